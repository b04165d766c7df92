"""Fast tests of the autograder's parts: notebook reading, protocol, feedback, plugin, check."""
import ast
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from autograder.rules import feedback
from autograder.local import LocalLearner
from autograder.notebook import (NotebookError, chapter_of, inject, read_notebook,
                                 solution_cells)
from autograder.boundary.protocol import MAX_MESSAGE, HEADER, ProtocolError, decode, encode, read_message
from autograder.boundary.refs import CacheRef, Handle, ModelRef, from_wire, to_wire
from autograder.boundary.store import ReferenceStore

ROOT = Path(__file__).resolve().parents[2]


def solution(grade_id, source):
    meta = {"nbgrader": {"solution": True, "grade": False, "locked": False, "grade_id": grade_id,
                         "points": 1, "schema_version": 3}}
    return {"cell_type": "code", "metadata": meta, "source": source, "outputs": [],
            "execution_count": None}


def notebook(*cells, chapter=None):
    meta = {"course": {"chapter": chapter}} if chapter else {}
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": meta, "cells": list(cells)}


def test_solution_cells_accept_list_and_string_sources_and_skip_others():
    nb = notebook({"cell_type": "markdown", "source": "# hi"}, solution("a", ["x = 1\n", "y = 2"]),
                  {"cell_type": "code", "source": "z = 3"}, solution("b", "def b(): pass"),
                  {"cell_type": "code", "metadata": {"nbgrader": "junk"}})
    assert solution_cells(nb) == [("a", "x = 1\ny = 2"), ("b", "def b(): pass")]
    assert solution_cells({"cells": []}) == []


def test_invalid_json_and_non_notebooks_give_clear_errors(tmp_path):
    (tmp_path / "broken.ipynb").write_text('{"cells": [')
    (tmp_path / "list.ipynb").write_text("[1, 2]")
    with pytest.raises(NotebookError, match="not valid notebook JSON.*line 1"):
        read_notebook(tmp_path / "broken.ipynb")
    with pytest.raises(NotebookError, match="not a notebook"):
        read_notebook(tmp_path / "list.ipynb")
    (tmp_path / "nocells.ipynb").write_text("{}")
    assert read_notebook(tmp_path / "nocells.ipynb")["cells"] == []


def test_chapter_from_metadata_then_file_name_then_grade_ids():
    nb = notebook(solution("naive_generate", ""))
    assert chapter_of(notebook(chapter="ch02_kv_cache"), "ch01_x.ipynb") == "ch02_kv_cache"
    assert chapter_of(nb, "alice_ch01.ipynb") == "ch01"
    chapters = {"ch01_naive_decoding": ["naive_generate"], "ch02_kv_cache": ["KVCache"]}
    assert chapter_of(nb, "submission.ipynb", chapters) == "ch01_naive_decoding"
    assert chapter_of(notebook(), "submission.ipynb", chapters) is None


def test_inject_replaces_only_the_named_solution_cells(tmp_path):
    nb = notebook(solution("a", "old a"), solution("b", "old b"))
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    injected = inject(path, {"a": "new a"})
    assert solution_cells(injected) == [("a", "new a"), ("b", "old b")]
    assert solution_cells(nb) == [("a", "old a"), ("b", "old b")]  # the input is not modified
    with pytest.raises(KeyError, match="zzz"):
        inject(nb, {"zzz": ""})


def test_protocol_round_trip_of_plain_data_and_markers():
    store = ReferenceStore()
    refs = to_wire([ModelRef("tiny", 3), CacheRef(3, 16), Handle(7)], store.register)
    value = {"t": torch.arange(6).reshape(2, 3)[:, 1], "xs": [1, 2.5, "s", None, (True,)],
             "refs": refs}
    data = encode(value)
    (size,) = HEADER.unpack(data[:HEADER.size])
    back = decode(data[HEADER.size:])
    assert size == len(data) - HEADER.size
    assert torch.equal(back["t"], torch.tensor([1, 4])) and back["xs"] == value["xs"]
    assert from_wire(back["refs"][2]) == Handle(7)
    model, cache = from_wire(back["refs"][:2])
    assert (model.kind, cache.kind) == ("model", "cache") and store.get(cache).max_len == 16
    with pytest.raises(TypeError, match="store"):
        to_wire(ModelRef("tiny", 3))
    with pytest.raises(ValueError, match="unexpected marker"):
        from_wire({"__autograder__": "model"})


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_protocol_refuses_pickled_objects_and_oversized_messages():
    import io
    import pickle
    with pytest.raises(ProtocolError, match="unreadable"):
        decode(pickle.dumps(Path("/etc/passwd")))
    buffer = io.BytesIO()
    torch.save({"obj": Path("/")}, buffer)  # an arbitrary object inside torch.save
    with pytest.raises(ProtocolError):
        decode(buffer.getvalue())
    read_fd, write_fd = __import__("os").pipe()
    __import__("os").write(write_fd, HEADER.pack(MAX_MESSAGE + 1))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        read_message(read_fd)


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


def test_local_learner_and_check_report_points(capsys):
    namespace = {}
    exec((ROOT / "tests/fixtures/add_solution.py").read_text(), namespace)
    learner = LocalLearner(namespace)
    counter = learner.new("Counter", 1)
    learner.method(counter, "bump")
    assert isinstance(counter, Handle) and learner.getattr(counter, "value") == 2
    sys.path.insert(0, str(ROOT / "tests/fixtures"))
    try:
        __import__("add_grader")
    finally:
        sys.path.remove(str(ROOT / "tests/fixtures"))
    from autograder import check

    def add(a, b):
        raise NotImplementedError()
    with pytest.raises(AssertionError, match="add: 2 of 2 tests fail(.|\n)*not implemented yet"):
        check(add)
    out = capsys.readouterr().out  # every line is printed before the error
    assert "✗ test_add_ints" in out and "✗ test_add_tensors" in out and "0/2 points" in out
    check(namespace["last_logits"])
    assert "1/1 points" in capsys.readouterr().out


def test_cli_help_lists_the_options():
    out = subprocess.run([sys.executable, "-m", "autograder", "grade", "--help"], cwd=ROOT,
                         capture_output=True, text=True).stdout
    for option in ("--json", "--csv", "--jobs", "--timeout", "--memory-mb", "--seed", "--tests"):
        assert option in out


