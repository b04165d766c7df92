"""The grader contract of the kernel chapters, proved on a tiny Triton exercise
(tests/fixtures/triton_grader.py): a learner's ``@triton.jit`` kernel runs in the sandbox under
``TRITON_INTERPRET=1``, parametrized tests split the points over their cases, ``check()`` runs
every case in-process, and a stub, a wrong kernel and a cheat score below full marks."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.solutions import split_sections

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests/fixtures"
GRADER = FIXTURES / "triton_grader.py"
SECTIONS = {s.kind: s for s in split_sections((FIXTURES / "triton_submissions.py").read_text())}


def notebook(source: str) -> str:
    meta = {"nbgrader": {"solution": True, "grade": False, "locked": False,
                         "grade_id": "add_kernel", "schema_version": 3}}
    cell = {"cell_type": "code", "metadata": meta, "source": source, "outputs": [],
            "execution_count": None}
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [cell]})


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder, out = tmp_path_factory.mktemp("triton"), tmp_path_factory.mktemp("triton_out")
    for kind, section in SECTIONS.items():
        (folder / f"{kind}.ipynb").write_text(notebook(section.source))
    run = subprocess.run([sys.executable, "-m", "autograder", "grade", str(folder), "--tests",
                          str(GRADER), "--json", str(out), "--jobs", "2", "--seed", "3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def test_solution_kernel_scores_full_marks_over_three_cases(graded):
    tests = graded["solution"]["tests"]
    assert graded["solution"]["score"] == 2 and len(tests) == 3, tests
    assert all(abs(t["max_score"] - 2 / 3) < 1e-3 and t["status"] == "passed" for t in tests)


@pytest.mark.parametrize("kind, message", [("stub", "not implemented yet"),
                                           ("wrong", "is not close to the expected values"),
                                           ("cheat", "must be a @triton.jit kernel")])
def test_stub_wrong_and_cheat_score_zero(graded, kind, message):
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
