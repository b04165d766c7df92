"""Known-wrong and cheating submissions for chapter 05 (see tests/test_selfcheck.py).

Each section is the body of one solution cell; none may earn the exercise's full points.
"""

# %% grade_id: tiled_attention | wrong: no max subtraction (exp overflows on large scores)
# expect: subtract the running max
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    """Attention computed tile by tile with a running softmax, never holding [Nq, Nk] scores.

    q: [B, H, Nq, D], k and v: [B, H, Nk, D], one floating dtype. Scores are q k^T / sqrt(D).
    causal: query i sees keys j <= i + (Nk - Nq) (the queries are the LAST Nq positions;
    the grader only asks for causal with Nq <= Nk).
    Loop over query tiles of block_q rows and, inside, over key/value tiles of block_k rows;
    the last tile of either may be shorter. Per query row keep the running max m, the sum
    l = sum exp(s - m) and the unnormalised output acc = sum exp(s - m) v over the keys seen.
    Returns (out [B, H, Nq, D], lse [B, H, Nq]) in q's dtype; lse = m + log(l), the natural
    log of sum_j exp(score_ij). softmax functions and scaled_dot_product_attention are forbidden.
    """
    batch, heads, n_q, dim = q.shape
    n_k = k.shape[2]
    scale = 1.0 / math.sqrt(dim)
    out, lse = torch.empty_like(q), q.new_empty(batch, heads, n_q)
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] * scale                        # [B, H, bq, D]
        rows = torch.arange(i, i + q_tile.shape[2])[:, None] + (n_k - n_q)
        m = q.new_full(q_tile.shape[:3], float("-inf"))
        l = torch.zeros_like(m)
        acc = torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)     # [B, H, bq, bk]
            if causal:
                cols = torch.arange(j, j + s.shape[-1])[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
            p = torch.exp(s)                                            # no max subtracted
            l = l + p.sum(-1)
            acc = acc + p @ v[:, :, j:j + block_k]
            m = torch.zeros_like(m)
        out[:, :, i:i + block_q] = acc / l[..., None]
        lse[:, :, i:i + block_q] = m + torch.log(l)
    return out, lse

# %% grade_id: tiled_attention | wrong: does not rescale l and acc when the max grows
# expect: multiply l and acc by exp(m_old - m_new)
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    """Attention computed tile by tile with a running softmax, never holding [Nq, Nk] scores.

    q: [B, H, Nq, D], k and v: [B, H, Nk, D], one floating dtype. Scores are q k^T / sqrt(D).
    causal: query i sees keys j <= i + (Nk - Nq) (the queries are the LAST Nq positions;
    the grader only asks for causal with Nq <= Nk).
    Loop over query tiles of block_q rows and, inside, over key/value tiles of block_k rows;
    the last tile of either may be shorter. Per query row keep the running max m, the sum
    l = sum exp(s - m) and the unnormalised output acc = sum exp(s - m) v over the keys seen.
    Returns (out [B, H, Nq, D], lse [B, H, Nq]) in q's dtype; lse = m + log(l), the natural
    log of sum_j exp(score_ij). softmax functions and scaled_dot_product_attention are forbidden.
    """
    batch, heads, n_q, dim = q.shape
    n_k = k.shape[2]
    scale = 1.0 / math.sqrt(dim)
    out, lse = torch.empty_like(q), q.new_empty(batch, heads, n_q)
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] * scale                        # [B, H, bq, D]
        rows = torch.arange(i, i + q_tile.shape[2])[:, None] + (n_k - n_q)
        m = q.new_full(q_tile.shape[:3], float("-inf"))
        l = torch.zeros_like(m)
        acc = torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)     # [B, H, bq, bk]
            if causal:
                cols = torch.arange(j, j + s.shape[-1])[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # no key seen yet
            alpha = torch.exp(m - safe)                                 # rescales the old sums
            p = torch.exp(s - safe[..., None])
            l = l + p.sum(-1)                                           # old sums not rescaled
            acc = acc + p @ v[:, :, j:j + block_k]
            m = m_new
        out[:, :, i:i + block_q] = acc / l[..., None]
        lse[:, :, i:i + block_q] = m + torch.log(l)
    return out, lse

# %% grade_id: tiled_attention | wrong: rescales l but not acc when the max grows
# expect: multiply acc (as well as l) by exp(m_old - m_new)
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    batch, heads, n_q, dim = q.shape
    n_k = k.shape[2]
    scale = 1.0 / math.sqrt(dim)
    out, lse = torch.empty_like(q), q.new_empty(batch, heads, n_q)
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] * scale                        # [B, H, bq, D]
        rows = torch.arange(i, i + q_tile.shape[2])[:, None] + (n_k - n_q)
        m = q.new_full(q_tile.shape[:3], float("-inf"))
        l = torch.zeros_like(m)
        acc = torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)     # [B, H, bq, bk]
            if causal:
                cols = torch.arange(j, j + s.shape[-1])[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # no key seen yet
            alpha = torch.exp(m - safe)                                 # rescales the old sums
            p = torch.exp(s - safe[..., None])
            l = l * alpha + p.sum(-1)
            acc = acc + p @ v[:, :, j:j + block_k]
            m = m_new
        out[:, :, i:i + block_q] = acc / l[..., None]
        lse[:, :, i:i + block_q] = m + torch.log(l)
    return out, lse

# %% grade_id: tiled_attention | wrong: causal diagonal off by one (a query does not see its own key)
# expect: off by one
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    """Attention computed tile by tile with a running softmax, never holding [Nq, Nk] scores.

    q: [B, H, Nq, D], k and v: [B, H, Nk, D], one floating dtype. Scores are q k^T / sqrt(D).
    causal: query i sees keys j <= i + (Nk - Nq) (the queries are the LAST Nq positions;
    the grader only asks for causal with Nq <= Nk).
    Loop over query tiles of block_q rows and, inside, over key/value tiles of block_k rows;
    the last tile of either may be shorter. Per query row keep the running max m, the sum
    l = sum exp(s - m) and the unnormalised output acc = sum exp(s - m) v over the keys seen.
    Returns (out [B, H, Nq, D], lse [B, H, Nq]) in q's dtype; lse = m + log(l), the natural
    log of sum_j exp(score_ij). softmax functions and scaled_dot_product_attention are forbidden.
    """
    batch, heads, n_q, dim = q.shape
    n_k = k.shape[2]
    scale = 1.0 / math.sqrt(dim)
    out, lse = torch.empty_like(q), q.new_empty(batch, heads, n_q)
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] * scale                        # [B, H, bq, D]
        rows = torch.arange(i, i + q_tile.shape[2])[:, None] + (n_k - n_q)
        m = q.new_full(q_tile.shape[:3], float("-inf"))
        l = torch.zeros_like(m)
        acc = torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)     # [B, H, bq, bk]
            if causal:
                cols = torch.arange(j, j + s.shape[-1])[None, :]
                s = s.masked_fill(cols >= rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # no key seen yet
            alpha = torch.exp(m - safe)                                 # rescales the old sums
            p = torch.exp(s - safe[..., None])
            l = l * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + p @ v[:, :, j:j + block_k]
            m = m_new
        out[:, :, i:i + block_q] = acc / l[..., None]
        lse[:, :, i:i + block_q] = m + torch.log(l)
    return out, lse

# %% grade_id: tiled_attention | cheat: the whole score matrix at once with torch.logsumexp, no tiles
# expect: which this exercise forbids
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.arange(n_k)[None, :] > torch.arange(n_q)[:, None] + n_k - n_q,
                          float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


# %% grade_id: tiled_attention | cheat: the whole score matrix at once, normalised by hand, no tiles
# expect: The whole [Nq, Nk] score matrix
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.arange(n_k)[None, :] > torch.arange(n_q)[:, None] + n_k - n_q,
                          float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    return p @ v / l, (m + torch.log(l)).squeeze(-1)


# %% grade_id: tiled_attention | cheat: SDPA through an alias fetched by name
# expect: is forbidden
import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    """Plain attention by another name."""
    attend = getattr(torch.nn.functional, "scaled_dot_" + "product_attention")
    out = attend(q, k, v, is_causal=False, attn_mask=_mask(q, k) if causal else None)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        scores = scores.masked_fill(~_mask(q, k), float("-inf"))
    top = scores.amax(-1, keepdim=True)
    return out, (top + torch.log(torch.exp(scores - top).sum(-1, keepdim=True))).squeeze(-1)


def _mask(q, k):
    n_q, n_k = q.shape[2], k.shape[2]
    return torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + (n_k - n_q)

# %% grade_id: tiled_attention | cheat: imports the reference implementation
# expect: is not allowed
from reference.kernels.torch_reference import tiled_attention as _tiled


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    return _tiled(q, k, v, causal=causal, block_m=block_q, block_n=block_k)

# %% grade_id: flash_attention_fwd_kernel | wrong: does not rescale the accumulator when the max grows
# expect: exp(m_old - m_new)
import triton
import triton.language as tl


@triton.jit
def flash_attention_fwd_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
                               stride_qh, stride_qm, stride_kh, stride_kn,
                               stride_vh, stride_vn, stride_oh, stride_om,
                               n_queries, n_keys, group, sm_scale,
                               CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Flash attention forward: one program per (query tile, query head).

    Tensors (float32, last dimension contiguous, i.e. stride 1 along HEAD_DIM):
      q_ptr   [H_q, n_queries, HEAD_DIM]   queries; batch and heads flattened into H_q rows
      k_ptr   [H_kv, n_keys, HEAD_DIM]     keys, H_kv = H_q // group
      v_ptr   [H_kv, n_keys, HEAD_DIM]     values
      out_ptr [H_q, n_queries, HEAD_DIM]   output, written by this kernel
      lse_ptr [H_q, n_queries]             contiguous; log-sum-exp (natural log) of each row's scores
    stride_xh, stride_xm / stride_xn: element strides between heads and between rows of x
      (they need not equal n * HEAD_DIM and HEAD_DIM: use them).
    n_queries, n_keys: lengths (any positive ints, not necessarily multiples of the blocks).
    group: query heads per K/V head (grouped-query attention); query head h reads K/V head
      h // group.
    sm_scale: the softmax scale (1 / sqrt(HEAD_DIM)); scores are (q . k) * sm_scale.
    CAUSAL: query i sees keys j <= i + (n_keys - n_queries) only (the launcher guarantees
      n_queries <= n_keys).
    HEAD_DIM, BLOCK_M, BLOCK_N: head dimension, query rows per program, keys per inner step
      (powers of two, at least 16).
    Grid: (cdiv(n_queries, BLOCK_M), H_q); program (t, h) writes rows t*BLOCK_M ... of head h.
    """
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    kv_head = head // group
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < n_queries
    q = tl.load(q_ptr + head * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offset = n_keys - n_queries
    end = n_keys
    if CAUSAL:
        end = tl.minimum(n_keys, start_m + BLOCK_M + offset)   # later key tiles are all masked
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < n_keys
        k = tl.load(k_ptr + kv_head * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                    mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale                   # [BLOCK_M, BLOCK_N]
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))              # finite: key 0 is in tile 0
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_head * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                    mask=col_ok[:, None], other=0.0)
        acc = acc + tl.dot(p, v)                                # acc not rescaled
        m_i = m_new
    tl.store(out_ptr + head * stride_oh + rows[:, None] * stride_om + dims[None, :],
             acc / l_i[:, None], mask=row_ok[:, None])
    tl.store(lse_ptr + head * n_queries + rows, m_i + tl.log(l_i), mask=row_ok)

# %% grade_id: flash_attention_fwd_kernel | wrong: causal diagonal off by one
# expect: off by one
import triton
import triton.language as tl


@triton.jit
def flash_attention_fwd_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
                               stride_qh, stride_qm, stride_kh, stride_kn,
                               stride_vh, stride_vn, stride_oh, stride_om,
                               n_queries, n_keys, group, sm_scale,
                               CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Flash attention forward: one program per (query tile, query head).

    Tensors (float32, last dimension contiguous, i.e. stride 1 along HEAD_DIM):
      q_ptr   [H_q, n_queries, HEAD_DIM]   queries; batch and heads flattened into H_q rows
      k_ptr   [H_kv, n_keys, HEAD_DIM]     keys, H_kv = H_q // group
      v_ptr   [H_kv, n_keys, HEAD_DIM]     values
      out_ptr [H_q, n_queries, HEAD_DIM]   output, written by this kernel
      lse_ptr [H_q, n_queries]             contiguous; log-sum-exp (natural log) of each row's scores
    stride_xh, stride_xm / stride_xn: element strides between heads and between rows of x
      (they need not equal n * HEAD_DIM and HEAD_DIM: use them).
    n_queries, n_keys: lengths (any positive ints, not necessarily multiples of the blocks).
    group: query heads per K/V head (grouped-query attention); query head h reads K/V head
      h // group.
    sm_scale: the softmax scale (1 / sqrt(HEAD_DIM)); scores are (q . k) * sm_scale.
    CAUSAL: query i sees keys j <= i + (n_keys - n_queries) only (the launcher guarantees
      n_queries <= n_keys).
    HEAD_DIM, BLOCK_M, BLOCK_N: head dimension, query rows per program, keys per inner step
      (powers of two, at least 16).
    Grid: (cdiv(n_queries, BLOCK_M), H_q); program (t, h) writes rows t*BLOCK_M ... of head h.
    """
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    kv_head = head // group
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < n_queries
    q = tl.load(q_ptr + head * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offset = n_keys - n_queries
    end = n_keys
    if CAUSAL:
        end = tl.minimum(n_keys, start_m + BLOCK_M + offset)   # later key tiles are all masked
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < n_keys
        k = tl.load(k_ptr + kv_head * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                    mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale                   # [BLOCK_M, BLOCK_N]
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] < rows[:, None] + offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))              # finite: key 0 is in tile 0
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_head * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                    mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    tl.store(out_ptr + head * stride_oh + rows[:, None] * stride_om + dims[None, :],
             acc / l_i[:, None], mask=row_ok[:, None])
    tl.store(lse_ptr + head * n_queries + rows, m_i + tl.log(l_i), mask=row_ok)

