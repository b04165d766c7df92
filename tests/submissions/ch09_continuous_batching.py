"""Known-wrong and cheating submissions for chapter 09 (see tests/test_selfcheck.py).

Each section is the body of one solution cell; none may earn the exercise's full points.
"""

# %% grade_id: continuous_batch_step | wrong: admits before retiring (a finished request's slot idles a step)
# expect: retire first
def continuous_batch_step(running, waiting, max_batch):
    free = max(0, max_batch - len(running))
    admitted = [dict(r) for r in waiting[:free]]
    finished = [dict(r) for r in running if r["generated"] >= r["output_len"]]
    still = [dict(r) for r in running if r["generated"] < r["output_len"]] + admitted
    for request in still:
        request["generated"] += 1
    return still, [dict(r) for r in waiting[free:]], finished


# %% grade_id: continuous_batch_step | wrong: the admission (prefill) step samples no token
# expect: generated = 1
def continuous_batch_step(running, waiting, max_batch):
    finished = [dict(r) for r in running if r["generated"] >= r["output_len"]]
    still = [dict(r) for r in running if r["generated"] < r["output_len"]]
    for request in still:
        request["generated"] += 1
    free = max(0, max_batch - len(still))
    return still + [dict(r) for r in waiting[:free]], [dict(r) for r in waiting[free:]], finished


# %% grade_id: continuous_batch_step | cheat: imports the reference implementation
# expect: is not allowed
from reference.calculators.batching_sim import continuous_batch_step  # noqa: F401


# %% grade_id: simulate_batching | wrong: TPOT counts the prefill's token as a decode token
# expect: output_len - 1
def simulate_batching(workload, max_batch, policy):
    def percentile(values, q):
        ordered = sorted(values)
        position = (len(ordered) - 1) * q / 100
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    queue, waiting, running, first, last, held, step = list(workload), [], [], {}, {}, 0, 0
    while queue or waiting or running:
        while queue and queue[0]["arrival"] <= step:
            waiting.append(queue.pop(0))
        if policy == "continuous" or not running:
            free = max_batch - len(running)
            running += [{"id": r["id"], "left": r["output_len"]} for r in waiting[:free]]
            waiting = waiting[free:]
        held += len(running)
        for request in running:
            first.setdefault(request["id"], step)
            last[request["id"]] = step
            request["left"] -= 1
        running = [r for r in running if r["left"] > 0]
        step += 1
    ttft = [first[r["id"]] + 1 - r["arrival"] for r in workload]
    tpot = [(last[r["id"]] - first[r["id"]]) / r["output_len"] for r in workload if r["output_len"] > 1]
    stats = {"steps": step, "slot_utilisation": held / (max_batch * step),
             "throughput": sum(r["output_len"] for r in workload) / step}
    for name, values in (("ttft", ttft), ("tpot", tpot)):
        stats |= {f"{name}_mean": sum(values) / len(values), f"{name}_p50": percentile(values, 50),
                  f"{name}_p99": percentile(values, 99)}
    return stats


# %% grade_id: simulate_batching | wrong: TTFT counted from admission instead of arrival (the queue is left out)
# expect: ARRIVAL, not at its admission
def simulate_batching(workload, max_batch, policy):
    def percentile(values, q):
        ordered = sorted(values)
        position = (len(ordered) - 1) * q / 100
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    queue, waiting, running, first, last, held, step = list(workload), [], [], {}, {}, 0, 0
    admitted = {}
    while queue or waiting or running:
        while queue and queue[0]["arrival"] <= step:
            waiting.append(queue.pop(0))
        if policy == "continuous" or not running:
            free = max_batch - len(running)
            running += [{"id": r["id"], "left": r["output_len"]} for r in waiting[:free]]
            admitted |= {r["id"]: step for r in waiting[:free]}
            waiting = waiting[free:]
        held += len(running)
        for request in running:
            first.setdefault(request["id"], step)
            last[request["id"]] = step
            request["left"] -= 1
        running = [r for r in running if r["left"] > 0]
        step += 1
    ttft = [first[r["id"]] + 1 - admitted[r["id"]] for r in workload]
    tpot = [(last[r["id"]] - first[r["id"]]) / (r["output_len"] - 1) for r in workload
            if r["output_len"] > 1]
    stats = {"steps": step, "slot_utilisation": held / (max_batch * step),
             "throughput": sum(r["output_len"] for r in workload) / step}
    for name, values in (("ttft", ttft), ("tpot", tpot)):
        stats |= {f"{name}_mean": sum(values) / len(values), f"{name}_p50": percentile(values, 50),
                  f"{name}_p99": percentile(values, 99)}
    return stats


