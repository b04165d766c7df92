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

The recorder is a dispatch mode of the calling thread. The routes that run operations where it
is not are shut by what they are, at run time (the static look refuses their names):

- a tensor subclass with its own ``__torch_dispatch__``: ``guard`` refuses any operation that
  reaches one (``guard.SUBCLASS``), and a call may return plain tensors only (``proxies``);
- another thread (``_thread.start_new_thread``, under ``threading``, thread pools and
  ``asyncio.to_thread``) and another process (the ``os.fork``, ``os.posix_spawn``,
  ``subprocess.Popen``, ``os.system`` and ``os.exec`` audit events): refused while learner
  code runs, however deep in a library the start is made, cells included (a thread or a
  process started at a cell's load would take work from the calls later); a kernel launch
  excepted (``launching``: Triton's compiler runs ptxas where it builds for a GPU);
- a signal handler (``signal.signal`` with a Python function, however reached: ``_signal``
  too): Python runs it between any two lines of whatever runs when the signal comes (a timer,
  ``signal.setitimer``), the worker's own code after the recorded call included, where the
  handler's work is neither counted nor refused. Refused while learner code runs, but for the
  defaults and asyncio's own handler of Ctrl-C (``asyncio.run`` installs it; nothing in the
  sandbox sends SIGINT later);
- a torch function mode left on torch's stack when a cell or a call ends: its
  ``__torch_function__`` would run at every torch function the worker calls afterwards (its
  copy of the result, the reply's serialisation), where nothing is recorded. Taken off and
  refused (``function_modes_left``); the worker's own torch code inside and after a call runs
  with torch functions' overrides off (``guard.limits_paused``);
- torch's dispatch switches (``SWITCHES``: the mode stack popped or replaced, the Python
  dispatch key excluded, a kernel registered for an operation, an operation redispatched
  below the modes), wherever ``torch`` holds them: refused while learner code runs, however
  deep in torch (``_disable_current_modes`` reaches them five frames down), except inside
  torch's formatting of a plain tensor that learner code printed (torch formats with its
  modes off; nothing of the learner's runs there).

Each door is wrapped once, before any cell runs. While an operation limit is in force and
learner code is near the call (``audit.asked_by_learner``), a door raises ``ExitRefused`` and
the refusal is kept in the limit's ``refused``, so that catching the error does not hide it:
the exercise scores 0. Library code using a door for itself, away from learner frames (torch
printing a tensor), is left alone.
"""
from __future__ import annotations

import _thread
import contextlib
import functools
import sys
import threading
import types
from typing import Iterator

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

# What the routes around the recorder are, by the name a refusal is kept under (``refused``).
ANOTHER_THREAD, ANOTHER_PROCESS, DISPATCH_SWITCH = "another thread", "another process", "dispatch switch"
SIGNAL_HANDLER, FUNCTION_MODE = "a signal handler", "a torch function mode left on"
ROUTES = {
    guard.SUBCLASS: "a tensor subclass with its own __torch_dispatch__ (torch runs that handler "
                    "with the grader's recorder set aside)",
    ANOTHER_THREAD: "work handed to another thread (the recorder follows the calling thread)",
    ANOTHER_PROCESS: "work handed to another process (fork, spawn, a subprocess)",
    DISPATCH_SWITCH: "torch's dispatch machinery switched (a dispatch mode popped or replaced, "
                     "the Python dispatch key excluded, a kernel registered, a redispatch)",
    SIGNAL_HANDLER: "work in a signal handler (Python runs it wherever the signal comes, in the "
                    "grader's own code after your call too)",
    FUNCTION_MODE: "a torch function mode left on after your code returned (its "
                   "__torch_function__ would run in the grader's own code after your call)"}
# The dispatch switches, in torch._C: the mode stack, the dispatch keys of this thread, kernel
# registration (torch.library), calls below the modes; and the redispatch of an operator handle.
SWITCHES = ("_pop_torch_dispatch_stack", "_push_on_torch_dispatch_stack", "_set_dispatch_mode",
            "_unset_dispatch_mode", "_DisableTorchDispatch", "ExcludeDispatchKeyGuard",
            "_ExcludeDispatchKeyGuard", "_SetExcludeDispatchKeyGuard", "_ForceDispatchKeyGuard",
            "_IncludeDispatchKeyGuard", "_dispatch_tls_set_dispatch_key_excluded",
            "_dispatch_tls_set_dispatch_key_included", "_dispatch_library", "_dispatch_call_boxed",
            "_EnablePythonDispatcher", "_DisablePythonDispatcher", "_EnablePreDispatch",
            "_RestorePythonTLSSnapshot")
PROCESS_EVENTS = ("os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp", "subprocess.Popen",
                  "os.system", "os.exec", "os.spawn")


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


def _refuse_route(route: str, what: str) -> None:
    """Keep ``route`` in the active limit's refusals (catching the error hides nothing) and raise."""
    limit = guard.active_limit()
    if limit is not None and route not in limit.refused:
        limit.refused.append(route)
    raise ExitRefused(f"{what}: {ROUTES[route]}; the grader records your code's work in the "
                      "thread that calls it, on plain tensors, through torch's operations")


_PRINTING = [0]   # > 0 while torch formats a plain tensor for learner code (``_counted``)


def _switch(name: str, original):
    def switch(*args, **kwargs):
        if audit.learner_running() and not _PRINTING[0]:
            _refuse_route(DISPATCH_SWITCH, f"torch._C.{name}")
        return original(*args, **kwargs)
    switch.__name__ = switch.__qualname__ = name
    return switch


_LAUNCHING = [0]   # > 0 while a Triton kernel is launched: its compiler may start processes


@contextlib.contextmanager
def launching() -> Iterator[None]:
    """The block launches a kernel: where Triton compiles it for a GPU, its compiler (ptxas) runs
    as a process, and may use threads; a kernel cell is Triton code only (``kernel_rules``), so
    nothing of the learner's starts them there."""
    _LAUNCHING[0] += 1
    try:
        yield
    finally:
        _LAUNCHING[0] -= 1


def _thread_start(original):
    def start_new_thread(*args, **kwargs):
        if audit.learner_running() and not _LAUNCHING[0]:
            _refuse_route(ANOTHER_THREAD, "a new thread")
        return original(*args, **kwargs)
    return start_new_thread


def _process_hook(event: str, args: tuple) -> None:
    if event in PROCESS_EVENTS and audit.learner_running() and not _LAUNCHING[0]:
        _refuse_route(ANOTHER_PROCESS, f"a new process ({event})")


def _allowed_handler(signum, handler) -> bool:
    """The handlers learner code may install: the defaults (ints, ``default_int_handler``) and
    asyncio's own Ctrl-C handler (``asyncio.run`` installs it for SIGINT, which nothing in the
    sandbox sends later), checked by identity, not by name."""
    import signal
    if not callable(handler) or handler is signal.default_int_handler:
        return True
    if signum != signal.SIGINT or type(handler) is not functools.partial:
        return False
    import asyncio.runners
    func = handler.func
    return type(func) is types.MethodType and func.__func__ is asyncio.runners.Runner._on_sigint


def _signal_wall(original):
    def signal(signum, handler):
        if audit.learner_running() and not _allowed_handler(signum, handler):
            _refuse_route(SIGNAL_HANDLER, "signal.signal")
        return original(signum, handler)
    return signal


def function_modes_left() -> None:
    """Take off the torch function modes learner code left on torch's stack (a cell's or a
    call's) and refuse them (``FUNCTION_MODE``): their handlers would run in the worker's code."""
    if not torch._C._len_torch_function_stack():
        return
    while torch._C._len_torch_function_stack():
        torch._C._pop_torch_function_stack()
    _refuse_route(FUNCTION_MODE, "a torch function mode still entered")


def _replace_everywhere(replacements: dict) -> None:
    """Wherever a loaded module of torch holds a key of ``replacements`` (by identity: ``from
    torch._C import X`` made copies), put its value there instead; one pass over the modules."""
    by_id = {id(original): replacement for original, replacement in replacements.items()}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "torch" or name.startswith("torch.")):
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in by_id:
                setattr(module, attr, by_id[id(value)])


