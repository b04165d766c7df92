"""Grader for exercises/ch08_paged_attention.ipynb.

``PagedKVCache`` is driven side by side with ``reference.paging.BlockManager`` (prefix caching
off) through the same seeded random operations; after every operation the grader compares what
both show (slots, free blocks, reference counts, copy-on-write pairs) up to a renaming of the
physical blocks, so any free-list order is accepted. ``fragmentation`` is compared with the
pools of ``reference.calculators.fragmentation`` replaying the same log (the chapter's 64-slot walkthrough
and random logs). The attention exercises are compared with attention computed in float64 in
this process over K/V gathered through the block table; when an answer is wrong the grader
computes the usual slips (reading past context_lens, forgetting `* block_size`, the wrong K/V
head) and names the one that matches. The Triton kernel runs under the grader's launcher with
its output poisoned with NaN, in the interpreter when there is no GPU, where its loads and stores
are counted: each program reads exactly the slots its block table names for positions below its
context length, each once, and stores its output row once (``kernel_rules.require_traffic``).
"""
from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():   # `pytest` on this file alone: the solution's kernel is
    os.environ.setdefault("TRITON_INTERPRET", "1")   # defined after this, in the interpreter

from autograder.boundary.causes import LearnerError
from autograder.rules.feedback import assert_close
from autograder.rules.gpu_targets import Build, planned, require_gpu_build
from autograder.rules.inputs import climbing_scores, generator, large_rows, randint
from autograder.rules.kernel_rules import require_tile_loop, require_traffic
from autograder.rules.plugin import exercise
from reference.attention import paged_attention
from reference.calculators.fragmentation import WALKTHROUGH, WALKTHROUGH_BLOCK_SIZE, WALKTHROUGH_SLOTS, \
    ContiguousPool, PagedPool
from reference.paging import BlockManager, OutOfBlocks

# torch's attention, and the quantizable MultiheadAttention's (bmm and softmax in Python, allowed
# operations), guarded on its class however a cell got one (torch.ao.quantization.prepare)
FORBIDDEN = ["torch.nn.functional.scaled_dot_product_attention",
             "torch.nn.functional.multi_head_attention_forward",
             "torch.nn.attention.flex_attention.flex_attention",
             "torch.ao.nn.quantizable.MultiheadAttention._forward_impl"]


# ------------------------------------------------------------------------------ PagedKVCache

