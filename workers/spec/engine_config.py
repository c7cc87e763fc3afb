"""`EngineConfig`: what the decode engine runs, as one typed, frozen value (no environment switches).

It travels in the `GangSpec` to every worker process (local gang or Ray actor) and is handed
explicitly to `StepRunner`, `FusedStep`, the GEMV picker and the fused add + norm check. On the
driver it is the YAML section `engine:` (orchestrator/config/schema.py), the `spectune decode` flags and
the MLflow params `engine.<field>`, all derived from the fields below (orchestrator/config/registry.py).

    engine = EngineConfig(attention="sdpa", gemv="off")
    engine.describe()   # {"attention": "sdpa", "cuda_graphs": True, ...}

Each field is a parameter declared once (`param`, workers/spec/params.py): its one line of
documentation is what the YAML schema, decode's --help and docs/reference.md show. At length:
- gemv auto:   per shape and width the faster of cuBLAS and the Triton GEMV, by a timed race on CUDA;
               off: the GEMMs inside the compiled bodies
- moe_kernel:  with CUDA graphs and the grouped kernel picked, the prefill runs it too (in chunks of
               tokens); otherwise (dense, CPU, no graphs) eager passes loop over the chosen experts;
               no effect on dense models
- mla:         latent attention's cache (workers/model/transformer.py `LatentAttention`): absorbed reads
               kv_lora_rank + qk_rope numbers a cached token; no effect on other attention
- overlap:     with an in-rank EAGLE-3 chain, verify, acceptance and the next chain stay on the device
               (workers/engine/device_loop.py) and the host reads each step's result while the chain runs
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from workers.spec.params import check_choices, param

ATTENTION_CHOICES = ("auto", "triton", "sdpa")
GEMV_CHOICES = ("auto", "cublas", "triton", "off")
MOE_KERNEL_CHOICES = ("auto", "triton", "dense")
MLA_CHOICES = ("absorbed", "expanded")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    attention: str = param(
        "auto",
        "attention of the graphed steps: triton (split-KV kernel), sdpa, or auto (triton where it runs)",
        choices=ATTENTION_CHOICES,
    )
    cuda_graphs: bool = param(
        True,
        "capture decode / verify steps as CUDA graphs (CUDA only)",
        flag_doc="run CUDA steps eagerly",
    )
    compile: bool = param(
        True,
        "merged weights and torch.compile'd layer bodies inside the graphs (off: the plain model)",
        flag_doc="CUDA graphs of the plain model (no merged weights, no torch.compile)",
    )
    gemv: str = param(
        "auto",
        "step GEMMs: auto (faster of cuBLAS and the Triton GEMV per shape), cublas, triton, or off",
        choices=GEMV_CHOICES,
    )
    fused_add_norm: bool = param(
        True,
        "residual add + next RMS norm inside the allreduce kernel where the backend (symm_mem_ll) can",
        flag_doc="allreduce, then add and norm, even where the backend fuses them",
    )
    moe_kernel: str = param(
        "auto",
        "MoE routed experts in graphed steps: triton (grouped kernel, each chosen expert read once; also the CUDA prefill), dense (all experts), or auto",
        choices=MOE_KERNEL_CHOICES,
    )
    mla: str = param(
        "absorbed",
        "latent attention (DeepSeek-V3): absorbed (one compressed cache entry a token, projections folded into query and output) or expanded (each head's K/V)",
        choices=MLA_CHOICES,
    )
    overlap: bool = param(
        True,
        "greedy decoding: plain steps enqueue step n + 1 before reading step n; in-rank EAGLE-3 chains verify, accept and draft on the device",
        flag_doc="greedy steps read each step back before launching the next (in-rank EAGLE-3 drafts too)",
    )

    def __post_init__(self) -> None:
        check_choices(EngineConfig, self, "engine")

    def describe(self) -> dict:
        """Field -> value (what a worker reports in its setup info)."""
        return asdict(self)
