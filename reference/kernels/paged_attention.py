"""Paged attention: store new K/V into a block pool, and decode attention read through block tables.

The pool. One layer's keys live in `k_cache [num_blocks, block_size, Hkv, D]` (values alike): a
sequence's token at position p sits in block `block_tables[b, p // block_size]`, row
`p % block_size`, so slot `s = block * block_size + row` names one token's `[Hkv, D]` keys. The
blocks of one sequence are anywhere in the pool, in any order, and may be shared with others.

Why the table costs (almost) nothing. Decode attention is memory-bound: one query row per head
against N keys reads K and V once, 2 N Hkv D element bytes per sequence, whatever their layout.
Read through a table those are the same bytes, only fetched from scattered places: a program
that serves one K/V head reads, for each key, one row of D contiguous elements (128 bytes in
fp16 at D = 64, a whole number of 32-byte sectors, exactly as from a contiguous cache), so no
byte is wasted at a block boundary. The table itself adds N / block_size int32 entries per
sequence, 4 / (block_size * 2 Hkv D * element bytes) of the K/V bytes: 4 / 12288, about 0.03%,
for SmolLM2 (Hkv = 3, D = 64, fp16) with blocks of 16 tokens. What paging does cost is latency:
a key's address depends on a table load, one extra dependent load per tile, which split-K
hides by running many programs at once (`decode_attention.py` explains the split and merge).

Storing. `store_kv` writes N new tokens' `[Hkv, D]` keys and values to their slots, one program
per token; slot -1 (a padded position) writes nothing.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from reference.kernels import checks
from reference.kernels.checks import INTERPRETED
from reference.kernels.decode_attention import attend_tile, default_num_splits, merge_kernel
from reference.kernels.flash_attention import LOG2E, dot_options

GPU_BLOCK_N = 64                         # keys per tile on a GPU; a tile may span several pool blocks
BLOCK_N = 16 if INTERPRETED else GPU_BLOCK_N
MAX_HEAD_DIM = 256


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kn, stride_kh, stride_kd, stride_vn, stride_vh, stride_vd,
                     stride_kcb, stride_kcs, stride_kch, stride_kcd,
                     stride_vcb, stride_vcs, stride_vch, stride_vcd,
                     head_dim, n_elements, block_size, BLOCK: tl.constexpr):
    """Program (token): copy its [Hkv, D] keys and values, flattened to BLOCK lanes, to its slot."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token)                              # int64; -1: do not store
    lanes = tl.arange(0, BLOCK)
    head, dim = lanes // head_dim, lanes % head_dim
    ok = lanes < tl.where(slot >= 0, n_elements, 0)                # no lane for slot -1
    block, row = slot // block_size, slot % block_size
    k = tl.load(k_ptr + token * stride_kn + head * stride_kh + dim * stride_kd, mask=ok)
    v = tl.load(v_ptr + token * stride_vn + head * stride_vh + dim * stride_vd, mask=ok)
    tl.store(k_cache_ptr + block * stride_kcb + row * stride_kcs + head * stride_kch + dim * stride_kcd, k, mask=ok)
    tl.store(v_cache_ptr + block * stride_vcb + row * stride_vcs + head * stride_vch + dim * stride_vcd, v, mask=ok)


