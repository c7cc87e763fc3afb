"""The split-KV attention's self-test cases (workers/kernels/attention.py), each against SDPA.

Plain steps (GQA, uneven head maps, one or many query tokens, caches of several splits, junk past
each sequence, a batch at two lengths; also from the merged QKV projection with rope and the
cache writes fused) and token trees (the ancestor bits against SDPA under the tree mask).

    python -m workers.checks.attention_check --selftest   # GPU, bf16: every case, one line each
    python -m pytest tests/test_kernels_attention.py     # the same cases as tests (CPU: Triton's interpreter)
"""

from __future__ import annotations

import torch

from workers.kernels.attention import decode_attend, rope_write_attend
from workers.kernels.support import counters_all_zero, selftest_main

# bf16 on the GPU: both sides round (a wrong kernel is off by O(1)); float32 under the CPU interpreter
SELFTEST_TOL = {"cuda": 5e-2, "cpu": 1e-4}
# a tree's error stays under this share of the distance to a causal mask's result (the smallest
# distance a wrong mask could make here: one case's prefix dilutes it to ~0.05)
TREE_GAP_SHARE = 0.25

# the self-test's shapes, each against `workers.model.transformer.attend`: B, H, Hkv, T, D, max_seq,
# first position (GQA, uneven head maps, one or many query tokens, caches longer than one split,
# queries in the middle of the cache, a batch of two sequences at different lengths)
SELFTEST_CASES = (
    (1, 4, 2, 1, 64, 200, 150),
    (1, 4, 2, 5, 64, 200, 0),
    (1, 6, 3, 17, 16, 300, 270),
    (2, 4, 4, 3, 32, 64, 10),
    (1, 8, 2, 1, 128, 1100, 1000),
    (1, 5, 2, 4, 64, 130, 126),
    (3, 4, 2, 5, 32, 400, 300),  # a batched verify pass: rows whose last keys lie in different splits
    (2, 4, 2, 1, 64, 2048, 130),  # batched decode on a static cache: 2 of 16 splits hold keys, the rest return at once
)
# token trees, each against `attend` under the tree mask: H, Hkv, D, max_seq, first slot, parents (a
# chain of 4 with two siblings a depth as leaves, a shape workers/drafters/eagle3/tree.py drafts,
# straddling the split boundary at 128; a branching tree of 17 entries, the most a step drafts,
# straddling 1024; no prefix at all)
TREE_SELFTEST_CASES = (
    (4, 2, 64, 300, 120, (-1, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3)),
    (8, 2, 128, 1100, 1010, (-1, 0, 1, 1, 2, 3, 3, 4, 0, 8, 9, 5, 6, 7, 2, 12, 15)),
    (6, 3, 32, 64, 0, (-1, 0, 0, 1, 2)),
)


