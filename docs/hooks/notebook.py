"""One downloadable, executed Jupyter notebook per chapter with code.

The chapters are the single source. At every build this hook turns each page of the
article, of beyond/ and of modern/ that has runnable code into
``notebooks/<name>.ipynb`` in the built site:

- the page is read by ``blocks.py`` (the parser every docs tool shares) and written out
  as a jupytext Markdown document, which jupytext turns into the notebook: prose becomes
  Markdown cells, every runnable block a code cell; links and API cross-references
  become absolute addresses under ``site_url``; admonitions (pitfall boxes) become
  Jupyter's coloured alert boxes, and collapsed solutions stay collapsed (an HTML
  ``<details>`` for their text, hidden input and output for their code cells, tagged
  ``solution``); a figure block (markdown-exec, ``html="1"``) becomes a cell that
  displays the same figure inline;
- the outputs stored in the notebook are those of the page's own run: the build's
  output check (``outputs.py``) has run every block of the chapter and left its run on
  the page (markdown-exec's figure blocks included), so the notebook takes what each
  block printed or drew from there rather than running the chapter again;
- in the downloaded file the images are embedded as cell attachments, so the notebook
  shows its figures offline.

The notebooks are added as files when MkDocs collects its files (``on_files``), into a
temporary folder outside ``docs/``, and filled with their outputs just before their page
is rendered (``on_pre_page``), after their chapter's page (the notebooks are the last
files of the build). The mkdocs-jupyter plugin renders each as a page (``execute:
false``) and copies it beside its page, ``notebooks/<name>/<name>.ipynb``, where both
the page and its chapter offer a "Download notebook" button. The notebook pages are not
in the navigation, which lists the chapters only: one page, ``notebooks.md``, lists
every notebook with its chapter, from the same list of chapters that makes the
notebooks (``on_page_markdown``), so it names each notebook the build makes and no
other. API cross-references are only known once every page is
rendered, so the notebooks carry a placeholder for each, replaced in the finished pages
(``on_post_page``) and in the downloads (``on_post_build``). The notebook pages share one
stylesheet (``assets/stylesheets/jupyter.css``, linked by ``overrides/main.html``) instead
of inlining nbconvert's in each page. Nothing is written into ``docs/``, so ``mkdocs
serve`` does not loop and no committed notebook can drift from its chapter.

Run it as a script to write the notebooks somewhere yourself::

    python docs/hooks/notebook.py out/ [https://attnlab.github.io/attnlab/]
"""

from __future__ import annotations

import ast
import base64
import json
import logging
import posixpath
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

log = logging.getLogger("mkdocs.hooks.notebook")

try:
    from hooks import blocks, outputs  # under pytest (pythonpath: docs)
except ImportError:  # as an MkDocs hook or a script: this folder is on sys.path
    import blocks  # type: ignore[no-redef]
    import outputs  # type: ignore[no-redef]

DOCS = Path(__file__).resolve().parent.parent
ARTICLE = "article"
SECTIONS = (ARTICLE, "beyond", "modern")  # the chapters of these get notebooks
SITE_URL = "https://attnlab.github.io/attnlab/"
INDEX_PAGE = "notebooks.md"  # the page that lists every notebook
INDEX_MARKER = "<!-- attnlab:notebook-list -->"  # where on it the list goes
REPO_URL = "https://github.com/attnlab/attnlab"

AUTOREF = re.compile(r"\[(?P<text>[^\]]+)\]\[(?P<ident>[\w.]+)\]")  # [`X`][attnlab.X]
LINK = re.compile(r"\]\((?!https?://|mailto:|attachment:|data:)(?P<target>[^)\s]+)\)")
IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<url>[^)\s]+)\)")
FIGURE_PRINT = re.compile(
    r"""^print\(f?(["'])<div class="attn-figure">\{figure_to_svg\((?P<fig>\w+)\)\}</div>\1\)$""",
    flags=re.M,
)
ALERT = {  # admonition kind -> Jupyter's alert class
    "warning": "warning", "caution": "warning", "attention": "warning",
    "danger": "danger", "error": "danger", "bug": "danger", "failure": "danger",
    "tip": "success", "hint": "success", "success": "success", "check": "success",
}  # fmt: skip
SOLUTION = {"tags": ["solution"], "jupyter": {"source_hidden": True, "outputs_hidden": True}}
HIDDEN_INPUT = {"tags": ["hide-input"], "jupyter": {"source_hidden": True}}
IMAGE_TYPES = {".svg": "image/svg+xml", ".png": "image/png", ".jpg": "image/jpeg"}
DOWNLOAD_ICON = (  # Material Design "download" icon
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" aria-hidden="true">'
    '<path d="M5 20h14v-2H5m14-9h-4V3H9v6H5l7 7 7-7Z"/></svg>'
)

