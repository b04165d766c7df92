"""``LocalLearner``: the ``Learner`` (``autograder.learner``) whose code runs in this process,
for notebook check cells (``check``) and for running the graders against the solution files
(``autograder/graders/conftest.py``). No isolation: advisory only.

Models and caches are the same proxies as in the sandbox, answered by a ``ReferenceStore`` in
this process, so a grader test behaves the same in both places.
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import math
import secrets
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.nn import functional as F
from torch import Tensor

from autograder.boundary.builds import KernelBuilder
from autograder.boundary.causes import LearnerError, OperationRefused, describe, learner_frame
from autograder.boundary.guard import CallWork, Guard, limits_paused, operation_limit
from autograder.boundary.launching import launch
from autograder.boundary.protocol import HEADER, decode, encode
from autograder.boundary.proxies import LearnerSide
from autograder.boundary.refs import Handle, from_wire, to_wire
from autograder.boundary.traffic import LaunchTraffic
from autograder.learner import Learner
from autograder.rules.feedback import PrerequisiteFailed

GRADERS_DIR = Path(__file__).resolve().parent / "graders"
BUILDER: list[KernelBuilder] = []   # this process's compile worker (not isolated), at the first build


def base_namespace() -> dict[str, Any]:
    """What every learner namespace starts with: ``torch``, ``math``, ``F``, ``Tensor``."""
    return {"__name__": "__learner__", "torch": torch, "math": math, "F": F, "Tensor": Tensor}


def _copy(value: Any) -> Any:
    """``value`` after a trip through the wire format (as between two processes)."""
    return decode(encode(value)[HEADER.size:])


class LocalLearner(Learner):
    """The learner API over a namespace ``dict`` of the learner's objects, called directly.

    Arguments and results are converted exactly as for the sandbox (tensors copied, markers
    become proxies answered by ``self.store``, non-plain results returned as ``Handle``).
    """

    def __init__(self, namespace: dict[str, Any], sources: dict[str, str] | None = None):
        super().__init__()
        self.namespace = namespace
        self.sources = dict(sources or {})
        self._side = LearnerSide(self._remote)
        self._guard: Guard | None = None

    @classmethod
    def from_file(cls, path: str | Path) -> "LocalLearner":
        """Learner whose namespace is the Python file ``path`` executed in ``base_namespace()``."""
        from autograder.solutions import split_sections
        namespace = base_namespace()
        source = Path(path).read_text()
        exec(compile(source, str(path), "exec"), namespace)
        return cls(namespace, {s.grade_id: s.source for s in split_sections(source)})

    def cell_list(self) -> list[tuple[str, str]]:
        return list(self.sources.items())

    def _remote(self, request: dict) -> dict:
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.uninstall()  # the reference code may use what the learner may not
        try:
            with limits_paused():
                return _copy(self.store.handle(_copy(request)))
        finally:
            if guard is not None:
                self._guard = guard.install()

    def _run(self, target: Callable, args: tuple, kwargs: dict, limit_ops: bool = True) -> Any:
        self.largest_allocation, self.last_call_work = 0, CallWork()
        args, kwargs = self._side.args(_copy(to_wire((args, kwargs), self.store.register)))
        self.store.trace.clear()
        forbid = self.exercise.forbid if self.exercise is not None else ()
        guard = Guard(forbid).install() if forbid else None
        self._guard = guard
        limit = operation_limit(self.allowed_operations() if limit_ops else None)
        where = ""   # the learner's line that ran a refused operation, when one raised
        try:
            with guard.forbidding(forbid) if guard else contextlib.nullcontext(), limit:
                value = target(*args, **kwargs)
        except Exception as exc:
            if not limit.refused:   # a refused operation is the verdict, whatever followed it
                raise LearnerError(describe(exc)) from exc
            where = learner_frame(exc)
        finally:
            if self._guard is not None:
                self._guard.uninstall()
            self._guard = None
        if limit.refused:
            raise self.refused(limit.refused, where)
        self.largest_allocation, self.last_call_work = limit.largest, limit.work
        return from_wire(_copy(self._side.result(value)))

    def _lookup(self, name: str) -> Any:
        if name not in self.namespace:
            raise LearnerError(f"`{name}` is not defined (run its cell first)")
        return self.namespace[name]

    def _object(self, handle: Handle) -> Any:
        return self._side.args(to_wire(handle))

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Result of the learner's function ``name(*args, **kwargs)``."""
        return self._run(self._lookup(name), args, kwargs)

    def new(self, cls: str, *args: Any, **kwargs: Any) -> Handle:
        """``Handle`` to a new instance of the learner's class ``cls``."""
        return self._run(self._lookup(cls), args, kwargs)

    def method(self, handle: Handle, name: str, *args: Any, **kwargs: Any) -> Any:
        """Result of ``obj.name(*args, **kwargs)`` for the object behind ``handle``."""
        try:
            bound = getattr(self._object(handle), name)
        except AttributeError as exc:
            raise LearnerError(describe(exc)) from exc
        return self._run(bound, args, kwargs)

    def getattr(self, handle: Handle, attr: str) -> Any:
        """Value of the attribute ``attr`` of the object behind ``handle``."""
        return self._run(lambda: getattr(self._object(handle), attr), (), {}, limit_ops=False)

    def launch(self, kernel: str, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> list:
        """Run the learner's Triton kernel ``kernel[grid](*args, **kwargs)``; returns ``args``
        after the launch, its loads and stores in ``last_traffic``; a kernel cell that is not plain
        Triton code, or any kernel while a cell names the interpreter's internals, is refused."""
        problem = self.launch_problem(kernel)
        if problem:
            raise LearnerError(problem)
        target = self._lookup(kernel)
        self.last_traffic = None

        def run(*a, **k):
            after, measured = launch(target, grid, a, k)
            self.last_traffic = LaunchTraffic.from_wire(measured)
            return after
        return self._run(run, args, kwargs, limit_ops=False)


    def build_kernel(self, kernel: str, source: str, launches: list[list]) -> dict:
        """Reports of ``source`` built for every target at each launch, by a compile worker of
        this process (a child process without TRITON_INTERPRET: this one may have interpreted
        triton, and then nothing here can be compiled)."""
        if not BUILDER:
            BUILDER.append(KernelBuilder("none", None, []))
        return BUILDER[0].build(source, kernel, launches)


def load_graders() -> None:
    """Import every ``autograder/graders/ch*.py`` so that ``plugin.REGISTRY`` is complete."""
    for path in sorted(GRADERS_DIR.glob("ch[0-9][0-9]_*.py")):
        name = f"_autograder_graders.{path.stem}"
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


def cases(test: Callable) -> list[tuple[str, dict]]:
    """``(label suffix, kwargs)`` for every case of a test's ``pytest.mark.parametrize`` marks
    (their product, as pytest generates them); ``[("", {})]`` without marks."""
    result: list[dict] = [{}]
    for mark in getattr(test, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        expanded = []
        for value in mark.args[1]:
            if isinstance(value, type(pytest.param(None))):
                value = value.values if len(names) > 1 else value.values[0]
            expanded.append(dict(zip(names, (value,) if len(names) == 1 else tuple(value))))
        result = [{**kwargs, **case} for kwargs in result for case in expanded]
    return [(_suffix(kwargs), kwargs) for kwargs in result]


def _suffix(kwargs: dict) -> str:
    shown = [str(v) if isinstance(v, (int, float, str)) else "…" for v in kwargs.values()]
    return f"[{'-'.join(shown)}]" if shown else ""


def _weight(test: Callable) -> int:
    """The test's weight among its exercise's tests (``exercise(..., weight=)``)."""
    marks = [m for m in getattr(test, "pytestmark", []) if m.name == "exercise"]
    return marks[0].kwargs.get("weight", 1) if marks else 1


def check(obj: Any, seed: int | None = None) -> None:
    """Run the grader tests of exercise ``obj.__name__`` in-process against the notebook's
    objects; print one ✓/✗ line per test (per case of a parametrized test), the teaching
    message of each failure and the points; then raise ``AssertionError`` with the teaching
    messages if any test failed (so that nbgrader sees the failure)."""
    from autograder.rules.plugin import REGISTRY, failure_message, points_of_tests, static_check
    name = getattr(obj, "__name__", None)
    load_graders()
    if name not in REGISTRY:
        print(f"check: no grader tests for {name!r} (known: {', '.join(sorted(REGISTRY))})")
        return
    exercise = REGISTRY[name]
    seed = secrets.randbelow(2**31) if seed is None else seed
    namespace = getattr(obj, "__globals__", None)
    if namespace is None:
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        namespace = vars(module) if module else {}
    namespace = dict(namespace)
    namespace[name] = obj
    try:
        sources = {name: inspect.getsource(obj)}
    except (OSError, TypeError):
        sources = {}
    runs = [(test, suffix, kwargs) for test in exercise.tests.values()
            for suffix, kwargs in cases(test)]
    shares = points_of_tests(exercise.points, [_weight(test) for test, _, _ in runs])
    total, failures, gate = 0.0, [], None
    print(f"check({name}) — seed {seed}")
    for (test, suffix, kwargs), share in zip(runs, shares):
        learner = LocalLearner(namespace, sources)
        label = test.__name__ + suffix
        try:
            static_check(learner, exercise)
            test(learner=learner, seed=seed, **kwargs)
        except (Exception, pytest.skip.Exception, pytest.fail.Exception) as exc:
            if isinstance(exc, pytest.skip.Exception):
                message = f"skipped: {exc.msg} (a skipped test earns no points)"
            else:
                message = failure_message(exc)
            if isinstance(exc, (PrerequisiteFailed, OperationRefused)) and gate is None:
                gate = (label, exc.rule)
            failures.append(f"{label}: {message}")
            message = message.replace("\n", "\n      ")
            print(f"  ✗ {label:<40} 0/{share:g}\n      {message}")
        else:
            total += share
            print(f"  ✓ {label:<40} {share:g}/{share:g}")
            if learner.notes:
                print("      " + learner.take_notes().replace("\n", "\n      "))
    if gate is not None and total:
        print(f"  0 points for the tests that pass: {gate[1]} (see `{gate[0]}`; every test "
              "needs it)")
        total = 0.0
    total = round(total, 2)   # whole hundredths, as the grader reports them
    print(f"  {total:g}/{exercise.points:g} points" + ("  — all tests pass!" if
          not failures else ""))
    if failures:
        raise AssertionError(f"{name}: {len(failures)} of {len(runs)} tests fail\n"
                             + "\n".join(failures))
