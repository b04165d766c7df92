"""Solutions of exercises/ch09_continuous_batching.ipynb, one section per solution cell.

Loaded with ``autograder.solutions.load_solutions("ch09_continuous_batching")``.
"""

# %% grade_id: continuous_batch_step
def continuous_batch_step(running: list, waiting: list, max_batch: int) -> tuple:
    """One engine step of continuous (iteration-level) batching.

    running: the requests holding a slot, dicts {"id", "output_len", "generated"}, where
        generated = output tokens produced so far (tokens);
    waiting: the requests not admitted yet, in arrival order (first come, first served), with
        generated = 0;
    max_batch: the number of slots (at most this many requests run in one step).

    In this order:
    1. retire: every running request with generated == output_len is finished and frees its slot;
    2. admit: waiting requests, from the front of the queue, take the free slots;
    3. advance: every running request gains one token (generated += 1), the ones admitted in 2.
       too: the step that admits a request runs its prefill, which samples its first token.
    Returns (running, waiting, finished): three new lists of dicts (change copies, not the dicts
    passed in); running and finished in any order, waiting in queue order.
    """
    finished = [dict(r) for r in running if r["generated"] >= r["output_len"]]
    still_running = [dict(r) for r in running if r["generated"] < r["output_len"]]
    free = max(0, max_batch - len(still_running))
    still_running += [dict(r) for r in waiting[:free]]
    for request in still_running:
        request["generated"] += 1
    return still_running, [dict(r) for r in waiting[free:]], finished


# %% grade_id: simulate_batching
def simulate_batching(workload: list, max_batch: int, policy: str) -> dict:
    """Simulate static or continuous batching one engine step at a time; return the run's stats.

    workload: dicts {"id", "arrival" (step), "prompt_len", "output_len" (tokens, >= 1)} sorted
        by arrival; serve them first come, first served, in this order.
    max_batch: the number of slots. policy: "static" or "continuous".
    Steps are numbered 0, 1, 2, ... A request arriving at step a may be admitted in step a. In a
    step every running request gains one token; the step that admits a request runs its prefill
    and samples its first token. A request whose last token is sampled in step s frees its slot
    for step s + 1.
    - "continuous": in every step, free slots are filled from the front of the queue.
    - "static": a new batch (up to max_batch arrived requests) is admitted only when no request of
      the previous batch is still generating; until then the finished requests' slots stay empty.
    A step in which nothing runs (waiting for the next arrival) still counts.

    Returns a dict, times in steps:
      "steps": steps until the last token is sampled;
      "slot_utilisation": slot-steps held by a request still generating / (max_batch * steps);
      "throughput": output tokens per step;
      "ttft_mean", "ttft_p50", "ttft_p99": TTFT = (step of its first token) + 1 - arrival;
      "tpot_mean", "tpot_p50", "tpot_p99": TPOT = (step of its last token - step of its first
          token) / (output_len - 1), over the requests with output_len >= 2 only.
    Percentiles interpolate linearly between ranks (numpy.percentile's and torch.quantile's
    default).
    """
    def percentile(values, q):
        ordered = sorted(values)
        position = (len(ordered) - 1) * q / 100
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    queue, waiting, running = list(workload), [], []
    first_step, last_step = {}, {}
    held, step = 0, 0
    while queue or waiting or running:
        while queue and queue[0]["arrival"] <= step:
            waiting.append(queue.pop(0))
        if policy == "continuous" or not running:
            free = max_batch - len(running)
            running += [{"id": r["id"], "left": r["output_len"]} for r in waiting[:free]]
            waiting = waiting[free:]
        held += len(running)
        for request in running:
            first_step.setdefault(request["id"], step)
            last_step[request["id"]] = step
            request["left"] -= 1
        running = [r for r in running if r["left"] > 0]
        step += 1
    ttft = [first_step[r["id"]] + 1 - r["arrival"] for r in workload]
    tpot = [(last_step[r["id"]] - first_step[r["id"]]) / (r["output_len"] - 1)
            for r in workload if r["output_len"] > 1]
    stats = {"steps": step, "slot_utilisation": held / (max_batch * step),
             "throughput": sum(r["output_len"] for r in workload) / step}
    for name, values in (("ttft", ttft), ("tpot", tpot)):
        stats[f"{name}_mean"] = sum(values) / len(values)
        stats[f"{name}_p50"] = percentile(values, 50)
        stats[f"{name}_p99"] = percentile(values, 99)
    return stats


# %% grade_id: schedule_chunked
def schedule_chunked(running: list, waiting: list, token_budget: int, max_num_seqs: int) -> dict:
    """How many tokens each request gets in one step of chunked prefill under a token budget.

    running: the admitted, unfinished requests, in admission order; waiting: the requests not
    admitted yet, first come first served. Each is a dict {"id", "prompt_len", "prefilled",
    "output_len", "generated"}: prefilled = prompt tokens already processed (a running request
    with prefilled < prompt_len is part-way through its prefill).
    token_budget: the most tokens one step may process (vLLM's max_num_batched_tokens);
    max_num_seqs: the most requests that may be running (admitted) at once.

    1. decodes first: every running request whose prompt is done (prefilled == prompt_len) gets
       1 token, in order, while the budget lasts;
    2. then prefill chunks, first come first served: first the running requests with prompt
       tokens left, then waiting requests while fewer than max_num_seqs requests would be
       running; each gets min(its prompt tokens left, the budget left).
    Returns {id: tokens} for the requests that get at least one token this step (their sum is
    at most token_budget). A waiting request in it is admitted in this step.
    """
    left, counts = token_budget, {}
    for request in running:
        if request["prefilled"] >= request["prompt_len"] and left > 0:
            counts[request["id"]] = 1
            left -= 1
    prefilling = [r for r in running if r["prefilled"] < r["prompt_len"]]
    for request in prefilling + waiting[:max(0, max_num_seqs - len(running))]:
        if left == 0:
            break
        chunk = min(request["prompt_len"] - request["prefilled"], left)
        counts[request["id"]] = chunk
        left -= chunk
    return counts
