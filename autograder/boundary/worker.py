"""The sandbox worker: runs learner code (solution cells) and answers the grader's requests.

Forked by the fork server (``autograder.boundary.forkserver``), which imported torch and the
worker's own modules (never ``reference``) once for all workers; ``run`` is the trusted
bootstrap (``confine``), in this order: with ``lockdown`` (root, in the new namespaces the
fork server made) show only ``show`` (the directories Python imports from and the system's:
everything else, other checkouts and home directories included, masked by empty read-only
mounts), mask ``hide`` too, make every mount read-only, mount a private ``/tmp`` and bind the
Python environment's directories that were under /tmp back, read-only; with ``uid`` drop to that unprivileged user and group (all
capabilities go) and set no_new_privs; with Landlock, allow writes only in the private
temporary directory (and, without namespaces, reads only beneath ``show``); fork (the
parent only relays the exit status, so that killing "the parent" cannot reach the grader); set
rlimits; install the forbidden-function guard and the count of Triton kernels' loads and stores
(``traffic``); forget ``reference``/``autograder`` and block
importing them; import what learner code may import (``check_imports``: on failure the worker
says why and exits with ``ENVIRONMENT_BROKEN``, and the grader refuses to grade); add the audit
hook (``audit``) and wrap the doors through which tensor data leaves torch (``exits``). Then
learner code runs.

With ``compile`` in its configuration the worker is the compile worker instead: the same
confinement, no TRITON_INTERPRET, and ``compiling.serve`` answers its requests (a kernel's source,
built for GPUs; the learner's cells never run there).

Models and caches given to learner code are proxies (``proxies``): using one sends a ``remote``
request to the grader and waits for its answer on the same pipes.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import importlib.util
import linecache
import math
import os
import re
import resource
import signal
import sys
from importlib.abc import MetaPathFinder
from pathlib import Path

import torch
from torch.nn import functional as F
from torch import Tensor

from autograder.boundary.confine import close_network, drop_privileges, landlock, lock_down, readable
from autograder.boundary.causes import describe, learner_frame
from autograder.boundary.compiling import serve
from autograder.boundary.guard import (CallWork, ForbiddenOperationError, Guard, limits_paused,
                                       operation_limit)
from autograder.boundary.launching import launch
from autograder.boundary import audit, exits, guard, traffic
from autograder.boundary.protocol import decode, encode, read_message, write_message
from autograder.boundary.proxies import LearnerSide

FORBIDDEN = ("reference", "autograder")
CELL_DIR = "learner_cells"
LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
ENVIRONMENT_BROKEN = 3  # exit status: the environment cannot run learner code in the sandbox


def check_imports(modules: list[str]) -> str | None:
    """Import ``modules`` (what a learner cell may import: the standard library, torch's lazily
    loaded parts, numpy, triton), once confined; those the fork server imported already must
    still be readable here (their file and its folder: what their lazy imports read). ``None``
    when all are, else why not: a directory of the Python environment the sandbox does not show
    (or lets the unprivileged user read) would otherwise fail inside learner code and score
    zeros."""
    for name in modules:
        try:
            module = sys.modules.get(name) or importlib.import_module(name)
            where = getattr(module, "__file__", None)
            if where:
                with open(where, "rb"):
                    os.listdir(os.path.dirname(where))
        except BaseException as exc:  # noqa: BLE001 - an import may fail in any way
            return f"cannot import {name} ({type(exc).__name__}: {exc})"
    return None


def cuda_usable() -> bool:
    """Whether this process can use a CUDA GPU. A GPU the grader sees may be out of reach in the
    sandbox (device files hidden by the namespaces or the unprivileged user); torch then warns,
    which would land in the learner's output, so the warning is silenced."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.cuda.is_available()


def triton_kernel_types() -> tuple[type, ...]:
    """The classes a ``@triton.jit`` (or autotuned / heuristics-wrapped) kernel has; a learner's
    class that merely shares one of their names is not among them."""
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    return JITFunction, InterpretedFunction, Autotuner, Heuristics

