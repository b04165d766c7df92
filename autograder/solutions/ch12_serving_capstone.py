# %% grade_id: schedule
def schedule(snapshot: dict) -> dict:
    """One step of the serving engine's scheduler: which sequences run and how many tokens each.

    snapshot (plain data, a fresh copy every step):
      "step": the engine's step clock; "block_size": token slots per K/V block;
      "free_blocks": blocks a new token can take now; "max_num_seqs": most sequences running
      at once; "max_num_batched_tokens": most tokens fed in one step (the token budget);
      "running": the admitted sequences, oldest admission first, each a dict with
        "id" (str), "prompt_len", "generated" (tokens sampled so far), "computed" (tokens whose
        K/V are in the pool), "blocks_held", "private_blocks" (held by it alone: what preempting
        it frees), "arrival_step", "admitted_step";
      "waiting": the queue, in order (a preempted sequence goes back to its front), each with
        "id", "prompt_len", "generated" (> 0 after a preemption: those tokens are recomputed
        too), "cached_prefix_tokens" (leading tokens already in the prefix cache: not fed
        again), "cached_blocks_free" (how many of those cached blocks no sequence holds: they
        count in free_blocks until reused), "arrival_step", "preemptions".

    A sequence has prompt_len + generated tokens; a running one has prompt_len + generated -
    computed left to feed (1 once it decodes), a waiting one prompt_len + generated -
    cached_prefix_tokens. Feeding n more tokens to a sequence whose first c tokens have slots
    takes ceil((c + n) / block_size) minus the blocks it already holds (running: blocks_held;
    waiting: cached_prefix_tokens / block_size) new blocks; admitting a waiting one also takes
    its cached_blocks_free out of free_blocks.

    Returns {"batch": {id: n_tokens, ...}, "preempt": [id, ...]}. A waiting id in the batch is
    admitted. Preempted sequences give their private blocks back and wait to be recomputed.
    The rules a legal decision keeps (the engine checks each and stops at the first broken one):
      - every id is running or waiting; only running ids are preempted, and not also fed;
      - each fed sequence gets 1 <= n <= the tokens it has left;
      - running after the step (kept + admitted) <= max_num_seqs;
      - sum of n <= max_num_batched_tokens;
      - new blocks needed <= free_blocks + private blocks of the preempted.
    The policy is yours: which sequences to feed, how many tokens each, whom to admit and whom
    to preempt. It is measured against the course's scheduler on the same traces and clock
    (the notebook says how).
    """
    bs = snapshot["block_size"]
    budget = snapshot["max_num_batched_tokens"]
    running = list(snapshot["running"])
    free = snapshot["free_blocks"]
    preempt = []

    def left(seq):
        done = seq["computed"] if "computed" in seq else seq["cached_prefix_tokens"]
        return seq["prompt_len"] + seq["generated"] - done

    def blocks_needed(seq, n):
        if "computed" in seq:
            return max(0, -(-(seq["computed"] + n) // bs) - seq["blocks_held"])
        cached = seq["cached_prefix_tokens"]
        return -(-(cached + n) // bs) - cached // bs + seq["cached_blocks_free"]

    while True:
        batch, tokens, room = {}, budget, free
        # 1. decodes first, oldest admission first; make room by preempting the newest
        for seq in [s for s in running if left(s) == 1]:
            while seq in running and blocks_needed(seq, 1) > room:
                victim = running.pop()
                preempt.append(victim["id"])
                free += victim["private_blocks"]
                room += victim["private_blocks"]
            if seq in running:
                room -= blocks_needed(seq, 1)
                batch[seq["id"]] = 1
                tokens -= 1
        # 2. the next chunk of prompts already admitted
        for seq in [s for s in running if left(s) > 1]:
            n = min(left(seq), tokens, (seq["blocks_held"] + room) * bs - seq["computed"])
            if n > 0:
                room -= blocks_needed(seq, n)
                batch[seq["id"]] = n
                tokens -= n
        # 3. admit waiting sequences in order while a slot, tokens and blocks remain (none
        #    after a preemption: the preempted sequence heads the queue)
        slots = snapshot["max_num_seqs"] - len(running) if not preempt else 0
        for seq in snapshot["waiting"]:
            if slots <= 0 or tokens <= 0:
                break
            n = min(left(seq), tokens)
            if blocks_needed(seq, n) > room:
                break
            room -= blocks_needed(seq, n)
            batch[seq["id"]] = n
            tokens -= n
            slots -= 1
        if batch or not running:
            return {"batch": batch, "preempt": preempt}
        # 4. nothing fits at all: free the newest sequence's blocks and try again
        victim = running.pop()
        preempt.append(victim["id"])
        free += victim["private_blocks"]
