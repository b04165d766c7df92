"""The tiny model: one forward serves prefill and decode, RoPE and GQA behave as specified."""
import torch

from reference.context import DenseContext
from reference.model import (TINY, RMSNorm, apply_rope, build_tiny, rope_tables, rotate_complex,
                             rotate_complex_)


def random_ids(gen, length):
    return torch.randint(0, TINY.vocab_size, (1, length), generator=gen)


def test_logits_shape_and_dtype():
    model = build_tiny(0)
    logits = model(torch.zeros(2, 5, dtype=torch.long))
    assert logits.shape == (2, 5, TINY.vocab_size) and logits.dtype == torch.float32


def test_build_tiny_is_deterministic_in_seed():
    a, b, c = build_tiny(7), build_tiny(7), build_tiny(8)
    ids = torch.arange(10)[None]
    assert torch.equal(a(ids), b(ids))
    assert not torch.allclose(a(ids), c(ids))


def test_cached_chunks_match_one_full_pass():
    """Prefill 7 tokens, feed 3 more as a chunk, then 1 by 1: same logits as one uncached pass."""
    gen = torch.Generator().manual_seed(1)
    model, ids = build_tiny(1), random_ids(gen, 14)
    full = model(ids)
    cache = model.new_cache(max_len=14)
    pieces = [model(ids[:, :7], cache=cache), model(ids[:, 7:10], cache=cache)]
    pieces += [model(ids[:, t:t + 1], cache=cache) for t in range(10, 14)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-4, atol=1e-4)
    assert cache.length == 14


def test_future_tokens_do_not_change_past_logits():
    gen = torch.Generator().manual_seed(2)
    model, ids = build_tiny(2), random_ids(gen, 12)
    changed = ids.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % TINY.vocab_size
    torch.testing.assert_close(model(ids)[:, :8], model(changed)[:, :8])


def test_rope_rotates_pairs_and_preserves_norm():
    x = torch.randn(1, 2, 5, 16, dtype=torch.float64).float()
    cos, sin = rope_tables(16, 10000.0, torch.arange(5))
    y = apply_rope(x, cos, sin)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0])  # position 0 is not rotated
    # the pair (x0, x1) turns by angle = position * base^0 = position radians
    angle = torch.tensor(3.0)
    expected0 = x[0, 0, 3, 0] * angle.cos() - x[0, 0, 3, 1] * angle.sin()
    torch.testing.assert_close(y[0, 0, 3, 0], expected0)


def test_model_rope_tables_match_the_closed_form():
    """The tables the model precomputes once equal rope_tables at any position."""
    model = build_tiny(0)
    positions = torch.tensor([0, 1, 37, TINY.max_seq_len - 1])
    cos, sin = rope_tables(TINY.head_dim, TINY.rope_base, positions)
    x = torch.randn(1, 1, 4, TINY.head_dim)
    rotated_by_model = rotate_complex(x.transpose(1, 2), model.rope_turns[positions])
    torch.testing.assert_close(rotated_by_model.transpose(1, 2), apply_rope(x, cos, sin))
    torch.testing.assert_close(model.rope_turns[positions, 0, :, 0], cos)


def test_complex_rotation_gives_the_same_bits_as_the_pair_swap():
    """The model rotates Q and K by one complex product; it must equal the three-op pair swap
    exactly (same products, same sums), or greedy tokens could move at near-ties."""
    cos, sin = rope_tables(64, 100000.0, torch.arange(300, 340))
    qk = torch.randn(1, 40, 15 * 64)[..., :12 * 64].unflatten(-1, (-1, 64))   # a strided slice, as in Attention
    by_pairs = apply_rope(qk.transpose(1, 2), cos, sin).transpose(1, 2)
    by_complex = rotate_complex(qk, torch.stack((cos, sin), dim=-1)[:, None])
    assert torch.equal(by_complex, by_pairs), \
        f"complex rotation differs from rotate_pairs by up to {(by_complex - by_pairs).abs().max():.2e}"
    half = rotate_complex(qk.half(), torch.stack((cos, sin), dim=-1)[:, None].half())
    assert half.dtype == torch.float16, f"a float16 model's keys must stay float16, got {half.dtype}"
    turns = torch.stack((cos, sin), dim=-1)[:, None]
    in_place = rotate_complex_(qk.clone(), torch.view_as_complex(turns))    # what the model does
    assert torch.equal(in_place, by_complex)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):   # a model in dtype: its table too
        want = rotate_complex(qk.to(dtype), turns.to(dtype))
        assert torch.equal(rotate_complex_(qk.to(dtype), torch.view_as_complex(turns.to(dtype).float())), want), dtype


def test_scores_depend_only_on_relative_position():
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    def score(pq, pk):
        cq, sq = rope_tables(16, 10000.0, torch.tensor([pq]))
        ck, sk = rope_tables(16, 10000.0, torch.tensor([pk]))
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum()
    torch.testing.assert_close(score(5, 2), score(103, 100), rtol=1e-4, atol=1e-5)


def test_query_heads_share_kv_heads_in_groups():
    """With GQA, query head h reads K/V head h // group_size: zeroing V of KV head 0 changes
    exactly the outputs of query heads 0..group_size-1."""
    model = build_tiny(3)
    attn = model.blocks[0].attn
    x = torch.randn(1, 4, TINY.d_model)
    turns = torch.view_as_complex(model.rope_turns[:4])   # as a forward makes it, once per step
    context = DenseContext.for_step(None, 4, None, x.device)   # no cache: causal over the 4 tokens
    captured = {}
    attn.o_proj.register_forward_hook(lambda mod, inp, out: captured.__setitem__("in", inp[0].clone()))
    attn(x, turns, context, 0)
    before = captured["in"].view(1, 4, TINY.n_heads, TINY.head_dim)
    with torch.no_grad():
        v_rows = TINY.n_heads * TINY.head_dim + TINY.n_kv_heads * TINY.head_dim  # [q; k; v] fused
        attn.qkv_proj.weight[v_rows:v_rows + TINY.head_dim] = 0
    attn(x, turns, context, 0)
    after = captured["in"].view(1, 4, TINY.n_heads, TINY.head_dim)
    changed = [(before[:, :, h] != after[:, :, h]).any().item() for h in range(TINY.n_heads)]
    assert changed == [h < TINY.group_size for h in range(TINY.n_heads)]


def test_rms_norm_formula_gives_the_bits_of_f_rms_norm():
    """The CPU float32 path writes the formula out; it must equal torch's fused op exactly."""
    norm = RMSNorm(576, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(576))
    for shape in [(1, 1, 576), (2, 7, 576)]:
        x = torch.randn(shape) * 3
        assert torch.equal(norm(x), torch.nn.functional.rms_norm(x, (576,), norm.weight, 1e-5))
    half = norm.half()(torch.randn(1, 3, 576).half())
    assert half.dtype == torch.float16
