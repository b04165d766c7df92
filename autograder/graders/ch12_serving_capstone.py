"""Grader for exercises/ch12_serving_capstone.ipynb: the learner's `schedule` runs the real engine.

The engine (``reference.engine``: its block pool, prefix cache, the tiny model and the step
clock) lives here, in the grader's process. At every step ``reference.engine.replay`` sends the
learner's ``schedule`` a snapshot made of dicts, lists, strings and ints (``learner.call``) and
applies the returned decision (plain data too) only if it keeps every rule of
``reference.engine.scheduler.check_decision``; an illegal decision ends that trace, with the
rule and the step. The learner never holds an engine object.

Five traces (steady, bursty, long shared system prompt, a pool too small to avoid preemption,
long documents among short chats) are drawn fresh from ``seed``; each is replayed under the
learner's policy and under the course's own (``reference_policy``, the engine's FCFS,
decodes-first scheduler), on the step-cost clock of ``reference.engine.step_cost`` (a step lasts
what serving SmolLM2-135M on an A100 would take: a long prompt chunk costs more than a decode).
Per trace, three tests: legal decisions and token-identical replies (greedy, equal to serving
each request alone with ``reference.decoding.generate``); the invariants (no block leaked or
double-freed, every request finishes, no slot left free while requests wait much longer than the
course's scheduler leaves one, none waits past the starvation bound); the service level
against the course's scheduler on the same trace (the limits below), with both side by side in
every report. The service level is what the capstone is about: it weighs twice as much as
either of the others, so a legal policy that serves badly (static batching) stays below half.
"""
from __future__ import annotations

import sys

import pytest

from autograder.rules.feedback import assert_equal_tokens
from autograder.rules.plugin import exercise
from reference.decoding import generate
from reference.engine.replay import (TRACE_KINDS, idle_slot_time, make_trace, one_thread, replay,
                                     service_levels, timeline_figure)
from reference.engine.scheduler import reference_policy
from reference.engine.step_cost import StepClock
from reference.model import build_tiny

POINTS = 10
TIMEOUT = 10          # seconds per call of schedule (one step)
STALL_STEPS = 20      # this many steps without a token fed while requests wait: the trace stops
# Service level: yours against the course's scheduler on the same trace, in clock time counted
# in decode steps (reference.engine.step_cost).
MIN_THROUGHPUT = 0.9                     # tokens per decode step >= 0.9 x the course's
TTFT_FACTOR, TTFT_SLACK = 1.5, 2.0       # TTFT p50 and p99 <= 1.5 x the course's + 2 decode steps
TPOT_FACTOR, TPOT_SLACK = 1.5, 0.5       # TPOT p50 and p99 <= 1.5 x the course's + 0.5 decode steps
# Starvation: every request's first token within 3 x the course's worst TTFT + 10 decode steps.
STARVE_FACTOR, STARVE_SLACK = 3, 10
# Continuous batching: the time a slot stood free while a request waited (idle_slot_time) at
# most 2 x the course's + 10 decode steps (the course's is what the budget and the pool force).
IDLE_FACTOR, IDLE_SLACK = 2, 10

RULE_HINTS = {
    "format": "return {'batch': {id: n_tokens}, 'preempt': [ids]} with the snapshot's string ids "
              "and int token counts",
    "unknown id": "use the ids of this step's snapshot; a finished sequence is gone from it",
    "preempt": "preempt only running sequences, and do not feed a sequence you preempt",
    "tokens": "a running sequence has prompt_len + generated - computed tokens left (1 once it "
              "decodes); a waiting one prompt_len + generated - cached_prefix_tokens",
    "max_num_seqs": "admit only while (running - preempted + admitted) < max_num_seqs",
    "max_num_batched_tokens": "count every token fed (1 per decode, n per prompt chunk) and give "
                              "the last prompt only what the budget leaves: chunked prefill",
    "blocks": "before feeding n tokens count the new blocks, ceil((c + n) / block_size) minus "
              "the blocks held, and stop when free_blocks runs out; a decode that finds no free "
              "block must preempt (the most recently admitted sequence) to make room",
}

_MODEL = None
_RUNS: dict = {"key": None}   # the last learner's replays: one replay per trace serves 3 tests


