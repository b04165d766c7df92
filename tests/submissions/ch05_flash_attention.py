"""Known-wrong and cheating submissions for chapter 05 (see tests/grading/test_selfcheck.py).

Each section is the body of one solution cell, written in full or, for a slip, as
`# replace:` / `# with:` edits of the solution section (autograder/solutions/__init__.py);
none may earn the exercise's full points.
"""

# %% grade_id: attend_tile | wrong: rescales l but not acc when the max grows
# expect: multiply acc (as well as l) by exp(m_old - m_new)
# replace:
#     return acc * alpha[..., None] + p @ v, m_new, l * alpha + p.sum(-1)
# with:
#     return acc + p @ v, m_new, l * alpha + p.sum(-1)

# %% grade_id: attend_tile | wrong: no guard for a row that has seen no visible key
# expect: a row that has seen no visible key yet has m = -inf
# replace:
#     safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)  # no key yet
# with:
#     safe = m_new

# %% grade_id: attend_tile | wrong: forgets the scale
# expect: multiply the scores q k^T by scale (once)
# replace:
#     s = (q @ k.transpose(-1, -2)) * scale
# with:
#     s = q @ k.transpose(-1, -2)

# %% grade_id: attend_tile | wrong: rescales neither sum when the max grows
# expect: both were summed with the old max
# replace:
#     return acc * alpha[..., None] + p @ v, m_new, l * alpha + p.sum(-1)
# with:
#     return acc + p @ v, m_new, l + p.sum(-1)

# %% grade_id: attend_tile | cheat: ignores the incoming state (the tile's own acc, m and l)
# expect: the incoming state (acc, m, l) was ignored
# expect score: 0
import torch


def attend_tile(acc, m, l, q, k, v, scale, visible=None):
    s = (q @ k.transpose(-1, -2)) * scale
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    m_new = s.amax(-1)
    safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    p = torch.exp(s - safe[..., None])
    return p @ v, m_new, p.sum(-1)

# %% grade_id: attend_tile | cheat: keeps every key tile it was given in a global and recomputes softmax-weighted sums over them all (never rescales)
# expect score: 0
import torch

_KEYS = []


def attend_tile(acc, m, l, q, k, v, scale, visible=None):
    if bool((m == float("-inf")).all()):              # a fresh problem: forget the old tiles
        _KEYS.clear()
    if visible is None:
        visible = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)
    _KEYS.append((k, v, visible.expand(*q.shape[:-1], k.shape[-2])))
    try:
        keys, values, seen = (torch.cat(parts, -2 if i < 2 else -1) for i, parts in enumerate(zip(*_KEYS)))
    except RuntimeError:                              # another problem's tiles: start over
        _KEYS[:] = _KEYS[-1:]
        keys, values, seen = _KEYS[0]
    s = ((q @ keys.transpose(-1, -2)) * scale).masked_fill(~seen, float("-inf"))
    m_new = s.amax(-1)
    safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    p = torch.exp(s - safe[..., None])
    return (p @ values).to(acc.dtype), m_new.to(m.dtype), p.sum(-1).to(l.dtype)

# %% grade_id: attend_tile | cheat: the tile's attention from SDPA, its weight from a logsumexp, merged in
# expect: which this exercise forbids
# expect score: 0
import torch
from torch.nn import functional as F


def attend_tile(acc, m, l, q, k, v, scale, visible=None):
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)
    s = (q @ k.transpose(-1, -2)) * scale
    lse = torch.logsumexp(s if visible is None else s.masked_fill(~visible, float("-inf")), -1)
    m_new = torch.maximum(m, lse)
    a, b = torch.exp(m - m_new), torch.exp(lse - m_new)
    return acc * a[..., None] + o * b[..., None], m_new, l * a + b

# %% grade_id: attend_tile | cheat: imports the reference merge and merges the tile's state in
# expect: is not allowed
import torch
from reference.kernels.torch_reference import merge_softmax_states as _merge


def attend_tile(acc, m, l, q, k, v, scale, visible=None):
    s = (q @ k.transpose(-1, -2)) * scale
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    t = s.amax(-1)
    p = torch.exp(s - torch.where(t == float("-inf"), torch.zeros_like(t), t)[..., None])
    m_new, l_new, acc_new = _merge((m, l, acc), (t, p.sum(-1), p @ v))
    return acc_new, m_new, l_new

# %% grade_id: attend_tile | cheat: two passes over the tile: the max from scores made of copies (q and k repeated to [Bq, Bk, D], multiplied, summed), then the scores again with a matmul for the exponentials
# expect: times the product work of one pass
# expect: in elementwise products of two tensors
# expect: however its factors were made
# expect score: 0
import torch


def attend_tile(acc, m, l, q, k, v, scale, visible=None):
    n_q, n_k = q.shape[-2], k.shape[-2]
    q_copies = q.unsqueeze(-2).repeat(*[1] * (q.dim() - 1), n_k, 1)        # [..., Bq, Bk, D]
    k_copies = k.unsqueeze(-3).repeat(*[1] * (k.dim() - 2), n_q, 1, 1)     # [..., Bq, Bk, D]
    first = (q_copies * k_copies).sum(-1) * scale     # as large as its factors: no outer product
    if visible is not None:
        first = first.masked_fill(~visible, float("-inf"))
    m_new = torch.maximum(m, first.amax(-1))          # pass 1: the max
    safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    s = (q @ k.transpose(-1, -2)) * scale             # pass 2: the scores again
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    alpha = torch.exp(m - safe)
    p = torch.exp(s - safe[..., None])
    return acc * alpha[..., None] + p @ v, m_new, l * alpha + p.sum(-1)

