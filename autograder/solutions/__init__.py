"""Solution code for the exercise notebooks, one module per chapter.

Each chapter file (``chNN_topic.py``) is plain Python split into sections by marker lines::

    # %% grade_id: naive_work
    def naive_work(prompt_len, n_new):
        ...

A section runs from its marker to the next marker (or the end of the file) and is exactly
what a learner would type into the solution cell with that ``grade_id``. Sections never
import ``reference``: they are injected into notebooks and graded like learner code.

The same marker syntax, with a trailing ``| kind: label``, describes the known-wrong and
cheating submissions kept under ``tests/submissions/``::

    # %% grade_id: naive_work | wrong: counts the step after appending
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

MARKER = re.compile(
    r"^# %% grade_id: (?P<gid>[A-Za-z_][A-Za-z0-9_]*)"
    r"(?:\s*\|\s*(?P<kind>[a-z]+):\s*(?P<label>.+?))?\s*$"
)


@dataclass(frozen=True)
class Section:
    grade_id: str
    kind: str  # "solution", "wrong", "cheat", ...
    label: str
    source: str


def split_sections(text: str) -> list[Section]:
    """Cut a marked file into its sections, in file order (text before the first marker is ignored)."""
    sections: list[Section] = []
    current: dict | None = None
    body: list[str] = []

    def close():
        if current is not None:
            src = "\n".join(body).strip("\n") + "\n"
            sections.append(Section(current["gid"], current["kind"] or "solution",
                                    current["label"] or "", src))

    for line in text.splitlines():
        m = MARKER.match(line)
        if m:
            close()
            current, body = m.groupdict(), []
        elif current is not None:
            body.append(line)
    close()
    return sections


def chapter_file(chapter: str) -> Path:
    path = HERE / f"{chapter}.py"
    if not path.exists():
        raise FileNotFoundError(f"no solutions for chapter {chapter!r} (looked for {path})")
    return path


def load_solutions(chapter: str) -> dict[str, str]:
    """``{grade_id: source}`` of the solution cells of ``chapter`` (e.g. ``"ch01_naive_decoding"``)."""
    out: dict[str, str] = {}
    for sec in split_sections(chapter_file(chapter).read_text()):
        if sec.kind != "solution":
            continue
        if sec.grade_id in out:
            raise ValueError(f"{chapter}: two solution sections for {sec.grade_id!r}")
        out[sec.grade_id] = sec.source
    return out


def chapters() -> list[str]:
    """Chapters that have a solution file, sorted."""
    return sorted(p.stem for p in HERE.glob("ch[0-9][0-9]_*.py"))
