"""The batching simulators: hand-checked tiny runs, and properties on random workloads."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.calculators.batching_sim import (continuous_batch_step, pareto_workload, percentile, run_schedule,
                                                schedule_chunked, simulate_continuous, simulate_static)


def request(rid, output_len, prompt_len=8, arrival=0):
    return {"id": rid, "arrival": arrival, "prompt_len": prompt_len, "output_len": output_len}


workloads = st.lists(st.tuples(st.integers(0, 12), st.integers(1, 40), st.integers(1, 12)),
                     min_size=0, max_size=14).map(
    lambda rows: [request(i, out, prompt, arrival) for i, (arrival, prompt, out) in enumerate(rows)])

def policies(max_batch):
    """name -> (token budget per step or None, the run) for every scheduling policy."""
    b = max_batch
    return {"static": (None, lambda w: simulate_static(w, b)),
            "continuous": (None, lambda w: simulate_continuous(w, b)),
            "chunked, budget 2b": (2 * b, lambda w: simulate_continuous(w, b, 2 * b)),
            "chunked, budget 17": (max(17, b), lambda w: simulate_continuous(w, b, max(17, b))),
            "prefill steps": (None, lambda w: simulate_continuous(w, b, chunked_prefill=False)),
            "prefill steps, budget 40": (40, lambda w: simulate_continuous(w, b, 40, chunked_prefill=False))}


# ----------------------------------------------------------------------- hand-checked runs
def test_static_waits_for_the_longest_while_continuous_refills():
    # Outputs 4, 1, 1 tokens, two slots, all at step 0. Static: {a, b} run steps 0-3 (a is the
    # longest), c runs alone in step 4 -> 5 steps. Continuous: b leaves after step 0, c takes its
    # slot in step 1, a finishes in step 3 -> 4 steps.
    work = [request("a", 4), request("b", 1), request("c", 1)]
    static, cont = simulate_static(work, 2), simulate_continuous(work, 2)
    assert static.grid == [["a", "b"], ["a", None], ["a", None], ["a", None], ["c", None]]
    assert cont.grid == [["a", "b"], ["a", "c"], ["a", None], ["a", None]]
    held = 4 + 1 + 1                                   # slot-steps: one per output token here
    assert static.stats["slot_utilisation"] == held / (2 * 5)
    assert cont.stats["slot_utilisation"] == held / (2 * 4)
    assert static.stats["throughput"] == 6 / 5 and cont.stats["throughput"] == 6 / 4
    # TTFT = step of the first token + 1 - arrival: c waits for the whole first batch in static.
    assert [r["ttft"] for r in static.requests] == [1, 1, 5]
    assert [r["ttft"] for r in cont.requests] == [1, 1, 2]
    assert static.stats["ttft_p50"] == 1 and cont.stats["ttft_mean"] == (1 + 1 + 2) / 3
    assert [r["tpot"] for r in cont.requests] == [1.0, None, None]   # one token: no TPOT


def test_chunked_prefill_by_hand():
    # Budget 4 tokens, 2 slots. a: prompt 6, 2 outputs; b: prompt 3, 1 output.
    # step 0: a gets 4 prompt tokens (budget spent, b waits);
    # step 1: a's last 2 prompt tokens (first token sampled) and 2 of b's 3 prompt tokens;
    # step 2: a decodes its 2nd token (done), b's last prompt token samples its only token.
    work = [request("a", 2, prompt_len=6), request("b", 1, prompt_len=3)]
    run = simulate_continuous(work, 2, max_num_batched_tokens=4)
    assert run.tokens_per_step == [4, 2 + 2, 1 + 1]
    assert run.grid == [["a", None], ["a", "b"], ["a", "b"]]
    assert [(r["first_token_step"], r["last_token_step"]) for r in run.requests] == [(1, 2), (2, 2)]
    assert [r["ttft"] for r in run.requests] == [2, 3]


def test_prefill_steps_stall_decodes_without_chunked_prefill():
    # a (3 outputs) at step 0, b (2 outputs) at step 1, no budget, separate prefill steps.
    # step 0 prefills a (token 1); step 1 prefills b (b's token 1) while a stalls; step 2 decodes
    # both (a: 2, b: 2, done); step 3 decodes a (3, done). a's TPOT: 2 gaps over 3 steps.
    work = [request("a", 3), request("b", 2, arrival=1)]
    run = simulate_continuous(work, 2, chunked_prefill=False)
    assert run.stats["steps"] == 4
    assert [r["tpot"] for r in run.requests] == [(3 - 0) / 2, (2 - 1) / 1]
    mixed = simulate_continuous(work, 2)                 # b's prefill rides along with a's decode
    assert [r["tpot"] for r in mixed.requests] == [1.0, 1.0] and mixed.stats["steps"] == 3


def test_continuous_batch_step_retires_before_admitting():
    running = [{"id": "a", "output_len": 2, "generated": 2}, {"id": "b", "output_len": 5, "generated": 1}]
    waiting = [{"id": "c", "output_len": 3, "generated": 0}, {"id": "d", "output_len": 1, "generated": 0}]
    new_running, new_waiting, finished = continuous_batch_step(running, waiting, max_batch=2)
    assert [(r["id"], r["generated"]) for r in new_running] == [("b", 2), ("c", 1)]
    assert [r["id"] for r in new_waiting] == ["d"] and [r["id"] for r in finished] == ["a"]
    assert running[1]["generated"] == 1 and waiting[0]["generated"] == 0   # inputs untouched


def test_schedule_chunked_by_hand():
    def state(rid, prompt, prefilled):
        return {"id": rid, "prompt_len": prompt, "prefilled": prefilled, "output_len": 9, "generated": 0}
    running = [state("p", 100, 30), state("d1", 5, 5), state("d2", 7, 7)]
    waiting = [state("w1", 20, 0), state("w2", 50, 0)]
    # budget 40: decodes d1, d2 (2 tokens), then p's 38 of its 70 prompt tokens left; w1 waits
    assert schedule_chunked(running, waiting, 40, max_num_seqs=8) == {"d1": 1, "d2": 1, "p": 38}
    # budget 100: 2 + 70 for p, 20 for w1, the last 8 to w2
    assert schedule_chunked(running, waiting, 100, 8) == {"d1": 1, "d2": 1, "p": 70, "w1": 20, "w2": 8}
    # only 4 sequences may run: w1 is admitted, w2 is not
    assert schedule_chunked(running, waiting, 100, 4) == {"d1": 1, "d2": 1, "p": 70, "w1": 20}


# ------------------------------------------------------------------------------ properties
@settings(max_examples=60, deadline=None)
@given(workloads, st.integers(1, 5))
def test_every_request_finishes_with_its_output_length_and_budgets_hold(work, max_batch):
    for name, (budget, policy) in policies(max_batch).items():
        run = policy(work)
        assert sorted(r["id"] for r in run.requests) == [r["id"] for r in work], name
        assert all(r["generated"] == r["output_len"] for r in run.requests), name
        assert 0 <= run.stats["slot_utilisation"] <= 1, name
        assert run.stats["output_tokens"] == sum(r["output_len"] for r in work), name
        assert all(r["ttft"] >= 1 for r in run.requests), name
        if budget is not None:
            assert max(run.tokens_per_step, default=0) <= budget, name
        _check_grid(run, max_batch)


def _check_grid(run, max_batch):
    """Each request holds exactly one slot, from its admission to its last token, and nothing else."""
    assert all(len(row) == max_batch for row in run.grid)
    for r in run.requests:
        cells = [(step, slot) for step, row in enumerate(run.grid) for slot, rid in enumerate(row)
                 if rid == r["id"]]
        assert [s for s, _ in cells] == list(range(r["admitted"], r["last_token_step"] + 1))
        assert len({slot for _, slot in cells}) == 1 and r["admitted"] >= r["arrival"]


@settings(max_examples=80, deadline=None)
@given(workloads, st.integers(1, 5))
def test_continuous_is_never_worse_than_static(work, max_batch):
    static, cont = simulate_static(work, max_batch), simulate_continuous(work, max_batch)
    assert cont.stats["steps"] <= static.stats["steps"]
    # Both serve in arrival order and continuous admits each request no later (a free slot is
    # there whenever static would admit it), so every first token comes no later either.
    for c, s in zip(cont.requests, static.requests):
        assert c["first_token_step"] <= s["first_token_step"]


@settings(max_examples=40, deadline=None)
@given(workloads, st.integers(1, 5))
def test_the_simulator_without_budget_is_repeated_continuous_batch_steps(work, max_batch):
    run = simulate_continuous(work, max_batch)
    pending = sorted(work, key=lambda r: r["arrival"])
    running, waiting, rows, step = [], [], [], 0
    while pending or waiting or any(r["generated"] < r["output_len"] for r in running):
        waiting += [dict(r, generated=0) for r in pending if r["arrival"] <= step]
        pending = [r for r in pending if r["arrival"] > step]
        running, waiting, _ = continuous_batch_step(running, waiting, max_batch)
        rows.append(sorted(r["id"] for r in running))
        step += 1
    assert rows == [sorted(rid for rid in row if rid is not None) for row in run.grid]


@settings(max_examples=40, deadline=None)
@given(workloads, st.integers(1, 5))
def test_a_budget_nothing_reaches_changes_nothing(work, max_batch):
    everything = sum(r["prompt_len"] for r in work) + max_batch
    assert simulate_continuous(work, max_batch, everything).grid == simulate_continuous(work, max_batch).grid


states = st.lists(st.tuples(st.integers(1, 30), st.integers(0, 30)), max_size=8)


@settings(max_examples=200, deadline=None)
@given(states, st.lists(st.integers(1, 30), max_size=6), st.integers(1, 40), st.integers(1, 10))
def test_schedule_chunked_properties(run_rows, wait_rows, budget, max_num_seqs):
    running = [{"id": f"r{i}", "prompt_len": p, "prefilled": min(done, p), "output_len": 5, "generated": 0}
               for i, (p, done) in enumerate(run_rows)]
    waiting = [{"id": f"w{i}", "prompt_len": p, "prefilled": 0, "output_len": 5, "generated": 0}
               for i, p in enumerate(wait_rows)]
    seqs = max(max_num_seqs, len(running))
    counts = schedule_chunked(running, waiting, budget, seqs)
    assert sum(counts.values()) <= budget and all(n >= 1 for n in counts.values())
    decoding = [r["id"] for r in running if r["prefilled"] == r["prompt_len"]]
    prefill_order = [r for r in running + waiting if r["prefilled"] < r["prompt_len"]]
    # decodes first: no prefill token while a decode waits
    if any(r["id"] in counts for r in prefill_order):
        assert all(counts.get(rid) == 1 for rid in decoding)
    # chunks never pass a prompt, and first come first served: a request gets tokens only when
    # every request before it got all its prompt tokens left
    left = [r["prompt_len"] - r["prefilled"] for r in prefill_order]
    given_tokens = [counts.get(r["id"], 0) for r in prefill_order]
    assert all(g <= n for g, n in zip(given_tokens, left))
    for i, g in enumerate(given_tokens):
        if g:
            assert given_tokens[:i] == left[:i]
    admitted = [r for r in waiting if r["id"] in counts]
    assert len(running) + len(admitted) <= seqs
    # work-conserving: budget is left over only when everything that may run got all it needs
    if sum(counts.values()) < budget:
        may_run = prefill_order[:len(prefill_order) - len(waiting) + max(0, seqs - len(running))]
        assert all(counts.get(rid) == 1 for rid in decoding)
        assert all(counts.get(r["id"]) == r["prompt_len"] - r["prefilled"] for r in may_run)


# ------------------------------------------------------------------------ workload, helpers
def test_pareto_workload_is_seeded_and_shaped():
    a, b = pareto_workload(500, 7), pareto_workload(500, 7, arrival="poisson", rate=0.25)
    assert a == pareto_workload(500, 7) and a != pareto_workload(500, 8)
    outputs = [r["output_len"] for r in a]
    assert min(outputs) >= 4 and max(outputs) <= 256 and np.median(outputs) < np.mean(outputs)  # long tail
    assert all(16 <= r["prompt_len"] <= 1024 for r in a) and {r["arrival"] for r in a} == {0}
    arrivals = [r["arrival"] for r in b]
    assert arrivals == sorted(arrivals) and 0.8 < arrivals[-1] / (500 / 0.25) < 1.2


def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        values = list(rng.integers(0, 50, n).astype(float))
        for q in (0, 50, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_bad_input_is_a_clear_value_error():
    work = [request("a", 3, prompt_len=50)]
    for message, call in [("max_batch", lambda: simulate_static(work, 0)),
                          ("max_num_batched_tokens", lambda: simulate_continuous(work, 4, 2)),
                          ("never fits", lambda: simulate_continuous(work, 4, 20, chunked_prefill=False)),
                          ("keys", lambda: simulate_continuous([{"id": 1}], 2)),
                          ("output_len >= 1", lambda: simulate_static([request("a", 0)], 2)),
                          ("unique id", lambda: simulate_static([request("a", 1), request("a", 2)], 2)),
                          ("arrival", lambda: pareto_workload(3, 0, arrival="burst")),
                          ("max_batch", lambda: continuous_batch_step([], [], 0)),
                          ("token_budget", lambda: schedule_chunked([], [], 0, 4)),
                          ("neither running nor waiting", lambda: run_schedule(work, 1, lambda r, w: {"zz": 1})),
                          ("more than 1 slots", lambda: run_schedule([request("a", 1), request("b", 1)], 1,
                                                                     lambda r, w: {x["id"]: 8 for x in w})),
                          ("whole number >= 1", lambda: run_schedule(work, 1, lambda r, w: {"a": 0})),
                          ("prompt tokens left", lambda: run_schedule(work, 1, lambda r, w: {"a": 51}))]:
        with pytest.raises(ValueError, match=message):
            call()
