"""MkDocs hook: block-level output of a code block is not wrapped in a paragraph.

markdown-exec leaves a placeholder paragraph where a block's HTML output goes, so a
figure, table or heatmap it prints (in a `=== "Figure"` tab, a `source="tabbed-*"`
block, or on its own) lands as `<p><figure>...</figure></p>`: invalid HTML (a paragraph
cannot hold block content; browsers close it early and leave an empty `<p>` with its
margins). This hook removes that paragraph around block-level output, keeping the output.
"""

from __future__ import annotations

import re
from typing import Any

_OPEN = re.compile(r"()<p>\s*(?=<(figure|div|svg|table)\b)")


def _element_end(html: str, start: int, tag: str) -> int | None:
    """The index just past the element `tag` that opens at `start` (nesting counted)."""
    tags = re.compile(rf"<(/?){tag}\b[^>]*?(/?)>")
    depth = 0
    for match in tags.finditer(html, start):
        closing, self_closing = match.group(1), match.group(2)
        if self_closing:
            if depth == 0:
                return match.end()
            continue
        depth += -1 if closing else 1
        if depth == 0:
            return match.end()
    return None


def unwrap_block_paragraphs(html: str) -> str:
    """`html` with no `<p>` opening on a block element (its inline tail keeps one)."""
    out: list[str] = []
    pos = 0
    for match in _OPEN.finditer(html):
        if match.start() < pos:
            continue
        end = _element_end(html, match.end(), match.group(2))
        if end is None:
            continue
        out.append(html[pos : match.start()])
        out.append(match.group(1))
        out.append(html[match.end() : end])
        closing = re.match(r"\s*</p>", html[end:])
        if closing is None:  # inline content follows: it keeps a paragraph of its own
            out.append("<p>")
            pos = end
        else:
            pos = end + closing.end()
    out.append(html[pos:])
    return "".join(out)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return unwrap_block_paragraphs(html)
