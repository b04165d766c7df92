"""Bytes, FLOPs and the roofline: why decode waits on memory while prefill waits on arithmetic.

Conventions used throughout (units are plain bytes, FLOPs and seconds; 1 MiB = 2**20 bytes,
1 GB = 10**9 bytes):

* a multiply-add counts as 2 FLOPs;
* a "traffic" figure is bytes moved between off-chip memory (HBM, or DRAM on a CPU) and the
  chip, reads and writes both counted;
* int4 elements take half a byte (counts are rounded up to whole bytes).

This machine's own roofline, measured, is `reference.bench.machine` (`measure_machine`,
`measure_model_points`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from reference.calculators.memory import BITS, whole_number


def dtype_bits(dtype: str | torch.dtype) -> int:
    """Bits per element of a format name in `memory.BITS` (the course's one table) or of any
    torch.dtype."""
    if isinstance(dtype, torch.dtype):
        return torch.empty((), dtype=dtype).element_size() * 8
    if isinstance(dtype, str) and dtype in BITS:
        return BITS[dtype]
    raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(BITS)} or a torch.dtype")


def nbytes(count: int, dtype: str | torch.dtype) -> int:
    """Bytes taken by `count` elements of `dtype` (int4: half a byte each, rounded up).
    `count` may be written as a float holding a whole number (`70e9`)."""
    return -(-whole_number("count", count) * dtype_bits(dtype) // 8)


def _positive_int(name: str, value) -> int:
    """`value` as an int >= 1; whole-number floats (`4096.0`, `80e9`) are accepted."""
    return whole_number(name, value, minimum=1)


def _positive_number(name: str, value, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")
    return float(value)


# ------------------------------------------------------------------- attention traffic

def standard_attention_traffic(n: int, d: int, dtype: str | torch.dtype = "fp16") -> list[tuple[str, int]]:
    """HBM traffic of unfused attention for one head, one sequence: [(stage, bytes), ...].

    Three separate kernels, as `softmax(Q K^T) V` runs in eager PyTorch: S = Q K^T reads Q and
    K [n, d] and writes S [n, n]; P = softmax(S) reads S and writes P [n, n]; O = P V reads P
    and V and writes O [n, d]. The on-chip compute between the legs moves nothing and is not
    listed (with it, the walk-through has eleven stages). The scaling by 1/sqrt(d) and the mask
    are assumed fused into the kernels that produce S and P.
    """
    n, d = _positive_int("n", n), _positive_int("d", d)
    row_block, square = nbytes(n * d, dtype), nbytes(n * n, dtype)
    return [("load Q", row_block), ("load K", row_block), ("write S", square), ("read S", square),
            ("write P", square), ("read P", square), ("load V", row_block), ("write O", row_block)]


def flash_attention_traffic(n: int, d: int, dtype: str | torch.dtype = "fp16", block_q: int = 128,
                            block_k: int = 128) -> list[tuple[str, int]]:
    """HBM traffic of tiled (Flash) attention for one head, one sequence: [(stage, bytes), ...].

    Model (FlashAttention-2 loop order, no causal skipping): the outer loop takes the
    ceil(n / block_q) row blocks of Q; for each, the inner loop streams all of K and V in
    ceil(n / block_k) tiles, so K and V are each read once per Q block; each Q block is read once
    and each O block written once. S and P exist only on chip. Every tile load is counted as HBM
    traffic, so this is an upper bound: on a GPU, Q blocks processed at the same time share K/V
    tiles through the L2 cache. block_k sets the tile count, not the bytes.
    """
    n, d = _positive_int("n", n), _positive_int("d", d)
    block_q, block_k = _positive_int("block_q", block_q), _positive_int("block_k", block_k)
    q_blocks, k_tiles = -(-n // block_q), -(-n // block_k)
    row_block = nbytes(n * d, dtype)
    return [(f"load Q ({q_blocks} blocks)", row_block),
            (f"load K ({q_blocks} passes x {k_tiles} tiles)", q_blocks * row_block),
            (f"load V ({q_blocks} passes x {k_tiles} tiles)", q_blocks * row_block),
            (f"write O ({q_blocks} blocks)", row_block)]


def total_bytes(traffic: list[tuple[str, int]]) -> int:
    """Sum of the bytes of a traffic list."""
    return sum(b for _, b in traffic)


# -------------------------------------------------------------------------- the roofline

def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte of memory traffic."""
    flops = _positive_number("flops", flops, allow_zero=True)
    return flops / _positive_number("bytes_moved", bytes_moved)


def matmul_cost(m: int, k: int, n: int, dtype: str | torch.dtype = "fp16") -> tuple[int, int]:
    """(FLOPs, bytes) of C[m, n] = A[m, k] @ B[k, n], each operand read once and C written once."""
    m, k, n = (_positive_int(name, v) for name, v in (("m", m), ("k", k), ("n", n)))
    return 2 * m * k * n, nbytes(m * k, dtype) + nbytes(k * n, dtype) + nbytes(m * n, dtype)


def attainable_flops(intensity, peak_flops: float, bandwidth: float):
    """The roofline: min(peak_flops, intensity * bandwidth) in FLOP/s.

    intensity: FLOPs per byte, a number or a tensor (elementwise); peak_flops in FLOP/s,
    bandwidth in bytes/s.
    """
    peak_flops = _positive_number("peak_flops", peak_flops)
    bandwidth = _positive_number("bandwidth", bandwidth)
    if isinstance(intensity, torch.Tensor):
        if not torch.isfinite(intensity).all() or (intensity < 0).any():
            raise ValueError("intensity must be finite and >= 0 everywhere")
        return torch.clamp(intensity * bandwidth, max=peak_flops)
    return min(peak_flops, _positive_number("intensity", intensity, allow_zero=True) * bandwidth)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """Intensity (FLOPs/byte) where the memory roof meets the compute roof."""
    return _positive_number("peak_flops", peak_flops) / _positive_number("bandwidth", bandwidth)


def decode_floor_seconds(bytes_read: float, bandwidth: float) -> float:
    """Shortest possible time of a step that must read `bytes_read` bytes at `bandwidth` bytes/s."""
    return _positive_number("bytes_read", bytes_read, allow_zero=True) / _positive_number("bandwidth", bandwidth)


# ------------------------------------------------------------ one forward of a Llama model

@dataclass(frozen=True)
class ForwardCost:
    """FLOPs and minimum memory traffic of one forward pass."""
    flops: int
    weight_bytes: int
    kv_bytes: int

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def llama_matmul_params(cfg) -> int:
    """Weights that multiply activations in one forward: all projections plus the LM head."""
    attn = cfg.d_model * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim + cfg.n_heads * cfg.head_dim * cfg.d_model
    mlp = 3 * cfg.d_model * cfg.d_ff  # gate, up, down (SwiGLU)
    return cfg.n_layers * (attn + mlp) + cfg.vocab_size * cfg.d_model


def llama_params(cfg) -> int:
    """All parameters, the tied embedding / LM head counted once (norm weights included)."""
    return llama_matmul_params(cfg) + (2 * cfg.n_layers + 1) * cfg.d_model


def forward_cost(cfg, *, batch: int, new_tokens: int, context: int = 0,
                 weight_dtype: str | torch.dtype = "fp16", kv_dtype: str | torch.dtype | None = None) -> ForwardCost:
    """Cost of one forward of a Llama-style model (a `reference.model.ModelConfig`).

    `batch` sequences each feed `new_tokens` positions after `context` cached ones: prefill is
    (new_tokens=P, context=0), a decode step (new_tokens=1, context=L). FLOPs: 2 per weight per
    token, plus causal attention (QK^T and PV: 4 * n_heads * head_dim FLOPs per visible key per
    query). Bytes: every parameter read once (however large the batch), each sequence's K/V
    read over context + new_tokens positions and written for the new ones. Activations are
    assumed to stay on chip, so this is the minimum traffic.
    """
    batch, new_tokens = _positive_int("batch", batch), _positive_int("new_tokens", new_tokens)
    context = whole_number("context", context)
    kv_dtype = weight_dtype if kv_dtype is None else kv_dtype
    tokens = batch * new_tokens
    visible_keys = new_tokens * context + new_tokens * (new_tokens + 1) // 2  # per sequence, causal
    attention = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * visible_keys * batch
    flops = 2 * llama_matmul_params(cfg) * tokens + attention
    kv_per_position = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim
    kv_elements = batch * kv_per_position * (context + 2 * new_tokens)  # read all, write the new
    return ForwardCost(flops, nbytes(llama_params(cfg), weight_dtype), nbytes(kv_elements, kv_dtype))



# ----------------------------------------------- one decode step, kernel by kernel

# FLOPs per element of the element-wise kernels of a Llama layer (a model, stated once):
# RMSNorm squares, sums, scales and multiplies by its weight; RoPE is x*cos + rot(x)*sin;
# SwiGLU's silu(g) * u is about five (negate, exp, add, divide, multiply); a residual add is one.
ELEMENTWISE_FLOPS = {"rmsnorm": 4, "rope": 3, "swiglu": 5, "residual": 1}


@dataclass(frozen=True)
class KernelCost:
    """FLOPs and HBM bytes of one class of kernels in a step; each class sits on the roofline
    at its own intensity."""
    name: str
    flops: int
    bytes: int

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    def seconds(self, peak_flops: float, bandwidth: float) -> float:
        """max(F / peak, B / bandwidth): the kernel waits on whichever roof is lower for it."""
        return max(self.flops / _positive_number("peak_flops", peak_flops),
                   self.bytes / _positive_number("bandwidth", bandwidth))

    def bound(self, peak_flops: float, bandwidth: float) -> str:
        """'compute' when the arithmetic takes longer than the bytes, else 'memory'."""
        compute = self.flops / _positive_number("peak_flops", peak_flops)
        return "compute" if compute > self.bytes / _positive_number("bandwidth", bandwidth) else "memory"


def _llama_matrices(cfg) -> list[tuple[int, int, int]]:
    """(rows in k, columns n, how many) of every weight matrix a token multiplies."""
    d, q, kv = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    layers = cfg.n_layers
    return [(d, q, layers), (d, kv, 2 * layers), (q, d, layers),      # W_q; W_k, W_v; W_o
            (d, cfg.d_ff, 2 * layers), (cfg.d_ff, d, layers),         # gate, up; down
            (d, cfg.vocab_size, 1)]                                   # LM head


def decode_step_kernels(cfg, *, batch: int, context: int, weight_dtype: str | torch.dtype = "fp16",
                        kv_dtype: str | torch.dtype | None = None) -> list[KernelCost]:
    """One decode step of a Llama-style model (`reference.model.ModelConfig`), by kernel class:
    `forward_kernels` with one new token per sequence.

    `batch` sequences each feed one token after `context` cached ones. Three classes, each
    placed on the roofline on its own (activations and the cache in `weight_dtype` unless
    `kv_dtype` is given):

    * "weight matmuls": every projection and the LM head as C[B, n] = A[B, k] @ W[k, n]
      (`matmul_cost` with m = batch): 2 FLOPs per weight per token; bytes = each weight read
      once for the whole batch + the activations read and written. Intensity grows with B.
    * "attention": per layer and sequence, the new query against its context + 1 keys:
      4 * head_dim FLOPs per visible key, per query head (2 d for q.k, 2 d for p.v); bytes =
      that sequence's K and V read (context + 1 positions), the new K and V written, q read and
      the output written. Nobody else reads a sequence's cache, so F and B both grow with B
      and the intensity stays put: about the GQA group size in fp16 (n_heads / n_kv_heads
      query heads share each K/V byte, 2 FLOPs per element per query head, 2 bytes each;
      `attention_intensity` gives the general formula, MLA's and a verification pass's).
    * "element-wise": two RMSNorms, RoPE on q and k, SwiGLU and two residual adds per layer,
      plus the final norm (FLOPs per element: `ELEMENTWISE_FLOPS`); each reads its inputs and
      writes its output once (unfused), and the norms read their weights once per step.

    The embedding lookup (batch rows) and sampling are left out. The step's time on a roofline
    is `step_seconds`: the sum over classes of max(F / peak, B / bandwidth).
    """
    return forward_kernels(cfg, batch=batch, new_tokens=1, context=context,
                           weight_dtype=weight_dtype, kv_dtype=kv_dtype)


def forward_kernels(cfg, *, batch: int, new_tokens: int, context: int,
                    weight_dtype: str | torch.dtype = "fp16",
                    kv_dtype: str | torch.dtype | None = None) -> list[KernelCost]:
    """One forward of a Llama-style model over `new_tokens` positions per sequence after
    `context` cached ones, by kernel class (the classes of `decode_step_kernels`).

    `batch` sequences each feed `new_tokens` positions: a decode step is new_tokens = 1, a
    speculative verification pass over the last token and k drafts is k + 1, a draft tree's
    pass 1 + its node count. Per class:

    * "weight matmuls": C[batch * new_tokens, n] = A @ W[k, n] for every projection and the LM
      head (logits at every position, as verification needs them); each weight read once.
    * "attention": per layer and sequence, each new position against the context and the new
      positions up to itself (causal, as `forward_cost` counts them: new_tokens * context +
      new_tokens (new_tokens + 1) / 2 visible keys; a tree's nodes see only their ancestors,
      fewer keys, but a masked kernel computes the whole block anyway); bytes = that
      sequence's K and V read once over context + new_tokens positions and written for the
      new ones, its queries read and outputs written. The cache read does not grow with
      new_tokens, the FLOPs do: the intensity is about new_tokens times the decode step's.
    * "element-wise": as in `decode_step_kernels`, for batch * new_tokens tokens.
    """
    batch, new_tokens = _positive_int("batch", batch), _positive_int("new_tokens", new_tokens)
    context = whole_number("context", context)
    kv_dtype = weight_dtype if kv_dtype is None else kv_dtype
    act = lambda n: nbytes(n, weight_dtype)  # noqa: E731  (activation bytes)
    tokens = batch * new_tokens

    mm_flops = mm_bytes = 0
    for k, n, count in _llama_matrices(cfg):
        flops, moved = matmul_cost(tokens, k, n, weight_dtype)
        mm_flops, mm_bytes = mm_flops + count * flops, mm_bytes + count * moved

    layers, q_width = cfg.n_layers, cfg.n_heads * cfg.head_dim
    kv_width = cfg.n_kv_heads * cfg.head_dim
    visible = new_tokens * context + new_tokens * (new_tokens + 1) // 2   # per sequence, causal
    att_flops = 4 * cfg.head_dim * cfg.n_heads * visible * layers * batch
    att_bytes = layers * batch * (nbytes(2 * kv_width * (context + 2 * new_tokens), kv_dtype)
                                  + act(2 * q_width * new_tokens))

    e = ELEMENTWISE_FLOPS
    d, ff = cfg.d_model, cfg.d_ff
    rope = q_width + kv_width
    per_token_flops = layers * (2 * e["rmsnorm"] * d + e["rope"] * rope + e["swiglu"] * ff
                                + 2 * e["residual"] * d) + e["rmsnorm"] * d
    per_token_elements = layers * (2 * 2 * d + 2 * rope + 3 * ff + 2 * 3 * d) + 2 * d
    ew_flops = tokens * per_token_flops
    ew_bytes = act(tokens * per_token_elements) + act((2 * layers + 1) * d)   # + norm weights
    return [KernelCost("weight matmuls", mm_flops, mm_bytes),
            KernelCost("attention", att_flops, att_bytes),
            KernelCost("element-wise", ew_flops, ew_bytes)]


def attention_intensity(*, query_heads: int, score_dim: int, value_dim: int, cached_elements: int,
                        query_positions: int = 1, kv_dtype: str | torch.dtype = "fp16") -> float:
    """FLOPs per byte of cache read by attention over a sequence's cache (a decode step, or a
    verification pass), counted per cached position of one cache head.

    One cache head (a K/V head of MHA/GQA/MQA; absorbed MLA's latent) holds `cached_elements`
    elements per position, read once per step at `dtype_bits(kv_dtype) / 8` bytes each. They
    serve `query_heads` query heads at `query_positions` positions each, and every such query
    does 2 * score_dim FLOPs for its score (q.k) and 2 * value_dim for its share of the output
    (p v):

        I = 2 * query_heads * query_positions * (score_dim + value_dim) / (cached_elements * s)

    GQA with head_dim d: query_heads = the group G, score_dim = value_dim = d, cached_elements =
    2d (a key and a value), so I = 2 G T / s. Absorbed MLA: query_heads = all heads, score_dim =
    latent + RoPE widths, value_dim = latent width, cached_elements = latent + RoPE widths.
    Only the cache's bytes count (the queries and outputs are small next to a long cache), and
    every query is taken to see every cached position (a verification pass's last queries also
    see the few drafted keys). The batch does not appear: each sequence reads only its own cache.
    """
    query_heads, score_dim, value_dim, cached_elements, query_positions = (
        _positive_int(name, value) for name, value in (
            ("query_heads", query_heads), ("score_dim", score_dim), ("value_dim", value_dim),
            ("cached_elements", cached_elements), ("query_positions", query_positions)))
    flops = 2 * query_heads * query_positions * (score_dim + value_dim)
    return flops / (cached_elements * dtype_bits(kv_dtype) / 8)


def decode_attention_intensity(shape, *, query_positions: int = 1,
                               kv_dtype: str | torch.dtype = "fp16") -> float:
    """`attention_intensity` for a published model (`reference.calculators.memory.ModelShape`).

    MHA/GQA/MQA: each K/V head serves q_heads / kv_heads query heads, keys and values of
    head_dim. MLA, in the absorbed form of `reference.mla` (the queries scored against the
    cached latent and RoPE key, the output taken in the latent space): all q_heads share the
    one cached vector of latent_dim + rope_dim elements. `query_positions`: 1 for a decode step,
    k + 1 for a pass that verifies k drafted tokens (chapter 10).
    """
    if shape.attention == "MLA":
        width = shape.latent_dim + shape.rope_dim
        return attention_intensity(query_heads=shape.q_heads, score_dim=width,
                                   value_dim=shape.latent_dim, cached_elements=width,
                                   query_positions=query_positions, kv_dtype=kv_dtype)
    return attention_intensity(query_heads=shape.q_heads // shape.kv_heads,
                               score_dim=shape.head_dim, value_dim=shape.head_dim,
                               cached_elements=2 * shape.head_dim,
                               query_positions=query_positions, kv_dtype=kv_dtype)


def step_seconds(kernels: list[KernelCost], peak_flops: float, bandwidth: float) -> float:
    """The step's time as the kernels run one after another: sum of max(F_k / peak, B_k / bw)."""
    return sum(k.seconds(peak_flops, bandwidth) for k in kernels)


def blended_step_seconds(kernels: list[KernelCost], peak_flops: float, bandwidth: float) -> float:
    """The one-point shortcut: all FLOPs and all bytes as a single kernel, max(sum F / peak,
    sum B / bw). Never longer than `step_seconds`, and shorter whenever one kernel is
    compute-bound while another is memory-bound: it lets one kernel's idle memory system
    hide another's bytes, which kernels that run one after another cannot do."""
    flops, moved = sum(k.flops for k in kernels), sum(k.bytes for k in kernels)
    return max(flops / _positive_number("peak_flops", peak_flops),
               moved / _positive_number("bandwidth", bandwidth))
