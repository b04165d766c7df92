"""KV quantization: round trips within the stated bounds, byte counts that agree with the memory
formula, KIVI's layout, and a quantized cache the model decodes with."""
import pytest
import torch

from reference.kv_cache import KVCache
from reference.calculators.memory import kv_cache_bytes, tensor_bytes
from reference.model import build_tiny, load_model
from reference.quant import (FORMATS, QuantizedKVCache, dequantize, error_bound,
                             evaluate_kv_formats, quantize)


def _keys_with_outlier_channels(seed=0, shape=(2, 3, 64, 32)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x[..., 3] = x[..., 3] * 2 + 20         # a channel of large magnitude, as keys have
    return x


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("dim,group", [(-1, None), (-1, 8), (-2, 16), (2, 32)])
def test_round_trip_within_the_stated_bound(fmt, dim, group):
    x = _keys_with_outlier_channels()
    q = quantize(x, fmt, dim=dim, group_size=group)
    back = dequantize(q)
    assert back.shape == x.shape and back.dtype == torch.float32
    bound = error_bound(x, q)
    assert ((back - x).abs() <= bound).all()
    assert (back - x).abs().max() > bound.max() / 1000        # it is a lossy format


def test_codes_and_metadata_types_and_bytes():
    x = torch.randn(4, 64)
    for fmt, code_dtype, zero in (("int8", torch.int8, False), ("int4", torch.uint8, True),
                                  ("fp8", torch.float8_e4m3fn, False)):
        q = quantize(x, fmt, group_size=16)
        assert q.codes.dtype == code_dtype and q.scale.dtype == torch.float16
        assert (q.zero is not None) == zero
        assert q.nbytes() == tensor_bytes(x.numel(), fmt, group_size=16)
    assert quantize(x, "int4", group_size=16).codes.shape == (4, 4, 8)   # two codes per byte


def test_int8_codes_are_symmetric_and_int4_covers_min_to_max():
    x = torch.tensor([[-3.0, 0.0, 1.0, 3.0]])
    q = quantize(x, "int8")
    assert q.codes.tolist() == [[[-127, 0, 42, 127]]]
    q4 = quantize(x, "int4")
    codes = torch.stack((q4.codes & 15, q4.codes >> 4), -1).flatten(-2)
    assert codes.min() == 0 and codes.max() == 15


@pytest.mark.parametrize("kwargs", [dict(fmt="int3"), dict(fmt="int8", group_size=4),
                                    dict(fmt="int4", group_size=3, dim=0)])
def test_bad_requests_are_value_errors(kwargs):
    with pytest.raises(ValueError, match=r"^[^\n]+$"):
        quantize(torch.randn(6, 10), **kwargs)


def test_kivi_keys_per_channel_beat_keys_per_token():
    k = _keys_with_outlier_channels()
    per_channel = dequantize(quantize(k, "int4", dim=2, group_size=32))
    per_token = dequantize(quantize(k, "int4", dim=-1, group_size=32))
    assert (per_channel - k).norm() < 0.5 * (per_token - k).norm()


def _dims(T):
    return dict(n_layers=2, batch=1, n_kv_heads=3, max_len=T, head_dim=64)


@pytest.mark.parametrize("name", list(FORMATS))
def test_incremental_cache_equals_one_shot_round_trip(name):
    fmt = FORMATS[name]
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(1, 3, 75, 64, generator=g), torch.randn(1, 3, 75, 64, generator=g)
    cache = QuantizedKVCache(**_dims(80), kv_format=fmt)
    for start, stop in ((0, 40), *((t, t + 1) for t in range(40, 70)), (70, 75)):
        for layer in range(2):
            k_all, v_all = cache.append(layer, k[:, :, start:stop], v[:, :, start:stop])
    torch.testing.assert_close(k_all, fmt.roundtrip_keys(k), rtol=0, atol=0)
    torch.testing.assert_close(v_all, fmt.roundtrip_values(v), rtol=0, atol=0)
    if fmt.fmt == "int4" and fmt.key_axis == "channel":
        assert torch.equal(k_all[:, :, 64:], k[:, :, 64:])    # residual: 75 % 32 tokens wait in full precision


def test_stored_bytes_agree_with_the_memory_formula():
    cache = QuantizedKVCache(**_dims(64), kv_format=FORMATS["int4 KIVI (K/channel, V/token)"])
    for layer in range(2):
        cache.append(layer, torch.randn(1, 3, 64, 64), torch.randn(1, 3, 64, 64))
    assert cache.stored_bytes() == kv_cache_bytes(layers=2, kv_heads=3, head_dim=64, tokens=64,
                                                  dtype="int4", group_size=32)
    fp16 = QuantizedKVCache(**_dims(64), kv_format=FORMATS["fp16"])
    for layer in range(2):
        fp16.append(layer, torch.randn(1, 3, 10, 64), torch.randn(1, 3, 10, 64))
    assert fp16.stored_bytes() == kv_cache_bytes(layers=2, kv_heads=3, head_dim=64, tokens=10)


def test_tiny_model_decodes_with_a_quantized_cache():
    model = build_tiny(0)
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    cfg = model.config
    dims = (cfg.n_layers, 1, cfg.n_kv_heads, 48, cfg.head_dim)
    exact = model(ids, cache=KVCache(*dims))
    same = model(ids, cache=QuantizedKVCache(*dims, kv_format=FORMATS["fp32"]))
    torch.testing.assert_close(same, exact, rtol=0, atol=0)
    approx = model(ids, cache=QuantizedKVCache(*dims, kv_format=FORMATS["int8 (K/channel, V/token)"]))
    assert 0 < (approx - exact).norm() < 0.05 * exact.norm()


def test_evaluate_kv_formats_on_the_tiny_model():
    model, tok = load_model("tiny")
    names = ["fp32", "int8 (K/channel, V/token)", "int4 KIVI (K/channel, V/token)"]
    rows = evaluate_kv_formats(model, tok, "a" + "bcdefghij" * 8, n_tokens=6, formats=names)
    assert [r["format"] for r in rows] == names
    base, int8, int4 = rows
    assert base["delta_nll"] == 0 and base["agreement"] == 1 and base["first_divergence"] is None
    assert base["top1_agreement"] == 1 and 0 <= int4["top1_agreement"] <= 1
    assert len(int8["k_error"]) == model.config.n_layers
    assert max(base["k_error"]) == 0 and 0 < max(int8["k_error"]) < max(int4["k_error"])
    assert base["bytes_per_token"] > int8["bytes_per_token"] > int4["bytes_per_token"]


@pytest.mark.slow
def test_real_model_int8_cache_is_nearly_lossless(real_model):
    model, tok = real_model
    from reference.quant import EVAL_TEXT
    rows = evaluate_kv_formats(model, tok, EVAL_TEXT, n_tokens=8,
                               formats=["fp32", "int8 (K/channel, V/token)"])
    int8 = rows[1]
    assert max(int8["k_error"]) < 0.02 and max(int8["v_error"]) < 0.02
    assert abs(int8["delta_nll"]) < 0.02 and int8["agreement"] == 1
