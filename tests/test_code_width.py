"""Code shown on the site fits the page column: no line of a shown fence over 88 characters.

The column of a page holds about 88 characters of code at the desktop width; a longer
line is cut at the right edge and has to be scrolled to. Output fences are included
(wrap what a block prints); markdown-exec blocks that do not show their source are not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from markdown_it import MarkdownIt

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)
LIMIT = 88


def _shown(info: str) -> bool:
    # markdown-exec shows a block's source only when asked (source="..."); else only its
    # result, which is HTML or a table here, not a line of code.
    return 'exec="on"' not in info or "source=" in info


def long_lines(markdown: str) -> list[tuple[int, int]]:
    """(line, length) of each code line over the limit in the page's shown fences."""
    found = []
    for token in MarkdownIt("commonmark").parse(markdown):
        if token.type != "fence" or token.map is None or not _shown(token.info):
            continue
        for k, line in enumerate(token.content.split("\n")):
            if len(line) > LIMIT:
                found.append((token.map[0] + 2 + k, len(line)))
    return found


def test_long_lines_are_found() -> None:
    page = "text\n\n```python\nx = 1\n" + "y = " + "1 + " * 30 + "1\n```\n"
    assert long_lines(page) == [(5, 4 + 4 * 30 + 1)]
    hidden = page.replace("```python", '```python exec="on"')
    assert long_lines(hidden) == []


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_code_fits_the_column(page: Path) -> None:
    assert long_lines(page.read_text("utf-8")) == []
