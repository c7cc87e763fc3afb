"""Prompts: Spec-Bench JSONL and the bundled public set with its splits (`loading`), and the made-up
prompts `spectune train-drafter` adds (`synthesis`). Data: `data/`."""
