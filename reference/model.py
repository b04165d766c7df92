"""A Llama-family decoder written from scratch, and loaders for SmolLM2-135M-Instruct.

One forward serves prefill and decode, one sequence or a served batch: it takes token ids and a
per-step context (reference.context) that says where keys and values are kept and which keys each
query sees. With a contiguous KV cache the new positions are written into it and attention reads
the whole cached prefix; without one, the sequence attends only to itself; in the engine, ragged
sequences share one paged pool.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from reference.context import DenseContext, PagedContext
from reference.kv_cache import KVCache


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 49152
    d_model: int = 576
    n_layers: int = 30
    n_heads: int = 9
    n_kv_heads: int = 3
    head_dim: int = 64
    d_ff: int = 1536
    rope_base: float = 100000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 8192

    @property
    def group_size(self) -> int:
        """Query heads that share one K/V head (grouped-query attention)."""
        return self.n_heads // self.n_kv_heads


TINY = ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                   d_ff=128, rope_base=10000.0, max_seq_len=512)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """x * rsqrt(mean(x^2) + eps) * weight over the last dimension (float32 math for half
        precision)."""
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def rope_tables(head_dim: int, base: float, positions: Tensor) -> tuple[Tensor, Tensor]:
    """cos, sin of shape [T, head_dim // 2] for the given absolute positions [T]."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def interleave_tables(cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """[T, D/2] tables -> [T, D] tables (c0, c0, c1, c1, ...) and (-s0, s0, -s1, s1, ...),
    the form `rotate_pairs` multiplies by directly."""
    return cos.repeat_interleave(2, dim=-1), torch.stack((-sin, sin), dim=-1).flatten(-2)


def rotate_pairs(x: Tensor, cos2: Tensor, sin2: Tensor) -> Tensor:
    """x [..., T, H, D] or [..., T, D] rotated by interleaved tables [T, (1,) D] (see `interleave_tables`).

    Pair (a, b) becomes (a*c - b*s, b*c + a*s): x * cos2 + swapped(x) * sin2, three element-wise ops.
    """
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (b, a) for every pair (a, b)
    return x * cos2 + swapped * sin2


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]) of x [B, H, T, D], the layout GGUF stores Q/K in."""
    return rotate_pairs(x, *interleave_tables(cos, sin))


def rotate_complex(x: Tensor, turns: Tensor) -> Tensor:
    """`rotate_pairs` as one complex product: x [..., T, H, D] with pair (a, b) read as a + ib,
    times turns [T, 1, D/2, 2] (cos, sin of each pair's angle, read as cos + i sin).

    (a + ib)(c + is) = (ac - bs) + i(bc + as): in float32 the same products and sums as
    `rotate_pairs`, so the same bits, in one element-wise pass instead of a copy (the swap) and
    three (measured 6-8x faster on the course's CPU, for a decode step's 16 rows and a prefill's
    512 alike). Half-precision x is rotated in float32 and rounded back (no complex half math).
    """
    if x.dtype not in (torch.float32, torch.float64):
        return rotate_complex(x.float(), turns.float()).to(x.dtype)
    pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)))      # a view when D's stride is 1
    return torch.view_as_real(pairs * torch.view_as_complex(turns.to(x.dtype))).flatten(-2)


def rotate_complex_(x: Tensor, turns: Tensor) -> Tensor:
    """`rotate_complex` in place, by a table that is already complex: x [..., T, H, D] is
    overwritten by its rotation and returned; turns [T, 1, D/2] complex (`view_as_complex` of the
    real table, in float32: made once per step, not once per layer). The same products and sums,
    so the same bits, without a new tensor."""
    if x.dtype not in (torch.float32, torch.float64):
        return x.copy_(rotate_complex(x, torch.view_as_real(turns)))
    torch.view_as_complex(x.unflatten(-1, (-1, 2))).mul_(turns)
    return x


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # Q, K and V projections fused into one matrix [q; k; v]: one weight read per decode step.
        self.split = (cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim)
        self.qkv_proj = nn.Linear(cfg.d_model, sum(self.split), bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x: Tensor, turns: Tensor, context: DenseContext | PagedContext, layer: int) -> Tensor:
        """x [B, T, d_model] -> [B, T, d_model].

        turns: the complex RoPE table [T, 1, head_dim / 2] for the T positions of x
        (`rotate_complex_`). The context stores the new keys and values and runs attention with its
        backend (reference.context).
        """
        cfg = self.cfg
        heads = self.qkv_proj(x).unflatten(-1, (-1, cfg.head_dim))   # [B, T, n_heads + 2 n_kv_heads, head_dim]
        # Rotate the query and key heads together, in place: q, k and v stay views of one product.
        rotate_complex_(heads[:, :, :cfg.n_heads + cfg.n_kv_heads], turns)
        q, k, v = heads.split((cfg.n_heads, cfg.n_kv_heads, cfg.n_kv_heads), dim=2)
        return self.o_proj(context.attend(layer, q, k, v))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)  # [gate; up], fused
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)


