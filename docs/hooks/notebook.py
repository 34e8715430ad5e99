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

The notebooks are generated when MkDocs collects its files (``on_files``), into a
temporary folder outside ``docs/``, and added to the build as files
``notebooks/<chapter>.ipynb``; the mkdocs-jupyter plugin renders each as a page of the
"Notebooks" section (``execute: false``: they are already executed) and copies it beside
its page, ``notebooks/<chapter>/<chapter>.ipynb``, where both the page and its chapter
offer a "Download notebook" button. API cross-references are only known once every page
is rendered, so the notebooks carry a placeholder for each, replaced in the finished
pages (``on_post_page``) and in the downloads (``on_post_build``). Nothing is written
into ``docs/``, so ``mkdocs serve`` does not loop and no committed notebook can drift
from its chapter.

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
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

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

MAX_LINE = 88  # a code line longer than this is cut by the page's column
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


def notebook_src_uri(chapter: str) -> str:
    """The notebook as a file of the build (a page): ``notebooks/07-x.ipynb``."""
    return f"notebooks/{Path(chapter).stem}.ipynb"


def notebook_uri(chapter: str) -> str:
    """Where the download lives, beside its page: ``notebooks/07-x/07-x.ipynb``."""
    stem = Path(chapter).stem
    return f"notebooks/{stem}/{stem}.ipynb"


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
    call = f"HTML({shown})  # drawn below the cell"
    if "\n" in str(shown) or len(call) > MAX_LINE:  # one argument per line, as ruff would
        call = f"HTML(  # drawn below the cell\n    {shown}\n)"
    body = f"{head}\n{call}"
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
    # The note goes right under the title: the title becomes a cell of its own.
    first = cells[0]["source"] if cells and cells[0]["cell_type"] == "markdown" else ""
    head, _, rest = first.partition("\n")
    after_title = 0
    if head.startswith("# "):
        cells[0]["source"] = head
        after_title = 1
        if rest.strip():
            cells.insert(1, {"cell_type": "markdown", "metadata": {}, "source": rest.strip()})
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

AUTOREF_MARK = "__autoref__/"  # site_url + AUTOREF_MARK + identifier, until resolved
PLACEHOLDER_LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<url>[^)\s]*__autoref__/[\w.]+)\)")
ALERT_BOX = re.compile(
    r'<div class="alert alert-block alert-(?P<alert>\w+)">\s*'
    r"<p><strong>(?P<title>.*?)</strong></p>(?P<body>.*?)</div>",
    flags=re.S,
)
ADMONITION_KIND = {"warning": "warning", "danger": "danger", "success": "tip", "info": "note"}
# What nbconvert's template adds for a notebook page that the site provides itself or
# does not use: MathJax and Mermaid from a CDN (KaTeX is served by the site).
CDN_SCRIPT = re.compile(
    r"<script\b[^>]*\bsrc=[\"'](?:https?:)?//[^\"']*[\"'][^>]*>\s*</script>", flags=re.I
)
MATHJAX_CONFIG = re.compile(
    r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", flags=re.S
)
MERMAID_MODULE = re.compile(
    r'<script type="module">\s*document\.addEventListener\(\s*"DOMContentLoaded"'
    r".*?mermaid.*?</script>",
    flags=re.S,
)

# The notebook's cells use the page's column as a chapter's code blocks do (the Jupyter
# paddings would cut lines that fit a chapter).
NOTEBOOK_CSS = """<style>
.md-typeset .jupyter-wrapper .jp-Notebook,
.md-typeset .jupyter-wrapper .jp-Cell { padding: 0; width: 100%; }
.md-typeset .jupyter-wrapper .jp-Cell + .jp-Cell { margin-top: 0.6em; }
.md-typeset .jupyter-wrapper .jp-InputArea-editor pre,
.md-typeset .jupyter-wrapper .jp-OutputArea-output pre {
  font-family: var(--md-code-font-family);
  font-size: 0.6rem;  /* a little under a chapter's .68rem: 88-character lines fit */
}
</style>
"""
_build: dict[str, Any] = {}  # this build's temporary folder and notebook pages


