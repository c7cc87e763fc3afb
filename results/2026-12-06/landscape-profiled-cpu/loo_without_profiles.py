"""The landscape's leave-one-configuration-out error with and without the trials' width profiles.

    PYTHONPATH=. .venv/bin/python results/2026-12-06/landscape-profiled-cpu/loo_without_profiles.py

printed 0.0408 (with) and 0.0375 (without) on 2026-12-06.
"""

from dataclasses import replace

from orchestrator.config.schema import load_config
from orchestrator.explain.perfcheck import config_point, config_shape
from orchestrator.explain.perfmodel import config_loo, config_loo_error
from orchestrator.study.search_bench import config_of, load_landscape

R = "results/2026-12-06/landscape-profiled-cpu"
STUDIES = "landscape-cpu-ngram,landscape-cpu-skip8,landscape-cpu-skip16,landscape-cpu-eagle3-actor,landscape-cpu-eagle3-rank0"

cfg = load_config("results/2026-12-05/landscape-cpu/landscape-cpu.yaml", [])
land = load_landscape(cfg, f"sqlite:///{R}/optuna.db", STUDIES.split(","), f"sqlite:///{R}/mlflow.db")
points = []
for c in land.configs.values():
    p = config_point(config_shape(config_of(c.resolved, cfg), cfg), c.metrics, c.throughput)
    if p is not None:
        points.append(replace(p, trial=None))
print("with profiles", round(config_loo_error(config_loo(points)), 4))
print("without profiles", round(config_loo_error(config_loo([replace(p, width_ms=()) for p in points])), 4))
