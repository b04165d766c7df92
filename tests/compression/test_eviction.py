"""reference.eviction on the tiny model: the kept sets, the bytes, and exactness where it holds."""
from __future__ import annotations

import pytest
import torch

from reference.decoding import generate
from reference.eviction import (HeavyHitters, SinkWindow, _rotate, generate_evicting,
                                heavy_hitter_keep, sink_window_keep)
from reference.model import apply_rope, build_tiny, rope_tables

PROMPT = list(range(40, 52))


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(0)


def test_sink_window_keep():
    assert sink_window_keep(5, 2, 3) == [0, 1, 2, 3, 4]
    assert sink_window_keep(10, 2, 3) == [0, 1, 7, 8, 9]
    assert sink_window_keep(10, 0, 4) == [6, 7, 8, 9]
    assert sink_window_keep(0, 2, 3) == []
    with pytest.raises(ValueError):
        sink_window_keep(5, -1, 3)


def test_heavy_hitter_keep_takes_the_top_scores_outside_the_window():
    scores = torch.tensor([5.0, 1.0, 4.0, 4.0, 0.5, 9.0, 9.0, 0.0])
    # window 2 keeps slots 6, 7; of slots 0..5 the 3 largest: 5 (9.0), 0 (5.0), 2 (4.0, the earlier tie)
    assert heavy_hitter_keep(scores, 3, 2).tolist() == [0, 2, 5, 6, 7]
    assert heavy_hitter_keep(scores, 0, 3).tolist() == [5, 6, 7]
    assert heavy_hitter_keep(scores, 6, 2).tolist() == list(range(8))
    rows = heavy_hitter_keep(torch.stack([scores, scores.flip(0)]), 1, 1)
    assert rows.tolist() == [[5, 7], [1, 7]]


@pytest.mark.parametrize("policy", [SinkWindow(4, 40), SinkWindow(0, 44), HeavyHitters(22, 22),
                                    SinkWindow(4, 40, reindex=True), HeavyHitters(20, 24, reindex=True)],
                         ids=lambda p: p.name)
def test_a_budget_above_the_sequence_decodes_like_the_full_cache(tiny, policy):
    n = 30
    assert policy.budget >= len(PROMPT) + n
    run = generate_evicting(tiny, PROMPT, n, policy)
    assert run.tokens[0] == generate(tiny, PROMPT, n)
    assert run.positions[0, 0, 0].tolist() == list(range(len(PROMPT) + n - 1))


def test_sink_window_keeps_what_the_policy_says_after_every_step(tiny):
    policy, n = SinkWindow(3, 5), 20
    run = generate_evicting(tiny, PROMPT, n, policy, trace=True)
    assert len(run.history) == n
    for step, positions in enumerate(run.history):
        written = len(PROMPT) + step        # the prefill wrote P positions, each step one more
        expected = sink_window_keep(written, 3, 5)
        assert (positions == torch.tensor(expected)).all(), step


def test_heavy_hitters_keep_the_window_and_n_heavy_older_positions(tiny):
    policy, n = HeavyHitters(4, 3), 20
    run = generate_evicting(tiny, PROMPT, n, policy, trace=True)
    for step, positions in enumerate(run.history):
        written = len(PROMPT) + step
        assert positions.shape[-1] == 7
        assert (positions[..., -3:] == torch.arange(written - 3, written)).all()
        assert (positions.diff(dim=-1) > 0).all()           # ascending, no duplicates
    # each layer and K/V head chooses for itself: the sets are not all the same
    final = run.positions.reshape(-1, 7)
    assert len({tuple(row.tolist()) for row in final}) > 1


