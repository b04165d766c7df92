"""How many bytes the KV cache takes, for any model shape, precision and batch.

Per token and per layer a standard (MHA/GQA/MQA) layer keeps one key and one value vector for
each of its ``kv_heads``:

    bytes = 2 (K and V) * layers * kv_heads * head_dim * tokens * batch * bytes_per_element

An MLA layer (DeepSeek V2/V3, Kimi K2) keeps one latent vector of ``latent_dim`` plus one decoupled
RoPE key of ``rope_dim``, shared by all heads, and no factor 2:

    bytes = layers * (latent_dim + rope_dim) * tokens * batch * bytes_per_element

Quantized formats carry metadata: with ``group_size`` every group of that many elements also
stores an fp16 scale, and the asymmetric int4 format (as in KIVI) an fp16 zero point too.
The formats are the ones of ``reference.quant``: int8 and fp8 are symmetric (scale only).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch


# Bits per stored element, by format name.
BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}
# fp16 metadata per quantization group: scale (all) and zero point (asymmetric int4 only).
GROUP_METADATA_BYTES = {"fp8": 2, "int8": 2, "int4": 4}
_TORCH_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                torch.int8: "int8", torch.uint8: "int8"}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _TORCH_NAMES[getattr(torch, _name)] = "fp8"


def dtype_name(dtype) -> str:
    """Normalise a format name or a torch.dtype to one of ``BITS``' keys (ValueError otherwise)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _TORCH_NAMES:
            raise ValueError(f"no KV-cache format for torch dtype {dtype}; "
                             f"use one of {sorted(set(_TORCH_NAMES.values()))}")
        return _TORCH_NAMES[dtype]
    if not isinstance(dtype, str) or dtype.lower() not in BITS:
        raise ValueError(f"unknown dtype {dtype!r}: choose one of {', '.join(BITS)} or a torch.dtype")
    return dtype.lower()


def whole_number(name: str, value, minimum: int = 0) -> int:
    """`value` as an int, for a count of bytes, tokens, layers, slots...

    Readers write sizes as `80e9` or `2**20`: an int, or a float (or a numpy scalar) holding a
    whole number, is accepted and returned as an int. A fractional float (`80.5`, `1.5` tokens),
    a bool, a string or anything else raises TypeError; a whole number below `minimum` raises
    ValueError. Every message is one line and names the argument.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a whole number, got the bool {value!r}")
    if isinstance(value, numbers.Integral):
        value = int(value)
    elif isinstance(value, numbers.Real):
        if not math.isfinite(value) or not float(value).is_integer():
            raise TypeError(f"{name} must be a whole number, got {value!r}: "
                            "a count of bytes or tokens has no fractional part")
        value = int(value)
    else:
        raise TypeError(f"{name} must be a whole number (an int, or a float such as 80e9), "
                        f"got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_counts(**counts) -> dict[str, int]:
    """The counts as ints (whole-number floats accepted), each >= 0: see `whole_number`."""
    return {name: whole_number(name, value) for name, value in counts.items()}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tensor_bytes(elements: int, dtype="fp16", group_size: int | None = None) -> int:
    """Bytes of one tensor of ``elements`` values stored in ``dtype`` (int4 packs two per byte,
    rounded up to whole bytes), plus the per-group metadata when ``group_size`` is given."""
    name = dtype_name(dtype)
    elements = whole_number("elements", elements)
    payload = _ceil_div(elements * BITS[name], 8)
    if group_size is None:
        return payload
    if name not in GROUP_METADATA_BYTES:
        raise ValueError(f"group_size applies to quantized formats (fp8, int8, int4), not {name}")
    group_size = whole_number("group_size", group_size, minimum=1)
    return payload + _ceil_div(elements, group_size) * GROUP_METADATA_BYTES[name]


def kv_cache_bytes(*, layers: int, kv_heads: int, head_dim: int, tokens: int, batch: int = 1,
                   dtype="fp16", group_size: int | None = None) -> int:
    """Bytes of the K and V caches of a standard (MHA/GQA/MQA) model.

    dtype: "fp32", "fp16", "bf16", "fp8", "int8", "int4" or a torch.dtype. With ``group_size``
    (quantized formats only) each of the K and V tensors of each layer pays one fp16 scale per
    ``group_size`` elements (rounded up), plus an fp16 zero point for int4.
    """
    c = _check_counts(layers=layers, kv_heads=kv_heads, head_dim=head_dim, tokens=tokens,
                      batch=batch)
    layers, kv_heads, head_dim, tokens, batch = c.values()
    per_layer_tensor = batch * kv_heads * tokens * head_dim
    return 2 * layers * tensor_bytes(per_layer_tensor, dtype, group_size)


def mla_kv_bytes(*, layers: int, latent_dim: int, rope_dim: int, tokens: int, batch: int = 1,
                 dtype="fp16") -> int:
    """Bytes of an MLA cache: per layer and token one latent (``latent_dim``) and one RoPE key
    (``rope_dim``) shared by all heads. No factor 2: K and V are both rebuilt from the latent."""
    layers, latent_dim, rope_dim, tokens, batch = _check_counts(
        layers=layers, latent_dim=latent_dim, rope_dim=rope_dim, tokens=tokens,
        batch=batch).values()
    return layers * tensor_bytes(batch * tokens * (latent_dim + rope_dim), dtype)


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache of a published model depends on, and where the numbers come from.

    attention: "MHA", "GQA", "MQA" or "MLA". For MLA, kv_heads/head_dim describe the query side
    only and the cache is latent_dim + rope_dim per layer and token. params: total parameter
    count from the model card (used for weight bytes, never for the cache).
    """
    name: str
    attention: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    d_model: int
    params: float
    source: str
    latent_dim: int = 0
    rope_dim: int = 0

    def bytes_per_token(self, dtype="fp16") -> int:
        """Cache bytes one token adds (all layers, batch 1)."""
        return kv_cache_bytes_for(self.name, 1, dtype=dtype)

    def weight_bytes(self, dtype="bf16") -> int:
        """Bytes of the weights at ``dtype`` (params * bytes per element, rounded)."""
        return round(self.params * BITS[dtype_name(dtype)] / 8)


