"""`spectune decode`: one configuration, no study. Runs the greedy baseline (k = 0) and the
speculative configuration on the same prompts in one gang of worker processes and prints one
JSON object with the metric names of docs/reference.md (plus per-category acceptance).

    spectune decode --model smollm2-135m --tp 2 --drafter ngram --num-draft-tokens 4 \
        --category summarization --num-prompts 4 --max-new-tokens 64 --json
    spectune decode --emulate-tp 8 --allreduce-table pcie-8x-rtx-pro-6000 --simulate-accept-len 3 ...   # one rank of TP 8

The flags become an experiment configuration (`experiment`), which takes the path of a study's
trial: validation (orchestrator/execution/validate.py), the prepared workload, the trial's resolved
parameters (orchestrator/config/space.py `resolve`: engine settings included) and its GangSpec.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

from orchestrator.config import emulation
from orchestrator.config.emulation import deployed_tp
from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.space import TrialConfig, resolve
from orchestrator.decode.flags import DecodeRun, experiment, flag_message
from orchestrator.errors import UserError
from orchestrator.execution.validate import check_experiment
from orchestrator.execution.workload import ABLATION_ITERS
from orchestrator.prompts.loading import Prompt, Tokenizer
from orchestrator.study.equivalence import outputs_verdict
from workers.model.locate import load_args, resolve_model_path
from workers.runtime.gang import Gang
from workers.spec import GangSpec, RunResult, Workload, batch_refusal


@dataclass
class DecodePlan:
    cfg: ExperimentConfig
    trial: TrialConfig
    gang: GangSpec
    workload: Workload  # the speculative run (k = 0: the baseline itself)
    prompts: list[Prompt]
    token_ids: tuple[tuple[int, ...], ...]
    tokenizer: Tokenizer


def log(msg: str) -> None:
    print(f"spectune: {msg}", file=sys.stderr, flush=True)


def rates(metrics: dict) -> str:
    """A run's throughput (prefill included) and, where it has decode steps, its decode rate (steps only)."""
    text = f"{metrics['throughput_tok_s']:.1f} tok/s"
    return text + (f" (decode {metrics['decode_tok_s']:.1f} tok/s)" if metrics.get("decode_tok_s") else "")


