"""Decode / verify steps of one sequence on a model + KV cache, eager or as CUDA graphs.

    runner = StepRunner(model, cache, max_width=k + 1, engine=EngineConfig(), allreduce=allreduce)
    logits = runner.step([last, d1, d2])      # [T, vocab] float32; advances cache.lengths[0] by T
    runner.prefill(prompt)                      # eager, any length

On CUDA each step width T (1 .. max_width) is captured once as a CUDA graph over static buffers:
token ids and positions are copied in (through pinned staging, behind an event), K/V are
written at those positions (index_copy_), and attention reads the static cache up to each query's
position (the split-KV Triton kernel; SDPA under a position mask where it does not run), so no
shape depends on the sequence length. A token tree (`step(..., parents=)`) is one graph per tree
width: entries rotated at their depth, each seeing the prefix and its ancestors (ancestor bits
for the kernel, a mask for SDPA). The graphs share one memory pool. A graph's allreduces (NCCL or symmetric
memory) are captured with it; the allreduce object's `enabled` flag is part of the graph key, so
the compute-only ablation replays its own graphs. The returned logits live in the graph's output
buffer: consume them before the next step.

`draft_chain(tokens, k)` is a greedy drafter's whole proposal as one graph: feed `tokens`, then
k - 1 times its own argmax, each token fed on the device, so k drafts cost one replay and one
host sync instead of k of each.

Every graphed body goes through `replay(key, run, restore)`: captured on first use (a body that
feeds itself has its static inputs restored after the capture's warm-up runs), replayed after; the
device loop's verify + acceptance graph (workers/engine/device_loop.py) is one such key.

`greedy_launch` / `greedy_result` overlap the host with the GPU in plain greedy decoding (k = 0):
the step's graph writes its own argmax and next position into the input buffer, so step n + 1 is
enqueued before the host reads step n's token (from a pinned slot, behind an event) and the GPU
never idles while the host checks EOS, records stats and launches (0.13 ms a step on the H200,
against a 3.2 ms TP 2 step). The price is one step past an EOS, run and thrown away.

    slot = runner.greedy_launch(first_token)
    nxt = runner.greedy_launch()            # before reading `slot`
    token, top1, top2 = runner.greedy_result(slot)
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch

from workers.engine.fused_step import try_fused
from workers.model.transformer import KVCache, Transformer, tree_mask, tree_shape
from workers.spec.engine_config import ATTENTION_CHOICES, EngineConfig


def no_cudnn_attention() -> None:
    """Keep SDPA off cuDNN in this process. torch 2.11 sends masked SDPA to cuDNN first, which
    builds an execution plan for every new shape (~0.4 s each): every prompt length of the eager
    prefill paid it (H200, Llama-3-8B: 615 ms to prefill ~220 tokens). Flash and memory-efficient
    attention need no plan."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def pick_attention(choice: str, head_dim: int, device: torch.device):
    """The attention core of the graphed steps: (attend_fn or None for SDPA, a note for the log)."""
    if choice not in ATTENTION_CHOICES:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_CHOICES)}, not {choice!r}")
    if choice == "sdpa":
        return None, "sdpa"
    from workers.kernels import attention as decode_attention

    why_not = decode_attention.available(head_dim, device)
    if why_not is None:
        return decode_attention.decode_attend, "triton"
    if choice == "triton":
        raise ValueError(f"attention 'triton' cannot run here: {why_not}")
    return None, f"sdpa ({why_not})"


def tree_step_inputs(tokens: list[int], parents: list[int], start: int, ids: torch.Tensor | None, mask: torch.Tensor | None = None) -> None:
    """A tree step's inputs for `_run_tree`, written into the first len(tokens) columns / rows:
    ids [4, W] (token ids, rotary positions start + depth, cache slots start + i, ancestor bits for
    the split-KV attention) and, for SDPA, mask [W, S] (row i: the cache before start, then entry
    i's ancestors among the new slots, nothing after). None: not written."""
    T = len(tokens)
    if ids is not None:
        depth, bits = tree_shape(parents)
        ids[:, :T] = torch.tensor([tokens, [start + d for d in depth], list(range(start, start + T)), bits])
    if mask is not None:
        mask[:T] = tree_mask(parents, start, mask.shape[1])


@dataclass(frozen=True)
class StepGraph:
    """A verify step of `width` tokens; `comm`: the allreduce on (off: the compute-only ablation)."""

    width: int
    comm: bool


