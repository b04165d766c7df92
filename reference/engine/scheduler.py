"""Which sequences run in the next step, and how many tokens each feeds.

Continuous (iteration-level) scheduling re-decides at every step: finished sequences have left,
waiting ones join as soon as a slot, blocks and token budget allow. A step's tokens stay under
`max_num_batched_tokens`: decodes go first (one token each, so a long prompt never stalls them),
then the rest of partly computed prompts, then new prompts, each cut to the budget that is left
(chunked prefill). When a decode needs a block and none is free, the most recently admitted
sequence is preempted: its blocks are freed and it waits to be recomputed from its tokens (its
full blocks may still be found in the prefix cache).

Static scheduling is the baseline: it admits up to `max_num_seqs` requests only when nothing is
running and serves that batch until all of it has finished.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

from reference.engine.sequence import Sequence, Status
from reference.paging import BlockManager, OutOfBlocks

SCHEDULING = ("continuous", "static")


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 scheduling: str = "continuous", propose: Callable[[Sequence, int], None] | None = None):
        if scheduling not in SCHEDULING:
            raise ValueError(f"scheduling must be one of {SCHEDULING}, got {scheduling!r}")
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.scheduling = scheduling
        self.propose = propose      # speculative decoding: propose(seq, room) sets seq.draft_ids
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0
        self.prefix_queried_tokens = 0   # prompt tokens in full blocks looked up at admissions
        self.prefix_hit_tokens = 0       # of those, found in the prefix cache
        self.block_copies: list[tuple[int, int]] = []   # copy-on-write (src, dst) for the runner
        self.finished: list[Sequence] = []   # sequences the scheduler itself ended (pool too small)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """The next step's batch: (sequence, number of its tokens to feed), in running order.

        Sequences finished last step must have been `release`d. Returns [] only when there is
        nothing to do. Sequences that cannot even be given one block are finished with "length".
        """
        self.block_copies, self.finished = [], []
        while True:
            batch, budget = self._schedule_running(self.max_num_batched_tokens)
            if self.scheduling == "continuous" or not self.running:
                batch += self._admit(budget)
            if batch or not self.running:
                return batch
            # Every running sequence is mid-prompt and none could get a block: make room.
            self._preempt(self.running[-1])

    def release(self, seq: Sequence) -> None:
        """Drop a finished (or aborted) sequence: free its blocks and its slot."""
        if seq in self.running:
            self.running.remove(seq)
            self.blocks.free(seq.request_id)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    # ----- internals -----------------------------------------------------------------------
    def _schedule_running(self, budget: int) -> tuple[list[tuple[Sequence, int]], int]:
        batch = []
        decodes = [s for s in self.running if s.tokens_to_feed == 1]
        spare = budget - len(decodes)                     # tokens left for drafts and prompts
        for seq in decodes:                               # decodes first
            if seq.status is not Status.RUNNING:
                continue                                  # preempted by an earlier decode
            if self.propose is not None:
                self.propose(seq, max(spare, 0))
            if self._reserve_decode(seq):
                n = 1 + len(seq.draft_ids)
                batch.append((seq, n))
                budget -= n
                spare -= n - 1
        for seq in [s for s in self.running if s.tokens_to_feed > 1]:    # unfinished prompts
            n = self._reserve(seq, min(seq.tokens_to_feed, max(budget, 0)))
            if n > 0:
                batch.append((seq, n))
                budget -= n
        order = {id(s): i for i, s in enumerate(self.running)}
        return sorted(batch, key=lambda item: order[id(item[0])]), budget

    def _reserve_decode(self, seq: Sequence) -> bool:
        """Make room for one token (and its drafts if blocks allow), preempting later sequences
        if the token itself has no room; False if seq itself went."""
        if seq.draft_ids:
            try:
                self._grow_to(seq, seq.num_tokens + len(seq.draft_ids))
                return True
            except OutOfBlocks:   # no room for the drafts: hand back what they took, decode plainly
                self.blocks.truncate(seq.request_id, min(self.blocks.num_tokens(seq.request_id), seq.num_tokens))
                seq.draft_ids, seq.draft_probs = [], None
        while True:
            try:
                self._grow_to(seq, seq.num_tokens)
                return True
            except OutOfBlocks:
                victim = self.running[-1]
                if victim is seq and len(self.running) == 1:
                    self.release(seq)   # alone and still no room: the pool is too small for it
                    seq.finish("length")
                    self.finished.append(seq)
                    return False
                self._preempt(victim)
                if victim is seq:
                    return False

    def _reserve(self, seq: Sequence, n: int) -> int:
        """Reserve slots for up to n more prompt tokens; returns how many have one (no preemption)."""
        try:
            self._grow_to(seq, seq.num_computed + n)
        except OutOfBlocks:
            pass
        return min(n, self.blocks.num_tokens(seq.request_id) - seq.num_computed)

    def _grow_to(self, seq: Sequence, n_tokens: int) -> None:
        """Give tokens up to position n_tokens - 1 a slot (raises OutOfBlocks when the pool is dry)."""
        wanted = seq.tokens_between(self.blocks.num_tokens(seq.request_id), n_tokens)
        done, copies = self.blocks.append_tokens(seq.request_id, wanted)
        self.block_copies += copies
        if done < len(wanted):
            raise OutOfBlocks(f"sequence {seq.request_id!r} got slots for {done} of {len(wanted)} tokens")

    def _admit(self, budget: int) -> list[tuple[Sequence, int]]:
        """Move waiting sequences into free slots while blocks allow; each feeds what the budget
        leaves (continuous scheduling stops at an empty budget, static admits a whole batch and
        feeds the rest of it in later steps)."""
        batch = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            if budget <= 0 and self.scheduling == "continuous":
                break
            seq = self.waiting[0]
            cached = self.blocks.cached_prefix_tokens(seq.token_ids)
            n = min(seq.num_tokens - cached, max(budget, 0))
            try:  # slots for what is fed now (at least one token, to hold the sequence's place)
                cached = self.blocks.allocate(seq.request_id, seq.token_ids[:cached + max(n, 1)])
            except OutOfBlocks:
                break
            self.waiting.popleft()
            self.prefix_queried_tokens += (seq.num_tokens - 1) // self.blocks.block_size * self.blocks.block_size
            self.prefix_hit_tokens += cached
            if seq.metrics.first_token_time is None:   # first admission, not a recompute
                seq.num_cached_tokens = cached
            seq.num_computed = cached
            seq.status = Status.RUNNING
            self.running.append(seq)
            if n:
                batch.append((seq, n))
                budget -= n
        return batch

    def _preempt(self, seq: Sequence) -> None:
        """Free the sequence's blocks and put it first in line; it will be recomputed."""
        self.running.remove(seq)
        self.blocks.free(seq.request_id)
        seq.status = Status.WAITING
        seq.num_computed = 0
        seq.draft_ids, seq.draft_probs = [], None
        self.waiting.appendleft(seq)
        self.preemptions += 1


