"""Solutions of exercises/ch07_flash_versions.ipynb, one section per solution cell.

Loaded with ``autograder.solutions.load_solutions("ch07_flash_versions")``; never imported as a
module by the grader (each section is injected into the notebook and graded).
"""

# %% grade_id: pick_flash
def pick_flash(gpu: str, training: bool, head_dim: int = 64) -> tuple[int, str]:
    """The FlashAttention version to use: returns (version, reason).

    gpu: one of "P100", "V100", "T4", "RTX 2080", "A100", "A10", "A6000", "RTX 3090", "L4",
    "L40S", "RTX 4090", "H100", "H200", "H800", "B200", "GB200" (any upper/lower case).
    training: True for training (forward and backward passes), False for inference (forward).
    head_dim: the attention head dimension, a multiple of 8 from 8 to 128.
    version: 1, 2, 3 or 4, or 0 when no FlashAttention version supports the case; where several
    run, the newest one written for the GPU's generation (FA4 also runs on Hopper, but FA3 is the
    one written for Hopper).
    reason: one sentence that names the GPU's architecture generation (e.g. "Ampere") and what
    decides the version on it: the feature or limit that rules a newer version out (or that the
    chosen one is built on), and the head dim where training on Turing.
    Raises ValueError for an unknown GPU or a bad head_dim, TypeError if training is not a bool.
    """
    generations = {"P100": "Pascal", "V100": "Volta", "T4": "Turing", "RTX 2080": "Turing",
                   "A100": "Ampere", "A10": "Ampere", "A6000": "Ampere", "RTX 3090": "Ampere",
                   "L4": "Ada", "L40S": "Ada", "RTX 4090": "Ada",
                   "H100": "Hopper", "H200": "Hopper", "H800": "Hopper",
                   "B200": "Blackwell", "GB200": "Blackwell"}
    name = gpu.strip().upper() if isinstance(gpu, str) else None
    if name not in generations:
        raise ValueError(f"unknown GPU {gpu!r}")
    if not isinstance(training, bool):
        raise TypeError(f"training must be True or False, got {training!r}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) \
            or not (8 <= head_dim <= 128 and head_dim % 8 == 0):
        raise ValueError(f"head_dim must be a multiple of 8 from 8 to 128, got {head_dim!r}")
    generation = generations[name]
    if generation in ("Pascal", "Volta"):
        return 0, f"{generation}: no FlashAttention version runs on it"
    if generation == "Turing":
        if training and head_dim > 64:
            return 0, "Turing: FA1's backward above head dim 64 needs an A100/H100, FA2 needs Ampere"
        return 1, "Turing: FA2 needs Ampere; FA1 runs here (and trains up to head dim 64)"
    if generation in ("Ampere", "Ada"):
        return 2, f"{generation}: FlashAttention-2; FA3 is Hopper-only"
    if generation == "Hopper":
        return 3, "Hopper: FlashAttention-3 was written for its TMA and WGMMA"
    return 4, "Blackwell: FlashAttention-4 targets its asynchronous MMA and tensor memory"


# %% grade_id: decode_split
import math

import torch
from torch import Tensor


def decode_split(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """First stage of flash decoding: the partial softmax state of ONE split of the keys.

    q: [B, Hq, D], one query per sequence and head; k and v: [B, Hkv, n, D], the n keys of one
    split (n may be 0), with Hq a multiple of Hkv (query head h reads K/V head h // (Hq // Hkv)).
    With scores x_j = q . k_j / sqrt(D) over the split's keys, returns (m, l, o):
    m [B, Hq] = max_j x_j, l [B, Hq] = sum_j exp(x_j - m), o [B, Hq, D] = sum_j exp(x_j - m) v_j
    (not divided by l), in q's dtype. A split without keys returns (-inf, 0, 0).
    torch.softmax, logsumexp, log_softmax and scaled_dot_product_attention are not allowed.
    """
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if k.shape[2] == 0:                               # no keys: the empty state
        m = q.new_full(q.shape[:2], float("-inf"))
        return m, torch.zeros_like(m), torch.zeros_like(q)
    scores = torch.einsum("bhd,bhnd->bhn", q, k) / math.sqrt(q.shape[-1])
    m = scores.amax(dim=-1)
    p = torch.exp(scores - m[..., None])
    return m, p.sum(dim=-1), torch.einsum("bhn,bhnd->bhd", p, v)


# %% grade_id: merge_splits
import torch
from torch import Tensor


def merge_splits(m: Tensor, l: Tensor, o: Tensor) -> Tensor:
    """Second stage of flash decoding: merge the splits' partial states into the output.

    m and l: [B, Hq, S], o: [B, Hq, S, D]: split s's state (m_s, l_s, o_s) as decode_split
    returns it (o_s not divided by l_s; a split without keys has m_s = -inf, l_s = 0, o_s = 0;
    every row has at least one split with keys). With M = max_s m_s, returns
    out [B, Hq, D] = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s, in o's dtype.
    torch.softmax, logsumexp, log_softmax and scaled_dot_product_attention are not allowed.
    """
    m_all = m.amax(dim=-1, keepdim=True)              # M, over the splits
    weight = torch.exp(m - m_all)                     # exp(m_s - M): 0 for an empty split
    l_all = (weight * l).sum(dim=-1)
    o_all = (weight[..., None] * o).sum(dim=-2)
    return o_all / l_all[..., None]


# %% grade_id: decode_partial_kernel
import triton
import triton.language as tl


@triton.jit
def decode_partial_kernel(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, o_ptr,
                          n_q_heads, n_kv_heads, n_keys, chunk, num_splits, sm_scale,
                          HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """First stage of flash decoding: one program per (batch * query head, split).

    Contiguous float32 tensors: q [B, Hq, D], k and v [B, Hkv, N, D], outputs m and l
    [B, Hq, num_splits] and o [B, Hq, num_splits, D]. Program (row, split), with
    row = batch * n_q_heads + head, reduces the keys [split * chunk, min((split + 1) * chunk, N))
    of K/V head head // (n_q_heads // n_kv_heads), BLOCK_N keys at a time, to the state
    m = max score, l = sum exp(score - m), o = sum exp(score - m) v (not divided by l), where
    score = (q . k) * sm_scale. A split without keys writes m = -inf, l = 0, o = 0.
    One pass: each key of the split is loaded once, one BLOCK_N tile per load.
    """
    row = tl.program_id(0)
    split = tl.program_id(1)
    batch = row // n_q_heads
    kv_head = (row % n_q_heads) // (n_q_heads // n_kv_heads)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + row * HEAD_DIM + dims)
    kv_base = (batch * n_kv_heads + kv_head).to(tl.int64) * n_keys * HEAD_DIM
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)
    m_i = float("-inf")
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for tile in range(start, end, BLOCK_N):
        keys = tile + tl.arange(0, BLOCK_N)
        in_split = keys < end
        offsets = kv_base + keys[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(k_ptr + offsets, mask=in_split[:, None], other=0.0)
        v = tl.load(v_ptr + offsets, mask=in_split[:, None], other=0.0)
        scores = tl.where(in_split, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        rescale = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new)
        l_i = l_i * rescale + tl.sum(p, axis=0)
        o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    state = row * num_splits + split
    tl.store(m_ptr + state, m_i)
    tl.store(l_ptr + state, l_i)
    tl.store(o_ptr + state * HEAD_DIM + dims, o_i)
