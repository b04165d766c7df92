"""`python -m reference.bench threads`: the OpenMP wait policy and thread count, chosen by measurement.

    python -m reference.bench threads [--tokens 64] [--repeats 3] [--policies NAME ...]

Decode is a chain of small matrix-vector products, each split over torch's OpenMP threads with a
barrier at its end. How a thread waits at that barrier decides two things at once: how fast a step
is on a quiet machine (a spinning thread answers at once; a sleeping one must be woken) and how
badly a step suffers when another process takes a core (a spinning thread holds its core while
the thread it waits for queues behind the other process). This benchmark measures both for every
candidate policy, each in a fresh process (libgomp reads its environment once, when torch loads):

- quiet: batch-1 decode step, its bandwidth against this machine's copy bandwidth, HF `generate`;
- load after: a busy loop started once the model is loaded; `generate` re-chooses its threads
  (`reference.threads.adapt`, what every run does by default);
- load after, threads fixed: the same load with the thread count fixed at load time
  (`configure(n)`, as `--threads n` does): what re-choosing buys;
- load before: a fresh process started while the busy loop already runs (it chooses its threads
  on the busy machine).

Each row is one process per scenario; compare rows of one run only (ratios), never runs on
different machines. The default of `reference.threads` is the row this table chose.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from reference.bench import measure

# name -> environment for the OpenMP runtime (libgomp); "libgomp default" sets nothing.
POLICIES = {
    "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "libgomp default": {},
    "spin 10k": {"GOMP_SPINCOUNT": "10000"},
    "spin 100k": {"GOMP_SPINCOUNT": "100000"},
    "ACTIVE": {"OMP_WAIT_POLICY": "ACTIVE"},
}
OPENMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# The child imports torch before reference, so that reference's own policy choice stays out of it.
CHILD = "import torch, sys; from reference.bench.threads import child; child(sys.argv[1:])"


def ours(model, ids: list[int], tokens: int, repeats: int) -> tuple[float, float]:
    """(median decode step in ms, tokens/s of the whole call) over `repeats` greedy generations
    of `tokens` new tokens."""
    from reference.decoding import DecodeStats, generate

    steps: list[float] = []
    calls: list[float] = []
    for _ in range(repeats):
        stats = DecodeStats()
        calls.append(measure.timed(lambda: generate(model, ids, tokens, stats=stats))[0])
        steps.extend(stats.step_seconds)
    return statistics.median(steps) * 1e3, tokens / statistics.median(calls)


def hf_tokens_per_s(hf, ids: list[int], tokens: int, repeats: int) -> float:
    from reference.bench.decode import time_hf

    return tokens / statistics.median(time_hf(hf, ids, tokens)[0] for _ in range(repeats))


def child(argv: list[str]) -> None:
    """One process, one policy: print a JSON line of measurements (see the module docstring)."""
    import torch

    from reference.bench.decode import PROMPT, step_bytes
    from reference.bench.hf_peer import load_hf_peer
    from reference.model import load_model
    from reference.threads import configure

    tokens, repeats, scenario = int(argv[0]), int(argv[1]), argv[2]
    threads = configure()
    model, tok = load_model("smollm2-135m")
    ids = tok.chat_ids(PROMPT)
    ours(model, ids, 4, 1)  # warm-up: allocator, thread pool
    row = {"threads": threads}
    if scenario == "load before":
        row["step_ms"] = ours(model, ids, tokens, repeats)[0]
    else:
        hf = load_hf_peer()
        hf_tokens_per_s(hf, ids, 4, 1)
        row["step_ms"], row["tok_s"] = ours(model, ids, tokens, repeats)
        row["of_copy"] = step_bytes(model, len(ids) + tokens // 2) / (row["step_ms"] / 1e3) / \
            measure.copy_bandwidth(seconds=0.5)
        row["hf_tok_s"] = hf_tokens_per_s(hf, ids, tokens, repeats)
        with measure.competing_load(processes=1):
            row["after_step_ms"] = ours(model, ids, tokens, repeats)[0]
            row["after_threads"] = torch.get_num_threads()
            row["after_hf_tok_s"] = hf_tokens_per_s(hf, ids, tokens, repeats)
            configure(threads)   # fixed: adapt leaves it alone
            row["fixed_step_ms"] = ours(model, ids, tokens, repeats)[0]
    print(json.dumps(row))


def run_child(policy: dict[str, str], tokens: int, repeats: int, scenario: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in OPENMP_VARIABLES} | policy
    out = subprocess.run([sys.executable, "-c", CHILD, str(tokens), str(repeats), scenario],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m reference.bench threads", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    args = parser.parse_args(argv)
    info = measure.provenance("python -m reference.bench threads", argv)
    print(f"{info['cpu']}, {info['cpus_allowed']} CPUs allowed, torch {info['torch']}, "
          f"{info['date']}\n")
    header = (f"{'policy':<16} {'thr':>3} {'quiet ms':>9} {'of copy':>8} {'HF tok/s':>9} "
              f"{'ours/HF':>8} | {'after ms':>9} {'thr':>3} {'kept':>5} {'HF kept':>8} "
              f"{'fixed ms':>9} {'kept':>5} | {'before ms':>10} {'kept':>5}")
    print(header + "\n" + "-" * len(header))
    for name in args.policies:
        quiet = run_child(POLICIES[name], args.tokens, args.repeats, "quiet")
        with measure.competing_load(processes=1):
            before = run_child(POLICIES[name], args.tokens, args.repeats, "load before")
        print(f"{name:<16} {quiet['threads']:>3} {quiet['step_ms']:9.1f} {quiet['of_copy']:8.0%} "
              f"{quiet['hf_tok_s']:9.1f} {quiet['tok_s'] / quiet['hf_tok_s']:7.2f}x | "
              f"{quiet['after_step_ms']:9.1f} {quiet['after_threads']:>3} "
              f"{quiet['step_ms'] / quiet['after_step_ms']:5.0%} "
              f"{quiet['after_hf_tok_s'] / quiet['hf_tok_s']:8.0%} "
              f"{quiet['fixed_step_ms']:9.1f} {quiet['step_ms'] / quiet['fixed_step_ms']:5.0%} | "
              f"{before['step_ms']:10.1f} {quiet['step_ms'] / before['step_ms']:5.0%}", flush=True)
    print("\nms = median decode step at batch 1 (SmolLM2-135M fp32); of copy = bytes a step must "
          "read / step time, against a large copy measured in the same process; ours/HF = "
          "tokens/s of whole calls, prefill included; kept = quiet step / loaded step; "
          "after = a busy loop started after loading, threads re-chosen as the run goes (thr: "
          "the count in force at the end); fixed = the same load, threads fixed at load; "
          "before = a process started under the load.")
