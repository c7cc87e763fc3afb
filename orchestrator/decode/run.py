"""`spectune decode`: one configuration, no study. Runs the greedy baseline (k = 0) and the
speculative configuration on the same prompts in one gang of worker processes and prints one
JSON object with the metric names of docs/reference.md (plus per-category acceptance).

    spectune decode --model smollm2-135m --tp 2 --drafter ngram --num-draft-tokens 4 \
        --category summarization --num-prompts 4 --max-new-tokens 64 --json

The flags become an experiment configuration (`experiment`), which takes the path of a study's
trial: validation (orchestrator/config/validate.py), the prepared workload, the trial's resolved
parameters (orchestrator/config/space.py `resolve`: engine settings included) and its GangSpec.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

from orchestrator.config.registry import PARAMS
from orchestrator.config.schema import ExperimentConfig, validated
from orchestrator.config.space import TrialConfig, resolve
from orchestrator.config.validate import check_experiment
from orchestrator.errors import UserError
from orchestrator.prompts.loading import BUNDLED_PROMPTS, Prompt, Tokenizer
from orchestrator.study.equivalence import outputs_verdict
from workers.model.checkpoint import load_args, resolve_model_path
from workers.runtime.gang import Gang
from workers.spec import GangSpec, RunResult, Workload


@dataclass
class DecodeOptions:
    model: str = "smollm2-135m"
    tp: int = 1
    backend: str = "gloo"
    drafter: str = "ngram"
    draft_model: str | None = None
    draft_layers: int | None = None
    ngram_max: int = 3
    ngram_actor: bool = False
    draft_placement: str = "actor"  # eagle3: actor | rank0
    draft_lookup: int = 0  # eagle3: n-gram lookup, instead of the head's chain or as tree branches (drafter.lookup)
    tree_width: int = 0  # eagle3: 0/1 a chain, w >= 2 a tree of the head's top-w tokens per depth (drafter.tree_width)
    num_draft_tokens: int = 4
    temperature: float = 0.0
    prompts: str = str(BUNDLED_PROMPTS)
    num_prompts: int | None = None  # default: 8, unless per_category picks them
    categories: list[str] | None = None
    per_category: int | None = None
    split: str = "all"  # all | train | heldout (orchestrator/prompts/loading.py)
    max_new_tokens: int = 64
    seed: int = 0
    vocab_parallel: bool = False
    threads: int = 1
    baseline: bool = True
    timeout_s: float = 1800.0
    device: str = "cpu"
    dtype: str | None = None  # default: bfloat16 on cuda, float32 on cpu
    # the engine (workers/engine/config.py): the flags of the YAML section `engine:`
    cuda_graphs: bool = True
    compile: bool = True
    attention: str = "auto"
    gemv: str = "auto"
    fused_add_norm: bool = True
    overlap: bool = True
    simulate_accept_len: float | None = None
    batch_size: int = 1  # > 1: the speculative run and a plain run decode in static batches of this size
    ablation_iters: int | None = None  # comm/compute split; default 10 on cpu, 50 on cuda (tp > 1)
    peer_baseline: bool = False  # also time transformers' generate (and assisted generation with --draft-model)
    ray: bool = False  # the gang as Ray actors (RAY_ADDRESS or an embedded local Ray) instead of local processes


@dataclass
class DecodePlan:
    cfg: ExperimentConfig
    trial: TrialConfig
    gang: GangSpec
    workload: Workload  # the speculative run (k = 0: the baseline itself)
    prompts: list[Prompt]
    token_ids: tuple[tuple[int, ...], ...]
    tokenizer: Tokenizer


# the YAML field each decode flag sets (experiment() below): errors of the study's checks name the flag
FLAGS = {
    "parallel.tp": "--tp",
    "parallel.backend": "--backend",
    "drafter.kind": "--drafter",
    "drafter.model_path": "--draft-model",
    "drafter.placement": "--draft-placement",
    "drafter.lookup": "--draft-lookup",
    "drafter.tree_width": "--tree-width",
    "drafter.layers": "--draft-layers",
    "drafter.ngram_max": "--ngram-max",
    "drafter.num_draft_tokens": "--num-draft-tokens",
    "model.path": "--model",
    "model.dtype": "--dtype",
    "workload.prompts": "--prompts",
    "workload.max_new_tokens": "--max-new-tokens",
    "engine.attention": "--attention",
    "engine.gemv": "--gemv",
    "workload.simulate_accept_len": "--simulate-accept-len",
    "workload.batch_sizes": "--batch-size",
}


def log(msg: str) -> None:
    print(f"spectune: {msg}", file=sys.stderr, flush=True)


def experiment(o: DecodeOptions, n_layers: int) -> ExperimentConfig:
    """The flags as an experiment configuration of one trial (no search)."""
    k = o.num_draft_tokens
    layers = o.draft_layers if o.draft_layers is not None else max(1, n_layers // 2)
    drafter = {
        "kind": o.drafter,
        "num_draft_tokens": k,
        "ngram_max": o.ngram_max,
        **({"model_path": o.draft_model} if o.drafter in ("draft_model", "eagle3") else {}),
        **({"placement": o.draft_placement, "lookup": o.draft_lookup, "tree_width": o.tree_width} if o.drafter == "eagle3" else {}),
        **({"layers": layers} if o.drafter == "layer_skip" else {}),
    }
    raw = {
        "name": "decode",
        "model": {"path": o.model, "dtype": o.dtype or ("bfloat16" if o.device == "cuda" else "float32")},
        "drafter": drafter,
        "parallel": {"tp": o.tp, "device": o.device, "backend": o.backend, "threads": o.threads, "vocab_parallel": o.vocab_parallel},
        "engine": {
            "attention": o.attention,
            "cuda_graphs": o.cuda_graphs,
            "compile": o.compile,
            "gemv": o.gemv,
            "fused_add_norm": o.fused_add_norm,
            "overlap": o.overlap,
        },
        "workload": {
            "prompts": o.prompts,
            "num_prompts": o.num_prompts if o.num_prompts is not None or o.per_category else 8,
            "per_category": o.per_category,
            "split": o.split,
            "categories": o.categories,
            "max_new_tokens": o.max_new_tokens,
            "temperature": o.temperature,
            "seed": o.seed,
            "simulate_accept_len": o.simulate_accept_len,
            "batch_sizes": [o.batch_size],
        },
        "search": {"space": {"spec.num_draft_tokens": k}},
        "study": {"n_trials": 1, "baseline": False},
    }
    return validated(raw)


def plan(o: DecodeOptions) -> DecodePlan:
    """Check every input before any process starts; raise UserError (one line) on the first problem.
    The flags' own checks first (named by flag), then those of a study's trial."""
    args = load_args(resolve_model_path(o.model))
    if o.device not in ("cpu", "cuda"):
        raise UserError(f"--device {o.device!r} must be cpu or cuda")
    if o.device == "cuda":
        import torch

        if torch.cuda.device_count() < 1:
            raise UserError("--device cuda: this machine has no CUDA device")
    for flag, name, v in (("--num-draft-tokens", "spec.num_draft_tokens", o.num_draft_tokens), ("--drafter", "drafter.kind", o.drafter)):
        if why := PARAMS[name].problem(v):
            raise UserError(f"{flag} {why}")
    if o.simulate_accept_len is not None and not 1 <= o.simulate_accept_len <= o.num_draft_tokens + 1:
        raise UserError(f"--simulate-accept-len {o.simulate_accept_len} must be between 1 and k + 1 = {o.num_draft_tokens + 1}")
    if o.drafter == "none" and o.num_draft_tokens > 0:
        raise UserError(f"--num-draft-tokens {o.num_draft_tokens} needs a drafter (--drafter ngram, layer_skip, draft_model or eagle3)")
    if o.drafter == "draft_model" and not o.draft_model:
        raise UserError("--drafter draft_model needs --draft-model PATH")
    if o.drafter == "eagle3" and not o.draft_model:
        raise UserError("--drafter eagle3 needs --draft-model PATH (an EAGLE-3 head, e.g. smollm2-135m-eagle3)")
    if why := PARAMS["drafter.placement"].problem(o.draft_placement):
        raise UserError(f"--draft-placement {why}")
    if why := PARAMS["drafter.lookup"].problem(o.draft_lookup):
        raise UserError(f"--draft-lookup {why}")
    if why := PARAMS["drafter.tree_width"].problem(o.tree_width):
        raise UserError(f"--tree-width {why}")
    if o.temperature < 0:
        raise UserError(f"--temperature {o.temperature} must be >= 0")
    if o.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {o.max_new_tokens} must be at least 1")
    if o.batch_size < 1:
        raise UserError(f"--batch-size {o.batch_size} must be at least 1")
    if o.batch_size > 1 and o.ngram_actor and o.temperature > 0 and o.simulate_accept_len is None:
        raise UserError("--batch-size > 1 with --ngram-actor (a drafter process) needs greedy decoding (--temperature 0)")
    if o.batch_size > 1 and o.drafter == "eagle3" and o.tree_width >= 2:
        raise UserError(f"--tree-width {o.tree_width} drafts a tree, which runs at batch size 1 only (--batch-size {o.batch_size})")
    if o.attention == "triton" and o.device != "cuda":
        raise UserError("--attention triton runs the CUDA graphs' attention kernel; this run is on CPU (use auto or sdpa)")
    try:
        cfg = experiment(o, args.n_layers)
        prepared = check_experiment(cfg)  # as `spectune validate` / `run` check a study
    except UserError as e:  # named by the flag that set it, not by its YAML field
        field, sep, why = str(e).partition(": ")
        raise UserError(f"{FLAGS[field]}: {why}" if sep and field in FLAGS else str(e)) from None
    tc = resolve({}, cfg)
    gang = prepared.gang_spec(cfg, tc)
    if o.ngram_actor and gang.drafter.kind == "ngram":  # the n-gram drafter as its own process on the draft link
        gang = replace(gang, drafter=replace(gang.drafter, ngram_actor=True))
    ablation = o.ablation_iters if o.ablation_iters is not None else (50 if o.device == "cuda" else 5)
    workload = replace(
        prepared.workload(cfg, tc, batch_size=o.batch_size), record_margins=False, comm_ablation_iters=ablation if o.tp > 1 else 0
    )
    return DecodePlan(
        cfg=cfg,
        trial=tc,
        gang=gang,
        workload=workload,
        prompts=prepared.prompts,
        token_ids=prepared.token_ids,
        tokenizer=prepared.tokenizer,
    )


def params(o: DecodeOptions, p: DecodePlan) -> dict:
    """The configuration with the dotted names MLflow params use (a trial's, plus the workload's)."""
    w = p.cfg.workload
    return {
        "model.path": o.model,
        **p.trial.params(),
        "workload.temperature": w.temperature,
        "workload.num_prompts": len(p.prompts),
        "workload.max_new_tokens": w.max_new_tokens,
        "workload.seed": w.seed,
        "workload.batch_size": o.batch_size,
    }


def per_category(prompts: list[Prompt], result: RunResult, batched: bool = False) -> dict:
    """Acceptance per category, and throughput where each prompt ran alone (a batch's prompts share their seconds)."""
    groups = defaultdict(list)
    for prompt, r in zip(prompts, result.prompts):
        groups[prompt.category].append(r)
    return {
        cat: {
            "prompts": len(rs),
            "accept_len_mean": sum(r.accepted + r.steps for r in rs) / max(1, sum(r.steps for r in rs)),
            **({} if batched else {"throughput_tok_s": sum(len(r.tokens) for r in rs) / sum(r.seconds for r in rs)}),
        }
        for cat, rs in sorted(groups.items())
    }


class _PeerCut(Exception):
    pass


def _cut_peer(signum, frame):
    raise _PeerCut()


def peer(o: DecodeOptions, p: DecodePlan, base: RunResult) -> dict:
    """transformers' generate on the same prompts (and assisted generation with the draft model).

    It runs after our own figures exist, and is the slow part (eager generate of a large model):
    a SIGTERM (e.g. `timeout`) during it ends only it, so those figures are still printed, with
    `peer_baseline_cut` = 1 and whatever peer figure was complete."""
    import signal

    import torch

    from orchestrator.decode.peer import generate_throughput

    dtype = getattr(torch, p.gang.dtype)
    device = "cuda:0" if o.device == "cuda" else "cpu"
    prompts = [list(s) for s in p.token_ids]
    out: dict = {}
    try:
        previous = signal.signal(signal.SIGTERM, _cut_peer)
    except ValueError:  # not the main thread: no handler, nothing to restore
        previous = None
    try:
        log("peer baseline: transformers generate ...")
        out.update(generate_throughput(p.gang.model_path, prompts, o.max_new_tokens, dtype, device))
        out["baseline_vs_hf_generate"] = base.metrics["throughput_tok_s"] / out["hf_generate_tok_s"]  # both include prefill
        if p.gang.drafter.kind == "draft_model":
            log("peer baseline: transformers assisted generation ...")
            out.update(generate_throughput(p.gang.model_path, prompts, o.max_new_tokens, dtype, device, p.gang.drafter.model_path))
    except _PeerCut:
        log("peer baseline cut short by SIGTERM: our figures are printed without the peer figures it lacked")
        out["peer_baseline_cut"] = 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return out


def _decode_on_ray(o: DecodeOptions, p: DecodePlan) -> dict:
    """`decode` with the gang as Ray actors, placed as a study's trial places them (placement group,
    one GPU per verifier rank, NVLink multicast off in every actor)."""
    import os

    import ray

    from orchestrator.execution.cluster import Resources, connect
    from orchestrator.execution.gang import RayGang

    embedded = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
    log(f"gang as Ray actors: {connect()}")
    res = Resources(call_timeout_s=o.timeout_s, setup_timeout_s=o.timeout_s)
    try:
        return {**_decode(o, p, lambda spec: RayGang(spec, {}, res)), "gang": "ray"}
    finally:
        if embedded:
            ray.shutdown()


def decode(o: DecodeOptions, gang_factory: Callable[[GangSpec], Gang] | None = None) -> dict:
    from workers.runtime.local_gang import LocalGang

    p = plan(o)  # bad input fails here, before any process or Ray starts
    if o.ray and gang_factory is None:
        return _decode_on_ray(o, p)
    return _decode(o, p, gang_factory or (lambda spec: LocalGang(spec, timeout_s=o.timeout_s)))


def _decode(o: DecodeOptions, p: DecodePlan, make: Callable[[GangSpec], Gang]) -> dict:
    workload = p.workload
    n_tokens = sum(len(s) for s in p.token_ids)
    log(
        f"{len(p.prompts)} prompts ({n_tokens} prompt tokens), model {p.gang.model_path}, tp={o.tp}, drafter={o.drafter}, k={o.num_draft_tokens}"
    )
    t0 = time.perf_counter()
    with make(p.gang) as gang:
        setup = gang.setup()
        setup_s = time.perf_counter() - t0
        attention = next((s["attention"] for s in setup if s.get("attention")), "sdpa")
        log(f"gang of {p.gang.world_size} processes ready in {setup_s:.1f}s (step attention: {attention})")
        warm = Workload(prompts=p.token_ids[:1], max_new_tokens=4, num_draft_tokens=o.num_draft_tokens, eos_ids=())
        gang.run(warm)
        base = ref = None
        B = workload.batch_size
        if o.baseline and (o.num_draft_tokens > 0 or B > 1):
            # the reference: plain decoding at batch 1 (its tokens and near-tie margins judge every other run)
            ref = gang.run(replace(workload, num_draft_tokens=0, simulate_accept_len=None, record_margins=o.temperature == 0, batch_size=1))
            log(f"baseline (k=0, batch 1): {ref.metrics['throughput_tok_s']:.1f} tok/s")
            base = ref
            if B > 1 and o.num_draft_tokens > 0:
                base = gang.run(replace(workload, num_draft_tokens=0, simulate_accept_len=None))
                log(f"baseline (k=0, batch {B}): {base.metrics['throughput_tok_s']:.1f} tok/s")
        spec = gang.run(workload)
        log(
            f"k={o.num_draft_tokens}: {spec.metrics['throughput_tok_s']:.1f} tok/s, accepted length {spec.metrics.get('accept_len_mean', 1.0):.2f}"
        )
        rss = [round(mb, 1) for mb in gang.peak_rss_mb()[: o.tp]]  # each verifier rank's peak resident memory
    out: dict = {
        "params": params(o, p),
        **spec.metrics,
        "setup_s": max(s["setup_s"] for s in setup),
        "attention": attention,
        "fused_add_norm": any(s.get("fused_add_norm") for s in setup),
        "rank_peak_rss_mb": rss,
        "prompt_tokens_mean": n_tokens / len(p.token_ids),
    }
    if base is None and o.num_draft_tokens == 0:
        base = spec
    if ref is not None and B > 1:
        plain = spec if o.num_draft_tokens == 0 else base
        out["batch1_baseline_throughput_tok_s"] = ref.metrics["throughput_tok_s"]
        out["batch1_baseline_decode_tok_s"] = ref.metrics["decode_tok_s"]
        out["plain_batch_speedup"] = plain.metrics["throughput_tok_s"] / ref.metrics["throughput_tok_s"]  # plain at B over plain at 1
        if o.temperature == 0:
            verdict = outputs_verdict(
                [r.tokens for r in ref.prompts], [r.margins for r in ref.prompts], [r.tokens for r in plain.prompts], p.gang.dtype
            )
            out["plain_batch_outputs_match_batch1"] = verdict["outputs_match_baseline"]
        if o.num_draft_tokens == 0:
            base = ref
    if base is not None:
        out["speedup_vs_baseline"] = spec.metrics["throughput_tok_s"] / base.metrics["throughput_tok_s"]
        out["baseline_throughput_tok_s"] = base.metrics["throughput_tok_s"]
        if "decode_tok_s" in base.metrics and "decode_tok_s" in spec.metrics:
            out["baseline_decode_tok_s"] = base.metrics["decode_tok_s"]
            out["decode_speedup_vs_baseline"] = spec.metrics["decode_tok_s"] / base.metrics["decode_tok_s"]
        if o.temperature == 0 and o.simulate_accept_len is None:
            judge = ref or base  # batch 1's tokens and margins
            out.update(
                outputs_verdict(
                    [b.tokens for b in judge.prompts], [b.margins for b in judge.prompts], [s.tokens for s in spec.prompts], p.gang.dtype
                )
            )
    if o.peer_baseline:
        out.update(peer(o, p, base or spec))
    out["per_category"] = per_category(p.prompts, spec, batched=B > 1)
    out["median_prompt_accept_len"] = statistics.median(r.accept_len for r in spec.prompts)
    out["prefill_ms"] = [round(r.prefill_s * 1e3, 2) for r in spec.prompts]
    out["sample_output"] = p.tokenizer.decode(spec.prompts[0].tokens)
    return out
