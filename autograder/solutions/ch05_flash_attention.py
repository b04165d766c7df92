"""Solutions of exercises/ch05_flash_attention.ipynb, one section per solution cell.

Loaded with ``autograder.solutions.load_solutions("ch05_flash_attention")``; never imported as a
module by the grader (each section is injected into the notebook and graded).
"""

# %% grade_id: attend_tile
import torch


def attend_tile(acc, m, l, q, k, v, scale: float, visible=None):
    """One key tile of flash attention: fold the keys k and values v into the running state
    of the queries q.

    q [..., Bq, D]; k, v [..., Bk, D] (Bk >= 1): the next tile of keys and values. The state
    of each query row over the keys folded in so far: acc [..., Bq, D], the UNnormalised output
    sum_j exp(s_j - m) v_j; m [..., Bq], the max score; l [..., Bq], sum_j exp(s_j - m)
    ((0, -inf, 0) before any key, or while every key so far was hidden from the row).
    Scores s = (q @ k^T) * scale, [..., Bq, Bk]; where visible (bool, broadcastable to the
    scores; None: every key visible) is False, the key does not count (its score is -inf).
    Returns (acc, m, l) after the tile, shapes and dtype as given: m grows to the tile's max,
    and acc and l, measured from the old max, are rescaled by exp(m_old - m_new) before the
    tile's terms are added. A row that has seen no visible key stays (0, -inf, 0), without NaN.
    The state may come from keys you never saw: it is all you know about them. softmax
    functions, the one-line normalisers, scaled_dot_product_attention and flex_attention are
    forbidden.
    """
    s = (q @ k.transpose(-1, -2)) * scale
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    m_new = torch.maximum(m, s.amax(-1))
    safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)  # no key yet
    alpha = torch.exp(m - safe)                                   # rescales the old sums
    p = torch.exp(s - safe[..., None])
    return acc * alpha[..., None] + p @ v, m_new, l * alpha + p.sum(-1)


