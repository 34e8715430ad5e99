"""Each chapter's notebook is generated from it: same code, in order, executed, portable.

The outputs come from the test session's run of each chapter's blocks (the `page_run`
fixture of conftest.py), the same execution that the chapter's own items check.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hooks import blocks, notebook, outputs

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SITE = "https://example.org/attnlab/"
API = {"attnlab.SelfAttention": "reference/article/#attnlab.SelfAttention"}
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")
DISPLAY = "from IPython.display import"  # how a figure cell starts in a notebook


def _figure_cell(source: str) -> bool:
    """A cell that displays a figure: `SVG(...)`/`HTML(...)`, or an object showing itself."""
    return source.startswith(DISPLAY) or source.rstrip("\n").endswith("  # drawn below the cell")


PageRun = Callable[[str], outputs.PageRun]


_FAILED: dict[str, str] = {}  # chapters whose notebook could not be built: why


@pytest.fixture(scope="module")
def notebooks(page_run: PageRun) -> dict[str, dict[str, Any]]:
    # A chapter whose block raises fails its own items and test_every_notebook_builds;
    # the other chapters' notebooks are still checked by the tests below.
    built = {}
    for chapter in notebook.chapters():
        try:
            built[chapter] = notebook.build_notebook(
                chapter, site_url=SITE, resolve=API.get, run=page_run(f"docs/{chapter}")
            )
        except notebook.NotebookError as exc:
            _FAILED[chapter] = str(exc)
    return built


def test_every_notebook_builds(notebooks: dict[str, dict[str, Any]]) -> None:
    assert _FAILED == {}
    assert list(notebooks) == notebook.chapters()


def _blocks(chapter: str) -> list[blocks.Block]:
    """The chapter's blocks that are code cells as they are (figures are rewritten)."""
    every = blocks.code_blocks((DOCS / chapter).read_text("utf-8"), exec_blocks=True)
    return [b for b in every if not _figure(b)]


def _figure(block: blocks.Block) -> bool:
    return block.fence is not None and block.is_exec and 'html="1"' in block.fence.info


def _rich(data: dict[str, Any]) -> dict[str, str]:
    """A display result without its text/plain fallback (the kernel writes a repr)."""
    return {mime: value for mime, value in data.items() if mime != "text/plain"}


