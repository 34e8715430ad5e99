"""Each chapter's notebook is generated from it: same code, in order, executed, portable."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hooks import notebook, outputs

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SITE = "https://example.org/attnlab/"
API = {"attnlab.SelfAttention": "reference/modules/#attnlab.SelfAttention"}
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")
FIGURE_CHAPTERS = [
    "article/07-self-attention-class.md",
    "article/09-causal-self-attention.md",
    "article/10-cross-attention.md",
]


@pytest.fixture(scope="module")
def notebooks() -> dict[str, dict[str, Any]]:
    return {
        chapter: notebook.build_notebook(chapter, site_url=SITE, resolve=API.get)
        for chapter in notebook.chapters()
    }


def _cells(nb: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [c for c in nb["cells"] if c["cell_type"] == kind]


def test_every_chapter_with_code_has_a_notebook() -> None:
    chapters = sorted(p.name for p in (DOCS / "article").glob("[0-9][0-9]-*.md"))
    with_code = [
        f"article/{name}"
        for name in chapters
        if outputs.parse_blocks((DOCS / "article" / name).read_text("utf-8"))
    ]
    assert notebook.chapters() == with_code
    assert len(with_code) >= 10


def test_code_cells_are_the_chapters_blocks_in_order(
    notebooks: dict[str, dict[str, Any]],
) -> None:
    for chapter, nb in notebooks.items():
        expected = [b.code.rstrip("\n") for b in outputs.parse_blocks((DOCS / chapter).read_text())]
        code = [c["source"].rstrip("\n") for c in _cells(nb, "code")]
        shown = [c for c in code if not c.startswith("from IPython.display import SVG")]
        assert shown == expected, chapter


def test_outputs_are_what_the_chapter_shows(notebooks: dict[str, dict[str, Any]]) -> None:
    # Each code cell's stored output is what executing it printed; the chapter's output
    # fence (checked against the code at every build) is the independent reference.
    compared = 0
    for chapter, nb in notebooks.items():
        blocks = outputs.parse_blocks((DOCS / chapter).read_text("utf-8"))
        cells = [c for c in _cells(nb, "code") if "SVG(" not in c["source"]]
        assert len(cells) == len(blocks)
        for k, (cell, block) in enumerate(zip(cells, blocks, strict=True), start=1):
            assert cell["execution_count"] is not None
            printed = "".join(o["text"] for o in cell["outputs"] if o["output_type"] == "stream")
            if block.output is None:
                assert printed == "", f"{chapter} cell {k}"
            else:
                assert outputs.compare(block.output, printed) is None, f"{chapter} cell {k}"
                compared += 1
    assert compared > 50


def test_chapter_figures_are_drawn_in_their_notebooks(
    notebooks: dict[str, dict[str, Any]],
) -> None:
    for chapter in FIGURE_CHAPTERS:
        figures = [
            out["data"]["image/svg+xml"]
            for cell in _cells(notebooks[chapter], "code")
            for out in cell["outputs"]
            if "image/svg+xml" in out.get("data", {})
        ]
        assert len(figures) == 1, chapter
        assert figures[0].startswith("<svg")
        assert figures[0].rstrip().endswith("</svg>")
        assert "attention weight" in figures[0]  # the colour bar's label, kept as text
    others = [c for c in notebooks if c not in FIGURE_CHAPTERS]
    for chapter in others:
        assert all("SVG(" not in c["source"] for c in _cells(notebooks[chapter], "code"))


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


def test_site_only_markdown_is_rewritten(notebooks: dict[str, dict[str, Any]]) -> None:
    prose = "\n".join(c["source"] for nb in notebooks.values() for c in _cells(nb, "markdown"))
    assert "][attnlab." not in prose  # autorefs became links or plain text
    assert "!!! " not in prose
    assert 'title="Output"' not in prose
    assert "{.python" not in prose
    assert prose.count('<div class="alert alert-block alert-warning">') >= 7  # pitfalls
    assert "> **Pitfall" not in prose  # not grey quotes


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


@pytest.mark.slow
def test_notebooks_run_in_jupyter(tmp_path: Path) -> None:
    # What a reader does after downloading: run every cell in a real kernel. The printed
    # text must equal what the build stored, and the figures must display.
    nbclient = pytest.importorskip("nbclient")
    import nbformat

    paths = notebook.write_notebooks(tmp_path, site_url=SITE)
    assert [p.name for p in paths] == [notebook.notebook_uri(c)[10:] for c in notebook.chapters()]
    for path in paths:
        stored = nbformat.read(str(path), as_version=4)
        nbformat.validate(stored)
        fresh = nbformat.read(str(path), as_version=4)
        nbclient.NotebookClient(fresh, timeout=120, allow_errors=False).execute()
        for old, new in zip(_cells(stored, "code"), _cells(fresh, "code"), strict=True):
            old_text = "".join(o.get("text", "") for o in old["outputs"])
            new_text = "".join(o.get("text", "") for o in new["outputs"])
            assert outputs.compare(old_text, new_text) is None, path.name
            old_svg = [o["data"]["image/svg+xml"] for o in old["outputs"] if "data" in o]
            new_svg = [o["data"]["image/svg+xml"] for o in new["outputs"] if "data" in o]
            assert len(old_svg) == len(new_svg), path.name
