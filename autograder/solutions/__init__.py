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

Such a variant is either full code, like a solution section, or an *edit* of the solution
section with the same ``grade_id``: comment lines only, one or more ``# replace:`` /
``# with:`` pairs, each followed by the lines it stands for, every line written as ``# ``
plus the line exactly as in the code (its indentation kept; a lone ``#`` is an empty line)::

    # %% grade_id: tiled_attention | wrong: rescales l but not acc when the max grows
    # expect: multiply acc (as well as l) by exp(m_old - m_new)
    # replace:
    #             acc = acc * alpha[..., None] + p @ v[:, :, j:j + block_k]
    # with:
    #             acc = acc + p @ v[:, :, j:j + block_k]

A ``replace`` block is a run of whole lines that must occur exactly once in the solution
section; ``with`` gives the lines that take its place (none: the lines are deleted). All
blocks of a variant are found in the unedited solution and must not overlap. Comment lines
before the first ``# replace:`` (``# expect: ...``) head the edited code. Blank lines between
pairs are ignored. ``Section.applied_to(solution)`` / ``apply_edits`` build the variant's code
and raise ``EditError``, naming the variant, when a ``replace`` block is missing from the
solution or occurs more than once, so a changed solution cannot silently turn a variant into
the solution (or into a different slip).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

MARKER = re.compile(
    r"^# %% grade_id: (?P<gid>[A-Za-z_][A-Za-z0-9_]*)"
    r"(?:\s*\|\s*(?P<kind>[a-z]+):\s*(?P<label>.+?))?\s*$"
)
REPLACE, WITH = "# replace:", "# with:"


class EditError(ValueError):
    """A variant's edit does not fit its solution section (or is badly written)."""


@dataclass(frozen=True)
class Edit:
    """Replace the lines ``old`` (exactly once in the solution) by the lines ``new``."""
    old: tuple[str, ...]
    new: tuple[str, ...]
    line: int = 0  # line of its ``# replace:`` in the marked file (1-based; 0: unknown)


@dataclass(frozen=True)
class Section:
    grade_id: str
    kind: str  # "solution", "wrong", "cheat", ...
    label: str
    source: str  # the code; for an edit, its comment lines (``Section.applied_to`` gives the code)
    edits: tuple[Edit, ...] = ()  # non-empty: a variant written as an edit of the solution
    line: int = 0  # line of the marker in the marked file (1-based; 0: unknown)

    @property
    def name(self) -> str:
        """``grade_id | kind: label`` (the marker's text), for messages."""
        return f"{self.grade_id} | {self.kind}: {self.label}" if self.label else self.grade_id

    def applied_to(self, solution: str, where: str = "") -> Section:
        """This section with its edits applied to ``solution`` (the solution section's code);
        a full section is returned as it is. ``where`` (e.g. the file) prefixes error messages."""
        if not self.edits:
            return self
        variant = f"{where + ':' if where else ''}{self.line or '?'}: `{self.name}`"
        lines = self.source.splitlines()
        header = "".join(line + "\n" for line in lines[:lines.index(REPLACE)] if line.strip())
        code = apply_edits(solution, self.edits, variant=variant)
        return dataclasses.replace(self, source=header + code, edits=())


def _find(lines: list[str], block: tuple[str, ...]) -> list[int]:
    n = len(block)
    return [i for i in range(len(lines) - n + 1) if tuple(lines[i:i + n]) == block]


def apply_edits(solution: str, edits, *, variant: str = "variant") -> str:
    """``solution`` with every ``Edit`` applied: each ``old`` run of whole lines must occur
    exactly once in the unedited ``solution`` and the runs must not overlap. Raises
    ``EditError`` whose message starts with ``variant`` otherwise."""
    lines = solution.splitlines()
    spans: list[tuple[int, int, Edit]] = []
    for number, edit in enumerate(edits, 1):
        at = f"{variant}: replace block {number}" + (f" (line {edit.line})" if edit.line else "")
        if not edit.old:
            raise EditError(f"{at} is empty")
        found = _find(lines, tuple(edit.old))
        shown = "\n".join("    | " + line for line in edit.old)
        if not found:
            raise EditError(f"{at} is not in the solution (did the solution change?); "
                            f"the lines it looks for:\n{shown}")
        if len(found) > 1:
            raise EditError(f"{at} occurs {len(found)} times in the solution (at lines "
                            f"{', '.join(str(i + 1) for i in found)} of the section); "
                            f"add a neighbouring line to make it unique:\n{shown}")
        spans.append((found[0], found[0] + len(edit.old), edit))
    spans.sort(key=lambda s: s[0])
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:
            raise EditError(f"{variant}: replace blocks at lines {first.line} and {second.line} "
                            "overlap in the solution")
    out: list[str] = []
    done = 0
    for start, end, edit in spans:
        out += lines[done:start] + list(edit.new)
        done = end
    out += lines[done:]
    return "\n".join(out).strip("\n") + "\n"


def _parse_edits(body: list[str], first_line: int, name: str, where: str = "") -> tuple[Edit, ...]:
    """The ``# replace:`` / ``# with:`` pairs of a variant's body (``first_line``: the file line
    of ``body[0]``); empty when it has no ``# replace:`` line (a full section)."""
    if REPLACE not in body and WITH not in body:
        return ()
    where = where + ":" if where else "line "
    edits: list[Edit] = []
    block: str | None = None  # "replace" or "with": the block being read
    old: list[str] = []
    new: list[str] = []
    start = 0

    def close():
        if block == "replace":
            raise EditError(f"{where}{start}: `{name}`: a `{REPLACE}` block without its `{WITH}`")
        if block == "with":
            edits.append(Edit(tuple(old), tuple(new), start))

    for number, line in enumerate(body, first_line):
        if line == REPLACE:
            close()
            block, old, new, start = "replace", [], [], number
        elif line == WITH:
            if block != "replace":
                raise EditError(f"{where}{number}: `{name}`: `{WITH}` without a `{REPLACE}` "
                                "before it")
            block = "with"
        elif block is None:
            if line.strip() and not line.startswith("#"):
                raise EditError(f"{where}{number}: `{name}`: code before `{REPLACE}` in an edit "
                                "(an edit holds comment lines only)")
        elif not line.strip():
            continue  # blank lines separate pairs; an empty line of code is a lone "#"
        elif line == "#" or line.startswith("# "):
            (old if block == "replace" else new).append(line[2:])
        else:
            raise EditError(f"{where}{number}: `{name}`: {line!r} in an edit: every line of a "
                            "replace or with block is '# ' + the code line (or '#' alone)")
    close()
    return tuple(edits)


def split_sections(text: str, where: str = "") -> list[Section]:
    """Cut a marked file into its sections, in file order (text before the first marker is
    ignored). A variant section (``| kind: label``) with ``# replace:`` lines gets ``edits``;
    a badly written edit raises ``EditError`` (``where``, e.g. the file, prefixes its message)."""
    sections: list[Section] = []
    current: dict | None = None
    body: list[str] = []
    start = 0

    def close():
        if current is not None:
            src = "\n".join(body).strip("\n") + "\n"
            kind, label = current["kind"] or "solution", current["label"] or ""
            edits = ()
            if current["kind"]:
                edits = _parse_edits(body, start + 1, f"{current['gid']} | {kind}: {label}", where)
            sections.append(Section(current["gid"], kind, label, src, edits, start))

    for number, line in enumerate(text.splitlines(), 1):
        m = MARKER.match(line)
        if m:
            close()
            current, body, start = m.groupdict(), [], number
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
