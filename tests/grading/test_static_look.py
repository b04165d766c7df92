"""The static look at a cell's source (rules/forbid.py): forbidden names, the detours around
them, the exits of tensor data from torch; and the run-time guard of a forbidden function
(boundary/guard.py)."""

import pytest
import torch


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


def test_a_class_pattern_fetching_a_forbidden_function_is_found():
    from autograder.rules.forbid import uses_in_source
    source = "def f(x):\n    match torch:\n        case object(softmax=soft):\n            return soft(x, -1)"
    assert uses_in_source(source, ["torch.softmax"]) == ["torch.softmax"]


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
            ("x = frame.f_back.f_locals", "f_locals"),
            ("match torch:\n    case object(_C=c):\n        pass", "_C")):   # a class pattern's attributes
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


def test_a_modules_eval_method_is_not_pythons_eval():
    from autograder.rules.forbid import detours_in_source
    assert detours_in_source("def f(m):\n    m.eval()\n    return m") == []
    assert detours_in_source("def f(s):\n    return eval(s)") == ["eval"]

