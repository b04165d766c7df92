"""Hostile submissions, graded as a batch through the CLI: each is contained and graded
honestly (the grader's verdict, never the submission's claims)."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.sandbox import namespaces_available

ROOT = Path(__file__).resolve().parent.parent
GRADER = ROOT / "tests/fixtures/hostile_grader.py"
ISOLATED = namespaces_available() is None


def solution(grade_id, source):
    meta = {"nbgrader": {"solution": True, "grade": False, "locked": False,
                         "grade_id": grade_id, "points": 1, "schema_version": 3}}
    return {"cell_type": "code", "metadata": meta, "source": source, "outputs": [],
            "execution_count": None}


def notebook(sources: dict) -> str:
    cells = [solution(name, source) for name, source in sources.items()]
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells})


def submissions(out: Path) -> dict[str, str]:
    """grade_id -> solution cell; every cell but ``honest`` misbehaves."""
    forge = json.dumps({"score": 100, "max_score": 1, "tests": []})
    return {
        "honest": "def honest(a, b):\n    print('adding')\n    return a + b",
        "loop": "def loop(a, b):\n    while True:\n        pass",
        "exit": "import os\ndef exit(a, b):\n    os._exit(0)",
        "import_reference": "from reference.model import build_tiny\n"
                            "def import_reference(a, b):\n    return a + b",
        "read_reference": f"SRC = open({str(ROOT / 'reference/kv_cache.py')!r}).read()\n"
                          "def read_reference(a, b):\n    return a + b",
        "patch_allclose": "torch.allclose = lambda *a, **k: True\n"
                          "torch.testing.assert_close = lambda *a, **k: None\n"
                          "def patch_allclose(a, b):\n    return a - b",
        "fake_score": "def fake_score(a, b):\n    print('All tests passed! Score: 10/10')\n"
                      "    return a * b",
        "write_results": f"for p in ['results.json', {str(out / 'hostile.json')!r}]:\n"
                         f"    try:\n        open(p, 'w').write({forge!r})\n"
                         "    except OSError:\n        pass\n"
                         "def write_results(a, b):\n    return 0",
        "allocate": "def allocate(a, b):\n    x = torch.empty(20 * 2**30, dtype=torch.uint8)\n"
                    "    return a + b",
        "alias_reference": "import gc\nalias_reference = next(o for o in gc.get_objects() if "
                           "isinstance(o, type) and o.__module__ == 'reference.kv_cache')",
        "kill_parent": "import os\ndef kill_parent(a, b):\n    os.kill(os.getppid(), 9)\n"
                       "    return a - b",
    }


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Grade the hostile notebook and an invalid notebook in one CLI batch run."""
    folder, out = tmp_path_factory.mktemp("subs"), tmp_path_factory.mktemp("out")
    (folder / "hostile.ipynb").write_text(notebook(submissions(out)))
    (folder / "invalid_json.ipynb").write_text('{"cells": [{"source": "def add(a, b):')
    run = subprocess.run(
        [sys.executable, "-m", "autograder", "grade", str(folder), "--tests", str(GRADER),
         "--json", str(out), "--csv", str(out / "grades.csv"), "--jobs", "2", "--timeout", "3",
         "--seed", "7"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    rows = {Path(r["submission"]).stem: r for r in csv.DictReader(open(out / "grades.csv"))}
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    return run, rows, results


def entry(results, name, submission="hostile"):
    return next(t for t in results[submission]["tests"] if t["name"].startswith(name + ":"))


def test_batch_completes_with_one_row_and_results_file_per_submission(batch):
    run, rows, results = batch
    assert run.returncode == 0, run.stderr[-2000:]
    assert set(rows) == set(results) == {"hostile", "invalid_json"}
    assert "seed 7" in run.stdout and all(r["seed"] == "7" for r in rows.values())
    assert sum(t["max_score"] for t in results["hostile"]["tests"]) == len(submissions(Path(".")))


def test_honest_exercise_scores_full_and_its_output_is_shown(batch):
    _, rows, results = batch
    assert rows["hostile"]["honest"] == "1" and entry(results, "honest")["status"] == "passed"
    assert "adding" in entry(results, "honest")["output"]


@pytest.mark.parametrize("name", [n for n in submissions(Path(".")) if n != "honest"])
def test_hostile_exercise_scores_zero(batch, name):
    _, rows, results = batch
    assert rows["hostile"][name] == "0" and entry(results, name)["status"] == "failed"


def test_totals_are_the_graders(batch):
    _, rows, results = batch
    assert rows["hostile"]["total"] == "1" and results["hostile"]["score"] == 1
    assert rows["invalid_json"]["total"] == "0" and results["invalid_json"]["score"] == 0
    assert rows["invalid_json"]["max_score"] == str(len(submissions(Path("."))))


def test_failures_are_explained(batch):
    _, rows, results = batch
    assert "timed out after 3 s — an infinite loop?" in entry(results, "loop")["output"]
    assert "crashed" in entry(results, "exit")["output"]
    assert "code 0" in entry(results, "exit")["output"]
    assert "the grader forbids" in entry(results, "import_reference")["output"]
    assert "memory limit (4096 MB) exceeded" in entry(results, "allocate")["output"]
    assert "must be your own code" in entry(results, "alias_reference")["output"]
    assert "not valid notebook JSON" in rows["invalid_json"]["error"]
    assert "not valid notebook JSON" in entry(results, "honest", "invalid_json")["output"]
    assert "All tests passed" in entry(results, "fake_score")["output"]  # shown, not believed


@pytest.mark.skipif(not ISOLATED, reason=f"no namespaces: {namespaces_available()}")
def test_reference_files_are_unreadable_when_isolated(batch):
    _, _, results = batch
    assert "FileNotFoundError" in entry(results, "read_reference")["output"]
    assert "isolated" in results["hostile"]["output"]


def test_without_isolation_kill_parent_does_not_reach_the_grader(tmp_path):
    path = tmp_path / "kill_parent.ipynb"
    source = submissions(tmp_path)
    path.write_text(notebook({"kill_parent": source["kill_parent"], "honest": source["honest"]}))
    run = subprocess.run(
        [sys.executable, "-m", "autograder", "grade", str(path), "--tests", str(GRADER),
         "--timeout", "3", "--no-isolation", "--json", str(tmp_path / "r.json")], cwd=ROOT,
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "NOT isolated" in run.stdout
    result = json.loads((tmp_path / "r.json").read_text())
    assert entry({"r": result}, "kill_parent", "r")["score"] == 0  # the relay died, not us
    assert entry({"r": result}, "honest", "r")["score"] == 1
