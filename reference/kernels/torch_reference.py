"""The algorithms of chapters 05-07 in plain PyTorch, written to be read before the kernels.

Conventions: q [B, Hq, Nq, D], k and v [B, Hkv, Nk, D] with Hq a multiple of Hkv (query head h
reads K/V head h // (Hq // Hkv)). Causal attention with Nq <= Nk is aligned to the end: query i
sees keys j <= i + (Nk - Nq), so the last query sees every key (prefill after a cached prefix).
A softmax state of a row over some keys is (m, l, acc): the largest score m, the sum
l = sum exp(s - m), and the unnormalised output acc = sum exp(s - m) v. The output is acc / l.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def causal_mask(n_queries: int, n_keys: int, device=None) -> Tensor:
    """Bool [Nq, Nk], True where query i may see key j (j <= i + Nk - Nq)."""
    rows = torch.arange(n_queries, device=device)[:, None] + (n_keys - n_queries)
    return torch.arange(n_keys, device=device)[None, :] <= rows


def naive_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                    sm_scale: float | None = None) -> tuple[Tensor, Tensor]:
    """The whole score matrix at once: (out [B, Hq, Nq, D], lse [B, Hq, Nq]) in q's dtype.

    Run it in float64 to get the reference the kernels are tested against.
    """
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-1, -2) * scale                       # [B, Hq, Nq, Nk]
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def online_softmax(scores: Tensor, tile: int) -> Tensor:
    """Softmax over the last dim, reading `tile` columns at a time with a running max and sum.

    When a tile raises the max from m_old to m_new, the sum so far is rescaled by
    exp(m_old - m_new); a second sweep writes exp(s - m) / l.
    """
    m = torch.full(scores.shape[:-1], float("-inf"), dtype=scores.dtype, device=scores.device)
    l = torch.zeros_like(m)
    for start in range(0, scores.shape[-1], tile):
        block = scores[..., start:start + tile]
        m_new = torch.maximum(m, block.amax(dim=-1))
        # While every score so far is -inf, m_new is -inf too: shift by 0 instead, so that
        # exp(-inf - -inf) = NaN never appears (those terms are exactly 0).
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        l = l * torch.exp(m - shift) + torch.exp(block - shift[..., None]).sum(dim=-1)
        m = m_new
    return torch.exp(scores - m[..., None]) / l[..., None]


def merge_softmax_states(a: tuple[Tensor, Tensor, Tensor],
                         b: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """Combine the states (m [...], l [...], acc [..., D]) of two disjoint sets of keys.

    Both are brought to the common max m = max(m_a, m_b). A state over no keys is
    (-inf, 0, 0); it contributes nothing (its weight exp(-inf - m) is 0).
    """
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    safe_m = torch.where(torch.isinf(m), torch.zeros_like(m), m)   # both empty: avoid -inf - -inf
    w_a, w_b = torch.exp(m_a - safe_m), torch.exp(m_b - safe_m)
    return m, w_a * l_a + w_b * l_b, w_a[..., None] * acc_a + w_b[..., None] * acc_b


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                    sm_scale: float | None = None, block_m: int = 16,
                    block_n: int = 16) -> tuple[Tensor, Tensor]:
    """Flash attention's loop nest in PyTorch: (out, lse) without ever
    holding [Nq, Nk] scores.

    Outer loop over query tiles of `block_m` rows, inner loop over key/value
    tiles of `block_n` columns; each query row keeps its running state
    (m, l, acc) and merges one tile at a time.
    """
    group = q.shape[1] // k.shape[1]
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    n_q, n_k = q.shape[2], k.shape[2]
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    visible = causal_mask(n_q, n_k, q.device) if causal else None
    for h in range(q.shape[1]):
        k_h, v_h = k[:, h // group], v[:, h // group]      # GQA: no copies
        for i in range(0, n_q, block_m):
            q_tile = q[:, h, i:i + block_m]                  # [B, bm, D]
            m = q.new_full(q_tile.shape[:2], float("-inf"))
            l, acc = torch.zeros_like(m), torch.zeros_like(q_tile)
            for j in range(0, n_k, block_n):
                k_tile = k_h[:, j:j + block_n].transpose(-1, -2)
                s = q_tile @ k_tile * scale                  # [B, bm, bn]
                if causal:
                    hidden = ~visible[i:i + block_m, j:j + block_n]
                    s = s.masked_fill(hidden, float("-inf"))
                s_max = s.amax(-1)     # -inf where a row sees no key here
                shift = torch.where(torch.isinf(s_max), 0.0, s_max)
                p = torch.exp(s - shift[..., None])
                tile = (s_max, p.sum(-1), p @ v_h[:, j:j + block_n])
                m, l, acc = merge_softmax_states((m, l, acc), tile)
            out[:, h, i:i + block_m] = acc / l[..., None]
            lse[:, h, i:i + block_m] = m + torch.log(l)
    return out, lse


def split_decode_attention(q: Tensor, k: Tensor, v: Tensor, num_splits: int,
                           sm_scale: float | None = None) -> Tensor:
    """Flash decoding in PyTorch: q [B, Hq, D] against k, v [B, Hkv, N, D] -> [B, Hq, D].

    The N keys are cut into `num_splits` contiguous chunks (some may be empty); each chunk
    yields a state (m, l, acc) independently (on a GPU, in parallel), and the states are merged.
    """
    group = q.shape[1] // k.shape[1]
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    chunk = -(-k.shape[2] // num_splits)
    state = (q.new_full(q.shape[:2], float("-inf")), q.new_zeros(q.shape[:2]), torch.zeros_like(q))
    for start in range(0, chunk * num_splits, chunk):
        s = torch.einsum("bhd,bhnd->bhn", q, k[:, :, start:start + chunk]) * scale
        if s.shape[-1] == 0:
            continue                                                  # an empty chunk: state (-inf, 0, 0)
        m = s.amax(-1)
        p = torch.exp(s - m[..., None])
        state = merge_softmax_states(state, (m, p.sum(-1), torch.einsum("bhn,bhnd->bhd", p, v[:, :, start:start + chunk])))
    return state[2] / state[1][..., None]


def paged_attention_reference(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                              context_lens: Tensor, sm_scale: float | None = None) -> Tensor:
    """Decode attention through block tables, in float64: q [B, Hq, D] -> float64 [B, Hq, D].

    k_cache, v_cache [num_blocks, block_size, Hkv, D]; sequence b's key at position p is row
    p % block_size of block block_tables[b, p // block_size], for p < context_lens[b]. Gathers
    each sequence's keys into a contiguous [Hkv, n, D] and runs `naive_attention` on them.
    """
    block_size = k_cache.shape[1]
    k_rows, v_rows = k_cache.flatten(0, 1).double(), v_cache.flatten(0, 1).double()   # [slots, Hkv, D]
    outs = []
    for b in range(q.shape[0]):
        positions = torch.arange(int(context_lens[b]), device=q.device)
        slots = block_tables[b, positions // block_size].long() * block_size + positions % block_size
        k, v = k_rows[slots].transpose(0, 1), v_rows[slots].transpose(0, 1)                # [Hkv, n, D]
        outs.append(naive_attention(q[b, None, :, None].double(), k[None], v[None], sm_scale=sm_scale)[0][0, :, 0])
    return torch.stack(outs)
