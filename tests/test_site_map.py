"""The map of the site, the "Before this" lines, the reading paths, the glossary and the
list of notebooks: each drawn from, or checked against, the nav and one table.

No build here (tests/test_site.py checks the built pages): the tables of
docs/hooks/site_map.py against mkdocs.yml's nav and the pages' Markdown, the map's
drawings as SVG, and the glossary against the abbreviations every page gets.
"""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml
from hooks import abbreviations as abbreviations_hook
from hooks import notebook, site_map

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SVG = "{http://www.w3.org/2000/svg}"


class _Loader(yaml.SafeLoader):
    """mkdocs.yml with its Python tags (``!!python/name:...``) read as nothing."""


_Loader.add_multi_constructor("", lambda loader, suffix, node: None)


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return yaml.load((ROOT / "mkdocs.yml").read_text("utf-8"), Loader=_Loader)


@pytest.fixture(scope="module")
def nav(config: dict[str, Any]) -> list[Any]:
    return config["nav"]


def _nav_pages(nav: list[Any]) -> list[str]:
    return [page for _, page in site_map.nav_pages(nav)]


def test_tables_match_the_nav_and_the_pages(nav: list[Any]) -> None:
    assert site_map.problems(nav) == []
    # Each "Before this" line stands where the table says, with the text it gives.
    assert site_map.before_lines() == site_map.expected_before_lines()
    assert len(site_map.before_lines()) == len(site_map.PREREQUISITES) == 5


