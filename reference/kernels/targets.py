"""Compile a Triton kernel for a real NVIDIA GPU on a machine without one, and read its budget.

The build itself, the three targets (T4, A100, H100 and their shared memory per block) and the
report live in `autograder/boundary/compiling.py`, the one place both the course and the grader
read them from (the grader's compile worker may import nothing of `reference`). This module adds
what the course needs around them: a cache, the compile matrix's entry point and, for the
chapters, `tile_table` and `ptx_lines` (reference/kernels/gpu_build.py).

    from reference.kernels.targets import TARGETS, compile_for
    report = compile_for(kernel, args, {"BLOCK": 1024, "num_warps": 4}, TARGETS[0])

Only in a process that imported triton without TRITON_INTERPRET=1 (the tests, which set it, run
`python -m reference.bench kernels --targets` as a child process).

Reports are cached as JSON keyed by the kernel's source hash (its callees included), the
launch's specialisation, options, target and triton version, under COMPILE_REPORT_CACHE
(default: <tempdir>/llm-course-compile-reports): a second run of the same source is free.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path

from autograder.boundary.compiling import (REGISTER_ALLOCATION_UNIT, REGISTERS_PER_SM, TARGETS,  # noqa: F401
                                           CompileReport, Target, build, ptxas_usage, specialise)


def cache_dir() -> Path:
    return Path(os.environ.get("COMPILE_REPORT_CACHE",
                               Path(tempfile.gettempdir()) / "llm-course-compile-reports"))


def compile_for(kernel, args: tuple, kwargs: dict, target: Target, with_ptx: bool = False):
    """Build `kernel[grid](*args, **kwargs)` for `target` as a launch there would, and report.

    args: as for a launch (tensors stand for pointers: their dtype and 16-byte alignment count,
    not their device; ints are specialised like a launch's: 1, multiples of 16); kwargs: the
    constexprs plus num_warps / num_stages. with_ptx: return (report, PTX text) instead.
    """
    _, _, _, identity = specialise(kernel, args, kwargs, target)
    key = hashlib.sha256(repr((kernel.cache_key, *identity)).encode()).hexdigest()
    cached, ptx_file = cache_dir() / f"{key}.json", cache_dir() / f"{key}.ptx"
    if cached.exists() and (ptx_file.exists() or not with_ptx):
        report = CompileReport(**json.loads(cached.read_text()))
        return (report, ptx_file.read_text()) if with_ptx else report
    report, ptx = build(kernel, args, kwargs, target)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(dataclasses.asdict(report)))
    ptx_file.write_text(ptx)
    return (report, ptx) if with_ptx else report
