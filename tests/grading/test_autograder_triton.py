"""The grader contract of the kernel chapters, proved on a tiny Triton exercise
(tests/fixtures/triton_grader.py): a learner's ``@triton.jit`` kernel runs in the sandbox under
``TRITON_INTERPRET=1``, parametrized tests split the points over their cases, ``check()`` runs
every case in-process, and a stub, a wrong kernel and a cheat score below full marks."""
import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import torch

from autograder import cli
from autograder.solutions import split_sections
from cli_runs import in_process

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures"
GRADER = FIXTURES / "triton_grader.py"
SECTIONS = {s.kind: s for s in split_sections((FIXTURES / "triton_submissions.py").read_text())}


# Cells beside a right kernel that reach the interpreter, where the loads and stores are counted:
# by name (refused before any kernel runs), and by computed names, putting the builder's own
# load back in place of the count (found by the worker before the launch).
TAMPERING = {
    "tamper_named": "import triton.runtime.interpreter as ti\nB = ti.InterpreterBuilder\n",
    "tamper_computed": "import importlib\n"
                       "B = getattr(importlib.import_module('triton.runtime.' + 'inter' + 'preter'),"
                       " 'Inter' + 'preterBuilder')\n"
                       "name = 'create_' + 'masked_' + 'load'\n"
                       "setattr(B, name, vars(B)[name].__closure__[0].cell_contents)\n",
}


def notebook(source: str, other: str | None = None) -> str:
    cells = []
    for grade_id, text in (("add_kernel", source), ("other", other)):
        meta = {"nbgrader": {"solution": True, "grade": False, "locked": False,
                             "grade_id": grade_id, "schema_version": 3}}
        cells += [{"cell_type": "code", "metadata": meta, "source": text, "outputs": [],
                   "execution_count": None}] if text is not None else []
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells})


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder, out = tmp_path_factory.mktemp("triton"), tmp_path_factory.mktemp("triton_out")
    for kind, section in SECTIONS.items():
        (folder / f"{kind}.ipynb").write_text(notebook(section.source))
    for kind, other in TAMPERING.items():
        (folder / f"{kind}.ipynb").write_text(notebook(SECTIONS["solution"].source, other))
    run = in_process(cli.main, "grade", str(folder), "--tests", str(GRADER), "--json", str(out),
                     "--seed", "3")
    assert run.returncode == 0, run.stderr[-3000:]
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def test_solution_kernel_scores_full_marks_over_three_cases(graded):
    tests = graded["solution"]["tests"]
    assert graded["solution"]["score"] == 2 and len(tests) == 3, tests
    assert [t["max_score"] for t in tests] == [0.67, 0.67, 0.66], tests   # whole hundredths
    assert all(t["status"] == "passed" for t in tests)


@pytest.mark.parametrize("kind, message", [("stub", "not implemented yet"),
                                           ("wrong", "is not close to the expected values"),
                                           ("cheat", "must be a @triton.jit kernel")])
def test_stub_wrong_and_cheat_score_zero(graded, kind, message):
    assert graded[kind]["score"] == 0
    assert all(message in t["output"] for t in graded[kind]["tests"]), graded[kind]["tests"]


@pytest.mark.parametrize("kind, message", [("tamper_named", "names `InterpreterBuilder`, "
                                                          "`interpreter`"),
                                           ("tamper_computed", "a cell changed Triton's "
                                                               "interpreter")])
def test_a_cell_reaching_the_interpreter_stops_the_kernel(graded, kind, message):
    assert graded[kind]["score"] == 0
    assert all(message in t["output"] for t in graded[kind]["tests"]), graded[kind]["tests"]