# %% grade_id: flash_attention_fwd_kernel | wrong: drops the tail key tile when n_keys is not a multiple of BLOCK_N
# expect: partial key tile was skipped
import triton
import triton.language as tl


@triton.jit
def flash_attention_fwd_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
                               stride_qh, stride_qm, stride_kh, stride_kn,
                               stride_vh, stride_vn, stride_oh, stride_om,
                               n_queries, n_keys, group, sm_scale,
                               CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Flash attention forward: one program per (query tile, query head).

    Tensors (float32, last dimension contiguous, i.e. stride 1 along HEAD_DIM):
      q_ptr   [H_q, n_queries, HEAD_DIM]   queries; batch and heads flattened into H_q rows
      k_ptr   [H_kv, n_keys, HEAD_DIM]     keys, H_kv = H_q // group
      v_ptr   [H_kv, n_keys, HEAD_DIM]     values
      out_ptr [H_q, n_queries, HEAD_DIM]   output, written by this kernel
      lse_ptr [H_q, n_queries]             contiguous; log-sum-exp (natural log) of each row's scores
    stride_xh, stride_xm / stride_xn: element strides between heads and between rows of x
      (they need not equal n * HEAD_DIM and HEAD_DIM: use them).
    n_queries, n_keys: lengths (any positive ints, not necessarily multiples of the blocks).
    group: query heads per K/V head (grouped-query attention); query head h reads K/V head
      h // group.
    sm_scale: the softmax scale (1 / sqrt(HEAD_DIM)); scores are (q . k) * sm_scale.
    CAUSAL: query i sees keys j <= i + (n_keys - n_queries) only (the launcher guarantees
      n_queries <= n_keys).
    HEAD_DIM, BLOCK_M, BLOCK_N: head dimension, query rows per program, keys per inner step
      (powers of two, at least 16).
    Grid: (cdiv(n_queries, BLOCK_M), H_q); program (t, h) writes rows t*BLOCK_M ... of head h.
    """
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    kv_head = head // group
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < n_queries
    q = tl.load(q_ptr + head * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offset = n_keys - n_queries
    end = n_keys
    if CAUSAL:
        end = tl.minimum(n_keys, start_m + BLOCK_M + offset)   # later key tiles are all masked
    for start_n in range(0, end // BLOCK_N * BLOCK_N, BLOCK_N):   # whole tiles only
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < n_keys
        k = tl.load(k_ptr + kv_head * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                    mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale                   # [BLOCK_M, BLOCK_N]
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))              # finite: key 0 is in tile 0
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_head * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                    mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    tl.store(out_ptr + head * stride_oh + rows[:, None] * stride_om + dims[None, :],
             acc / l_i[:, None], mask=row_ok[:, None])
    tl.store(lse_ptr + head * n_queries + rows, m_i + tl.log(l_i), mask=row_ok)

# %% grade_id: flash_attention_fwd_kernel | wrong: ignores GQA: reads K/V head h for query head h
# expect: h // group
import triton
import triton.language as tl


@triton.jit
def flash_attention_fwd_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
                               stride_qh, stride_qm, stride_kh, stride_kn,
                               stride_vh, stride_vn, stride_oh, stride_om,
                               n_queries, n_keys, group, sm_scale,
                               CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Flash attention forward: one program per (query tile, query head).

    Tensors (float32, last dimension contiguous, i.e. stride 1 along HEAD_DIM):
      q_ptr   [H_q, n_queries, HEAD_DIM]   queries; batch and heads flattened into H_q rows
      k_ptr   [H_kv, n_keys, HEAD_DIM]     keys, H_kv = H_q // group
      v_ptr   [H_kv, n_keys, HEAD_DIM]     values
      out_ptr [H_q, n_queries, HEAD_DIM]   output, written by this kernel
      lse_ptr [H_q, n_queries]             contiguous; log-sum-exp (natural log) of each row's scores
    stride_xh, stride_xm / stride_xn: element strides between heads and between rows of x
      (they need not equal n * HEAD_DIM and HEAD_DIM: use them).
    n_queries, n_keys: lengths (any positive ints, not necessarily multiples of the blocks).
    group: query heads per K/V head (grouped-query attention); query head h reads K/V head
      h // group.
    sm_scale: the softmax scale (1 / sqrt(HEAD_DIM)); scores are (q . k) * sm_scale.
    CAUSAL: query i sees keys j <= i + (n_keys - n_queries) only (the launcher guarantees
      n_queries <= n_keys).
    HEAD_DIM, BLOCK_M, BLOCK_N: head dimension, query rows per program, keys per inner step
      (powers of two, at least 16).
    Grid: (cdiv(n_queries, BLOCK_M), H_q); program (t, h) writes rows t*BLOCK_M ... of head h.
    """
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    kv_head = head                                          # GQA ignored
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < n_queries
    q = tl.load(q_ptr + head * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offset = n_keys - n_queries
    end = n_keys
    if CAUSAL:
        end = tl.minimum(n_keys, start_m + BLOCK_M + offset)   # later key tiles are all masked
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < n_keys
        k = tl.load(k_ptr + kv_head * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                    mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale                   # [BLOCK_M, BLOCK_N]
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))              # finite: key 0 is in tile 0
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_head * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                    mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    tl.store(out_ptr + head * stride_oh + rows[:, None] * stride_om + dims[None, :],
             acc / l_i[:, None], mask=row_ok[:, None])
    tl.store(lse_ptr + head * n_queries + rows, m_i + tl.log(l_i), mask=row_ok)

