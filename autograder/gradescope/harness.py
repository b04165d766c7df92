"""Trusted side of a Gradescope run (standard library only, so it works even when torch or the
grader cannot be imported): find the one submitted notebook, grade it for the chapter fixed by
the instructor's zip, and always leave a valid, honest ``results/results.json``.

Usage (from ``run_autograder``): ``python harness.py ROOT CHAPTER`` where ROOT holds
``source/`` (the zip), ``submission/`` and ``results/``. The grader writes into a private
temporary directory; its results are checked (scores add up, nothing above the maximum) and only
then copied to ``results/results.json``. Any other outcome gives 0 points and says why.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The whole grader run, kept under Gradescope's usual 10-minute autograder timeout so that a
# hung grader still leaves a result (chapters 01-02 take seconds).
GRADING_SECONDS = 480
JUNK_PARTS = ("__MACOSX", ".ipynb_checkpoints")


def candidates(submission: Path) -> list[Path]:
    """Notebooks in the submission, ignoring macOS resource forks, checkpoints, hidden files."""
    found = []
    for path in sorted(submission.rglob("*.ipynb")):
        parts = path.relative_to(submission).parts
        if any(p in JUNK_PARTS or p.startswith(".") for p in parts):
            continue
        if path.is_file() and not path.is_symlink():
            found.append(path)
    return found


def failure(reason: str, seconds: float) -> dict:
    """A 0-point result that says why nothing was graded."""
    return {"score": 0, "execution_time": round(seconds, 2), "output": reason,
            "output_format": "text", "visibility": "visible", "stdout_visibility": "hidden",
            "tests": []}


def checked(results: object) -> dict:
    """``results`` if it is a well-formed, self-consistent Gradescope document, else ValueError."""
    if not isinstance(results, dict) or not isinstance(results.get("tests"), list):
        raise ValueError("results are not an object with a list of tests")
    total = 0.0
    for test in results["tests"]:
        score, best = (test.get("score"), test.get("max_score")) if isinstance(test, dict) \
            else (None, None)
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (score, best)) \
                or not 0 <= score <= best:
            raise ValueError(f"a test has an invalid score: {test!r:.200}")
        total += score
    if not isinstance(results.get("score"), (int, float)) or abs(results["score"] - total) > 1e-6:
        raise ValueError("the total is not the sum of the tests' scores")
    return results


def grade(root: Path, chapter: str, notebook: Path, workdir: Path) -> dict:
    """Run ``python -m autograder grade`` on a private copy of ``notebook``; its checked results."""
    private = workdir / "submission" / notebook.name   # the report names the student's file
    private.parent.mkdir()
    shutil.copyfile(notebook, private)
    out = workdir / "out" / "results.json"
    out.parent.mkdir()
    source = root / "source"
    command = [sys.executable, "-m", "autograder", "grade", str(private), "--chapter", chapter,
               "--json", str(out), "--hide", str(root / "submission"),
               "--hide", str(root / "results")]
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL")}
    env["PYTHONPATH"] = str(source)
    process = subprocess.Popen(command, cwd=source, env=env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log, _ = process.communicate(timeout=GRADING_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise RuntimeError(f"grading took longer than {GRADING_SECONDS} s and was stopped")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)   # leftovers of the grader's session
        except ProcessLookupError:
            pass
    print(log)   # the instructor's log (results/stdout), never shown to the student
    if not out.is_file():
        raise RuntimeError(f"the grader stopped (exit status {process.returncode}) without "
                           "writing results; please tell the course staff")
    return checked(json.loads(out.read_text()))


def main(root: Path, chapter: str) -> int:
    start = time.monotonic()
    results_file = root / "results" / "results.json"
    notebooks = candidates(root / "submission")
    if len(notebooks) != 1:
        names = ", ".join(str(p.relative_to(root / "submission")) for p in notebooks)
        reason = (f"Expected exactly one .ipynb notebook in your submission, found "
                  f"{len(notebooks)}{': ' + names if names else ''}. Upload only your "
                  f"{chapter} exercise notebook.")
        results = failure(reason, time.monotonic() - start)
    else:
        with tempfile.TemporaryDirectory(prefix="grading-") as workdir:
            try:
                results = grade(root, chapter, notebooks[0], Path(workdir))
            except (RuntimeError, ValueError, OSError) as exc:
                results = failure(f"Not graded: {exc}", time.monotonic() - start)
    temporary = results_file.with_name("results.json.tmp")
    temporary.write_text(json.dumps(results, indent=2, ensure_ascii=False))
    os.replace(temporary, results_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
