"""Reading and writing notebooks (autograder/notebook.py): solution cells, clear errors for
what is not a notebook, the chapter a notebook is for, injecting solutions."""
import json

import pytest

from autograder.notebook import NotebookError, chapter_of, inject, read_notebook, solution_cells


def solution(grade_id, source):
    meta = {"nbgrader": {"solution": True, "grade": False, "locked": False, "grade_id": grade_id,
                         "points": 1, "schema_version": 3}}
    return {"cell_type": "code", "metadata": meta, "source": source, "outputs": [],
            "execution_count": None}


def notebook(*cells, chapter=None):
    meta = {"course": {"chapter": chapter}} if chapter else {}
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": meta, "cells": list(cells)}


def test_solution_cells_accept_list_and_string_sources_and_skip_others():
    nb = notebook({"cell_type": "markdown", "source": "# hi"}, solution("a", ["x = 1\n", "y = 2"]),
                  {"cell_type": "code", "source": "z = 3"}, solution("b", "def b(): pass"),
                  {"cell_type": "code", "metadata": {"nbgrader": "junk"}})
    assert solution_cells(nb) == [("a", "x = 1\ny = 2"), ("b", "def b(): pass")]
    assert solution_cells({"cells": []}) == []


def test_invalid_json_and_non_notebooks_give_clear_errors(tmp_path):
    (tmp_path / "broken.ipynb").write_text('{"cells": [')
    (tmp_path / "list.ipynb").write_text("[1, 2]")
    with pytest.raises(NotebookError, match="not valid notebook JSON.*line 1"):
        read_notebook(tmp_path / "broken.ipynb")
    with pytest.raises(NotebookError, match="not a notebook"):
        read_notebook(tmp_path / "list.ipynb")
    (tmp_path / "nocells.ipynb").write_text("{}")
    assert read_notebook(tmp_path / "nocells.ipynb")["cells"] == []


def test_chapter_from_metadata_then_file_name_then_grade_ids():
    nb = notebook(solution("naive_generate", ""))
    assert chapter_of(notebook(chapter="ch02_kv_cache"), "ch01_x.ipynb") == "ch02_kv_cache"
    assert chapter_of(nb, "alice_ch01.ipynb") == "ch01"
    chapters = {"ch01_naive_decoding": ["naive_generate"], "ch02_kv_cache": ["KVCache"]}
    assert chapter_of(nb, "submission.ipynb", chapters) == "ch01_naive_decoding"
    assert chapter_of(notebook(), "submission.ipynb", chapters) is None


def test_inject_replaces_only_the_named_solution_cells(tmp_path):
    nb = notebook(solution("a", "old a"), solution("b", "old b"))
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    injected = inject(path, {"a": "new a"})
    assert solution_cells(injected) == [("a", "new a"), ("b", "old b")]
    assert solution_cells(nb) == [("a", "old a"), ("b", "old b")]  # the input is not modified
    with pytest.raises(KeyError, match="zzz"):
        inject(nb, {"zzz": ""})

