"""GQA/MQA/MHA share one attention function; MLA naive and absorbed agree and cache only the latent."""
import pytest
import torch
from torch.nn import functional as F

from reference.attention import grouped_query_attention, repeat_kv
from reference.calculators.memory import mla_kv_bytes
from reference.mla import MLA, rope


def _qkv(B, Hq, Hkv, Tq, Tk, D, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, Tq, D, generator=g, dtype=dtype), torch.randn(B, Hkv, Tk, D, generator=g, dtype=dtype),
            torch.randn(B, Hkv, Tk, D, generator=g, dtype=dtype))


@pytest.mark.parametrize("Hq,Hkv", [(6, 6), (6, 2), (6, 1), (9, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_equals_mha_with_repeated_kv_and_sdpa(Hq, Hkv, causal):
    q, k, v = _qkv(2, Hq, Hkv, 5, 5, 8)
    got = grouped_query_attention(q, k, v, causal=causal)
    group = Hq // Hkv
    expected = grouped_query_attention(q, repeat_kv(k, group), repeat_kv(v, group), causal=causal)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    sdpa = F.scaled_dot_product_attention(q, repeat_kv(k, group), repeat_kv(v, group), is_causal=causal)
    torch.testing.assert_close(got, sdpa, rtol=1e-10, atol=1e-10)


def test_causal_decode_rows_equal_the_last_rows_of_a_prefill():
    q, k, v = _qkv(1, 4, 2, 7, 7, 8)
    full = grouped_query_attention(q, k, v, causal=True)
    last3 = grouped_query_attention(q[:, :, -3:], k, v, causal=True)
    torch.testing.assert_close(last3, full[:, :, -3:])
    one = grouped_query_attention(q[:, :, -1:], k, v, causal=True)
    torch.testing.assert_close(one, grouped_query_attention(q[:, :, -1:], k, v))   # decode needs no mask


def test_value_width_may_differ_and_float32_stays_float32():
    q, k, _ = _qkv(1, 4, 1, 3, 6, 8, dtype=torch.float32)
    v = torch.randn(1, 1, 6, 5)
    out = grouped_query_attention(q, k, v, scale=0.3)
    assert out.shape == (1, 4, 3, 5) and out.dtype == torch.float32


def test_kv_is_never_copied_per_query_head(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", lambda *a, **k: calls.append(a))
    q, k, v = _qkv(1, 8, 1, 2, 4, 4)
    grouped_query_attention(q, k, v)
    assert not calls


@pytest.mark.parametrize("bad", [dict(Hkv=4, Hq=6), dict(Tq=5, Tk=3)])
def test_bad_shapes_are_value_errors(bad):
    shape = dict(B=1, Hq=6, Hkv=2, Tq=2, Tk=3, D=4) | bad
    q, k, v = _qkv(**shape)
    with pytest.raises(ValueError):
        grouped_query_attention(q, k, v, causal=True)


def _mla(seed=0):
    torch.manual_seed(seed)
    layer = MLA(d_model=48, n_heads=4, latent_dim=16, q_latent_dim=24, nope_dim=8, rope_dim=4, v_dim=6)
    return layer.double()


def test_absorbed_mla_equals_naive_mla_prefill_and_decode():
    layer = _mla()
    h = torch.randn(2, 9, 48, dtype=torch.float64)
    torch.testing.assert_close(layer(h, mode="absorbed"), layer(h, mode="naive"), rtol=1e-10, atol=1e-10)
    naive_cache, absorbed_cache = layer.new_cache(batch=2, max_len=9), layer.new_cache(batch=2, max_len=9)
    steps = [layer(h[:, :5], cache=naive_cache)] + [layer(h[:, t:t + 1], cache=naive_cache) for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), layer(h, mode="naive"))
    for t, chunk in ((0, 5), (5, 1), (6, 1), (7, 2)):
        torch.testing.assert_close(layer(h[:, t:t + chunk], cache=absorbed_cache, mode="absorbed"),
                                   layer(h, mode="naive")[:, t:t + chunk], rtol=1e-10, atol=1e-10)


def test_absorbed_mla_in_float32_agrees_to_float_tolerance():
    layer = _mla().float()
    h = torch.randn(1, 6, 48)
    torch.testing.assert_close(layer(h, mode="absorbed"), layer(h, mode="naive"), rtol=1e-4, atol=1e-5)


def test_mla_cache_holds_latent_plus_rope_per_token():
    layer = _mla().float()
    cache = layer.new_cache(n_layers=3, batch=2, max_len=10)
    assert cache.buffer.shape == (3, 2, 10, 16 + 4)
    assert cache.nbytes() == mla_kv_bytes(layers=3, latent_dim=16, rope_dim=4, tokens=10, batch=2, dtype="fp32")
    latent, rope_key = cache.append(0, torch.zeros(2, 3, 16), torch.ones(2, 3, 4))
    assert latent.shape == (2, 3, 16) and rope_key.shape == (2, 3, 4)
    assert torch.equal(cache.buffer[0, :, :3, 16:], torch.ones(2, 3, 4))
    with pytest.raises(ValueError):
        cache.append(0, torch.zeros(2, 8, 16), torch.zeros(2, 8, 4))


def test_rope_on_the_rebuilt_key_would_break_absorption():
    # Scores of a rotated content key depend on the positions: no single matrix W_UQᵀ W_UK fits.
    layer = _mla().requires_grad_(False)
    w_uqk, _ = layer.absorbed_weights()
    c_q, c_kv = torch.randn(1, 24, dtype=torch.float64), torch.randn(1, 16, dtype=torch.float64)
    q = layer.w_uq(c_q).view(4, 8)[0]
    k = layer.w_uk(c_kv).view(4, 8)[0]
    absorbed = (c_q @ w_uqk[0] @ c_kv.T).item()
    assert (q @ k).item() == pytest.approx(absorbed)
    at = lambda x, p: rope(x[None], torch.tensor([p]))[0]
    rotated = [(at(q, t) @ at(k, s)).item() for t, s in ((3, 1), (10, 8), (10, 1))]
    assert rotated[0] == pytest.approx(rotated[1])       # only s - t matters ...
    assert rotated[0] != pytest.approx(absorbed) and rotated[2] != pytest.approx(rotated[0])  # ... but it matters
