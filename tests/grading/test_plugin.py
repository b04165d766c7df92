"""What a grader applies (rules/plugin.py, feedback.py): teaching messages, points, gates on a
failed prerequisite, costly tests, the order exercises with a memory limit are graded in."""
import pytest
import torch

from autograder.rules import feedback


def test_feedback_messages_teach():
    expected = torch.zeros(2, 3)
    got = expected.clone()
    got[1, 2] = 0.5
    with pytest.raises(AssertionError, match=r"index \[1, 2\]: expected 0, got 0.5"):
        feedback.assert_close(got, expected, name="logits")
    with pytest.raises(AssertionError, match=r"shape \[3\] but should have shape \[2, 3\]"):
        feedback.assert_close(torch.zeros(3), expected, name="logits")
    with pytest.raises(AssertionError, match="NaN"):
        feedback.assert_close(expected / 0, expected, name="logits")
    with pytest.raises(AssertionError, match="should be a torch.Tensor"):
        feedback.assert_close([0.0], expected, name="logits")
    with pytest.raises(AssertionError, match=r"position 2: expected 3, got 9(.|\n)*Hint: off by one"):
        feedback.assert_equal_tokens([1, 2, 9], [1, 2, 3], name="ids", hint="off by one?")
    with pytest.raises(AssertionError, match="has 2 tokens but should have 3"):
        feedback.assert_equal_tokens(torch.tensor([1, 2]), [1, 2, 3], name="ids")
    with pytest.raises(AssertionError, match="is 4 but should be 5"):
        feedback.assert_equal(4, 5, name="n")
    with pytest.raises(AssertionError, match=r"^f\(1\) returned True; expected a float$"):
        feedback.as_number(True, name="f(1)", kind="a float")
    assert feedback.as_number(torch.tensor([2]), name="f(1)") == 2.0
    feedback.assert_close(expected + 1e-7, expected, name="logits")


def test_a_failed_prerequisite_scores_its_whole_exercise_zero(capsys):
    from autograder.rules.feedback import PrerequisiteFailed
    from autograder.local import check
    from autograder.rules.plugin import REGISTRY, TestOutcome, apply_gates, exercise

    outcomes = [TestOutcome("t1", "a", 1, 1, True), TestOutcome("t2", "a", 1, 0, False, "x",
                                                              prerequisite="work tile by tile"),
                TestOutcome("t3", "a", 1, 0, False, "wrong"), TestOutcome("t4", "b", 1, 1, True)]
    apply_gates(outcomes)
    assert [o.score for o in outcomes] == [0, 0, 0, 1]
    assert "work tile by tile" in outcomes[0].message and not outcomes[0].passed
    assert outcomes[2].message == "wrong" and outcomes[3].passed

    @exercise("gated_exercise", points=2)
    def test_right_numbers(learner, seed):
        pass

    @exercise("gated_exercise", points=2)
    def test_the_method(learner, seed):
        raise PrerequisiteFailed("the whole matrix", rule="work tile by tile")

    def gated_exercise():
        return None
    try:
        with pytest.raises(AssertionError, match="the whole matrix"):
            check(gated_exercise, seed=0)
        out = capsys.readouterr().out
        assert "0 points for the tests that pass: work tile by tile" in out and "0/2 points" in out
    finally:
        REGISTRY.pop("gated_exercise")