@triton.jit
def _paged_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, table_ptr, lens_ptr, m_ptr, l_ptr, acc_ptr,
                        stride_qb, stride_qh, stride_qd,
                        stride_kb, stride_ks, stride_kh, stride_kd,
                        stride_vb, stride_vs, stride_vh, stride_vd,
                        stride_tb, stride_tp, stride_lb,
                        n_kv_heads, group, head_dim, block_size, num_splits, qk_scale,
                        BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                        PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """Program (batch * kv_head, split): the softmax state of one chunk of the sequence's keys.

    The sequence's context_len keys are cut into num_splits chunks of whole tiles (some empty);
    each key's pool row is found through the block table.
    """
    batch = tl.program_id(0) // n_kv_heads
    kv_head = tl.program_id(0) % n_kv_heads
    split = tl.program_id(1)
    heads = kv_head * group + tl.arange(0, BLOCK_H)              # the query heads of this group
    head_ok = tl.arange(0, BLOCK_H) < group
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    q = tl.load(q_ptr + batch.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                mask=head_ok[:, None] & dim_ok[None, :], other=0.0)
    if DOT_UPCAST:
        q = q.to(tl.float32)
    table = table_ptr + batch.to(tl.int64) * stride_tb
    n_keys = tl.load(lens_ptr + batch * stride_lb)
    chunk = tl.cdiv(tl.cdiv(n_keys, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)                       # start >= end: an empty split

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)                    # logical key positions
        in_range = cols < end
        block = tl.load(table + (cols // block_size) * stride_tp, mask=in_range, other=0).to(tl.int64)
        row = cols % block_size
        kv_ok = in_range[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + (block * stride_kb + row * stride_ks + kv_head * stride_kh)[:, None]
                    + dims[None, :] * stride_kd, mask=kv_ok, other=0.0)
        v = tl.load(v_cache_ptr + (block * stride_vb + row * stride_vs + kv_head * stride_vh)[:, None]
                    + dims[None, :] * stride_vd, mask=kv_ok, other=0.0)
        m_i, l_i, acc = attend_tile(q, k, v, in_range, m_i, l_i, acc, qk_scale, PRECISION, DOT_UPCAST)
    # States [B, Hq, num_splits] and [B, Hq, num_splits, BLOCK_D], fp32, contiguous.
    state = (batch * n_kv_heads * group + heads).to(tl.int64) * num_splits + split
    tl.store(m_ptr + state, m_i, mask=head_ok)
    tl.store(l_ptr + state, l_i, mask=head_ok)
    tl.store(acc_ptr + state[:, None] * BLOCK_D + dims[None, :], acc, mask=head_ok[:, None])


def _check_pool(k_cache: torch.Tensor, v_cache: torch.Tensor, n_kv_heads: int, head_dim: int) -> tuple[int, int]:
    """k_cache, v_cache of one shape [num_blocks, block_size, Hkv, D]; returns (num_blocks, block_size)."""
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} "
                         f"and {tuple(v_cache.shape)}")
    if tuple(k_cache.shape[2:]) != (n_kv_heads, head_dim):
        raise ValueError(f"cache shape {tuple(k_cache.shape)} does not match [num_blocks, block_size, "
                         f"{n_kv_heads}, {head_dim}]")
    if k_cache.shape[0] == 0 or k_cache.shape[1] == 0:
        raise ValueError(f"the pool holds no slots: cache shape {tuple(k_cache.shape)}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head dim must be in 1..{MAX_HEAD_DIM}, got {head_dim}")
    return k_cache.shape[0], k_cache.shape[1]


