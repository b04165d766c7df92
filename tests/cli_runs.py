"""A command line run in the test's own process: ``main(argv)`` of a CLI with its output and exit
status as ``subprocess.run`` gives them. A CLI run as a process costs its interpreter, torch and,
for the autograder, a fork server (~4.5 CPU-seconds before any work); tests whose subject is what
the command does, not the process, call it here. Each CLI keeps tests through the real process
(``python -m ...``) for what only a process shows: the entry point, exit statuses, signals."""
from __future__ import annotations

import contextlib
import io
import signal
import subprocess
from typing import Callable


def in_process(main: Callable[[list[str]], int | None], *args: str) -> subprocess.CompletedProcess:
    """Run ``main(list(args))``; stdout and stderr are collected, ``SystemExit`` (argparse's
    errors) becomes the exit status, and the signal handlers a CLI installs (the autograder's kill
    its sandboxes and exit) are put back to pytest's afterwards."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args)) or 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (exc.code is not None)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess(["main", *args], int(code), out.getvalue(), err.getvalue())
