"""KV-cache quantization: int8, fp8 (e4m3) and int4 in groups, with KIVI's layout, and a cache
the model decodes with.

Groups are ``group_size`` consecutive elements along one axis; each group stores an fp16 scale
(and, for int4, an fp16 zero point):

* int8, symmetric: scale = max|x| / 127, code = round(x / scale) in [-127, 127].
  Bound: |x - x̂| <= scale / 2.
* int4, asymmetric (as in KIVI): zero = min x, scale = (max x - zero) / 15, code in [0, 15],
  two codes packed per byte. Bound: |x - x̂| <= scale / 2.
* fp8, symmetric: scale = max|x| / 448, code = (x / scale) in torch.float8_e4m3fn (converts on
  CPU in torch >= 2.1). Bound: |x - x̂| <= 2⁻⁴ |x| + 2⁻¹⁰ scale (3 mantissa bits; subnormals).

Scales are rounded *up* to fp16 and zero points *down*, so no code is ever clipped and the bounds
hold with the stored fp16 metadata (plus float32 rounding, ~1e-6 relative).

KIVI (Liu et al., 2024): keys have a few large channels, values do not, so keys are quantized per
channel (a group spans ``group_size`` tokens of one channel) and values per token (a group spans
channels of one token). Per-channel groups only close every ``group_size`` tokens: the newest
tokens wait in full precision (the "residual") until their group is complete.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from reference.kv_cache import KVCache
from reference.calculators.memory import tensor_bytes

LEVELS = {"int8": 127, "int4": 15, "fp8": 448}
FP16_ULP = 2.0 ** -10


def _fp16_up(x: Tensor) -> Tensor:
    """Smallest-ish fp16 value >= x (x >= 0), returned as float32."""
    return (x * (1 + FP16_ULP)).clamp_min(2.0 ** -14).half().float()


def _fp16_down(x: Tensor) -> Tensor:
    return (x - x.abs() * FP16_ULP).half().float()


@dataclass
class QuantizedTensor:
    """codes: int8 / uint8 (int4 packed in pairs) / float8_e4m3fn, shape [..., n_groups, group_size]
    (int4: group_size / 2) with the quantized axis moved last; scale, zero: fp16 [..., n_groups, 1]."""
    fmt: str
    codes: Tensor
    scale: Tensor
    zero: Tensor | None
    dim: int
    shape: tuple[int, ...]

    def nbytes(self) -> int:
        meta = self.scale.numel() * 2 + (self.zero.numel() * 2 if self.zero is not None else 0)
        return self.codes.numel() * self.codes.element_size() + meta


def quantize(x: Tensor, fmt: str, *, dim: int = -1, group_size: int | None = None) -> QuantizedTensor:
    """Quantize x in groups of ``group_size`` consecutive elements along ``dim`` (default: the
    whole axis is one group). The size of ``dim`` must be a multiple of group_size."""
    if fmt not in LEVELS:
        raise ValueError(f"unknown format {fmt!r}: choose one of {', '.join(LEVELS)}")
    moved = x.detach().float().movedim(dim, -1)
    n = moved.shape[-1]
    group_size = group_size or n
    if n % group_size or (fmt == "int4" and group_size % 2):
        raise ValueError(f"axis of size {n} cannot be split into groups of {group_size}"
                         + (" (int4 needs an even group size)" if fmt == "int4" and group_size % 2 else ""))
    groups = moved.reshape(*moved.shape[:-1], n // group_size, group_size)
    zero = None
    if fmt == "int4":
        zero = _fp16_down(groups.amin(-1, keepdim=True))
        scale = _fp16_up((groups.amax(-1, keepdim=True) - zero) / LEVELS[fmt])
        codes = torch.round((groups - zero) / scale).clamp(0, 15).to(torch.uint8)
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    else:
        scale = _fp16_up(groups.abs().amax(-1, keepdim=True) / LEVELS[fmt])
        if fmt == "int8":
            codes = torch.round(groups / scale).clamp(-127, 127).to(torch.int8)
        else:
            codes = (groups / scale).to(torch.float8_e4m3fn)
    return QuantizedTensor(fmt, codes, scale.half(), None if zero is None else zero.half(),
                           dim, tuple(x.shape))


def dequantize(q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Back to a tensor of q.shape and ``dtype``."""
    codes = q.codes
    if q.fmt == "int4":
        codes = torch.stack((codes & 15, codes >> 4), dim=-1).flatten(-2)
    values = codes.float() * q.scale.float()
    if q.zero is not None:
        values = values + q.zero.float()
    dim = q.dim % len(q.shape)
    moved_shape = q.shape[:dim] + q.shape[dim + 1:] + (q.shape[dim],)
    return values.reshape(moved_shape).movedim(-1, dim).to(dtype)


