"""Reading exercise notebooks: solution cells by nbgrader ``grade_id``, the chapter, injection.

Notebooks are read as plain JSON (nbformat v4 layout) and never executed here. Malformed input
raises ``NotebookError`` with a message meant for the learner.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

CHAPTER_RE = re.compile(r"ch(\d\d)")


class NotebookError(ValueError):
    """The submission is not a readable notebook (the message says why)."""


def read_notebook(path: str | Path) -> dict:
    """Parse the notebook at ``path`` into a dict with a ``cells`` list."""
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise NotebookError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookError(f"{Path(path).name} is not valid notebook JSON (line {exc.lineno}, "
                            f"column {exc.colno}: {exc.msg}); was it saved completely? Re-save "
                            "it from Jupyter and resubmit") from exc
    if not isinstance(nb, dict) or not isinstance(nb.get("cells", []), list):
        raise NotebookError(f"{Path(path).name} is JSON but not a notebook (no list of cells)")
    nb.setdefault("cells", [])
    return nb


def cell_source(cell: Mapping) -> str:
    """Source of a cell as one string (nbformat allows a string or a list of lines)."""
    source = cell.get("source", "")
    if isinstance(source, list):
        return "".join(str(line) for line in source)
    return source if isinstance(source, str) else ""


def _nbgrader(cell: Any) -> Mapping:
    meta = cell.get("metadata") if isinstance(cell, dict) else None
    info = meta.get("nbgrader") if isinstance(meta, dict) else None
    return info if isinstance(info, dict) else {}


def solution_cells(nb: Mapping) -> list[tuple[str, str]]:
    """``(grade_id, source)`` of every code cell with ``nbgrader.solution: true``, in order."""
    cells = []
    for cell in nb.get("cells", []):
        info = _nbgrader(cell)
        if info.get("solution") is True and isinstance(info.get("grade_id"), str) \
                and cell.get("cell_type", "code") == "code":
            cells.append((info["grade_id"], cell_source(cell)))
    return cells


def chapter_of(nb: Mapping, path: str | Path | None,
               chapters: Mapping[str, Iterable[str]] = ()) -> str | None:
    """The chapter (e.g. ``"ch01_naive_decoding"``) or its short form (``"ch01"``).

    Tried in order: ``metadata.course.chapter``; ``chNN`` in the file name; the chapter of
    ``chapters`` (name -> grade_ids) sharing most grade_ids with the solution cells.
    """
    course = nb.get("metadata", {}).get("course", {}) if isinstance(nb.get("metadata"), dict) \
        else {}
    if isinstance(course, dict) and isinstance(course.get("chapter"), str):
        return course["chapter"]
    match = CHAPTER_RE.search(Path(path).name) if path else None
    if match:
        return match.group(0)
    ids = {grade_id for grade_id, _ in solution_cells(nb)}
    overlap = {name: len(ids & set(grade_ids)) for name, grade_ids in dict(chapters).items()}
    best = max(overlap, key=overlap.get, default=None)
    return best if best and overlap[best] else None


def inject(notebook: str | Path | Mapping, sources: Mapping[str, str]) -> dict:
    """Copy of the notebook (a path or a dict) with the source of each solution cell whose
    ``grade_id`` is in ``sources`` replaced. Unknown grade_ids raise ``KeyError``."""
    nb = copy.deepcopy(dict(notebook)) if isinstance(notebook, Mapping) \
        else read_notebook(notebook)
    missing = set(sources) - {grade_id for grade_id, _ in solution_cells(nb)}
    if missing:
        raise KeyError(f"no solution cell with grade_id {sorted(missing)}")
    for cell in nb["cells"]:
        info = _nbgrader(cell)
        if info.get("solution") is True and info.get("grade_id") in sources:
            cell["source"] = sources[info["grade_id"]]
    return nb
