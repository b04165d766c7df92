"""The learner API, declared once: what every grader test may ask of the learner's code,
whichever way it runs.

``Learner`` is the interface (``call``, ``new``, ``method``, ``getattr``, ``launch``,
``build_kernel``; ``trace``/``last_trace``, ``largest_allocation``, ``last_call_work``,
``last_traffic`` after a call; ``note``) and the rules both kinds apply before learner code
runs: the exercise graded now (``begin``), the operations it allows, the refusal that names what
was refused, and the static look at a kernel's cell before it is launched. Its kinds:

- ``autograder.sandbox.SandboxLearner``: the learner's code in a confined worker process
  (``python -m autograder grade``, Gradescope, nbgrader through ``check``'s grading runs);
- ``autograder.local.LocalLearner``: the learner's code in this process (a notebook's ``check``
  cell, the graders run on the solution files); advisory, no isolation;
- ``autograder.grading.BrokenLearner``: a submission that cannot run (every call fails).

This module sits above ``rules/`` and ``boundary/`` (it imports both; neither imports it).
"""
from __future__ import annotations

import abc
from typing import Any

from autograder.boundary.causes import OperationRefused
from autograder.boundary.guard import CallWork
from autograder.boundary.store import GraderSideTrace, ReferenceStore
from autograder.boundary.traffic import LaunchTraffic
from autograder.rules.gpu_targets import start_builds
from autograder.rules.kernel_rules import cell_problem, interpreter_reach
from autograder.rules.operations import allowed_operations, refusal_message


class Learner(GraderSideTrace, abc.ABC):
    """The learner API for the cells of one submission (``cell_list()``: ``(grade_id, source)``
    pairs), with the models and caches its proxies reach answered by ``self.store``."""

    def __init__(self) -> None:
        self.store = ReferenceStore()
        self.exercise = None                  # the rules.plugin.Exercise graded now (``begin``)
        self.largest_allocation = 0           # bytes: the largest tensor the last call's operations made
        self.last_traffic: LaunchTraffic | None = None   # the last launch's loads and stores
        self.last_call_work = CallWork()      # the last call's products and exponentials
        self.notes: list[str] = []            # what a passing test adds to its report

    # -- what learner code is called through --------------------------------------------------
    @abc.abstractmethod
    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Result of the learner's function ``name(*args, **kwargs)`` (plain data or ``Handle``)."""

    @abc.abstractmethod
    def new(self, cls: str, *args: Any, **kwargs: Any) -> Any:
        """``Handle`` to a new instance of the learner's class ``cls``."""

    @abc.abstractmethod
    def method(self, handle: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        """Result of ``obj.name(*args, **kwargs)`` for the object behind ``handle``."""

    @abc.abstractmethod
    def getattr(self, handle: Any, attr: str) -> Any:
        """Value of the attribute ``attr`` of the object behind ``handle``."""

    @abc.abstractmethod
    def launch(self, kernel: str, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> list:
        """Run the learner's Triton kernel ``kernel[grid](*args, **kwargs)`` (refused unrun when
        ``launch_problem`` says so); returns ``args`` after the launch, its loads and stores in
        ``last_traffic``."""

    @abc.abstractmethod
    def build_kernel(self, kernel: str, source: str, launches: list[list]) -> dict:
        """Reports of ``source`` built for every GPU target at each launch."""

    @abc.abstractmethod
    def cell_list(self) -> list[tuple[str, str]]:
        """``(grade_id, source)`` of every cell of the submission."""

    # -- the rules applied on this side, the same for every kind --------------------------------
    def begin(self, exercise) -> None:
        """The exercise graded from now on (its ``forbid``, ``timeout``, ``memory_mb`` and
        allowed operations apply to the calls); a kernel's GPU builds start now where the kind
        builds ahead (``build_kernel_soon``)."""
        self.exercise = exercise
        start_builds(self, exercise.grade_id)

    def build_kernel_soon(self, kernel: str, source: str, launches: list[list]) -> None:
        """Start ``build_kernel``'s builds ahead, where this kind can (default: at the call)."""

    def cell_source(self, grade_id: str) -> str | None:
        return next((src for gid, src in self.cell_list() if gid == grade_id), None)

    def allowed_operations(self) -> set[str] | None:
        """The aten operations the current exercise allows (None: no limit)."""
        return allowed_operations(self.exercise)

    def refused(self, names: list[str], where: str = "") -> OperationRefused:
        """The verdict on a call that ran operations the current exercise does not allow;
        ``where``: the learner's line that ran the first of them (`` (line N of cell `x`: code)``)."""
        return OperationRefused(refusal_message(self.exercise.grade_id, names, where), names)

    def launch_problem(self, kernel: str) -> str:
        """Why ``kernel`` may not be launched ("" if it may): its cell is not plain Triton code,
        or a cell names the interpreter's internals."""
        return cell_problem(self.cell_source(kernel), kernel) or interpreter_reach(self.cell_list())

    def note(self, text: str) -> None:
        """Add ``text`` to the report of the test that runs now (shown even when it passes)."""
        self.notes.append(text)

    def take_notes(self) -> str:
        text, self.notes = "\n".join(self.notes), []
        return text
