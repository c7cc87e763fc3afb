"""Drafters: `ngram` (prompt lookup), `draft_model` (a smaller checkpoint), `layer_skip` (the
verifier's first L layers and head). `build_drafter(spec, ...)` makes the one a gang asks for."""
from __future__ import annotations

from workers.drafters.base import Drafter
from workers.drafters.model_drafter import ModelDrafter
from workers.drafters.ngram import NgramDrafter

KINDS = ("none", "draft_model", "ngram", "layer_skip")

__all__ = ["Drafter", "KINDS", "ModelDrafter", "NgramDrafter"]
