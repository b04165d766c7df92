"""Writing grading results: the text report, Gradescope ``results.json`` and the CSV."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from autograder.grading import SubmissionResult


def _indent(text: str, prefix: str = "        ") -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())


def header(result: SubmissionResult) -> str:
    """First lines of every report: submission, chapter, seed (to replay), sandbox mode."""
    lines = [f"Autograder — {result.submission}",
             f"chapter: {result.chapter or '?'}    seed: {result.seed} "
             f"(replay with --seed {result.seed})"]
    if result.isolation:
        lines.append(f"sandbox: {result.isolation}")
    if result.error:
        lines.append(f"NOT GRADED: {result.error}")
    return "\n".join(lines)


def text_report(result: SubmissionResult) -> str:
    """Per-exercise points, ✓/✗ per test with the teaching message and learner output."""
    lines = [header(result)]
    for grade_id, error in result.cell_errors.items():
        lines.append(f"cell `{grade_id}` did not load: {error}")
    exercises = result.exercises()
    for grade_id, (score, best) in exercises.items():
        lines.append(f"\n{grade_id:<40} {score:g}/{best:g}")
        for o in (o for o in result.outcomes if o.grade_id == grade_id):
            lines.append(f"    {'✓' if o.passed else '✗'} {o.name:<46} {o.score:g}/{o.max_score:g}")
            if o.message:
                lines.append(_indent(o.message))
            if o.output and not o.passed:
                lines.append(_indent(f"your code printed:\n{o.output}"))
    lines.append(f"\nTotal: {result.score:g}/{result.max_score:g}")
    return "\n".join(lines)


def gradescope(result: SubmissionResult) -> dict:
    """The Gradescope ``results.json`` document for ``result``."""
    tests = []
    for o in result.outcomes:
        output = o.message + (f"\n\nyour code printed:\n{o.output}" if o.output else "")
        tests.append({"name": f"{o.grade_id}: {o.name}", "score": round(o.score, 4),
                      "max_score": round(o.max_score, 4),
                      "status": "passed" if o.passed else "failed", "output": output.strip(),
                      "visibility": "visible"})
    # Only keys of Gradescope's results.json spec; what it has no key for goes in extra_data.
    return {"score": round(result.score, 4), "execution_time": round(result.seconds, 2),
            "output": header(result), "output_format": "text", "visibility": "visible",
            "stdout_visibility": "hidden", "tests": tests,
            "extra_data": {"max_score": round(result.max_score, 4), "seed": result.seed,
                           "chapter": result.chapter}}


def write_json(result: SubmissionResult, path: str | Path) -> None:
    """Write ``gradescope(result)`` to ``path`` (parent directories created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(gradescope(result), indent=2, ensure_ascii=False))


def write_csv(results: list[SubmissionResult], path: str | Path) -> None:
    """One row per submission: submission, seed, one column per exercise, total, max, error."""
    columns: dict[str, None] = {}
    for result in results:
        columns.update(dict.fromkeys(result.exercises()))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["submission", "seed", *columns, "total", "max_score", "error"])
        for result in results:
            points = result.exercises()
            writer.writerow([result.submission, result.seed,
                             *(f"{points[c][0]:g}" if c in points else "" for c in columns),
                             f"{result.score:g}", f"{result.max_score:g}", result.error])