MAX_LINE = 88  # a code line longer than this is cut by the page's column
Resolver = Callable[[str], str | None]  # API identifier -> site-relative URL, or None
Cell = dict[str, Any]


class NotebookError(RuntimeError):
    """A chapter's cell raised while its notebook was executed."""


DISPLAY = "from IPython.display import"  # how a cell that displays SVG or HTML starts


def _is_figure(fence: blocks.Fence) -> bool:
    return fence.is_exec and 'html="1"' in fence.info


def chapters(docs: Path = DOCS) -> list[str]:
    """The chapters with runnable code, as paths relative to ``docs``: article first."""
    found = []
    for section in SECTIONS:
        pattern = "[0-9][0-9]-*.md" if section == ARTICLE else "*.md"
        for path in sorted((docs / section).glob(pattern)):
            if any(f.runs for f in blocks.read(path.read_text("utf-8")).fences):
                found.append(f"{section}/{path.name}")
    return found


def notebook_name(chapter: str) -> str:
    """``07-self-attention-class`` for the article's chapters, ``modern-rope`` for others."""
    section, stem = Path(chapter).parent.name, Path(chapter).stem
    return stem if section == ARTICLE else f"{section}-{stem}"


def notebook_src_uri(chapter: str) -> str:
    """The notebook as a file of the build (a page): ``notebooks/07-x.ipynb``."""
    return f"notebooks/{notebook_name(chapter)}.ipynb"


def notebook_uri(chapter: str) -> str:
    """Where the download lives, beside its page: ``notebooks/07-x/07-x.ipynb``."""
    name = notebook_name(chapter)
    return f"notebooks/{name}/{name}.ipynb"


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


def _links(text: str, chapter: str, site_url: str, resolve: Resolver | None) -> str:
    def autoref(match: re.Match[str]) -> str:
        url = resolve(match["ident"]) if resolve is not None else None
        return f"[{match['text']}]({site_url}{url})" if url is not None else match["text"]

    text = AUTOREF.sub(autoref, text)
    return LINK.sub(lambda m: f"]({absolute_url(m['target'], chapter, site_url)})", text)


def _open(container: blocks.Container, again: bool) -> list[str]:
    """The HTML that stands for a container in a Markdown cell (blank lines around)."""
    title = container.title if container.title is not None else container.kind.capitalize()
    if again and title:
        title += " (continued)"
    if container.marker == "===":  # a content tab: its title, then its body
        return ["", f"**{title}**", ""]
    alert = f'class="alert alert-block alert-{ALERT.get(container.kind, "info")}"'
    if container.collapsed:
        return ["", f"<details {alert}>", f"<summary><strong>{title}</strong></summary>", ""]
    return ["", f"<div {alert}>", "", f"**{title}**", ""]


def _close(container: blocks.Container) -> list[str]:
    if container.marker == "===":
        return [""]
    return ["", "</details>" if container.collapsed else "</div>", ""]


def cell_metadata(fence: blocks.Fence) -> dict[str, Any]:
    """A code cell's metadata: hidden as the chapter hides it.

    A block in a collapsed solution is a cell tagged ``solution`` whose input and output
    Jupyter hides; a markdown-exec block whose code the chapter does not show is a cell
    tagged ``hide-input`` (its code hidden in Jupyter, and left off the notebook's page).
    """
    if any(c.collapsed for c in fence.containers):
        return SOLUTION
    if not fence.shown:
        return HIDDEN_INPUT
    return {}


def _cell_fence(fence: blocks.Fence) -> str:
    """The opening line of a code cell in jupytext Markdown, with the cell's metadata."""
    meta = " ".join(f"{key}={json.dumps(value)}" for key, value in cell_metadata(fence).items())
    return f"```python {meta}".rstrip()


