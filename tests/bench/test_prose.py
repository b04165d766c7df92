"""The book's measured sentences follow the numbers whatever they show; exercise lists follow
the exercise notebooks."""
import json
import re
from pathlib import Path

import pytest

from reference.bench.prose import (bound_phrase, exercise_list, naive_growth_paragraph, pass_cost_sentence,
                                   shortfall_phrase, speedup_phrase, times_phrase,
                                   verification_sentence)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("ratio, expected", [
    (3.2, "3.2× slower"), (0.5, "2.0× faster"), (1.05, "about as fast"), (0.95, "about as fast"),
    (1.2, "1.2× slower")])
def test_times_phrase_follows_the_ratio(ratio, expected):
    assert times_phrase(ratio) == expected


def test_times_phrase_rejects_non_positive():
    with pytest.raises(ValueError):
        times_phrase(0.0)


def test_growth_is_claimed_when_the_long_step_is_slower():
    text = naive_growth_paragraph(25, 217, 120.0, 840.0, 50.0, 52.0)
    assert "7.0 times as long" in text and "3.75 ms more for every extra position" in text
    assert "grows quadratically" in text and "stayed nearly flat" in text


def test_no_growth_is_claimed_when_the_data_shows_none():
    """The busy-machine case of issue 7: the later steps measured faster."""
    text = naive_growth_paragraph(25, 57, 246.0, 196.0, 60.0, 130.0)
    assert "times as long" not in text and "more for every extra" not in text
    assert "1.3× faster" in text and "did not show the growth" in text
    assert "-" not in re.sub(r"\w-\w", "", text)  # no negative numbers anywhere
    assert "stayed nearly flat" not in text and "2.2× slower" in text


@pytest.mark.parametrize("slow, fast, expected", [
    (10.0, 2.0, "a speed-up of 5.0×"), (2.0, 3.0, "a slow-down of 1.5×"),
    (2.0, 2.05, "no measurable difference")])
def test_speedup_phrase(slow, fast, expected):
    assert speedup_phrase(slow, fast) == expected


def grade_ids(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text())["cells"]
    return [c["metadata"]["nbgrader"]["grade_id"] for c in cells
            if c.get("metadata", {}).get("nbgrader", {}).get("solution")]


@pytest.mark.parametrize("name", ["ch01_naive_decoding", "ch02_kv_cache"])
def test_exercise_list_names_every_graded_exercise_in_order(name):
    notebook = ROOT / "exercises" / f"{name}.ipynb"
    listed = re.findall(r"^- `(\w+)`", exercise_list(notebook), flags=re.M)
    assert listed == grade_ids(notebook) and listed


@pytest.mark.parametrize("chapter, exercises", [
    ("01_naive_decoding", "ch01_naive_decoding"), ("02_kv_cache", "ch02_kv_cache")])
def test_book_chapter_builds_its_exercise_list_from_the_notebook(chapter, exercises):
    """The chapter's exercise section calls exercise_list on its notebook and names no
    exercise by hand."""
    cells = json.loads((ROOT / "book" / f"{chapter}.ipynb").read_text())["cells"]
    code = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert f'exercise_list("../exercises/{exercises}.ipynb")' in code
    markdown = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    exercise_section = markdown[markdown.index("## Exercise"):]
    named = set(re.findall(r"`(\w+)`", exercise_section))
    assert not named & set(grade_ids(ROOT / "exercises" / f"{exercises}.ipynb")), named


def test_pass_cost_near_the_roofline_is_called_nearly_free():
    text = pass_cost_sentence(5, 1.08, 1.0, plain_ratio=1.6)
    assert "1.08×" in text and "rode along" in text, text
    assert "re-packs" in text, "F.linear 1.6× vs packed 1.08× should be explained by re-packing"


def test_pass_cost_far_from_the_roofline_says_the_positions_cost():
    text = pass_cost_sentence(5, 1.83, 1.0, plain_ratio=1.85)
    assert "not free" in text and "rode along" not in text, text
    assert "loses little" in text, "packed and F.linear within 10% must not blame re-packing"


def test_pass_cost_without_a_plain_path_stops_after_the_first_sentence():
    assert "F.linear" not in pass_cost_sentence(8, 1.1, 1.0)
    with pytest.raises(ValueError):
        pass_cost_sentence(8, 0.0, 1.0)


@pytest.mark.parametrize("pass_ratio, speedup, per_pass, words", [
    (1.08, 2.13, 2.42, ["nearly free here, so", "88%"]),
    (1.08, 1.00, 2.42, ["nearly free here, yet", "41%", "work around the passes"]),
    (1.83, 0.95, 2.06, ["not free", "accepted or not", "46%"]),
])
def test_verification_sentence_follows_the_pass_cost_and_the_clock(pass_ratio, speedup, per_pass, words):
    text = verification_sentence(pass_ratio, speedup, per_pass)
    assert all(w in text for w in words), text
    with pytest.raises(ValueError):
        verification_sentence(1.0, 0.0, 2.0)


def test_agreement_phrase_says_exactly_when_the_difference_is_zero():
    from reference.bench.prose import agreement_phrase
    assert agreement_phrase(0.0) == "exactly (bit for bit)"
    assert agreement_phrase(-0.0, cause="float rounding") == "exactly (bit for bit)"
    assert "e+00" not in agreement_phrase(0.0)


def test_agreement_phrase_prints_a_nonzero_difference():
    from reference.bench.prose import agreement_phrase
    assert agreement_phrase(2.2e-16) == "to within 2.2e-16"
    assert agreement_phrase(3.1e-7, cause="float rounding") == "to within 3.1e-07 (float rounding)"
    with pytest.raises(ValueError):
        agreement_phrase(float("nan"))


def test_plural():
    from reference.bench.prose import plural
    assert plural(1, "thread") == "1 thread" and plural(2, "thread") == "2 threads"
    assert plural(0, "split") == "0 splits"


def test_bound_phrase_follows_the_ridge():
    assert bound_phrase(858.4, 295.3) == "compute-bound (858 FLOPs/byte, past the ridge at 295)"
    assert bound_phrase(7.98, 295.3) == "memory-bound (8.0 FLOPs/byte, below the ridge at 295)"
    assert bound_phrase(295.0, 295.3).startswith("memory-bound")
    with pytest.raises(ValueError):
        bound_phrase(1.0, 0.0)


@pytest.mark.parametrize("estimate, actual, expected", [
    (470.0, 564.0, "17% short"), (105.0, 100.0, "5% long"), (99.5, 100.0, "within 1%")])
def test_shortfall_phrase(estimate, actual, expected):
    assert shortfall_phrase(estimate, actual) == expected
