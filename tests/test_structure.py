"""reference/ by role: the core never imports the measurements, no module imports itself back
through a cycle, and the modules that moved say where they went."""
import ast
import importlib
from pathlib import Path

import pytest

import reference
from import_graphs import modules_on_cycles

ROOT = Path(reference.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = ("reference",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the reference modules it imports (anywhere in the file, lazy imports too)."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("reference"):
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("reference")}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def role(module: str) -> str:
    return module.split(".")[1] if module.split(".")[1:2] in (["bench"], ["calculators"]) else "core"


def test_the_core_never_imports_measurement_code():
    graph = import_graph()
    wrong = sorted((m, d) for m, deps in graph.items() for d in deps
                   if role(m) != "bench" and role(d) == "bench")
    assert not wrong, f"only reference.bench may import reference.bench: {wrong}"


def test_the_core_reaches_the_grader_only_for_the_gpu_build():
    """reference/ imports one module of autograder/: the GPU targets and build, which the grader's
    compile worker must have without reference (autograder/boundary/compiling.py). The bench reads
    the exercise solutions too."""
    allowed = {"core": {"autograder.boundary.compiling"}, "calculators": set(),
               "bench": {"autograder.boundary.compiling", "autograder.solutions"}}
    wrong = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            wrong += [f"{module_name(path)} -> {n}" for n in names
                      if n.split(".")[0] == "autograder" and n not in allowed[role(module_name(path))]]
    assert not wrong, f"reference/ may import only autograder.boundary.compiling of the grader: {wrong}"


def test_no_import_cycles():
    cycles = modules_on_cycles(import_graph())
    assert not cycles, f"modules on an import cycle: {cycles}"


@pytest.mark.parametrize("old", sorted(reference.MOVED))
def test_a_moved_module_names_its_new_place(old):
    with pytest.raises(ModuleNotFoundError, match=f"{old} has moved: import {reference.MOVED[old]}"):
        importlib.import_module(old)
    importlib.import_module(reference.MOVED[old])


def test_from_import_of_a_moved_module_names_its_new_place_too():
    with pytest.raises(ModuleNotFoundError, match="import reference.calculators.roofline"):
        from reference import roofline  # noqa: F401
