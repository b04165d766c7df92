"""Grader side of the sandbox: ``SandboxLearner`` runs learner code in a worker process.

Modes (``SandboxLearner.mode``), strongest available first:

- ``namespaces`` (root, ``unshare`` works): new mount/pid/net/ipc/uts namespaces, the grader's
  directories hidden, every mount read-only but a private ``/tmp``, an unprivileged user.
- ``user`` (root, ``unshare`` refused, e.g. no CAP_SYS_ADMIN in Docker): an unprivileged user
  of its own; with Landlock (Linux >= 5.13) writes only in its temporary directory and no reads
  of the grader's directories; files it leaves in /tmp, /var/tmp, /dev/shm are deleted.
- ``none``: not root, or ``isolate=False``. As root, when neither sandbox can be had, grading
  is refused (``SandboxUnavailable``) unless ``isolate=False``.

Every read and write on the worker's pipes has a deadline (per-call time limit, per-exercise
``timeout``, and the submission's total ``budget``); a worker that times out, crashes or
garbles the protocol is killed (process group, and every process of its user) and a fresh one
is started for the next call. Requests the worker's proxies send while learner code runs are
answered by ``self.store`` (the reference objects, in this process).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

from autograder.errors import LearnerError
from autograder.isolation import (UID_BASE, UNSHARE, SandboxUnavailable, can_switch_user,
                                  delete_leftovers, hidden_dirs, import_dirs, kill_user,
                                  namespaces_available, outermost, readable_dirs)
from autograder.kernel_rules import cell_problem
from autograder.protocol import ProtocolError, read_message, write_message
from autograder.refs import Handle, from_wire, to_wire
from autograder.store import GraderSideTrace, ReferenceStore

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
ENV_KEPT = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_VISIBLE_DEVICES")
OUTPUT_LIMIT = 4000
STARTUP_SECONDS = 120
MAX_PROCESSES = 128
# Imported by the worker once confined, before any learner code (those the grader can import):
# the standard library, torch and its lazily loaded parts, numpy, triton.
STARTUP_IMPORTS = ("math", "sysconfig", "json", "numpy", "torch", "torch.nn.functional",
                   "torch.utils.serialization", "torch.utils.data", "triton", "triton.language")
LIVE: set["SandboxLearner"] = set()


class EnvironmentProblem(SandboxUnavailable):
    """The sandbox worker cannot import what learner code needs (grading refused)."""


def importable(name: str) -> bool:
    """Whether this (the grader's) interpreter can import ``name``."""
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def kill_all() -> None:
    """Kill every live sandbox (on SIGTERM to the grader)."""
    for learner in list(LIVE):
        learner.close()


class SandboxLearner(GraderSideTrace):
    """The learner API (``call``, ``new``, ``method``, ``getattr``, ``launch``, ``last_trace``)
    for the solution ``cells`` (list of ``(grade_id, source)``), run in a worker process.

    ``timeout`` (seconds per call), ``budget`` (seconds of learner time for the whole
    submission), ``memory_mb``, ``hide`` (directories made unreadable in ``namespaces`` mode),
    ``isolate=False`` runs without a sandbox, ``forbid`` adds functions to guard (those of
    every registered exercise are). ``cell_errors`` maps grade_id -> why its cell did
    not load.
    """

    def __init__(self, cells: list[tuple[str, str]], *, timeout: float = 10,
                 memory_mb: int = 4096, hide: Iterable[str | Path] = (), isolate: bool = True,
                 budget: float = 600, forbid: Iterable[str] = ()):
        self.cells, self.timeout, self.memory_mb = list(cells), timeout, memory_mb
        self.budget, self._spent = budget, 0.0
        self.forbid = set(forbid)  # guarded in the worker, with every forbid of REGISTRY
        self.hide = [str(Path(p).resolve()) for p in hide]
        self.cell_errors: dict[str, str] = {}
        self.store = ReferenceStore()
        self.exercise = None
        self._proc: subprocess.Popen | None = None
        self._worker_mb = memory_mb
        self._handles: set[int] = set()
        self._spawned = False
        self._output: list[str] = []
        reason = namespaces_available() if isolate else "disabled with --no-isolation"
        if reason is None:
            self.mode = "namespaces"
        elif isolate and can_switch_user():
            self.mode = "user"
        elif isolate and os.geteuid() == 0:
            raise SandboxUnavailable(
                f"refusing to grade as root without a sandbox ({reason}; and no user to drop "
                "to: CAP_SETUID/CAP_SETGID are missing). Give the grader those capabilities, "
                "or pass --no-isolation if you trust the submissions")
        else:
            self.mode = "none"
        self.uid = UID_BASE + os.getpid() if self.mode != "none" and can_switch_user() else None
        self.isolation = {
            "namespaces": "isolated: new mount/pid/net namespaces, grader files hidden, "
                          "read-only file system, unprivileged user",
            "user": f"isolated as an unprivileged user, without namespaces ({reason})",
            "none": f"NOT isolated ({reason}): import blocker and resource limits only"}[self.mode]
        self._workdir = Path(tempfile.mkdtemp(prefix="autograder-worker-"))
        self._log = Path(tempfile.mkdtemp(prefix="autograder-log-")) / "output.txt"
        LIVE.add(self)

    # -- what the grader tests see -----------------------------------------------------------
    def begin(self, exercise) -> None:
        """The exercise graded from now on (its ``forbid`` list, ``timeout`` and ``memory_mb``:
        a running worker whose memory limit is not the exercise's is stopped, and the next call
        starts one with the right limit, set before any learner code runs)."""
        self.exercise = exercise
        if self._proc is not None and self._worker_mb != self.memory_limit_mb:
            self._kill()

    @property
    def memory_limit_mb(self) -> int:
        """The memory limit (MB) the learner's code runs under for the current exercise."""
        wanted = getattr(self.exercise, "memory_mb", None)
        return min(self.memory_mb, wanted) if wanted else self.memory_mb

    def cell_source(self, grade_id: str) -> str | None:
        return next((src for gid, src in self.cells if gid == grade_id), None)

    # -- worker life cycle -------------------------------------------------------------------
    def _spawn(self) -> None:
        from autograder.plugin import REGISTRY
        import torch
        worker_in, grader_out = os.pipe()
        grader_in, worker_out = os.pipe()
        log = open(self._log, "ab", buffering=0)
        if self.uid is not None:
            os.chown(self._workdir, self.uid, self.uid)
        cuda = torch.cuda.is_available()
        hide = hidden_dirs(self.hide, self._workdir) if self.mode != "none" else []
        imports = import_dirs(exclude=hide + [str(PACKAGE_ROOT / "autograder"),
                                              str(PACKAGE_ROOT / "reference")])
        self._worker_mb = self.memory_limit_mb
        config = {"in": worker_in, "out": worker_out, "memory_mb": self._worker_mb,
                  "memory_limit": "data" if cuda or torch.version.cuda else "as",
                  "lockdown": self.mode == "namespaces",
                  "hide": hide, "restore": outermost(imports),
                  "uid": self.uid, "keep_read": not readable_dirs(imports),
                  "check_imports": [m for m in STARTUP_IMPORTS if importable(m)],
                  "tmp": str(self._workdir), "max_processes": MAX_PROCESSES,
                  "forbid": sorted(self.forbid | {n for e in REGISTRY.values() for n in e.forbid})}
        command = [sys.executable, "-s", "-m", "autograder.worker", json.dumps(config)]
        if self.mode == "namespaces":
            command = UNSHARE + command
        env = {k: os.environ[k] for k in ENV_KEPT if k in os.environ}
        # the grader's own sys.path (user site, .pth and editable paths) although the worker
        # runs with -s: it imports from where the grader does
        on_path = [str(Path(p).resolve()) for p in sys.path if p and os.path.isabs(p)]
        python_path = [str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")]),
                       *(p for p in on_path if p in imports)]
        env.update(PYTHONPATH=os.pathsep.join(python_path), AUTOGRADER_ROOT=str(PACKAGE_ROOT),
                   PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS=str(min(4, os.cpu_count() or 1)))
        if not cuda:
            env["TRITON_INTERPRET"] = "1"
        try:
            self._proc = subprocess.Popen(
                command, pass_fds=(worker_in, worker_out), stdin=subprocess.DEVNULL,
                stdout=log, stderr=log, cwd=self._workdir, env=env, start_new_session=True)
        finally:
            os.close(worker_in), os.close(worker_out), log.close()
        self._write, self._read = grader_out, grader_in
        os.set_blocking(self._write, False), os.set_blocking(self._read, False)
        self._handles.clear()
        try:
            ready = self._exchange(None, time.monotonic() + STARTUP_SECONDS, "while starting")
        except (LearnerError, TimeoutError) as exc:
            log = self._log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the sandbox worker failed to start ({exc}):\n{log}") from None
        if ready.get("environment"):
            self._kill()
            raise EnvironmentProblem(
                f"the Python environment does not work inside the sandbox: the worker "
                f"{ready['environment']} (it imports from {', '.join(imports)}). Grade with a "
                "Python installed where the sandbox can read it, or pass --no-isolation if you "
                "trust the submissions")
        if not ready.get("ready"):
            raise RuntimeError("the sandbox worker did not start properly")
        layers = ready.get("isolation")
        if self.mode != "none" and isinstance(layers, list) and "(worker:" not in self.isolation:
            self.isolation += f" (worker: {', '.join(str(x) for x in layers)})"

    def start(self) -> None:
        """Start the first worker and load the cells, before any test: a worker that cannot
        start in this environment (not the learner's doing, no learner code has run) raises
        ``SandboxUnavailable`` and grading is refused."""
        try:
            self._ensure_worker()
        except LearnerError:
            pass   # the budget ran out while loading the cells: the tests say so

    def _ensure_worker(self) -> None:
        while self._proc is None:
            if self._spent >= self.budget:
                raise LearnerError(f"time budget exhausted ({self.budget:g} s for the whole "
                                   "submission): this test was not run")
            start = time.monotonic()
            try:
                self._spawn()
            except RuntimeError as exc:
                if self._spawned or isinstance(exc, SandboxUnavailable):
                    raise
                raise EnvironmentProblem(
                    f"the Python environment does not work inside the sandbox: {exc}\nGrading "
                    "refused. Grade with a Python installed where the sandbox can read it, or "
                    "pass --no-isolation if you trust the submissions") from None
            finally:  # restarts count: a submission that crashes every call must not stall us
                self._spent += time.monotonic() - start
            self._spawned = True   # from now on a failed start may be the learner's doing
            for grade_id, source in self.cells:
                if grade_id in self.cell_errors:
                    continue
                try:
                    self._request({"op": "exec", "grade_id": grade_id, "source": source})
                except LearnerError as exc:
                    self.cell_errors[grade_id] = str(exc)
                    if self._proc is None:
                        break  # the worker died: start again without this cell

    def _kill(self) -> None:
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if self.uid is not None:
                kill_user(self.uid)
            self._proc.wait()
            os.close(self._write), os.close(self._read)
            self._proc = None

    def _crashed(self, what: str) -> LearnerError:
        """Error for a worker that closed its pipe (killed if still running after 2 s)."""
        try:
            cause = f"the worker exited with code {self._proc.wait(timeout=2)}"
        except subprocess.TimeoutExpired:
            cause = "it closed the grader's pipe"
        self._kill()
        return LearnerError(f"crashed {what} ({cause})")

    def close(self) -> None:
        """Stop the worker, delete its working directory and whatever its user left behind."""
        self._kill()
        LIVE.discard(self)
        shutil.rmtree(self._workdir, ignore_errors=True)
        shutil.rmtree(self._log.parent, ignore_errors=True)
        if self.uid is not None and self.mode == "user":
            delete_leftovers(self.uid)

    # -- one request -------------------------------------------------------------------------
    def _exchange(self, request: dict | None, deadline: float, what: str) -> dict:
        """Send ``request`` (if any) and return the worker's final reply, answering the proxy
        requests that come first. Every read and write ends at ``deadline``."""
        try:
            if request is not None:
                write_message(self._write, request, deadline)
            while True:
                reply = read_message(self._read, deadline)
                if not isinstance(reply, dict):
                    raise ProtocolError("reply is not a dict")
                if reply.get("op") != "remote":
                    return reply
                write_message(self._write, self.store.handle(reply), deadline)
        except TimeoutError:
            self._kill()
            raise
        except (EOFError, OSError):
            raise self._crashed(what) from None
        except ProtocolError as exc:
            self._kill()
            raise LearnerError(f"the sandbox sent back garbage {what}: {exc}") from None

    def _request(self, request: dict) -> Any:
        left = self.budget - self._spent
        if left <= 0:
            raise LearnerError(f"time budget exhausted ({self.budget:g} s for the whole "
                               "submission): this test was not run")
        limit = self.timeout if self.exercise is None or self.exercise.timeout is None \
            else self.exercise.timeout
        self._take_log()
        start = time.monotonic()
        try:
            reply = self._exchange(request, start + min(limit, left), "while running your code")
        except TimeoutError:
            if left < limit:
                raise LearnerError(f"time budget exhausted ({self.budget:g} s for the whole "
                                   "submission)") from None
            raise LearnerError(f"timed out after {limit:g} s — an infinite loop?") from None
        finally:
            self._spent += time.monotonic() - start
            self._take_log()
        if not reply.get("ok"):
            raise LearnerError(str(reply.get("error", "unknown error"))[:2000])
        return from_wire(reply.get("value"))

    def _take_log(self) -> None:
        try:
            with open(self._log, "rb+") as log:
                text = log.read(OUTPUT_LIMIT + 1).decode("utf-8", errors="replace")
                log.truncate(0)
        except OSError:
            return
        if text:
            self._output.append(text[:OUTPUT_LIMIT] + ("\n… (output truncated)"
                                                       if len(text) > OUTPUT_LIMIT else ""))

    def take_output(self) -> str:
        """The learner's stdout/stderr since the last ``take_output()`` (truncated)."""
        text, self._output = "".join(self._output), []
        return text[:2 * OUTPUT_LIMIT]

    def _call(self, request: dict) -> Any:
        self._ensure_worker()
        self.store.trace.clear()
        if self.exercise is not None:
            request["forbid"] = list(self.exercise.forbid)
        value = self._request(request)
        for handle in _handles_in(value):
            self._handles.add(handle.id)
        return value

    def _wire(self, value: Any) -> Any:
        return to_wire(value, self.store.register)

    def _target(self, handle: Handle) -> dict:
        if not isinstance(handle, Handle) or handle.id not in self._handles:
            raise LearnerError("this object was lost: the worker was restarted after an earlier "
                               "failure (time-out or crash)")
        return to_wire(handle)

    # -- the learner API ---------------------------------------------------------------------
    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Result of the learner's function ``name(*args, **kwargs)`` (plain data or Handle)."""
        return self._call_named(name, {"op": "call", "name": name, "args": self._wire(args),
                                       "kwargs": self._wire(kwargs)})

    def _call_named(self, name: str, request: dict) -> Any:
        """``_call``, naming the failed cell when ``name`` is undefined because its cell raised."""
        try:
            return self._call(request)
        except LearnerError as exc:
            if name in self.cell_errors and "is not defined" in str(exc):
                raise LearnerError(f"`{name}` is not defined because its cell failed: "
                                   f"{self.cell_errors[name]}") from None
            raise

    def new(self, cls: str, *args: Any, **kwargs: Any) -> Any:
        """``Handle`` to a new instance of the learner's class ``cls``."""
        return self.call(cls, *args, **kwargs)

    def method(self, handle: Handle, name: str, *args: Any, **kwargs: Any) -> Any:
        """Result of ``obj.name(*args, **kwargs)`` for the object behind ``handle``."""
        return self._call({"op": "call", "handle": self._target(handle), "attr": name,
                           "args": self._wire(args), "kwargs": self._wire(kwargs)})

    def getattr(self, handle: Handle, attr: str) -> Any:
        """Value of attribute ``attr`` of the object behind ``handle``."""
        return self._call({"op": "call", "handle": self._target(handle), "attr": attr,
                           "get": True, "args": (), "kwargs": {}})

    def launch(self, kernel: str, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> list:
        """Run the learner's Triton kernel ``kernel[grid](*args, **kwargs)``; returns ``args``
        as they are after the launch (the kernel's outputs are written into them). A kernel
        cell that is not plain Triton code (``kernel_rules.cell_problem``) is refused unrun."""
        problem = cell_problem(self.cell_source(kernel), kernel)
        if problem:
            raise LearnerError(problem)
        return self._call_named(kernel, {"op": "launch", "name": kernel,
                                         "grid": [int(g) for g in grid],
                                         "args": self._wire(args), "kwargs": self._wire(kwargs)})


def _handles_in(value: Any) -> list[Handle]:
    if isinstance(value, Handle):
        return [value]
    if isinstance(value, (list, tuple)):
        return [h for v in value for h in _handles_in(v)]
    if isinstance(value, dict):
        return [h for v in value.values() for h in _handles_in(v)]
    return []
