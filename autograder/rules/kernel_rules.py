"""Static rules for a learner's Triton kernel cell, checked on its source before it runs.

Under ``TRITON_INTERPRET=1`` a ``@triton.jit`` body is plain Python executed in the process
that launches it: a kernel that calls an ordinary Python helper could walk the stack
(``sys._getframe().f_back``) to the launcher's frame, take the torch tensors there and compute
the answer with torch. On a GPU the same cell would not compile; here it would earn full marks.
So a kernel cell must be Triton code, which these rules check on the AST (nothing is run):

- the cell holds imports of ``triton``/``triton.language``/``math``, ``@triton.jit`` functions,
  docstrings and constant assignments, nothing else;
- no name or attribute of the cell reaches Python's machinery (``sys``, ``inspect``, ``gc``,
  ``builtins``, frames, ``getattr``, dunder names, ...);
- inside a ``@triton.jit`` function, calls go to ``tl.*``/``triton.*``, to other ``@triton.jit``
  functions of the cell, to a few builtins Triton accepts (``range``, ``min``, ...) or to tensor
  methods (``x.to(...)``); names read are the function's parameters and locals, the modules and
  the cell's own functions and constants; attributes of values are those of Triton tensors.

``cell_problem`` applies these to any kernel; graders add their exercise's own rules with
``reachable_calls`` (an operation that counts only where it can run) and ``loop_problem`` (a loop
over keys must step a whole tile at a time; ``require_tile_loop`` fails a grader test with it),
``fixed_size_aranges`` (a tile whose size the cell fixes instead of the launcher's constexpr)
and ``key_loops`` (whether there is a loop at all). These static looks are early, friendly
messages; the technique itself is checked on what the kernel did: ``require_traffic`` reads the
launch's loads and stores, counted by the interpreter (``autograder.boundary.traffic``), so a
second pass over K shows as K read twice whatever the source looks like (a fake
``l * tl.exp(m - m)`` fooled the static look for a running rescale this replaced).
``interpreter_reach`` refuses every kernel while any cell names the interpreter's internals,
where that count is kept.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import types
from typing import Any

import torch

from autograder.rules.feedback import PrerequisiteFailed

KERNEL_MODULES = {"triton", "triton.language", "math"}
SAFE_BUILTINS = {"range", "min", "max", "float", "int", "bool", "abs", "len",
                 "NotImplementedError"}
TENSOR_ATTRIBUTES = {"to", "dtype", "shape", "T", "reshape", "view", "trans", "permute",
                     "broadcast_to", "expand_dims", "ravel", "split", "element_ty", "numel",
                     "sum", "max", "min", "argmax", "argmin", "cumsum", "exp", "log", "sqrt",
                     "abs", "item", "value"}
FORBIDDEN_NAMES = {"sys", "inspect", "gc", "builtins", "importlib", "ctypes", "os", "torch",
                   "_getframe", "f_back", "f_locals", "f_globals", "f_builtins", "f_code",
                   "tb_frame", "gi_frame", "cr_frame", "getattr", "setattr", "delattr", "vars",
                   "globals", "locals", "eval", "exec", "compile", "open", "__import__"}
WHY = ("A kernel cell is Triton code: under the interpreter the kernel body runs as Python, so "
       "anything else could reach the launcher's tensors and compute with torch, which a GPU "
       "would never compile")
UNSUPPORTED = (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import,
               ast.ImportFrom, ast.Global, ast.Nonlocal, ast.With, ast.AsyncWith, ast.Try,
               ast.Yield, ast.YieldFrom, ast.Await, ast.ListComp, ast.SetComp, ast.DictComp,
               ast.GeneratorExp, ast.Delete, ast.Starred, ast.NamedExpr)


def _is_jit(function: ast.FunctionDef) -> bool:
    """Decorated with ``triton.jit`` / ``jit`` (called or not)."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(target) in ("triton.jit", "jit"):
            return True
    return False


def _constant(node: ast.AST) -> bool:
    """A literal, or ``tl.constexpr(<literal>)``."""
    if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("constexpr"):
        return len(node.args) == 1 and not node.keywords and _constant(node.args[0])
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