def jupytext_markdown(
    markdown: str, chapter: str, site_url: str = SITE_URL, resolve: Resolver | None = None
) -> tuple[str, list[blocks.Fence]]:
    """A chapter as a jupytext Markdown document, and the fences of its code cells.

    Prose goes in ``<!-- #region -->`` blocks (one Markdown cell each, whatever fences it
    shows); each block that runs becomes a code cell, breaking out of the containers it
    stands in, which close before it and open again after it.
    """
    page = blocks.read(markdown)
    lines = page.text.split("\n")
    starts = {fence.start: fence for fence in page.fences}
    out: list[str] = []
    prose: list[str] = []
    opened: list[blocks.Container] = []  # the containers open in the current prose
    seen: set[int] = set()  # header lines of the containers opened once already
    cells: list[blocks.Fence] = []

    def close_to(depth: int) -> None:
        while len(opened) > depth:
            prose.extend(_close(opened.pop()))

    def open_to(wanted: tuple[blocks.Container, ...]) -> None:
        common = 0
        while common < min(len(opened), len(wanted)) and opened[common] == wanted[common]:
            common += 1
        close_to(common)
        for container in wanted[common:]:
            prose.extend(_open(container, again=container.line in seen))
            opened.append(container)
            seen.add(container.line)

    def flush() -> None:
        close_to(0)
        text = re.sub(r"\n{3,}", "\n\n", "\n".join(prose)).strip()
        if text:
            out.extend(["<!-- #region -->", _links(text, chapter, site_url, resolve)])
            out.extend(["<!-- #endregion -->", ""])
        prose.clear()

    n = 0
    while n < len(lines):
        fence = starts.get(n)
        if fence is None:
            if lines[n].strip():
                open_to(page.containers[n])
            if lines[n].startswith("# ") and not prose and not out:
                prose.append(lines[n])
                flush()  # the title is a cell of its own
            else:
                prose.append(lines[n])
            n += 1
            continue
        if fence.runs:
            flush()
            out.extend([_cell_fence(fence), fence.content.rstrip("\n"), "```", ""])
            cells.append(fence)
        elif not fence.is_output:  # outputs come from running the notebook
            open_to(fence.containers)
            shown = lines[fence.start : fence.end]
            if fence.is_python:  # a block that does not run: plain ```python for Jupyter
                shown[0] = shown[0][: len(shown[0]) - len(shown[0].lstrip("`~"))] + "python"
            prose.extend(shown)
        n = fence.end
    flush()
    return "\n".join(out), cells


def _figure_source(code: str) -> tuple[str, str]:
    """A figure block's code as a notebook shows it, and the MIME type of its result.

    The site's block prints HTML for the page; in Jupyter that would be text, so the
    final ``print`` becomes a value that Jupyter displays: ``SVG(figure_to_svg(fig))``
    for a matplotlib figure printed in ``<div class="attn-figure">``, the object itself for
    ``print(x.html())`` (it displays itself, e.g. a model view with its script inline),
    else ``HTML(...)``.
    """
    svg, n = FIGURE_PRINT.subn(r"SVG(figure_to_svg(\g<fig>))  # drawn below the cell", code)
    if n == 1:
        return f"{DISPLAY} SVG\n\n" + svg.rstrip("\n"), "image/svg+xml"
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
    own = re.fullmatch(r"(\w+)\.html\(\)", str(shown))
    if own:  # an object that shows itself in Jupyter (a model view: with its script)
        return f"{head}\n{own[1]}  # drawn below the cell".lstrip("\n"), "text/html"
    call = f"HTML({shown})  # drawn below the cell"
    if "\n" in str(shown) or len(call) > MAX_LINE:  # one argument per line, as ruff would
        call = f"HTML(  # drawn below the cell\n    {shown}\n)"
    body = f"{head}\n{call}"
    return f"{DISPLAY} HTML\n\n" + body.lstrip("\n"), "text/html"


