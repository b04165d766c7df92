"""Request traces replayed through the engine under a scheduling policy (chapter 12).

A trace is a list of requests with arrival times, drawn from a seeded distribution of one of five
kinds. Time is counted by a step-cost clock (`reference.engine.step_cost.StepClock`): each
engine step lasts what chapter 04's roofline says it costs serving SmolLM2-135M on an A100, in
units of one decode step (one read of the weights), so a step that carries a long prompt chunk
lasts longer than one that only decodes.

* "steady": requests arrive one every few steps, short and long replies mixed;
* "bursty": bursts of requests arrive at once, with quiet steps between them;
* "shared_prefix": every prompt starts with one long system prompt (longer than the token
  budget, so it is chunked), which the prefix cache lets later requests share;
* "small_pool": the K/V pool holds any one request but not all that run together, so a
  scheduler must preempt;
* "long_prompt": short chats with long documents among them, and a token budget above the
  ridge point, so a step that feeds a whole chunk costs more than a decode step.

`replay(trace, policy)` serves the trace with the real engine (`LLMEngine`, its block pool, the
tiny model) whose scheduler is a `PolicyScheduler` asking `policy(snapshot) -> decision` at every
step. It records each request's reply and the steps and clock times of its first and last
tokens, a timeline (sequences in the batch, blocks in use after the step, tokens fed, the step's
cost), the preemptions, the block pool's invariants after every step, and the first error: an
illegal decision (the rule, the step), a policy that raised, a stall (nothing fed for
`stall_steps` steps while requests wait) or the step limit. `service_levels` turns a replay into
throughput and TTFT / TPOT / inter-token latency percentiles on that clock, and `service_costs`
and `balance` weigh them against the course's scheduler on the same trace.
"""
from __future__ import annotations

import contextlib
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from reference.calculators.batching_sim import percentile
from reference.engine.llm import LLMEngine
from reference.engine.params import SamplingParams
from reference.engine.scheduler import IllegalDecision, PolicyScheduler, reference_policy
from reference.engine.step_cost import StepClock
from reference.paging import BlockManager

TRACE_KINDS = ("steady", "bursty", "shared_prefix", "small_pool", "long_prompt")
VOCAB = 256   # the tiny model's (and the byte tokenizer's) vocabulary


@dataclass
class Trace:
    """Requests ({"id", "arrival" (clock time, in decode steps), "prompt_ids", "max_tokens"}, by
    arrival) and the engine's knobs for this trace."""
    kind: str
    requests: list[dict]
    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int

    def describe(self) -> str:
        prompts = [len(r["prompt_ids"]) for r in self.requests]
        replies = [r["max_tokens"] for r in self.requests]
        return (f"{self.kind}: {len(self.requests)} requests arriving at times "
                f"{self.requests[0]['arrival']}..{self.requests[-1]['arrival']}, prompts "
                f"{min(prompts)}-{max(prompts)} tokens, replies {min(replies)}-{max(replies)}; "
                f"max_num_seqs={self.max_num_seqs}, max_num_batched_tokens="
                f"{self.max_num_batched_tokens}, {self.num_blocks} blocks of {self.block_size}")


