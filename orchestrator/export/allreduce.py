"""The allreduce a study chose, in each serving engine's spelling, and what it costs where the engine
has no equivalent.

spectune measures four allreduce backends (`comm.backend`): gloo (CPU), nccl, symm_mem (torch's
one-shot kernel over symmetric memory: every rank reads every peer's buffer) and symm_mem_ll
(spectune's own low-latency one-shot push, workers/comm/symm_mem_ll.py). `engine_allreduce(engine,
backend)` gives an engine's setting for one of them: the flags, environment or YAML key, whether it
runs the same algorithm (`equivalent`) or is the engine's nearest choice, and notes. Where it is only
the nearest choice, `allreduce_costs(rows, engine)` says, from the study's own trials, how much of the
win that costs: at each batch size, the best configuration measured on a backend the engine has
(`ENGINE_BACKENDS`) against the winner (schedule rows' `best_by_backend`,
orchestrator/export/schedule.py). The export's header and the report (orchestrator/explain/report/
engines.py) print both figures and their ratio. Pure data and strings.

    choice = engine_allreduce("vllm", "symm_mem_ll"); costs = allreduce_costs(rows, "vllm")

Why only nccl counts as an equivalent in every engine (checked in the versions of versions.py):
- vLLM and SGLang have a torch symmetric-memory allreduce, but it runs torch's multimem (NVLink
  multicast) or two-shot kernels, never the one-shot one spectune's symm_mem measures, and it turns
  itself off when the rendezvous gives no multicast pointer (vllm/distributed/device_communicators/
  symm_mem.py, python/sglang/srt/distributed/device_communicators/torch_symm_mem.py). NVLink
  multicast stays off in every export (TORCH_SYMM_MEM_DISABLE_MULTICAST=1), so neither can run.
- TensorRT-LLM's allreduce_strategy (AUTO, NCCL, UB, MINLATENCY, ONESHOT, TWOSHOT, LOWPRECISION, MNNVL,
  NCCL_SYMMETRIC) has no torch symmetric-memory strategy; ONESHOT is its own IPC kernel.
- spectune's symm_mem_ll exists nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.export.schedule import config_words
from orchestrator.export.versions import ENGINE_NAMES

BACKEND_WORDS = {
    "gloo": "gloo (a CPU allreduce)",
    "nccl": "NCCL",
    "symm_mem": "torch's one-shot allreduce over symmetric memory",
    "symm_mem_ll": "spectune's low-latency one-shot push over symmetric memory",
}

# the spectune backends an engine runs as spectune measured them (the module docstring says why)
ENGINE_BACKENDS: dict[str, tuple[str, ...]] = {"vllm": ("nccl",), "sglang": ("nccl",), "trtllm": ("nccl",)}

_MULTICAST_OFF = "its torch symmetric-memory allreduce needs NVLink multicast, which stays off in this export"


@dataclass(frozen=True)
class EngineAllreduce:
    """One engine's allreduce setting for one spectune backend."""

    engine: str  # vllm | sglang | trtllm
    backend: str  # the winner's comm.backend
    equivalent: bool  # the engine runs the same algorithm (else `choice` is its nearest)
    setting: str  # the engine's setting in a few words ("custom allreduce", "allreduce_strategy ONESHOT")
    choice: str  # the same, explained
    flags: tuple[str, ...] = ()  # command-line flags
    env: tuple[tuple[str, str], ...] = ()  # environment variables
    strategy: str | None = None  # TensorRT-LLM's allreduce_strategy
    notes: tuple[str, ...] = ()


