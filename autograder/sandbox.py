"""``SandboxLearner``: the ``Learner`` (``autograder.learner``) whose code runs in a worker
process behind the process boundary (``autograder.boundary.process``); this side keeps the time
limits and the proxies' objects.

Modes (``SandboxLearner.mode``), strongest available first:

- ``namespaces`` (root, new namespaces can be made): new mount/pid/net/ipc/uts namespaces, the
  grader's directories hidden, every mount read-only but a private ``/tmp``, an unprivileged user.
- ``user`` (root, namespaces refused, e.g. no CAP_SYS_ADMIN in Docker): an unprivileged user
  of its own; with Landlock (Linux >= 5.13) writes only in its temporary directory and no reads
  of the grader's directories; files it leaves in /tmp, /var/tmp, /dev/shm are deleted.
- ``none``: not root, or ``isolate=False``. As root, when neither sandbox can be had, grading
  is refused (``SandboxUnavailable``) unless ``isolate=False``.

Where the exercises to grade need workers with different memory limits (``memory_mb``), the next
one is started ahead (``start``'s plan), as a second sandbox user, while the running one serves
its exercises, so that changing workers costs no wait for its imports.

Workers are forked by a fork server that imported torch once (``autograder.boundary.forkserver``):
a new worker, for each submission or after one was killed, costs milliseconds, not an import.

Every read and write on the worker's pipes has a deadline (per-call time limit, per-exercise
``timeout``, and the submission's total ``budget``); a worker that times out, crashes or
garbles the protocol is killed (process group, and every process of its user) and a fresh one
is started for the next call. Requests the worker's proxies send while learner code runs are
answered by ``self.store`` (the reference objects, in this process).
"""
from __future__ import annotations

import ast
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

from autograder.boundary.budget import TimeBudget
from autograder.boundary.builds import BUILD_SECONDS, KernelBuilder
from autograder.boundary.causes import NOT_IMPLEMENTED, LearnerError
from autograder.boundary.guard import CallWork
from autograder.boundary.isolation import (UID_SPAN, SandboxUnavailable, choose_mode,
                                           delete_leftovers)
from autograder.boundary.process import EnvironmentProblem, ForkServer, WorkerProcess
from autograder.boundary.refs import Handle, from_wire, to_wire
from autograder.boundary.traffic import LaunchTraffic
from autograder.learner import Learner
from autograder.rules.plugin import REGISTRY

__all__ = ["SandboxLearner", "SandboxUnavailable", "EnvironmentProblem", "kill_all"]
LIVE: set["SandboxLearner"] = set()


def kill_all() -> None:
    """Kill every live sandbox and the fork servers (on SIGTERM to the grader)."""
    for learner in list(LIVE):
        learner.close()
    ForkServer.stop_all(wait=False)


