"""Grader for exercises/ch09_continuous_batching.ipynb.

Expected values come from ``reference.calculators.batching_sim``, computed here on requests and workloads
drawn from ``torch.Generator().manual_seed(seed)`` (a workload's own seed is drawn from it too).
Wrong answers are compared with what the usual slips produce, to name the slip.
"""
from __future__ import annotations

import math
import statistics

import pytest
import torch

from autograder.rules.inputs import generator, randint
from autograder.rules.plugin import exercise
from reference.calculators import batching_sim as sim

RETIRE_FIRST = ("retire first: a request that reached output_len frees its slot for THIS step; "
                "admitting before retiring leaves that slot idle for a step")
PREFILL_SAMPLES = ("the step that admits a request runs its prefill, and the prefill samples the "
                   "first token: admitted requests leave the step with generated = 1")
DECODES_FIRST = ("decodes first: every running request that has finished its prompt gets its 1 "
                 "token before any prefill chunk, or one long prompt starves every decode")
MAX_SEQS = "admit a waiting request only while fewer than max_num_seqs requests would be running"
MAX_SEQS_PLUS_ONE = ("one request too many was admitted: after admitting, at most max_num_seqs "
                     "requests are running (admit while len(running) + admitted < max_num_seqs, "
                     "i.e. max_num_seqs - len(running) waiting requests at most)")
MAX_SEQS_MINUS_ONE = ("one request too few was admitted: max_num_seqs requests may run at once, "
                      "so max_num_seqs - len(running) waiting requests can be admitted")
STATIC = ("that is static batching: continuous batching admits waiting requests into every slot "
          "freed this step, while the other requests keep generating, not only when the whole "
          "batch has finished")
IGNORES_ARRIVALS = ("a request cannot be admitted before its arrival step: move requests from the "
                    "workload into the queue only once step >= their arrival (TTFT still counts "
                    "from the arrival)")
EXCLUSIVE = ("those percentiles use the 'exclusive' method (statistics.quantiles' default: rank "
             "(n + 1) q / 100, 1-based). The course interpolates linearly between the sorted "
             "values at position (n - 1) q / 100, 0-based: numpy.percentile's default, "
             "statistics.quantiles(..., method='inclusive')")
PERCENTILES = ("only the percentiles differ: the q-th percentile interpolates linearly between the "
               "two sorted values around position (n - 1) q / 100 (0-based), numpy.percentile's "
               "default")
WITHIN_BUDGET = ("never schedule more than token_budget tokens in total: the last prefill gets "
                 "only the budget left (that is the chunk)")


# ------------------------------------------------------------------ continuous_batch_step
def _state(gen, max_batch):
    """Running requests (some finished, some not) and a queue longer than the free slots."""
    n_running = randint(gen, 1, max_batch)
    running = []
    for i in range(n_running):
        output_len = randint(gen, 1, 6)
        done = i == 0 or randint(gen, 0, 2) == 0            # at least one request just finished
        running.append({"id": i, "output_len": output_len,
                        "generated": output_len if done else randint(gen, 1, output_len - 1)
                        if output_len > 1 else 1})
    waiting = [{"id": 100 + i, "output_len": randint(gen, 1, 6), "generated": 0}
               for i in range(randint(gen, max_batch, max_batch + 3))]
    return running, waiting


def _step_slips(running, waiting, max_batch):
    """advice -> what continuous_batch_step returns with that slip."""
    def admit_first(run, wait, b):
        free = max(0, b - len(run))
        out = [dict(r) for r in run if r["generated"] < r["output_len"]] + [dict(r) for r in wait[:free]]
        for r in out:
            r["generated"] += 1
        return out, wait[free:], [r for r in run if r["generated"] >= r["output_len"]]

    def not_advanced(run, wait, b):
        out, rest, done = sim.continuous_batch_step(run, wait, b)
        admitted = {r["id"] for r in wait}
        return [dict(r, generated=r["generated"] - (r["id"] in admitted)) for r in out], rest, done

    def retire_last(run, wait, b):
        out, rest, done = sim.continuous_batch_step(
            [r for r in run if r["generated"] < r["output_len"]], wait, b)
        return ([r for r in out if r["generated"] < r["output_len"]], rest,
                [r for r in run if r["generated"] >= r["output_len"]]
                + [r for r in out if r["generated"] >= r["output_len"]])

    def static(run, wait, b):
        still = [r for r in run if r["generated"] < r["output_len"]]
        if still:   # the batch is still generating: no admission, the freed slots stay empty
            out = [dict(r, generated=r["generated"] + 1) for r in still]
            return out, list(wait), [r for r in run if r["generated"] >= r["output_len"]]
        return sim.continuous_batch_step(run, wait, b)

    return {RETIRE_FIRST: admit_first(running, waiting, max_batch),
            STATIC: static(running, waiting, max_batch),
            PREFILL_SAMPLES: not_advanced(running, waiting, max_batch),
            "retire at the START of the step the requests that reached output_len in earlier steps; "
            "a request that reaches it now runs this step and leaves in the next one":
                retire_last(running, waiting, max_batch)}