def make_trace(kind: str, seed: int) -> Trace:
    """A fresh trace of `kind` (one of TRACE_KINDS) drawn from random.Random(seed)."""
    rng = random.Random(f"{kind}:{seed}")

    def ids(n):
        return [rng.randrange(1, VOCAB) for _ in range(n)]

    def reply():   # most replies short, some long: slots free up at different steps
        return rng.randint(3, 7) if rng.random() < 0.65 else rng.randint(12, 20)

    requests = []
    if kind == "steady":
        step = 0
        for _ in range(rng.randint(10, 12)):
            requests.append({"arrival": step, "prompt_ids": ids(rng.randint(6, 40)), "max_tokens": reply()})
            step += rng.randint(1, 3)
        knobs = dict(block_size=4, num_blocks=96, max_num_seqs=4, max_num_batched_tokens=32)
    elif kind == "bursty":
        step = 0
        for _ in range(3):
            for _ in range(rng.randint(4, 5)):
                requests.append({"arrival": step, "prompt_ids": ids(rng.randint(6, 40)), "max_tokens": reply()})
            step += rng.randint(12, 18)
        knobs = dict(block_size=4, num_blocks=96, max_num_seqs=4, max_num_batched_tokens=32)
    elif kind == "shared_prefix":
        system, step = ids(rng.randint(36, 52)), 0
        for _ in range(rng.randint(9, 11)):
            requests.append({"arrival": step, "prompt_ids": system + ids(rng.randint(3, 10)),
                             "max_tokens": reply()})
            step += rng.randint(1, 3)
        knobs = dict(block_size=4, num_blocks=96, max_num_seqs=4, max_num_batched_tokens=24)
    elif kind == "small_pool":
        step = 0
        for _ in range(2):
            for _ in range(rng.randint(4, 5)):
                requests.append({"arrival": step, "prompt_ids": ids(rng.randint(8, 24)),
                                 "max_tokens": rng.randint(14, 24)})
            step += rng.randint(6, 10)
        longest = max(len(r["prompt_ids"]) + r["max_tokens"] for r in requests)
        knobs = dict(block_size=4, num_blocks=-(-longest // 4) + rng.randint(3, 6), max_num_seqs=4,
                     max_num_batched_tokens=32)
    elif kind == "long_prompt":
        step, n = 0, rng.randint(10, 12)
        documents = set(rng.sample(range(1, n), 3))   # a long prompt never comes first
        for i in range(n):
            size = rng.randint(150, 450) if i in documents else rng.randint(6, 30)
            requests.append({"arrival": step, "prompt_ids": ids(size), "max_tokens": reply()})
            step += rng.randint(1, 4)
        knobs = dict(block_size=16, num_blocks=128, max_num_seqs=4, max_num_batched_tokens=256)
    else:
        raise ValueError(f"trace kind must be one of {TRACE_KINDS}, got {kind!r}")
    for i, r in enumerate(requests):
        r["id"] = str(i)
    return Trace(kind, requests, **knobs)


@dataclass
class Replay:
    """What serving a trace under a policy gave. Steps count the engine's steps; times are the
    clock's (in decode steps), at the end of the step that sampled the token."""
    trace: Trace
    replies: dict[str, list[int]] = field(default_factory=dict)     # finished requests only
    first_token_step: dict[str, int] = field(default_factory=dict)
    last_token_step: dict[str, int] = field(default_factory=dict)
    first_token_time: dict[str, float] = field(default_factory=dict)
    last_token_time: dict[str, float] = field(default_factory=dict)
    token_times: dict[str, list[float]] = field(default_factory=dict)   # every token's, in order
    # {"step", "time" (at its end), "cost", "batch" (sequences fed), "running" (slots taken),
    #  "waiting", "blocks_used", "tokens"}
    timeline: list[dict] = field(default_factory=list)
    preemptions: int = 0
    error: str | None = None          # why the replay stopped early, if it did
    error_step: int | None = None
    rule: str | None = None           # the broken rule of an illegal decision
    pool_problems: list[str] = field(default_factory=list)   # block-pool invariants broken
    stall_cause: str | None = None    # what kept the engine from feeding any token, if it stalled

    @property
    def arrival(self) -> dict[str, float]:
        return {r["id"]: r["arrival"] for r in self.trace.requests}

    @property
    def unfinished(self) -> list[str]:
        return [r["id"] for r in self.trace.requests if r["id"] not in self.replies]

    def ttft(self) -> dict[str, float]:
        """Time from arrival to the end of the step that sampled the first token."""
        return {rid: t - self.arrival[rid] for rid, t in self.first_token_time.items()}


class PolicyFailed(RuntimeError):
    """The policy raised instead of deciding."""


@contextlib.contextmanager
def one_thread():
    """torch on one CPU thread inside the block: the tiny model's matrices are too small to
    share, and on a busy machine a second thread makes every step wait for a core."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def replay(trace: Trace, policy: Callable[[dict], dict] = reference_policy, model=None, tokenizer=None,
           max_steps: int = 1000, stall_steps: int = 20, clock: StepClock | None = None) -> Replay:
    """Serve `trace` with the engine, `policy` deciding every step (see PolicyScheduler), each
    step lasting what `clock` says it costs (SmolLM2-135M on an A100 by default); the model runs
    on one CPU thread (`one_thread`)."""
    with one_thread():
        return _replay(trace, policy, model, tokenizer, max_steps, stall_steps, clock or StepClock())


def _replay(trace, policy, model, tokenizer, max_steps, stall_steps, clock) -> Replay:
    if model is None:
        from reference.model import build_tiny
        model = build_tiny(0)
    if tokenizer is None:
        from reference.tokenizer import ByteTokenizer
        tokenizer = ByteTokenizer()
    engine = LLMEngine(model, tokenizer, block_size=trace.block_size, num_blocks=trace.num_blocks,
                       max_num_seqs=trace.max_num_seqs, max_num_batched_tokens=trace.max_num_batched_tokens,
                       enable_prefix_caching=True)

    def ask(snapshot):
        try:
            return policy(snapshot)
        except Exception as exc:  # noqa: BLE001 - the policy's failure ends the trace, with its reason
            raise PolicyFailed(f"step {snapshot['step']}: the policy failed: {type(exc).__name__}: {exc}") from exc

    scheduler = PolicyScheduler(engine.blocks, trace.max_num_seqs, trace.max_num_batched_tokens, ask)
    engine.scheduler = scheduler
    result, pending = Replay(trace), sorted(trace.requests, key=lambda r: r["arrival"])
    stalled, now = 0, 0.0
    for step in range(max_steps):
        if pending and not engine.has_unfinished():
            now = max(now, pending[0]["arrival"])     # idle until the next request arrives
        while pending and pending[0]["arrival"] <= now:
            r = pending.pop(0)   # the snapshot's "arrival_step" is this step's number
            engine.add_request(list(r["prompt_ids"]), SamplingParams(max_tokens=r["max_tokens"], temperature=0.0,
                                                                     ignore_eos=True),
                               request_id=r["id"], arrival_time=float(step))
        if not pending and not engine.has_unfinished():
            return result
        scheduler.clock = step
        try:
            outputs = engine.step()
        except (IllegalDecision, PolicyFailed) as exc:
            result.error, result.error_step = str(exc), step
            result.rule = getattr(exc, "rule", None)
            return result
        cost = clock.cost(scheduler.last_fed)
        now += cost
        for out in outputs:
            result.first_token_step.setdefault(out.request_id, step)
            result.first_token_time.setdefault(out.request_id, now)
            result.token_times.setdefault(out.request_id, []).append(now)
            if out.finished:
                result.last_token_step[out.request_id] = step
                result.last_token_time[out.request_id] = now
                result.replies[out.request_id] = list(out.token_ids)
        batch = scheduler.last_batch
        result.timeline.append({"step": step, "time": now, "cost": cost, "batch": len(batch),
                                "running": scheduler.last_running, "waiting": len(scheduler.waiting),
                                "blocks_used": trace.num_blocks - engine.blocks.num_free_blocks,
                                "tokens": sum(n for _, n in batch)})
        result.preemptions = scheduler.preemptions
        problems = pool_problems(engine.blocks, [s.request_id for s in scheduler.running])
        if problems and not result.pool_problems:
            result.pool_problems = [f"after step {step}: {p}" for p in problems]
        stalled = 0 if batch else stalled + 1
        if stalled >= stall_steps:
            result.error, result.error_step = (
                f"step {step}: stalled: no token was fed for {stall_steps} steps while "
                f"{len(scheduler.running)} sequence(s) ran and {len(scheduler.waiting)} waited "
                f"({engine.blocks.num_free_blocks} blocks free)"), step
            result.stall_cause = stall_cause(scheduler, engine.blocks.num_free_blocks,
                                             trace.max_num_batched_tokens)
            return result
    result.error, result.error_step = (f"step {max_steps}: the step limit was reached with "
                                       f"{len(result.unfinished)} request(s) unfinished"), max_steps
    return result


def stall_cause(scheduler, free_blocks: int, budget: int) -> str:
    """What kept a stalled engine from feeding any token, said as the fix: a waiting prompt
    longer than the token budget with nothing running (it must be chunked), running sequences
    that each need a block with none free (preempt), or waiting requests never admitted."""
    left = max((s.num_prompt_tokens - s.num_computed for s in scheduler.waiting), default=0)
    if not scheduler.running and left > budget:
        return (f"a waiting prompt has {left} tokens left to feed, more than the token budget of "
                f"{budget} a step: feed a long prompt in chunks of at most the budget")
    if scheduler.running and free_blocks == 0:
        return ("every running sequence needs a new block and none is free: only a preempted "
                "sequence gives blocks back (its private blocks)")
    return ("requests waited while nothing was scheduled: admit a waiting request whose next "
            "chunk fits the token budget and the free blocks")


def pool_problems(blocks: BlockManager, holders: list[str]) -> list[str]:
    """Broken invariants of the block pool: every block is free, idle in the prefix cache, or
    held, each exactly once, with a reference count equal to the number of tables holding it."""
    held = Counter(b for sid in holders for b in blocks.block_table(sid))
    free, idle = blocks.free_block_ids, blocks.cache.idle_blocks()
    problems = []
    if len(set(free)) != len(free):
        problems.append(f"blocks {sorted(b for b, k in Counter(free).items() if k > 1)} are on the free list twice (double free)")
    both = (set(free) | set(idle)) & set(held)
    if both:
        problems.append(f"blocks {sorted(both)} are free and held at once")
    wrong = [b for b in range(blocks.num_blocks) if blocks.ref_count(b) != held[b]]
    if wrong:
        problems.append(f"blocks {wrong[:5]} have reference counts that differ from their holders")
    lost = blocks.num_blocks - len(set(free) | set(idle) | set(held))
    if lost:
        problems.append(f"{lost} block(s) leaked: neither free, idle nor held")
    return problems


def idle_slot_time(result: Replay) -> float:
    """Clock time (decode steps) during which a slot stood free while a request waited: the
    cost of every step whose decision left fewer than max_num_seqs sequences running with the
    queue not empty. Continuous batching keeps it to what the token budget and the pool force;
    static batching adds the rest of the longest reply of every batch."""
    return sum(t["cost"] for t in result.timeline
               if t["waiting"] and t["running"] < result.trace.max_num_seqs)


# The measures a policy is judged by (keys of service_levels), each with its label and whether
# a higher value is better.
SERVICE_MEASURES = {"throughput": ("throughput (tokens/d.s.)", True),
                    "ttft_p50": ("TTFT p50 (d.s.)", False), "ttft_p90": ("TTFT p90 (d.s.)", False),
                    "tpot_p50": ("TPOT p50 (d.s.)", False), "tpot_p90": ("TPOT p90 (d.s.)", False),
                    "itl_p99": ("ITL p99 (d.s.)", False)}
# A policy whose balance against the course's scheduler is at most this serves a trace as well
# as the course's: a different design may lose a few percent on one draw and win on the next.
AS_GOOD_AS_THE_COURSE = 1.05


def service_levels(result: Replay) -> dict:
    """Throughput (tokens per decode step of clock time, from the first arrival to the last
    token), TTFT and TPOT percentiles as chapter 9 defines them, and the inter-token latency's
    99th percentile (ITL: the gap between two consecutive tokens of one reply, over every reply:
    the longest pauses a streaming reader sees), all in decode steps of clock time, over the
    finished requests; "steps" is how many engine steps the replay took."""
    done = [rid for rid in result.replies if result.replies[rid]]
    if not done:
        return {**{key: float("inf") for key in SERVICE_MEASURES}, "throughput": 0.0, "steps": 0,
                "preemptions": result.preemptions}
    start = min(r["arrival"] for r in result.trace.requests)
    end = max(result.last_token_time[rid] for rid in done)
    ttft = result.ttft()
    ttfts = [ttft[rid] for rid in done]
    tpots = [(result.last_token_time[rid] - result.first_token_time[rid]) / (len(result.replies[rid]) - 1)
             for rid in done if len(result.replies[rid]) > 1]
    gaps = [later - earlier for rid in done
            for earlier, later in zip(result.token_times[rid], result.token_times[rid][1:])]
    return {"throughput": sum(len(result.replies[rid]) for rid in done) / (end - start),
            "ttft_p50": percentile(ttfts, 50), "ttft_p90": percentile(ttfts, 90),
            "tpot_p50": percentile(tpots, 50) if tpots else 0.0, "tpot_p90": percentile(tpots, 90) if tpots else 0.0,
            "itl_p99": percentile(gaps, 99) if gaps else 0.0,
            "steps": len(result.timeline), "preemptions": result.preemptions}


def service_costs(levels: dict, course: dict) -> dict[str, float]:
    """Each measure of SERVICE_MEASURES as a cost relative to the course's scheduler on the same
    trace (both service_levels dicts): yours / the course's for a latency, the course's / yours
    for throughput. 1 is as good as the course's, 1.2 is 20% worse, 0.9 is 10% better."""
    costs = {}
    for key, (_, higher_is_better) in SERVICE_MEASURES.items():
        mine, theirs = levels[key], course[key]
        if mine == theirs:            # equal, zero or infinite alike
            costs[key] = 1.0
        elif higher_is_better:
            costs[key] = theirs / mine if mine > 0 else math.inf
        else:
            costs[key] = mine / theirs if theirs > 0 else math.inf
    return costs


def balance(costs: dict[str, float]) -> float:
    """The geometric mean of service_costs: one number per trace, in which a measure 10% better
    makes up for another 10% worse."""
    if any(math.isinf(c) for c in costs.values()):
        return math.inf
    return math.exp(sum(math.log(c) for c in costs.values()) / len(costs))


# How timeline_figure draws each policy: the course's scheduler as a broad pale line underneath,
# the others thinner, dashed, with markers, and raised by a small fraction of the panel's scale,
# so that where two policies do the same thing both lines stay visible.
COURSE_STYLE = dict(color="0.45", lw=3.2, alpha=0.45, ls="-", zorder=2)
OTHER_STYLES = [dict(color="C0", lw=1.3, ls=":", marker="s", zorder=3),   # by rank, cycling: the
                dict(color="C1", lw=1.3, ls="--", marker="o", zorder=3)]  # first after the course's: C1
LIFT = 0.025   # the k-th policy drawn is raised by k times this fraction of the panel's limit


def timeline_figure(runs: dict[str, dict[str, Replay]]):
    """A small matplotlib figure: for each trace (a key of `runs`), the sequences in each step's
    batch and the blocks in use after it, against clock time, one line per policy (the inner
    keys; the one called "course" drawn as the course's scheduler, underneath the others, which
    are lifted slightly so that equal stretches show as two lines). Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(len(runs), 2, figsize=(8.4, 1.8 * len(runs) + 0.5), squeeze=False,
                             sharex="row")
    for row, (kind, by_policy) in enumerate(runs.items()):
        trace = next(iter(by_policy.values())).trace
        course_first = sorted(by_policy.items(), key=lambda item: item[0] != "course")
        for rank, (label, result) in enumerate(course_first):
            style = COURSE_STYLE if label == "course" else OTHER_STYLES[rank % len(OTHER_STYLES)]
            ends = [t["time"] for t in result.timeline]   # each step's value holds until it ends
            for col, (key, limit) in enumerate((("batch", trace.max_num_seqs), ("blocks_used", trace.num_blocks))):
                values = [t[key] + rank * LIFT * limit for t in result.timeline]
                marks = dict(markevery=max(1, len(ends) // 12), markersize=3) if "marker" in style else {}
                shown = label if not rank else f"{label}, drawn {100 * rank * LIFT:g}% higher"
                axes[row][col].step(ends, values, where="pre", label=shown, **style, **marks)
        axes[row][0].set_title(f"{kind}: sequences in the batch", fontsize=9, loc="left")
        axes[row][1].set_title(f"{kind}: blocks in use", fontsize=9, loc="left")
        axes[row][0].axhline(trace.max_num_seqs, color="grey", lw=0.6, ls=":")
        axes[row][1].axhline(trace.num_blocks, color="grey", lw=0.6, ls=":")
        axes[row][0].yaxis.set_major_locator(MaxNLocator(integer=True))
        for ax in axes[row]:
            ax.tick_params(labelsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("time (decode steps)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.3 / fig.get_figheight(), 1, 1))
    return fig
