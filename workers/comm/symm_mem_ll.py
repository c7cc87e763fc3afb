"""`symm_mem_ll`: a low-latency one-shot allreduce (Lamport-style push) over torch symmetric memory, in Triton.

torch's one-shot kernel (`symm_mem`) copies the input into the symmetric buffer, runs a barrier
(a signal to and a wait on every peer), reads every peer's buffer over NVLink and runs a second
barrier before the buffer may be reused: two round trips per call. Here no barrier is needed:

    every rank's buffer = NPHASE phases x world slots x max_numel elements, all initialised to the
    sentinel -0.0 (a real -0.0 is sent as +0.0, which sums the same);
    call c uses phase c % NPHASE (a counter on the device, so CUDA graph replays advance it):
      push:   rank r stores its partial sum into slot r of that phase on every other rank (remote
              stores; its own slot stays unused);
      reduce: rank r polls the peers' slots in its buffer until no element is the sentinel (each
              element is its own ready flag: a 2- or 4-byte store is never torn), sums them with its
              own partial, still in registers, in float32 and rank order, writes the result and
              puts the sentinel back into those slots.

Why the slots are free again when the next call of the same phase writes them: a rank pushes call
c + NPHASE only after its call c + NPHASE - 1 has read every peer's push of that call, which each
peer made after its own call c had finished, clean-up included (kernels on one stream run in
order). NPHASE = 3 leaves a call of slack over that argument. The last program of each call to
finish (a device-side counter) advances the phase; every program has read it by then.

`all_gather_last` (vocab-parallel logits) runs the same protocol, each rank's part landing at its
offset instead of adding up. `add_norm` runs the same protocol one program per token row and, in the same kernel, adds the
sum to the residual stream and applies the next RMS norm (workers/engine/fused_step.py then drops its norm
kernels: two kernels fewer per layer). `validate_add_norm` checks it against allreduce + add + norm.

    ar = SymmMemLLAllReduce(group, world); ar.setup(device, torch.bfloat16, max_numel); ar(x)
    x_new, h = ar.add_norm(partial, x, norm_weight, eps)

The protocol is tested on simulated ranks in one process under Triton's CPU interpreter
(tests/test_kernels_symm_mem_ll.py: `launch*` take `mode` = PUSH or REDUCE to run one half of a call).
"""

from __future__ import annotations

import torch

from workers.comm.base import AllReduce

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

NPHASE = 3
MAX_SPINS = 1 << 24  # polls before a reader gives up on a peer (seconds): a bug fails validation, not hangs
MAX_PROGRAMS = 128  # every program must be resident at once (programs wait on peers' programs)
BOTH, PUSH, REDUCE = 0, 1, 2  # kernel modes: one call on GPU; the halves separately in the CPU tests

_SENTINEL_BITS = {torch.bfloat16: -32768, torch.float16: -32768, torch.float32: -2147483648}