class SandboxLearner(Learner):
    """The learner API for the solution ``cells`` (list of ``(grade_id, source)``), run in a
    worker process.

    ``timeout`` (seconds per call), ``budget`` (seconds of learner time for the whole
    submission), ``memory_mb``, ``hide`` (directories made unreadable in ``namespaces`` mode),
    ``isolate=False`` runs without a sandbox, ``forbid`` adds functions to guard (those of
    every registered exercise are: the worker starts before the first exercise is known).
    ``cell_errors`` maps grade_id -> why its cell did not load.
    """

    def __init__(self, cells: list[tuple[str, str]], *, timeout: float = 10,
                 memory_mb: int = 4096, hide: Iterable[str | Path] = (), isolate: bool = True,
                 budget: float = 600, forbid: Iterable[str] = ()):
        super().__init__()
        self.cells, self.timeout, self.memory_mb = list(cells), timeout, memory_mb
        self.budget = TimeBudget(budget)
        self.forbid = set(forbid)  # guarded in the worker, with every forbid of REGISTRY
        self.cell_errors: dict[str, str] = {}
        self._stubs: dict[str, bool] = {}   # function name -> still at its stub (cells never change)
        self._handles: set[int] = set()
        self._spawned = False
        self._builder: KernelBuilder | None = None   # the compile worker, at the first build
        self._building: ThreadPoolExecutor | None = None  # sends builds, one at a time, beside the tests
        self._builds: dict[tuple, Future] = {}
        self.mode, uid, self.isolation = choose_mode(isolate)
        self._uids = (uid, None if uid is None else uid + UID_SPAN)
        self._hide = [str(Path(p).resolve()) for p in hide]
        self._dirs: list[Path] = []   # the workers' working and log directories, deleted at close
        self.worker = self._new_worker(uid)
        self._standby: WorkerProcess | None = None   # the next memory limit's worker, started ahead
        self._limits: list[int] = []   # the memory limits of start's plan, in the order graded
        LIVE.add(self)

    def _new_worker(self, uid: int | None) -> WorkerProcess:
        workdir = Path(tempfile.mkdtemp(prefix="autograder-worker-"))
        log = Path(tempfile.mkdtemp(prefix="autograder-log-")) / "output.txt"
        self._dirs += [workdir, log.parent]
        return WorkerProcess(self.mode, uid, workdir, log, self._hide)

    @property
    def uid(self) -> int | None:
        """The sandbox user of the running worker (``None``: the grader's user)."""
        return self.worker.uid

    # -- what the grader tests see -----------------------------------------------------------
    # ``begin`` (Learner): the exercise's first call to the learner's code stops a worker whose
    # memory limit is not the exercise's and starts one with the right limit, set before any
    # learner code runs; an exercise left at its stub starts none.

    @property
    def memory_limit_mb(self) -> int:
        """The memory limit (MB) the learner's code runs under for the current exercise."""
        return self._limit_of(self.exercise)

    def _limit_of(self, exercise) -> int:
        wanted = getattr(exercise, "memory_mb", None)
        return min(self.memory_mb, wanted) if wanted else self.memory_mb

    def cell_list(self) -> list[tuple[str, str]]:
        return self.cells

    # -- worker life cycle -------------------------------------------------------------------
    def launch_worker(self, exercises: Iterable = ()) -> None:
        """Start the first worker's process without waiting for it (``start`` waits), so that it
        imports torch while the grader loads its tests: under the memory limit of the first of
        ``exercises`` (in the order graded) not left at its stub, so that a submission whose
        only work is a memory-limited exercise starts one worker, not two. Never raises:
        ``start`` reports."""
        limits = self._plan(exercises)
        if not limits:
            return   # every exercise at its stub: no learner code will run
        try:
            self.worker.launch(limits[0], self._forbidden())
        except Exception:  # noqa: BLE001 - start() tries again and says why
            self.worker.kill()

    def start(self, exercises: Iterable = ()) -> None:
        """Start the first worker and load the cells, before any test: a worker that cannot
        start in this environment (not the learner's doing, no learner code has run) raises
        ``SandboxUnavailable`` and grading is refused. ``exercises``: those to be graded, in
        order (the plan); where their memory limits differ, the next limit's worker is started
        ahead, unless every exercise needing it is still at its stub. A plan left empty (every
        exercise at its stub) starts none: no learner code will run."""
        self._limits = self._plan(exercises)
        if not self._limits:
            return   # every exercise at its stub (or refused by its cell's look): no worker
        try:
            self._ensure_worker()
        except LearnerError:
            pass   # the budget ran out while loading the cells: the tests say so

    def _plan(self, exercises: Iterable) -> list[int]:
        """The memory limits of ``exercises`` (in the order graded), once each, leaving out the
        exercises still at their stub (they call no learner code)."""
        limits: list[int] = []
        for exercise in exercises:
            limit = self._limit_of(exercise)
            if limit not in limits and not untouched_stub(self.cells, exercise.grade_id):
                limits.append(limit)
        return limits

    def _forbidden(self) -> list[str]:
        return sorted(self.forbid | {n for e in REGISTRY.values() for n in e.forbid})

    def _spawn(self) -> None:
        standby = self._standby
        if not self.worker.running and standby and standby.memory_mb == self.memory_limit_mb:
            self.worker, self._standby = standby, None   # started ahead for this limit
        if not self.worker.running:
            self.worker.launch(self.memory_limit_mb, self._forbidden())
        self.worker.wait_ready()
        self._handles.clear()
        if self.mode != "none" and self.worker.isolation and "(worker:" not in self.isolation:
            self.isolation += f" (worker: {', '.join(self.worker.isolation)})"

    def _start_next_ahead(self) -> None:
        """Launch the worker of the plan's next memory limit after the running one's, as the
        other sandbox user (killing this worker kills every process of its user)."""
        limits = self._limits
        if self._standby is not None or self.worker.memory_mb not in limits[:-1]:
            return
        other = self._uids[1] if self.worker.uid == self._uids[0] else self._uids[0]
        standby = self._new_worker(other)
        try:
            standby.launch(limits[limits.index(self.worker.memory_mb) + 1], self._forbidden())
        except Exception:  # noqa: BLE001 - the next limit's first call starts it and says why
            standby.kill()
            return
        self._standby = standby

    def _ensure_worker(self) -> None:
        while not self.worker.ready:
            self.budget.require()
            try:
                with self.budget.charged():   # restarts count too
                    self._spawn()
            except RuntimeError as exc:
                if self._spawned or isinstance(exc, SandboxUnavailable):
                    raise
                raise EnvironmentProblem(
                    f"the Python environment does not work inside the sandbox: {exc}\nGrading "
                    "refused. Grade with a Python installed where the sandbox can read it, or "
                    "pass --no-isolation if you trust the submissions") from None
            self._spawned = True   # from now on a failed start may be the learner's doing
            for grade_id, source in self.cells:
                if grade_id in self.cell_errors:
                    continue
                try:
                    self._request({"op": "exec", "grade_id": grade_id, "source": source})
                except LearnerError as exc:
                    self.cell_errors[grade_id] = str(exc)
                    if not self.worker.running:
                        break  # the worker died: start again without this cell
            if self.worker.ready:
                self._start_next_ahead()

    def close(self) -> None:
        """Stop the workers, delete their working directories and whatever their users left."""
        if self._builder is not None:
            self._builder.close()
        if self._building is not None:
            self._building.shutdown(cancel_futures=True)
        self.worker.kill()
        if self._standby is not None:
            self._standby.kill()
        LIVE.discard(self)
        for folder in self._dirs:
            shutil.rmtree(folder, ignore_errors=True)
        if self.mode == "user":
            for uid in filter(None, self._uids):
                delete_leftovers(uid)

    # -- one request, within the time limits ---------------------------------------------------
    def _request(self, request: dict) -> Any:
        self.largest_allocation, self.last_traffic, self.last_call_work = 0, None, CallWork()
        self.budget.require()
        limit = self.timeout if self.exercise is None or self.exercise.timeout is None \
            else self.exercise.timeout
        left = self.budget.left
        self.worker.take_log()
        try:
            with self.budget.charged() as start:
                reply = self.worker.exchange(request, start + min(limit, left),
                                             "while running your code", self.store.handle)
        except TimeoutError:
            raise LearnerError(f"time budget exhausted ({self.budget.total:g} s for the whole "
                               "submission)" if left < limit else
                               f"timed out after {limit:g} s — an infinite loop?") from None
        finally:
            self.worker.take_log()
        if not reply.get("ok"):
            refused = reply.get("refused_ops")
            if isinstance(refused, list) and self.exercise is not None:
                names = [str(n) for n in refused][:10]
                raise self.refused(names, str(reply.get("where") or "")[:300])
            raise LearnerError(str(reply.get("error", "unknown error"))[:2000])
        largest = reply.get("largest")
        self.largest_allocation = int(largest) if isinstance(largest, int) else 0
        self.last_traffic = LaunchTraffic.from_wire(reply.get("traffic"))
        self.last_call_work = CallWork.from_wire(reply.get("work"))
        return from_wire(reply.get("value"))

    def take_output(self) -> str:
        """The learner's stdout/stderr since the last ``take_output()`` (truncated)."""
        return self.worker.take_output()

    def _call(self, request: dict) -> Any:
        if self.worker.running and self.worker.memory_mb != self.memory_limit_mb:
            self.worker.kill()
            self._handles.clear()
            if "handle" in request:
                self._target(from_wire(request["handle"]))   # lost with the old worker: says so
        self._ensure_worker()
        self.store.trace.clear()
        if self.exercise is not None:
            request["forbid"] = list(self.exercise.forbid)
            allowed = self.allowed_operations()
            if allowed is not None:
                request["allowed_ops"] = sorted(allowed)
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
        """Result of the learner's function ``name(*args, **kwargs)`` (plain data or Handle).
        A function still at its stub (``untouched_stub``) fails as its call would, unrun, so
        that an exercise left undone starts no worker."""
        if name not in self._stubs:
            self._stubs[name] = untouched_stub(self.cells, name)
        if self._stubs[name]:
            raise LearnerError(NOT_IMPLEMENTED)
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
        as they are after the launch (the kernel's outputs are written into them); its loads and
        stores are then in ``last_traffic`` (None when the kernel ran compiled). A kernel cell
        that is not plain Triton code (``kernel_rules.cell_problem``) is refused unrun, and so is
        every kernel while a cell names the interpreter's internals (``interpreter_reach``)."""
        problem = self.launch_problem(kernel)
        if problem:
            raise LearnerError(problem)
        return self._call_named(kernel, {"op": "launch", "name": kernel,
                                         "grid": [int(g) for g in grid],
                                         "args": self._wire(args), "kwargs": self._wire(kwargs)})


    def build_kernel_soon(self, kernel: str, source: str, launches: list[list]) -> None:
        """Start building ``source`` (``rules/gpu_targets.build_source``) for every target at each
        launch in the compile worker (``boundary/builds.py``), beside whatever runs meanwhile."""
        key = (kernel, source, repr(launches))
        if key not in self._builds:
            if self._builder is None:
                self._builder = KernelBuilder(self.mode, self.uid, self.worker.hide, self.memory_mb)
                self._building = ThreadPoolExecutor(1, thread_name_prefix="gpu-builds")
            self._builds[key] = self._building.submit(self._builder.build, source, kernel, launches, BUILD_SECONDS)

    def build_kernel(self, kernel: str, source: str, launches: list[list]) -> dict:
        """The reports of ``build_kernel_soon``'s builds (started now if they were not); the time
        waited for them counts against the submission's budget."""
        self.build_kernel_soon(kernel, source, launches)
        self.budget.require()
        with self.budget.charged():
            return self._builds[(kernel, source, repr(launches))].result()


def untouched_stub(cells: list[tuple[str, str]], name: str) -> bool:
    """Whether ``name`` is a function of the cells that is still its stub: defined once, in
    the cell graded as ``name``, as a body that only raises NotImplementedError (after its
    docstring), and named in no other cell (which could define it again)."""
    own = [src for gid, src in cells if gid == name]
    if len(own) != 1 or any(name in src for gid, src in cells if gid != name):
        return False
    try:
        tree = ast.parse(own[0])
    except (SyntaxError, ValueError):
        return False
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(defs) != 1 or any(isinstance(n, (ast.Assign, ast.ClassDef, ast.AsyncFunctionDef))
                             and name in ast.unparse(n) for n in tree.body):
        return False
    body = defs[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return (len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc is not None
            and "NotImplementedError" == ast.unparse(body[0].exc).split("(")[0])


def _handles_in(value: Any) -> list[Handle]:
    if isinstance(value, Handle):
        return [value]
    if isinstance(value, (list, tuple)):
        return [h for v in value for h in _handles_in(v)]
    if isinstance(value, dict):
        return [h for v in value.values() for h in _handles_in(v)]
    return []
