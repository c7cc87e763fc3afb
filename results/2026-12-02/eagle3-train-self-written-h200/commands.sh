#!/usr/bin/env bash
# H200 (one GPU), session 12, commit ee5080c, after `bash infra/device-setup.sh ray rest check` (carry
# .devcarry/ray + .devcarry/rest) and the demo model's two calls (`bash infra/device-setup.sh model`
# with .devcarry/model-a, then model-b, the second call also running the train stage):
STAGES=train TRAIN_S=520 OUT=$OUT bash infra/gpu-eagle3.sh                   # log_call1_generate_train.txt (progress thinned to every 100 steps)
# generation: 180 train-split + 4000 synthetic + 8000 self-written prompts (Magpie) -> 12184 responses in 235 s;
# training killed by TRAIN_S at step 905 (saved at 900), resumed by the next call:
STAGES="train heldout" TRAIN_S=320 TRAIN_TIME=480 OUT=$OUT bash infra/gpu-eagle3.sh   # log_call2_train_heldout.txt, heldout_*.json
# heldout_*.json: 56 held-out prompts x 128 tokens, TP 1, k = 4, rank0, each with its own plain baseline;
# heldout_eagle3_shipped.json is the session-11 head; heldout_eagle3_gpu.json the head trained above
# (step 1680, best validation accepted length 2.66), now workers/drafters/heads/smollm2-135m-eagle3