def _site_url(config: Any) -> str:
    url = config.get("site_url") or SITE_URL
    return url if url.endswith("/") else url + "/"


def _button(href: str) -> str:
    return (
        f'<p class="attn-notebook"><a class="md-button" href="{href}" download '
        'title="This chapter as a Jupyter notebook, with its outputs">'
        f"{DOWNLOAD_ICON} Download notebook</a></p>"
    )


def _after_title(html: str, insert: str) -> str:
    heading_end = html.find("</h1>")
    if heading_end < 0:
        return insert + html
    heading_end += len("</h1>")
    return html[:heading_end] + insert + html[heading_end:]


def _resolver(config: Any) -> Resolver:
    autorefs = config["plugins"].get("autorefs")

    def resolve(identifier: str) -> str | None:
        if autorefs is None:
            return None
        try:
            url, _ = autorefs.get_item_url(identifier)
        except KeyError:
            return None
        return str(url)

    return resolve


def resolve_placeholders(text: str, site_url: str, resolve: Resolver) -> str:
    """Replace the autoref placeholders in a notebook's Markdown by absolute links.

    An identifier that does not resolve becomes its plain text, as in the chapter.
    """

    def link(match: re.Match[str]) -> str:
        url = resolve(match["url"].rsplit(AUTOREF_MARK, 1)[1])
        return f"[{match['text']}]({site_url}{url})" if url is not None else match["text"]

    return PLACEHOLDER_LINK.sub(link, text)


def site_page_html(html: str, page_url: str, site_url: str) -> str:
    """A notebook's HTML from mkdocs-jupyter as the site shows it.

    Absolute links and images into the site become relative ones (so they work on any host,
    ``mkdocs serve`` included), Jupyter alert boxes become the site's admonitions, and
    the CDN scripts of nbconvert's template are dropped (the site serves KaTeX).
    """
    from mkdocs.utils import get_relative_url

    html = MATHJAX_CONFIG.sub("", html)
    html = MERMAID_MODULE.sub("", html)
    html = CDN_SCRIPT.sub("", html)

    def local(match: re.Match[str]) -> str:
        path, hash_, anchor = match["path"].partition("#")
        if path.startswith(AUTOREF_MARK):
            return match[0]  # resolved in the finished page
        target = get_relative_url(path or ".", page_url)
        if (not path or path.endswith("/")) and not target.endswith("/"):
            target += "/"
        return f'{match["attr"]}="{target}{hash_}{anchor}"'

    html = re.sub(rf'(?P<attr>href|src)="{re.escape(site_url)}(?P<path>[^"]*)"', local, html)

    def admonition(match: re.Match[str]) -> str:
        kind = ADMONITION_KIND.get(match["alert"], "note")
        return (
            f'<div class="admonition {kind}"><p class="admonition-title">{match["title"]}'
            f"</p>{match['body'].strip()}</div>"
        )

    return ALERT_BOX.sub(admonition, html)


def resolve_page_placeholders(html: str, page_url: str, site_url: str, resolve: Resolver) -> str:
    """Replace the autoref placeholders of a finished notebook page by relative links."""
    from mkdocs.utils import get_relative_url

    def placeholder(match: re.Match[str]) -> str:
        url = resolve(match["ident"])
        if url is None:
            return match["text"]
        return f'<a href="{get_relative_url(url, page_url)}">{match["text"]}</a>'

    mark = re.escape(site_url + AUTOREF_MARK)
    return re.sub(rf'<a href="{mark}(?P<ident>[\w.]+)"[^>]*>(?P<text>.*?)</a>', placeholder, html)


