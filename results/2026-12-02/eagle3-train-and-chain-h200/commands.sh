#!/usr/bin/env bash
# H200 (one GPU). random8b_*: commit bd76285 (the chain graph capturing after the d2t fix), after
# `bash infra/device-setup.sh ray rest check`:
STAGES=chain OUT=$OUT bash infra/gpu-eagle3.sh
# heldout_ngram.json and log_train_heldout.txt: commit 738cce6 plus the STAGES switch, after the demo
# model's two calls (`bash infra/device-setup.sh model` with .devcarry/model-a, then model-b):
STAGES="train heldout" TRAIN_S=250 OUT=$OUT bash infra/gpu-eagle3.sh
# (the two EAGLE-3 held-out runs of that call failed: the chain's capture, fixed in bd76285; the
# trained head, step 700, is scored on CPU in ../eagle3-heldout-cpu)
