"""What the real compiler says about a chapter's kernel, in the few numbers and lines a chapter shows.

- `tile_table(kernel, words)`: for each launch of `launches.py` whose kernel is `kernel` and whose
  configuration has every word of `words` (e.g. "flash", "fp16 D=64 full": every autotune tile),
  and each GPU:
  shared memory per block (KiB), registers per thread, bytes spilled per thread, and whether it fits.
- `ptx_lines(kernel, words, target)`: the PTX of the first such launch built for `target`, with the
  lines a chapter explains picked out (`ld.global`: loads from HBM into registers, `cp.async`: from
  HBM into shared memory without them, how an A100 or H100 brings in the next K/V tiles while it
  computes, `mma`: tensor-core products, `ex2`: the exponentials) and counted.

A chapter runs with TRITON_INTERPRET=1 on a CPU, where nothing can be compiled, so both build in a
child process (`python -m reference.kernels.chapter_builds`) and keep its answer as JSON keyed by
the request, triton's version and the source of reference/kernels/: a chapter built again (or a
second chapter asking the same) reads it back without starting one. `targets.compile_for` caches
each build as well.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parent
ROOT = KERNELS_DIR.parents[1]
PTX_PATTERNS = ("ld.global", "cp.async", "mma", "ex2")


def _launches(kernel: str, words: str) -> list:
    from reference.kernels.launches import reference_launches
    chosen = [launch for launch in reference_launches()
              if launch.kernel == kernel and set(words.split()) <= set(launch.config.split())]
    if not chosen:
        raise ValueError(f"no launch of {kernel!r} with {words!r} in its configuration (reference/kernels/launches.py)")
    return chosen


def _table(kernel: str, words: str) -> list[dict]:
    from reference.kernels.targets import TARGETS, compile_for
    rows = []
    for launch in _launches(kernel, words):
        for target in TARGETS:
            report = compile_for(launch.fn, launch.args, launch.kwargs, target)
            rows.append({"config": launch.config, "target": target.name, "compiles": report.error is None,
                         "shared_kib": round(report.shared_bytes / 1024, 1), "limit_kib": target.shared_per_block // 1024,
                         "registers": report.registers, "spilled_bytes": report.spill_stores,
                         "fits": not report.problems()})
    return rows


def _ptx(kernel: str, words: str, target_name: str) -> dict:
    from reference.kernels.targets import TARGETS, compile_for
    launch = _launches(kernel, words)[0]
    target = next(t for t in TARGETS if t.name == target_name)
    _, ptx = compile_for(launch.fn, launch.args, launch.kwargs, target, with_ptx=True)
    lines = [line.strip() for line in ptx.splitlines() if line.strip() and not line.strip().startswith("//")]
    return {"config": launch.config, "target": target.name, "lines": len(lines),
            "picked": {p: [line for line in lines if _instruction(line).startswith(p)] for p in PTX_PATTERNS}}


def _instruction(line: str) -> str:
    """The opcode of a PTX line, after its predicate guard (`@%p1 ld.global.b32 ...`)."""
    words = line.split()
    return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]


def _in_child(*request: str):
    """The answer to `request`, from the cache or from a child process built without the interpreter."""
    sources = sorted((path.name, path.read_bytes()) for path in KERNELS_DIR.glob("*.py"))
    key = hashlib.sha256(repr((request, version("triton"), sources)).encode()).hexdigest()
    from reference.kernels.targets import cache_dir
    cached = cache_dir() / f"chapter-{key}.json"
    if not cached.exists():
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        run = subprocess.run([sys.executable, "-m", "reference.kernels.chapter_builds", *request], env=env,
                             cwd=ROOT, capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"building {request} failed:\n{run.stderr[-3000:]}")
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(run.stdout)
    return json.loads(cached.read_text())


def tile_table(kernel: str, words: str) -> list[dict]:
    """One row per (launch, GPU): config, target, compiles, shared_kib, limit_kib, registers,
    spilled_bytes (per thread), fits."""
    return _in_child("table", kernel, words)


def ptx_lines(kernel: str, words: str, target: str = "A100") -> dict:
    """{config, target, lines: how many PTX instructions and directives, picked: {pattern: the
    lines that start with it}} for the first launch of `kernel` with `words` built for `target`."""
    return _in_child("ptx", kernel, words, target)


if __name__ == "__main__":
    what, *rest = sys.argv[1:]
    print(json.dumps(_table(*rest) if what == "table" else _ptx(*rest)))
