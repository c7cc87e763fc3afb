"""Emulated TP on the driver: the allreduce table an experiment names, what is checked before anything
launches, and how the record says its figures are emulated.

    parallel: {tp: 1, emulate_tp: 8, allreduce_table: pcie-8x-rtx-pro-6000}     # YAML
    spectune decode --emulate-tp 8 --allreduce-table seeds-tp8-pcie --simulate-accept-len 3 ...

One process runs rank 0's shard of TP `emulate_tp` and every collective waits the table's latency
for its message size, rank count and `comm.backend` (workers/comm/emulated.py). The backends the
table lists at that TP size are the comm.backend choices. An emulated rank exchanges no partial
sums, so its tokens are not the model's: a trial that drafts takes its acceptance from
`workload.simulate_accept_len` or `workload.simulate_accept_profile` (e.g. the per-position acceptance a
real trial of the model and drafter measured), and no output is compared with a baseline.
"""

from __future__ import annotations

from orchestrator.config import registry
from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.space import candidates
from orchestrator.errors import UserError
from workers.comm import AllreduceTable, TableError, emulation_refusal, load_table
from workers.model.args import ModelArgs, ModelConfigError, check_tp
from workers.spec.allreduce_table import emulated_words

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def deployed_tp(params: dict, cfg: ExperimentConfig | None = None) -> int:
    """The TP size a trial's figures are for, from its params (then the experiment's): an emulated trial
    runs TP `emulate_tp` as one rank (parallel.tp 1), and its allreduces (waits from the table) are as
    much part of its step as real ones."""
    emulated = params.get("parallel.emulate_tp") or (cfg.parallel.emulate_tp if cfg is not None else None)
    return int(emulated or params.get("parallel.tp", cfg.parallel.tp if cfg is not None else 1))


def table_of(cfg: ExperimentConfig) -> AllreduceTable | None:
    """The table of an emulated experiment (None when its TP is real); UserError naming the field."""
    if cfg.parallel.emulate_tp is None:
        return None
    try:
        return load_table(cfg.parallel.allreduce_table)
    except TableError as e:
        raise UserError(f"parallel.allreduce_table: {e}") from None


def message_bytes(cfg: ExperimentConfig, args: ModelArgs, prompt_lengths: list[int], most_drafts: int) -> tuple[int, int]:
    """The smallest and largest allreduce an emulated trial issues: one token's hidden state (a plain
    decode step), up to a batch's prefill (its prompts packed in one pass) or its widest verify pass."""
    token = args.dim * ITEMSIZE[cfg.model.dtype]
    batch = max(cfg.workload.batch_sizes)
    prefill = sum(sorted(prompt_lengths, reverse=True)[:batch])
    return token, token * max(prefill, batch * (most_drafts + 1))


def check(cfg: ExperimentConfig, args: ModelArgs, prompt_lengths: list[int], most_drafts: int) -> AllreduceTable | None:
    """Everything an emulated experiment needs before launch (UserError, one line, naming the field);
    the table, or None when the experiment's TP is real."""
    table = table_of(cfg)
    if table is None:
        return None
    n = cfg.parallel.emulate_tp
    if candidates(cfg, "parallel.tp") != [1]:
        raise UserError(
            f"{registry.where(cfg, 'parallel.tp')}: an emulated study (parallel.emulate_tp {n}) runs one process; parallel.tp stays 1"
        )
    try:
        check_tp(args, n)
    except ModelConfigError as e:
        raise UserError(f"parallel.emulate_tp: {e}") from None
    if searched := [name for name in cfg.search.space if name.startswith("nccl.")]:
        raise UserError(
            f"search.space.{searched[0]}: an emulated rank waits the table's default NCCL environment; NCCL variables change nothing"
        )
    backends = candidates(cfg, "comm.backend")
    for backend in backends:
        if why := emulation_refusal(table, str(backend), n):
            raise UserError(f"{registry.where(cfg, 'comm.backend')}: {why}")
    ks = candidates(cfg, "spec.num_draft_tokens")
    if any(k > 0 for k in ks) and not cfg.workload.simulated:
        raise UserError(
            "workload.simulate_accept_len: an emulated rank's tokens are not the model's (no partial sums are exchanged), "
            "so a trial that drafts takes its accepted length from here (e.g. 2.5), or its per-position acceptance from "
            "workload.simulate_accept_profile (e.g. the accept_rate_pos_i a real run measured)"
        )
    if n > 1:
        lo, hi = message_bytes(cfg, args, prompt_lengths, most_drafts)
        graphs = candidates(cfg, "engine.cuda_graphs") if cfg.parallel.device == "cuda" else [False]
        for backend in backends:
            for mode in {"graph" if g else "eager" for g in graphs}:
                for size in (lo, hi):
                    try:
                        table.latency_us(str(backend), n, size, mode)
                    except TableError as e:
                        raise UserError(f"parallel.allreduce_table: {e}") from None
    return table


def label(cfg: ExperimentConfig, table: AllreduceTable | None = None) -> str | None:
    """The words the console, the decode JSON and the report use: "emulated TP 8 from table NAME (sha256 ...)"; None: real TP."""
    if cfg.parallel.emulate_tp is None:
        return None
    table = table or table_of(cfg)
    return emulated_words(cfg.parallel.emulate_tp, table.label)


def acceptance(cfg: ExperimentConfig) -> str:
    """Which acceptance an emulated trial's figures rest on."""
    words = cfg.workload.acceptance_words()
    return "none (plain decoding only)" if words is None else f"simulated: {words}"


def params(cfg: ExperimentConfig, table: AllreduceTable | None = None) -> dict:
    """MLflow params saying the figures are emulated, from which table and on which acceptance (none
    for a real TP experiment: its records stay as they were)."""
    if cfg.parallel.emulate_tp is None:
        return {}
    table = table or table_of(cfg)
    return {
        "parallel.emulated": True,
        "parallel.emulate_tp": cfg.parallel.emulate_tp,
        "parallel.allreduce_table": table.name,
        "parallel.allreduce_table_sha256": table.sha256,
        "parallel.emulated_acceptance": acceptance(cfg),
    }


def report_line(cfg: ExperimentConfig) -> str | None:
    """The console's and the report's words for an emulated study (None for real TP): which deployment,
    from which table, on which acceptance."""
    if (what := label(cfg)) is None:
        return None
    return f"EMULATED: {what}; acceptance {acceptance(cfg)}. No process ran the whole model: confirm on the real deployment."
