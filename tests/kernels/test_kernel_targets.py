"""The compile matrix: every shipped Triton kernel, in every launch configuration it takes on a GPU,
built for a T4, an A100 and an H100 without one (reference/kernels/targets.py, launches.py).

A cold build of the whole matrix takes about 40 CPU-minutes, so each run builds one of
SLICES interleaved slices (whole autotune groups), picked by a hash of the kernels' sources
(``source_slice``): the same commit builds the same slice on any day, and a change to a kernel
moves the suite to another slice. COMPILE_MATRIX_SLICE=K builds slice K, COMPILE_MATRIX=all all
of it (``python -m reference.bench kernels --targets`` prints the whole matrix). Reports are
cached by source hash (COMPILE_REPORT_CACHE), so a rerun of unchanged kernels is free.

The builds run in child processes: this one may have imported triton under TRITON_INTERPRET=1
(tests/kernel_support.py), and then no kernel in it can be compiled.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import hashlib
import sys
from pathlib import Path

import pytest

from autograder.solutions import load_solutions
from reference.kernels import checks
from reference.kernels.chapter_builds import ptx_lines, tile_table
from reference.kernels.launches import Launch, all_launches, matrix_problems, open_rows
from reference.kernels.targets import CompileReport, compile_for, ptxas_usage

SLICES = 48
ROOT = Path(__file__).resolve().parents[2]
SOLUTION_CHAPTERS = ("ch05_flash_attention", "ch06_online_softmax", "ch07_flash_versions", "ch08_paged_attention")


def source_slice() -> int:
    """The slice this tree builds: sha256 of the kernel sources (reference/ and the chapter
    05-08 solutions) modulo SLICES, the same on every day and machine for the same files."""
    digest = hashlib.sha256()
    files = sorted((ROOT / "reference" / "kernels").rglob("*.py"))
    files += [ROOT / "autograder" / "solutions" / f"{chapter}.py" for chapter in SOLUTION_CHAPTERS]
    for path in files:
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return int(digest.hexdigest(), 16) % SLICES


def uninterpreted(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, f"{' '.join(argv)} failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    return run


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> list[tuple[Launch, CompileReport]]:
    if os.environ.get("COMPILE_MATRIX") == "all":
        k, n = 0, 1
    else:
        k, n = int(os.environ.get("COMPILE_MATRIX_SLICE", source_slice())), SLICES
    path = tmp_path_factory.mktemp("matrix") / "matrix.json"
    uninterpreted("-m", "reference.bench", "kernels", "--targets", "--slice", f"{k}/{n}", "--json", str(path))
    return [(Launch(row["kernel"], row["config"], None, (), tuned=row["tuned"]), CompileReport(**row["report"]))
            for row in json.loads(path.read_text())]


def test_every_launch_of_the_slice_compiles_fits_and_spills_only_where_accepted(matrix):
    assert matrix, "the slice built nothing"
    problems = matrix_problems(matrix)
    assert not problems, "on a GPU these launches would fail or spill unaccepted:\n" + "\n".join(problems)


def test_what_is_open_still_fails_so_a_fix_must_close_it(matrix):
    closed = [f"{launch.kernel} {launch.config} on {report.target}" for launch, report, _ in open_rows(matrix)
              if not (report.problems() or report.spills)]
    assert not closed, "these now fit without spills: remove their launches.OPEN entry:\n" + "\n".join(closed)


def jit_entry_points(source: str) -> set[str]:
    """Names of the @triton.jit functions in source that no other jitted function there calls."""
    jitted = {node.name: node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)
              and any("jit" in ast.unparse(d) for d in node.decorator_list)}
    called = {ast.unparse(call.func).split(".")[-1] for fn in jitted.values()
              for call in ast.walk(fn) if isinstance(call, ast.Call)}
    return set(jitted) - called


def test_the_matrix_launches_every_kernel_the_course_ships():
    sources = [p.read_text() for p in (ROOT / "reference").rglob("*.py")]
    sources += [code for chapter in SOLUTION_CHAPTERS for code in load_solutions(chapter).values()]
    shipped = set().union(*(jit_entry_points(source) for source in sources))
    launched = {launch.fn.__name__ for launch in all_launches(load_solutions)}
    assert shipped <= launched, f"kernels with no row in the compile matrix: {sorted(shipped - launched)}"


OVERSIZED = """
import json
from reference.kernels.launches import flash_launches
from reference.kernels.targets import TARGETS, compile_for
launch = next(l for l in flash_launches() if l.config.startswith("fp16 D=16 full") and "128x128" in l.config)
report = compile_for(launch.fn, launch.args, launch.kwargs, TARGETS[0])
print(json.dumps({"config": launch.config, "report": report.__dict__}))
"""


def test_a_tile_too_big_for_a_t4_is_reported_as_not_fitting():
    """Flash attention's largest autotune tile (128 x 128 keys and queries, fp16, 3 stages) asks a
    T4 for more than its 64 KiB: the check that passes the matrix must fail this one."""
    row = json.loads(uninterpreted("-c", OVERSIZED).stdout.splitlines()[-1])
    report = CompileReport(**row["report"])
    assert report.target == "T4" and report.shared_bytes > 64 * 1024, row
    launch = Launch("flash", row["config"], None, ())              # as if it were launched alone
    assert any("shared memory" in p for p in matrix_problems([(launch, report)])), report


def test_a_chapter_reads_its_tile_table_from_the_compiler():
    """The tile of the test above, in the table a chapter shows: over a T4, within an A100 and an H100."""
    rows = {row["target"]: row for row in tile_table("flash", "fp16 D=16 full 128x128")}
    assert list(rows) == ["T4", "A100", "H100"], rows
    assert not rows["T4"]["fits"] and rows["T4"]["shared_kib"] > rows["T4"]["limit_kib"] == 64, rows["T4"]
    assert rows["A100"]["fits"] and rows["H100"]["fits"] and rows["A100"]["registers"] > 0, rows


def test_a_chapter_gets_the_ptx_lines_it_explains():
    ptx = ptx_lines("flash", "fp16 D=16 full 128x128", "A100")
    assert ptx["target"] == "A100" and ptx["lines"] > 100, ptx
    missing = [pattern for pattern, lines in ptx["picked"].items() if not lines]
    assert not missing, f"flash attention's PTX for an A100 has no {missing} line (HBM loads, into registers " \
                        "and into shared memory, tensor-core products, exponentials)"


def test_ptxas_log_is_read_for_registers_and_spills():
    log = ("ptxas info    : Function properties for k\n"
           "    488 bytes stack frame, 1040 bytes spill stores, 856 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 488 bytes cumulative stack size\n")
    assert ptxas_usage(log) == {"registers": 255, "spill_stores": 1040, "spill_loads": 856}
    with pytest.raises(ValueError, match="no register or spill line"):
        ptxas_usage("ptxas info    : Compile time = 3 ms\n")


def test_registers_beyond_the_register_file_are_a_problem():
    fits = CompileReport("A100", shared_limit=1, registers=128, threads=512)       # 65536 exactly
    over = CompileReport("A100", shared_limit=1, registers=129, threads=512)
    assert not fits.problems()
    assert "registers per block" in over.problems()[0]


@pytest.mark.skipif(not checks.INTERPRETED, reason="only an interpreted process refuses to compile")
def test_an_interpreted_process_refuses_to_compile_and_says_where_to():
    launch = all_launches(load_solutions)[0]
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1.*--targets"):
        compile_for(launch.fn, launch.args, launch.kwargs, None)