if triton is not None:

    @triton.jit
    def _push(x, PTRS, phase, rank, max_numel, offs, m, WORLD: tl.constexpr):
        # store this rank's partial sum into slot `rank` of this phase on every peer (remote stores);
        # x is already sentinel-free. A rank's own slot is never written: its reduce adds x itself.
        for peer in tl.static_range(WORLD):
            if peer != rank:
                dst = tl.load(PTRS + peer).to(tl.pointer_type(x.dtype))
                tl.store(dst + (phase * WORLD + rank) * max_numel + offs, x, mask=m)

    @triton.jit
    def _await_slot(slot, STATE, m, INT: tl.constexpr, SENT: tl.constexpr, MAX_SPINS: tl.constexpr):
        # poll a peer's slot until no element is the sentinel; a peer that never pushes sets the
        # timed-out flag after MAX_SPINS polls (the values are then wrong) rather than hang the GPU
        v = tl.load(slot, mask=m, other=0.0, volatile=True)
        pending = tl.sum(((v.to(INT, bitcast=True) == SENT) & m).to(tl.int32), axis=0)
        spins = 0
        while (pending > 0) & (spins < MAX_SPINS):
            v = tl.load(slot, mask=m, other=0.0, volatile=True)
            pending = tl.sum(((v.to(INT, bitcast=True) == SENT) & m).to(tl.int32), axis=0)
            spins += 1
        if pending > 0:
            tl.store(STATE + 2, 1)
        return v

    @triton.jit
    def _collect(
        own,
        PTRS,
        STATE,
        phase,
        rank,
        max_numel,
        offs,
        m,
        ty: tl.constexpr,
        WORLD: tl.constexpr,
        BLOCK: tl.constexpr,
        INT: tl.constexpr,
        SENT: tl.constexpr,
        MAX_SPINS: tl.constexpr,
    ):
        # wait for every peer's push into this rank's slots of this phase, sum them with this rank's
        # own partial `own` in float32 (rank order, so every rank gets the same bits: +0.0 + -0.0 and
        # +0.0 + +0.0 are both +0.0) and put the sentinel back
        local = tl.load(PTRS + rank).to(tl.pointer_type(ty))
        acc = tl.zeros([BLOCK], tl.float32)
        for src in tl.static_range(WORLD):
            if src == rank:
                acc += own.to(tl.float32)
            else:
                slot = local + (phase * WORLD + src) * max_numel + offs
                acc += _await_slot(slot, STATE, m, INT, SENT, MAX_SPINS).to(tl.float32)
                tl.store(slot, tl.full([BLOCK], SENT, INT).to(ty, bitcast=True), mask=m)
        return acc

    @triton.jit
    def _finish_call(STATE, phase, NPH: tl.constexpr):
        # the last program of this call to finish moves every later call to the next phase (a lone
        # program just stores it: no atomic round trip)
        if tl.num_programs(0) == 1:
            tl.store(STATE, (phase + 1) % NPH)
        else:
            done = tl.atomic_add(STATE + 1, 1)
            if done == tl.num_programs(0) - 1:
                tl.store(STATE, (phase + 1) % NPH)
                tl.store(STATE + 1, 0)

    @triton.jit
    def _start_call(X, STATE, n, BLOCK: tl.constexpr):
        # this call's phase, this program's block of X and its elements, sentinel-free (-0.0 is the
        # sentinel: send +0.0, which sums and compares the same)
        phase = tl.load(STATE)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(X + offs, mask=m, other=0.0)
        return phase, offs, m, tl.where(x == 0.0, 0.0, x)

    @triton.jit
    def _ll_allreduce(
        X,
        PTRS,
        STATE,
        n,
        max_numel,
        rank,
        WORLD: tl.constexpr,
        NPH: tl.constexpr,
        BLOCK: tl.constexpr,
        INT: tl.constexpr,
        SENT: tl.constexpr,
        MODE: tl.constexpr,
        MAX_SPINS: tl.constexpr,
    ):
        phase, offs, m, x = _start_call(X, STATE, n, BLOCK)
        ty = X.dtype.element_ty
        if MODE != 2:  # not REDUCE alone (jit code reads no plain module globals)
            _push(x, PTRS, phase, rank, max_numel, offs, m, WORLD)
        if MODE != 1:  # not PUSH alone
            acc = _collect(x, PTRS, STATE, phase, rank, max_numel, offs, m, ty, WORLD, BLOCK, INT, SENT, MAX_SPINS)
            tl.store(X + offs, acc.to(ty), mask=m)
            _finish_call(STATE, phase, NPH)

    @triton.jit
    def _ll_all_gather(
        X,
        OUT,
        PTRS,
        STATE,
        n,
        max_numel,
        rank,
        WORLD: tl.constexpr,
        NPH: tl.constexpr,
        BLOCK: tl.constexpr,
        INT: tl.constexpr,
        SENT: tl.constexpr,
        MODE: tl.constexpr,
        MAX_SPINS: tl.constexpr,
    ):
        # the same push and wait, but rank src's elements land at OUT[src * n:] instead of adding up
        # (vocab-parallel logits: a -0.0 arrives as +0.0, which no softmax or argmax tells apart)
        phase, offs, m, x = _start_call(X, STATE, n, BLOCK)
        ty = X.dtype.element_ty
        if MODE != 2:
            _push(x, PTRS, phase, rank, max_numel, offs, m, WORLD)
        if MODE != 1:
            local = tl.load(PTRS + rank).to(tl.pointer_type(ty))
            for src in tl.static_range(WORLD):
                if src == rank:
                    tl.store(OUT + src * n + offs, x, mask=m)
                else:
                    slot = local + (phase * WORLD + src) * max_numel + offs
                    tl.store(OUT + src * n + offs, _await_slot(slot, STATE, m, INT, SENT, MAX_SPINS), mask=m)
                    tl.store(slot, tl.full([BLOCK], SENT, INT).to(ty, bitcast=True), mask=m)
            _finish_call(STATE, phase, NPH)

    @triton.jit
    def _ll_allreduce_add_norm(
        X,
        RES,
        W,
        RES_OUT,
        NORM_OUT,
        PTRS,
        STATE,
        hidden,
        max_numel,
        rank,
        eps,
        WORLD: tl.constexpr,
        NPH: tl.constexpr,
        BLOCK: tl.constexpr,
        INT: tl.constexpr,
        SENT: tl.constexpr,
        MODE: tl.constexpr,
        MAX_SPINS: tl.constexpr,
    ):
        # one program per token row: the allreduce of the row's partial sums, then (as the unfused
        # step does it) s = residual + round(sum); out = weight * round(s * rsqrt(mean(s^2) + eps))
        row = tl.program_id(0)
        phase = tl.load(STATE)
        cols = tl.arange(0, BLOCK)
        m = cols < hidden
        offs = row * hidden + cols
        ty = X.dtype.element_ty
        # every plain load first, so they overlap the push and the wait instead of following them
        x = tl.load(X + offs, mask=m, other=0.0)
        x = tl.where(x == 0.0, 0.0, x)  # -0.0 is the sentinel: send +0.0 (sums the same)
        res = tl.load(RES + offs, mask=m, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
        if MODE != 2:
            _push(x, PTRS, phase, rank, max_numel, offs, m, WORLD)
        if MODE != 1:
            acc = _collect(x, PTRS, STATE, phase, rank, max_numel, offs, m, ty, WORLD, BLOCK, INT, SENT, MAX_SPINS)
            s = (res + acc.to(ty).to(tl.float32)).to(ty)
            tl.store(RES_OUT + offs, s, mask=m)
            sf = s.to(tl.float32)
            inv = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=0) / hidden + eps)
            tl.store(NORM_OUT + offs, (w * (sf * inv).to(ty).to(tl.float32)).to(ty), mask=m)
            _finish_call(STATE, phase, NPH)


