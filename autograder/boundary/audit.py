"""Learner side: the run-time wall around what the grader records in the learner's process.

The worker records a call's operations, memory and work (``guard``) and a launch's loads and
stores (``traffic``) inside the process the learner's code runs in. The static look
(``autograder.rules.forbid.detours_in_source``) refuses the names that reach those records; this
module refuses the routes that need no name: an audit hook (PEP 578: once added, Python code
cannot remove it) that, while learner code runs, refuses

- the garbage collector's lists of live objects (``gc.get_objects``, ``gc.get_referrers``,
  ``gc.get_referents``), through which any object of the process can be found;
- stack frames (``sys._getframe``, which ``inspect`` and ``traceback.walk_stack`` use, a
  traceback's or generator's frame, ``sys._current_frames``) and tracing (``sys.settrace``,
  ``sys.setprofile``), through which the worker's own frames and their locals can be read;
- code objects made or put in a function's place (``code.__new__``, ``__code__`` assigned);
- raw memory through ``ctypes`` (``ctypes.cast``, ``memmove`` and ``memset`` raise no event,
  so they are wrapped);
- classes loaded by name from a pickle (``pickle.find_class``).

Each is refused when learner code asks for it: a cell's code is among the few frames that led to the event (so the
standard library and torch doing such things for themselves, as ``typing`` does while torch
imports a module lazily, are left alone; Triton's CUDA driver calls through ``ctypes``).
A refused event raises ``IntrospectionRefused`` (a ``ValueError``, as ``sys._getframe`` raises
when the stack is too short, so that library code that looks at the caller's frame and can do
without it, such as ``collections.namedtuple``, goes on without it). The worker's own code that
runs inside a learner call (a proxy's request to the grader: ``guard.limits_paused``) is not
learner code.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from autograder.boundary import guard


class IntrospectionRefused(ValueError):
    """Learner code reached for something the grader keeps out of its reach."""


REFUSED = {
    "gc.get_objects": "the garbage collector's list of live objects",
    "gc.get_referrers": "the garbage collector's list of the objects referring to one",
    "gc.get_referents": "the garbage collector's list of the objects one refers to",
    "sys._getframe": "a stack frame (inspect.currentframe, traceback.walk_stack)",
    "sys._current_frames": "the threads' stack frames",
    "sys.settrace": "a trace function (it sees every frame)",
    "sys.setprofile": "a profile function (it sees every frame)",
    "code.__new__": "making a code object",
    "pickle.find_class": "loading a class or function by name from a pickle",
}
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# ctypes functions that turn an address into an object or move raw memory and raise no audit
# event in Python 3.11 (they are foreign functions): wrapped, refused as the events are.
UNAUDITED_CTYPES = ("cast", "memmove", "memset")
NEAR = 4   # frames above the one that raised the event in which learner code counts as its caller

_LEARNER = [0]        # > 0 while learner code runs
_CELLS = [""]         # the directory the worker runs cells from (their code's file names)
_BUSY = [False]       # the hook's own look at the stack (itself an audited event)


def _refusal(event: str, args: tuple) -> str | None:
    """What ``event`` would reach, when it is one the wall refuses."""
    if event in REFUSED:
        return REFUSED[event]
    if event == "object.__getattr__" and len(args) == 2 and args[1] in FRAME_ATTRIBUTES:
        return f"a stack frame ({args[1]})"
    if event == "object.__setattr__" and len(args) >= 2 and args[1] == "__code__":
        return "replacing a function's code"
    if event.startswith("ctypes."):
        return "raw memory through ctypes"
    return None


def _learner_asks(depth: int) -> bool:
    """Whether learner code is among the ``NEAR`` frames from ``depth`` frames above the
    caller up: code from a cell's file, or made at run time (``<string>``). Library code that
    looks at frames on its own (typing while torch imports a module lazily, Triton's CUDA
    driver calling through ctypes) is deeper than that below any learner frame."""
    _BUSY[0] = True
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return False
    finally:
        _BUSY[0] = False
    for _ in range(NEAR):
        if frame is None:
            return False
        name = frame.f_code.co_filename
        if (_CELLS[0] and name.startswith(_CELLS[0])) or \
                (name.startswith("<") and not name.startswith("<frozen")):
            return True
        frame = frame.f_back
    return False


def _refuse(event: str, what: str) -> None:
    raise IntrospectionRefused(
        f"{event}: the grader does not let learner code reach {what}; the grader records what "
        "your code does in this process, and nothing an exercise asks for needs it")


def _hook(event: str, args: tuple) -> None:
    if not _LEARNER[0] or guard._PAUSED[0] or _BUSY[0]:
        return
    what = _refusal(event, args)
    if what is not None and _learner_asks(1):
        _refuse(event, what)


def learner_running() -> bool:
    """Whether learner code is running (a cell, a call, a launch) and the worker's own code is
    not (``guard.limits_paused``), however deep in library code the question is asked."""
    return bool(_LEARNER[0]) and not guard._PAUSED[0]


def asked_by_learner() -> bool:
    """Whether the function that calls this was called by learner code during a learner call
    (a cell's frame among the ``NEAR`` frames above it; the worker's own code inside a call,
    ``guard.limits_paused``, is not learner code)."""
    return bool(_LEARNER[0]) and not guard._PAUSED[0] and not _BUSY[0] and _learner_asks(2)


def _refusing(name: str, original):
    def wrapper(*args, **kwargs):
        if asked_by_learner():
            _refuse(f"ctypes.{name}", "raw memory through ctypes")
        return original(*args, **kwargs)
    return wrapper


_INSTALLED = [False]


def install(cells: str) -> None:
    """Add the audit hook and wrap ``UNAUDITED_CTYPES`` (once per process, before any learner
    code). ``cells``: the directory learner cells run from."""
    _CELLS[0] = cells.rstrip("/") + "/"
    if not _INSTALLED[0]:
        import ctypes
        for name in UNAUDITED_CTYPES:
            setattr(ctypes, name, _refusing(name, getattr(ctypes, name)))
        sys.addaudithook(_hook)
        _INSTALLED[0] = True


@contextlib.contextmanager
def learner_code() -> Iterator[None]:
    """The block runs learner code (a cell, a call, a kernel launch): the wall stands."""
    _LEARNER[0] += 1
    try:
        yield
    finally:
        _LEARNER[0] -= 1
