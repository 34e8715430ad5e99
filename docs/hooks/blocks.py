"""The fences of a page, read the way the site renders them: the docs tooling's one parser.

Every tool that looks at a page's code reads it through this module: the output checker
(``outputs.py``, at build time and under pytest), pytest-markdown-docs (``conftest.py``
hands it :func:`markdown_it`), the notebook generator (``notebook.py``) and the width
test (``tests/test_code_width.py``). So they all see the same fences, at the same lines.

pymdownx writes a container, an admonition (``!!! note``), a collapsible block
(``??? success "Solution"``, ``???+``) or a content tab (``=== "Tab"``), as a header line
and a body indented by four spaces. To CommonMark that body is an indented code block or
part of a paragraph, so a fence inside it would be missed. :func:`unwrap_containers`
turns each header into a blank line and removes its body's indentation, so the fences
parse as if they stood at the top level, on the lines they have in the file; :func:`read`
then parses the result with markdown-it and keeps, for each fence, the containers it
stands in (the notebook generator turns those into alert boxes and collapsed solutions).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

CONTAINER = re.compile(
    r'^(?P<indent> *)(?P<marker>!!!|\?\?\?\+?|===)[ \t]+(?P<kind>[\w-]*)[^"]*(?:"(?P<title>.*)")?'
)
FENCE_OPEN = re.compile(r"^(?P<ticks>`{3,}|~{3,})")
OUTPUT_INFO = re.compile(r'^text\b.*\btitle="Output"')
PYTHON_LANGS = ("python", "py", "python3")


@dataclass(frozen=True)
class Container:
    """An admonition, collapsible block or content tab that a fence stands in."""

    marker: str  # "!!!", "???", "???+" or "==="
    kind: str  # "note", "warning", "success"...; "" for a tab
    title: str | None  # the quoted title, if any
    line: int  # 0-based line of its header

    @property
    def collapsed(self) -> bool:
        """A ``???`` block, shown closed until the reader opens it."""
        return self.marker == "???"


@dataclass(frozen=True)
class Fence:
    """A fenced block of a page, wherever it stands (top level or in containers)."""

    info: str
    content: str  # its lines without the containers' indentation
    start: int  # 0-based line of the opening fence
    end: int  # 0-based line just after the closing fence
    indent: int  # spaces removed from its lines by :func:`unwrap_containers`
    containers: tuple[Container, ...]  # outermost first

    @property
    def line(self) -> int:
        """1-based line of the opening fence, as pytest-markdown-docs names its items."""
        return self.start + 1

    @property
    def words(self) -> list[str]:
        """The info string's words, language first (``{.python notest}`` too)."""
        return info_words(self.info)

    @property
    def lang(self) -> str:
        words = self.words
        return words[0] if words else ""

    @property
    def is_python(self) -> bool:
        return self.lang in PYTHON_LANGS

    @property
    def runs(self) -> bool:
        """Run under pytest (pytest-markdown-docs runs every Python fence not ``notest``)."""
        return self.is_python and "notest" not in self.words

    @property
    def is_exec(self) -> bool:
        """A markdown-exec block: run at build time by markdown-exec, which shows its result."""
        return any(w.startswith("exec=") for w in self.words) and 'exec="off"' not in self.info

    @property
    def continuation(self) -> bool:
        """It runs in the namespace its page's earlier blocks left (pytest-markdown-docs)."""
        return "continuation" in self.words

    @property
    def is_output(self) -> bool:
        """A ``text title="Output"`` fence: what the block before it prints."""
        return bool(OUTPUT_INFO.match(self.info.strip()))

    @property
    def shown(self) -> bool:
        """Its text is on the page: markdown-exec shows a block's source only if asked."""
        return not self.is_exec or "source=" in self.info


@dataclass(frozen=True)
class Page:
    markdown: str  # the page as written
    text: str  # the page with its containers unwrapped (same lines)
    removed: tuple[int, ...]  # per line, the spaces the unwrapping removed
    containers: tuple[tuple[Container, ...], ...]  # per line, the containers it is in
    fences: tuple[Fence, ...]


def info_words(info: str) -> list[str]:
    """A fence's info string as words, language first: ``{.python notest}`` too."""
    info = info.strip()
    if info.startswith("{"):
        words = info.strip("{}").split()
        lang = next((w[1:] for w in words if w.startswith(".")), "")
        return [lang] + [w for w in words if not w.startswith(".")]
    return info.split()


