# The landscape's leave-one-configuration-out error with and without the width profiles (run from the repo root:
# PYTHONPATH=. .venv/bin/python results/2026-12-06/landscape-cpu-profiled/loo_without_profiles.py): 0.0408 / 0.0375
import sys
from dataclasses import replace
import orchestrator.explain.perfmodel as pm
from orchestrator.config.schema import load_config
from orchestrator.study.search_bench import load_landscape, landscape_loo
R = "results/2026-12-06/landscape-cpu-profiled"
cfg = load_config("results/2026-12-05/landscape-cpu/landscape-cpu.yaml", [])
land = load_landscape(cfg, f"sqlite:///{R}/optuna.db", "landscape-cpu-ngram,landscape-cpu-skip8,landscape-cpu-skip16,landscape-cpu-eagle3-actor,landscape-cpu-eagle3-rank0".split(","), f"sqlite:///{R}/mlflow.db")
print("with profiles", round(pm.config_loo_error(landscape_loo(cfg, land)), 4))
real = pm.config_loo
pm_loo = lambda pts, pruned=(): real([replace(p, width_ms=()) for p in pts], pruned)
import orchestrator.study.search_bench as sb
import orchestrator.explain.perfmodel
orchestrator.explain.perfmodel.config_loo = pm_loo
print("without profiles", round(pm.config_loo_error(landscape_loo(cfg, land)), 4))