def _vllm(backend: str) -> EngineAllreduce:
    """vLLM 0.25.0: CudaCommunicator.all_reduce (cuda_communicator.py) tries its custom allreduce before
    torch symmetric memory and falls back to PyNccl; --disable-custom-all-reduce (ParallelConfig.
    disable_custom_all_reduce) and VLLM_ALLREDUCE_USE_SYMM_MEM=0 (vllm/envs.py, default 1) leave PyNccl.
    The custom allreduce (custom_all_reduce.py) is off on more than two PCIe-only GPUs."""
    if backend in ("symm_mem", "symm_mem_ll"):
        return EngineAllreduce(
            "vllm",
            backend,
            False,
            "custom allreduce",
            "vLLM's custom allreduce (a one-shot reduce over CUDA IPC buffers for small messages; on by default)",
            env=(("VLLM_ALLREDUCE_USE_SYMM_MEM", "0"),),
            notes=(
                f"VLLM_ALLREDUCE_USE_SYMM_MEM=0: {_MULTICAST_OFF} (vllm/distributed/device_communicators/symm_mem.py)",
                "vLLM turns its custom allreduce off on more than two PCIe-only GPUs (custom_all_reduce.py): NCCL then carries every allreduce",
            ),
        )
    return EngineAllreduce(
        "vllm",
        backend,
        backend == "nccl",
        "PyNccl allreduce",
        "vLLM's PyNccl allreduce: custom allreduce off (--disable-custom-all-reduce), torch symmetric memory off (VLLM_ALLREDUCE_USE_SYMM_MEM=0)",
        flags=("--disable-custom-all-reduce",),
        env=(("VLLM_ALLREDUCE_USE_SYMM_MEM", "0"),),
        notes=(
            "these settings make vLLM run the allreduce the study measured (NCCL); vLLM's own custom allreduce, its default "
            "on NVLink and on up to two PCIe GPUs, was not measured: drop both to compare it on your box",
        ),
    )


def _sglang(backend: str) -> EngineAllreduce:
    """SGLang (server_args.py): --disable-custom-all-reduce falls back to NCCL; --enable-torch-symm-mem
    (off by default) is never emitted: torch_symm_mem.py refuses to start without multicast (and below SM 90)."""
    if backend in ("symm_mem", "symm_mem_ll"):
        return EngineAllreduce(
            "sglang",
            backend,
            False,
            "custom allreduce",
            "SGLang's custom allreduce (a one-shot reduce over CUDA IPC buffers for small messages; on by default)",
            notes=(
                f"no --enable-torch-symm-mem: {_MULTICAST_OFF} (torch_symm_mem.py)",
                "SGLang's custom allreduce is off on more than two PCIe-only GPUs: NCCL then carries every allreduce",
            ),
        )
    return EngineAllreduce(
        "sglang",
        backend,
        backend == "nccl",
        "NCCL allreduce",
        "SGLang's NCCL allreduce: custom allreduce off (--disable-custom-all-reduce); torch symmetric memory stays off (its default)",
        flags=("--disable-custom-all-reduce",),
    )


def _trtllm(backend: str) -> EngineAllreduce:
    """TensorRT-LLM 1.4.0rc4: TorchLlmArgs.allreduce_strategy (tensorrt_llm/llmapi/llm_args.py), one of
    AUTO, NCCL, UB, MINLATENCY, ONESHOT, TWOSHOT, LOWPRECISION, MNNVL, NCCL_SYMMETRIC (default AUTO)."""
    if backend in ("symm_mem", "symm_mem_ll"):
        return EngineAllreduce(
            "trtllm",
            backend,
            False,
            "allreduce_strategy ONESHOT",
            "allreduce_strategy ONESHOT (TensorRT-LLM's one-shot kernel: every rank reduces all peers' parts over IPC buffers)",
            strategy="ONESHOT",
            notes=(
                "TensorRT-LLM's custom kernels check the TP group for NVLink / P2P (tensorrt_llm/_torch/distributed/ops.py): "
                "on a PCIe box confirm in its log which strategy ran",
            ),
        )
    return EngineAllreduce("trtllm", backend, backend == "nccl", "allreduce_strategy NCCL", "allreduce_strategy NCCL", strategy="NCCL")


_BY_ENGINE = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm}


def engine_allreduce(engine: str, backend: str) -> EngineAllreduce:
    """The engine's allreduce setting for the winner's backend; an unknown backend gets the engine's NCCL
    choice, marked as no equivalent."""
    choice = _BY_ENGINE[engine](backend)
    if backend not in BACKEND_WORDS:
        return replace(choice, equivalent=False)
    return choice