def error_bound(x: Tensor, q: QuantizedTensor) -> Tensor:
    """Largest |x - dequantize(q)| the format allows, elementwise (the bounds of the module doc)."""
    group_size = q.codes.shape[-1] * (2 if q.fmt == "int4" else 1)
    scale = q.scale.float().expand(*q.scale.shape[:-1], group_size)
    dim = q.dim % len(q.shape)
    scale = scale.reshape(q.shape[:dim] + q.shape[dim + 1:] + (q.shape[dim],)).movedim(-1, dim)
    magnitude = x.detach().abs().float()
    slack = 1e-6 * magnitude + 1e-6 * scale
    if q.fmt == "fp8":
        return 2.0 ** -4 * magnitude + 2.0 ** -10 * scale + slack
    return scale / 2 + slack


def int8_quantize_kv(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The exercise's plain form of KIVI int8: k, v [B, H, T, D] -> (k_codes, k_scale [B, H, 1, D],
    v_codes, v_scale [B, H, T, 1]); float32 scales max|x| / 127 (no fp16 rounding, no groups):
    keys per channel over all T tokens, values per token over all D channels."""
    k_scale = k.float().abs().amax(dim=2, keepdim=True) / 127
    v_scale = v.float().abs().amax(dim=3, keepdim=True) / 127
    k_codes = torch.round(k / k_scale).clamp(-127, 127).to(torch.int8)
    v_codes = torch.round(v / v_scale).clamp(-127, 127).to(torch.int8)
    return k_codes, k_scale, v_codes, v_scale


@dataclass(frozen=True)
class KVFormat:
    """How a cache stores K and V. fmt: "fp32", "fp16", "bf16" (plain casts) or one of LEVELS.
    key_axis: "channel" (KIVI: groups of ``group_size`` tokens per channel) or "token".
    Values are always quantized per token, in groups of ``value_group`` channels (None: all)."""
    name: str
    fmt: str
    key_axis: str = "channel"
    group_size: int = 32
    value_group: int | None = None

    def bytes_per_token(self, n_layers: int, n_kv_heads: int, head_dim: int) -> int:
        """Stored bytes per token (all layers, K and V), scales and zero points included."""
        return round(n_layers * (self.key_bytes_per_token(n_kv_heads, head_dim)
                                 + self.value_bytes_per_token(n_kv_heads, head_dim)))

    def key_bytes_per_token(self, n_kv_heads: int, head_dim: int) -> float:
        """One layer's key bytes per token (a per-channel group's metadata spread over its tokens)."""
        if self.fmt in _CASTS:
            return tensor_bytes(n_kv_heads * head_dim, self.fmt)
        if self.key_axis == "token":
            return tensor_bytes(n_kv_heads * head_dim, self.fmt, min(self.group_size, head_dim))
        return tensor_bytes(n_kv_heads * head_dim * self.group_size, self.fmt, self.group_size) / self.group_size

    def value_bytes_per_token(self, n_kv_heads: int, head_dim: int) -> int:
        if self.fmt in _CASTS:
            return tensor_bytes(n_kv_heads * head_dim, self.fmt)
        return tensor_bytes(n_kv_heads * head_dim, self.fmt, min(self.value_group or head_dim, head_dim))

    def roundtrip_values(self, v: Tensor) -> Tensor:
        """v [B, H, T, D] as this format stores it, per token."""
        if self.fmt in _CASTS:
            return v.to(_CASTS[self.fmt]).to(v.dtype)
        group = min(self.value_group or v.shape[-1], v.shape[-1])   # channel groups never exceed a head
        return dequantize(quantize(v, self.fmt, dim=-1, group_size=group), v.dtype)

    def roundtrip_keys(self, k: Tensor) -> Tensor:
        """k [B, H, T, D] as this format stores it; per-channel groups that are not yet complete
        (the last T % group_size tokens) stay in full precision, as KIVI's residual."""
        if self.fmt in _CASTS:
            return k.to(_CASTS[self.fmt]).to(k.dtype)
        if self.key_axis == "token":
            group = min(self.group_size, k.shape[-1])
            return dequantize(quantize(k, self.fmt, dim=-1, group_size=group), k.dtype)
        full = k.shape[2] - k.shape[2] % self.group_size
        done = dequantize(quantize(k[:, :, :full], self.fmt, dim=2, group_size=self.group_size), k.dtype) \
            if full else k[:, :, :0]
        return torch.cat((done, k[:, :, full:]), dim=2)


