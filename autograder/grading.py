"""Grading one submission: read the notebook, find the chapter's grader file, run it with
pytest in this (trusted) process against a ``SandboxLearner``, return a ``SubmissionResult``."""
from __future__ import annotations

import contextlib
import io
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import pytest

from autograder.boundary.causes import LearnerError
from autograder.learner import Learner
from autograder.local import GRADERS_DIR, load_graders
from autograder.notebook import NotebookError, chapter_of, read_notebook, solution_cells
from autograder.rules.plugin import REGISTRY, Collector, TestOutcome, apply_gates, graded_order
from autograder.sandbox import SandboxLearner, SandboxUnavailable

PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass
class SubmissionResult:
    """Outcome of grading ``submission``: ``outcomes`` per test, ``error`` if the submission
    could not be graded normally, ``cell_errors`` (grade_id -> why the cell did not load)."""
    submission: str
    chapter: str | None
    seed: int
    outcomes: list[TestOutcome] = field(default_factory=list)
    error: str = ""
    isolation: str = ""
    cell_errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    refused: bool = False

    @property
    def score(self) -> float:
        return sum(o.score for o in self.outcomes)

    @property
    def max_score(self) -> float:
        return sum(o.max_score for o in self.outcomes)

    def exercises(self) -> dict[str, tuple[float, float]]:
        """grade_id -> (score, max_score), in test order."""
        totals: dict[str, tuple[float, float]] = {}
        for o in self.outcomes:
            score, best = totals.get(o.grade_id, (0.0, 0.0))
            totals[o.grade_id] = (score + o.score, best + o.max_score)
        return totals


class BrokenLearner(Learner):
    """Stands in for a submission that cannot run: every call fails with ``message``."""

    def __init__(self, message: str):
        super().__init__()
        self.message = message

    def _fail(self, *args, **kwargs):
        raise LearnerError(self.message)

    call = new = method = getattr = launch = build_kernel = _fail

    def cell_list(self) -> list[tuple[str, str]]:
        return []


def chapter_graders() -> dict[str, list[str]]:
    """Chapter name (grader file stem without ``test_``) -> grade_ids it grades."""
    load_graders()
    chapters: dict[str, list[str]] = {}
    for exercise in REGISTRY.values():
        for key in exercise.tests:
            chapter = Path(key.split("::")[0]).stem.removeprefix("test_")
            chapters.setdefault(chapter, []).append(exercise.grade_id)
    return chapters


def grader_file(chapter: str) -> Path:
    """``autograder/graders/<chapter>.py`` for ``ch01_naive_decoding`` or ``ch01``."""
    matches = sorted(GRADERS_DIR.glob(f"{chapter}.py")) or \
        sorted(GRADERS_DIR.glob(f"{chapter}_*.py"))
    if not matches:
        raise FileNotFoundError(f"no grader for chapter {chapter!r} in {GRADERS_DIR}")
    return matches[0]


def run_tests(tests: Path, learner, seed: int) -> list[TestOutcome]:
    """Run the grader file ``tests`` in-process with the collecting plugin."""
    collector = Collector(learner, seed)
    args = [str(tests), "-c", os.devnull, "--rootdir", str(tests.parent), "--confcutdir",
            str(tests.parent), "--disable-plugin-autoload", "-p", "no:cacheprovider",
            "--import-mode=importlib", "--capture=sys", "-q", "--no-header",
            "-W", "ignore::pytest.PytestAssertRewriteWarning",
            # the verdict comes from the exceptions (``Collector``), never from pytest's report:
            # no traceback formatted with the grader's source, no forced garbage collections
            # at the end of every submission (about a second each with torch loaded)
            "--tb=native", "-p", "no:unraisableexception", "-p", "no:threadexception"]
    with contextlib.redirect_stdout(io.StringIO()) as log:
        status = pytest.main(args, plugins=[collector])
    if collector.start_failed is not None:
        raise collector.start_failed
    if status not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) or not collector.outcomes:
        raise RuntimeError(f"the grader {tests} did not run ({status!r}):\n{log.getvalue()[-3000:]}")
    outcomes = sorted(collector.outcomes, key=lambda o: collector.position.get(o.name, 0))
    return apply_gates(outcomes)


def grade(path: str | Path | Mapping, *, seed: int, tests: str | Path | None = None,
          timeout: float = 10, memory_mb: int = 4096, hide: Iterable[str | Path] = (),
          isolate: bool = True, budget: float = 300) -> SubmissionResult:
    """Grade the notebook at ``path`` (or a notebook dict, e.g. from ``notebook.inject``).
    ``tests`` overrides the grader file found from the chapter; ``hide`` adds directories the
    worker must not see (submissions, outputs); ``isolate=False`` runs the worker without a
    sandbox even as root; ``budget`` is the learner time (s) for the whole submission. As root
    without any sandbox the result is ``refused`` (no test runs)."""
    start = time.monotonic()
    is_dict = isinstance(path, Mapping)
    result = SubmissionResult("<notebook>" if is_dict else str(path), None, seed)
    try:
        nb = dict(path) if is_dict else read_notebook(path)
    except NotebookError as exc:
        nb, result.error = None, str(exc)
    if tests is None:
        result.chapter = chapter_of(nb or {}, None if is_dict else path, chapter_graders())
        if result.chapter is None:
            result.error = result.error or ("cannot tell which chapter this notebook is for "
                                            "(no course.chapter metadata, no chNN in the name)")
            return result
        tests = grader_file(result.chapter)
    else:
        result.chapter = Path(tests).stem.removeprefix("test_")
    if nb is None:
        learner = BrokenLearner(f"not graded: {result.error}")
    else:
        hidden = [PACKAGE_DIR.parent, PACKAGE_DIR, PACKAGE_DIR.parent / "reference", *hide]
        try:
            learner = SandboxLearner(solution_cells(nb), timeout=timeout, memory_mb=memory_mb,
                                     hide=hidden, isolate=isolate, budget=budget)
        except SandboxUnavailable as exc:
            result.error, result.refused = str(exc), True
            return result
        # the worker imports torch while pytest loads the grader's tests
        learner.launch_worker(graded_order(chapter_graders().get(result.chapter, ())))
    try:   # the worker is ready before the first test, or grading is refused
        result.outcomes = run_tests(Path(tests).resolve(), learner, seed)
    except SandboxUnavailable as exc:
        result.error, result.refused = str(exc), True
    finally:
        if isinstance(learner, SandboxLearner):
            result.cell_errors = dict(learner.cell_errors)
            result.isolation = learner.isolation  # with what the worker reported
            learner.close()
    result.seconds = time.monotonic() - start
    return result