def _normal(result):
    """(running as a set of (id, generated), waiting ids in order, finished ids as a set)."""
    if not isinstance(result, (tuple, list)) or len(result) != 3 or \
            not all(isinstance(part, (list, tuple)) for part in result):
        raise AssertionError(f"continuous_batch_step returned {type(result).__name__}; expected a "
                             "tuple of three lists (running, waiting, finished)")
    try:
        running, waiting, finished = result
        return ({(r["id"], r["generated"]) for r in running}, [r["id"] for r in waiting],
                {r["id"] for r in finished})
    except (TypeError, KeyError) as exc:
        raise AssertionError(f"continuous_batch_step must return lists of request dicts with "
                             f"'id' and 'generated' ({type(exc).__name__}: {exc})") from None


def _compare_step(got, expected, slips, where):
    got, expected = _normal(got), _normal(expected)
    if got == expected:
        return
    hint = "\nor: ".join(advice for advice, slip in slips.items() if got == _normal(slip)) or None
    parts = ("running (id, generated)", "waiting ids", "finished ids")
    wrong = "; ".join(f"{p}: expected {sorted(e) if isinstance(e, set) else e}, got "
                      f"{sorted(g) if isinstance(g, set) else g}"
                      for p, g, e in zip(parts, got, expected) if g != e)
    raise AssertionError(f"{where}: {wrong}" + (f"\nHint: {hint}" if hint else ""))


@exercise("continuous_batch_step", points=6)
def test_one_step_retires_admits_and_advances(learner, seed):
    gen = generator(seed)
    for _ in range(6):
        max_batch = randint(gen, 2, 6)
        running, waiting = _state(gen, max_batch)
        got = learner.call("continuous_batch_step", running, waiting, max_batch)
        _compare_step(got, sim.continuous_batch_step(running, waiting, max_batch),
                      _step_slips(running, waiting, max_batch),
                      f"continuous_batch_step(running={running}, waiting={waiting}, max_batch={max_batch})")


@exercise("continuous_batch_step", points=6)
def test_steps_in_a_row_serve_a_pareto_workload(learner, seed):
    gen = generator(seed + 1)
    max_batch = randint(gen, 2, 5)
    workload = sim.pareto_workload(randint(gen, 10, 16), randint(gen, 0, 2**31), min_output=1,
                                   max_output=12)
    queue = [{"id": r["id"], "output_len": r["output_len"], "generated": 0} for r in workload]
    mine, theirs = ([], list(queue), []), ([], list(queue), [])
    for step in range(200):
        if not mine[1] and all(r["generated"] >= r["output_len"] for r in mine[0]):
            return
        slips = _step_slips(mine[0], mine[1], max_batch)
        theirs = sim.continuous_batch_step(mine[0], mine[1], max_batch)
        mine = learner.call("continuous_batch_step", mine[0], mine[1], max_batch)
        _compare_step(mine, theirs, slips, f"step {step} of a run with max_batch={max_batch} "
                      f"(output lengths {[r['output_len'] for r in workload]})")
    raise AssertionError("after 200 steps requests were still waiting or running: does every "
                         "step advance the running requests?")


# ---------------------------------------------------------------------- simulate_batching
STAT_KEYS = ("steps", "slot_utilisation", "throughput", "ttft_mean", "ttft_p50", "ttft_p99",
             "tpot_mean", "tpot_p50", "tpot_p99")


