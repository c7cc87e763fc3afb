"""The workload of a study (or of `spectune decode`), prepared once on the driver: prompts
tokenized, then per trial its GangSpec (engine settings included) and its Workload."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.config.registry import PARAMS
from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.space import TrialConfig, resolve
from orchestrator.errors import UserError
from orchestrator.prompts.context import context_repeats, draw_to_length, filler_tokens
from orchestrator.prompts.loading import BUNDLED_PROMPTS, Prompt, Tokenizer, load_prompts
from workers.model.args import ModelArgs
from workers.model.locate import is_random, load_args, resolve_model_path
from workers.spec import GangSpec, Workload
from workers.spec.allreduce_table import AllreduceTable

# steps timed with and without the allreduce (the comm/compute split), once per trial or decode
ABLATION_ITERS = {"cpu": 3, "cuda": 50}


def profile_widths(cfg: ExperimentConfig) -> tuple[int, ...]:
    """The verify widths a trial times at its end (Workload.profile_widths): every chain width k + 1 of
    the search space, so the performance model reads each width's pass from a measurement of the
    setup instead of a line through the widths other trials ran (on CPU a pass of 4 rows cost 25% more
    than one of 3: the matrix kernels change with the rows). CPU only: on CUDA a width the run did not
    capture would run uncaptured, another cost than its graph's."""
    if cfg.parallel.device != "cpu":
        return ()
    p = cfg.search.space.get("spec.num_draft_tokens", cfg.drafter.num_draft_tokens)
    ks = range(p.low, p.high + 1, p.step) if hasattr(p, "low") else getattr(p, "choices", None) or [p]
    return tuple(sorted({int(k) + 1 for k in ks} | {cfg.drafter.num_draft_tokens + 1}))


@dataclass
class PreparedWorkload:
    model_path: str
    args: ModelArgs
    prompts: list[Prompt]
    token_ids: tuple[tuple[int, ...], ...]
    eos_ids: tuple[int, ...]
    max_seq: int
    tokenizer: Tokenizer
    allreduce_table: AllreduceTable | None = None  # emulated TP: the table its collectives wait (set by validation)
    # workload.context_lengths: {L: every prompt drawn to exactly L tokens} (orchestrator/prompts/context.py)
    contexts: dict[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # caveats of this workload, one line each (validate and run print them)

    def prompts_at(self, context: int | None) -> tuple[tuple[int, ...], ...]:
        """The prompts of a context bucket (None: as they are)."""
        return self.token_ids if context is None else self.contexts[context]

    def workload(
        self, cfg: ExperimentConfig, tc: TrialConfig, prompts: tuple[tuple[int, ...], ...] | None = None, batch_size: int = 1
    ) -> Workload:
        w = cfg.workload
        return Workload(
            prompts=prompts if prompts is not None else self.token_ids,
            max_new_tokens=w.max_new_tokens,
            num_draft_tokens=tc.num_draft_tokens,
            temperature=w.temperature,
            seed=w.seed,
            eos_ids=self.eos_ids,
            simulate_accept_len=w.simulate_accept_len if tc.num_draft_tokens > 0 else None,
            # its drafter kind's (check_experiment, which every run passes first, refuses a kind without one)
            simulate_accept_profile=w.profile_for(tc.drafter.kind) if tc.num_draft_tokens > 0 else None,
            # the batch-1 baseline other trials are checked against
            record_margins=tc.num_draft_tokens == 0 and w.temperature == 0 and batch_size == 1,
            batch_size=batch_size,
        )

    def gang_spec(self, cfg: ExperimentConfig, tc: TrialConfig) -> GangSpec:
        drafter = tc.drafter
        if tc.num_draft_tokens == 0 and cfg.drafter.kind != "none":
            # a plain-decoding trial still launches the YAML's default drafter (it only listens), so the
            # speculative trials after it can reuse the gang instead of launching a new one
            drafter = resolve({"spec.num_draft_tokens": 1}, cfg).drafter
        if drafter.kind == "draft_model" and drafter.model_path:
            drafter = type(drafter)(**{**drafter.__dict__, "model_path": str(resolve_model_path(drafter.model_path))})
        return GangSpec(
            model_path=self.model_path,
            tp=tc.tp,
            backend=tc.backend,
            drafter=drafter,
            dtype=cfg.model.dtype,
            device=cfg.parallel.device,
            max_seq=self.max_seq,
            vocab_parallel=cfg.parallel.vocab_parallel,
            threads=cfg.parallel.threads,
            engine=tc.engine,
            max_batch=max(cfg.workload.batch_sizes),
            emulate_tp=cfg.parallel.emulate_tp or 0,
            allreduce_table=self.allreduce_table,
        )


def prepare(cfg: ExperimentConfig, k_max: int | None = None) -> PreparedWorkload:
    """Prompts tokenized and checked against the model; room in the cache for k_max drafts (default:
    the most any trial may draft)."""
    k_max = PARAMS["spec.num_draft_tokens"].high if k_max is None else k_max
    path = resolve_model_path(cfg.model.path)
    args = load_args(path)
    w = cfg.workload
    prompts = load_prompts(BUNDLED_PROMPTS if w.prompts == "bundled" else w.prompts, w.num_prompts, w.categories, w.per_category, w.split)
    tok = Tokenizer(path)
    ids = tuple(tuple(tok.encode_prompt(p.text)) for p in prompts)
    if any(i >= args.vocab_size for seq in ids for i in seq):
        raise UserError(f"workload.prompts: the tokenizer of {path} produces ids beyond the model's vocabulary ({args.vocab_size})")
    room = w.max_new_tokens + k_max + 1
    if w.context_lengths and max(w.context_lengths) + room > args.max_position_embeddings:
        raise UserError(
            f"workload.context_lengths: {max(w.context_lengths)} + max_new_tokens needs {max(w.context_lengths) + room} positions, "
            f"the model has {args.max_position_embeddings}"
        )
    need = max(len(s) for s in ids) + room
    if need > args.max_position_embeddings:
        raise UserError(f"workload: longest prompt + max_new_tokens needs {need} positions, the model has {args.max_position_embeddings}")
    contexts, notes = {}, []
    if w.context_lengths:
        filler = filler_tokens([p.text for p in prompts], tok.encode_text)
        try:
            contexts = {n: draw_to_length(ids, filler, n, tok.bos_id) for n in w.context_lengths}
        except ValueError as e:
            raise UserError(f"workload.context_lengths: {e}") from None
        need = max(need, max(w.context_lengths) + room)
        if (times := context_repeats(filler, max(w.context_lengths))) > 1:
            notes.append(
                f"workload.context_lengths: a bucket of {max(w.context_lengths)} tokens repeats the other prompts' text {times:.0f} times; "
                "n-gram and EAGLE drafters find more to copy in repeated text than in a real context (more prompts repeat less)"
            )
        if cfg.parallel.device == "cuda":
            notes.append(
                f"workload.context_lengths: every cell runs on one KV cache of {-(-need // 256) * 256} positions (the longest "
                "bucket's): SDPA attention in CUDA graphs reads all of it, and the split-KV kernel splits it for that length"
            )
    # random weights' tokens mean nothing: an EOS among them would only cut the measured run short
    # (nor do an emulated rank's: it exchanges no partial sums)
    eos = () if is_random(path) or cfg.parallel.emulate_tp else tuple(sorted(set(tok.eos_ids) | set(args.eos_token_ids)))
    max_seq = min(args.max_position_embeddings, -(-need // 256) * 256)
    return PreparedWorkload(str(path), args, prompts, ids, eos, max_seq, tok, contexts=contexts, notes=notes)
