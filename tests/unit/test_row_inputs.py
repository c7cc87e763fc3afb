"""A batched body's integer inputs in one buffer (workers/engine/graphs.py `RowInputs`): each (n, W)'s
views hold what one `send` wrote, in rows, and a shape past the buffer is refused.

    .venv/bin/python -m pytest -q tests/unit/test_row_inputs.py
"""

from __future__ import annotations

import pytest
import torch

from workers.engine.graphs import RowInputs


def test_one_send_fills_each_shapes_views_row_by_row():
    inputs = RowInputs(4, 5, torch.device("cpu"))
    for n, W in ((3, 5), (2, 3), (4, 1)):
        tokens = list(range(100, 100 + n * W))
        positions = [10 * i + j for i in range(n) for j in range(W)]
        at = [i % W for i in range(n)]
        inputs.send(tokens, positions, at)
        tok, pos, last = inputs.views(n, W)
        assert tok.tolist() == [tokens[i * W : (i + 1) * W] for i in range(n)]
        assert pos.tolist() == [[10 * i + j for j in range(W)] for i in range(n)]
        assert last.tolist() == at
    # the views of one shape stay where a graph captured them: the same storage offsets at every call
    assert inputs.views(3, 5)[1].data_ptr() == inputs.views(3, 5)[1].data_ptr() != inputs.views(2, 5)[1].data_ptr()
    inputs.zero()
    assert not inputs.buf.any()


@pytest.mark.parametrize("n, W", [(5, 2), (0, 2), (2, 6)])
def test_a_shape_past_the_buffer_is_refused(n, W):
    with pytest.raises(ValueError, match=f"{n} rows of {W} entries on inputs of 4 x 5"):
        RowInputs(4, 5, torch.device("cpu")).views(n, W)
