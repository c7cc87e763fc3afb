"""`spectune train-drafter`: train an EAGLE-3 head for a Llama-family target on its own responses.

    spectune train-drafter --model smollm2-135m --prompts orchestrator/prompts/data/spec_bench_public.jsonl \
        --split train --max-steps 400 --out /tmp/head

1. Responses: the target answers each prompt greedily through spectune's engine, its aux layers'
   states captured on the way (workers/drafters/eagle3/training.py); cached in OUT/data.pt.
2. Draft vocabulary from token frequency; the head is warm-started from the target.
3. Training-time test over --ttt-steps unrolled draft steps; a progress line with the loss and the
   top-1 accuracy of each draft position; OUT/train_state.pt every --save-every steps, and a run
   with the same OUT resumes from it (data, weights, optimizer, step).
4. OUT/config.json + OUT/model.safetensors in the public format (SGLang / vLLM / spectune load it).

`--split train` keeps 3 of every 4 prompts of each category (`heldout`: the 4th), so a head can be
scored on prompts it never saw. `--synthetic-prompts N` adds N prompts made by
orchestrator/prompts/synthesis.py (templates with fresh topics, names and numbers, and passages of the
standard library's docstrings): far more, and more varied, responses than the bundled file holds.
`--self-prompts N` adds N user prompts the target writes itself: given its chat template up to
where a user's message begins, a chat model samples a user's message (Magpie), so the head trains
on the kind of requests the target was tuned to answer, on any topic, not on templates.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from orchestrator.errors import UserError
from orchestrator.prompts.loading import Tokenizer, load_prompts
from orchestrator.train_options import TrainOptions


def _log(msg: str, end: str = "\n") -> None:
    print(msg, file=sys.stderr, end=end, flush=True)


def _self_prompts(model, tok, eos: set[int], o: TrainOptions, fast) -> list[str]:
    """The texts of --self-prompts user messages sampled by the target after its chat template's
    opening of a user turn (workers/drafters/eagle3/training.py self_prompts)."""
    from workers.drafters.eagle3.training import self_prompts

    hf = getattr(tok, "hf", None)
    if hf is None or not hf.chat_template:
        raise UserError(f"--self-prompts: {o.model} has no chat template to open a user's turn with; use --synthetic-prompts")
    mark = "\x00SPECTUNE\x00"
    full = hf.apply_chat_template([{"role": "user", "content": mark}], tokenize=False, add_generation_prompt=True)
    prefix = list(hf(full[: full.index(mark)], add_special_tokens=False)["input_ids"])
    # the end of the user's turn: the template's first token after the message
    after = hf(full[full.index(mark) + len(mark) :], add_special_tokens=False)["input_ids"]
    stop = set(eos) | ({after[0]} if after else set())
    rows = self_prompts(model, prefix, stop, o.self_prompts, o.seed, batch=min(o.gen_batch, o.self_prompts), fast=fast)
    # distinct token rows can decode to one text (whitespace, special tokens): distinct non-empty texts
    return [t for t in dict.fromkeys(hf.decode(r, skip_special_tokens=True).strip() for r in rows) if t]


def _val_every(o: TrainOptions, n: int) -> int:
    """Every how many of n responses one is kept for validation (0: none)."""
    return o.val_every if o.val_every > 1 and n >= 2 * o.val_every else 0


def _answer(model, encoded: list[list[int]], eos: set[int], o: TrainOptions, fast, t0: float) -> list:
    """The target's greedy responses to encoded prompts, --gen-batch at a time, with a progress line."""
    from workers.drafters.eagle3.training import generate

    samples = []
    for i in range(0, len(encoded), o.gen_batch):
        try:
            samples += generate(model, encoded[i : i + o.gen_batch], o.max_new_tokens, eos, fast)
        except ValueError as e:  # a prompt too long for the target
            raise UserError(f"--max-new-tokens {o.max_new_tokens}: {e}") from None
        _log(f"\rspectune: responses {len(samples)}/{len(encoded)} ({time.perf_counter() - t0:.0f}s)", end="")
    _log("")
    return samples


