"""The distinct experts a verify pass reads (workers/engine/experts.py): the union over whole passes of
W tokens, per layer, and the metric names a run records them under."""

from __future__ import annotations

import pytest
import torch

from workers.engine.experts import union_sizes
from workers.spec import RunResult, experts_metric
from workers.spec.run_stats import RunStats

pytestmark = pytest.mark.unit


def test_the_union_of_each_whole_pass():
    ids = torch.tensor([[0, 1], [1, 2], [0, 1], [3, 4], [5, 6]])  # 5 tokens, top 2
    assert union_sizes(ids, 1) == [2, 2, 2, 2, 2]
    assert union_sizes(ids, 2) == [3, 4]  # {0,1,2}, {0,1,3,4}; the fifth token alone is no whole pass
    assert union_sizes(ids, 5) == [7] and union_sizes(ids, 6) == []


def test_runs_merge_their_sums_and_the_metric_is_the_mean():
    a = RunResult(prompts=[], stats=RunStats(), num_draft_tokens=3, experts={1: (6.0, 3), 2: (8.0, 2)})
    b = RunResult(prompts=[], stats=RunStats(), num_draft_tokens=3, experts={1: (2.0, 1)})
    merged = RunResult.merge([a, b])
    assert merged.experts == {1: (8.0, 4), 2: (8.0, 2)}
    assert merged.metrics[experts_metric(1)] == 2.0 and merged.metrics["moe_experts_w2"] == 4.0