def plan(given: dict, run: DecodeRun) -> DecodePlan:
    """Check every input before any process starts; raise UserError (one line) on the first problem.
    `given`: the YAML fields the flags set (orchestrator/decode/flags.py); the checks are those of a
    study (schema, then orchestrator/execution/validate.py), their errors named by the flag that set the field."""
    given = dict(given)
    try:
        cfg = experiment(given)
        if cfg.parallel.emulate_tp is not None and "parallel.backend" not in given:
            # no --backend: an emulated rank waits as its table says, so take the table's one backend at that TP
            table = emulation.table_of(cfg)
            if table is not None and len(offered := table.backends(cfg.parallel.emulate_tp)) == 1:
                given["parallel.backend"] = offered[0]
                cfg = experiment(given)
        if cfg.drafter.kind == "layer_skip" and cfg.drafter.layers is None:  # default: half the verifier's layers
            given["drafter.layers"] = max(1, load_args(resolve_model_path(cfg.model.path)).n_layers // 2)
            cfg = experiment(given)
        prepared = check_experiment(cfg)  # as `spectune validate` / `run` check a study
    except UserError as e:
        raise UserError(flag_message(str(e))) from None
    w = cfg.workload
    if run.peer_baseline and cfg.parallel.emulate_tp is not None:
        raise UserError("--peer-baseline: an emulated rank's outputs are not the model's (--emulate-tp); there is nothing to compare")
    if cfg.parallel.device == "cuda":
        import torch

        if torch.cuda.device_count() < 1:
            raise UserError("--device cuda: this machine has no CUDA device")
    batch = max(w.batch_sizes)
    sampled = w.temperature > 0 and not w.simulated
    if run.ngram_actor and (why := batch_refusal(batch, drafter_process=True, hidden_over_link=False, tree=False, sampled=sampled)):
        raise UserError(f"--batch-size: {why} (--ngram-actor)")
    tc = resolve({}, cfg)
    gang = prepared.gang_spec(cfg, tc)
    if run.ngram_actor and gang.drafter.kind == "ngram":  # the n-gram drafter as its own process on the draft link
        gang = replace(gang, drafter=replace(gang.drafter, ngram_actor=True))
    ablation = run.ablation_iters if run.ablation_iters is not None else ABLATION_ITERS[cfg.parallel.device]
    tp = deployed_tp({}, cfg)
    # margins only where this run is itself the plain batch-1 reference a --peer-baseline check reads (k = 0);
    # otherwise the baseline run records them
    peer_judge = run.peer_baseline and cfg.workload.temperature == 0 and tc.num_draft_tokens == 0 and batch == 1
    context = w.context_lengths[0] if w.context_lengths else None  # --context-len: the prompts drawn to L tokens
    workload = replace(
        prepared.workload(cfg, tc, prompts=prepared.prompts_at(context), batch_size=batch),
        record_margins=peer_judge,
        comm_ablation_iters=ablation if tp > 1 else 0,
        # an MoE verifier: the distinct experts each pass width reads (moe_experts_w<W>), over the model's own
        # tokens: under imposed acceptance the kept drafts are not, so the plain reference run counts them
        count_experts=not (w.simulated and tc.num_draft_tokens > 0),
    )
    return DecodePlan(
        cfg=cfg,
        trial=tc,
        gang=gang,
        workload=workload,
        prompts=prepared.prompts,
        token_ids=prepared.prompts_at(context),
        tokenizer=prepared.tokenizer,
    )


def params(p: DecodePlan) -> dict:
    """The configuration with the dotted names MLflow params use (a trial's, plus the workload's)."""
    w = p.cfg.workload
    subset = load_args(p.gang.model_path).layers_label  # "8 of 94 layers" for a random shape's layer subset
    return {
        "model.path": p.cfg.model.path,
        **({"model.layers": subset} if subset else {}),
        **p.trial.params(),
        **emulation.params(p.cfg, p.gang.allreduce_table),  # emulated TP: the table's name and hash, the acceptance
        "workload.temperature": w.temperature,
        "workload.num_prompts": len(p.prompts),
        "workload.max_new_tokens": w.max_new_tokens,
        "workload.seed": w.seed,
        "workload.batch_size": p.workload.batch_size,
        **({"workload.context_len": w.context_lengths[0]} if w.context_lengths else {}),
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


def peer_verdict(ours: RunResult, theirs: list[list[int]], eos: set[int], dtype: str) -> dict[str, int]:
    """outputs_match_peer: 1 when transformers' greedy tokens are our plain decoding's on every prompt,
    under the baseline's near-tie rule (orchestrator/study/equivalence.py; our margins judge where
    the run recorded them). Where our prompt ended at an EOS, transformers' run (held to max_new_tokens
    by min_new_tokens, which also forbids that EOS) is compared on the tokens before it."""
    pairs = [
        (o.tokens[:-1], t[: len(o.tokens) - 1]) if o.tokens and o.tokens[-1] in eos else (o.tokens, t) for o, t in zip(ours.prompts, theirs)
    ]
    v = outputs_verdict([a for a, _ in pairs], [o.margins for o in ours.prompts], [b for _, b in pairs], dtype)
    return {
        "outputs_match_peer": v["outputs_match_baseline"],
        "prompts_matching_peer": v["prompts_matching_baseline"],
        "prompts_near_tie_peer": v["prompts_near_tie"],
    }


def peer(p: DecodePlan, base: RunResult) -> dict:
    """transformers' generate on the same prompts (and assisted generation with the draft model).

    It runs after our own figures exist, and is the slow part (eager generate of a large model):
    a SIGTERM (e.g. `timeout`) during it ends only it, so those figures are still printed, with
    `peer_baseline_cut` = 1 and whatever peer figure was complete."""
    import signal

    import torch

    from orchestrator.decode.peer import generate_throughput

    dtype = getattr(torch, p.gang.dtype)
    device = "cuda:0" if p.cfg.parallel.device == "cuda" else "cpu"
    max_new = p.cfg.workload.max_new_tokens
    prompts = [list(s) for s in p.token_ids]
    out: dict = {}
    try:
        previous = signal.signal(signal.SIGTERM, _cut_peer)
    except ValueError:  # not the main thread: no handler, nothing to restore
        previous = None
    try:
        log("peer baseline: transformers generate ...")
        theirs: list[list[int]] = []
        out.update(generate_throughput(p.gang.model_path, prompts, max_new, dtype, device, outputs=theirs))
        out["baseline_vs_hf_generate"] = base.metrics["throughput_tok_s"] / out["hf_generate_tok_s"]  # both include prefill
        if p.cfg.workload.temperature == 0:
            out.update(peer_verdict(base, theirs, set(p.workload.eos_ids), p.gang.dtype))
        if p.gang.drafter.kind == "draft_model":
            log("peer baseline: transformers assisted generation ...")
            out.update(generate_throughput(p.gang.model_path, prompts, max_new, dtype, device, p.gang.drafter.model_path))
    except _PeerCut:
        log("peer baseline cut short by SIGTERM: our figures are printed without the peer figures it lacked")
        out["peer_baseline_cut"] = 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return out


def _decode_on_ray(run: DecodeRun, p: DecodePlan) -> dict:
    """`decode` with the gang as Ray actors, placed as a study's trial places them (placement group,
    one GPU per verifier rank, NVLink multicast off in every actor)."""
    import os

    import ray

    from orchestrator.execution.cluster import Resources, connect
    from orchestrator.execution.gang import RayGang

    embedded = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
    log(f"gang as Ray actors: {connect()}")
    res = Resources(call_timeout_s=run.timeout_s, setup_timeout_s=run.timeout_s)
    try:
        return {**_decode(run, p, lambda spec: RayGang(spec, {}, res)), "gang": "ray"}
    finally:
        if embedded:
            ray.shutdown()


def decode(given: dict, run: DecodeRun = DecodeRun(), gang_factory: Callable[[GangSpec], Gang] | None = None) -> dict:
    """Decode the configuration of `given` (YAML fields the flags set) as `run` says; the JSON object's dict."""
    p = plan(given, run)  # bad input fails here, before any process or Ray starts (or torch is imported)
    if run.ray and gang_factory is None:
        return _decode_on_ray(run, p)
    from workers.runtime.local_gang import LocalGang

    return _decode(run, p, gang_factory or (lambda spec: LocalGang(spec, timeout_s=run.timeout_s)))


def _decode(run: DecodeRun, p: DecodePlan, make: Callable[[GangSpec], Gang]) -> dict:
    workload, cfg = p.workload, p.cfg
    k, greedy = workload.num_draft_tokens, cfg.workload.temperature == 0
    n_tokens = sum(len(s) for s in p.token_ids)
    log(
        f"{len(p.prompts)} prompts ({n_tokens} prompt tokens), model {p.gang.model_path}"
        + (f" ({subset}: figures for these layers only)" if (subset := load_args(p.gang.model_path).layers_label) else "")
        + f", tp={cfg.parallel.tp}, drafter={cfg.drafter.kind}, k={k}"
        + (
            f"; {emulated} ({emulation.acceptance(cfg)}): figures emulated"
            if (emulated := emulation.label(cfg, p.gang.allreduce_table))
            else ""
        )
    )
    t0 = time.perf_counter()
    with make(p.gang) as gang:
        setup = gang.setup()
        setup_s = time.perf_counter() - t0
        attention = next((s["attention"] for s in setup if s.get("attention")), "sdpa")
        moe_experts = next((s["moe_experts"] for s in setup if s.get("moe_experts")), None)  # an MoE verifier's expert path
        log(f"gang of {p.gang.world_size} processes ready in {setup_s:.1f}s (step attention: {attention})")
        warm = Workload(prompts=p.token_ids[:1], max_new_tokens=4, num_draft_tokens=k, eos_ids=())
        gang.run(warm)
        base = ref = None
        B = workload.batch_size
        if run.baseline and (k > 0 or B > 1):
            # the reference: plain decoding at batch 1 (its tokens and near-tie margins judge every other run)
            ref = gang.run(
                replace(
                    workload,
                    num_draft_tokens=0,
                    simulate_accept_len=None,
                    simulate_accept_profile=None,
                    record_margins=greedy,
                    batch_size=1,
                    count_experts=not workload.count_experts,  # the one census reported (see DecodePlan)
                )
            )
            log(f"baseline (k=0, batch 1): {rates(ref.metrics)}")
            base = ref
            if B > 1 and k > 0:
                base = gang.run(replace(workload, num_draft_tokens=0, simulate_accept_len=None, simulate_accept_profile=None))
                log(f"baseline (k=0, batch {B}): {rates(base.metrics)}")
        spec = gang.run(workload)
        log(
            f"k={k}{f', batch {B}' if B > 1 else ''}: {rates(spec.metrics)}, accepted length {spec.metrics.get('accept_len_mean', 1.0):.2f}"
        )
        rss = [round(mb, 1) for mb in gang.peak_rss_mb()[: cfg.parallel.tp]]  # each verifier rank's peak resident memory
    census = spec if p.workload.count_experts or ref is None else ref  # the run that counted the experts
    out: dict = {
        "params": params(p),
        **spec.metrics,
        **{name: value for name, value in census.metrics.items() if name.startswith("moe_experts_w")},
        "setup_s": max(s["setup_s"] for s in setup),
        "attention": attention,
        **({"moe_experts": moe_experts} if moe_experts else {}),
        "fused_add_norm": any(s.get("fused_add_norm") for s in setup),
        "rank_peak_rss_mb": rss,
        "prompt_tokens_mean": n_tokens / len(p.token_ids),
    }
    if emulated:  # no output of an emulated rank is the model's: none is compared with a baseline
        out["emulated"] = emulated
        out["acceptance"] = emulation.acceptance(cfg)
    if base is None and k == 0:
        base = spec
    if ref is not None and B > 1:
        plain = spec if k == 0 else base
        out["batch1_baseline_throughput_tok_s"] = ref.metrics["throughput_tok_s"]
        out["batch1_baseline_decode_tok_s"] = ref.metrics["decode_tok_s"]
        out["plain_batch_speedup"] = plain.metrics["throughput_tok_s"] / ref.metrics["throughput_tok_s"]  # plain at B over plain at 1
        if "decode_tok_s" in plain.metrics and "decode_tok_s" in ref.metrics:  # decode steps only, prefills left out
            out["plain_batch_decode_speedup"] = plain.metrics["decode_tok_s"] / ref.metrics["decode_tok_s"]
        if greedy and not emulated:
            verdict = outputs_verdict(
                [r.tokens for r in ref.prompts], [r.margins for r in ref.prompts], [r.tokens for r in plain.prompts], p.gang.dtype
            )
            out["plain_batch_outputs_match_batch1"] = verdict["outputs_match_baseline"]
            out["plain_batch_prompts_identical_to_batch1"] = verdict["prompts_matching_baseline"]  # token for token, no near tie
        if k == 0:
            base = ref
    if base is not None:
        out["speedup_vs_baseline"] = spec.metrics["throughput_tok_s"] / base.metrics["throughput_tok_s"]
        out["baseline_throughput_tok_s"] = base.metrics["throughput_tok_s"]
        if "decode_tok_s" in base.metrics and "decode_tok_s" in spec.metrics:
            out["baseline_decode_tok_s"] = base.metrics["decode_tok_s"]
            out["decode_speedup_vs_baseline"] = spec.metrics["decode_tok_s"] / base.metrics["decode_tok_s"]
        if greedy and not cfg.workload.simulated and not emulated:
            judge = ref or base  # batch 1's tokens and margins
            out.update(
                outputs_verdict(
                    [b.tokens for b in judge.prompts], [b.margins for b in judge.prompts], [s.tokens for s in spec.prompts], p.gang.dtype
                )
            )
    if run.peer_baseline:
        # plain decoding at batch 1 (with its near-tie margins) is what transformers' generate is held to
        out.update(peer(p, ref or base or spec))
    out["per_category"] = per_category(p.prompts, spec, batched=B > 1)
    out["median_prompt_accept_len"] = statistics.median(r.accept_len for r in spec.prompts)
    out["prefill_ms"] = [round(r.prefill_s * 1e3, 2) for r in spec.prompts]
    out["sample_output"] = p.tokenizer.decode(spec.prompts[0].tokens)
    return out
