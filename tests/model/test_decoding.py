"""Naive and cached decoding agree; counters match the closed form; sampling is reproducible."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.decoding import DecodeStats, generate, naive_work, sample_next
from reference.model import build_tiny


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_naive_and_cached_greedy_tokens_are_identical(seed):
    model = build_tiny(seed)
    prompt = torch.randint(0, 256, (9,), generator=torch.Generator().manual_seed(seed)).tolist()
    naive, cached = DecodeStats(), DecodeStats()
    a = generate(model, prompt, 24, use_cache=False, stats=naive)
    b = generate(model, prompt, 24, use_cache=True, stats=cached)
    assert a == b and len(a) == 24
    assert (naive.projected_positions, naive.attention_cells) == naive_work(9, 24)
    assert cached.projected_positions == 9 + 23
    assert cached.attention_cells == 9 * 9 + sum(range(10, 10 + 23))
    assert naive.model_calls == cached.model_calls == 24 and len(cached.step_seconds) == 23


@given(st.integers(1, 300), st.integers(0, 300))
@settings(max_examples=200, deadline=None)
def test_naive_work_closed_form_equals_the_loop(prompt_len, n_new):
    lengths = [prompt_len + i for i in range(n_new)]
    assert naive_work(prompt_len, n_new) == (sum(lengths), sum(L * L for L in lengths))


def test_naive_work_matches_the_triangular_numbers():
    assert naive_work(1, 100)[0] == 5050
    assert naive_work(1, 4096)[0] == 4096 * 4097 // 2 > 8_000_000


def test_sampling_is_reproducible_with_a_seed():
    model = build_tiny(4)
    runs = [generate(model, [1, 2, 3], 20, temperature=0.8, top_k=50, seed=s) for s in (5, 5, 6)]
    assert runs[0] == runs[1] != runs[2]


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([5.0, 4.0, 3.0, -10.0, -10.0])
    gen = torch.Generator().manual_seed(0)
    seen_k = {sample_next(logits, 1.0, top_k=2, generator=gen) for _ in range(300)}
    assert seen_k == {0, 1}
    # p = softmax -> [0.665, 0.245, 0.090, ...]: top_p 0.8 keeps the first two only
    seen_p = {sample_next(logits, 1.0, top_p=0.8, generator=gen) for _ in range(300)}
    assert seen_p == {0, 1}
    assert sample_next(logits, 0.0) == 0


def test_stop_ids_end_generation_before_the_stop_token():
    model = build_tiny(0)
    full = generate(model, [10, 20], 30)
    stop = full[5]
    first = full.index(stop)
    stats = DecodeStats()
    assert generate(model, [10, 20], 30, stop_ids=[stop], stats=stats) == full[:first]
    assert stats.model_calls == first + 1  # the forward that picked the stop token still ran


@pytest.mark.parametrize("settings, message", [
    ({"top_k": 0}, "top_k must be an integer >= 1"), ({"top_k": -3}, "top_k must be"),
    ({"top_k": 2.5}, "top_k must be"), ({"top_p": 0.0}, "top_p must be in"),
    ({"top_p": -1.0}, "top_p must be in"), ({"top_p": 2.0}, "top_p must be in"),
    ({"temperature": float("nan")}, "temperature must be a finite number"),
    ({"temperature": -1.0}, "temperature must be"), ({"temperature": float("inf")}, "temperature")])
def test_bad_sampling_settings_raise_clear_errors(settings, message):
    with pytest.raises(ValueError, match=message):
        generate(build_tiny(0), [1, 2], 3, **settings)


def test_edge_sampling_settings_are_accepted():
    model = build_tiny(0)
    assert generate(model, [1, 2], 3, temperature=1.0, top_k=1, seed=0) == generate(model, [1, 2], 3)
    assert len(generate(model, [1, 2], 3, temperature=0.5, top_p=1.0, seed=0)) == 3


@pytest.mark.parametrize("prompt, n, message", [
    ([], 4, "empty"), ([1, 2], -1, ">= 0"), ([1] * 500, 20, "context window"),
    ([1, 999], 2, "outside the vocabulary")])
def test_bad_requests_raise_clear_errors(prompt, n, message):
    with pytest.raises(ValueError, match=message):
        generate(build_tiny(0), prompt, n)