def _stats_from(requests, steps, held, max_batch, ttft=None, tpot=None, percentile=sim.percentile):
    """Stats of a run from its per-request steps, each part replaceable to reproduce a slip."""
    ttft = ttft or (lambda r: r["first_token_step"] + 1 - r["arrival"])
    tpot = tpot or (lambda r: (r["last_token_step"] - r["first_token_step"]) / (r["output_len"] - 1))
    out = {"steps": steps, "slot_utilisation": held / (max_batch * steps),
           "throughput": sum(r["output_len"] for r in requests) / steps}
    for name, values in (("ttft", [ttft(r) for r in requests]),
                         ("tpot", [tpot(r) for r in requests if r["output_len"] > 1])):
        out |= {f"{name}_mean": sum(values) / len(values), f"{name}_p50": percentile(values, 50),
                f"{name}_p99": percentile(values, 99)}
    return out


def _stat_slips(run, other, policy, max_batch):
    """advice -> the stats that slip gives (``run``: the reference run, ``other``: the other policy's)."""
    requests, steps = run.requests, run.stats["steps"]
    held = sum(rid is not None for row in run.grid for rid in row)

    def nearest_rank(values, q):
        ordered = sorted(values)
        return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]

    def exclusive(values, q):
        return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]

    batches = {}   # static: admission step -> last token steps of the batch admitted then
    for r in requests:
        batches.setdefault(r["admitted"], []).append(r["last_token_step"])
    slips = {
        "TTFT counts the step that samples the first token: ttft = first_token_step + 1 - arrival":
            _stats_from(requests, steps, held, max_batch, ttft=lambda r: r["first_token_step"] - r["arrival"]),
        "TTFT starts at the request's ARRIVAL, not at its admission: time in the queue is part of it":
            _stats_from(requests, steps, held, max_batch, ttft=lambda r: r["first_token_step"] + 1 - r["admitted"]),
        "the first token comes from the prefill step, not from a decode: TPOT divides the gap between "
        "the first and the last token by output_len - 1":
            _stats_from(requests, steps, held, max_batch,
                        tpot=lambda r: (r["last_token_step"] - r["first_token_step"]) / r["output_len"]),
        "TPOT is the time per token AFTER the first one; it does not include the wait for the first "
        "token (use last_token_step - first_token_step)":
            _stats_from(requests, steps, held, max_batch,
                        tpot=lambda r: (r["last_token_step"] + 1 - r["arrival"]) / r["output_len"]),
        "percentiles interpolate linearly between ranks (numpy.percentile's default), not nearest rank":
            _stats_from(requests, steps, held, max_batch, percentile=nearest_rank),
        EXCLUSIVE: _stats_from(requests, steps, held, max_batch, percentile=exclusive),
        "steps in which nothing runs (before the next arrival) still count":
            _stats_from(requests, sum(any(rid is not None for rid in row) for row in run.grid), held, max_batch),
    }
    if any(r["arrival"] for r in requests):   # what a simulation that ignores arrivals gives
        early = [dict(r, arrival=0) for r in requests]
        runs = (sim.simulate_static if policy == "static" else sim.simulate_continuous)(early, max_batch)
        arrival = {r["id"]: r["arrival"] for r in requests}
        slips[IGNORES_ARRIVALS] = _stats_from(
            [dict(r, arrival=arrival[r["id"]]) for r in runs.requests], runs.stats["steps"],
            sum(rid is not None for row in runs.grid for rid in row), max_batch)
    if policy == "static":
        batch_held = sum(len(ends) * (max(ends) + 1 - start) for start, ends in batches.items())
        slips["a finished request no longer uses its slot: count the slot-steps of requests still "
              "generating (the empty slots of a static batch are what utilisation measures)"] = \
            _stats_from(requests, steps, batch_held, max_batch)
        slips["static batching admits a new batch only when EVERY request of the current batch has "
              "finished; refilling freed slots at once is continuous batching"] = other.stats
    else:
        slips["continuous batching fills a freed slot in the very next step; waiting for the whole "
              "batch to finish is static batching"] = other.stats
    return slips


@exercise("simulate_batching", points=8)
@pytest.mark.parametrize("policy, arrival", [("static", "all"), ("continuous", "all"),
                                             ("static", "poisson"), ("continuous", "poisson")])