# %% grade_id: simulate_batching | wrong: "static" refills freed slots at once (that is continuous batching)
# expect: EVERY request of the current batch
def simulate_batching(workload, max_batch, policy):
    def percentile(values, q):
        ordered = sorted(values)
        position = (len(ordered) - 1) * q / 100
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    queue, waiting, running, first, last, held, step = list(workload), [], [], {}, {}, 0, 0
    while queue or waiting or running:
        while queue and queue[0]["arrival"] <= step:
            waiting.append(queue.pop(0))
        free = max_batch - len(running)
        running += [{"id": r["id"], "left": r["output_len"]} for r in waiting[:free]]
        waiting = waiting[free:]
        held += len(running)
        for request in running:
            first.setdefault(request["id"], step)
            last[request["id"]] = step
            request["left"] -= 1
        running = [r for r in running if r["left"] > 0]
        step += 1
    ttft = [first[r["id"]] + 1 - r["arrival"] for r in workload]
    tpot = [(last[r["id"]] - first[r["id"]]) / (r["output_len"] - 1) for r in workload if r["output_len"] > 1]
    stats = {"steps": step, "slot_utilisation": held / (max_batch * step),
             "throughput": sum(r["output_len"] for r in workload) / step}
    for name, values in (("ttft", ttft), ("tpot", tpot)):
        stats |= {f"{name}_mean": sum(values) / len(values), f"{name}_p50": percentile(values, 50),
                  f"{name}_p99": percentile(values, 99)}
    return stats


# %% grade_id: simulate_batching | cheat: loads the reference simulators from their file and runs them
# expect: simulate_batching
import importlib.util
import pathlib
import sys

# where the course lives: the grader says so in the environment and on sys.path
for _folder in (*map(pathlib.Path, filter(None, [__import__("os").environ.get("AUTOGRADER_ROOT")])),
                *map(pathlib.Path, sys.path), pathlib.Path.cwd(), *pathlib.Path.cwd().parents):
    _file = _folder / "reference" / "batching_sim.py"
    if _file.exists():
        _spec = importlib.util.spec_from_file_location("stolen_batching_sim", _file)
        _stolen = sys.modules["stolen_batching_sim"] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_stolen)

        def simulate_batching(workload, max_batch, policy):
            run = (_stolen.simulate_static(workload, max_batch) if policy == "static"
                   else _stolen.simulate_continuous(workload, max_batch))
            return run.stats
        break


# %% grade_id: schedule_chunked | wrong: admits whole prompts, past the token budget
# expect: token_budget tokens in total
def schedule_chunked(running, waiting, token_budget, max_num_seqs):
    counts = {r["id"]: 1 for r in running if r["prefilled"] >= r["prompt_len"]}
    left = token_budget - len(counts)
    for request in [r for r in running if r["prefilled"] < r["prompt_len"]] + \
            waiting[:max(0, max_num_seqs - len(running))]:
        if left <= 0:
            break
        counts[request["id"]] = request["prompt_len"] - request["prefilled"]
        left -= counts[request["id"]]
    return counts


# %% grade_id: schedule_chunked | wrong: prefill chunks first, decodes from what is left (starves them)
# expect: decodes first
def schedule_chunked(running, waiting, token_budget, max_num_seqs):
    left, counts = token_budget, {}
    for request in [r for r in running if r["prefilled"] < r["prompt_len"]] + \
            waiting[:max(0, max_num_seqs - len(running))]:
        if left == 0:
            break
        counts[request["id"]] = min(request["prompt_len"] - request["prefilled"], left)
        left -= counts[request["id"]]
    for request in running:
        if request["prefilled"] >= request["prompt_len"] and left > 0:
            counts[request["id"]] = 1
            left -= 1
    return counts


# %% grade_id: schedule_chunked | cheat: imports the reference scheduler under another name
# expect: is not allowed
import importlib

schedule_chunked = importlib.import_module("reference.batching" + "_sim").schedule_chunked
