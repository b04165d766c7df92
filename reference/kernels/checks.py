"""Input checks shared by the kernel launchers: one clear error line instead of a deep traceback.

A Triton kernel runs either compiled for a CUDA GPU or, when the environment variable
`TRITON_INTERPRET=1` was set before the kernels were imported, in Triton's interpreter (NumPy
on the CPU, slow but exact enough to test). `@triton.jit` makes that choice once, when a kernel
is defined, so we read the variable at import time too.
"""
from __future__ import annotations

import os

import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HEAD_DIMS = (16, 32, 64, 128)


def check_tensors(name_to_tensor: dict[str, torch.Tensor], ndims: dict[str, int | None]) -> torch.device:
    """Types, ranks (None: any), float dtypes and one common device; returns that device.

    Raises TypeError for a non-tensor or an unsupported dtype, ValueError for a wrong rank,
    mixed devices or dtypes, or a CPU tensor when the kernels were compiled for a GPU.
    """
    for name, t in name_to_tensor.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: float32, float16, bfloat16")
        if ndims[name] is not None and t.dim() != ndims[name]:
            raise ValueError(f"{name} must have {ndims[name]} dimensions, got shape {tuple(t.shape)}")
    dtypes = {t.dtype for t in name_to_tensor.values()}
    if len(dtypes) > 1:
        raise TypeError(f"inputs must share one dtype, got {sorted(map(str, dtypes))}")
    devices = {t.device for t in name_to_tensor.values()}
    if len(devices) > 1:
        raise ValueError(f"inputs must be on one device, got {sorted(map(str, devices))}")
    device = devices.pop()
    if device.type != "cuda" and not INTERPRETED:
        raise ValueError(f"Triton kernels need a CUDA device, got tensors on {device}; to run them on "
                         "the CPU set TRITON_INTERPRET=1 before importing reference.kernels")
    return device


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every kernel output and scratch buffer is allocated here (contiguous, uninitialised), so
    that tests can replace it with a NaN-filled allocation and prove each element is written."""
    return torch.empty(shape, dtype=dtype, device=device)


def check_head_dim(head_dim: int) -> None:
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head dim must be one of {HEAD_DIMS}, got {head_dim}")


def check_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int]:
    """K/V against queries laid out [B, Hq, ..., D]: k and v of one shape [B, Hkv, N, D] with q's
    batch and head dim, Hq a multiple of Hkv, a supported head dim. Returns (Hkv, N)."""
    batch, n_q_heads, head_dim = q.shape[0], q.shape[1], q.shape[-1]
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"k/v shape {tuple(k.shape)} does not match q {tuple(q.shape)} in batch or head dim")
    n_kv_heads, n_keys = k.shape[1], k.shape[2]
    if n_kv_heads == 0 or n_q_heads % n_kv_heads:
        raise ValueError(f"query heads ({n_q_heads}) must be a multiple of K/V heads ({n_kv_heads})")
    check_head_dim(head_dim)
    return n_kv_heads, n_keys
