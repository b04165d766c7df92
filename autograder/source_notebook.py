"""The exercise notebooks as nbgrader source notebooks: solution regions, their stub, the
structure every chapter follows, and the instructor's copy with the solutions filled in.

A solution cell holds the imports, the ``def``/``class`` line and docstring a learner keeps,
and one or more regions (nbgrader's markers, indented to the body)::

    def naive_work(prompt_len: int, n_new: int) -> tuple[int, int]:
        \"\"\"...\"\"\"
        ### BEGIN SOLUTION
        # YOUR CODE HERE
        raise NotImplementedError()
        ### END SOLUTION

In ``exercises/`` every region holds the stub above. ``autograder/solutions/chNN_*.py`` keeps
the full cell text with the real code (no markers); ``fill`` matches it against the cell's
fixed text and puts the code between the markers, so ``nbgrader generate_assignment`` turns
the filled notebook back into exactly the stub. The markers are comments: the grader runs a
cell the same with or without them.
"""
from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Mapping

from autograder.notebook import _nbgrader, cell_source, read_notebook

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB_LINES = ("# YOUR CODE HERE", "raise NotImplementedError()")
EXERCISES = Path(__file__).resolve().parents[1] / "exercises"


def split_regions(source: str) -> tuple[list[str], list[str], list[str]]:
    """``(fixed, indents, bodies)``: the text outside the regions (one more piece than there
    are regions), each region's marker indentation and its text. ``ValueError`` when the
    markers do not pair up."""
    fixed, indents, bodies, current, inside = [], [], [], [], False
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        if "BEGIN SOLUTION" in line:   # nbgrader's test: the text anywhere in the line
            if inside:
                raise ValueError(f"line {number}: {BEGIN} inside an open solution region")
            fixed.append("".join(current))
            indents.append(line[:len(line) - len(line.lstrip())])
            current, inside = [], True
        elif "END SOLUTION" in line:
            if not inside:
                raise ValueError(f"line {number}: {END} without {BEGIN}")
            bodies.append("".join(current))
            current, inside = [], False
        else:
            current.append(line)
    if inside:
        raise ValueError(f"{BEGIN} is never closed by {END}")
    fixed.append("".join(current))
    return fixed, indents, bodies


def stub_body(indent: str) -> str:
    """The region text nbgrader writes in the release version (and ``exercises/`` holds)."""
    return "".join(f"{indent}{line}\n" for line in STUB_LINES)


def release(source: str) -> str:
    """What ``nbgrader generate_assignment`` makes of a cell: each region becomes the stub."""
    fixed, indents, _ = split_regions(source)
    pieces = [fixed[0]]
    for indent, after in zip(indents, fixed[1:]):
        pieces += [stub_body(indent), after]
    text = "".join(pieces)
    return text if source.endswith("\n") else text.rstrip("\n")


def fill(template: str, solution: str) -> str:
    """``template`` (a cell with regions) with each region holding the matching part of
    ``solution``, the full cell text of the solution. Its text outside the regions must
    appear in ``solution`` unchanged and in order (same imports, signatures, docstrings);
    ``ValueError`` names the first piece that does not."""
    fixed, indents, _ = split_regions(template)
    if not indents:
        raise ValueError("the cell has no solution region")
    solution = solution.rstrip("\n") + "\n"
    if not solution.startswith(fixed[0]):
        raise ValueError(f"the solution does not start with the cell's text:\n{fixed[0]}")
    pos, pieces = len(fixed[0]), [fixed[0]]
    for number, (indent, after) in enumerate(zip(indents, fixed[1:]), 1):
        last = number == len(indents)
        tail = after.rstrip("\n") + "\n" if after.strip() else ""
        end = len(solution) - len(tail) if last else solution.find(after, pos)
        if end < pos or (last and not solution.endswith(tail)):
            raise ValueError(f"region {number}: the solution lacks the text that follows it:\n"
                             f"{after}")
        body = solution[pos:end]
        pieces += [f"{indent}{BEGIN}\n", body.rstrip("\n") + "\n", f"{indent}{END}\n",
                   after if not last else tail]
        pos = end + len(after)
    return "".join(pieces).rstrip("\n")