def _unwrap(markdown: str) -> tuple[list[str], list[int], list[tuple[Container, ...]]]:
    lines = markdown.split("\n")
    removed = [0] * len(lines)
    inside: list[tuple[Container, ...]] = [()] * len(lines)
    stack: list[tuple[int, Container]] = []  # (body indentation, container), innermost last
    fence: str | None = None  # the ticks of the fence we are inside, if any
    for n, line in enumerate(lines):
        spaces = len(line) - len(line.lstrip(" "))
        if line.strip() and fence is None:
            while stack and spaces < stack[-1][0]:
                stack.pop()
        cut = min(stack[-1][0], spaces) if stack else 0
        text = line[cut:]
        inside[n] = tuple(c for _, c in stack)
        if fence is not None:
            closing = text.strip()
            if len(closing) >= len(fence) and not closing.strip(fence[0]):
                fence = None
        elif (header := CONTAINER.match(text)) is not None:
            container = Container(header["marker"], header["kind"], header["title"], n)
            stack.append((cut + len(header["indent"]) + 4, container))
            lines[n], removed[n] = "", len(line)
            continue
        elif (opening := FENCE_OPEN.match(text.lstrip(" "))) is not None:
            fence = opening["ticks"]
        lines[n], removed[n] = text, cut
    return lines, removed, inside


def unwrap_containers(markdown: str) -> tuple[str, list[int]]:
    """The page with container headers blanked and their bodies dedented, lines kept.

    Returns the new text and, per line, how many leading spaces were removed.
    """
    lines, removed, _ = _unwrap(markdown)
    return "\n".join(lines), removed


@functools.cache
def commonmark() -> Any:
    """The CommonMark parser the tools share (markdown-it, as pytest-markdown-docs uses).

    One instance, made once: parsing does not change it.
    """
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark")


def markdown_it() -> Any:
    """A CommonMark parser that reads a page with its containers unwrapped.

    pytest-markdown-docs collects its fences through this (``conftest.py``), so it finds
    the same fences as every other tool, at the same lines.
    """
    from markdown_it import MarkdownIt

    class UnwrappingMarkdownIt(MarkdownIt):
        def parse(self, src: str, env: Any = None) -> Any:
            return super().parse(unwrap_containers(src)[0], env)

    return UnwrappingMarkdownIt("commonmark")


@functools.lru_cache(maxsize=128)
def read(markdown: str) -> Page:
    """Parse a page: its unwrapped text and every fence, containers included.

    A page is read several times in a build (its output check, its notebook, its
    record); the :class:`Page` is immutable, so the parse of one text is kept.
    """
    lines, removed, inside = _unwrap(markdown)
    text = "\n".join(lines)
    fences = []
    for token in commonmark().parse(text):
        if token.type != "fence" or token.map is None:
            continue
        start, end = token.map
        fences.append(
            Fence(
                info=token.info,
                content=token.content,
                start=start,
                end=end,
                indent=removed[start],
                containers=inside[start],
            )
        )
    return Page(markdown, text, tuple(removed), tuple(inside), tuple(fences))


@dataclass
class Block:
    """A Python fence that runs, and the output fence that follows it, if any."""

    code: str
    line: int  # 1-based line of the opening fence of the code
    output: str | None = None
    output_line: int | None = None  # 1-based line of the opening fence of the output
    output_span: tuple[int, int] | None = None  # 0-based [start, end) lines of its content
    output_indent: int = 0  # spaces before the output's lines (inside an admonition)
    fence: Fence | None = None

    @property
    def is_exec(self) -> bool:
        return self.fence is not None and self.fence.is_exec

    @property
    def continuation(self) -> bool:
        return self.fence is not None and self.fence.continuation


def code_blocks(markdown: str | Page, *, exec_blocks: bool = False) -> list[Block]:
    """The page's Python blocks that run, each with the output fence right after it.

    markdown-exec blocks (``exec="on"``) are left out unless ``exec_blocks``: their result
    is shown by markdown-exec, not in an output fence.
    """
    page = read(markdown) if isinstance(markdown, str) else markdown
    lines = page.text.split("\n")
    blocks = []
    for k, fence in enumerate(page.fences):
        if not fence.runs or (fence.is_exec and not exec_blocks):
            continue
        block = Block(code=fence.content, line=fence.line, fence=fence)
        nxt = page.fences[k + 1] if k + 1 < len(page.fences) else None
        # Only blank lines between the two fences: the output belongs to that code.
        if nxt is not None and nxt.is_output and not "".join(lines[fence.end : nxt.start]).strip():
            block.output = nxt.content
            block.output_line = nxt.line
            block.output_span = (nxt.start + 1, nxt.end - 1)
            block.output_indent = nxt.indent
        blocks.append(block)
    return blocks