def _results(
    chapter: str, markdown: str, path: str, run: outputs.PageRun | bool
) -> dict[int, outputs.Result]:
    """What each block of the chapter printed, by line: from ``run``, else run now."""
    if run is True or (run is not False and not run.results):
        run = outputs.PageSession(path, markdown, exec_blocks=True).run_all()
    found = {r.block.line: r for r in run.results} if run is not False else {}
    if run is not False and any(
        b.line not in found for b in blocks.code_blocks(markdown, exec_blocks=True)
    ):
        # A run without some blocks (the build's has markdown-exec's too): run them all.
        return _results(chapter, markdown, path, True)
    for result in found.values():
        if result.error is not None:
            raise NotebookError(f"{path}:{result.block.line}: the cell raised\n{result.error}")
    return found


def _outputs(cell: Any, fence: blocks.Fence, result: outputs.Result | None, count: int) -> None:
    if result is None:
        if _is_figure(fence):
            cell["source"] = _figure_source(cell["source"])[0]
        return
    cell["execution_count"] = count
    printed = result.printed
    if _is_figure(fence):
        cell["source"], mime = _figure_source(cell["source"])
        if not cell["source"].startswith(DISPLAY):
            # An object that draws itself (a model view) keeps no stored copy: its data
            # (a megabyte and more) would double the download, and running the cell,
            # which it needs anyway for its script, draws it.
            return
        if mime == "image/svg+xml":
            from IPython.display import SVG

            start, end = printed.index("<svg"), printed.rindex("</svg>") + len("</svg>")
            # As the cell's SVG(...) shows it in a kernel (IPython re-serialises the XML).
            data = {mime: SVG(printed[start:end]).data, "text/plain": "<SVG figure>"}
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


def _about(chapter: str, name: str, site_url: str, reads_files: bool) -> str:
    where = (
        "Run it from the root of the clone: some cells read results stored under `docs/`."
        if reads_files
        else "The cells run in order, each after the ones above it."
    )
    return (
        f"*This notebook is the chapter [{name}]({site_url}{page_url(chapter)}) of "
        f"[attnlab]({site_url}), generated from the page when the site was built: the "
        "outputs below are what its code printed. To run it yourself, install attnlab "
        f"from a clone of [the repository]({REPO_URL}) (`pip install -e '.[plot]'`). "
        f"{where}*"
    )


def build_notebook(
    chapter: str,
    *,
    docs: Path = DOCS,
    site_url: str = SITE_URL,
    resolve: Resolver | None = None,
    run: outputs.PageRun | bool = True,
    embed_images: bool = False,
) -> dict[str, Any]:
    """One chapter as an nbformat-4 notebook.

    Its outputs are those of ``run``: a run of the chapter's blocks (the build's, or the
    test session's), ``True`` to run the chapter now, ``False`` to store none. With
    ``embed_images``, the chapter's images are attached to their cells (a download).
    """
    import jupytext

    markdown = (docs / chapter).read_text(encoding="utf-8")
    title = re.search(r"^# (.+)$", markdown, flags=re.M)
    name = title[1].strip() if title else Path(chapter).stem
    path = str(Path(docs.name) / chapter)
    text, fences = jupytext_markdown(markdown, chapter, site_url, resolve)
    nb = jupytext.reads(text, fmt="md")
    code = [c for c in nb.cells if c.cell_type == "code"]
    if len(code) != len(fences):  # pragma: no cover - jupytext read a fence as prose
        raise NotebookError(f"{path}: {len(fences)} blocks but {len(code)} code cells")
    results = _results(chapter, markdown, path, run) if run is not False else {}
    for count, (cell, fence) in enumerate(zip(code, fences, strict=True), start=1):
        cell["source"] = fence.content.rstrip("\n")
        _outputs(cell, fence, results.get(fence.line), count)
    cells = [dict(c) for c in nb.cells]
    # The note on the notebook goes right under the title.
    after_title = 1 if cells and cells[0]["source"].startswith("# ") else 0
    about = _about(chapter, name, site_url, reads_files='"docs/' in markdown)
    cells.insert(after_title, {"cell_type": "markdown", "metadata": {}, "source": about})
    for k, cell in enumerate(cells):
        cell["id"] = f"cell-{k}"
        if cell["cell_type"] == "markdown" and embed_images:
            _attach_images(cell, docs, site_url)
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _attach_images(cell: Cell, docs: Path, site_url: str) -> None:
    """Embed the site's images that a Markdown cell shows as attachments of the cell."""

    def attach(match: re.Match[str]) -> str:
        url = match["url"]
        local = docs / url.removeprefix(site_url)
        mime = IMAGE_TYPES.get(local.suffix.lower())
        if not url.startswith(site_url) or mime is None or not local.is_file():
            return match[0]
        data = base64.b64encode(local.read_bytes()).decode("ascii")
        cell.setdefault("attachments", {})[local.name] = {mime: data}
        return f"![{match['alt']}](attachment:{local.name})"

    cell["source"] = IMAGE.sub(attach, cell["source"])


