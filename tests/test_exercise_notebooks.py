"""The exercise notebooks: structure, agreement with the graders, and a full run with solutions.

* every solution cell carries the nbgrader metadata of CONTRIBUTING.md, defines exactly its
  grade_id, is a stub, and is followed by its locked ``check(<name>)`` cell;
* the points of each solution cell equal the grader's ``@exercise`` points, every grade_id has
  grader tests and a solution section, and every graded exercise of the chapter has a cell;
* with the solutions injected, each notebook runs top to bottom in a Jupyter kernel and every
  check cell reports that all its tests pass.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat
import pytest

from autograder.local import load_graders
from autograder.notebook import inject, solution_cells
from autograder.plugin import REGISTRY
from autograder.solutions import chapters, load_solutions

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = ROOT / "exercises"
CHAPTERS = chapters()


def _notebook(chapter: str) -> dict:
    return json.loads((EXERCISES / f"{chapter}.ipynb").read_text())


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _graded_exercises(chapter: str) -> dict[str, float]:
    """grade_id -> points of the exercises whose tests live in test_<chapter>.py."""
    load_graders()
    grader = f"test_{chapter}.py"
    return {gid: ex.points for gid, ex in REGISTRY.items()
            if any(Path(key.split("::")[0]).name == grader for key in ex.tests)}


def test_every_chapter_with_solutions_has_a_notebook_and_a_grader():
    assert CHAPTERS, "no solution files found in autograder/solutions/"
    for chapter in CHAPTERS:
        assert (EXERCISES / f"{chapter}.ipynb").exists(), f"exercises/{chapter}.ipynb is missing"
        assert (ROOT / "autograder" / "tests" / f"test_{chapter}.py").exists()


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_notebook_structure_follows_the_conventions(chapter):
    nb = _notebook(chapter)
    nbformat.validate(nbformat.reads(json.dumps(nb), as_version=4))
    assert nb["metadata"].get("course", {}).get("chapter") == chapter
    cells = nb["cells"]
    for cell in cells:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, \
                "exercise notebooks are committed without outputs"
    solutions = 0
    for i, cell in enumerate(cells):
        info = cell.get("metadata", {}).get("nbgrader")
        if not info or not info.get("solution"):
            continue
        solutions += 1
        gid = info["grade_id"]
        assert info == {"solution": True, "grade": False, "locked": False, "grade_id": gid,
                        "points": info["points"], "schema_version": 3}, info
        src = _source(cell)
        assert "# YOUR CODE HERE" in src and "raise NotImplementedError()" in src, gid
        tree = ast.parse(src)
        defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert defined == [gid], f"the cell of {gid} defines {defined}"
        assert ast.get_docstring(tree.body[0]), f"{gid} needs a docstring (shapes and contract)"
        check = cells[i + 1]
        assert check["cell_type"] == "code" and _source(check).strip() == f"check({gid})"
        assert check["metadata"]["nbgrader"] == {
            "solution": False, "grade": True, "locked": True, "grade_id": f"{gid}_check",
            "points": 0, "schema_version": 3}
    assert solutions, f"{chapter} has no solution cells"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_points_and_grade_ids_agree_with_graders_and_solutions(chapter):
    cells = {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"]["points"]
             for c in _notebook(chapter)["cells"]
             if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    graded = _graded_exercises(chapter)
    assert set(cells) == set(graded), (
        f"notebook grade_ids {sorted(cells)} vs grader exercises {sorted(graded)}")
    for gid, points in cells.items():
        assert REGISTRY[gid].tests, f"{gid} has no grader test"
        assert points == graded[gid], f"{gid}: notebook says {points} points, grader {graded[gid]}"
    assert set(load_solutions(chapter)) == set(cells), "solution sections != solution cells"


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_notebook_runs_with_solutions_and_every_check_passes(chapter, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("COURSE_DEMO_MODEL", "tiny")   # the optional demo cell uses the toy model
    nb = inject(EXERCISES / f"{chapter}.ipynb", load_solutions(chapter))
    nb = nbformat.reads(json.dumps(nb), as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}})
    client.execute()   # raises CellExecutionError on the first failing cell
    checks = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade") is True]
    assert len(checks) == len(solution_cells(nb))
    for cell in checks:
        text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
        assert "all tests pass" in text and "✗" not in text, f"{cell.source}:\n{text}"
