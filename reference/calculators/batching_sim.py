"""Static and continuous batching, simulated one engine step at a time (no model, pure Python).

Units. Time is counted in **engine steps**, lengths in **tokens**. In one step the engine runs one
forward pass over every sequence it schedules: a decoding sequence contributes one token and
receives one new output token; a sequence being prefilled contributes the prompt tokens scheduled
for it (the whole prompt, or a chunk under a token budget), and the step that completes its prompt
also samples its first output token (the last prompt position's logits give it, as in vLLM).
A request arriving at step `a` may be admitted in step `a`; a token sampled in step `s` exists at
the end of that step, time `s + 1`. A request that samples its last token in step `s` gives its
slot back for step `s + 1`.

Per request (steps): TTFT = first_token_step + 1 - arrival (at least 1);
TPOT = (last_token_step - first_token_step) / (output_len - 1), for output_len >= 2 only (the first
token comes from the prefill, it is not a decode token).
Per run: `steps` until the last token (idle steps included); `slot_utilisation` = slot-steps held
by an unfinished request / (max_batch * steps); `throughput` = output tokens / steps; mean, p50
and p99 of TTFT and TPOT (percentiles interpolate linearly between ranks, as numpy's default).

Requests are plain dicts so that the exercise notebooks use the same data: a workload entry is
`{"id", "arrival", "prompt_len", "output_len"}`; the step functions add `generated` (output tokens
so far) and `prefilled` (prompt tokens processed so far).

`reference.engine` schedules by the same rules; without preemption or prefix-cache hits it
samples every token in the step this simulator predicts (tests/engine/test_batching_sim_engine.py).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

from reference.calculators.memory import whole_number

WORKLOAD_KEYS = ("id", "arrival", "prompt_len", "output_len")
Counts = dict   # request id -> tokens scheduled in one step


def pareto_workload(n: int, seed: int, *, min_output: int = 4, max_output: int = 256,
                    alpha: float = 1.5, prompt_range: tuple[int, int] = (16, 1024),
                    arrival: str = "all", rate: float = 0.5) -> list[dict]:
    """`n` requests drawn from `random.Random(seed)`, sorted by arrival (ids 0..n-1 in that order).

    output_len (tokens): min(max_output, floor(min_output * X)) with X Pareto(alpha) >= 1, so most
    answers are short and a few are very long; prompt_len (tokens): log-uniform in `prompt_range`.
    arrival "all": every request at step 0; "poisson": a Poisson stream of `rate` requests per
    step (exponential gaps, arrival = the whole step it falls in).
    """
    if n < 0 or min_output < 1 or max_output < min_output or alpha <= 0:
        raise ValueError("need n >= 0, 1 <= min_output <= max_output and alpha > 0")
    if not 1 <= prompt_range[0] <= prompt_range[1]:
        raise ValueError(f"prompt_range must be (low, high) with 1 <= low <= high, got {prompt_range}")
    if arrival not in ("all", "poisson") or rate <= 0:
        raise ValueError(f"arrival must be 'all' or 'poisson' and rate > 0, got {arrival!r}, {rate}")
    rng, clock, requests = random.Random(seed), 0.0, []
    low, high = math.log(prompt_range[0]), math.log(prompt_range[1])
    for i in range(n):
        if arrival == "poisson":
            clock += rng.expovariate(rate)
        requests.append({"id": i, "arrival": int(clock),
                         "prompt_len": round(math.exp(rng.uniform(low, high))),
                         "output_len": min(max_output, int(min_output * rng.paretovariate(alpha)))})
    return requests


def continuous_batch_step(running: list[dict], waiting: list[dict],
                          max_batch: int) -> tuple[list[dict], list[dict], list[dict]]:
    """One iteration of continuous (iteration-level) batching, without a token budget.

    running: requests holding a slot, dicts with "id", "output_len", "generated" (tokens so far);
    waiting: requests not admitted yet, first come first served, "generated" 0.
    1. retire: running requests with generated == output_len leave (their slots free up now);
    2. admit: waiting requests, from the front, take the free slots (at most max_batch running);
    3. advance: every running request gains one token, the admitted ones too (their prefill runs
       in this step and samples their first token).
    Returns new lists (running, waiting, finished); the dicts passed in are not changed.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    finished = [dict(r) for r in running if r["generated"] >= r["output_len"]]
    still = [dict(r) for r in running if r["generated"] < r["output_len"]]
    if len(still) > max_batch:
        raise ValueError(f"{len(still)} unfinished running requests do not fit max_batch={max_batch}")
    free = max_batch - len(still)
    still += [dict(r) for r in waiting[:free]]
    for request in still:
        request["generated"] += 1
    return still, [dict(r) for r in waiting[free:]], finished


