""""Compiles for a real GPU": a learner's Triton kernel built for a T4, an A100 and an H100 by the
compile worker (``autograder.boundary.builds``), and the verdict on what the builds report.

What is sent to the compile worker is not the cell but ``build_source``: the cell's imports of
triton/math, its constants and the ``@triton.jit`` functions the kernel calls, each line where the
cell has it (so that the compiler's line numbers are the cell's), everything else blanked. Before
anything is sent, the cell must pass ``kernel_rules.cell_problem`` and each function kept must be
decorated with a bare ``@triton.jit`` only, with constant defaults and no annotation but
``tl.constexpr``: what Python runs when it loads that text is then imports, literals and
``triton.jit`` itself (the kernel bodies are read by triton's compiler, never run).

What the verdict trusts: the compile worker's reply, which its own code writes after the load and
triton's build (a sandboxed process like the learner's worker: the same confinement, started
without TRITON_INTERPRET, given nothing but that text and the launches). Shared memory is triton's
metadata; registers and spills are ptxas's log of the cubin stage alone. The launches, the
targets, the limits and the verdict are the grader's.
"""
from __future__ import annotations

import ast
import linecache
import inspect
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any

import torch

from autograder.boundary.causes import NOT_IMPLEMENTED, LearnerError
from autograder.boundary.compiling import KIB, TARGETS, CompileReport, a
from autograder.rules.kernel_rules import cell_problem

ANNOTATIONS = {"tl.constexpr", "triton.language.constexpr", "constexpr"}
PREAMBLE = "import math, triton; import triton.language as tl"   # a kernel's own source has no imports


@dataclass
class Build:
    """One launch to build: ``label`` says where it comes from and its sizes ("grader: fp32 D=16,
    16x16 tiles", "GPU tile: ..." for the launch a GPU would use); ``args`` and ``kwargs`` as for
    the launch (tensors stand for pointers: only their dtype counts)."""
    label: str
    args: tuple
    kwargs: dict = field(default_factory=dict)

    def wire(self) -> list:
        """``[args, kwargs]`` as the compile worker takes them (a tensor as ``("tensor", dtype)``)."""
        args = [("tensor", str(a.dtype).removeprefix("torch.")) if isinstance(a, torch.Tensor) else a
                for a in self.args]
        return [args, dict(self.kwargs)]


def whole_cell(learner: Any, kernel: str) -> str | None:
    """The learner's cell (sandbox); in a notebook (check()), the cell the kernel was defined in,
    or where its text is gone (Python's line cache dropped it), the kernel's own text (as Triton
    read it at definition, ``raw_src``, or from its file) under the usual imports; "" when none
    can be read."""
    source = learner.cell_source(kernel) if hasattr(learner, "cell_source") else None
    jit = getattr(learner, "namespace", {}).get(kernel)
    if source is None and hasattr(jit, "fn"):
        cell = "".join(linecache.getlines(jit.fn.__code__.co_filename))
        raw = "".join(getattr(jit, "raw_src", None) or ())   # compiled mode keeps it; interpreted not
        if not raw and f"def {kernel}(" not in cell:
            try:
                raw = inspect.getsource(jit.fn)
            except (OSError, TypeError):
                raw = ""
        source = cell if f"def {kernel}(" in cell else \
            f"import triton\nimport triton.language as tl\n\n\n{textwrap.dedent(raw)}" if raw else ""
    return source


def _decorator_problem(function: ast.FunctionDef) -> str | None:
    names = [ast.unparse(d) for d in function.decorator_list]
    if names not in (["triton.jit"], ["jit"]):
        return (f"`{function.name}` is decorated with {', '.join('@' + n for n in names)}: a kernel built "
                "for a GPU takes one bare @triton.jit")
    return None


def _signature_problem(function: ast.FunctionDef) -> str | None:
    args = function.args
    for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
        try:
            ast.literal_eval(default)
        except ValueError:
            return (f"line {default.lineno}: the default `{ast.unparse(default)}` of `{function.name}` is "
                    "not a constant (a literal such as 0, 1.0 or True)")
    for arg in args.posonlyargs + args.args + args.kwonlyargs:
        if arg.annotation is not None and ast.unparse(arg.annotation) not in ANNOTATIONS:
            return (f"line {arg.lineno}: `{arg.arg}: {ast.unparse(arg.annotation)}`: a kernel parameter is "
                    "annotated with tl.constexpr or not at all")
    if args.vararg or args.kwarg or function.returns is not None:
        return f"`{function.name}`: no *args, **kwargs or return annotation in a kernel"
    return None


