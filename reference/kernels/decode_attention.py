"""Flash decoding: attention of one new query per sequence, split over the keys (split-K).

Why split. At decode time each sequence has one query row per head, so flash attention's grid
(query tiles x heads) is B x Hq programs: at batch 1 with 9 heads, 9 programs on a GPU with
132 multiprocessors, each streaming the whole cache alone. Decode attention is memory-bound:
it must read K and V once, 2 N Hkv D element bytes per sequence (N = 4096, Hkv = 3, D = 64,
fp16: 3 MiB per layer), and the only question is how many programs share that read. Splitting
the N keys into `num_splits` chunks gives B x Hkv x num_splits programs; each one reduces its
chunk to a partial softmax state (m, l, acc) per query head, and a second small kernel merges
the states (the merge of `torch_reference.merge_softmax_states`). The extra traffic is the
states themselves, num_splits x (D + 2) fp32 numbers per query head, small next to K and V.

GQA: one program serves all Hq / Hkv query heads that share a K/V head, so each K/V element is
read from HBM once, not once per query head. The group's query rows form the M side of a
tl.dot (padded to 16 rows, the smallest tile tl.dot accepts).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from reference.kernels import checks
from reference.kernels.checks import INTERPRETED
from reference.kernels.flash_attention import LOG2E, dot_options

GPU_BLOCK_N = 64                         # keys per tile inside a split on a GPU
BLOCK_N = 16 if INTERPRETED else GPU_BLOCK_N


@triton.jit
def attend_tile(q, k, v, in_range, m_i, l_i, acc, qk_scale,
                PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """One key tile of the online softmax, for the split-K decode kernels here and in
    paged_attention.py (they differ only in where k and v come from).

    q [BLOCK_H, D] (pre-upcast when DOT_UPCAST), k and v [BLOCK_N, D] as loaded (their dtype
    is the input's), in_range [BLOCK_N] marks real keys; the state m_i, l_i [BLOCK_H] and
    acc [BLOCK_H, D] is fp32, scores in base 2 (qk_scale includes log2 e). Returns the new state:
    m grows to the tile's max, l and acc are rescaled by exp2(m_old - m_new) before the tile adds in.
    """
    if DOT_UPCAST:  # see flash_attention.dot_options
        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision=PRECISION)
    else:
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    s = tl.where(in_range[None, :], s * qk_scale, float("-inf"))                 # [BLOCK_H, BLOCK_N]
    m_new = tl.maximum(m_i, tl.max(s, axis=1))              # finite: each tile has a key in range
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    p_in = p.to(v.dtype)                                          # P V in the input dtype
    if DOT_UPCAST:
        pv = tl.dot(p_in.to(tl.float32), v.to(tl.float32), input_precision=PRECISION)
    else:
        pv = tl.dot(p_in, v, input_precision=PRECISION)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, acc_ptr,
                  stride_qb, stride_qh, stride_qd,
                  stride_kb, stride_kh, stride_kn, stride_kd,
                  stride_vb, stride_vh, stride_vn, stride_vd,
                  n_kv_heads, group, n_keys, chunk, num_splits, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                  PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """Program (batch * kv_head, split): the state of keys [split * chunk, (split + 1) * chunk)."""
    batch = tl.program_id(0) // n_kv_heads
    kv_head = tl.program_id(0) % n_kv_heads
    split = tl.program_id(1)
    heads = kv_head * group + tl.arange(0, BLOCK_H)              # the query heads of this group
    head_ok = tl.arange(0, BLOCK_H) < group
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + batch.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                mask=head_ok[:, None], other=0.0)
    if DOT_UPCAST:
        q = q.to(tl.float32)
    k_base = k_ptr + batch.to(tl.int64) * stride_kb + kv_head * stride_kh
    v_base = v_ptr + batch.to(tl.int64) * stride_vb + kv_head * stride_vh

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)                       # start >= end: an empty split
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        in_range = cols < end
        k = tl.load(k_base + cols[:, None] * stride_kn + dims[None, :] * stride_kd, mask=in_range[:, None], other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + dims[None, :] * stride_vd, mask=in_range[:, None], other=0.0)
        m_i, l_i, acc = attend_tile(q, k, v, in_range, m_i, l_i, acc, qk_scale, PRECISION, DOT_UPCAST)
    # States [B, Hq, num_splits] and [B, Hq, num_splits, D], fp32, contiguous.
    state = (batch * n_kv_heads * group + heads).to(tl.int64) * num_splits + split
    tl.store(m_ptr + state, m_i, mask=head_ok)
    tl.store(l_ptr + state, l_i, mask=head_ok)
    tl.store(acc_ptr + state[:, None] * HEAD_DIM + dims[None, :], acc, mask=head_ok[:, None])


@triton.jit
def merge_kernel(m_ptr, l_ptr, acc_ptr, out_ptr,
                 stride_ob, stride_oh, stride_od,
                 n_q_heads, num_splits, head_dim,
                 BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Program (batch * q_head): merge its num_splits states into the
    output row.

    acc rows are BLOCK_D wide (head_dim padded to a power of 2); only
    head_dim columns are written.
    """
    row = tl.program_id(0).to(tl.int64)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    ok = splits < num_splits
    states = row * num_splits + splits
    m = tl.load(m_ptr + states, mask=ok, other=float("-inf"))
    l = tl.load(l_ptr + states, mask=ok, other=0.0)
    acc = tl.load(acc_ptr + states[:, None] * BLOCK_D + dims[None, :],
                  mask=ok[:, None], other=0.0)
    m_all = tl.max(m, axis=0)              # finite: some split holds keys
    weight = tl.exp2(m - m_all)            # 0 for empty splits (m = -inf)
    out = tl.sum(weight[:, None] * acc, axis=0) / tl.sum(weight * l, axis=0)
    batch, head = row // n_q_heads, row % n_q_heads
    out_row = out_ptr + batch * stride_ob + head * stride_oh
    tl.store(out_row + dims * stride_od, out.to(out_ptr.dtype.element_ty),
             mask=dims < head_dim)


def default_num_splits(batch: int, n_kv_heads: int, n_keys: int, device: torch.device) -> int:
    """Enough programs to cover the GPU about twice, never more splits than key tiles."""
    programs = 2 * torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(triton.cdiv(programs, batch * n_kv_heads), triton.cdiv(n_keys, BLOCK_N)))


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, num_splits: int | None = None,
                     sm_scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * sm_scale) v for one query per sequence, split over the keys.

    q [B, Hq, D], k and v [B, Hkv, N, D] (any strides), one float dtype, D in {16, 32, 64, 128},
    Hq % Hkv == 0, N >= 1. num_splits >= 1 (default: a heuristic); any value gives the same
    result up to rounding, splits beyond N simply hold no keys. Returns [B, Hq, D] in q's dtype.
    """
    checks.check_tensors({"q": q, "k": k, "v": v}, {"q": 3, "k": 4, "v": 4})
    batch, n_q_heads, head_dim = q.shape
    n_kv_heads, n_keys = checks.check_kv(q, k, v)
    if n_keys == 0:
        raise ValueError("decode attention needs at least one key")
    if num_splits is None:
        num_splits = default_num_splits(batch, n_kv_heads, n_keys, q.device)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    group = n_q_heads // n_kv_heads
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    m = checks.empty((batch, n_q_heads, num_splits), torch.float32, q.device)
    l = checks.empty((batch, n_q_heads, num_splits), torch.float32, q.device)
    acc = checks.empty((batch, n_q_heads, num_splits, head_dim), torch.float32, q.device)
    _split_kernel[(batch * n_kv_heads, num_splits)](
        q, k, v, m, l, acc, *q.stride(), *k.stride(), *v.stride(),
        n_kv_heads, group, n_keys, triton.cdiv(n_keys, num_splits), num_splits, scale * LOG2E,
        HEAD_DIM=head_dim, BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=BLOCK_N,
        **dot_options(q.dtype))
    out = checks.empty(q.shape, q.dtype, q.device)
    merge_kernel[(batch * n_q_heads,)](m, l, acc, out, *out.stride(), n_q_heads, num_splits, head_dim,
                                        BLOCK_D=head_dim, BLOCK_S=triton.next_power_of_2(num_splits))
    return out