class ImportBlocker(MetaPathFinder):
    """Refuses to import ``reference`` and ``autograder`` from learner code."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ModuleNotFoundError(f"importing {name!r} is not allowed: the grader forbids "
                                      "using the reference implementation or the autograder",
                                      name=name)
        return None


def relay_exit_status() -> None:
    """Fork; the parent waits for the child and exits with its status (128 + signal). Both die
    with their parent (PR_SET_PDEATHSIG, set after any change of user)."""
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    child = os.fork()
    if child == 0:
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    _, status = os.waitpid(child, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def restrict(memory_mb: int, memory_limit: str, max_processes: int | None) -> None:
    """Apply rlimits and hide the grader's packages from ``import``. ``memory_limit`` is "as"
    (address space) or "data" (RLIMIT_DATA, anonymous memory only: with a CUDA build of torch,
    whose libraries map gigabytes of address space even on a machine without a GPU, and on CUDA
    machines, where the driver reserves far more address space than it uses). Either way a tensor
    larger than the limit cannot be allocated, which per-exercise limits (``memory_mb``) rely on."""
    limit = memory_mb * 2**20
    kind = resource.RLIMIT_DATA if memory_limit == "data" else resource.RLIMIT_AS
    resource.setrlimit(kind, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 2**20, 64 * 2**20))
    if max_processes:
        resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    for name in list(sys.modules):
        if name.split(".")[0] in FORBIDDEN:
            del sys.modules[name]
    sys.meta_path.insert(0, ImportBlocker())
    root = os.environ.pop("AUTOGRADER_ROOT", "")
    sys.path[:] = [p for p in sys.path if p not in ("", ".", root, os.getcwd())]


def refuse_grader_code(name: str, target) -> None:
    """Refuse a graded name bound to (a subclass of) autograder code (e.g. a proxy class)."""
    classes = target.__mro__ if isinstance(target, type) else (target,)
    for item in classes:
        module = getattr(item, "__module__", None) or ""
        if module.split(".")[0] in FORBIDDEN:
            raise PermissionError(f"`{name}` must be your own code, not {module}."
                                  f"{getattr(item, '__qualname__', '')} from the grader")


class Worker:
    """Request loop. Requests are dicts with ``op``: ``exec`` (``grade_id``, ``source``),
    ``call`` (``name`` or ``handle`` + ``attr``, ``args``, ``kwargs``, ``get`` for getattr,
    ``forbid``) or ``launch`` (``name``, ``grid``, ``args``, ``kwargs``: a Triton kernel)."""

    def __init__(self, in_fd: int, out_fd: int, memory_mb: int, tmp: str, forbid: list[str]):
        self.in_fd, self.out_fd, self.memory_mb = in_fd, out_fd, memory_mb
        self.namespace = {"__name__": "__learner__", "torch": torch, "math": math, "F": F,
                          "Tensor": Tensor}
        self.side = LearnerSide(self.remote)
        self.guard = Guard(forbid).install()
        if importlib.util.find_spec("triton") is not None:
            # before any cell: the kernels' loads and stores are counted, and whatever the
            # count and the launch rest on is remembered (traffic.tampered)
            traffic.install({"worker": globals(), "Worker": vars(Worker),
                             "launching": launch.__globals__, **recorder_places()})
        self.traffic: dict | None = None
        self.cells = Path(tmp) / CELL_DIR
        self.cells.mkdir(exist_ok=True)
        # the streams the worker flushes, by their own type's method: no object a cell put in
        # sys.stdout, and no attribute a cell set on these, runs in the worker's code
        self.streams = [(type(stream).flush, stream) for stream in (sys.stdout, sys.stderr)]
        self.held: tuple = ()   # what the last request left: let go in the next learner block

    @contextlib.contextmanager
    def running_learner_code(self, release: bool = True):
        """The block runs learner code: the walls stand (``audit``), the garbage collector runs
        (it is off in the worker's own code, so that no finalizer of a learner object runs
        there), and what the last request left (its arguments, result, exception) is let go
        here (``release``), so that its finalizers and weak-reference callbacks run walled in
        and, inside a call's operation limit, recorded."""
        with audit.learner_code():
            if release:
                self.held = ()
            gc.enable()
            try:
                yield
            finally:
                gc.disable()
                exits.function_modes_left()   # none may run in the worker's code later

    def walled(self, function, *args, fallback: str):
        """``function(*args)`` for the worker's look at a learner object (an exception's message
        and traceback): whatever learner code it reaches (``__str__``, a ``__class__``
        property) runs walled in, every operation refused; ``fallback`` if it fails."""
        try:
            with operation_limit(()), self.running_learner_code(release=False):
                return function(*args)
        except BaseException:  # noqa: BLE001 - learner code may raise anything
            return fallback

    def remote(self, request: dict) -> dict:
        """Send a proxy's request to the grader and wait for its answer."""
        with limits_paused():
            write_message(self.out_fd, request)
            reply = read_message(self.in_fd)
        return reply if isinstance(reply, dict) else {"ok": False, "error": "bad reply"}

    def exec_cell(self, grade_id: str, source: str) -> None:
        """Run a cell from a file of its own (so that ``inspect.getsource`` works, as the
        Triton interpreter needs)."""
        path = self.cells / f"{re.sub(r'[^A-Za-z0-9_]', '_', grade_id)}.py"
        path.write_text(source)
        linecache.cache[str(path)] = (len(source), None, source.splitlines(True), str(path))
        code = compile(source, str(path), "exec")
        with self.running_learner_code():
            exec(code, self.namespace)

    def _lookup(self, name: str):
        if name not in self.namespace:
            raise NameError(f"`{name}` is not defined by your solution cells")
        target = self.namespace[name]
        refuse_grader_code(name, target)
        return target

    def call(self, request: dict):
        args, kwargs = self.side.args((request["args"], request["kwargs"]))
        with self.guard.forbidding(request.get("forbid", ())):
            if request["op"] == "launch":
                with self.running_learner_code():
                    kernel = self._lookup(request["name"])
                if type(kernel) not in triton_kernel_types():  # exact types: no look-alike class
                    raise TypeError(f"`{request['name']}` must be a @triton.jit kernel")
                changed = traffic.tampered()
                if changed:
                    raise PermissionError(
                        f"a cell changed Triton's interpreter ({', '.join(changed[:4])}): the "
                        "grader counts a kernel's loads and stores there, so no kernel is launched")
                with self.running_learner_code(), exits.launching():
                    after, self.traffic = launch(kernel, request["grid"], args, kwargs)
                self.held = (args, kwargs, kernel, after)
                with limits_paused():
                    return self.side.result(after)
            limit = operation_limit(request.get("allowed_ops"))
            try:   # the lookup is learner code too: a property, __getattr__, a __class__
                with limit, self.running_learner_code():
                    if "handle" in request:
                        target = getattr(self.side.resolve(request["handle"]), request["attr"])
                    else:
                        target = self._lookup(request["name"])
                    self.held = (args, kwargs, target, limit)
                    value = target if request.get("get") else target(*args, **kwargs)
                    self.held += (value,)
            finally:
                if limit.refused:   # even when the learner's code caught the error
                    raise ForbiddenOperationError(limit.refused)
            changed = traffic.tampered(RECORDER_PLACES)
            if changed:
                raise PermissionError(
                    f"your code changed what the grader records its work with "
                    f"({', '.join(changed[:4])}), so this call counts for nothing")
            self.largest, self.work = limit.largest, limit.work
            with limits_paused():   # the worker's copy: no __torch_function__ of the learner's
                return self.side.result(value)

    def handle(self, request: dict) -> dict:
        self.largest, self.traffic, self.work = 0, None, CallWork()
        try:
            if request["op"] == "exec":
                value = self.exec_cell(request["grade_id"], request["source"])
            else:
                value = self.call(request)
            reply = {"op": "done", "ok": True, "value": value, "largest": self.largest,
                     "traffic": self.traffic, "work": self.work.to_wire()}
        except ForbiddenOperationError as exc:
            self.held += (exc,)
            reply = {"op": "done", "ok": False, "error": str(exc), "refused_ops": exc.names,
                     "where": self.walled(learner_frame, exc, fallback="")}
        except BaseException as exc:  # noqa: BLE001 - learner code may raise anything
            self.held += (exc,)
            reply = {"op": "done", "ok": False, "error": self.walled(
                cause, exc, self.memory_mb,
                fallback="your code raised an exception whose message could not be read")}
        for flush, stream in self.streams:
            try:
                flush(stream)
            except Exception:  # noqa: BLE001 - a closed stream
                pass
        return reply


