"""`python -m reference.bench serve`: the serving engine under a seeded workload, side by side.

    python -m reference.bench serve [--requests 32] [--max-tokens 128] [--seed 0] [--max-num-seqs 8]
                                    [--model smollm2-135m|tiny] [--rate R] [--threads N]
                                    [--quick] [--json PATH]

One workload (reference/bench/workload.py: a shared system prompt, user messages of mixed
length, Pareto output lengths, every reply generated to its drawn length) is served by:

- a peer that serves one request at a time: Hugging Face `generate` on the same GGUF weights
  (our own cached decode loop for the tiny model, which transformers cannot load);
- the engine with `scheduling="static"` (admit a batch, wait for all of it), then
  `scheduling="continuous"` without and with prefix caching, all with `--max-num-seqs` slots.
  With fewer slots than requests, requests queue for a slot: static batching refills its slots
  only when the longest reply of the batch is done, continuous batching whenever a reply is done.

Each runs twice: every request arriving at once, then a Poisson stream whose rate (default) is
the requests/s that continuous batching achieved with all of them at once, so requests arrive
about as fast as it served them. Arrival times are honoured: the loop steps the engine and hands
a request to `engine.add_request` once its time has come. Every configuration gets a fresh engine,
so no prefix cache or counter carries over from one run to the next.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from reference.__main__ import OneLineParser, positive
from reference.bench.measure import provenance
from reference.bench.workload import (SHORT_SYSTEM_PROMPT, SYSTEM_PROMPT, RequestTiming, add_ratios,
                                      format_table, make_workload, prefix_hit_bound, summarize)
from reference.threads import configure

BLOCK_SIZE = 16
STATIC, CONTINUOUS, CACHED = "static", "continuous", "continuous + prefix cache"
ENGINE_CONFIGS = {STATIC: dict(scheduling="static", enable_prefix_caching=False),
                  CONTINUOUS: dict(scheduling="continuous", enable_prefix_caching=False),
                  CACHED: dict(scheduling="continuous", enable_prefix_caching=True)}


def wait_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.perf_counter()))


def run_engine(llm, requests, rate: float | None) -> tuple[dict, dict]:
    """Serve `requests` arriving at `rate` requests/s (None: all at once) by stepping
    `llm.engine`; return the summary and the engine's own stats after the run."""
    from reference.engine import SamplingParams

    engine = llm.engine
    queue = sorted(requests, key=lambda r: r.arrival_units)
    timings: dict[str, RequestTiming] = {}
    start = time.perf_counter()
    while queue or engine.has_unfinished():
        while queue and start + queue[0].arrival_s(rate) <= time.perf_counter():
            request = queue.pop(0)
            arrival = start + request.arrival_s(rate)
            params = SamplingParams(temperature=0.0, max_tokens=request.max_tokens, ignore_eos=True)
            rid = engine.add_request(request.prompt_ids, params, request_id=f"req-{request.index}",
                                     arrival_time=arrival)
            timings[rid] = RequestTiming(arrival)
        if not engine.has_unfinished():
            wait_until(start + queue[0].arrival_s(rate))
            continue
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            if out.finish_reason == "error":
                raise RuntimeError(f"the engine refused {out.request_id}: {out.error}")
            timings[out.request_id].record(len(out.token_ids), out.finished, now)
    return summarize(list(timings.values()), start), dict(engine.stats)


def engine_columns(stats: dict) -> dict:
    """The engine's slot utilisation, prefix-cache hit rate and preemption count."""
    return {"slot_utilisation": stats.get("slot_utilisation"), "prefix_hit_rate": stats.get("prefix_hit_rate"),
            "preemptions": stats.get("preemptions")}


def run_sequential(generate_times, requests, rate: float | None) -> dict:
    """Serve the requests one at a time in arrival order; `generate_times(prompt_ids, n)`
    generates exactly n tokens and returns the perf_counter time at which each appeared."""
    timings, start = [], time.perf_counter()
    for request in sorted(requests, key=lambda r: r.arrival_units):
        arrival = start + request.arrival_s(rate)
        wait_until(arrival)
        times = generate_times(request.prompt_ids, request.max_tokens)
        timing = RequestTiming(arrival)
        for i, moment in enumerate(times):
            timing.record(i + 1, i == len(times) - 1, moment)
        timings.append(timing)
    return summarize(timings, start)


class TokenClock:
    """A transformers streamer that notes when each generated token arrives (the first `put`
    is the prompt)."""

    def __init__(self):
        self.times, self.seen_prompt = [], False

    def put(self, value) -> None:
        if self.seen_prompt:
            self.times.append(time.perf_counter())
        self.seen_prompt = True

    def end(self) -> None:
        pass


def hf_generate_times(hf):
    """`generate_times` for Hugging Face `generate` (greedy, exactly n new tokens)."""
    @torch.inference_mode()
    def generate_times(prompt_ids: list[int], n: int) -> list[float]:
        inputs, clock = torch.tensor([prompt_ids]), TokenClock()
        hf.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=n, min_new_tokens=n,
                    do_sample=False, pad_token_id=hf.config.eos_token_id, streamer=clock)
        return clock.times
    return generate_times


def ours_generate_times(model):
    """`generate_times` for our batch-1 KV-cached loop (reference.decoding.stream)."""
    from reference.decoding import stream

    def generate_times(prompt_ids: list[int], n: int) -> list[float]:
        return [time.perf_counter() for _ in stream(model, prompt_ids, n)]
    return generate_times


