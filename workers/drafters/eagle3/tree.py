"""The shape of an EAGLE-3 draft tree: the head's chain, an n-gram continuation, the head's runners-up.

A tree step (`drafter.tree_width` W >= 2) scores every entry in one verify pass and keeps the
longest path the target agrees with (workers/engine/verify.py `tree_path`). The tree holds

    the chain: the head's top-1 at each of k depths, root first;
    n-gram branches (`drafter.lookup` L > 0): what followed the latest earlier occurrence of the
        committed sequence's last n tokens, for the two longest n from L down to 1 that give
        different continuations, merged into the tree as a trie (tokens the tree already holds
        are shared; from the first difference a branch of its own);
    siblings: each depth's other top-(W - 1) tokens as leaves under the chain node before them,
        depth 1 first, skipping a token already at that place.

The size is fixed by (k, W) alone, min(k x W, MAX_DRAFT_TOKENS) drafts, whatever the n-gram
branches hold: they take the places of the deepest siblings, so every step of a trial is one tree
width and replays one graph. With no room for a sibling (k = MAX_DRAFT_TOKENS) the proposal is the
chain. `tree_size` (workers/spec.py, torch-free) is the rule the verifier warms and the orchestrator counts.

    python -m pytest tests/test_tree.py      # shapes, the merge, and trees verified end to end
"""

from __future__ import annotations

from workers.spec import MAX_DRAFT_TOKENS


def shape_tree(chain: list[int], alternatives: list[list[int]], branches: list[list[int]] = ()) -> tuple[list[int], list[int] | None]:
    """(tokens, parents) of the drafts: parents[i] is the index of entry i's parent among the
    drafts, -1 for the root (the last committed token); parents None: a chain. alternatives[d]:
    depth d's runners-up, best first; branches: n-gram continuations, best first (module docstring)."""
    size = min(len(chain) + sum(len(a) for a in alternatives), MAX_DRAFT_TOKENS)
    if size == len(chain):  # no room for a sibling: a chain
        return list(chain), None
    tokens, parents = list(chain), list(range(-1, len(chain) - 1))
    children: dict[tuple[int, int], int] = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens))}
    for branch in branches:
        node = -1
        for t in branch:
            if (node, t) in children:  # the tree already holds this token here: share it
                node = children[(node, t)]
                continue
            if len(tokens) == size:
                break
            tokens.append(t)
            parents.append(node)
            children[(node, t)] = len(tokens) - 1
            node = len(tokens) - 1
    for depth, alts in enumerate(alternatives):
        parent = depth - 1  # the chain node before this depth
        for t in alts:
            if len(tokens) == size:
                break
            if (parent, t) not in children:
                tokens.append(t)
                parents.append(parent)
                children[(parent, t)] = len(tokens) - 1
    return tokens, parents