def _called_jit(function: ast.FunctionDef, jitted: dict[str, ast.FunctionDef]) -> set[str]:
    return {n.func.id for n in ast.walk(function) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name) and n.func.id in jitted}


def build_source(cell: str, kernel: str) -> tuple[str, int]:
    """(text for the compile worker, lines added before the cell's first line) for ``kernel``
    of the cell ``cell``; ``AssertionError`` saying why when the cell may not be built."""
    problem = cell_problem(cell, kernel)
    if problem:
        raise AssertionError(problem)
    tree = ast.parse(cell)
    jitted = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if kernel not in jitted:
        raise AssertionError(f"no `def {kernel}` at the top level of its cell"
                             if re.search(rf"\bdef\s+{kernel}\s*\(", cell) else
                             f"the text read as `{kernel}`'s cell does not define it: run the cell "
                             "that defines the kernel again, then check()")
    kept, todo = set(), [kernel]
    while todo:
        name = todo.pop()
        if name not in kept:
            kept.add(name)
            todo += _called_jit(jitted[name], jitted)
    for name in sorted(kept):
        problem = _decorator_problem(jitted[name]) or _signature_problem(jitted[name])
        if problem:
            raise AssertionError(f"`{kernel}` was not built for a GPU: {problem}")
    lines = cell.splitlines()
    out = [""] * len(lines)
    imports = False
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.annotation) not in ANNOTATIONS | {"int", "float"}:
            raise AssertionError(f"`{kernel}` was not built for a GPU: line {node.lineno}: a constant of a kernel "
                                 "cell is annotated with tl.constexpr, int, float or not at all")
        keep = (isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign))
                or (isinstance(node, ast.FunctionDef) and node.name in kept))
        imports |= isinstance(node, (ast.Import, ast.ImportFrom))
        if keep:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            out[first - 1:node.end_lineno] = lines[first - 1:node.end_lineno]
    text = "\n".join(out) + "\n"
    return (text, 0) if imports else (f"{PREAMBLE}\n{text}", 1)


def _cell(report: CompileReport) -> str:
    if report.error:
        return "does not compile"
    shared = f"{report.shared_bytes / KIB:.1f} KiB" if report.shared_bytes >= KIB else f"{report.shared_bytes} B"
    text = f"{shared}, {report.registers} reg"
    text += f", spills {report.spill_stores} B" if report.spills else ""
    return text + (" OVER" if report.problems() else "")


def table(builds: list[Build], reports: list[list[CompileReport]]) -> str:
    """One line per build, one column per target: shared memory per block, registers per thread,
    bytes spilled per thread, OVER where it would not launch."""
    width = max(len(b.label) for b in builds) + 2
    columns = [max([24] + [len(_cell(row[c])) + 2 for row in reports]) for c in range(len(TARGETS))]
    head = f"{'launch':{width}}" + "".join(f"{f'{t.name} ({t.shared_per_block // KIB} KiB)':{w}}"
                                           for t, w in zip(TARGETS, columns))
    rows = [f"{b.label:{width}}" + "".join(f"{_cell(r):{w}}" for r, w in zip(row, columns))
            for b, row in zip(builds, reports)]
    return "\n".join([head.rstrip(), *(r.rstrip() for r in rows)])


def _on_learner_line(error: str, source: str, kernel: str, cell_offset: int) -> str:
    """triton's ``at L:C: code -> message`` (``L`` counted from the failing function's ``def``):
    the same, naming the line of the cell that holds ``code`` (the one nearest the kernel's
    ``def`` + L where several do)."""
    match = re.match(r"at (\d+):\d+: (.+?) -> (.*)$", error)
    lines = source.splitlines()
    hits = [number for number, line in enumerate(lines, 1) if match and line.strip() == match[2].strip()]
    if not hits:
        return error
    start = next((number for number, line in enumerate(lines, 1) if line.startswith(f"def {kernel}(")), 1)
    line = min(hits, key=lambda hit: abs(hit - (start + int(match[1]) - 1)))
    return f"line {line - cell_offset} of your cell, `{match[2].strip()}`: {match[3]}"


