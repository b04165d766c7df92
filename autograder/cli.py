"""Command line: ``python -m autograder grade PATH [options]`` (see ``--help``)."""
from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import json
import multiprocessing
import os
import re
import secrets
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported lazily: torch and pytest are slow to import
    from autograder.grading import SubmissionResult


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="grade a notebook or a folder of notebooks")
    g.add_argument("path", type=Path, help="a .ipynb file or a folder (searched recursively)")
    g.add_argument("--json", type=Path, help="results file (a name ending in .json, for one "
                   "notebook) or a directory receiving one <submission>.json per notebook")
    g.add_argument("--csv", type=Path, help="CSV of points: one row per submission")
    g.add_argument("--jobs", type=int, default=1, help="submissions graded in parallel")
    g.add_argument("--timeout", type=float, default=10, help="seconds per learner call")
    g.add_argument("--budget", type=float, default=300, help="seconds of learner time for a "
                   "whole submission; tests after it is spent fail with 'time budget exhausted'")
    g.add_argument("--memory-mb", type=int, default=4096, help="address-space limit of the "
                   "learner's process")
    g.add_argument("--seed", type=int, help="seed of the random test inputs (default: random)")
    g.add_argument("--tests", type=Path, help="grader file to use instead of the chapter's")
    g.add_argument("--chapter", help="grade as this chapter (ch01 or ch01_naive_decoding), "
                   "whatever the notebook's metadata or file name say")
    g.add_argument("--hide", type=Path, action="append", default=[], help="another directory "
                   "the learner's process must not see (repeatable)")
    g.add_argument("--no-isolation", action="store_true", help="run the learner's code "
                   "without a sandbox, even as root where grading is otherwise refused when no "
                   "sandbox can be set up (debugging only)")
    g.add_argument("--quiet", action="store_true", help="print only the total per submission")
    s = sub.add_parser("source-notebook", help="write the nbgrader source notebook of a chapter "
                       "(exercise notebook with the solutions between the markers)")
    s.add_argument("chapter", help="ch01 or ch01_naive_decoding")
    s.add_argument("-o", "--output", type=Path, required=True, help="directory to write into")
    z = sub.add_parser("gradescope", help="build the Gradescope autograder zip of a chapter")
    z.add_argument("chapter", help="ch01 or ch01_naive_decoding")
    z.add_argument("-o", "--output", type=Path, required=True, help="directory to write into")
    return p


def instructor_command(args: argparse.Namespace) -> int:
    """``source-notebook`` and ``gradescope``: write a file, print its path."""
    from autograder import gradescope_zip
    try:
        chapter = gradescope_zip.resolve_chapter(args.chapter)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.command == "gradescope":
        print(gradescope_zip.build(chapter, args.output))
        return 0
    import json
    from autograder.source_notebook import source_notebook
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / f"{chapter}.ipynb"
    path.write_text(json.dumps(source_notebook(chapter), indent=1, ensure_ascii=False) + "\n")
    print(path)
    return 0


def submissions(path: Path) -> list[Path]:
    """The notebooks to grade: ``path`` itself or every .ipynb below it (no checkpoints)."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def _grade_one(args: tuple) -> "SubmissionResult":
    from autograder.grading import SubmissionResult, grade
    path, options = args
    try:
        return grade(path, **options)
    except Exception as exc:  # noqa: BLE001 - one broken submission must not stop a batch
        return SubmissionResult(str(path), None, options["seed"],
                                error=f"grader failure: {type(exc).__name__}: {exc}")


def json_name(path: Path, root: Path) -> str:
    """File name of a submission's results in the output directory."""
    return re.sub(r"[^\w.-]+", "__", str(path.relative_to(root).with_suffix(""))) + ".json"


def _terminate(signum, frame) -> None:
    """SIGTERM/SIGINT: kill every sandbox of this process, then exit (results files already
    hold the "did not finish" placeholder written at the start)."""
    from autograder.sandbox import kill_all
    kill_all()
    os._exit(128 + signum)


def _pool_worker_init() -> None:
    """A grading process of a batch dies with the main one and kills its sandboxes."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    signal.signal(signal.SIGTERM, _terminate)


def _placeholder(path: Path, message: str) -> None:
    """Overwrite a results file this run owns, so that no stale or learner-written file
    survives whatever happens next."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"score": 0, "output": message, "tests": []}))


def results_path(json_arg: Path, path: Path, root: Path) -> Path:
    """Where the results of notebook ``path`` go: ``--json`` itself for a single notebook, or a
    file in the ``--json`` directory (a folder was graded, or ``--json`` is an existing dir)."""
    if root.is_dir():
        return json_arg / json_name(path, root)
    return json_arg / f"{path.stem}.json" if json_arg.is_dir() else json_arg


def run_batch(paths: list[Path], options: dict, jobs: int) -> list["SubmissionResult"]:
    """Grade ``paths`` over ``jobs`` processes with a progress bar; results in input order."""
    from tqdm import tqdm
    work = [(p, options) for p in paths]
    if jobs <= 1 or len(paths) == 1:
        return [_grade_one(w) for w in tqdm(work, desc="grading", disable=len(paths) == 1)]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context,
                                                initializer=_pool_worker_init) as pool:
        return list(tqdm(pool.map(_grade_one, work), total=len(work), desc="grading"))


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status: 0 when grading ran (even with low scores), 3 when
    it was refused (root without a sandbox)."""
    args = parser().parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _terminate)
    if args.command != "grade":
        return instructor_command(args)
    if args.chapter:
        from autograder.gradescope_zip import resolve_chapter
        from autograder.grading import grader_file
        try:
            args.tests = grader_file(resolve_chapter(args.chapter))
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
    paths = submissions(args.path)
    if not paths:
        print(f"no notebooks found at {args.path}", file=sys.stderr)
        return 2
    seed = secrets.randbelow(2**31) if args.seed is None else args.seed
    batch = args.path.is_dir()
    if args.json and not batch and (args.json.is_dir() or args.json.suffix != ".json"):
        # one notebook and a directory (existing, or a name without .json): DIR/<notebook>.json
        args.json = args.json / json_name(args.path, args.path.parent)
    outputs = [args.json if batch else args.json and args.json.parent, args.csv and args.csv.parent]
    hide = [args.path if batch else args.path.parent, *(d for d in outputs if d), *args.hide]
    options = dict(seed=seed, tests=args.tests, timeout=args.timeout, memory_mb=args.memory_mb,
                   hide=[d.resolve() for d in hide], isolate=not args.no_isolation,
                   budget=args.budget)
    owned = [results_path(args.json, p, args.path) for p in paths] if args.json else []
    for path in owned:
        _placeholder(path, "grading did not finish (the grader was stopped or crashed)")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        args.csv.write_text("")
    from autograder import report  # after the placeholders: a missing torch must not keep a file
    if batch:  # a single report already names its seed in its header
        print(f"seed {seed} (replay with --seed {seed})")
    results = run_batch(paths, options, args.jobs)
    for path, result in zip(paths, results):
        print(f"{result.submission}: {result.score:g}/{result.max_score:g}" if args.quiet
              else report.text_report(result) + "\n")
        if args.json:
            report.write_json(result, results_path(args.json, path, args.path))
    if args.csv:
        report.write_csv(results, args.csv)
    refused = [r for r in results if r.refused]
    for result in refused:
        print(f"{result.submission}: {result.error}", file=sys.stderr)
    return 3 if refused else 0
