"""Fragmentation of a KV pool: the contiguous allocator against the paged one, on the same workload.

Both pools hold `num_slots` token slots. At each step we count
- live: slots holding a token of a running request;
- tail slack (internal fragmentation): slots held by a request but not (yet) used: the rest of a
  contiguous reservation, or the unfilled end of a request's last block (< block_size);
- holes (external fragmentation): free slots below the highest contiguous reservation, gaps left
  by finished requests (always 0 for the paged pool, where any free block serves any request);
- utilisation = live / num_slots.

`replay` applies explicit events (the chapter 08 walkthrough); `simulate` runs a workload of
requests step by step: each step every running request gains one token, finished requests free
their memory, and waiting requests are admitted in arrival order while they fit. When the paged
pool cannot grow a request, the youngest running request is preempted (its memory freed, to be
recomputed on readmission), as vLLM does; the contiguous pool never needs to, having reserved
every request's maximum length up front.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from reference.calculators.contiguous import ContiguousAllocator
from reference.calculators.memory import whole_number
from reference.paging import BlockManager


@dataclass(frozen=True)
class PoolStats:
    """Slot counts of one pool at one moment (see the module docstring)."""
    total: int
    live: int
    held: int
    tail_slack: int
    holes: int
    requests: int   # requests holding memory

    @property
    def free(self) -> int:
        return self.total - self.held

    @property
    def utilisation(self) -> float:
        return self.live / self.total


def _positive(name: str, value) -> int:
    """`value` as an int >= 1 (whole-number floats such as 4096.0 accepted); ValueError otherwise."""
    try:
        return whole_number(name, value, minimum=1)
    except TypeError as error:
        raise ValueError(str(error)) from None


class PagedPool:
    """`BlockManager` (no prefix caching) behind the interface `replay` and `simulate` drive."""

    def __init__(self, num_slots: int, block_size: int = 16):
        num_slots, block_size = (_positive(n, v) for n, v in (("num_slots", num_slots),
                                                              ("block_size", block_size)))
        if num_slots % block_size:
            raise ValueError(f"num_slots={num_slots} is not a multiple of block_size={block_size}")
        self.num_slots, self.block_size = num_slots, block_size
        self.manager = BlockManager(num_slots // block_size, block_size, enable_prefix_caching=False)
        self.requests: set = set()

    def admission_slots(self, n_tokens: int, max_len: int) -> int:
        """Slots a request must find free to start with `n_tokens` tokens: whole blocks only."""
        return self.manager.blocks_needed(n_tokens) * self.block_size

    def admit(self, req_id, n_tokens: int, max_len: int) -> bool:
        if not self.manager.can_allocate(n_tokens):
            return False
        self.manager.allocate(req_id, [0] * n_tokens)   # token ids matter only to prefix caching
        self.requests.add(req_id)
        return True

    def grow(self, req_id) -> bool:
        if not self.manager.can_append(req_id):
            return False
        self.manager.append_token(req_id, 0)
        return True

    def release(self, req_id) -> None:
        self.manager.free(req_id)
        self.requests.discard(req_id)

    def stats(self) -> PoolStats:
        held = (self.manager.num_blocks - self.manager.num_free_blocks) * self.block_size
        live = sum(self.manager.num_tokens(r) for r in self.requests)
        return PoolStats(self.num_slots, live, held, held - live, holes=0, requests=len(self.requests))


class ContiguousPool:
    """`ContiguousAllocator` behind the same interface: reserves max_len slots per request."""

    def __init__(self, num_slots: int):
        self.allocator = ContiguousAllocator(num_slots)
        self.num_slots = self.allocator.num_slots

    def admission_slots(self, n_tokens: int, max_len: int) -> int:
        return max_len

    def admit(self, req_id, n_tokens: int, max_len: int) -> bool:
        if not self.allocator.can_allocate(max_len):
            return False
        self.allocator.allocate(req_id, n_tokens, max_len)
        return True

    def grow(self, req_id) -> bool:
        self.allocator.append(req_id)
        return True

    def release(self, req_id) -> None:
        self.allocator.free(req_id)

    def stats(self) -> PoolStats:
        a = self.allocator
        return PoolStats(self.num_slots, a.live_tokens, a.reserved_slots,
                         a.reserved_slots - a.live_tokens, a.holes, len(a.regions))


# ----- explicit events ----------------------------------------------------------------------
class Arrive(NamedTuple):
    """A request starts with `prompt_len` tokens and may grow to `max_len` (what contiguous reserves)."""
    req_id: str
    prompt_len: int
    max_len: int


class Grow(NamedTuple):
    """A running request gains `n_tokens` tokens, one at a time."""
    req_id: str
    n_tokens: int


class Finish(NamedTuple):
    req_id: str


class ReplayStep(NamedTuple):
    title: str
    stats: PoolStats
    refused: tuple[str, ...]   # arrivals this pool could not admit


# The chapter 08 walkthrough: 64 slots, drawn as 16 blocks of 4 for the paged pool.
WALKTHROUGH_SLOTS, WALKTHROUGH_BLOCK_SIZE = 64, 4
WALKTHROUGH = [
    ("empty pool", []),
    ("A and B arrive", [Arrive("A", 7, 16), Arrive("B", 5, 24)]),
    ("A and B decode", [Grow("A", 3), Grow("B", 4)]),
    ("C arrives", [Arrive("C", 9, 20)]),
    ("A finishes", [Finish("A")]),
    ("D arrives", [Arrive("D", 14, 20)]),
]


def replay(steps, pool) -> list[ReplayStep]:
    """Apply each step's events to `pool`; return its stats and refused arrivals after every step."""
    records = []
    for title, events in steps:
        refused = []
        for event in events:
            if isinstance(event, Arrive):
                if not pool.admit(event.req_id, event.prompt_len, event.max_len):
                    refused.append(event.req_id)
            elif isinstance(event, Grow):
                for _ in range(event.n_tokens):
                    if not pool.grow(event.req_id):
                        raise RuntimeError(f"{title}: no room to grow {event.req_id!r}")
            elif isinstance(event, Finish):
                pool.release(event.req_id)
            else:
                raise TypeError(f"unknown event {event!r}")
        records.append(ReplayStep(title, pool.stats(), tuple(refused)))
    return records


