"""Self-check variants written as edits of the solution (autograder/solutions/__init__.py)."""
from __future__ import annotations

import re

import pytest

from autograder.solutions import Edit, EditError, apply_edits, split_sections

SOLUTION = """\
def f(x):
    y = x + 1
    z = y * 2
    y = x + 1
    return z
"""

MARKED = """\
# %% grade_id: f
def f(x):
    return x

# %% grade_id: f | wrong: doubles before adding
# expect: add first
# replace:
#     z = y * 2
# with:
#     z = x * 2
#
#     z = z + 0

# replace:
#     return z
# with:

# %% grade_id: f | cheat: full code
def f(x):
    return 0
"""


def test_a_good_edit_gives_the_solution_with_those_lines_replaced():
    edits = (Edit(("    z = y * 2",), ("    z = x * 2", "    # slip")),
             Edit(("def f(x):",), ("def f(x, w=0):",)))
    assert apply_edits(SOLUTION, edits) == SOLUTION.replace(
        "    z = y * 2\n", "    z = x * 2\n    # slip\n").replace("f(x)", "f(x, w=0)")


def test_a_replace_block_missing_from_the_solution_is_an_error_naming_the_variant():
    with pytest.raises(EditError, match=r"ch99\.py:7: `f \| wrong: slip`: replace block 1 "
                                        r"\(line 9\) is not in the solution"):
        apply_edits(SOLUTION, (Edit(("    z = y * 3",), ("    z = 0",), 9),),
                    variant="ch99.py:7: `f | wrong: slip`")


def test_an_ambiguous_replace_block_is_an_error():
    with pytest.raises(EditError, match="occurs 2 times"):
        apply_edits(SOLUTION, (Edit(("    y = x + 1",), ("    y = x",)),))
    # one more line of context makes it unique
    assert "    y = x\n    z = y * 2" in apply_edits(
        SOLUTION, (Edit(("    y = x + 1", "    z = y * 2"), ("    y = x", "    z = y * 2")),))


def test_overlapping_blocks_are_an_error():
    with pytest.raises(EditError, match="overlap"):
        apply_edits(SOLUTION, (Edit(("    y = x + 1", "    z = y * 2"), ("",)),
                               Edit(("    z = y * 2", "    y = x + 1"), ("",))))


def test_marked_edits_are_parsed_with_their_indentation_and_applied_to_the_solution():
    solution, wrong, cheat = split_sections(MARKED, "ch99.py")
    assert not solution.edits and not cheat.edits and cheat.source == "def f(x):\n    return 0\n"
    assert wrong.line == 5 and [e.line for e in wrong.edits] == [7, 14]
    assert wrong.edits[0] == Edit(("    z = y * 2",), ("    z = x * 2", "", "    z = z + 0"), 7)
    assert wrong.edits[1].new == ()  # an empty `with`: the lines are deleted
    applied = wrong.applied_to(SOLUTION, "ch99.py")
    assert not applied.edits and applied.label == wrong.label
    assert applied.source == ("# expect: add first\ndef f(x):\n    y = x + 1\n    z = x * 2\n\n"
                              "    z = z + 0\n    y = x + 1\n")
    with pytest.raises(EditError, match=r"ch99\.py:5: `f \| wrong: doubles before adding`: "
                                        r"replace block 2 \(line 14\) is not in the solution"):
        wrong.applied_to(SOLUTION.replace("return z", "return z + 0"), "ch99.py")


@pytest.mark.parametrize("body, message", [
    ("# replace:\n#     x = 1\n", "without its `# with:`"),
    ("# with:\n#     x = 1\n", "without a `# replace:`"),
    ("x = 1\n# replace:\n#     x = 1\n# with:\n", "code before `# replace:`"),
    ("# replace:\n    x = 1\n# with:\n", "'# ' + the code line"),
])
def test_badly_written_edits_are_refused(body, message):
    with pytest.raises(EditError, match=r"ch99\.py:\d+: `f \| wrong: w`: .*" + re.escape(message)):
        split_sections("# %% grade_id: f | wrong: w\n" + body, "ch99.py")


def test_a_solution_section_is_never_read_as_an_edit():
    (section,) = split_sections("# %% grade_id: f\n# replace:\n#   x\n# with:\n#   y\nx = 1\n")
    assert section.edits == () and section.source.endswith("x = 1\n")
