"""The Gradescope flow, simulated: build the chapter 01 zip with ``python -m autograder
gradescope``, unpack it as Gradescope does (``<root>/source``, ``run_autograder`` copied to
``<root>``), and run ``run_autograder`` on honest, stub, hostile and badly packed submissions,
with a working ``unshare`` and without CAP_SYS_ADMIN (``setpriv --bounding-set=-sys_admin``).
Every run must leave a results.json that follows Gradescope's spec and tells the truth.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from placement import linked_venv

from autograder.source_notebook import source_notebook

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = "ch01_naive_decoding"
FULL = 8   # points of chapter 01: naive_work 2, causal_attention 3, naive_generate 3
SPEC_TOP = {"score", "execution_time", "output", "output_format", "test_output_format",
            "test_name_format", "visibility", "stdout_visibility", "extra_data", "tests",
            "leaderboard"}
SPEC_TEST = {"score", "max_score", "status", "name", "name_format", "number", "output",
             "output_format", "tags", "visibility", "extra_data"}
STALE = {"score": 999, "output": "FORGED stale file", "tests": []}


def can_drop_sys_admin() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


MODES = ["unshare", pytest.param("no_sys_admin", marks=pytest.mark.skipif(
    not can_drop_sys_admin(), reason="needs root and setpriv to drop CAP_SYS_ADMIN"))]


@pytest.fixture(scope="module")
def zip_path(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("zip")
    run = subprocess.run([sys.executable, "-m", "autograder", "gradescope", "ch01", "-o", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert run.returncode == 0, run.stderr
    return Path(run.stdout.strip())


def install(zip_path: Path, root: Path) -> None:
    """What Gradescope does with the zip, plus a stand-in for the venv setup.sh creates: a venv
    at ``<root>/venv`` whose site-packages links to this interpreter's packages (a symlink to
    ``sys.executable`` would resolve to a venv's base interpreter, without torch)."""
    with zipfile.ZipFile(zip_path) as archive:
        archive.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    (root / "run_autograder").chmod(0o755)
    linked_venv(root / "venv")   # a real venv with this interpreter's packages (placement.py)