def cause(exc: BaseException, memory_mb: int) -> str:
    """The one-line cause of a failed request (``describe``; ``exit()`` named as such)."""
    if isinstance(exc, SystemExit):
        exc = RuntimeError(f"your code called exit({exc.code!r})")
    return describe(exc, memory_mb)


RECORDER_PLACES = ("guard", "OperationLimit", "CallWork", "product_flops", "exp_elements",
                   "python_dispatch", "TorchDispatchMode", "dispatch_stack")


def recorder_places() -> dict:
    """What the operation recorder rests on (``traffic.tampered`` watches them as it watches
    the interpreter's), by the names of ``RECORDER_PLACES``: the guard module, the mode's class,
    the work record and its tables, and torch's dispatch-mode machinery (``guard.dispatch_places``)."""
    return dict(zip(RECORDER_PLACES[:5], (vars(guard), vars(guard._limit_mode()), vars(CallWork),
                                          guard._PRODUCT_FLOPS, guard._EXP_ELEMENTS))) \
        | guard.dispatch_places()


def hide_worker_module() -> None:
    """The worker runs as ``__main__``: put an empty module there, so that
    ``sys.modules['__main__']`` leads learner code to nothing of the worker's."""
    sys.modules["__main__"] = type(sys)("__main__")


def run(config: dict) -> None:
    """Confine this process as ``config`` says, then answer the grader's requests until it
    closes the pipe (``os._exit``: never returns)."""
    decode(encode({"ready": True})[8:])   # the protocol's own lazy imports, before confinement
    tmp, isolation = config["tmp"], []
    if config["lockdown"]:
        tmp = lock_down(config["show"], config["hide"], config.get("restore", []))
        isolation.append("namespaces")
    if config["uid"] is not None or config["lockdown"]:
        drop_privileges(config["uid"], config["keep_read"])
        isolation.append("unprivileged user" if config["uid"] is not None else "no capabilities")
    if tmp != config["tmp"]:
        tmp = os.path.join(tmp, "work")
        os.mkdir(tmp, 0o700)
    os.chdir(tmp)
    os.environ.update(HOME=tmp, TMPDIR=tmp)
    shown = None if config["lockdown"] else readable(config["show"], config["hide"])
    if config["uid"] is not None and landlock(tmp, shown):
        isolation.append("Landlock: writes only in its temporary directory"
                         + ("" if config["lockdown"] else ", reads only where Python imports from"))
    relay_exit_status()
    if config.get("compile"):   # the compile worker builds kernels for GPUs: never interpreted
        os.environ.pop("TRITON_INTERPRET", None)
        isolation.append("builds Triton kernels for GPUs (compiled, never run)")
    elif os.environ.get("TRITON_INTERPRET") != "1" and not cuda_usable():
        os.environ["TRITON_INTERPRET"] = "1"   # the sandbox cannot reach the GPU: interpret kernels
        isolation.append("Triton kernels interpreted (no GPU inside the sandbox)")
    restrict(config["memory_mb"], config["memory_limit"],
             config["max_processes"] if config["uid"] is not None else None)
    if close_network():
        isolation.append("no network sockets (seccomp)")
    elif not config["lockdown"]:
        isolation.append("network reachable (no network namespace, no libseccomp)")
    problem = check_imports(config.get("check_imports", []))
    if problem is not None:
        print(problem, file=sys.stderr, flush=True)   # in the grader's log, should this fail
        write_message(config["out"], {"ready": False, "environment": problem})
        os._exit(ENVIRONMENT_BROKEN)
    if config.get("compile"):
        write_message(config["out"], {"ready": True, "isolation": isolation})
        serve(config["in"], config["out"], tmp, describe)
    exits.install()   # before the worker remembers what its records rest on
    worker = Worker(config["in"], config["out"], config["memory_mb"], tmp, config["forbid"])
    gc.disable()   # the garbage collector runs in learner code only (running_learner_code)
    hide_worker_module()
    audit.install(str(worker.cells))
    write_message(worker.out_fd, {"ready": True, "isolation": isolation})
    while True:
        try:
            request = read_message(worker.in_fd)
        except EOFError:
            os._exit(0)
        reply = worker.handle(request)
        try:
            with torch._C.DisableTorchFunction():   # the reply's tensors are plain: their own
                write_message(worker.out_fd, reply)   # serialisation, no learner override
        except Exception as exc:  # noqa: BLE001 - a result torch.save cannot write
            write_message(worker.out_fd, {"op": "done", "ok": False, "error":
                                          f"your result could not be sent back ({describe(exc)})"})

