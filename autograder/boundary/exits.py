"""Learner side: the run-time wall at the doors through which tensor data leaves torch.

The operation recorder (``guard.operation_limit``) sees what torch's dispatcher runs. Data taken
out of a tensor and computed on elsewhere (numpy, a DLPack consumer) is work and memory it never
sees: a second pass over the scores, a copy of K per query head, a cache rebuilt at every
append. The static look (``autograder.rules.forbid``) refuses the names of these exits in a
graded cell; this wall refuses the doors that need no name in it: ``np.asarray(t)`` (or any
numpy function given a tensor) calls ``Tensor.__array__``, ``np.from_dlpack(t)`` calls
``Tensor.__dlpack__``, from whatever cell bound ``np``; and ``t.numpy()``, ``t.tolist()`` called
by a helper from a cell the static look does not read (another exercise's). The last two are C
methods of ``torch._C.TensorBase``, shadowed by wrappers on its Python subclass ``torch.Tensor``
(reached through ``TensorBase`` itself, they are not). (``Tensor.__array_wrap__`` only brings
numpy's result back after ``__array__`` let the data out.) Each is wrapped once, before any
cell runs; while an operation limit is in force and learner code is near the call
(``audit.asked_by_learner``), the door raises ``ExitRefused`` and the refusal is kept in the
limit's ``refused``, so that catching the error does not hide it: the exercise scores 0. Library
code using a door for itself, away from learner frames, is left alone.
"""
from __future__ import annotations

import torch

from autograder.boundary import audit, guard

DOORS = {"__array__": "numpy reading a tensor (np.asarray, np.array, a numpy function given one)",
         "__dlpack__": "a tensor's memory handed over through DLPack (from_dlpack)",
         "numpy": "a tensor's memory as a numpy array (x.numpy())",
         "tolist": "a tensor's values as Python lists (x.tolist())"}


class ExitRefused(RuntimeError):
    """Learner code handed tensor data out of torch while its work was being recorded."""


def _door(name: str, original):
    def door(*args, **kwargs):
        limit = guard.active_limit()
        if limit is not None and audit.asked_by_learner():
            refused = f"torch.Tensor.{name}"
            if refused not in limit.refused:
                limit.refused.append(refused)
            raise ExitRefused(f"{refused}: {DOORS[name]} takes the data out of torch, where the "
                              "grader does not count the work or the memory; use torch operations")
        return original(*args, **kwargs)
    door.__name__ = door.__qualname__ = name
    return door


_INSTALLED = [False]


def install() -> None:
    """Wrap the doors on ``torch.Tensor`` (once per process, before any learner code)."""
    if not _INSTALLED[0]:
        for name in DOORS:
            setattr(torch.Tensor, name, _door(name, getattr(torch.Tensor, name)))
        _INSTALLED[0] = True
