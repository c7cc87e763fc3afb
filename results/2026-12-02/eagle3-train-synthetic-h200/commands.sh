#!/usr/bin/env bash
# H200 (one GPU), commit 0efc82f, after `bash infra/device-setup.sh ray rest check` and the demo
# model's two calls (`bash infra/device-setup.sh model` with .devcarry/model-a, then model-b, the
# second call also running the train stage):
STAGES=train TRAIN_S=520 TRAIN_TIME=200 OUT=$OUT bash infra/gpu-eagle3.sh   # training.json, log_train_heldout.txt (progress lines thinned)
STAGES=heldout OUT=$OUT bash infra/gpu-eagle3.sh                          # heldout_*.json: 56 held-out prompts x 128 tokens, TP 1, k = 4
# heldout_eagle3_shipped.json is the head shipped before this one; heldout_eagle3_gpu.json the head
# trained above, which is now workers/drafters/heads/smollm2-135m-eagle3
