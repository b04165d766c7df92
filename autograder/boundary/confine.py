"""Confining the sandbox worker before learner code runs (called by ``autograder.boundary.worker``):
namespaced mounts, dropping to an unprivileged user and capabilities, Landlock rules, a seccomp
filter on network sockets. Linux only; every step that fails raises ``OSError`` naming it.
"""
from __future__ import annotations

import ctypes
import errno as errno_module
import os
from pathlib import Path

try:   # libseccomp through its ctypes binding, loaded here, before any confinement
    import pyseccomp
except Exception:  # noqa: BLE001 - no libseccomp here (the binding then fails as it loads)
    pyseccomp = None

LIBC = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC = 1, 2, 4, 8, 4096, 16384
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1
PR_SET_KEEPCAPS, PR_CAPBSET_DROP, PR_CAP_AMBIENT = 8, 24, 47
PR_SET_NO_NEW_PRIVS, CAP_DAC_READ_SEARCH = 38, 2
MS_PRIVATE = 1 << 18
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mask(result: int, what: str) -> None:
    """``_check`` for a mount that masks a path: a path gone since it was listed (another grader's
    worker directory beside a Python environment under /tmp, deleted when that grading ended)
    has nothing left to hide."""
    if result != 0 and ctypes.get_errno() == errno_module.ENOENT:
        return
    _check(result, what)


def _read_only(path: bytes, what: str) -> None:
    attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    _check(LIBC.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path, AT_RECURSIVE, ctypes.byref(attr),
                        ctypes.sizeof(attr)), what)


def enter_namespaces() -> None:
    """Move this process into new mount (every mount made private), network, IPC and UTS
    namespaces, and its next child into a new PID namespace, as ``unshare --mount --net --ipc
    --uts --pid`` does; that child mounts its own ``/proc`` (``mount_proc``)."""
    _check(LIBC.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID),
           "unshare")
    _check(LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make every mount private")


def mount_proc() -> None:
    """A ``/proc`` of this PID namespace (the first process of the namespace calls it)."""
    _check(LIBC.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None),
           "mount /proc")


def lock_down(show: list[str], hide: list[str], restore: list[str] = ()) -> str:
    """Inside a new mount namespace, show only ``show`` (and the directories leading to them):
    every other directory is masked by an empty read-only tmpfs and every other file by
    /dev/null (``readable_cover(show)``: the siblings of each directory on the way from / down
    to a shown one); ``hide`` (directories inside shown ones) is masked too. Then make every
    mount read-only, mount a fresh writable tmpfs on /tmp, and bind the directories of
    ``restore`` that were under /tmp (a Python environment there) back at the same paths,
    read-only (recursive binds: a masked directory inside one stays masked). Returns the
    private temp dir."""
    flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    for path in [*readable_cover(show), *hide]:
        if os.path.islink(path):
            continue    # mount would follow it: its target is masked or shown on its own
        if os.path.isdir(path):
            _mask(LIBC.mount(b"none", path.encode(), b"tmpfs", flags, b"size=4k,mode=0555"),
                  f"mount tmpfs over {path}")
        elif os.path.isfile(path):
            _mask(LIBC.mount(b"/dev/null", path.encode(), None, MS_BIND, None), f"mask {path}")
    _read_only(b"/", "make / read-only")
    under_tmp = [p for p in restore if Path(p).is_relative_to("/tmp") and p != "/tmp"]
    held = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in under_tmp}
    _check(LIBC.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV,
                      b"size=512m,mode=1777"), "mount a private /tmp")
    for path, fd in held.items():
        os.makedirs(path, 0o755, exist_ok=True)
        _check(LIBC.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None,
                          MS_BIND | MS_REC, None), f"bind {path} back into the private /tmp")
        os.close(fd)
        _read_only(path.encode(), f"make {path} read-only")
    return "/tmp"