def write_notebooks(
    out_dir: Path,
    *,
    docs: Path = DOCS,
    site_url: str = SITE_URL,
    resolve: Resolver | None = None,
) -> list[Path]:
    """Write every chapter's executed notebook, as downloaded, under ``out_dir``."""
    written = []
    for chapter in chapters(docs):
        notebook = build_notebook(
            chapter, docs=docs, site_url=site_url, resolve=resolve, embed_images=True
        )
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
NOTEBOOK_CSS = """
.md-typeset .jupyter-wrapper .jp-Notebook,
.md-typeset .jupyter-wrapper .jp-Cell { padding: 0; width: 100%; }
.md-typeset .jupyter-wrapper .jp-Cell + .jp-Cell { margin-top: 0.6em; }
.md-typeset .jupyter-wrapper .jp-InputArea-editor pre,
.md-typeset .jupyter-wrapper .jp-OutputArea-output pre {
  font-family: var(--md-code-font-family);
  font-size: 0.6rem;  /* a little under a chapter's .68rem: 88-character lines fit */
}
"""
STYLESHEET = "assets/stylesheets/jupyter.css"  # shared by the notebook pages
STYLE = re.compile(r"<style[^>]*>(?P<css>.*?)</style>\s*", flags=re.S)
DETAILS_BOX = re.compile(
    r'<details class="alert alert-block alert-(?P<alert>\w+)">\s*'
    r"<summary><strong>(?P<title>.*?)</strong></summary>",
    flags=re.S,
)
HEADING_ID = re.compile(r'<h[1-6][^>]*\bid="(?P<id>[^"]+)"')
SOLUTION_CELL = re.compile(r'<div\b[^>]*\bclass="jp-Cell\b[^"]*\bcelltag_solution\b[^"]*"')
DIV = re.compile(r"<div\b|</div>")
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

    html = ALERT_BOX.sub(admonition, html)

    def details(match: re.Match[str]) -> str:
        kind = ADMONITION_KIND.get(match["alert"], "note")
        return f'<details class="{kind}"><summary>{match["title"]}</summary>'

    return collapse_solutions(DETAILS_BOX.sub(details, html))


def collapse_solutions(html: str) -> str:
    """Wrap each code cell tagged ``solution`` in a collapsed box, as the chapter shows it.

    (Jupyter hides the input and output of such a cell by its metadata; nbconvert's HTML
    does not, so the page wraps it.)
    """
    out, pos = [], 0
    for match in SOLUTION_CELL.finditer(html):
        if match.start() < pos:
            continue  # inside a cell already wrapped
        depth, end = 0, match.start()
        for tag in DIV.finditer(html, match.start()):
            depth += 1 if tag[0] == "<div" else -1
            if depth == 0:
                end = tag.end()
                break
        out += [html[pos : match.start()], '<details class="tip"><summary>Solution: code</summary>']
        out += [html[match.start() : end], "</details>"]
        pos = end
    return "".join(out) + html[pos:]


def toc_anchors(html: str, toc: Any) -> None:
    """Point the page's contents (and Material's "skip to content" link) at its headings.

    mkdocs-jupyter slugs a heading's text without its inline code ("The `SelfAttention`
    class" gives ``#the-class``) while nbconvert's ids keep it
    (``#the-selfattention-class``): take the ids the page has, in order.
    """
    ids = HEADING_ID.findall(html)
    items = list(toc)
    k = 0
    while items and k < len(ids):
        item = items.pop(0)
        item.id = ids[k]
        k += 1
        items[:0] = list(item.children)


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