class CachePair:
    """The learner's PagedKVCache and the reference BlockManager, driven by the same operations."""

    def __init__(self, learner, num_blocks: int, block_size: int):
        self.learner, self.num_blocks, self.block_size = learner, num_blocks, block_size
        self.mine = learner.new("PagedKVCache", num_blocks, block_size)
        self.ref = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.seqs: list[str] = []
        self.done: list[str] = []            # the operations so far, for the messages
        self.to_ref: dict[int, int] = {}     # learner block -> reference block, after each op

    def where(self) -> str:
        ops = "; ".join(self.done[-8:])
        return (f"PagedKVCache({self.num_blocks}, {self.block_size}) after "
                f"{'...; ' if len(self.done) > 8 else ''}{ops or 'nothing'}")

    def fail(self, message: str) -> None:
        raise AssertionError(f"{self.where()}: {message}")

    def mine_call(self, name: str, *args):
        try:
            return self.learner.method(self.mine, name, *args)
        except LearnerError as exc:
            self.fail(f"{name}{args!r} failed: {exc}")

    def do(self, name: str, *args):
        """One operation on both; a refusal (OutOfBlocks) must be a RuntimeError in the learner's."""
        call = f"{name}({', '.join(map(repr, args))})"
        ref_args = {"allocate": lambda s, n: (s, [0] * n), "append_token": lambda s: (s, 0)}
        ref_name = {"share_prefix": "fork", "release": "free"}.get(name, name)
        before = dict(self.to_ref)
        try:
            expected = getattr(self.ref, ref_name)(*ref_args.get(name, lambda *a: a)(*args))
        except OutOfBlocks:
            try:
                got = self.learner.method(self.mine, name, *args)
            except LearnerError as exc:
                if "raised RuntimeError:" not in str(exc):
                    self.fail(f"{call} should raise RuntimeError (too few free blocks); {exc}")
            else:
                self.fail(f"{call} returned {got!r} but needs a block and only "
                          f"{self.ref.num_free_blocks} are free: raise RuntimeError")
            self.done.append(f"{call} (refused)")
            self.compare(hint="a refused operation must leave the cache exactly as it was: "
                              "check that enough blocks are free before changing anything")
            return
        self.done.append(call)
        got = self.mine_call(name, *args)
        if name == "append_token":
            self.check_copy(call, got, expected, before)
        if name in ("allocate", "share_prefix"):
            self.seqs.append(args[0] if name == "allocate" else args[1])
        if name == "release":
            self.seqs.remove(args[0])
        self.compare(hint={"allocate": "allocate takes ceil(n_tokens / block_size) free blocks",
                           "append_token": "append_token takes a block only when the tail block is "
                           "full, or to copy a shared partial tail (copy-on-write)",
                           "share_prefix": "share_prefix takes no block: the child points at the "
                           "parent's blocks and each of their refcounts goes up by one",
                           "release": "release gives back only the blocks whose refcount drops to "
                           "0; blocks another sequence still holds stay taken"}[name])
        if name == "append_token" and expected is not None and self.to_ref.get(got[1]) != expected[1]:
            self.fail(f"{call} returned {tuple(got)}, but the sequence's tail is now another "
                      "block: dst must be the block the sequence moved to")

    def check_copy(self, call: str, got, expected, before: dict) -> None:
        if expected is None and got is not None:
            self.fail(f"{call} returned {got!r}; no copy is needed here (None): the tail block is "
                      "full, so a new block starts, or this sequence alone holds its tail")
        if expected is not None:
            if got is None:
                self.fail(f"{call} returned None, but the sequence's partial tail block is shared "
                          "(refcount 2 or more): copy-on-write must move this sequence to a free "
                          "block dst, drop src's refcount by one and return (src, dst) for the "
                          "caller to copy; writing into the shared block would corrupt the other "
                          "sequence's cache")
            if not (isinstance(got, (tuple, list)) and len(got) == 2
                    and all(isinstance(b, int) for b in got)):
                self.fail(f"{call} returned {got!r:.80}; return a pair (src, dst) of block ids")
            if before.get(got[0]) != expected[0]:
                self.fail(f"{call} returned {tuple(got)}: src must be the shared tail block the "
                          "sequence held before the append")

    def slot(self, seq: str, position: int) -> int:
        got = self.mine_call("slot", seq, position)
        if isinstance(got, bool) or not isinstance(got, int):
            self.fail(f"slot({seq!r}, {position}) returned {got!r:.60}; it must be an int")
        if got % self.block_size != position % self.block_size:
            self.fail(f"slot({seq!r}, {position}) = {got} is at offset {got % self.block_size} of "
                      f"its block; position {position} sits at offset {position % self.block_size}"
                      ": slot = table[position // block_size] * block_size + position % block_size")
        return got

    def compare(self, hint: str, every_slot: bool = False) -> None:
        """Block tables (read through slot) map one-to-one onto the reference's; refcounts and
        the free count agree; with every_slot, every position and every block's refcount."""
        to_ref, from_ref, owner = {}, {}, {}
        bs = self.block_size
        for seq in self.seqs:
            n, table = self.ref.num_tokens(seq), self.ref.block_table(seq)
            mine = {}
            for p in range(n) if every_slot else [*range(0, n, bs), n - 1]:
                block = self.slot(seq, p) // bs
                if mine.setdefault(p // bs, block) != block:
                    self.fail(f"positions {p // bs * bs} and {p} of {seq!r} share a logical block "
                              f"but slot() puts them in blocks {mine[p // bs]} and {block}")
            for i, block in mine.items():
                if not 0 <= block < self.num_blocks:
                    self.fail(f"slot({seq!r}, {i * bs}) lies in block {block}, outside the pool")
                ref_block = table[i]
                if to_ref.setdefault(block, ref_block) != ref_block:
                    self.fail(f"sequences {owner[block]} and {(seq, i)} (sequence, logical block) "
                              f"both use block {block}, but they must not share it. {hint}")
                if from_ref.setdefault(ref_block, block) != block:
                    self.fail(f"logical block {i} of {seq!r} is block {block}, yet it should be "
                              f"the block {from_ref[ref_block]} that another sequence holds "
                              "(share_prefix shares every block of the parent)")
                owner.setdefault(block, (seq, i))
        for block, ref_block in to_ref.items():
            got, want = self.mine_call("ref_count", block), self.ref.ref_count(ref_block)
            if got == 0:
                seq, i = owner[block]
                self.fail(f"slot({seq!r}, {i * bs}) points into block {block}, yet ref_count({block})"
                          " is 0: slot must read the sequence's block table, and every block a "
                          "table holds has a refcount of at least 1")
            if got != want:
                self.fail(f"ref_count({block}) is {got!r}, expected {want} (the number of "
                          f"sequences whose block table holds it). {hint}")
        free = self.learner.getattr(self.mine, "num_free_blocks")
        if isinstance(free, bool) or not isinstance(free, int):
            self.fail(f"num_free_blocks is {free!r:.60}; it must be an int (a @property)")
        if free != self.ref.num_free_blocks:
            self.fail(f"num_free_blocks is {free!r}, expected {self.ref.num_free_blocks} "
                      f"({len(to_ref)} blocks held of {self.num_blocks}). {hint}")
        if every_slot:
            for block in set(range(self.num_blocks)) - set(to_ref):
                if self.mine_call("ref_count", block) != 0:
                    self.fail(f"block {block} is held by no sequence but its refcount is not 0: "
                              "a leak (it can never be freed)")
        self.to_ref = to_ref


def _session(pair: CachePair, gen, steps: int, share: bool) -> None:
    """Seeded random operations: allocate, append (often), share_prefix (if share), release."""
    made = len(pair.seqs)
    for _ in range(steps):
        choice = randint(gen, 0, 9)
        live = pair.seqs
        pick = (lambda: live[randint(gen, 0, len(live) - 1)])  # noqa: E731
        if not live or choice < 2:
            pair.do("allocate", f"s{made}", randint(gen, 1, 3 * pair.block_size))
            made += 1
        elif choice < (6 if share else 7):
            pair.do("append_token", pick())
        elif share and choice < 8:
            pair.do("share_prefix", pick(), f"s{made}")
            made += 1
        else:
            pair.do("release", pick())
    pair.compare(hint="every block is free, or held by the sequences whose tables name it",
                 every_slot=True)
    for seq in list(pair.seqs):
        pair.do("release", seq)
    pair.compare(hint="once every sequence is released, every block is free again", every_slot=True)


@exercise("PagedKVCache", points=6)
def test_paged_cache_allocate_append_release_follow_the_block_manager(learner, seed):
    gen = generator(seed)
    _session(CachePair(learner, randint(gen, 8, 12), randint(gen, 2, 4)), gen, 30, share=False)


@exercise("PagedKVCache", points=6)
def test_paged_cache_share_prefix_and_copy_on_write(learner, seed):
    gen = generator(seed + 1)
    bs = randint(gen, 2, 4)
    pair = CachePair(learner, randint(gen, 10, 14), bs)
    pair.do("allocate", "parent", bs * randint(gen, 1, 2) + randint(gen, 1, bs - 1))
    pair.do("share_prefix", "parent", "child")
    pair.do("append_token", "child")      # the shared partial tail is copied ...
    pair.do("append_token", "parent")     # ... and the parent now holds its tail alone
    pair.do("share_prefix", "child", "grandchild")
    _session(pair, gen, 30, share=True)


@exercise("PagedKVCache", points=6)
def test_paged_cache_refuses_when_blocks_run_out_and_changes_nothing(learner, seed):
    gen = generator(seed + 2)
    bs = randint(gen, 2, 4)
    pair = CachePair(learner, 5, bs)
    pair.do("allocate", "a", 2 * bs)
    pair.do("allocate", "b", bs + 1)
    pair.do("allocate", "c", bs + randint(gen, 1, bs))     # 2 blocks needed, 1 free
    pair.do("share_prefix", "b", "b2")                       # sharing needs no block
    pair.do("allocate", "d", randint(gen, 1, bs))           # the last free block
    pair.do("append_token", "a")                             # full tail, no free block
    pair.do("append_token", "b2")                            # shared partial tail, no free block
    pair.do("release", "b")
    pair.do("append_token", "b2")                            # b2 owns its tail now: no copy
    _session(pair, gen, 12, share=True)


@exercise("PagedKVCache", points=6)
def test_paged_cache_rejects_bad_requests_with_value_error(learner, seed):
    gen = generator(seed + 3)
    bs = randint(gen, 2, 4)
    pair = CachePair(learner, 8, bs)
    pair.do("allocate", "a", bs + 1)
    cases = [("allocate", ("a", 1), "a sequence id that already exists"),
             ("allocate", ("z", 0), "n_tokens = 0"),
             ("append_token", ("nobody",), "an unknown sequence"),
             ("release", ("nobody",), "an unknown sequence"),
             ("share_prefix", ("nobody", "z"), "an unknown parent"),
             ("share_prefix", ("a", "a"), "a child id that already exists"),
             ("slot", ("a", bs + 1), "a position past the sequence's last token")]
    for name, args, why in cases:
        try:
            got = learner.method(pair.mine, name, *args)
        except LearnerError as exc:
            if "raised ValueError:" not in str(exc):
                pair.fail(f"{name}{args!r} should raise ValueError ({why}); {exc}")
        else:
            pair.fail(f"{name}{args!r} returned {got!r:.60}; it should raise ValueError ({why})")
        pair.compare(hint=f"a rejected {name} must change nothing")


# ------------------------------------------------------------------------------ fragmentation

STAT_HINTS = {
    "live": "live counts the tokens of the requests a pool holds (prompt plus growth); events "
            "naming a request that pool refused are ignored",
    "tail_slack": "tail slack is held minus live: the unused end of each contiguous reservation "
                  "(max_len - tokens), or of each request's last block in the paged pool",
    "holes": "holes are the free slots below the end of the highest contiguous reservation (gaps "
             "left by finished requests); the paged pool has none",
    "free": "free is num_slots minus the slots held (reserved runs, or whole blocks)",
    "utilisation": "utilisation is live / num_slots",
    "refused": "the contiguous pool needs ONE free run of max_len slots, first fit from the "
               "lowest address; the paged pool needs ceil(prompt_len / block_size) free blocks "
               "anywhere",
}


def _reference_stats(events: list, num_slots: int, block_size: int) -> dict:
    """Both reference pools after replaying `events` (a pool ignores requests it refused)."""
    out = {}
    for name, pool in (("contiguous", ContiguousPool(num_slots)),
                       ("paged", PagedPool(num_slots, block_size))):
        held, refused = set(), []
        for kind, req, *rest in events:
            if kind == "arrive":
                (held.add if pool.admit(req, *rest) else refused.append)(req)
            elif req in held and kind == "grow":
                if not all(pool.grow(req) for _ in range(rest[0])):
                    raise RuntimeError(f"{name} pool cannot grow {req!r}")   # the log avoids it
            elif req in held:
                pool.release(req)
                held.discard(req)
        s = pool.stats()
        out[name] = {"live": s.live, "tail_slack": s.tail_slack, "holes": s.holes,
                     "free": s.free, "utilisation": s.utilisation, "refused": refused}
    return out


def _random_log(gen, num_slots: int, block_size: int, n_events: int) -> list:
    """A seeded log whose grows always fit (max_len in the contiguous pool, a block in the paged)."""
    events, tokens, made = [], {}, 0
    while len(events) < n_events:
        choice = randint(gen, 0, 9)
        if not tokens or choice < 4:
            prompt = randint(gen, 1, num_slots // 4)
            event = ("arrive", f"r{made}", prompt, prompt + randint(gen, 0, num_slots // 3))
            made += 1
        else:
            req = sorted(tokens)[randint(gen, 0, len(tokens) - 1)]
            room = tokens[req][1] - tokens[req][0]
            event = ("grow", req, randint(gen, 1, room)) if choice < 8 and room else ("finish", req)
        try:
            _reference_stats(events + [event], num_slots, block_size)
        except RuntimeError:
            continue
        events.append(event)
        if event[0] == "arrive":
            tokens[event[1]] = [event[2], event[3]]
        elif event[0] == "grow":
            tokens[event[1]][0] += event[2]
        else:
            del tokens[event[1]]
    return events


def _check_log(learner, events: list, num_slots: int, block_size: int) -> None:
    """The stats after every event of a random log, as the walkthrough is checked stage by stage:
    the state after the last event alone may not tell the pools' sizes apart (a log whose
    requests have all finished looks the same in blocks of 4 and of 8)."""
    for n in range(1, len(events) + 1):
        _check_fragmentation(learner, events[:n], num_slots, block_size,
                             f"the first {n} of {len(events)} events")


def _check_fragmentation(learner, events: list, num_slots: int, block_size: int, what: str):
    call = f"fragmentation(<{what}>, num_slots={num_slots}, block_size={block_size})"
    got = learner.call("fragmentation", events, num_slots, block_size)
    want = _reference_stats(events, num_slots, block_size)
    if not (isinstance(got, dict) and all(isinstance(got.get(p), dict) for p in want)):
        raise AssertionError(f"{call} returned {got!r:.100}; return a dict with keys "
                             "'contiguous' and 'paged', each a dict of the stats")
    for pool, stats in want.items():
        for key in ("refused", "live", "tail_slack", "holes", "free", "utilisation"):
            value, mine = stats[key], got[pool].get(key)
            mine = list(mine) if isinstance(mine, (list, tuple)) else mine
            same = (isinstance(mine, (int, float)) and not isinstance(mine, bool)
                    and abs(mine - value) < 1e-9) if key == "utilisation" else mine == value
            if not same:
                raise AssertionError(f"{call}: {pool} {key} is {mine!r:.60}, expected {value!r}. "
                                     f"Hint: {STAT_HINTS[key]}.\nThe log: {events}")


@exercise("fragmentation", points=4)
def test_fragmentation_on_the_chapter_walkthrough(learner, seed):
    log = []
    for title, events in WALKTHROUGH:
        log += [(type(e).__name__.lower(), *e) for e in events]
        _check_fragmentation(learner, list(log), WALKTHROUGH_SLOTS, WALKTHROUGH_BLOCK_SIZE,
                             f"walkthrough up to '{title}'")
    gen = generator(seed + 5)   # and a fresh log: the walkthrough's numbers alone earn nothing
    block_size = 2 * WALKTHROUGH_BLOCK_SIZE          # a pool unlike the walkthrough's in both sizes
    num_slots = block_size * randint(gen, WALKTHROUGH_SLOTS // block_size + 1, 16)
    events = _random_log(gen, num_slots, block_size, randint(gen, 10, 18))
    _check_log(learner, events, num_slots, block_size)


@exercise("fragmentation", points=4)
def test_fragmentation_on_random_logs(learner, seed):
    gen = generator(seed + 4)
    # both block sizes at every seed, and a pool unlike the walkthrough's in both sizes: an answer
    # right only for the walkthrough's blocks of 4 (or its 64 slots) earns nothing here either
    block_sizes = [WALKTHROUGH_BLOCK_SIZE, 2 * WALKTHROUGH_BLOCK_SIZE, (4, 8)[randint(gen, 0, 1)]]
    for i in torch.randperm(len(block_sizes), generator=gen).tolist():
        block_size = block_sizes[i]
        num_slots = block_size * randint(gen, 8, 16)
        if block_size != WALKTHROUGH_BLOCK_SIZE and num_slots == WALKTHROUGH_SLOTS:
            num_slots += block_size
        events = _random_log(gen, num_slots, block_size, randint(gen, 10, 18))
        _check_log(learner, events, num_slots, block_size)


# ------------------------------------------------------------------ paged attention (both)

def _paged_inputs(gen, batch, n_q_heads, n_kv_heads, head_dim, block_size, share: bool,
                  large: bool = False):
    """q [B, Hq, D]; a pool [num_blocks, block_size, Hkv, D] per K and V whose slots outside
    every context hold large values; block tables (shuffled blocks, -1 padded, with sequence 1
    sharing sequence 0's first block when `share`) and context lengths, one ending on a block
    boundary and one mid-block. ``large``: each row's scores sit near +-1000 and climb or fall
    by 32 per position of its sequence (``climbing_scores``)."""
    lens = [randint(gen, 1, 5 * block_size) for _ in range(batch)]
    lens[0] = block_size * randint(gen, 2, 3)
    lens[-1] = block_size * randint(gen, 1, 3) + randint(gen, 1, block_size - 1)
    counts = [-(-n // block_size) for n in lens]
    num_blocks = sum(counts) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((batch, max(counts) + 1), -1, dtype=torch.int32)
    for b, count in enumerate(counts):
        tables[b, :count] = torch.tensor(order[:count])
        order = order[count:]
    if share:
        tables[1, 0] = tables[0, 0]
    shape = (num_blocks, block_size, n_kv_heads, head_dim)
    k_cache, v_cache = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(2))
    visible = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    for b, n in enumerate(lens):
        visible[_slots(tables[b], n, block_size)] = True
    for cache in (k_cache, v_cache):
        flat = cache.view(num_blocks * block_size, -1)
        flat[~visible] = 6 * torch.randn(flat[~visible].shape, generator=gen, dtype=torch.float64) + 3
    q = torch.randn(batch, n_q_heads, head_dim, generator=gen, dtype=torch.float64)
    if large:
        position = torch.zeros(num_blocks * block_size)
        for b, n in enumerate(lens):
            position[_slots(tables[b], n, block_size)] = torch.arange(n, dtype=position.dtype)
        rows = (batch, n_q_heads)
        offsets, directions = large_rows(gen, rows)
        k_slots = k_cache.view(num_blocks * block_size, n_kv_heads, head_dim)
        q, climbing = climbing_scores(q, k_slots, position[:, None], offsets, directions)
        k_slots[visible] = climbing[visible].double()
    return q.float(), k_cache.float(), v_cache.float(), tables, torch.tensor(lens, dtype=torch.int32)


def _slots(table, n: int, block_size: int) -> torch.Tensor:
    positions = torch.arange(n)
    return table.long()[positions // block_size] * block_size + positions % block_size


def _attention(q, k_cache, v_cache, tables, lens) -> torch.Tensor:
    """reference.attention.paged_attention in float64, one query per sequence -> [B, Hq, D]."""
    return paged_attention(q.double(), k_cache.double(), v_cache.double(), tables, lens,
                           [1] * q.shape[0])


def _without_block_size(cache: torch.Tensor) -> torch.Tensor:
    """A pool whose block i holds flat slots i .. i + block_size - 1: reading it through the
    real tables is the slip slot = block + offset (no `* block_size`)."""
    num_blocks, block_size = cache.shape[:2]
    flat = cache.reshape(num_blocks * block_size, -1)
    return flat.unfold(0, block_size, 1)[:num_blocks].transpose(1, 2).reshape(cache.shape)


def _check_paged(got, q, k_cache, v_cache, tables, lens, call: str, rtol: float = 1e-4) -> None:
    expected = _attention(q, k_cache, v_cache, tables, lens)
    block_size = k_cache.shape[1]
    whole_blocks = torch.tensor([int((t >= 0).sum()) * block_size for t in tables])
    group = q.shape[1] // k_cache.shape[2]
    by_modulo = [c.repeat(1, 1, group, 1) for c in (k_cache, v_cache)]   # head h reads h % Hkv
    slips = [(_attention(q, k_cache, v_cache, tables, whole_blocks),
              "every slot of the sequence's blocks was read; only positions 0 .. "
              "context_lens[b] - 1 hold its keys: the rest of the last block is garbage or "
              "another sequence's, leave it out (mask it in a kernel)"),
             (_attention(q, *map(_without_block_size, (k_cache, v_cache)), tables, lens),
              "the slot is block_tables[b, p // block_size] * block_size + p % block_size: the "
              "block id counts blocks, not slots, so multiply it by block_size"),
             (_attention(q, *by_modulo, tables, lens),
              "query head h reads K/V head h // (Hq // Hkv), not h % Hkv (which is what "
              "repeat() gives; repeat_interleave gives h // group)")]
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and got.is_floating_point() \
            and not torch.allclose(got.double(), expected, rtol=rtol, atol=1e-5):
        for wrong, advice in slips:
            if torch.allclose(got.double(), wrong, rtol=rtol, atol=1e-5):
                raise AssertionError(f"{call}: {advice}")
    assert_close(got, expected, name=call, rtol=rtol, atol=1e-5,
                 hint="gather sequence b's keys and values at the slots of positions 0 .. "
                      "context_lens[b] - 1, then softmax(q k^T / sqrt(D)) v")


def _gather_case(learner, gen, batch, heads, kv_heads, dim, block_size, share):
    inputs = _paged_inputs(gen, batch, heads, kv_heads, dim, block_size, share)
    call = (f"paged_attention_gather(q [{batch}, {heads}, {dim}], pool of {inputs[1].shape[0]} "
            f"blocks of {block_size} with {kv_heads} K/V heads, context_lens "
            f"{inputs[4].tolist()})")
    _check_paged(learner.call("paged_attention_gather", *inputs), *inputs, call)


@exercise("paged_attention_gather", points=5, forbid=FORBIDDEN)
def test_gather_reads_through_the_block_table(learner, seed):
    gen = generator(seed + 5)
    _gather_case(learner, gen, 3, 4, 2, 8, randint(gen, 2, 4), share=False)


@exercise("paged_attention_gather", points=5, forbid=FORBIDDEN)
def test_gather_with_a_shared_block_and_groups_of_three(learner, seed):
    gen = generator(seed + 6)
    _gather_case(learner, gen, 4, 6, 2, 16, 8, share=True)


# ------------------------------------------------------------------------ paged_decode_kernel

def _without_output_rescale(q, k_cache, v_cache, tables, lens) -> torch.Tensor:
    """The kernel's online softmax in float64 with the slip o = o + p v (the output is never
    multiplied by exp(m_old - m_new) when a block raises the max; l is)."""
    block_size, n_kv_heads, dim = k_cache.shape[1:]
    group = q.shape[1] // n_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b, n in enumerate(lens.tolist()):
        keys, values = (c.double().reshape(-1, n_kv_heads, dim)[_slots(tables[b], n, block_size)]
                        for c in (k_cache, v_cache))
        for h in range(q.shape[1]):
            m, total, o = float("-inf"), 0.0, torch.zeros(dim, dtype=torch.float64)
            for start in range(0, n, block_size):
                k, v = keys[start:start + block_size, h // group], values[start:start + block_size, h // group]
                scores = k @ q[b, h].double() / math.sqrt(dim)
                m_new = max(m, float(scores.max()))
                p = torch.exp(scores - m_new)
                total = total * math.exp(m - m_new) + float(p.sum())
                o, m = o + p @ v, m_new
            out[b, h] = o / total
    return out


def _require_named_blocks(learner, k_cache, tables, lens, group: int) -> None:
    """PrerequisiteFailed unless the launch read each K/V slot of position p < context_lens[b]
    through sequence b's block table once per query head of the group, and nothing else."""
    block_size = k_cache.shape[1]
    named = torch.zeros(k_cache.shape[:2], dtype=torch.int32)
    for table, n in zip(tables, lens.tolist()):
        slots = _slots(table, n, block_size)
        named.view(-1).index_put_((slots,), torch.tensor(group, dtype=torch.int32), accumulate=True)
    allowed = named[:, :, None, None].expand(k_cache.shape)
    advice = ("a program walks its block table once, loading the slots of positions 0 .. "
              "context_len - 1 (mask the rest of the last block in the load, not only in the "
              "scores), one block at a time, with a running max, sum and output")
    require_traffic(learner, "paged_decode_kernel", rule="read only the blocks the table names, once",
                    reads={"K": (1, allowed, "per query head", advice),
                           "V": (2, allowed, "per query head", advice)},
                    outputs={"out": 3},
                    tiles={name: (block_size * k_cache.shape[-1], f"one block: BLOCK_SIZE="
                                  f"{block_size} slots of HEAD_DIM={k_cache.shape[-1]}")
                           for name in ("K", "V")})


def _kernel_case(learner, gen, batch, heads, kv_heads, dim, block_size, share, large=False):
    """One launch; ``large``: scores in the thousands, far beyond where exp overflows and
    underflows in float32 and float64 alike: a kernel without a running max fails."""
    q, k_cache, v_cache, tables, lens = _paged_inputs(gen, batch, heads, kv_heads, dim,
                                                      block_size, share, large)
    rtol = 1e-3 if large else 1e-4   # fp32 scores in the thousands: ~1e-4 absolute
    call = (f"paged_decode_kernel on q [{batch}, {heads}, {dim}], blocks of {block_size} with "
            f"{kv_heads} K/V heads, context_lens {lens.tolist()}"
            + (", scores in the thousands, climbing or falling by 32 per key" if large else ""))
    require_tile_loop(learner, "paged_decode_kernel", "BLOCK_SIZE",
                      "Work on whole blocks: one loop over the sequence's blocks, e.g. range(0, "
                      "tl.cdiv(context_len, BLOCK_SIZE)), each iteration loading a [BLOCK_SIZE, "
                      "HEAD_DIM] tile with tl.arange offsets")
    out = torch.full_like(q, float("nan"))
    args = learner.launch("paged_decode_kernel", (batch * heads,), q, k_cache, v_cache, out,
                          tables, lens, heads, kv_heads, tables.shape[1], 1 / math.sqrt(dim),
                          BLOCK_SIZE=block_size, HEAD_DIM=dim)
    got = args[3]
    if large and not torch.isfinite(got).all():
        raise AssertionError(f"{call}: out is inf or NaN on scores in the thousands: exp of a raw "
                             "score above ~88 overflows float32 (~709 in float64). Keep a running "
                             "max m over the blocks and take exp(s - m); when a block raises it, "
                             "rescale l and o by exp(m_old - m_new)")
    if torch.isnan(got).any():
        raise AssertionError(f"{call}: out still holds NaN where the grader poisoned it: every "
                             "program must store its row o / l (and never compute inf - inf)")
    if torch.allclose(got.double(), _without_output_rescale(q, k_cache, v_cache, tables, lens),
                      rtol=rtol, atol=1e-5) and not torch.allclose(
                          got.double(), _attention(q, k_cache, v_cache, tables, lens),
                          rtol=rtol, atol=1e-5):
        raise AssertionError(f"{call}: when a block raises the running max from m_old to m_new, "
                             "multiply both l and the output o by exp(m_old - m_new) before "
                             "adding the block's terms; o was not rescaled")
    _check_paged(got, q, k_cache, v_cache, tables, lens, call, rtol)
    _require_named_blocks(learner, k_cache, tables, lens, heads // kv_heads)


@exercise("paged_decode_kernel", points=5, timeout=120)
def test_paged_kernel_with_gqa_and_partial_last_blocks(learner, seed):
    gen = generator(seed + 7)
    _kernel_case(learner, gen, 3, 4, 2, 16, 4, share=False)
    _kernel_case(learner, gen, 3, 4, 2, 16, 4, share=False, large=True)


@exercise("paged_decode_kernel", points=5, timeout=120)
def test_paged_kernel_with_a_shared_block_and_groups_of_three(learner, seed):
    gen = generator(seed + 8)
    _kernel_case(learner, gen, 2, 6, 2, 32, 8, share=True)


def _paged_build(label: str, dim: int, block_size: int) -> Build:
    """A launch like the tests' (3 sequences, 6 query heads on 2 K/V heads, tables of 10), fp32."""
    q, cache = torch.empty(3, 6, dim), torch.empty(40, block_size, 2, dim)
    tables, lens = torch.empty(3, 10, dtype=torch.int32), torch.empty(3, dtype=torch.int32)
    return Build(label, (q, cache, cache, q, tables, lens, 6, 2, 10, dim ** -0.5),
                 {"BLOCK_SIZE": block_size, "HEAD_DIM": dim})


PAGED_BUILDS = planned("paged_decode_kernel", [
    _paged_build("grader: fp32 D=16, blocks of 4", 16, 4),
    _paged_build("grader: fp32 D=32, blocks of 8", 32, 8),
    _paged_build("GPU tile: fp32 D=128, blocks of 16", 128, 16)])
PAGED_BUILD_ADVICE = ("A program holds one block's K and V [BLOCK_SIZE, HEAD_DIM] and its running o [HEAD_DIM] "
                      "at a time. Load one block of keys and values per step, through the block table")


@exercise("paged_decode_kernel", points=5, timeout=120, costly=True)
def test_paged_kernel_compiles_for_a_real_gpu(learner, seed):
    """Built (not run) for a T4, an A100 and an H100 at the tests' blocks and at a GPU-sized one:
    it must compile and fit one of them; the report shows shared memory, registers and spills."""
    require_gpu_build(learner, "paged_decode_kernel", PAGED_BUILDS, PAGED_BUILD_ADVICE)
