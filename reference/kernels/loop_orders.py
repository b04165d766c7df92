"""The loop orders of chapter 05, run on one head with every HBM transfer counted.

q [Nq, d], k and v [Nk, d]. Each function returns the output [Nq, d] and fills
an `HBM` ledger with the bytes each named tensor moved between HBM and the
chip: tiles are loaded with `hbm.load` and results stored with `hbm.store`,
nothing else crosses. The closed forms of `reference.calculators.flash_traffic`
count the same bytes without running anything (tests/calculators/test_flash_traffic.py).
"""
from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor

STATISTICS = ("m", "l", "lse")        # per-row fp32 statistics


class HBM:
    """A ledger of bytes moved, by tensor name ("Q", "O", "m", ...).

    element_bytes: bytes per element of Q, K, V, O, S, P (2: fp16);
    stat_bytes: bytes per entry of m, l and the log-sum-exp (4: fp32).
    """

    def __init__(self, element_bytes: int = 2, stat_bytes: int = 4):
        self.element_bytes, self.stat_bytes = element_bytes, stat_bytes
        self.moved: Counter[str] = Counter()

    def _count(self, name: str, values: Tensor) -> None:
        size = self.stat_bytes if name in STATISTICS else self.element_bytes
        self.moved[name] += values.numel() * size

    def load(self, name: str, tile: Tensor) -> Tensor:
        """Bring `tile` (a view of tensor `name`) on chip."""
        self._count(name, tile)
        return tile.clone()

    def store(self, name: str, dest: Tensor, rows: slice,
              values: Tensor) -> None:
        """Write `values` to rows `rows` of tensor `name` (held in `dest`)."""
        self._count(name, values)
        dest[rows] = values

    def total(self) -> int:
        return sum(self.moved.values())


def standard_attention(q: Tensor, k: Tensor, v: Tensor,
                       hbm: HBM) -> Tensor:
    """Three kernels: S = Q K^T / sqrt(d), P = softmax(S), O = P V."""
    everything = slice(None)
    s = q.new_empty(q.shape[0], k.shape[0])
    hbm.store("S", s, everything,
              hbm.load("Q", q) @ hbm.load("K", k).T * q.shape[1] ** -0.5)
    p = torch.empty_like(s)
    hbm.store("P", p, everything, torch.softmax(hbm.load("S", s), dim=-1))
    out = torch.empty_like(q)
    hbm.store("O", out, everything, hbm.load("P", p) @ hbm.load("V", v))
    return out


def fa1_attention(q: Tensor, k: Tensor, v: Tensor, hbm: HBM,
                  block_r: int, block_c: int) -> Tensor:
    """FlashAttention 1 (Algorithm 1): K/V tiles outside, O, l, m in HBM."""
    n_q, n_k, scale = q.shape[0], k.shape[0], q.shape[1] ** -0.5
    everything = slice(None)
    out, l, m = torch.empty_like(q), q.new_empty(n_q), q.new_empty(n_q)
    hbm.store("O", out, everything, torch.zeros_like(q))
    hbm.store("l", l, everything, q.new_zeros(n_q))
    hbm.store("m", m, everything, q.new_full((n_q,), float("-inf")))
    for j in range(0, n_k, block_c):
        k_j = hbm.load("K", k[j:j + block_c])
        v_j = hbm.load("V", v[j:j + block_c])
        for i in range(0, n_q, block_r):
            rows = slice(i, i + block_r)
            q_i, o_i = hbm.load("Q", q[rows]), hbm.load("O", out[rows])
            l_i, m_i = hbm.load("l", l[rows]), hbm.load("m", m[rows])
            s = q_i @ k_j.T * scale
            m_tile = s.amax(-1)
            p = torch.exp(s - m_tile[:, None])
            m_new = torch.maximum(m_i, m_tile)
            old, new = torch.exp(m_i - m_new), torch.exp(m_tile - m_new)
            l_new = old * l_i + new * p.sum(-1)
            # o_i is stored normalised: undo the old 1/l, rescale, divide
            o_new = (l_i * old)[:, None] * o_i + new[:, None] * (p @ v_j)
            hbm.store("O", out, rows, o_new / l_new[:, None])
            hbm.store("l", l, rows, l_new)
            hbm.store("m", m, rows, m_new)
    return out


def fa2_attention(q: Tensor, k: Tensor, v: Tensor, hbm: HBM,
                  block_r: int, block_c: int) -> Tensor:
    """FlashAttention 2: query tiles outside, the state stays on chip."""
    n_q, n_k, scale = q.shape[0], k.shape[0], q.shape[1] ** -0.5
    out, lse = torch.empty_like(q), q.new_empty(n_q)
    for i in range(0, n_q, block_r):
        rows = slice(i, i + block_r)
        q_i = hbm.load("Q", q[rows])
        m = q_i.new_full((q_i.shape[0],), float("-inf"))
        l, acc = torch.zeros_like(m), torch.zeros_like(q_i)
        for j in range(0, n_k, block_c):
            k_j = hbm.load("K", k[j:j + block_c])
            v_j = hbm.load("V", v[j:j + block_c])
            s = q_i @ k_j.T * scale
            m_new = torch.maximum(m, s.amax(-1))
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new[:, None])
            l = alpha * l + p.sum(-1)
            acc = alpha[:, None] * acc + p @ v_j      # not divided by l
            m = m_new
        hbm.store("O", out, rows, acc / l[:, None])  # divided once, here
        hbm.store("lse", lse, rows, m + torch.log(l))
    return out