def _problem(report: CompileReport, where) -> str | None:
    if report.error:
        return f"does not compile: {where(report.error)}"
    problems = report.problems()
    return problems[0] if problems else None


def verdict(kernel: str, builds: list[Build], reports: list[list[CompileReport]], advice: str,
            source: str = "", cell_offset: int = 0) -> tuple[bool, str]:
    """(passes, the message): it passes when every build fits at least one target whole; the
    message names, per target that does not fit, the first launch that does not and why (a
    compiler error on its line of the cell: ``source`` is what was built, ``cell_offset`` the
    lines added before the cell's)."""
    def where(error: str) -> str:
        return _on_learner_line(error, source, kernel, cell_offset)
    why = {}
    for column, target in enumerate(TARGETS):
        failed = next(((b, p) for b, row in zip(builds, reports) if (p := _problem(row[column], where))), None)
        if failed:
            why[target.name] = f"{failed[0].label}: {failed[1]}"
    fits = [t.name for t in TARGETS if t.name not in why]
    summary = table(builds, reports)
    if len(set(why.values())) == 1 and len(why) > 1:
        missing = f"not on {', '.join(map(a, why))} ({next(iter(why.values()))})"
    else:
        missing = "; ".join(f"not on {a(name)} ({text})" for name, text in why.items())
    if not fits:
        return False, f"`{kernel}` would run on no GPU: {missing}. {advice}\n{summary}"
    if why:
        return True, f"`{kernel}` builds and fits {' and '.join(map(a, fits))}, {missing}. {advice}\n{summary}"
    return True, f"`{kernel}` builds and fits {', '.join(map(a, fits[:-1]))} and {a(fits[-1])}:\n{summary}"


PLANNED: dict[str, list[Build]] = {}   # kernel -> the builds its grader asks for (a sandbox starts them early)


def planned(kernel: str, builds: list[Build]) -> list[Build]:
    """``builds``, noted as those of ``kernel`` so that ``start_builds`` can start them before
    the test that needs them (the compile worker then works while the kernel's tests run)."""
    PLANNED[kernel] = builds
    return builds


def start_builds(learner: Any, kernel: str) -> None:
    """Send ``kernel``'s planned builds to the compile worker now, if its cell may be built; the
    test that needs them takes the reports (``require_gpu_build``), or says why not."""
    cell = whole_cell(learner, kernel) if kernel in PLANNED else None
    try:
        source, _ = build_source(cell, kernel) if cell else (None, 0)
    except (AssertionError, SyntaxError):
        return
    if source:
        learner.build_kernel_soon(kernel, source, [b.wire() for b in PLANNED[kernel]])


def require_gpu_build(learner: Any, kernel: str, builds: list[Build], advice: str) -> None:
    """Build ``kernel`` for every target at every launch of ``builds``; fail (AssertionError with
    what does not fit where, and ``advice``) when no target takes them all; otherwise note the
    table (and a target that does not fit) in the report."""
    cell = whole_cell(learner, kernel)
    if cell is None:
        raise AssertionError(f"`{kernel}` is not defined (run its cell first)")
    if not cell.strip():
        raise AssertionError(f"the source of `{kernel}` cannot be read, and the grader builds a "
                             "kernel from its source: define it with @triton.jit in a cell of its "
                             "own (not through exec or a string)")
    function = next((n for n in ast.walk(ast.parse(cell)) if isinstance(n, ast.FunctionDef) and n.name == kernel),
                    None)
    if function is not None and any(isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n)
                                    for n in ast.walk(function)):
        raise LearnerError(NOT_IMPLEMENTED)
    source, offset = build_source(cell, kernel)
    result = learner.build_kernel(kernel, source, [b.wire() for b in builds])
    if result["environment"]:
        raise RuntimeError(result["environment"])
    reports = [[CompileReport(**r) for r in row] for row in result["reports"]]
    passes, message = verdict(kernel, builds, reports, advice, source, offset)
    if not passes:
        raise AssertionError(message)
    learner.note(message)
