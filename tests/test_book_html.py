"""The built book as a reader sees it (`_build/html`, made by the README's first command, which CI
runs before the suite): every data table is an HTML table, no page shows a traceback, and no
`{glue:...}` role is left unrendered."""
from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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


def test_the_checks_catch_what_they_look_for():
    parsed = Paragraphs()
    parsed.feed("<p>| a | b |\n|---|---|\n| 1 | 2 |</p><p>a | b</p><table><tr><td>| x | y | z</td></tr></table>")
    assert raw_tables(parsed) == ["| a | b |\n|---|---|\n| 1 | 2 |"]
