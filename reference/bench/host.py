"""Host time of an engine step beside its model time, at several batch sizes (issue 14).

    python -m reference.bench engine-host [--batch 1 8 32] [--model smollm2-135m|tiny]
                                          [--steps 32] [--sampling greedy top-p] [--threads N]
                                          [--json PATH]

A step is the model's forward plus the host's work around it: scheduling, block bookkeeping,
building the step's tensors (tokens, positions, slots, block tables), sampling, appending tokens,
stop checks and the outputs. The engine keeps both clocks (`engine.stats["model_seconds"]` and
`["host_seconds"]`); this runs `--batch` copies of a chat prompt until every one is decoding,
then times `--steps` pure decode steps and prints the medians per step: step ms, model ms, host ms
and host as a share of the step. `greedy` rows use temperature 0; `top-p` rows sample with
temperature 0.8 and top_p 0.95, each request seeded (its own generator).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics

import torch

from reference.engine import LLM, SamplingParams
from reference.model import load_model
from reference.threads import configure, free_cores

PROMPT = "Explain in a few sentences why the sky is blue."
SAMPLING = {"greedy": dict(temperature=0.0), "top-p": dict(temperature=0.8, top_p=0.95)}


def decode_steps(llm: LLM, prompt_ids: list[int], batch: int, steps: int, sampling: str) -> list[tuple[float, float]]:
    """(model s, host s) of each of `steps` decode steps with `batch` requests running."""
    engine = llm.engine
    for b in range(batch):   # a different last token per request: same prefix, distinct sequences
        params = SamplingParams(max_tokens=steps + 8, ignore_eos=True, seed=b, **SAMPLING[sampling])
        engine.add_request(prompt_ids + [prompt_ids[-1 - b % len(prompt_ids)]], params)
    while engine.scheduler.waiting or any(s.tokens_to_feed > 1 for s in engine.scheduler.running):
        engine.step()                                 # prefill (and the first token)
    engine.step()                                     # one decode step to warm up
    times = []
    for _ in range(steps):
        before = engine.stats
        engine.step()
        after = engine.stats
        times.append((after["model_seconds"] - before["model_seconds"],
                      after["host_seconds"] - before["host_seconds"]))
    while engine.has_unfinished():
        engine.step()
    return times


def row(batch: int, sampling: str, times: list[tuple[float, float]]) -> dict:
    """Medians over the steps, in ms."""
    step = statistics.median(m + h for m, h in times)
    host = statistics.median(h for _, h in times)
    model = statistics.median(m for m, _ in times)
    return dict(batch=batch, sampling=sampling, step_ms=step * 1e3, model_ms=model * 1e3,
                host_ms=host * 1e3, host_share=host / step)


def print_table(rows: list[dict]) -> None:
    header = f"{'sampling':<8} {'batch':>5} {'step ms':>9} {'model ms':>9} {'host ms':>8} {'host %':>7}"
    print(header + "\n" + "-" * len(header))
    for r in rows:
        print(f"{r['sampling']:<8} {r['batch']:>5} {r['step_ms']:9.2f} {r['model_ms']:9.2f} "
              f"{r['host_ms']:8.3f} {r['host_share']:7.1%}", flush=True)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m reference.bench engine-host",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m", "tiny"])
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps per row (median)")
    parser.add_argument("--sampling", nargs="+", default=list(SAMPLING), choices=list(SAMPLING))
    parser.add_argument("--threads", type=int, default=None, help="default: the cores free now")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    if min(args.batch) < 1 or args.steps < 1:
        parser.error("--batch and --steps must be >= 1")
    idle = free_cores()
    threads = configure(args.threads)
    model, tok = load_model(args.model)
    prompt_ids = tok.chat_ids(PROMPT)
    print(f"model: {args.model}   threads: {threads}   free cores at start: {idle:.1f}   "
          f"torch {torch.__version__}   {platform.processor() or platform.machine()}\n")
    rows = []
    for sampling in args.sampling:
        for batch in args.batch:
            llm = LLM(model, tokenizer=tok, max_num_seqs=batch, max_num_batched_tokens=max(512, batch))
            rows.append(row(batch, sampling, decode_steps(llm, prompt_ids, batch, args.steps, sampling)))
    print_table(rows)
    print("\nmedians over the decode steps; model = the model's forward (engine.stats['model_seconds']); "
          "host = the rest of the step (['host_seconds']); host % = host / step.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=args.model, threads=threads, free_cores=idle, steps=args.steps,
                           torch=torch.__version__, rows=rows), f, indent=1)
    return rows
