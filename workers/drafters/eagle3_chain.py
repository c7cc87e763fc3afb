"""The greedy EAGLE-3 draft chain as one CUDA graph: feed the verifier's new states, then k drafts.

    chain = Eagle3Chain(head, cache, max_width=17)      # capture: CUDA graphs (default on a GPU)
    drafts = chain.draft(tokens, g, k)                  # list of k target ids, or None (use the eager loop)

One replay runs the head's step on the `T` staged entries (tokens x_{i+1} and fused states g_i at
positions start..start+T-1), takes the argmax of the last entry's draft logits, maps it to a target
id, and k - 1 times feeds that token with the head's own pre-norm output at the next position,
all on the device: k drafts cost one launch and one host sync instead of ~30 kernels and a sync
per draft. Positions live in a device buffer and attention reads the whole head cache under a
position mask (`Eagle3Head.step_at` with kv_len = max_seq), so no shape depends on the sequence
length. A graph is captured per (T, k) on first use, or ahead of timing by `warm`.

Invariant (as the eager loop): after a chain the cache holds start + T + k - 1 entries; the last
draft is not fed. Without capture (CPU) the same device-only body runs directly, which is how the
tests compare it with the eager loop.
"""

from __future__ import annotations

import torch

from workers.model.transformer import KVCache


class Eagle3Chain:
    def __init__(self, head, cache: KVCache, max_width: int, capture: bool | None = None):
        self.head, self.cache, self.max_width = head, cache, max_width
        self.device = head.fc.weight.device
        self.capture = self.device.type == "cuda" if capture is None else capture
        dim, dtype = head.cfg.args.dim, head.fc.weight.dtype
        self._tok = torch.zeros(max_width, dtype=torch.long, device=self.device)
        self._pos = torch.zeros(1, max_width, dtype=torch.long, device=self.device)
        self._g = torch.zeros(max_width, dim, dtype=dtype, device=self.device)
        pin = self.device.type == "cuda"
        self._staging = torch.zeros(2, max_width, dtype=torch.long).pin_memory() if pin else torch.zeros(2, max_width, dtype=torch.long)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None

    def fits(self, T: int, k: int) -> bool:
        return 1 <= T <= self.max_width and k >= 1 and self.cache.lengths[0] + T + k - 1 <= self.cache.max_seq

    def draft(self, tokens: list[int], g: torch.Tensor, k: int) -> list[int] | None:
        """k greedy drafts (target ids) after feeding `tokens` with their fused states g [T, dim];
        None where the chain does not apply (too wide a feed, a full cache)."""
        T = len(tokens)
        if not self.fits(T, k):
            return None
        start = self.cache.lengths[0]
        self._staging[0, :T] = torch.tensor(tokens)
        self._staging[1, :T] = torch.arange(start, start + T)
        self._tok[:T].copy_(self._staging[0, :T], non_blocking=True)
        self._pos[0, :T].copy_(self._staging[1, :T], non_blocking=True)
        self._g[:T].copy_(g)
        if self.capture:
            if (T, k) not in self.graphs:
                self.graphs[(T, k)] = self._capture(T, k)
            graph, out = self.graphs[(T, k)]
            graph.replay()
        else:
            out = self._run(T, k)
        self.cache.lengths[0] = start + T + k - 1
        return out.tolist()

    def warm(self, k: int) -> None:
        """Capture the chains of k drafts after every feed width 1..k + 1 (what a step sends),
        outside any timing. Writes scratch entries from position 0: reset the cache after."""
        if not self.capture:
            return
        for T in range(1, min(k + 1, self.max_width) + 1):
            self.cache.lengths[0] = 0
            self.draft([0] * T, torch.zeros(T, self._g.shape[1], dtype=self._g.dtype, device=self.device), k)
        self.cache.lengths[0] = 0

    def _run(self, T: int, k: int) -> torch.Tensor:
        """Device ops only (graph-safe): the k drafts after the T staged entries, as target ids."""
        head, window = self.head, self.cache.max_seq
        pos = self._pos[:, :T]
        h, logits = head.step_at(self._tok[:T], self._g[:T], pos, self.cache, window)
        nxt = head.to_target(logits.argmax())
        drafts, pos = [nxt], pos[:, -1:]
        for _ in range(k - 1):
            pos = pos + 1
            h, logits = head.step_at(nxt.view(1), h[-1:], pos, self.cache, window)
            nxt = head.to_target(logits.argmax())
            drafts.append(nxt)
        return torch.stack(drafts)

    def _capture(self, T: int, k: int):
        # warm up on a side stream (lazy kernels, allocator), then capture into the shared pool
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._run(T, k)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._run(T, k)
        self._pool = graph.pool()
        return graph, out
