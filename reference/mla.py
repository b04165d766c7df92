"""Multi-head latent attention (MLA, DeepSeek-V2/V3) with decoupled RoPE, in two equivalent forms.

Per token, a layer caches one latent c_kv = W_DKV h (``latent_dim``) and one RoPE key
k_r = RoPE(W_KR h) (``rope_dim``) shared by all heads: nothing else.

* naive: rebuild every head's key k_h = [W_UK,h c_kv ; k_r] and value v_h = W_UV,h c_kv from the
  cache, then run ordinary attention.
* absorbed: the content score q_hᵀ k_h = c_qᵀ (W_UQ,hᵀ W_UK,h) c_kv, so W_UQ,hᵀ W_UK,h is multiplied
  once at load time and queries are scored against the latent itself; likewise the output
  W_O,h W_UV,h c_kv folds W_UV into W_O. Absorbed MLA is MQA whose single K/V head is the cache.
  This only works because RoPE touches the separate k_r / q_r channel: a rotation R_t between
  W_UQ,hᵀ and W_UK,h would make the product depend on the positions.

Simplifications kept out of the way of the point: no RMSNorm on the latents, no biases.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from reference.attention import grouped_query_attention


def rope(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """Rotate interleaved pairs (x0, x1), (x2, x3), ... of x [..., T, D] by angle pos * base^(-2i/D)."""
    d = x.shape[-1]
    freqs = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.to(torch.float64)[:, None] * freqs[None, :]          # [T, D/2]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class LatentCache:
    """MLA cache: buffer [n_layers, batch, max_len, latent_dim + rope_dim], allocated once."""

    def __init__(self, n_layers: int, batch: int, max_len: int, latent_dim: int, rope_dim: int,
                 dtype: torch.dtype = torch.float32):
        self.buffer = torch.zeros(n_layers, batch, max_len, latent_dim + rope_dim, dtype=dtype)
        self.latent_dim, self.max_len = latent_dim, max_len
        self._lengths = [0] * n_layers

    @property
    def length(self) -> int:
        return self._lengths[-1]

    def append(self, layer: int, latent: Tensor, rope_key: Tensor) -> tuple[Tensor, Tensor]:
        """Store latent [B, T, latent_dim] and rope_key [B, T, rope_dim]; return both for the
        whole prefix: [B, S, latent_dim], [B, S, rope_dim] (views)."""
        start, T = self._lengths[layer], latent.shape[1]
        if start + T > self.max_len:
            raise ValueError(f"latent cache full: {start} + {T} tokens exceed max_len={self.max_len}")
        self.buffer[layer, :, start:start + T] = torch.cat((latent, rope_key), dim=-1)
        self._lengths[layer] = start + T
        held = self.buffer[layer, :, :start + T]
        return held[..., :self.latent_dim], held[..., self.latent_dim:]

    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


class MLA(nn.Module):
    """One MLA layer. h [B, T, d_model] -> [B, T, d_model]; ``mode`` picks naive or absorbed."""

    def __init__(self, d_model: int, n_heads: int, *, latent_dim: int, q_latent_dim: int,
                 nope_dim: int, rope_dim: int, v_dim: int, rope_base: float = 10000.0):
        super().__init__()
        self.n_heads, self.nope_dim, self.rope_dim, self.v_dim = n_heads, nope_dim, rope_dim, v_dim
        self.latent_dim, self.rope_base = latent_dim, rope_base
        self.w_dq = nn.Linear(d_model, q_latent_dim, bias=False)            # c_q = W_DQ h
        self.w_uq = nn.Linear(q_latent_dim, n_heads * nope_dim, bias=False)  # content queries
        self.w_qr = nn.Linear(q_latent_dim, n_heads * rope_dim, bias=False)  # RoPE queries
        self.w_dkv = nn.Linear(d_model, latent_dim, bias=False)             # c_kv = W_DKV h (cached)
        self.w_kr = nn.Linear(d_model, rope_dim, bias=False)                # k_r, shared by heads (cached)
        self.w_uk = nn.Linear(latent_dim, n_heads * nope_dim, bias=False)
        self.w_uv = nn.Linear(latent_dim, n_heads * v_dim, bias=False)
        self.w_o = nn.Linear(n_heads * v_dim, d_model, bias=False)
        self.scale = 1.0 / math.sqrt(nope_dim + rope_dim)  # the head's query/key width, as in training
        self._absorbed: tuple[Tensor, Tensor] | None = None   # filled by absorb()

    def absorb(self, weights: tuple[Tensor, Tensor] | None = None) -> None:
        """Precompute the absorbed matrices once (call again after changing the weights), or use
        the given (w_uqk, w_ouv) pair instead."""
        self._absorbed = weights if weights is not None else self.absorbed_weights()

    @torch.no_grad()
    def absorbed_weights(self) -> tuple[Tensor, Tensor]:
        """(W_UQK [H, q_latent_dim, latent_dim] = W_UQ,hᵀ W_UK,h per head,
            W_OUV [d_model, H * latent_dim] = W_O,h W_UV,h per head, side by side)."""
        H = self.n_heads
        w_uq = self.w_uq.weight.view(H, self.nope_dim, -1)        # [H, nope, q_latent]
        w_uk = self.w_uk.weight.view(H, self.nope_dim, -1)        # [H, nope, latent]
        w_uv = self.w_uv.weight.view(H, self.v_dim, -1)           # [H, v, latent]
        w_o = self.w_o.weight.view(-1, H, self.v_dim)             # [d_model, H, v]
        w_uqk = w_uq.transpose(1, 2) @ w_uk
        w_ouv = torch.einsum("dhv,hvc->dhc", w_o, w_uv).reshape(w_o.shape[0], -1)
        return w_uqk, w_ouv

    def new_cache(self, n_layers: int = 1, batch: int = 1, max_len: int = 256) -> LatentCache:
        return LatentCache(n_layers, batch, max_len, self.latent_dim, self.rope_dim,
                           dtype=self.w_dkv.weight.dtype)

    @torch.no_grad()
    def forward(self, h: Tensor, positions: Tensor | None = None, cache: LatentCache | None = None,
                layer: int = 0, mode: str = "naive") -> Tensor:
        """h [B, T, d_model]; positions [T] (default: continue the cache). Causal."""
        if mode not in ("naive", "absorbed"):
            raise ValueError(f"mode must be 'naive' or 'absorbed', got {mode!r}")
        B, T, _ = h.shape
        H = self.n_heads
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + T)
        c_q = self.w_dq(h)
        q_rope = rope(self.w_qr(c_q).view(B, T, H, self.rope_dim).transpose(1, 2), positions, self.rope_base)
        latent, rope_key = self.w_dkv(h), rope(self.w_kr(h), positions, self.rope_base)
        if cache is not None:
            latent, rope_key = cache.append(layer, latent, rope_key)   # [B, S, latent], [B, S, rope]
        S = latent.shape[1]
        if mode == "naive":
            q_nope = self.w_uq(c_q).view(B, T, H, self.nope_dim).transpose(1, 2)
            k_nope = self.w_uk(latent).view(B, S, H, self.nope_dim).transpose(1, 2)
            k = torch.cat((k_nope, rope_key[:, None].expand(B, H, S, self.rope_dim)), dim=-1)
            v = self.w_uv(latent).view(B, S, H, self.v_dim).transpose(1, 2)
            out = grouped_query_attention(torch.cat((q_nope, q_rope), -1), k, v, causal=True, scale=self.scale)
            return self.w_o(out.transpose(1, 2).reshape(B, T, H * self.v_dim))
        if self._absorbed is None:
            self.absorb()
        w_uqk, w_ouv = self._absorbed
        q_latent = torch.einsum("btq,hqc->bhtc", c_q, w_uqk)                  # [B, H, T, latent]
        keys = torch.cat((latent, rope_key), dim=-1)[:, None]                 # [B, 1, S, latent+rope]
        out = grouped_query_attention(torch.cat((q_latent, q_rope), -1), keys, latent[:, None],
                                      causal=True, scale=self.scale)          # [B, H, T, latent]
        return out.transpose(1, 2).reshape(B, T, H * self.latent_dim) @ w_ouv.T