def sequential_peer(model_name: str, model):
    """(row name, generate_times) for the one-request-at-a-time peer: HF on the real weights,
    our loop on `model` for the tiny one."""
    if model_name == "smollm2-135m":
        from reference.bench.hf_peer import load_hf_peer
        return "HF generate, sequential", hf_generate_times(load_hf_peer())
    return "ours, sequential", ours_generate_times(model)


def describe_workload(requests) -> str:
    """Prompt and output token counts (prefill vs decode work) and the best possible hit rate."""
    lengths = [len(r.prompt_ids) for r in requests]
    return (f"prompts {min(lengths)}-{max(lengths)} tokens, {sum(lengths)} in all, for "
            f"{sum(r.max_tokens for r in requests)} output tokens; a prefix-cache hit rate of at most "
            f"{prefix_hit_bound(requests, BLOCK_SIZE):.0%} is possible (blocks of {BLOCK_SIZE} shared with "
            f"an earlier prompt / full prompt blocks)")


def run_all(args: argparse.Namespace) -> tuple[list[dict], float]:
    """Every (arrival pattern, configuration) row, printed as it finishes; and the Poisson rate."""
    from reference.engine import LLM
    from reference.model import load_model

    model, tokenizer = load_model(args.model)   # weights shared by every engine; each has its own pool
    system = SYSTEM_PROMPT if args.model == "smollm2-135m" else SHORT_SYSTEM_PROMPT
    requests = make_workload(tokenizer, args.requests, args.max_tokens, args.seed, system_prompt=system)
    print(describe_workload(requests) + "\n", flush=True)
    peer_name, peer = sequential_peer(args.model, model)
    peer(requests[0].prompt_ids, 2)  # warm-up: thread pool, allocator
    rows, rate = [], args.rate
    for arrival in ("all at once", "poisson"):
        if arrival == "poisson":
            rate = rate or args.requests / next(r["wall_s"] for r in rows if r["config"] == CONTINUOUS)
        pattern = None if arrival == "all at once" else rate
        for config in (peer_name, STATIC, CONTINUOUS, CACHED):
            if config == peer_name:
                row = {**run_sequential(peer, requests, pattern), "slot_utilisation": None,
                       "prefix_hit_rate": None, "preemptions": None}
            else:
                llm = LLM(model, tokenizer=tokenizer, block_size=BLOCK_SIZE, max_num_seqs=args.max_num_seqs,
                          **ENGINE_CONFIGS[config])
                summary, stats = run_engine(llm, requests, pattern)
                row = {**summary, **engine_columns(stats), "engine_stats": stats}
                if not ENGINE_CONFIGS[config]["enable_prefix_caching"]:
                    row["prefix_hit_rate"] = None   # printed as "-": no cache, nothing looked up
            rows.append({"arrival": arrival, "config": config, **row})
            print(f"  done: {arrival:11} {config:26} {row['tok_per_s']:8.1f} tok/s", flush=True)
    add_ratios(rows, static=STATIC, sequential=peer_name)
    return rows, rate


def goal_lines(rows: list[dict]) -> list[str]:
    """The issue's goals, with what this run measured (printed, not asserted)."""
    def find(arrival, config):
        return next(r for r in rows if r["arrival"] == arrival and r["config"] == config)
    lines = []
    for arrival in ("all at once", "poisson"):
        best = find(arrival, CACHED)
        lines.append(f"{arrival}: continuous + prefix cache / static = {best['vs_static']:.2f}x (goal >= 3x), "
                     f"/ sequential = {best['vs_sequential']:.2f}x (goal >= 8x), prefix hit rate "
                     f"{best['prefix_hit_rate']:.0%} (goal >= 90%)")
    return lines


def positive_rate(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def main(argv: list[str]) -> None:
    parser = OneLineParser(prog="python -m reference.bench serve", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=positive, default=32, help="requests in the workload")
    parser.add_argument("--max-tokens", type=positive, default=128, help="cap of the Pareto output lengths")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", choices=["smollm2-135m", "tiny"], default="smollm2-135m")
    parser.add_argument("--max-num-seqs", type=positive, default=8,
                        help="engine slots (static batch size); below --requests, so requests queue for slots")
    parser.add_argument("--rate", type=positive_rate, default=None,
                        help="Poisson arrivals per second (default: continuous batching's all-at-once requests/s)")
    parser.add_argument("--threads", type=positive, default=None, help="default: the cores free now")
    parser.add_argument("--quick", action="store_true", help="12 requests, outputs capped at 32 tokens")
    parser.add_argument("--json", metavar="PATH", help="also write the rows and their provenance as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.max_tokens = min(args.requests, 12), min(args.max_tokens, 32)
    info = provenance("python -m reference.bench serve", argv, configure(args.threads))
    print(f"{info['cpu']}, {info['threads']} threads, torch {info['torch']}; model {args.model}, "
          f"{args.requests} requests, outputs <= {args.max_tokens} tokens, seed {args.seed}, "
          f"{args.max_num_seqs} engine slots", flush=True)
    rows, rate = run_all(args)
    print(f"\nPoisson stream: {rate:.2f} requests/s\n\n{format_table(rows)}\n")
    print("\n".join(goal_lines(rows)))
    print("\ntok/s = output tokens / (last finish - start); TTFT includes queueing from the arrival time; "
          "TPOT = (finish - first token) / (tokens - 1); vs static / vs seq = tok/s over the static / "
          "sequential row with the same arrivals.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"provenance": {**info, "poisson_rate": rate}, "rows": rows}, f, indent=1, default=str)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main(sys.argv[1:])
