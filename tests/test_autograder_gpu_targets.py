"""The grader's "compiles for a real GPU" (autograder/rules/gpu_targets.py, boundary/builds.py,
boundary/compiling.py): what reaches the compile worker, the verdict, the cache, and real builds
in a compile worker of this process (not isolated here; the self-checks grade through the
sandbox, tests/submissions/ch05_flash_attention.py)."""
from __future__ import annotations

import ast
import os

import pytest
import torch

from autograder.boundary.builds import KernelBuilder, cache_dir
from autograder.boundary.compiling import KIB, CompileReport
from autograder.rules.gpu_targets import Build, build_source, require_gpu_build, verdict
from autograder.solutions import load_solutions

KERNEL = '''import triton
import triton.language as tl
SCALE = 2.0


@triton.jit
def helper(x):
    return x * SCALE


@triton.jit
def unused(x):
    return x


@triton.jit
def double(x_ptr, n, BLOCK: tl.constexpr, EXTRA: tl.constexpr = 1):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, helper(tl.load(x_ptr + offsets, mask=offsets < n)), mask=offsets < n)
'''
DOUBLE = [Build("grader: fp32, BLOCK = 64", (torch.empty(4), 100), {"BLOCK": 64})]


def test_only_the_kernel_and_what_it_calls_reach_the_compile_worker_each_on_its_line():
    sent, offset = build_source(KERNEL, "double")
    assert offset == 0 and len(sent.splitlines()) == len(KERNEL.splitlines())
    kept = {n.name for n in ast.parse(sent).body if isinstance(n, ast.FunctionDef)}
    assert kept == {"double", "helper"}, f"the compile worker should get the kernel and its callees only: {kept}"
    for number, line in enumerate(sent.splitlines()):
        assert line in ("", KERNEL.splitlines()[number]), f"line {number + 1} moved or changed: {line!r}"


@pytest.mark.parametrize("change, why", [
    ("@triton.jit\ndef double(", "@triton.jit\n@print\ndef double(", "one bare @triton.jit"),
    ("@triton.jit\ndef double(", "@triton.jit(debug=True)\ndef double(", "one bare @triton.jit"),
    ("EXTRA: tl.constexpr = 1", "EXTRA: tl.constexpr = print('ran')", "not a constant"),
    ("n, BLOCK", "n: print('ran') or int, BLOCK", "annotated with tl.constexpr or not at all"),
], ids=["second decorator", "jit with arguments", "default that calls", "annotation that calls"])
def test_what_would_run_code_as_the_kernel_loads_is_refused_before_anything_runs(change, why):
    old, new, message = change, why, None
    with pytest.raises(AssertionError, match=r"(one bare @triton.jit|not a constant|annotated with)"):
        build_source(KERNEL.replace(old, new), "double")


def _report(target: str, shared_kib: float, error: str | None = None) -> CompileReport:
    limit = {"T4": 64, "A100": 163, "H100": 227}[target] * KIB
    return CompileReport(target, int(shared_kib * KIB), limit, registers=40, threads=128, error=error)


def test_a_kernel_that_fits_no_gpu_fails_and_says_where_and_by_how_much():
    reports = [[_report(t, 240) for t in ("T4", "A100", "H100")]]
    passes, message = verdict("k", [Build("GPU tile: fp32 D=128", ())], reports, "Use smaller tiles")
    assert not passes
    for text in ("would run on no GPU", "GPU tile: fp32 D=128", "240.0 KiB", "a T4 allows 64 KiB",
                 "an H100 allows 227 KiB", "Use smaller tiles"):
        assert text in message, f"{text!r} missing from:\n{message}"


def test_a_kernel_too_big_for_a_t4_alone_passes_and_says_so():
    reports = [[_report("T4", 72), _report("A100", 72), _report("H100", 72)]]
    passes, message = verdict("k", [Build("GPU tile: fp16", ())], reports, "Use smaller tiles")
    assert passes and "fits an A100 and an H100" in message and "a T4 allows 64 KiB" in message, message


def test_a_compiler_error_names_the_learners_line():
    error = "at 7:4: s = tl.dot(q, k) -> Both operands must be same dtype"
    reports = [[_report(t, 0, error) for t in ("T4", "A100", "H100")]]
    passes, message = verdict("k", [Build("grader", ())], reports, "", cell_offset=1)
    assert not passes and "line 6 of your cell, s = tl.dot(q, k) -> Both operands" in message, message


def test_a_cache_others_may_write_is_not_trusted(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    monkeypatch.setenv("AUTOGRADER_BUILD_CACHE", str(shared))
    assert cache_dir() is None, "a world-writable cache lets a learner's process plant a report"
    monkeypatch.setenv("AUTOGRADER_BUILD_CACHE", str(tmp_path / "private"))
    assert cache_dir() == tmp_path / "private" and not (tmp_path / "private").stat().st_mode & 0o077


class Learner:
    """A learner with one kernel cell, built by a compile worker of this process."""

    def __init__(self, cell: str, builder: KernelBuilder):
        self.cell, self.builder, self.notes = cell, builder, []

    def cell_source(self, name: str) -> str:
        return self.cell

    def build_kernel(self, kernel: str, source: str, launches: list) -> dict:
        return self.builder.build(source, kernel, launches)

    def note(self, text: str) -> None:
        self.notes.append(text)


@pytest.fixture(scope="module")
def builder(tmp_path_factory):
    os.environ["AUTOGRADER_BUILD_CACHE"] = str(tmp_path_factory.mktemp("builds"))   # every build here is real
    built = KernelBuilder("none", None, [])
    yield built
    built.close()
    del os.environ["AUTOGRADER_BUILD_CACHE"]