def _model():
    global _MODEL
    if _MODEL is None:
        _MODEL = build_tiny(0)
    return _MODEL


class ScheduleFailed(Exception):
    """The learner's schedule raised, timed out or crashed."""


def _runs(learner, seed: int, kind: str) -> dict:
    """{"trace", "mine", "course", "expected"} for this learner, seed and trace kind (cached:
    the three tests of a trace share one replay of each policy)."""
    owner = getattr(learner, "namespace", learner)   # check() makes a learner per test
    if _RUNS["key"] is None or _RUNS["key"][0] is not owner or _RUNS["key"][1] != seed:
        _RUNS.clear()
        _RUNS["key"] = (owner, seed)
    if kind not in _RUNS:
        trace = make_trace(kind, seed)
        model = _model()
        course = replay(trace, reference_policy, _model())
        assert course.error is None and not course.unfinished, f"grader error: {course.error}"
        worst = max(course.ttft().values())

        def ask(snapshot):
            try:
                return learner.call("schedule", snapshot)
            except AssertionError as exc:     # LearnerError: the cause in one line
                raise ScheduleFailed(str(exc)) from None

        mine = replay(trace, ask, model, max_steps=3 * len(course.timeline) + 60 + int(trace.requests[-1]["arrival"]),
                      stall_steps=STALL_STEPS)
        with one_thread():
            expected = {r["id"]: generate(model, r["prompt_ids"], r["max_tokens"]) for r in trace.requests}
        _RUNS[kind] = {"trace": trace, "mine": mine, "course": course, "expected": expected,
                       "starve": STARVE_FACTOR * worst + STARVE_SLACK}
    return _RUNS[kind]


def _stopped(run: dict) -> str | None:
    """Why the learner's replay of this trace stopped early, as a teaching message (None: it ran)."""
    mine = run["mine"]
    if mine.error is None:
        return None
    head = f"trace {run['trace'].describe()}\n"
    if mine.rule is not None:
        return head + f"illegal decision at {mine.error}\nHint: {RULE_HINTS[mine.rule]}"
    if "stalled" in mine.error:
        return head + f"{mine.error}\nHint: {mine.stall_cause}"
    return head + mine.error.replace("the policy failed: ScheduleFailed: ", "")


# ------------------------------------------------------------------------------------ tests

@exercise("schedule", points=POINTS, timeout=TIMEOUT)
@pytest.mark.parametrize("trace", TRACE_KINDS)
def test_decisions_are_legal_and_replies_exact(learner, seed, trace):
    run = _runs(learner, seed, trace)
    problem = _stopped(run)
    if problem:
        raise AssertionError(problem)
    for rid, want in run["expected"].items():
        assert_equal_tokens(run["mine"].replies.get(rid), want, name=f"reply to request {rid}",
                            hint="a reply must equal serving the request alone")


@exercise("schedule", points=POINTS, timeout=TIMEOUT)
@pytest.mark.parametrize("trace", TRACE_KINDS)
def test_pool_invariants_hold_and_no_request_starves(learner, seed, trace):
    run = _runs(learner, seed, trace)
    mine, trace_info = run["mine"], run["trace"]
    if mine.pool_problems:
        raise AssertionError(f"trace {trace_info.describe()}\nthe block pool broke: {mine.pool_problems[0]}")
    problem = _stopped(run)
    if problem:
        stopped = mine.timeline[-1]["time"] if mine.timeline else 0.0
        waiting = [r for r in trace_info.requests if r["id"] not in mine.first_token_step
                   and r["arrival"] <= stopped]
        if waiting:
            problem += ("\nrequests without a first token when it stopped: " + ", ".join(
                f"{r['id']} (prompt {len(r['prompt_ids'])} tokens, waiting since time {r['arrival']})"
                for r in waiting[:6]))
        raise AssertionError(problem)
    idle, course_idle = idle_slot_time(mine), idle_slot_time(run["course"])
    if idle > IDLE_FACTOR * course_idle + IDLE_SLACK:
        raise AssertionError(
            f"trace {trace_info.describe()}\na slot stood free while requests waited for "
            f"{idle:.1f} decode steps of the replay (the course's scheduler: {course_idle:.1f}; "
            f"allowed: {IDLE_FACTOR} x that + {IDLE_SLACK}).\nHint: admit into a slot as soon as "
            "it frees (continuous batching), as far as the token budget and the free blocks allow")
    ttft = mine.ttft()
    bound = run["starve"]
    starved = sorted((t, rid) for rid, t in ttft.items() if t > bound)
    if starved:
        t, rid = starved[-1]
        prompt = len(next(r for r in trace_info.requests if r["id"] == rid)["prompt_ids"])
        raise AssertionError(
            f"trace {trace_info.describe()}\nrequest {rid} (prompt {prompt} tokens) waited {t:.1f} decode steps for its first "
            f"token; the bound is {bound:.1f} ({STARVE_FACTOR} x the course scheduler's worst TTFT + "
            f"{STARVE_SLACK}). {len(starved)} request(s) starved.\nHint: admit into a slot as soon as it "
            "frees (continuous batching), serve the queue in arrival order (FCFS), and feed long "
            "prompts in chunks rather than skipping them for shorter ones")