@dataclass(frozen=True)
class TreeGraph:
    """A tree step of `width` entries (the root and its drafts)."""

    width: int
    comm: bool


@dataclass(frozen=True)
class ChainGraph:
    """A greedy draft chain: feed `width` tokens, then k - 1 of its own argmaxes."""

    width: int
    k: int
    comm: bool


@dataclass(frozen=True)
class GreedyGraph:
    """The self-feeding greedy width-1 step (k = 0), with or without near-tie margins."""

    comm: bool
    margins: bool


@dataclass(frozen=True)
class AcceptGraph:
    """A device loop's verify + acceptance (workers/engine/device_loop.py), bound to that loop's buffers."""

    loop: int  # id() of the DeviceLoop
    comm: bool
    simulated: bool


GraphKey = StepGraph | TreeGraph | ChainGraph | GreedyGraph | AcceptGraph


def use_grouped_experts(model: Transformer, engine: EngineConfig) -> str | None:
    """What an MoE layer's routed experts run on CUDA: inside the graphs where the plain model is
    captured (no fused step: engine.compile off, a family FusedStep refuses, or its fallback), the
    grouped Triton kernel unless engine.moe_kernel is dense or it cannot run here (then the dense loop
    over every expert, which reads all experts a step and so overstates the verify cost's flatness in
    width); in eager passes (the prefill, the MTP drafter's steps), the grouped kernel in chunks of
    tokens where it runs, else the loop over the chosen experts. Returns the graphs' path, or None for
    a dense model."""
    from workers.engine.experts import moe_layers
    from workers.model.moe import MoE

    moes = moe_layers(model)
    if not moes:
        return None
    if model.mtp is not None and isinstance(model.mtp.mlp, MoE):
        moes.append(model.mtp.mlp)  # the MTP drafter's experts: eager steps
    from workers.kernels import moe as moe_kernels

    device = model.embed_tokens.weight.device
    if engine.moe_kernel == "dense" or not moe_kernels.available(device):
        return "dense"
    for m in moes:
        m.graph_experts = moe_kernels.grouped_experts
        m.eager_experts = moe_kernels.grouped_experts_chunked
    if device.type == "cuda":  # the kernels compile here, not in the first timed prefill
        moe_kernels.warm_chunked(moes[0].experts, moes[0].gate.top_k, model.embed_tokens.weight.dtype)
    return "grouped"


