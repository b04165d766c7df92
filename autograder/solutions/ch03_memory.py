"""Solutions of exercises/ch03_memory.ipynb, one section per solution cell.

Loaded with ``autograder.solutions.load_solutions("ch03_memory")``.
"""

# %% grade_id: kv_cache_bytes
def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, tokens: int, batch: int = 1,
                   dtype: str = "fp16") -> int:
    """Bytes of the K and V caches of a standard (MHA / GQA / MQA) transformer.

    Each of `layers` layers keeps, for each of `batch` sequences and each of `tokens` positions,
    one key and one value vector of `head_dim` numbers per K/V head (`kv_heads`).
    dtype: "fp32" (4 bytes), "fp16" or "bf16" (2), "fp8" or "int8" (1), "int4" (half a byte;
    round the total up to whole bytes). Returns an int.
    Raises ValueError for a negative count or an unknown dtype.
    """
    bits = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}
    if dtype not in bits:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(bits)}")
    counts = dict(layers=layers, kv_heads=kv_heads, head_dim=head_dim, tokens=tokens, batch=batch)
    for name, value in counts.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    elements = 2 * layers * kv_heads * head_dim * tokens * batch
    return -(-elements * bits[dtype] // 8)


# %% grade_id: mla_kv_bytes
def mla_kv_bytes(layers: int, latent_dim: int, rope_dim: int, tokens: int, batch: int = 1,
                 dtype: str = "fp16") -> int:
    """Bytes of a multi-head latent attention (MLA) cache.

    Per layer, sequence and token the cache holds ONE latent vector of `latent_dim` numbers (keys
    and values are both rebuilt from it) and ONE RoPE key of `rope_dim` numbers shared by all heads.
    dtype as in kv_cache_bytes ("fp32", "fp16", "bf16", "fp8", "int8", "int4"). Returns an int.
    """
    bits = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}
    if dtype not in bits:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(bits)}")
    if min(layers, latent_dim, rope_dim, tokens, batch) < 0:
        raise ValueError("counts must be >= 0")
    elements = layers * (latent_dim + rope_dim) * tokens * batch
    return -(-elements * bits[dtype] // 8)


# %% grade_id: max_concurrent_sequences
def max_concurrent_sequences(gpu_bytes: int, weight_bytes: int, per_token_bytes: int,
                             tokens_per_seq: int, overhead_bytes: int = 0) -> int:
    """How many sequences of `tokens_per_seq` tokens fit in GPU memory at once.

    The weights and a fixed overhead (activations, runtime) come first; each sequence then needs
    per_token_bytes * tokens_per_seq bytes of KV cache. Returns a whole number >= 0 (0 when the
    weights and overhead alone do not fit). Raises ValueError when per_token_bytes or
    tokens_per_seq is not positive.
    """
    if per_token_bytes <= 0 or tokens_per_seq <= 0:
        raise ValueError("per_token_bytes and tokens_per_seq must be positive")
    free = gpu_bytes - weight_bytes - overhead_bytes
    return max(free, 0) // (per_token_bytes * tokens_per_seq)


# %% grade_id: gqa_attention
import math

import torch
from torch import Tensor


def gqa_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Grouped-query attention without copying K or V.

    q: [B, Hq, T, D]; k, v: [B, Hkv, S, D] with Hq a multiple of Hkv. Query head h uses K/V head
    h // (Hq // Hkv) (consecutive query heads share a K/V head; Hkv == 1 is MQA, Hkv == Hq is MHA).
    Returns softmax(q kᵀ / sqrt(D)) v, shape [B, Hq, T, D], dtype of q.
    causal: the T queries are the last T of the S positions; query i sees keys 0 .. S - T + i.
    Never materialise K or V once per query head (no repeat / repeat_interleave / expand+copy).
    """
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    group = Hq // Hkv
    rows = q.reshape(B, Hkv, group * T, D)
    scores = rows @ k.transpose(-1, -2) / math.sqrt(D)              # [B, Hkv, group*T, S]
    if causal:
        allowed = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T)
        scores = scores.view(B, Hkv, group, T, S).masked_fill(~allowed, float("-inf")).view_as(scores)
    return (torch.softmax(scores, dim=-1) @ v).reshape(B, Hq, T, D)


# %% grade_id: int8_quantize_kv
import torch
from torch import Tensor


def int8_quantize_kv(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Symmetric int8 quantization of a KV cache with KIVI's layout.

    k, v: float32 [B, H, T, D]. Keys are quantized per channel (one scale per (b, h, d), over the
    T tokens), values per token (one scale per (b, h, t), over the D channels).
    scale = max|x| / 127 over the slice (float32); code = round(x / scale), an int8 in [-127, 127].
    Returns (k_codes int8 [B, H, T, D], k_scale float32 [B, H, 1, D],
             v_codes int8 [B, H, T, D], v_scale float32 [B, H, T, 1]).
    Dequantized, code * scale is within scale / 2 of x.
    """
    k_scale = k.abs().amax(dim=2, keepdim=True) / 127
    v_scale = v.abs().amax(dim=3, keepdim=True) / 127
    k_codes = torch.round(k / k_scale).clamp(-127, 127).to(torch.int8)
    v_codes = torch.round(v / v_scale).clamp(-127, 127).to(torch.int8)
    return k_codes, k_scale, v_codes, v_scale


# %% grade_id: absorb_mla_weights
import torch
from torch import Tensor


def absorb_mla_weights(w_uq: Tensor, w_uk: Tensor, w_uv: Tensor, w_o: Tensor,
                       n_heads: int) -> tuple[Tensor, Tensor]:
    """Precompute MLA's absorbed matrices (weights in nn.Linear layout: [out_features, in_features]).

    w_uq: [H*d_nope, d_cq] (content queries from the query latent), w_uk: [H*d_nope, d_c] and
    w_uv: [H*d_v, d_c] (keys and values from the KV latent), w_o: [d_model, H*d_v]; head h owns
    rows h*d_nope:(h+1)*d_nope of w_uq / w_uk, rows h*d_v:(h+1)*d_v of w_uv and the same columns
    of w_o.
    Returns (w_uqk [H, d_cq, d_c] with w_uqk[h] = W_UQ,hᵀ W_UK,h, so that the content score of
    head h is c_qᵀ w_uqk[h] c_kv, and
             w_ouv [d_model, H*d_c] with columns h*d_c:(h+1)*d_c = W_O,h W_UV,h, so that the output
    is w_ouv @ (the H latent-space outputs, concatenated)).
    """
    w_uq_h = w_uq.reshape(n_heads, -1, w_uq.shape[1])          # [H, d_nope, d_cq]
    w_uk_h = w_uk.reshape(n_heads, -1, w_uk.shape[1])          # [H, d_nope, d_c]
    w_uv_h = w_uv.reshape(n_heads, -1, w_uv.shape[1])          # [H, d_v, d_c]
    w_o_h = w_o.reshape(w_o.shape[0], n_heads, -1)             # [d_model, H, d_v]
    w_uqk = w_uq_h.transpose(1, 2) @ w_uk_h
    w_ouv = torch.einsum("mhv,hvc->mhc", w_o_h, w_uv_h).reshape(w_o.shape[0], -1)
    return w_uqk, w_ouv


# %% grade_id: sink_window_step
def sink_window_step(kept: list[int], position: int, n_sink: int,
                     window: int) -> list[int]:
    """One step of StreamingLLM's eviction: what the cache keeps once
    `position` is written.

    kept: the positions the cache holds before the step, ascending (what
    earlier steps returned, or a whole prefill not evicted yet).
    position: the position just written, larger than all of them.
    Returns the kept positions after the step, ascending: all of
    kept + [position] while they are at most n_sink + window; otherwise
    the first n_sink of them (the attention sinks) and the last `window`
    (the newest, `position` included).
    """
    held = list(kept) + [position]
    if len(held) <= n_sink + window:
        return held
    return held[:n_sink] + held[len(held) - window:]