def _check_index(name: str, t, dtype: torch.dtype, ndim: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the other inputs on {device}")


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, *, check_values: bool = True) -> None:
    """Write k, v [N, Hkv, D] into k_cache, v_cache [num_blocks, block_size, Hkv, D] in place.

    Token i goes to slot slot_mapping[i] (int64 [N]), i.e. block slot // block_size, row
    slot % block_size; slot -1 skips the token. All four tensors share one float dtype and device;
    any strides. Two tokens with the same slot leave either one's values. check_values reads the
    slots on the host (a device sync) to reject slots outside [-1, num_blocks * block_size).
    """
    device = checks.check_tensors({"k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache},
                                  {"k": 3, "v": 3, "k_cache": 4, "v_cache": 4})
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    n_tokens, n_kv_heads, head_dim = k.shape
    num_blocks, block_size = _check_pool(k_cache, v_cache, n_kv_heads, head_dim)
    _check_index("slot_mapping", slot_mapping, torch.int64, 1, device)
    if slot_mapping.shape[0] != n_tokens:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {n_tokens} tokens")
    if n_tokens == 0:
        return
    if check_values:
        low, high = torch.aminmax(slot_mapping)
        if low.item() < -1 or high.item() >= num_blocks * block_size:
            raise ValueError(f"slots must lie in [-1, {num_blocks * block_size}) (num_blocks * block_size), "
                             f"got {low.item()}..{high.item()}")
    _store_kv_kernel[(n_tokens,)](k, v, k_cache, v_cache, slot_mapping, *k.stride(), *v.stride(),
                                  *k_cache.stride(), *v_cache.stride(), head_dim, n_kv_heads * head_dim,
                                  block_size, BLOCK=triton.next_power_of_2(n_kv_heads * head_dim))


def _check_tables(block_tables: torch.Tensor, context_lens: torch.Tensor, num_blocks: int, block_size: int) -> None:
    """Every context length in 1..capacity and every block it reaches in [0, num_blocks) (one sync)."""
    capacity = block_tables.shape[1] * block_size
    needed = torch.arange(block_tables.shape[1], device=block_tables.device) * block_size < context_lens[:, None]
    used = torch.where(needed, block_tables, 0)
    low_len, high_len, low_block, high_block = torch.stack(
        [context_lens.min(), context_lens.max(), used.min(), used.max()]).tolist()
    if low_len < 1:
        raise ValueError(f"every context length must be at least 1, got {low_len}")
    if high_len > capacity:
        raise ValueError(f"context length {high_len} exceeds the block table's capacity "
                         f"({block_tables.shape[1]} blocks x {block_size} = {capacity} tokens)")
    if low_block < 0 or high_block >= num_blocks:
        raise ValueError(f"block tables reach block ids {low_block}..{high_block} within the context; "
                         f"valid ids are 0..{num_blocks - 1} (-1 only past the context)")


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, sm_scale: float | None = None,
                           *, num_splits: int | None = None, check_values: bool = True) -> torch.Tensor:
    """softmax(q k^T * sm_scale) v for one query per sequence, keys read through block tables.

    q [B, Hq, D]; k_cache, v_cache [num_blocks, block_size, Hkv, D], Hq % Hkv == 0 (query head h
    reads K/V head h // (Hq / Hkv)), one float dtype, D in 1..256, any strides; block_tables int32
    [B, max_blocks] padded with -1; context_lens int32 [B]: sequence b attends to its positions
    0 .. context_lens[b] - 1. num_splits >= 1 splits each sequence's keys (default: a heuristic).
    check_values reads the lengths and tables on the host (one device sync) to reject a length of
    0 or beyond the table, or a block id out of the pool. Returns [B, Hq, D] in q's dtype.
    """
    device = checks.check_tensors({"q": q, "k_cache": k_cache, "v_cache": v_cache},
                                  {"q": 3, "k_cache": 4, "v_cache": 4})
    batch, n_q_heads, head_dim = q.shape
    n_kv_heads = k_cache.shape[2]
    if n_kv_heads == 0 or n_q_heads % n_kv_heads:
        raise ValueError(f"query heads ({n_q_heads}) must be a multiple of K/V heads ({n_kv_heads})")
    num_blocks, block_size = _check_pool(k_cache, v_cache, n_kv_heads, head_dim)
    _check_index("block_tables", block_tables, torch.int32, 2, device)
    _check_index("context_lens", context_lens, torch.int32, 1, device)
    if block_tables.shape[0] != batch or context_lens.shape[0] != batch:
        raise ValueError(f"block_tables {tuple(block_tables.shape)} and context_lens {tuple(context_lens.shape)} "
                         f"need one row per sequence of q ({batch})")
    if batch == 0:
        raise ValueError("paged decode attention needs at least one sequence")
    if block_tables.shape[1] == 0:
        raise ValueError("block_tables has no columns: no sequence can hold a key")
    if check_values:
        _check_tables(block_tables, context_lens, num_blocks, block_size)
    if num_splits is None:
        num_splits = default_num_splits(batch, n_kv_heads, block_tables.shape[1] * block_size, device)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    group = n_q_heads // n_kv_heads
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    block_d = max(16, triton.next_power_of_2(head_dim))          # tl.dot needs >= 16 on each side
    m = checks.empty((batch, n_q_heads, num_splits), torch.float32, device)
    l = checks.empty((batch, n_q_heads, num_splits), torch.float32, device)
    acc = checks.empty((batch, n_q_heads, num_splits, block_d), torch.float32, device)
    _paged_split_kernel[(batch * n_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, m, l, acc, *q.stride(), *k_cache.stride(),
        *v_cache.stride(), *block_tables.stride(), context_lens.stride(0),
        n_kv_heads, group, head_dim, block_size, num_splits, scale * LOG2E,
        BLOCK_D=block_d, BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=BLOCK_N, **dot_options(q.dtype))
    out = checks.empty(q.shape, q.dtype, device)
    merge_kernel[(batch * n_q_heads,)](m, l, acc, out, *out.stride(), n_q_heads, num_splits, head_dim,
                                       BLOCK_D=block_d, BLOCK_S=triton.next_power_of_2(num_splits))
    return out
