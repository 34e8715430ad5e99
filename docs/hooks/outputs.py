"""Run every Python block of a page and check the output shown under it.

A chapter shows a block's output in a fence right after it::

    ```python continuation
    print(torch.tensor([0.5, 1.0]))
    ```

    ```text title="Output"
    tensor([0.5000, 1.0000])
    ```

This module is used three ways, with one implementation:

- as an MkDocs hook (``hooks:`` in ``mkdocs.yml``): each page's blocks run at build time,
  and a block that raises, prints something it does not show, or shows an output that
  differs from what it prints is a warning, so ``mkdocs build --strict`` fails;
- from ``tests/conftest.py``: one pytest item per output fence, failing with the Markdown
  file and line;
- as a script that rewrites the stored outputs after a deliberate change::

      python docs/hooks/outputs.py --update docs/article/*.md

Fences indented inside an admonition (``!!! note``), a collapsible block (``??? success
"Solution"``, pymdownx.details) or a content tab (``=== "Tab"``) count like the others:
Markdown would read them as indented text, so the page is parsed with those containers
unwrapped (:func:`unwrap_containers`), line numbers kept.

Blocks run in order in one namespace per page. A block marked ``notest`` is skipped, and
markdown-exec blocks (``exec="on"``) are left to markdown-exec. Numbers are compared with a
tolerance of one unit in the last printed digit, so a value that rounds differently on
another BLAS (``-0.26265`` shown as ``-0.2626`` or ``-0.2627``) still matches; every other
character must be equal, up to whitespace.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUTPUT_INFO = re.compile(r'^text\b.*\btitle="Output"')
PYTHON_LANGS = ("python", "py", "python3")
NUMBER = re.compile(r"-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")

log = logging.getLogger("mkdocs.hooks.outputs")


@dataclass
class Block:
    """A Python fence and the output fence that follows it, if any."""

    code: str
    line: int  # 1-based line of the opening fence of the code
    output: str | None = None
    output_line: int | None = None  # 1-based line of the opening fence of the output
    output_span: tuple[int, int] | None = None  # 0-based [start, end) lines of its content
    output_indent: int = 0  # spaces before the output's lines (inside an admonition)


@dataclass
class Result:
    block: Block
    printed: str = ""
    error: str | None = None
    problem: str | None = None  # why the shown output is wrong, if it is

    def describe(self, path: str) -> str | None:
        """What is wrong with this block, located as `file:line`; None if nothing is."""
        if self.error is not None:
            return f"{path}:{self.block.line}: the block raised\n{self.error}"
        if self.problem is not None:
            return f"{path}:{self.block.output_line or self.block.line}: {self.problem}"
        return None


@dataclass
class PageRun:
    path: str
    results: list[Result] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [m for r in self.results if (m := r.describe(self.path)) is not None]


def _info_words(info: str) -> list[str]:
    info = info.strip()
    if info.startswith("{"):
        words = info.strip("{}").split()
        lang = next((w[1:] for w in words if w.startswith(".")), "")
        return [lang] + [w for w in words if not w.startswith(".")]
    return info.split()


CONTAINER = re.compile(r"^(?P<indent> *)(?:!!!|\?\?\?\+?|===)[ \t]")
FENCE_OPEN = re.compile(r"^(?P<ticks>`{3,}|~{3,})")


def unwrap_containers(markdown: str) -> tuple[str, list[int]]:
    """The page with admonition, details and tab bodies dedented, and the spaces removed.

    pymdownx writes a container as a header line (``??? success "Solution"``) and a body
    indented by four spaces; to CommonMark, which the test tools use, that body is an
    indented code block or part of a paragraph, so its fences would be missed. Here each
    header becomes a blank line and each body line loses its container's indentation, so
    the fences parse as if they stood at the top level, on the same line numbers. Returns
    the new text and, per line, how many leading spaces were removed.
    """
    lines = markdown.split("\n")
    removed = [0] * len(lines)
    stack: list[int] = []  # the body indentation of each open container, innermost last
    fence: str | None = None  # the ticks of the fence we are inside, if any
    for n, line in enumerate(lines):
        spaces = len(line) - len(line.lstrip(" "))
        if line.strip() and fence is None:
            while stack and spaces < stack[-1]:
                stack.pop()
        cut = min(stack[-1], spaces) if stack else 0
        text = line[cut:]
        if fence is not None:
            closing = text.strip()
            if len(closing) >= len(fence) and not closing.strip(fence[0]):
                fence = None
        elif (header := CONTAINER.match(text)) is not None:
            stack.append(cut + len(header["indent"]) + 4)
            lines[n], removed[n] = "", len(line)
            continue
        elif (opening := FENCE_OPEN.match(text.lstrip(" "))) is not None:
            fence = opening["ticks"]
        lines[n], removed[n] = text, cut
    return "\n".join(lines), removed


def parse_blocks(markdown: str) -> list[Block]:
    """The runnable Python blocks of a page, each with the output fence right after it."""
    from markdown_it import MarkdownIt

    markdown, removed = unwrap_containers(markdown)
    tokens = [t for t in MarkdownIt("commonmark").parse(markdown) if t.map is not None]
    blocks: list[Block] = []
    for i, tok in enumerate(tokens):
        if tok.type != "fence" or tok.map is None:
            continue
        words = _info_words(tok.info)
        if not words or words[0] not in PYTHON_LANGS:
            continue
        if "notest" in words or any(w.startswith("exec=") for w in words):
            continue
        block = Block(code=tok.content, line=tok.map[0] + 1)
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if nxt is not None and nxt.type == "fence" and nxt.map and OUTPUT_INFO.match(nxt.info):
            block.output = nxt.content
            block.output_line = nxt.map[0] + 1
            block.output_span = (nxt.map[0] + 1, nxt.map[1] - 1)
            block.output_indent = removed[nxt.map[0]]
        blocks.append(block)
    return blocks


def _tolerance(token: str) -> float:
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    if decimals == 0 and not exponent and "." not in mantissa:
        return 0.0  # integers (shapes, indices) must match exactly
    return 10.0 ** (int(exponent or 0) - decimals) * 1.000001


def compare(shown: str, printed: str) -> str | None:
    """None if `printed` matches `shown`, else a short description of the first difference."""
    shown_text = NUMBER.split(" ".join(shown.split()))
    printed_text = NUMBER.split(" ".join(printed.split()))
    shown_nums = NUMBER.findall(" ".join(shown.split()))
    printed_nums = NUMBER.findall(" ".join(printed.split()))
    if [t.strip() for t in shown_text] != [t.strip() for t in printed_text] or len(
        shown_nums
    ) != len(printed_nums):
        return "the output shown differs from what the code prints"
    for k, (a, b) in enumerate(zip(shown_nums, printed_nums, strict=True)):
        if abs(float(a) - float(b)) > max(_tolerance(a), _tolerance(b)):
            return f"number #{k + 1} differs: shown {a}, printed {b}"
    return None


def _fresh_state() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_printoptions(profile="default")


def run_page(path: str | Path, markdown: str | None = None) -> PageRun:
    """Run the page's blocks in order, in one namespace, and check each shown output."""
    path = Path(path)
    markdown = path.read_text(encoding="utf-8") if markdown is None else markdown
    run = PageRun(str(path))
    namespace: dict[str, Any] = {"__name__": "__main__"}
    _fresh_state()
    failed = False
    for block in parse_blocks(markdown):
        result = Result(block)
        run.results.append(result)
        if failed:
            result.error = "  (not run: an earlier block on this page raised)"
            continue
        # Pad with blank lines so tracebacks point at the Markdown line.
        source = "\n" * block.line + block.code
        buffer = io.StringIO()
        try:
            code = compile(source, str(path), "exec", dont_inherit=True)
            with contextlib.redirect_stdout(buffer):
                exec(code, namespace)
        except Exception:
            failed = True
            result.error = "".join(traceback.format_exception(*sys.exc_info(), limit=-3)).rstrip()
            continue
        result.printed = buffer.getvalue()
        if block.output is None:
            if result.printed.strip():
                result.problem = (
                    f"block at line {block.line} prints output but the page does not show it; "
                    'add a ```text title="Output" fence right after it'
                )
        else:
            diff = compare(block.output, result.printed)
            if diff is not None:
                result.problem = (
                    f"{diff}\n--- shown\n{block.output.rstrip()}\n+++ printed\n"
                    f"{result.printed.rstrip()}\n(regenerate with: "
                    f"python docs/hooks/outputs.py --update {path})"
                )
    return run


