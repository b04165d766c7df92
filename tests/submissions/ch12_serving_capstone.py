# %% grade_id: schedule | wrong: static batching (admits only when nothing runs)
# expect: below the course's scheduler on the
# expect: a slot stood free while requests waited
# replace:
#         slots = snapshot["max_num_seqs"] - len(running) if not preempt else 0
# with:
#         slots = snapshot["max_num_seqs"] if not running and not preempt else 0

# %% grade_id: schedule | wrong: prefill-first (prompts take the token budget, decodes get what is left)
# expect: below the course's scheduler on the
# expect: running sequences with a token to decode were left out of the batch
# replace:
#         # 1. decodes first, oldest admission first; make room by preempting the newest
#         for seq in [s for s in running if left(s) == 1]:
#             while seq in running and blocks_needed(seq, 1) > room:
#                 victim = running.pop()
#                 preempt.append(victim["id"])
#                 free += victim["private_blocks"]
#                 room += victim["private_blocks"]
#             if seq in running:
#                 room -= blocks_needed(seq, 1)
#                 batch[seq["id"]] = 1
#                 tokens -= 1
# with:

# replace:
#         if batch or not running:
# with:
#         for seq in [s for s in running if left(s) == 1]:
#             if tokens == 0:
#                 break
#             while seq in running and blocks_needed(seq, 1) > room:
#                 victim = running.pop()
#                 preempt.append(victim["id"])
#                 batch.pop(victim["id"], None)
#                 free += victim["private_blocks"]
#                 room += victim["private_blocks"]
#             if seq in running:
#                 room -= blocks_needed(seq, 1)
#                 batch[seq["id"]] = 1
#                 tokens -= 1
#         if batch or not running:

# %% grade_id: schedule | wrong: never preempts (a decode that finds no block waits)
# expect: stalled
# expect: only a preempted sequence gives blocks back
# replace:
#             while seq in running and blocks_needed(seq, 1) > room:
#                 victim = running.pop()
#                 preempt.append(victim["id"])
#                 free += victim["private_blocks"]
#                 room += victim["private_blocks"]
#             if seq in running:
# with:
#             if blocks_needed(seq, 1) <= room:
#
# replace:
#         victim = running.pop()
#         preempt.append(victim["id"])
#         free += victim["private_blocks"]
# with:
#         return {"batch": batch, "preempt": preempt}

# %% grade_id: schedule | wrong: starves long prompts (admits only prompts that fit whole in the budget left)
# expect: without a first token
# expect: more than the token budget of
# replace:
#             n = min(left(seq), tokens)
#             if blocks_needed(seq, n) > room:
#                 break
# with:
#             n = left(seq)
#             if n > tokens or blocks_needed(seq, n) > room:
#                 continue

# %% grade_id: schedule | wrong: ignores the token budget (admits whole prompts)
# expect: rule 'max_num_batched_tokens' broken
# expect: chunked prefill
# replace:
#             n = min(left(seq), tokens)
# with:
#             n = left(seq)

# %% grade_id: schedule | wrong: admits past the block pool (no block count at admission)
# expect: rule 'blocks' broken
# replace:
#             if blocks_needed(seq, n) > room:
#                 break
#             room -= blocks_needed(seq, n)
# with:
#             room -= blocks_needed(seq, n)

# %% grade_id: schedule | cheat: the course's own policy, through the course on sys.path
# expect: is not allowed
# expect score: 0
import os
import sys

sys.path.insert(0, os.environ.get("AUTOGRADER_ROOT", "."))
from reference.engine.scheduler import reference_policy as _policy


def schedule(snapshot):
    return _policy(snapshot)


# %% grade_id: schedule | cheat: hunts the engine's block pool in its own process to free blocks
# expect: step 0: your code raised
# expect score: 0
import gc


def schedule(snapshot):
    pools = [o for o in gc.get_objects() if hasattr(o, "free_block_ids") and hasattr(o, "_free")]
    for pool in pools:            # never found: the engine lives in the grader's process
        pool._free.extend(range(10 ** 6))
    snapshot["free_blocks"] = 10 ** 6      # a copy: the engine does not read it back
    return {"batch": {}, "preempt": []}


# %% grade_id: schedule | cheat: kills its own worker at every step
# expect: crashed
# expect score: 0
import os


def schedule(snapshot):
    os.kill(os.getpid(), 9)
