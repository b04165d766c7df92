"""Incoherent processing (FlashAttention-3's FP8 path, chapter 07): rotate Q
and K by one random orthogonal matrix before quantising them.

For an orthogonal R, (Q R)(K R)^T = Q R R^T K^T = Q K^T, so the scores are
unchanged in exact arithmetic. A channel whose values are far larger than
the others (an outlier) sets the quantisation scale and, through its large
products, dominates the rounding error of Q K^T; after the rotation each
rotated channel is a random signed mix of all of them, the outlier's weight
is spread evenly and the error of the product shrinks. R is a Hadamard
matrix times random signs, as in the paper (Shah et al. 2024, section 3.3),
which a GPU applies in O(d log d).

Quantisation uses `reference.quant` (symmetric int8 or fp8 e4m3), one scale
per block of `block_rows` rows (the paper's block quantisation), or one for
the whole tensor when block_rows is None.
"""
from __future__ import annotations

import torch
from torch import Tensor

from reference.quant import dequantize, quantize


def random_hadamard(dim: int, generator: torch.Generator) -> Tensor:
    """Orthogonal float64 [dim, dim]: H / sqrt(dim) with random column signs.

    H is Sylvester's Hadamard matrix; dim must be a power of two.
    """
    if dim < 1 or dim & (dim - 1):
        raise ValueError(f"dim must be a power of two, got {dim}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = torch.randint(0, 2, (dim,), generator=generator) * 2 - 1
    return h * signs.to(torch.float64) / dim ** 0.5


def roundtrip(x: Tensor, fmt: str, block_rows: int | None) -> Tensor:
    """x [N, d] quantised to fmt ("int8" or "fp8") and back, in float64."""
    rows = block_rows or x.shape[0]
    if x.shape[0] % rows:
        raise ValueError(f"{x.shape[0]} rows do not split into blocks of {rows}")
    blocks = x.reshape(-1, rows * x.shape[1])        # one scale per block
    return dequantize(quantize(blocks, fmt), torch.float64).reshape(x.shape)


def score_error(q: Tensor, k: Tensor, fmt: str,
                rotation: Tensor | None = None,
                block_rows: int | None = None) -> float:
    """Relative error ||S' - S|| / ||S|| (Frobenius) of S = q k^T [Nq, Nk]
    when q [Nq, d] and k [Nk, d] are quantised, optionally after rotating
    both by `rotation` [d, d]."""
    exact = q.double() @ k.double().T
    if rotation is not None:
        q, k = q.double() @ rotation, k.double() @ rotation
    approx = roundtrip(q, fmt, block_rows) @ roundtrip(k, fmt, block_rows).T
    return ((approx - exact).norm() / exact.norm()).item()


def outlier_channels(n: int, dim: int, channels: list[int], size: float,
                     generator: torch.Generator) -> Tensor:
    """Standard normal [n, dim] float64 with the given channels `size` times
    larger in every row (the outlier features of large models)."""
    x = torch.randn(n, dim, generator=generator, dtype=torch.float64)
    x[:, channels] *= size
    return x
