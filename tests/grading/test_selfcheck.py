"""Self-check of every chapter grader through the command-line autograder.

For each chapter with submissions in tests/submissions/<chapter>.py: the untouched stub scores 0,
the solutions score full marks, and every known-wrong or cheating submission loses points on its
exercise and is told why (its `# expect:` text).
"""
from __future__ import annotations

import pytest

import selfcheck

# A chapter's first test grades the chapter in one CLI run: its limit is that run's hang guard
# (selfcheck.CLI_SECONDS), not pytest's usual per-test timeout.
pytestmark = pytest.mark.timeout(selfcheck.CLI_SECONDS)
CHAPTERS = sorted(p.stem for p in selfcheck.SUBMISSIONS.glob("ch[0-9][0-9]_*.py"))


# Each chapter's tests run in one xdist worker (its group), which grades the chapter once.
@pytest.fixture(scope="module", params=[pytest.param(c, marks=pytest.mark.xdist_group(f"selfcheck-{c}"))
                                        for c in CHAPTERS])
def chapter(request):
    return request.param


@pytest.fixture(scope="module")
def graded(chapter, tmp_path_factory):
    return selfcheck.graded_chapter(chapter, tmp_path_factory)


def test_every_chapter_with_exercises_has_submissions():
    exercises = {p.stem for p in (selfcheck.ROOT / "exercises").glob("ch[0-9][0-9]_*.ipynb")}
    assert exercises and exercises == set(CHAPTERS)


def test_every_exercise_has_a_known_wrong_and_a_cheat(chapter):
    kinds = selfcheck.variants(chapter)
    solutions = set(selfcheck.load_solutions(chapter))
    for kind in ("wrong", "cheat"):
        assert set(kinds.get(kind, {})) == solutions, f"{kind} variants missing for some exercise"


def test_edited_variants_fit_their_solutions(chapter):
    """``variants`` applies each `# replace:` / `# with:` variant to its solution section and
    raises (naming the variant) when a replace block is missing there or ambiguous; no
    variant's code may come out as the solution itself."""
    def code(source):
        lines = source.splitlines()
        while lines and lines[0].startswith("#"):
            lines.pop(0)
        return "\n".join(lines).strip()

    solutions = selfcheck.load_solutions(chapter)
    for per_exercise in selfcheck.variants(chapter).values():
        for gid, sections in per_exercise.items():
            for section in sections:
                assert code(section.source) != code(solutions[gid]), f"{section.name} is the solution"


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
def test_known_wrong_and_cheating_submissions_lose_points(chapter, graded, kind):
    checked = 0
    for name, result in graded.items():
        if not name.startswith(kind + "_"):
            continue
        for gid, section in result.injected.items():
            score, best = result.points[gid]
            assert score < best, f"{name} `{gid}` ({section.label}) scored full marks {score}/{best}"
            wanted = selfcheck.expected_score(section)
            assert wanted is None or abs(score - wanted) < 1e-6, (
                f"{name} `{gid}` ({section.label}) scored {score:g}/{best:g}, not {wanted:g}:\n"
                + "\n".join(result.messages(gid)))
            messages = result.messages(gid)
            for text in selfcheck.expectations(section):
                assert any(text in m for m in messages), (
                    f"{name} `{gid}` ({section.label}): no failure message mentions {text!r}:\n"
                    + "\n".join(messages))
            checked += 1
    assert checked == sum(len(v) for v in selfcheck.variants(chapter)[kind].values())
    print("\n" + selfcheck.describe({n: r for n, r in graded.items() if n.startswith(kind)}))


@pytest.mark.xdist_group("selfcheck-ch12_serving_capstone")
@pytest.mark.parametrize("chapter", ["ch12_serving_capstone"], indirect=True)
def test_the_capstone_report_shows_its_service_table_when_it_passes(graded):
    """The side-by-side service table (yours, the course's, each measure's cost and the balance
    that full marks need) is in the report of every trace, a passing one too."""
    tests = [t for t in graded["solution"].report["tests"] if "service_level" in t["name"]]
    assert tests and all(t["status"] == "passed" for t in tests), tests
    for test in tests:
        assert all(word in test["output"] for word in ("yours", "course", "TTFT p90", "balance")), test
