"""Shared fixtures: tiny random checkpoints and the real demo model (fetched once per machine)."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from workers.model.checkpoint import resolve_model_path, tiny_config, write_random_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """Tiny Llama with GQA (4 query heads, 2 KV heads), random weights, no tokenizer."""
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny"), tiny_config(), seed=0)


@pytest.fixture(scope="session")
def tiny_draft_ckpt(tmp_path_factory):
    """A different tiny random model with the same vocabulary: a weak but valid draft model."""
    cfg = tiny_config(num_hidden_layers=1, hidden_size=32, intermediate_size=64, head_dim=8)
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny_draft"), cfg, seed=1)


@pytest.fixture(scope="session")
def smollm2():
    return resolve_model_path("smollm2-135m")