_CASTS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

FORMATS = {f.name: f for f in (
    KVFormat("fp32", "fp32"), KVFormat("fp16", "fp16"), KVFormat("bf16", "bf16"),
    KVFormat("fp8 (K/channel, V/token)", "fp8"),
    KVFormat("int8 (K/channel, V/token)", "int8"),
    KVFormat("int4 KIVI (K/channel, V/token)", "int4", value_group=32),
    KVFormat("int4 (K/token, V/token)", "int4", key_axis="token", value_group=32),
)}


class QuantizedKVCache(KVCache):
    """A KVCache whose contents are what ``kv_format`` stores: values are rounded when appended,
    keys when their per-channel group of ``group_size`` tokens is complete (until then they sit in
    full precision, KIVI's residual). The float32 buffers hold the dequantized values, which is
    what an attention kernel would reconstruct on the fly; ``stored_bytes`` counts the format."""

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 kv_format: KVFormat):
        super().__init__(n_layers, batch, n_kv_heads, max_len, head_dim)
        self.kv_format = kv_format
        self._keys_done = [0] * n_layers     # tokens of each layer whose keys are quantized

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        fmt = self.kv_format
        per_channel = fmt.fmt not in _CASTS and fmt.key_axis == "channel"
        k_all, v_all = super().append(layer, k if per_channel else fmt.roundtrip_keys(k),
                                      fmt.roundtrip_values(v))
        done = self._keys_done[layer]
        complete = k_all.shape[2] - k_all.shape[2] % fmt.group_size if per_channel else k_all.shape[2]
        if per_channel and complete > done:
            k_all[:, :, done:complete] = fmt.roundtrip_keys(k_all[:, :, done:complete].clone())
        self._keys_done[layer] = complete
        return k_all, v_all

    def truncate(self, n: int) -> None:
        raise NotImplementedError("a quantized cache cannot un-quantize a closed key group")

    def stored_bytes(self) -> int:
        """Bytes the format needs for the tokens held: quantized keys and values with their
        metadata, residual (not yet grouped) keys as fp16."""
        n_layers, batch, heads, _, dim = self.k.shape
        fmt, total = self.kv_format, 0.0
        for layer in range(n_layers):
            held, done = self.read(layer)[0].shape[2], self._keys_done[layer]
            total += done * fmt.key_bytes_per_token(heads, dim) + (held - done) * heads * dim * 2
            total += held * fmt.value_bytes_per_token(heads, dim)
        return round(total * batch)