class _Cell:
    """What the cell's top level defines: module aliases, jit functions, constants."""

    def __init__(self, tree: ast.Module):
        self.modules: dict[str, str] = {}        # alias -> module
        self.jit: dict[str, ast.FunctionDef] = {}
        self.constants: set[str] = set()
        self.problems: list[str] = []
        for node in tree.body:
            self._top_level(node)
        if not any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body):
            # the kernel's own source (check() in a notebook) or a cell relying on an earlier
            # cell's imports: the usual names, as they resolve when it runs
            self.modules = {"triton": "triton", "tl": "triton.language", "math": "math"}

    def _top_level(self, node: ast.stmt) -> None:
        where = f"line {node.lineno}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                self._module(alias.name, alias.asname or alias.name.split(".")[0], where)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                self._module(f"{node.module}.{alias.name}", alias.asname or alias.name, where)
        elif isinstance(node, ast.FunctionDef) and _is_jit(node):
            self.jit[node.name] = node
        elif isinstance(node, ast.FunctionDef):
            self.problems.append(f"{where}: `{node.name}` is a plain Python function; a kernel "
                                 "may call only tl.* and other @triton.jit functions")
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            pass                                  # a docstring
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None \
                and _constant(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) for t in targets):
                self.constants.update(t.id for t in targets)
            else:
                self.problems.append(f"{where}: only plain names may be assigned in a kernel cell")
        else:
            self.problems.append(f"{where}: `{ast.unparse(node).splitlines()[0][:60]}` has no "
                                 "place in a kernel cell (imports of triton, @triton.jit "
                                 "functions and constants only)")

    def _module(self, module: str, alias: str, where: str) -> None:
        if module in KERNEL_MODULES:
            self.modules[alias] = module
        elif module == "triton.jit" or module.startswith("triton.language."):
            self.modules[alias] = module          # `from triton.language import sum` and alike
        else:
            self.problems.append(f"{where}: a kernel cell imports triton and triton.language "
                                 f"only, not `{module}`")


def _forbidden(tree: ast.AST) -> list[str]:
    """Names and attributes anywhere in the cell that reach Python's machinery."""
    found = []
    for node in ast.walk(tree):
        name = (node.id if isinstance(node, ast.Name) else node.attr
                if isinstance(node, ast.Attribute) else None)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if getattr(node, "module", None)
                                                     else [])
            name = next((n for n in names if n.split(".")[0] in FORBIDDEN_NAMES), None)
        if name and (name in FORBIDDEN_NAMES or (name.startswith("__") and name.endswith("__"))):
            found.append(f"line {node.lineno}: `{name}`")
    return found


def _chain_root(node: ast.AST) -> str | None:
    """``a`` for ``a.b.c``, None when the chain does not start at a name."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _module_attribute_problem(node: ast.Attribute, cell: _Cell) -> str | None:
    """Why ``tl.a.b`` (a chain from a module alias) leaves Triton's language, or None. The
    chain is resolved here, in the grader: every module on it must be part of
    ``triton.language`` (not ``triton.language.core``, which holds Python's ``inspect`` and
    ``builtins``), and the chain's end must not be another module."""
    chain = []
    while isinstance(node, ast.Attribute):
        chain.insert(0, node.attr)
        node = node.value
    module = cell.modules.get(node.id) if isinstance(node, ast.Name) else None
    if module is None:
        return None
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return f"`{module}` cannot be imported here"
    path = [module]
    for name in chain:
        if isinstance(obj, types.ModuleType) and not _language_module(obj) \
                and obj.__name__ not in ("triton", "math"):
            return f"`{'.'.join(path)}` is not part of Triton's language"
        if not hasattr(obj, name):
            return f"`{'.'.join(path + [name])}` does not exist"
        obj = getattr(obj, name)
        path.append(name)
    if isinstance(obj, types.ModuleType) and not _language_module(obj):
        return f"`{'.'.join(path)}` is not part of Triton's language"
    return None


def _language_module(module: types.ModuleType) -> bool:
    name = module.__name__
    return name.startswith("triton.language") and name != "triton.language.core"


