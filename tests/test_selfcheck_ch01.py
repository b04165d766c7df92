"""Self-check of the chapter 01 grader through the command-line autograder.

The untouched stub scores 0, the solutions score full marks, and every known-wrong or cheating
submission in tests/submissions/ch01_naive_decoding.py loses points on its exercise.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

CHAPTER = "ch01_naive_decoding"

_spec = importlib.util.spec_from_file_location(
    "_selfcheck_harness", Path(__file__).parent / "submissions" / "selfcheck.py")
selfcheck = sys.modules.setdefault("_selfcheck_harness", importlib.util.module_from_spec(_spec))
if not hasattr(selfcheck, "grade_chapter"):
    _spec.loader.exec_module(selfcheck)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return selfcheck.graded_chapter(CHAPTER, tmp_path_factory)


def test_every_exercise_has_a_known_wrong_and_a_cheat():
    kinds = selfcheck.variants(CHAPTER)
    solutions = set(selfcheck.load_solutions(CHAPTER))
    for kind in ("wrong", "cheat"):
        assert set(kinds.get(kind, {})) == solutions, f"{kind} variants missing for some exercise"


@pytest.mark.slow
def test_untouched_stub_scores_zero(graded):
    score, best = graded["stub"].total
    assert best > 0 and score == 0, graded["stub"].points


@pytest.mark.slow
def test_solutions_score_full_marks(graded):
    result = graded["solution"]
    assert set(result.points) == set(result.injected)
    for gid, (score, best) in result.points.items():
        assert best > 0 and score == best, f"{gid}: {score}/{best}\n" + "\n".join(result.messages(gid))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wrong", "cheat"])
def test_known_wrong_and_cheating_submissions_lose_points(graded, kind):
    checked = 0
    for name, result in graded.items():
        if not name.startswith(kind + "_"):
            continue
        for gid, section in result.injected.items():
            score, best = result.points[gid]
            assert score < best, f"{name} `{gid}` ({section.label}) scored full marks {score}/{best}"
            messages = result.messages(gid)
            for text in selfcheck.expectations(section):
                assert any(text in m for m in messages), (
                    f"{name} `{gid}` ({section.label}): no failure message mentions {text!r}:\n"
                    + "\n".join(messages))
            checked += 1
    assert checked == sum(len(v) for v in selfcheck.variants(CHAPTER)[kind].values())
    print("\n" + selfcheck.describe({n: r for n, r in graded.items() if n.startswith(kind)}))