@dataclass(frozen=True)
class AllreduceCost:
    """At one batch size: the winner (on a backend the engine lacks) against the best configuration
    measured on a backend the engine has (`fallback_*`; None where the study measured none)."""

    batch_size: int
    backend: str
    winner_tok_s: float
    winner_trial: int | None
    fallback_backend: str | None = None
    fallback_tok_s: float | None = None
    fallback_trial: int | None = None
    fallback_config: str | None = None

    @property
    def ratio(self) -> float | None:
        """fallback / winner throughput (below 1: what the engine's choices keep of the win)."""
        return self.fallback_tok_s / self.winner_tok_s if self.fallback_tok_s is not None and self.winner_tok_s else None


def allreduce_costs(rows: list[dict], engine: str) -> list[AllreduceCost]:
    """One entry per batch size whose winner ran a backend the engine has no equivalent of."""
    have = ENGINE_BACKENDS[engine]
    out = []
    for r in rows:
        if r.get("backend") in have or r.get("throughput_tok_s") is None:
            continue
        measured = {b: e for b, e in (r.get("best_by_backend") or {}).items() if b in have}
        cost = AllreduceCost(int(r["batch_size"]), str(r.get("backend")), float(r["throughput_tok_s"]), r.get("trial"))
        if measured:
            backend, best = max(measured.items(), key=lambda kv: kv[1]["throughput_tok_s"])
            cost = AllreduceCost(
                cost.batch_size,
                cost.backend,
                cost.winner_tok_s,
                cost.winner_trial,
                backend,
                float(best["throughput_tok_s"]),
                best.get("trial"),
                config_words(best),
            )
        out.append(cost)
    return out


def cost_text(c: AllreduceCost, engine: str) -> str:
    """One cost in words: both throughputs and their ratio, or why it is unmeasured."""
    name, have = ENGINE_NAMES[engine], ", ".join(ENGINE_BACKENDS[engine])
    if c.fallback_tok_s is None:
        return f"batch size {c.batch_size}: no configuration of this study ran on a backend {name} has ({have}): the cost is unmeasured"
    ratio = c.ratio
    return (
        f"batch size {c.batch_size}: the best configuration on a backend {name} has ({c.fallback_backend}: {c.fallback_config}, "
        f"trial {c.fallback_trial}) ran {c.fallback_tok_s:.1f} tok/s against the winner's {c.winner_tok_s:.1f} on {c.backend}: "
        f"{ratio:.3f}x ({(ratio - 1) * 100:+.1f}%)"
    )


def header_lines(rows: list[dict], engine: str) -> list[str]:
    """The `#` lines an export opens its allreduce part with: the winner's backend, the engine's
    setting for it (or its nearest, with the cost), and where the batch sizes' winners differ."""
    first, name = rows[0], ENGINE_NAMES[engine]
    choice = engine_allreduce(engine, str(first.get("backend")))
    words = BACKEND_WORDS.get(choice.backend, choice.backend)
    if choice.equivalent:
        lines = [f"# allreduce: the winner ran {choice.backend} ({words}); {name}'s equivalent: {choice.choice}"]
    else:
        lines = [
            f"# allreduce: the winner ran {choice.backend} ({words}), which {name} has no equivalent of;",
            f"#   nearest: {choice.choice}",
        ]
    lines += [f"#   {n}" for n in choice.notes]
    others = [r for r in rows[1:] if r.get("backend") != first.get("backend")]
    if others:
        lines.append(
            f"#   {name} runs one allreduce: the batch-size-{first['batch_size']} winner's is used; "
            + "; ".join(f"batch size {r['batch_size']} was won on {r.get('backend')}" for r in others)
        )
    costs = allreduce_costs(rows, engine)
    if costs:
        lines.append(f"# what the missing allreduce costs (this study's trials; {name}'s own nearest choice was not measured):")
        lines += [f"#   {cost_text(c, engine)}" for c in costs]
    return lines
