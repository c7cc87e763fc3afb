"""Plain data passed from the driver to the workers and back (picklable; no Ray, no Optuna, no
torch), and the draft-count rule both sides share (`MAX_DRAFT_TOKENS`, `tree_size`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from workers.spec.allreduce_table import AllreduceTable
from workers.spec.engine_config import EngineConfig
from workers.spec.params import param
from workers.spec.run_stats import RunStats

MAX_DRAFT_TOKENS = 16  # the draft link's capacity (workers/engine/link.py): drafts a step scores at most


def tree_size(k: int, width: int) -> int:
    """Drafts in an EAGLE-3 tree of k depths and `width` tokens at each (a chain: k): the width the
    verifier warms (`Verifier._tree_nodes`), what `Eagle3Drafter._width` checks and `shape_tree`
    builds, and what the orchestrator counts (validate's cache sizing, the SGLang export)."""
    return min(k * width, MAX_DRAFT_TOKENS) if width >= 2 else k


def batch_refusal(batch_size: int, *, drafter_process: bool, hidden_over_link: bool, tree: bool, sampled: bool) -> str | None:
    """The one rule of batch sizes > 1 (workers/engine/batched.py runs what it allows), None where a
    run at `batch_size` can decode in batches. `drafter_process`: the drafter runs in a process of its
    own (a draft model, layer-skip, an eagle3 head at placement actor, the n-gram actor); `hidden_over_link`:
    an eagle3 head reads the verifier's hidden states over the draft link; `tree`: it drafts a tree
    (drafter.tree_width >= 2); `sampled`: temperature > 0 without simulated acceptance."""
    if batch_size < 1:
        return f"batch size must be at least 1, not {batch_size}"
    if batch_size == 1:
        return None
    if hidden_over_link:
        return "batch sizes > 1 run the eagle3 head inside the verifier ranks (placement rank0), not as a process of its own"
    if tree:
        return "batch sizes > 1 draft chains only: a tree (drafter.tree_width >= 2) runs at batch size 1"
    if drafter_process and sampled:
        return "batch sizes > 1 with a drafter process of its own need greedy decoding (temperature 0) or simulated acceptance"
    return None


DRAFTER_KINDS = ("none", "draft_model", "ngram", "layer_skip", "eagle3", "mtp")
DRAFTER_PLACEMENTS = ("actor", "rank0")  # eagle3: its own process, or inside the verifier ranks


@dataclass(frozen=True)
class DrafterSpec:
    """The drafter of a gang. Its `param` fields are the parameters drafter.* (workers/spec/params.py:
    the YAML section `drafter:`, the search space, decode's flags and the MLflow params derive from them);
    `kind`'s default is what a YAML that drafts (k > 0) and names no drafter gets. No drafter: NO_DRAFTER."""

    kind: str = param("ngram", "drafter: " + ", ".join(DRAFTER_KINDS), choices=DRAFTER_KINDS, flags=("--drafter",))
    layers: int | None = param(
        None,
        "layer_skip: the verifier's first layers that draft",
        low=1,
        drafters=("layer_skip",),
        flags=("--draft-layers",),
        flag_doc="verifier layers that draft (--drafter layer_skip; default: half)",
    )
    ngram_max: int = param(3, "ngram: the longest n-gram matched", low=1, high=8, drafters=("ngram",))
    ngram_min: int = param(1, "ngram: the shortest n-gram matched", low=1, high=8, drafters=("ngram",))
    model_path: str | None = param(
        None,
        "draft_model: a checkpoint with the model's tokenizer; eagle3: an EAGLE-3 head",
        drafters=("draft_model", "eagle3"),
        flags=("--draft-model",),
    )
    # eagle3: the head as its own process on the draft link ("actor"; the verifier's hidden states
    # travel to it) or inside the verifier ("rank0": every TP rank runs its copy of the head on the
    # states it holds anyway, so nothing crosses the link)
    placement: str = param(
        "actor",
        "eagle3: the head as its own process (actor) or inside the verifier ranks (rank0)",
        choices=DRAFTER_PLACEMENTS,
        drafters=("eagle3",),
        flags=("--draft-placement",),
    )
    # eagle3: n-gram lookup of the last `lookup` committed tokens. A chain: an earlier occurrence
    # drafts its continuation instead of the head. A tree (tree_width >= 2): the continuations of
    # the longest matches (lookup down to 1 token, two at most) join the head's tree as branches.
    lookup: int = param(
        0,
        "eagle3: n-gram lookup of the last N tokens: a chain drafts what followed their earlier occurrence instead of "
        "the head; a tree adds the continuations of the two longest matches (N down to 1 token) as branches; 0: the head alone",
        low=0,
        high=8,
        drafters=("eagle3",),
        flags=("--draft-lookup",),
    )
    # eagle3: at each depth the head's top-w tokens, the first continuing the chain and the others
    # leaves, verified in one pass under a tree mask. Widths 0 and 1 both draft a chain: one value (0)
    tree_width: int = param(
        0,
        "eagle3: 0/1 drafts a chain; w >= 2 a tree: the head's top-w tokens at each depth, verified in one pass under a tree mask",
        low=0,
        high=8,
        drafters=("eagle3",),
    )
    # n-gram only: run it as its own process on the draft link (two link messages per step) instead
    # of inside every verifier rank; kept to measure what those messages cost
    ngram_actor: bool = False

    def __post_init__(self) -> None:
        if self.tree_width == 1:
            object.__setattr__(self, "tree_width", 0)  # frozen: the one spelling of a chain

    @property
    def in_verifier(self) -> bool:
        """An n-gram drafter's proposals are a pure function of the committed tokens, which every
        verifier rank holds: each rank runs its own copy and no message crosses the draft link. An
        eagle3 head placed at rank0 likewise reads states every rank holds; an MTP layer is part of the
        verifier's own model, split across its ranks like its other layers."""
        return (
            (self.kind == "ngram" and not self.ngram_actor) or (self.kind == "eagle3" and self.placement == "rank0") or self.kind == "mtp"
        )

    @property
    def runs_a_model(self) -> bool:
        """A drafter with weights (a share of a GPU where it is a process of its own)."""
        return self.kind in ("draft_model", "layer_skip", "eagle3")


NO_DRAFTER = DrafterSpec(kind="none")


@dataclass(frozen=True)
class GangSpec:
    """Everything the processes of one gang need to load their part (fixed for the gang's life)."""

    model_path: str
    tp: int = 1
    backend: str = "gloo"
    drafter: DrafterSpec = field(default_factory=lambda: NO_DRAFTER)
    dtype: str = "float32"
    device: str = "cpu"
    max_seq: int = 2048
    vocab_parallel: bool = False
    threads: int = 1  # torch intra-op threads per process
    engine: EngineConfig = field(default_factory=EngineConfig)  # what the decode engine runs (workers/spec/engine_config.py)
    # the largest Workload.batch_size the gang will run: sizes the allreduce buffers (a batched pass
    # reduces B x (k + 1) tokens' hidden states) and the batch KV cache
    max_batch: int = 1
    # emulated TP (parallel.emulate_tp; tp is then 1): the one verifier process holds rank 0's shard of
    # TP `emulate_tp`, and each collective waits `backend`'s latency in `allreduce_table` instead of
    # communicating (workers/comm/emulated.py). 0: the ranks are real
    emulate_tp: int = 0
    allreduce_table: AllreduceTable | None = None

    @property
    def shard_world(self) -> int:
        """The TP size the verifier's weights are split for: the emulated one, else tp."""
        return self.emulate_tp or self.tp

    @property
    def has_drafter(self) -> bool:
        """A drafter process (rank tp) is part of the gang; an in-verifier n-gram drafter is not one."""
        return self.drafter.kind != "none" and not self.drafter.in_verifier

    @property
    def drafts(self) -> bool:
        return self.drafter.kind != "none"

    @property
    def world_size(self) -> int:
        return self.tp + int(self.has_drafter)


@dataclass(frozen=True)
class Workload:
    """One decoding run: the same prompts, one speculation setting."""

    prompts: tuple[tuple[int, ...], ...]
    max_new_tokens: int = 64
    num_draft_tokens: int = 0  # k; 0 = plain decoding (the baseline)
    temperature: float = 0.0
    seed: int = 0
    eos_ids: tuple[int, ...] = ()
    # engine speed apart from drafter quality: the verifier accepts exactly tau - 1 drafts per step
    # (on average, for a fractional tau); the tokens are then meaningless, the timing is real
    simulate_accept_len: float | None = None
    # or position by position: P(accepted >= i), i = 1, 2, ...; a step with k drafts keeps sum_{i<=k} P_i
    # of them on average (0 past the profile)
    simulate_accept_profile: tuple[float, ...] | None = None
    # time one step with and without the allreduce at the end (compute vs communication split)
    comm_ablation_iters: int = 0
    # at the end, time one verify pass at each of these widths (median of `profile_iters`): the pass's
    # cost per width for the performance model, which a line in the width misses where the matrix
    # kernels change with the rows they multiply (batch 1 only)
    profile_widths: tuple[int, ...] = ()
    profile_iters: int = 0
    # an MoE verifier, batch 1: at the end, count the distinct routed experts that passes of 1 .. 9 of the
    # decoded tokens read (workers/engine/experts.py; one untimed forward per prompt)
    count_experts: bool = False
    # plain greedy decoding: also record each token's top-1 / top-2 logit margin (relative to the top
    # logit), so a speculative run that leaves this output at a numerical near tie can be told apart
    # from a wrong one (orchestrator/study/equivalence.py)
    record_margins: bool = False
    # B > 1: the prompts decode in static batches of B (in order; the last batch may hold fewer),
    # one verify pass of B x (k + 1) tokens per step (workers/engine/batched.py)
    batch_size: int = 1

    @property
    def simulated(self) -> bool:
        """Acceptance is imposed (simulate_accept_len or simulate_accept_profile): tokens are not the model's."""
        return self.simulate_accept_len is not None or self.simulate_accept_profile is not None

    def simulated_drafts(self, chain: int) -> float:
        """Drafts a step keeps on average out of a chain of `chain` under the imposed acceptance."""
        if self.simulate_accept_profile is not None:
            return float(sum(self.simulate_accept_profile[:chain]))
        return float(self.simulate_accept_len or 1.0) - 1.0


@dataclass
class PromptResult:
    tokens: list[int]  # generated tokens (prompt excluded)
    seconds: float  # wall time for this prompt, prefill included
    steps: int  # verifier decode steps after the prefill
    accepted: int  # drafts accepted over all steps
    prefill_s: float = 0.0  # prompt forward + first token
    margins: list[float] = field(default_factory=list)  # Workload.record_margins: one per token

    @property
    def accept_len(self) -> float:
        """Tokens emitted per decode step (accepted drafts + 1); 1.0 for plain decoding."""
        return (self.accepted + self.steps) / self.steps if self.steps else 1.0


def width_metric(width: int) -> str:
    """The metric of one verify pass's ms at `width` tokens (Workload.profile_widths)."""
    return f"verify_ms_w{width}"


def experts_metric(width: int) -> str:
    """The metric of the distinct routed experts a pass of `width` tokens reads, per MoE layer (Workload.count_experts)."""
    return f"moe_experts_w{width}"


@dataclass
class RunResult:
    """What verifier rank 0 returns for one Workload (raw per-step records, so the driver can
    merge runs over prompt chunks and recompute the metrics)."""

    prompts: list[PromptResult]
    stats: RunStats
    num_draft_tokens: int
    ablation: dict[str, float] = field(default_factory=dict)  # Verifier.comm_split of the step width
    width_ms: dict[int, float] = field(default_factory=dict)  # Workload.profile_widths: ms of one verify pass per width
    # Workload.count_experts: width -> (distinct experts summed over layers and passes, layer-passes counted)
    experts: dict[int, tuple[float, int]] = field(default_factory=dict)

    @property
    def metrics(self) -> dict[str, float]:
        m = self.stats.metrics(self.num_draft_tokens)
        if self.prompts:
            m["prefill_ms_mean"] = 1e3 * sum(p.prefill_s for p in self.prompts) / len(self.prompts)
        if self.ablation and m.get("step_ms_p50"):
            # communication per step from the no-op ablation, as a share of the step it was timed in (the
            # ablation's step with its allreduces): one pair of timings, where the run's p50 step is another
            # sitting's (on shared CPU cores the two drift apart and the mixed ratio with them)
            m["comm_ms_counted"] = m.get("comm_ms_per_step", 0.0)
            m.update(self.ablation)
            whole = self.ablation.get("ablation_step_ms") or m["step_ms_p50"]
            m["comm_fraction"] = min(1.0, self.ablation["comm_ms_per_step"] / whole)
        m.update({width_metric(W): ms for W, ms in self.width_ms.items()})
        m.update({experts_metric(W): total / n for W, (total, n) in self.experts.items() if n})
        return m

    @classmethod
    def merge(cls, parts: list[RunResult]) -> RunResult:
        stats = RunStats()
        for p in parts:
            stats.steps.extend(p.stats.steps)
            stats.tokens += p.stats.tokens
            stats.seconds += p.stats.seconds
        return cls(
            prompts=[r for p in parts for r in p.prompts],
            stats=stats,
            num_draft_tokens=parts[0].num_draft_tokens,
            ablation=parts[-1].ablation,
            width_ms=next((p.width_ms for p in reversed(parts) if p.width_ms), {}),
            experts={
                W: (sum(p.experts[W][0] for p in parts if W in p.experts), sum(p.experts[W][1] for p in parts if W in p.experts))
                for W in sorted({W for p in parts for W in p.experts})
            },
        )