# ----- workloads ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """Arrives at step `arrival` with `prompt_len` tokens, generates `output_len` <= `max_tokens`."""
    req_id: int
    arrival: int
    prompt_len: int
    output_len: int
    max_tokens: int


def random_workload(n_requests: int, seed: int, prompt_len: tuple[int, int] = (16, 128),
                    min_output: int = 8, pareto_alpha: float = 1.2, max_tokens: int = 512,
                    arrivals_per_step: float | None = None) -> list[Request]:
    """Seeded requests: uniform prompt lengths, Pareto(alpha) output lengths scaled by `min_output`
    and capped at `max_tokens`; all arriving at step 0, or a Poisson stream at the given rate."""
    rng, clock, requests = random.Random(seed), 0.0, []
    for i in range(n_requests):
        output = min(max_tokens, int(min_output * rng.paretovariate(pareto_alpha)))
        requests.append(Request(i, int(clock), rng.randint(*prompt_len), output, max_tokens))
        if arrivals_per_step:
            clock += rng.expovariate(arrivals_per_step)
    return requests


@dataclass
class SimResult:
    """Per-step pool stats and what happened to the requests."""
    stats: list[PoolStats] = field(default_factory=list)
    finish_step: dict[int, int] = field(default_factory=dict)
    preemptions: int = 0
    fragmentation_stalls: int = 0   # steps the head request waited although enough slots were free

    @property
    def steps(self) -> int:
        return len(self.stats)

    @property
    def mean_utilisation(self) -> float:
        return sum(s.utilisation for s in self.stats) / len(self.stats)

    def mean(self, name: str) -> float:
        """Mean over steps of one PoolStats field, e.g. mean("tail_slack")."""
        return sum(getattr(s, name) for s in self.stats) / len(self.stats)


def simulate(requests: list[Request], pool, max_steps: int = 1_000_000) -> SimResult:
    """Run `requests` through `pool` until all finish (see the module docstring for the rules)."""
    for r in requests:
        if not 1 <= r.output_len <= r.max_tokens or r.prompt_len < 1:
            raise ValueError(f"request {r.req_id}: need prompt_len >= 1 and 1 <= output_len <= max_tokens")
        if pool.admission_slots(r.prompt_len + r.output_len, r.prompt_len + r.max_tokens) > pool.num_slots:
            raise ValueError(f"request {r.req_id} can never fit in a pool of {pool.num_slots} slots")
    result, generated = SimResult(), {r.req_id: 0 for r in requests}
    waiting, running = deque(sorted(requests, key=lambda r: r.arrival)), []
    while waiting or running:
        if result.steps >= max_steps:
            raise RuntimeError(f"workload not finished after {max_steps} steps")
        step = result.steps
        for req in list(running):                       # oldest first: one token each
            if req not in running:
                continue                                # preempted earlier in this step
            while req in running and not pool.grow(req.req_id):
                victim = running.pop()                  # the youngest goes back to the queue
                pool.release(victim.req_id)
                waiting.appendleft(victim)
                result.preemptions += 1
            if req in running:
                generated[req.req_id] += 1
                if generated[req.req_id] == req.output_len:
                    pool.release(req.req_id)
                    running.remove(req)
                    result.finish_step[req.req_id] = step
        while waiting and waiting[0].arrival <= step:   # admit in arrival order while they fit
            head = waiting[0]
            n_tokens, max_len = head.prompt_len + generated[head.req_id], head.prompt_len + head.max_tokens
            if not pool.admit(head.req_id, n_tokens, max_len):
                result.fragmentation_stalls += pool.stats().free >= pool.admission_slots(n_tokens, max_len)
                break
            running.append(waiting.popleft())
        result.stats.append(pool.stats())
    return result


def main() -> None:
    """`python -m reference.calculators.fragmentation`: the walkthrough table, then one Pareto workload."""
    pools = {"contiguous": lambda n, b: ContiguousPool(n), "paged": PagedPool}
    print(f"walkthrough: {WALKTHROUGH_SLOTS} slots, paged as blocks of {WALKTHROUGH_BLOCK_SIZE}")
    for name, make in pools.items():
        for rec in replay(WALKTHROUGH, make(WALKTHROUGH_SLOTS, WALKTHROUGH_BLOCK_SIZE)):
            s = rec.stats
            print(f"  {name:10s} {rec.title:15s} live {s.live:2d}  held {s.held:2d}  tail slack {s.tail_slack:2d}"
                  f"  holes {s.holes:2d}  free {s.free:2d}  utilisation {s.utilisation:6.1%}"
                  + (f"  refused {', '.join(rec.refused)}" if rec.refused else ""))
    requests = random_workload(200, seed=0)
    print("\n200 requests at once (seed 0, Pareto outputs, max_tokens 512), 4096 slots, blocks of 16:")
    for name, make in pools.items():
        r = simulate(requests, make(4096, 16))
        print(f"  {name:10s} steps {r.steps:5d}  mean utilisation {r.mean_utilisation:6.1%}"
              f"  mean tail slack {r.mean('tail_slack'):7.1f}  mean holes {r.mean('holes'):6.1f}"
              f"  preemptions {r.preemptions:3d}  fragmentation stalls {r.fragmentation_stalls}")


if __name__ == "__main__":
    main()
