"""Flash attention forward (FlashAttention-2 schedule) as a Triton kernel.

Why. Plain attention writes the score matrix S = Q K^T [Nq, Nk] to HBM, reads it back for the
softmax, writes P, and reads P again for P V: about 4 Nq Nk elements of traffic per head on
top of Q, K, V and O. At N = 8192, D = 64, fp16 that is 512 MiB per head against 4 MiB for Q, K, V
and O together. Flash attention never materialises S: one program owns a tile of BLOCK_M
query rows, keeps it in registers, and streams K and V past it in tiles of BLOCK_N keys, with
a running max m, sum l and unnormalised output acc per row (online softmax). HBM traffic per
head is Q and O once plus K and V once per query tile: (2 Nq + 2 Nk Nq / BLOCK_M) D elements,
so the bigger BLOCK_M, the fewer times K and V are re-read (`hbm_bytes` below does the sums).

Layout and options: q [B, Hq, Nq, D], k and v [B, Hkv, Nk, D], any strides (passed to the
kernel; no copies). Grouped-query attention reads K/V head h // (Hq // Hkv) for query head h.
Causal masking is aligned to the end (query i sees keys j <= i + Nk - Nq). Scores, softmax
and the output accumulator are fp32 for every input dtype; with fp32 inputs the matrix products
use `input_precision="ieee"` (true fp32, not TF32). Exponentials are base 2 with log2(e) folded
into the scale. The kernel also writes the log-sum-exp of each row's scores (natural log).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from reference.kernels import checks
from reference.kernels.checks import INTERPRETED

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)     # a kernel may read a global only if it is a constexpr

# Tiles tried by the autotuner on a GPU (the interpreter uses the small one only: it is exact
# but slow, and small tiles let small test shapes still span several tiles).
GPU_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
               for bm, bn, w, s in [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3)]]
INTERPRETER_CONFIGS = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16})]
# fp32 tiles take twice the bytes, and IEEE fp32 products run on the FMA units, operands in
# registers: 64 x 64 at D = 128 asks a T4 for 80 KiB of shared memory and an A100 for 176 KiB,
# over their limits (`python -m reference.bench kernels --targets`); 32 x 32 fits all three.
FP32_GPU_CONFIG = triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2)


def _prune_configs(configs, named_args, **kwargs):
    """fp32: the smallest tile, at most FP32_GPU_CONFIG's."""
    if named_args["q_ptr"].dtype == torch.float32:
        return [min(configs + [FP32_GPU_CONFIG], key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]
    return configs


@triton.jit
def _attend_key_tiles(acc, l_i, m_i, q, k_base, v_base,
                      stride_kn, stride_kd, stride_vn, stride_vd,
                      rows, start, end, n_keys, causal_offset, qk_scale,
                      MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                      BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                      PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """Fold the key tiles [start, end) into the running state
    (acc, l_i, m_i) of the q tile."""
    dims = tl.arange(0, HEAD_DIM)
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        in_range = cols[:, None] < n_keys
        k_ptrs = k_base + cols[:, None] * stride_kn + dims[None, :] * stride_kd
        k = tl.load(k_ptrs, mask=in_range, other=0.0)
        if DOT_UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s = s * qk_scale                                 # [BLOCK_M, BLOCK_N]
        if MASKED:  # the tail tile past n_keys, tiles across the diagonal
            visible = cols[None, :] < n_keys
            if CAUSAL:
                last_key = rows[:, None] + causal_offset
                visible = visible & (cols[None, :] <= last_key)
            s = tl.where(visible, s, float("-inf"))
        # Every row sees key 0 in the first tile: m_new is finite from then.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)    # rescales what the old max summed
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_ptrs = v_base + cols[:, None] * stride_vn + dims[None, :] * stride_vd
        v = tl.load(v_ptrs, mask=in_range, other=0.0)
        p_in = p.to(v_base.dtype.element_ty)   # P V in the input dtype too
        if DOT_UPCAST:
            p_in, v = p_in.to(tl.float32), v.to(tl.float32)
        pv = tl.dot(p_in, v, input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _flash_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
                            stride_qb, stride_qh, stride_qm, stride_qd,
                            stride_kb, stride_kh, stride_kn, stride_kd,
                            stride_vb, stride_vh, stride_vn, stride_vd,
                            stride_ob, stride_oh, stride_om, stride_od,
                            n_q_heads, group, n_queries, n_keys, qk_scale,
                            CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                            PRECISION: tl.constexpr,
                            DOT_UPCAST: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    batch = tl.program_id(1) // n_q_heads
    head = tl.program_id(1) % n_q_heads
    kv_head = head // group                 # GQA: index the shared K/V head
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    batch64 = batch.to(tl.int64)
    q_base = q_ptr + batch64 * stride_qb + head * stride_qh
    k_base = k_ptr + batch64 * stride_kb + kv_head * stride_kh
    v_base = v_ptr + batch64 * stride_vb + kv_head * stride_vh
    q = tl.load(q_base + rows[:, None] * stride_qm + dims[None, :] * stride_qd,
                mask=rows[:, None] < n_queries, other=0.0)
    if DOT_UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    causal_offset = n_keys - n_queries
    if CAUSAL:
        # Keys every row of this tile sees, then the tiles crossing the
        # diagonal (masked).
        end = tl.minimum(n_keys, start_m + BLOCK_M + causal_offset)
        full = tl.minimum((start_m + causal_offset + 1) // BLOCK_N,
                          n_keys // BLOCK_N) * BLOCK_N
    else:
        end = n_keys
        full = n_keys // BLOCK_N * BLOCK_N
    acc, l_i, m_i = _attend_key_tiles(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn,
        stride_vd, rows, 0, full, n_keys, causal_offset, qk_scale,
        False, CAUSAL, BLOCK_N, HEAD_DIM, PRECISION, DOT_UPCAST)
    acc, l_i, m_i = _attend_key_tiles(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn,
        stride_vd, rows, full, end, n_keys, causal_offset, qk_scale,
        True, CAUSAL, BLOCK_N, HEAD_DIM, PRECISION, DOT_UPCAST)

    out_base = out_ptr + batch64 * stride_ob + head * stride_oh
    out = (acc / l_i[:, None]).to(out_ptr.dtype.element_ty)
    tl.store(out_base + rows[:, None] * stride_om + dims[None, :] * stride_od,
             out, mask=rows[:, None] < n_queries)
    lse_row = lse_ptr + (batch64 * n_q_heads + head) * n_queries
    tl.store(lse_row + rows, (m_i + tl.log2(l_i)) * LN2, mask=rows < n_queries)


_kernel = triton.autotune(INTERPRETER_CONFIGS if INTERPRETED else GPU_CONFIGS,
                          key=["HEAD_DIM", "CAUSAL"],
                          prune_configs_by={"early_config_prune": _prune_configs})(_flash_attention_kernel)


def dot_options(dtype: torch.dtype, interpreted: bool = INTERPRETED) -> dict:
    """tl.dot settings: true fp32 products for fp32 inputs; bf16 products in fp32 under the
    interpreter, whose tl.dot multiplies bf16 bit patterns as integers (triton-lang/triton#11584).
    Both are exact for bf16 inputs (a bf16 x bf16 product fits in fp32)."""
    upcast = interpreted and dtype == torch.bfloat16
    return {"PRECISION": "ieee" if dtype == torch.float32 or upcast else "tf32", "DOT_UPCAST": upcast}


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    sm_scale: float | None = None, return_lse: bool = False):
    """softmax(q k^T * sm_scale [+ causal mask]) v without materialising the scores.

    q [B, Hq, Nq, D], k and v [B, Hkv, Nk, D], one float dtype, D in {16, 32, 64, 128},
    Hq % Hkv == 0, Nq >= 1, Nk >= 1, and Nq <= Nk when causal. sm_scale defaults to 1/sqrt(D).
    Returns out [B, Hq, Nq, D] in q's dtype, and with return_lse also lse [B, Hq, Nq] (fp32,
    natural log of sum_j exp(score_ij)).
    """
    checks.check_tensors({"q": q, "k": k, "v": v}, {"q": 4, "k": 4, "v": 4})
    batch, n_q_heads, n_queries, head_dim = q.shape
    n_kv_heads, n_keys = checks.check_kv(q, k, v)
    if n_queries == 0 or n_keys == 0:
        raise ValueError(f"need at least one query and one key, got Nq={n_queries}, Nk={n_keys}")
    if causal and n_queries > n_keys:
        raise ValueError(f"causal attention needs Nq <= Nk (queries aligned to the last keys), "
                         f"got Nq={n_queries}, Nk={n_keys}")
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    out = checks.empty(q.shape, q.dtype, q.device)
    lse = checks.empty((batch, n_q_heads, n_queries), torch.float32, q.device)
    grid = lambda meta: (triton.cdiv(n_queries, meta["BLOCK_M"]), batch * n_q_heads)
    _kernel[grid](q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
                  n_q_heads, n_q_heads // n_kv_heads, n_queries, n_keys, scale * LOG2E,
                  CAUSAL=bool(causal), HEAD_DIM=head_dim,
                  **dot_options(q.dtype))
    return (out, lse) if return_lse else out


def hbm_bytes(n_queries: int, n_keys: int, head_dim: int, element_bytes: int = 2,
              block_m: int = 128) -> dict[str, int]:
    """Analytic HBM traffic of one head's attention forward, in bytes.

    naive: read Q, K, V, write S, read S, write P, read P (for P V), write O.
    flash: read Q once, K and V once per query tile of block_m rows, write O and the LSE (an
    upper bound: on a GPU many of the K/V re-reads are served by the L2 cache).
    """
    qkvo = (2 * n_queries + 2 * n_keys) * head_dim * element_bytes
    naive = qkvo + 4 * n_queries * n_keys * element_bytes
    tiles = -(-n_queries // block_m)
    flash = (2 * n_queries + 2 * n_keys * tiles) * head_dim * element_bytes + 4 * n_queries
    return {"naive": naive, "flash": flash}