def test_check_counts_a_skipped_test_as_a_failure(capsys):
    import pytest as _pytest
    from autograder.local import check
    from autograder.rules.plugin import REGISTRY, exercise

    @exercise("skipper_exercise", points=1)
    def test_skips(learner, seed):
        _pytest.skip("needs a GPU")

    def skipper_exercise():
        return None
    try:
        with pytest.raises(AssertionError, match="skipped: needs a GPU"):
            check(skipper_exercise, seed=0)
        assert "✗ test_skips" in capsys.readouterr().out
    finally:
        REGISTRY.pop("skipper_exercise")


def test_exercise_timeout_replaces_the_call_limit_and_forbid_is_enforced():
    from autograder.rules.plugin import Exercise
    from autograder.sandbox import SandboxLearner
    cells = [("spin", "import time\ndef spin():\n    time.sleep(30)"),
             ("fused", "def fused(q):\n    return F.scaled_dot_product_attention(q, q, q)")]
    learner = SandboxLearner(cells, timeout=30,
                             forbid=["torch.nn.functional.scaled_dot_product_attention"])
    try:
        learner.begin(Exercise("spin", 1, timeout=1))
        with pytest.raises(AssertionError, match="timed out after 1 s"):
            learner.call("spin")
        learner.begin(Exercise("fused", 1, forbid=(
            "torch.nn.functional.scaled_dot_product_attention",)))
        with pytest.raises(AssertionError, match="scaled_dot_product_attention` is forbidden"):
            learner.call("fused", torch.randn(1, 1, 2, 4))
        learner.begin(Exercise("fused", 1))  # allowed in another exercise
        assert learner.call("fused", torch.randn(1, 1, 2, 4)).shape == (1, 1, 2, 4)
    finally:
        learner.close()


def test_forbidding_a_tensor_method_refuses_it_under_any_spelling():
    from autograder.boundary.guard import ForbiddenFunctionError, Guard
    guard = Guard(["torch.Tensor.softmax"]).install()
    x = torch.randn(3)
    try:
        assert torch.equal(x.softmax(-1), torch.softmax(x, -1))  # installed but not active
        with guard.forbidding(["torch.Tensor.softmax"]):
            for spelled in (lambda: x.softmax(-1), lambda: getattr(x, "soft" + "max")(-1),
                            lambda: torch.Tensor.softmax(x, -1)):
                with pytest.raises(ForbiddenFunctionError, match="torch.Tensor.softmax"):
                    spelled()
    finally:
        guard.uninstall()
    assert torch.equal(x.softmax(-1), torch.softmax(x, -1))


def test_static_look_names_forbidden_functions_but_not_in_docstrings():
    from autograder.rules.forbid import uses_in_source
    name = ["torch.nn.functional.scaled_dot_product_attention"]
    doc = 'def f(q):\n    """Do not call scaled_dot_product_attention."""\n    return q  # nor here'
    assert uses_in_source(doc, name) == []
    for source in ("y = F.scaled_dot_product_attention(q, k, v)",
                   "from torch.nn.functional import scaled_dot_product_attention as a",
                   "f = getattr(F, 'scaled_dot_product_attention')"):
        assert uses_in_source(source, name) == name, source


def test_the_static_look_refuses_the_ways_around_a_forbidden_name():
    from autograder.rules.forbid import detours_in_source
    honest = ("import math\nimport torch\n\n\ndef _helper(x):\n    return x\n\n\n"
              "def f(q):\n    return _helper(torch.exp(q - q.amax(-1, keepdim=True)))")
    assert detours_in_source(honest, "f") == []
    for source, word in (("f = torch.ops.aten._softmax", "ops"),
                         ("f = getattr(torch, 'soft' + 'max')", "getattr"),
                         ("f = torch._scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu"),
                         ("from torch._C import _VariableFunctions", "_C"),
                         ("f = F.softmax.__wrapped__", "__wrapped__"),
                         ("import importlib", "importlib"),
                         ("f = vars(torch)['softmax']", "vars")):
        assert word in detours_in_source(source, "f"), source
    kernel = ("import triton\n\n\n@triton.jit\ndef k(x_ptr):\n    y = tl._private\n\n\n"
              "z = torch.ops")
    assert detours_in_source(kernel, "k") == ["ops"]        # jit bodies: kernel_rules' business
    assert "_private" in detours_in_source(kernel, "other")  # not a kernel exercise: all of it


def test_the_static_look_knows_the_routes_that_need_no_forbidden_name():
    """Name resolvers and introspection of the standard library are detours too, imported or
    reached as an attribute; a cell's own private names are not, unless a library has them."""
    from autograder.rules.forbid import detours_in_source
    for source, word in (
            ("import pkgutil\nm = pkgutil.resolve_name('torch.utils.x:y')", "pkgutil"),
            ("from traceback import walk_stack", "traceback"),
            ("import string\nf = string.Formatter().get_field('0.x', [1], {})", "string"),
            ("import pickle", "pickle"),
            ("import os\nm = os.sys", "sys"),
            ("t = typing.get_type_hints(f)", "get_type_hints"),
            ("x = frame.f_back.f_locals", "f_locals")):
        assert word in detours_in_source(source, "f"), source
    own = ("class K:\n    def __init__(self):\n        self._used = [0]\n\n"
           "    def _grow(self):\n        return self._used\n\n"
           "    def f(self):\n        return self._grow()")
    assert detours_in_source(own, "f") == []
    borrowed = ("class K:\n    def __init__(self):\n        self._C = 1\n"
                "        self._python_dispatch = 2\n\n"
                "    def f(self):\n        return torch.utils._python_dispatch, torch._C")
    assert detours_in_source(borrowed, "f") == ["_C", "_python_dispatch"]


def test_recorded_exercises_and_kernels_get_the_static_look_too():
    """An exercise that forbids nothing still has its cell looked at when its verdict rests on a
    record kept in the learner's process: a RECORDED one's memory, a kernel's traffic."""
    from autograder.rules.plugin import Exercise, records_in_process
    kernel = "import triton\n\n\n@triton.jit\ndef k(x_ptr):\n    pass"
    assert records_in_process(Exercise("KVCache", 4), "class KVCache: pass")
    assert records_in_process(Exercise("k", 4), kernel)
    assert records_in_process(Exercise("f", 2, forbid=("torch.softmax",)), "")
    assert not records_in_process(Exercise("naive_work", 2), "def naive_work(n): return n")