# %% grade_id: tiled_attention
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
    log of sum_j exp(score_ij). softmax functions, the one-line normalisers (logsumexp,
    logcumsumexp), scaled_dot_product_attention and flex_attention are forbidden, and a
    score matrix of the whole [Nq, Nk] scores 0 for the exercise: the grader runs one case
    under a memory limit where only tiles fit.
    """
    batch, heads, n_q, dim = q.shape
    n_k = k.shape[2]
    scale = 1.0 / math.sqrt(dim)
    out, lse = torch.empty_like(q), q.new_empty(batch, heads, n_q)
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] * scale                        # [B, H, bq, D]
        rows = torch.arange(i, i + q_tile.shape[2], device=q.device)[:, None] + (n_k - n_q)
        m = q.new_full(q_tile.shape[:3], float("-inf"))
        l = torch.zeros_like(m)
        acc = torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)     # [B, H, bq, bk]
            if causal:
                cols = torch.arange(j, j + s.shape[-1], device=q.device)[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
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


# %% grade_id: score_tile_kernel
import triton
import triton.language as tl


@triton.jit
def score_tile_kernel(q_ptr, k_ptr, s_ptr, m_ptr, l_ptr,
                      stride_qm, stride_kn, stride_sm, stride_tm,
                      n_queries, n_keys, scale,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One tile of attention scores and its softmax statistics, one program per tile:
    program (i, j) takes the query rows i*BLOCK_M ... and the keys j*BLOCK_N ...

    Tensors (float32, unit stride along a row; the buffers hold spare rows and columns filled
    with NaN, which the kernel must neither read nor write):
      q_ptr [n_queries, HEAD_DIM]  queries, one row every stride_qm elements
      k_ptr [n_keys, HEAD_DIM]     keys, one row every stride_kn elements
      s_ptr [n_queries, n_keys]    scores, one row every stride_sm elements: write the tile's
                                   s = (q . k) * scale where query < n_queries and key < n_keys
      m_ptr, l_ptr [n_queries, cdiv(n_keys, BLOCK_N)]   one row every stride_tm elements: at
                                   [query, j] the max m of the query's scores in key tile j and
                                   l = sum exp(s - m) over them; keys >= n_keys do not count
    n_queries, n_keys: any positive ints, not necessarily multiples of the blocks.
    HEAD_DIM, BLOCK_M, BLOCK_N: powers of two, at least 16.
    Grid: (cdiv(n_queries, BLOCK_M), cdiv(n_keys, BLOCK_N)). One tl.dot computes the tile (on
      a GPU pass input_precision="ieee": the grader compares with float64 at 1e-4); no loops.
    """
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    keys = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < n_queries
    key_ok = keys < n_keys
    q = tl.load(q_ptr + rows[:, None] * stride_qm + dims[None, :], mask=row_ok[:, None], other=0.0)
    k = tl.load(k_ptr + keys[:, None] * stride_kn + dims[None, :], mask=key_ok[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale     # [BLOCK_M, BLOCK_N]
    tl.store(s_ptr + rows[:, None] * stride_sm + keys[None, :], s,
             mask=row_ok[:, None] & key_ok[None, :])
    s = tl.where(key_ok[None, :], s, float("-inf"))                 # missing keys do not count
    m = tl.max(s, axis=1)
    l = tl.sum(tl.exp(s - m[:, None]), axis=1)
    stats = rows * stride_tm + tl.program_id(1)
    tl.store(m_ptr + stats, m, mask=row_ok)
    tl.store(l_ptr + stats, l, mask=row_ok)


# %% grade_id: flash_attention_fwd_kernel
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

    Tensors (float32, last dimension contiguous, i.e. stride 1 along HEAD_DIM; the buffers may
    hold spare rows and heads beyond the sizes below, which the kernel must not read):
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
    Memory: a program loads its query tile once and each key tile it needs once (causal: none
      past the tile's last visible key), and stores out and lse once; nothing else.
    Precision: on a GPU, fp32 tl.dot runs in TF32 (10-bit mantissa) unless you pass
      input_precision="ieee"; the grader compares with float64 at 1e-4, so pass it.
    The plumbing below is given: this program's rows and heads, its query tile, and pointers
    to the first key tile and to the output. Write the rest: the loop over key tiles (loads
    masked past n_keys, scores with tl.dot, masked scores -inf, causal ones too), the online
    softmax update of m_i, l_i, acc, and the stores of acc / l and lse = m + log(l).
    """
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    kv_head = head // group                             # the K/V head this query head reads
    rows = start_m + tl.arange(0, BLOCK_M)              # this program's query rows
    keys = tl.arange(0, BLOCK_N)                        # key offsets within a key tile
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < n_queries
    q = tl.load(q_ptr + head * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                mask=row_ok[:, None], other=0.0)        # [BLOCK_M, HEAD_DIM]
    # [BLOCK_N, HEAD_DIM] pointers to keys 0 .. BLOCK_N - 1 (+ start_n * stride: keys start_n ...)
    k_tile_ptrs = k_ptr + kv_head * stride_kh + keys[:, None] * stride_kn + dims[None, :]
    v_tile_ptrs = v_ptr + kv_head * stride_vh + keys[:, None] * stride_vn + dims[None, :]
    out_ptrs = out_ptr + head * stride_oh + rows[:, None] * stride_om + dims[None, :]
    lse_ptrs = lse_ptr + head * n_queries + rows        # [BLOCK_M]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offset = n_keys - n_queries
    end = n_keys
    if CAUSAL:
        end = tl.minimum(n_keys, start_m + BLOCK_M + offset)   # later key tiles are all masked
    for start_n in range(0, end, BLOCK_N):
        key_ok = start_n + keys < n_keys
        k = tl.load(k_tile_ptrs + start_n * stride_kn, mask=key_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale  # [BLOCK_M, BLOCK_N]
        visible = key_ok[None, :]
        if CAUSAL:
            visible = visible & (start_n + keys[None, :] <= rows[:, None] + offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))              # finite: key 0 is in tile 0
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_tile_ptrs + start_n * stride_vn, mask=key_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    tl.store(out_ptrs, acc / l_i[:, None], mask=row_ok[:, None])
    tl.store(lse_ptrs, m_i + tl.log(l_i), mask=row_ok)


# %% grade_id: flash_hbm_bytes
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
            "flash": q_and_o + k_and_v * tiles + 4 * n_queries}