def _function_problems(function: ast.FunctionDef, cell: _Cell) -> list[str]:
    """Calls, names and attributes of one @triton.jit function."""
    args = function.args
    known = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    known |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Store)}
    known |= set(cell.modules) | set(cell.jit) | cell.constants | SAFE_BUILTINS
    problems = []
    body = function.body[1:] if ast.get_docstring(function) else function.body
    for node in (n for statement in body for n in ast.walk(statement)):
        where = f"line {getattr(node, 'lineno', function.lineno)} of `{function.name}`"
        if isinstance(node, UNSUPPORTED):
            problems.append(f"{where}: `{type(node).__name__}` is not Triton code")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in known:
            problems.append(f"{where}: `{node.id}` is not defined in this cell (a kernel reads "
                            "its arguments, its locals, tl.* and the cell's own constants)")
        elif isinstance(node, ast.Attribute) and _chain_root(node) not in cell.modules \
                and node.attr not in TENSOR_ATTRIBUTES:
            problems.append(f"{where}: `.{node.attr}` is not an attribute of a Triton tensor")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            problems.append(f"{where}: `{ast.unparse(node)}` is private")
        elif isinstance(node, ast.Attribute) and (problem := _module_attribute_problem(node, cell)):
            problems.append(f"{where}: {problem}")
        elif isinstance(node, ast.Call):
            callee = node.func
            allowed = ((isinstance(callee, ast.Name) and callee.id in set(cell.jit) | SAFE_BUILTINS)
                       or (isinstance(callee, ast.Name) and cell.modules.get(callee.id, "")
                           .startswith("triton"))
                       or (isinstance(callee, ast.Attribute) and (
                           _chain_root(callee) in cell.modules or callee.attr in TENSOR_ATTRIBUTES)))
            if not allowed:
                problems.append(f"{where}: `{ast.unparse(callee)}(...)` is not a Triton call; "
                                "a kernel may call only tl.*, triton.* and other @triton.jit "
                                "functions of this cell")
    return problems


def cell_problem(source: str | None, kernel: str) -> str | None:
    """Why the kernel cell ``source`` defining ``kernel`` is not plain Triton code, or None.
    None too when there is no source to look at (a kernel that is not a @triton.jit object is
    refused at launch anyway)."""
    if not source:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    cell = _Cell(tree)
    if kernel not in cell.jit:
        return None
    problems = list(cell.problems)
    for function in cell.jit.values():
        problems += _function_problems(function, cell)
    problems += [f"{p} is not allowed in a kernel cell" for p in _forbidden(tree)]
    problems = list(dict.fromkeys(problems))
    if not problems:
        return None
    shown = "; ".join(problems[:5])
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    return f"`{kernel}` was not run. {WHY}. {shown}{more}"


# ---------------------------------------------------------------- rules graders opt into

def kernel_source(learner: Any, name: str) -> str | None:
    """The learner's cell source (sandbox), else the kernel's own source (check() in a notebook)."""
    source = learner.cell_source(name) if hasattr(learner, "cell_source") else None
    kernel = getattr(learner, "namespace", {}).get(name)
    if source is None and hasattr(kernel, "fn"):
        source = inspect.getsource(kernel.fn)
    return source


def _decided_at_compile_time(test: ast.AST, constexprs: set[str]) -> bool:
    """A condition made of constants and constexpr parameters only: Triton decides it once,
    so the branch it guards may never run (``if HEAD_DIM < 0:``)."""
    return all(isinstance(n, (ast.Constant, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp,
                              ast.cmpop, ast.boolop, ast.unaryop, ast.operator, ast.Load))
               or (isinstance(n, ast.Name) and n.id in constexprs)
               for n in ast.walk(test))


def _constexprs(function: ast.FunctionDef) -> set[str]:
    return {a.arg for a in function.args.args
            if a.annotation is not None and ast.unparse(a.annotation).endswith("constexpr")}


