"""The per-step context: what one forward pass needs to know besides token ids and weights.

A model step is the same code whether it serves one prompt in a notebook or a batch of requests in
the engine; what differs is *where the keys and values live* and *which keys each query may see*.
That knowledge sits in a context object built once per step and read by every attention layer:

- `DenseContext`: B sequences in lockstep over a contiguous `KVCache` (or no cache at all), the
  T new tokens at positions ``start .. start + T - 1``. Writing at ``start`` is writing by
  position: a step that starts before the cache's end overwrites the tail (speculative rollback).
  Backends: ``"sdpa"`` (PyTorch's fused attention), ``"naive"`` (explicit softmax, chapter 01),
  ``"triton"`` (our FlashAttention and split-K decode kernels, chapters 05–07).
- `PagedContext`: ragged sequences flattened into one row of N tokens (the engine), keys and values
  in a paged pool addressed through block tables (chapter 08). Backends: ``"torch"`` (gather
  through the block table) and ``"triton"`` (store and decode kernels over the block table).

`attend(layer, q, k, v)` stores the new keys and values where the context keeps them and returns
the attention output; the model never touches a cache itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from reference.attention import PagedPlan, grouped_query_attention, paged_attention

DENSE_BACKENDS = ("sdpa", "naive", "triton")
PAGED_BACKENDS = ("torch", "triton")


@dataclass
class DenseContext:
    """One step over a contiguous cache. positions [T] (shared by the batch); mask [T, S] bool
    (True = key visible) or None when every key is visible; rope_rows: slice or index tensor."""
    positions: Tensor
    rope_rows: slice | Tensor
    cache: object | None
    mask: Tensor | None
    backend: str = "sdpa"

    @classmethod
    def for_step(cls, cache, n_new: int, positions: Tensor | None, device: torch.device,
                 backend: str = "sdpa", mask: Tensor | None = None) -> "DenseContext":
        """Build the context of a step feeding `n_new` tokens; the causal mask is made once here.

        Without positions, the tokens continue the cache (or start at 0). With positions, the first
        one says where they are written: a cache holding more tokens is cut back to it first.
        mask [n_new, S] replaces the causal mask (sdpa backend only), e.g. for a draft tree.
        """
        if backend not in DENSE_BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}: choose one of {DENSE_BACKENDS}")
        start = cache.length if cache is not None else 0
        if positions is None:
            rope_rows = slice(start, start + n_new)
            positions = torch.arange(start, start + n_new, device=device)
        else:
            if positions.shape != (n_new,):
                raise ValueError(f"positions must have shape [{n_new}], got {list(positions.shape)}")
            rope_rows = positions
            if cache is not None:
                start = int(positions[0])
                if start > cache.length:
                    raise ValueError(f"cannot write at position {start}: the cache holds {cache.length} tokens")
                if start < cache.length:
                    cache.truncate(start)  # write by position: the rejected tail is overwritten
        if mask is not None:
            if backend != "sdpa":
                raise ValueError(f"a custom mask needs the sdpa backend, not {backend!r}")
            return cls(positions, rope_rows, cache, mask, backend)
        if n_new > 1:  # a single query sees every key: a decode step needs no mask
            key_positions = torch.arange(start + n_new, device=device) if cache is not None else positions
            mask = key_positions[None, :] <= positions[:, None]
        return cls(positions, rope_rows, cache, mask, backend)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [B, T, H, D], k and v [B, T, H_kv, D] -> [B, T, H * D]."""
        B, T = q.shape[:2]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.cache is not None:
            k, v = self.cache.append(layer, k, v)  # views of the whole cached prefix [B, H_kv, S, D]
        if self.backend == "triton":
            out = kernel_attention(q, k, v)
        elif self.backend == "naive":  # the new queries are the last T of the S keys: end-aligned causal
            out = grouped_query_attention(q, k, v, causal=T > 1)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, enable_gqa=True)
        return out.transpose(1, 2).reshape(B, T, -1)


def kernel_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The "triton" dense backend: q [B, Hq, T, D], k and v [B, Hkv, S, D] with T <= S -> [B, Hq, T, D].

    The T new queries are the last T of the S cached positions (prefill: T = S, or a chunk after
    a cached prefix; decode: T = 1): exactly the end-aligned causal mask of `flash_attention`; a
    single query sees every key, the case `decode_attention` serves with split-K.
    """
    from reference.kernels import decode_attention, flash_attention  # Triton loads on first use

    if q.shape[2] == 1:
        return decode_attention(q[:, :, 0], k, v)[:, :, None]
    return flash_attention(q, k, v, causal=True)


@dataclass
class PagedContext:
    """One engine step over a paged pool (shapes: N new tokens, B sequences).

    positions [N] int64; slot_mapping [N] int64 (-1 = do not store); query_lens: new tokens per
    sequence (B ints, summing to N); context_lens [B] int32 (keys each sequence sees after this
    step's writes); block_tables [B, max_blocks] int32 padded with -1; k_pool, v_pool
    [n_layers, num_blocks, block_size, H_kv, D].
    """
    positions: Tensor
    slot_mapping: Tensor
    query_lens: list[int]
    context_lens: Tensor
    block_tables: Tensor
    k_pool: Tensor
    v_pool: Tensor
    backend: str = "torch"

    def __post_init__(self):
        if self.backend not in PAGED_BACKENDS:
            raise ValueError(f"unknown paged backend {self.backend!r}: choose one of {PAGED_BACKENDS}")
        self.rope_rows = self.positions
        self.decode_only = all(n == 1 for n in self.query_lens)
        # Tokens to store and their slots, worked out once per step rather than once per layer.
        stored = (self.slot_mapping >= 0).nonzero().squeeze(1)
        self.stored_rows = None if len(stored) == len(self.slot_mapping) else stored
        self.stored_slots = self.slot_mapping if self.stored_rows is None else self.slot_mapping[stored]
        self.plan: PagedPlan | None = None   # built by the first layer that gathers, reused by the rest

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [1, N, H, D], k and v [1, N, H_kv, D] -> [1, N, H * D]."""
        q, k, v = q[0], k[0], v[0]
        k_cache, v_cache = self.k_pool[layer], self.v_pool[layer]
        if self.backend == "triton":
            from reference.kernels.paged_attention import paged_decode_attention, store_kv
            # The runner builds tables and slots from the block manager: no per-layer host checks.
            store_kv(k, v, k_cache, v_cache, self.slot_mapping, check_values=False)
            if self.decode_only:
                out = paged_decode_attention(q, k_cache, v_cache, self.block_tables, self.context_lens,
                                             check_values=False)
                return out.reshape(1, q.shape[0], -1)
        else:
            new_k, new_v = (k, v) if self.stored_rows is None else (k[self.stored_rows], v[self.stored_rows])
            k_cache.view(-1, *k.shape[1:]).index_copy_(0, self.stored_slots, new_k)
            v_cache.view(-1, *v.shape[1:]).index_copy_(0, self.stored_slots, new_v)
        if self.plan is None:
            self.plan = PagedPlan(self.block_tables, self.context_lens, self.query_lens, q, k_cache)
        out = paged_attention(q, k_cache, v_cache, self.block_tables, self.context_lens, self.query_lens,
                              self.plan)
        return out.reshape(1, q.shape[0], -1)
