"""Fast checks of the book's sources (the chapters themselves are executed by nbval).

- every entry of _toc.yml points to an existing file under book/;
- every notebook under book/ is committed without outputs or execution counts;
- no book page repeats a source document word for word (../shared/tools/seed_overlap.py);
- the book loads math from the local MathJax copy, not from a CDN.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
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