# %% grade_id: attend_tile | cheat: two passes over the tile, the first one's scores from copies made by index_select with repeated indices and torch.cat, multiplied with addcmul and summed
# expect: times the product work of one pass
# expect score: 0
import torch


def attend_tile(acc, m, l, q, k, v, scale, visible=None):
    n_q, n_k = q.shape[-2], k.shape[-2]
    q_copies = q.index_select(-2, torch.arange(n_q).repeat_interleave(n_k))    # [..., Bq*Bk, D]
    k_copies = torch.cat([k] * n_q, -2)                                         # [..., Bq*Bk, D]
    terms = torch.addcmul(torch.zeros_like(q_copies), q_copies, k_copies)
    first = terms.sum(-1).unflatten(-1, (n_q, n_k)) * scale
    if visible is not None:
        first = first.masked_fill(~visible, float("-inf"))
    m_new = torch.maximum(m, first.amax(-1))          # pass 1: the max
    safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    s = (q @ k.transpose(-1, -2)) * scale             # pass 2: the scores again
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    alpha = torch.exp(m - safe)
    p = torch.exp(s - safe[..., None])
    return acc * alpha[..., None] + p @ v, m_new, l * alpha + p.sum(-1)

# %% grade_id: tiled_attention | wrong: no max subtraction (exp overflows on large scores)
# expect: subtract the running max
# replace:
#             m_new = torch.maximum(m, s.amax(-1))
#             safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # no key seen yet
#             alpha = torch.exp(m - safe)                                 # rescales the old sums
#             p = torch.exp(s - safe[..., None])
#             l = l * alpha + p.sum(-1)
#             acc = acc * alpha[..., None] + p @ v[:, :, j:j + block_k]
#             m = m_new
# with:
#             p = torch.exp(s)                                            # no max subtracted
#             l = l + p.sum(-1)
#             acc = acc + p @ v[:, :, j:j + block_k]
#             m = torch.zeros_like(m)

# %% grade_id: tiled_attention | wrong: does not rescale l and acc when the max grows
# expect: multiply l and acc by exp(m_old - m_new)
# replace:
#             l = l * alpha + p.sum(-1)
#             acc = acc * alpha[..., None] + p @ v[:, :, j:j + block_k]
# with:
#             l = l + p.sum(-1)                                           # old sums not rescaled
#             acc = acc + p @ v[:, :, j:j + block_k]

# %% grade_id: tiled_attention | wrong: rescales l but not acc when the max grows
# expect: multiply acc (as well as l) by exp(m_old - m_new)
# replace:
#             acc = acc * alpha[..., None] + p @ v[:, :, j:j + block_k]
# with:
#             acc = acc + p @ v[:, :, j:j + block_k]

# %% grade_id: tiled_attention | wrong: causal diagonal off by one (a query does not see its own key)
# expect: off by one
# replace:
#                 s = s.masked_fill(cols > rows, float("-inf"))
# with:
#                 s = s.masked_fill(cols >= rows, float("-inf"))

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
# expect: the whole [Nq, Nk] score matrix
# expect: the whole score matrix is not allowed; work tile by tile
# expect score: 0
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


# %% grade_id: tiled_attention | cheat: the whole score matrix at once in float32, normalised in place by hand (half the memory)
# expect: the whole [Nq, Nk] score matrix
# expect score: 0
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    s = q.float() @ k.float().transpose(-1, -2)
    s.mul_(1 / math.sqrt(q.shape[-1]))
    if causal:
        s.masked_fill_(torch.arange(n_k)[None, :] > torch.arange(n_q)[:, None] + n_k - n_q,
                       float("-inf"))
    m = s.amax(-1, keepdim=True)
    s.sub_(m).exp_()
    l = s.sum(-1, keepdim=True)
    return (s @ v.float() / l).to(q.dtype), (m + torch.log(l)).squeeze(-1).to(q.dtype)


# %% grade_id: tiled_attention | cheat: query tiles only: each tile's whole rows of scores over all keys, normalised by hand
# expect: or a query tile's whole rows of scores
# expect score: 0
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    for i in range(0, n_q, block_q):
        s = q[:, :, i:i + block_q] @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            rows = torch.arange(i, i + s.shape[2])[:, None] + n_k - n_q
            s = s.masked_fill(torch.arange(n_k)[None, :] > rows, float("-inf"))
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        l = p.sum(-1, keepdim=True)
        out[:, :, i:i + block_q] = p @ v / l
        lse[:, :, i:i + block_q] = (m + torch.log(l)).squeeze(-1)
    return out, lse


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

# %% grade_id: tiled_attention | cheat: torch's own CPU flash kernel (tiled, returns the lse), fetched from torch.ops.aten by a built name
# expect: may not reach torch's internals
# expect score: 0
import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    fused = getattr(torch.ops.aten, "_scaled_dot_" + "product_flash_attention_for_cpu")
    n_q, n_k = q.shape[2], k.shape[2]
    if causal and n_q != n_k:   # its causal mask is anchored at the first key: pad the queries
        pad = q.new_zeros(q.shape[0], q.shape[1], n_k - n_q, q.shape[3])
        out, lse = fused(torch.cat([pad, q], 2), k, v, is_causal=True)[:2]
        return out[:, :, n_k - n_q:], lse[:, :, n_k - n_q:]
    out, lse = fused(q, k, v, is_causal=causal)[:2]
    return out, lse


# %% grade_id: tiled_attention | cheat: honest tiles, but each tile's log-sum-exp is the last entry of torch.logcumsumexp
# expect: which this exercise forbids
# expect score: 0
import math

import torch

