"""The model's attention through our kernels: `use_kernels(model)` switches every layer.

Inside the model, the T new queries of a forward are the last T of the S positions in the
cache (prefill: T = S, or a chunk after a cached prefix; decode: T = 1). That is exactly the
end-aligned causal mask of `flash_attention`; a single query sees every key, which is the case
`decode_attention` serves with split-K.
"""
from __future__ import annotations

import torch

from reference.kernels.decode_attention import decode_attention
from reference.kernels.flash_attention import flash_attention

BACKENDS = ("sdpa", "naive", "triton")


def kernel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [B, Hq, T, D], k and v [B, Hkv, S, D] with T <= S -> [B, Hq, T, D], causal."""
    if q.shape[2] == 1:
        return decode_attention(q[:, :, 0], k, v)[:, :, None]
    return flash_attention(q, k, v, causal=True)


def use_kernels(model, backend: str = "triton"):
    """Route every attention layer of `model` (a reference.model.Llama) through `backend`."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}: choose one of {BACKENDS}")
    model.attention_backend = backend
    return model
