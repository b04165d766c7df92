"""Used by tests/grading/test_selfcheck.py: grade one chapter's stub, solutions, known-wrong and
cheating submissions through the command-line autograder, then report per exercise.

Submissions are sections of ``tests/submissions/<chapter>.py`` (marker syntax in
``autograder/solutions/__init__.py``); a ``# expect: TEXT`` line in a section names a piece of
the teaching message the grader must show for it. A section is full code, or a slip written
as ``# replace:`` / ``# with:`` edits of the solution section, applied by ``variants``; ``# expect score: N`` says it must score exactly N points on its exercise
(where the grader must withhold every point, not only some). The k-th section of a kind ("wrong", "cheat") of every
exercise goes into notebook ``<kind>_<k>``; exercises without a k-th section keep their stub.
A chapter's notebooks sit in one folder that one ``autograder grade FOLDER`` grades (the CLI's
``main``, run in the test's process: the grading work is the subject, and the suite's worker
keeps one fork server for all chapters; the CLI picks each notebook's chapter from its
metadata); each chapter is its own xdist group, so the chapters spread over the suite's workers.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from autograder import cli
from autograder.notebook import inject, read_notebook
from autograder.solutions import EditError, Section, load_solutions, split_sections
from cli_runs import in_process

ROOT = Path(__file__).resolve().parents[1]
SUBMISSIONS = Path(__file__).resolve().parent / "submissions"


@dataclass
class Graded:
    """Results of one batch notebook: what was injected and the points per exercise."""
    name: str
    injected: dict[str, Section] = field(default_factory=dict)
    points: dict[str, tuple[float, float]] = field(default_factory=dict)  # gid -> (score, max)
    report: dict = field(default_factory=dict)

    @property
    def total(self) -> tuple[float, float]:
        return (sum(s for s, _ in self.points.values()), sum(m for _, m in self.points.values()))

    def messages(self, grade_id: str) -> list[str]:
        return [t["output"] for t in self.report.get("tests", [])
                if t["name"].startswith(f"{grade_id}: ") and t["status"] != "passed"]


def expectations(section: Section) -> list[str]:
    """Substrings that the grader's messages must contain for ``section`` (``# expect: ...``)."""
    return [line.split(":", 1)[1].strip() for line in section.source.splitlines()
            if line.startswith("# expect:")]


def expected_score(section: Section) -> float | None:
    """The points ``section`` must score on its exercise (``# expect score: N``), if it says."""
    scores = [float(line.split(":", 1)[1]) for line in section.source.splitlines()
              if line.startswith("# expect score:")]
    return scores[0] if scores else None


def variants(chapter: str) -> dict[str, dict[str, list[Section]]]:
    """kind -> grade_id -> sections, in file order, each as the code that gets injected: a
    variant written as an edit (``# replace:`` / ``# with:``) is applied to the solution
    section of its grade_id here, which raises ``EditError`` naming the variant when a
    ``replace`` block is not exactly once in that solution."""
    path = SUBMISSIONS / f"{chapter}.py"
    where = str(path.relative_to(ROOT))
    solutions = load_solutions(chapter)
    out: dict[str, dict[str, list[Section]]] = {}
    for sec in split_sections(path.read_text(), where):
        if sec.edits:
            if sec.grade_id not in solutions:
                raise EditError(f"{where}:{sec.line}: `{sec.name}` edits the solution of "
                                f"{sec.grade_id!r}, which {chapter} does not have")
            sec = sec.applied_to(solutions[sec.grade_id], where)
        out.setdefault(sec.kind, {}).setdefault(sec.grade_id, []).append(sec)
    return out


def batches(chapter: str) -> dict[str, dict[str, Section]]:
    """Notebook name -> {grade_id: injected section}: "solution", then "wrong_1", "cheat_1", ..."""
    out = {"solution": {gid: Section(gid, "solution", "reference solution", src)
                        for gid, src in load_solutions(chapter).items()}}
    for kind, per_exercise in variants(chapter).items():
        for k in range(max(len(v) for v in per_exercise.values())):
            out[f"{kind}_{k + 1}"] = {gid: secs[k] for gid, secs in per_exercise.items()
                                      if k < len(secs)}
    return out


# Hang guard of the CLI run that grades a chapter's submissions (up to about a minute on 2 quiet
# cores), not a budget: a slower or busier machine must not fail the self-checks.
# test_selfcheck.py gives its tests this much as pytest's per-test timeout.
CLI_SECONDS = 1200


# Under xdist the chapters already run side by side, one CLI per worker: a CLI grading two
# notebooks at once on top would put more processes than cores on a 2-core machine.
JOBS = 1 if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1 else 2


def grade_chapters(chapters: list[str], workdir: Path, *, seed: int = 1234, timeout: float = 10,
                   jobs: int = JOBS) -> dict[str, dict[str, Graded]]:
    """Grade the stub ("stub") and every batch of each chapter with ONE call of the CLI.

    Returns chapter -> notebook name -> ``Graded``.
    """
    folder, out = workdir / "submissions", workdir / "results"
    folder.mkdir(parents=True)
    graded: dict[str, dict[str, Graded]] = {}
    for chapter in chapters:
        notebook = ROOT / "exercises" / f"{chapter}.ipynb"
        graded[chapter] = {"stub": Graded("stub")}
        (folder / f"{chapter}__stub.ipynb").write_text(json.dumps(read_notebook(notebook)))
        for name, sections in batches(chapter).items():
            nb = inject(notebook, {gid: sec.source for gid, sec in sections.items()})
            (folder / f"{chapter}__{name}.ipynb").write_text(json.dumps(nb))
            graded[chapter][name] = Graded(name, sections)
    start = time.monotonic()
    run = in_process(cli.main, "grade", str(folder), "--json", str(out), "--timeout", str(timeout),
                     "--seed", str(seed), "--jobs", str(jobs), "--quiet")
    seconds = time.monotonic() - start
    assert run.returncode == 0, f"autograder CLI failed ({run.returncode}):\n{run.stderr[-3000:]}"
    for chapter, results in graded.items():
        for name, result in results.items():
            report = json.loads((out / f"{chapter}__{name}.json").read_text())
            assert report.get("tests"), f"{chapter}/{name} was not graded: {report.get('output')}"
            result.report = report
            for test in report["tests"]:
                gid = test["name"].split(": ", 1)[0]
                score, best = result.points.get(gid, (0.0, 0.0))
                result.points[gid] = (score + test["score"], best + test["max_score"])
        results["stub"].report["cli_seconds"] = seconds
    return graded


def graded_chapter(chapter: str, tmp_path_factory) -> dict[str, Graded]:
    """Results for ``chapter``: its stub and every batch graded in one CLI run of its own, so
    that the chapters spread over the suite's workers (one xdist group each)."""
    return grade_chapters([chapter], tmp_path_factory.mktemp(f"selfcheck-{chapter}"))[chapter]


def describe(graded: dict[str, Graded]) -> str:
    """One line per injected variant: kind, exercise, label, points (for failure messages/logs)."""
    lines = []
    for name, result in graded.items():
        for gid, sec in result.injected.items():
            score, best = result.points.get(gid, (0.0, 0.0))
            lines.append(f"{name:<11} {gid:<18} {score:>5.2f}/{best:g}  {sec.label}")
    return "\n".join(lines)
