"""The built book as a reader sees it (`_build/html`, made by the README's first command, which CI
runs before the suite): every data table is an HTML table, no page shows a traceback, no
`{glue:...}` role is left unrendered, no code line a reader sees is wider than the page's code
column, and no code a reader sees unfolded is an exercise's answer."""
from __future__ import annotations

import ast
import functools
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
PAGES = sorted((HTML / "book").glob("*.html")) if HTML.is_dir() else []


class Paragraphs(HTMLParser):
    """The text of every <p> element and of the whole page (scripts and styles left out)."""

    def __init__(self):
        super().__init__()
        self.paragraphs: list[str] = []
        self.text: list[str] = []
        self._open_p: list[str] | None = None
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self._skip += 1
        elif tag == "p":
            self._open_p = []

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1
        elif tag == "p" and self._open_p is not None:
            self.paragraphs.append("".join(self._open_p).strip())
            self._open_p = None

    def handle_data(self, data):
        if self._skip:
            return
        self.text.append(data)
        if self._open_p is not None:
            self._open_p.append(data)


COLUMN_CHARS = 80
"""The widest code line a reader sees whole at a 1280-pixel-wide window, in characters.

Measured in Chromium on the built pages at 1280 px: sphinx-book-theme 1.3 shows the chapter list
on the left and the page's contents on the right, and a cell's `<pre>` between them is 672 px wide,
640 px of text inside its 16 px paddings. The theme sets code in 14 px (0.875em) of its monospace
stack (DejaVu Sans Mono where nothing earlier in the stack is installed, 0.602 em a character):
8.43 px a character, 75 characters; a 76-character line already overflowed behind a scroll bar.
book/_static/code-width.css sets code blocks in 13 px instead (7.83 px a character): 81
characters fit, and every line of 80 or fewer was shown whole (no `<pre>` of the built book with
such lines overflowed). 80 keeps a character in hand, and is the width the chapters are written
to. Without that style sheet the threshold would be 75."""
CODE_CSS = "code-width.css"


class CodeLines(HTMLParser):
    """The lines of every `<pre>` a reader sees without opening anything: a cell whose input or
    output is hidden (MyST-NB's `hide-input` / `hide-output` tags) sits in a `<details
    class="... hide ...">` and is left out; removed cells are not in the page at all."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []
        self._details: list[bool] = []     # per open <details>: is it a hidden cell part?
        self._pre: list[str] | None = None
        self._pre_depth = 0

    def handle_starttag(self, tag, attrs):
        if tag == "details":
            self._details.append("hide" in (dict(attrs).get("class") or "").split())
        elif tag == "pre":
            self._pre_depth += 1
            if self._pre_depth == 1 and not any(self._details):
                self._pre = []

    def handle_endtag(self, tag):
        if tag == "details" and self._details:
            self._details.pop()
        elif tag == "pre" and self._pre_depth:
            self._pre_depth -= 1
            if self._pre_depth == 0 and self._pre is not None:
                self.lines.extend("".join(self._pre).expandtabs().splitlines())
                self._pre = None

    def handle_data(self, data):
        if self._pre is not None:
            self._pre.append(data)


def wide_code_lines(html: str, limit: int = COLUMN_CHARS) -> list[str]:
    """The visible code lines of a page longer than `limit` characters (trailing spaces aside)."""
    parser = CodeLines()
    parser.feed(html)
    return [line for line in parser.lines if len(line.rstrip()) > limit]


def read(page: Path) -> Paragraphs:
    parser = Paragraphs()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def raw_tables(parsed: Paragraphs) -> list[str]:
    """Paragraphs that are a Markdown table left as text: start with '|' and hold 3+ pipes."""
    return [p for p in parsed.paragraphs if p.startswith("|") and p.count("|") >= 3]


def test_the_book_was_built():
    assert PAGES, (f"no built chapters under {HTML / 'book'}: build the book first, with the README's "
                   "first command (jupyter-book build --all --warningiserror --keep-going .)")


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_page_shows_tables_as_tables_and_no_errors(page):
    parsed = read(page)
    text = "".join(parsed.text)
    assert not raw_tables(parsed), (
        f"{page.name}: a Markdown table rendered as a paragraph of pipes: {raw_tables(parsed)[0][:120]!r}. "
        "Displayed Markdown must be parsed as MyST (nb_render_markdown_format) and a table needs its "
        "own block (a blank line before it)")
    assert "Traceback (most recent call last)" not in text, f"{page.name} shows a Python traceback"
    left = re.findall(r"\{glue:\w+\}`?[\w.:]*", text)
    assert not left, f"{page.name}: glue roles left unrendered: {left[:3]}"
    assert 'class="output stderr' not in page.read_text(encoding="utf-8"), (
        f"{page.name} shows a cell's stderr (a warning) to the reader: fix its cause or silence it narrowly")
    zero = [p for p in parsed.paragraphs if "0.0e+00" in p]
    assert not zero, (f"{page.name}: prose prints a zero difference as a number: {zero[0][:120]!r}; "
                      "word it with reference.bench.prose.agreement_phrase")


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_every_visible_code_line_fits_the_column(page):
    html = page.read_text(encoding="utf-8")
    assert CODE_CSS in html, (
        f"{page.name} does not load {CODE_CSS}: without its 13 px code font the column at 1280 px "
        f"holds 75 characters, not {COLUMN_CHARS} (html_css_files in _config.yml)")
    wide = wide_code_lines(html)
    assert not wide, (
        f"{page.name}: {len(wide)} code line(s) a reader sees are wider than {COLUMN_CHARS} "
        f"characters, the code column at 1280 px; the first: {wide[0]!r}. Wrap the input, print "
        "shorter lines (textwrap, fewer columns), or move plumbing (glue, plotting) into a hidden "
        "cell (tags remove-cell, remove-input or hide-input)")


def _normal(line: str) -> str:
    """A code line without its indentation, trailing comment and repeated spaces."""
    return re.sub(r"\s+", " ", re.sub(r"\s+#.*$", "", line.strip()))


def answer_lines(source: str, names: set[str] | None = None) -> set[str]:
    """The lines of ``source``'s function bodies (of the functions ``names`` only, if given) that
    give an answer away: 25 characters or more, docstrings and comments left out."""
    tree = ast.parse(source)
    lines = source.splitlines()
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    found = set()
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef) and (names is None or function.name in names):
            for statement in function.body:
                for number in range(statement.lineno, statement.end_lineno + 1):
                    line = _normal(lines[number - 1])
                    if number not in docstrings and len(line) >= 25 and not line.startswith("#"):
                        found.add(line)
    return found


@functools.cache
def exercise_answers() -> dict[str, set[str]]:
    """Every exercise's answer as the lines that give it away: each solution cell
    (``autograder/solutions``), and each function of ``reference/`` named after an exercise
    (``tiled_attention``, ``_softmax_kernel``...), the course's own version of it."""
    from autograder.solutions import chapters, load_solutions
    answers = {f"{chapter} `{grade_id}`": answer_lines(source)
               for chapter in chapters() for grade_id, source in load_solutions(chapter).items()}
    grade_ids = {name.split("`")[1] for name in answers}
    for path in sorted((ROOT / "reference").rglob("*.py")):
        source = path.read_text()
        named = {n.name for n in ast.walk(ast.parse(source))
                 if isinstance(n, ast.FunctionDef) and n.name.lstrip("_") in grade_ids}
        for name in named:
            answers[f"{path.relative_to(ROOT)} `{name}`"] = answer_lines(source, {name})
    return answers


