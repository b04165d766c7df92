"""Known-wrong and cheating submissions for chapter 09 (see tests/grading/test_selfcheck.py).

Each section is the body of one solution cell, written in full or, for a slip, as
`# replace:` / `# with:` edits of the solution section (autograder/solutions/__init__.py);
none may earn the exercise's full points.
"""

# %% grade_id: continuous_batch_step | wrong: admits before retiring (a finished request's slot idles a step)
# expect: retire first
# replace:
#     free = max(0, max_batch - len(still_running))
# with:
#     free = max(0, max_batch - len(running))          # the finished requests still hold slots


# %% grade_id: continuous_batch_step | wrong: the admission (prefill) step samples no token
# expect: generated = 1
# replace:
#     free = max(0, max_batch - len(still_running))
#     still_running += [dict(r) for r in waiting[:free]]
#     for request in still_running:
#         request["generated"] += 1
# with:
#     for request in still_running:
#         request["generated"] += 1
#     free = max(0, max_batch - len(still_running))
#     still_running += [dict(r) for r in waiting[:free]]


# %% grade_id: continuous_batch_step | wrong: static batching: admits only once the whole batch has finished
# expect: that is static batching
# replace:
#     free = max(0, max_batch - len(still_running))
# with:
#     free = max_batch if not still_running else 0                 # a new batch only when all are done

# %% grade_id: continuous_batch_step | cheat: imports the reference implementation
# expect: is not allowed
from reference.calculators.batching_sim import continuous_batch_step  # noqa: F401


# %% grade_id: simulate_batching | wrong: TPOT counts the prefill's token as a decode token
# expect: output_len - 1
# replace:
#     tpot = [(last_step[r["id"]] - first_step[r["id"]]) / (r["output_len"] - 1)
# with:
#     tpot = [(last_step[r["id"]] - first_step[r["id"]]) / r["output_len"]


# %% grade_id: simulate_batching | wrong: TTFT counted from admission instead of arrival (the queue is left out)
# expect: ARRIVAL, not at its admission
# replace:
#     first_step, last_step = {}, {}
# with:
#     first_step, last_step, admitted = {}, {}, {}

# replace:
#             running += [{"id": r["id"], "left": r["output_len"]} for r in waiting[:free]]
# with:
#             running += [{"id": r["id"], "left": r["output_len"]} for r in waiting[:free]]
#             admitted |= {r["id"]: step for r in waiting[:free]}

# replace:
#     ttft = [first_step[r["id"]] + 1 - r["arrival"] for r in workload]
# with:
#     ttft = [first_step[r["id"]] + 1 - admitted[r["id"]] for r in workload]


# %% grade_id: simulate_batching | wrong: "static" refills freed slots at once (that is continuous batching)
# expect: EVERY request of the current batch
# replace:
#         if policy == "continuous" or not running:
#             free = max_batch - len(running)
#             running += [{"id": r["id"], "left": r["output_len"]} for r in waiting[:free]]
#             waiting = waiting[free:]
# with:
#         free = max_batch - len(running)              # whatever the policy
#         running += [{"id": r["id"], "left": r["output_len"]} for r in waiting[:free]]
#         waiting = waiting[free:]


# %% grade_id: simulate_batching | wrong: ignores the arrivals (every request is in the queue at step 0)
# expect: a request cannot be admitted before its arrival step
# replace:
#         while queue and queue[0]["arrival"] <= step:
# with:
#         while queue:                                            # arrivals ignored

# %% grade_id: simulate_batching | wrong: percentiles by statistics.quantiles' default, the exclusive method
# expect: the 'exclusive' method
# replace:
#         ordered = sorted(values)
#         position = (len(ordered) - 1) * q / 100
#         low = int(position)
#         high = min(low + 1, len(ordered) - 1)
#         return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
# with:
#         import statistics
#         return statistics.quantiles(values, n=100)[int(q) - 1]   # method="exclusive"


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
# replace:
#         if left == 0:
#             break
#         chunk = min(request["prompt_len"] - request["prefilled"], left)
# with:
#         if left <= 0:
#             break
#         chunk = request["prompt_len"] - request["prefilled"]   # the whole prompt, budget or not


# %% grade_id: schedule_chunked | wrong: prefill chunks first, decodes from what is left (starves them)
# expect: decodes first
# replace:
#     for request in running:
#         if request["prefilled"] >= request["prompt_len"] and left > 0:
#             counts[request["id"]] = 1
#             left -= 1
# with:

# replace:
#     return counts
# with:
#     for request in running:
#         if request["prefilled"] >= request["prompt_len"] and left > 0:
#             counts[request["id"]] = 1
#             left -= 1
#     return counts


# %% grade_id: schedule_chunked | wrong: admits one request past max_num_seqs (off by one)
# expect: one request too many was admitted
# replace:
#     for request in prefilling + waiting[:max(0, max_num_seqs - len(running))]:
# with:
#     for request in prefilling + waiting[:max(0, max_num_seqs - len(running) + 1)]:


# %% grade_id: schedule_chunked | cheat: imports the reference scheduler under another name
# expect: is not allowed
import importlib

schedule_chunked = importlib.import_module("reference.batching" + "_sim").schedule_chunked
