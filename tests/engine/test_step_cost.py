"""The capstone's clock (reference/engine/step_cost.py): a step lasts what chapter 04's roofline
says, in decode steps; replays advance by it, a slot left free while requests wait is timed, and
a policy's service on that clock is weighed against the course's scheduler's."""
import math

import pytest

from reference.engine.replay import (AS_GOOD_AS_THE_COURSE, balance, idle_slot_time, make_trace, replay,
                                     service_costs, service_levels)
from reference.engine.scheduler import reference_policy
from reference.engine.step_cost import StepClock
from reference.model import ModelConfig, build_tiny

A100_BANDWIDTH, A100_FLOPS = 2.039e12, 312e12   # bytes/s and dense fp16 FLOP/s (data sheet)


def smollm2_counts():
    """(parameters, parameters that multiply a token) of SmolLM2-135M, from its shape."""
    c = ModelConfig()
    layer = c.d_model * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim + c.n_heads * c.head_dim * c.d_model \
        + 3 * c.d_model * c.d_ff
    matmul = c.n_layers * layer + c.vocab_size * c.d_model
    return matmul + (2 * c.n_layers + 1) * c.d_model, matmul


def test_a_decode_step_is_one_read_of_the_weights_and_the_unit():
    params, _ = smollm2_counts()
    clock = StepClock()
    assert clock.decode_step_seconds == pytest.approx(params * 2 / A100_BANDWIDTH, rel=1e-3)
    assert clock.cost([(1, 0)]) == pytest.approx(1.0)
    assert clock.cost([]) == 1.0          # an empty step: the engine's polling period
    # four decodes over short contexts: still one weight read, plus their K/V
    assert 1.0 < clock.cost([(1, 50)] * 4) < 1.05


def test_a_long_prompt_chunk_costs_its_arithmetic():
    params, matmul = smollm2_counts()
    c, clock = ModelConfig(), StepClock()
    n = 512
    attention = 4 * c.n_layers * c.n_heads * c.head_dim * n * (n + 1) // 2
    seconds = (2 * matmul * n + attention) / A100_FLOPS
    assert seconds > params * 2 / A100_BANDWIDTH          # past the ridge: compute-bound
    assert clock.cost([(n, 0)]) == pytest.approx(seconds / clock.decode_step_seconds, rel=1e-3)
    assert clock.cost([(n, 0)]) > 3
    assert clock.cost([(64, 0)]) == pytest.approx(clock.cost([(1, 0)]), rel=0.02)   # below it
    ridge = clock.ridge_tokens     # where arithmetic takes over: ~ peak / bandwidth FLOPs per byte
    assert 0.8 < ridge / (A100_FLOPS / A100_BANDWIDTH) < 1.2
    assert clock.cost([(ridge - 1, 0)]) < 1.05 < 1.9 < clock.cost([(2 * ridge, 0)])


def test_a_replay_advances_by_each_steps_cost():
    model, trace = build_tiny(0), make_trace("long_prompt", 3)
    run = replay(trace, reference_policy, model)
    assert run.error is None and not run.unfinished
    times = [t["time"] for t in run.timeline]
    assert all(b > a for a, b in zip(times, times[1:]))
    for before, step in zip([0.0, *times], run.timeline):
        assert step["time"] - step["cost"] >= before - 1e-9   # idle gaps only move it forward
    chunks = [t["cost"] for t in run.timeline if t["tokens"] > 160]
    decodes = [t["cost"] for t in run.timeline if t["tokens"] <= t["batch"]]
    assert chunks and min(chunks) > 1.3 and max(decodes) < 1.1
    levels = service_levels(run)
    assert levels["itl_p99"] > 1.3    # some decodes shared a step with a long chunk


def static(snapshot):
    """Static batching as a policy: the course's, shown an empty queue while any request runs."""
    return reference_policy(dict(snapshot, waiting=[] if snapshot["running"] else snapshot["waiting"]))


def test_static_batching_leaves_slots_idle_where_continuous_batching_does_not():
    model, trace = build_tiny(0), make_trace("steady", 0)
    assert idle_slot_time(replay(trace, reference_policy, model)) == 0
    assert idle_slot_time(replay(trace, static, model)) > 20


def test_service_costs_weigh_a_policy_against_the_course_on_the_same_trace():
    """Each measure becomes a cost relative to the course's scheduler (throughput inverted, so
    that above 1 is worse for every measure), and the balance is their geometric mean: 1 for the
    course's own policy, far above AS_GOOD_AS_THE_COURSE for static batching."""
    model, trace = build_tiny(0), make_trace("steady", 0)
    course, slow = (service_levels(replay(trace, policy, model)) for policy in (reference_policy, static))
    assert set(service_costs(course, course).values()) == {1.0}
    costs = service_costs(slow, course)
    assert costs["throughput"] == pytest.approx(course["throughput"] / slow["throughput"])
    assert costs["ttft_p90"] == pytest.approx(slow["ttft_p90"] / course["ttft_p90"])
    assert costs["throughput"] > 1 and costs["ttft_p90"] > 1
    assert balance(costs) == pytest.approx(math.prod(costs.values()) ** (1 / len(costs)))
    assert balance(costs) > 1.5 * AS_GOOD_AS_THE_COURSE
    assert balance(dict(costs, throughput=math.inf)) == math.inf
