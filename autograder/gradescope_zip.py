"""``python -m autograder gradescope CHAPTER -o DIR``: the autograder zip for one chapter.

The zip holds, at its root, ``setup.sh`` and ``run_autograder`` (with the chapter written in:
the chapter is the instructor's choice, never read from the student's file name), the pins
``torch-requirement.txt`` and ``grading-requirements.txt``, and the code grading imports:
``autograder/`` (without the solutions, which grading never reads) and ``reference/``.
"""
from __future__ import annotations

import re
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "autograder" / "gradescope"
PACKAGES = ("autograder", "reference")
LEFT_OUT = ("autograder/solutions",)


def resolve_chapter(chapter: str) -> str:
    """Full chapter name (``ch01_naive_decoding``) for ``ch01`` or the full name; ValueError
    naming the known chapters otherwise."""
    graders = sorted(p.stem for p in (ROOT / "autograder" / "graders").glob("ch[0-9][0-9]_*.py"))
    matches = [g for g in graders if g == chapter or g.split("_", 1)[0] == chapter]
    if len(matches) != 1:
        raise ValueError(f"unknown chapter {chapter!r}; known: {', '.join(graders)}")
    return matches[0]


def torch_requirement() -> str:
    """The ``torch==X`` line of requirements.txt, so Gradescope grades with the tested version."""
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if re.match(r"^torch\s*[=<>~!]", line):
            return line.split("#")[0].strip()
    return "torch"


def files_to_ship() -> list[Path]:
    """Source files of the packages grading imports, relative to the repository root."""
    shipped = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            relative = path.relative_to(ROOT)
            if path.is_file() and "__pycache__" not in relative.parts and \
                    not str(relative).startswith(LEFT_OUT):
                shipped.append(relative)
    return shipped


def build(chapter: str, out_dir: str | Path) -> Path:
    """Write ``OUT_DIR/gradescope_<chapter>.zip`` and return its path."""
    chapter = resolve_chapter(chapter)
    out = Path(out_dir) / f"gradescope_{chapter}.zip"
    out.parent.mkdir(parents=True, exist_ok=True)
    run_autograder = (TEMPLATES / "run_autograder").read_text().replace("@CHAPTER@", chapter)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        def add(name: str, text: str | bytes, mode: int = 0o644) -> None:
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, text)

        add("setup.sh", (TEMPLATES / "setup.sh").read_text(), 0o755)
        add("run_autograder", run_autograder, 0o755)
        add("torch-requirement.txt", torch_requirement() + "\n")
        add("grading-requirements.txt", (TEMPLATES / "grading-requirements.txt").read_text())
        for relative in files_to_ship():
            add(relative.as_posix(), (ROOT / relative).read_bytes())
    return out
