"""Fresh random inputs for the chapter graders, all drawn from a seeded torch.Generator."""
from __future__ import annotations

import torch


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randint(gen: torch.Generator, low: int, high: int) -> int:
    """An int drawn uniformly from [low, high] (both ends included)."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def qkv(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype = torch.float32):
    """Three standard-normal tensors (q, k, v) of `shape`, drawn in float64 then cast to `dtype`."""
    return tuple(torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype) for _ in range(3))
