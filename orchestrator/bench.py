"""`spectune bench-allreduce`: an nccl-tests-style table (size, time, algbw, busbw) per backend and
NCCL environment, eager and inside a CUDA graph, over the message sizes that verify steps
produce (batch x (k + 1) x hidden x 2 bytes) plus a power-of-two sweep.

    spectune bench-allreduce --backend nccl symm_mem --tp 2 --device cuda \\
        --nccl-env NCCL_PROTO=LL --nccl-env NCCL_P2P_DISABLE=1 --json
    spectune bench-allreduce --backend gloo --tp 2            # CPU

Each (backend, environment) gets fresh processes, because NCCL reads its environment when a
communicator is created. NVLink multicast stays off in every one of them.
"""

from __future__ import annotations

import os
import tempfile

from orchestrator.config.envpolicy import NVLS_OFF_ENV, refuse_nvls
from orchestrator.errors import UserError
from workers.comm import BACKEND_NAMES, GangInfo, refusal
from workers.runtime.procs import rank_context, with_env


def step_sizes(hidden: int, batch: int = 1, ks=(0, 1, 2, 3, 4, 6, 8, 12, 16), itemsize: int = 2) -> list[int]:
    """Bytes of one row-parallel output per verify step: batch x (k + 1) x hidden x itemsize."""
    return [batch * (k + 1) * hidden * itemsize for k in ks]


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, IndexError):
        raise UserError(f"--sizes: {text!r} is not a size (e.g. 8192, 64K, 1M)") from None


def parse_env(items: list[str]) -> list[dict[str, str]]:
    """Each --nccl-env 'A=1,B=2' is one environment; none given = the default environment."""
    envs = []
    for item in items or [""]:
        env = {}
        for pair in filter(None, item.split(",")):
            key, sep, value = pair.partition("=")
            if not sep or not key.startswith("NCCL_"):
                raise UserError(f"--nccl-env {item!r}: expected NCCL_NAME=value[,NCCL_OTHER=value]")
            try:
                refuse_nvls(key, value)
            except ValueError as e:
                raise UserError(f"--nccl-env {e}") from None
            env[key] = value
        envs.append(env)
    return envs


def run_backend(
    backend: str, tp: int, device: str, sizes: list[int], dtype: str, iters: int, env: dict[str, str], timeout_s: float = 600
) -> list[dict]:
    from workers.comm.benchmark import bench_rank

    ctx = rank_context(device)
    queue = ctx.Queue()
    full_env = {**env, **NVLS_OFF_ENV}
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "rdv")
        procs = [
            ctx.Process(
                target=with_env, args=(dict(os.environ), bench_rank, r, tp, init, backend, device, sizes, dtype, iters, full_env, queue)
            )
            for r in range(tp)
        ]
        for p in procs:
            p.start()
        try:
            results = [queue.get(timeout=timeout_s) for _ in procs]
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    errors = [err for _, _, err in results if err]
    if errors:
        raise UserError(f"bench-allreduce {backend} {env or ''}: {errors[0]}")
    rows = next(rows for rank, rows, _ in results if rank == 0)
    label = ",".join(f"{k}={v}" for k, v in sorted(env.items())) or "default"
    return [{**row, "env": label, "tp": tp} for row in rows]


def bench(
    backends: list[str], tp: int, device: str, sizes: list[int], dtype: str, iters: int, envs: list[dict], log
) -> tuple[list[dict], list[str]]:
    """Rows of every (backend, environment) that ran, and one line per one that failed: a backend
    that breaks on this machine must not cost the rows of the others."""
    if tp < 2:
        raise UserError(f"--tp {tp}: an allreduce needs at least 2 ranks")
    if device == "cuda":
        import torch

        if torch.cuda.device_count() < tp:
            raise UserError(f"--tp {tp}: this machine has {torch.cuda.device_count()} CUDA devices")
    for b in backends:
        if b not in BACKEND_NAMES or b == "noop":
            raise UserError(f"--backend {b!r} is not one of {', '.join(n for n in BACKEND_NAMES if n != 'noop')}")
        if why := refusal(b, GangInfo(world_size=tp, device_type=device, p2p_ok=True, max_message_bytes=max(sizes))):
            raise UserError(f"--backend {b}: {why}")
    rows, failures = [], []
    for b in backends:
        for env in envs if b == "nccl" else [{}]:  # NCCL knobs only change nccl
            log(f"spectune: bench-allreduce {b} tp={tp} {env or 'default env'} ...")
            try:
                rows += run_backend(b, tp, device, sizes, dtype, iters, env)
            except UserError as e:
                failures.append(str(e).splitlines()[0])
                log(f"spectune: {failures[-1]}")
    return rows, failures


def table(rows: list[dict]) -> str:
    lines = [f"{'backend':>9} {'env':>28} {'mode':>6} {'size(B)':>10} {'time(us)':>9} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11}"]
    for r in rows:
        lines.append(
            f"{r['backend']:>9} {r['env'][:28]:>28} {r['mode']:>6} {r['size_bytes']:>10} {r['time_us']:>9.2f} "
            f"{r['algbw_GBps']:>11.3f} {r['busbw_GBps']:>11.3f}"
        )
    return "\n".join(lines)


def latency_plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key in sorted({(r["backend"], r["env"], r["mode"]) for r in rows}):
        pts = sorted((r["size_bytes"], r["time_us"]) for r in rows if (r["backend"], r["env"], r["mode"]) == key)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=" ".join(key))
    ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="allreduce latency (us)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
