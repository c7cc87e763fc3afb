"""`TrainOptions`: the options of `spectune train-drafter` (orchestrator/train_drafter.py), one typed
value that the CLI's flags default to and the saved head's training.json records. No torch here: the
CLI builds its parser from it for every command."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.prompts.loading import BUNDLED_PROMPTS


@dataclass
class TrainOptions:
    model: str = "smollm2-135m"
    prompts: str = str(BUNDLED_PROMPTS)
    num_prompts: int | None = None
    split: str = "all"
    synthetic_prompts: int = 0  # made-up instruction prompts added to the training set (orchestrator/prompts/synthesis.py)
    self_prompts: int = 0  # user prompts the target writes itself from its chat template (Magpie), added too
    max_new_tokens: int = 128
    max_steps: int = 200
    ttt_steps: int = 3
    prompt_labels: bool = True  # prompt positions train too, labelled with the target's own argmax
    val_every: int = 10  # every Nth response is kept out of training: its accuracy picks the checkpoint saved (0: none)
    draft_vocab: int = 4096
    batch: int = 4
    pack_tokens: int = 4096  # a batch's samples run packed into passes of at most this many tokens (one sample may exceed it)
    gen_batch: int = 16  # prompts answered together
    lr: float = 5e-4
    device: str = "cpu"
    threads: int = 1
    save_every: int = 50
    max_time: float = 0.0  # stop training (saved, summary written) after this many seconds of it; 0: no limit
    seed: int = 0
    out: str = ""
