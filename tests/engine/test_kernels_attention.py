"""The split-KV attention of the graphed steps (workers/kernels/attention.py) against the model's SDPA
attention, one test per shape: GQA, uneven head maps, several query tokens, caches of several
splits, junk past each sequence, a batch at two lengths; the same step from the merged QKV
projection (rope and cache writes fused into one kernel); every head's arrival counter reset; token
trees (each entry's ancestor bits) against SDPA under the tree mask, with a wrong mask caught.

    python -m pytest tests/engine/test_kernels_attention.py     # CPU: Triton's interpreter (tests/conftest.py); GPU: bf16
"""

from __future__ import annotations

import pytest
import torch

from workers.checks import attention_check as check
from workers.kernels import attention


@pytest.mark.parametrize("case", check.SELFTEST_CASES, ids=lambda c: "B{}-H{}-Hkv{}-T{}-D{}-S{}-pos{}".format(*c))
def test_split_kv_attention_matches_sdpa(kernel_device, case):
    errs = check.check_case(case, kernel_device, seed=check.SELFTEST_CASES.index(case))
    tol = check.SELFTEST_TOL[kernel_device]
    assert errs["attend"] <= tol, f"decode_attend differs from attend by {errs['attend']:.2e}"
    assert errs["rope_write"] <= tol, f"rope_write_attend differs from rope + attend by {errs['rope_write']:.2e}"
    assert errs["cache"] <= tol, f"the fused cache writes differ by {errs['cache']:.2e} (relative)"
    assert errs["rope_norm"] <= tol, f"rope_write_attend with the q/k norm differs from norm + rope + attend by {errs['rope_norm']:.2e}"
    assert errs["cache_norm"] <= tol, f"the fused cache writes with the q/k norm differ by {errs['cache_norm']:.2e} (relative)"


@pytest.mark.parametrize("case", check.TREE_SELFTEST_CASES, ids=lambda c: "H{}-Hkv{}-D{}-S{}-first{}".format(*c[:5]) + f"-n{len(c[5])}")
def test_tree_mask_matches_sdpa(kernel_device, case):
    """A token tree's entries see the prefix and their own ancestors only, as SDPA under the tree mask."""
    errs = check.check_tree_case(case, kernel_device, seed=check.TREE_SELFTEST_CASES.index(case))
    tol = min(check.SELFTEST_TOL[kernel_device], check.TREE_GAP_SHARE * errs["causal_gap"])
    assert errs["tree"] <= tol, f"decode_attend with tree bits differs from the tree mask by {errs['tree']:.2e}"
    assert errs["tree_rope"] <= tol, f"rope_write_attend with tree bits differs by {errs['tree_rope']:.2e}"


def test_a_wrong_tree_is_caught(kernel_device, monkeypatch):
    """The tree check can fail: bits that let every entry see every earlier entry (a chain's causal
    mask, as the kernel without bits would) differ from the tree mask by far more than the tolerance."""
    real = attention.attend_cache

    def causal(q, k_cache, v_cache, pos, kv_map, tree_bits=None, gqa_group=0):
        T = pos.shape[1]
        bits = torch.tensor([[(1 << (t + 1)) - 1 for t in range(T)]], device=pos.device)
        return real(q, k_cache, v_cache, pos, kv_map, bits, gqa_group=gqa_group)

    monkeypatch.setattr(attention, "attend_cache", causal)
    for case in check.TREE_SELFTEST_CASES:
        errs = check.check_tree_case(case, kernel_device)
        assert errs["tree"] > check.TREE_GAP_SHARE * errs["causal_gap"] and errs["tree"] > 10 * check.SELFTEST_TOL["cpu"]


def test_a_wrong_answer_is_caught(kernel_device, monkeypatch):
    """The check can fail: a kernel that drops each query's last visible key (the first query of this
    case sees one key only, so its output is that key's value) is off by far more than the tolerance."""
    real = attention.attend_cache

    def off_by_one(q, k_cache, v_cache, pos, kv_map, tree_bits=None, gqa_group=0):
        return real(q, k_cache, v_cache, pos - 1, kv_map, tree_bits, gqa_group=gqa_group)

    monkeypatch.setattr(attention, "attend_cache", off_by_one)
    errs = check.check_case(check.SELFTEST_CASES[1], kernel_device)
    assert errs["attend"] > 10 * check.SELFTEST_TOL[kernel_device]
