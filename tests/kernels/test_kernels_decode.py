"""Split-K decode attention against float64 attention of one query, for every kind of split."""
import pytest
import torch

from kernel_support import DEVICE, DTYPES, assert_matches, poisoned_outputs, randn, seed  # noqa: F401
from reference.kernels import decode_attention
from reference.kernels.decode_attention import BLOCK_N
from reference.kernels.torch_reference import merge_softmax_states, naive_attention, split_decode_attention

# (B, Hq, Hkv, N, D); the interpreter's key tiles are 16 wide, so N = 70 is 5 tiles.
CASES = [(1, 1, 1, 1, 16), (2, 9, 3, 70, 64), (1, 8, 1, 33, 32), (1, 3, 3, 40, 128), (3, 2, 2, 17, 16)]
if DEVICE.type == "cuda":
    CASES += [(4, 9, 3, 4097, 64), (1, 32, 8, 1000, 128), (2, 24, 3, 12345, 64)]


def inputs(case, dtype, seed):
    batch, n_q_heads, n_kv_heads, n_keys, head_dim = case
    gen = torch.Generator().manual_seed(seed)
    q = randn(gen, batch, n_q_heads, head_dim, dtype=dtype)
    k = randn(gen, batch, n_kv_heads, n_keys, head_dim, dtype=dtype)
    v = randn(gen, batch, n_kv_heads, n_keys, head_dim, dtype=dtype)
    reference = naive_attention(q.double()[:, :, None], k.double(), v.double())[0][:, :, 0]
    return q, k, v, reference


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_decode_attention_matches_float64(case, dtype, seed):
    q, k, v, reference = inputs(case, dtype, seed)
    out = decode_attention(q, k, v)                          # the default number of splits
    assert out.dtype == dtype and out.shape == q.shape
    assert_matches(out, reference, dtype, seed, f"decode_attention {case}")


@pytest.mark.parametrize("n_keys", [5, 50], ids=lambda n: f"N={n}")
def test_every_num_splits_gives_the_unsplit_result(n_keys, seed):
    """Splits of one key, uneven splits, and more splits than keys (empty splits) all agree."""
    q, k, v, reference = inputs((1, 3, 1, n_keys, 32), torch.float32, seed)
    tiles = -(-n_keys // BLOCK_N)
    for num_splits in sorted({1, 2, 3, tiles, tiles + 1, n_keys, n_keys + 3}):
        assert_matches(decode_attention(q, k, v, num_splits=num_splits), reference, torch.float32, seed,
                       f"decode_attention N={n_keys} num_splits={num_splits}")


def test_decode_attention_strided_cache_view(seed):
    """K/V as views of a larger preallocated cache (as the model's KV cache hands them out)."""
    gen = torch.Generator().manual_seed(seed)
    cache = randn(gen, 2, 1, 2, 64, 16)                   # [layers, B, Hkv, max_len, D]
    k, v = cache[0, :, :, :37], cache[1, :, :, :37]
    q = randn(gen, 1, 4, 16)
    reference = naive_attention(q.double()[:, :, None], k.double(), v.double())[0][:, :, 0]
    assert_matches(decode_attention(q, k, v, num_splits=3), reference, torch.float32, seed, "cache views")


def test_pytorch_split_and_merge(seed):
    """The readable flash decoding, and merging states in either order or with an empty state."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 6, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 23, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    reference = naive_attention(q[:, :, None], k, v)[0][:, :, 0]
    for num_splits in (1, 2, 5, 23, 40):
        assert torch.allclose(split_decode_attention(q, k, v, num_splits), reference, atol=1e-12), num_splits
    m = torch.randn(4, generator=gen, dtype=torch.float64)
    a = (m, torch.rand(4, generator=gen, dtype=torch.float64) + 1, torch.randn(4, 3, generator=gen, dtype=torch.float64))
    b = (m + 3, torch.rand(4, generator=gen, dtype=torch.float64) + 1, torch.randn(4, 3, generator=gen, dtype=torch.float64))
    empty = (torch.full((4,), float("-inf"), dtype=torch.float64), torch.zeros(4, dtype=torch.float64),
             torch.zeros(4, 3, dtype=torch.float64))
    ab, ba = merge_softmax_states(a, b), merge_softmax_states(b, a)
    assert all(torch.allclose(x, y) for x, y in zip(ab, ba))
    assert all(torch.equal(x, y) for x, y in zip(merge_softmax_states(a, empty), a))
    assert all(torch.equal(x, y) for x, y in zip(merge_softmax_states(empty, empty), empty))


def zeros(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((zeros(1, 2, 16), zeros(1, 2, 4, 16), [0.0]), {}, TypeError, "must be a torch.Tensor"),
    ((zeros(1, 2, 4, 16), zeros(1, 2, 4, 16), zeros(1, 2, 4, 16)), {}, ValueError, "3 dimensions"),
    ((zeros(1, 2, 16), zeros(1, 2, 4, 16), zeros(1, 2, 4, 16, dtype=torch.float64)), {}, TypeError, "dtype torch.float64"),
    ((zeros(1, 4, 16), zeros(1, 3, 4, 16), zeros(1, 3, 4, 16)), {}, ValueError, "multiple of K/V heads"),
    ((zeros(1, 2, 24), zeros(1, 2, 4, 24), zeros(1, 2, 4, 24)), {}, ValueError, "head dim must be one of"),
    ((zeros(1, 2, 16), zeros(1, 2, 0, 16), zeros(1, 2, 0, 16)), {}, ValueError, "at least one key"),
    ((zeros(1, 2, 16), zeros(1, 2, 4, 16), zeros(1, 2, 4, 16)), {"num_splits": 0}, ValueError, "positive int"),
    ((zeros(1, 2, 16), zeros(1, 2, 4, 16), zeros(1, 2, 4, 16)), {"num_splits": 2.0}, ValueError, "positive int"),
], ids=["list", "rank", "float64", "gqa", "head dim", "no keys", "zero splits", "float splits"])
def test_decode_attention_rejects_bad_input(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        decode_attention(*args, **kwargs)