def test_stats_match_the_reference_on_a_pareto_workload(learner, seed, policy, arrival):
    gen = generator(seed + (arrival == "poisson"))
    max_batch = randint(gen, 3, 8)
    for _ in range(20):   # a workload with a queue: TTFT counted from admission must show
        workload = sim.pareto_workload(randint(gen, 25, 50), randint(gen, 0, 2**31), min_output=2,
                                       max_output=64, arrival=arrival, rate=randint(gen, 5, 20) / 10)
        static = sim.simulate_static(workload, max_batch)
        continuous = sim.simulate_continuous(workload, max_batch)
        run, other = (static, continuous) if policy == "static" else (continuous, static)
        if any(r["admitted"] > r["arrival"] for r in run.requests):
            break
    call = f"simulate_batching(workload of {len(workload)} requests arriving {arrival!r}, " \
           f"max_batch={max_batch}, policy={policy!r})"
    got = learner.call("simulate_batching", workload, max_batch, policy)
    if not isinstance(got, dict) or any(k not in got for k in STAT_KEYS):
        missing = f" without {[k for k in STAT_KEYS if k not in got]}" if isinstance(got, dict) else ""
        raise AssertionError(f"{call} returned {type(got).__name__}{missing}; "
                             f"expected a dict with the keys {list(STAT_KEYS)}")
    got = {k: v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v for k, v in got.items()}

    def same(a, b):
        return isinstance(a, (int, float)) and not isinstance(a, bool) and \
            math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)

    wrong = [k for k in STAT_KEYS if not same(got[k], run.stats[k])]
    if wrong:
        hint = next((advice for advice, stats in _stat_slips(run, other, policy, max_batch).items()
                     if all(same(got[k], stats[k]) for k in wrong)), None)
        if hint is None and all(k.endswith(("_p50", "_p99")) for k in wrong):
            hint = PERCENTILES
        raise AssertionError(f"{call}: " + "; ".join(f"{k} expected {run.stats[k]:.6g}, got {got[k]!r}"
                                                       for k in wrong) + (f"\nHint: {hint}" if hint else ""))


# ----------------------------------------------------------------------- schedule_chunked
def _chunk_state(gen):
    def request(rid, prompt, prefilled):
        return {"id": rid, "prompt_len": prompt, "prefilled": prefilled, "output_len": 8, "generated": 0}
    running = [request(f"d{i}", randint(gen, 1, 40), None) for i in range(randint(gen, 1, 5))]
    for r in running:
        r["prefilled"] = r["prompt_len"]
    running.insert(randint(gen, 0, len(running)), request("p0", randint(gen, 60, 200), randint(gen, 1, 50)))
    waiting = [request(f"w{i}", randint(gen, 5, 120), 0) for i in range(randint(gen, 2, 4))]
    return running, waiting, randint(gen, 8, 220), len(running) + randint(gen, 1, 2)


def _chunk_slips(running, waiting, budget, max_num_seqs):
    decoding = [r for r in running if r["prefilled"] == r["prompt_len"]]
    prefilling = [r for r in running if r["prefilled"] < r["prompt_len"]]

    def fill(order, left, whole=False, decode_first=True):
        counts = {r["id"]: 1 for r in decoding} if decode_first else {}
        left -= len(counts)
        for r in order:
            need = r["prompt_len"] - r["prefilled"]
            if left <= 0 and not whole:
                break
            counts[r["id"]] = need if whole else min(need, left)
            left -= counts[r["id"]]
        if not decode_first:
            counts |= {r["id"]: 1 for r in decoding[:max(0, left)]}
        return counts

    admissible = waiting[:max(0, max_num_seqs - len(running))]
    return {DECODES_FIRST: fill(prefilling + admissible, budget, decode_first=False),
            WITHIN_BUDGET: fill(prefilling + admissible, budget, whole=True),
            MAX_SEQS_PLUS_ONE: fill(prefilling + waiting[:max(0, max_num_seqs - len(running) + 1)],
                                    budget),
            MAX_SEQS_MINUS_ONE: fill(prefilling + waiting[:max(0, max_num_seqs - len(running) - 1)],
                                     budget),
            MAX_SEQS: fill(prefilling + waiting, budget),
            "first come, first served: the running request part-way through its prompt continues "
            "before any waiting request is admitted": fill(admissible + prefilling, budget),
            "a running request with prompt tokens left is still prefilling: it gets a chunk, not "
            "1 decode token": sim.schedule_chunked([dict(r, prefilled=r["prompt_len"]) for r in running],
                                                   waiting, budget, max_num_seqs),
            "decode tokens count against the budget too": fill(prefilling + admissible, budget + len(decoding))}