def _cells(nb: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [c for c in nb["cells"] if c["cell_type"] == kind]


def test_every_chapter_with_code_has_a_notebook() -> None:
    pages = [
        *sorted((DOCS / "article").glob("[0-9][0-9]-*.md")),
        *sorted((DOCS / "beyond").glob("*.md")),
        *sorted((DOCS / "modern").glob("*.md")),
    ]
    with_code = [
        str(page.relative_to(DOCS))
        for page in pages
        if blocks.code_blocks(page.read_text("utf-8"), exec_blocks=True)
    ]
    assert notebook.chapters() == with_code
    assert len([c for c in with_code if c.startswith("article/")]) >= 10
    assert len([c for c in with_code if c.startswith(("beyond/", "modern/"))]) >= 10
    assert "modern/index.md" not in with_code  # no code, no notebook
    names = [notebook.notebook_name(c) for c in with_code]
    assert len(set(names)) == len(names)
    assert notebook.notebook_uri("modern/rope.md") == "notebooks/modern-rope/modern-rope.ipynb"


def test_code_cells_are_the_chapters_blocks_in_order(
    notebooks: dict[str, dict[str, Any]],
) -> None:
    for chapter, nb in notebooks.items():
        expected = [b.code.rstrip("\n") for b in _blocks(chapter)]
        code = [c["source"].rstrip("\n") for c in _cells(nb, "code")]
        shown = [c for c in code if not _figure_cell(c)]
        assert shown == expected, chapter


def test_outputs_are_what_the_chapter_shows(notebooks: dict[str, dict[str, Any]]) -> None:
    # Each code cell's stored output is what executing it printed; the chapter's output
    # fence (checked against the code at every build) is the independent reference.
    compared = 0
    for chapter, nb in notebooks.items():
        chapter_blocks = _blocks(chapter)
        cells = [c for c in _cells(nb, "code") if not _figure_cell(c["source"])]
        assert len(cells) == len(chapter_blocks)
        for k, (cell, block) in enumerate(zip(cells, chapter_blocks, strict=True), start=1):
            assert cell["execution_count"] is not None
            printed = "".join(o["text"] for o in cell["outputs"] if o["output_type"] == "stream")
            if block.is_exec:  # markdown-exec shows what it prints (a table) as Markdown
                assert printed.strip(), f"{chapter} cell {k}"
            elif block.output is None:
                assert printed == "", f"{chapter} cell {k}"
            else:
                assert outputs.compare(block.output, printed) is None, f"{chapter} cell {k}"
                compared += 1
    assert compared > 150


def test_chapter_figures_are_drawn_in_their_notebooks(
    notebooks: dict[str, dict[str, Any]],
) -> None:
    # Each figure the chapter draws at build time (markdown-exec blocks that print HTML)
    # is a cell whose stored result is the same drawing, SVG or HTML with inline SVG; an
    # object that draws itself (`print(view.html())`: a model view) is a cell with no
    # stored copy, drawn when it runs.
    drawn = self_drawn = 0
    for chapter, nb in notebooks.items():
        every = blocks.code_blocks((DOCS / chapter).read_text("utf-8"), exec_blocks=True)
        wanted = len([b for b in every if _figure(b)])
        own = [c for c in _cells(nb, "code") if _figure_cell(c["source"])]
        own = [c for c in own if not c["source"].startswith(DISPLAY)]
        assert all(c["outputs"] == [] and c["execution_count"] for c in own)
        figures = [
            value
            for cell in _cells(nb, "code")
            for out in cell["outputs"]
            for mime, value in out.get("data", {}).items()
            if mime in ("image/svg+xml", "text/html")
        ]
        assert len(figures) == wanted - len(own), chapter
        for figure in figures:
            assert "<svg" in figure
            assert figure.rstrip().endswith(("</svg>", "</figure>", "</div>"))
        figure_cells = [c for c in _cells(nb, "code") if _figure_cell(c["source"])]
        assert len(figure_cells) == wanted, chapter
        assert all("print(" not in c["source"].split("\n")[-1] for c in figure_cells)
        drawn += wanted - len(own)
        self_drawn += len(own)
    assert self_drawn == 1  # the model view of "Attention in a real LLM"
    assert drawn >= 10  # chapters 07, 09 and 10, masks, rope, gqa...


def test_figure_source_displays_instead_of_printing() -> None:
    svg, mime = notebook._figure_source(
        "fig = make()\nprint(f'<div class=\"attn-figure\">{figure_to_svg(fig)}</div>')\n"
    )
    assert mime == "image/svg+xml"
    assert svg.endswith("SVG(figure_to_svg(fig))  # drawn below the cell")
    html, mime = notebook._figure_source("x = 1\nprint(\n    draw(x, title='t')\n)\n")
    assert mime == "text/html"
    assert html == (
        "from IPython.display import HTML\n\n"
        "x = 1\nHTML(draw(x, title='t'))  # drawn below the cell"
    )
    # An object that displays itself (a model view, its script inline) is the cell's value.
    own, mime = notebook._figure_source("view = make()\nprint(view.html())\n")
    assert (own, mime) == ("view = make()\nview  # drawn below the cell", "text/html")
    with pytest.raises(ValueError, match="must end with print"):
        notebook._figure_source("x = 1\n")


def test_links_and_images_work_outside_the_site(notebooks: dict[str, dict[str, Any]]) -> None:
    targets = [
        m["target"]
        for nb in notebooks.values()
        for cell in _cells(nb, "markdown")
        for m in MARKDOWN_LINK.finditer(cell["source"])
    ]
    assert len(targets) > 30
    relative = [t for t in targets if not t.startswith(("https://", "mailto:"))]
    assert relative == []
    assert f"{SITE}assets/images/self-attention-one-token.svg" in targets
    assert f"{SITE}article/05-attention-weights/" in targets
    assert f"{SITE}{API['attnlab.SelfAttention']}" in targets  # an autoref, resolved


def test_downloads_embed_their_images(page_run: PageRun) -> None:
    # A downloaded notebook shows its figures offline: each image of the site is a cell
    # attachment, byte for byte the site's file.
    chapter = "article/01-introducing-self-attention.md"
    nb = notebook.build_notebook(
        chapter, site_url=SITE, run=page_run(f"docs/{chapter}"), embed_images=True
    )
    attached = {
        name: data
        for cell in _cells(nb, "markdown")
        for name, data in cell.get("attachments", {}).items()
    }
    image = "self-attention-one-token.svg"
    assert set(attached) == {image}
    svg = (DOCS / "assets/images" / image).read_bytes()
    assert base64.b64decode(attached[image]["image/svg+xml"]) == svg
    prose = "\n".join(c["source"] for c in _cells(nb, "markdown"))
    assert f"](attachment:{image})" in prose
    assert f"{SITE}assets/images/" not in prose


def test_solutions_stay_collapsed(notebooks: dict[str, dict[str, Any]]) -> None:
    # A chapter's `??? success "Solution"` is closed until the reader opens it: its text
    # in a <details>, its code cells with hidden input and output.
    solutions = 0
    for chapter, nb in notebooks.items():
        page = blocks.read((DOCS / chapter).read_text("utf-8"))
        in_solutions = [
            f.content.rstrip("\n")
            for f in page.fences
            if f.runs and not (f.is_exec and 'html="1"' in f.info)
            if any(c.collapsed for c in f.containers)
        ]
        hidden = [c["source"] for c in _cells(nb, "code") if c["metadata"] == notebook.SOLUTION]
        assert hidden == in_solutions, chapter
        solutions += len(hidden)
        prose = "\n".join(c["source"] for c in _cells(nb, "markdown"))
        collapsed = {c.line for f in page.fences for c in f.containers if c.collapsed}
        if collapsed:
            assert "<details " in prose, chapter
    assert solutions >= 25


def test_site_only_markdown_is_rewritten(notebooks: dict[str, dict[str, Any]]) -> None:
    prose = "\n".join(c["source"] for nb in notebooks.values() for c in _cells(nb, "markdown"))
    assert "][attnlab." not in prose  # autorefs became links or plain text
    assert "!!! " not in prose
    assert "??? " not in prose
    assert '=== "' not in prose
    assert 'title="Output"' not in prose
    assert "{.python" not in prose
    assert prose.count('<div class="alert alert-block alert-warning">') >= 7  # pitfalls
    assert "> **Pitfall" not in prose  # not grey quotes


def test_the_note_on_the_notebook_comes_right_under_the_title(
    notebooks: dict[str, dict[str, Any]],
) -> None:
    for chapter, nb in notebooks.items():
        title = re.search(r"^# .+$", (DOCS / chapter).read_text("utf-8"), flags=re.M)
        assert title is not None
        assert nb["cells"][0]["source"] == title[0], chapter
        assert nb["cells"][1]["source"].startswith("*This notebook is the chapter"), chapter


def test_generated_figure_cells_fit_the_column(notebooks: dict[str, dict[str, Any]]) -> None:
    # The display line the notebook adds (HTML(...)/SVG(...)) is split rather than cut.
    calls = [
        cell["source"][cell["source"].rfind("\nHTML(") + 1 :]
        if "\nHTML(" in cell["source"]
        else cell["source"][cell["source"].rfind("\nSVG(") + 1 :]
        for nb in notebooks.values()
        for cell in _cells(nb, "code")
        if cell["source"].startswith(DISPLAY)
    ]
    lines = [line for call in calls for line in call.split("\n")]
    assert any(line.startswith("HTML(") for line in lines)
    # Every code line of a notebook page fits, the figure code too (a chapter hides it,
    # so tests/test_code_width.py does not see it).
    # (Cells of markdown-exec blocks whose code the chapter hides are hidden there too.)
    code_lines = [
        line
        for nb in notebooks.values()
        for cell in _cells(nb, "code")
        if cell["metadata"] != notebook.HIDDEN_INPUT
        for line in cell["source"].split("\n")
    ]
    assert [line for line in code_lines if len(line) > notebook.MAX_LINE] == []
    assert [line for line in lines if len(line) > notebook.MAX_LINE] == []
    long_call, _ = notebook._figure_source(f"print(draw({'x' * 90!r}))\n")
    assert long_call.endswith(f"HTML(  # drawn below the cell\n    draw({'x' * 90!r})\n)")


def test_one_exporter_renders_the_notebook_pages_as_new_ones_do(
    tmp_path: Path, notebooks: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mkdocs_jupyter import convert, nbconvert2
    from nbconvert.exporters.html import HTMLExporter

    paths = []
    for chapter in ("article/05-attention-weights.md", "beyond/masks.md"):
        path = tmp_path / f"{notebook.notebook_name(chapter)}.ipynb"
        path.write_text(json.dumps(notebooks[chapter]), "utf-8")
        paths.append(str(path))
    options: dict[str, Any] = {
        "no_prompt": True,
        "remove_tag_config": {"remove_input_tags": ["hide-input"]},
    }
    made: list[object] = []

    class Counted(HTMLExporter):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(self)
            super().__init__(*args, **kwargs)

    # mkdocs-jupyter as it comes (restored after the test), with exporters counted.
    monkeypatch.setattr(nbconvert2, "HTMLExporter", Counted)
    monkeypatch.setattr(nbconvert2, "MarkdownExporter", nbconvert2.MarkdownExporter)
    monkeypatch.setattr(convert, "nb2html", nbconvert2.nb2html)
    monkeypatch.setattr(convert, "nb2md", nbconvert2.nb2md)
    notebook.reuse_exporters()
    notebook.reuse_exporters()  # once is enough: a second call changes nothing
    assert convert.nb2html.attnlab_reuse  # the patch took: this layout is the known one
    reused = [convert.nb2html(path, **options) for path in paths]
    assert len(made) == 1  # one exporter for both pages
    with monkeypatch.context() as patch:  # mkdocs-jupyter's own way: a new exporter each
        patch.setattr(nbconvert2, "HTMLExporter", HTMLExporter)
        fresh = [nbconvert2.nb2html(path, **options) for path in paths]
    assert reused == fresh
    assert "jp-Notebook" in reused[1]


def test_notebook_pages_are_adapted_to_the_site() -> None:
    # What mkdocs-jupyter renders for a notebook cell, trimmed; the page is
    # notebooks/05-x/ (a page of the site, not the downloaded file).
    rendered = (
        "<!-- Load mathjax -->\n<script src='https://cdn.example/MathJax.js'></script>\n"
        "<script>MathJax.Hub.Config({});</script>\n<!-- End of mathjax configuration -->"
        '<script src="https://cdn.example/require.min.js"></script>'
        f'<p><a href="{SITE}article/05-x/">the chapter</a>, '
        f'<a href="{SITE}article/04-y/#scores">scores</a>, <a href="{SITE}">home</a></p>'
        f'<img alt="a" src="{SITE}assets/images/a.svg"/>'
        f'<a href="{SITE}{notebook.AUTOREF_MARK}attnlab.SelfAttention"><code>S</code></a>'
        '<div class="alert alert-block alert-warning">\n<p><strong>Pitfall: x</strong></p>\n'
        "<p>Body.</p>\n</div>"
    )
    page = notebook.site_page_html(rendered, "notebooks/05-x/", SITE)
    assert "https://cdn.example" not in page
    assert "MathJax" not in page
    assert '<a href="../../article/05-x/">the chapter</a>' in page
    assert '<a href="../../article/04-y/#scores">scores</a>' in page
    assert '<a href="../../">home</a>' in page
    assert 'src="../../assets/images/a.svg"' in page
    assert (
        '<div class="admonition warning"><p class="admonition-title">Pitfall: x</p>'
        "<p>Body.</p></div>"
    ) in page
    assert "alert-block" not in page
    # API links are resolved only once every page is rendered (autorefs).
    finished = notebook.resolve_page_placeholders(page, "notebooks/05-x/", SITE, API.get)
    assert '<a href="../../reference/article/#attnlab.SelfAttention"><code>S</code></a>' in finished
    assert notebook.AUTOREF_MARK not in finished
    unresolved = notebook.resolve_page_placeholders(page, "notebooks/05-x/", SITE, {}.get)
    assert "<code>S</code>" in unresolved
    assert notebook.AUTOREF_MARK not in unresolved


def test_collapsed_boxes_and_solution_cells_on_the_page() -> None:
    rendered = (
        '<details class="alert alert-block alert-success">\n'
        "<summary><strong>Solution</strong></summary>\n<p>Text.</p>\n</details>"
        '<div class="jp-Cell jp-CodeCell celltag_solution" id="c1"><div class="in">'
        "<pre>print(1)</pre></div><div class='out'></div></div>"
        '<div class="jp-Cell jp-CodeCell" id="c2"><pre>x</pre></div>'
    )
    page = notebook.site_page_html(rendered, "notebooks/05-x/", SITE)
    assert page.startswith('<details class="tip"><summary>Solution</summary>')
    assert page.count("<details") == page.count("</details>") == 2
    cell = page[page.index('<details class="tip"><summary>Solution: code') :]
    assert cell.index('id="c1"') < cell.index("</details>") < cell.index('id="c2"')
    assert "alert-block" not in page


def test_toc_anchors_follow_the_page_headings() -> None:
    class Item:
        def __init__(self, id: str, children: list[Item]) -> None:
            self.id, self.children = id, children

    toc = [Item("the-class", [Item("a", []), Item("b", [])]), Item("c", [])]
    html = (
        '<h1 id="the-selfattention-class">The <code>SelfAttention</code> class</h1>'
        '<h2 id="a">A</h2><h2 id="b-2">B</h2><h2 id="c">C</h2>'
    )
    notebook.toc_anchors(html, toc)
    assert [toc[0].id, toc[0].children[0].id, toc[0].children[1].id, toc[1].id] == [
        "the-selfattention-class",
        "a",
        "b-2",
        "c",
    ]


def test_download_placeholders_become_absolute_links() -> None:
    text = (
        f"See [`SelfAttention`]({SITE}{notebook.AUTOREF_MARK}attnlab.SelfAttention) and "
        f"[`gone`]({SITE}{notebook.AUTOREF_MARK}attnlab.gone)."
    )
    assert notebook.resolve_placeholders(text, SITE, API.get) == (
        f"See [`SelfAttention`]({SITE}{API['attnlab.SelfAttention']}) and `gone`."
    )


def test_chapter_title_is_plain_text() -> None:
    assert notebook.chapter_title("article/07-self-attention-class.md") == (
        "The SelfAttention class"
    )


@pytest.mark.parametrize(
    ("target", "url"),
    [
        ("05-attention-weights.md", f"{SITE}article/05-attention-weights/"),
        ("../assets/images/x.svg", f"{SITE}assets/images/x.svg"),
        ("../beyond/masks.md#table", f"{SITE}beyond/masks/#table"),
        ("index.md", f"{SITE}article/"),
        ("../index.md", SITE),
        ("#a-section", f"{SITE}article/03-weight-matrices/#a-section"),
    ],
)
def test_absolute_url(target: str, url: str) -> None:
    assert notebook.absolute_url(target, "article/03-weight-matrices.md", SITE) == url


def test_a_raising_cell_names_the_chapter_and_line(tmp_path: Path) -> None:
    (tmp_path / "article").mkdir()
    (tmp_path / "article/01-x.md").write_text(
        "# X\n\n```python\nx = 1\n```\n\ntext\n\n```python\nprint(1 / 0)\n```\n", "utf-8"
    )
    with pytest.raises(notebook.NotebookError, match=r"01-x\.md:9: the cell raised"):
        notebook.build_notebook("article/01-x.md", docs=tmp_path)


def test_notebooks_are_valid(notebooks: dict[str, dict[str, Any]]) -> None:
    nbformat = pytest.importorskip("nbformat")
    for chapter, nb in notebooks.items():
        nbformat.validate(nbformat.from_dict(nb))
        assert nb["cells"][1]["source"].startswith("*This notebook"), chapter


# Chapters whose notebooks run in a real kernel below: one with printed text only, the
# three with figures (SVG and interactive HTML) and solution cells, and one of beyond/
# that reads no stored file. Every notebook is built from its chapter's run and compared
# with its chapter by the tests above; a kernel per notebook costs ~5 s, mostly
# importing torch, so the kernel check is kept to what differs in a kernel: the display
# of each kind of output.
KERNEL_CHAPTERS = (
    "article/01-introducing-self-attention.md",
    "article/07-self-attention-class.md",
    "article/09-causal-self-attention.md",
    "article/10-cross-attention.md",
    "beyond/masks.md",
)


@pytest.mark.slow
def test_notebooks_run_in_jupyter(tmp_path: Path, page_run: PageRun) -> None:
    # What a reader does after downloading: run every cell in a real kernel. The printed
    # text must equal what the build stored, and the figures must display.
    nbclient = pytest.importorskip("nbclient")
    import nbformat
    from nbclient.util import run_sync

    # One kernel for the five, its namespace and print options reset before each, as a
    # fresh kernel has them: starting a kernel and importing torch in it is most of the
    # cost of a notebook this small.
    fresh_state = "%reset -f\nimport torch\ntorch.set_printoptions(profile='default')\ndel torch"
    reset = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(fresh_state)])
    km = nbclient.NotebookClient(reset).create_kernel_manager()
    # In a folder that is not the repository: these notebooks need none of its files.
    run_sync(km.start_kernel)(cwd=str(tmp_path))
    try:
        for chapter in KERNEL_CHAPTERS:
            _run_in_kernel(nbclient, km, reset, chapter, page_run)
    finally:
        run_sync(km.shutdown_kernel)(now=True)