def drop_privileges(uid: int | None, keep_read: bool) -> None:
    """Empty the capability bounding set; with ``uid``, become that user and group; clear every
    capability but, with ``keep_read``, CAP_DAC_READ_SEARCH (read any file, write none: for a
    Python installed where other users cannot read it, e.g. under /root). Then no_new_privs."""
    for cap in range(64):
        if cap != CAP_DAC_READ_SEARCH or not keep_read:
            if LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:  # EINVAL past the last cap
                break
    if uid is not None:
        _check(LIBC.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "keep capabilities")
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _check(LIBC.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0), "clear ambient capabilities")
    kept = 1 << CAP_DAC_READ_SEARCH if keep_read else 0
    data = (_CapData * 2)(_CapData(kept, kept, 0), _CapData(0, 0, 0))
    _check(LIBC.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "capset")
    _check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
WRITE_FILE, READ_FILE, READ_DIR = 1 << 1, 1 << 2, 1 << 3
MAKE_ALL = sum(1 << b for b in range(4, 13))  # remove dir/file, make char/dir/reg/sock/...
REFER, TRUNCATE = 1 << 13, 1 << 14


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def close_network() -> bool:
    """Install a seccomp filter on this process and its children: the ``socket`` call fails with
    EACCES whatever the family (IPv4, IPv6 and raw packets reach a network; a Unix socket reaches
    any local process listening on a path or an abstract name, a relay to the network among
    them), and so does setting up io_uring (whose requests can make sockets without the socket
    call). ``socketpair`` is another call and stays: asyncio and torch use it within the process.
    Closes the network where no network namespace can be made (Docker's default permissions).
    False when libseccomp is missing."""
    if pyseccomp is None:
        return False
    refuse = pyseccomp.ERRNO(errno_module.EACCES)
    rules = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    rules.add_rule(refuse, "socket")
    rules.add_rule(refuse, "io_uring_setup")
    rules.load()
    return True


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: not available)."""
    return max(0, LIBC.syscall(LANDLOCK_CREATE_RULESET, None, 0, 1))


def readable_cover(hidden: list[str], top: str = "/") -> list[str]:
    """Paths whose subtrees together hold every file beneath ``top`` except those under
    ``hidden``: the siblings of each directory on the way from ``top`` down to a hidden one."""
    hidden_paths = [Path(h) for h in hidden]
    cover: list[str] = []

    def walk(folder: Path) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            path = Path(entry.path)
            if path in hidden_paths:
                continue
            if entry.is_dir(follow_symlinks=False) and any(path in h.parents for h in hidden_paths):
                walk(path)
            else:
                cover.append(str(path))
    if any(Path(top) in h.parents for h in hidden_paths):
        walk(Path(top))
    elif Path(top) not in hidden_paths:
        cover.append(top)
    return cover


def readable(show: list[str], hide: list[str]) -> list[str]:
    """The subtrees the worker may read: ``show`` without what ``hide`` masks inside them."""
    return [p for top in show for p in readable_cover(hide, top)]


def landlock(tmp: str, readable_dirs: list[str] | None) -> bool:
    """With Landlock: creating, changing or deleting files only beneath ``tmp`` (and writing to
    existing devices, e.g. /dev/null); with ``readable_dirs`` (not ``None``), reading only
    beneath those and ``tmp``, whatever the file permissions (or a kept CAP_DAC_READ_SEARCH)
    say. Returns False when the kernel has no Landlock."""
    abi = landlock_abi()
    if abi == 0:
        return False
    writes = WRITE_FILE | MAKE_ALL | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0)
    reads = READ_FILE | READ_DIR if readable_dirs is not None else 0
    attr = ctypes.c_uint64(writes | reads)
    ruleset = LIBC.syscall(LANDLOCK_CREATE_RULESET, ctypes.byref(attr), 8, 0)
    if ruleset < 0:
        return False
    rules = [(tmp, writes | reads), ("/dev", WRITE_FILE | (TRUNCATE if abi >= 3 else 0))]
    rules += [(path, reads) for path in readable_dirs or ()]
    try:
        for path, allowed in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                if not os.path.isdir(path) or os.path.islink(path):
                    allowed &= READ_FILE | WRITE_FILE | TRUNCATE  # rights that apply to files
                rule = _PathBeneath(allowed, fd)
                _check(LIBC.syscall(LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0),
                       f"landlock rule for {path}")
            finally:
                os.close(fd)
        _check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _check(LIBC.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return True