# ----- the policy as a pure function of plain data (chapter 12) ----------------------------
#
# `PolicyScheduler` asks a policy, once per step, for the step's batch. The policy sees a
# snapshot made of dicts, lists, strings and ints only, and answers with plain data too:
#
#   snapshot = {"step", "block_size", "free_blocks", "max_num_seqs", "max_num_batched_tokens",
#               "running": [{"id", "prompt_len", "generated", "computed", "blocks_held",
#                            "private_blocks", "arrival_step", "admitted_step"}, ...],   # admission order
#               "waiting": [{"id", "prompt_len", "generated", "cached_prefix_tokens",
#                            "cached_blocks_free", "arrival_step", "preemptions"}, ...]}  # queue order
#   decision = {"batch": {id: n_tokens, ...}, "preempt": [id, ...]}
#
# `check_decision` holds the rules a legal decision keeps (each broken rule is named), and the
# scheduler applies only legal decisions. `reference_policy` is the course's own policy (FCFS,
# decodes first, chunked prefill, preempt the most recently admitted when a decode finds no
# block), the same rules `Scheduler` follows, written against the snapshot alone.

RULES = {
    "format": "the decision is {'batch': {id: n_tokens}, 'preempt': [ids]} with int token counts",
    "unknown id": "every id is a running or waiting sequence of this snapshot",
    "preempt": "only running sequences are preempted, and a preempted one is not also fed this step",
    "tokens": "a sequence is fed 1 or more tokens and never past its last token",
    "max_num_seqs": "at most max_num_seqs sequences run (those kept plus those admitted)",
    "max_num_batched_tokens": "the step feeds at most max_num_batched_tokens tokens in all",
    "blocks": "the new blocks the step needs fit in the free blocks (plus those preemption frees)",
}


