"""autograder/ by role: the worker side of the process boundary imports nothing of the grader
(no rules, no front-ends, no reference), the rules and the boundary never import a front-end,
there are no import cycles, and the modules that moved say where they went."""
import ast
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import autograder
from import_graphs import modules_on_cycles

ROOT = Path(autograder.__file__).resolve().parent
# The worker side of autograder/boundary/ and the wire both sides share (boundary/__init__.py).
WORKER_SIDE = {"forkserver", "worker", "confine", "guard", "proxies", "launching", "traffic",
               "audit", "exits", "causes", "compiling", "protocol", "refs"}
# what the worker side may import besides stdlib (pyseccomp: libseccomp's binding, confine.py)
THIRD_PARTY = {"torch", "numpy", "triton", "pyseccomp"}
FRONT_ENDS = {"cli", "grading", "report", "local", "notebook", "source_notebook",
              "gradescope_zip", "bench", "learner", "sandbox"}


def module_name(path: Path, root: Path) -> str:
    parts = ("autograder",) + path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in the file (lazy imports too), absolute names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def worker_side_violations(root: Path) -> list[str]:
    """``module -> import`` for each import of a worker-side module of the package at ``root``
    that is neither the standard library, ``THIRD_PARTY``, nor another worker-side module."""
    own = {f"autograder.boundary.{m}" for m in WORKER_SIDE}
    wrong = []
    for name in sorted(WORKER_SIDE):
        for imported in sorted(imports_of(root / "boundary" / f"{name}.py")):
            top = imported.split(".")[0]
            if top == "autograder":   # a worker-side module, a name in one, or a package
                ok = imported in own | {"autograder", "autograder.boundary"} \
                    or imported.rpartition(".")[0] in own
            else:
                ok = top in sys.stdlib_module_names or top in THIRD_PARTY or top == "__future__"
            if not ok:
                wrong.append(f"boundary.{name} -> {imported}")
    return wrong


def import_graph() -> dict[str, set[str]]:
    """module -> the autograder modules it imports (chapter graders and solutions left out)."""
    paths = [p for p in ROOT.rglob("*.py") if p.parent.name not in ("graders", "solutions",
                                                                      "gradescope")]
    modules = {module_name(p, ROOT): p for p in paths}
    return {name: {d for d in imports_of(path) if d in modules and d != name}
            for name, path in modules.items()}


def test_the_worker_side_imports_nothing_of_the_grader():
    assert not worker_side_violations(ROOT), (
        "the worker side of autograder/boundary runs in the learner's process: it may import the "
        f"standard library, torch, numpy, triton and its own side only: "
        f"{worker_side_violations(ROOT)}")


@pytest.mark.parametrize("planted", ["from autograder.rules.feedback import assert_close",
                                     "import reference.model",
                                     "from autograder.boundary import store",
                                     "import pytest"])
def test_a_planted_grader_import_on_the_worker_side_is_found(tmp_path, planted):
    copy = tmp_path / "autograder"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("graders", "solutions", "__pycache__"))
    proxies = copy / "boundary" / "proxies.py"
    proxies.write_text(proxies.read_text() + f"\n\ndef planted():\n    {planted}\n")
    assert worker_side_violations(copy), f"{planted!r} on the worker side was not reported"


def test_the_worker_loads_only_worker_side_modules():
    """What importing the worker really loads (the static look above could miss a relative or
    dynamic import)."""
    probe = ("import sys, autograder.boundary.forkserver as w\n"
             "print(' '.join(m for m in sys.modules if m.split('.')[0] in "
             "('autograder', 'reference', 'pytest')))")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=ROOT.parent, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    loaded = set(run.stdout.split())
    allowed = {f"autograder.boundary.{m}" for m in WORKER_SIDE} | {"autograder",
                                                                  "autograder.boundary"}
    assert loaded and loaded <= allowed, f"the worker loads grader-side code: {loaded - allowed}"


def test_rules_and_boundary_never_import_a_front_end():
    fronts = {f"autograder.{m}" for m in FRONT_ENDS}
    wrong = sorted((m, d) for m, deps in import_graph().items() for d in deps
                   if m.split(".")[1:2] in (["rules"], ["boundary"]) and d in fronts)
    assert not wrong, f"autograder.rules and autograder.boundary may not import front-ends: {wrong}"


def test_the_boundary_never_imports_the_rules():
    """One direction between the two layers: a rule may use the boundary (its causes, its wire),
    the boundary never a rule; what applies both is the learner layer above them."""
    wrong = sorted((m, d) for m, deps in import_graph().items() for d in deps
                   if m.split(".")[1:2] == ["boundary"] and d.split(".")[1:2] == ["rules"])
    assert not wrong, f"autograder.boundary may not import autograder.rules: {wrong}"


def test_every_learner_kind_implements_the_one_interface():
    """SandboxLearner, LocalLearner and BrokenLearner are ``Learner``s with nothing abstract left,
    and none adds a public method a grader test could come to rely on in one place only."""
    from autograder.grading import BrokenLearner
    from autograder.learner import Learner
    from autograder.local import LocalLearner
    from autograder.sandbox import SandboxLearner

    declared = {n for n in dir(Learner) if not n.startswith("_")}
    # what only the grading front-end drives (worker life cycle, the learner's printed output)
    lifecycle = {"start", "launch_worker", "close", "take_output", "uid", "memory_limit_mb",
                 "from_file"}
    for kind in (SandboxLearner, LocalLearner, BrokenLearner):
        assert issubclass(kind, Learner) and not kind.__abstractmethods__, kind
        extra = {n for n in dir(kind) if not n.startswith("_")} - declared - lifecycle
        assert not extra, f"{kind.__name__} has public methods outside Learner: {sorted(extra)}"


def test_no_import_cycles():
    cycles = modules_on_cycles(import_graph())
    assert not cycles, f"modules on an import cycle: {cycles}"


@pytest.mark.parametrize("old", sorted(autograder.MOVED))
def test_a_moved_module_names_its_new_place(old):
    new = autograder.MOVED[old]
    with pytest.raises(ModuleNotFoundError, match=f"{old} has moved: import {new.split()[0]}"):
        importlib.import_module(old)
    importlib.import_module(new.split()[0])
