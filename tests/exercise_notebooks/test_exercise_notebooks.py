"""The exercise notebooks: nbgrader source notebooks that agree with the graders and solutions.

* every solution cell has the solution metadata (no points), regions holding the stub between
  nbgrader's markers, imports plus one documented def/class named after its grade_id, and is
  followed by its locked ``check(<name>)`` cell carrying the grader's points
  (``autograder.source_notebook.structure_problems``);
* every graded exercise has a cell, every cell a grader and a solution section whose text
  outside the regions (imports, signatures, docstrings) is the cell's own;
* with the solutions filled in between the markers, each notebook runs top to bottom in a
  Jupyter kernel and every check cell reports that all its tests pass.
"""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from autograder.local import load_graders
from autograder.notebook import solution_cells
from autograder.rules.plugin import REGISTRY
from autograder.solutions import chapters, load_solutions
from autograder.source_notebook import (BEGIN, END, exercise_cells, fill, release,
                                        source_notebook, split_regions, structure_problems)

ROOT = Path(__file__).resolve().parents[2]
EXERCISES = ROOT / "exercises"
CHAPTERS = chapters()


def _notebook(chapter: str) -> dict:
    return json.loads((EXERCISES / f"{chapter}.ipynb").read_text())


def _graded_exercises(chapter: str) -> dict[str, float]:
    """grade_id -> points of the exercises whose tests live in test_<chapter>.py."""
    load_graders()
    grader = f"{chapter}.py"
    return {gid: ex.points for gid, ex in REGISTRY.items()
            if any(Path(key.split("::")[0]).name == grader for key in ex.tests)}


def test_every_chapter_with_solutions_has_a_notebook_and_a_grader():
    assert CHAPTERS, "no solution files found in autograder/solutions/"
    for chapter in CHAPTERS:
        assert (EXERCISES / f"{chapter}.ipynb").exists(), f"exercises/{chapter}.ipynb is missing"
        assert (ROOT / "autograder" / "graders" / f"{chapter}.py").exists()


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_notebook_structure_follows_the_conventions(chapter):
    nb = _notebook(chapter)
    nbformat.validate(nbformat.reads(json.dumps(nb), as_version=4))
    assert nb["metadata"].get("course", {}).get("chapter") == chapter
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, \
                "exercise notebooks are committed without outputs"
    graded = _graded_exercises(chapter)
    assert graded, f"no grader exercises for {chapter}"
    assert structure_problems(nb, graded) == []


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_solutions_fit_their_cells_and_release_back_to_the_stub(chapter):
    cells = dict(solution_cells(_notebook(chapter)))
    solutions = load_solutions(chapter)
    assert set(solutions) == set(cells), "solution sections != solution cells"
    for gid, stub in cells.items():
        filled = fill(stub, solutions[gid])   # raises if imports/signature/docstring differ
        assert release(filled) == release(stub) == _without_markers(stub), gid
        assert _without_markers(filled) == solutions[gid].rstrip("\n"), gid


def _without_markers(source: str) -> str:
    return "".join(line for line in source.splitlines(keepends=True)
                   if line.strip() not in (BEGIN, END)).rstrip("\n")


def test_exercise_cells_build_a_notebook_that_follows_the_conventions():
    stub = 'def f(x):\n    """Doc."""\n    ### BEGIN SOLUTION\n    # YOUR CODE HERE\n' \
           '    raise NotImplementedError()\n    ### END SOLUTION'
    nb = {"cells": exercise_cells("f", stub, 2)}
    nbformat.validate(nbformat.from_dict({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                                          "cells": [dict(c, id=f"c{i}") for i, c in
                                                    enumerate(nb["cells"])]}))
    assert structure_problems(nb, {"f": 2}) == []
    assert structure_problems(nb, {"f": 3}) and structure_problems(nb, {"f": 2, "g": 1})
    no_markers = "".join(line for line in stub.splitlines(keepends=True) if "SOLUTION" not in line)
    assert structure_problems({"cells": exercise_cells("f", no_markers, 2)}, {"f": 2})
    broken = structure_problems({"cells": exercise_cells("f", stub.replace("(x)", "(x"), 2)},
                                {"f": 2})
    assert broken == ["f: line 1: '(' was never closed"], broken


def test_fill_names_the_text_a_solution_changed():
    stub = 'def f(x):\n    """Doc."""\n    ### BEGIN SOLUTION\n    # YOUR CODE HERE\n' \
           '    raise NotImplementedError()\n    ### END SOLUTION'
    assert split_regions(fill(stub, 'def f(x):\n    """Doc."""\n    return x\n'))[2] == \
        ["    return x\n"]
    with pytest.raises(ValueError, match="does not start with"):
        fill(stub, 'def f(x, y):\n    """Doc."""\n    return x\n')
    with pytest.raises(ValueError, match="never closed"):
        split_regions("x = 1\n### BEGIN SOLUTION\n")


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_notebook_runs_with_solutions_and_every_check_passes(chapter, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("COURSE_DEMO_MODEL", "tiny")   # the optional demo cell uses the toy model
    nb = source_notebook(chapter)   # the solutions between the markers
    nb = nbformat.reads(json.dumps(nb), as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}})
    client.execute()   # raises CellExecutionError on the first failing cell
    checks = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade") is True]
    assert len(checks) == len(solution_cells(nb))
    for cell in checks:
        text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
        assert "all tests pass" in text and "✗" not in text, f"{cell.source}:\n{text}"
