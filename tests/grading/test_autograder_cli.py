"""Instructor commands of ``python -m autograder``: ``grade --chapter`` and ``--json DIR`` for a
single notebook, ``source-notebook``, and one-line errors for an unknown chapter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import cli
from autograder.notebook import read_notebook, solution_cells
from autograder.solutions import load_solutions
from autograder.source_notebook import BEGIN, END, release, source_notebook
from cli_runs import in_process

ROOT = Path(__file__).resolve().parents[2]


def autograder(*args: str) -> subprocess.CompletedProcess:
    """The real process: ``python -m autograder ARGS``."""
    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def autograder_main(*args: str) -> subprocess.CompletedProcess:
    """The same command through ``cli.main`` in this process (see tests/cli_runs.py)."""
    return in_process(cli.main, *args)


def test_chapter_option_wins_over_the_file_name_and_json_dir_gets_name_json(tmp_path):
    nb = source_notebook("ch01_naive_decoding")   # solutions between the markers
    del nb["metadata"]["course"]
    path = tmp_path / "subs" / "ch02_kv_cache.ipynb"   # a misleading name
    path.parent.mkdir()
    path.write_text(json.dumps(nb))
    (tmp_path / "existing").mkdir()
    by_name = autograder_main("grade", str(path), "--json", str(tmp_path / "existing"), "--seed", "5")
    by_option = autograder_main("grade", str(path), "--chapter", "ch01", "--json",
                           str(tmp_path / "new_dir"), "--seed", "5")
    assert by_name.returncode == by_option.returncode == 0, by_name.stderr + by_option.stderr
    named = json.loads((tmp_path / "existing" / "ch02_kv_cache.json").read_text())
    chosen = json.loads((tmp_path / "new_dir" / "ch02_kv_cache.json").read_text())
    assert named["extra_data"]["chapter"] == "ch02" and named["score"] == 0   # from the name
    assert chosen["extra_data"]["chapter"] == "ch01_naive_decoding"
    assert chosen["score"] == chosen["extra_data"]["max_score"] == 8


def test_source_notebook_puts_the_solutions_between_the_markers(tmp_path):
    run = autograder_main("source-notebook", "ch02", "-o", str(tmp_path))
    assert run.returncode == 0, run.stderr
    written = dict(solution_cells(read_notebook(tmp_path / "ch02_kv_cache.ipynb")))
    stubs = dict(solution_cells(read_notebook(ROOT / "exercises" / "ch02_kv_cache.ipynb")))
    solutions = load_solutions("ch02_kv_cache")
    assert set(written) == set(stubs) == set(solutions)
    for gid, source in written.items():
        assert BEGIN in source and END in source and "NotImplementedError" not in source, gid
        assert release(source) == release(stubs[gid]), gid
        last_line = solutions[gid].rstrip().splitlines()[-1]
        assert last_line in source, gid


def test_unknown_chapter_through_the_real_entry_point_is_one_line_and_exit_2():
    """The process itself (``__main__``, exit status); the other commands in-process below."""
    run = autograder("grade", "exercises", "--chapter", "ch99")
    assert run.returncode == 2 and "unknown chapter 'ch99'" in run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["source-notebook", "ch99", "-o", "x"],
                                     ["gradescope", "ch99", "-o", "x"],
                                     ["grade", "exercises", "--chapter", "ch99"]])
def test_unknown_chapter_is_one_line_and_exit_2(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # "x" would be written here, were the chapter known
    run = autograder_main(*command)
    assert run.returncode == 2 and "unknown chapter 'ch99'" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_cli_help_lists_the_options():
    out = autograder_main("grade", "--help").stdout
    for option in ("--json", "--csv", "--jobs", "--timeout", "--memory-mb", "--seed", "--tests"):
        assert option in out

