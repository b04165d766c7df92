"""What the sandbox can rely on here, and cleaning up after its unprivileged user.

See ``autograder.boundary.sandbox`` for the modes (``namespaces``, ``user``, ``none``).
"""
from __future__ import annotations

import functools
import os
import shutil
import signal
import site
import sys
import sysconfig
import tempfile
from pathlib import Path

from autograder.boundary.confine import enter_namespaces

UID_BASE = 1_200_000  # sandbox users: UID_BASE + grader pid (no account, no files)
# A grader's second sandbox user (a worker started ahead beside the running one): uid + UID_SPAN,
# above any pid (Linux caps pid_max at 2**22), so no other grader process has it.
UID_SPAN = 1 << 22
LEFTOVER_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# Shown to the worker besides the directories Python imports from: shared libraries, the C
# toolchain Triton builds its launcher with on a GPU machine, system configuration, devices and
# the kernel's views. Nothing that holds users' files (/root, /home, /srv, /opt, /var, /work...).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev",
               "/proc", "/sys")


class SandboxUnavailable(RuntimeError):
    """Running as root but no sandbox can be set up (grading refused)."""


@functools.lru_cache(maxsize=1)
def namespaces_available() -> str | None:
    """``None`` if the worker can be isolated in new namespaces (a forked child enters them as
    the fork server's do: ``confine.enter_namespaces``), else the reason why not."""
    if os.geteuid() != 0:
        return "not running as root"
    reason, said = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            enter_namespaces()
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001 - report any failure, then exit
            os.write(said, str(exc).encode()[:500])
        finally:
            os._exit(1)
    os.close(said)
    _, status = os.waitpid(child, 0)
    with os.fdopen(reason, "rb") as pipe:
        why = pipe.read().decode(errors="replace")
    return None if os.waitstatus_to_exitcode(status) == 0 else f"cannot make namespaces ({why})"


def can_switch_user() -> bool:
    """Root with CAP_SETUID and CAP_SETGID in its effective set."""
    if os.geteuid() != 0:
        return False
    status = Path("/proc/self/status").read_text()
    effective = int(status.split("CapEff:")[1].split()[0], 16)
    return bool(effective & (1 << 6)) and bool(effective & (1 << 7))


def choose_mode(isolate: bool) -> tuple[str, int | None, str]:
    """(mode, sandbox uid or ``None``, one line saying how the worker is isolated): the strongest
    sandbox available, ``none`` when not root or ``isolate`` is false. As root with neither
    sandbox, ``SandboxUnavailable`` (grading refused)."""
    reason = namespaces_available() if isolate else "disabled with --no-isolation"
    if reason is None:
        mode = "namespaces"
    elif isolate and can_switch_user():
        mode = "user"
    elif isolate and os.geteuid() == 0:
        raise SandboxUnavailable(
            f"refusing to grade as root without a sandbox ({reason}; and no user to drop "
            "to: CAP_SETUID/CAP_SETGID are missing). Give the grader those capabilities, "
            "or pass --no-isolation if you trust the submissions")
    else:
        mode = "none"
    uid = UID_BASE + os.getpid() if mode != "none" and can_switch_user() else None
    isolation = {
        "namespaces": "isolated: new mount/pid/net namespaces, grader files hidden, "
                      "read-only file system, unprivileged user",
        "user": f"isolated as an unprivileged user, without namespaces ({reason})",
        "none": f"NOT isolated ({reason}): import blocker and resource limits only"}[mode]
    return mode, uid, isolation


def readable_by_all(path: str | Path) -> bool:
    """Whether every directory from / down to ``path`` can be entered by any user."""
    path = Path(path).resolve()
    return all(p.stat().st_mode & 0o001 for p in [path, *path.parents])


def import_dirs(exclude: list[str]) -> list[str]:
    """Every directory the worker imports from, as this (the grader's) interpreter sees them:
    the prefixes of the environment and of the interpreter beneath it (a venv's base), the
    standard library, site-packages of every kind (the environment's, user site, ``.pth``-added
    and editable paths: all of ``sys.path``), and the directories that hold the targets of packages
    installed there as symbolic links (Nix and some conda layouts do this; so do the test suite's
    cheap environments). Existing directories only, resolved, without those equal to,
    inside or containing a directory of ``exclude`` (the grader's own packages stay hidden)."""
    paths = sysconfig.get_paths()
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *searched_dirs(),
                  *(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")), *linked_dirs()]
    excluded = [Path(e).resolve() for e in exclude]
    found: list[str] = []
    for entry in candidates:
        if not entry or not os.path.isabs(entry) or not os.path.isdir(entry):
            continue   # "" (the working directory), path hooks, zip files that do not exist
        path = Path(entry).resolve()
        if any(e == path or path in e.parents or e in path.parents for e in excluded) \
                or str(path) in found:
            continue
        found.append(str(path))
    return found


def shown_dirs(imports: list[str]) -> list[str]:
    """Everything the worker may see of the machine (besides its private temporary directory):
    ``imports`` and the ``SYSTEM_DIRS`` that exist, resolved, outermost only."""
    system = [str(Path(d).resolve()) for d in SYSTEM_DIRS if os.path.isdir(d)]
    return outermost([*imports, *system])


def searched_dirs() -> list[str]:
    """Where this interpreter looks packages up: ``sys.path`` and site-packages of every kind."""
    searched = [*sys.path, *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        searched.append(site.getusersitepackages())
    return searched


def linked_dirs() -> list[str]:
    """The folders that packages installed as symbolic links (in any searched folder) point into."""
    return sorted({target for folder in searched_dirs() for target in link_target_dirs(folder)})


def link_target_dirs(folder: str) -> list[str]:
    """The directories holding what the symbolic links directly inside ``folder`` point to (a
    package installed as a link is imported from there, so the sandbox must show that too)."""
    try:
        entries = [e for e in os.scandir(folder) if e.is_symlink()]
    except OSError:
        return []
    targets = (Path(e.path).resolve() for e in entries)
    return sorted({str(t.parent) for t in targets if t.exists()})


def readable_dirs(dirs: list[str]) -> bool:
    """Whether any user can list every directory of ``dirs`` and reach it from /."""
    for folder in dirs:
        path = Path(folder)
        if not os.stat(path).st_mode & 0o004 or not readable_by_all(path):
            return False
    return True


def outermost(dirs: list[str]) -> list[str]:
    """``dirs`` without those inside another one of them."""
    paths = sorted({Path(d) for d in dirs}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in paths:
        if not any(k == path or k in path.parents for k in kept):
            kept.append(path)
    return [str(p) for p in kept]


def hidden_dirs(hide: list[str], workdir: Path) -> list[str]:
    """Directories the worker must not see: ``hide`` plus the installed ``reference`` and
    ``autograder`` packages, keeping those that exist, do not contain what the worker needs
    (Python, packages it imports through links, its working directory, the temp dir) and are not
    inside another one."""
    import reference
    needed = [Path(sys.prefix).resolve(), Path(os.__file__).resolve(), workdir,
              Path(tempfile.gettempdir()).resolve(), *(Path(d) for d in linked_dirs())]
    packages = [Path(reference.__file__).resolve().parent, Path(__file__).resolve().parents[1]]
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
