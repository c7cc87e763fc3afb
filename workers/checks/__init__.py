"""Oracles the tests and the device scripts check the product against, kept out of the product
packages: sharded-vs-unsharded logits at TP n beside transformers' (`parity`) and the split-KV
attention kernels' self-test cases against SDPA (`attention_check`). Each runs as `python -m`."""
