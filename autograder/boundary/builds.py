"""Grader side: a submission's compile worker and the cache of what it built.

``KernelBuilder.build`` sends a kernel's source (``rules/gpu_targets.build_source``: the kernel and
what it calls, nothing else of the cell) and launches to a compile worker
(``process.WorkerProcess`` with ``compile_kernels``: the learner's confinement, no
TRITON_INTERPRET; ``compiling.serve`` answers) and returns its reports, one per launch and target.

Reports are cached as JSON keyed by (source, kernel, launch, target, triton version), so that a
class of identical kernels, or the suite grading the solutions again, pays for each build once.
The cache is a directory of the grader's user, mode 0700, under the temporary directory
(``AUTOGRADER_BUILD_CACHE`` moves it); one that another user owns or may write is not trusted
(a learner's process could otherwise plant a report before its key is first built) and not used.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from autograder.boundary.causes import LearnerError
from autograder.boundary.compiling import TARGETS, CompileReport
from autograder.boundary.isolation import delete_leftovers
from autograder.boundary.process import WorkerProcess

BUILD_SECONDS = 120          # one request: every launch x target of one kernel (a hostile kernel's too)
OWN_USER = 1 << 22           # the compile worker's uid: the learner worker's + this (above any pid)


def cache_dir() -> Path | None:
    """The report cache, created if need be; ``None`` when it cannot be trusted."""
    path = Path(os.environ.get("AUTOGRADER_BUILD_CACHE")
                or Path(tempfile.gettempdir()) / f"autograder-gpu-builds-{os.getuid()}")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError:
        return None
    private = stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077
    return path if private else None


def cache_key(source: str, kernel: str, launch: list, target: str) -> str:
    return hashlib.sha256(repr((source, kernel, launch, target, version("triton"))).encode()).hexdigest()


class KernelBuilder:
    """Builds a submission's kernels in a compile worker of its own, started at the first build
    that the cache cannot answer, in the sandbox ``mode`` of the learner's worker (``uid``: the
    learner's sandbox user; the compile worker runs as a user of its own beside it, so that
    killing either never reaches the other)."""

    def __init__(self, mode: str, uid: int | None, hide: list[str], memory_mb: int = 4096):
        self.memory_mb = memory_mb
        self.workdir = Path(tempfile.mkdtemp(prefix="autograder-build-"))
        log = Path(tempfile.mkdtemp(prefix="autograder-build-log-")) / "output.txt"
        self.worker = WorkerProcess(mode, None if uid is None else uid + OWN_USER, self.workdir, log, hide,
                                    compile_kernels=True)

    def build(self, source: str, kernel: str, launches: list[list], seconds: float = BUILD_SECONDS) -> dict:
        """``{"reports": [[CompileReport dict per target] per launch], "environment": None or why no
        kernel builds here}``. ``LearnerError`` when the source does not load or the build takes
        longer than ``seconds``."""
        folder = cache_dir()
        keys = [[cache_key(source, kernel, launch, t.name) for t in TARGETS] for launch in launches]
        files = [[folder / f"{k}.json" for k in row] for row in keys] if folder else None
        cached = [[_read(f) for f in row] for row in files] if files else [[None]]
        if all(r is not None for row in cached for r in row):
            return {"reports": cached, "environment": None}
        if not self.worker.running:
            self.worker.start(self.memory_mb, [])
        request = {"op": "compile", "source": source, "name": kernel, "launches": launches,
                   "targets": [t.name for t in TARGETS]}
        try:
            reply = self.worker.exchange(request, time.monotonic() + seconds, "while building your kernel")
        except TimeoutError:
            raise LearnerError(f"building `{kernel}` for the GPUs took more than {seconds:g} s") from None
        if not reply.get("ok"):
            raise LearnerError(str(reply.get("error", "unknown error"))[:2000])
        value = reply.get("value")
        reports = _checked(value, len(launches))
        if files and not value["environment"]:
            for row, paths in zip(reports, files):
                for report, path in zip(row, paths):
                    scratch = path.with_suffix(f".{os.getpid()}")
                    scratch.write_text(json.dumps(report))
                    scratch.replace(path)          # whole or absent, for a grader beside this one
        return {"reports": reports, "environment": value["environment"]}

    def close(self) -> None:
        self.worker.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.rmtree(self.worker.log.parent, ignore_errors=True)
        if self.worker.uid is not None and self.worker.mode == "user":
            delete_leftovers(self.worker.uid)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _checked(value, launches: int) -> list[list[dict]]:
    """The reply's reports as plain ``CompileReport`` fields: a row of one report per target for
    each launch, counts non-negative ints, the error a string or None; else ``LearnerError``."""
    fields = set(CompileReport.__dataclass_fields__)
    counts = fields - {"target", "error"}

    def valid(r) -> bool:
        return (isinstance(r, dict) and set(r) == fields and type(r["target"]) is str
                and isinstance(r["error"], (str, type(None)))
                and all(type(r[k]) is int and r[k] >= 0 for k in counts))
    rows = value.get("reports") if isinstance(value, dict) else None
    if not (isinstance(rows, list) and len(rows) == launches and isinstance(value.get("environment"), (str, type(None)))
            and all(isinstance(row, list) and len(row) == len(TARGETS) and all(map(valid, row)) for row in rows)):
        raise LearnerError("the compile worker sent back garbage, not reports")
    return [[CompileReport(**r).__dict__ for r in row] for row in rows]
