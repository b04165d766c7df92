"""One attention function for MHA, GQA and MQA (and for absorbed MLA, which is MQA over a latent).

Grouped-query attention lets ``group = H_q / H_kv`` query heads share one K/V head. Copying each
K/V head ``group`` times (``repeat_interleave``) would rebuild the memory the cache just saved.
Instead the queries of one group are stacked as extra *rows*: q [B, H_q, T_q, D] is viewed as
[B, H_kv, group * T_q, D], and every K/V head is multiplied once by all the queries that use it.
No K or V element is copied; MHA is ``group == 1`` and MQA is ``H_kv == 1``.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


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

