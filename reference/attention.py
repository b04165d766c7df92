"""One attention function for MHA, GQA and MQA (and for absorbed MLA, which is MQA over a latent).

Grouped-query attention lets ``group = H_q / H_kv`` query heads share one K/V head. Copying each
K/V head ``group`` times (``repeat_interleave``) would rebuild the memory the cache just saved.
Instead the queries of one group are stacked as extra *rows*: q [B, H_q, T_q, D] is viewed as
[B, H_kv, group * T_q, D], and every K/V head is multiplied once by all the queries that use it.
No K or V element is copied; MHA is ``group == 1`` and MQA is ``H_kv == 1``.

`paged_attention` is the same computation for the serving engine (chapter 08): keys and values sit
in a pool of fixed-size blocks and each sequence reads its own through a block table.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import functional as F



def grouped_query_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
                            scale: float | None = None) -> Tensor:
    """softmax(q kᵀ * scale) v with K/V heads shared by consecutive query heads.

    q: [B, H_q, T_q, D]; k: [B, H_kv, T_k, D]; v: [B, H_kv, T_k, D_v]; H_q a multiple of H_kv.
    Query head h reads K/V head h // (H_q / H_kv). scale defaults to 1/sqrt(D).
    causal: the T_q queries are the *last* T_q of the T_k positions (a prefill when T_q == T_k,
    one decode step when T_q == 1), and query i sees keys 0 .. T_k - T_q + i.
    Returns [B, H_q, T_q, D_v] in q's dtype (scores and softmax in at least float32).
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-d [B, H, T, D]; got {q.dim()}-d, {k.dim()}-d, {v.dim()}-d")
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"{Hq} query heads cannot be split evenly over {Hkv} K/V heads")
    if k.shape != (B, Hkv, Tk, D) or v.shape[:3] != (B, Hkv, Tk):
        raise ValueError(f"shapes do not match: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}")
    if causal and Tq > Tk:
        raise ValueError(f"causal attention needs T_q <= T_k, got {Tq} queries over {Tk} keys")
    group = Hq // Hkv
    compute = torch.promote_types(q.dtype, torch.float32)
    rows = q.reshape(B, Hkv, group * Tq, D).to(compute)          # a view when q is contiguous
    scores = rows @ k.to(compute).transpose(-1, -2)              # [B, H_kv, group * T_q, T_k]
    scores = scores * (scale if scale is not None else 1.0 / math.sqrt(D))
    if causal:
        offset = Tk - Tq
        allowed = torch.arange(Tk, device=q.device)[None, :] <= torch.arange(Tq, device=q.device)[:, None] + offset
        scores = scores.view(B, Hkv, group, Tq, Tk).masked_fill(~allowed, float("-inf")).view_as(scores)
    out = torch.softmax(scores, dim=-1) @ v.to(compute)          # [B, H_kv, group * T_q, D_v]
    return out.reshape(B, Hq, Tq, v.shape[-1]).to(q.dtype)


def repeat_kv(x: Tensor, group: int) -> Tensor:
    """[B, H_kv, T, D] -> [B, H_kv * group, T, D], each head repeated ``group`` times (a copy).

    What GQA avoids; kept to show the equivalence (tests, book)."""
    return x.repeat_interleave(group, dim=1)



def gather_blocks(cache: Tensor, blocks: Tensor) -> Tensor:
    """Keys (or values) of whole blocks, read through a block table.

    cache: one layer of the paged pool [num_blocks, block_size, H_kv, D]; blocks [..., m] int64
    block ids (no padding: the caller clamps -1 to a real block and masks those keys out).
    Returns [..., m * block_size, H_kv, D], a copy: position p of a row is its block p // block_size,
    slot p % block_size. Copying whole blocks (12 KiB each for SmolLM2) is ~3x faster on a CPU
    than gathering the same keys one slot at a time.
    """
    out = cache.index_select(0, blocks.reshape(-1))
    return out.view(*blocks.shape[:-1], -1, *cache.shape[2:])


