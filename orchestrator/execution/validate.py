"""Everything `spectune validate` checks, and `spectune run` checks before launching anything:
the YAML against the model (TP sizes, drafter layers, draft-model vocabulary), the backends
against the device (or, for emulated TP, against its allreduce table: orchestrator/config/emulation.py), the search space's values and conditions, and the prompts. A value is named by
its `search.space` entry where the study searches it, else by its YAML path (orchestrator/config/registry.py)."""

from __future__ import annotations

from orchestrator.config import emulation, registry
from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.space import candidates, check_conditions
from orchestrator.errors import UserError
from orchestrator.execution.workload import PreparedWorkload, prepare
from workers.comm import GangInfo, refusal
from workers.model.args import ModelConfigError, check_tp
from workers.model.locate import is_random, load_args, resolve_model_path
from workers.spec import batch_refusal, tree_size


def most_drafts(cfg: ExperimentConfig, k: int) -> int:
    """The most drafts one verify pass scores: k for a chain; an eagle3 tree (drafter.tree_width w >= 2)
    holds min(k x w, the link's capacity), its k chain nodes first and then the other top-w tokens."""
    if "eagle3" not in candidates(cfg, "drafter.kind"):
        return k
    w = max(1, *(int(v or 0) for v in candidates(cfg, "drafter.tree_width")))
    return tree_size(k, w)


def check_batch_drafters(cfg: ExperimentConfig, kinds: list) -> None:
    """Batch sizes > 1 need drafters that run batched (workers/engine/batched.py): an eagle3 head at
    placement rank0 drafting a chain (drafter.tree_width 0 or 1). Needs no model or prompts, so it runs
    before anything is loaded or fetched."""
    big = max(cfg.workload.batch_sizes)
    if big == 1:
        return
    # the workers' one rule (workers.spec.batch_refusal), over every drafter setup the study can draw
    sampled = cfg.workload.temperature > 0 and not cfg.workload.simulated
    for kind in kinds:
        setups = [("drafter.kind", kind, {"drafter_process": kind in ("draft_model", "layer_skip")})]
        if kind == "eagle3":
            setups = [
                ("drafter.placement", p, {"hidden_over_link": p == "actor", "drafter_process": p == "actor"})
                for p in candidates(cfg, "drafter.placement")
            ]
            setups += [("drafter.tree_width", w, {"tree": int(w or 0) >= 2}) for w in candidates(cfg, "drafter.tree_width")]
        for name, value, facts in setups:
            facts = {"drafter_process": False, "hidden_over_link": False, "tree": False, **facts}
            if why := batch_refusal(big, sampled=sampled, **facts):
                raise UserError(f"workload.batch_sizes: {why}; {registry.where(cfg, name)} allows {value}")


def check_mtp(cfg: ExperimentConfig, args, where) -> None:
    """drafter.kind mtp needs the model's own multi-token-prediction layer, declared and stored (a
    checkpoint transformers saved declares one and stores none: it drops those weights)."""
    if not args.mtp_layers:
        raise UserError(
            f"{where('drafter.kind')}: mtp needs the model's own multi-token-prediction layer; {cfg.model.path} has none (num_nextn_predict_layers is 0)"
        )
    if is_random(str(cfg.model.path)):
        return  # a random model draws its MTP layer as it draws the rest
    from workers.model.checkpoint import CheckpointReader

    if f"layers.{args.mtp_index}.eh_proj.weight" not in CheckpointReader(resolve_model_path(cfg.model.path)).where:
        raise UserError(
            f"{where('drafter.kind')}: mtp needs the model's own multi-token-prediction layer; {cfg.model.path} declares "
            f"num_nextn_predict_layers {args.mtp_layers} but stores no layers.{args.mtp_index}.* weights (transformers does not save them)"
        )


def check_batch_prompts(cfg: ExperimentConfig, prepared: PreparedWorkload) -> None:
    """Batch sizes > 1 need a batch's worth of prompts."""
    big = max(cfg.workload.batch_sizes)
    if big > len(prepared.token_ids):
        raise UserError(
            f"workload.batch_sizes: {big} exceeds the {len(prepared.token_ids)} prompts of the workload (more prompts: workload.num_prompts)"
        )


