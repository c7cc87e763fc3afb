"""Sharded-vs-unsharded parity: logits of a checkpoint at TP n (gloo, one process per rank)
next to the unsharded model's and transformers' own model's.

    python -m workers.checks.parity smollm2-135m --tp 2 4      # prints the max |difference| per TP size
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist

from workers.runtime.procs import rank_context, with_env


def _rank_logits(
    rank: int, world: int, init: str, path: str, tokens: list[list[int]], vocab_parallel: bool, split: int, queue, absorbed: bool = False
) -> None:
    from workers.comm import make_allreduce
    from workers.model.checkpoint import load_model
    from workers.model.tp import TPPart, hook

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        part = TPPart(rank, world, vocab_parallel)  # read only this rank's slices, as a worker does
        model = hook(load_model(path, tp=part), part, make_allreduce("gloo", dist.group.WORLD, world))
        model.absorb_latent_attention(absorbed)
        with torch.inference_mode():
            x = torch.tensor(tokens)
            cache = model.new_cache(x.shape[0])
            # two chunks: the second reads the first one's KV cache (prefill + verify shape)
            logits = torch.cat([model(x[:, :split], cache), model(x[:, split:], cache)], dim=1)
        queue.put((rank, logits.numpy() if rank == 0 else None, None))  # numpy: no shared-memory fds
    except Exception as e:  # noqa: BLE001 - reported to the parent
        queue.put((rank, None, f"{type(e).__name__}: {e}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def sharded_logits(
    path: str, tp: int, tokens: list[list[int]], vocab_parallel: bool = False, split: int | None = None, absorbed: bool = False
) -> torch.Tensor:
    """Logits [batch, seq, vocab] of `path` sharded over `tp` gloo processes (rank 0's copy); absorbed:
    latent attention on its compressed cache (`Transformer.absorb_latent_attention`)."""
    split = split if split is not None else max(1, len(tokens[0]) // 2)
    ctx = rank_context("cpu")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'rdv')}"
        procs = [
            ctx.Process(
                target=with_env,
                args=(dict(os.environ), _rank_logits, r, tp, init, str(path), tokens, vocab_parallel, split, queue, absorbed),
            )
            for r in range(tp)
        ]
        for p in procs:
            p.start()
        results = [queue.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(timeout=30)
    errors = [err for _, _, err in results if err]
    if errors:
        raise RuntimeError(errors[0])
    return torch.from_numpy(next(logits for rank, logits, _ in results if rank == 0))


def reference_logits(path: str, tokens: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(our unsharded model, transformers' AutoModelForCausalLM) logits for the same tokens."""
    import transformers
    from transformers import AutoModelForCausalLM

    from workers.model.checkpoint import load_model

    transformers.logging.set_verbosity_error()
    x = torch.tensor(tokens)
    with torch.inference_mode():
        ours = load_model(path)
        mine = ours(x, ours.new_cache(x.shape[0]))
        hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        theirs = hf(x).logits.float()
    return mine, theirs


def main() -> None:
    from workers.model.checkpoint import load_args, resolve_model_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--tp", type=int, nargs="+", default=[2])
    ap.add_argument("--seq", type=int, default=16)
    args = ap.parse_args()
    path = resolve_model_path(args.model)
    vocab = load_args(path).vocab_size
    tokens = torch.randint(0, vocab, (1, args.seq), generator=torch.Generator().manual_seed(0)).tolist()
    mine, theirs = reference_logits(str(path), tokens)
    print(f"unsharded vs transformers: max |diff| = {(mine - theirs).abs().max():.3g}")
    for tp in args.tp:
        sharded = sharded_logits(str(path), tp, tokens)
        print(f"tp={tp} vs unsharded: max |diff| = {(sharded - mine).abs().max():.3g}")


if __name__ == "__main__":
    main()
