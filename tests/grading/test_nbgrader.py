"""The nbgrader flow, with nbgrader itself (its Python API, which its commands and formgrader
run), in a temporary course directory.

``source/<chapter>/`` gets our source notebook (``python -m autograder source-notebook``);
``generate_assignment`` must keep every import, signature and docstring; ``validate`` must fail
on the stubs and pass with the solutions; ``autograde`` of a stub submission and a solution
submission must give the scores our grader gives the same files (autograde runs for chapter 02
only, whose class exercise is the harder case, to keep the test near a minute; generate and
validate run for every chapter listed).
The kernel finds ``autograder`` and ``reference`` through PYTHONPATH, as an instructor's
grading environment does through ``pip install -e <course repository>``.
"""
from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
from nbgrader.api import Gradebook
from nbgrader.apps.api import NbGraderAPI
from nbgrader.validator import Validator
from traitlets.config import Config

from autograder import cli
from autograder.cli import json_name
from autograder.notebook import inject, read_notebook, solution_cells
from autograder.solutions import load_solutions
from autograder.source_notebook import release
from cli_runs import in_process

pytestmark = [pytest.mark.slow,   # runs whole notebooks in Jupyter kernels
              # autograde's own ORM use; its command line prints the same warnings
              pytest.mark.filterwarnings("ignore:Object of type:sqlalchemy.exc.SAWarning")]

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = {"ch01": "ch01_naive_decoding", "ch02": "ch02_kv_cache",
            "ch12": "ch12_serving_capstone"}
AUTOGRADED = "ch02"
FULL = 10   # sum of chapter 02's @exercise points


def kernel_env() -> dict[str, str]:
    """The environment nbgrader and its kernels run in: the course packages importable, the
    notebooks' optional demo cell on the small random model."""
    return dict(os.environ, PYTHONPATH=str(ROOT), COURSE_DEMO_MODEL="tiny")


def nbgrader_api(course: Path) -> NbGraderAPI:
    """nbgrader's own Python API (what its command line and formgrader run) on ``course``, in
    this process: one nbgrader start-up for every step instead of one per command."""
    config = Config()
    config.CourseDirectory.root = str(course)
    config.CourseDirectory.course_id = "llm-inference"
    config.ExecutePreprocessor.timeout = 300
    return NbGraderAPI(config=config)


def nbgrader(api: NbGraderAPI, step: str, *args: str) -> None:
    """Run nbgrader's ``step`` (``generate_assignment``, ``autograde``) with the kernels'
    environment (``kernel_env``); fail with nbgrader's log and traceback if it did not succeed."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in kernel_env().items():
            patch.setenv(key, value)
        result = getattr(api, step)(*args)
    assert result["success"], f"nbgrader {step} {' '.join(args)}:\n" \
        f"{result.get('log', '')[-2000:]}{result.get('error', '')[-2000:]}"


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """A course directory with both chapters generated, a ``solution`` copy of each release
    notebook (the solutions typed in) next to it, and for the autograded chapter a ``stub``
    student (the notebook as handed out) and a ``solution`` student."""
    course = tmp_path_factory.mktemp("course")
    api = nbgrader_api(course)
    for short, chapter in CHAPTERS.items():
        run = in_process(cli.main, "source-notebook", short, "-o", str(course / "source" / short))
        assert run.returncode == 0, run.stderr
        nbgrader(api, "generate_assignment", short)
        released = course / "release" / short / f"{chapter}.ipynb"
        solved = course / "solved" / short / f"{chapter}.ipynb"
        solved.parent.mkdir(parents=True)
        solved.write_text(json.dumps(inject(released, load_solutions(chapter))))
        if short == AUTOGRADED:
            for student, path in (("stub", released), ("solution", solved)):
                folder = course / "submitted" / student / short
                folder.mkdir(parents=True)
                (folder / path.name).write_text(path.read_text())
    return course


def documented(source: str) -> list[tuple[str, str | None]]:
    """(name, docstring) of the classes, their methods and the functions of a cell; helpers
    nested inside a function (a solution's own) are not part of what the learner keeps."""
    found = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.ClassDef)):
                found.append((child.name, ast.get_docstring(child)))
                if isinstance(child, ast.ClassDef):
                    visit(child)
            else:
                visit(child)
    visit(ast.parse(source))
    return found


@pytest.mark.parametrize("short", CHAPTERS)
def test_release_keeps_imports_signatures_and_docstrings(course, short):
    chapter = CHAPTERS[short]
    released = dict(solution_cells(read_notebook(course / "release" / short / f"{chapter}.ipynb")))
    ours = dict(solution_cells(read_notebook(ROOT / "exercises" / f"{chapter}.ipynb")))
    solutions = load_solutions(chapter)
    assert set(released) == set(ours) == set(solutions)
    for gid, cell in released.items():
        assert cell.rstrip() == release(ours[gid]).rstrip(), gid
        docs = documented(cell)
        assert docs and all(doc for _, doc in docs), gid
        assert docs == documented(solutions[gid]), gid


def test_validate_fails_on_stubs_and_passes_with_solutions(course, monkeypatch):
    for key, value in kernel_env().items():
        monkeypatch.setenv(key, value)
    validator = Validator()
    for short, chapter in CHAPTERS.items():
        stub = validator.validate(str(course / "release" / short / f"{chapter}.ipynb"))
        failed = [cell["source"] for cell in stub.get("failed", [])]
        assert failed and all(source.startswith("check(") for source in failed), stub
    solution = validator.validate(str(course / "solved" / "ch01" / "ch01_naive_decoding.ipynb"))
    assert "failed" not in solution and not solution.get("changed"), solution


@pytest.fixture(scope="module")
def both_scores(course, tmp_path_factory) -> dict[str, tuple[tuple, tuple]]:
    """student -> ((nbgrader score, max), (our score, max)) for the autograded chapter."""
    api = nbgrader_api(course)
    for student in ("stub", "solution"):
        nbgrader(api, "autograde", AUTOGRADED, student)
    out = tmp_path_factory.mktemp("ours")
    submitted = course / "submitted"
    chapter = CHAPTERS[AUTOGRADED]
    paths = {student: submitted / student / AUTOGRADED / f"{chapter}.ipynb"
             for student in ("stub", "solution")}
    run = in_process(cli.main, "grade", str(submitted), "--json", str(out), "--seed", "3", "--quiet")
    assert run.returncode == 0, run.stderr[-3000:]
    scores = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for student, path in paths.items():
            theirs = gradebook.find_submission(AUTOGRADED, student)
            ours = json.loads((out / json_name(path, submitted)).read_text())
            scores[student] = ((theirs.score, theirs.max_score),
                               (ours["score"], sum(t["max_score"] for t in ours["tests"])))
    return scores


@pytest.mark.parametrize("student, expected", [("stub", 0), ("solution", FULL)])
def test_nbgrader_autograde_scores_equal_ours(both_scores, student, expected):
    theirs, ours = both_scores[student]
    assert theirs == ours == (expected, FULL), both_scores
