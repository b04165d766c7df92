"""The ``exercise`` mark, the registry of grader tests, and the pytest plugin that records
per-test outcomes and points.

Grader tests are written as::

    from autograder.rules.plugin import exercise

    @exercise("naive_generate", points=2)
    def test_matches_reference(learner, seed): ...

An exercise's points are split evenly over its tests (every case of a
``pytest.mark.parametrize`` test counts as one test). A test that raises
``autograder.rules.feedback.PrerequisiteFailed`` (the method is not followed: right numbers by a way the
exercise rules out) scores the whole exercise 0. ``forbid=["torch.nn.functional.x", ...]``
names functions the learner's code must not call (refused at run time and flagged in the cell's
source) and puts the exercise under the operation allow-list of ``autograder.rules.operations``
(an operation outside it scores the exercise 0, as a failed prerequisite does); ``timeout=S`` replaces the per-call time limit for this exercise (slow interpreters);
``memory_mb=M`` lowers the sandbox's memory limit while this exercise is graded (a fresh worker).
``costly=True`` marks a slow test (a case sized to a memory limit, a build for the GPUs): it is
not run, and scores 0 as the gate would score it, once an earlier test of the exercise has failed
its prerequisite, so a submission that skips the technique costs seconds, not minutes (put such
tests last in their exercise).
The verdict is computed here, in the grader process, from pytest's own reports; learner output
is shown, never parsed. A test that skips itself scores 0 (shown as "skipped: ...").
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pytest

from autograder.boundary.causes import LearnerError, OperationRefused
from autograder.rules.feedback import PrerequisiteFailed
from autograder.rules.forbid import (defines_kernel, detour_message, detours_in_other_cell,
                                     detours_in_source, forbidden_message, other_cell_message,
                                     uses_in_source)
from autograder.rules.operations import RECORDED


@dataclass
class Exercise:
    """One graded exercise: ``grade_id`` (the learner's function/class name), total ``points``,
    ``tests`` maps ``"file::function"`` to the test function."""
    grade_id: str
    points: float
    tests: dict[str, Callable] = field(default_factory=dict)
    forbid: tuple[str, ...] = ()
    timeout: float | None = None
    memory_mb: int | None = None


REGISTRY: dict[str, Exercise] = {}


def exercise(grade_id: str, points: float = 1, *, forbid: Iterable[str] = (),
             timeout: float | None = None, memory_mb: int | None = None,
             costly: bool = False, weight: int = 1) -> Callable[[Callable], Callable]:
    """Decorator: mark a grader test as part of exercise ``grade_id`` worth ``points`` in total
    (shared by all tests of that exercise, in proportion to their ``weight``s) and register it
    in ``REGISTRY``. ``forbid`` (dotted function names), ``timeout`` (seconds per learner call)
    and ``memory_mb`` (the sandbox's memory limit, when below ``--memory-mb``) apply to the
    whole exercise; ``costly`` and ``weight`` to this test only (``costly``: not run after a
    failed prerequisite of the exercise)."""
    def decorate(fn: Callable) -> Callable:
        entry = REGISTRY.setdefault(grade_id, Exercise(grade_id, points))
        if entry.points != points:
            raise ValueError(f"exercise {grade_id!r} is declared with points={entry.points} and "
                             f"points={points}; use the same total on every test")
        entry.forbid = tuple(sorted(set(entry.forbid) | set(forbid)))
        if timeout is not None:
            entry.timeout = max(entry.timeout or 0.0, float(timeout))
        if memory_mb is not None:
            entry.memory_mb = min(entry.memory_mb or memory_mb, int(memory_mb))
        entry.tests[f"{fn.__code__.co_filename}::{fn.__name__}"] = fn
        return pytest.mark.exercise(grade_id, points=points, costly=costly, weight=weight)(fn)
    return decorate


def static_check(learner: Any, entry: Exercise | None) -> None:
    """Tell ``learner`` which exercise is graded now (``begin(exercise)``, if it has it) and fail
    when the exercise's cell source (``cell_source(grade_id)``) names a forbidden function."""
    if entry is None:
        return
    if hasattr(learner, "begin"):
        learner.begin(entry)
    problem = static_problem(learner, entry)
    if problem:
        raise LearnerError(problem)


def static_problem(learner: Any, entry: Exercise) -> str:
    """The message of ``static_check``'s failure for ``entry`` ("" if its cell passes)."""
    source = learner.cell_source(entry.grade_id) if hasattr(learner, "cell_source") else None
    used = uses_in_source(source, entry.forbid) if source and entry.forbid else []
    if used:
        return forbidden_message(entry.grade_id, used)
    detours = detours_in_source(source, entry.grade_id) \
        if source and records_in_process(entry, source) else []
    return detour_message(entry.grade_id, detours, entry.forbid) if detours else ""


def other_cells_problem(learner: Any, entry: Exercise) -> str:
    """Why ``entry`` scores 0 whatever its tests say ("" if nothing): where its verdict rests on
    records kept in the learner's process, another cell the worker runs (``learner.cells``)
    reaching around them as its own cell may not (``detours_in_other_cell``). Its tests still run,
    so that their own messages are shown too."""
    source = learner.cell_source(entry.grade_id) if hasattr(learner, "cell_source") else None
    if not (source and records_in_process(entry, source)):
        return ""
    return "\n".join(other_cell_message(entry.grade_id, other, list(found))
                     for other, cell in getattr(learner, "cells", ())
                     if other != entry.grade_id and (found := detours_in_other_cell(cell, other)))


def records_in_process(entry: Exercise, source: str) -> bool:
    """Whether the exercise's verdict rests on something recorded in the learner's process, so
    that its cell may not reach around the record: the operations of an exercise that forbids
    functions, the memory of a ``RECORDED`` one, the loads and stores of a kernel."""
    return bool(entry.forbid) or entry.grade_id in RECORDED or defines_kernel(source,
                                                                               entry.grade_id)


@dataclass
class TestOutcome:
    """Result of one grader test: ``score`` out of ``max_score`` points; ``message`` is the
    teaching message of a failure (``""`` when passed); ``output`` the learner's output."""
    __test__ = False  # not a pytest test class

    name: str
    grade_id: str
    max_score: float
    score: float
    passed: bool
    message: str = ""
    output: str = ""
    seconds: float = 0.0
    prerequisite: str = ""   # failed with PrerequisiteFailed: its rule; the exercise scores 0


def apply_gates(outcomes: list[TestOutcome]) -> list[TestOutcome]:
    """Score 0 every test of an exercise one of whose tests failed with ``PrerequisiteFailed``;
    a test that passed says so and why (the failed prerequisite's message comes with its test)."""
    gates: dict[str, TestOutcome] = {}
    for o in outcomes:
        if o.prerequisite:
            gates.setdefault(o.grade_id, o)
    for o in outcomes:
        gate = gates.get(o.grade_id)
        if gate is None or o.prerequisite or o.score == 0:
            continue
        o.score, o.passed = 0.0, False
        o.message = (f"passed, but 0 points: {gate.prerequisite} (see `{gate.name}`; every "
                     f"test of `{o.grade_id}` needs it)")
    return outcomes


COLLECTOR = pytest.StashKey["Collector"]()


def failure_message(exc: BaseException) -> str:
    """The message a failed test shows: assertion text, or the exception type and message."""
    if isinstance(exc, AssertionError):
        return str(exc).strip() or "assertion failed"
    return f"{type(exc).__name__}: {exc}"


def points_of_tests(points: float, weights: list[int]) -> list[float]:
    """An exercise's ``points`` shared by its tests in proportion to their ``weights``, in whole
    hundredths that add up to ``points`` exactly (5 over 3 equal tests: 1.67, 1.67, 1.66), so
    that no report shows 5.83333 or a total of 5.0001; the hundredths left over go to the first
    tests."""
    hundredths, total = round(points * 100), sum(weights)
    shares = [hundredths * w // total for w in weights]
    left = hundredths - sum(shares)
    return [(share + (i < left)) / 100 for i, share in enumerate(shares)]


def memory_last(entry: Exercise | None) -> float:
    """Sort key that grades the exercises with a memory limit of their own (``memory_mb``) after
    the others, the highest limit first (a stable sort keeps every exercise's own order): each
    limit then starts one worker, where grading in file order could start one for the limited
    exercise and another after it. Outcomes are reported in file order (``Collector.position``)."""
    return -entry.memory_mb if entry is not None and entry.memory_mb else float("-inf")


def graded_order(grade_ids: Iterable[str]) -> list[Exercise]:
    """The registered exercises among ``grade_ids`` in the order the ``Collector`` grades them."""
    return sorted((REGISTRY[g] for g in dict.fromkeys(grade_ids) if g in REGISTRY), key=memory_last)


def _memory_last(item: pytest.Item) -> float:
    mark = item.get_closest_marker("exercise")
    return memory_last(REGISTRY.get(mark.args[0]) if mark else None)


class Collector:
    """pytest plugin: provides the ``learner`` and ``seed`` fixtures and collects
    ``outcomes`` (list of ``TestOutcome``) for tests carrying the ``exercise`` mark.

    ``learner`` is an ``autograder.learner.Learner`` (``SandboxLearner``, ``LocalLearner``); if it
    has ``take_output() -> str``, that text becomes the test's output.
    """

    def __init__(self, learner: Any, seed: int):
        self.learner = learner
        self.seed = seed
        self.outcomes: list[TestOutcome] = []
        self._share: dict[str, float] = {}
        self.position: dict[str, int] = {}   # test name -> its place in the grader file
        self.start_failed: Exception | None = None   # why the learner's sandbox did not start
        self._start = 0.0

    @pytest.fixture(name="learner")
    def learner_fixture(self) -> Any:
        return self.learner

    @pytest.fixture(name="seed")
    def seed_fixture(self) -> int:
        return self.seed

    def pytest_configure(self, config: pytest.Config) -> None:
        config.stash[COLLECTOR] = self
        config.addinivalue_line("markers", "exercise(grade_id, points): a graded test")

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        graded: dict[str, list[pytest.Item]] = {}
        for item in items:
            mark = item.get_closest_marker("exercise")
            if mark:
                graded.setdefault(mark.args[0], []).append(item)
        for tests in graded.values():
            marks = [item.get_closest_marker("exercise") for item in tests]
            shares = points_of_tests(marks[0].kwargs.get("points", 1),
                                     [mark.kwargs.get("weight", 1) for mark in marks])
            self._share.update({item.nodeid: share for item, share in zip(tests, shares)})
        self.position = {item.name: i for i, item in enumerate(items)}
        items.sort(key=_memory_last)
        start = getattr(self.learner, "start", None)
        if start is not None:   # a sandbox: its worker is ready before the first test, or none runs
            marks = (item.get_closest_marker("exercise") for item in items)
            plan = dict.fromkeys(mark.args[0] for mark in marks if mark)
            try:   # an exercise whose cell fails the static look calls no learner code
                start([REGISTRY[grade_id] for grade_id in plan if grade_id in REGISTRY
                       and not static_problem(self.learner, REGISTRY[grade_id])])
            except Exception as exc:  # noqa: BLE001 - handed to whoever ran the tests
                self.start_failed = exc
                items.clear()


    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self._start = time.monotonic()
        if hasattr(self.learner, "take_output"):
            self.learner.take_output()
        if hasattr(self.learner, "take_notes"):
            self.learner.take_notes()
        mark = item.get_closest_marker("exercise")
        if mark:
            gate = next((o for o in self.outcomes if o.grade_id == mark.args[0] and o.prerequisite),
                        None) if mark.kwargs.get("costly") else None
            if gate is not None:
                pytest.skip(f"not run: {gate.prerequisite} (see `{gate.name}`); this slow test "
                            "runs once the exercise's other tests hold it")
            static_check(self.learner, REGISTRY.get(mark.args[0]))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        mark = item.get_closest_marker("exercise")
        done = call.when == "call" or (call.when == "setup" and report.outcome != "passed")
        if not mark or not done:
            return report
        passed = report.passed
        if call.excinfo is None:
            message = "" if passed else f"skipped: {report.longrepr}"
        elif call.excinfo.errisinstance(pytest.skip.Exception):
            message = f"skipped: {call.excinfo.value.msg}"
        else:
            message = failure_message(call.excinfo.value)
            if call.when == "setup" and not isinstance(call.excinfo.value, LearnerError):
                message = f"grader error during set-up: {message}"
        output = self.learner.take_output() if hasattr(self.learner, "take_output") else ""
        note = self.learner.take_notes() if hasattr(self.learner, "take_notes") else ""
        message = note if passed and note else message   # a passing test's note (e.g. GPU builds)
        entry = REGISTRY.get(mark.args[0])
        problem = other_cells_problem(self.learner, entry) if entry is not None else ""
        if problem:
            passed = False
            message = f"{message}\n{problem}" if message else f"passed, but 0 points: {problem}"
        share = self._share[item.nodeid]
        self.outcomes.append(TestOutcome(
            name=item.name, grade_id=mark.args[0], max_score=share,
            score=share if passed else 0.0, passed=passed, message=message, output=output,
            seconds=time.monotonic() - self._start,
            prerequisite=call.excinfo.value.rule if call.excinfo is not None
            and call.excinfo.errisinstance((PrerequisiteFailed, OperationRefused)) else ""))
        return report
