"""Grader side: one sandbox worker process, its pipes and its output log.

``WorkerProcess.start`` has the fork server of the workers' environment (``ForkServer``, started
at the first worker: ``autograder.boundary.forkserver``) fork a worker confined as the mode asks
(``autograder.boundary.isolation.choose_mode``) and waits for it to say it is ready (``launch``
and ``wait_ready`` apart: the grader goes on meanwhile); ``exchange`` sends one request and
returns the final reply, answering the proxies' requests that come first; every read and write
ends at a deadline. ``kill`` stops the process group and every process of the sandbox user.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from autograder.boundary.causes import LearnerError
from autograder.boundary.isolation import (SandboxUnavailable, hidden_dirs, import_dirs,
                                           kill_user, outermost, readable_dirs, shown_dirs)
from autograder.boundary.protocol import ProtocolError, read_message, write_message

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
ENV_KEPT = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_VISIBLE_DEVICES")
OUTPUT_LIMIT = 4000
STARTUP_SECONDS = 120
MAX_PROCESSES = 128
# What learner code may import, imported by the fork server and checked by each worker once
# confined, before any learner code (those the grader can import): the standard library, torch
# and its lazily loaded parts, numpy, triton.
STARTUP_IMPORTS = ("math", "sysconfig", "json", "numpy", "torch", "torch.nn.functional",
                   "torch.utils.serialization", "torch.utils.data", "triton", "triton.language")


class EnvironmentProblem(SandboxUnavailable):
    """The sandbox worker cannot import what learner code needs (grading refused)."""


@functools.lru_cache(maxsize=1)
def learner_imports() -> list[str]:
    """The ``STARTUP_IMPORTS`` this (the grader's) interpreter can import."""
    return [m for m in STARTUP_IMPORTS if importable(m)]


def importable(name: str) -> bool:
    """Whether this (the grader's) interpreter can import ``name``."""
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class WorkerProcess:
    """The worker of one submission, in ``mode`` (``namespaces``, ``user`` or ``none``) as
    ``uid`` (``None``: the grader's own), working in ``workdir``, its output going to ``log``.
    ``isolation`` lists what the worker reported it set up (after ``start``)."""

    def __init__(self, mode: str, uid: int | None, workdir: Path, log: Path, hide: list[str],
                 compile_kernels: bool = False):
        self.mode, self.uid, self.workdir, self.log, self.hide = mode, uid, workdir, log, hide
        self.compile_kernels = compile_kernels   # the compile worker (compiling.serve)
        self.proc: ForkedWorker | None = None
        self.ready = False   # said it is ready (``wait_ready``); False again once killed
        self._killing = threading.Lock()
        self.memory_mb = 0
        self.isolation: list[str] = []
        self._output: list[str] = []
        self._server: ForkServer | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None

    def start(self, memory_mb: int, forbid: list[str]) -> None:
        """Start the worker under ``memory_mb`` with the functions ``forbid`` guarded, and wait
        until it is ready. ``EnvironmentProblem`` when it cannot import what learner code needs,
        ``RuntimeError`` when it does not start."""
        self.launch(memory_mb, forbid)
        self.wait_ready()

    def launch(self, memory_mb: int, forbid: list[str]) -> None:
        """Start the worker process (``start`` without the wait): it confines itself and imports
        what learner code may import while the caller goes on; ``wait_ready`` then waits for it."""
        import torch
        worker_in, grader_out = os.pipe()
        grader_in, worker_out = os.pipe()
        log = open(self.log, "ab", buffering=0)
        if self.uid is not None:
            os.chown(self.workdir, self.uid, self.uid)
        cuda = torch.cuda.is_available()
        hide = hidden_dirs(self.hide, self.workdir) if self.mode != "none" else []
        imports = import_dirs(exclude=hide + [str(PACKAGE_ROOT / "autograder"),
                                              str(PACKAGE_ROOT / "reference")])
        show = shown_dirs(imports)
        self.memory_mb, self._imports = memory_mb, imports
        config = {"memory_mb": memory_mb,
                  "memory_limit": "data" if cuda or torch.version.cuda else "as",
                  "lockdown": self.mode == "namespaces",
                  "show": show, "hide": hide, "restore": outermost(imports),
                  "uid": self.uid, "keep_read": not readable_dirs(imports),
                  "check_imports": learner_imports(),
                  "tmp": str(self.workdir), "max_processes": MAX_PROCESSES, "forbid": forbid,
                  "compile": self.compile_kernels}
        request = {"config": config, "workdir": str(self.workdir),
                   "namespaces": self.mode == "namespaces"}
        env = worker_environment(imports, cuda, interpret=not self.compile_kernels)
        status, status_out = os.pipe()
        try:
            self._server = ForkServer.of(env)
            self._server.fork(request, [worker_in, worker_out, log.fileno(), status_out])
        except BaseException:
            os.close(status), os.close(grader_out), os.close(grader_in)
            raise
        finally:
            os.close(worker_in), os.close(worker_out), os.close(status_out), log.close()
        self.proc = ForkedWorker(status)
        self._write, self._read = grader_out, grader_in
        os.set_blocking(self._write, False), os.set_blocking(self._read, False)
        self._started = time.monotonic()

    def wait_ready(self) -> None:
        """Wait for the launched worker to say it is ready (``STARTUP_SECONDS`` from its launch);
        the errors of ``start``."""
        if self.ready:
            return
        if self.proc is None:
            raise RuntimeError("the sandbox worker was stopped before it was ready")
        try:
            ready = self.exchange(None, self._started + STARTUP_SECONDS, "while starting")
        except (LearnerError, TimeoutError) as exc:
            log_text = self.log.read_text(errors="replace")[-3000:] + (
                self._server.failure() if self._server else "")
            raise RuntimeError(f"the sandbox worker failed to start ({exc}):\n{log_text}") from None
        if ready.get("environment"):
            self.kill()
            raise EnvironmentProblem(
                f"the Python environment does not work inside the sandbox: the worker "
                f"{ready['environment']} (it imports from {', '.join(self._imports)}). Grade with a "
                "Python installed where the sandbox can read it, or pass --no-isolation if you "
                "trust the submissions")
        if not ready.get("ready"):
            raise RuntimeError("the sandbox worker did not start properly")
        layers = ready.get("isolation")
        self.isolation = [str(x) for x in layers] if isinstance(layers, list) else []
        self.ready = True

    def exchange(self, request: dict | None, deadline: float, what: str,
                 answer: Callable[[dict], dict] | None = None) -> dict:
        """Send ``request`` (if any) and return the worker's final reply; the proxies' requests
        that come first (``op: remote``) are answered by ``answer``. Every read and write ends at
        ``deadline`` (``TimeoutError``, the worker killed); a crash or garbage is a
        ``LearnerError`` naming ``what`` the worker was doing."""
        try:
            if request is not None:
                write_message(self._write, request, deadline)
            while True:
                reply = read_message(self._read, deadline)
                if not isinstance(reply, dict):
                    raise ProtocolError("reply is not a dict")
                if reply.get("op") != "remote" or answer is None:
                    return reply
                write_message(self._write, answer(reply), deadline)
        except TimeoutError:
            self.kill()
            raise
        except (EOFError, OSError):
            raise self._crashed(what) from None
        except ProtocolError as exc:
            self.kill()
            raise LearnerError(f"the sandbox sent back garbage {what}: {exc}") from None

    def kill(self) -> None:
        """Kill the worker's process group and every process of its user; close the pipes.
        Safe to call from two threads at once (the compile worker's builds run beside the tests,
        and closing the sandbox kills it under a build): the first call does it, once."""
        with self._killing:
            proc, self.proc, self.ready = self.proc, None, False
            if proc is None:
                return
            if proc.poll() is None and proc.pid is not None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if self.uid is not None:
                kill_user(self.uid)
            proc.wait()
            os.close(self._write), os.close(self._read)

    def _crashed(self, what: str) -> LearnerError:
        """Error for a worker that closed its pipe (killed if still running after 2 s)."""
        proc = self.proc
        if proc is None:
            cause = "it was stopped by the grader"    # closed meanwhile, from another thread
        else:
            try:
                cause = f"the worker exited with code {proc.wait(timeout=2)}"
            except subprocess.TimeoutExpired:
                cause = "it closed the grader's pipe"
        self.kill()
        return LearnerError(f"crashed {what} ({cause})")

    def take_log(self) -> None:
        """Move what the worker printed since the last call into the output kept for the report."""
        try:
            with open(self.log, "rb+") as log:
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


class ForkServer:
    """The fork server of one worker environment (``autograder.boundary.forkserver``), started
    by the first worker that needs it and kept for the life of this process (one that died is
    replaced at the next worker). ``fork`` sends it one worker's request."""
    _servers: dict[tuple, "ForkServer"] = {}
    _starting = threading.Lock()

    def __init__(self, env: dict[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.output = tempfile.TemporaryFile()
        self.folder = tempfile.TemporaryDirectory(prefix="autograder-forkserver-")
        command = [sys.executable, "-s", "-m", "autograder.boundary.forkserver",
                   str(theirs.fileno()), *learner_imports()]
        try:
            self.proc = subprocess.Popen(command, pass_fds=(theirs.fileno(),),
                                         stdin=subprocess.DEVNULL, stdout=self.output,
                                         stderr=self.output, cwd=self.folder.name, env=env,
                                         start_new_session=True)
        finally:
            theirs.close()
        self.socket, self._sending = ours, threading.Lock()

    @classmethod
    def of(cls, env: dict[str, str]) -> "ForkServer":
        """This process's fork server for ``env``, started if there is none or it died."""
        key = (os.getpid(), tuple(sorted(env.items())))
        with cls._starting:
            server = cls._servers.get(key)
            if server is None or server.proc.poll() is not None:
                server = cls._servers[key] = cls(env)
                if len(cls._servers) == 1:
                    atexit.register(cls.stop_all)
            return server

    def fork(self, request: dict, fds: list[int]) -> None:
        """Have a worker forked for ``request`` with ``fds`` (its pipes, log and status pipe);
        ``RuntimeError`` with the server's output when it is gone."""
        try:
            with self._sending:
                socket.send_fds(self.socket, [json.dumps(request).encode()], fds)
        except OSError:
            raise RuntimeError(f"the sandbox's fork server is gone{self.failure()}") from None

    def failure(self) -> str:
        """What the server printed, if it has exited ("" while it runs)."""
        if self.proc.poll() is None:
            return ""
        self.output.seek(0)
        text = self.output.read()[-3000:].decode(errors="replace")
        return f"\n(the sandbox's fork server exited with code {self.proc.returncode}):\n{text}"

    @classmethod
    def stop_all(cls, wait: bool = True) -> None:
        """Stop every fork server of this process: each exits at the end of its socket (after
        up to 5 s with ``wait``, else at once: killed)."""
        with cls._starting:
            servers, cls._servers = list(cls._servers.values()), {}
        for server in servers:
            server.socket.close()
            try:
                server.proc.wait(timeout=5 if wait else 0)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()
            server.output.close(), server.folder.cleanup()


class ForkedWorker:
    """A worker the fork server forked, seen through its status pipe as ``subprocess.Popen``
    would show it: ``pid`` (its leader's, a session of its own; ``None`` if it never started),
    ``poll`` and ``wait`` (its exit status, a signal as its negative number)."""

    def __init__(self, status_fd: int):
        self._fd: int | None = status_fd
        self._text = b""
        self.returncode: int | None = None

    def _read(self, deadline: float | None, line: bool) -> bool:
        """Read the status pipe until its first line (``line``) or its end; False at
        ``deadline`` (``None``: no deadline)."""
        if self._fd is None or line and b"\n" in self._text:
            return True
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while self._fd is not None and not (line and b"\n" in self._text):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not poller.poll(None if left is None else left * 1000):
                return False
            chunk = os.read(self._fd, 64)
            if chunk:
                self._text += chunk
            else:
                os.close(self._fd)
                self._fd = None
        return True

    @property
    def pid(self) -> int | None:
        self._read(time.monotonic() + STARTUP_SECONDS, line=True)
        first, newline, _ = self._text.partition(b"\n")
        return int(first) if newline else None

    def poll(self) -> int | None:
        return self.wait(0) if self._read(time.monotonic(), line=False) else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._read(None if timeout is None else time.monotonic() + timeout, line=False):
            raise subprocess.TimeoutExpired("the sandbox worker", timeout)
        _, _, status = self._text.partition(b"\n")
        # no status: the leader was killed before the worker ended (by the grader)
        self.returncode = int(status) if status.strip() else -signal.SIGKILL
        return self.returncode


def worker_environment(imports: list[str], cuda: bool, interpret: bool = True) -> dict[str, str]:
    """The worker's environment: a few variables of the grader's, and the grader's own
    ``sys.path`` (user site, ``.pth`` and editable paths) among ``imports`` although the worker
    runs with ``-s``: it imports from where the grader does. Its threads: the grader's
    ``OMP_NUM_THREADS`` where set (several gradings side by side), else up to 4.
    ``TRITON_INTERPRET=1`` without CUDA, unless ``interpret`` is False (the compile worker)."""
    env = {k: os.environ[k] for k in ENV_KEPT if k in os.environ}
    on_path = [str(Path(p).resolve()) for p in sys.path if p and os.path.isabs(p)]
    python_path = [str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")]),
                   *(p for p in on_path if p in imports)]
    env.update(PYTHONPATH=os.pathsep.join(python_path), AUTOGRADER_ROOT=str(PACKAGE_ROOT),
               PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS")
               or str(min(4, os.cpu_count() or 1)))
    if interpret and not cuda:
        env["TRITON_INTERPRET"] = "1"
    return env