def _execute(nbclient: Any, nb: Any, km: Any) -> None:
    client = nbclient.NotebookClient(nb, km=km, timeout=120, allow_errors=False)
    try:
        client.execute()
    finally:  # the kernel stays up for the next notebook; this client's sockets do not
        if client.kc is not None:
            client.kc.stop_channels()


def _run_in_kernel(nbclient: Any, km: Any, reset: Any, chapter: str, page_run: PageRun) -> None:
    """Run the chapter's notebook in the kernel of ``km``, after ``reset``; compare outputs."""
    import nbformat

    _execute(nbclient, reset, km)
    nb = notebook.build_notebook(
        chapter, site_url=SITE, run=page_run(f"docs/{chapter}"), embed_images=True
    )
    stored = nbformat.from_dict(nb)
    nbformat.validate(stored)
    fresh = nbformat.from_dict(nb)
    _execute(nbclient, fresh, km)
    for old, new in zip(_cells(stored, "code"), _cells(fresh, "code"), strict=True):
        old_text = "".join(o.get("text", "") for o in old["outputs"])
        new_text = "".join(o.get("text", "") for o in new["outputs"])
        assert outputs.compare(old_text, new_text) is None, chapter
        # Figures are drawn deterministically: the kernel's equals the stored one.
        old_fig = [_rich(o["data"]) for o in old["outputs"] if "data" in o]
        new_fig = [_rich(o["data"]) for o in new["outputs"] if "data" in o]
        assert old_fig == new_fig, chapter
