"""The serving benchmark's workload, per-request timings, summary statistics and printed table.

Nothing here runs a model: `reference/bench/serve.py` feeds the workload to the engine and to a
one-request-at-a-time peer, records a `RequestTiming` per request, and prints `format_table`.

Workload: every prompt is a chat whose system message is the same text (so full blocks of it can
be shared by the prefix cache) followed by a user message of a seeded length; output lengths are
Pareto-distributed and capped (`reference.calculators.batching_sim.pareto_workload`, chapter 09's simulator
workload, draws both lengths).
Requests arrive all at once or as a Poisson stream: each request carries its arrival offset in
units of the mean gap between arrivals, so one seeded workload serves every arrival rate.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from reference.calculators.batching_sim import pareto_workload, percentile

SYSTEM_SENTENCES = [
    "You are a patient assistant for a course on how language models are served.",
    "Answer in plain words, define each term the first time you use it, and prefer a short "
    "worked example with small numbers to a long abstract explanation.",
    "When a question is about speed, say which resource limits it: the bytes read from memory, "
    "the arithmetic, or the time spent waiting for other requests.",
    "When a question is about memory, count the bytes: weights, the key and value cache of every "
    "sequence, and the activations of one step.",
    "If you are not sure of a number, say so and explain how the reader could measure it on "
    "their own machine with a small script.",
    "Keep every answer under two hundred words unless the reader asks for more detail, and end "
    "with one sentence that names the idea to remember.",
    "Never invent a citation; when you mention a system such as vLLM or a paper such as the one "
    "on PagedAttention, describe what it does rather than quoting it.",
]
SYSTEM_PROMPT = " ".join(SYSTEM_SENTENCES)
SHORT_SYSTEM_PROMPT = " ".join(SYSTEM_SENTENCES[:2])   # for the tiny model's 512-byte context

WORDS = ("why does a batch of requests share the weights read from memory at each step while "
         "every sequence keeps its own keys and values in blocks of the cache pool explain how "
         "long prompts short answers waiting time first token scheduler preemption throughput "
         "latency percentile queue arrival stream decode prefill chunk budget slot utilisation "
         "compare static continuous batching with an example of eight users").split()


@dataclass(frozen=True)
class BenchRequest:
    """One request: its prompt ids, the exact number of tokens to generate, and its arrival
    offset in units of the mean gap between Poisson arrivals (0 for the first request)."""
    index: int
    prompt_ids: list[int]
    max_tokens: int
    arrival_units: float

    def arrival_s(self, rate: float | None) -> float:
        """Arrival time in seconds after the start: 0 when all arrive at once (rate None)."""
        return 0.0 if rate is None else self.arrival_units / rate


def chat_prompt_ids(tokenizer, system: str, user: str) -> list[int]:
    """Token ids of a system + user chat ending where the reply begins (the model's chat
    template); a tokenizer without one (the tiny model's bytes) gets the two texts joined."""
    if hasattr(tokenizer, "apply_chat_template"):
        return tokenizer.encode(tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": user}]))
    return tokenizer.encode(f"{system}\n\n{user}\n\n")


def user_text(tokenizer, n_tokens: int, rng: random.Random) -> str:
    """Seeded words, as many as it takes to reach at least `n_tokens` tokens."""
    text = rng.choice(WORDS).capitalize()
    while len(tokenizer.encode(text)) < n_tokens:
        text += " " + rng.choice(WORDS)
    return text + "?"


def make_workload(tokenizer, n_requests: int, max_tokens: int, seed: int, *,
                  system_prompt: str = SYSTEM_PROMPT, user_tokens: tuple[int, int] = (8, 96),
                  min_output: int = 8, pareto_alpha: float = 1.2) -> list[BenchRequest]:
    """`n_requests` seeded requests: the shared system prompt, a user message of a length drawn
    log-uniformly from `user_tokens`, an output length min(max_tokens, min_output * Pareto(alpha)),
    and Poisson arrival offsets (exponential gaps of mean 1). Same seed, same workload."""
    if n_requests < 1 or max_tokens < 1:
        raise ValueError(f"need n_requests >= 1 and max_tokens >= 1, got {n_requests} and {max_tokens}")
    specs = pareto_workload(n_requests, seed, min_output=min(min_output, max_tokens), max_output=max_tokens,
                            alpha=pareto_alpha, prompt_range=user_tokens)
    rng, offset, requests = random.Random(f"serve-bench-{seed}"), 0.0, []
    for spec in specs:
        ids = chat_prompt_ids(tokenizer, system_prompt, user_text(tokenizer, spec["prompt_len"], rng))
        requests.append(BenchRequest(spec["id"], ids, spec["output_len"], offset))
        offset += rng.expovariate(1.0)
    return requests


def prefix_hit_bound(requests: list[BenchRequest], block_size: int) -> float:
    """The best prefix-cache hit rate the workload allows, counted as the engine counts it (over
    full prompt blocks): each prompt's full blocks that repeat an earlier prompt's (in arrival
    order), over all full prompt blocks."""
    shared = full = 0
    earlier: list[list[int]] = []
    for request in sorted(requests, key=lambda r: r.arrival_units):
        ids = request.prompt_ids
        common = max((next((i for i, (a, b) in enumerate(zip(ids, other)) if a != b), min(len(ids), len(other)))
                      for other in earlier), default=0)
        n_full = len(ids) // block_size
        shared, full = shared + min(common // block_size, n_full), full + n_full
        earlier.append(ids)
    return shared / full if full else 0.0


@dataclass
class RequestTiming:
    """perf_counter seconds of one request's arrival, first generated token and last token."""
    arrival: float
    first_token: float | None = None
    finish: float | None = None
    n_tokens: int = 0

    def record(self, n_tokens: int, finished: bool, now: float) -> None:
        """Note a step's result: `n_tokens` generated so far (cumulative) at time `now`."""
        if n_tokens > 0 and self.first_token is None:
            self.first_token = now
        self.n_tokens = n_tokens
        if finished:
            self.finish = now

    @property
    def ttft(self) -> float:
        """Time to first token (s), queueing included."""
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (s); None for a one-token reply."""
        return (self.finish - self.first_token) / (self.n_tokens - 1) if self.n_tokens > 1 else None


def summarize(timings: list[RequestTiming], start: float) -> dict:
    """Output tokens, wall seconds (start to the last finish), output tokens/s, TTFT and TPOT
    p50/p99 in milliseconds (TPOT None when every reply is one token long)."""
    if any(t.finish is None for t in timings):
        raise ValueError("every request must have finished before it is summarized")
    tokens = sum(t.n_tokens for t in timings)
    wall = max(t.finish for t in timings) - start
    ttfts = [t.ttft * 1e3 for t in timings]
    tpots = [t.tpot * 1e3 for t in timings if t.tpot is not None]
    return {"requests": len(timings), "output_tokens": tokens, "wall_s": wall, "tok_per_s": tokens / wall,
            "ttft_p50_ms": percentile(ttfts, 50), "ttft_p99_ms": percentile(ttfts, 99),
            "tpot_p50_ms": percentile(tpots, 50) if tpots else None,
            "tpot_p99_ms": percentile(tpots, 99) if tpots else None}


def add_ratios(rows: list[dict], static: str, sequential: str) -> None:
    """Give each row `vs_static` and `vs_sequential`: its tokens/s over that of the row named
    `static` / `sequential` with the same arrival pattern (None where that row is missing)."""
    for row in rows:
        for key, name in (("vs_static", static), ("vs_sequential", sequential)):
            base = next((r for r in rows if r["config"] == name and r["arrival"] == row["arrival"]), None)
            row[key] = row["tok_per_s"] / base["tok_per_s"] if base else None


COLUMNS = [  # (header, key, format); None values print as "-"
    ("arrival", "arrival", "{}"), ("configuration", "config", "{}"), ("reqs", "requests", "{}"),
    ("out tok", "output_tokens", "{}"), ("wall s", "wall_s", "{:.1f}"), ("tok/s", "tok_per_s", "{:.1f}"),
    ("vs static", "vs_static", "{:.2f}x"), ("vs seq", "vs_sequential", "{:.2f}x"),
    ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}"), ("TTFT p99 ms", "ttft_p99_ms", "{:.0f}"),
    ("TPOT p50 ms", "tpot_p50_ms", "{:.1f}"), ("TPOT p99 ms", "tpot_p99_ms", "{:.1f}"),
    ("slot util", "slot_utilisation", "{:.0%}"), ("prefix hit", "prefix_hit_rate", "{:.0%}"),
    ("preempt", "preemptions", "{}"),
]


def format_table(rows: list[dict]) -> str:
    """One aligned text table, a row per (arrival pattern, configuration), in the given order."""
    cells = [[h for h, _, _ in COLUMNS]]
    for row in rows:
        cells.append(["-" if row.get(key) is None else fmt.format(row[key]) for _, key, fmt in COLUMNS])
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
             for line in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