class IllegalDecision(ValueError):
    """A policy's decision broke a rule; `rule` is a key of RULES, `step` the snapshot's step."""

    def __init__(self, rule: str, step: int, message: str):
        super().__init__(f"step {step}: rule '{rule}' broken ({RULES[rule]}): {message}")
        self.rule, self.step, self.detail = rule, step, message


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold `tokens` tokens."""
    return -(-tokens // block_size)


def tokens_left(entry: dict) -> int:
    """Tokens a snapshot entry can still be fed: the rest of prompt + generated (a waiting
    entry starts after its cached prefix; a preempted one recomputes what it had generated)."""
    done = entry["computed"] if "computed" in entry else entry["cached_prefix_tokens"]
    return entry["prompt_len"] + entry["generated"] - done


def new_blocks(entry: dict, n: int, block_size: int) -> int:
    """Free blocks that feeding n more tokens to a snapshot entry takes: the new blocks, and for
    a waiting entry its cached blocks that nobody holds (they count among the free blocks until
    reused); cached blocks a running sequence holds are shared for nothing."""
    if "computed" in entry:
        return max(0, blocks_for(entry["computed"] + n, block_size) - entry["blocks_held"])
    cached = entry["cached_prefix_tokens"]
    return blocks_for(cached + n, block_size) - cached // block_size + entry["cached_blocks_free"]


def check_decision(snapshot: dict, decision) -> tuple[list[tuple[str, int]], list[str]]:
    """The decision as ([(id, n_tokens), ...] in its order, [preempted ids]) if it is legal,
    else IllegalDecision naming the first rule it breaks."""
    step = snapshot["step"]

    def broken(rule, message):
        raise IllegalDecision(rule, step, message)

    if not isinstance(decision, dict) or set(decision) - {"batch", "preempt"}:
        broken("format", f"got {type(decision).__name__}"
               + (f" with keys {sorted(map(str, decision))}" if isinstance(decision, dict) else ""))
    batch, preempt = decision.get("batch", {}), decision.get("preempt", [])
    if not isinstance(batch, dict) or not isinstance(preempt, (list, tuple)):
        broken("format", f"'batch' must be a dict and 'preempt' a list, got "
               f"{type(batch).__name__} and {type(preempt).__name__}")
    running = {e["id"]: e for e in snapshot["running"]}
    waiting = {e["id"]: e for e in snapshot["waiting"]}
    for sid in list(batch) + list(preempt):
        if not isinstance(sid, str) or sid not in running and sid not in waiting:
            broken("unknown id", f"{sid!r} is neither running nor waiting")
    for sid in preempt:
        if sid not in running:
            broken("preempt", f"{sid!r} is waiting, not running: there is nothing to preempt")
        if sid in batch:
            broken("preempt", f"{sid!r} is both preempted and fed")
    if len(set(preempt)) != len(preempt):
        broken("preempt", "an id is preempted twice")
    bs, freed, need, fed = snapshot["block_size"], 0, 0, 0
    for sid in preempt:
        freed += running[sid]["private_blocks"]
    for sid, n in batch.items():
        if isinstance(n, bool) or not isinstance(n, int):
            broken("format", f"{sid!r} gets {n!r} ({type(n).__name__}); token counts are ints")
        entry = running.get(sid) or waiting[sid]
        left = tokens_left(entry)
        if not 1 <= n <= left:
            where = "running" if sid in running else "waiting"
            broken("tokens", f"{where} sequence {sid!r} has {left} token(s) left to feed, the batch gives it {n}")
        need += new_blocks(entry, n, bs)
        fed += n
    admitted = sum(sid in waiting for sid in batch)
    seqs = len(running) - len(preempt) + admitted
    if seqs > snapshot["max_num_seqs"]:
        broken("max_num_seqs", f"{len(running) - len(preempt)} kept running + {admitted} admitted = "
               f"{seqs} sequences, max_num_seqs is {snapshot['max_num_seqs']}")
    if fed > snapshot["max_num_batched_tokens"]:
        broken("max_num_batched_tokens", f"the batch feeds {fed} tokens, max_num_batched_tokens is "
               f"{snapshot['max_num_batched_tokens']}")
    if need > snapshot["free_blocks"] + freed:
        broken("blocks", f"the batch needs {need} new blocks of {bs} tokens; {snapshot['free_blocks']} "
               f"are free" + (f" and preempting frees {freed}" if preempt else ""))
    return list(batch.items()), list(preempt)


def reference_policy(snapshot: dict) -> dict:
    """The course's scheduler as a pure function: FCFS with decodes first.

    1. Every running sequence with one token left (a decode) gets it, in admission order. When
       a decode needs a new block and none is left, the most recently admitted sequence still
       running is preempted (its private blocks come back) until the decode fits, or the decode
       itself was the one preempted.
    2. Running sequences mid-prompt get the next chunk the token budget and blocks allow.
    3. Waiting sequences are admitted in queue order while a slot, budget and blocks remain,
       each fed as much of its prompt (after its cached prefix) as the budget leaves; none when
       a sequence was preempted this step (it heads the queue, and comes back next step).
    4. A step that would feed nothing while sequences run preempts the last admitted and tries
       again (every running sequence is mid-prompt and none can get a block).
    """
    bs, budget = snapshot["block_size"], snapshot["max_num_batched_tokens"]
    alive, waiting = list(snapshot["running"]), list(snapshot["waiting"])
    free, preempt = snapshot["free_blocks"], []

    def drop(entry):
        nonlocal free
        alive.remove(entry)
        free += entry["private_blocks"]
        preempt.append(entry["id"])

    while True:
        batch, left, room = {}, budget, free
        for entry in [e for e in alive if tokens_left(e) == 1]:        # decodes first
            while entry in alive and new_blocks(entry, 1, bs) > room:
                victim = alive[-1]
                drop(victim)
                room += victim["private_blocks"]
            if entry in alive:
                room -= new_blocks(entry, 1, bs)
                batch[entry["id"]] = 1
                left -= 1
        for entry in [e for e in alive if tokens_left(e) > 1]:         # unfinished prompts
            fits = (entry["blocks_held"] + room) * bs - entry["computed"]
            n = min(tokens_left(entry), left, fits)
            if n > 0:
                room -= new_blocks(entry, n, bs)
                batch[entry["id"]] = n
                left -= n
        count = len(alive)
        for entry in [] if preempt else waiting:   # admissions, FCFS (one preempted now heads the queue)
            if count >= snapshot["max_num_seqs"] or left <= 0:
                break
            n = min(tokens_left(entry), left)
            if new_blocks(entry, n, bs) > room:
                break
            room -= new_blocks(entry, n, bs)
            batch[entry["id"]] = n
            left -= n
            count += 1
        if batch or not alive:
            return {"batch": batch, "preempt": preempt}
        drop(alive[-1])


def cached_prefix(blocks: BlockManager, token_ids: list[int]) -> tuple[int, int]:
    """(leading tokens `allocate` would find cached, how many of those blocks are idle: held by
    no sequence, so counted among the free blocks and taken out of them when reused)."""
    if not blocks.enable_prefix_caching:
        return 0, 0
    from reference.prefix_cache import full_block_hashes
    found, idle = 0, 0
    for block_hash in full_block_hashes(token_ids, blocks.block_size)[:(len(token_ids) - 1) // blocks.block_size]:
        block_id = blocks.cache.lookup(block_hash)
        if block_id is None:
            break
        found += 1
        idle += blocks.cache.is_idle(block_id)
    return found * blocks.block_size, idle


class PolicyScheduler(Scheduler):
    """Continuous batching whose every decision comes from `policy(snapshot) -> decision`
    (plain data both ways; see `check_decision`). An illegal decision raises IllegalDecision
    and changes nothing. `clock` is the step number the snapshot reports (the caller may set
    it; it counts schedule() calls otherwise). No speculative decoding."""

    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: Callable[[dict], dict] = reference_policy):
        super().__init__(blocks, max_num_seqs, max_num_batched_tokens, "continuous")
        self.policy = policy
        self.clock = 0
        self.admitted_step: dict[str, int] = {}
        self.preempted: dict[str, int] = {}
        self.last_batch: list[tuple[Sequence, int]] = []
        self.last_fed: list[tuple[int, int]] = []
        self.last_running = 0

    def snapshot(self) -> dict:
        """This step's state as plain data (a fresh copy: the policy may keep or change it)."""
        blocks, refs = self.blocks, self.blocks.ref_count

        def arrival(seq):
            return int(seq.metrics.arrival_time)

        running = [{"id": s.request_id, "prompt_len": s.num_prompt_tokens,
                    "generated": s.num_tokens - s.num_prompt_tokens, "computed": s.num_computed,
                    "blocks_held": len(blocks.block_table(s.request_id)),
                    "private_blocks": sum(refs(b) == 1 for b in blocks.block_table(s.request_id)),
                    "arrival_step": arrival(s), "admitted_step": self.admitted_step[s.request_id]}
                   for s in self.running]
        waiting = []
        for s in self.waiting:
            cached, idle = cached_prefix(blocks, s.token_ids)
            waiting.append({"id": s.request_id, "prompt_len": s.num_prompt_tokens,
                            "generated": s.num_tokens - s.num_prompt_tokens, "cached_prefix_tokens": cached,
                            "cached_blocks_free": idle, "arrival_step": arrival(s),
                            "preemptions": self.preempted.get(s.request_id, 0)})
        return {"step": self.clock, "block_size": blocks.block_size,
                "free_blocks": blocks.num_free_blocks, "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "running": running, "waiting": waiting}

    def schedule(self) -> list[tuple[Sequence, int]]:
        self.block_copies, self.finished = [], []
        snap = self.snapshot()
        fed, preempt = check_decision(snap, self.policy(snap))
        self.clock += 1
        by_id = {s.request_id: s for s in [*self.running, *self.waiting]}
        for sid in preempt:
            self._preempt(by_id[sid])
            self.preempted[sid] = self.preempted.get(sid, 0) + 1
        cached = {e["id"]: e["cached_prefix_tokens"] for e in snap["waiting"]}
        order = {s.request_id: i for i, s in enumerate(self.running)}
        batch = []
        for sid, n in sorted(((sid, n) for sid, n in fed if sid in order), key=lambda x: order[x[0]]):
            n = self._reserve(by_id[sid], n)   # a legal decision always fits; never more than asked
            if n > 0:
                batch.append((by_id[sid], n))
        for sid, n in fed:
            if sid not in order:
                n = self._admit_one(by_id[sid], cached[sid], n, snap["step"])
                if n > 0:
                    batch.append((by_id[sid], n))
        self.last_batch = batch
        # (tokens fed, tokens already in the pool) per fed sequence: what the step costs
        self.last_fed = [(n, seq.num_computed) for seq, n in batch]
        self.last_running = len(self.running)   # slots taken once the decision is applied
        return batch

    def _admit_one(self, seq: Sequence, cached: int, n: int, step: int) -> int:
        """Admit seq feeding positions up to cached + n (its cached prefix as the snapshot saw
        it, or a longer one found now); returns how many tokens it is fed (0: not admitted)."""
        live = self.blocks.cached_prefix_tokens(seq.token_ids)
        end = min(live, cached) + n
        try:
            found = self.blocks.allocate(seq.request_id, seq.token_ids[:end])
        except OutOfBlocks:
            return 0
        self.waiting.remove(seq)
        self.prefix_queried_tokens += (seq.num_tokens - 1) // self.blocks.block_size * self.blocks.block_size
        self.prefix_hit_tokens += found
        if seq.metrics.first_token_time is None:
            seq.num_cached_tokens = found
        seq.num_computed = found
        seq.status = Status.RUNNING
        self.running.append(seq)
        self.admitted_step[seq.request_id] = step
        return end - found

    def release(self, seq: Sequence) -> None:
        super().release(seq)
        self.admitted_step.pop(seq.request_id, None)