LSE = torch.logcumsumexp


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    for i in range(0, n_q, block_q):
        qt = q[:, :, i:i + block_q] / math.sqrt(q.shape[-1])
        rows = torch.arange(i, i + qt.shape[2])[:, None] + n_k - n_q
        run_lse = qt.new_full(qt.shape[:3], float("-inf"))
        acc = torch.zeros_like(qt)
        for j in range(0, n_k, block_k):
            s = qt @ k[:, :, j:j + block_k].transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            both = torch.stack([run_lse, LSE(s, -1)[..., -1]], -1)
            new = LSE(both, -1)[..., -1]
            safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
            acc = acc * torch.exp(run_lse - safe)[..., None] \
                + torch.exp(s - safe[..., None]) @ v[:, :, j:j + block_k]
            run_lse = new
        out[:, :, i:i + block_q], lse[:, :, i:i + block_q] = acc, run_lse
    return out, lse


# %% grade_id: tiled_attention | cheat: honest tiles, each tile's log-sum-exp from torch's private torch._logcumsumexp (which no guard wraps)
# expect: may not reach torch's internals
# expect score: 0
import math

import torch

LSE = torch._logcumsumexp


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    for i in range(0, n_q, block_q):
        qt = q[:, :, i:i + block_q] / math.sqrt(q.shape[-1])
        rows = torch.arange(i, i + qt.shape[2])[:, None] + n_k - n_q
        run_lse = qt.new_full(qt.shape[:3], float("-inf"))
        acc = torch.zeros_like(qt)
        for j in range(0, n_k, block_k):
            s = qt @ k[:, :, j:j + block_k].transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            both = torch.stack([run_lse, LSE(s, -1)[..., -1]], -1)
            new = LSE(both, -1)[..., -1]
            safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
            acc = acc * torch.exp(run_lse - safe)[..., None] \
                + torch.exp(s - safe[..., None]) @ v[:, :, j:j + block_k]
            run_lse = new
        out[:, :, i:i + block_q], lse[:, :, i:i + block_q] = acc, run_lse
    return out, lse


# %% grade_id: tiled_attention | cheat: imports the reference implementation
# expect: is not allowed
from reference.kernels.torch_reference import tiled_attention as _tiled


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    return _tiled(q, k, v, causal=causal, block_m=block_q, block_n=block_k)

# %% grade_id: tiled_attention | cheat: key tiles, but each tile's scores written into one preallocated [Nq, Nk] matrix, normalised at the end
# expect: the whole [Nq, Nk] score matrix
# expect score: 0
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    scores = q.new_empty(*q.shape[:3], n_k)
    for j in range(0, n_k, block_k):
        scores[..., j:j + block_k] = q @ k[:, :, j:j + block_k].transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores.masked_fill_(torch.arange(n_k)[None, :] > torch.arange(n_q)[:, None] + n_k - n_q,
                            float("-inf"))
    m = scores.amax(-1, keepdim=True)
    scores.sub_(m).exp_()
    l = scores.sum(-1, keepdim=True)
    return scores @ v / l, (m + torch.log(l)).squeeze(-1)


# %% grade_id: tiled_attention | cheat: key tiles kept in a list (each [Nq, block_k]), every row's max and sum taken over the list at the end
# expect: the whole [Nq, Nk] score matrix
# expect score: 0
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    rows = torch.arange(n_q)[:, None] + n_k - n_q
    tiles = []
    for j in range(0, n_k, block_k):
        s = q @ k[:, :, j:j + block_k].transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
        tiles.append(s)
    m = torch.stack([t.amax(-1) for t in tiles], -1).amax(-1)
    ps = [torch.exp(t - m[..., None]) for t in tiles]
    l = sum(p.sum(-1) for p in ps)
    acc = sum(p @ v[:, :, j * block_k:(j + 1) * block_k] for j, p in enumerate(ps))
    return acc / l[..., None], m + torch.log(l)

# %% grade_id: tiled_attention | cheat: the whole score matrix wherever it fits, tiles only where the memory limit would see it
# expect: the size of the whole [Nq, Nk] score matrix
# expect score: 0
def tiled_attention(q, k, v, block_q, block_k, causal=False):
    batch, heads, n_q, dim = q.shape
    n_k = k.shape[2]
    if n_q * n_k * q.element_size() > 2**28:      # the case the limit is for: tile honestly
        out, lse = torch.empty_like(q), q.new_empty(batch, heads, n_q)
        for i in range(0, n_q, block_q):
            q_tile = q[:, :, i:i + block_q] / math.sqrt(dim)
            m = q.new_full(q_tile.shape[:3], float("-inf"))
            l, acc = torch.zeros_like(m), torch.zeros_like(q_tile)
            for j in range(0, n_k, block_k):
                s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)
                m_new = torch.maximum(m, s.amax(-1))
                alpha, p = torch.exp(m - m_new), torch.exp(s - m_new[..., None])
                l, acc, m = l * alpha + p.sum(-1), acc * alpha[..., None] + p @ v[:, :, j:j + block_k], m_new
            out[:, :, i:i + block_q], lse[:, :, i:i + block_q] = acc / l[..., None], m + torch.log(l)
        return out, lse
    s = q @ k.transpose(-1, -2) / math.sqrt(dim)
    if causal:
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(n_k - n_q + 1), float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    return p @ v / l, (m + torch.log(l))[..., 0]


