"""The GPU issue's logic, on CPU: backend capability checks and their refusals, the no-op
allreduce ablation, simulated acceptance, the step runner's device check, random-weight models,
bench-allreduce and the transformers peer baseline. (The GPU figures are in docs/performance.md.)
The bench-allreduce table and the peer-baseline decode run spectune's `main` in the test's process
(studyutil.spectune_here: the same flags and output, no interpreter, torch and transformers to start per
command); the refusals and the decode cut by SIGTERM are `spectune` processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from studyutil import run_cli, spectune_here

from workers.comm import GangInfo, refusal
from workers.engine.steps import StepRunner
from workers.model.checkpoint import CheckpointError, load_args, load_model, resolve_model_path, tiny_config
from workers.runtime.local_gang import LocalGang
from workers.spec import DrafterSpec, GangSpec, Workload
from workers.spec.engine_config import EngineConfig

EAGER = EngineConfig(cuda_graphs=False)

CUDA2 = dict(world_size=2, device_type="cuda", devices=(0, 1), p2p_ok=True, max_message_bytes=1 << 16)


@pytest.mark.parametrize(
    "backend, gang, needle",
    [
        ("nccl", GangInfo(world_size=2, device_type="cpu"), "nccl needs CUDA devices"),
        ("symm_mem", GangInfo(world_size=2, device_type="cpu"), "symm_mem needs CUDA devices"),
        ("symm_mem", GangInfo(**{**CUDA2, "p2p_ok": False}), "peer-to-peer access"),
        ("symm_mem", GangInfo(**{**CUDA2, "world_size": 16, "devices": tuple(range(16))}), "at most 8 ranks"),
        ("symm_mem", GangInfo(**{**CUDA2, "max_message_bytes": 64 << 20}), "MiB messages"),
        ("symm_mem_ll", GangInfo(world_size=2, device_type="cpu"), "symm_mem_ll needs CUDA devices"),
        ("symm_mem_ll", GangInfo(**{**CUDA2, "p2p_ok": False}), "peer-to-peer access"),
        ("nccl", GangInfo(**{**CUDA2, "devices": (0, 0)}), "same GPU"),
        ("gloo", GangInfo(**CUDA2), "gloo allreduce runs on CPU tensors only"),
        ("mpi", GangInfo(world_size=2, device_type="cpu"), "unknown allreduce backend 'mpi'"),
    ],
)
def test_capability_refusals(backend, gang, needle):
    why = refusal(backend, gang)
    assert why is not None and needle in why and "\n" not in why


def test_capabilities_that_can_run():
    assert refusal("gloo", GangInfo(world_size=2, device_type="cpu")) is None
    assert refusal("noop", GangInfo(world_size=2, device_type="cpu")) is None


def _prompts():
    g = torch.Generator().manual_seed(3)
    return tuple(tuple(torch.randint(3, 512, (16,), generator=g).tolist()) for _ in range(2))


def test_engine_config_reaches_every_worker(tiny_ckpt):
    """The GangSpec carries the EngineConfig to every process of a local gang (as to Ray actors):
    each rank reports the settings it runs in its setup info, the drafter process too."""
    engine = EngineConfig(attention="sdpa", cuda_graphs=False, gemv="off", fused_add_norm=False, overlap=False)
    spec = GangSpec(model_path=str(tiny_ckpt), tp=2, drafter=DrafterSpec(kind="ngram", ngram_actor=True), max_seq=64, engine=engine)
    with LocalGang(spec, timeout_s=300) as gang:
        infos = gang.setup()
    assert sorted(i["role"] for i in infos) == ["drafter", "verifier", "verifier"]
    assert all(i["engine"] == engine.describe() for i in infos), infos


def test_simulated_acceptance_and_comm_ablation(tiny_ckpt):
    spec = GangSpec(model_path=str(tiny_ckpt), tp=2, drafter=DrafterSpec(kind="ngram"), max_seq=256)
    with LocalGang(spec, timeout_s=300) as gang:
        gang.setup()
        base = gang.run(Workload(prompts=_prompts(), max_new_tokens=30, comm_ablation_iters=3, profile_widths=(1, 3, 5), profile_iters=2))
        sim = gang.run(Workload(prompts=_prompts(), max_new_tokens=30, num_draft_tokens=4, simulate_accept_len=2.5))
        after = gang.run(Workload(prompts=_prompts(), max_new_tokens=30))
    m = base.metrics
    # the ablation: the same step with the allreduce and with a no-op; its difference is communication
    assert m["compute_ms_per_step"] > 0 and m["ablation_step_ms"] >= m["compute_ms_per_step"]
    assert m["comm_ms_per_step"] == pytest.approx(m["ablation_step_ms"] - m["compute_ms_per_step"])
    assert m["comm_fraction"] == pytest.approx(m["comm_ms_per_step"] / m["ablation_step_ms"])  # a share of the step it was timed in
    # the end-of-run width profile: one verify pass per width, timed on both ranks together
    assert sorted(base.width_ms) == [1, 3, 5] and all(m[f"verify_ms_w{w}"] > 0 for w in (1, 3, 5))
    # the allreduce is switched back on: outputs are the baseline's again
    assert [p.tokens for p in after.prompts] == [p.tokens for p in base.prompts]
    # simulated acceptance: every step verifies k + 1 = 5 tokens and keeps 2.5 on average
    s = sim.metrics
    assert s["drafted_mean"] == 4.0
    steps = sim.stats.steps
    full = [st for st in steps if st.accepted + 1 <= 4]  # the last step of a prompt may be cut at max_new_tokens
    assert abs(sum(st.accepted + 1 for st in full) / len(full) - 2.5) < 0.1
    assert {st.accepted for st in steps} <= {1, 2}


@torch.inference_mode()
def test_greedy_draft_chain_equals_drafting_step_by_step(tiny_ckpt):
    """A greedy drafter's k drafts as one graph (`StepRunner.draft_chain` on CUDA) feed each argmax
    back on the device. Its body, run eagerly here, gives the tokens and the cache that k separate
    steps give; on CPU the chain itself declines (no graphs) and the drafter steps one by one."""
    model = load_model(tiny_ckpt, max_seq=64)
    prompt, feed, k = [5, 6, 7, 11, 12], [8, 9], 4
    step_by_step = StepRunner(model, model.new_cache(1), max_width=5, engine=EAGER)
    step_by_step.prefill(prompt)
    logits, want = step_by_step.step(feed)[-1], []
    for i in range(k):
        want.append(int(logits.argmax()))
        if i + 1 < k:
            logits = step_by_step.step([want[-1]])[-1]
    chained = StepRunner(model, model.new_cache(1), max_width=5, engine=EAGER)
    assert chained.draft_chain(feed, k) is None  # CPU: no graph, the caller drafts step by step
    chained.prefill(prompt)
    start = chained.cache.lengths[0]
    chained._inputs = torch.tensor([feed + [0] * 3, list(range(start, start + 2)) + [0] * 3])  # as `_stage` fills them
    assert chained._run_chain(len(feed), k).tolist() == want
    end = start + len(feed) + k - 1  # the last draft is not fed
    for got, ref in zip(chained.cache.k + chained.cache.v, step_by_step.cache.k + step_by_step.cache.v):
        torch.testing.assert_close(got[:, :, :end], ref[:, :, :end])


@torch.inference_mode()
def test_greedy_step_that_feeds_itself_equals_plain_greedy_steps(tiny_ckpt):
    """Overlapped greedy decoding (`StepRunner.greedy_launch` on CUDA) replays a width-1 step whose
    graph writes its own argmax and next position into the input buffer. That body, run eagerly
    here, gives the tokens, top-2 logits and cache of plain one-token steps."""
    model = load_model(tiny_ckpt, max_seq=64)
    prompt, first, n = [5, 6, 7, 11, 12], 8, 6
    plain = StepRunner(model, model.new_cache(1), max_width=1, engine=EAGER)
    plain.prefill(prompt)
    want, top2, tok = [], [], first
    for _ in range(n):
        logits = plain.step([tok])[-1]
        tok = int(logits.argmax())
        want.append(tok)
        top2.append(logits.topk(2).values.tolist())
    fed = StepRunner(model, model.new_cache(1), max_width=1, engine=EAGER)
    fed.prefill(prompt)
    start = fed.cache.lengths[0]
    fed._inputs = torch.tensor([[first], [start]])  # as `_stage` fills them for the first step only
    got = [fed._run_greedy(margins=True).tolist() for _ in range(n)]
    assert [int(g[0]) for g in got] == want
    torch.testing.assert_close(
        torch.tensor([g[1:] for g in got], dtype=torch.float64), torch.tensor(top2, dtype=torch.float64), rtol=1e-5, atol=1e-5
    )
    assert fed._inputs.tolist() == [[want[-1]], [start + n]]  # the next step's input, already in place
    assert fed._run_greedy().tolist() == [plain.step([want[-1]])[-1].argmax().item()]  # without margins: the token alone
    for a, b in zip(fed.cache.k + fed.cache.v, plain.cache.k + plain.cache.v):
        torch.testing.assert_close(a[:, :, : start + n], b[:, :, : start + n])


class _EagerFeed(StepRunner):
    """greedy_launch / greedy_result without a GPU: the self-feeding body runs at launch, eagerly."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.use_graphs, self.launches, self._done = True, 0, {}

    def warm(self, widths, chain=0, greedy=False, margins=False, tree=0):
        assert greedy  # the overlapped loop asked for its graph

    def greedy_launch(self, token=None, margins=False):
        start = self.cache.lengths[0]
        if token is not None:
            self._inputs = torch.tensor([[token], [start]])
        slot = self.launches % 2
        assert slot not in self._done, "a third step launched while two were unread"
        self._done[slot] = self._run_greedy(margins).tolist() if margins else self._run_greedy().tolist() + [float("nan")] * 2
        self.launches += 1
        self.cache.lengths[0] = start + 1
        return slot

    def greedy_result(self, slot):
        token, first, second = self._done.pop(slot)
        return int(token), first, second