def reuse_exporters() -> None:
    """Let mkdocs-jupyter convert every notebook with one nbconvert exporter.

    mkdocs-jupyter makes a new exporter for each notebook it renders (one for its HTML,
    one more for the Markdown its contents are read from), and each new exporter
    compiles nbconvert's Jinja templates again: a quarter of the time the notebook
    pages took. An exporter holds no state of the notebook it converted (each
    conversion starts its own resources), so the first one made with a given set of
    options serves every later conversion with the same options. mkdocs-jupyter has no
    option for this; if its module layout is not the one known, nothing changes.
    """
    try:
        from mkdocs_jupyter import convert, nbconvert2
    except ImportError:
        return
    if getattr(convert.nb2html, "attnlab_reuse", False) or not all(
        hasattr(nbconvert2, name) for name in ("HTMLExporter", "MarkdownExporter")
    ):
        return
    made: dict[tuple[Any, str], Any] = {}
    options: list[str] = []  # the options of the conversion running now

    def reused(cls: Any) -> Callable[..., Any]:
        def make(**kwargs: Any) -> Any:
            key = (cls, options[-1])
            if key not in made:
                made[key] = cls(**kwargs)
            return made[key]

        return make

    def with_options(conversion: Callable[..., Any]) -> Callable[..., Any]:
        def run(nb_path: Any, *args: Any, **kwargs: Any) -> Any:
            options.append(repr((args, sorted(kwargs.items()))))
            try:
                return conversion(nb_path, *args, **kwargs)
            finally:
                options.pop()

        run.attnlab_reuse = True  # type: ignore[attr-defined]
        return run

    nbconvert2.HTMLExporter = reused(nbconvert2.HTMLExporter)
    nbconvert2.MarkdownExporter = reused(nbconvert2.MarkdownExporter)
    convert.nb2html = with_options(nbconvert2.nb2html)
    convert.nb2md = with_options(nbconvert2.nb2md)


@event_priority(50)  # before mkdocs-jupyter's on_files turns .ipynb files into pages
def on_files(files: Any, config: Any) -> Any:
    """Add the notebooks to the build as pages (their outputs come in ``on_pre_page``)."""
    from mkdocs.structure.files import File

    reuse_exporters()

    old = _build.pop("tmp", None)
    if old is not None:
        old.cleanup()
    tmp = tempfile.TemporaryDirectory(prefix="attnlab-notebooks-")
    _build.update(tmp=tmp, css={})
    docs = Path(config["docs_dir"])
    pages = {}
    for chapter in chapters(docs):
        src_uri = notebook_src_uri(chapter)
        (Path(tmp.name) / src_uri).parent.mkdir(parents=True, exist_ok=True)
        notebook = File(src_uri, tmp.name, config["site_dir"], config["use_directory_urls"])
        notebook.attnlab_chapter = chapter  # outputs.py reads it right after its chapter
        files.append(notebook)
        pages[src_uri] = chapter
    _build["pages"] = pages
    return files


def _nav_parts(nav: list[Any]) -> dict[str, str]:
    """Each page of the nav -> the title of the top-level section that holds it."""
    parts: dict[str, str] = {}

    def walk(items: list[Any], part: str) -> None:
        for item in items:
            if isinstance(item, str):
                parts[item] = part
            elif isinstance(item, dict):
                for title, value in item.items():
                    if isinstance(value, str):
                        parts[value] = part or title
                    else:
                        walk(value, part or title)

    walk(nav, "")
    return parts