# %% grade_id: tiled_attention | cheat: two passes over the key tiles: the row max first, then l and acc measured from it (no rescale)
# expect: times the product work of one pass
# expect: Flash attention is ONE pass over the keys
# expect score: 0
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] / math.sqrt(q.shape[-1])
        rows = torch.arange(i, i + q_tile.shape[2])[:, None] + n_k - n_q

        def scores(j):
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            return s

        m = q.new_full(q_tile.shape[:3], float("-inf"))
        for j in range(0, n_k, block_k):                  # pass 1: the max
            m = torch.maximum(m, scores(j).amax(-1))
        l, acc = torch.zeros_like(m), torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):                  # pass 2: the sums, from the final max
            p = torch.exp(scores(j) - m[..., None])
            l, acc = l + p.sum(-1), acc + p @ v[:, :, j:j + block_k]
        out[:, :, i:i + block_q], lse[:, :, i:i + block_q] = acc / l[..., None], m + torch.log(l)
    return out, lse


# %% grade_id: tiled_attention | cheat: two passes, the first one's scores from a broadcast product and a sum instead of a matmul (no product counted twice, it hopes)
# expect: times the product work of one pass
# expect score: 0
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] / math.sqrt(q.shape[-1])
        rows = torch.arange(i, i + q_tile.shape[2])[:, None] + n_k - n_q
        m = q.new_full(q_tile.shape[:3], float("-inf"))
        for j in range(0, n_k, block_k):                  # pass 1: the max, without a matmul
            s = (q_tile[:, :, :, None, :] * k[:, :, None, j:j + block_k, :]).sum(-1)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            m = torch.maximum(m, s.amax(-1))
        l, acc = torch.zeros_like(m), torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):                  # pass 2: the sums, from the final max
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            p = torch.exp(s - m[..., None])
            l, acc = l + p.sum(-1), acc + p @ v[:, :, j:j + block_k]
        out[:, :, i:i + block_q], lse[:, :, i:i + block_q] = acc / l[..., None], m + torch.log(l)
    return out, lse


# %% grade_id: tiled_attention | cheat: two passes, the first one's scores from q and k repeated to [bq, bk, D] (factors as large as their product, no broadcast), multiplied and summed
# expect: times the product work of one pass
# expect: in elementwise products of two tensors
# expect: however its factors were made
# expect score: 0
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] / math.sqrt(q.shape[-1])
        rows = torch.arange(i, i + q_tile.shape[2])[:, None] + n_k - n_q
        m = q.new_full(q_tile.shape[:3], float("-inf"))
        for j in range(0, n_k, block_k):                  # pass 1: the max, without a matmul
            k_tile = k[:, :, j:j + block_k]
            q_copies = q_tile.unsqueeze(3).repeat(1, 1, 1, k_tile.shape[2], 1)   # [B, H, bq, bk, D]
            k_copies = k_tile.unsqueeze(2).repeat(1, 1, q_tile.shape[2], 1, 1)  # [B, H, bq, bk, D]
            s = (q_copies * k_copies).sum(-1)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            m = torch.maximum(m, s.amax(-1))
        l, acc = torch.zeros_like(m), torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):                  # pass 2: the sums, from the final max
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            p = torch.exp(s - m[..., None])
            l, acc = l + p.sum(-1), acc + p @ v[:, :, j:j + block_k]
        out[:, :, i:i + block_q], lse[:, :, i:i + block_q] = acc / l[..., None], m + torch.log(l)
    return out, lse


# %% grade_id: tiled_attention | cheat: two passes, the first one's scores from each key tile expanded to every query row and made contiguous (a copy), times the broadcast queries, summed
# expect: times the product work of one pass
# expect score: 0
import math

import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] / math.sqrt(q.shape[-1])
        rows = torch.arange(i, i + q_tile.shape[2])[:, None] + n_k - n_q
        m = q.new_full(q_tile.shape[:3], float("-inf"))
        for j in range(0, n_k, block_k):                  # pass 1: the max, without a matmul
            k_tile = k[:, :, j:j + block_k]
            k_copies = k_tile.unsqueeze(2).expand(-1, -1, q_tile.shape[2], -1, -1).contiguous()
            s = (q_tile.unsqueeze(3) * k_copies).sum(-1)  # one factor as large as the product
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            m = torch.maximum(m, s.amax(-1))
        l, acc = torch.zeros_like(m), torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):                  # pass 2: the sums, from the final max
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            p = torch.exp(s - m[..., None])
            l, acc = l + p.sum(-1), acc + p @ v[:, :, j:j + block_k]
        out[:, :, i:i + block_q], lse[:, :, i:i + block_q] = acc / l[..., None], m + torch.log(l)
    return out, lse


# %% grade_id: score_tile_kernel | wrong: the lanes past n_keys (loaded as 0) count in the tile's max and sum
# expect: the lanes past n_keys counted in the max and the sum
# replace:
#     s = tl.where(key_ok[None, :], s, float("-inf"))                 # missing keys do not count
# with:

# %% grade_id: score_tile_kernel | wrong: stores the scores of every lane, keys past n_keys too
# expect: the kernel wrote scores outside its
# replace:
#              mask=row_ok[:, None] & key_ok[None, :])
# with:
#              mask=row_ok[:, None])

# %% grade_id: score_tile_kernel | wrong: the scores' rows stored n_keys apart (the row stride taken as the row's length), the store's mask right
# expect: elements per row apart, but the rows of that buffer are stride_sm
# replace:
#     tl.store(s_ptr + rows[:, None] * stride_sm + keys[None, :], s,
# with:
#     tl.store(s_ptr + rows[:, None] * n_keys + keys[None, :], s,


# %% grade_id: score_tile_kernel | wrong: forgets the scale
# expect: multiply q kᵀ by scale (once)
# replace:
#     s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale     # [BLOCK_M, BLOCK_N]
# with:
#     s = tl.dot(q, tl.trans(k), input_precision="ieee")

# %% grade_id: score_tile_kernel | wrong: l from the raw exponentials, not measured from the tile's max
# expect: l is measured from the tile's max
# replace:
#     l = tl.sum(tl.exp(s - m[:, None]), axis=1)
# with:
#     l = tl.sum(tl.exp(s), axis=1)

