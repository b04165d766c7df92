"""Grader for exercises/ch12_serving_capstone.ipynb: the learner's `schedule` runs the real engine.

The engine (``reference.engine``: its block pool, prefix cache, the tiny model and the step
clock) lives here, in the grader's process. At every step ``reference.engine.replay`` sends the
learner's ``schedule`` a snapshot made of dicts, lists, strings and ints (``learner.call``, on a
copy: the grader keeps its own) and applies the returned decision (plain data too) only if it
keeps every rule of ``reference.engine.scheduler.check_decision``; an illegal decision ends that
trace, with the rule and the step. The learner never holds an engine object.

Five traces (steady, bursty, long shared system prompt, a pool too small to avoid preemption,
long documents among short chats) are drawn fresh from ``seed``; each is replayed under the
learner's policy and under the course's own (``reference_policy``), on the step-cost clock of
``reference.engine.step_cost`` (a step lasts what serving SmolLM2-135M on an A100 would take: a
long prompt chunk costs more than a decode). Per trace, three tests: legal decisions and
token-identical replies (greedy, equal to serving each request alone with
``reference.decoding.generate``); the invariants (no block leaked or double-freed, every request
finishes, no slot left free while requests wait much longer than the course's scheduler leaves
one, none waits past the starvation bound); and the service, weighed against the course's
scheduler on the same trace: six measures (``reference.engine.replay.SERVICE_MEASURES``), each
as a cost relative to the course's, and their geometric mean, the balance, which must be at most
``AS_GOOD_AS_THE_COURSE``. The service counts twice as much as either of the others, so a legal
policy that serves badly (static batching) stays below half. Nothing in the messages says which
policy to write: a failing test names what the grader measured on that trace, yours against the
course's (``_symptoms``), from the snapshots and decisions it recorded on its own side.
"""
from __future__ import annotations

import copy
import math
import sys

import pytest

from autograder.rules.feedback import assert_equal_tokens
from autograder.rules.plugin import exercise
from reference.decoding import generate
from reference.engine.replay import (AS_GOOD_AS_THE_COURSE, SERVICE_MEASURES, TRACE_KINDS, balance,
                                     idle_slot_time, make_trace, one_thread, replay, service_costs,
                                     service_levels, timeline_figure)
from reference.engine.scheduler import reference_policy, tokens_left
from reference.engine.step_cost import StepClock
from reference.model import build_tiny

POINTS = 10
TIMEOUT = 10          # seconds per call of schedule (one step)
STALL_STEPS = 20      # this many steps without a token fed while requests wait: the trace stops
# Starvation: every request's first token within 3 x the course's worst TTFT + 10 decode steps.
STARVE_FACTOR, STARVE_SLACK = 3, 10
# Continuous batching: the time a slot stood free while a request waited (idle_slot_time) at
# most 2 x the course's + 10 decode steps (the course's is what the budget and the pool force).
IDLE_FACTOR, IDLE_SLACK = 2, 10
LONG_STEP = 1.25      # a step longer than this (decode steps) makes the decodes in it wait

