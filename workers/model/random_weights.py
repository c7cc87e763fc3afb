"""Random-weight models of realistic shape, for engine speed where real large weights cannot be
downloaded: `random:<preset or path/to/config.json>[:layers=N]` wherever a model path goes.

    spectune decode --model random:llama-3-8b --tp 2 ...
    spectune decode --model random:llama-3-70b:layers=8 ...      # the 70B shape, 8 of its 80 layers

Weights are drawn on the target device (no file is written): N(0, 1/fan_in), with the output
projections scaled by 1/sqrt(2 * layers) so the residual stream stays bounded in bf16; norms are 1,
biases 0. A rank draws only its part of each tensor: a tensor is cut into TILE x TILE tiles, each
drawn from its own seed (the tensor's name and the tile's place), so any part of a tensor is the
same numbers at every TP size and a rank's transient memory is one tile. Such models have no
tokenizer (prompts go through the byte tokenizer) and no EOS.
"""

from __future__ import annotations

import hashlib

import torch

from workers.model.locate import PREFIX, PRESETS, is_random, random_config  # noqa: F401 - re-exported

TILE = 1024  # rows and columns of one independently seeded block


def _tile_seed(seed: int, name: str, i: int, j: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{name}:{i}:{j}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _std(name: str, full_shape: tuple[int, ...], n_layers: int) -> float:
    std = 1.0 if "embed" in name else full_shape[1] ** -0.5
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        std /= (2 * max(1, n_layers)) ** 0.5
    return std


@torch.no_grad()
def random_part(
    name: str,
    full_shape: tuple[int, ...],
    rows: tuple[int, int] | None,
    cols: tuple[int, int] | None,
    n_layers: int,
    dtype: torch.dtype,
    device,
    seed: int = 0,
) -> torch.Tensor:
    """Rows [r0, r1) and columns [c0, c1) (None: all) of parameter `name` of a random model with
    `n_layers` layers (the full model's count, also for a prefix of its layers), drawn tile by tile."""
    if len(full_shape) == 1:
        r0, r1 = rows or (0, full_shape[0])
        return torch.full((r1 - r0,), 1.0 if name.endswith("norm.weight") else 0.0, dtype=dtype, device=device)
    r0, r1 = rows or (0, full_shape[0])
    c0, c1 = cols or (0, full_shape[1])
    out = torch.empty((r1 - r0, c1 - c0), dtype=dtype, device=device)
    std = _std(name, full_shape, n_layers)
    for i in range(r0 // TILE, -(-r1 // TILE)):
        for j in range(c0 // TILE, -(-c1 // TILE)):
            ti0, ti1 = i * TILE, min((i + 1) * TILE, full_shape[0])
            tj0, tj1 = j * TILE, min((j + 1) * TILE, full_shape[1])
            gen = torch.Generator(device=device).manual_seed(_tile_seed(seed, name, i, j))
            tile = torch.randn((ti1 - ti0, tj1 - tj0), generator=gen, device=device, dtype=torch.float32).mul_(std)
            a0, a1, b0, b1 = max(r0, ti0), min(r1, ti1), max(c0, tj0), min(c1, tj1)
            out[a0 - r0 : a1 - r0, b0 - c0 : b1 - c0] = tile[a0 - ti0 : a1 - ti0, b0 - tj0 : b1 - tj0]
    return out
