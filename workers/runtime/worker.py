"""One process of a gang: a verifier rank (0..tp-1) or the drafter (rank tp).

The same class runs in a local process (`workers/runtime/local_gang.py`) or inside a Ray actor
(`workers/runtime/actor.py`, started by orchestrator/execution/gang.py): `setup` joins the process groups, loads this rank's part and checks
the allreduce backend against a reference sum; `run` decodes one Workload; `shutdown` leaves
the process groups. With `GangSpec.emulate_tp` the one verifier process holds rank 0's shard of
that TP size and its collectives wait as the allreduce table says (workers/comm/emulated.py). Verifier rank 0 returns the RunResult, everyone else returns None.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from workers.comm import GangInfo, backend_class, make_allreduce, make_emulated, validate, validate_add_norm
from workers.drafters import Drafter, Eagle3Drafter, ModelDrafter, NgramDrafter
from workers.drafters.eagle3 import checkpoint as eagle3_ckpt
from workers.drafters.eagle3 import head as eagle3
from workers.drafters.mtp import MtpDrafter, MtpHead
from workers.engine.link import DraftLink
from workers.engine.steps import no_cudnn_attention
from workers.engine.verifier import ProgressHook, Verifier, run_drafter
from workers.errors import WorkerError
from workers.model.checkpoint import load_args, load_model, resolve_model_path
from workers.model.tp import TPPart, hook
from workers.model.transformer import Transformer
from workers.runtime.gang import RAY_NOSET_CUDA_ENV, Rendezvous  # noqa: F401 - Rendezvous re-exported
from workers.spec import MAX_DRAFT_TOKENS, GangSpec, RunResult, Workload

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


NO_GPU_ASSIGNED = -1


def _ray_gpu_index() -> int | None:
    """The torch device index of the GPU Ray assigned to this actor, when Ray was asked not to mask
    CUDA_VISIBLE_DEVICES (orchestrator/execution/gang.py sets RAY_NOSET_CUDA_ENV for GPU gangs): None
    outside such an actor, NO_GPU_ASSIGNED for an actor Ray gave no GPU (it sees every GPU of the
    node and must touch none). Ray's GPU ids name devices as the node's CUDA_VISIBLE_DEVICES lists
    them (or 0..n-1 without it)."""
    if os.environ.get(RAY_NOSET_CUDA_ENV) != "1":
        return None
    import ray

    if not ray.is_initialized():  # the variable leaked into a process Ray did not start
        return None
    ids = [str(i) for i in ray.get_gpu_ids()]
    if not ids:
        return NO_GPU_ASSIGNED
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible.index(ids[0]) if ids[0] in visible else int(ids[0])


def aux_layers_read(spec: GangSpec) -> tuple[int, ...]:
    """The target layers whose states the drafter reads: an eagle3 head's three, an MTP layer's final
    normed state (id n_layers), none for other drafters."""
    if spec.drafter.kind == "mtp":
        return (load_args(spec.model_path).n_layers,)
    if spec.drafter.kind != "eagle3" or spec.drafter.model_path is None:
        return ()
    path = resolve_model_path(spec.drafter.model_path)
    return eagle3.check_fits(eagle3.load_config(path), load_args(spec.model_path), path)


def eagle3_tree_width(spec: GangSpec) -> int:
    """The tokens an eagle3 tree drafts at each depth: drafter.tree_width, at most the head's draft
    vocabulary (what Eagle3Drafter._width drafts), so the verifier warms the width that runs."""
    d = spec.drafter
    if d.kind != "eagle3" or d.tree_width < 2 or d.model_path is None:
        return 0
    return min(d.tree_width, eagle3.load_config(resolve_model_path(d.model_path)).draft_vocab)


def build_drafter(spec: GangSpec, device, verifier: Transformer | None = None) -> Drafter:
    """`verifier`: the rank's model where the drafter lives in a verifier rank (an eagle3 head reads
    its token embedding; an MTP drafter is its MTP layer)."""
    d = spec.drafter
    dtype = DTYPES[spec.dtype]
    embed = verifier.embed_tokens.weight if verifier is not None else None
    if d.kind == "mtp":
        if verifier is None:
            raise WorkerError("drafter.kind mtp runs inside the verifier ranks: its MTP layer is the verifier's")
        return MtpDrafter(MtpHead(verifier), chain=None if spec.engine.cuda_graphs else False)  # None: captured on a GPU
    if d.kind == "eagle3":
        if embed is None:
            embed = eagle3_ckpt.target_embedding(spec.model_path, dtype, device)
        return Eagle3Drafter(
            eagle3_ckpt.load_head(
                resolve_model_path(d.model_path), embed, load_args(spec.model_path), dtype=dtype, device=device, max_seq=spec.max_seq
            ),
            # a head in every verifier rank (rank0 placement, TP > 1) must draft the same tokens on every
            # rank: each rank's own GEMV race could pick another kernel, and bf16 rounding flip an argmax
            engine=replace(spec.engine, gemv="cublas")
            if d.placement == "rank0" and spec.tp > 1 and spec.engine.gemv != "off"
            else spec.engine,
            lookup=d.lookup,
            tree_width=d.tree_width,
        )
    if d.kind == "ngram":
        return NgramDrafter(d.ngram_max, d.ngram_min)
    if d.kind == "draft_model":
        model = load_model(d.model_path, dtype=dtype, device=device, max_seq=spec.max_seq)
        return ModelDrafter(model, kind="draft_model", engine=spec.engine)
    if d.kind == "layer_skip":
        model = load_model(spec.model_path, dtype=dtype, device=device, max_seq=spec.max_seq, n_layers=d.layers)
        return ModelDrafter(model, kind="layer_skip", engine=spec.engine)
    raise WorkerError(f"unknown drafter kind {d.kind!r}")


class Worker:
    def __init__(self, rank: int, spec: GangSpec):
        self.rank, self.spec = rank, spec
        self.is_drafter = spec.has_drafter and rank == spec.tp
        self.verifier: Verifier | None = None
        self.drafter: Drafter | None = None
        self.link: DraftLink | None = None

    def open_store(self, host: str, timeout_s: float = 600.0) -> int:
        """Rank 0 only: serve the rendezvous TCPStore on `host` (the address the other ranks are given)
        at a free port and return the port. TCPStore's own server listens on every interface whatever
        host it is handed, so it is given a socket already bound to `host` (the store owns it from here)."""
        family, _, _, _, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.bind(addr)
        sock.listen(128)
        port = sock.getsockname()[1]
        self._store = dist.TCPStore(
            host,
            port,
            self.spec.world_size,
            is_master=True,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
            master_listen_fd=sock.detach(),
        )
        return port

    def setup(self, rdv: Rendezvous, timeout_s: float = 600.0) -> dict:
        t0 = time.perf_counter()
        spec = self.spec
        torch.set_num_threads(spec.threads)
        timeout = datetime.timedelta(seconds=timeout_s)
        if rdv.file:
            dist.init_process_group("gloo", init_method=f"file://{rdv.file}", rank=self.rank, world_size=spec.world_size, timeout=timeout)
        else:
            store = getattr(self, "_store", None) or dist.TCPStore(rdv.host, rdv.port, spec.world_size, is_master=False, timeout=timeout)
            dist.init_process_group("gloo", store=store, rank=self.rank, world_size=spec.world_size, timeout=timeout)
        device = self._device()
        self._devices, self._peers_ok = self._exchange_devices(device)
        # every process joins every new_group call, members or not; the TP group carries the
        # allreduces (NCCL on GPUs), the default group (gloo, CPU) the draft-link messages
        backend_cls = backend_class(spec.backend)
        tp_backend = backend_cls.cuda_group if device.type == "cuda" and backend_cls is not None else "gloo"
        tp_group = dist.new_group(list(range(spec.tp)), backend=tp_backend)
        args = load_args(spec.model_path)
        drafter_rank = spec.tp if spec.has_drafter else None
        dtype = DTYPES[spec.dtype]
        aux_layers = aux_layers_read(spec)
        self.link = DraftLink(
            dist.group.WORLD,
            self.rank,
            drafter_rank,
            MAX_DRAFT_TOKENS,
            args.vocab_size,
            hidden_width=len(aux_layers) * args.dim,
            hidden_dtype=dtype,
        )
        if self.is_drafter:
            self.drafter = build_drafter(spec, device)
        else:
            max_numel = spec.max_batch * (MAX_DRAFT_TOKENS + 1) * args.dim  # the widest verify pass of any batch
            engine = spec.engine
            if spec.emulate_tp:  # one rank of TP emulate_tp, its collectives waiting as the table says
                if spec.allreduce_table is None:
                    raise WorkerError(f"emulate_tp={spec.emulate_tp} needs an allreduce table")
                mode = "graph" if device.type == "cuda" and engine.cuda_graphs else "eager"
                allreduce = make_emulated(spec.allreduce_table, spec.backend, spec.emulate_tp, mode, device.type)
                allreduce.setup(device, dtype, max_numel)  # nothing is summed, so nothing to validate
            else:
                gang = GangInfo(
                    world_size=spec.tp,
                    device_type=device.type,
                    devices=self._tp_devices(),
                    p2p_ok=self._p2p_ok(),
                    max_message_bytes=max_numel * dtype.itemsize,
                )
                allreduce = make_allreduce(spec.backend, tp_group, spec.tp, gang if spec.tp > 1 else None)
            if spec.tp > 1:
                allreduce.setup(device, dtype, max_numel)
                # within the buffer the backend sized (a larger message would test its NCCL fallback instead)
                if err := validate(allreduce, self.rank, dtype=dtype, device=device, numel=min(4104, max_numel)):
                    raise WorkerError(err)
                # the engine records whether it joins row-parallel outputs in the allreduce's kernel
                # (the backend's capability is left as built)
                engine = replace(engine, fused_add_norm=self._check_add_norm(allreduce, tp_group, args.dim, dtype, device))
            part = TPPart(self.rank, spec.shard_world, spec.vocab_parallel)
            mtp = spec.drafter.kind == "mtp"  # the verifier with its MTP layer, split as its other layers
            model = hook(load_model(spec.model_path, dtype=dtype, device=device, max_seq=spec.max_seq, tp=part, mtp=mtp), part, allreduce)
            model.aux_layers = aux_layers  # eagle3, mtp: capture the states the drafter reads (plain and fused steps)
            model.absorb_latent_attention(spec.engine.mla == "absorbed")  # before the Verifier makes its cache
            self.verifier = Verifier(
                model,
                allreduce,
                self.link,
                self.rank,
                engine=engine,
                drafter=build_drafter(spec, device, model) if spec.drafter.in_verifier else None,
                tree_width=eagle3_tree_width(spec),
            )
        info = {
            "rank": self.rank,
            "role": "drafter" if self.is_drafter else "verifier",
            "setup_s": time.perf_counter() - t0,
            "pid": os.getpid(),
            "engine": spec.engine.describe(),
            "devices": list(self._devices),
            "p2p_ok": self._peers_ok,
        }
        if self.verifier is not None:
            steps = self.verifier.steps
            info["engine"] = steps.engine.describe()  # as this rank runs it (fused_add_norm after the setup check)
            info["attention"] = steps.attention
            if steps.moe_experts:  # an MoE verifier: how its routed experts ran in the graphed steps
                info["moe_experts"] = steps.moe_experts
            info["fused_add_norm"] = bool(steps.engine.fused_add_norm and allreduce.fuses_add_norm and spec.tp > 1)
        return info

    def _check_add_norm(self, allreduce, tp_group, hidden: int, dtype, device) -> bool:
        """Whether this gang's steps join row-parallel outputs in the allreduce's kernel (fused add +
        norm), agreed by every rank: the backend must fuse it, `engine.fused_add_norm` must ask for
        it on every rank, and it must agree with allreduce, add, norm on every rank (else every rank
        drops it: the collectives must keep lining up; the plain allreduce was validated already)."""
        if not allreduce.fuses_add_norm:
            return False

        def everyone(ok: bool) -> bool:  # one collective: does every rank say yes?
            flag = torch.tensor([int(ok)], dtype=torch.int32, device=device if device.type == "cuda" else "cpu")
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=tp_group)
            return bool(flag.item())

        # agreed before the check: validate_add_norm's own collectives run on every rank or on none
        wanted = self.spec.engine.fused_add_norm
        if not everyone(wanted):
            print(
                f"spectune: rank {self.rank}: fused add + norm turned off by engine.fused_add_norm=false"
                f"{'' if not wanted else ' on a peer rank'}",
                file=sys.stderr,
                flush=True,
            )
            return False
        err = validate_add_norm(allreduce, self.rank, hidden, dtype=dtype, device=device)
        if not everyone(err is None):
            print(
                f"spectune: rank {self.rank}: {err or 'a peer rank refused the fused add + norm'}; using allreduce, then add and norm",
                file=sys.stderr,
                flush=True,
            )
            return False
        return True

    def _device(self) -> torch.device:
        if self.spec.device == "cpu":
            return torch.device("cpu")
        if not torch.cuda.is_available():
            if self.is_drafter:  # e.g. an n-gram drafter in a Ray bundle without a GPU: it needs none
                return torch.device("cpu")
            raise WorkerError("parallel.device is cuda but this process sees no CUDA device")
        # Ray actor (every GPU visible, RAY_NOSET_CUDA_ENV): the GPU Ray assigned to it. Local gang:
        # rank r takes GPU r; the drafter shares GPU 0 with rank 0. One visible GPU: that one.
        n = torch.cuda.device_count()
        assigned = _ray_gpu_index()
        if assigned == NO_GPU_ASSIGNED:
            if self.is_drafter:  # an n-gram drafter actor in a GPU gang: no GPU, none touched
                return torch.device("cpu")
            raise WorkerError("parallel.device is cuda but Ray assigned this verifier rank no GPU")
        if assigned is not None:
            index = assigned
        else:
            index = 0 if self.is_drafter or n < self.spec.tp else self.rank
        torch.cuda.set_device(index)
        no_cudnn_attention()
        return torch.device("cuda", index)

    def _exchange_devices(self, device: torch.device) -> tuple[tuple[int, ...], bool]:
        """What each process really got, gathered over the gang (every process calls this): the
        verifier ranks' device indices (as this node numbers them) and whether each verifier rank's
        GPU can access every other rank's GPU directly (false when a peer's GPU is not visible here)."""
        world = dist.get_world_size()
        indices: list = [None] * world
        dist.all_gather_object(indices, device.index if device.type == "cuda" else -1)
        tp_indices = tuple(indices[: self.spec.tp])
        ok = True
        if device.type == "cuda" and not self.is_drafter:
            n = torch.cuda.device_count()
            ok = all(j == device.index or (0 <= j < n and torch.cuda.can_device_access_peer(device.index, j)) for j in tp_indices)
        oks: list = [None] * world
        dist.all_gather_object(oks, ok)
        if device.type != "cuda":
            return (), False
        return tp_indices, all(oks[: self.spec.tp])

    def _tp_devices(self) -> tuple[int, ...]:
        return self._devices

    def _p2p_ok(self) -> bool:
        return self._peers_ok

    def run(self, workload: Workload, progress: ProgressHook | None = None) -> RunResult | None:
        """Decode `workload`; `progress` (verifier ranks; the driver hands it to rank 0) is called
        after every decode step with (tokens of the current prompt, seconds since it began)."""
        if workload.num_draft_tokens > self.link.k:
            raise WorkerError(f"num_draft_tokens={workload.num_draft_tokens} exceeds the maximum of {self.link.k}")
        if self.is_drafter:
            run_drafter(self.drafter, self.link, workload)
            return None
        self.verifier.on_progress = progress
        try:
            return self.verifier.run(workload)
        finally:
            self.verifier.on_progress = None

    def pid(self) -> int:
        return os.getpid()

    def peak_rss_mb(self) -> float:
        """This process's peak resident memory so far (VmHWM), in MiB."""
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