@torch.inference_mode()
@pytest.mark.parametrize("stop, margins", [("max_new_tokens", True), ("eos", True), ("eos", False)])
def test_overlapped_greedy_decoding_matches_the_plain_loop(tiny_ckpt, stop, margins):
    """The overlapped greedy loop (step n + 1 launched before step n is read) returns the plain
    loop's tokens, steps and top-2 margins; at max_new_tokens it launches no step past the end,
    at an EOS exactly one, which it waits for and drops."""
    from workers.comm.base import AllReduce
    from workers.engine.link import DraftLink
    from workers.engine.verifier import Verifier

    model = load_model(tiny_ckpt, max_seq=128)

    def verifier(overlap: bool):
        engine = EngineConfig(cuda_graphs=False, overlap=overlap)
        v = Verifier(model, AllReduce(None, 1), DraftLink(None, 0, None, 4, model.args.vocab_size), 0, engine=engine)
        if overlap:
            v.steps = _EagerFeed(model, v.cache, 5, engine=engine)
        return v

    w = Workload(prompts=_prompts(), max_new_tokens=12, record_margins=margins)
    if stop == "eos":  # a token the plain loop emits mid-way in the first prompt
        first = verifier(False).run(w).prompts[0].tokens
        w = Workload(prompts=_prompts(), max_new_tokens=12, record_margins=margins, eos_ids=(first[6],))
    plain = verifier(False).run(w)
    fast = verifier(True)
    got = fast.run(w)
    assert [p.tokens for p in got.prompts] == [p.tokens for p in plain.prompts]
    assert [p.steps for p in got.prompts] == [p.steps for p in plain.prompts]
    for a, b in zip(got.prompts, plain.prompts):
        assert a.margins == pytest.approx(b.margins, abs=1e-5) and (len(a.margins) > 0) == margins
    ended_early = sum(len(p.tokens) < w.max_new_tokens for p in got.prompts)
    assert (ended_early > 0) == (stop == "eos")
    assert fast.steps.launches == sum(p.steps for p in got.prompts) + ended_early
    assert len(got.stats.steps) == sum(p.steps for p in got.prompts)