def test_sink_window_with_real_positions_is_attention_with_evicted_keys_masked(tiny):
    """Eviction that keeps real positions computes what the full cache computes when every
    step's mask hides the evicted keys."""
    policy, n = SinkWindow(2, 6), 16
    run = generate_evicting(tiny, PROMPT, n, policy, trace=True)
    cache = tiny.new_cache(max_len=len(PROMPT) + n)
    logits = tiny(torch.tensor([PROMPT]), cache=cache)[0, -1]
    tokens = [int(logits.argmax())]
    for step in range(1, n):
        kept = run.history[step - 1][0, 0, 0]
        mask = torch.zeros(1, cache.length + 1, dtype=torch.bool)
        mask[0, kept] = True
        mask[0, -1] = True                                   # the new token sees itself
        logits = tiny(torch.tensor([[tokens[-1]]]), cache=cache, mask=mask)[0, -1]
        tokens.append(int(logits.argmax()))
    assert tokens == run.tokens[0]


def test_teacher_forcing_feeds_the_reference_and_scores_it(tiny):
    n = 12
    reference = generate(tiny, PROMPT, n)
    full = generate_evicting(tiny, PROMPT, n, SinkWindow(0, 100), forced=reference)
    assert full.tokens[0] == reference
    assert len(full.logprobs[0]) == n and all(lp <= 0 for lp in full.logprobs[0])
    small = generate_evicting(tiny, PROMPT, n, [SinkWindow(1, 3), HeavyHitters(2, 2)], forced=reference)
    assert len(small.tokens) == 2 and all(len(t) == n for t in small.tokens)


def test_policies_of_one_batch_need_one_budget(tiny):
    with pytest.raises(ValueError, match="one budget"):
        generate_evicting(tiny, PROMPT, 4, [SinkWindow(1, 3), SinkWindow(1, 4)])


def test_memory_kept_is_counted(tiny):
    cfg = tiny.config
    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4      # float32 K and V
    run = generate_evicting(tiny, PROMPT, 20, SinkWindow(2, 6))
    assert run.max_kept == 8 and run.kept_bytes == 8 * per_token
    assert run.reserved_bytes == len(PROMPT) * per_token                 # the prefill needs P slots
    long = generate_evicting(tiny, PROMPT[:3], 20, SinkWindow(2, 6))
    assert long.max_kept == 8 and long.reserved_bytes == 9 * per_token   # budget + the new token


def test_accumulated_attention_sums_to_one_per_query_row(tiny):
    """Without eviction, the scores of a K/V head add up to group size x queries so far."""
    from reference.eviction import _ScoringContext  # noqa: F401 (the context the scores come from)
    cfg, n = tiny.config, 6
    captured = {}
    import reference.eviction as ev
    original = ev._evict

    def spy(cache, positions, scores, policies, reindex, cfg_):
        captured["scores"] = scores[..., :cache.length].clone()
        return original(cache, positions, scores, policies, reindex, cfg_)
    ev._evict = spy
    try:
        generate_evicting(tiny, PROMPT, n, HeavyHitters(50, 50))
    finally:
        ev._evict = original
    group = cfg.n_heads // cfg.n_kv_heads
    queries = len(PROMPT) + n - 1
    total = captured["scores"].sum(-1)
    assert torch.allclose(total, torch.full_like(total, group * queries))


def test_reindexing_rotates_a_key_to_its_new_position():
    """RoPE rotations compose: a key rotated at position 37, moved by -30, is the key at 7."""
    head_dim, base = 16, 10000.0
    raw = torch.randn(1, 1, 3, head_dim, dtype=torch.float64)
    at = lambda p: apply_rope(raw, *rope_tables(head_dim, base, torch.tensor(p)))
    moved = _rotate(at([37, 40, 41]), torch.tensor([-30, -30, -2]), head_dim, base)
    assert torch.allclose(moved, at([7, 10, 39]), atol=1e-6)


def test_evaluate_eviction_with_room_for_everything_agrees_fully(tiny):
    from reference.eviction import evaluate_eviction

    reference, rows = evaluate_eviction(tiny, PROMPT, 8, [32])
    assert reference == generate(tiny, PROMPT, 8)
    assert [r["policy"] for r in rows] == ["window", "sinks + window",
                                          "sinks + window, cache positions", "H2O"]
    for r in rows:
        assert r["agreement"] == 1.0 and r["first_divergence"] is None
        assert abs(r["delta_nll"]) < 1e-4