def update_page(path: str | Path) -> int:
    """Rewrite the page's output fences with what the code prints; return how many changed."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    run = run_page(path)
    changed = 0
    for result in reversed(run.results):
        if result.error is not None:
            raise SystemExit(f"{path}:{result.block.line}: the block raised\n{result.error}")
        span = result.block.output_span
        if span is None:
            continue
        pad = " " * result.block.output_indent
        new = [pad + line if line else line for line in result.printed.rstrip("\n").split("\n")]
        if lines[span[0] : span[1]] != new:
            lines[span[0] : span[1]] = new
            changed += 1
    path.write_text("\n".join(lines), encoding="utf-8")
    return changed


# MkDocs hook ---------------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "```" not in markdown or not page.file.src_uri.endswith(".md") or page.file.generated_by:
        return markdown
    # Read the file itself: `markdown` has lost its front matter, which would shift lines.
    docs_dir = Path(config["docs_dir"])
    path = docs_dir / page.file.src_uri
    run = run_page(path.relative_to(docs_dir.parent) if docs_dir.is_absolute() else path)
    for problem in run.problems:
        log.warning(problem)
    return markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--update", action="store_true", help="rewrite the stored outputs")
    args = parser.parse_args(argv)
    status = 0
    for path in args.files:
        if args.update:
            print(f"{path}: {update_page(path)} output(s) updated")
            continue
        problems = run_page(path).problems
        for problem in problems:
            print(problem, file=sys.stderr)
        status |= bool(problems)
    return status


if __name__ == "__main__":
    sys.exit(main())
