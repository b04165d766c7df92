"""The engine's scheduling policy as a pure function of plain data (chapter 12).

`PolicyScheduler` with `reference_policy` is the course's scheduler: on traces without prefix
sharing or pool pressure it feeds the same tokens in the same steps as the built-in `Scheduler`;
everywhere its replies equal serving each request alone, nothing leaks, and the small pool
preempts. `check_decision` names the rule each kind of illegal decision breaks.
"""
import pytest
import torch

from reference.decoding import generate
from reference.engine.llm import LLMEngine
from reference.engine.params import SamplingParams
from reference.engine.replay import TRACE_KINDS, make_trace, one_thread, replay, service_levels
from reference.engine.scheduler import IllegalDecision, check_decision, reference_policy
from reference.engine.step_cost import StepClock
from reference.model import build_tiny
from reference.tokenizer import ByteTokenizer


@pytest.fixture(scope="module")
def model():
    return build_tiny(0)


def legacy_token_steps(model, trace):
    """First and last token step of each request under the built-in Scheduler, requests
    arriving on the same step-cost clock as `replay`'s."""
    engine = LLMEngine(model, ByteTokenizer(), block_size=trace.block_size, num_blocks=trace.num_blocks,
                       max_num_seqs=trace.max_num_seqs, max_num_batched_tokens=trace.max_num_batched_tokens)
    schedule, fed = engine.scheduler.schedule, []

    def recording():   # (tokens fed, tokens already in the pool) of each fed sequence
        batch = schedule()
        fed[:] = [(n, seq.num_computed) for seq, n in batch]
        return batch

    engine.scheduler.schedule = recording
    clock, now = StepClock(), 0.0
    pending, first, last = list(trace.requests), {}, {}
    with one_thread():
        for step in range(1000):
            if pending and not engine.has_unfinished():
                now = max(now, pending[0]["arrival"])
            while pending and pending[0]["arrival"] <= now:
                r = pending.pop(0)
                engine.add_request(r["prompt_ids"], SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True),
                                   request_id=r["id"])
            if not pending and not engine.has_unfinished():
                break
            outputs = engine.step()
            now += clock.cost(fed)
            for out in outputs:
                first.setdefault(out.request_id, step)
                if out.finished:
                    last[out.request_id] = step
    return first, last


@pytest.mark.parametrize("kind", ["steady", "bursty"])
def test_reference_policy_schedules_as_the_engine_does(model, kind):
    trace = make_trace(kind, 0)
    run = replay(trace, reference_policy, model)
    assert (run.first_token_step, run.last_token_step) == legacy_token_steps(model, trace)


@pytest.mark.parametrize("kind", TRACE_KINDS)
def test_reference_policy_serves_every_trace_exactly(model, kind):
    trace = make_trace(kind, 1)
    run = replay(trace, reference_policy, model)
    assert run.error is None and not run.unfinished and not run.pool_problems
    with one_thread():
        for r in trace.requests:
            assert run.replies[r["id"]] == generate(model, r["prompt_ids"], r["max_tokens"])
    levels = service_levels(run)
    assert levels["throughput"] > 0 and levels["ttft_p50"] >= 1
    assert (levels["preemptions"] > 0) == (kind == "small_pool")


SNAPSHOT = {"step": 3, "block_size": 4, "free_blocks": 1, "max_num_seqs": 2, "max_num_batched_tokens": 8,
            "running": [{"id": "a", "prompt_len": 6, "generated": 2, "computed": 7, "blocks_held": 2,
                         "private_blocks": 2, "arrival_step": 0, "admitted_step": 0}],
            "waiting": [{"id": "b", "prompt_len": 12, "generated": 0, "cached_prefix_tokens": 4,
                         "cached_blocks_free": 0, "arrival_step": 1, "preemptions": 0}]}


@pytest.mark.parametrize("decision, rule", [
    ([("a", 1)], "format"),
    ({"batch": {"a": 1.0}}, "format"),
    ({"batch": {"zz": 1}}, "unknown id"),
    ({"batch": {"a": 1}, "preempt": ["a"]}, "preempt"),
    ({"batch": {"b": 1}, "preempt": ["b"]}, "preempt"),
    ({"batch": {"a": 2}}, "tokens"),
    ({"batch": {"b": 9}}, "tokens"),
    ({"batch": {"a": 1, "b": 8}}, "max_num_batched_tokens"),
    ({"batch": {"b": 8}}, "blocks"),
])
def test_each_illegal_decision_names_its_rule(decision, rule):
    with pytest.raises(IllegalDecision) as info:
        check_decision(SNAPSHOT, decision)
    assert info.value.rule == rule and "step 3" in str(info.value)


def test_max_num_seqs_and_a_legal_decision():
    tight = dict(SNAPSHOT, max_num_seqs=1)
    with pytest.raises(IllegalDecision, match="max_num_seqs"):
        check_decision(tight, {"batch": {"a": 1, "b": 1}})
    assert check_decision(SNAPSHOT, {"batch": {"a": 1, "b": 3}}) == ([("a", 1), ("b", 3)], [])
    # preempting a frees its 2 private blocks: b may then take 2 more
    assert check_decision(tight, {"batch": {"b": 8}, "preempt": ["a"]}) == ([("b", 8)], ["a"])


def test_reference_policy_on_a_snapshot():
    # b's 7 tokens (the budget left) would take 2 blocks, 1 is free: FCFS admits nothing
    assert reference_policy(SNAPSHOT) == {"batch": {"a": 1}, "preempt": []}
    torch.manual_seed(0)   # the policy is pure: same snapshot, same decision
    assert reference_policy(SNAPSHOT) == reference_policy(SNAPSHOT)
