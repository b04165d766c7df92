"""Functions a grader forbids in an exercise (``@exercise(..., forbid=[...])``).

Two checks, both named in the report:

- static, grader side (here): ``uses_in_source`` looks for the function's name in the cell's
  source, ``detours_in_source`` for the ways around a name;
- run time, learner side: ``autograder.boundary.guard.Guard`` makes the function raise while an
  exercise that forbids it is being graded.
"""
from __future__ import annotations

import ast
import functools
from typing import Iterable


# The softmax and every one-line normaliser that does its work, under each of its names: what an
# exercise about the online softmax forbids (chapters 05-07 add attention itself).
SOFTMAX_FAMILY = (
    "torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax", "torch.Tensor.softmax",
    "torch._softmax", "torch.nn.functional.softmin",
    "torch.logsumexp", "torch.special.logsumexp", "torch.Tensor.logsumexp",
    "torch.logcumsumexp", "torch.Tensor.logcumsumexp",
    "torch.log_softmax", "torch.nn.functional.log_softmax", "torch.special.log_softmax",
    "torch.Tensor.log_softmax", "torch._log_softmax")


def uses_in_source(source: str, names: Iterable[str]) -> list[str]:
    """The forbidden ``names`` whose last component appears in ``source`` as a name, an
    attribute or inside a string literal (docstrings and comments do not count: a stub may say
    what not to use)."""
    words: set[str] = set()
    strings: list[str] = []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        words.update(source.replace(".", " ").replace("(", " ").split())
    else:
        docstrings = {id(node.value) for node in ast.walk(tree)
                      if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                      and isinstance(node.value.value, str)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                words.add(node.id)
            elif isinstance(node, ast.Attribute):
                words.add(node.attr)
            elif isinstance(node, ast.MatchClass):   # `case object(softmax=f)`: an attribute
                words.update(node.kwd_attrs)
            elif isinstance(node, ast.alias):
                words.update(node.name.split("."))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docstrings:
                strings.append(node.value)
    return [n for n in names if n.rsplit(".", 1)[-1] in words
            or any(n.rsplit(".", 1)[-1] in s for s in strings)]


# What a cell of an exercise that forbids functions may not name: the places where torch keeps
# the same computations under other names (torch.ops.aten, torch._C._VariableFunctions), and
# the ways to fetch an attribute or a module by a name built at run time, around the static look.
DETOURS = frozenset({
    "ops", "_C", "_VF", "_VariableFunctions", "_ops", "_refs", "_prims", "_decomp", "library",
    "getattr", "vars", "globals", "locals", "eval", "exec", "compile", "__import__",
    "import_module", "attrgetter", "methodcaller", "unwrap", "getmembers", "modules",
    "resolve_name", "locate", "get_type_hints", "f_back", "f_locals", "f_globals", "f_code",
    "tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# Builtins that are also common method names: a detour only when called by their bare name.
METHOD_NAMES = frozenset({"eval", "exec"})
# Modules that reach objects by computed names or introspection: a detour when imported, and
# (those in DETOUR_ATTRIBUTES) when named as an attribute (``os.sys``, ``numpy.ctypes``).
DETOUR_MODULES = frozenset({"sys", "builtins", "importlib", "inspect", "ctypes", "gc", "operator",
                            "pkgutil", "pydoc", "pickle", "marshal", "traceback", "runpy", "types",
                            "copyreg", "code", "codeop", "pdb", "bdb", "faulthandler", "string",
                            "threading", "_thread", "weakref"})
DETOUR_ATTRIBUTES = frozenset({"sys", "builtins", "importlib", "inspect", "ctypes", "gc",
                               "pkgutil", "pydoc", "pickle", "marshal", "traceback", "runpy"})
# The exits of tensor data from torch, where the operation recorder no longer sees the work or
# the memory (a second pass computed in numpy, K copied per head through a list), the doors back
# in, and work moved to another thread or process (the recorder is per thread): refused as
# attribute or imported names (a variable may be called ``storage``).
# ``.item()``, ``float(t)``, ``int(t)`` stay: the recorder sees each as an operation, and the
# floor of ``operations.require_one_pass`` sees the work done on such values as missing.
EXIT_NAMES = frozenset({"numpy", "tolist", "from_numpy", "from_dlpack", "to_dlpack", "frombuffer",
                        "untyped_storage", "storage", "data_ptr", "dlpack", "save", "fork",
                        "multiprocessing"})
# Libraries that compute on arrays outside torch or read raw memory: refused when imported.
EXIT_MODULES = frozenset({"numpy", "scipy", "jax", "jaxlib", "cupy", "numba", "pandas", "sklearn",
                          "numexpr", "tensorflow", "mlx", "dask", "xarray", "polars", "pyarrow",
                          "array", "struct", "mmap", "io", "tempfile", "shelve", "sqlite3",
                          "multiprocessing", "concurrent", "subprocess"})
OUTSIDE_TORCH = ("the grader counts your code's work and memory at torch's operations, so "
                 "computing outside them (numpy or another array library, Python lists of a "
                 "tensor's values, its raw storage, another thread or process) is not counted: "
                 "use torch operations")
ALLOWED_DUNDERS = frozenset({"__init__", "__name__", "__len__", "__call__", "__getitem__",
                             "__setitem__", "__iter__", "__post_init__", "__repr__"})


def detours_in_source(source: str, grade_id: str | None = None) -> list[str]:
    """The names in ``source`` (a cell of an exercise that forbids functions) that reach around
    the forbidden names: torch's internal namespaces and private functions (``torch.ops``,
    ``torch._C``, ``torch._softmax``: any attribute or imported name with a leading underscore
    but ``__init__`` and a few such), attribute or module look-ups by computed names
    (``getattr``, ``vars``, ``eval``, ``sys.modules``, ``importlib``), ``__dict__``,
    ``__wrapped__``, ``__import__``; and the exits of tensor data from torch (``EXIT_NAMES``,
    ``EXIT_MODULES``: numpy, ``.tolist()``, raw storage). In a kernel cell (``grade_id`` is a
    ``@triton.jit`` function) the jit bodies are left to ``autograder.rules.kernel_rules``,
    checked at launch over the whole cell. An unparsable cell gives [] (it fails to load
    anyway)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: set[str] = set()
    own = _own_private_names(tree)
    kernel = any(isinstance(n, ast.FunctionDef) and n.name == grade_id and _is_jit(n)
                 for n in ast.walk(tree))
    for node in (_outside_kernels(tree) if kernel else ast.walk(tree)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "super" and node.args:
            found.add("super(type, obj)")   # past a class's methods: torch._C's, behind the doors
        words, private_ok = [], False
        if isinstance(node, ast.Name):
            words, private_ok = [node.id], True      # the cell's own helpers may be _private
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, ast.MatchClass):   # `case object(_C=c)` fetches torch._C
            words = list(node.kwd_attrs)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) \
                else [node.module or ""]
            found.update(m for m in modules if m.split(".")[0] in DETOUR_MODULES | EXIT_MODULES)
            words = [part for m in modules for part in m.split(".")[1:]]
            words += [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            private_ok = not any(m.split(".")[0] == "torch" for m in modules)
        for word in words:
            private = word.startswith("_") and word not in ALLOWED_DUNDERS and not private_ok \
                and word not in own
            if isinstance(node, ast.Attribute) and word in METHOD_NAMES:
                continue    # model.eval(), not Python's eval
            exit_name = word in EXIT_NAMES and not isinstance(node, ast.Name)
            if word in DETOURS or exit_name or private or \
                    (word.startswith("__") and word not in ALLOWED_DUNDERS):
                found.add(word)
            elif isinstance(node, ast.Attribute) and word in DETOUR_ATTRIBUTES:
                found.add(word)
    return sorted(found)


def _own_private_names(tree: ast.AST) -> set[str]:
    """The cell's own private names (``self._used = ...``, ``def _helper``), which its
    attributes may use, less every name a library the worker loads has (so that a cell cannot
    make ``_C`` or ``_python_dispatch`` its own by assigning to it)."""
    own = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
           and isinstance(n.ctx, ast.Store) and n.attr.startswith("_")}
    own |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
            ast.AsyncFunctionDef, ast.ClassDef)) and n.name.startswith("_")}
    own = {name for name in own if not name.startswith("__")}
    return own - _library_private_names() if own else own


@functools.lru_cache(maxsize=1)
def _library_private_names() -> frozenset[str]:
    """Every private name of the modules loaded here from torch, triton and numpy, and of
    ``torch.Tensor``."""
    import importlib
    import sys
    import torch
    for name in ("triton", "triton.language", "triton.runtime.interpreter", "numpy"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    names = {name for name in dir(torch.Tensor) if name.startswith("_")}
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] in ("torch", "triton", "numpy") and module is not None:
            names.update(name for name in getattr(module, "__dict__", {}) if name.startswith("_"))
            names.update(part for part in module_name.split(".") if part.startswith("_"))
    return frozenset(names)


def defines_kernel(source: str, grade_id: str) -> bool:
    """Whether ``source`` defines ``grade_id`` as a ``@triton.jit`` function."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return any(isinstance(n, ast.FunctionDef) and n.name == grade_id and _is_jit(n)
               for n in ast.walk(tree))


def _is_jit(node: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in node.decorator_list)


def _outside_kernels(tree: ast.AST):
    """Every node of ``tree`` but those inside ``@triton.jit`` functions (which
    ``autograder.rules.kernel_rules`` governs, more strictly)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef) and _is_jit(node):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _is_exit(name: str) -> bool:
    return name in EXIT_NAMES or name.split(".")[0] in EXIT_MODULES


@functools.lru_cache(maxsize=256)   # asked again for every test of a notebook
def detours_in_other_cell(source: str, grade_id: str) -> tuple[str, ...]:
    """``detours_in_source`` of a cell that is not the graded exercise's own but runs in the same
    process, before and beside it (a helper there could hand the recorder a module of its own, or
    reach tensor data through ``torch._C``): all but ``tolist``, which an exercise that records
    nothing may use on token ids (the run-time door refuses it to learner code under a limit)."""
    return tuple(n for n in detours_in_source(source, grade_id) if n != "tolist")


def other_cell_message(grade_id: str, other: str, names: list[str]) -> str:
    """The report line for another cell (``other``) that reaches around what the grader records
    while ``grade_id`` runs."""
    listed = ", ".join(f"`{n}`" for n in names)
    return (f"your `{other}` cell uses {listed}: every cell runs in the process where the grader "
            f"records what `{grade_id}` does, so no cell may reach torch's internals (torch.ops, "
            "torch._C, private torch._functions) nor fetch attributes or modules by computed "
            "names (getattr, vars, eval, sys.modules, importlib, dunder attributes); take them "
            f"out of `{other}` (`{grade_id}` scores 0 until then)")


def detour_message(grade_id: str, names: list[str], forbidden: Iterable[str] = ()) -> str:
    """The report line for a cell that reaches around the forbidden names (or, in an exercise
    that forbids nothing, around what the grader records in the learner's process), or takes
    tensor data out of torch."""
    exits = [n for n in names if _is_exit(n)]
    lines = [_exit_message(grade_id, exits)] if exits else []
    names = [n for n in names if not _is_exit(n)]
    if names:
        lines.append(_around_message(grade_id, names, forbidden))
    return "\n".join(lines)


def _exit_message(grade_id: str, names: list[str]) -> str:
    """The report line for a cell that names exits of tensor data from torch."""
    listed = ", ".join(f"`{n}`" for n in names)
    return (f"your `{grade_id}` cell uses {listed}, a way of taking tensor data out of torch: "
            f"{OUTSIDE_TORCH}")


def _around_message(grade_id: str, names: list[str], forbidden: Iterable[str]) -> str:
    listed = ", ".join(f"`{n}`" for n in names)
    which = ", ".join(f"`{n}`" for n in forbidden)
    why = (f"it forbids {which}" if which else "the grader records what your code does (the "
           "memory it allocates, the loads and stores of a kernel) in the process it runs in")
    return (f"your `{grade_id}` cell uses {listed}, which is forbidden in this exercise: "
            f"{why}, so its cell may not reach torch's internals (torch.ops, torch._C, "
            "private torch._functions), where they live under other names, nor fetch "
            "attributes or modules by computed names (getattr, vars, eval, sys.modules, "
            "importlib, pkgutil, dunder attributes), nor look at the running program (gc, stack "
            "frames, tracebacks); call public torch functions by name and write the "
            "computation yourself")


def forbidden_message(grade_id: str, names: list[str]) -> str:
    """The report line for a cell that names forbidden functions."""
    listed = ", ".join(f"`{n}`" for n in names)
    return (f"your `{grade_id}` cell uses {listed}, which this exercise forbids: write the "
            "computation yourself")
