#!/usr/bin/env bash
# H200, session 13: a head trained with the session-12 recipe plus 3000 --self-documents prompts (an option
# since removed: this run is why), then scored on the 56 held-out prompts against the shipped head and n-gram.
# After `device-setup.sh ray rest` and the demo model's two calls (docs/gpu.md), two calls on the warm machine
# with infra/gpu-eagle3.sh as of commit edbbae9 (SELF_DOCS default 3000):
STAGES=train TRAIN_S=530 OUT=$OUT bash infra/gpu-eagle3.sh                    # generation (15184 responses, 307 s), 557 steps; the call hit 600 s
STAGES="train heldout" TRAIN_S=330 TRAIN_TIME=480 OUT=$OUT bash infra/gpu-eagle3.sh   # resumed at step 500 to 1388 (saved: best val, step 1300); heldout_*.json
