"""Build the notebook page "The article as one notebook" from the article's chapters.

The chapters are the single source: at every build this hook turns the chapters listed in
``CHAPTERS`` into one ``.ipynb`` (prose as Markdown cells, runnable blocks as code cells,
no outputs), writes it to a temporary folder, and adds it to the site as
``notebooks/article.ipynb``. mkdocs-jupyter then executes and renders it, and copies the
``.ipynb`` beside the page for download. Nothing generated is written into ``docs/``, so
``mkdocs serve`` does not loop and there is no committed notebook to drift.

Run it as a script to write the notebook somewhere yourself::

    python docs/hooks/notebook.py article.ipynb
"""

from __future__ import annotations

import posixpath
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent
NOTEBOOK_URI = "notebooks/article.ipynb"
CHAPTERS = sorted(p.name for p in (DOCS / "article").glob("[0-9][0-9]-*.md"))
SITE_ROOT = "../../"  # from the notebook page (notebooks/article/) to the site root

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<info>[^\n]*)$")
AUTOREF = re.compile(r"\[([^\]]+)\]\[[\w.]+\]")  # [`SelfAttention`][attnlab.SelfAttention]
ADMONITION = re.compile(r'^(?:!!!|\?\?\?\+?)\s+\w+(?:\s+"(?P<title>[^"]*)")?\s*$')
LINK = re.compile(r"\]\((?!https?://|#|mailto:)(?P<target>[^)\s]+)\)")


def _is_code(info: str) -> bool:
    words = info.strip().strip("{}").replace(".python", "python").split()
    return (
        bool(words)
        and words[0] in ("python", "py")
        and "notest" not in words
        and not any(w.startswith("exec=") for w in words)
    )


def _site_url(target: str) -> str:
    """A chapter's relative link or image path, as seen from the notebook page."""
    path, hash_, anchor = target.partition("#")
    path = posixpath.normpath("article/" + path)  # chapters live in article/
    if path.endswith(".md"):  # the page's URL, with directory URLs
        path = path.removesuffix(".md").removesuffix("index")
        path = path if not path or path.endswith("/") else path + "/"
    return SITE_ROOT + path + hash_ + anchor


def _markdown_for_jupyter(text: str) -> str:
    """Rewrite the site-only Markdown (autorefs, admonitions, .md links) for Jupyter."""
    text = AUTOREF.sub(r"\1", text)
    text = LINK.sub(lambda m: f"]({_site_url(m['target'])})", text)
    lines, out, quoting = text.split("\n"), [], False
    for line in lines:
        match = ADMONITION.match(line)
        if match:
            quoting = True
            out.append(f"> **{match['title'] or 'Note'}**")
            continue
        if quoting and (line.startswith("    ") or not line.strip()):
            out.append("> " + line[4:] if line.strip() else ">")
            continue
        quoting = False
        out.append(line)
    return "\n".join(out).strip()


def chapter_cells(markdown: str) -> list[dict[str, Any]]:
    """Split one chapter into notebook cells: prose and runnable code, outputs dropped."""
    cells: list[dict[str, Any]] = []
    prose: list[str] = []

    def flush() -> None:
        text = _markdown_for_jupyter("\n".join(prose))
        if text:
            cells.append({"cell_type": "markdown", "metadata": {}, "source": text})
        prose.clear()

    lines = markdown.split("\n")
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            prose.append(lines[i])
            i += 1
            continue
        ticks, info = fence["ticks"], fence["info"]
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(ticks):
            j += 1
        body = "\n".join(line[len(fence["indent"]) :] for line in lines[i + 1 : j])
        if _is_code(info) and not fence["indent"]:
            flush()
            cells.append(
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "metadata": {},
                    "outputs": [],
                    "source": body,
                }
            )
        elif 'title="Output"' in info or "exec=" in info:
            pass  # outputs are recomputed by executing the notebook; figures are site-only
        else:
            prose.extend(lines[i : j + 1])
        i = j + 1
    flush()
    return cells


def build_notebook(docs: Path = DOCS) -> dict[str, Any]:
    """The article chapters as one nbformat-4 notebook, without outputs."""
    intro = (
        "# The article as one notebook\n\n"
        "Every runnable block of the chapters *Introducing self-attention* to "
        "*Cross-attention*, in order, in one notebook. It is generated from the chapters "
        "at each build of the site and executed there, so what you see below is what the "
        "code printed. [Download it](article.ipynb) and run it with `attnlab` installed "
        "(`pip install -e .` in a clone of the repository)."
    )
    cells: list[dict[str, Any]] = [{"cell_type": "markdown", "metadata": {}, "source": intro}]
    for name in CHAPTERS:
        cells.extend(chapter_cells((docs / "article" / name).read_text(encoding="utf-8")))
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def write_notebook(path: Path) -> Path:
    import nbformat

    notebook = nbformat.from_dict(build_notebook())
    for k, cell in enumerate(notebook.cells):
        cell["id"] = f"cell-{k}"
    nbformat.validate(notebook)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, str(path))
    return path


# MkDocs hook ---------------------------------------------------------------------------

_tmp: tempfile.TemporaryDirectory[str] | None = None


def _on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    global _tmp
    if _tmp is None:
        _tmp = tempfile.TemporaryDirectory(prefix="attnlab-notebook-")
    write_notebook(Path(_tmp.name) / NOTEBOOK_URI)
    # A plain File rooted in the temporary folder (not File.generated): mkdocs-jupyter's
    # wrapper derives the source path from src_dir, which generated files lack.
    files.append(
        File(
            NOTEBOOK_URI,
            src_dir=_tmp.name,
            dest_dir=config["site_dir"],
            use_directory_urls=config["use_directory_urls"],
        )
    )
    return files


try:  # run before mkdocs-jupyter's on_files, which must see the notebook
    from mkdocs.plugins import event_priority

    on_files = event_priority(100)(_on_files)
except ImportError:  # pragma: no cover - only when used as a script without mkdocs
    on_files = _on_files


def on_page_context(context: Any, page: Any, config: Any, nav: Any) -> Any:
    if page.file.src_uri == NOTEBOOK_URI:
        page.edit_url = None  # generated from the chapters: there is no file to edit
    return context


def on_post_page(output: str, page: Any, config: Any) -> str:
    if page.file.src_uri == NOTEBOOK_URI:
        # nbconvert's template loads MathJax from an empty URL; KaTeX renders the math here.
        output = output.replace('<script src=""> </script>', "")
    return output


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "article.ipynb")
    print(write_notebook(target))
