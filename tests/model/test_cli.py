"""`python -m reference generate`: streams text, and bad requests end with one line and exit 2."""
import subprocess
import sys

import pytest

from cli_runs import in_process
from reference.__main__ import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "reference", "generate", *args],
                          capture_output=True, text=True, timeout=300)


def test_tiny_model_streams_and_reports_speed():
    result = run("hello", "--model", "tiny", "--max-new-tokens", "8")
    assert result.returncode == 0, result.stderr
    assert "tokens/s" in result.stderr and "8 new tokens" in result.stderr


def test_threads_option_sets_the_thread_count():
    result = run("hello", "--model", "tiny", "--max-new-tokens", "2", "--threads", "1")
    assert result.returncode == 0, result.stderr
    assert "1 thread]" in result.stderr


def test_bad_input_through_the_real_entry_point_is_one_line_and_exit_2():
    """The process itself (interpreter, ``__main__``, exit status); every other bad input is
    checked in-process below, through the same ``main``."""
    result = run("x" * 600, "--model", "tiny")
    assert result.returncode == 2
    assert "exceeds the context window of 512 tokens" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def run_in_process(argv: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of `python -m reference generate ARGV`, without starting a process."""
    run = in_process(main, "generate", *argv)
    return run.returncode, run.stderr


@pytest.mark.parametrize("args, message", [
    (["", "--model", "tiny"], "prompt is empty"),
    (["hi", "--model", "tiny", "--max-new-tokens", "-3"], "must be >= 0"),
    (["x" * 600, "--model", "tiny"], "exceeds the context window of 512 tokens"),
    (["hi", "--model", "tiny", "--top-k", "0"], "top_k must be an integer >= 1"),
    (["hi", "--model", "tiny", "--top-k", "-3"], "top_k must be an integer >= 1"),
    (["hi", "--model", "tiny", "--top-p", "0"], "top_p must be in (0, 1]"),
    (["hi", "--model", "tiny", "--top-p", "-1"], "top_p must be in (0, 1]"),
    (["hi", "--model", "tiny", "--top-p", "2"], "top_p must be in (0, 1]"),
    (["hi", "--model", "tiny", "--temperature", "nan"], "temperature must be a finite number"),
    (["hi", "--model", "tiny", "--temperature", "-1"], "temperature must be a finite number"),
    (["hi", "--model", "tiny", "--temperature", "warm"], "invalid float value"),
    (["hi", "--model", "tiny", "--threads", "0"], "must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    code, err = run_in_process(args)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_real_model_chat_answers():
    result = run("What is the capital of France?", "--chat", "--max-new-tokens", "12")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