def check_experiment(cfg: ExperimentConfig) -> PreparedWorkload:
    check_conditions(cfg)

    def where(name: str) -> str:
        return registry.where(cfg, name)

    def check_limits(name: str) -> list:
        values = candidates(cfg, name)
        for v in values:
            if why := registry.lookup(name).problem(v):
                raise UserError(f"{where(name)}: {why}")
        return values

    ks = check_limits("spec.num_draft_tokens")
    check_batch_drafters(cfg, check_limits("drafter.kind"))  # before the model and its tokenizer are fetched
    per_kind = cfg.workload.simulate_accept_profile
    kinds_drafting = [k for k in check_limits("drafter.kind") if k != "none"] if any(k > 0 for k in ks) else []
    if isinstance(per_kind, dict) and (missing := [k for k in kinds_drafting if k not in per_kind]):
        raise UserError(
            f"workload.simulate_accept_profile: no profile for drafter kind {', '.join(missing)}, which {where('drafter.kind')} "
            "drafts with (give every kind one, or one list for all)"
        )
    prepared = prepare(cfg, k_max=most_drafts(cfg, max(ks)))  # the cache holds the longest prompt, max_new_tokens and the most drafts
    args = prepared.args
    # emulated TP: one rank of TP emulate_tp, its backends those of the table (which need not run here)
    lengths = [len(s) for s in prepared.token_ids] + [len(s) for bucket in prepared.contexts.values() for s in bucket]  # prefills
    prepared.allreduce_table = emulation.check(cfg, args, lengths, most_drafts(cfg, max(ks)))
    for tp in check_limits("parallel.tp"):
        if prepared.allreduce_table is not None:
            break
        try:
            check_tp(args, tp)
        except ModelConfigError as e:
            raise UserError(f"{where('parallel.tp')}: {e}") from None
        for backend in candidates(cfg, "comm.backend"):
            # peer access and message sizes are checked by the workers, which can see the GPUs
            gang = GangInfo(world_size=tp, device_type=cfg.parallel.device, devices=tuple(range(tp)), p2p_ok=True)
            why = refusal(str(backend), gang)
            if why and tp > 1:
                raise UserError(f"{where('comm.backend')}: {why}")
    tau = cfg.workload.simulate_accept_len
    if tau is not None and any(0 < k < tau - 1 for k in ks):
        k_min = min(k for k in ks if k > 0)
        raise UserError(
            f"workload.simulate_accept_len: {tau:g} needs at least {tau - 1:g} drafts per step, but "
            f"{where('spec.num_draft_tokens')} allows k = {k_min}"
        )
    if cfg.study.baseline and "spec.num_draft_tokens" in cfg.search.space and 0 not in ks:  # k not searched: the baseline is added
        raise UserError(
            f"{where('spec.num_draft_tokens')}: must allow 0, the baseline every speedup is measured against (or set study.baseline: false)"
        )
    kinds = check_limits("drafter.kind")
    if any(k > 0 for k in ks) and kinds == ["none"]:
        raise UserError(f"{where('drafter.kind')}: spec.num_draft_tokens > 0 needs a drafter")
    if "layer_skip" in kinds:
        for layers in candidates(cfg, "drafter.layers"):
            if layers is None or not isinstance(layers, int) or not 1 <= layers < args.n_layers:
                raise UserError(
                    f"{where('drafter.layers')}: {layers!r} must be between 1 and {args.n_layers - 1} for layer_skip (the model has {args.n_layers} layers)"
                )
    # every pair bad: refused; some: those trials are not run (space.constraint_violation)
    if "ngram" in kinds and (lo := min(candidates(cfg, "drafter.ngram_min"))) > (hi := max(candidates(cfg, "drafter.ngram_max"))):
        raise UserError(f"{where('drafter.ngram_min')}: {lo} is above {where('drafter.ngram_max')} {hi} (min must be <= max)")
    if "draft_model" in kinds:
        for path in candidates(cfg, "drafter.model_path"):
            if not path:
                raise UserError(f"{where('drafter.model_path')}: drafter.kind draft_model needs a checkpoint path")
            try:
                dargs = load_args(resolve_model_path(path))
            except (ValueError, OSError) as e:
                raise UserError(f"{where('drafter.model_path')}: {e}") from None
            if dargs.vocab_size != args.vocab_size:
                raise UserError(f"{where('drafter.model_path')}: vocabulary {dargs.vocab_size} differs from the model's {args.vocab_size}")
    if "mtp" in kinds:
        check_mtp(cfg, args, where)
    if "eagle3" in kinds:
        from workers.drafters.eagle3.head import check_fits, load_config

        for path in candidates(cfg, "drafter.model_path"):
            if not path:
                raise UserError(f"{where('drafter.model_path')}: drafter.kind eagle3 needs an EAGLE-3 head (e.g. smollm2-135m-eagle3)")
            try:
                hpath = resolve_model_path(path)
                check_fits(load_config(hpath), args, hpath)
            except (ValueError, OSError) as e:
                raise UserError(f"{where('drafter.model_path')}: {e}") from None
        check_limits("drafter.placement")
    check_batch_prompts(cfg, prepared)
    for name in registry.ENGINE_PARAMS:
        check_limits(name)
    if cfg.parallel.device != "cuda" and "triton" in candidates(cfg, "engine.attention"):
        raise UserError(
            f"{where('engine.attention')}: triton runs the CUDA graphs' attention kernel; parallel.device is "
            f"{cfg.parallel.device} (use auto or sdpa)"
        )
    if cfg.parallel.device != "cuda" and "triton" in candidates(cfg, "engine.moe_kernel"):
        raise UserError(
            f"{where('engine.moe_kernel')}: triton runs the CUDA graphs' grouped MoE kernel; parallel.device is "
            f"{cfg.parallel.device} (use auto or dense)"
        )
    return prepared