def schedule_chunked(running: list[dict], waiting: list[dict], token_budget: int | None,
                     max_num_seqs: int) -> Counts:
    """Tokens each request gets in one step of chunked prefill under a token budget.

    running: admitted, unfinished requests in admission order; waiting: not admitted, first come
    first served. Each is a dict with "id", "prompt_len", "prefilled", "output_len", "generated".
    1. decodes first: every running request whose prompt is done (prefilled == prompt_len) gets
       1 token, in order, while the budget lasts;
    2. then prefill chunks, first come first served: running requests with prompt left, then
       waiting ones while fewer than max_num_seqs requests would run; each gets
       min(prompt tokens left, budget left).
    token_budget: tokens per step (vLLM's max_num_batched_tokens); None = unlimited.
    Returns {id: tokens} for the requests that get at least one token (the sum <= token_budget);
    a waiting request in it is admitted this step.
    """
    if max_num_seqs < 1 or (token_budget is not None and token_budget < 1):
        raise ValueError(f"need max_num_seqs >= 1 and token_budget >= 1 (or None), "
                         f"got {max_num_seqs}, {token_budget}")
    left = token_budget if token_budget is not None else \
        sum(r["prompt_len"] + 1 for r in (*running, *waiting))
    counts: Counts = {}
    decoding = [r for r in running if r["prefilled"] >= r["prompt_len"]]
    prefilling = [r for r in running if r["prefilled"] < r["prompt_len"]]
    admissible = waiting[:max(0, max_num_seqs - len(running))]
    for request in decoding:
        if left == 0:
            return counts
        counts[request["id"]], left = 1, left - 1
    for request in prefilling + admissible:
        if left == 0:
            break
        chunk = min(request["prompt_len"] - request["prefilled"], left)
        counts[request["id"]], left = chunk, left - chunk
    return counts


def schedule_separate_prefill(running: list[dict], waiting: list[dict], token_budget: int | None,
                              max_num_seqs: int) -> Counts:
    """A step without chunked prefill (vLLM's V0 default): prefill steps and decode steps alternate.

    If the front waiting requests fit (a free slot and the whole prompt within the budget left),
    this step prefills as many of them as fit, first come first served, and the running requests
    decode nothing (they stall); otherwise every running request decodes one token.
    """
    left = math.inf if token_budget is None else token_budget
    counts: Counts = {}
    for request in waiting[:max(0, max_num_seqs - len(running))]:
        if request["prompt_len"] > left:
            break
        counts[request["id"]], left = request["prompt_len"], left - request["prompt_len"]
    return counts or {r["id"]: 1 for r in running}


def schedule_static(running: list[dict], waiting: list[dict], max_batch: int) -> Counts:
    """A step of static batching: a new batch (up to max_batch waiting requests, whole prompts)
    only once every request of the previous batch has finished; otherwise the batch decodes."""
    if running:
        return {r["id"]: 1 for r in running}
    return {r["id"]: r["prompt_len"] for r in waiting[:max_batch]}


@dataclass
class SimResult:
    """What a simulation returns.

    stats: steps, slot_utilisation, throughput (output tokens per step), output_tokens, requests,
        ttft_mean/p50/p99 and tpot_mean/p50/p99 (steps);
    grid: one row per step, one entry per slot: the id of the request holding it, or None;
    requests: the workload entries with "admitted", "first_token_step", "last_token_step" (step
        indices), "generated", "ttft" and "tpot" (steps; tpot None when output_len == 1);
    tokens_per_step: tokens (prompt + decode) processed in each step.
    """
    stats: dict
    grid: list
    requests: list
    tokens_per_step: list


def simulate_static(workload: list[dict], max_batch: int) -> SimResult:
    """Static batching: admit up to `max_batch` arrived requests, run them until the LAST one
    finishes (finished slots stay idle), then admit the next batch. No token budget."""
    return run_schedule(workload, max_batch, lambda run, wait: schedule_static(run, wait, max_batch))


def simulate_continuous(workload: list[dict], max_batch: int, max_num_batched_tokens: int | None = None,
                        chunked_prefill: bool = True) -> SimResult:
    """Continuous batching: free slots are refilled every step.

    chunked_prefill=True: `schedule_chunked` (decodes first, prefill chunks from the budget left);
    False: `schedule_separate_prefill` (whole prompts in prefill-only steps that stall decodes).
    max_num_batched_tokens: tokens per step (None = unlimited; else >= max_batch, and without
    chunked prefill >= every prompt). With None and chunked prefill every step is exactly
    `continuous_batch_step`.
    """
    max_batch = _positive("max_batch", max_batch)
    requests, budget = _checked_workload(workload), max_num_batched_tokens
    if budget is not None:
        budget = _positive("max_num_batched_tokens", budget)
    if budget is not None and budget < max_batch:
        raise ValueError(f"max_num_batched_tokens={budget} must be >= max_batch={max_batch} "
                         "(one decode token per running sequence)")
    longest = max((r["prompt_len"] for r in requests), default=0)
    if not chunked_prefill and budget is not None and longest > budget:
        raise ValueError(f"a prompt of {longest} tokens never fits max_num_batched_tokens={budget} "
                         "without chunked prefill")
    schedule = schedule_chunked if chunked_prefill else schedule_separate_prefill
    return run_schedule(workload, max_batch, lambda run, wait: schedule(run, wait, budget, max_batch))


