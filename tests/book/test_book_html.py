"""The built book as a reader sees it (`_build/html`, made by the README's first command, which CI
runs before the suite): every data table is an HTML table, no page shows a traceback, no
`{glue:...}` role is left unrendered, and no code line a reader sees is wider than the page's
code column."""
from __future__ import annotations

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
