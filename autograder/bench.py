"""Class-scale timing of the grader: ``python -m autograder.bench [-o DIR] [--batch N] [--jobs J]``.

For every chapter (or ``--chapters ch01 ch06``), the wall-clock time of
``python -m autograder grade NOTEBOOK`` (a fresh process, as a batch job or Gradescope runs it)
on the untouched stub, the solution notebook and a hostile one (every solution cell kills its
worker with ``os._exit``: a fresh sandbox per cell, the costliest honest-looking failure that
is not a time-out), then one ``--jobs J`` batch of ``N`` solution notebooks of chapter 01.
Prints a Markdown table (the one in ``autograder/README.md``) and the batch figure.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder.source_notebook import EXERCISES, source_notebook

ROOT = Path(__file__).resolve().parent.parent
HOSTILE_CELL = "import os\nos._exit(1)\n"


def variants(chapter: str) -> dict[str, dict]:
    """stub, solution and hostile notebooks of ``chapter``."""
    stub = json.loads((EXERCISES / f"{chapter}.ipynb").read_text())
    hostile = source_notebook(chapter)
    for cell in hostile["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            cell["source"] = HOSTILE_CELL
    return {"stub": stub, "solution": source_notebook(chapter), "hostile": hostile}


def grade(path: Path, *extra: str) -> tuple[float, str]:
    """Seconds for ``python -m autograder grade path`` and its last line."""
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "autograder", "grade", str(path), "--quiet",
                          "--seed", "1", *extra], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), check=False)
    seconds = time.monotonic() - start
    lines = (run.stdout.strip() or run.stderr.strip() or "?").splitlines()
    return seconds, lines[-1].split(": ")[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chapters", nargs="*", help="chapters (default: every exercise notebook)")
    p.add_argument("--batch", type=int, default=100, help="notebooks in the batch (0: none)")
    p.add_argument("--jobs", type=int, default=2, help="--jobs of the batch")
    p.add_argument("-o", "--output", type=Path, help="work directory (default: a temporary one)")
    args = p.parse_args(argv)
    chapters = sorted(c.stem for c in EXERCISES.glob("ch[0-9][0-9]_*.ipynb"))
    if args.chapters:
        chapters = [c for c in chapters if any(c.startswith(x) for x in args.chapters)]
    work = args.output or Path(tempfile.mkdtemp(prefix="autograder-bench-"))
    print(f"{os.cpu_count()} CPUs; wall-clock seconds of `python -m autograder grade` "
          "(score in brackets)\n")
    print("| chapter | stub | solution | hostile (every cell kills its worker) |")
    print("|---|---|---|---|")
    for chapter in chapters:
        cells = []
        for name, nb in variants(chapter).items():
            path = work / chapter / f"{name}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(nb))
            seconds, score = grade(path, "--chapter", chapter)
            cells.append(f"{seconds:.1f} s ({score})")
        print(f"| {chapter} | " + " | ".join(cells) + " |", flush=True)
    if args.batch:
        folder = work / "batch"
        folder.mkdir(parents=True, exist_ok=True)
        solution = json.dumps(source_notebook("ch01_naive_decoding"))
        for i in range(args.batch):
            (folder / f"learner{i:03d}_ch01.ipynb").write_text(solution)
        seconds, _ = grade(folder, "--jobs", str(args.jobs), "--json", str(work / "batch-out"))
        print(f"\nbatch: {args.batch} ch01 solution notebooks, --jobs {args.jobs}: "
              f"{seconds:.0f} s ({seconds / args.batch:.2f} s per notebook)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
