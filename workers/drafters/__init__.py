"""Drafters: `ngram` (prompt lookup), `draft_model` (a smaller checkpoint), `layer_skip` (the
verifier's first L layers and head), `eagle3` (an EAGLE-3 head on the verifier's hidden states),
`mtp` (DeepSeek-V3's own multi-token-prediction layer, in the verifier ranks).
`build_drafter(spec, ...)` (workers/runtime/worker.py) makes the one a gang asks for."""

from __future__ import annotations

from workers.drafters.eagle3.head import Eagle3Drafter
from workers.drafters.model_drafter import ModelDrafter
from workers.drafters.ngram import NgramDrafter
from workers.engine.drafter import Drafter
from workers.spec import DRAFTER_KINDS as KINDS
from workers.spec import DRAFTER_PLACEMENTS as PLACEMENTS

__all__ = ["Drafter", "Eagle3Drafter", "KINDS", "ModelDrafter", "NgramDrafter", "PLACEMENTS"]
