"""Around the Triton kernels of the GPU path: the choice between the split-KV attention and SDPA,
made or refused with a reason; every kernel built for Hopper (sm_90) without a GPU; and the GEMV
bench's shapes. The kernels' numerics are tests/engine/test_kernels_*.py (CPU: Triton's interpreter).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from workers.engine.steps import pick_attention
from workers.kernels.attention import available


def test_attention_choice_and_refusals():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert pick_attention("sdpa", 128, cuda) == (None, "sdpa")
    fn, note = pick_attention("auto", 128, cpu)
    assert fn is None and note.startswith("sdpa (") and "CUDA" in note
    with pytest.raises(ValueError, match="cannot run here"):
        pick_attention("triton", 128, cpu)
    with pytest.raises(ValueError, match="one of auto, triton, sdpa"):
        pick_attention("flash", 128, cpu)
    if available(128, cuda) != "Triton is not installed":
        assert "power of two" in available(96, cuda)  # no GPU needed to say so
        assert available(128, cuda) is None


def test_decode_refuses_triton_attention_on_cpu():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "decode",
            "--model",
            "random:llama-3.2-1b:layers=1",
            "--num-prompts",
            "1",
            "--max-new-tokens",
            "2",
            "--attention",
            "triton",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "--attention: triton" in r.stderr and "--device is cpu" in r.stderr


_HOPPER_COMPILE = r"""
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from workers.comm import symm_mem_ll as ll
from workers.kernels import attention as da

def build(fn, sig, consts):
    # the parameters this kernel has (a GEMV without the push epilogue takes no PEERS, STATE, PUSH)
    sig = {k: v for k, v in sig.items() if k in fn.arg_names}
    consts = {k: v for k, v in consts.items() if k in fn.arg_names}
    sig = {**sig, **{k: "constexpr" for k in consts}}
    kernel = triton.compile(ASTSource(fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))
    assert "cubin" in kernel.asm, list(kernel.asm)
    print("built", fn.__name__)

ints = {k: "i32" for k in ("n", "max_numel", "rank")}
for ty, it, sent in [("*bf16", tl.int16, -32768), ("*fp32", tl.int32, -2147483648)]:
    for mode in (ll.BOTH, ll.PUSH, ll.REDUCE):
        build(ll._ll_allreduce, {"X": ty, "PTRS": "*i64", "STATE": "*i32", **ints},
              {"WORLD": 2, "NPH": ll.NPHASE, "BLOCK": 512, "INT": it, "SENT": sent, "MODE": mode, "MAX_SPINS": ll.MAX_SPINS})
    build(ll._ll_all_gather, {"X": ty, "OUT": ty, "PTRS": "*i64", "STATE": "*i32", **ints},
          {"WORLD": 2, "NPH": ll.NPHASE, "BLOCK": 512, "INT": it, "SENT": sent, "MODE": ll.BOTH, "MAX_SPINS": ll.MAX_SPINS})
    build(ll._ll_allreduce_add_norm, {"X": ty, "RES": ty, "W": ty, "RES_OUT": ty, "NORM_OUT": ty, "PTRS": "*i64",
                                      "STATE": "*i32", "hidden": "i32", "max_numel": "i32", "rank": "i32", "eps": "fp32"},
          {"WORLD": 2, "NPH": ll.NPHASE, "BLOCK": 4096, "INT": it, "SENT": sent, "MODE": ll.BOTH, "MAX_SPINS": ll.MAX_SPINS})
strides = {k: "i32" for k in ("sqb", "sqh", "sqt", "skb", "skh", "sks", "svb", "svh", "svs", "sob", "sot")}
for group in (1, 4):  # one head a program, and a GQA group of 4 heads (a batched decode step's)
    build(da._partial, {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "POS": "*i64", "KVMAP": "*i64", "M": "*fp32", "L": "*fp32",
                        "ACC": "*fp32", "CNT": "*i32", "OUT": "*bf16", "NG": "i32", "T": "i32", "NSPLIT": "i32", "scale": "fp32",
                        **strides},
          {"G": group, "CHUNK": 256, "BLOCK_N": 64, "T_PAD": 16, "D": 128})
