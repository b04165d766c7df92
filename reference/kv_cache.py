"""A preallocated, contiguous KV cache.

Buffers are allocated once at their full size; appending writes into them in place and returns
views of the filled prefix. Growing a tensor with ``torch.cat`` at every step would instead
copy the whole prefix each time: O(N^2) bytes moved over a generation of N tokens.
"""
from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Keys and values for every layer: k, v of shape [n_layers, batch, n_kv_heads, max_len, head_dim]."""

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self._lengths = [0] * n_layers

    @property
    def length(self) -> int:
        """Tokens held by the most recently written layer (all layers agree after a forward)."""
        return self._lengths[-1]

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v [batch, n_kv_heads, T, head_dim] after the layer's prefix.

        Returns views (k_all, v_all) of shape [batch, n_kv_heads, length + T, head_dim].
        """
        start, T = self._lengths[layer], k.shape[2]
        if start + T > self.max_len:
            raise ValueError(f"KV cache full: {start} + {T} tokens exceed max_len={self.max_len}")
        self.k[layer, :, :, start:start + T] = k
        self.v[layer, :, :, start:start + T] = v
        self._lengths[layer] = start + T
        return self.read(layer)

    def read(self, layer: int) -> tuple[Tensor, Tensor]:
        """Views of the filled prefix of one layer: [batch, n_kv_heads, length, head_dim] each."""
        n = self._lengths[layer]
        return self.k[layer, :, :, :n], self.v[layer, :, :, :n]

    def aligned(self) -> bool:
        """Whether every layer holds the same number of tokens (a self-draft through the first
        layers only leaves the cache unaligned until it is truncated)."""
        return self._lengths.count(self._lengths[-1]) == len(self._lengths)

    def filled(self, n: int) -> None:
        """Record that every layer now holds positions < n, written into k and v in place by
        someone else (reference.cpu.native_step writes a decode step's keys and values itself)."""
        if not 0 <= n <= self.max_len:
            raise ValueError(f"cannot hold {n} tokens: max_len={self.max_len}")
        self._lengths = [n] * len(self._lengths)

    def truncate(self, n: int) -> None:
        """Forget every position >= n in all layers (e.g. rejected speculative tokens)."""
        if not 0 <= n <= min(self._lengths):
            raise ValueError(f"cannot truncate to {n}: cache holds {min(self._lengths)} tokens")
        self._lengths = [n] * len(self._lengths)

    def nbytes(self) -> int:
        """Bytes reserved by both buffers."""
        return self.k.numel() * self.k.element_size() * 2