# A fixed paragraph (ours) for the measurements: long enough for several complete key groups.
EVAL_TEXT = (
    "The lighthouse keeper wrote in her logbook every evening, even when nothing had happened. "
    "On the third of March the wind turned north before noon, the supply boat arrived two hours "
    "late, and the lamp needed a new wick. She noted the barometer reading, the colour of the "
    "sea, and the number of ships that passed within sight of the rocks: four cargo vessels, one "
    "fishing trawler and a small yacht whose crew waved at the tower. After supper she repaired "
    "the radio, read two chapters of a novel about a mapmaker in Lisbon, and climbed the "
    "spiral stairs to check the lens one last time before midnight.")


def _relative_error(approx: Tensor, exact: Tensor) -> float:
    return float((approx - exact).norm() / exact.norm())


def _greedy(model, ids: Tensor, n_tokens: int, cache: KVCache) -> list[int]:
    logits, out = model(ids, cache=cache), []
    for step in range(n_tokens):
        out.append(int(logits[0, -1].argmax()))
        if step + 1 < n_tokens:
            logits = model(torch.tensor([[out[-1]]]), cache=cache)
    return out


@torch.no_grad()
def evaluate_kv_formats(model, tok, text: str, n_tokens: int = 128,
                        formats: list[str] | None = None) -> list[dict]:
    """Measure each KV format of ``FORMATS`` (or the names in ``formats``) on ``model``.

    Per format, a dict: format, bytes_per_token (all layers, metadata included), k_error and
    v_error (per layer: relative Frobenius error ||x̂ - x|| / ||x|| of the fp32 cache's K and V
    after a prefill of ``text``, over its complete key groups), nll (mean next-token negative
    log-likelihood of ``text`` read through the format's cache) and delta_nll (minus fp32's),
    top1_agreement (fraction of the text's positions whose most likely next token is fp32's),
    agreement (fraction of the ``n_tokens`` greedy tokens after ``text`` equal to fp32-cache
    greedy tokens, position by position) and first_divergence (index of the first different
    token, None if all agree). Cost: one prefill and ``n_tokens`` decode steps per format.
    """
    cfg = model.config
    ids = torch.tensor([tok.encode(text)])
    T = ids.shape[1]
    dims = (cfg.n_layers, 1, cfg.n_kv_heads, T + n_tokens, cfg.head_dim)
    reference_cache = KVCache(*dims)
    targets = ids[0, 1:]

    def nll(logits: Tensor) -> float:
        return float(torch.nn.functional.cross_entropy(logits[0, :-1], targets))

    base_logits = model(ids, cache=reference_cache)
    base_nll, base_top1 = nll(base_logits), base_logits[0].argmax(-1)
    layers = [reference_cache.read(layer) for layer in range(cfg.n_layers)]
    base_tokens = _greedy(model, ids, n_tokens, KVCache(*dims))
    rows = []
    for name in formats or list(FORMATS):
        fmt = FORMATS[name]
        whole = T - T % fmt.group_size
        k_error = [_relative_error(fmt.roundtrip_keys(k[:, :, :whole]), k[:, :, :whole]) for k, _ in layers]
        v_error = [_relative_error(fmt.roundtrip_values(v), v) for _, v in layers]
        logits = model(ids, cache=QuantizedKVCache(*dims, kv_format=fmt))
        value, top1 = nll(logits), float((logits[0].argmax(-1) == base_top1).float().mean())
        tokens = base_tokens if fmt.fmt == "fp32" else _greedy(model, ids, n_tokens, QuantizedKVCache(*dims, kv_format=fmt))
        same = [a == b for a, b in zip(tokens, base_tokens)]
        rows.append(dict(format=name, bytes_per_token=fmt.bytes_per_token(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim),
                         k_error=k_error, v_error=v_error, nll=value, delta_nll=value - base_nll,
                         top1_agreement=top1,
                         agreement=sum(same) / n_tokens, tokens=tokens,
                         first_divergence=None if all(same) else same.index(False)))
    return rows