# %% grade_id: score_tile_kernel | cheat: broadcast products and a sum instead of tl.dot
# expect: with one tl.dot
# replace:
#     s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale     # [BLOCK_M, BLOCK_N]
# with:
#     s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale

# %% grade_id: score_tile_kernel | cheat: tiles of the 16 rows and keys the grader happens to launch with, not BLOCK_M and BLOCK_N
# expect: size every tile by the launcher's BLOCK_M, BLOCK_N and HEAD_DIM
# replace:
#     rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
#     keys = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
# with:
#     rows = tl.program_id(0) * 16 + tl.arange(0, 16)
#     keys = tl.program_id(1) * 16 + tl.arange(0, 16)

# %% grade_id: score_tile_kernel | wrong: masks the missing keys with a module-level constant that is not a tl.constexpr (the interpreter reads it; no GPU compiler takes it)
# expect: would run on no GPU
# expect: Cannot access global variable NO_KEY
# expect score: 1.5
# replace:
# import triton.language as tl
# with:
# import triton.language as tl
#
# NO_KEY = -1.0e30          # the score of a lane past n_keys: exp of it minus the max is 0

# replace:
#     s = tl.where(key_ok[None, :], s, float("-inf"))                 # missing keys do not count
# with:
#     s = tl.where(key_ok[None, :], s, NO_KEY)                        # missing keys do not count

# %% grade_id: flash_attention_fwd_kernel | wrong: does not rescale the accumulator when the max grows
# expect: exp(m_old - m_new)
# replace:
#         acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
# with:
#         acc = acc + tl.dot(p, v, input_precision="ieee")        # acc not rescaled

# %% grade_id: flash_attention_fwd_kernel | wrong: causal diagonal off by one
# expect: off by one
# replace:
#             visible = visible & (start_n + keys[None, :] <= rows[:, None] + offset)
# with:
#             visible = visible & (start_n + keys[None, :] < rows[:, None] + offset)

# %% grade_id: flash_attention_fwd_kernel | wrong: drops the tail key tile when n_keys is not a multiple of BLOCK_N
# expect: partial key tile was skipped
# replace:
#     for start_n in range(0, end, BLOCK_N):
# with:
#     for start_n in range(0, end // BLOCK_N * BLOCK_N, BLOCK_N):   # whole tiles only

# %% grade_id: flash_attention_fwd_kernel | wrong: leaves the key loop with `break` (the interpreter runs it; no GPU compiler takes it)
# expect: would run on no GPU
# expect: Break
# expect score: 3.2
# replace:
#     for start_n in range(0, end, BLOCK_N):
#         key_ok = start_n + keys < n_keys
# with:
#     for start_n in range(0, n_keys, BLOCK_N):
#         if start_n >= end:                                  # the causal tiles past the diagonal
#             break
#         key_ok = start_n + keys < n_keys

# %% grade_id: flash_attention_fwd_kernel | cheat: loads all of K in one fixed 64-key tile (fits the small test shapes)
# expect: tl.arange must span
# replace:
#     for start_n in range(0, end, BLOCK_N):
#         key_ok = start_n + keys < n_keys
#         k = tl.load(k_tile_ptrs + start_n * stride_kn, mask=key_ok[:, None], other=0.0)
# with:
#     for start_n in range(0, 1):                             # all keys in one 64-wide tile
#         keys = tl.arange(0, 64)
#         key_ok = keys < n_keys
#         k = tl.load(k_ptr + kv_head * stride_kh + keys[:, None] * stride_kn + dims[None, :],
#                     mask=key_ok[:, None], other=0.0)

# replace:
#         v = tl.load(v_tile_ptrs + start_n * stride_vn, mask=key_ok[:, None], other=0.0)
# with:
#         v = tl.load(v_ptr + kv_head * stride_vh + keys[:, None] * stride_vn + dims[None, :],
#                     mask=key_ok[:, None], other=0.0)

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
# expect: forbidden in this exercise
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
# replace:
#         s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale  # [BLOCK_M, BLOCK_N]
# with:
#         s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * sm_scale

# replace:
#         acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
# with:
#         acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)

# replace:
#     tl.store(lse_ptrs, m_i + tl.log(l_i), mask=row_ok)
# with:
#     tl.store(lse_ptrs, m_i + tl.log(l_i), mask=row_ok)
#     if HEAD_DIM < 0:   # never runs: only there for a look that searches the source for tl.dot
#         tl.dot(q, tl.trans(q))

# %% grade_id: flash_hbm_bytes | wrong: reads K and V once in total instead of once per query tile
# expect: once per query tile
# replace:
#             "flash": q_and_o + k_and_v * tiles + 4 * n_queries}
# with:
#             "flash": q_and_o + k_and_v + 4 * n_queries}

# %% grade_id: flash_hbm_bytes | wrong: rounds the number of query tiles down
# expect: round the number of query tiles up
# replace:
#     tiles = -(-n_queries // block_m)
# with:
#     tiles = n_queries // block_m

# %% grade_id: flash_hbm_bytes | wrong: counts S and P once each
# expect: four trips
# replace:
#     return {"naive": q_and_o + k_and_v + 4 * n_queries * n_keys * element_bytes,
# with:
#     return {"naive": q_and_o + k_and_v + 2 * n_queries * n_keys * element_bytes,

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