_HF = "https://huggingface.co/{}/blob/main/config.json"
MODELS: dict[str, ModelShape] = {m.name: m for m in (
    ModelShape("Llama 3.1 8B", "GQA", 32, 32, 8, 128, 4096, 8.03e9, _HF.format("meta-llama/Llama-3.1-8B")),
    ModelShape("Llama 3.1 70B", "GQA", 80, 64, 8, 128, 8192, 70.6e9, _HF.format("meta-llama/Llama-3.1-70B")),
    ModelShape("Llama 3.1 405B", "GQA", 126, 128, 8, 128, 16384, 405.9e9, _HF.format("meta-llama/Llama-3.1-405B")),
    ModelShape("Qwen 3 32B", "GQA", 64, 64, 8, 128, 5120, 32.8e9, _HF.format("Qwen/Qwen3-32B")),
    ModelShape("Qwen 2.5 72B", "GQA", 80, 64, 8, 128, 8192, 72.7e9, _HF.format("Qwen/Qwen2.5-72B")),
    ModelShape("Mistral Large 2", "GQA", 88, 96, 8, 128, 12288, 123e9,
               _HF.format("mistralai/Mistral-Large-Instruct-2407")),
    ModelShape("DeepSeek V3", "MLA", 61, 128, 128, 128, 7168, 671e9, _HF.format("deepseek-ai/DeepSeek-V3")
               + " (kv_lora_rank 512, qk_rope_head_dim 64)", latent_dim=512, rope_dim=64),
    ModelShape("Kimi K2", "MLA", 61, 64, 64, 128, 7168, 1.04e12, _HF.format("moonshotai/Kimi-K2-Instruct")
               + " (kv_lora_rank 512, qk_rope_head_dim 64)", latent_dim=512, rope_dim=64),
    ModelShape("LLaMA-2 7B", "MHA", 32, 32, 32, 128, 4096, 6.74e9, _HF.format("meta-llama/Llama-2-7b-hf")),
    ModelShape("LLaMA-2 70B", "GQA", 80, 64, 8, 128, 8192, 69.0e9, _HF.format("meta-llama/Llama-2-70b-hf")),
    ModelShape("SmolLM2-135M", "GQA", 30, 9, 3, 64, 576, 134.5e6,
               _HF.format("HuggingFaceTB/SmolLM2-135M-Instruct") + "; also the GGUF this course loads"),
)}


def model(name: str) -> ModelShape:
    """The preset called ``name`` (ValueError listing the presets otherwise)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; presets: {', '.join(MODELS)}")
    return MODELS[name]


def kv_cache_bytes_for(name: str, tokens: int, batch: int = 1, dtype="fp16") -> int:
    """Cache bytes of preset ``name`` holding ``tokens`` tokens for each of ``batch`` sequences."""
    m = model(name)
    if m.attention == "MLA":
        return mla_kv_bytes(layers=m.layers, latent_dim=m.latent_dim, rope_dim=m.rope_dim,
                            tokens=tokens, batch=batch, dtype=dtype)
    return kv_cache_bytes(layers=m.layers, kv_heads=m.kv_heads, head_dim=m.head_dim,
                          tokens=tokens, batch=batch, dtype=dtype)


def max_concurrent_sequences(*, gpu_bytes: int, weight_bytes: int, per_token_bytes: int,
                             tokens_per_seq: int, overhead_bytes: int = 0) -> int:
    """How many sequences of ``tokens_per_seq`` tokens fit in what the weights and a fixed
    overhead (activations, CUDA context, fragmentation) leave of ``gpu_bytes``.

    floor((gpu_bytes - weight_bytes - overhead_bytes) / (per_token_bytes * tokens_per_seq)),
    and 0 when the weights and overhead alone do not fit. Sizes may be written as floats that
    hold whole numbers (``gpu_bytes=80e9``); a fractional one (``80.5``) is refused by name.
    """
    gpu_bytes, weight_bytes, per_token_bytes, tokens_per_seq, overhead_bytes = _check_counts(
        gpu_bytes=gpu_bytes, weight_bytes=weight_bytes, per_token_bytes=per_token_bytes,
        tokens_per_seq=tokens_per_seq, overhead_bytes=overhead_bytes).values()
    if per_token_bytes == 0 or tokens_per_seq == 0:
        raise ValueError("per_token_bytes and tokens_per_seq must be > 0")
    free = gpu_bytes - weight_bytes - overhead_bytes
    return max(free, 0) // (per_token_bytes * tokens_per_seq)
