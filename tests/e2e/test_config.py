"""Experiment YAML validation (`spectune validate`), --set overrides, the search space's conditions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from studyutil import tiny_experiment

from orchestrator.config.schema import json_schema, load_config
from orchestrator.config.space import suggest
from orchestrator.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def validate(path: Path, *sets: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "orchestrator", "validate", str(path)]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def validate_here(path: Path, capsys, *sets: str) -> tuple[int, str, str]:
    """`spectune validate` in this process (exit code, stdout, stderr): the same code path as the
    command without a Python start and the torch / Ray imports per case; the subprocess tests
    below keep the real command's exit code and its one-line stderr covered."""
    from orchestrator import cli

    args = ["validate", str(path)]
    for s in sets:
        args += ["--set", s]
    capsys.readouterr()
    code = cli.main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


MALFORMED = {
    "unknown key": ({"parallel": {"tp": 2, "tpp": 3}}, "parallel.tpp: unknown key"),
    "unknown section": ({"tracker": {}}, "tracker: unknown key"),
    "wrong type": ({"study": {"n_trials": "many"}}, "study.n_trials: Input should be a valid integer"),
    "empty space": ({"search": {"space": {}}}, "space: is empty"),
    "tp the model cannot take": ({"parallel": {"tp": 8}}, "parallel.tp: tp=8 does not divide the model's 4 attention heads"),
    "tp in the space the model cannot take": (
        {"search": {"space": {"parallel.tp": {"choices": [2, 6]}, "spec.num_draft_tokens": {"choices": [0, 2]}}}},
        "search.space.parallel.tp: tp=6",
    ),
    "NVLS in the space": (
        {
            "parallel": {"tp": 2, "backend": "gloo"},
            "search": {"space": {"spec.num_draft_tokens": {"choices": [0, 2]}, "nccl.NCCL_ALGO": {"choices": ["Ring", "NVLS"]}}},
        },
        "NCCL_ALGO=NVLS: NVLS / NVLink multicast must stay off",
    ),
    "NVLS variable": (
        {"search": {"space": {"spec.num_draft_tokens": {"choices": [0]}, "nccl.NCCL_NVLS_ENABLE": {"choices": [0, 1]}}}},
        "NCCL_NVLS_ENABLE: NVLS / NVLink multicast must stay off",
    ),
    "unknown parameter": ({"search": {"space": {"spec.depth": {"choices": [1]}}}}, "space.spec.depth: unknown parameter"),
    "backend that cannot run here": (
        {"search": {"space": {"spec.num_draft_tokens": {"choices": [0, 2]}, "comm.backend": {"choices": ["gloo", "nccl"]}}}},
        "search.space.comm.backend: nccl needs CUDA",
    ),
    "no baseline in the space": ({"search": {"space": {"spec.num_draft_tokens": {"choices": [2, 4]}}}}, "must allow 0, the baseline"),
    "layer_skip deeper than the model": ({"drafter": {"kind": "layer_skip", "layers": 9}}, "drafter.layers: 9 must be between 1 and 1"),
    "unknown engine key": ({"engine": {"gemvv": "off"}}, "engine.gemvv: unknown key"),
    "engine value the engine lacks": ({"engine": {"gemv": "fast"}}, "engine.gemv: Input should be 'auto', 'cublas', 'triton' or 'off'"),
    "engine value in the space the engine lacks": (
        {"search": {"space": {"spec.num_draft_tokens": {"choices": [0, 2]}, "engine.gemv": {"choices": ["auto", "fast"]}}}},
        "space.engine.gemv: 'fast' is not one of auto, cublas, triton, off",
    ),
    "draft tokens past the registry's limit": (
        {"search": {"space": {"spec.num_draft_tokens": {"choices": [0, 17]}}}},
        "space.spec.num_draft_tokens: 17 must be an integer between 0 and 16",
    ),
    "triton attention on cpu": ({"engine": {"attention": "triton"}}, "engine.attention: triton runs the CUDA graphs' attention kernel"),
    "triton moe kernel on cpu": (
        {"engine": {"moe_kernel": "triton"}},
        "engine.moe_kernel: triton runs the CUDA graphs' grouped MoE kernel",
    ),
    "rising acceptance profile": (
        {"workload": {"simulate_accept_profile": [0.5, 0.7]}},
        "workload.simulate_accept_profile: P(accepted >= i) for i = 1, 2, ...: each between 0 and 1, never rising",
    ),
    "acceptance profile for a drafter the study lacks": (
        {"workload": {"simulate_accept_profile": {"ngram": [0.8], "medusa": [0.5]}}},
        "workload.simulate_accept_profile: no drafter kind 'medusa' (kinds: draft_model, ngram, layer_skip, eagle3, mtp)",
    ),
    "acceptance profile per drafter neither a list nor a file": (
        {"workload": {"simulate_accept_profile": {"ngram": None, "layer_skip": [0.5]}}},
        "workload.simulate_accept_profile: ngram: give a list of P(accepted >= i) or a spectune decode --json file, got None",
    ),
    "acceptance profile per drafter from a missing file": (
        {"workload": {"simulate_accept_profile": {"ngram": "no-such-run.json", "layer_skip": [0.5]}}},
        "workload.simulate_accept_profile: ngram: 'no-such-run.json': No such file or directory",
    ),
    "no acceptance profile for a drafter the study drafts with": (
        {"workload": {"simulate_accept_profile": {"ngram": [0.8, 0.5]}}},
        "workload.simulate_accept_profile: no profile for drafter kind layer_skip, which search.space.drafter.kind drafts with",
    ),
    "two imposed acceptances": (
        {"workload": {"simulate_accept_len": 2, "simulate_accept_profile": [0.5]}},
        "workload: set simulate_accept_len or simulate_accept_profile, not both",
    ),
    "shortest n-gram above the longest": (
        {"drafter": {"ngram_min": 4}},
        "drafter.ngram_min: 4 is above drafter.ngram_max 3 (min must be <= max)",
    ),
    "searched triton moe kernel on cpu": (
        {"search": {"space": {"engine.moe_kernel": {"choices": ["dense", "triton"]}}}},
        "search.space.engine.moe_kernel: triton runs the CUDA graphs' grouped MoE kernel",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_yaml_exits_2_with_one_line(tmp_path, tiny_ckpt, capsys, case):
    sections, needle = MALFORMED[case]
    path = tiny_experiment(tmp_path, tiny_ckpt)
    raw = yaml.safe_load(path.read_text())
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) and key != "search" else value
    path.write_text(yaml.safe_dump(raw))
    code, _, err = validate_here(path, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]


def test_not_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsearch: [unclosed\n")
    r = validate(bad)
    assert r.returncode == 2 and "not valid YAML" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = validate(tmp_path / "missing.yaml")
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_valid_experiment_and_overrides(tmp_path, tiny_ckpt, capsys):
    path = tiny_experiment(tmp_path, tiny_ckpt)
    code, out, err = validate_here(path, capsys, "study.n_trials=9", "workload.max_new_tokens=5")
    assert code == 0, err
    assert "9 trials" in out
    cfg = load_config(
        path, ["study.n_trials=9", "search.space.nccl.NCCL_PROTO={choices: [LL, Simple]}", "parallel.nccl_env={NCCL_DEBUG: WARN}"]
    )
    assert cfg.study.n_trials == 9 and cfg.parallel.nccl_env == {"NCCL_DEBUG": "WARN"}
    assert cfg.search.space["nccl.NCCL_PROTO"].choices == ["LL", "Simple"]
    with pytest.raises(UserError, match="parallel.tpx: unknown key"):
        load_config(path, ["parallel.tpx=2"])
    with pytest.raises(UserError, match="expected dotted.key=value"):
        load_config(path, ["parallel.tp"])


def test_conditional_parameters(tmp_path, tiny_ckpt):
    """NCCL knobs only with nccl; drafter knobs only when drafting; layers only for layer_skip."""
    path = tiny_experiment(tmp_path, tiny_ckpt)
    cfg = load_config(
        path,
        [
            "search.space.comm.backend={choices: [gloo, nccl]}",
            "search.space.nccl.NCCL_PROTO={choices: [LL, Simple]}",
            "search.space.drafter.layers={choices: [1]}",
            "search.space.spec.num_draft_tokens={choices: [0, 3]}",
        ],
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(40):
        trial = study.ask()
        tc = suggest(trial, cfg)
        p = trial.params
        assert ("nccl.NCCL_PROTO" in p) == (p["comm.backend"] == "nccl")
        assert ("drafter.kind" in p) == (p["spec.num_draft_tokens"] > 0)
        assert ("drafter.layers" in p) == (p.get("drafter.kind") == "layer_skip")
        assert (dict(tc.nccl_env).get("NCCL_PROTO") is not None) == (tc.backend == "nccl")
        assert tc.drafter.kind == (p.get("drafter.kind") or "none")
        seen.add((p["comm.backend"], p["spec.num_draft_tokens"], p.get("drafter.kind")))
        study.tell(trial, 1.0)
    assert len(seen) >= 5


def test_schema_file_is_current():
    """experiments/spectune.schema.json (what editors read) matches the code."""
    on_disk = json.loads((ROOT / "experiments" / "spectune.schema.json").read_text())
    assert on_disk == json.loads(json.dumps(json_schema()))


def test_editors_schema_takes_every_shipped_experiment_and_refuses_a_profile_for_no_drafter():
    """What an editor checks against the schema: every experiments/*.yaml passes; a per-drafter profile
    naming no drafter kind, or a P above 1, does not (as the validators refuse them)."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema()
    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    raw = yaml.safe_load((ROOT / "experiments" / "deepseek-v3-tp8-mtp-vs-ngram.yaml").read_text())
    for bad in ({"medusa": [0.5]}, {"mtp": [1.5]}, {}):
        raw["workload"]["simulate_accept_profile"] = bad
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(raw, schema)


def test_reference_parameter_table_is_generated_from_the_declarations():
    """docs/reference.md's parameter table is the registry's own (python -m orchestrator.config.registry)."""
    from orchestrator.config.registry import markdown_table

    doc = (ROOT / "docs" / "reference.md").read_text()
    between = doc.split("<!-- parameters: generated -->\n")[1].split("<!-- parameters: end -->")[0]
    assert between == markdown_table()


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "experiments").glob("*.yaml")))
def test_shipped_experiments_parse(name):
    cfg = load_config(ROOT / "experiments" / name)
    assert cfg.search.space


def test_shipped_emulated_experiment_validates():
    """The emulated TP 8 studies (Kimi-K2 and DeepSeek-V3 shapes) pass every check `spectune run` makes before launching (it needs no GPU to
    validate: its model is a random preset and its backends are its table's), on each bundled table it names."""
    from orchestrator.execution.validate import check_experiment

    for name in ("tp8-pcie-emulated.yaml", "deepseek-v3-tp8-emulated.yaml", "deepseek-v3-tp8-mtp-vs-ngram.yaml"):
        for table in ("seeds-tp8-pcie", "nvlink-h200"):
            cfg = load_config(ROOT / "experiments" / name, [f"parallel.allreduce_table={table}"])
            prepared = check_experiment(cfg)
            assert prepared.allreduce_table is not None and prepared.allreduce_table.name == table
    # the Qwen3 dense and MoE studies (issue 44 item 7): the same space and imposed profile, another model
    dense, moe = (load_config(ROOT / "experiments" / f"{n}-1gpu.yaml") for n in ("qwen3-8b", "qwen3-30b-a3b"))
    for cfg in (dense, moe):
        check_experiment(cfg)
    assert dense.search == moe.search and dense.workload == moe.workload and dense.model.path != moe.model.path


@pytest.mark.slow  # validating smoke-cpu.yaml fetches the demo model it names (its config and tokenizer)
def test_engine_section_through_set_on_the_shipped_experiment():
    """`--set engine.<field>=...` reaches the typed engine section; an unknown engine key is one line, exit 2."""
    ok = validate(ROOT / "experiments" / "smoke-cpu.yaml", "engine.attention=sdpa")
    assert ok.returncode == 0, ok.stderr
    bad = validate(ROOT / "experiments" / "smoke-cpu.yaml", "engine.bogus=1")
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and bad.stdout == "" and len(lines) == 1, bad.stderr
    assert lines[0].startswith("spectune: error: ") and lines[0].endswith("smoke-cpu.yaml: engine.bogus: unknown key"), lines[0]


# a value other than the default for every registry parameter (nccl.* rows are made on demand)
OTHER = {
    "parallel.tp": 4,
    "comm.backend": "nccl",
    "spec.num_draft_tokens": 3,
    "drafter.kind": "layer_skip",
    "drafter.layers": 1,
    "drafter.ngram_max": 5,
    "drafter.ngram_min": 2,
    "drafter.model_path": "some/ckpt",
    "drafter.placement": "rank0",
    "drafter.lookup": 2,
    "drafter.tree_width": 3,
    "engine.attention": "sdpa",
    "engine.cuda_graphs": False,
    "engine.compile": False,
    "engine.gemv": "off",
    "engine.fused_add_norm": False,
    "engine.moe_kernel": "dense",
    "engine.mla": "expanded",
    "engine.overlap": False,
    "nccl.NCCL_PROTO": "LL",
}


def test_registry_round_trip(tmp_path):
    """Each registry parameter written into the YAML at its path (as the report writes the winner)
    reads back as that value, resolves into the trial's configuration (engine settings in its
    EngineConfig) and comes out under the same dotted name as an MLflow param."""
    from orchestrator.config import registry
    from orchestrator.config.space import resolve

    assert set(OTHER) - {"nccl.NCCL_PROTO"} == set(registry.PARAMS)
    base = {"name": "round-trip", "search": {"space": {"spec.num_draft_tokens": 0}}}
    (tmp_path / "defaults.yaml").write_text(yaml.safe_dump(base))
    defaults = load_config(tmp_path / "defaults.yaml")
    for name, v in OTHER.items():
        row = registry.lookup(name)
        assert registry.value(defaults, name) == row.default and row.problem(v) is None
    raw = yaml.safe_load(yaml.safe_dump(base))
    for name, v in OTHER.items():
        registry.set_yaml(raw, name, v)
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    assert {name: registry.value(cfg, name) for name in OTHER} == OTHER
    tc = resolve({}, cfg)
    assert tc.engine.describe() == {n.removeprefix("engine."): v for n, v in OTHER.items() if n.startswith("engine.")}
    params = tc.params()
    assert {n: params[n] for n in OTHER if n in params} == {n: v for n, v in OTHER.items() if n in params}
    # the drafter's own parameters appear only with that drafter (layer_skip: its layers, not the others)
    assert {"drafter.layers", "nccl.NCCL_PROTO"} | set(registry.ENGINE_PARAMS) <= params.keys()
    assert (
        not {"drafter.ngram_max", "drafter.ngram_min", "drafter.model_path", "drafter.placement", "drafter.lookup", "drafter.tree_width"}
        & params.keys()
    )
    assert tc.drafter.tree_width == 0  # an eagle3 option: another drafter drafts a chain
    eagle3 = resolve({"drafter.kind": "eagle3"}, cfg)  # an EAGLE-3 trial: its own parameters reach the gang and MLflow
    assert (eagle3.drafter.lookup, eagle3.drafter.placement, eagle3.drafter.tree_width) == (2, "rank0", 3)
    assert {"drafter.lookup": 2, "drafter.placement": "rank0", "drafter.tree_width": 3}.items() <= eagle3.params().items()
    ngram = resolve({"drafter.kind": "ngram"}, cfg)
    assert (ngram.drafter.ngram_max, ngram.drafter.ngram_min) == (5, 2) and {"drafter.ngram_min": 2}.items() <= ngram.params().items()
    # spectune decode: each parameter's flag (derived from the same declaration) sets its YAML field
    from orchestrator.decode.flags import PARAM_FLAGS, parse

    assert {f.field for f in PARAM_FLAGS} == {p.yaml_key for p in registry.PARAMS.values()}
    for flag in PARAM_FLAGS:
        v = OTHER[registry.PARAMS_BY_YAML[flag.field].name]
        argv = [flag.names[0]] if isinstance(v, bool) else [flag.names[0], str(v)]
        assert parse(argv)[0] == {flag.field: v}, flag
    # the report's best configuration: the winner's searched values written back at their YAML paths
    from orchestrator.explain.report import best_yaml

    best = yaml.safe_load(best_yaml(defaults, {"engine.gemv": "off", "spec.num_draft_tokens": 2, "nccl.NCCL_PROTO": "LL"}))
    assert best["engine"]["gemv"] == "off" and best["engine"]["attention"] == "auto"
    assert best["drafter"]["num_draft_tokens"] == 2 and best["parallel"]["nccl_env"] == {"NCCL_PROTO": "LL"}


def test_engine_parameters_are_searchable(tmp_path, tiny_ckpt):
    """`search.space: {engine.gemv: {choices: [auto, off]}}` is suggested like any parameter and
    lands in the trial's EngineConfig and its MLflow params; the YAML's engine section is the default."""
    path = tiny_experiment(tmp_path, tiny_ckpt, engine={"overlap": False})
    cfg = load_config(
        path, ["search.space.engine.gemv={choices: [auto, off]}", "search.space.engine.fused_add_norm={choices: [true, false]}"]
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(20):
        trial = study.ask()
        tc = suggest(trial, cfg)
        assert tc.engine.gemv == trial.params["engine.gemv"] == tc.params()["engine.gemv"]
        assert tc.engine.fused_add_norm == trial.params["engine.fused_add_norm"]
        assert tc.engine.overlap is False and tc.params()["engine.overlap"] is False
        seen.add((tc.engine.gemv, tc.engine.fused_add_norm))
        study.tell(trial, 1.0)
    assert len(seen) == 4
    assert load_config(path, ["engine.gemv=off"]).engine.gemv == "off"  # YAML reads a bare off as false


def test_the_train_and_heldout_splits_partition_every_category():
    """workload.split / --split: train keeps prompts 0-2 of every 4 per category, heldout the 4th,
    counted over the whole file before categories, per_category and num_prompts pick from it."""
    from orchestrator.prompts.loading import BUNDLED_PROMPTS, load_prompts

    every = load_prompts(BUNDLED_PROMPTS)
    train, held = load_prompts(BUNDLED_PROMPTS, split="train"), load_prompts(BUNDLED_PROMPTS, split="heldout")
    ids = lambda ps: [p.question_id for p in ps]  # noqa: E731
    assert not set(ids(train)) & set(ids(held)) and sorted(ids(train) + ids(held)) == sorted(ids(every))
    for cat in {p.category for p in every}:
        in_cat = [p.question_id for p in every if p.category == cat]
        assert [p.question_id for p in held if p.category == cat] == in_cat[3::4]
    picked = load_prompts(BUNDLED_PROMPTS, num_prompts=2, categories=["writing", "coding"], per_category=1, split="heldout")
    assert [p.question_id for p in picked] == [
        next(p.question_id for p in held if p.category == "writing"),
        next(p.question_id for p in held if p.category == "coding"),
    ]  # the file lists writing before coding
    from orchestrator.config.schema import ExperimentConfig

    space = {"space": {"spec.num_draft_tokens": {"choices": [0, 2]}}}
    cfg = ExperimentConfig.model_validate({"name": "x", "search": space, "workload": {"split": "heldout"}})
    assert cfg.workload.split == "heldout"
    with pytest.raises(ValueError, match="split"):
        ExperimentConfig.model_validate({"name": "x", "search": space, "workload": {"split": "test"}})


def test_tree_width_is_searched_for_eagle3_and_refused_at_batch_sizes_above_1(tmp_path):
    """drafter.tree_width is suggested only for eagle3 trials; a tree widens the verify pass the cache
    must hold (min(k x w, 16) drafts); and a space that lets a tree meet a batch size > 1 is refused
    before any trial runs, in one line naming where the tree comes from."""
    from types import SimpleNamespace

    import optuna

    from orchestrator.config.space import suggest
    from orchestrator.errors import UserError
    from orchestrator.execution.validate import check_batch_drafters, check_batch_prompts, most_drafts

    raw = {
        "name": "tree",
        "drafter": {"kind": "eagle3", "model_path": "some/head", "placement": "rank0"},
        "search": {"space": {"drafter.kind": {"choices": ["ngram", "eagle3"]}, "drafter.tree_width": {"choices": [0, 1, 3]}}},
    }
    (tmp_path / "tree.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_config(tmp_path / "tree.yaml")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(20):
        trial = study.ask()
        tc = suggest(trial, cfg)
        assert ("drafter.tree_width" in trial.params) == (tc.drafter.kind == "eagle3")
        seen.add((tc.drafter.kind, tc.drafter.tree_width))
        study.tell(trial, 1.0)
    assert seen == {("ngram", 0), ("eagle3", 0), ("eagle3", 3)}  # width 1 drafts a chain: resolved to 0
    assert any(t.params.get("drafter.tree_width") == 1 for t in study.trials)  # it was suggested
    assert (most_drafts(cfg, 4), most_drafts(cfg, 6), most_drafts(cfg, 0)) == (12, 16, 0)
    chain = load_config(tmp_path / "tree.yaml", ["search.space.drafter.tree_width=1"])
    assert most_drafts(chain, 4) == 4
    prepared = SimpleNamespace(token_ids=((1, 2),) * 4)
    check_batch_drafters(cfg, ["ngram", "eagle3"])  # batch size 1 only: a tree is fine
    batched = load_config(tmp_path / "tree.yaml", ["workload.batch_sizes=[1, 2]"])
    with pytest.raises(
        UserError,
        match=r"^workload.batch_sizes: batch sizes > 1 draft chains only: a tree \(drafter.tree_width >= 2\) runs at batch size 1; "
        r"search.space.drafter.tree_width allows 3$",
    ):
        check_batch_drafters(batched, ["ngram", "eagle3"])
    chains = load_config(tmp_path / "tree.yaml", ["workload.batch_sizes=[1, 2]", "search.space.drafter.tree_width=1"])
    check_batch_drafters(chains, ["eagle3"])
    check_batch_prompts(chains, prepared)
    with pytest.raises(UserError, match=r"^workload.batch_sizes: 8 exceeds the 4 prompts of the workload"):
        check_batch_prompts(load_config(tmp_path / "tree.yaml", ["workload.batch_sizes=[1, 8]"]), prepared)


def test_an_acceptance_profile_read_from_a_real_runs_json(tmp_path):
    """`workload.simulate_accept_profile: FILE` (or decode's --simulate-accept-profile FILE) takes the
    accept_rate_pos_i of a `spectune decode --json` output, in order, and the record names the file; a
    file without them, or none, is one line naming the field."""
    from orchestrator.decode.flags import parse

    real = tmp_path / "real.json"
    real.write_text(json.dumps({"throughput_tok_s": 9.0, "accept_rate_pos_1": 0.7, "accept_rate_pos_2": 0.45, "accept_rate_pos_3": 0.2}))
    cfg = load_config(ROOT / "experiments" / "tp8-pcie-emulated.yaml", [f"workload.simulate_accept_profile={real}"])
    assert cfg.workload.simulate_accept_profile == [0.7, 0.45, 0.2] and cfg.workload.simulate_accept_profile_from == str(real)
    assert cfg.workload.acceptance_words().endswith(f"(workload.simulate_accept_profile, from {real})")
    assert parse(["--simulate-accept-profile", str(real)])[0] == {"workload.simulate_accept_profile": str(real)}
    assert parse(["--simulate-accept-profile", "0.8,0.5"])[0] == {"workload.simulate_accept_profile": [0.8, 0.5]}
    (tmp_path / "plain.json").write_text(json.dumps({"throughput_tok_s": 9.0}))
    for bad, why in ((tmp_path / "plain.json", "holds no accept_rate_pos_1"), (tmp_path / "none.json", "No such file")):
        with pytest.raises(UserError, match=f"workload.simulate_accept_profile: .*{why}"):
            load_config(ROOT / "experiments" / "tp8-pcie-emulated.yaml", [f"workload.simulate_accept_profile={bad}"])


def test_an_acceptance_profile_per_drafter_kind_reaches_the_params_and_the_best_yaml(tmp_path):
    """`workload.simulate_accept_profile: {kind: list or file}`: each kind's profile, the record's words,
    one MLflow param per kind, and the best YAML names the file as the experiment did."""
    from orchestrator.explain.report.core import best_yaml
    from orchestrator.tracking.runs import experiment_params

    real = tmp_path / "real.json"
    real.write_text(json.dumps({"accept_rate_pos_1": 0.6, "accept_rate_pos_2": 0.3}))
    cfg = load_config(
        ROOT / "experiments" / "deepseek-v3-tp8-emulated.yaml", [f"workload.simulate_accept_profile={{mtp: [0.85, 0.6], ngram: {real}}}"]
    )
    w = cfg.workload
    assert w.profile_for("mtp") == (0.85, 0.6) and w.profile_for("ngram") == (0.6, 0.3) and w.profile_for("eagle3") is None
    assert (
        w.acceptance_words()
        == f"P(accepted >= i) per drafter: mtp 0.85, 0.6; ngram 0.6, 0.3 (workload.simulate_accept_profile, from ngram: {real})"
    )
    params = experiment_params(cfg)
    assert params["workload.simulate_accept_profile.mtp"] == "0.85,0.6" and params["workload.simulate_accept_profile.ngram"] == "0.6,0.3"
    again = yaml.safe_load(best_yaml(cfg, {"spec.num_draft_tokens": 2, "drafter.kind": "mtp"}))
    assert again["workload"]["simulate_accept_profile"] == {"mtp": [0.85, 0.6], "ngram": str(real)}
    # a run that did not always draft (n-gram without a match): its rates count the steps that drafted each
    # position, so they are scaled to the accepted length it measured (1 + 0.4 + 0.2 = 1.6)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"accept_len_mean": 1.6, "accept_rate_pos_1": 0.6, "accept_rate_pos_2": 0.3}))
    scaled = load_config(ROOT / "experiments" / "deepseek-v3-tp8-emulated.yaml", [f"workload.simulate_accept_profile={partial}"])
    assert scaled.workload.profile_for("ngram") == pytest.approx((0.4, 0.2))


def test_ngram_min_above_max_is_refused_for_the_whole_space_and_skipped_per_trial(tmp_path):
    """drafter.ngram_min > drafter.ngram_max: a space where every pair is so is refused before launch; one
    where only some are runs the others and marks those trials not run (space.constraint_violation)."""
    from orchestrator.config.space import constraint_violation, resolve

    path = tmp_path / "ngram.yaml"
    raw = {"name": "ngram", "search": {"space": {"drafter.ngram_min": {"choices": [1, 4]}, "drafter.ngram_max": {"choices": [2, 5]}}}}
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    ok = resolve({"drafter.ngram_min": 1, "drafter.ngram_max": 2}, cfg)
    bad = resolve({"drafter.ngram_min": 4, "drafter.ngram_max": 2}, cfg)
    assert constraint_violation(ok) is None
    assert constraint_violation(bad) == "constraint: drafter.ngram_min=4 is above drafter.ngram_max=2 (min must be <= max); not run"
    plain = resolve({"spec.num_draft_tokens": 0, "drafter.ngram_min": 4, "drafter.ngram_max": 2}, cfg)
    assert constraint_violation(plain) is None  # no n-gram drafter, nothing to break