# %% grade_id: flash_attention_fwd_kernel | cheat: a first pass over K for each row's max, then the usual loop (K read twice, the numbers exact)
# expect: your kernel read K 2.00 times per query tile
# expect score: 0
# replace:
#     for start_n in range(0, end, BLOCK_N):
#         key_ok = start_n + keys < n_keys
# with:
#     for first_n in range(0, end, BLOCK_N):                  # a first pass for the row max
#         first_ok = first_n + keys < n_keys
#         k = tl.load(k_tile_ptrs + first_n * stride_kn, mask=first_ok[:, None], other=0.0)
#         s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
#         visible = first_ok[None, :]
#         if CAUSAL:
#             visible = visible & (first_n + keys[None, :] <= rows[:, None] + offset)
#         m_i = tl.maximum(m_i, tl.max(tl.where(visible, s, float("-inf")), axis=1))
#     for start_n in range(0, end, BLOCK_N):
#         key_ok = start_n + keys < n_keys

# %% grade_id: flash_attention_fwd_kernel | wrong: causal, but every key tile is loaded and masked instead of skipped
# expect: more often than the technique does
# expect score: 0
# replace:
#         end = tl.minimum(n_keys, start_m + BLOCK_M + offset)   # later key tiles are all masked
# with:
#         end = n_keys                                            # no tile skipped


# %% grade_id: tiled_attention | cheat: two passes, the first (each row's max) in numpy where the inputs are small, so that torch records one pass and its memory a tile; one pass with rescales on the large case
# expect: a way of taking tensor data out of torch
# expect score: 0
import math

import numpy as np
import torch


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] / math.sqrt(q.shape[-1])
        rows = torch.arange(i, i + q_tile.shape[2])[:, None] + n_k - n_q
        known = None
        if n_k <= 4096:                                   # pass 1, the max, out of the record
            s = q_tile.numpy() @ k.numpy().swapaxes(-1, -2)
            if causal:
                s = np.where(np.arange(n_k)[None, :] > rows.numpy(), -np.inf, s)
            known = torch.from_numpy(s.max(-1)).to(q.dtype)
        m = q.new_full(q_tile.shape[:3], float("-inf")) if known is None else known
        l, acc = torch.zeros_like(m), torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):                  # pass 2 (the only one on the large case)
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            m_new = m if known is not None else torch.maximum(m, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - safe[..., None])
            if known is None:
                alpha = torch.exp(m - safe)
                l, acc = l * alpha, acc * alpha[..., None]
            l, acc, m = l + p.sum(-1), acc + p @ v[:, :, j:j + block_k], m_new
        out[:, :, i:i + block_q], lse[:, :, i:i + block_q] = acc / l[..., None], m + torch.log(l)
    return out, lse


# %% grade_id: attend_tile | cheat: the whole step in Python arithmetic on values read from str(t) (no value read one at a time, nothing named), returned through torch.tensor: torch records no product and no exponential
# expect: the work was not done with torch operations the grader can see
# expect score: 0
import math

import torch


def _numbers(t, size):
    """t's values, read from its printed form, in rows of ``size``."""
    torch.set_printoptions(precision=17, threshold=10**9, linewidth=10**9)
    text = str(t.reshape(-1).double())
    flat = [float(x) for x in text[text.index("[") + 1:text.index("]")].split(",")]
    return [flat[i:i + size] for i in range(0, len(flat), size)]


def attend_tile(acc, m, l, q, k, v, scale: float, visible=None):
    n_q, dim, n_k = q.shape[-2], q.shape[-1], k.shape[-2]
    if visible is None:
        visible = torch.ones(n_q, n_k, dtype=torch.bool)
    Q, A = _numbers(q, n_q * dim), _numbers(acc, n_q * dim)
    K, V = _numbers(k, n_k * dim), _numbers(v, n_k * dim)
    M, L = _numbers(m, n_q), _numbers(l, n_q)
    S = _numbers(visible.expand(*q.shape[:-1], n_k), n_q * n_k)
    out_acc, out_m, out_l = [], [], []
    for b in range(len(Q)):
        for i in range(n_q):
            s = [scale * sum(Q[b][i * dim + d] * K[b][j * dim + d] for d in range(dim))
                 if S[b][i * n_k + j] else -math.inf for j in range(n_k)]
            m_new = max([M[b][i]] + s)
            safe = 0.0 if m_new == -math.inf else m_new
            alpha = math.exp(M[b][i] - safe)
            p = [math.exp(x - safe) for x in s]
            out_l.append(L[b][i] * alpha + sum(p))
            out_m.append(m_new)
            out_acc.append([A[b][i * dim + d] * alpha + sum(p[j] * V[b][j * dim + d] for j in range(n_k))
                            for d in range(dim)])
    return (torch.tensor(out_acc, dtype=acc.dtype).reshape(acc.shape),
            torch.tensor(out_m, dtype=m.dtype).reshape(m.shape),
            torch.tensor(out_l, dtype=l.dtype).reshape(l.shape))


# %% grade_id: tiled_attention | cheat: two passes, the first (each row's max) in Python on values read one at a time with float(x) (allowed, nothing named) where the inputs are small, so that torch records one pass; one pass with rescales on the large case
# expect: values out of tensors one at a time
# expect score: 0
def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k, dim = q.shape[2], k.shape[2], q.shape[3]
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    known = None
    if n_k <= 4096:                                       # pass 1, the max, out of the record
        qs = [[[float(x) for x in row] for row in head] for head in q.reshape(-1, n_q, dim)]
        ks = [[[float(x) for x in row] for row in head] for head in k.reshape(-1, n_k, dim)]
        known = torch.tensor([[max(sum(a * b for a, b in zip(qr, kr)) for j, kr in enumerate(kh)
                                   if not causal or j <= i + n_k - n_q) / math.sqrt(dim)
                               for i, qr in enumerate(qh)] for qh, kh in zip(qs, ks)],
                             dtype=q.dtype).reshape(q.shape[:3])
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] / math.sqrt(dim)
        rows = torch.arange(i, i + q_tile.shape[2])[:, None] + n_k - n_q
        m = q.new_full(q_tile.shape[:3], float("-inf")) if known is None else known[:, :, i:i + block_q]
        l, acc = torch.zeros_like(m), torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):                  # pass 2 (the only one on the large case)
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            m_new = m if known is not None else torch.maximum(m, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - safe[..., None])
            if known is None:
                alpha = torch.exp(m - safe)
                l, acc = l * alpha, acc * alpha[..., None]
            l, acc, m = l + p.sum(-1), acc + p @ v[:, :, j:j + block_k], m_new
        out[:, :, i:i + block_q], lse[:, :, i:i + block_q] = acc / l[..., None], m + torch.log(l)
    return out, lse


