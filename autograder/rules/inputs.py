"""Fresh random inputs for the chapter graders, all drawn from a seeded torch.Generator."""
from __future__ import annotations

import math

import torch


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randint(gen: torch.Generator, low: int, high: int) -> int:
    """An int drawn uniformly from [low, high] (both ends included)."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def qkv(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype = torch.float32):
    """Three standard-normal tensors (q, k, v) of `shape`, drawn in float64 then cast to `dtype`."""
    return tuple(torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype) for _ in range(3))


def large_rows(gen: torch.Generator, shape: tuple[int, ...]):
    """(offsets, directions) for ``climbing_scores``, float64 tensors of `shape`: offsets
    +-900 to +-1100, directions +-1. Each row is of one of four kinds (above or below zero,
    climbing or falling), dealt in a random order so that every kind is present once there are
    four rows or more. The other three kinds leave float64's exp range at once; a row below
    zero that climbs does so only after ~50 keys."""
    n = math.prod(shape)
    kinds = torch.randperm(n, generator=gen) % 4
    offsets = torch.where(kinds % 2 == 0, 1.0, -1.0) * torch.randint(900, 1101, (n,), generator=gen)
    directions = torch.where(kinds < 2, 1.0, -1.0)
    return offsets.double().view(shape), directions.double().view(shape)


def climbing_scores(q: torch.Tensor, k: torch.Tensor, key_positions: torch.Tensor,
                    offsets: torch.Tensor, directions: torch.Tensor):
    """Inputs for a softmax that only a running max keeps finite: float32 copies of q [..., D]
    and k [..., D] (standard normal, D >= 4) whose scores (q . k) / sqrt(D) sit near `offsets`
    (score units, broadcast to q.shape[:-1]) and climb (`directions` +1) or fall (-1) by 32 per
    key position (`key_positions`, broadcast to k.shape[:-1]), with noise of about 64.

    q is integer and k a multiple of 1/4, so q . k is exact in float32. With offsets near
    +-1000 the scores lie far beyond where exp overflows and underflows, in float64 too (~709,
    ~-745), and a climbing row's max grows past any first tile's by more than exp's range: no
    float64, no constant shift and no max taken once keeps the sums finite."""
    root = math.sqrt(q.shape[-1])
    q, k = (q.double() * 64).round(), (k.double() * 4).round() / 4
    k[..., 0] = 4.0                                    # q[..., 0]: the row's offset
    k[..., 1] = key_positions.double() / 4             # q[..., 1]: +-32 per key position
    q[..., 0] = (offsets * root / 4).round()
    q[..., 1] = (directions * 128 * root).round()
    return q.float(), k.float()