def test_a_changed_line_or_a_renamed_page_fails(nav: list[Any], tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    for folder in site_map.MAP_SECTIONS:
        shutil.copytree(DOCS / folder, docs / folder)
    assert site_map.problems(nav, docs) == []
    sparse = docs / "modern/sparse-attention.md"
    text = sparse.read_text("utf-8")
    sparse.write_text(text.replace("selects entries of", "reads"), "utf-8")
    found = site_map.problems(nav, docs)
    assert len(found) == 1
    assert "modern/sparse-attention.md, under its title" in found[0]
    # A "Before this" line the table does not give, anywhere, fails too.
    sparse.write_text(text + "\n**Before this:** [a page](mla.md): more.\n", "utf-8")
    assert len(site_map.problems(nav, docs)) == 1
    # --update writes the table's line back, and only where it differs.
    sparse.write_text(text.replace("selects entries of", "reads"), "utf-8")
    assert site_map.write_before_lines(docs) == ["modern/sparse-attention.md"]
    assert sparse.read_text("utf-8") == text
    assert site_map.problems(nav, docs) == []
    # A page renamed in the nav (and on disk) that the tables still name.
    renamed = yaml.safe_load(yaml.safe_dump(nav).replace("induction-heads", "heads"))
    found = site_map.problems(renamed, docs)
    assert any("beyond/induction-heads.md, which is not in the nav" in p for p in found)
    assert any("READING_PATHS (A researcher)" in p for p in found)


def test_each_before_this_line_links_a_heading_that_exists() -> None:
    for entry in site_map.PREREQUISITES:
        line = site_map.before_line(entry)
        target = re.search(r"\]\(([^)]+)\)", line)
        assert target is not None
        path, _, anchor = target[1].partition("#")
        page = (DOCS / entry.page).parent / path
        assert page.is_file(), line
        if anchor:
            found = [site_map.slug(h) for h in site_map.headings(entry.needs)]
            assert anchor in found, line


def _drawings(nav: list[Any]) -> dict[str, ET.Element]:
    html = site_map.map_html(nav, lambda page: "/" + page)
    svgs = re.findall(r"<svg\b.*?</svg>", html, flags=re.S)
    return {ET.fromstring(svg).get("class", ""): ET.fromstring(svg) for svg in svgs}


def _rects(svg: ET.Element) -> list[tuple[float, float, float, float]]:
    return [
        tuple(float(r.get(a, 0)) for a in ("x", "y", "width", "height"))  # type: ignore[misc]
        for r in svg.iter(f"{SVG}rect")
    ]


@pytest.mark.parametrize("layout", [site_map.WIDE, site_map.NARROW], ids=lambda x: x.name)
def test_the_map_draws_every_chapter_and_every_arrow(
    nav: list[Any], layout: site_map.Layout
) -> None:
    svg = _drawings(nav)[f"attn-map-{layout.name}"]
    chapters = [p for p in _nav_pages(nav) if p.split("/")[0] in site_map.MAP_SECTIONS]
    links = [a.get("href") for a in svg.iter(f"{SVG}a")]
    # Every chapter of the three parts once, in the nav's order (the two index pages are
    # the parts' headings, linked too); nothing else.
    assert sorted(links) == sorted("/" + p for p in chapters)
    assert [p for p in links if "/index.md" not in str(p)] == [
        "/" + p for p in chapters if not p.endswith("index.md")
    ]
    # One "read this first" arrow per row of the table, plus the legend's sample.
    needs = [p for p in svg.iter(f"{SVG}path") if p.get("class") == "attn-map-needs"]
    assert len(needs) == len(site_map.PREREQUISITES) + 1
    hints = [p.findtext(f"{SVG}title") for p in needs if p.find(f"{SVG}title") is not None]
    assert "Read Watching heads learn before Attention in a real LLM" in hints
    # The article's path: one arrow between consecutive chapters, two out of its end.
    article = [p for p in chapters if p.startswith("article/") and not p.endswith("index.md")]
    paths = [p for p in svg.iter(f"{SVG}path") if p.get("class") == "attn-map-path"]
    assert len(paths) == len(article) - 1 + 2 + 1  # + the legend's sample
    # Readable as drawn: no text under 11 px, nothing outside the drawing, no two boxes
    # on top of each other.
    sizes = [float(t.get("font-size", 0)) for t in svg.iter(f"{SVG}text")]
    assert min(sizes) >= 11
    width, height = float(svg.get("width", 0)), float(svg.get("height", 0))
    assert width == layout.width
    rects = _rects(svg)
    assert len(rects) == len(chapters) - 2
    for k, (x, y, w, h) in enumerate(rects):
        assert x >= 0
        assert y >= 0
        assert x + w <= width
        assert y + h <= height
        for x2, y2, w2, h2 in rects[k + 1 :]:
            assert x + w <= x2 or x2 + w2 <= x or y + h <= y2 or y2 + h2 <= y
    assert svg.findtext(f"{SVG}desc", "").count(" before ") == len(site_map.PREREQUISITES)


def test_reading_paths_name_pages_of_the_nav(nav: list[Any]) -> None:
    pages = _nav_pages(nav)
    html = site_map.reading_paths(lambda page: "/" + page)
    assert html.count("<li>") == 3
    for path in site_map.READING_PATHS:
        assert set(path.steps) <= set(pages), path.reader
        for page in path.steps:
            assert f'href="/{page}"' in html
    engineer, researcher = site_map.READING_PATHS[1:]
    assert engineer.steps == (
        "beyond/production.md",
        "beyond/flash-attention.md",
        "modern/kv-cache.md",
        "modern/serving.md",
    )
    assert researcher.steps[1:3] == ("modern/real-llm.md", "modern/softcapping-and-sinks.md")


def test_the_home_page_holds_the_maps_markers() -> None:
    text = (DOCS / "index.md").read_text("utf-8")
    assert text.count(site_map.MARKER) == 1
    assert text.count(site_map.PATHS_MARKER) == 1
    assert "## A map of the site" in text


# --- the glossary ----------------------------------------------------------------------

GLOSSARY = DOCS / "glossary.md"
ABBREVIATIONS = DOCS / "includes/abbreviations.md"


def _glossary_terms() -> list[str]:
    """The glossary's terms: the lines that a definition (``:   ``) follows."""
    lines = GLOSSARY.read_text("utf-8").splitlines()
    return [lines[k - 1] for k, line in enumerate(lines) if line.startswith(":   ")]


def test_every_abbreviation_has_a_glossary_entry(config: dict[str, Any]) -> None:
    abbreviations = abbreviations_hook.read(ABBREVIATIONS)
    assert len(abbreviations) >= 20
    assert abbreviations["GQA"].startswith("grouped-query attention: ")
    terms = " ".join(_glossary_terms())
    # Each under an entry of its own or of its family ("MQA" under "GQA, MQA", "UT" under
    # "WY and UT transform", "FLOP" under "FLOPs").
    missing = [a for a in abbreviations if not re.search(rf"\b{re.escape(a)}", terms)]
    assert missing == []
    # Read by the hook, outside the pages (docs/includes is not a page).
    assert "docs/hooks/abbreviations.py" in config["hooks"]
    assert "abbr" in [
        e if isinstance(e, str) else next(iter(e)) for e in config["markdown_extensions"]
    ]
    assert "includes/" in config["exclude_docs"]


def test_the_hook_gives_every_conversion_the_abbreviations() -> None:
    import markdown

    settings: dict[str, Any] = {"docs_dir": str(DOCS), "mdx_configs": {}}
    abbreviations_hook.on_config(settings)
    md = markdown.Markdown(
        extensions=["abbr", "pymdownx.arithmatex"],
        extension_configs={**settings["mdx_configs"], "pymdownx.arithmatex": {"generic": True}},
    )
    for _ in range(2):  # a second page starts from the glossary again
        html = md.reset().convert("A GQA layer, `GQA` and $GQA$.\n\n*[KV]: local")
        assert html.count("<abbr") == 1
        assert '<abbr title="grouped-query attention: ' in html
        assert "<code>GQA</code>" in html
        assert '<span class="arithmatex">\\(GQA\\)</span>' in html


def test_glossary_links_point_at_headings_that_exist(nav: list[Any]) -> None:
    assert "glossary.md" in _nav_pages(nav)
    text = GLOSSARY.read_text("utf-8")
    links = re.findall(r"\]\(((?:article|beyond|modern)/[^)#]+\.md)(?:#([^)]+))?\)", text)
    assert len(links) >= 40
    for page, anchor in links:
        assert (DOCS / page).is_file(), page
        if anchor:
            assert anchor in [site_map.slug(h) for h in site_map.headings(page)], (page, anchor)
    # The terms the chapters use before defining them are all there.
    terms = " ".join(_glossary_terms()).lower()
    for term in (
        "perplexity",
        "prefill",
        "decode",
        "log-sum-exp",
        "sddmm",
        "wy and ut transform",
        "block table",
        "chunked prefill",
        "preemption",
        "kv cache",
        "gqa, mqa",
        "mla",
        "rope",
    ):
        assert term in terms, term


def test_headings_lose_their_abbreviation_marks_and_text_keeps_them() -> None:
    html = (
        '<h1 id="t">The <abbr title="keys and values">KV</abbr> cache</h1>'
        '<p>A <abbr title="keys and values">KV</abbr> cache.</p>'
        '<h2 id="s">Bytes, <abbr title="operations">FLOPs</abbr></h2>'
    )
    assert abbreviations_hook.unmark_headings(html) == (
        '<h1 id="t">The KV cache</h1><p>A <abbr title="keys and values">KV</abbr> cache.</p>'
        '<h2 id="s">Bytes, FLOPs</h2>'
    )


SYMBOLS = {  # anchor on the glossary -> the chapter that links it at its first use
    "ds": "beyond/flash-attention.md",
    "d-i": "beyond/flash-attention.md",
    "mamba-a": "modern/linear-attention.md",
    "mamba-delta": "modern/linear-attention.md",
}


@pytest.mark.parametrize(("anchor", "chapter"), SYMBOLS.items())
def test_symbols_are_defined_and_linked_at_first_use(anchor: str, chapter: str) -> None:
    glossary = GLOSSARY.read_text("utf-8")
    entry = re.search(rf"^(\$.+?\$).*\{{ #{anchor} \}}$", glossary, flags=re.M)
    assert entry is not None, anchor
    symbol = entry[1]  # e.g. "$D_i$"
    text = (DOCS / chapter).read_text("utf-8")
    link = f"[{symbol}](../glossary.md#{anchor})"
    assert link in text, link
    # No inline use of the symbol in the chapter's prose comes before its link.
    assert text.find(symbol) >= text.find(link) + 1, symbol


# --- the notebooks ---------------------------------------------------------------------


def test_the_nav_lists_chapters_and_one_page_of_notebooks(
    nav: list[Any], config: dict[str, Any]
) -> None:
    pages = _nav_pages(nav)
    assert [p for p in pages if p.endswith(".ipynb")] == []
    assert "notebooks.md" in pages
    assert "/notebooks/*.ipynb" in config["not_in_nav"]
    # The left column: 12 article pages, 7 beyond, 13 modern, and no notebook twins.
    assert len(pages) < 60


def test_the_notebook_page_lists_every_notebook_with_its_chapter(nav: list[Any]) -> None:
    # The build hands it notebook.chapters(), the list the notebooks are made from
    # (tests/test_site.py checks the built page against the built notebooks); here, a few.
    chapters = ["article/02-embedding.md", "beyond/masks.md", "beyond/production.md"]
    chapters.append("modern/rope.md")
    listed = notebook.notebook_list(chapters[::-1], "notebooks/", nav)
    rows = [line for line in listed.splitlines() if line.startswith("| [")]
    # In the nav's order (production comes before masks there), not the order given.
    chapters[1:3] = ["beyond/production.md", "beyond/masks.md"]
    assert len(rows) == len(chapters)
    for chapter, row in zip(chapters, rows, strict=True):
        name = notebook.notebook_name(chapter)
        assert f"]({chapter})" in row
        assert f"](notebooks/{name}.ipynb)" in row
        assert f'<a href="{name}/{name}.ipynb" download>' in row
    assert "[Embedding an input sentence](article/02-embedding.md)" in rows[0]
    # One table per part of the site, titled as the nav titles it.
    headings = re.findall(r"^## (.+)$", listed, flags=re.M)
    assert headings == ["The article", "Beyond the article", "Attention in modern LLMs"]
    page = (DOCS / notebook.INDEX_PAGE).read_text("utf-8")
    assert page.count(notebook.INDEX_MARKER) == 1