def _check_counts(got, expected, slips, budget, call):
    if not isinstance(got, dict):
        raise AssertionError(f"{call} returned {type(got).__name__}; expected a dict {{id: tokens}}")
    got = {k: v for k, v in got.items() if v}           # a 0 entry is the same as no entry
    if got != expected:
        hint = next((advice for advice, slip in slips.items() if slip == got), None)
        if hint is None and sum(v for v in got.values() if isinstance(v, int)) > budget:
            hint = WITHIN_BUDGET
        raise AssertionError(f"{call}: expected {expected}, got {got}" + (f"\nHint: {hint}" if hint else ""))


@exercise("schedule_chunked", points=6)
def test_decodes_first_then_chunks_within_the_budget(learner, seed):
    gen = generator(seed)
    for case in range(6):
        running, waiting, budget, max_num_seqs = _chunk_state(gen)
        if case == 0:                                   # a budget that covers every prompt
            budget = sum(r["prompt_len"] - r["prefilled"] for r in running + waiting) + len(running)
        got = learner.call("schedule_chunked", running, waiting, budget, max_num_seqs)
        _check_counts(got, sim.schedule_chunked(running, waiting, budget, max_num_seqs),
                      _chunk_slips(running, waiting, budget, max_num_seqs), budget,
                      f"schedule_chunked(running={running}, waiting={waiting}, token_budget={budget}, "
                      f"max_num_seqs={max_num_seqs})")


@exercise("schedule_chunked", points=6)
def test_a_long_prompt_never_starves_the_decodes(learner, seed):
    gen = generator(seed + 1)
    running = [{"id": i, "prompt_len": randint(gen, 10, 300), "output_len": 50, "generated": randint(gen, 1, 40)}
               for i in range(randint(gen, 4, 12))]
    for r in running:
        r["prefilled"] = r["prompt_len"]
    waiting = [{"id": 99, "prompt_len": randint(gen, 2000, 8000), "prefilled": 0, "output_len": 20, "generated": 0}]
    budget = 512
    got = learner.call("schedule_chunked", running, waiting, budget, 32)
    expected = sim.schedule_chunked(running, waiting, budget, 32)
    _check_counts(got, expected, _chunk_slips(running, waiting, budget, 32), budget,
                  f"schedule_chunked({len(running)} decoding requests, a waiting prompt of "
                  f"{waiting[0]['prompt_len']} tokens, token_budget={budget}, max_num_seqs=32)")


@exercise("schedule_chunked", points=6)
def test_a_whole_run_with_your_scheduler(learner, seed):
    gen = generator(seed + 2)
    max_batch, budget = randint(gen, 3, 6), 16 * randint(gen, 2, 8)
    workload = sim.pareto_workload(randint(gen, 12, 20), randint(gen, 0, 2**31), max_output=24,
                                   prompt_range=(8, 4 * budget), arrival="poisson", rate=0.5)
    expected = sim.simulate_continuous(workload, max_batch, budget)
    calls = []

    def learner_schedule(running, waiting):
        if len(calls) > 3 * expected.stats["steps"]:
            raise AssertionError(f"the run took more than {len(calls) - 1} steps where the reference takes "
                                 f"{expected.stats['steps']}: does every step schedule the budget's tokens?")
        calls.append(len(calls))
        counts = learner.call("schedule_chunked", running, waiting, budget, max_batch)
        if not isinstance(counts, dict) or sum(v for v in counts.values() if isinstance(v, int)) > budget:
            raise AssertionError(f"step {len(calls) - 1}: schedule_chunked returned {counts!r} "
                                 f"with token_budget={budget}. {WITHIN_BUDGET}")
        return {k: v for k, v in counts.items() if v}

    try:
        run = sim.run_schedule(workload, max_batch, learner_schedule)
    except ValueError as exc:
        hint = f"\nHint: {MAX_SEQS}" if "slots" in str(exc) else ""
        raise AssertionError(f"driving a run with your scheduler failed: {exc}{hint}") from None
    differ = [k for k in ("steps", "ttft_mean", "ttft_p99", "tpot_mean", "tpot_p99")
              if not math.isclose(run.stats[k], expected.stats[k], rel_tol=1e-9)]
    if differ:
        raise AssertionError(
            f"a run of {len(workload)} requests with max_batch={max_batch}, token_budget={budget} and "
            "your scheduler: " + "; ".join(f"{k} expected {expected.stats[k]:.6g}, got {run.stats[k]:.6g}"
                                           for k in differ)
            + (f"\nHint: {DECODES_FIRST}" if run.stats["tpot_mean"] > expected.stats["tpot_mean"] else ""))