class Llama(nn.Module):
    """Decoder-only transformer with RMSNorm, RoPE, GQA, SwiGLU and tied embeddings.

    Plain torch: what runs is what is written here. The fast CPU path (reference/cpu) is another
    object built from this one (`reference.cpu.CpuModel`), held to it by a parity test."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        # RoPE turns (cos, sin) for every position of the context window, computed once: a step
        # indexes them. [max_seq_len, 1, head_dim / 2, 2], real (a buffer follows `.to(dtype)`).
        cos, sin = rope_tables(cfg.head_dim, cfg.rope_base, torch.arange(cfg.max_seq_len))
        self.register_buffer("rope_turns", torch.stack((cos, sin), dim=-1)[:, None], persistent=False)
        self.attention_backend = "sdpa"  # "naive" | "sdpa" | "triton" for dense steps (reference.context)

    @torch.inference_mode()
    def forward(self, input_ids: Tensor, positions: Tensor | None = None,
                cache: KVCache | None = None, *, context: PagedContext | None = None,
                num_layers: int | None = None, logits_rows: Tensor | None = None,
                mask: Tensor | None = None) -> Tensor:
        """input_ids [B, T] -> logits [B, T, vocab] (float32).

        positions [T] are absolute positions; by default they continue the cache
        (cache.length, cache.length + 1, ...) or start at 0 without one. Given positions are
        written by position: a cache holding more tokens is cut back to positions[0] first.
        context: a `PagedContext` for an engine step (input_ids [1, N], ragged sequences
        flattened); positions and cache are then ignored. num_layers: run only the first
        num_layers blocks before the final norm and head (a self-speculative draft).
        logits_rows [R]: compute logits only at these positions along T -> [B, R, vocab] (the
        engine needs one row per sequence, not one per prompt token: the head is the largest matmul).
        mask: bool [T, S] (True = key visible) replacing the causal mask of a dense step, e.g. a
        draft tree's (each node sees the cached prefix and its ancestors); S = cache length + T.
        """
        if context is None:
            context = DenseContext.for_step(cache, input_ids.shape[1], positions, input_ids.device,
                                            self.attention_backend, mask)
        turns = torch.view_as_complex(self.rope_turns[context.rope_rows].float())   # [T, 1, head_dim / 2]
        x = self.embed(input_ids)
        # islice, not self.blocks[:num_layers]: slicing a ModuleList builds a new module (0.1 ms)
        for layer, block in enumerate(itertools.islice(self.blocks, num_layers)):
            x = x + block.attn(block.attn_norm(x), turns, context, layer)
            x = x + block.mlp(block.mlp_norm(x))
        if logits_rows is not None:
            x = x[:, logits_rows]
        x = self.norm(x)
        return F.linear(x, self.embed.weight).float()  # tied embeddings: the LM head is embed^T

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        """An empty preallocated cache for this model (max_len defaults to the context window)."""
        cfg = self.config
        p = self.embed.weight
        return KVCache(cfg.n_layers, batch, cfg.n_kv_heads, max_len or cfg.max_seq_len,
                       cfg.head_dim, dtype=p.dtype, device=p.device)

    @property
    def device(self) -> torch.device:
        """Where the weights (and so every cache made by `new_cache`) live."""
        return self.embed.weight.device

    def weight_bytes(self) -> int:
        """Bytes of parameters one forward pass reads (the tied embedding counted once)."""
        return sum(p.numel() * p.element_size() for p in self.parameters())


def build_tiny(seed: int = 0, dtype: torch.dtype = torch.float32) -> Llama:
    """A small random model of the same architecture, identical for identical seeds."""
    gen = torch.Generator().manual_seed(seed)
    model = Llama(TINY)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                scale = 1.0 if "embed" in name else 2.0  # large enough that greedy text does not collapse
                p.copy_(torch.randn(p.shape, generator=gen) * scale / p.shape[-1] ** 0.5)
    return model.to(dtype).eval()


def load_model(name: str = "smollm2-135m", *, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu"):
    """Return (model, tokenizer). "smollm2-135m": the real weights; "tiny": a random toy.

    device: "cpu" by default (chapters 01-04 measure the CPU the book is built on), "cuda",
    "cuda:N", or "auto" for CUDA when this torch sees a GPU (reference/device.py)."""
    from reference.device import resolve_device
    from reference.tokenizer import ByteTokenizer, Tokenizer

    device = resolve_device(device)
    if name == "smollm2-135m":
        from reference import weights
        reader = weights.parse_gguf(weights.gguf_path())
        model = Llama(ModelConfig(**weights.config_fields(reader)))
        model.load_state_dict(weights.state_dict(reader), strict=True)
        tokenizer = Tokenizer.from_gguf(reader)
        del reader                       # the parsed header: ~140 MiB of small objects
        weights.return_freed_memory()
        return model.to(device=device, dtype=dtype).eval(), tokenizer
    if name == "tiny":
        return build_tiny(0, dtype).to(device), ByteTokenizer()
    raise ValueError(f"unknown model {name!r}: choose 'smollm2-135m' or 'tiny'")