def _bits_type(x: torch.Tensor):
    """The integer type of x's element size: the sentinel is compared bit for bit."""
    return tl.int16 if x.element_size() == 2 else tl.int32


def _block(n: int) -> int:
    return max(512, triton.next_power_of_2(triton.cdiv(n, MAX_PROGRAMS)))


def launch(
    x: torch.Tensor,
    ptrs: torch.Tensor,
    state: torch.Tensor,
    max_numel: int,
    rank: int,
    world: int,
    mode: int = BOTH,
    max_spins: int = MAX_SPINS,
) -> None:
    """One allreduce of the contiguous tensor `x` in place (or, for tests, its push / reduce half)."""
    n = x.numel()
    block = _block(n)
    _ll_allreduce[(triton.cdiv(n, block),)](
        x,
        ptrs,
        state,
        n,
        max_numel,
        rank,
        WORLD=world,
        NPH=NPHASE,
        BLOCK=block,
        INT=_bits_type(x),
        SENT=_SENTINEL_BITS[x.dtype],
        MODE=mode,
        MAX_SPINS=max_spins,
    )


def launch_all_gather(
    x: torch.Tensor,
    out: torch.Tensor,
    ptrs: torch.Tensor,
    state: torch.Tensor,
    max_numel: int,
    rank: int,
    world: int,
    mode: int = BOTH,
    max_spins: int = MAX_SPINS,
) -> torch.Tensor:
    """Every rank's contiguous `x` (numel n) into out[src * n:(src + 1) * n], rank-major."""
    n = x.numel()
    block = _block(n)
    _ll_all_gather[(triton.cdiv(n, block),)](
        x,
        out,
        ptrs,
        state,
        n,
        max_numel,
        rank,
        WORLD=world,
        NPH=NPHASE,
        BLOCK=block,
        INT=_bits_type(x),
        SENT=_SENTINEL_BITS[x.dtype],
        MODE=mode,
        MAX_SPINS=max_spins,
    )
    return out


def launch_add_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    ptrs: torch.Tensor,
    state: torch.Tensor,
    max_numel: int,
    rank: int,
    world: int,
    mode: int = BOTH,
    max_spins: int = MAX_SPINS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """allreduce(x) + residual and its RMS norm, each [..., hidden], in one kernel (one program per row)."""
    hidden = x.shape[-1]
    rows = x.numel() // hidden
    res_out, norm_out = torch.empty_like(residual), torch.empty_like(residual)
    _ll_allreduce_add_norm[(rows,)](
        x,
        residual,
        weight,
        res_out,
        norm_out,
        ptrs,
        state,
        hidden,
        max_numel,
        rank,
        eps,
        WORLD=world,
        NPH=NPHASE,
        BLOCK=triton.next_power_of_2(hidden),
        INT=_bits_type(x),
        SENT=_SENTINEL_BITS[x.dtype],
        MODE=mode,
        MAX_SPINS=max_spins,
        num_warps=8 if hidden >= 4096 else 4,
    )
    return res_out, norm_out


