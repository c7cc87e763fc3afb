#!/usr/bin/env bash
# H200 (one GPU), the image's Python (no setup needed: torch, Triton, safetensors).
# bench_generate_fp32.json: commit 264b803 (before --dtype: the model in float32, as train-drafter loaded it then)
python -m workers.tools.bench_generate --model random:llama-3.2-1b --batch 256 --prompt-len 200 --new 128 --json bench_generate_fp32.json
# bench_generate_bf16.json: commit 6f9af6e (--dtype; train-drafter now loads the target in bf16 on a GPU)
python -m workers.tools.bench_generate --model random:llama-3.2-1b --batch 256 --prompt-len 200 --new 128 --dtype bfloat16 --json bench_generate_bf16.json
