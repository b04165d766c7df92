"""reference.bench.composition: chapter 11's ladder on the tiny model (counters, same tokens every row)."""
from __future__ import annotations

import pytest
import torch

from reference.bench.composition import composition_ladder, loop_row
from reference.decoding import naive_work
from reference.model import load_model

BLOCK = 4


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def _workload(n_requests=6, shared=2 * BLOCK + 1):
    gen = torch.Generator().manual_seed(0)
    system = torch.randint(0, 256, (shared,), generator=gen).tolist()
    prompts = [system + torch.randint(0, 256, (3 + i % 3,), generator=gen).tolist() for i in range(n_requests)]
    max_tokens = [7, 2, 5, 3, 6, 2][:n_requests]
    return system, prompts, max_tokens


@pytest.fixture(scope="module")
def ladder(tiny):
    model, tok = tiny
    _, prompts, max_tokens = _workload()
    return {r.name: r for r in composition_ladder(model, tok, prompts, max_tokens, max_num_seqs=3,
                                                  block_size=BLOCK)}


def test_loop_rows_count_positions_and_calls(ladder):
    _, prompts, max_tokens = _workload()
    naive, cached = ladder["naive"], ladder["cached"]
    assert naive.positions_fed == sum(naive_work(len(p), n)[0] for p, n in zip(prompts, max_tokens))
    assert cached.positions_fed == sum(len(p) + n - 1 for p, n in zip(prompts, max_tokens))
    assert naive.model_calls == cached.model_calls == sum(max_tokens)
    assert naive.new_tokens == cached.new_tokens == sum(max_tokens)


def test_batching_cuts_model_calls_and_continuous_cuts_idle_slots(ladder):
    cached, static, continuous = ladder["cached"], ladder["batched"], ladder["continuous"]
    # 6 requests in 3 slots: two static batches of at most max(max_tokens) steps each
    assert static.model_calls <= 7 + 6 < cached.model_calls
    assert static.idle_slots > 0
    assert continuous.idle_slots < static.idle_slots
    assert continuous.model_calls < static.model_calls


def test_prefix_cache_reuses_the_shared_full_blocks_of_every_later_request(ladder):
    system, prompts, _ = _workload()
    shared_tokens = len(system) // BLOCK * BLOCK
    assert ladder["batched"].prefix_reused == 0
    assert ladder["prefix cache"].prefix_reused == shared_tokens * (len(prompts) - 1)
    assert ladder["prefix cache"].positions_fed == ladder["batched"].positions_fed - shared_tokens * (len(prompts) - 1)


def test_every_row_returns_the_same_tokens(ladder):
    rows = list(ladder.values())
    assert all(r.outputs == rows[1].outputs for r in rows[1:])
    assert len(rows[1].outputs) == 6


def test_a_sampled_naive_row_scales_its_time_but_counts_the_whole_workload(tiny):
    model, _ = tiny
    _, prompts, max_tokens = _workload()
    row = loop_row("naive", model, prompts, max_tokens, use_cache=False, measure=2)
    assert len(row.outputs) == 2 and row.extra["measured_requests"] == 2
    assert row.positions_fed == sum(naive_work(len(p), n)[0] for p, n in zip(prompts, max_tokens))


def test_bad_workload_is_refused(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="one max_tokens per prompt"):
        composition_ladder(model, tok, [[1, 2]], [3, 4])


def _row(name, seconds, **counters):
    from reference.bench.composition import Row
    base = {"new_tokens": 100, "model_calls": 100, "positions_fed": 500}
    return Row(name, seconds, **{**base, **counters})


@pytest.mark.parametrize("seconds, word", [(1.0, "faster"), (4.0, "slower"), (2.05, "about as fast")])
def test_step_sentence_words_the_measured_direction(seconds, word):
    from reference.bench.composition import step_sentence
    previous = _row("cached", 2.0)
    row = _row("batched", seconds, model_calls=25)
    sentence = step_sentence(previous, row)
    assert word in sentence and "75 passes over the weights (1.00 → 0.25 per token)" in sentence
    assert ("Python bookkeeping" in sentence) == (word != "faster")
    assert ("about as fast as **cached**" in sentence) == (word == "about as fast")


def test_the_reasons_quote_this_runs_counters():
    from reference.bench.composition import step_sentence
    prefix = step_sentence(_row("batched", 1.0), _row("prefix cache", 1.0, prefix_reused=48))
    assert "the 48 positions it saved were all prompt positions" in prefix and "of the 100 steps" in prefix
    spec = step_sentence(_row("continuous", 1.0), _row("speculative", 2.0, positions_fed=640))
    assert "2.0× slower" in spec and "640 positions fed against 500" in spec


def test_removed_names_each_techniques_saving():
    from reference.bench.composition import removed
    assert removed(_row("naive", 1), _row("cached", 1, positions_fed=120)) == "380 recomputed positions"
    assert removed(_row("batched", 1), _row("prefix cache", 1, prefix_reused=48)) == \
        "48 duplicated prefix positions"
    assert removed(_row("prefix cache", 1, idle_slots=30), _row("continuous", 1, idle_slots=6)) == \
        "24 idle slot-steps"
    assert removed(_row("continuous", 1), _row("speculative", 1, model_calls=40)) == "60 target passes"


def test_the_speculative_row_returns_the_same_tokens_and_its_draft_counters(ladder):
    spec = ladder["speculative"]
    assert spec.outputs == ladder["cached"].outputs
    assert spec.extra["spec_proposed"] >= spec.extra["spec_checked"] >= spec.extra["spec_accepted"] >= 0
    assert spec.new_tokens == ladder["continuous"].new_tokens