def test_step_runner_stays_eager_on_cpu(tiny_ckpt):
    model = load_model(tiny_ckpt, max_seq=64)
    runner = StepRunner(model, model.new_cache(1), max_width=5, engine=EngineConfig(cuda_graphs=True, compile=True))
    assert not runner.use_graphs and runner.fast is None  # graphs and compile need CUDA
    runner.warm(range(1, 6))
    assert runner.graphs == {}
    with torch.inference_mode():
        runner.prefill([5, 6, 7])
        got = runner.step([8, 9])
        ref_model = load_model(tiny_ckpt, max_seq=64)
        want = ref_model(torch.tensor([[5, 6, 7, 8, 9]]), ref_model.new_cache(1))[0, 3:]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_random_model_references(tmp_path):
    args = load_args("random:llama-3-8b")
    assert (args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.vocab_size) == (4096, 32, 32, 8, 128256)
    assert load_args("random:llama-3-70b:layers=8").n_layers == 8
    with pytest.raises(CheckpointError, match="neither a preset"):
        resolve_model_path("random:llama-9")
    with pytest.raises(CheckpointError, match="layers must be a positive integer"):
        resolve_model_path("random:llama-3-8b:layers=x")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(tiny_config()))
    ref = f"random:{cfg}"
    a, b = load_model(ref, max_seq=32), load_model(ref, max_seq=32)
    torch.testing.assert_close(a.layers[0].mlp.up_proj.weight, b.layers[0].mlp.up_proj.weight)  # one seed: ranks agree
    with torch.inference_mode():
        logits = a(torch.tensor([[1, 2, 3]]), a.new_cache(1))
    assert torch.isfinite(logits).all() and logits.std() > 0.1