def filled_notebook(notebook: str | Path | Mapping, solutions: Mapping[str, str]) -> dict:
    """Copy of the notebook with ``solutions`` (grade_id -> full cell text) put between the
    markers of the solution cells: an nbgrader source notebook with the answers."""
    nb = copy.deepcopy(dict(notebook)) if isinstance(notebook, Mapping) \
        else read_notebook(notebook)
    missing = set(solutions)
    for cell in nb["cells"]:
        info = _nbgrader(cell)
        if info.get("solution") is True and info.get("grade_id") in solutions:
            grade_id = info["grade_id"]
            try:
                cell["source"] = fill(cell_source(cell), solutions[grade_id])
            except ValueError as exc:
                raise ValueError(f"solution of {grade_id!r} does not fit its cell: {exc}") from exc
            missing.discard(grade_id)
    if missing:
        raise KeyError(f"no solution cell with grade_id {sorted(missing)}")
    return nb


def source_notebook(chapter: str) -> dict:
    """``exercises/<chapter>.ipynb`` with ``autograder/solutions/<chapter>.py`` filled in."""
    from autograder.solutions import load_solutions
    return filled_notebook(EXERCISES / f"{chapter}.ipynb", load_solutions(chapter))


def solution_metadata(grade_id: str) -> dict:
    """nbgrader metadata of a solution cell (no points: nbgrader ignores them there)."""
    return {"solution": True, "grade": False, "locked": False, "grade_id": grade_id,
            "schema_version": 3}


def check_metadata(grade_id: str, points: float) -> dict:
    """nbgrader metadata of the locked check cell that carries the exercise's points."""
    return {"solution": False, "grade": True, "locked": True, "grade_id": f"{grade_id}_check",
            "points": points, "schema_version": 3}


def exercise_cells(grade_id: str, source: str, points: float) -> list[dict]:
    """The two code cells of one exercise for a new chapter's notebook: the solution cell
    (``source``: imports, the documented def/class, regions holding the stub) and its check."""
    def code(text: str, metadata: dict) -> dict:
        return {"cell_type": "code", "execution_count": None, "metadata": {"nbgrader": metadata},
                "outputs": [], "source": text.splitlines(keepends=True)}
    return [code(source, solution_metadata(grade_id)),
            code(f"check({grade_id})", check_metadata(grade_id, points))]


def structure_problems(nb: Mapping, points: Mapping[str, float]) -> list[str]:
    """What breaks the exercise-notebook convention (empty list when nothing does).

    ``points``: grade_id -> points of the chapter's grader. Every solution cell has the
    solution metadata (no points), regions holding the stub, imports plus exactly one
    def/class named after its grade_id with a docstring; the next cell is its locked
    ``check(<grade_id>)`` cell carrying the grader's points; every graded exercise has a cell.
    """
    problems, cells, seen = [], list(nb.get("cells", [])), set()
    for i, cell in enumerate(cells):
        info = _nbgrader(cell)
        if not info.get("solution"):
            if "BEGIN SOLUTION" in cell_source(cell) or "END SOLUTION" in cell_source(cell):
                problems.append(f"cell {i}: nbgrader would cut out a solution region here")
            continue
        gid = info.get("grade_id")
        seen.add(gid)
        if info != solution_metadata(gid):
            problems.append(f"{gid}: solution metadata {info}")
        source = cell_source(cell)
        try:
            fixed, indents, bodies = split_regions(source)
        except ValueError as exc:
            problems.append(f"{gid}: {exc}")
            continue
        if not indents or any(b != stub_body(ind) for b, ind in zip(bodies, indents)):
            problems.append(f"{gid}: needs regions holding exactly the stub {STUB_LINES}")
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            problems.append(f"{gid}: line {exc.lineno}: {exc.msg}")
            continue
        defined = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))]
        if [getattr(n, "name", None) for n in defined] != [gid] or \
                not ast.get_docstring(defined[0]):
            problems.append(f"{gid}: the cell must hold imports and one documented def/class "
                            f"named {gid}")
        check = cells[i + 1] if i + 1 < len(cells) else {}
        expected = check_metadata(gid, points.get(gid))
        if cell_source(check).strip() != f"check({gid})" or _nbgrader(check) != expected:
            problems.append(f"{gid}: the next cell must be `check({gid})` with {expected}")
    problems += [f"{gid}: graded but has no solution cell" for gid in sorted(set(points) - seen)]
    return problems