def _random(device: str, seed: int):
    """The cases' dtype (bf16 on the GPU, float32 under the interpreter) and a seeded randn in it."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    return dtype, rnd


def check_case(case: tuple[int, ...], device: str, seed: int = 0) -> dict[str, float]:
    """One self-test case: the largest |difference| of `decode_attend` ("attend") and of
    `rope_write_attend` ("rope_write") to `attend` (after rope), and of the fused kernel's cache
    writes relative to each value's size ("cache"). Asserts that decode_attend writes the cache
    exactly as `attend` does and that every head's last split reset its arrival counter."""
    from workers.model.rope import apply_rope
    from workers.model.transformer import attend, rms_norm

    B, H, Hkv, T, D, S, first = case
    dtype, rnd = _random(device, seed)

    q, k, v = rnd(B, H, T, D), rnd(B, Hkv, T, D), rnd(B, Hkv, T, D)
    kc, vc = rnd(B, Hkv, S, D), rnd(B, Hkv, S, D)  # slots past each sequence hold junk: must stay unread
    pos = (first + torch.arange(T))[None].repeat(B, 1).to(device)
    if B > 1:
        pos[1] -= 5  # sequences at different lengths
    if B > 2:
        pos[2] -= 150  # a row two splits shorter
    uneven = H % Hkv != 0 or H == 5
    kv_map = (torch.tensor([0, 0, 0, 1, 1]) if H == 5 else torch.arange(H) // (H // Hkv)).to(device)
    group = 0 if uneven else H // Hkv
    mask = (torch.arange(S, device=device)[None, None, :] <= pos[:, :, None])[:, None]
    kc2, vc2 = kc.clone(), vc.clone()
    want = attend(q, k, v, mask, kc2, vc2, pos, group, kv_map).float()
    got = decode_attend(q, k, v, mask, kc, vc, pos, group, kv_map).float()
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2), "decode_attend wrote the cache differently"
    assert counters_all_zero(), "the last split of a head left its arrival counter set"
    errs = {"attend": (got - want).abs().max().item()}
    # the same step from the merged projection: rope + cache writes in one kernel
    angle = rnd(B, 1, T, D // 2).float().repeat(1, 1, 1, 2) * 3  # real rotations, "rotate half" layout
    cos_t, sin_t = angle.cos().to(dtype), angle.sin().to(dtype)
    qkv = torch.cat([x.transpose(1, 2).reshape(B, T, -1) for x in (q, k, v)], dim=-1)
    kc3, vc3 = kc2.clone(), vc2.clone()
    kc2.copy_(kc), vc2.copy_(vc)
    qr, kr = apply_rope(q, cos_t, sin_t), apply_rope(k, cos_t, sin_t)
    want = attend(qr, kr, v, mask, kc2, vc2, pos, group, kv_map).float()
    got = rope_write_attend(qkv, cos_t, sin_t, kc3, vc3, pos, H, Hkv, kv_map, gqa_group=group).float()
    assert counters_all_zero(), "the last split of a head left its arrival counter set"
    errs["rope_write"] = (got - want).abs().max().item()
    # relative to each value's size: bf16 rounds the reference's three products and sums where the
    # kernel rounds once, one ulp apart at most
    errs["cache"] = max(((a.float() - b.float()).abs() / b.float().abs().clamp(min=1.0)).max().item() for a, b in ((kc3, kc2), (vc3, vc2)))
    # with Qwen3's per-head q/k RMSNorm before rope, in the same kernel
    qw, kw, eps = rnd(D) + 1, rnd(D) + 1, 1e-6
    kc2.copy_(kc), vc2.copy_(vc)
    kc3.copy_(kc), vc3.copy_(vc)
    qr, kr = apply_rope(rms_norm(q, qw, eps), cos_t, sin_t), apply_rope(rms_norm(k, kw, eps), cos_t, sin_t)
    want = attend(qr, kr, v, mask, kc2, vc2, pos, group, kv_map).float()
    got = rope_write_attend(qkv, cos_t, sin_t, kc3, vc3, pos, H, Hkv, kv_map, gqa_group=group, qk_norm=(qw, kw, eps)).float()
    errs["rope_norm"] = (got - want).abs().max().item()
    errs["cache_norm"] = max(
        ((a.float() - b.float()).abs() / b.float().abs().clamp(min=1.0)).max().item() for a, b in ((kc3, kc2), (vc3, vc2))
    )
    return errs


def check_tree_case(case: tuple, device: str, seed: int = 0) -> dict[str, float]:
    """One token tree: the largest |difference| of `decode_attend` ("tree") and of `rope_write_attend`
    ("tree_rope", rotated at each entry's depth) with tree bits to `attend` under the tree mask, and
    how far a wrong mask would land ("causal_gap": the tree's reference against a causal mask's,
    in float32): an error must be a small part of it, or a long prefix could hide a wrong mask."""
    from workers.model.rope import apply_rope
    from workers.model.transformer import attend, tree_mask, tree_shape

    H, Hkv, D, S, first, parents = case
    T = len(parents)
    dtype, rnd = _random(device, seed)

    q, k, v = rnd(1, H, T, D), rnd(1, Hkv, T, D), rnd(1, Hkv, T, D)
    kc, vc = rnd(1, Hkv, S, D), rnd(1, Hkv, S, D)
    depth, bits = tree_shape(list(parents))
    slots = torch.arange(first, first + T, device=device)[None]
    bits = torch.tensor([bits], device=device)
    mask = tree_mask(list(parents), first, S).to(device)[None, None]
    kv_map = (torch.arange(H) // (H // Hkv)).to(device)
    kc2, vc2 = kc.clone(), vc.clone()
    want = attend(q, k, v, mask, kc2, vc2, slots, H // Hkv, kv_map).float()
    got = decode_attend(q, k, v, None, kc.clone(), vc.clone(), slots, H // Hkv, kv_map, tree_bits=bits).float()
    assert counters_all_zero(), "the last split of a head left its arrival counter set"
    errs = {"tree": (got - want).abs().max().item()}
    causal = mask.clone()
    causal[..., first : first + T] = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    f32 = [x.float() for x in (q, k, v, kc, vc)]
    tree_ref = attend(*f32[:3], mask, f32[3].clone(), f32[4].clone(), slots, H // Hkv, kv_map)
    chain_ref = attend(*f32[:3], causal, f32[3].clone(), f32[4].clone(), slots, H // Hkv, kv_map)
    errs["causal_gap"] = (tree_ref - chain_ref).abs().max().item()
    angle = (torch.tensor(depth, device=device) + first).float()[None, None, :, None] * torch.linspace(
        0.01, 1, D // 2, device=device
    ).repeat(2)
    cos_t, sin_t = angle.cos().to(dtype), angle.sin().to(dtype)
    qkv = torch.cat([x.transpose(1, 2).reshape(1, T, -1) for x in (q, k, v)], dim=-1)
    kc2, vc2 = kc.clone(), vc.clone()
    want = attend(apply_rope(q, cos_t, sin_t), apply_rope(k, cos_t, sin_t), v, mask, kc2, vc2, slots, H // Hkv, kv_map).float()
    got = rope_write_attend(qkv, cos_t, sin_t, kc.clone(), vc.clone(), slots, H, Hkv, kv_map, tree_bits=bits, gqa_group=H // Hkv).float()
    errs["tree_rope"] = (got - want).abs().max().item()
    return errs


def selftest(device: str) -> float:
    """Every SELFTEST_CASES case (one line each); the worst error. tests/test_kernels_attention.py runs
    the same cases one by one."""
    worst = 0.0
    for i, case in enumerate(SELFTEST_CASES):
        errs = check_case(case, device, seed=i)
        print(
            "B={} H={} Hkv={} T={} D={} slots={} pos={}: ".format(*case)
            + ", ".join(f"{name} max |diff| {err:.2e}" for name, err in errs.items())
        )
        worst = max(worst, *errs.values())
    for i, case in enumerate(TREE_SELFTEST_CASES):
        errs = check_tree_case(case, device, seed=i)
        gap = errs.pop("causal_gap")
        if max(errs.values()) > TREE_GAP_SHARE * gap:  # a wrong mask could pass as rounding: fail loudly
            errs["worse than a share of the causal gap"] = float("inf")
        print(
            "tree H={} Hkv={} D={} slots={} first={} entries={}: ".format(*case[:5], len(case[5]))
            + ", ".join(f"{name} max |diff| {err:.2e}" for name, err in errs.items())
        )
        worst = max(worst, *errs.values())
    return worst


def main(argv=None) -> None:
    selftest_main(argv, __doc__, selftest, "cuda", SELFTEST_TOL, "decode_attention")


if __name__ == "__main__":
    main()