# %% grade_id: tiled_attention | cheat: two passes, the first (each row's max) in Python on values parsed from the printed tensors (torch formats str(t) with the dispatch modes off, so no operation reads them) where the inputs are small; one pass with rescales on the large case
# expect: printing a tensor reads all its values
# expect score: 0
def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k, dim = q.shape[2], k.shape[2], q.shape[3]
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    known = None
    if n_k <= 4096:                                       # pass 1, the max, out of the record
        torch.set_printoptions(precision=8, threshold=10**9, linewidth=10**9)
        text = [str(x.reshape(-1)) for x in (q, k)]
        torch.set_printoptions(profile="default")
        qv, kv = ([float(w) for w in t[t.index("[") + 1:t.index("]")].split(",")] for t in text)
        qs = [[qv[(h * n_q + r) * dim:(h * n_q + r + 1) * dim] for r in range(n_q)]
              for h in range(len(qv) // (n_q * dim))]
        ks = [[kv[(h * n_k + r) * dim:(h * n_k + r + 1) * dim] for r in range(n_k)]
              for h in range(len(kv) // (n_k * dim))]
        known = torch.tensor([[max(sum(a * b for a, b in zip(qr, kr)) for j, kr in enumerate(kh)
                                   if not causal or j <= i + n_k - n_q) / math.sqrt(dim)
                               for i, qr in enumerate(qh)] for qh, kh in zip(qs, ks)],
                             dtype=q.dtype).reshape(q.shape[:3])
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] / math.sqrt(dim)
        rows = torch.arange(i, i + q_tile.shape[2])[:, None] + n_k - n_q
        m = q.new_full(q_tile.shape[:3], float("-inf")) if known is None else known[:, :, i:i + block_q]
        l, acc = torch.zeros_like(m), torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):                  # pass 2 (the only one on the large case)
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            m_new = m if known is not None else torch.maximum(m, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - safe[..., None])
            if known is None:
                alpha = torch.exp(m - safe)
                l, acc = l * alpha, acc * alpha[..., None]
            l, acc, m = l + p.sum(-1), acc + p @ v[:, :, j:j + block_k], m_new
        out[:, :, i:i + block_q], lse[:, :, i:i + block_q] = acc / l[..., None], m + torch.log(l)
    return out, lse


# %% grade_id: tiled_attention | cheat: two passes, the first one (each row's max over the key tiles) run inside a tensor subclass's __torch_dispatch__, which torch calls with the recorder set aside
# expect: a tensor subclass with its own __torch_dispatch__
# expect score: 0
import math

import torch

JOB = {}


class RowMax(torch.Tensor):
    """Any operation on one of these runs the first pass here, out of the recorder's sight."""
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        q_tile, k, block_k, causal, rows = JOB["pass 1"]
        m = q_tile.new_full(q_tile.shape[:3], float("-inf"))
        for j in range(0, k.shape[2], block_k):
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            m = torch.maximum(m, s.amax(-1))
        JOB["max"] = m
        return torch.zeros(())


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] / math.sqrt(q.shape[-1])
        rows = torch.arange(i, i + q_tile.shape[2])[:, None] + n_k - n_q
        JOB["pass 1"] = (q_tile, k, block_k, causal, rows)
        torch.zeros(1).as_subclass(RowMax) + 0                  # pass 1, unseen
        m = JOB["max"]
        l, acc = torch.zeros_like(m), torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):                        # pass 2, from the final max
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            p = torch.exp(s - m[..., None])
            l, acc = l + p.sum(-1), acc + p @ v[:, :, j:j + block_k]
        out[:, :, i:i + block_q], lse[:, :, i:i + block_q] = acc / l[..., None], m + torch.log(l)
    return out, lse


# %% grade_id: tiled_attention | cheat: two passes, the first one run with torch's dispatch modes disabled, the function fetched by class patterns (`case object(_python_dispatch=...)`), no private attribute written
# expect score: 0
import math

import torch

match torch.utils:
    case object(_python_dispatch=dispatch):
        match dispatch:
            case object(_disable_current_modes=modes_off):
                pass


def tiled_attention(q, k, v, block_q: int, block_k: int, causal: bool = False):
    n_q, n_k = q.shape[2], k.shape[2]
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    for i in range(0, n_q, block_q):
        q_tile = q[:, :, i:i + block_q] / math.sqrt(q.shape[-1])
        rows = torch.arange(i, i + q_tile.shape[2])[:, None] + n_k - n_q
        m = q.new_full(q_tile.shape[:3], float("-inf"))
        with modes_off():
            for j in range(0, n_k, block_k):                    # pass 1, unseen
                s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)
                if causal:
                    s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
                m = torch.maximum(m, s.amax(-1))
        l, acc = torch.zeros_like(m), torch.zeros_like(q_tile)
        for j in range(0, n_k, block_k):                        # pass 2
            s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, float("-inf"))
            p = torch.exp(s - m[..., None])
            l, acc = l + p.sum(-1), acc + p @ v[:, :, j:j + block_k]
        out[:, :, i:i + block_q], lse[:, :, i:i + block_q] = acc / l[..., None], m + torch.log(l)
    return out, lse


