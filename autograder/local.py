"""In-process learner for notebook check cells (``check``) and for running the graders against
the solution files (``autograder/tests/conftest.py``). No isolation: advisory only."""
from __future__ import annotations

import importlib.util
import math
import secrets
import sys
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F
from torch import Tensor

from autograder.errors import LearnerError, describe
from autograder.refs import Handle, Resolver, from_wire, to_wire

TESTS_DIR = Path(__file__).resolve().parent / "tests"


def base_namespace() -> dict[str, Any]:
    """What every learner namespace starts with: ``torch``, ``math``, ``F``, ``Tensor``."""
    return {"__name__": "__learner__", "torch": torch, "math": math, "F": F, "Tensor": Tensor}


def _build_tiny(seed: int):
    from reference.model import build_tiny
    return build_tiny(seed)


class LocalLearner:
    """The learner API over a namespace ``dict`` of the learner's objects, called directly.

    Arguments and results are converted exactly as for the sandbox (tensors copied, markers
    resolved, non-plain results returned as ``Handle``), so a grader test behaves the same.
    """

    def __init__(self, namespace: dict[str, Any]):
        self.namespace = namespace
        self.last_trace: list[tuple[tuple[int, ...], bool]] = []
        self._resolver = Resolver(_build_tiny)

    @classmethod
    def from_file(cls, path: str | Path) -> "LocalLearner":
        """Learner whose namespace is the Python file ``path`` executed in ``base_namespace()``."""
        namespace = base_namespace()
        source = Path(path).read_text()
        exec(compile(source, str(path), "exec"), namespace)
        return cls(namespace)

    def _run(self, target: Any, args: tuple, kwargs: dict) -> Any:
        args, kwargs = self._resolver.args(to_wire((args, kwargs)))
        self._resolver.trace.clear()
        try:
            value = target(*args, **kwargs)
        except Exception as exc:
            raise LearnerError(describe(exc)) from exc
        finally:
            self.last_trace = list(self._resolver.trace)
        return from_wire(self._resolver.result(value))

    def _lookup(self, name: str) -> Any:
        if name not in self.namespace:
            raise LearnerError(f"`{name}` is not defined (run its cell first)")
        return self.namespace[name]

    def _object(self, handle: Handle) -> Any:
        return self._resolver.args(to_wire(handle))

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
        return self._run(lambda: getattr(self._object(handle), attr), (), {})


def load_graders() -> None:
    """Import every ``autograder/tests/test_ch*.py`` so that ``plugin.REGISTRY`` is complete."""
    for path in sorted(TESTS_DIR.glob("test_ch*.py")):
        name = f"_autograder_graders.{path.stem}"
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


def check(obj: Any, seed: int | None = None) -> None:
    """Run the grader tests of exercise ``obj.__name__`` in-process against the notebook's
    objects and print one ✓/✗ line per test, the teaching message of each failure and points."""
    from autograder.plugin import REGISTRY, failure_message
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
    share = exercise.points / len(exercise.tests)
    total = 0.0
    print(f"check({name}) — seed {seed}")
    for key, test in exercise.tests.items():
        try:
            test(learner=LocalLearner(namespace), seed=seed)
        except Exception as exc:
            message = failure_message(exc).replace("\n", "\n      ")
            print(f"  ✗ {test.__name__:<40} 0/{share:g}\n      {message}")
        else:
            total += share
            print(f"  ✓ {test.__name__:<40} {share:g}/{share:g}")
    print(f"  {total:g}/{exercise.points:g} points" + ("  — all tests pass!" if
          total == exercise.points else ""))
    if total < exercise.points:  # a failing check cell is what nbgrader scores as 0
        raise AssertionError(f"{name}: {total:g}/{exercise.points:g} points, see the ✗ lines above")