def sentinel_fill_(buf: torch.Tensor) -> torch.Tensor:
    """Every element of `buf` := -0.0 (by its bits), "not arrived yet"."""
    buf.view(torch.int16 if buf.element_size() == 2 else torch.int32).fill_(_SENTINEL_BITS[buf.dtype])
    return buf


class SymmMemLLAllReduce(AllReduce):
    name = "symm_mem_ll"
    cuda_group = "nccl"
    timed = False
    fuses_add_norm = True
    MAX_HIDDEN = 16384  # add_norm: one program holds a whole row

    def setup(self, device: torch.device, dtype: torch.dtype, max_numel: int) -> None:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        if dtype not in _SENTINEL_BITS:
            raise ValueError(f"symm_mem_ll sums bfloat16, float16 or float32, not {dtype}")
        self.max_numel = max_numel
        self.buf = symm_mem.empty(NPHASE * self.world_size * max_numel, dtype=dtype, device=device)
        handle = symm_mem.rendezvous(self.buf, self.group)  # collective over the TP group
        self.rank = handle.rank
        self.ptrs = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device=device)
        self.state = torch.zeros(3, dtype=torch.int32, device=device)  # phase, finished programs, timed out
        # the compute-only ablation runs add_norm's kernel as a world of one on a private buffer:
        # the same add + norm work, no traffic, and the shared phase counter left alone
        self.local_buf = sentinel_fill_(torch.empty(NPHASE * max_numel, dtype=dtype, device=device))
        self.local_ptrs = torch.tensor([self.local_buf.data_ptr()], dtype=torch.int64, device=device)
        self.local_state = torch.zeros(3, dtype=torch.int32, device=device)
        sentinel_fill_(self.buf)
        torch.cuda.synchronize(device)
        dist.barrier(group=self.group)  # nobody pushes before every buffer holds the sentinel

    def _all_reduce(self, x: torch.Tensor) -> None:
        if x.numel() > self.max_numel or x.dtype != self.buf.dtype or not x.is_contiguous():
            import torch.distributed as dist

            dist.all_reduce(x, group=self.group)  # outside what the buffer was sized for: NCCL
            return
        launch(x, self.ptrs, self.state, self.max_numel, self.rank, self.world_size)

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled or self.world_size == 1 or x.numel() > self.max_numel or x.dtype != self.buf.dtype or not x.is_contiguous():
            return super().all_gather_last(x)  # the ablation's stand-in, or too big for the buffer: NCCL
        out = torch.empty(self.world_size * x.numel(), dtype=x.dtype, device=x.device)
        launch_all_gather(x, out, self.ptrs, self.state, self.max_numel, self.rank, self.world_size)
        out = out.view(self.world_size, *x.shape)
        return out.movedim(0, -2).reshape(*x.shape[:-1], self.world_size * x.shape[-1])

    def raise_if_timed_out(self) -> None:
        """A reader gave up on a peer (MAX_SPINS polls) since setup: its sums were wrong."""
        if int(self.state[2]):
            raise RuntimeError(
                f"symm_mem_ll: rank {self.rank} waited more than {MAX_SPINS} polls for a peer's "
                "partial sums (a rank fell behind or died); the sums since are wrong"
            )

    def add_norm(self, partial, residual, weight, eps):
        fits = (
            partial.numel() <= self.max_numel
            # one program per row, all resident at once (a batched pass has B x W rows): wider, the plain allreduce
            and partial.numel() // max(1, partial.shape[-1]) <= MAX_PROGRAMS
            and partial.dtype == self.buf.dtype
            and partial.shape[-1] <= self.MAX_HIDDEN
            and residual.dtype == partial.dtype
            and partial.is_contiguous()
            and residual.is_contiguous()
        )
        if self.world_size == 1 or not fits:
            return super().add_norm(partial, residual, weight, eps)
        if not self.enabled:  # compute-only ablation: residual + partial, normalised, by the same kernel
            return launch_add_norm(partial, residual, weight, eps, self.local_ptrs, self.local_state, self.max_numel, 0, 1)
        self.counters.calls += 1
        self.counters.bytes += partial.numel() * partial.element_size()
        return launch_add_norm(partial, residual, weight, eps, self.ptrs, self.state, self.max_numel, self.rank, self.world_size)
