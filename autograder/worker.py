"""The sandbox worker: runs learner code (solution cells) and answers the grader's requests.

Started by ``autograder.sandbox`` as ``python -s -m autograder.worker IN_FD OUT_FD MEMORY_MB
[--lockdown HIDE...]``. Trusted bootstrap, in this order: import torch and ``reference.model`` /
``reference.kv_cache``; with ``--lockdown`` (root, inside ``unshare``'s new namespaces) mount an
empty read-only tmpfs over each HIDE directory and drop every capability; fork (the parent only
relays the exit status, so that killing "the parent" cannot reach the grader); set rlimits;
forget ``reference``/``autograder`` and block importing them. Then learner code runs.
"""
from __future__ import annotations

import ctypes
import linecache
import math
import os
import resource
import signal
import sys
from importlib.abc import MetaPathFinder

import torch
from torch.nn import functional as F
from torch import Tensor

from autograder.errors import describe
from autograder.protocol import read_message, write_message
from autograder.refs import Resolver
from reference.kv_cache import KVCache  # noqa: F401  (imported while still readable)
from reference.model import build_tiny

FORBIDDEN = ("reference", "autograder")
LIBC = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def lock_down(hide: list[str]) -> None:
    """Hide ``hide`` directories under empty read-only tmpfs mounts, then drop all capabilities
    (bounding, ambient, effective, permitted, inheritable) and set no_new_privs."""
    flags = 1 | 2 | 4 | 8  # MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    for path in hide:
        _check(LIBC.mount(b"none", path.encode(), b"tmpfs", flags, b"size=4k,mode=0555"),
               f"mount tmpfs over {path}")
    for cap in range(64):
        if LIBC.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP; EINVAL past the last cap
            break
    _check(LIBC.prctl(47, 4, 0, 0, 0), "clear ambient capabilities")
    data = (_CapData * 2)()
    _check(LIBC.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "capset")
    _check(LIBC.prctl(38, 1, 0, 0, 0), "no_new_privs")


class ImportBlocker(MetaPathFinder):
    """Refuses to import ``reference`` and ``autograder`` from learner code."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ModuleNotFoundError(f"importing {name!r} is not allowed: the grader forbids "
                                      "using the reference implementation or the autograder",
                                      name=name)
        return None


def relay_exit_status() -> None:
    """Fork; the parent waits for the child and exits with its status (128 + signal)."""
    child = os.fork()
    if child == 0:
        LIBC.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the relay
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    _, status = os.waitpid(child, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def restrict(memory_mb: int) -> None:
    """Apply rlimits and hide the grader's packages from ``import``."""
    limit = memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 2**20, 64 * 2**20))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    for name in list(sys.modules):
        if name.split(".")[0] in FORBIDDEN:
            del sys.modules[name]
    sys.meta_path.insert(0, ImportBlocker())
    root = os.environ.pop("AUTOGRADER_ROOT", "")
    sys.path[:] = [p for p in sys.path if p not in ("", ".", root, os.getcwd())]


def refuse_grader_code(name: str, target) -> None:
    """Refuse a graded name bound to (a subclass of) reference/autograder code, which learner
    code can reach through the reference objects it is given."""
    classes = target.__mro__ if isinstance(target, type) else (target,)
    for item in classes:
        module = getattr(item, "__module__", None) or ""
        if module.split(".")[0] in FORBIDDEN:
            raise PermissionError(f"`{name}` must be your own code, not {module}."
                                  f"{getattr(item, '__qualname__', '')} from the grader")


class Worker:
    """Request loop. Requests are dicts with ``op``: ``exec`` (``grade_id``, ``source``) or
    ``call`` (``name`` or ``handle`` + ``attr``, ``args``, ``kwargs``, ``get`` for getattr)."""

    def __init__(self, memory_mb: int):
        self.memory_mb = memory_mb
        self.namespace = {"__name__": "__learner__", "torch": torch, "math": math, "F": F,
                          "Tensor": Tensor}
        self.resolver = Resolver(build_tiny)

    def exec_cell(self, grade_id: str, source: str) -> None:
        code = compile(source, f"<cell {grade_id}>", "exec")
        linecache.cache[f"<cell {grade_id}>"] = (len(source), None,
                                                 source.splitlines(True), f"<cell {grade_id}>")
        exec(code, self.namespace)

    def call(self, request: dict):
        args, kwargs = self.resolver.args((request["args"], request["kwargs"]))
        if "handle" in request:
            target = getattr(self.resolver.resolve(request["handle"]), request["attr"])
            if request.get("get"):
                return self.resolver.result(target)
        elif request["name"] not in self.namespace:
            raise NameError(f"`{request['name']}` is not defined by your solution cells")
        else:
            target = self.namespace[request["name"]]
            refuse_grader_code(request["name"], target)
        return self.resolver.result(target(*args, **kwargs))

    def handle(self, request: dict) -> dict:
        self.resolver.trace.clear()
        try:
            if request["op"] == "exec":
                value = self.exec_cell(request["grade_id"], request["source"])
            else:
                value = self.call(request)
            reply = {"ok": True, "value": value}
        except BaseException as exc:  # noqa: BLE001 - learner code may raise anything
            if isinstance(exc, SystemExit):
                exc = RuntimeError(f"your code called exit({exc.code!r})")
            reply = {"ok": False, "error": describe(exc, self.memory_mb)}
        reply["trace"] = list(self.resolver.trace)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - the learner may have replaced the stream
                pass
        return reply


def main(argv: list[str]) -> None:
    in_fd, out_fd, memory_mb = int(argv[0]), int(argv[1]), int(argv[2])
    isolation = "none"
    if len(argv) > 3 and argv[3] == "--lockdown":
        lock_down(argv[4:])
        isolation = "lockdown"
    relay_exit_status()
    restrict(memory_mb)
    worker = Worker(memory_mb)
    write_message(out_fd, {"ready": True, "isolation": isolation})
    while True:
        try:
            request = read_message(in_fd)
        except EOFError:
            os._exit(0)
        reply = worker.handle(request)
        try:
            write_message(out_fd, reply)
        except Exception as exc:  # noqa: BLE001 - a result torch.save cannot write
            write_message(out_fd, {"ok": False, "trace": [], "error":
                                   f"your result could not be sent back ({describe(exc)})"})


if __name__ == "__main__":
    main(sys.argv[1:])
