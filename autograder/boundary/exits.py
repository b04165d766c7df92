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
(reached through ``TensorBase`` itself, they are not). Two doors lead back in without an
operation: ``torch.frombuffer`` (a tensor over a ``bytearray``: memory no operation allocates,
a copy the recorder cannot see) and ``torch.from_dlpack``; ``torch.from_numpy`` and
``torch.tensor`` are ``aten.lift_fresh``, counted as allocations by ``guard``.
(``Tensor.__array_wrap__`` only brings numpy's result back after ``__array__`` let the data
out.) Each door is wrapped once, before any cell runs; while an operation limit is in force and learner code is near the call
(``audit.asked_by_learner``), the door raises ``ExitRefused`` and the refusal is kept in the
limit's ``refused``, so that catching the error does not hide it: the exercise scores 0. Library
code using a door for itself, away from learner frames, is left alone.
"""
from __future__ import annotations

import torch

from autograder.boundary import audit, guard

DOORS = {  # where -> what goes through it
    "torch.Tensor.__array__": "numpy reading a tensor (np.asarray, np.array, a numpy function "
                              "given one)",
    "torch.Tensor.__dlpack__": "a tensor's memory handed over through DLPack (from_dlpack)",
    "torch.Tensor.numpy": "a tensor's memory as a numpy array (x.numpy())",
    "torch.Tensor.tolist": "a tensor's values as Python lists (x.tolist())",
    "torch.frombuffer": "a tensor over memory made outside torch (torch.frombuffer)",
    "torch.from_dlpack": "a tensor over another library's memory (from_dlpack)"}


class ExitRefused(RuntimeError):
    """Learner code handed tensor data out of torch while its work was being recorded."""


def _door(where: str, original):
    def door(*args, **kwargs):
        limit = guard.active_limit()
        if limit is not None and audit.asked_by_learner():
            if where not in limit.refused:
                limit.refused.append(where)
            raise ExitRefused(f"{where}: {DOORS[where]} is outside torch's operations, where the "
                              "grader does not count the work or the memory; use torch operations")
        return original(*args, **kwargs)
    door.__name__ = door.__qualname__ = where.rsplit(".", 1)[1]
    return door


_INSTALLED = [False]


def install() -> None:
    """Wrap the doors (once per process, before any learner code): the methods on
    ``torch.Tensor``, the functions wherever ``torch`` and ``torch.utils.dlpack`` hold them."""
    if _INSTALLED[0]:
        return
    import torch.utils.dlpack
    for where in DOORS:
        owner_name, name = where.rsplit(".", 1)
        owners = [torch.Tensor] if owner_name == "torch.Tensor" else [torch, torch.utils.dlpack]
        original = getattr(owners[0], name)
        door = _door(where, original)
        for owner in owners:
            if getattr(owner, name, None) is original:
                setattr(owner, name, door)
    _INSTALLED[0] = True
