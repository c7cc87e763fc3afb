#!/usr/bin/env bash
# This 2-core CPU machine, commit de19d19: the check command (TP 2, the shipped head, k = 4) on 10
# held-out prompts x 48 tokens, with the plain baseline (outputs compared), then n-gram k = 4 on the same prompts.
export RAY_AUTH_MODE=disabled
.venv/bin/spectune decode --model smollm2-135m --tp 2 --drafter eagle3 --draft-model smollm2-135m-eagle3 -k 4 --split heldout --num-prompts 10 --max-new-tokens 48 --json > heldout_eagle3_tp2.json
.venv/bin/spectune decode --model smollm2-135m --tp 2 --drafter ngram --no-baseline -k 4 --split heldout --num-prompts 10 --max-new-tokens 48 --json > heldout_ngram_tp2.json
