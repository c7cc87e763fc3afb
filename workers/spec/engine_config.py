"""`EngineConfig`: what the decode engine runs, as one typed, frozen value (no environment switches).

It travels in the `GangSpec` to every worker process (local gang or Ray actor) and is handed
explicitly to `StepRunner`, `FusedStep`, the GEMV picker and the fused add + norm check. On the
driver it is the YAML section `engine:` (orchestrator/config/schema.py), the `spectune decode` flags and
the MLflow params `engine.<field>` (orchestrator/config/registry.py lists them from `ENGINE_FIELDS`).

    engine = EngineConfig(attention="sdpa", gemv="off")
    engine.describe()   # {"attention": "sdpa", "cuda_graphs": True, ...}

Fields (the only place they are documented; the schema and the registry copy these lines):
- attention:      the graphed steps' attention core: triton (split-KV kernel), sdpa, or auto
                  (triton where it runs, else sdpa)
- cuda_graphs:    capture decode / verify steps as CUDA graphs (CUDA only; CPU always runs eagerly)
- compile:        merged weights and torch.compile'd layer bodies inside the graphs
                  (workers/engine/fused_step.py); off: the graphs hold the plain model
- gemv:           the step GEMMs: auto (per shape and width the faster of cuBLAS and the Triton
                  GEMV, by a timed race on CUDA), cublas, triton, or off (the GEMMs inside the
                  compiled bodies)
- fused_add_norm: where the allreduce backend can (symm_mem_ll), the residual add and the next
                  RMS norm run in the allreduce's kernel
- moe_kernel:     an MoE layer's routed experts inside the graphed steps: triton (grouped kernel,
                  workers/kernels/moe.py: each chosen expert's weights read once per step), dense
                  (every expert over every token, graph-safe torch ops; reads all experts), or auto
                  (triton where it runs, else dense). Eager passes (prefill, CPU) loop over the
                  chosen experts. No effect on dense models.
- overlap:        greedy decoding overlaps the host with the device: plain steps on CUDA graphs
                  enqueue step n + 1 before reading step n; with an in-rank EAGLE-3 chain, verify,
                  acceptance and the next chain stay on the device (workers/engine/device_loop.py)
                  and the host reads each step's result while the chain runs
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

ATTENTION_CHOICES = ("auto", "triton", "sdpa")
GEMV_CHOICES = ("auto", "cublas", "triton", "off")
MOE_KERNEL_CHOICES = ("auto", "triton", "dense")

# field -> (allowed values, one line of documentation): the registry and the YAML schema read this
ENGINE_FIELDS: dict[str, tuple[tuple, str]] = {
    "attention": (ATTENTION_CHOICES, "attention of the graphed steps: triton (split-KV kernel), sdpa, or auto (triton where it runs)"),
    "cuda_graphs": ((True, False), "capture decode / verify steps as CUDA graphs (CUDA only)"),
    "compile": ((True, False), "merged weights and torch.compile'd layer bodies inside the graphs (off: the plain model)"),
    "gemv": (GEMV_CHOICES, "step GEMMs: auto (faster of cuBLAS and the Triton GEMV per shape), cublas, triton, or off"),
    "fused_add_norm": ((True, False), "residual add + next RMS norm inside the allreduce kernel where the backend can"),
    "moe_kernel": (MOE_KERNEL_CHOICES, "MoE routed experts in graphed steps: triton (grouped kernel), dense (all experts), or auto"),
    "overlap": (
        (True, False),
        "greedy decoding: plain steps enqueue step n + 1 before reading step n; in-rank EAGLE-3 chains verify, accept and draft on the device",
    ),
}


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    attention: str = "auto"
    cuda_graphs: bool = True
    compile: bool = True
    gemv: str = "auto"
    fused_add_norm: bool = True
    moe_kernel: str = "auto"
    overlap: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            allowed, _ = ENGINE_FIELDS[f.name]
            value = getattr(self, f.name)
            if isinstance(allowed[0], bool):
                if not isinstance(value, bool):
                    raise ValueError(f"engine.{f.name}: {value!r} is not true or false")
            elif value not in allowed:
                raise ValueError(f"engine.{f.name}: {value!r} is not one of {', '.join(allowed)}")

    def describe(self) -> dict:
        """Field -> value (what a worker reports in its setup info)."""
        return asdict(self)


assert set(ENGINE_FIELDS) == {f.name for f in fields(EngineConfig)}, "every engine field is documented once"
