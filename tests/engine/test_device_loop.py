"""The device loop (workers/engine/device_loop.py): verify, greedy acceptance and the next EAGLE-3
chain without a host round trip. On CPU its bodies run eagerly: acceptance on the device keeps what
the host rule keeps, the chain fed k + 1 entries drafts what the host chain fed the kept ones
drafts, and whole decodes through the loop equal the baseline, with real and simulated acceptance."""

from __future__ import annotations

import pytest
import torch

from workers.drafters.eagle3.checkpoint import head_config, load_head, random_head, save_head
from workers.drafters.eagle3.head import Eagle3Drafter
from workers.engine.device_loop import AcceptOnDevice
from workers.engine.steps import StepRunner
from workers.model.checkpoint import load_args, load_model
from workers.spec.engine_config import EngineConfig

EAGER = EngineConfig(compile=False, cuda_graphs=False)


@pytest.fixture(scope="module")
def head_dir(tiny_ckpt, tmp_path_factory):
    return save_head(random_head(head_config(load_args(tiny_ckpt), 200), seed=1), tmp_path_factory.mktemp("head"))


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    steps = StepRunner(model, model.new_cache(1), max_width=1, engine=EAGER)
    tok, out = int(steps.prefill(prompt).argmax()), []
    for _ in range(n):
        out.append(tok)
        tok = int(steps.step([tok])[-1].argmax())
    return out


@torch.inference_mode()
@pytest.mark.parametrize("wrong", [0, 2, 4])
def test_acceptance_on_the_device_keeps_what_the_host_rule_keeps(tiny_ckpt, wrong):
    """[last, d_1..d_4] with d_1..d_wrong the greedy continuation: the device keeps `wrong` drafts
    (all 4 when none is wrong), returns the pass's argmaxes, leaves the chain's feed (kept drafts,
    then a_n) at the pass's positions, and stages the next pass at a_n right after the kept ones."""
    from workers.drafters.eagle3.head import default_aux_layers

    model = load_model(tiny_ckpt, max_seq=64)
    prompt, k = [5, 6, 7, 11, 12], 4
    cont = _greedy(model, prompt, k + 2)
    model.aux_layers = default_aux_layers(
        model.args.n_layers
    )  # the states EAGLE-3 reads, as the pass keeps them  # cont[0]: the first token, fed as `last`
    drafts = cont[1 : k + 1]
    if wrong < k:
        drafts[wrong] = (drafts[wrong] + 1) % 512
    steps = StepRunner(model, model.new_cache(1), max_width=k + 1, engine=EAGER)
    steps.prefill(prompt)
    loop = AcceptOnDevice(steps, k, max_steps=8)
    start = steps.cache.lengths[0]
    loop.stage(cont[0], torch.tensor(drafts), start)
    loop.launch(simulated=False)
    n, got_drafts, am = loop.read()
    assert n == wrong and got_drafts == drafts
    assert am[: n + 1] == cont[1 : n + 2]  # the verified argmaxes: the greedy continuation
    assert steps.cache.lengths[0] == start + k + 1
    assert loop.feed.tokens[: n + 1].tolist() == drafts[:n] + [am[n]]
    assert loop.feed.positions.tolist() == [list(range(start, start + k + 1))] and loop.feed.at.tolist() == [n]
    assert [tuple(a.shape) for a in loop.feed.aux] == [(1, k + 1, model.args.dim)] * 3  # the pass's rows, for fc
    assert steps._inputs[0, 0].item() == am[n]
    assert steps._inputs[1, : k + 1].tolist() == list(range(start + n + 1, start + n + k + 2))


@torch.inference_mode()
def test_simulated_acceptance_on_the_device_takes_the_planned_n(tiny_ckpt):
    model = load_model(tiny_ckpt, max_seq=64)
    k, plan = 3, [2, 0, 3]
    steps = StepRunner(model, model.new_cache(1), max_width=k + 1, engine=EAGER)
    steps.prefill([5, 6, 7])
    loop = AcceptOnDevice(steps, k, max_steps=8)
    loop.plan[:3] = torch.tensor(plan)
    loop.stage(9, torch.tensor([1, 2, 3]), steps.cache.lengths[0])
    kept = []
    for _ in plan:
        base = steps.cache.lengths[0]
        loop.launch(simulated=True)
        n, drafts, am = loop.read()
        kept.append(n)
        steps.cache.rollback(0, base + 1 + n)
        assert loop.feed.tokens[: n + 1].tolist() == drafts[:n] + [am[n]]
    assert kept == plan and loop.step_no.item() == 3


@torch.inference_mode()
@pytest.mark.parametrize("n", [0, 1, 3])
def test_the_chain_fed_on_the_device_drafts_what_the_host_chain_drafts(tiny_ckpt, head_dir, n):
    """The device chain feeds all k + 1 entries of the pass (those past n hold rejected tokens) and
    drafts from entry n; the host chain feeds the n + 1 kept entries. Same drafts, and the same head
    cache up to the last fed slot."""
    from workers.engine.device_loop import DeviceFeed

    model = load_model(tiny_ckpt, max_seq=64)
    head = load_head(head_dir, model.embed_tokens.weight, load_args(tiny_ckpt), max_seq=64)
    k, g = 3, torch.Generator().manual_seed(0)
    prompt = list(range(20, 32))
    L = len(prompt)  # the verify pass: [t0, d_1..d_k] at positions L..L + k
    dim = load_args(tiny_ckpt).dim
    aux = torch.randn(L + k + 1, 3 * dim, generator=g)  # the prompt's rows, then the pass's
    t0, *d = torch.randint(3, 512, (k + 1,), generator=g).tolist()
    drafters = []
    for _ in range(2):
        x = Eagle3Drafter(head, chain=True)
        x.prefill(prompt)
        x.observe(aux[:L])
        x.propose(prompt + [t0], k)  # the prompt's entries, then a chain the verifier "rejected"
        drafters.append(x)
    host, dev = drafters
    host.observe(aux[L : L + n + 1])  # the kept rows: [t0, d_1..d_n]
    want = host.propose(prompt + [t0] + d[:n] + [7], k).tokens  # a_n = 7
    feed = DeviceFeed(
        tokens=torch.tensor(d[:n] + [7] + d[n:]),  # entry j: x_{j+1}; past n the rejected drafts
        positions=torch.arange(L, L + k + 1)[None],
        at=torch.tensor([n]),
        drafts=torch.zeros(k, dtype=torch.long),
        aux=[a[None] for a in aux[L:].split(dim, dim=-1)],
    )
    dev.draft_fed(feed, k)
    assert feed.drafts.tolist() == want
    last = L + n + k - 1  # the last slot both chains fed (the last draft is not fed)
    for a, b in zip(dev.cache.k + dev.cache.v, host.cache.k + host.cache.v):
        torch.testing.assert_close(a[:, :, : last + 1], b[:, :, : last + 1], atol=1e-5, rtol=1e-5)