def test_a_costly_test_is_not_run_after_a_failed_prerequisite(tmp_path):
    """``costly=True``: a slow test (a memory-sized case, a build for the GPUs) does not run once
    an earlier test of its exercise failed its prerequisite, and says why; it runs where none did."""
    from autograder.grading import run_tests
    from autograder.rules.plugin import REGISTRY

    grader = tmp_path / "test_costly_grader.py"
    grader.write_text(
        "from autograder.rules.feedback import PrerequisiteFailed\n"
        "from autograder.rules.plugin import exercise\n"
        "RAN = []\n"
        "@exercise('skips_method', points=2)\n"
        "def test_method(learner, seed):\n"
        "    raise PrerequisiteFailed('two passes', rule='one pass over the keys')\n"
        "@exercise('skips_method', points=2, costly=True)\n"
        "def test_large_case(learner, seed):\n"
        "    RAN.append('skips_method')\n"
        "@exercise('follows_method', points=2)\n"
        "def test_method_held(learner, seed):\n"
        "    pass\n"
        "@exercise('follows_method', points=2, costly=True)\n"
        "def test_large_case_held(learner, seed):\n"
        "    RAN.append('follows_method')\n"
        "    assert False, 'the large case ran'\n")
    try:
        outcomes = {o.name: o for o in run_tests(grader, learner=object(), seed=0)}
    finally:
        for gid in ("skips_method", "follows_method"):
            REGISTRY.pop(gid, None)
    skipped = outcomes["test_large_case"]
    assert skipped.score == 0 and skipped.message.startswith("skipped: not run: one pass over")
    assert "see `test_method`" in skipped.message
    assert outcomes["test_large_case_held"].message.startswith("the large case ran")
    assert outcomes["test_method_held"].score == 1


def test_exercises_with_a_memory_limit_are_graded_last_and_reported_in_file_order(tmp_path):
    """One worker per memory limit: the limited exercises run after the others (highest limit
    first), and the report keeps the grader file's order."""
    from autograder.grading import run_tests
    from autograder.rules.plugin import REGISTRY

    class Learner:
        graded: list[str] = []

        def begin(self, entry):
            self.graded.append(entry.grade_id)

    grader = tmp_path / "test_order_grader.py"
    grader.write_text(
        "from autograder.rules.plugin import exercise\n"
        "@exercise('first_open', points=1)\n"
        "def test_a(learner, seed): pass\n"
        "@exercise('limited_low', points=1, memory_mb=1024)\n"
        "def test_b(learner, seed): pass\n"
        "@exercise('limited_high', points=1, memory_mb=2048)\n"
        "def test_c(learner, seed): pass\n"
        "@exercise('last_open', points=1)\n"
        "def test_d(learner, seed): pass\n")
    learner = Learner()
    try:
        outcomes = run_tests(grader, learner=learner, seed=0)
    finally:
        for gid in ("first_open", "limited_low", "limited_high", "last_open"):
            REGISTRY.pop(gid, None)
    assert learner.graded == ["first_open", "last_open", "limited_high", "limited_low"]
    assert [o.name for o in outcomes] == ["test_a", "test_b", "test_c", "test_d"]



@pytest.mark.parametrize("points, weights", [(5, [1] * 3), (2, [1] * 3), (10, [1] * 6), (4, [1]),
                                             (3, [1] * 7), (2.5, [1] * 4), (10, [1, 1, 2] * 5),
                                             (7, [3, 1, 2])])
def test_an_exercises_points_split_into_whole_hundredths_that_add_up(points, weights):
    from autograder.rules.plugin import points_of_tests
    shares = points_of_tests(points, weights)
    assert all(abs(round(s * 100) - s * 100) < 1e-9 for s in shares)
    assert f"{sum(shares):g}" == f"{points:g}" and abs(sum(shares) - points) < 1e-9
    per_weight = [s / w for s, w in zip(shares, weights)]   # in proportion, to a hundredth
    assert max(per_weight) - min(per_weight) <= 0.0100001, shares
    if weights == [1, 1, 2] * 5:
        assert shares[:3] == [0.5, 0.5, 1.0], shares


def test_a_refusal_names_the_learners_line_and_the_hint_for_the_function_written_there():
    """F.linear of a vector reaches the dispatcher as aten.squeeze_ first: the hint for linear is
    found from the learner's line; an exercise that refuses copies says so instead of
    'indexing'."""
    from autograder.rules.operations import refusal_message
    text = refusal_message("online_softmax", ["aten.squeeze_"],
                           " (line 2 of cell `online_softmax`: y = F.linear(x, w))")
    assert "ran aten.squeeze_ (line 2 of cell `online_softmax`: y = F.linear(x, w))" in text
    assert "aten.linear: a linear layer" in text
    gqa = refusal_message("gqa_attention", ["aten.repeat_interleave"])
    assert "Build it from views" in gqa and "repeat_interleave" in gqa and "indexing" not in gqa
