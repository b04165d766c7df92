"""The grader's "compiles for a real GPU" (autograder/rules/gpu_targets.py, boundary/builds.py,
boundary/compiling.py): what reaches the compile worker, the verdict, the cache, and real builds
in a compile worker of this process (not isolated here; the self-checks grade through the
sandbox, tests/submissions/ch05_flash_attention.py)."""
from __future__ import annotations

import ast
import os
import sys

import pytest
import torch

from autograder.boundary.builds import KernelBuilder, cache_dir
from autograder.boundary.causes import LearnerError
from autograder.boundary.compiling import KIB, CompileReport
from autograder.local import load_graders
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


@pytest.mark.parametrize("old, new", [
    ("@triton.jit\ndef double(", "@triton.jit\n@print\ndef double("),
    ("@triton.jit\ndef double(", "@triton.jit(debug=True)\ndef double("),
    ("EXTRA: tl.constexpr = 1", "EXTRA: tl.constexpr = print('ran')"),
    ("n, BLOCK", "n: print('ran') or int, BLOCK"),
    ("SCALE = 2.0", "SCALE: print('ran') or float = 2.0"),
], ids=["second decorator", "jit with arguments", "default that calls", "annotation that calls",
        "constant's annotation that calls"])
def test_what_would_run_code_as_the_kernel_loads_is_refused_before_anything_runs(old, new):
    with pytest.raises(AssertionError, match=r"one bare @triton.jit|not a constant|annotated with tl.constexpr"):
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
    sent, _ = build_source(KERNEL, "double")
    error = "at 3:4: tl.store(x_ptr + offsets, helper(tl.load(x_ptr + offsets, mask=offsets < n)), mask=offsets < n) " \
            "-> unsupported thing"
    reports = [[_report(t, 0, error) for t in ("T4", "A100", "H100")]]
    passes, message = verdict("double", [Build("grader", ())], reports, "", f"# added\n{sent}", cell_offset=1)
    assert not passes and "line 19 of your cell, `tl.store(x_ptr" in message and "unsupported thing" in message, message


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
def builder():
    """The grader's cache: a build is as real the first time as the cached report it leaves."""
    built = KernelBuilder("none", None, [])
    yield built
    built.close()


def _grader(chapter: str):
    load_graders()
    return sys.modules[f"_autograder_graders.{chapter}"]


FLASH = "flash_attention_fwd_kernel"


@pytest.mark.slow
def test_the_flash_solution_with_a_tile_too_big_for_a_t4_passes_and_the_report_says_so(builder):
    """fp32 at D=64 with 128 x 64 tiles: about 80 KiB on a T4 (64 allowed), 128 KiB on an A100 (163)."""
    learner = Learner(load_solutions("ch05_flash_attention")[FLASH], builder)
    big = _grader("ch05_flash_attention")._flash_build("GPU tile: fp32 D=64, 128x64 tiles, causal", 64, 64, True)
    big.kwargs["BLOCK_M"] = 128
    require_gpu_build(learner, FLASH, [big], "ADVICE")
    note = learner.notes[0]
    assert "fits an A100 and an H100, not on a T4" in note and "a T4 allows 64 KiB" in note and "ADVICE" in note, note


def test_a_kernel_printing_a_ptxas_line_at_compile_time_is_read_from_ptxas_alone(builder):
    cell = load_solutions("ch06_online_softmax")["online_softmax_kernel"]
    fake = "ptxas info    : Used 1 registers, used 0 barriers; 0 bytes spill stores, 0 bytes spill loads"
    body = cell.index('"""', cell.index('"""', cell.index("def online_softmax_kernel")) + 3) + 3
    printing = cell[:body] + f"\n    tl.static_print({fake!r})" + cell[body:]
    builds = _grader("ch06_online_softmax").KERNEL_BUILDS[:1]
    honest, faked = (Learner(text, builder) for text in (cell, printing))
    for learner in (honest, faked):
        require_gpu_build(learner, "online_softmax_kernel", builds, "")
    assert honest.notes[0] == faked.notes[0] and " 1 reg" not in faked.notes[0], faked.notes


