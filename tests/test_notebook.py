"""The notebook page is generated from the chapters: same code, in order, no outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hooks import notebook, outputs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def nb() -> dict:  # type: ignore[type-arg]
    return notebook.build_notebook()


def test_code_cells_are_the_chapters_runnable_blocks_in_order(nb: dict) -> None:  # type: ignore[type-arg]
    expected = [
        block.code.rstrip("\n")
        for name in notebook.CHAPTERS
        for block in outputs.parse_blocks((ROOT / "docs/article" / name).read_text("utf-8"))
    ]
    cells = [c["source"].rstrip("\n") for c in nb["cells"] if c["cell_type"] == "code"]
    assert cells == expected
    assert len(cells) > 40


def test_notebook_has_no_outputs_and_is_valid(nb: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    import nbformat

    path = notebook.write_notebook(tmp_path / "article.ipynb")
    nbformat.validate(nbformat.read(str(path), as_version=4))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == []


def test_markdown_cells_drop_site_only_syntax(nb: dict) -> None:  # type: ignore[type-arg]
    prose = "\n".join(c["source"] for c in nb["cells"] if c["cell_type"] == "markdown")
    assert "][attnlab." not in prose  # autorefs became plain text
    assert "!!! " not in prose  # admonitions became quotes
    assert 'title="Output"' not in prose
    assert ".md)" not in prose  # links point at site pages


@pytest.mark.parametrize(
    ("target", "url"),
    [
        ("05-attention-weights.md", "../../article/05-attention-weights/"),
        ("../assets/images/x.svg", "../../assets/images/x.svg"),
        ("../beyond/masks.md#table", "../../beyond/masks/#table"),
        ("index.md", "../../article/"),
        ("../index.md", "../../"),
    ],
)
def test_links_are_rewritten_for_the_notebook_page(target: str, url: str) -> None:
    assert notebook._site_url(target) == url