def _positive(name: str, value) -> int:
    """`value` as an int >= 1 (whole-number floats such as 16.0 accepted); ValueError otherwise."""
    try:
        return whole_number(name, value, minimum=1)
    except TypeError as error:
        raise ValueError(str(error)) from None


def _checked_workload(workload: list[dict]) -> list[dict]:
    """Copies of the entries, sorted by arrival (stable: FCFS), with the state fields at zero."""
    ids = set()
    for r in workload:
        if not isinstance(r, dict) or any(k not in r for k in WORKLOAD_KEYS):
            raise ValueError(f"each request must be a dict with keys {WORKLOAD_KEYS}, got {r!r}")
        if r["arrival"] < 0 or r["prompt_len"] < 1 or r["output_len"] < 1 or r["id"] in ids:
            raise ValueError(f"request {r!r}: need arrival >= 0, prompt_len >= 1, output_len >= 1 "
                             "and a unique id")
        ids.add(r["id"])
    return [{**{k: r[k] for k in WORKLOAD_KEYS}, "prefilled": 0, "generated": 0, "admitted": None,
             "first_token_step": None, "last_token_step": None}
            for r in sorted(workload, key=lambda r: r["arrival"])]


def run_schedule(workload: list[dict], max_batch: int,
                 schedule: Callable[[list[dict], list[dict]], Counts]) -> SimResult:
    """The engine loop every policy shares. Each step: arrivals join `waiting`; `schedule(running,
    waiting)` says how many tokens each request gets (a waiting request in it is admitted into
    the lowest free slot); the step is applied; requests that sampled their last token give their
    slot back. Raises ValueError when the schedule names an unknown request, admits more than
    `max_batch` or gives a request more tokens than it can use."""
    max_batch = _positive("max_batch", max_batch)
    requests = _checked_workload(workload)
    by_id = {r["id"]: r for r in requests}
    pending, waiting, running = list(reversed(requests)), [], []
    slots: list = [None] * max_batch
    grid, tokens_per_step, step = [], [], 0
    while pending or waiting or running:
        while pending and pending[-1]["arrival"] <= step:
            waiting.append(pending.pop())
        counts = schedule(running, waiting)
        for rid in counts:
            request = by_id.get(rid)
            if request is None or (request not in running and request not in waiting):
                raise ValueError(f"step {step}: tokens for {rid!r}, which is neither running nor waiting")
            if request["admitted"] is None:
                if None not in slots:
                    raise ValueError(f"step {step}: admitting {rid!r} needs more than {max_batch} slots")
                waiting.remove(request)
                running.append(request)
                request["admitted"] = step
                slots[slots.index(None)] = rid
            _advance(request, counts[rid], step)
        grid.append(list(slots))
        tokens_per_step.append(sum(counts.values()))
        for request in [r for r in running if r["generated"] == r["output_len"]]:
            running.remove(request)
            slots[slots.index(request["id"])] = None
        step += 1
    return SimResult(_stats(requests, grid, max_batch), grid, requests, tokens_per_step)


def _advance(request: dict, tokens: int, step: int) -> None:
    """Apply `tokens` scheduled tokens: prompt tokens first; completing the prompt, or a decode
    token, samples one output token."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"request {request['id']}: scheduled {tokens!r} tokens; give a whole number >= 1")
    if request["prefilled"] < request["prompt_len"]:
        if tokens > request["prompt_len"] - request["prefilled"]:
            raise ValueError(f"request {request['id']}: {tokens} tokens scheduled for "
                             f"{request['prompt_len'] - request['prefilled']} prompt tokens left")
        request["prefilled"] += tokens
        if request["prefilled"] < request["prompt_len"]:
            return
        request["first_token_step"] = step
    elif tokens != 1:
        raise ValueError(f"request {request['id']}: a decode step takes 1 token, got {tokens}")
    request["generated"] += 1
    request["last_token_step"] = step


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _stats(requests: list[dict], grid: list, max_batch: int) -> dict:
    for r in requests:
        r["ttft"] = r["first_token_step"] + 1 - r["arrival"]
        r["tpot"] = ((r["last_token_step"] - r["first_token_step"]) / (r["output_len"] - 1)
                     if r["output_len"] > 1 else None)
    steps = len(grid)
    held = sum(rid is not None for row in grid for rid in row)
    output_tokens = sum(r["generated"] for r in requests)
    stats = {"steps": steps, "requests": len(requests), "output_tokens": output_tokens,
             "slot_utilisation": held / (max_batch * steps) if steps else 0.0,
             "throughput": output_tokens / steps if steps else 0.0}
    for name in ("ttft", "tpot"):
        values = [r[name] for r in requests if r[name] is not None]
        stats[f"{name}_mean"] = sum(values) / len(values) if values else math.nan
        stats[f"{name}_p50"] = percentile(values, 50)
        stats[f"{name}_p99"] = percentile(values, 99)
    return stats