def test_check_runs_every_case_in_process(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec = importlib.util.spec_from_file_location("_triton_fixture_grader", GRADER)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # registers add_kernel
    from autograder import check
    for kind in ("solution", "stub"):
        namespace = {"__name__": "__learner__"}
        path = tmp_path / f"{kind}.py"  # Triton reads a kernel's source from its file
        path.write_text(SECTIONS[kind].source)
        exec(compile(path.read_text(), str(path), "exec"), namespace)
        if kind == "solution":
            check(namespace["add_kernel"], seed=1)
            assert capsys.readouterr().out.count("✓") == 3
        else:
            with pytest.raises(AssertionError, match="3 of 3 tests fail"):
                check(namespace["add_kernel"], seed=1)
            assert capsys.readouterr().out.count("✗") == 3


# ---------------------------------------------------------------- the traffic of a launch

TWICE = SECTIONS["solution"].source.replace(
    "x = tl.load(x_ptr + offsets, mask=mask)",
    "x = tl.load(x_ptr + offsets, mask=mask) + 0 * tl.load(x_ptr + offsets, mask=mask)")


def _traffic(monkeypatch, tmp_path, source: str, *args):
    """The LaunchTraffic of ``add_kernel`` from ``source`` launched in this process."""
    from autograder.boundary.launching import launch
    from autograder.boundary.traffic import LaunchTraffic
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    path = tmp_path / "kernel.py"   # Triton reads a kernel's source from its file
    path.write_text(source)
    namespace = {"__name__": "__learner__"}
    exec(compile(source, str(path), "exec"), namespace)
    n = args[3]
    _, measured = launch(namespace["add_kernel"], (-(-n // 64),), args, {"BLOCK": 64})
    return LaunchTraffic.from_wire(measured)


def test_a_launch_counts_each_elements_loads_and_stores(monkeypatch, tmp_path):
    n = 3 * 64 + 17
    x = torch.randn(n + 6)[4:4 + n]           # a view with an offset into its storage
    y, out = torch.randn(n), torch.full((n + 3,), float("nan"))
    traffic = _traffic(monkeypatch, tmp_path, SECTIONS["solution"].source, x, y, out, n)
    assert traffic[0].reads.shape == (n,) and traffic[0].reads.eq(1).all(), traffic[0].reads
    assert traffic[1].reads.eq(1).all() and not traffic[0].writes.any()
    assert traffic[2].writes[:n].eq(1).all() and not traffic[2].writes[n:].any(), \
        "the masked-off lanes of the last block were counted as stores"
    assert not traffic[2].reads.any() and traffic.outside_reads == traffic.outside_writes == 0
    assert (traffic[0].most_reads, traffic[0].widest_read, traffic[2].most_writes) == (1, 64, 1)
    twice = _traffic(monkeypatch, tmp_path, TWICE, x, y, out, n)
    assert twice[0].reads.eq(2).all() and twice[0].most_reads == 2 and twice[1].most_reads == 1


def test_a_compiled_kernel_is_counted_in_the_interpreter():
    """Where kernels run compiled (a GPU), the grader still reads their traffic: the launch is
    run again in the interpreter, from the kernel's Python function and its jit helpers', which
    are put back afterwards (tests/fixtures/compiled_traffic_probe.py, no TRITON_INTERPRET)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(FIXTURES / "compiled_traffic_probe.py")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    result = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    assert result == {"reads": [1] * 21, "writes": [1] * 21, "right": True,
                      "bound": ["JITFunction", "JITFunction"]}


def test_accesses_are_counted_per_element_of_a_strided_argument():
    from autograder.boundary.traffic import LaunchTraffic, Recording
    storage = torch.zeros(4, 6)
    column = storage[:, 2]                    # stride 6, offset 2
    record = Recording({0: column, "other": torch.zeros(3)})
    address = lambda i: column.data_ptr() + 4 * 6 * i     # noqa: E731 - row i of the column
    record.access("reads", numpy.array([address(1), address(3), address(3)], dtype=numpy.uint64),
                  None)
    record.access("reads", numpy.array([address(0), address(2)], dtype=numpy.uint64),
                  numpy.array([False, True]))
    record.access("writes", numpy.array([8], dtype=numpy.uint64), None)   # no argument's
    traffic = LaunchTraffic.from_wire(record.wire())
    assert traffic[0].reads.tolist() == [0, 1, 1, 2] and traffic[0].most_reads == 2
    assert traffic[0].widest_read == 3 and not traffic["other"].reads.any()
    assert (traffic.outside_reads, traffic.outside_writes) == (0, 1)


def test_a_changed_interpreter_builder_is_found(monkeypatch):
    from triton.runtime.interpreter import InterpreterBuilder
    from autograder.boundary import traffic
    traffic.install()
    assert traffic.tampered() == []
    hook = vars(InterpreterBuilder)["create_masked_load"]
    monkeypatch.setattr(InterpreterBuilder, "create_masked_load", hook.__closure__[0].cell_contents)
    assert traffic.tampered() == ["InterpreterBuilder.create_masked_load"]


@pytest.mark.parametrize("release, load_options, store_options", [
    ("3.9", ("cache policy", False), ("cache policy",)),
    ("3.6", ("cache modifier", "eviction policy", False), ("cache modifier", "eviction policy")),
    ("a later one", ("cache policy", False, "hint"), ("cache policy", "hint"))])
def test_the_counting_hooks_pass_any_releases_cache_arguments_through(release, load_options,
                                                                     store_options):
    """Triton releases differ in what follows the mask (3.9: one cache policy; 3.6: a cache
    modifier and an eviction policy). The hooks count the access and hand the builder's own
    method every argument it was given, whatever the release (3.6 once failed every launch)."""
    from types import SimpleNamespace
    from autograder.boundary import traffic
    column = torch.zeros(8)
    calls = []
    load = traffic._load(lambda *args: calls.append(("load", args)) or "loaded")
    store = traffic._store(lambda *args: calls.append(("store", args)))
    address = numpy.array([column.data_ptr() + 4 * i for i in range(3)], dtype=numpy.uint64)
    ptrs, mask = SimpleNamespace(data=address), SimpleNamespace(data=numpy.array([True, True, False]))
    with traffic.recording((column,), {}) as record:
        assert load("builder", ptrs, mask, "other", *load_options) == "loaded"
        store("builder", ptrs, "value", mask, *store_options)
    assert calls == [("load", ("builder", ptrs, mask, "other", *load_options)),
                     ("store", ("builder", ptrs, "value", mask, *store_options))], release
    counted = traffic.LaunchTraffic.from_wire(record.wire())[0]
    assert counted.reads.tolist() == counted.writes.tolist() == [1, 1, 0, 0, 0, 0, 0, 0]


def test_the_atomic_and_program_hooks_pass_extra_arguments_through():
    """The same for the atomics and the program index: what a hook does not count reaches the
    builder unchanged, however many such arguments a release has."""
    from types import SimpleNamespace
    from autograder.boundary import traffic
    cell = torch.zeros(4)
    calls = []
    rmw = traffic._read_modify_write(lambda *args: calls.append(args))
    cas = traffic._compare_and_swap(lambda *args: calls.append(args))
    program = traffic._next_program(lambda *args: calls.append(args))
    ptr = SimpleNamespace(data=numpy.array([cell.data_ptr()], dtype=numpy.uint64))
    mask = SimpleNamespace(data=numpy.array([True]))
    with traffic.recording((cell,), {}) as record:
        rmw("builder", "add", ptr, "val", mask, "sem", "scope", "new")
        cas("builder", ptr, "cmp", "val", "sem", "scope", "new")
        program("builder", 1, 0, 0, "new")
    assert calls == [("builder", "add", ptr, "val", mask, "sem", "scope", "new"),
                     ("builder", ptr, "cmp", "val", "sem", "scope", "new"), ("builder", 1, 0, 0, "new")]
    counted = traffic.LaunchTraffic.from_wire(record.wire())[0]
    assert counted.reads.tolist() == counted.writes.tolist() == [2, 0, 0, 0]
