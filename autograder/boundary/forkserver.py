"""The fork server: one process per grader that has imported what every sandbox worker imports
before it is confined (torch and the worker's own modules, over a second of CPU), and forks each
worker from there, so that a worker starts in milliseconds rather than importing torch again.
Worker side: it runs no learner code and holds nothing of the grader's (no reference code, no
submission, no result): it sees only each worker's configuration and pipes, and keeps neither.

Started by ``autograder.boundary.process.ForkServer`` as ``python -s -m
autograder.boundary.forkserver FD MODULE...`` in the workers' environment; FD is its end of a
Unix socket pair, the modules are those learner code may import (imported here too, where they
can be: each worker checks they are still readable once confined). A request is one message:
JSON (``config``, as ``worker.run`` takes it; ``workdir``; ``namespaces``) with four file
descriptors: the worker's request and reply pipes, its output log and a status pipe. It forks,
for each request:

- the worker's **leader**: a session of its own (``os.killpg`` of its pid reaches the worker);
  with ``namespaces``, new mount (all private), network, IPC, UTS and PID namespaces, as
  ``unshare --mount --net --ipc --uts --pid --fork --kill-child --mount-proc`` would. It writes
  its pid and a newline on the status pipe, waits for the worker and writes the worker's exit
  status (``subprocess``'s convention: a signal as its negative number), then exits;
- the **worker** (the PID namespace's first process, with its own ``/proc``; killed when the
  leader dies): every file descriptor closed but its pipes and output, then ``worker.run``.

The server ends when the grader closes its end of the socket. It never reads from a worker.
"""
from __future__ import annotations

import importlib
import json
import os
import random
import signal
import socket
import sys

from autograder.boundary import worker
from autograder.boundary.confine import enter_namespaces, mount_proc

REQUEST_BYTES = 1 << 20
FDS = 4   # the worker's request pipe, reply pipe, output log, status pipe


def lead(request: dict, fds: list[int]) -> None:
    """The leader of one worker (a forked child of the server); never returns."""
    worker_in, worker_out, log, status = fds
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    for target in (1, 2):
        os.dup2(log, target)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null), os.close(log)
    os.write(status, f"{os.getpid()}\n".encode())
    os.chdir(request["workdir"])
    if request["namespaces"]:
        enter_namespaces()
    child = os.fork()
    if child == 0:
        # dies with the leader (before this line, killpg of the leader's group reaches it)
        worker.LIBC.prctl(worker.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if request["namespaces"]:
            mount_proc()
        kept = sorted({0, 1, 2, worker_in, worker_out})
        for low, high in zip(kept, kept[1:] + [1 << 20]):
            os.closerange(low + 1, high)
        random.seed()   # as a fresh interpreter would be (the server's state is every worker's)
        worker.run(dict(request["config"], **{"in": worker_in, "out": worker_out}))
        os._exit(0)
    os.close(worker_in), os.close(worker_out)
    _, wait_status = os.waitpid(child, 0)
    os.write(status, str(os.waitstatus_to_exitcode(wait_status)).encode())
    os._exit(0)


def serve(sock: socket.socket) -> None:
    """Fork a leader for each request on ``sock`` until the grader closes it (then exit at
    once: nothing to tidy)."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # leaders are reaped by the kernel
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, REQUEST_BYTES, FDS)
        except OSError:
            os._exit(0)
        if not message:
            os._exit(0)
        if len(fds) != FDS:
            for fd in fds:
                os.close(fd)
            continue
        request = json.loads(message)
        sys.stdout.flush(), sys.stderr.flush()
        if os.fork() == 0:
            try:
                sock.close()
                lead(request, fds)
            except BaseException as exc:  # noqa: BLE001 - say why in the worker's log
                print(f"the sandbox worker could not be started: {exc!r}", file=sys.stderr,
                      flush=True)
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[0]))
    if os.getcwd() in sys.path:   # ``-m`` put the server's working directory there
        sys.path.remove(os.getcwd())
    for name in argv[1:]:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - each worker's check_imports says why
            pass
    serve(sock)


if __name__ == "__main__":
    main(sys.argv[1:])