def notebook_text(sources: dict[str, str] | None = None) -> str:
    """The learner's notebook: chapter 01 with ``sources`` (grade_id -> cell) put in."""
    nb = json.loads((ROOT / "exercises" / f"{CHAPTER}.ipynb").read_text())
    for cell in nb["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if sources and gid in sources:
            cell["source"] = sources[gid]
    return json.dumps(nb)


def solution_sources() -> dict[str, str]:
    nb = source_notebook(CHAPTER)
    return {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in nb["cells"]
            if c.get("metadata", {}).get("nbgrader", {}).get("solution")}


def hostile_sources(root: Path) -> dict[str, str]:
    """naive_work forges results.json (now, from a daemon, and through a line appended to
    run_autograder) and returns the reference's answer; naive_generate kills the grader."""
    results = str(root / "results" / "results.json")
    forged = json.dumps({"score": 100, "output": "FORGED", "tests": []})
    daemon = (f"import time\nfor _ in range(40):\n    open({results!r}, 'w').write({forged!r})\n"
              "    time.sleep(0.5)\n")
    appended = f"\necho '{forged}' > {results}\n"
    solutions = solution_sources()
    return {
        "naive_work": f'''import subprocess, sys

def naive_work(prompt_len, n_new):
    for action in (lambda: open({results!r}, "w").write({forged!r}),
                   lambda: open({str(root / "run_autograder")!r}, "a").write({appended!r}),
                   lambda: subprocess.Popen([sys.executable, "-c", {daemon!r}],
                                            start_new_session=True)):
        try:
            action()
        except Exception:
            pass
    from reference.decoding import naive_work as reference_naive_work
    return reference_naive_work(prompt_len, n_new)
''',
        "causal_attention": solutions["causal_attention"],
        "naive_generate": f'''import os, signal

def naive_generate(model, prompt_ids, n_new):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = open(f"/proc/{{pid}}/cmdline", "rb").read()
        except OSError:
            continue
        if b"autograder\\x00grade" in command and {str(root).encode()!r} in command:
            os.kill(int(pid), signal.SIGKILL)
    return [0] * n_new
''',
    }


def run_autograder(zip_path: Path, root: Path, files: dict[str, str | bytes],
                   mode: str = "unshare", prepare=None, strays: bool = False) -> dict:
    """Install the zip under ``root``, put ``files`` in the submission, leave a forged stale
    results.json, run ``run_autograder``; return the results it leaves (checked against the
    spec), where the submission starts processes of its own (``strays``), read after they had
    two seconds to rewrite them. ``prepare(root)`` may change the installation first."""
    install(zip_path, root)
    if prepare:
        prepare(root)
    for name, content in files.items():
        path = root / "submission" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    (root / "submission").mkdir(exist_ok=True)
    (root / "results").mkdir()
    (root / "results" / "results.json").write_text(json.dumps(STALE))
    prefix = ["setpriv", "--bounding-set=-sys_admin", "--"] if mode == "no_sys_admin" else []
    run = subprocess.run([*prefix, str(root / "run_autograder")], cwd=root, capture_output=True,
                         text=True, timeout=300, env={"PATH": os.environ["PATH"],
                                                      "HOME": str(root), "AUTOGRADER_ROOT": str(root)})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    if strays:
        time.sleep(2)   # the hostile daemon rewrites results.json every 0.5 s while it lives
    results = json.loads((root / "results" / "results.json").read_text())
    follows_spec(results)
    assert "FORGED" not in results.get("output", ""), results
    return results


def follows_spec(results: dict) -> None:
    assert set(results) <= SPEC_TOP, set(results) - SPEC_TOP
    assert isinstance(results["score"], (int, float)) and isinstance(results["tests"], list)
    assert results.get("output_format", "text") in ("text", "html", "simple_format", "md", "ansi")
    for test in results["tests"]:
        assert set(test) <= SPEC_TEST and test["status"] in ("passed", "failed"), test
        assert 0 <= test["score"] <= test["max_score"]
    assert results["score"] == pytest.approx(sum(t["score"] for t in results["tests"]))


def exercise_scores(results: dict) -> dict[str, tuple[float, float]]:
    totals: dict[str, tuple[float, float]] = {}
    for test in results["tests"]:
        gid = test["name"].split(":", 1)[0]
        score, best = totals.get(gid, (0.0, 0.0))
        totals[gid] = (score + test["score"], best + test["max_score"])
    return totals


def test_zip_holds_the_scripts_and_grading_code_but_no_solutions(zip_path):
    names = zipfile.ZipFile(zip_path).namelist()
    assert {"setup.sh", "run_autograder", "autograder/cli.py", "reference/model.py",
            f"autograder/graders/{CHAPTER}.py"} <= set(names)
    assert not [n for n in names if "solutions" in n or "__pycache__" in n]
    archive = zipfile.ZipFile(zip_path)
    assert archive.getinfo("run_autograder").external_attr >> 16 & stat.S_IXUSR
    assert f'chapter="{CHAPTER}"' in archive.read("run_autograder").decode()
    setup = archive.read("setup.sh").decode()
    assert "python3 -m venv /autograder/venv" in setup
    assert "--index-url https://download.pytorch.org/whl/cpu" in setup
    requirements = {line.strip() for line in archive.read("grading-requirements.txt").decode()
                    .splitlines() if line.strip() and not line.startswith("#")}
    assert requirements == {"numpy", "pytest", "tqdm"}   # no jupyter-book, torch comes apart
    assert archive.read("torch-requirement.txt").decode().startswith("torch")
    for script in ("setup.sh", "run_autograder"):
        check = subprocess.run(["bash", "-n"], input=archive.read(script).decode(), text=True,
                               capture_output=True)
        assert check.returncode == 0, f"{script}: {check.stderr}"


def test_the_capstone_zip_holds_its_grader_and_the_engine_but_no_solutions(tmp_path):
    run = subprocess.run([sys.executable, "-m", "autograder", "gradescope", "ch12", "-o",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert run.returncode == 0, run.stderr
    archive = zipfile.ZipFile(run.stdout.strip())
    names = archive.namelist()
    assert {"autograder/graders/ch12_serving_capstone.py", "reference/engine/replay.py",
            "reference/engine/scheduler.py"} <= set(names)
    assert not [n for n in names if "solutions" in n]
    assert 'chapter="ch12_serving_capstone"' in archive.read("run_autograder").decode()


@pytest.mark.parametrize("mode", MODES)
def test_honest_submission_scores_full(zip_path, tmp_path, mode):
    results = run_autograder(zip_path, tmp_path / "autograder",
                             {"alice.ipynb": notebook_text(solution_sources())}, mode)
    assert results["score"] == FULL and len(results["tests"]) > 3, results["output"]


@pytest.mark.parametrize("mode", MODES)
def test_stub_scores_zero_out_of_full(zip_path, tmp_path, mode):
    results = run_autograder(zip_path, tmp_path / "autograder", {"ch01.ipynb": notebook_text()},
                             mode)
    assert results["score"] == 0
    assert sum(t["max_score"] for t in results["tests"]) == FULL
    assert "not implemented" in results["tests"][0]["output"]


@pytest.mark.parametrize("mode", [
    pytest.param("unshare", marks=pytest.mark.skipif(
        os.geteuid() != 0, reason="learner code is contained only when grading as root, as on "
        "Gradescope and in CI")),
    pytest.param("no_sys_admin", marks=MODES[1].marks)])
def test_hostile_submission_scores_zero_on_its_exercises_and_forges_nothing(zip_path, tmp_path,
                                                                            mode):
    root = tmp_path / "autograder"
    results = run_autograder(zip_path, root, {"mallory.ipynb": notebook_text(
        hostile_sources(root))}, mode, strays=True)
    scores = exercise_scores(results)
    assert results["score"] <= 3, results   # at most the honest causal_attention
    for gid in ("naive_work", "naive_generate"):
        assert scores.get(gid, (0, 0))[0] == 0, results


def test_chapter_comes_from_the_zip_and_junk_is_ignored(zip_path, tmp_path):
    files = {"work/ch02_kv_cache.ipynb": notebook_text(solution_sources()),  # misleading name
             "__MACOSX/work/._ch02_kv_cache.ipynb": b"\x00\x05\x16\x07 resource fork",
             "work/.ipynb_checkpoints/ch02_kv_cache-checkpoint.ipynb": notebook_text(),
             ".hidden.ipynb": notebook_text()}
    results = run_autograder(zip_path, tmp_path / "autograder", files)
    assert results["score"] == FULL and CHAPTER in results["output"], results["output"]


@pytest.mark.parametrize("files, found", [({"notes.txt": "no notebook here"}, "found 0"),
                                          ({"a.ipynb": "{}", "b/c.ipynb": "{}"}, "found 2")])
def test_zero_or_several_notebooks_give_zero_and_say_why(zip_path, tmp_path, files, found):
    results = run_autograder(zip_path, tmp_path / "autograder", files)
    assert results["score"] == 0 and results["tests"] == []
    assert found in results["output"] and "exactly one" in results["output"]


def test_grader_that_cannot_start_leaves_an_honest_zero(zip_path, tmp_path):
    def break_grader(root: Path) -> None:   # as if torch were missing: the grader cannot import
        (root / "source" / "autograder" / "grading.py").write_text(
            "raise ImportError('No module named torch')\n")
    results = run_autograder(zip_path, tmp_path / "autograder",
                             {"a.ipynb": notebook_text(solution_sources())}, prepare=break_grader)
    assert results["score"] == 0 and results["tests"] == []
    assert "without writing results" in results["output"], results["output"]