class StepRunner:
    """engine: what runs (workers/spec/engine_config.py); allreduce: the TP allreduce of `model`'s
    row-parallel outputs (None: one rank), handed on to the fused step."""

    def __init__(self, model: Transformer, cache: KVCache, max_width: int, engine: EngineConfig | None = None, allreduce=None):
        engine = engine or EngineConfig()
        self.model, self.cache, self.max_width, self.engine = model, cache, max_width, engine
        self.allreduce = allreduce
        self.device = model.embed_tokens.weight.device
        self.use_graphs = engine.cuda_graphs and self.device.type == "cuda"
        # merged weights + compiled layer bodies (workers/engine/fused_step.py) for the graphed steps, with the
        # split-KV Triton attention where it runs (workers/kernels/attention.py)
        fused = engine.compile and self.use_graphs
        attend_fn, self.attention = pick_attention(engine.attention, model.args.head_dim, self.device) if fused else (None, None)
        self.fast = try_fused(model, engine, allreduce, attend_fn) if fused else None
        if self.fast is None:  # the plain model's own attention runs, whatever the fused step would have picked
            self.attention = model.layers[0].self_attn.core
        # the plain model's routed experts in graphs; the fused step picks its own (`moe_experts` says which ran)
        self._plain_experts = use_grouped_experts(model, engine) if self.use_graphs else None
        # one (graph, output, allreduce calls) per kind and shape of graphed body (GraphKey)
        self.graphs: dict[GraphKey, tuple[torch.cuda.CUDAGraph, torch.Tensor, int]] = {}
        self._pool = None
        self._aux: dict[GraphKey, list[torch.Tensor]] = {}
        self._staged: torch.cuda.Event | None = None  # set below where steps are graphs (CUDA)
        # the device loops of this runner by k (workers/engine/device_loop.py): their graphs are bound to their buffers
        self.device_loops: dict[int, object] = {}
        # the graphed bodies' static input: tokens, positions (on CPU too, where the bodies run eagerly in tests)
        self._inputs = torch.zeros(2, max_width, dtype=torch.long, device=self.device)
        if self.use_graphs:
            self._staging = torch.zeros(2, max_width, dtype=torch.long).pin_memory()
            # recorded after each non-blocking copy out of pinned staging (`_stage`, the tree step's):
            # the host waits on it before rewriting staging, so a copy the GPU has not run yet never
            # reads the next step's values (whatever the caller synced in between)
            self._staged = torch.cuda.Event()
            # greedy_launch: two result slots, one in flight while the host reads the other: the
            # argmax alone, or with margins (argmax, top-1 and top-2 logit); an event per slot says
            # its copy has landed
            self._greedy_tok = torch.zeros(2, 1, dtype=torch.long).pin_memory()
            self._greedy_out = torch.zeros(2, 3, dtype=torch.float64).pin_memory()
            self._greedy_done = [torch.cuda.Event() for _ in range(2)]
            self._greedy_margins = [False, False]
            self._greedy_n = 0

    @property
    def moe_experts(self) -> str | None:
        """How the graphed steps run an MoE layer's routed experts: grouped (the Triton kernel, each
        chosen expert read once), dense (every expert), eager (no graphs: a loop over the chosen
        experts); None for a dense model. The record carries it: dense figures overstate a deep k's cost."""
        if not any(getattr(layer.mlp, "graph_experts", None) for layer in self.model.layers):
            return None
        if not self.use_graphs:
            return "eager"
        if self.fast is not None and self.fast.experts_fn is not None:
            from workers.model.moe import experts_dense

            return "dense" if self.fast.experts_fn is experts_dense else "grouped"
        return self._plain_experts

    def prefill(self, tokens: list[int]) -> torch.Tensor:
        """Eager pass over a prompt (or anything longer than max_width): logits of the last token (the head
        runs on that one position: [T, vocab] logits of a 32k-token context would take tens of GB)."""
        h = self.model.hidden(torch.tensor([tokens], device=self.device), self.cache)
        return self.model.logits(h[:, -1])[0]

    def _comm_on(self) -> bool:
        return bool(getattr(self.allreduce, "enabled", True))

    def step(self, tokens: list[int], tail: torch.Tensor | None = None, parents: list[int] | None = None) -> torch.Tensor:
        """Logits [T, vocab] of `tokens` fed after the cached positions. tail: more tokens [n] on the
        device (an in-rank chain's drafts), fed after `tokens` without reading them on the host
        where the step is a graph (copied into its input on the device, behind the chain).
        parents: `tokens` is a tree, parents[i] the index of entry i's parent (-1: entry 0, the
        root), scored under a tree mask (`Transformer.tree_logits`; a graph per width on CUDA)."""
        if parents is not None:
            tokens = tokens + ([] if tail is None else tail.tolist())
            if not self.use_graphs or len(tokens) > self.max_width:
                return self.model.tree_logits(tokens, parents, self.cache)
            return self._tree_replay(tokens, parents)
        T = len(tokens) + (0 if tail is None else tail.shape[0])
        if not self.use_graphs or T > self.max_width:
            if tail is not None:
                tokens = tokens + tail.tolist()
            return self.model(torch.tensor([tokens], device=self.device), self.cache)[0]
        start = self.cache.lengths[0]
        if start + T > self.cache.max_seq:
            raise ValueError(f"sequence length {start + T} exceeds the cache ({self.cache.max_seq})")
        self._stage(tokens, start, T)
        if tail is not None:
            self._inputs[0, len(tokens) : T].copy_(tail)
        out = self.replay(StepGraph(T, self._comm_on()), lambda: self._run_static(T))
        self.cache.lengths[0] = start + T
        return out[0]

    def replay(self, key: GraphKey, run, restore: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
        """`run()` (device ops only, reading the static inputs) as the CUDA graph `key`, captured on
        first use (its aux states kept as that graph's static outputs) and replayed; eagerly where
        steps are not graphs (CPU: the same body, for tests). restore: more static tensors the body
        writes besides `_inputs`, put back after the capture's warm-up runs."""
        if not self.use_graphs:
            return run()
        self._ensure_graph(key, run, restore)
        graph, out, calls = self.graphs[key]
        graph.replay()
        if self.model.aux_layers:
            self.model.aux = self._aux[key]
        if calls and self.allreduce is not None:  # a replay issues the allreduces its capture recorded
            self.allreduce.counters.calls += calls
        return out

    def _ensure_graph(self, key: GraphKey, run, restore: tuple[torch.Tensor, ...] = ()) -> None:
        if key not in self.graphs:
            self.graphs[key] = self._capture_or_fall_back(run, restore)
            self._aux[key] = list(self.model.aux)  # captured hidden states: static outputs of this graph

    def _tree_replay(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """A tree step as a CUDA graph of its width: token ids, rotary positions (start + depth),
        cache slots (start + i) and ancestor bits into static inputs. The fused body where there is
        one; its attention the split-KV kernel reading the bits where that runs, else SDPA under a
        mask over the whole static cache (the prefix, then each entry's ancestors) staged into a
        static [max_width, max_seq] buffer."""
        T, start = len(tokens), self.cache.lengths[0]
        if start + T > self.cache.max_seq:
            raise ValueError(f"sequence length {start + T} exceeds the cache ({self.cache.max_seq})")
        self._tree_buffers()
        needs_mask = self._tree_needs_mask()
        self._stage_tree(tokens, parents, start, ids=True, mask=needs_mask)
        key = TreeGraph(T, self._comm_on())
        if key not in self.graphs:
            self._ensure_graph(key, lambda: self._run_tree(T))
            if self._tree_needs_mask() and not needs_mask:  # the compiled body failed: SDPA reads the mask
                self._stage_tree(tokens, parents, start, ids=False, mask=True)
        out = self.replay(key, lambda: self._run_tree(T))
        self.cache.lengths[0] = start + T
        return out[0]

    def _stage_tree(self, tokens: list[int], parents: list[int], start: int, ids: bool, mask: bool) -> None:
        """The tree step's inputs (ids: tokens, positions, slots, bits; mask: SDPA's rows) through
        pinned staging into the static inputs."""
        T, staged = len(tokens), self._staged  # None on CPU (tests of the body)
        if staged is not None:
            staged.synchronize()
        tree_step_inputs(tokens, parents, start, self._tree_staging if ids else None, self._mask_staging if mask else None)
        if ids:
            self._tree_in.copy_(self._tree_staging, non_blocking=True)
        if mask:
            self._tree_mask[:T].copy_(self._mask_staging[:T], non_blocking=True)
        if staged is not None:
            staged.record()

    def _tree_needs_mask(self) -> bool:
        """Whether the tree step's attention is SDPA under a mask (not the split-KV kernel's bits)."""
        return self.fast is None or self.fast.rope_attend is None

    def _tree_buffers(self) -> None:
        """The tree step's static inputs (device) and their host staging (pinned on CUDA), once."""
        if hasattr(self, "_tree_in"):
            return
        W, S, pin = self.max_width, self.cache.max_seq, self.device.type == "cuda"
        staging = torch.zeros(4, W, dtype=torch.long)  # tokens, rotary positions, slots, ancestor bits
        mask = torch.zeros(W, S, dtype=torch.bool)
        self._tree_staging, self._mask_staging = (staging.pin_memory(), mask.pin_memory()) if pin else (staging, mask)
        self._tree_in = torch.zeros(4, W, dtype=torch.long, device=self.device)
        self._tree_mask = torch.zeros(W, S, dtype=torch.bool, device=self.device)

    def _run_tree(self, T: int) -> torch.Tensor:
        tok, pos, slots, bits = (self._tree_in[i : i + 1, :T] for i in range(4))
        mask = self._tree_mask[:T][None, None]
        if self.fast is not None:
            return self.model.logits(self.fast.hidden_tree(tok, pos, slots, cache=self.cache, mask=mask, bits=bits))
        cos, sin, _ = self.model.rope_and_mask(pos, 0, masked=False)
        return self.model.logits(self.model._layers(tok, cos, sin, mask, slots, self.cache))

    def draft_chain(self, tokens: list[int], k: int) -> list[int] | None:
        """Greedy drafting in one CUDA graph: the argmax after `tokens`, then k - 1 more, each
        fed back on the device. Advances cache.lengths[0] by len(tokens) + k - 1 (the last draft
        is not fed). None where no graph applies (CPU, a feed wider than max_width, a full cache):
        the caller drafts step by step."""
        T = len(tokens)
        start = self.cache.lengths[0]
        if not self.use_graphs or k < 1 or T > self.max_width or start + T + k - 1 > self.cache.max_seq:
            return None
        self._stage(tokens, start)
        out = self.replay(ChainGraph(T, k, self._comm_on()), lambda: self._run_chain(T, k))
        self.cache.lengths[0] = start + T + k - 1
        return out.tolist()

    def greedy_launch(self, token: int | None = None, margins: bool = False) -> int:
        """Enqueue one greedy width-1 step (`token` stages its input: the first step of a prompt;
        later steps read the previous step's argmax, fed on the device) and the copy of its
        argmax (with `margins`, also its top-1 and top-2 logits: a top-k over the vocabulary more
        per step) to a pinned slot; return the slot for greedy_result. Advances
        cache.lengths[0] by 1. At most two steps may be unread at once."""
        start = self.cache.lengths[0]
        if start + 1 > self.cache.max_seq:
            raise ValueError(f"sequence length {start + 1} exceeds the cache ({self.cache.max_seq})")
        if token is not None:
            self._stage([token], start)
        out = self.replay(GreedyGraph(self._comm_on(), margins), lambda: self._run_greedy(margins))
        slot = self._greedy_n % 2
        self._greedy_n += 1
        (self._greedy_out[slot] if margins else self._greedy_tok[slot]).copy_(out, non_blocking=True)
        self._greedy_margins[slot] = margins
        self._greedy_done[slot].record()
        self.cache.lengths[0] = start + 1
        return slot

    def greedy_result(self, slot: int) -> tuple[int, float, float]:
        """The token, top-1 and top-2 logits (NaN without margins) of the step greedy_launch put in
        `slot` (waits for it)."""
        self._greedy_done[slot].synchronize()
        if not self._greedy_margins[slot]:
            return int(self._greedy_tok[slot, 0]), float("nan"), float("nan")
        token, top1, top2 = self._greedy_out[slot].tolist()
        return int(token), top1, top2

    def _run_greedy(self, margins: bool = False) -> torch.Tensor:
        """A width-1 step that feeds itself: its argmax becomes the next input token and the
        position advances by one, on the device (graph-safe). Returns the argmax [1] (int64), or
        with `margins` (argmax, top-1, top-2) as float64."""
        logits = self._run_static(1)[0, -1]
        nxt = logits.argmax().view(1)  # the same tie-break as step() + argmax
        self._inputs[0, :1].copy_(nxt)
        self._inputs[1, :1].add_(1)
        if not margins:
            return nxt
        top = logits.topk(2).values.double()
        return torch.cat([nxt.double(), top])

    def _run_chain(self, T: int, k: int) -> torch.Tensor:
        """The k greedy drafts after the staged `T` tokens (device ops only: graph-safe)."""
        tok, pos = self._inputs[0:1, :T], self._inputs[1:2, :T]
        body = self.fast.hidden_at if self.fast is not None else self.model.hidden_at
        nxt = self.model.logits(body(tok, pos, self.cache, self.cache.max_seq))[0, -1].argmax()
        drafts, pos = [nxt], pos[:, -1:]
        for _ in range(k - 1):
            pos = pos + 1
            nxt = self.model.logits(body(nxt.view(1, 1), pos, self.cache, self.cache.max_seq))[0, -1].argmax()
            drafts.append(nxt)
        return torch.stack(drafts)

    def _stage(self, tokens: list[int], start: int, T: int | None = None) -> None:
        """Tokens and the positions of T entries (default: as many as tokens) into the step's input."""
        T = len(tokens) if T is None else T
        if self._staged is None:  # no graphs (CPU): straight into the static input
            self._inputs[0, : len(tokens)] = torch.tensor(tokens)
            self._inputs[1, :T] = torch.arange(start, start + T)
            return
        self._staged.synchronize()
        self._staging[0, : len(tokens)] = torch.tensor(tokens)
        self._staging[1, :T] = torch.arange(start, start + T)
        self._inputs.copy_(self._staging, non_blocking=True)
        self._staged.record()

    def _capture_or_fall_back(self, run, restore: tuple[torch.Tensor, ...] = ()):
        # a body may feed itself (the greedy step, device acceptance: the next token and positions
        # into `_inputs`): whatever ran before a capture succeeds, the static inputs are put back
        statics = (self._inputs, *restore)
        saved = [t.clone() for t in statics]
        try:
            return self._capture(run, statics, saved)
        except Exception as e:  # noqa: BLE001 - torch.compile fails lazily, here; the plain model still works
            if self.fast is None:
                raise
            print(
                f"spectune: compiled step failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); using the plain model",
                file=sys.stderr,
                flush=True,
            )
            self.fast = None  # the bodies read it when they run: the capture below takes the plain model
            return self._capture(run, statics, saved)

    def warm(self, widths, chain: int = 0, greedy: bool = False, margins: bool = False, tree: int = 0) -> None:
        """Capture the graphs of these step widths now (compiling their bodies), outside any timing,
        with `chain` = k the greedy draft chains of k drafts after each width, and with `tree` the
        tree step of that many entries (the root and its drafts). Writes scratch K/V at positions
        0.. (the cache is reset before the next prompt). TP ranks must warm the same widths together."""
        if not self.use_graphs:
            return
        tree = tree if tree <= self.max_width else 0
        gemv = getattr(self.fast, "gemv", None)
        if gemv is not None:  # the GEMV races (seconds of compiling and timing) before any collective
            extra = ({1} if chain or greedy else set()) | ({tree} if tree else set())
            gemv.prepare(sorted({T for T in widths if T <= self.max_width} | extra))
        self.line_up()  # every rank (picker or not) starts the warm-up steps together
        for T in widths:
            if T <= self.max_width and StepGraph(T, self._comm_on()) not in self.graphs:
                self.cache.lengths[0] = 0
                self.step([1] * T)
        for T in widths if chain else ():
            if T <= self.max_width and ChainGraph(T, chain, self._comm_on()) not in self.graphs:
                self.cache.lengths[0] = 0
                self.draft_chain([1] * T, chain)
        if greedy and GreedyGraph(self._comm_on(), margins) not in self.graphs:
            self.cache.lengths[0] = 0
            self.greedy_result(self.greedy_launch(1, margins))
        if tree and TreeGraph(tree, self._comm_on()) not in self.graphs:
            self.cache.lengths[0] = 0
            self.step([1] * tree, parents=[-1] + [0] * (tree - 1))
        self.cache.lengths[0] = 0
        if (check := getattr(self.allreduce, "raise_if_timed_out", None)) is not None:
            check()  # a peer that arrived too late during the warm-up left wrong sums: say so now

    def line_up(self) -> None:
        """A barrier of the TP ranks (none at TP 1): after work of uneven length on each rank
        (compiling, GEMV races), before the next collective is timed."""
        if getattr(self.allreduce, "world_size", 1) > 1 and getattr(self.allreduce, "group", None) is not None:
            import torch.distributed as dist

            dist.barrier(group=self.allreduce.group)

    def _run_static(self, T: int) -> torch.Tensor:
        tok, pos = self._inputs[0:1, :T], self._inputs[1:2, :T]
        body = self.fast.hidden_at if self.fast is not None else self.model.hidden_at
        return self.model.logits(body(tok, pos, self.cache, self.cache.max_seq))

    def _capture(self, run, statics: tuple[torch.Tensor, ...], saved: list[torch.Tensor]):
        # Warm up on a side stream (lazy kernels, allocator), then capture. Every TP rank captures
        # the same width at the same step (SPMD), so the collectives inside line up.
        for t, before in zip(statics, saved):
            t.copy_(before)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                run()
        torch.cuda.current_stream(self.device).wait_stream(side)
        for t, before in zip(statics, saved):  # the warm-up runs' writes undone before the first replay
            t.copy_(before)
        graph = torch.cuda.CUDAGraph()
        counters = getattr(self.allreduce, "counters", None)
        before = counters.calls if counters is not None else 0
        with torch.cuda.graph(graph, pool=self._pool):
            out = run()
        calls = (counters.calls - before) if counters is not None else 0
        if counters is not None:
            counters.calls = before  # the capture itself ran nothing
        self._pool = graph.pool()
        return graph, out, calls

    def time_step(self, width: int, iters: int, tree: bool = False) -> float:
        """Median seconds of one step of `width` tokens at position 0 (scratch: the cache is reset
        before the next prompt anyway); tree: a tree step of that width. All TP ranks must call it
        together."""
        times = sorted(self.step_times(width, iters, tree))
        return times[len(times) // 2]

    def step_times(self, width: int, iters: int, tree: bool = False, warm: int = 2) -> list[float]:
        """Seconds of each of `iters` steps as `time_step` times them, after `warm` untimed ones."""
        times = []
        parents = [-1] + [0] * (width - 1) if tree else None
        # distinct tokens, spread over the vocabulary: an MoE layer reads the union of the experts its
        # tokens route to, and `width` copies of one token would all route alike (a union of top_k)
        vocab = self.model.args.vocab_size
        tokens = [(1 + 7919 * i) % vocab for i in range(width)]
        for _ in range(iters + warm):
            self.cache.lengths[0] = 0
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            t0 = time.perf_counter()
            self.step(tokens, parents=parents)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            times.append(time.perf_counter() - t0)
        self.cache.lengths[0] = 0
        return times[warm:]