def test_the_audit_wall_refuses_introspection_only_to_learner_code(tmp_path):
    """In a process of its own (an audit hook stays): a cell's code asking for the garbage
    collector, frames, ctypes or pickled classes is refused, library code doing so for itself
    is not, nor is the same code outside learner calls (tests/fixtures/audit_probe.py)."""
    run = subprocess.run([sys.executable, str(ROOT / "tests/fixtures/audit_probe.py"),
                          str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    verdicts = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    assert verdicts == {"gc": "refused", "walk_stack": "refused", "tb_frame": "refused",
                        "cast": "refused", "from_address": "refused", "pickle": "refused",
                        "namedtuple": "allowed", "library": "allowed", "outside": "allowed"}


def test_the_static_look_refuses_the_exits_of_tensor_data_from_torch():
    """numpy, .tolist(), raw storage and DLPack as attribute or imported names, and the array
    libraries imported, are refused with a message of their own; .item(), float(t) and a
    variable called storage are not."""
    from autograder.rules.forbid import detour_message, detours_in_source
    honest = ("def f(x):\n    storage = x.clone()\n    n = int(x.shape[0])\n"
              "    return storage * x.amax().item() + float(x[0])")
    assert detours_in_source(honest, "f") == []
    for source, word in (("a = x.numpy()", "numpy"), ("a = x.tolist()", "tolist"),
                         ("a = torch.from_numpy(b)", "from_numpy"), ("p = x.data_ptr()", "data_ptr"),
                         ("s = x.untyped_storage()", "untyped_storage"), ("import numpy as np", "numpy"),
                         ("from torch.utils.dlpack import to_dlpack", "to_dlpack"),
                         ("import scipy.special", "scipy.special"), ("import struct", "struct"),
                         ("from array import array", "array"), ("torch.save(x, path)", "save")):
        assert word in detours_in_source(source, "f"), source
    message = detour_message("f", ["numpy", "getattr"])
    assert "a way of taking tensor data out of torch" in message and "use torch operations" in message
    assert "computed names" in message
    # past the doors to torch._C's methods; super() without arguments stays
    assert "super(type, obj)" in detours_in_source("def f(t):\n    return super(torch.Tensor, t).tolist()")
    assert detours_in_source("class M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()") == []
    # in another exercise's cell, all but .tolist()
    from autograder.rules.forbid import detours_in_other_cell
    assert detours_in_other_cell("ids = out.tolist()", "naive_generate") == ()
    assert {"_C", "numpy"} <= set(detours_in_other_cell("a = x.numpy()\nb = torch._C.TensorBase",
                                                         "naive_generate"))


def test_the_exits_wall_refuses_numpy_and_dlpack_only_to_learner_code_under_a_limit(tmp_path):
    """In a process of its own (the doors stay wrapped): a cell handing a tensor to numpy
    (np.asarray, a numpy function, np.from_dlpack, x.numpy()) or to Python lists (x.tolist()),
    or making a tensor over memory from outside torch (torch.frombuffer), under an operation
    limit is refused, and the refusal is kept in the limit even when the cell
    catches it; printing a tensor (its values counted as reads), library code doing the same for
    itself, and the cell outside a limit are not (tests/fixtures/exits_probe.py)."""
    run = subprocess.run([sys.executable, str(ROOT / "tests/fixtures/exits_probe.py"),
                          str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    verdicts, recorded = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    assert verdicts == {"asarray": "refused", "repeat": "refused", "from_dlpack": "refused",
                        "numpy": "refused", "tolist": "refused", "frombuffer": "refused",
                        "caught": "allowed",
                        "printed": "allowed", "library": "allowed", "no limit": "allowed"}
    assert recorded == {"asarray": ["torch.Tensor.__array__"], "repeat": ["torch.Tensor.__array__"],
                        "from_dlpack": ["torch.Tensor.__dlpack__"], "numpy": ["torch.Tensor.numpy"],
                        "tolist": ["torch.Tensor.tolist"], "frombuffer": ["torch.frombuffer"],
                        "caught": ["torch.Tensor.__array__"],
                        "printed": ["reads 6"], "library": []}


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


def test_a_function_still_at_its_stub_fails_unrun_and_anything_else_runs():
    from autograder.sandbox import untouched_stub
    stub = 'def f(x):\n    """Doc."""\n    raise NotImplementedError("write f")\n'
    assert untouched_stub([("f", stub)], "f")
    assert untouched_stub([("f", "import torch\n\n\ndef f(x):\n    raise NotImplementedError\n")], "f")
    done = "def f(x):\n    return x\n"
    for cells in ([("f", done)],                                         # written
                  [("f", stub), ("g", "def g():\n    pass\nf = g\n")],  # bound again elsewhere
                  [("f", stub + "f = lambda x: x\n")],                  # bound again in its cell
                  [("f", "def f(x):\n    if x:\n        raise NotImplementedError\n    return 1\n")],
                  [("f", stub), ("f", done)],                            # graded twice
                  [("g", stub)]):                                        # not its exercise's cell
        assert not untouched_stub(cells, "f"), cells


def test_an_exercise_memory_limit_applies_while_it_is_graded():
    from autograder.rules.plugin import Exercise
    from autograder.sandbox import SandboxLearner
    cells = [("grab", "import torch\ndef grab(mb):\n    return float(torch.ones(mb * 2**18).sum())")]
    learner = SandboxLearner(cells, timeout=30, memory_mb=4096)
    try:
        learner.begin(Exercise("grab", 1))
        assert learner.memory_limit_mb == 4096 and learner.call("grab", 1200) == 1200 * 2**18
        learner.begin(Exercise("grab", 1, memory_mb=1024))
        assert learner.memory_limit_mb == 1024
        with pytest.raises(AssertionError, match=r"memory limit \(1024 MB\)"):
            learner.call("grab", 1200)
        learner.begin(Exercise("grab", 1))      # the next exercise gets the whole limit back
        assert learner.call("grab", 1200) == 1200 * 2**18
    finally:
        learner.close()


def test_an_honest_model_forward_loop_passes_cached_generate(capsys):
    from autograder.local import base_namespace, check
    from autograder.solutions import load_solutions
    source = load_solutions("ch02_kv_cache")["cached_generate"].replace("model(", "model.forward(")
    assert "model.forward(" in source
    namespace = base_namespace()
    exec(source, namespace)
    check(namespace["cached_generate"], seed=5)  # raises AssertionError if a test fails
    assert "all tests pass" in capsys.readouterr().out


def test_the_grader_side_store_refuses_bad_or_excessive_requests():
    store = ReferenceStore()
    model = store.register(ModelRef("tiny", 0))

    def ask(method, *args, target=model):
        return store.handle({"id": target.id, "method": method, "args": args, "kwargs": {}})
    assert ask("forward", torch.tensor([[1, 2]]))["ok"] and len(store.trace) == 1
    for bad in (torch.tensor([[1.5]]), torch.tensor([[999]]), torch.zeros(9, 1, dtype=torch.long)):
        assert not ask("forward", bad)["ok"]
    assert "no method" in ask("__class__")["error"] and "no method" in ask("state_dict")["error"]
    assert not ask("forward", torch.tensor([[1]]), None, {"__autograder__": "remote",
                                                          "kind": "model", "id": model.id})["ok"]
    replies = [ask("new_cache", 1, 4) for _ in range(300)]
    assert replies[0]["ok"] and "more than" in replies[-1]["error"]


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
    stepping_keys = KERNEL_HEAD + "    for i in range(0, n):\n        x = x + 1\n"
    learner = types.SimpleNamespace(cell_source=lambda name: stepping_keys)
    with pytest.raises(AssertionError, match=r"^kern: line 9: .* one tile of BLOCK keys at a "
                                             r"time\. Use tiles$"):
        require_tile_loop(learner, "kern", "BLOCK", "Use tiles")


def test_every_forward_is_recorded_with_its_model_whatever_cache_it_goes_into():
    store = ReferenceStore()
    target, draft = ModelRef("tiny", 0), ModelRef("tiny", 0, role="draft")
    remotes = [store.register(m) for m in (target, draft)]
    assert remotes[0].id != remotes[1].id == store.model_id(draft)
    made = store.handle({"id": remotes[0].id, "method": "new_cache", "args": (1, 8), "kwargs": {}})
    cache = {"__autograder__": "remote", "kind": "cache", "id": made["value"]["id"]}
    for remote, kwargs in ((remotes[0], {"cache": cache}), (remotes[1], {})):
        assert store.handle({"id": remote.id, "method": "forward", "args": (torch.tensor([[1, 2]]),),
                             "kwargs": kwargs})["ok"]
    assert [(f.model, f.cache) for f in store.trace] == [(store.model_id(target), cache["id"]),
                                                         (store.model_id(draft), None)]


def test_a_kernel_source_without_its_imports_uses_the_usual_names():
    from autograder.rules.kernel_rules import cell_problem
    kernel_only = KERNEL_HEAD.split("\n\n\n", 1)[1] + "    tl.store(out_ptr + offsets, x)\n"
    assert cell_problem(kernel_only, "kern") is None


def test_what_the_worker_is_shown_and_what_is_masked(tmp_path):
    """The allow-list: masking ``readable_cover(shown)`` leaves exactly the shown folders (and
    the folders on the way to them) readable; ``readable`` carves a hidden folder out of a
    shown one, for Landlock's read rules."""
    from autograder.boundary.confine import readable, readable_cover
    for path in ("home/a/venv/lib", "home/a/course/autograder/solutions", "home/b", "srv/x",
                 "usr/lib"):
        (tmp_path / path).mkdir(parents=True)
    (tmp_path / "home/a/secret.txt").write_text("token")
    shown = [str(tmp_path / "home/a/venv"), str(tmp_path / "usr")]
    masked = set(readable_cover(shown, str(tmp_path)))
    assert masked == {str(tmp_path / p) for p in ("home/a/course", "home/a/secret.txt", "home/b",
                                                  "srv")}
    carved = set(readable([str(tmp_path / "home/a")], [str(tmp_path / "home/a/course")]))
    assert carved == {str(tmp_path / "home/a/venv"), str(tmp_path / "home/a/secret.txt")}
    assert readable([str(tmp_path / "srv")], []) == [str(tmp_path / "srv")]


def test_the_worker_is_shown_python_and_the_system_only():
    from autograder.boundary.isolation import import_dirs, shown_dirs
    shown = shown_dirs(import_dirs(exclude=[]))
    assert "/usr" in shown and not any(d in shown for d in ("/", "/root", "/home", "/tmp", "/work"))
    assert all(not (a != b and b.startswith(a + "/")) for a in shown for b in shown)


def test_a_modules_eval_method_is_not_pythons_eval():
    from autograder.rules.forbid import detours_in_source
    assert detours_in_source("def f(m):\n    m.eval()\n    return m") == []
    assert detours_in_source("def f(s):\n    return eval(s)") == ["eval"]


def test_an_operation_outside_the_allowed_set_refuses_the_call_even_when_caught():
    """Below the names: the dispatcher sees aten._softmax whatever reached it, and catching the
    refusal does not hide it (the exercise scores 0, as for a failed prerequisite)."""
    from autograder.boundary.causes import OperationRefused
    from autograder.rules.plugin import Exercise
    namespace = {"torch": torch,
                 "alias": lambda x: torch.special.softmax(x, -1),   # no forbidden name in sight
                 "caught": lambda x: _swallow(lambda: x.softmax(-1), x),
                 "honest": lambda x: (x - x.amax(-1, keepdim=True)).exp()
                 / (x - x.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True)}
    learner = LocalLearner(namespace)
    learner.begin(Exercise("online_softmax", 1, forbid=("torch.softmax",)))
    x = torch.randn(3, 5)
    torch.testing.assert_close(learner.call("honest", x), torch.softmax(x, -1))
    for name in ("alias", "caught"):
        with pytest.raises(OperationRefused, match=r"aten\._softmax.*\n.*subtract the running max"):
            learner.call(name, x)
    learner.begin(Exercise("causal_attention", 1, forbid=("torch.nn.functional.scaled_dot_product_attention",)))
    torch.testing.assert_close(learner.call("alias", x), torch.softmax(x, -1))  # allowed there


def _swallow(fn, x):
    try:
        return fn()
    except Exception:  # noqa: BLE001 - the learner catches the refusal and answers anyway
        return torch.softmax(x.double(), -1).float()


def test_the_worker_refuses_an_operation_outside_the_allowed_set():
    """Through the sandbox: the dispatch mode runs in the worker, the verdict comes back as
    ``OperationRefused`` (the exercise's gate); the proxies' own copies are not counted."""
    from autograder.boundary.causes import OperationRefused
    from autograder.sandbox import SandboxLearner
    from autograder.rules.plugin import Exercise
    cells = [("norm", "def norm(x):\n    e = (x - x.amax(-1, keepdim=True)).exp()\n"
                      "    return F.normalize(e, p=1, dim=-1)"),
             ("honest", "def honest(x):\n    e = (x - x.amax(-1, keepdim=True)).exp()\n"
                        "    return e / e.sum(-1, keepdim=True)")]
    learner = SandboxLearner(cells, timeout=30)
    try:
        x = torch.randn(2, 6)
        learner.begin(Exercise("online_softmax", 1, forbid=("torch.softmax",)))
        torch.testing.assert_close(learner.call("honest", x), torch.softmax(x, -1))
        with pytest.raises(OperationRefused, match=r"aten\.linalg_vector_norm"):
            learner.call("norm", x)
        learner.begin(Exercise("norm", 1))      # an exercise that forbids nothing: no limit
        torch.testing.assert_close(learner.call("norm", x), torch.softmax(x, -1))
    finally:
        learner.close()


def test_the_largest_allocation_of_a_call_is_recorded_on_every_size():
    """Bounded memory, seen by the dispatch mode: the whole score matrix shows up at any size,
    a tiled loop stays at a tile's size."""
    from autograder.sandbox import SandboxLearner
    from autograder.rules.plugin import Exercise
    cells = [("whole", "def whole(q, k):\n    return (q @ k.T).amax(-1)"),
             ("tiled", "def tiled(q, k, tile):\n    best = torch.full((q.shape[0],), float('-inf'))\n"
                       "    for j in range(0, k.shape[0], tile):\n"
                       "        best = torch.maximum(best, (q @ k[j:j + tile].T).amax(-1))\n"
                       "    return best")]
    learner = SandboxLearner(cells, timeout=30)
    try:
        learner.begin(Exercise("whole", 1, forbid=("torch.softmax",)))
        q, k = torch.randn(48, 8), torch.randn(40, 8)
        torch.testing.assert_close(learner.call("whole", q, k), (q @ k.T).amax(-1))
        assert learner.largest_allocation == 48 * 40 * 4
        torch.testing.assert_close(learner.call("tiled", q, k, 8), (q @ k.T).amax(-1))
        assert learner.largest_allocation == 48 * 8 * 4
    finally:
        learner.close()



A, B = torch.randn(3, 4), torch.randn(4, 5)            # one [3, 4] @ [4, 5] product: 120 FLOPs
BATCH_A, BATCH_B = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
# The first half of A @ B written with factors copied to the product's size [3, 5, 4]: 120 FLOPs
# of elementwise products whatever made the copies.
A_COPIES = A[:, None, :].repeat(1, 5, 1)
B_COPIES = B.T[None].repeat(3, 1, 1)
WORK_CASES = {   # what a call runs -> (matmul FLOPs, elementwise FLOPs, exponentials), by hand
    "a @ b (mm)": (lambda: A @ B, 2 * 3 * 5 * 4, 0, 0),
    "addmm": (lambda: torch.addmm(torch.zeros(3, 5), A, B), 120, 0, 0),
    "batched @ (bmm)": (lambda: BATCH_A @ BATCH_B, 2 * 2 * 3 * 5 * 4, 0, 0),
    "4-d @ (bmm of the flattened batch)": (lambda: BATCH_A[None] @ BATCH_B[None], 240, 0, 0),
    "einsum": (lambda: torch.einsum("bij,bjk->bik", BATCH_A, BATCH_B), 240, 0, 0),
    "baddbmm": (lambda: torch.baddbmm(torch.zeros(2, 3, 5), BATCH_A, BATCH_B), 240, 0, 0),
    "dot": (lambda: torch.dot(A[0], A[1]), 2 * 4, 0, 0),
    "mv": (lambda: A @ B[:, 0], 2 * 3 * 4, 0, 0),
    "broadcast product and sum (a matmul by hand)":
        (lambda: (A[:, None, :] * B.T[None, :, :]).sum(-1), 120, 0, 0),
    "the same with expanded factors": (lambda: (A[:, None, :].expand(3, 5, 4)
                                                * B.T[None].expand(3, 5, 4)).sum(-1), 120, 0, 0),
    "outer": (lambda: torch.outer(A[:, 0], B[0]), 2 * 3 * 5, 0, 0),
    # factors as large as their product, however they were copied: 2 FLOPs per product
    "factors repeated to full size, multiplied, summed":
        (lambda: (A[:, None, :].repeat(1, 5, 1) * B.T[None].repeat(3, 1, 1)).sum(-1), 0, 120, 0),
    "factors expanded, then made contiguous (copies)":
        (lambda: (A[:, None, :].expand(3, 5, 4).contiguous()
                  * B.T[None].expand(3, 5, 4).contiguous()).sum(-1), 0, 120, 0),
    "one factor copied, the other broadcast":
        (lambda: (A[:, None, :] * B.T[None].expand(3, 5, 4).contiguous()).sum(-1), 0, 120, 0),
    "repeat_interleave and tile":
        (lambda: (A.repeat_interleave(5, 0) * B.T.tile(3, 1)).sum(-1), 0, 120, 0),
    "index_select with repeated indices, and cat of copies":
        (lambda: (A.index_select(0, torch.arange(3).repeat_interleave(5))
                  * torch.cat([B.T] * 3)).sum(-1), 0, 120, 0),
    "in-place mul_ of a copy": (lambda: A_COPIES.clone().mul_(B_COPIES).sum(-1), 0, 120, 0),
    "division by the reciprocal": (lambda: (A_COPIES / B_COPIES.reciprocal()).sum(-1), 0, 120, 0),
    "addcmul and addcdiv": (lambda: (torch.addcmul(torch.zeros(3, 5, 4), A_COPIES, B_COPIES),
                                     torch.addcdiv(torch.zeros(3, 5, 4), A_COPIES, B_COPIES)),
                            0, 240, 0),
    "lerp with a tensor weight (and with a number: not a product)":
        (lambda: (torch.lerp(torch.zeros(3, 5, 4), B_COPIES, A_COPIES),
                  torch.lerp(A_COPIES, B_COPIES, 0.5)), 0, 120, 0),
    "squares: (a + b)² - (a - b)² = 4ab": (lambda: ((A_COPIES + B_COPIES) ** 2
                                                    - (A_COPIES - B_COPIES).square()), 0, 240, 0),
    "prod over a stack of the two": (lambda: torch.stack([A_COPIES, B_COPIES]).prod(0), 0, 120, 0),
    "scatter with reduce='multiply'":
        (lambda: A_COPIES.scatter(2, torch.arange(4).expand(3, 5, 4), B_COPIES, reduce="multiply"),
         0, 120, 0),
    "floor_divide, remainder and fmod by a tensor":
        (lambda: (A_COPIES // B_COPIES[:, :, :1], A_COPIES % B_COPIES, A_COPIES.fmod(B_COPIES)),
         0, 3 * 120, 0),
    "elementwise products": (lambda: A * A * A[:, :1], 0, 2 * 12 + 2 * 12, 0),
    "products by a Python number (scales)": (lambda: (A * 2.0, A / 3, 0.5 * A, A.mul(True)), 0, 0, 0),
    "exp": (lambda: torch.exp(A), 0, 0, 12),
    "in-place exp_, exp2, expm1": (lambda: (A.clone().exp_(), A.exp2(), A.expm1()), 0, 0, 36),
    "2 ** x (a power with a tensor exponent)": (lambda: 2 ** A, 0, 0, 12),
    "x ** 2 (x times x, not an exponential)": (lambda: A ** 2, 0, 24, 0),
    "x ** 0.5 (a root, not a product)": (lambda: A.abs() ** 0.5, 0, 0, 0),
    "log, max, sum": (lambda: A.log().amax(-1) + A.sum(-1), 0, 0, 0),
}


@pytest.mark.parametrize("case", list(WORK_CASES))
def test_the_work_of_a_call_is_counted_exactly(case):
    """The recorder below the names: every matrix product is 2 M N K FLOPs whatever reaches it
    (@, einsum, a broadcast product), every elementwise product of two tensors 2 FLOPs per
    element however its factors were made (copies as large as the product included), every
    exponential one element, nothing else counts."""
    import warnings

    from autograder.boundary.guard import operation_limit
    from autograder.rules.operations import BASIC
    run, flops, elementwise, exps = WORK_CASES[case]
    with operation_limit(BASIC) as limit, warnings.catch_warnings():
        warnings.simplefilter("ignore")     # scatter's reduce= is deprecated, still a product
        run()
    work = limit.work
    assert (work.matmul_flops, work.elementwise_flops, work.exp_elements) == (flops, elementwise, exps), (
        f"{case}: recorded {work}, expected {flops} matmul FLOPs, {elementwise} elementwise FLOPs "
        f"and {exps} exponentials")


def test_every_elementwise_product_among_the_allowed_operations_is_counted():
    """The operations that multiply or divide two tensors elementwise, among those an exercise
    may run (``operations.BASIC``), are the ones the recorder counts: a new product added to the
    allow-list must be counted too."""
    from autograder.boundary.guard import ELEMENTWISE_PRODUCTS
    from autograder.rules.operations import BASIC
    multiplying = {f"aten.{name}" for name in """mul mul_ div div_ addcmul addcdiv lerp pow pow_
        prod floor_divide remainder fmod scatter scatter_""".split()}
    assert multiplying <= BASIC, sorted(multiplying - BASIC)
    assert multiplying <= ELEMENTWISE_PRODUCTS, sorted(multiplying - ELEMENTWISE_PRODUCTS)


class _Worked:
    """A learner whose last call did ``work`` (what ``require_one_pass`` reads)."""

    def __init__(self, work):
        self.last_call_work = work


def test_the_work_floor_refuses_a_call_that_records_less_than_its_visible_scores_take():
    """Work done outside torch is missing from the record: below ``WORK_FLOOR`` of the products
    (q kᵀ and p v, however written) and exponentials of the visible scores, the call fails;
    one honest pass, a causal one that skips masked tiles, and products written elementwise
    pass."""
    from autograder.boundary.guard import CallWork
    from autograder.rules.feedback import PrerequisiteFailed
    from autograder.rules.operations import require_one_pass
    rows, keys, dim = 8, 40, 16
    visible = rows * keys // 2                              # causal: half the pairs seen
    check = dict(matmul_flops=4 * rows * keys * dim, exp_elements=rows * keys, why="WHY", rule="R")
    for honest in (CallWork(4 * rows * keys * dim, rows * keys, 0),     # every tile
                   CallWork(4 * visible * dim + 2 * rows * dim, visible, 0),   # masked tiles skipped
                   CallWork(0, visible, 4 * visible * dim)):              # elementwise products
        require_one_pass(_Worked(honest), "call", visible_scores=visible, head_dim=dim, **check)
    for outside in (CallWork(0, 0, 0), CallWork(4 * visible * dim, 0, 0), CallWork(0, visible, 0)):
        with pytest.raises(PrerequisiteFailed, match="not done with torch operations the grader "
                                                     "can see") as failed:
            require_one_pass(_Worked(outside), "call", visible_scores=visible, head_dim=dim, **check)
        assert failed.value.rule == "the work done with torch operations"
    require_one_pass(_Worked(CallWork(0, 30, 0)), "call", exp_elements=40, visible_scores=30,
                     why="WHY", rule="R")                   # exponentials only (chapter 06)
    with pytest.raises(PrerequisiteFailed, match="0 exponentials"):
        require_one_pass(_Worked(CallWork(0, 0, 0)), "call", exp_elements=40, visible_scores=30,
                         why="WHY", rule="R")


def test_values_read_one_at_a_time_are_counted_and_bounded_where_one_pass_is_checked():
    """float(t), .item(), int(t), bool(t) each count one read; a call may read one value per
    row and tile (plus READ_SLACK), not the q and k values a max pass in Python needs."""
    from autograder.boundary.guard import CallWork, operation_limit
    from autograder.rules.feedback import PrerequisiteFailed
    from autograder.rules.operations import BASIC, READ_SLACK, require_one_pass
    x = torch.randn(5, 4)
    with operation_limit(BASIC) as limit:
        sum(float(value) for value in x.reshape(-1)) + x.amax().item() + int(bool(x[0, 0] > 0))
    assert limit.work.scalar_reads == 20 + 1 + 1
    rows, keys, dim, tiles = 8, 40, 16, 5
    one_pass = dict(matmul_flops=4 * rows * keys * dim, exp_elements=rows * keys,
                    visible_scores=rows * keys, head_dim=dim, reads=rows + tiles, why="W", rule="R")
    work = (4 * rows * keys * dim, rows * keys, 0)
    require_one_pass(_Worked(CallWork(*work, rows + tiles + READ_SLACK)), "call", **one_pass)
    with pytest.raises(PrerequisiteFailed, match="values out of tensors one at a time"):
        require_one_pass(_Worked(CallWork(*work, (rows + keys) * dim)), "call", **one_pass)


def test_a_tensor_made_from_python_values_counts_as_an_allocation():
    """torch.tensor of a list (aten.lift_fresh, whose output shares its input's storage) is new
    memory: a copy of K made through Python numbers shows in ``largest``."""
    from autograder.boundary.guard import operation_limit
    from autograder.rules.operations import BASIC
    k = torch.randn(30, 40)
    with operation_limit(BASIC) as limit:
        copy = torch.tensor([[float(x) for x in row] for row in k])
    assert torch.equal(copy, k) and limit.largest == 30 * 40 * 4


def test_one_pass_allows_its_rescales_and_refuses_a_pass_of_copied_factors():
    """``require_one_pass`` on the products: one pass's matmuls plus the elementwise products
    it is allowed (its rescales) pass; a second pass over the scores fails whether written as a
    matmul or as copies multiplied and summed, and the message says what was counted."""
    from autograder.boundary.guard import CallWork
    from autograder.rules.feedback import PrerequisiteFailed
    from autograder.rules.operations import require_one_pass
    rows, keys, dim = 8, 40, 8
    matmuls = 4 * rows * keys * dim

    def one_pass(tiles):
        return dict(matmul_flops=matmuls, elementwise_products=2 * rows * tiles * (dim + 1) + rows * dim,
                    why="WHY", rule="RULE")

    rescales = 2 * (rows * 40 * (dim + 1) + rows * dim)    # 1-key tiles: the rescales weigh most
    require_one_pass(_Worked(CallWork(matmuls, 0, rescales)), "call", **one_pass(40))
    with pytest.raises(PrerequisiteFailed) as failed:      # scores of copies, 4 times over
        require_one_pass(_Worked(CallWork(matmuls, 0, rescales + 4 * matmuls // 2)), "call", **one_pass(40))
    for text in ("times the product work of one pass", "in elementwise products of two tensors",
                 "however its factors were made", "WHY"):
        assert text in str(failed.value), f"{text!r} missing from: {failed.value}"
    assert failed.value.rule == "RULE"
    rescales = 2 * (rows * 5 * (dim + 1) + rows * dim)     # 8-key tiles
    require_one_pass(_Worked(CallWork(matmuls, 0, rescales)), "call", **one_pass(5))
    for second_pass in (CallWork(matmuls * 3 // 2, 0, rescales), CallWork(matmuls, 0, rescales + matmuls // 2)):
        with pytest.raises(PrerequisiteFailed, match="times the product work of one pass"):
            require_one_pass(_Worked(second_pass), "call", **one_pass(5))


@pytest.mark.parametrize("exercise", ["attend_tile", "tiled_attention"])
def test_the_chapter_05_solutions_and_two_passes_of_copies_across_the_graders_sizes(exercise):
    """On the sizes the grader draws (its own case generators, many seeds; small head dims and
    1-key tiles, where the rescales weigh most), the solution passes ``require_one_pass`` and a
    second pass of scores made of copied factors (repeat, multiply, sum) fails."""
    import selfcheck
    from autograder.boundary.guard import operation_limit
    from autograder.local import base_namespace, load_graders
    from autograder.rules.feedback import PrerequisiteFailed
    from autograder.rules.operations import BASIC
    from autograder.solutions import load_solutions
    load_graders()
    grader = sys.modules["_autograder_graders.test_ch05_flash_attention"]
    cheat = next(s.source for s in selfcheck.variants("ch05_flash_attention")["cheat"][exercise]
                 if "repeat" in s.label and "two passes" in s.label)
    sources = {"solution": load_solutions("ch05_flash_attention")[exercise], "cheat": cheat}

    class Learner:
        def __init__(self, source):
            self.namespace = base_namespace()
            exec(source, self.namespace)
            self.calls = self.refused = 0

        def call(self, name, *args, **kwargs):
            with operation_limit(BASIC) as limit:
                out = self.namespace[name](*args, **kwargs)
            self.last_call_work, self.largest_allocation = limit.work, limit.largest
            return out

    def calls(learner, seed):
        """Every call of the exercise's tests with ``seed``, the one-pass check counted."""
        check = grader.require_one_pass

        def counted(*args, **kwargs):
            learner.calls += 1
            try:
                check(*args, **kwargs)
            except PrerequisiteFailed:
                learner.refused += 1

        grader.require_one_pass = counted
        try:
            tests = ([grader.test_attend_tile_driven_key_tile_by_key_tile,
                      grader.test_attend_tile_from_states_the_grader_picks]
                     if exercise == "attend_tile" else
                     [grader.test_tiled_attention_matches_attention, grader.test_tiled_attention_causal,
                      grader.test_tiled_attention_large_scores])
            for test in tests:
                try:
                    test(learner, seed)
                except PrerequisiteFailed as exc:     # the memory check, on copies of a tile
                    assert "whole" in str(exc) and learner is copies, exc
        finally:
            grader.require_one_pass = check

    honest, copies = Learner(sources["solution"]), Learner(sources["cheat"])
    for seed in range(6 if exercise == "attend_tile" else 3):
        calls(honest, seed)
        calls(copies, seed)
    assert honest.calls > 30 and honest.refused == 0, f"{honest.refused} of {honest.calls} honest calls refused"
    assert copies.refused >= copies.calls / 2, f"only {copies.refused} of {copies.calls} two-pass calls refused"


def test_the_work_of_the_last_call_comes_back_from_the_worker():
    """``learner.last_call_work`` is the last call's own work (not the sum of calls), sent
    over the wire from the sandbox worker (its elementwise products too); an exercise without
    a limit records none."""
    from autograder.sandbox import SandboxLearner
    from autograder.rules.plugin import Exercise
    cells = [("scores", "def scores(q, k, times):\n"
                        "    return [torch.exp(q @ k.T) for _ in range(times)][-1]"),
             ("copies", "def copies(q, k):\n"
                        "    n, m = q.shape[0], k.shape[0]\n"
                        "    return (q[:, None].repeat(1, m, 1) * k[None].repeat(n, 1, 1)).sum(-1)")]
    learner = SandboxLearner(cells, timeout=30)
    try:
        q, k = torch.randn(6, 8), torch.randn(5, 8)
        learner.begin(Exercise("scores", 1, forbid=("torch.softmax",)))
        for times in (2, 1):
            learner.call("scores", q, k, times)
            work = learner.last_call_work
            assert (work.matmul_flops, work.exp_elements) == (times * 2 * 6 * 5 * 8, times * 30)
            assert work.elementwise_flops == 0
        torch.testing.assert_close(learner.call("copies", q, k), q @ k.T)
        work = learner.last_call_work
        assert (work.matmul_flops, work.elementwise_flops) == (0, 2 * 6 * 5 * 8), work
        learner.begin(Exercise("scores", 1))
        learner.call("scores", q, k, 1)
        assert (learner.last_call_work.matmul_flops, learner.last_call_work.exp_elements) == (0, 0)
    finally:
        learner.close()

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


def test_a_changed_operation_recorder_is_found(monkeypatch):
    """The worker checks after every call that nothing the operation recorder rests on was
    rebound: an entry of its work tables, a function of its module, a method of its mode."""
    from autograder.boundary import guard, traffic
    from autograder.boundary.worker import RECORDER_PLACES, recorder_places
    traffic.install(recorder_places())
    assert traffic.tampered(RECORDER_PLACES) == []
    monkeypatch.setitem(guard._PRODUCT_FLOPS, "aten.mm", lambda args, out: 0)
    monkeypatch.setattr(guard, "_allocated", lambda *a: 0)
    monkeypatch.setattr(guard._limit_mode(), "__torch_dispatch__", lambda *a, **k: None)
    assert traffic.tampered(RECORDER_PLACES) == ["OperationLimit.__torch_dispatch__",
                                                 "guard._allocated", "product_flops.aten.mm"]
    # torch's own dispatch-mode machinery: a mode never pushed records nothing
    from torch.utils import _python_dispatch
    monkeypatch.setattr(_python_dispatch, "_push_mode", lambda *a: None)
    monkeypatch.setattr(torch._C, "_pop_torch_dispatch_stack", lambda *a: None)
    assert {"python_dispatch._push_mode", "dispatch_stack._pop_torch_dispatch_stack"} \
        <= set(traffic.tampered(RECORDER_PLACES))


# A cell of another exercise (one that records nothing, so its own cell is never looked at)
# reaching the operation recorder before the limited exercise runs: a torch._dynamo of its own
# (torch would wrap the mode's dispatch with its `disable` at the first limited operation), or
# torch's dispatch-mode stack made a no-op. attend_tile then runs a forbidden operation.
HELPER_ATTACKS = {
    "fake dynamo": ("import sys, types, torch\n"
                    "fake = types.ModuleType('torch._dynamo')\n"
                    "def disable(fn, recursive=True, wrapping=False):\n"
                    "    return lambda self, func, types, args=(), kwargs=None: func(*args, **(kwargs or {}))\n"
                    "fake.disable = disable\n"
                    "sys.modules['torch._dynamo'] = torch._dynamo = fake\n",
                    "`_dynamo`", "ran aten._softmax"),
    "no mode stack": ("import torch.utils._python_dispatch as pd\n"
                      "pd._push_mode = lambda mode, k=None: None\n"
                      "pd._pop_mode = lambda k=None: None\n",
                      "`_python_dispatch`", "python_dispatch._push_mode"),
}
FUSED = ("import torch\n"
         "def helper(x):\n"
         "    return torch.ops.aten._softmax.default(x, -1, False)\n")


@pytest.mark.parametrize("attack", list(HELPER_ATTACKS))
def test_another_cell_cannot_switch_the_operation_recorder_off(attack):
    """Both walls: the static look now covers every cell the worker runs (whichever exercise it
    belongs to), and at run time the mode never imports torch._dynamo and watches torch's
    dispatch machinery. The run-time wall is shown alone by calling the sandbox directly."""
    from autograder.sandbox import SandboxLearner
    from autograder.rules.plugin import REGISTRY, other_cells_problem
    from autograder.grading import chapter_graders
    chapter_graders()
    code, static_name, runtime_message = HELPER_ATTACKS[attack]
    cells = [("flash_hbm_bytes", code + FUSED),
             ("attend_tile", "def attend_tile(s):\n    return helper(s)\n")]
    learner = SandboxLearner(cells, timeout=30)
    try:
        entry = REGISTRY["attend_tile"]
        problem = other_cells_problem(learner, entry)
        assert "your `flash_hbm_bytes` cell uses" in problem and static_name in problem
        assert "`attend_tile` scores 0" in problem
        learner.start()
        assert learner.cell_errors == {}
        learner.begin(entry)
        with pytest.raises(AssertionError, match=runtime_message.replace(".", r"\.")):
            learner.call("attend_tile", torch.randn(3, 4))
    finally:
        learner.close()


def test_the_next_memory_limit_s_worker_is_started_ahead_as_another_user():
    """With exercises under two memory limits, the second limit's worker starts while the first
    serves its exercises (as the other sandbox user, so that killing the first one's user leaves
    it running), and serves the limited exercise from its first call; none is started for an
    exercise still at its stub."""
    from autograder.sandbox import SandboxLearner
    from autograder.rules.plugin import Exercise
    free, limited = Exercise("free", 1), Exercise("capped", 1, memory_mb=1536)
    cells = [("free", "def free(x):\n    return x + 1\n"),
             ("capped", "def capped(x):\n    return x * 2\n")]
    learner = SandboxLearner(cells, timeout=30)
    try:
        learner.start([free, limited])
        first, ahead = learner.worker, learner._standby
        assert ahead is not None and ahead.memory_mb == 1536 and ahead.running
        if first.uid is not None:
            assert ahead.uid != first.uid
        learner.begin(free)
        assert float(learner.call("free", torch.tensor(1.0))) == 2.0
        learner.begin(limited)
        assert float(learner.call("capped", torch.tensor(3.0))) == 6.0
        assert learner.worker is ahead and not first.running and learner._standby is None
    finally:
        learner.close()
    stub = [("free", cells[0][1]), ("capped", "def capped(x):\n    raise NotImplementedError\n")]
    learner = SandboxLearner(stub, timeout=30)
    try:
        learner.start([free, limited])
        assert learner._standby is None
    finally:
        learner.close()


def test_a_worker_killed_from_two_threads_at_once_is_killed_once(tmp_path):
    """Closing a sandbox kills the compile worker while a build may be killing it too (a build
    thread runs beside the tests): every call returns, none fails, and a build whose pipe was
    closed under it is told the worker was stopped."""
    import os
    import threading
    from autograder.boundary.process import WorkerProcess
    worker = WorkerProcess("none", None, tmp_path, tmp_path / "log.txt", [])
    worker.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    worker._read, worker._write = os.pipe()
    start, errors = threading.Barrier(8), []

    def kill():
        start.wait()
        try:
            worker.kill()
        except Exception as exc:  # noqa: BLE001 - what the race used to raise
            errors.append(exc)
    threads = [threading.Thread(target=kill) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and worker.proc is None and not worker.running
    assert "stopped by the grader" in str(worker._crashed("while building"))
