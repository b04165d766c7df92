"""Grading wherever Python lives: the chapter 01 solution notebook gets full marks through the
real CLI (``python -m autograder grade``) run by a Python environment placed where learners'
and instructors' environments are (issue 15), and a hostile cell still gets 0 there:

- a venv under /tmp (the worker mounts a private /tmp: the environment is bound back into it),
- a readable venv inside a 0700 directory, and one readable by all over an interpreter that may
  not be (pyenv under /root: the unprivileged user needs to read its standard library),
- a venv inside the repository (the repository is hidden from the worker, the venv is not),
- torch found only in user site-packages (``PYTHONUSERBASE``; the worker runs with ``-s``),
- and without CAP_SYS_ADMIN (no namespaces: the unprivileged user and Landlock).

In each, two more copies of the course (solutions included, readable by every user) sit in the
home directory and beside this checkout while the hostile cell tries to read them: the worker
sees only the directories Python imports from, the system's, and its private temporary one.

An environment the sandbox cannot show is refused at start (exit 3, results.json says why),
never graded as zeros. The venvs are ``tests/placement.py``'s: links to this interpreter's
packages, built in well under a second. Each test grades one small chapter (about 5 s).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from autograder.source_notebook import source_notebook
from placement import link_packages, linked_venv, venv_site_packages

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = "ch01_naive_decoding"
# The hostile notebook loses naive_work's 2 points, and causal_attention's 3: its naive_work cell
# names `sys` and `__import__`, and every cell runs where causal_attention's operations are
# recorded (the static look covers them all).
FULL, HOSTILE_MAX = 8, 3
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="an unprivileged user to drop to")


def hostile_cell(prefix: Path, planted: Path, copies: list[Path]) -> str:
    """naive_work, right only if an attack on the environment worked: plant a module in the
    venv's site-packages (the next grader would run it), read the reference, import it, read
    the solutions of another copy of the course on the machine."""
    return f'''import os, sys, glob

def naive_work(prompt_len, n_new):
    worked = False
    for attack in (lambda: open({str(planted)!r}, "w").write("import os"),
                   lambda: open({str(ROOT / "reference" / "model.py")!r}).read(),
                   lambda: __import__("reference.model"),
                   *(lambda path=path: open(path).read() for path in {[str(c) for c in copies]!r})):
        try:
            attack()
            worked = True
        except Exception as exc:
            print("refused:", type(exc).__name__)
    lengths = range(prompt_len, prompt_len + n_new)
    right = (sum(lengths), sum(n * n for n in lengths))
    return right if worked else (0, 0)
'''


def grade(python: Path, folder: Path, env: dict | None = None, wrap: tuple[str, ...] = ()
          ) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    """``python -m autograder grade folder --json out`` from the repository (run by ``wrap``,
    e.g. ``setpriv``, when given); the results by notebook stem."""
    out = folder.parent / f"{folder.name}-out"
    run = subprocess.run([*wrap, str(python), "-m", "autograder", "grade", str(folder), "--seed", "3",
                          "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, **(env or {})})
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")} \
        if out.is_dir() else {}
    return run, results


def second_checkouts(tag: str) -> list[Path]:
    """The chapter's solutions in two more copies of the course, readable by every user: one in
    the home directory, one beside this checkout (an instructor's other clones). Outside /tmp,
    which the namespaces sandbox replaces anyway."""
    source = ROOT / "autograder" / "solutions" / f"{CHAPTER}.py"
    copies = []
    for base in (Path.home(), ROOT.parent):
        target = base / f"course-copy-{tag}" / "autograder" / "solutions" / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        for folder in (target.parent, target.parent.parent, target.parent.parent.parent):
            folder.chmod(0o755)
        shutil.copy(source, target)
        target.chmod(0o644)
        copies.append(target)
    return copies


def submissions(folder: Path, prefix: Path, copies: list[Path] = ()) -> Path:
    """``folder`` with the solution notebook and a hostile one (naive_work attacks ``prefix``
    and reads ``copies``)."""
    folder.mkdir(parents=True)
    nb = source_notebook(CHAPTER)
    (folder / "solution.ipynb").write_text(json.dumps(nb))
    planted = venv_site_packages(prefix) / "planted_by_learner.py"
    for cell in nb["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == "naive_work":
            cell["source"] = hostile_cell(prefix, planted, list(copies))
    (folder / "hostile.ipynb").write_text(json.dumps(nb))
    return folder


def check_placement(python: Path, prefix: Path, folder: Path, env: dict | None = None,
                    wrap: tuple[str, ...] = ()) -> None:
    """The solution scores full, the hostile notebook gains nothing from its attacks: no module
    planted in the environment, no reference read or imported, no other copy of the course
    read (two of them placed on the machine for the run)."""
    tag = f"{os.getpid()}-{folder.parent.name}"
    copies = second_checkouts(tag)
    try:
        run, results = grade(python, submissions(folder, prefix, copies), env, wrap)
    finally:
        for copy in copies:
            shutil.rmtree(copy.parents[2], ignore_errors=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert results["solution"]["score"] == FULL, results["solution"]["output"][-3000:]
    hostile = results["hostile"]
    assert hostile["score"] == HOSTILE_MAX, hostile["output"][-3000:]
    assert not (venv_site_packages(prefix) / "planted_by_learner.py").exists()


@pytest.fixture
def public_tmp():
    """A directory under /tmp that every user may enter (pytest's own are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="autograder-placement-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@ROOT_ONLY
def test_venv_in_a_private_directory(tmp_path):
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    python = linked_venv(private / "venv")
    check_placement(python, private / "venv", tmp_path / "subs")


@ROOT_ONLY
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv drops CAP_SYS_ADMIN")
def test_venv_in_a_private_directory_without_namespaces(tmp_path):
    """The ``user`` sandbox (no CAP_SYS_ADMIN, so no namespaces: Landlock instead): reads only
    where Python imports from, although the worker keeps CAP_DAC_READ_SEARCH to read a Python
    under a 0700 directory; the other copies of the course stay out of reach."""
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    python = linked_venv(private / "venv")
    check_placement(python, private / "venv", tmp_path / "subs",
                    wrap=("setpriv", "--bounding-set=-sys_admin", "--"))


@ROOT_ONLY
def test_readable_venv_under_tmp_over_the_interpreter(public_tmp):
    """With namespaces the worker mounts a private /tmp after importing torch: its lazy imports
    need the venv bound back. The venv is readable by any user, the interpreter beneath it
    perhaps not (here a pyenv under /root): its standard library must stay readable to the
    sandbox's user."""
    python = linked_venv(public_tmp / "venv")
    check_placement(python, public_tmp / "venv", public_tmp / "subs")


@ROOT_ONLY
def test_venv_inside_the_repository(tmp_path):
    venv = ROOT / f".venv-placement-{os.getpid()}"
    try:
        python = linked_venv(venv)
        check_placement(python, venv, tmp_path / "subs")
    finally:
        shutil.rmtree(venv, ignore_errors=True)


@ROOT_ONLY
def test_torch_in_user_site_packages(public_tmp):
    """``pip install --user torch``: the worker runs with ``-s`` yet imports from there."""
    python = linked_venv(public_tmp / "venv", system_site=True, skip={"torch"})
    user_base = public_tmp / "userbase"
    link_packages(venv_site_packages(user_base), only={"torch"})
    probe = subprocess.run([str(python), "-c", "import torch; print(torch.__file__)"],
                           capture_output=True, text=True, env={**os.environ,
                                                                "PYTHONUSERBASE": str(user_base)})
    assert str(user_base) in probe.stdout, probe.stdout + probe.stderr
    check_placement(python, public_tmp / "venv", public_tmp / "subs",
                    env={"PYTHONUSERBASE": str(user_base)})


@ROOT_ONLY
def test_an_environment_the_sandbox_cannot_show_is_refused_with_exit_3(public_tmp):
    """Hide the venv's packages from the worker (``--hide``): refused at start, with why."""
    python = linked_venv(public_tmp / "venv")
    folder = submissions(public_tmp / "subs", public_tmp / "venv")
    out = public_tmp / "out"
    run = subprocess.run([str(python), "-m", "autograder", "grade", str(folder / "solution.ipynb"),
                          "--json", str(out / "r.json"), "--hide", str(public_tmp / "venv" / "lib")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 3, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((out / "r.json").read_text())
    assert results["score"] == 0
    assert "does not work inside the sandbox" in results["output"], results["output"]
    assert "cannot import" in run.stderr and "--no-isolation" in run.stderr


def test_packages_installed_as_links_are_shown_where_they_point(tmp_path):
    # a site-packages whose entries are symbolic links (Nix, some conda layouts, placement.py's
    # linked venvs): the sandbox must show the folders the links point into, not only the links
    from autograder.boundary.isolation import link_target_dirs

    store, site_dir = tmp_path / "store" / "pkgs", tmp_path / "site-packages"
    (store / "mypkg").mkdir(parents=True)
    site_dir.mkdir()
    (site_dir / "mypkg").symlink_to(store / "mypkg")
    (site_dir / "dangling").symlink_to(tmp_path / "nowhere")
    (site_dir / "plain").mkdir()
    assert link_target_dirs(str(site_dir)) == [str(store.resolve())]
    assert link_target_dirs(str(tmp_path / "missing")) == []
