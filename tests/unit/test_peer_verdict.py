"""`decode --peer-baseline`'s verdict on transformers' greedy tokens: equal, a near tie (our plain
decoding's top two logits within the dtype's tolerance where the texts part), a real difference, and
transformers running on past an EOS our run stopped at."""

from __future__ import annotations

from orchestrator.decode.run import peer_verdict
from workers.spec import PromptResult, RunResult
from workers.spec.run_stats import RunStats


def _ours(*prompts: tuple[list[int], list[float]]) -> RunResult:
    return RunResult(
        prompts=[PromptResult(tokens=t, seconds=1.0, steps=len(t), accepted=0, margins=m) for t, m in prompts],
        stats=RunStats(),
        num_draft_tokens=0,
    )


def test_equal_near_tie_and_different():
    ours = _ours(([5, 6, 7], [0.5, 0.5, 0.5]), ([8, 9, 10], [0.5, 1e-7, 0.5]))
    assert peer_verdict(ours, [[5, 6, 7], [8, 9, 10]], set(), "float32") == {
        "outputs_match_peer": 1,
        "prompts_matching_peer": 2,
        "prompts_near_tie_peer": 0,
    }
    tie = peer_verdict(ours, [[5, 6, 7], [8, 4, 4]], set(), "float32")  # parts where our margin was ~0: a tie
    assert tie["outputs_match_peer"] == 1 and tie["prompts_near_tie_peer"] == 1
    wrong = peer_verdict(ours, [[5, 1, 7], [8, 9, 10]], set(), "float32")  # parts where our margin was wide
    assert wrong["outputs_match_peer"] == 0 and wrong["prompts_matching_peer"] == 1


def test_where_we_stopped_at_an_eos_the_tokens_before_it_are_compared():
    """transformers' run is held to max_new_tokens by min_new_tokens, which also forbids the EOS: where it
    would have stopped it writes another token, so only the tokens before our EOS can agree."""
    ours = _ours(([5, 6, 2], [0.5, 0.5, 0.5]))
    assert peer_verdict(ours, [[5, 6, 9, 9]], {2}, "float32")["outputs_match_peer"] == 1
    assert peer_verdict(ours, [[5, 7, 9, 9]], {2}, "float32")["outputs_match_peer"] == 0  # parted before the EOS
    assert peer_verdict(ours, [[5, 6, 9, 9]], set(), "float32")["outputs_match_peer"] == 0  # no EOS: a short output differs