from workers.kernels import gemv as gv
for split, swiglu, bias in ((1, False, True), (4, False, False), (1, True, False), (2, False, False)):
    build(gv._gemv, {"X": "*bf16", "W": "*bf16", "B": "*bf16", "Y": "*bf16", "PART": "*fp32", "CNT": "*i32",
                     "T": "i32", "N": "i32", "K": "i32", "sxt": "i32", "swn": "i32", "syt": "i32"},
          {"T_PAD": 16, "BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": split, "SWIGLU": swiglu, "HAS_BIAS": bias})
rw_strides = {k: "i32" for k in ("sxb", "sxt", "scb", "sct", "ssb", "sst", "sqb", "sqh", "sqt", "skb", "skh", "sks", "svb", "svh", "svs")}
build(da._rope_write, {"QKV": "*bf16", "COS": "*bf16", "SIN": "*bf16", "POS": "*i64", "QOUT": "*bf16", "KC": "*bf16", "VC": "*bf16",
                       "T": "i32", "NQ": "i32", "NKV": "i32", **rw_strides}, {"HALF": 64})
"""


@pytest.mark.timeout(900)
def test_kernels_compile_for_hopper():
    """The interpreter runs kernel bodies as Python, so it accepts code the GPU compiler rejects (a
    plain module global read inside @triton.jit is one such case). Build every GPU kernel
    to a Hopper (sm_90) binary here, no GPU needed."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _HOPPER_COMPILE], env=env, capture_output=True, text=True, timeout=600)
    if "ptxas" in r.stderr and "not found" in r.stderr:
        pytest.skip("this Triton install has no ptxas")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.count("built") == 17


@pytest.mark.parametrize("tp, heads, kv_heads", [(1, 4, 2), (2, 4, 2), (4, 8, 2)])
def test_gemv_bench_times_the_shapes_a_rank_runs(tmp_path, tp, heads, kv_heads):
    """`python -m workers.kernels.gemv --bench` races cuBLAS and the Triton GEMV on each TP rank's step
    GEMMs: its shapes are those of a sharded model's merged weights (KV heads replicated where
    there are fewer than ranks). Without a GPU the bench says so in one line and exits 1."""
    import torch

    from workers.comm.base import NoOpAllReduce
    from workers.engine.fused_step import FusedStep
    from workers.kernels.gemv import step_shapes
    from workers.model.checkpoint import load_model, tiny_config, write_random_checkpoint
    from workers.model.tp import TPPart, hook
    from workers.spec.engine_config import EngineConfig

    cfg = tiny_config(num_attention_heads=heads, num_key_value_heads=kv_heads)
    part = TPPart(0, tp)
    model = hook(load_model(write_random_checkpoint(tmp_path, cfg, seed=1), max_seq=32, tp=part), part, NoOpAllReduce(None, tp))
    fast = FusedStep(model, EngineConfig(compile=False))
    wqkv, _, wgu = fast.merged[0]
    layer = model.layers[0]
    got = {
        "qkv": tuple(wqkv.shape),
        "o": tuple(layer.self_attn.o_proj.weight.shape),
        "gate_up": tuple(wgu.shape),
        "down": tuple(layer.mlp.down_proj.weight.shape),
    }
    assert {role: (n, k) for role, (n, k, _) in step_shapes(cfg, tp).items()} == got
    if not torch.cuda.is_available() and tp == 1:  # the command takes no shape: one run of it says so for all three
        r = subprocess.run([sys.executable, "-m", "workers.kernels.gemv", "--bench"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and r.stderr.strip() == "gemv --bench: needs a CUDA GPU and Triton (the kernels are timed as CUDA graphs)"