def notebook_list(chapters: list[str], page_url: str, nav: list[Any], docs: Path = DOCS) -> str:
    """The notebooks of ``chapters`` as Markdown: one table per part of the site, in the
    order of the nav.

    Each row links the chapter, its notebook's page and the download (raw HTML: the
    file is written after the pages, so MkDocs cannot check a Markdown link to it).
    """
    from mkdocs.utils import get_relative_url

    parts = _nav_parts(nav)
    order = {page: k for k, page in enumerate(parts)}  # the nav's order, then the others
    out: list[str] = []
    part = None
    for chapter in sorted(chapters, key=lambda c: (order.get(c, len(order)), c)):
        if parts.get(chapter, "") != part:
            part = parts.get(chapter, "")
            out += [
                "",
                f"## {part or 'Other chapters'}",
                "",
                "| chapter | notebook: its page · the download |",
                "|---|---|",
            ]
        download = get_relative_url(notebook_uri(chapter), page_url)
        out.append(
            f"| [{chapter_title(chapter, docs)}]({chapter}) "
            f"| [page]({notebook_src_uri(chapter)}) · "
            f'<a href="{download}" download>{notebook_name(chapter)}.ipynb</a> |'
        )
    return "\n".join(out).strip() + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Write the list of notebooks into their index page."""
    if page.file.src_uri != INDEX_PAGE:
        return markdown
    if INDEX_MARKER not in markdown:
        log.warning(f"{INDEX_PAGE} has no {INDEX_MARKER}: the list of notebooks has no place")
        return markdown
    chapters = list(_build.get("pages", {}).values())
    listed = notebook_list(chapters, page.url, config["nav"] or [], Path(config["docs_dir"]))
    return markdown.replace(INDEX_MARKER, listed)


def on_pre_page(page: Any, config: Any, files: Any) -> Any:
    """Write a notebook, with the outputs of its chapter's run at this build, before its
    page is rendered. The chapter's page comes first (the notebooks are the build's last
    files), so its blocks have run; if not, the chapter runs here."""
    chapter = _build.get("pages", {}).get(page.file.src_uri)
    if chapter is None:
        return page
    chapter_file = files.get_file_from_path(chapter)
    run = getattr(getattr(chapter_file, "page", None), "attnlab_run", None)
    options: dict[str, Any] = {
        "docs": Path(config["docs_dir"]),
        "site_url": _site_url(config),
        "resolve": lambda i: AUTOREF_MARK + i,
    }
    try:
        nb = build_notebook(chapter, run=run if run is not None else True, **options)
    except NotebookError as exc:
        # A warning, as the chapter's own check gives: a strict build fails, naming the
        # line, and the other pages are still built and checked.
        log.warning(str(exc))
        nb = build_notebook(chapter, run=False, **options)
    path = Path(_build["tmp"].name) / page.file.src_uri
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", "utf-8")
    return page


def chapter_title(chapter: str, docs: Path = DOCS) -> str:
    """A chapter's title as plain text (for the navigation): its ``# `` line, unmarked."""
    title = re.search(r"^# (.+)$", (docs / chapter).read_text("utf-8"), flags=re.M)
    return title[1].replace("`", "").strip() if title else Path(chapter).stem


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Adapt a notebook page's HTML to the site (links, boxes, no CDN, one stylesheet)."""
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
    # nbconvert inlines its stylesheet (~570 KB) in every notebook: keep one copy, shared.
    for css in STYLE.findall(html):
        _build.setdefault("css", {}).setdefault(css.strip(), None)
    html = STYLE.sub("", html)
    toc_anchors(html, page.toc)
    return site_page_html(html, page.url, _site_url(config))


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
    if src_uri not in pages.values():  # the chapters of this build, found in on_files
        return html
    return _after_title(html, _button(get_relative_url(notebook_uri(src_uri), page.url)))


def on_post_build(config: Any) -> None:
    """Write each download (API links resolved, images embedded) and the shared styles."""
    tmp = _build.get("tmp")
    if tmp is None:
        return
    site_url, resolve = _site_url(config), _resolver(config)
    docs = Path(config["docs_dir"])
    for src_uri, chapter in _build.get("pages", {}).items():
        nb = json.loads((Path(tmp.name) / src_uri).read_text("utf-8"))
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                cell["source"] = resolve_placeholders(cell["source"], site_url, resolve)
                _attach_images(cell, docs, site_url)
        target = Path(config["site_dir"]) / notebook_uri(chapter)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", "utf-8")
    css = Path(config["site_dir"]) / STYLESHEET
    css.parent.mkdir(parents=True, exist_ok=True)
    css.write_text("\n".join([*_build.get("css", {}), NOTEBOOK_CSS]), "utf-8")


def on_shutdown() -> None:
    tmp = _build.pop("tmp", None)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "notebooks-out")
    site = sys.argv[2] if len(sys.argv) > 2 else SITE_URL
    for written in write_notebooks(out, site_url=site):
        print(written)