# %% grade_id: flash_attention_fwd_kernel | cheat: loads all of K in one fixed 64-key tile (fits the small test shapes)
# expect: tl.arange must span
import triton
import triton.language as tl


@triton.jit
def flash_attention_fwd_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
                               stride_qh, stride_qm, stride_kh, stride_kn,
                               stride_vh, stride_vn, stride_oh, stride_om,
                               n_queries, n_keys, group, sm_scale,
                               CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Flash attention forward: one program per (query tile, query head).

    Tensors (float32, last dimension contiguous, i.e. stride 1 along HEAD_DIM):
      q_ptr   [H_q, n_queries, HEAD_DIM]   queries; batch and heads flattened into H_q rows
      k_ptr   [H_kv, n_keys, HEAD_DIM]     keys, H_kv = H_q // group
      v_ptr   [H_kv, n_keys, HEAD_DIM]     values
      out_ptr [H_q, n_queries, HEAD_DIM]   output, written by this kernel
      lse_ptr [H_q, n_queries]             contiguous; log-sum-exp (natural log) of each row's scores
    stride_xh, stride_xm / stride_xn: element strides between heads and between rows of x
      (they need not equal n * HEAD_DIM and HEAD_DIM: use them).
    n_queries, n_keys: lengths (any positive ints, not necessarily multiples of the blocks).
    group: query heads per K/V head (grouped-query attention); query head h reads K/V head
      h // group.
    sm_scale: the softmax scale (1 / sqrt(HEAD_DIM)); scores are (q . k) * sm_scale.
    CAUSAL: query i sees keys j <= i + (n_keys - n_queries) only (the launcher guarantees
      n_queries <= n_keys).
    HEAD_DIM, BLOCK_M, BLOCK_N: head dimension, query rows per program, keys per inner step
      (powers of two, at least 16).
    Grid: (cdiv(n_queries, BLOCK_M), H_q); program (t, h) writes rows t*BLOCK_M ... of head h.
    """
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    kv_head = head // group
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < n_queries
    q = tl.load(q_ptr + head * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offset = n_keys - n_queries
    end = n_keys
    if CAUSAL:
        end = tl.minimum(n_keys, start_m + BLOCK_M + offset)   # later key tiles are all masked
    for start_n in range(0, 1):                             # all keys in one 64-wide tile
        cols = tl.arange(0, 64)
        col_ok = cols < n_keys
        k = tl.load(k_ptr + kv_head * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                    mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale                   # [BLOCK_M, BLOCK_N]
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))              # finite: key 0 is in tile 0
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_head * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                    mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    tl.store(out_ptr + head * stride_oh + rows[:, None] * stride_om + dims[None, :],
             acc / l_i[:, None], mask=row_ok[:, None])
    tl.store(lse_ptr + head * n_queries + rows, m_i + tl.log(l_i), mask=row_ok)

# %% grade_id: flash_attention_fwd_kernel | cheat: not a kernel: imports the reference kernel module
# expect: no `def flash_attention_fwd_kernel`
import triton
import triton.language as tl

from reference.kernels.flash_attention import _flash_attention_kernel as flash_attention_fwd_kernel  # noqa: F401

# %% grade_id: flash_attention_fwd_kernel | cheat: not a kernel: an object that computes attention with torch when launched
# expect: no `def flash_attention_fwd_kernel`
import torch


class _Launcher:
    def __getitem__(self, grid):
        def run(q, k, v, out, lse, *args, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N):
            n_q, n_k, group, scale = args[-4:]
            kk = k[:, :n_k].repeat_interleave(group, 0)[:out.shape[0]]
            vv = v[:, :n_k].repeat_interleave(group, 0)[:out.shape[0]]
            s = q[:out.shape[0], :n_q] @ kk.transpose(1, 2) * scale
            if CAUSAL:
                s = s.masked_fill(torch.arange(n_k)[None, :] > torch.arange(n_q)[:, None] + n_k - n_q, float("-inf"))
            w = torch.exp(s - s.amax(-1, keepdim=True))
            out[:, :n_q] = (w / w.sum(-1, keepdim=True)) @ vv
            lse.copy_(torch.logsumexp(s, -1))
        return run


flash_attention_fwd_kernel = _Launcher()

# %% grade_id: flash_attention_fwd_kernel | cheat: the kernel calls a Python helper that walks the stack and computes with torch; a dead tl.dot satisfies the look for tl.dot
# expect: A kernel cell is Triton code
import sys

import torch
import triton
import triton.language as tl


def _answer_from_the_launcher():
    """Find the launch's tensors (and constexprs) in a caller's frame; write out and lse."""
    frame = sys._getframe()
    while frame is not None:
        values = list(frame.f_locals.values())
        meta = next((v for v in values if isinstance(v, dict) and "CAUSAL" in v), None)
        for value in values:
            if meta is not None and isinstance(value, (list, tuple)) and len(value) > 5 \
                    and all(isinstance(t, torch.Tensor) for t in value[:5]):
                q, k, v, out, lse = value[:5]
                n_q, n_k, group, scale = value[-4:]
                heads = lse.shape[0]
                kk = k[:, :n_k].repeat_interleave(group, 0)[:heads]
                vv = v[:, :n_k].repeat_interleave(group, 0)[:heads]
                s = q[:heads, :n_q] @ kk.transpose(1, 2) * scale
                if meta["CAUSAL"]:
                    hidden = torch.arange(n_k)[None, :] > torch.arange(n_q)[:, None] + n_k - n_q
                    s = s.masked_fill(hidden, float("-inf"))
                out[:, :n_q] = torch.softmax(s, -1) @ vv
                lse.copy_(torch.logsumexp(s, -1))
        frame = frame.f_back


@triton.jit
def flash_attention_fwd_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
                               stride_qh, stride_qm, stride_kh, stride_kn,
                               stride_vh, stride_vn, stride_oh, stride_om,
                               n_queries, n_keys, group, sm_scale,
                               CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _answer_from_the_launcher()
    if HEAD_DIM < 0:
        tl.dot(tl.zeros([BLOCK_M, HEAD_DIM], tl.float32), tl.zeros([HEAD_DIM, BLOCK_N], tl.float32))

# %% grade_id: flash_attention_fwd_kernel | cheat: broadcast products and sums instead of tl.dot, with a dead tl.dot for the look
# expect: a tl.dot counts only where it runs
import triton
import triton.language as tl


@triton.jit
def flash_attention_fwd_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
                               stride_qh, stride_qm, stride_kh, stride_kn,
                               stride_vh, stride_vn, stride_oh, stride_om,
                               n_queries, n_keys, group, sm_scale,
                               CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    kv_head = head // group
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < n_queries
    q = tl.load(q_ptr + head * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offset = n_keys - n_queries
    end = n_keys
    if CAUSAL:
        end = tl.minimum(n_keys, start_m + BLOCK_M + offset)   # later key tiles are all masked
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < n_keys
        k = tl.load(k_ptr + kv_head * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                    mask=col_ok[:, None], other=0.0)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * sm_scale
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))              # finite: key 0 is in tile 0
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_head * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                    mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    tl.store(out_ptr + head * stride_oh + rows[:, None] * stride_om + dims[None, :],
             acc / l_i[:, None], mask=row_ok[:, None])
    tl.store(lse_ptr + head * n_queries + rows, m_i + tl.log(l_i), mask=row_ok)
    if HEAD_DIM < 0:   # never runs: only there for a look that searches the source for tl.dot
        tl.dot(q, tl.trans(q))

# %% grade_id: flash_hbm_bytes | wrong: reads K and V once in total instead of once per query tile
# expect: once per query tile
def flash_hbm_bytes(n_queries: int, n_keys: int, head_dim: int, block_m: int,
                    element_bytes: int = 2) -> dict[str, int]:
    """HBM traffic of one head's attention forward, in bytes: {"naive": ..., "flash": ...}.

    Q and O are [n_queries, head_dim], K and V [n_keys, head_dim], element_bytes per element.
    naive: read Q, K, V once, write O once, and move the [n_queries, n_keys] score matrix four
      times (write S, read S, write P, read P), all at element_bytes per element.
    flash: read Q once and write O once; read K and V once per query tile of block_m rows (the
      last tile may be shorter, it still reads all of K and V); write one float32 (4 bytes)
      log-sum-exp per query row.
    Raises ValueError when a size is below 1 (block_m, head_dim, element_bytes) or negative.
    """
    if min(block_m, head_dim, element_bytes) < 1 or min(n_queries, n_keys) < 0:
        raise ValueError(f"need block_m, head_dim, element_bytes >= 1 and lengths >= 0, got "
                         f"{block_m}, {head_dim}, {element_bytes}, {n_queries}, {n_keys}")
    q_and_o = 2 * n_queries * head_dim * element_bytes
    k_and_v = 2 * n_keys * head_dim * element_bytes
    tiles = -(-n_queries // block_m)
    return {"naive": q_and_o + k_and_v + 4 * n_queries * n_keys * element_bytes,
            "flash": q_and_o + k_and_v + 4 * n_queries}

# %% grade_id: flash_hbm_bytes | wrong: rounds the number of query tiles down
# expect: round the number of query tiles up
def flash_hbm_bytes(n_queries: int, n_keys: int, head_dim: int, block_m: int,
                    element_bytes: int = 2) -> dict[str, int]:
    """HBM traffic of one head's attention forward, in bytes: {"naive": ..., "flash": ...}.

    Q and O are [n_queries, head_dim], K and V [n_keys, head_dim], element_bytes per element.
    naive: read Q, K, V once, write O once, and move the [n_queries, n_keys] score matrix four
      times (write S, read S, write P, read P), all at element_bytes per element.
    flash: read Q once and write O once; read K and V once per query tile of block_m rows (the
      last tile may be shorter, it still reads all of K and V); write one float32 (4 bytes)
      log-sum-exp per query row.
    Raises ValueError when a size is below 1 (block_m, head_dim, element_bytes) or negative.
    """
    if min(block_m, head_dim, element_bytes) < 1 or min(n_queries, n_keys) < 0:
        raise ValueError(f"need block_m, head_dim, element_bytes >= 1 and lengths >= 0, got "
                         f"{block_m}, {head_dim}, {element_bytes}, {n_queries}, {n_keys}")
    q_and_o = 2 * n_queries * head_dim * element_bytes
    k_and_v = 2 * n_keys * head_dim * element_bytes
    tiles = n_queries // block_m
    return {"naive": q_and_o + k_and_v + 4 * n_queries * n_keys * element_bytes,
            "flash": q_and_o + k_and_v * tiles + 4 * n_queries}

# %% grade_id: flash_hbm_bytes | wrong: counts S and P once each
# expect: four trips
def flash_hbm_bytes(n_queries: int, n_keys: int, head_dim: int, block_m: int,
                    element_bytes: int = 2) -> dict[str, int]:
    """HBM traffic of one head's attention forward, in bytes: {"naive": ..., "flash": ...}.

    Q and O are [n_queries, head_dim], K and V [n_keys, head_dim], element_bytes per element.
    naive: read Q, K, V once, write O once, and move the [n_queries, n_keys] score matrix four
      times (write S, read S, write P, read P), all at element_bytes per element.
    flash: read Q once and write O once; read K and V once per query tile of block_m rows (the
      last tile may be shorter, it still reads all of K and V); write one float32 (4 bytes)
      log-sum-exp per query row.
    Raises ValueError when a size is below 1 (block_m, head_dim, element_bytes) or negative.
    """
    if min(block_m, head_dim, element_bytes) < 1 or min(n_queries, n_keys) < 0:
        raise ValueError(f"need block_m, head_dim, element_bytes >= 1 and lengths >= 0, got "
                         f"{block_m}, {head_dim}, {element_bytes}, {n_queries}, {n_keys}")
    q_and_o = 2 * n_queries * head_dim * element_bytes
    k_and_v = 2 * n_keys * head_dim * element_bytes
    tiles = -(-n_queries // block_m)
    return {"naive": q_and_o + k_and_v + 2 * n_queries * n_keys * element_bytes,
            "flash": q_and_o + k_and_v * tiles + 4 * n_queries}

# %% grade_id: flash_hbm_bytes | cheat: reads the reference source by path and runs it
# expect: flash_hbm_bytes
import pathlib

# where the course lives: the grader says so in the environment and on sys.path
for _folder in (*map(pathlib.Path, filter(None, [__import__("os").environ.get("AUTOGRADER_ROOT")])),
                *map(pathlib.Path, __import__("sys").path), pathlib.Path.cwd(), *pathlib.Path.cwd().parents):
    _file = _folder / "reference" / "kernels" / "flash_attention.py"
    if _file.exists():
        _text = _file.read_text()
        _start = _text.index("def hbm_bytes")
        _namespace = {}
        exec(_text[_start:], _namespace)
        break


def flash_hbm_bytes(n_queries, n_keys, head_dim, block_m, element_bytes=2):
    return _namespace["hbm_bytes"](n_queries, n_keys, head_dim, element_bytes, block_m)
