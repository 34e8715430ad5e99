"""One downloadable, executed Jupyter notebook per article chapter.

The chapters are the single source. At every build this hook turns each chapter that has
runnable code into ``notebooks/<chapter>.ipynb`` in the built site:

- prose becomes Markdown cells; links, images and API cross-references become absolute
  addresses under ``site_url``, so they work in a downloaded notebook; admonitions
  (pitfall boxes) become Jupyter's coloured alert boxes;
- every runnable block becomes a code cell, and the chapter's figures (its markdown-exec
  blocks, which print HTML) become code cells that display the same figure inline;
- the cells are executed in order, in one namespace per chapter, in the build's own
  Python process (no kernel to start), and their printed output and figures are stored
  in the notebook, so a reader sees the results before running anything.

A "Download notebook" button is added under the title of each such chapter. Nothing is
written into ``docs/``, so ``mkdocs serve`` does not loop and no committed notebook can
drift from its chapter.

Run it as a script to write the notebooks somewhere yourself::

    python docs/hooks/notebook.py out/ [https://attnlab.github.io/attnlab/]
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import posixpath
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent
ARTICLE = "article"
SITE_URL = "https://attnlab.github.io/attnlab/"
REPO_URL = "https://github.com/attnlab/attnlab"

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<info>[^\n]*)$")
AUTOREF = re.compile(r"\[(?P<text>[^\]]+)\]\[(?P<ident>[\w.]+)\]")  # [`X`][attnlab.X]
ADMONITION = re.compile(r'^(?:!!!|\?\?\?\+?)\s+(?P<kind>\w+)(?:\s+"(?P<title>[^"]*)")?\s*$')
LINK = re.compile(r"\]\((?!https?://|mailto:)(?P<target>[^)\s]+)\)")
FIGURE_PRINT = re.compile(
    r"""^print\(f?(["'])<div class="attn-figure">\{figure_to_svg\((?P<fig>\w+)\)\}</div>\1\)$""",
    flags=re.M,
)
ALERT = {  # admonition kind -> Jupyter's alert class
    "warning": "warning", "caution": "warning", "attention": "warning",
    "danger": "danger", "error": "danger", "bug": "danger", "failure": "danger",
    "tip": "success", "hint": "success", "success": "success", "check": "success",
}  # fmt: skip
DOWNLOAD_ICON = (  # Material Design "download" icon
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" aria-hidden="true">'
    '<path d="M5 20h14v-2H5m14-9h-4V3H9v6H5l7 7 7-7Z"/></svg>'
)

Resolver = Callable[[str], str | None]  # API identifier -> site-relative URL, or None
Cell = dict[str, Any]


class NotebookError(RuntimeError):
    """A chapter's cell raised while its notebook was executed."""


def _words(info: str) -> list[str]:
    return info.strip().strip("{}").replace(".python", "python").split()


def _is_code(info: str) -> bool:
    words = _words(info)
    return bool(words) and words[0] in ("python", "py") and "notest" not in words


def _is_figure(info: str) -> bool:
    return _is_code(info) and 'exec="on"' in info and 'html="1"' in info


def chapters(docs: Path = DOCS) -> list[str]:
    """The chapters with runnable code, as paths relative to ``docs``."""
    return [
        f"{ARTICLE}/{path.name}"
        for path in sorted((docs / ARTICLE).glob("[0-9][0-9]-*.md"))
        if any(
            _is_code(m["info"]) and not m["indent"]
            for m in map(FENCE.match, path.read_text("utf-8").split("\n"))
            if m
        )
    ]


def notebook_uri(chapter: str) -> str:
    """Where a chapter's notebook lives in the site: ``notebooks/07-...ipynb``."""
    return f"notebooks/{Path(chapter).stem}.ipynb"


def page_url(src_uri: str) -> str:
    """A page's site-relative URL with directory URLs: ``article/05-x/`` for ``05-x.md``."""
    path = src_uri.removesuffix(".md").removesuffix("index")
    return path if not path or path.endswith("/") else path + "/"


def absolute_url(target: str, chapter: str, site_url: str = SITE_URL) -> str:
    """A chapter's relative link or image path as an address that works anywhere."""
    path, hash_, anchor = target.partition("#")
    if not path:  # a section of this chapter
        return site_url + page_url(chapter) + hash_ + anchor
    path = posixpath.normpath(posixpath.join(posixpath.dirname(chapter), path))
    if path.endswith(".md"):
        path = page_url(path)
    return site_url + path + hash_ + anchor


def _admonition(kind: str, title: str | None, body: list[str]) -> list[str]:
    alert = ALERT.get(kind, "info")
    heading = title if title is not None else kind.capitalize()
    # Blank lines around the Markdown inside the <div>, so Jupyter renders it.
    start = f'<div class="alert alert-block alert-{alert}">'
    return [start, "", f"**{heading}**", "", *body, "", "</div>"]


def markdown_for_jupyter(
    text: str, chapter: str, site_url: str = SITE_URL, resolve: Resolver | None = None
) -> str:
    """Rewrite a chapter's site-only Markdown for Jupyter (links, autorefs, admonitions)."""

    def autoref(match: re.Match[str]) -> str:
        url = resolve(match["ident"]) if resolve is not None else None
        return f"[{match['text']}]({site_url}{url})" if url is not None else match["text"]

    text = AUTOREF.sub(autoref, text)
    text = LINK.sub(lambda m: f"]({absolute_url(m['target'], chapter, site_url)})", text)
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        match = ADMONITION.match(lines[i])
        if not match:
            fence = FENCE.match(lines[i])
            # Fences kept as prose (blocks that do not run): plain ```python for Jupyter.
            if fence and _is_code(fence["info"]):
                out.append(f"{fence['indent']}{fence['ticks']}python")
            else:
                out.append(lines[i])
            i += 1
            continue
        body, i = [], i + 1
        while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
            body.append(lines[i][4:])
            i += 1
        while body and not body[-1].strip():
            body.pop()
        out.extend(_admonition(match["kind"], match["title"], body))
        if i < len(lines):
            out.append("")
    return "\n".join(out).strip()


def _code_cell(source: str, line: int, figure: bool = False) -> Cell:
    cell: Cell = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": []}
    cell["source"] = source
    cell["_line"], cell["_figure"] = line, figure  # dropped before the notebook is written
    return cell


def _figure_source(code: str) -> tuple[str, str]:
    """A figure block's code as a notebook shows it, and the MIME type of its result.

    The site's block prints HTML for the page; in Jupyter that would be text, so the
    final ``print`` becomes a value that Jupyter displays: ``SVG(figure_to_svg(fig))``
    for a matplotlib figure printed in ``<div class="attn-figure">``, else ``HTML(...)``.
    """
    svg, n = FIGURE_PRINT.subn(r"SVG(figure_to_svg(\g<fig>))  # drawn below the cell", code)
    if n == 1:
        return "from IPython.display import SVG\n\n" + svg.rstrip("\n"), "image/svg+xml"
    tree = ast.parse(code)
    last = tree.body[-1] if tree.body else None
    if not (
        isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Call)
        and isinstance(last.value.func, ast.Name)
        and last.value.func.id == "print"
        and len(last.value.args) == 1
        and not last.value.keywords
    ):
        raise ValueError("a figure block must end with print(<the figure's HTML>)")
    lines = code.rstrip("\n").split("\n")
    shown = ast.get_source_segment(code, last.value.args[0])
    head = "\n".join(lines[: last.lineno - 1])
    body = f"{head}\nHTML({shown})  # drawn below the cell"
    return "from IPython.display import HTML\n\n" + body.lstrip("\n"), "text/html"


def chapter_cells(
    markdown: str, chapter: str, site_url: str = SITE_URL, resolve: Resolver | None = None
) -> list[Cell]:
    """Split one chapter into notebook cells: prose, runnable code and figures."""
    cells: list[Cell] = []
    prose: list[str] = []

    def flush() -> None:
        text = markdown_for_jupyter("\n".join(prose), chapter, site_url, resolve)
        if text:
            cells.append({"cell_type": "markdown", "metadata": {}, "source": text})
        prose.clear()

    lines = markdown.split("\n")
    i = 0
    inside = ""  # the indentation of the admonition whose code just became a cell
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            # The rest of that admonition's body, after its code, is plain prose now.
            if inside and lines[i].startswith(inside):
                prose.append(lines[i][len(inside) :])
            else:
                inside = "" if lines[i].strip() else inside
                prose.append(lines[i])
            i += 1
            continue
        ticks, info = fence["ticks"], fence["info"]
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(ticks):
            j += 1
        body = "\n".join(line[len(fence["indent"]) :] for line in lines[i + 1 : j])
        if _is_code(info):
            # A fence indented in an admonition (an exercise's collapsed solution) is a cell
            # too: the admonition's text before it becomes an alert box above it.
            flush()
            cells.append(_code_cell(body, i + 1, figure="exec=" in info))
            inside = fence["indent"]
        elif 'title="Output"' in info:
            pass  # the notebook's own outputs come from executing it
        else:
            prose.extend(lines[i : j + 1])
        i = j + 1
    flush()
    return cells


def _fresh_state() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_printoptions(profile="default")


def execute(cells: list[Cell], path: str) -> None:
    """Run the code cells in order, in one namespace, and store what they print or draw.

    Figure cells run the chapter's own code (which prints the figure as HTML) and store
    its SVG as the cell's result; their source is then rewritten to display it inline.
    """
    namespace: dict[str, Any] = {"__name__": "__main__"}
    _fresh_state()
    count = 0
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        count += 1
        buffer = io.StringIO()
        try:
            # Pad with blank lines so a traceback points at the chapter's line.
            code = compile("\n" * cell["_line"] + cell["source"], path, "exec", dont_inherit=True)
            with contextlib.redirect_stdout(buffer):
                exec(code, namespace)
        except Exception as exc:
            error = "".join(traceback.format_exception(*sys.exc_info(), limit=-3)).rstrip()
            raise NotebookError(f"{path}:{cell['_line']}: the cell raised\n{error}") from exc
        printed = buffer.getvalue()
        cell["execution_count"] = count
        if cell["_figure"]:
            cell["source"], mime = _figure_source(cell["source"])
            if mime == "image/svg+xml":
                start, end = printed.index("<svg"), printed.rindex("</svg>") + len("</svg>")
                data = {mime: printed[start:end], "text/plain": "<SVG figure>"}
            else:
                data = {mime: printed.strip(), "text/plain": "<HTML figure>"}
            cell["outputs"] = [
                {
                    "output_type": "execute_result",
                    "execution_count": count,
                    "metadata": {},
                    "data": data,
                }
            ]
        elif printed:
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": printed}]


def build_notebook(
    chapter: str,
    *,
    docs: Path = DOCS,
    site_url: str = SITE_URL,
    resolve: Resolver | None = None,
    run: bool = True,
) -> dict[str, Any]:
    """One chapter as an nbformat-4 notebook, executed unless ``run`` is false."""
    markdown = (docs / chapter).read_text(encoding="utf-8")
    title = re.search(r"^# (.+)$", markdown, flags=re.M)
    name = title[1].strip() if title else Path(chapter).stem
    about = (
        f"*This notebook is the chapter [{name}]({site_url}{page_url(chapter)}) of "
        f"[attnlab]({site_url}), generated from the page and run when the site was built: "
        "the outputs below are what its code printed. To run it yourself, install "
        f"attnlab from a clone of [the repository]({REPO_URL}) (`pip install -e '.[plot]'`); "
        "the cells run in order, each after the ones above it.*"
    )
    cells = chapter_cells(markdown, chapter, site_url, resolve)
    after_title = 1 if cells and cells[0]["cell_type"] == "markdown" else 0
    cells.insert(after_title, {"cell_type": "markdown", "metadata": {}, "source": about})
    if run:
        execute(cells, str(Path(docs.name) / chapter))
    for k, cell in enumerate(cells):
        if cell["cell_type"] == "code" and cell["_figure"] and not run:
            cell["source"] = _figure_source(cell["source"])[0]
        cell.pop("_line", None)
        cell.pop("_figure", None)
        cell["id"] = f"cell-{k}"
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def write_notebooks(
    out_dir: Path,
    *,
    docs: Path = DOCS,
    site_url: str = SITE_URL,
    resolve: Resolver | None = None,
) -> list[Path]:
    """Write every chapter's executed notebook under ``out_dir``; return their paths."""
    written = []
    for chapter in chapters(docs):
        notebook = build_notebook(chapter, docs=docs, site_url=site_url, resolve=resolve)
        path = out_dir / notebook_uri(chapter)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", "utf-8")
        written.append(path)
    return written


# MkDocs hook ---------------------------------------------------------------------------


def _site_url(config: Any) -> str:
    url = config.get("site_url") or SITE_URL
    return url if url.endswith("/") else url + "/"


def on_post_page(html: str, page: Any, config: Any) -> str:
    """Put a "Download notebook" button under the title of each chapter with code.

    Added to the finished page, after the search plugin has read its text, so the button's
    label is not indexed as part of every chapter.
    """
    from mkdocs.utils import get_relative_url

    src_uri = page.file.src_uri
    if src_uri not in chapters(Path(config["docs_dir"])):
        return html
    href = get_relative_url(notebook_uri(src_uri), page.url)
    button = (
        f'<p class="attn-notebook"><a class="md-button" href="{href}" download '
        'title="This chapter as a Jupyter notebook, with its outputs">'
        f"{DOWNLOAD_ICON} Download notebook</a></p>"
    )
    heading_end = html.find("</h1>")
    if heading_end < 0:
        return button + html
    heading_end += len("</h1>")
    return html[:heading_end] + button + html[heading_end:]


def on_post_build(config: Any) -> None:
    autorefs = config["plugins"].get("autorefs")

    def resolve(identifier: str) -> str | None:
        if autorefs is None:
            return None
        try:
            url, _ = autorefs.get_item_url(identifier)
        except KeyError:
            return None
        return str(url)

    try:
        write_notebooks(
            Path(config["site_dir"]),
            docs=Path(config["docs_dir"]),
            site_url=_site_url(config),
            resolve=resolve,
        )
    except NotebookError as exc:
        from mkdocs.exceptions import PluginError

        raise PluginError(str(exc)) from exc


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "notebooks-out")
    site = sys.argv[2] if len(sys.argv) > 2 else SITE_URL
    for written in write_notebooks(out, site_url=site):
        print(written)
