"""Learner side: the run-time wall at the doors through which tensor data leaves torch.

The operation recorder (``guard.operation_limit``) sees what torch's dispatcher runs. Data taken
out of a tensor and computed on elsewhere is work and memory it never sees: a second pass over
the scores in numpy, a copy of K per query head, a cache rebuilt at every append. The static
look (``autograder.rules.forbid``) refuses the names of these exits in a graded cell; this wall
shuts the doors themselves, whatever cell the code came from:

- ``Tensor.__array__`` (``np.asarray(t)``, any numpy function given a tensor, through an ``np``
  another cell imported) and ``Tensor.__dlpack__`` (``np.from_dlpack(t)``);
- ``Tensor.numpy`` and ``Tensor.tolist``, C methods of ``torch._C.TensorBase`` shadowed on its
  Python subclass ``torch.Tensor`` (a helper in another exercise's cell, which the static look
  does not read, calling ``t.numpy()``; through ``TensorBase`` itself they are not reached);
- the doors back in without an operation: ``torch.frombuffer`` (a tensor over a ``bytearray``,
  memory no operation allocates) and ``torch.from_dlpack``. (``torch.from_numpy`` and
  ``torch.tensor`` run ``aten.lift_fresh``, which ``guard`` counts as an allocation;
  ``Tensor.__array_wrap__`` only brings back what ``__array__`` let out.)

A tensor printed (``str(t)``, ``repr(t)``, ``print(t)``, an f-string: all reach
``Tensor.__repr__``) is let through, but counted: torch formats it with the dispatch modes off,
so no operation reads its values, yet their text can be parsed back into numbers for work in
Python beside an honest pass in torch. Printed by learner code under a limit, every value counts
as one read in the limit's ``work.scalar_reads``, which ``require_one_pass`` bounds.

Each door is wrapped once, before any cell runs. While an operation limit is in force and
learner code is near the call (``audit.asked_by_learner``), a door raises ``ExitRefused`` and
the refusal is kept in the limit's ``refused``, so that catching the error does not hide it:
the exercise scores 0. Library code using a door for itself, away from learner frames (torch
printing a tensor), is left alone.
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


COUNTED = {"torch.Tensor.__repr__": "a tensor printed (str(t), repr(t), print(t), an f-string)"}


class ExitRefused(RuntimeError):
    """Learner code went through a door out of torch (or back in) while its work was recorded."""


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


def _counted(where: str, original):
    def counted(self, *args, **kwargs):
        limit = guard.active_limit()
        if limit is not None and audit.asked_by_learner():
            limit.work.scalar_reads += self.numel()   # every value, as float(t) would read it
        return original(self, *args, **kwargs)
    counted.__name__ = counted.__qualname__ = where.rsplit(".", 1)[1]
    return counted


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
    for where in COUNTED:
        name = where.rsplit(".", 1)[1]
        setattr(torch.Tensor, name, _counted(where, getattr(torch.Tensor, name)))
    _INSTALLED[0] = True