def table_prefix(block_tables: Tensor, n_keys: int, block_size: int) -> Tensor:
    """The first ceil(n_keys / block_size) entries of each block table, as int64 block ids with
    -1 padding replaced by block 0 (its keys are masked out by the caller): [B, m]."""
    return block_tables[:, :-(-n_keys // block_size)].long().clamp_min(0)


def additive_mask(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool mask (True = key visible) as the 0 / -inf scores SDPA adds, made once per step:
    SDPA would otherwise convert the bool mask itself in every layer (the same values)."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))


class PagedPlan:
    """What `paged_attention` needs that is the same in every layer of a step, computed once:
    the query rows of the batched decodes and either their tables and lengths (for a
    `decode_kernel` that reads the pool in place: q [B', H, D], k_cache, v_cache, tables int32
    [B', M], lengths int32 [B'] -> [B', H, D], as `reference.cpu.native_attention.paged_decode`)
    or their key blocks and padding mask (for the gather), and per prefill chunk its rows, blocks
    and causal mask (masks additive, in the queries' dtype). Arguments as in `paged_attention`
    (q and k_cache: any layer's)."""

    def __init__(self, block_tables: Tensor, context_lens: Tensor, query_lens: list[int], q: Tensor,
                 k_cache: Tensor, decode_kernel=None):
        device, dtype, block_size = block_tables.device, q.dtype, k_cache.shape[1]
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        lens = [int(n) for n in context_lens.tolist()]
        decode = [b for b, n in enumerate(query_lens) if n == 1]
        self.decode_only = len(decode) == len(query_lens)   # then the decode rows are all N rows, in order
        self.decode_rows = self.decode_blocks = self.decode_mask = None
        self.decode_kernel = decode_kernel if decode else None
        if self.decode_kernel is not None:
            self.decode_tables = block_tables[decode].to(torch.int32).contiguous()        # [B', M]
            self.decode_lens = context_lens[decode].to(torch.int32).contiguous()          # [B']
        if decode:
            self.decode_rows = torch.tensor([starts[b] for b in decode], device=device)
        if decode and self.decode_kernel is None:
            longest = max(lens[b] for b in decode)
            self.decode_blocks = table_prefix(block_tables[decode], longest, block_size)   # [B', m]
            keys = self.decode_blocks.shape[1] * block_size
            visible = torch.arange(keys, device=device)[None, :] < context_lens[decode, None]
            self.decode_mask = additive_mask(visible, dtype)[:, None, None, :]            # [B', 1, 1, L]
        self.chunks = []     # per prefill chunk: (first row, last row + 1, blocks [m], mask [n, L] or None)
        for b, n in enumerate(query_lens):
            if n > 1:
                length = lens[b]
                blocks = table_prefix(block_tables[b:b + 1], length, block_size)[0]
                if n == length:   # a whole prompt: SDPA's own causal mask, no additive one to add
                    self.chunks.append((starts[b], starts[b + 1], blocks, None))
                    continue
                query_positions = torch.arange(length - n, length, device=device)
                keys = torch.arange(blocks.shape[0] * block_size, device=device)
                visible = keys[None, :] <= query_positions[:, None]   # causal; past the end: masked
                self.chunks.append((starts[b], starts[b + 1], blocks, additive_mask(visible, dtype)))


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                    context_lens: Tensor, query_lens: list[int], plan: PagedPlan | None = None) -> Tensor:
    """Causal attention for ragged sequences whose keys and values sit in a paged pool.

    q [N, H, D]: the new queries of B sequences, concatenated (query_lens[b] of them for sequence
    b); they are the *last* query_lens[b] of that sequence's context_lens[b] positions, whose K/V
    are already in the pool. k_cache, v_cache [num_blocks, block_size, H_kv, D]; block_tables
    [B, M]; context_lens [B]. Returns [N, H, D]. plan: a `PagedPlan` of these arguments, to reuse
    across layers (built here when None).

    Decode rows (one query each) run as one batched call: SDPA over keys gathered to the longest
    context, padding masked out (or the plan's `decode_kernel`). Each prefill chunk runs on
    its own (a Python loop over the few chunks of a step), so no query is padded to another
    sequence's length.
    """
    plan = plan or PagedPlan(block_tables, context_lens, query_lens, q, k_cache)
    if plan.decode_only:       # a pure decode step: no rows to pick out or scatter back
        return decode_rows_attention(q, k_cache, v_cache, plan)
    out = torch.empty_like(q)
    if plan.decode_rows is not None:
        out[plan.decode_rows] = decode_rows_attention(q[plan.decode_rows], k_cache, v_cache, plan)
    for first, last, blocks, mask in plan.chunks:
        k = gather_blocks(k_cache, blocks).transpose(0, 1)[None]       # [1, H_kv, L, D]
        v = gather_blocks(v_cache, blocks).transpose(0, 1)[None]
        chunk = q[first:last].transpose(0, 1)[None]                    # [1, H, n, D]
        o = F.scaled_dot_product_attention(chunk, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True)
        out[first:last] = o[0].transpose(0, 1)
    return out


def decode_rows_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: PagedPlan) -> Tensor:
    """The decode rows of a step: q [B', H, D] (row b: the plan's b-th decode sequence) -> [B', H, D].
    One SDPA call over the keys gathered to the longest context, the padding masked out (or the
    plan's `decode_kernel`, reading each key where it lies)."""
    if plan.decode_kernel is not None:
        return plan.decode_kernel(q, k_cache, v_cache, plan.decode_tables, plan.decode_lens)
    k = gather_blocks(k_cache, plan.decode_blocks).transpose(1, 2)      # [B', H_kv, L, D]
    v = gather_blocks(v_cache, plan.decode_blocks).transpose(1, 2)
    o = F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=plan.decode_mask, enable_gqa=True)
    return o[:, :, 0]                                                   # [B', H, 1, D] -> [B', H, D]
