"""The preallocated KV cache: writes in place, returns views, truncates, refuses overflow."""
import pytest
import torch

from reference.kv_cache import KVCache


def make(max_len=10):
    return KVCache(n_layers=2, batch=1, n_kv_heads=3, max_len=max_len, head_dim=4)


def test_append_returns_views_of_one_preallocated_buffer():
    cache = make()
    ptr = cache.k.data_ptr()
    k, v = torch.randn(1, 3, 4, 4), torch.randn(1, 3, 4, 4)
    k_all, v_all = cache.append(0, k, v)
    k_all2, _ = cache.append(0, k[:, :, :1], v[:, :, :1])
    assert cache.k.data_ptr() == ptr and k_all2.data_ptr() == ptr  # never reallocated
    assert k_all2.shape == (1, 3, 5, 4)
    torch.testing.assert_close(k_all2[:, :, :4], k)
    torch.testing.assert_close(v_all, v)


def test_layers_are_independent_and_length_follows_last_layer():
    cache = make()
    cache.append(0, torch.ones(1, 3, 2, 4), torch.ones(1, 3, 2, 4))
    assert cache.read(1)[0].shape[2] == 0
    cache.append(1, torch.zeros(1, 3, 2, 4), torch.zeros(1, 3, 2, 4))
    assert cache.length == 2
    assert cache.read(0)[0].sum() == 2 * 3 * 4 and cache.read(1)[0].sum() == 0


def test_truncate_then_overwrite():
    cache = make()
    for layer in range(2):
        cache.append(layer, torch.ones(1, 3, 6, 4), torch.ones(1, 3, 6, 4))
    cache.truncate(2)
    assert cache.length == 2
    for layer in range(2):
        k_all, _ = cache.append(layer, torch.full((1, 3, 1, 4), 7.0), torch.zeros(1, 3, 1, 4))
    assert k_all.shape[2] == 3 and k_all[0, 0, 2, 0] == 7.0
    with pytest.raises(ValueError):
        cache.truncate(4)


def test_overflow_is_a_clear_error():
    cache = make(max_len=3)
    cache.append(0, torch.ones(1, 3, 3, 4), torch.ones(1, 3, 3, 4))
    with pytest.raises(ValueError, match="max_len=3"):
        cache.append(0, torch.ones(1, 3, 1, 4), torch.ones(1, 3, 1, 4))


def test_nbytes_counts_both_buffers():
    assert make(max_len=10).nbytes() == 2 * 2 * 1 * 3 * 10 * 4 * 4