# %% grade_id: tiled_attention | wrong: no running max, the exponentials taken in float64 (exp overflows only above ~709, not ~88)
# expect: subtract the running max
# replace:
#         q_tile = q[:, :, i:i + block_q] * scale                        # [B, H, bq, D]
# with:
#         q_tile = q[:, :, i:i + block_q].double() * scale               # float64: room for exp
# replace:
#         l = torch.zeros_like(m)
#         acc = torch.zeros_like(q_tile)
# with:
#         l = torch.zeros_like(m, dtype=torch.float64)
#         acc = torch.zeros_like(q_tile)
# replace:
#             s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)     # [B, H, bq, bk]
# with:
#             s = q_tile @ k[:, :, j:j + block_k].double().transpose(-1, -2)
# replace:
#             m_new = torch.maximum(m, s.amax(-1))
#             safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # no key seen yet
#             alpha = torch.exp(m - safe)                                 # rescales the old sums
#             p = torch.exp(s - safe[..., None])
#             l = l * alpha + p.sum(-1)
#             acc = acc * alpha[..., None] + p @ v[:, :, j:j + block_k]
#             m = m_new
# with:
#             p = torch.exp(s)                                            # no max: float64 holds it
#             l = l + p.sum(-1)
#             acc = acc + p @ v[:, :, j:j + block_k].double()
# replace:
#         lse[:, :, i:i + block_q] = m + torch.log(l)
# with:
#         lse[:, :, i:i + block_q] = torch.log(l)

# %% grade_id: tiled_attention | wrong: subtracts each row's max of the FIRST key tile and never updates it (float64, so later tiles have ~709 of room)
# expect: subtract the running max
# replace:
#         q_tile = q[:, :, i:i + block_q] * scale                        # [B, H, bq, D]
# with:
#         q_tile = q[:, :, i:i + block_q].double() * scale               # float64: room for exp
# replace:
#         l = torch.zeros_like(m)
#         acc = torch.zeros_like(q_tile)
# with:
#         l = torch.zeros_like(m, dtype=torch.float64)
#         acc = torch.zeros_like(q_tile)
#         m = None
# replace:
#             s = q_tile @ k[:, :, j:j + block_k].transpose(-1, -2)     # [B, H, bq, bk]
# with:
#             s = q_tile @ k[:, :, j:j + block_k].double().transpose(-1, -2)
# replace:
#             m_new = torch.maximum(m, s.amax(-1))
#             safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # no key seen yet
#             alpha = torch.exp(m - safe)                                 # rescales the old sums
#             p = torch.exp(s - safe[..., None])
#             l = l * alpha + p.sum(-1)
#             acc = acc * alpha[..., None] + p @ v[:, :, j:j + block_k]
#             m = m_new
# with:
#             if m is None:                                               # the first tile's max
#                 m = s.amax(-1)
#                 m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
#             p = torch.exp(s - m[..., None])
#             l = l + p.sum(-1)
#             acc = acc + p @ v[:, :, j:j + block_k].double()

# %% grade_id: attend_tile | wrong: no running max: the old sums taken back to absolute ones in float64 (l * exp(m) + sum exp(s)), measured from the new max only on return
# expect: subtract the running max before exp
import torch


def attend_tile(acc, m, l, q, k, v, scale, visible=None):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    m_new = torch.maximum(m.double(), s.amax(-1))
    safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    p = torch.exp(s)                                     # float64: no overflow below ~709
    keep = torch.exp(m.double())                         # the old sums, absolute
    back = torch.exp(-safe)
    total = l.double() * keep + p.sum(-1)
    out = acc.double() * keep[..., None] + p @ v.double()
    return ((out * back[..., None]).to(acc.dtype), m_new.to(m.dtype),
            (total * back).to(l.dtype))


# %% grade_id: flash_attention_fwd_kernel | wrong: no running max, sums exp of the raw scores in float64 (right while every score stays under ~709: it passed a large case whose scores reached ~130)
# expect: exp of a raw score overflows above ~88 in float32 (~709 in float64)
# replace:
#     l_i = tl.zeros([BLOCK_M], tl.float32)
#     acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
# with:
#     l_i = tl.zeros([BLOCK_M], tl.float64)
#     acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float64)
# replace:
#         m_new = tl.maximum(m_i, tl.max(s, axis=1))              # finite: key 0 is in tile 0
#         alpha = tl.exp(m_i - m_new)
#         p = tl.exp(s - m_new[:, None])
#         l_i = l_i * alpha + tl.sum(p, axis=1)
#         v = tl.load(v_tile_ptrs + start_n * stride_vn, mask=key_ok[:, None], other=0.0)
#         acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
#         m_i = m_new
#     tl.store(out_ptrs, acc / l_i[:, None], mask=row_ok[:, None])
#     tl.store(lse_ptrs, m_i + tl.log(l_i), mask=row_ok)
# with:
#         p = tl.exp(s.to(tl.float64))                            # no max: float64 holds it
#         l_i = l_i + tl.sum(p, axis=1)
#         v = tl.load(v_tile_ptrs + start_n * stride_vn, mask=key_ok[:, None], other=0.0)
#         acc = acc + tl.dot(p, v.to(tl.float64))
#     tl.store(out_ptrs, (acc / l_i[:, None]).to(tl.float32), mask=row_ok[:, None])
#     tl.store(lse_ptrs, tl.log(l_i).to(tl.float32), mask=row_ok)
