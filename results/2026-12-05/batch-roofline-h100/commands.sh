#!/usr/bin/env bash
# Issue 33 item 2 (batch 32 near the HBM roofline): one device call (`run`, kind nvidia-h200; the tool served
# an H100 80GB HBM3), carry [".devcarry/pyd", ".devcarry/old", ".devcarry/call2.sh"], from the repo root at d5a4873:
#   .devcarry/pyd  = pydantic 2.14.4, pydantic_core 2.50.5, annotated-types, typing-inspection, typing_extensions
#   .devcarry/old  = `git archive e0c1e67 workers orchestrator infra scripts pyproject.toml` (the code before the
#                    attention change) with d5a4873's scripts/profile_step.py copied in
#   .devcarry/call2.sh = call.sh here
bash .devcarry/call2.sh
# then, on this machine: batch.tar's table.txt -> table.txt; the output tail's summary -> call.txt
#
# The CPU check (the 2-core machine, quiet: load 0.8, nothing else running), cpu_b4_quiet.json:
.venv/bin/spectune decode --model smollm2-135m --tp 1 --drafter none -k 0 --split heldout --category summarization \
  --num-prompts 8 --max-new-tokens 32 --batch-size 4 --json