def test_a_build_that_takes_too_long_is_stopped_and_blamed_on_the_kernel(builder):
    slow = KERNEL.replace("    offsets = tl.program_id", "    for i in tl.static_range(20000):\n        n = n + i\n"
                                                          "    offsets = tl.program_id")
    source, _ = build_source(slow, "double")
    with pytest.raises(LearnerError, match="took more than 3 s"):
        builder.build(source, "double", [b.wire() for b in DOUBLE], seconds=3)


PLANT = '''import json, os
for path, report in {planted!r}.items():
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(json.dumps(report))
    except OSError:
        pass
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a sandbox user that is not the grader's")
def test_a_report_planted_in_the_cache_by_the_learners_process_is_never_read(tmp_path, monkeypatch):
    """The `break` kernel of the self-checks builds for no GPU. Another cell of the notebook writes
    reports saying it fits into the grader's cache, under the keys its builds will have (a learner
    can compute them), before any test runs: the test still scores 0 and the cache holds the truth."""
    import json

    import selfcheck
    from autograder import cli
    from autograder.boundary.builds import cache_key
    from autograder.boundary.compiling import TARGETS
    from autograder.notebook import inject
    from cli_runs import in_process
    chapter = "ch05_flash_attention"
    broken = next(s.source for s in selfcheck.variants(chapter)["wrong"][FLASH] if "`break`" in s.label)
    source, _ = build_source(broken, FLASH)
    cache = tmp_path / "cache"
    planted = {str(cache / f"{cache_key(source, FLASH, b.wire(), t.name)}.json"):
               {"target": t.name, "shared_bytes": 1024, "shared_limit": t.shared_per_block, "registers": 32,
                "spill_stores": 0, "spill_loads": 0, "threads": 128, "error": None}
               for b in _grader(chapter).FLASH_BUILDS for t in TARGETS}
    hbm = load_solutions(chapter)["flash_hbm_bytes"]
    notebook = inject(selfcheck.ROOT / "exercises" / f"{chapter}.ipynb",
                      {FLASH: broken, "flash_hbm_bytes": PLANT.format(planted=planted) + hbm})
    (tmp_path / "planted.ipynb").write_text(json.dumps(notebook))
    monkeypatch.setenv("AUTOGRADER_BUILD_CACHE", str(cache))
    run = in_process(cli.main, "grade", str(tmp_path / "planted.ipynb"), "--json", str(tmp_path / "out.json"),
                     "--seed", "3")
    assert run.returncode == 0, run.stderr[-3000:]
    tests = json.loads((tmp_path / "out.json").read_text())["tests"]
    built = next(t for t in tests if t["name"].endswith("test_flash_kernel_compiles_for_a_real_gpu"))
    assert built["score"] == 0 and "would run on no GPU" in built["output"], built
    for path in planted:
        assert json.loads(open(path).read())["error"], f"{path} holds the planted report"


def test_a_kernel_whose_cell_text_is_gone_is_built_from_its_own_text_or_said_unreadable(tmp_path,
                                                                                      monkeypatch):
    """In a notebook (check()), a kernel's cell is read from Python's line cache; where that text
    is gone, the kernel's own text is built (as Triton read it, or from its file); where even
    that is missing the test says the source cannot be read (not "no def at the top level")."""
    import importlib.util
    import types

    from autograder.rules.gpu_targets import whole_cell
    path = tmp_path / "kernel_cell.py"
    path.write_text(KERNEL.replace("helper(tl.load", "(tl.load"))
    spec = importlib.util.spec_from_file_location("kernel_cell", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    learner = types.SimpleNamespace(namespace={"double": module.double})
    from autograder.rules import gpu_targets   # the cell's text gone from its line cache:
    monkeypatch.setattr(gpu_targets, "linecache", types.SimpleNamespace(getlines=lambda *a: []))
    cell = whole_cell(learner, "double")
    assert "@triton.jit\ndef double(" in cell
    build_source(cell, "double")   # buildable: no AssertionError
    path.unlink()                  # and the kernel's own text gone too
    if hasattr(module.double, "raw_src"):
        module.double.raw_src = []
    with pytest.raises(AssertionError, match="the source of `double` cannot be read"):
        require_gpu_build(learner, "double", DOUBLE, "")