def train(o: TrainOptions) -> dict:
    from workers.drafters.eagle3.checkpoint import save_head
    from workers.drafters.eagle3.head import default_aux_layers
    from workers.drafters.eagle3.training import (
        batched_step,
        draft_vocabulary,
        pack_by_tokens,
        ttt_loss,
        validation_accuracy,
        warm_start,
    )
    from workers.model.checkpoint import load_args, load_model, resolve_model_path
    from workers.model.random_weights import is_random

    if not o.out:
        raise UserError("--out DIR is required")
    if o.max_steps < 1 or o.ttt_steps < 1 or o.batch < 1 or o.draft_vocab < 2 or o.pack_tokens < 1:
        raise UserError("--max-steps, --ttt-steps, --batch, --pack-tokens must be >= 1 and --draft-vocab >= 2")
    if min(o.max_time, o.synthetic_prompts, o.self_prompts) < 0:
        raise UserError("--max-time, --synthetic-prompts and --self-prompts must be >= 0")
    if o.device not in ("cpu", "cuda") or (o.device == "cuda" and not torch.cuda.is_available()):
        raise UserError(f"--device {o.device!r}: cpu, or cuda on a machine with a GPU")
    path = resolve_model_path(o.model)
    if is_random(path):
        raise UserError("--model: a head is trained on a real model's responses, not on random weights")
    torch.set_num_threads(o.threads)
    out = Path(o.out)
    out.mkdir(parents=True, exist_ok=True)
    args = load_args(path)
    aux_layers = default_aux_layers(args.n_layers)
    device = torch.device(o.device)
    # on a GPU the target answers in bf16, as it decodes there (and 256 rows of fp32 GEMMs are compute-bound);
    # on CPU in float32, as it decodes there
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    data_file = out / "data.pt"
    prompts = load_prompts(o.prompts, split=o.split)[: o.num_prompts]
    if not prompts:
        raise UserError(f"--prompts {o.prompts}: no prompts in split {o.split!r}")
    if o.synthetic_prompts:
        from orchestrator.prompts.synthesis import synthetic_prompts

        prompts += synthetic_prompts(o.synthetic_prompts, o.seed)
    # what the responses answer: the prompt texts themselves (their file may move, the synthetic
    # ones change with the generator's version and the Python's docstrings), the target, the length
    made_by = {
        "prompts_sha256": hashlib.sha256("\0".join(p.text for p in prompts).encode()).hexdigest(),
        "target": str(path),
        "max_new_tokens": o.max_new_tokens,
        "self_prompts": [o.self_prompts, o.seed if o.self_prompts else None],  # sampled by the target: the count and the seed name them
    }
    if data_file.is_file():
        data = torch.load(data_file, weights_only=False)
        old = dict(data.get("made_by", made_by))
        # older data: no self_prompts key, or a self_documents one (an option since removed: resumable if none made)
        documents = old.pop("self_documents", [0, None])
        if {"self_prompts": [0, None]} | old != made_by or (documents[0] if isinstance(documents, list) else documents):
            raise UserError(
                f"{data_file} holds responses to other prompts or of another target or length (--prompts, --split, --num-prompts, "
                "--synthetic-prompts, --self-prompts, --seed, --model, --max-new-tokens); use the same ones or a new --out"
            )
        _log(f"spectune: {len(data['samples'])} responses from {data_file}")
    # loaded once OUT's cached responses are known to fit (a mismatch is refused without it)
    model = load_model(path, dtype=dtype, device=device, max_seq=args.max_position_embeddings)
    model.aux_layers = aux_layers
    t0 = time.perf_counter()  # generation and training times, the target's load left out
    if not data_file.is_file():
        tok = Tokenizer(path)
        eos = set(tok.eos_ids) | set(args.eos_token_ids)
        fast = batched_step(model)
        encoded = [tok.encode_prompt(p.text) for p in prompts]
        written = []
        if o.self_prompts:
            written = _self_prompts(model, tok, eos, o, fast)
            encoded += [tok.encode_prompt(text) for text in written]
            _log(f"spectune: {len(written)} prompts written by the target ({time.perf_counter() - t0:.0f}s)")
        samples = _answer(model, encoded, eos, o, fast, t0)
        data = {
            "samples": samples,
            "prompts": len(samples),
            "self_prompts": written,  # their texts, for provenance
            "generate_s": time.perf_counter() - t0,
            "made_by": made_by,
        }
        torch.save(data, data_file)
    samples = data["samples"]
    if o.prompt_labels and any(getattr(s, "argmax", None) is None for s in samples):
        _log(f"spectune: {data_file} holds no prompt argmaxes (an older version's data): response positions only")
    # validation: responses to train-split prompts kept out of the optimizer (never held-out prompts);
    # the public-format head in OUT is the step with the best validation accepted length, not the last
    every = _val_every(o, len(samples))
    val = samples[every - 1 :: every] if every else []
    samples = [s for i, s in enumerate(samples) if not every or i % every != every - 1]
    draft_ids = draft_vocabulary(samples, min(o.draft_vocab, args.vocab_size), args.vocab_size)
    head = warm_start(model, aux_layers, draft_ids, seed=o.seed).to(device)
    del model
    params = [p for n, p in head.named_parameters() if n != "embed_tokens.weight"]
    opt = torch.optim.AdamW(params, lr=o.lr, weight_decay=0.0)
    step, history = 0, []
    best = {"step": 0, "score": float("-inf")}  # the step whose head OUT holds
    state_file = out / "train_state.pt"
    trained_s = 0.0  # training seconds of earlier runs of this OUT
    if state_file.is_file():
        st = torch.load(state_file, weights_only=False)
        head.load_state_dict(st["head"], strict=False)
        opt.load_state_dict(st["opt"])
        step, history = st["step"], st["history"]
        trained_s = st.get("train_s", 0.0)
        best = st.get("best", best)
        if st.get("val_every", o.val_every) != o.val_every:
            raise UserError(
                f"--val-every {o.val_every}: {state_file} was trained with {st['val_every']} (another validation set); use it or a new --out"
            )
        _log(f"spectune: resuming at step {step}")
    rng = random.Random(o.seed * 1000003 + step)
    # training time so far counts against --max-time (a resumed run continues its budget and schedule)
    t_train = time.perf_counter() - trained_s

    def progress(s: int) -> float:
        # the cosine schedule runs on whichever budget is further along: steps, or --max-time
        done = s / o.max_steps
        return max(done, (time.perf_counter() - t_train) / o.max_time) if o.max_time else done

    sched = lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(min(1.0, progress(s)) * math.pi))  # noqa: E731
    counts = [0] * o.ttt_steps
    correct = [0] * o.ttt_steps
    loss_avg = None
    while step < o.max_steps and not (o.max_time and time.perf_counter() - t_train >= o.max_time):
        for gr in opt.param_groups:
            gr["lr"] = o.lr * sched(step)
        opt.zero_grad(set_to_none=True)
        batch_loss = 0.0
        packs = pack_by_tokens(rng.sample(samples, min(o.batch, len(samples))), o.pack_tokens)
        batch_tokens = sum(len(x.tokens) for pack in packs for x in pack)
        for pack in packs:  # each pack one pass (attention inside each sample), gradients accumulated
            loss, c, k = ttt_loss(head, pack, o.ttt_steps, o.prompt_labels)
            share = sum(len(x.tokens) for x in pack) / batch_tokens  # a pack weighs as much as its tokens
            if loss.requires_grad:
                (loss * share).backward()
            batch_loss += float(loss.detach()) * share
            counts = [a + b for a, b in zip(counts, c)]
            correct = [a + b for a, b in zip(correct, k)]
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        loss_avg = batch_loss if loss_avg is None else 0.9 * loss_avg + 0.1 * batch_loss
        acc = [c / max(1, n) for c, n in zip(correct, counts)]
        _log(f"\rspectune: step {step}/{o.max_steps} loss {loss_avg:.3f} acc " + " ".join(f"{a:.2f}" for a in acc), end="")
        out_of_time = bool(o.max_time) and time.perf_counter() - t_train >= o.max_time
        if step % o.save_every == 0 or step == o.max_steps or out_of_time:
            entry = {"step": step, "loss": loss_avg, "acc": acc}
            if val:
                entry["val_acc"], entry["val_accept_len"] = validation_accuracy(head, val, o.ttt_steps, o.pack_tokens)
                _log(f"  val acc {' '.join(f'{a:.2f}' for a in entry['val_acc'])} accepted {entry['val_accept_len']:.2f}", end="")
            history.append(entry)
            counts, correct = [0] * o.ttt_steps, [0] * o.ttt_steps
            # the validation responses' accepted length (a --ttt-steps chain from each position); without validation the latest step
            score = entry["val_accept_len"] if val else float(step)
            if score > best["score"]:
                best = {"step": step, "score": score}
                save_head(head, out)
            weights = {k: v for k, v in head.state_dict().items() if k != "embed_tokens.weight"}  # the target's
            torch.save(
                {
                    "head": weights,
                    "opt": opt.state_dict(),
                    "step": step,
                    "history": history,
                    "best": best,
                    "val_every": o.val_every,
                    "train_s": time.perf_counter() - t_train,  # all runs of this OUT
                },
                state_file,
            )
        if out_of_time:
            _log(f"\nspectune: --max-time {o.max_time:g}s reached at step {step}")
            break
    _log("")
    summary = {
        "out": str(out),
        "responses": len(samples),
        "response_tokens": sum(len(s.tokens) - s.prompt_len for s in samples),
        "draft_vocab": len(draft_ids),
        "aux_layers": list(aux_layers),
        "steps": step,
        "best_step": best["step"],
        "validation_responses": len(val),
        "history": history,
        "generate_s": data.get("generate_s"),
        "train_s": time.perf_counter() - t_train,  # all runs of this OUT
        "stopped_by_time": bool(o.max_time) and step < o.max_steps,
        "options": asdict(o),
    }
    (out / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