def test_bench_allreduce_gloo_table(capsys):
    r = spectune_here(capsys, "bench-allreduce", "--tp", "2", "--sizes", "4K,64K", "--iters", "5", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["size_bytes"] for row in rows] == [4096, 65536]
    for row in rows:
        assert row["backend"] == "gloo" and row["mode"] == "eager" and row["time_us"] > 0
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * 1 / 2)


def test_bench_keeps_the_rows_of_backends_that_ran(monkeypatch):
    """One (backend, environment) failing on the machine (e.g. one kernel's compile error) costs only
    its own rows, and is named: the rest of the table is kept."""
    from orchestrator import bench as bench_mod
    from orchestrator.errors import UserError

    real, calls = bench_mod.run_backend, []

    def first_breaks(backend, *args, **kwargs):
        calls.append(backend)
        if len(calls) == 1:
            raise UserError("bench-allreduce gloo : CompilationError: at 9:15\nmore detail")
        return real(backend, *args, **kwargs)

    monkeypatch.setattr(bench_mod, "run_backend", first_breaks)
    logs = []
    rows, failures = bench_mod.bench(["gloo", "gloo"], 2, "cpu", [4096], "float32", 3, [{}], logs.append)
    assert calls == ["gloo", "gloo"] and [r["size_bytes"] for r in rows] == [4096] and rows[0]["time_us"] > 0
    assert failures == ["bench-allreduce gloo : CompilationError: at 9:15"]
    assert any("CompilationError" in line for line in logs)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--backend", "nccl"], "nccl needs CUDA"),
        (["--nccl-env", "NCCL_NVLS_ENABLE=1"], "NVLS / NVLink multicast must stay off"),
        (["--nccl-env", "PROTO=LL"], "expected NCCL_NAME=value"),
        (["--tp", "1"], "needs at least 2 ranks"),
        (["--sizes", "lots"], "is not a size"),
    ],
)
def test_bench_allreduce_refusals(args, needle):
    r = run_cli("bench-allreduce", *args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_decode_with_simulation_and_peer_baseline(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(tiny_config()))
    r = spectune_here(
        capsys,
        "decode",
        "--model",
        f"random:{cfg}",
        "--tp",
        "1",  # one rank: neither the simulation nor the peer baseline is about tensor parallelism
        "--drafter",
        "ngram",
        "-k",
        "3",
        "--simulate-accept-len",
        "3",
        "--num-prompts",
        "1",
        "--max-new-tokens",
        "12",
        "--peer-baseline",
        "--json",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["accept_len_mean"] == pytest.approx(3.0, abs=0.5)
    assert out["hf_generate_tok_s"] > 0 and out["baseline_vs_hf_generate"] > 0
    assert "outputs_match_baseline" not in out  # simulated tokens are not the model's output
    bad = spectune_here(capsys, "decode", "--model", f"random:{cfg}", "-k", "2", "--simulate-accept-len", "5")
    assert bad.returncode == 2 and "--simulate-accept-len: 5 needs at least 4 drafts per step" in bad.stderr


def test_sigterm_during_the_peer_baseline_keeps_our_figures(tmp_path):
    """`timeout` cutting a decode while transformers' generate runs (the slow part on a GPU) ends
    only the peer baseline: our figures are still printed, so the run keeps its JSON."""
    import signal

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(tiny_config()))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "decode",
            "--model",
            f"random:{cfg}",
            "--tp",
            "1",
            "--drafter",
            "ngram",
            "-k",
            "2",
            "--num-prompts",
            "4",
            "--max-new-tokens",
            "400",
            "--peer-baseline",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stderr:
            if "peer baseline: transformers generate" in line:
                proc.send_signal(signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    result = json.loads(out)
    assert result["peer_baseline_cut"] == 1 and "hf_generate_tok_s" not in result
    assert result["throughput_tok_s"] > 0 and result["speedup_vs_baseline"] > 0


def test_ablation_skips_the_vocab_gather_too():
    """With the allreduce switched off, the vocab-parallel gather moves nothing but keeps the shape."""
    from workers.comm.torch_dist import GlooAllReduce

    ar = GlooAllReduce(group=None, world_size=2)
    ar.enabled = False
    x = torch.randn(1, 3, 8)
    assert ar(x) is x and ar.counters.calls == 0
    assert ar.all_gather_last(x).shape == (1, 3, 16)


_ADD_NORM_RANK = r"""
import os, sys, torch, torch.distributed as dist
from workers.comm.torch_dist import GlooAllReduce
from workers.spec.engine_config import EngineConfig
from workers.spec import GangSpec
from workers.runtime.worker import Worker

rank, init, broken_rank, off_rank = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)

class Fused(GlooAllReduce):  # a one-kernel add + norm, wrong on `broken_rank` (it forgets the residual)
    fuses_add_norm = True
    def add_norm(self, partial, residual, weight, eps):
        s, n = super().add_norm(partial, residual, weight, eps)
        return (s - residual, n) if rank == broken_rank else (s, n)

ar = Fused(dist.group.WORLD, 2)
engine = EngineConfig(fused_add_norm=rank != off_rank)
use = Worker(rank, GangSpec(model_path="", tp=2, engine=engine))._check_add_norm(ar, dist.group.WORLD, 64, torch.float32, torch.device("cpu"))
assert ar.fuses_add_norm  # the backend's capability stays as built: the decision is the engine's
print("fused" if use else "unfused")
sys.stdout.flush()
dist.barrier()
os._exit(0)
"""


@pytest.mark.parametrize("broken_rank, off_rank, want", [(-1, -1, "fused"), (1, -1, "unfused"), (-1, 0, "unfused")])
def test_a_wrong_fused_add_norm_is_dropped_on_every_rank(tmp_path, broken_rank, off_rank, want):
    """A fused allreduce + add + norm that disagrees with allreduce, add, norm on any rank is dropped
    by all ranks together (their collectives must keep lining up); the rank that saw it says why.
    engine.fused_add_norm=false turns it off the same way, even if only one rank's engine config says so."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _ADD_NORM_RANK, str(r), str(tmp_path / "init"), str(broken_rank), str(off_rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    done = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-1500:] for _, err in done]
    assert [out.strip() for out, _ in done] == [want, want]
    if broken_rank == 1:
        assert "fused add + norm differs" in done[1][1] and "a peer rank refused" in done[0][1]
    if off_rank == 0:
        assert "turned off by engine.fused_add_norm=false\n" in done[0][1] and "engine.fused_add_norm=false on a peer rank" in done[1][1]


@pytest.mark.parametrize("visible, ray_ids, want", [(None, [1], 1), ("4,5", ["5"], 1), ("4,5", ["4"], 0), (None, [], -1)])
def test_a_ray_actor_takes_the_gpu_ray_assigned(monkeypatch, visible, ray_ids, want):
    """Ray GPU actors see every GPU of their node (so torch's symmetric memory can tell the ranks'
    devices apart) and take the one Ray assigned, named as the node's CUDA_VISIBLE_DEVICES lists it."""
    import ray

    from workers.runtime.worker import RAY_NOSET_CUDA_ENV, _ray_gpu_index

    monkeypatch.setattr(ray, "get_gpu_ids", lambda: ray_ids)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.delenv(RAY_NOSET_CUDA_ENV, raising=False)
    assert _ray_gpu_index() is None  # a local gang, or Ray masking the devices itself
    monkeypatch.setenv(RAY_NOSET_CUDA_ENV, "1")
    assert _ray_gpu_index() == want  # -1: a Ray actor given no GPU (an n-gram drafter): it must touch none
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    assert _ray_gpu_index() is None  # the variable leaked into a process Ray did not start