@event_priority(50)  # before mkdocs-jupyter's on_files turns .ipynb files into pages
def on_files(files: Any, config: Any) -> Any:
    """Generate and execute the notebooks, and add them to the build as pages."""
    from mkdocs.structure.files import File

    old = _build.pop("tmp", None)
    if old is not None:
        old.cleanup()
    tmp = tempfile.TemporaryDirectory(prefix="attnlab-notebooks-")
    _build["tmp"] = tmp
    site_url = _site_url(config)
    docs = Path(config["docs_dir"])
    pages = {}
    for chapter in chapters(docs):
        try:
            nb = build_notebook(
                chapter, docs=docs, site_url=site_url, resolve=lambda i: AUTOREF_MARK + i
            )
        except NotebookError as exc:
            from mkdocs.exceptions import PluginError

            raise PluginError(str(exc)) from exc
        src_uri = notebook_src_uri(chapter)
        path = Path(tmp.name) / src_uri
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", "utf-8")
        files.append(File(src_uri, tmp.name, config["site_dir"], config["use_directory_urls"]))
        pages[src_uri] = chapter
    _build["pages"] = pages
    return files


def chapter_title(chapter: str, docs: Path = DOCS) -> str:
    """A chapter's title as plain text (for the navigation): its ``# `` line, unmarked."""
    title = re.search(r"^# (.+)$", (docs / chapter).read_text("utf-8"), flags=re.M)
    return title[1].replace("`", "").strip() if title else Path(chapter).stem


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Adapt a notebook page's HTML to the site (links, pitfall boxes, no CDN, column)."""
    chapter = _build.get("pages", {}).get(page.file.src_uri)
    if chapter is None:
        return html
    # mkdocs-jupyter titles the page with its first heading's text, minus inline code
    # ("The  class"): use the chapter's title, as the article's navigation does.
    page.title = chapter_title(chapter, Path(config["docs_dir"]))
    # The chapter is the page to find and to edit: search lists it, not its notebook
    # twin, and "Edit this page" opens the chapter (the notebook has no source file).
    page.meta["search"] = {"exclude": True}
    if page.edit_url:
        page.edit_url = page.edit_url.replace(page.file.src_uri, chapter)
    return site_page_html(html, page.url, _site_url(config)) + NOTEBOOK_CSS


def on_post_page(html: str, page: Any, config: Any) -> str:
    """Put a "Download notebook" button under the title of each chapter and notebook page.

    Added to the finished page, after the search plugin has read its text, so the button's
    label is not indexed as part of every chapter.
    """
    from mkdocs.utils import get_relative_url

    src_uri = page.file.src_uri
    pages: dict[str, str] = _build.get("pages", {})
    if src_uri in pages:  # a notebook rendered by mkdocs-jupyter
        chapter = pages[src_uri]
        html = resolve_page_placeholders(html, page.url, _site_url(config), _resolver(config))
        href = get_relative_url(notebook_uri(chapter), page.url)
        return _after_title(html, _button(href))
    if src_uri not in chapters(Path(config["docs_dir"])):
        return html
    return _after_title(html, _button(get_relative_url(notebook_uri(src_uri), page.url)))


def on_post_build(config: Any) -> None:
    """Write each download with its API links resolved, beside its notebook page."""
    tmp = _build.get("tmp")
    if tmp is None:
        return
    site_url, resolve = _site_url(config), _resolver(config)
    for src_uri, chapter in _build.get("pages", {}).items():
        text = (Path(tmp.name) / src_uri).read_text("utf-8")
        nb = json.loads(text)
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                cell["source"] = resolve_placeholders(cell["source"], site_url, resolve)
        target = Path(config["site_dir"]) / notebook_uri(chapter)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", "utf-8")


def on_shutdown() -> None:
    tmp = _build.pop("tmp", None)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "notebooks-out")
    site = sys.argv[2] if len(sys.argv) > 2 else SITE_URL
    for written in write_notebooks(out, site_url=site):
        print(written)
