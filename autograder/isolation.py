"""What the sandbox can rely on here, and cleaning up after its unprivileged user.

See ``autograder.sandbox`` for the modes (``namespaces``, ``user``, ``none``).
"""
from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

UNSHARE = ["unshare", "--mount", "--pid", "--fork", "--net", "--ipc", "--uts", "--kill-child",
           "--mount-proc"]
UID_BASE = 1_200_000  # sandbox users: UID_BASE + grader pid (no account, no files)
LEFTOVER_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


class SandboxUnavailable(RuntimeError):
    """Running as root but no sandbox can be set up (grading refused)."""


@functools.lru_cache(maxsize=1)
def namespaces_available() -> str | None:
    """``None`` if the worker can be isolated with ``unshare``, else the reason why not."""
    if os.geteuid() != 0:
        return "not running as root"
    if shutil.which("unshare") is None:
        return "the unshare command is missing"
    probe = subprocess.run(UNSHARE + ["true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare failed: {probe.stderr.strip()}"


def can_switch_user() -> bool:
    """Root with CAP_SETUID and CAP_SETGID in its effective set."""
    if os.geteuid() != 0:
        return False
    status = Path("/proc/self/status").read_text()
    effective = int(status.split("CapEff:")[1].split()[0], 16)
    return bool(effective & (1 << 6)) and bool(effective & (1 << 7))


def readable_by_all(path: str | Path) -> bool:
    """Whether every directory from / down to ``path`` can be entered by any user."""
    path = Path(path).resolve()
    return all(p.stat().st_mode & 0o001 for p in [path, *path.parents])


def hidden_dirs(hide: list[str], workdir: Path) -> list[str]:
    """Directories the worker must not see: ``hide`` plus the installed ``reference`` and
    ``autograder`` packages, keeping those that exist, do not contain what the worker needs
    (Python, its working directory, the temp dir) and are not inside another one."""
    import reference
    needed = [Path(sys.prefix).resolve(), Path(os.__file__).resolve(), workdir,
              Path(tempfile.gettempdir()).resolve()]
    packages = [Path(reference.__file__).resolve().parent, Path(__file__).resolve().parent]
    chosen: list[Path] = []
    for d in sorted({Path(p) for p in hide} | set(packages), key=lambda p: len(p.parts)):
        if d.is_dir() and not any(n == d or d in n.parents for n in needed) \
                and not any(c == d or c in d.parents for c in chosen):
            chosen.append(d)
    return [str(d) for d in chosen]


def kill_user(uid: int) -> None:
    """Kill every process of ``uid`` (learner code may have left the worker's group): a forked
    child becomes that user and signals all it may signal."""
    child = os.fork()
    if child == 0:
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(child, 0)


def delete_leftovers(uid: int) -> None:
    """Delete what ``uid`` created at the top of the world-writable temporary directories."""
    for folder in LEFTOVER_DIRS:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass
