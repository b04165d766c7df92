"""Learner side of forbidden functions: ``Guard`` replaces each function an exercise forbids
(under every name it has in ``torch``, ``torch.nn.functional`` and ``torch._C._nn``; a method
such as ``torch.Tensor.softmax`` on its class) by a wrapper that raises
``ForbiddenFunctionError`` while an exercise that forbids it is being graded. In the sandbox the
guard is installed before any learner cell runs, so aliases taken by a cell are guarded too.
The static look at a cell's source is grader side: ``autograder.rules.forbid``.

Below the names, ``operation_limit`` checks every aten operation learner code runs (a dispatch
mode) against the exercise's allowed set (``autograder.rules.operations``).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
from typing import Any, Iterable, Iterator

import torch

SEARCHED = ("torch", "torch.nn.functional", "torch._C._nn", "torch.functional", "torch.special")


class ForbiddenFunctionError(RuntimeError):
    """Learner code called a function its exercise forbids."""


def _owner(dotted: str) -> tuple[Any, str]:
    """(object holding the function, its attribute name): a module, or a class such as
    ``torch.Tensor`` for a method (``"torch.Tensor.softmax"``)."""
    parent, _, attr = dotted.rpartition(".")
    module, _, cls = parent.rpartition(".")
    if cls[:1].isupper():
        return getattr(importlib.import_module(module), cls), attr
    return importlib.import_module(parent), attr


def _resolve(dotted: str) -> Any:
    owner, attr = _owner(dotted)
    return getattr(owner, attr)


class Guard:
    """Wraps each function of ``names`` (dotted paths); ``active`` is the set that raises now."""

    def __init__(self, names: Iterable[str]):
        self.names = sorted(set(names))
        self.active: frozenset[str] = frozenset()
        self._patches: list[tuple[Any, str, Any]] = []

    def install(self) -> "Guard":
        for name in self.names:
            original = _resolve(name)
            wrapper = self._wrapper(name, original)
            owner, attr = _owner(name)
            if isinstance(owner, type):  # a method: patched on its class (x.softmax(-1))
                setattr(owner, attr, wrapper)
                self._patches.append((owner, attr, original))
                continue
            if getattr(owner, attr) is original and owner.__name__ not in SEARCHED:
                setattr(owner, attr, wrapper)   # where it lives (torch.nn.attention.flex_attention)
                self._patches.append((owner, attr, original))
            for module_name in SEARCHED:
                module = importlib.import_module(module_name)
                for attr, value in list(vars(module).items()):
                    if value is original:
                        setattr(module, attr, wrapper)
                        self._patches.append((module, attr, original))
        return self

    def uninstall(self) -> None:
        for module, attr, original in reversed(self._patches):
            setattr(module, attr, original)
        self._patches.clear()

    def _wrapper(self, name: str, original: Any):
        @functools.wraps(original)
        def guarded(*args, **kwargs):
            if name in self.active:
                raise ForbiddenFunctionError(
                    f"`{name}` is forbidden in this exercise: the grader forbids it so that you "
                    "write the computation yourself")
            return original(*args, **kwargs)
        return guarded

    @contextlib.contextmanager
    def forbidding(self, names: Iterable[str]) -> Iterator[None]:
        """Make ``names`` raise inside the block."""
        before, self.active = self.active, frozenset(names) & frozenset(self.names)
        try:
            yield
        finally:
            self.active = before


class ForbiddenOperationError(RuntimeError):
    """Learner code ran a torch operation outside its exercise's allowed set; ``names`` are the
    operations refused during the call."""

    def __init__(self, names: list[str]):
        super().__init__(f"the operation{'s' if len(names) > 1 else ''} {', '.join(names)} "
                         f"{'are' if len(names) > 1 else 'is'} not allowed in this exercise")
        self.names = list(names)


_PAUSED = [0]   # > 0 while the worker's own code runs inside a learner call (proxies' requests)


@contextlib.contextmanager
def limits_paused() -> Iterator[None]:
    """Operations run inside the block are the worker's own (a proxy serialising a request), not
    the learner's: no limit applies to them."""
    _PAUSED[0] += 1
    try:
        yield
    finally:
        _PAUSED[0] -= 1


def operation_name(func: Any) -> str:
    """``aten.name`` of an operation as the dispatcher sees it (overloads folded)."""
    packet = getattr(func, "overloadpacket", func)
    return str(packet)


@functools.lru_cache(maxsize=1)
def _limit_mode():
    """The dispatch mode class, built on first use (the import reaches torch internals)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OperationLimit(TorchDispatchMode):
        """While active, every aten operation the learner's code runs is checked against
        ``allowed`` (names such as ``aten.exp``) at the dispatcher, below every Python name a
        cell could use. The first one outside raises ``ForbiddenOperationError`` and is kept in
        ``refused``, so that catching the error does not hide it. ``largest`` is the size in
        bytes of the largest tensor any allowed operation allocated (views of an input do not
        count): a grader checks "bounded memory" with it on every test size."""

        def __init__(self, allowed: Iterable[str]):
            super().__init__()
            self.allowed = frozenset(allowed)
            self.refused: list[str] = []
            self.verdicts: dict = {}    # operation -> allowed, looked up once per call
            self.largest = 0            # bytes of the largest tensor an operation allocated

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            allowed = self.verdicts.get(func)
            if allowed is None:
                allowed = self.verdicts[func] = operation_name(func) in self.allowed
            if _PAUSED[0]:
                return func(*args, **(kwargs or {}))
            if not allowed:
                name = operation_name(func)
                if name not in self.refused:
                    self.refused.append(name)
                raise ForbiddenOperationError([name])
            out = func(*args, **(kwargs or {}))
            self.largest = max(self.largest, _allocated(out, args, kwargs, self.largest))
            return out

    return OperationLimit


def _storages(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _storages(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _storages(v)]
    return [value.untyped_storage()] if isinstance(value, torch.Tensor) else []


def _allocated(out: Any, args: tuple, kwargs: dict | None, above: int) -> int:
    """Bytes of the largest tensor in ``out`` whose storage is new (not a view of an input),
    when larger than ``above`` (else 0: the inputs are looked at only for a new largest)."""
    larger = [s for s in _storages(out) if s.nbytes() > above]
    if not larger:
        return 0
    inputs = {s.data_ptr() for s in _storages((args, kwargs or {})) if s.nbytes()}
    return max((s.nbytes() for s in larger if s.data_ptr() not in inputs), default=0)


def operation_limit(allowed: Iterable[str] | None):
    """A context manager limiting learner code to the operations ``allowed`` (``None``: no
    limit; its ``refused`` is then always empty)."""
    if allowed is None:
        return _NoLimit()
    return _limit_mode()(allowed)


class _NoLimit(contextlib.nullcontext):
    refused: list[str] = []
    largest = 0
