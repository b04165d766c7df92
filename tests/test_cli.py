"""`python -m reference generate`: streams text, and bad requests end with one line and exit 2."""
import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "reference", "generate", *args],
                          capture_output=True, text=True, timeout=300)


def test_tiny_model_streams_and_reports_speed():
    result = run("hello", "--model", "tiny", "--max-new-tokens", "8")
    assert result.returncode == 0, result.stderr
    assert "tokens/s" in result.stderr and "8 new tokens" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["", "--model", "tiny"], "prompt is empty"),
    (["hi", "--model", "tiny", "--max-new-tokens", "-3"], "must be >= 0"),
    (["x" * 600, "--model", "tiny"], "exceeds the context window of 512 tokens"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = run(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_real_model_chat_answers():
    result = run("What is the capital of France?", "--chat", "--max-new-tokens", "12")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