RULE_HINTS = {
    "format": "return {'batch': {id: n_tokens}, 'preempt': [ids]} with the snapshot's string ids "
              "and int token counts",
    "unknown id": "use the ids of this step's snapshot; a finished sequence is gone from it",
    "preempt": "preempt only running sequences, and do not feed a sequence you preempt",
    "tokens": "a running sequence has prompt_len + generated - computed tokens left (1 once it "
              "decodes); a waiting one prompt_len + generated - cached_prefix_tokens",
    "max_num_seqs": "admit only while (running - preempted + admitted) < max_num_seqs",
    "max_num_batched_tokens": "count every token fed (1 per decode, n per prompt chunk); a prompt "
                              "may be fed part of what it has left (chunked prefill)",
    "blocks": "before feeding n tokens count the new blocks, ceil((c + n) / block_size) minus "
              "the blocks held, and stop when free_blocks runs out; when a decode finds no free "
              "block, only a preempted sequence gives blocks back",
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


def _recording(policy, seen: list):
    """`policy` asked with a copy of each snapshot; the grader's own snapshot and the decision
    are appended to `seen`, one pair per step (a replay's timeline[i] is the step of seen[i])."""
    def decide(snapshot):
        decision = policy(copy.deepcopy(snapshot))
        seen.append((snapshot, decision))
        return decision
    return decide


def _runs(learner, seed: int, kind: str) -> dict:
    """{"trace", "mine", "course", "expected", "starve", "mine_seen", "course_seen"} for this
    learner, seed and trace kind (cached: the three tests of a trace share one replay of each
    policy)."""
    owner = getattr(learner, "namespace", learner)   # check() makes a learner per test
    if _RUNS["key"] is None or _RUNS["key"][0] is not owner or _RUNS["key"][1] != seed:
        _RUNS.clear()
        _RUNS["key"] = (owner, seed)
    if kind not in _RUNS:
        trace = make_trace(kind, seed)
        model = _model()
        course_seen, mine_seen = [], []
        course = replay(trace, _recording(reference_policy, course_seen), model)
        assert course.error is None and not course.unfinished, f"grader error: {course.error}"
        worst = max(course.ttft().values())

        def ask(snapshot):
            try:
                return learner.call("schedule", snapshot)
            except AssertionError as exc:     # LearnerError: the cause in one line
                raise ScheduleFailed(str(exc)) from None

        mine = replay(trace, _recording(ask, mine_seen), model,
                      max_steps=3 * len(course.timeline) + 60 + int(trace.requests[-1]["arrival"]),
                      stall_steps=STALL_STEPS)
        with one_thread():
            expected = {r["id"]: generate(model, r["prompt_ids"], r["max_tokens"]) for r in trace.requests}
        _RUNS[kind] = {"trace": trace, "mine": mine, "course": course, "expected": expected,
                       "starve": STARVE_FACTOR * worst + STARVE_SLACK,
                       "mine_seen": mine_seen, "course_seen": course_seen}
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


# ------------------------------------------------------------------- what a replay shows

def _steps(result, seen: list) -> list[dict]:
    """What each applied step did, from the grader's snapshot, the decision the engine applied
    (legal: check_decision passed it) and the step's entry in the timeline."""
    facts = []
    for (snapshot, decision), entry in zip(seen, result.timeline):
        fed, preempted = decision.get("batch", {}), set(decision.get("preempt", []))
        decoding = {e["id"] for e in snapshot["running"] if tokens_left(e) == 1}
        prompt_fed = sum(n for sid, n in fed.items() if sid not in decoding)
        # prompt tokens a step could still have fed: the rest of the running prompts', and the
        # waiting ones' while a slot stood free after the step
        prompt_left = sum(tokens_left(e) - fed.get(e["id"], 0) for e in snapshot["running"]
                          if e["id"] not in decoding and e["id"] not in preempted)
        if entry["running"] < snapshot["max_num_seqs"]:
            prompt_left += sum(tokens_left(e) for e in snapshot["waiting"] if e["id"] not in fed)
        facts.append({
            "step": entry["step"], "cost": entry["cost"],
            "decodes_fed": len(decoding & set(fed)),
            "decodes_left_out": len(decoding - set(fed) - preempted),
            "prompt_fed": prompt_fed,
            "prompt_left": prompt_left,
            "unused": snapshot["max_num_batched_tokens"] - sum(fed.values()),
            "recomputed": sum(e["computed"] for e in snapshot["running"] if e["id"] in preempted),
            "slots_free": snapshot["max_num_seqs"] - entry["running"], "waiting": entry["waiting"],
            "free_blocks": snapshot["free_blocks"]})
    return facts


def _longest_pause(result) -> tuple[float, str, float]:
    """(the longest gap between two tokens of one reply, its request, the time it ended)."""
    return max(((later - earlier, rid, later) for rid, times in result.token_times.items()
                for earlier, later in zip(times, times[1:])), default=(0.0, "-", 0.0))


def _symptoms(run: dict) -> list[str]:
    """What the grader measured where the learner's replay did worse than the course's on this
    trace, one line each, yours against the course's: facts about the replay, not a policy."""
    mine, course = _steps(run["mine"], run["mine_seen"]), _steps(run["course"], run["course_seen"])
    lines = []

    def total(facts, key):
        return sum(f[key] for f in facts)

    left_out = [total(f, "decodes_left_out") for f in (mine, course)]
    if left_out[0] > left_out[1]:
        steps = [f for f in mine if f["decodes_left_out"]]
        lines.append(f"running sequences with a token to decode were left out of the batch "
                     f"{left_out[0]} times, in {len(steps)} steps that fed "
                     f"{total(steps, 'prompt_fed')} prompt tokens (the course's scheduler: "
                     f"{left_out[1]} times)")
    long = [[f for f in facts if f["decodes_fed"] and f["cost"] > LONG_STEP] for facts in (mine, course)]
    if len(long[0]) > len(long[1]):
        worst = max(long[0], key=lambda f: f["cost"])
        lines.append(f"{len(long[0])} steps that carried decodes lasted more than {LONG_STEP} decode "
                     f"steps, the longest {worst['cost']:.2f} (step {worst['step']}, "
                     f"{worst['prompt_fed']} prompt tokens) (the course's: {len(long[1])})")
    idle = [idle_slot_time(run["mine"]), idle_slot_time(run["course"])]
    if idle[0] > idle[1] + 0.5:
        lines.append(f"a slot stood free while requests waited for {idle[0]:.1f} decode steps of "
                     f"clock time (the course's: {idle[1]:.1f})")

    unused = [[f for f in facts if f["unused"] > 0 and f["prompt_left"] > 0] for facts in (mine, course)]
    if total(unused[0], "unused") > 1.1 * total(unused[1], "unused"):
        lines.append(f"{total(unused[0], 'unused')} tokens of the budget went unused, in "
                     f"{len(unused[0])} steps, while prompt tokens waited to be fed (the course's: "
                     f"{total(unused[1], 'unused')} in {len(unused[1])} steps)")
    recomputed = [total(f, "recomputed") for f in (mine, course)]
    if recomputed[0] > recomputed[1]:
        lines.append(f"{run['mine'].preemptions} preemptions threw away {recomputed[0]} computed "
                     f"tokens to recompute (the course's: {run['course'].preemptions} and "
                     f"{recomputed[1]})")
    ttft, course_ttft = run["mine"].ttft(), run["course"].ttft()
    rid = max(ttft, key=ttft.get)
    if ttft[rid] > 1.05 * max(course_ttft.values()):
        prompt = len(next(r for r in run["trace"].requests if r["id"] == rid)["prompt_ids"])
        lines.append(f"the longest wait for a first token: request {rid} (prompt {prompt} tokens), "
                     f"{ttft[rid]:.1f} decode steps; under the course's scheduler it waited "
                     f"{course_ttft[rid]:.1f} (the course's longest: {max(course_ttft.values()):.1f})")
    pause, course_pause = _longest_pause(run["mine"]), _longest_pause(run["course"])
    if pause[0] > 1.05 * course_pause[0]:
        lines.append(f"the longest pause between two tokens of a reply: {pause[0]:.2f} decode steps "
                     f"(request {pause[1]}, ending at time {pause[2]:.1f}) (the course's: "
                     f"{course_pause[0]:.2f})")
    return lines


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
        steps = [f for f in _steps(mine, run["mine_seen"]) if f["waiting"] and f["slots_free"]]
        spare = [f for f in steps if f["unused"] and f["free_blocks"]]
        detail = "" if not spare else (
            f"; in {len(spare)} of them tokens of the budget and free blocks were left too (the "
            f"first: step {spare[0]['step']}, {spare[0]['slots_free']} of {trace_info.max_num_seqs} "
            f"slots free after it, {spare[0]['waiting']} request(s) waiting, {spare[0]['unused']} "
            f"tokens and {spare[0]['free_blocks']} blocks unused)")
        raise AssertionError(
            f"trace {trace_info.describe()}\na slot stood free while requests waited for "
            f"{idle:.1f} decode steps of the replay (the course's scheduler: {course_idle:.1f}; "
            f"allowed: {IDLE_FACTOR} x that + {IDLE_SLACK}), in {len(steps)} steps{detail}")
    ttft = mine.ttft()
    bound = run["starve"]
    starved = sorted((t, rid) for rid, t in ttft.items() if t > bound)
    if starved:
        t, rid = starved[-1]
        request = next(r for r in trace_info.requests if r["id"] == rid)
        overtook = [other for other, first in mine.first_token_time.items()
                    if mine.arrival[other] > request["arrival"] and first < mine.first_token_time[rid]]
        raise AssertionError(
            f"trace {trace_info.describe()}\nrequest {rid} (prompt {len(request['prompt_ids'])} "
            f"tokens) waited {t:.1f} decode steps for its first token; the bound is {bound:.1f} "
            f"({STARVE_FACTOR} x the course scheduler's worst TTFT + {STARVE_SLACK}). "
            f"{len(starved)} request(s) starved. While it waited, {len(overtook)} request(s) that "
            f"arrived after it got their first token (under the course's scheduler it waited "
            f"{run['course'].ttft()[rid]:.1f})")


def _table(run: dict) -> tuple[str, float]:
    """The side-by-side table for one trace, and the balance of the learner's costs."""
    mine, course = service_levels(run["mine"]), service_levels(run["course"])
    costs = service_costs(mine, course)
    score = balance(costs)
    rows = [f"trace {run['trace'].describe()}", f"  {'':<26}{'yours':>8}{'course':>9}{'cost':>8}"]
    for key, (label, _) in SERVICE_MEASURES.items():
        mark = "  ✗" if costs[key] > AS_GOOD_AS_THE_COURSE else ""
        rows.append(f"  {label:<26}{mine[key]:>8.2f}{course[key]:>9.2f}{costs[key]:>8.2f}{mark}")
    verdict = "as good as the course's" if score <= AS_GOOD_AS_THE_COURSE else "✗ below the course's"
    rows += [f"  {'balance (geometric mean)':<43}{score:>8.2f}  needs <= {AS_GOOD_AS_THE_COURSE:.2f}: "
             f"{verdict}",
             *(f"  {label:<26}{mine[key]:>8}{course[key]:>9}"
               for key, label in (("steps", "steps"), ("preemptions", "preemptions"))),
             "  cost: yours / the course's (throughput: the course's / yours); 1.10 is 10% worse,",
             "  0.90 10% better. d.s. = decode steps of clock time: one read of SmolLM2-135M's",
             f"  weights on an A100 ({1e3 * StepClock().decode_step_seconds:.3f} ms); a step with a "
             "long prompt chunk lasts longer"]
    return "\n".join(rows), score


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
    table, score = _table(run) if problem is None else ("", math.inf)
    print(table or problem)
    if _in_notebook() and trace == TRACE_KINDS[-1]:
        _show_timelines()
    if problem:
        raise AssertionError(problem + "\n(no service level without a full replay)")
    if score > AS_GOOD_AS_THE_COURSE:
        mine, course = service_levels(run["mine"]), service_levels(run["course"])
        costs = service_costs(mine, course)
        worse = [f"- {label.split(' (')[0]} was {mine[key]:.2f} against the course's {course[key]:.2f}"
                 for key, (label, _) in SERVICE_MEASURES.items() if costs[key] > AS_GOOD_AS_THE_COURSE]
        found = _symptoms(run)
        raise AssertionError("\n".join([
            table, f"below the course's scheduler on the {trace} trace (balance {score:.2f}):", *worse,
            *(["what the replay shows, yours against the course's:"] + [f"- {line}" for line in found]
              if found else [])]))
    learner.note(table)   # the side-by-side table in every report, a passing one too