def _table(run: dict) -> tuple[str, list[str]]:
    """The side-by-side table for one trace and the service levels it misses."""
    mine, course = service_levels(run["mine"]), service_levels(run["course"])
    rows, missed = [], []
    for key, label, factor, slack, higher in (
            ("throughput", "throughput (tokens/d.s.)", MIN_THROUGHPUT, 0.0, True),
            ("ttft_p50", "TTFT p50 (d.s.)", TTFT_FACTOR, TTFT_SLACK, False),
            ("ttft_p99", "TTFT p99 (d.s.)", TTFT_FACTOR, TTFT_SLACK, False),
            ("tpot_p50", "TPOT p50 (d.s.)", TPOT_FACTOR, TPOT_SLACK, False),
            ("tpot_p99", "TPOT p99 (d.s.)", TPOT_FACTOR, TPOT_SLACK, False)):
        limit = factor * course[key] + slack
        ok = mine[key] >= limit if higher else mine[key] <= limit
        need = f"{'>=' if higher else '<='} {limit:.2f}"
        rows.append(f"  {label:<26}{mine[key]:>8.2f}{course[key]:>9.2f}   {need:<10}{'' if ok else '  ✗'}")
        if not ok:
            missed.append(f"{label} {mine[key]:.2f} (needed {need})")
    for key, label in (("steps", "steps"), ("preemptions", "preemptions")):
        rows.append(f"  {label:<26}{mine[key]:>8}{course[key]:>9}")
    head = f"  {'':<26}{'yours':>8}{'course':>9}   needed"
    unit = ("  d.s. = decode steps of clock time: one read of SmolLM2-135M's weights on an A100 "
            f"({1e3 * StepClock().decode_step_seconds:.3f} ms); a step with a long prompt chunk "
            "lasts longer")
    return "\n".join([f"trace {run['trace'].describe()}", head, *rows, unit]), missed


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _show_timelines() -> None:
    """In a notebook's check cell: sequences in each step's batch and blocks in use, yours and
    the course's, for every trace replayed."""
    runs = {kind: {"yours": _RUNS[kind]["mine"], "course": _RUNS[kind]["course"]}
            for kind in TRACE_KINDS if kind in _RUNS}
    if not runs:
        return
    import matplotlib.pyplot as plt
    from IPython.display import display
    figure = timeline_figure(runs)
    display(figure)
    plt.close(figure)


@exercise("schedule", points=POINTS, timeout=TIMEOUT, weight=2)
@pytest.mark.parametrize("trace", TRACE_KINDS)
def test_service_level_against_the_course_scheduler(learner, seed, trace):
    run = _runs(learner, seed, trace)
    problem = _stopped(run)
    table, missed = _table(run) if problem is None else ("", [])
    print(table or problem)
    if _in_notebook() and trace == TRACE_KINDS[-1]:
        _show_timelines()
    if problem:
        raise AssertionError(problem + "\n(no service level without a full replay)")
    if missed:
        raise AssertionError(f"{table}\nbelow the service level: {'; '.join(missed)}.\nHint: keep "
                             "every slot busy (admit as soon as a sequence finishes: continuous "
                             "batching), decodes first so a long prompt never stalls them, and "
                             "chunk prompts so the budget is used every step")
    learner.note(table)   # the side-by-side table in every report, a passing one too