def reachable_calls(source: str, kernel: str) -> list[ast.Call]:
    """Calls of ``kernel`` (and of the @triton.jit functions it calls) that run whatever the
    constexpr values: not under an ``if``/``while`` decided by constants and constexpr
    parameters alone, not after a ``return``."""
    tree = ast.parse(source)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and _is_jit(n)}
    found: list[ast.Call] = []
    seen: set[str] = set()

    def visit(statements: list[ast.stmt], constexprs: set[str]) -> None:
        for statement in statements:
            if isinstance(statement, ast.Return):
                scan(statement, constexprs)
                return
            if isinstance(statement, ast.If) and _decided_at_compile_time(statement.test,
                                                                          constexprs):
                found.extend(in_both_branches(statement, constexprs))
            elif isinstance(statement, ast.While) and _decided_at_compile_time(statement.test,
                                                                               constexprs):
                continue
            elif isinstance(statement, (ast.If, ast.While)):
                scan(statement.test, constexprs)
                visit(statement.body, constexprs)
                visit(statement.orelse, constexprs)
            elif isinstance(statement, ast.For):
                scan(statement.iter, constexprs)
                visit(statement.body, constexprs)
            else:
                scan(statement, constexprs)

    def in_both_branches(statement: ast.If, constexprs: set[str]) -> list[ast.Call]:
        """Calls of a compile-time branch that the other branch makes too (by callee)."""
        nonlocal found
        outer = found
        branches = []
        for branch in (statement.body, statement.orelse):
            found = []
            visit(branch, constexprs)
            branches.append(found)
        found = outer
        other = {ast.unparse(c.func) for c in branches[1]}
        return [c for c in branches[0] if ast.unparse(c.func) in other]

    def scan(node: ast.AST, constexprs: set[str]) -> None:
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            found.append(call)
            callee = call.func.id if isinstance(call.func, ast.Name) else None
            if callee in functions and callee not in seen:
                seen.add(callee)
                visit(functions[callee].body, _constexprs(functions[callee]))

    if kernel in functions:
        seen.add(kernel)
        visit(functions[kernel].body, _constexprs(functions[kernel]))
    return found


def loop_problem(source: str, kernel: str, tile: str, what: str = "keys") -> str | None:
    """Why a loop of ``kernel`` does not step one tile of ``tile`` ``what`` at a time, or None.
    Allowed: ``range(start, end, TILE)`` or ``range([start,] n_tiles)`` with ``n_tiles`` a
    ``tl.cdiv(..., TILE)`` or ``... // TILE``, or a name the kernel assigns once, to one of
    those (likewise ``tl.range``/``tl.static_range``), and no loop inside a loop."""
    tree = ast.parse(source)
    function = next((n for n in tree.body if isinstance(n, ast.FunctionDef)
                     and n.name == kernel), None)
    if function is None:
        return None

    stores = [n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    assigned_once = {node.targets[0].id: node.value for node in ast.walk(function)
                     if isinstance(node, ast.Assign) and len(node.targets) == 1
                     and isinstance(node.targets[0], ast.Name) and stores.count(node.targets[0].id) == 1}

    def divides_by_tile(node: ast.AST) -> bool:
        if isinstance(node, ast.Name) and node.id in assigned_once:
            node = assigned_once[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
            return ast.unparse(node.right) == tile
        return (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("cdiv")
                and len(node.args) == 2 and ast.unparse(node.args[1]) == tile)

    for loop in (n for n in ast.walk(function) if isinstance(n, (ast.For, ast.While))):
        if isinstance(loop, ast.While) or any(isinstance(n, (ast.For, ast.While))
                                              for n in ast.walk(loop) if n is not loop):
            return f"line {loop.lineno}: a while loop or nested loops work key by key"
        it = loop.iter
        ranged = isinstance(it, ast.Call) and ast.unparse(it.func) in (
            "range", "tl.range", "tl.static_range") and not it.keywords and 1 <= len(it.args) <= 3
        if ranged and len(it.args) == 3 and ast.unparse(it.args[2]) == tile:
            continue
        if ranged and len(it.args) <= 2 and divides_by_tile(it.args[-1]):
            continue
        return (f"line {loop.lineno}: `for ... in {ast.unparse(it)}` does not step one tile of "
                f"{tile} {what} at a time")
    return None


def require_tile_loop(learner: Any, kernel: str, tile: str, advice: str, what: str = "keys") -> None:
    """Fail with ``"<kernel>: <loop_problem>. <advice>"`` where the learner's ``kernel`` does not
    step one tile of ``tile`` ``what`` at a time; pass where its source cannot be had."""
    source = kernel_source(learner, kernel)
    problem = source and loop_problem(source, kernel, tile, what)
    if problem:
        raise AssertionError(f"{kernel}: {problem}. {advice}")


def _jit_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and _is_jit(n)}


def _reachable(kernel: str, functions: dict[str, ast.FunctionDef]) -> list[ast.FunctionDef]:
    """``kernel`` and the @triton.jit functions it calls, directly or not (kernel first)."""
    order, todo = [], [kernel]
    while todo:
        name = todo.pop(0)
        if name in functions and functions[name] not in order:
            order.append(functions[name])
            todo += [c.func.id for c in ast.walk(functions[name])
                     if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)]
    return order


