"""The step simulator predicts the real engine's schedule.

On the tiny model, with a pool large enough that nothing is preempted and no prefix cache, the
engine (`reference.engine`) must sample each request's first and last token in the same step
as `reference.calculators.batching_sim` says, for continuous batching with chunked prefill under a token
budget and for static batching: the two implement one policy, written twice.
"""
import pytest

from reference.calculators.batching_sim import pareto_workload, simulate_continuous, simulate_static
from reference.engine import LLM, SamplingParams


def engine_token_steps(llm: LLM, workload: list[dict]) -> dict:
    """Drive the engine one step at a time, adding each request at its arrival step.
    Returns id -> (step of the first token, step of the last token)."""
    engine, pending, first, last, step = llm.engine, list(workload), {}, {}, 0
    while pending or engine.has_unfinished():
        while pending and pending[0]["arrival"] <= step:
            r = pending.pop(0)
            prompt = [(7 * r["id"] + i) % 250 + 1 for i in range(r["prompt_len"])]
            engine.add_request(prompt, SamplingParams(max_tokens=r["output_len"], ignore_eos=True),
                               request_id=str(r["id"]))
        for out in engine.step():
            first.setdefault(int(out.request_id), step)
            if out.finished:
                last[int(out.request_id)] = step
        step += 1
    return {rid: (first[rid], last[rid]) for rid in first}


@pytest.mark.parametrize("scheduling, budget", [("continuous", 24), ("continuous", 64), ("static", 256)])
def test_engine_steps_equal_the_simulator(scheduling, budget):
    max_num_seqs = 4
    workload = pareto_workload(14, seed=3, min_output=2, max_output=12, prompt_range=(4, 60),
                               arrival="poisson", rate=0.6)
    llm = LLM("tiny", max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
              enable_prefix_caching=False, scheduling=scheduling)
    simulated = (simulate_static(workload, max_num_seqs) if scheduling == "static"
                 else simulate_continuous(workload, max_num_seqs, budget))
    if scheduling == "static":   # the engine's static batches chunk too: make the budget moot
        assert budget >= max_num_seqs * max(r["prompt_len"] for r in workload)
    expected = {r["id"]: (r["first_token_step"], r["last_token_step"]) for r in simulated.requests}
    assert engine_token_steps(llm, workload) == expected
    assert llm.engine.stats["preemptions"] == 0