def answers_shown(html: str) -> dict[str, list[str]]:
    """The exercise answers of which a page shows two lines or more unfolded, with those lines."""
    parser = CodeLines()
    parser.feed(html)
    visible = {_normal(line) for line in parser.lines}
    shown = {name: sorted(lines & visible) for name, lines in exercise_answers().items()}
    return {name: lines for name, lines in shown.items() if len(lines) >= 2}


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_no_visible_code_is_an_exercise_answer(page):
    shown = answers_shown(page.read_text(encoding="utf-8"))
    assert not shown, (
        f"{page.name} shows the answer to an exercise unfolded: {shown}. Teach with code the "
        "exercises do not ask for, or fold it in a dropdown after the exercise pointer")


def test_the_answer_check_sees_an_answer_only_where_it_is_unfolded():
    from autograder.solutions import load_solutions
    answer = load_solutions("ch06_online_softmax")["online_softmax"]
    shown = f"<div class='highlight'><pre>{answer}</pre></div>"
    folded = f"<details class='admonition hide above-input'><pre>{answer}</pre></details>"
    assert "ch06_online_softmax `online_softmax`" in answers_shown(shown)
    assert answers_shown(folded) == {}


def test_the_width_check_catches_a_wide_line_and_only_where_it_is_seen():
    wide, fits = "x" * (COLUMN_CHARS + 1), "y" * COLUMN_CHARS
    page = (f"<div class='highlight'><pre><span>{wide[:40]}</span>{wide[40:]}\n{fits}</pre></div>"
            f"<details class='admonition hide above-input'><summary>Show code</summary>"
            f"<pre>{'h' * 120}</pre></details>"
            f"<details class='dropdown'><pre>{'z' * (COLUMN_CHARS + 1)}</pre></details>"
            f"<p>{'p' * 200}</p><pre>{fits}   </pre>")
    assert wide_code_lines(page) == [wide, "z" * (COLUMN_CHARS + 1)]


def test_the_checks_catch_what_they_look_for():
    parsed = Paragraphs()
    parsed.feed("<p>| a | b |\n|---|---|\n| 1 | 2 |</p><p>a | b</p><table><tr><td>| x | y | z</td></tr></table>")
    assert raw_tables(parsed) == ["| a | b |\n|---|---|\n| 1 | 2 |"]
