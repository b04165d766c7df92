"""`python -m reference.bench kernels --targets`: every shipped Triton kernel built for a T4, an
A100 and an H100 on this machine, no GPU needed (reference/kernels/targets.py says how).

One row per launch configuration (reference/kernels/launches.py lists them), one cell per GPU:
shared memory per block in KiB, registers per thread, bytes spilled per thread, and `OVER` where
the launch would not fit. Then the verdict of `launches.matrix_problems`. `--slice K/N` builds
the K-th of N interleaved slices of the matrix (whole autotune groups), which is how the test
suite spreads the ~40 CPU-minutes of a cold build over its runs; built reports are cached.

    python -m reference.bench kernels --targets [--slice K/N] [--json PATH]
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys


def compile_matrix(slice_k: int = 0, slice_n: int = 1) -> list[tuple]:
    """[(Launch, CompileReport)] of the K-th slice, every target."""
    from autograder.solutions import load_solutions
    from reference.kernels.launches import all_launches, groups
    from reference.kernels.targets import TARGETS, compile_for
    chosen = [launch for i, group in enumerate(groups(all_launches(load_solutions))) if i % slice_n == slice_k
              for launch in group]
    return [(launch, compile_for(launch.fn, launch.args, launch.kwargs, target))
            for launch in chosen for target in TARGETS]


def cell(report) -> str:
    if report.error:
        return "does not compile"
    text = f"{report.shared_bytes / 1024:5.1f}K {report.registers:3d}r"
    text += f" spill {report.spill_stores:5d}" if report.spills else " " * 11
    return text + (" OVER" if report.problems() else "     ")


def print_matrix(rows: list[tuple]) -> None:
    from reference.kernels.launches import matrix_problems
    from reference.kernels.targets import TARGETS
    print(f"{'kernel':32} {'config':38} " + " ".join(f"{t.name + f' ({t.shared_per_block // 1024} KiB)':30}"
                                                      for t in TARGETS))
    for i in range(0, len(rows), len(TARGETS)):
        launch = rows[i][0]
        print(f"{launch.kernel:32} {launch.config:38} "
              + " ".join(f"{cell(report):30}" for _, report in rows[i:i + len(TARGETS)]))
    problems = matrix_problems(rows)
    print(f"\n{len(rows) // len(TARGETS)} launches x {len(TARGETS)} GPUs (K: shared memory per block, r: registers "
          "per thread, spill: bytes stored per thread, OVER: would not launch)")
    print("verdict: " + ("every launch fits; no spill outside launches.ACCEPTED_SPILLS" if not problems
                         else f"{len(problems)} problem(s):\n  " + "\n  ".join(problems)))


def main(slice_arg: str | None, json_path: str | None) -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":        # interpreter objects cannot be compiled: start clean
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        argv = ["--targets"] + (["--slice", slice_arg] if slice_arg else []) + (["--json", json_path] if json_path else [])
        sys.exit(subprocess.run([sys.executable, "-m", "reference.bench", "kernels", *argv], env=env).returncode)
    k, n = map(int, (slice_arg or "0/1").split("/"))
    rows = compile_matrix(k, n)
    print_matrix(rows)
    if json_path:
        with open(json_path, "w") as f:
            json.dump([{"kernel": launch.kernel, "function": launch.fn.__name__, "config": launch.config,
                        "tuned": launch.tuned, "report": dataclasses.asdict(report)} for launch, report in rows],
                      f, indent=1)
        print(f"\nwrote {json_path}")
