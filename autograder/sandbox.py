"""Grader side of the sandbox: ``SandboxLearner`` runs learner code in a worker process.

As root with a working ``unshare`` the worker gets new mount, pid, net, ipc and uts namespaces,
the HIDE directories covered by empty read-only tmpfs mounts, and no capabilities. Otherwise
it runs as a plain child process (import blocker and rlimits only); ``isolation`` says which.
Every call has a time limit; a worker that times out, crashes or garbles the protocol is killed
(whole process group) and a fresh one is started for the next call.
"""
from __future__ import annotations

import functools
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
from autograder.protocol import ProtocolError, read_message, write_message
from autograder.refs import Handle, from_wire, to_wire

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
UNSHARE = ["unshare", "--mount", "--pid", "--fork", "--net", "--ipc", "--uts", "--kill-child",
           "--mount-proc"]
OUTPUT_LIMIT = 4000
STARTUP_SECONDS = 120


@functools.lru_cache(maxsize=1)
def namespaces_available() -> str | None:
    """``None`` if the worker can be isolated with ``unshare``, else the reason why not."""
    if os.geteuid() != 0:
        return "not running as root"
    if shutil.which("unshare") is None:
        return "the unshare command is missing"
    probe = subprocess.run(UNSHARE + ["true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare failed: {probe.stderr.strip()}"


class SandboxLearner:
    """The learner API (``call``, ``new``, ``method``, ``getattr``, ``last_trace``) for the
    solution ``cells`` (list of ``(grade_id, source)``), run in a separate worker process.

    ``timeout`` (seconds per call), ``memory_mb`` (RLIMIT_AS), ``hide`` (directories made
    unreadable when isolated), ``isolate=False`` skips the namespaces.
    ``cell_errors`` maps grade_id -> why its cell did not load.
    """

    def __init__(self, cells: list[tuple[str, str]], *, timeout: float = 10,
                 memory_mb: int = 4096, hide: Iterable[str | Path] = (), isolate: bool = True):
        self.cells, self.timeout, self.memory_mb = list(cells), timeout, memory_mb
        self.hide = [str(Path(p).resolve()) for p in hide]
        self.cell_errors: dict[str, str] = {}
        self.last_trace: list[tuple[tuple[int, ...], bool]] = []
        self._proc: subprocess.Popen | None = None
        self._handles: set[int] = set()
        self._output: list[str] = []
        self._workdir = Path(tempfile.mkdtemp(prefix="autograder-worker-"))
        reason = namespaces_available() if isolate else "disabled with --no-isolation"
        self.isolated = reason is None
        self.isolation = ("isolated: new mount/pid/net namespaces, grader files hidden, no "
                          "capabilities" if self.isolated else
                          f"NOT isolated ({reason}): import blocker and resource limits only")

    # -- worker life cycle -------------------------------------------------------------------
    def _spawn(self) -> None:
        worker_in, grader_out = os.pipe()
        grader_in, worker_out = os.pipe()
        log = open(self._workdir / "output.txt", "ab", buffering=0)
        command = [sys.executable, "-s", "-m", "autograder.worker", str(worker_in),
                   str(worker_out), str(self.memory_mb)]
        if self.isolated:
            command = UNSHARE + command + ["--lockdown"] + self._hidden_dirs()
        python_path = [str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = dict(os.environ, AUTOGRADER_ROOT=str(PACKAGE_ROOT),
                   PYTHONPATH=os.pathsep.join(python_path))
        try:
            self._proc = subprocess.Popen(
                command, pass_fds=(worker_in, worker_out), stdin=subprocess.DEVNULL,
                stdout=log, stderr=log, cwd=self._workdir, env=env, start_new_session=True)
        finally:
            os.close(worker_in), os.close(worker_out), log.close()
        self._write, self._read = grader_out, grader_in
        self._handles.clear()
        try:
            ready = self._receive(time.monotonic() + STARTUP_SECONDS, "while starting")
        except LearnerError as exc:
            log = (self._workdir / "output.txt").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the sandbox worker failed to start ({exc}):\n{log}") from None
        if not ready.get("ready"):
            raise RuntimeError("the sandbox worker did not start properly")

    def _hidden_dirs(self) -> list[str]:
        """Directories to cover: existing, not containing what the worker needs (Python, the
        temp dir), not inside another covered one. The installed packages are added."""
        import reference
        needed = [Path(sys.prefix).resolve(), Path(os.__file__).resolve(), self._workdir,
                  Path(tempfile.gettempdir()).resolve()]
        packages = [Path(reference.__file__).resolve().parent, Path(__file__).resolve().parent]
        chosen: list[Path] = []
        for d in sorted({Path(p) for p in self.hide} | set(packages), key=lambda p: len(p.parts)):
            if d.is_dir() and not any(n == d or d in n.parents for n in needed) \
                    and not any(c == d or c in d.parents for c in chosen):
                chosen.append(d)
        return [str(d) for d in chosen]

    def _ensure_worker(self) -> None:
        while self._proc is None:
            self._spawn()
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
        """Stop the worker and delete its working directory."""
        self._kill()
        shutil.rmtree(self._workdir, ignore_errors=True)

    # -- one request -------------------------------------------------------------------------
    def _receive(self, deadline: float, what: str) -> dict:
        try:
            reply = read_message(self._read, deadline)
            if not isinstance(reply, dict):
                raise ProtocolError("reply is not a dict")
            return reply
        except TimeoutError:
            self._kill()
            raise LearnerError(f"timed out after {self.timeout:g} s — an infinite loop?") from None
        except (EOFError, OSError):
            raise self._crashed(what) from None
        except ProtocolError as exc:
            self._kill()
            raise LearnerError(f"the sandbox sent back garbage {what}: {exc}") from None

    def _request(self, request: dict) -> Any:
        self._take_log()
        try:
            write_message(self._write, request)
        except OSError:
            raise self._crashed("before running your code") from None
        try:
            reply = self._receive(time.monotonic() + self.timeout, "while running your code")
        finally:
            self._take_log()
        trace = reply.get("trace")
        self.last_trace = [(tuple(s), bool(c)) for s, c in trace] if isinstance(trace, list) \
            else []
        if not reply.get("ok"):
            raise LearnerError(str(reply.get("error", "unknown error"))[:2000])
        return from_wire(reply.get("value"))

    def _take_log(self) -> None:
        path = self._workdir / "output.txt"
        try:
            with open(path, "rb+") as log:
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
        value = self._request(request)
        for handle in _handles_in(value):
            self._handles.add(handle.id)
        return value

    def _target(self, handle: Handle) -> dict:
        if not isinstance(handle, Handle) or handle.id not in self._handles:
            raise LearnerError("this object was lost: the worker was restarted after an earlier "
                               "failure (time-out or crash)")
        return to_wire(handle)

    # -- the learner API ---------------------------------------------------------------------
    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Result of the learner's function ``name(*args, **kwargs)`` (plain data or Handle)."""
        request = {"op": "call", "name": name, "args": to_wire(args), "kwargs": to_wire(kwargs)}
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
                           "args": to_wire(args), "kwargs": to_wire(kwargs)})

    def getattr(self, handle: Handle, attr: str) -> Any:
        """Value of attribute ``attr`` of the object behind ``handle``."""
        return self._call({"op": "call", "handle": self._target(handle), "attr": attr,
                           "get": True, "args": (), "kwargs": {}})


def _handles_in(value: Any) -> list[Handle]:
    if isinstance(value, Handle):
        return [value]
    if isinstance(value, (list, tuple)):
        return [h for v in value for h in _handles_in(v)]
    if isinstance(value, dict):
        return [h for v in value.values() for h in _handles_in(v)]
    return []
