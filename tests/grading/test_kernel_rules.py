"""What a Triton kernel cell may be (rules/kernel_rules.py): Triton code only, no plain Python
helpers, required calls where they run, tile loops, the interpreter's internals out of reach."""
import ast
import types

import pytest


KERNEL_HEAD = '''import triton
import triton.language as tl


@triton.jit
def kern(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n).to(tl.float32)
'''


@pytest.mark.parametrize("body, why", [
    ("    tl.store(out_ptr + offsets, x, mask=offsets < n)\n", None),
    ("    helper()\n", "not a Triton call"),
    ("    tl.store(out_ptr + offsets, x.__class__)\n", "__class__"),
    ("    y = x_ptr.handle.data\n", "not an attribute of a Triton tensor"),
    ("    y = tl.core.inspect.currentframe()\n", "inspect"),
    ("    y = tl.core.knobs\n", "not part of Triton's language"),
    ("    y = triton.runtime.interpreter\n", "not part of Triton's language"),
    ("    y = __builtins__\n", "__builtins__"),
    ("    y = getattr(x, 'hand' + 'le')\n", "getattr"),
    ("    y = gc.get_objects()\n", "gc"),
    ("    y = (lambda: 0)()\n", "Lambda"),
    ("    y = LOOKUP\n", "not defined in this cell"),
])
def test_kernel_cells_must_be_triton_code(body, why):
    from autograder.rules.kernel_rules import cell_problem
    problem = cell_problem(KERNEL_HEAD + body, "kern")
    assert (problem is None) if why is None else (why in problem), problem


def test_a_kernel_cell_holds_no_plain_python_helpers_or_other_imports():
    from autograder.rules.kernel_rules import cell_problem
    helper = "import sys\n\n\ndef helper():\n    return sys._getframe().f_back\n\n\n"
    problem = cell_problem(helper + KERNEL_HEAD + "    helper()\n", "kern")
    assert "`helper` is a plain Python function" in problem and "not `sys`" in problem


def test_required_calls_count_only_where_they_run_and_loops_step_whole_tiles():
    from autograder.rules.kernel_rules import loop_problem, reachable_calls, require_tile_loop

    def dots(body):
        calls = reachable_calls(KERNEL_HEAD + body, "kern")
        return sum(ast.unparse(c.func) == "tl.dot" for c in calls)
    assert dots("    y = tl.dot(x, x)\n") == 1
    assert dots("    if BLOCK < 0:\n        y = tl.dot(x, x)\n") == 0
    assert dots("    if BLOCK > 16:\n        y = tl.dot(x, x)\n    else:\n        y = tl.dot(x, x)\n") == 1
    assert dots("    if n > 3:\n        y = tl.dot(x, x)\n") == 1          # decided at run time
    assert dots("    return\n    y = tl.dot(x, x)\n") == 0
    for loop, ok in [("range(0, n, BLOCK)", True), ("range(0, tl.cdiv(n, BLOCK))", True),
                     ("range((n + BLOCK - 1) // BLOCK)", True), ("range(0, n)", False),
                     ("range(0, n + 0 * BLOCK)", False), ("range(0, n, 1 + 0 * BLOCK)", False)]:
        problem = loop_problem(KERNEL_HEAD + f"    for i in {loop}:\n        x = x + 1\n", "kern",
                               "BLOCK")
        assert (problem is None) == ok, (loop, problem)
    for count, ok in [("    n_tiles = tl.cdiv(n, BLOCK)\n", True),                 # a name set once
                      ("    n_tiles = tl.cdiv(n, BLOCK)\n    n_tiles += n\n", False),  # set again
                      ("    n_tiles = n\n", False)]:
        problem = loop_problem(KERNEL_HEAD + count + "    for i in range(0, n_tiles):\n        x = x + 1\n",
                               "kern", "BLOCK")
        assert (problem is None) == ok, (count, problem)
    stepping_keys = KERNEL_HEAD + "    for i in range(0, n):\n        x = x + 1\n"
    learner = types.SimpleNamespace(cell_source=lambda name: stepping_keys)
    with pytest.raises(AssertionError, match=r"^kern: line 9: .* one tile of BLOCK keys at a "
                                             r"time\. Use tiles$"):
        require_tile_loop(learner, "kern", "BLOCK", "Use tiles")


def test_a_kernel_source_without_its_imports_uses_the_usual_names():
    from autograder.rules.kernel_rules import cell_problem
    kernel_only = KERNEL_HEAD.split("\n\n\n", 1)[1] + "    tl.store(out_ptr + offsets, x)\n"
    assert cell_problem(kernel_only, "kern") is None


ONE_PASS = '''import triton
import triton.language as tl

@triton.jit
def k(x, out, n, BLOCK: tl.constexpr):
    m = float("-inf")
    s = 0.0
    for start in range(0, n, BLOCK):
        v = tl.load(x + start + tl.arange(0, BLOCK))
        m_new = tl.maximum(m, tl.max(v, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(v - m_new), 0)
        m = m_new
    tl.store(out, s)
'''


TWO_PASS = '''import triton
import triton.language as tl

@triton.jit
def k(x, out, n, BLOCK: tl.constexpr):
    m = float("-inf")
    for start in range(0, n, BLOCK):
        m = tl.maximum(m, tl.max(tl.load(x + start + tl.arange(0, BLOCK)), 0))
    s = 0.0
    for start in range(0, n, BLOCK):
        s += tl.sum(tl.exp(tl.load(x + start + tl.arange(0, 128)) - m), 0)
    tl.store(out, s)
'''


def test_kernel_rules_find_the_loops_and_fixed_tiles():
    """The static looks left as early messages (a second pass is seen in the traffic:
    tests/grading/test_autograder_triton.py)."""
    from autograder.rules.kernel_rules import fixed_size_aranges, key_loops
    assert len(key_loops(ONE_PASS, "k")) == 1 and len(key_loops(TWO_PASS, "k")) == 2
    assert fixed_size_aranges(ONE_PASS, "k") == []
    assert len(fixed_size_aranges(TWO_PASS, "k")) == 1 and "128" in fixed_size_aranges(TWO_PASS, "k")[0]


@pytest.mark.parametrize("cell, named", [
    ("import triton.runtime.interpreter as ti\n", "`interpreter`"),
    ("from triton.runtime import interpreter\n", "`interpreter`"),
    ("B = __import__('triton').runtime.InterpreterBuilder\n", "`InterpreterBuilder`"),
    ("x = 'triton.runtime.Interpreter'\n", "`interpreter`"),
    ("def f(b):\n    b.create_masked_load = None\n", "`create_masked_load`"),
    ("def f():\n    'runs in the interpreter'\n    return 1\n", None),
])
def test_a_cell_naming_the_interpreters_internals_stops_every_kernel(cell, named):
    from autograder.rules.kernel_rules import interpreter_reach
    problem = interpreter_reach([("kern", KERNEL_HEAD), ("other", cell)])
    assert (problem is None) if named is None else (named in problem and "`other`" in problem), problem