def _counted(where: str, original):
    def counted(self, *args, **kwargs):
        limit = guard.active_limit()
        if limit is not None and audit.asked_by_learner():
            limit.work.scalar_reads += self.numel()   # every value, as float(t) would read it
        if type(self) not in (torch.Tensor, torch.nn.Parameter):
            return original(self, *args, **kwargs)     # a subclass's methods: no switch allowed
        _PRINTING[0] += 1   # torch formats with its dispatch modes off: its own switches pass
        try:
            return original(self, *args, **kwargs)
        finally:
            _PRINTING[0] -= 1
    counted.__name__ = counted.__qualname__ = where.rsplit(".", 1)[1]
    return counted


_INSTALLED = [False]


def install() -> None:
    """Wrap the doors (once per process, before any learner code and before the recorder's
    places are remembered, ``traffic.install``): the methods on ``torch.Tensor``, the functions
    wherever ``torch`` and ``torch.utils.dlpack`` hold them; the switches wherever a module of
    torch holds them; the thread start; and add the hook on new processes."""
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
    import torch.utils._python_dispatch  # noqa: F401 - its copies of the switches are replaced too
    originals = {name: getattr(torch._C, name) for name in SWITCHES if hasattr(torch._C, name)}
    _replace_everywhere({original: _switch(name, original) for name, original in originals.items()})
    handle = torch._C._DispatchOperatorHandle
    handle.redispatch_boxed = _switch("_DispatchOperatorHandle.redispatch_boxed", handle.redispatch_boxed)
    threading._start_new_thread = _thread.start_new_thread = _thread_start(_thread.start_new_thread)
    import _signal
    _signal.signal = _signal_wall(_signal.signal)   # signal.signal calls _signal.signal
    sys.addaudithook(_process_hook)
    _INSTALLED[0] = True
