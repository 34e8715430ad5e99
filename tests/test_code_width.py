"""Code shown on the site fits the page column: no line of a shown fence over 88 characters.

The column of a page holds about 88 characters of code at the desktop width; a longer
line is cut at the right edge and has to be scrolled to. Output fences are included
(wrap what a block prints); markdown-exec blocks that do not show their source are not.
Fences are read by docs/hooks/blocks.py, as the build and the tests read them: those in
admonitions, collapsed solutions and content tabs count, measured without the
container's indentation (which the page does not show).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hooks import blocks

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)
LIMIT = 88


def long_lines(markdown: str) -> list[tuple[int, int]]:
    """(line, length) of each code line over the limit in the page's shown fences."""
    found = []
    for fence in blocks.read(markdown).fences:
        if not fence.shown:
            continue
        for k, line in enumerate(fence.content.split("\n")):
            if len(line) > LIMIT:
                found.append((fence.start + 2 + k, len(line)))
    return found


def test_long_lines_are_found() -> None:
    long = "y = " + "1 + " * 30 + "1"
    page = f"text\n\n```python\nx = 1\n{long}\n```\n"
    assert long_lines(page) == [(5, len(long))]
    hidden = page.replace("```python", '```python exec="on"')
    assert long_lines(hidden) == []
    # Inside a collapsed solution, a tab and a note, under a list item: the same line,
    # measured without the indentation the containers add.
    nested = (
        "1. Exercise.\n\n"
        '    ??? success "Solution"\n\n'
        f"        ```python\n        {long}\n        ```\n\n"
        '=== "Tab"\n\n'
        f"    !!! note\n\n        ```text\n        {long}\n        ```\n"
    )
    assert long_lines(nested) == [(6, len(long)), (14, len(long))]
    assert long_lines(nested.replace(long, long[:LIMIT])) == []


def test_every_fence_is_seen() -> None:
    # Plain CommonMark reads a container's body as indented text; the shared parser must
    # see at least every fence it sees, and the ones in containers besides.
    seen = plain = 0
    for page in PAGES:
        text = page.read_text("utf-8")
        seen += len(blocks.read(text).fences)
        plain += sum(t.type == "fence" for t in blocks.commonmark().parse(text))
    assert seen > plain > 300


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_code_fits_the_column(page: Path) -> None:
    assert long_lines(page.read_text("utf-8")) == []