def _unseen_callees(tree: ast.Module, kernel: str) -> set[str]:
    """Functions that ``kernel`` (or a jit function it calls) calls by a bare name that
    ``tree`` neither defines as a jit function nor imports: a helper of the cell when only the
    kernel's own source could be had (``check()`` in a notebook), where no verdict on the
    whole kernel can be given. (A whole cell has none: ``cell_problem`` refuses the rest.)"""
    functions = _jit_functions(tree)
    imported = {a.asname or a.name.split(".")[0] for n in tree.body
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    return {c.func.id for f in _reachable(kernel, functions) for c in ast.walk(f)
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
            and c.func.id not in set(functions) | imported | SAFE_BUILTINS}


def fixed_size_aranges(source: str, kernel: str) -> list[str]:
    """``tl.arange`` calls of ``kernel`` (and the jit functions it calls) whose size is not a
    parameter: ``"line 12: tl.arange(0, 128)"`` for each. In the kernel the end must be one of
    its ``tl.constexpr`` parameters (the launcher's BLOCK sizes); in a helper, one of its
    parameters. A tile of a size the cell fixes covers the keys a grader happens to use, not
    the split the launcher asks for."""
    tree = ast.parse(source)
    functions = _jit_functions(tree)
    found = []
    for function in _reachable(kernel, functions):
        sizes = _constexprs(function) if function.name == kernel else {
            a.arg for a in function.args.posonlyargs + function.args.args + function.args.kwonlyargs}
        for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
            if not ast.unparse(call.func).endswith("arange") or not call.args:
                continue
            end = call.args[-1]
            if not (isinstance(end, ast.Name) and end.id in sizes):
                found.append(f"line {call.lineno}: {ast.unparse(call)}")
    return found


def key_loops(source: str, kernel: str) -> list[int] | None:
    """Line numbers of every ``for``/``while`` loop of ``kernel`` and of the jit functions it
    calls (none: one tile is all the kernel reads); None when ``source`` has no @triton.jit
    function ``kernel``."""
    tree = ast.parse(source)
    functions = _jit_functions(tree)
    if kernel not in functions or _unseen_callees(tree, kernel):
        return None
    return sorted(n.lineno for f in _reachable(kernel, _jit_functions(tree))
                  for n in ast.walk(f) if isinstance(n, (ast.For, ast.While)))


# ---------------------------------------------------------------- the interpreter's internals

# Names that reach where the interpreter runs a kernel and ``autograder.boundary.traffic`` counts
# its loads and stores (as names, attributes, imported modules or inside strings).
INTERPRETER_NAMES = frozenset({
    "interpreter", "InterpreterBuilder", "interpreter_builder", "interpreter_semantic",
    "TritonSemantic", "semantic", "GridExecutor", "InterpretedFunction", "FunctionRewriter",
    "libtriton", "create_load", "create_store", "create_masked_load", "create_masked_store",
    "create_atomic_rmw", "create_atomic_cas", "set_grid_idx", "_patch_lang"})


def interpreter_reach(cells: list[tuple[str, str]]) -> str | None:
    """Why no kernel may run while these ``(grade_id, source)`` cells are loaded: the first
    cell that names the interpreter's internals (``INTERPRETER_NAMES``), or None. Any cell
    counts, not only the kernel's: all of them run in the process the kernel runs in."""
    for grade_id, source in cells:
        try:
            tree = ast.parse(source or "")
        except SyntaxError:
            continue
        found = set()
        docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
                      and isinstance(n.value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                found.add(node.id)
            elif isinstance(node, ast.Attribute):
                found.add(node.attr)
            elif isinstance(node, ast.alias):
                found.update(node.name.split("."))
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.update(node.module.split("."))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docstrings:
                found.update(n for n in INTERPRETER_NAMES if n.lower() in node.value.lower())
        named = sorted(found & INTERPRETER_NAMES)
        if named:
            return (f"no kernel was run: your `{grade_id}` cell names "
                    f"{', '.join(f'`{n}`' for n in named)}, Triton's interpreter, where the "
                    "grader counts a kernel's loads and stores. No cell may reach it; write the "
                    "kernel with tl.* only")
    return None


# ---------------------------------------------------------------- what a launch read and wrote

def require_traffic(learner: Any, kernel: str, *, rule: str,
                    reads: dict[str, tuple[Any, torch.Tensor, str, str]],
                    outputs: dict[str, Any], tiles: dict[str, tuple[int, str]] | None = None,
                    sweeps: dict[str, int] | None = None) -> None:
    """``PrerequisiteFailed(..., rule=rule)`` when the last launch of ``kernel`` moved memory
    other than its technique does; nothing when the launch was not counted (an autotuned
    kernel: compiled ones are counted by a second run in the interpreter).

    reads: name -> (argument key, the most times each element may be loaded over the launch
      (an int tensor shaped as the argument), what "once" is per, e.g. "per split", advice).
      No program may load one element twice (``sweeps``: name -> how many times one program
      may, a kernel that reads its input in that many passes), and no element more often than
      allowed.
    outputs: name -> argument key; an output is stored at most once per element, never loaded.
    tiles: name -> (the most elements one load of it may bring in, what a tile is).
    Every argument not in ``outputs`` is an input, never stored; nothing outside the arguments
    is touched."""
    traffic = getattr(learner, "last_traffic", None)
    if traffic is None:
        return

    def fail(message: str) -> None:
        raise PrerequisiteFailed(f"{kernel}: {message}", rule=rule)

    if traffic.outside_reads or traffic.outside_writes:
        fail(f"your kernel loaded {traffic.outside_reads} and stored {traffic.outside_writes} "
             "elements outside the tensors it was given; a kernel touches only its arguments")
    for name, (key, allowed, per, advice) in reads.items():
        counted = traffic[key]
        if int(allowed.sum()) and not int(counted.reads.sum()):
            fail(f"no load of {name} was counted: the kernel read it some other way than "
                 "tl.load, or the interpreter's count was tampered with")
        ratio = float(counted.reads.sum()) / max(float(allowed.sum()), 1.0)
        if counted.most_reads > (sweeps or {}).get(name, 1):
            fail(f"your kernel read {name} {ratio:.2f} times {per}; {advice} (one program "
                 f"loaded the same element of {name} {counted.most_reads} times)")
        beyond = int((counted.reads > allowed).sum())
        if beyond:
            fail(f"your kernel read {beyond} elements of {name} more often than the technique "
                 f"does ({name} read {ratio:.2f} times {per}); {advice}")
    for name, (most, what) in (tiles or {}).items():
        widest = traffic[reads[name][0]].widest_read
        if widest > most:
            fail(f"one load of {name} brought in {widest} elements; a tile is {what} ({most} "
                 "elements): loop over the tiles, one tile per load")
    output_keys = {key: name for name, key in outputs.items()}
    input_keys = {entry[0]: name for name, entry in reads.items()}
    for key, counted in traffic.arguments.items():
        name = output_keys.get(key)
        if name is not None and int(counted.reads.sum()):
            fail(f"your kernel loaded {name}, an output: running values stay in registers; "
                 "nothing (no scores, no partial result) goes through memory and back")
        most_writes = int(counted.writes.max()) if counted.writes.numel() else 0
        if name is not None and most_writes > 1:
            fail(f"your kernel stored one element of {name} {most_writes} times: "
                 "store each output once, at the end, from registers")
        if name is None and int(counted.writes.sum()):
            fail(f"your kernel stored {int(counted.writes.sum())} elements into "
                 f"{input_keys.get(key, f'argument {key}')}, an input: a kernel's only memory "
                 "for results is its outputs")
