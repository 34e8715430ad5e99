"""The search index's formulas become readable text (docs/hooks/search_tex.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hooks import search_tex


@pytest.mark.parametrize(
    ("tex", "text"),
    [
        (r"i", "i"),
        (r"1/\sqrt{d_k}", "1/√d_k"),
        (r"\alpha_{ij}", "α_ij"),
        (r"\omega_{ij} = q^{(i)} \cdot k^{(j)}", "ω_ij = q^(i) · k^(j)"),
        (r"\operatorname{softmax}\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V",
         "softmax((Q Kᵀ)/√d_k) V"),
        (r"\frac{1}{\sqrt{d}}", "1/√d"),
        (r"-\infty", "-∞"),
        (r"x \in \mathbb{R}^{T \times d}", "x ∈ ℝ^T × d"),
    ],
)  # fmt: skip
def test_tex_to_text(tex: str, text: str) -> None:
    assert search_tex.tex_to_text(tex) == text


def test_strip_math_keeps_the_prose_around_formulas() -> None:
    got = search_tex.strip_math(r"weight \(\alpha_{ij}\) of query \(i\): \[ z = \sum_j v_j \]")
    assert got == "weight α_ij of query i: z = Σ_j v_j"


def test_rewrite_index_changes_only_text_with_math(tmp_path: Path) -> None:
    path = tmp_path / "search_index.json"
    docs = [
        {"location": "a/", "title": r"Scale by \(\sqrt{d_k}\)", "text": r"<p>\(i\) and i</p>"},
        {"location": "b/", "title": "Plain", "text": "<p>no math</p>"},
    ]
    path.write_text(json.dumps({"config": {"lang": ["en"]}, "docs": docs}), "utf-8")
    assert search_tex.rewrite_index(path) == 2
    got = json.loads(path.read_text("utf-8"))
    assert got["config"] == {"lang": ["en"]}
    assert got["docs"][0] == {"location": "a/", "title": "Scale by √d_k", "text": "<p>i and i</p>"}
    assert got["docs"][1] == docs[1]


def test_entities_in_formulas_survive() -> None:
    # The index holds HTML: "\(j > i\)" is stored as "\(j &gt; i\)"; "&" aligns in TeX.
    assert search_tex.strip_math(r"<p>when \(j &gt; i\) or \(a &lt; b\)</p>") == (
        "<p>when j &gt; i or a &lt; b</p>"
    )
    assert search_tex.strip_math(r"\[\begin{aligned} x &amp;= 1 \end{aligned}\]") == "x = 1"
    assert search_tex.strip_math(r"\(e^{89} &gt; 3.4 \times 10^{38}\)") == "e^89 &gt; 3.4 × 10^38"


def test_figures_are_kept_out_of_the_index() -> None:
    page = (
        '<p>text</p><div class="attn-figure"><svg xmlns="http://www.w3.org/2000/svg">'
        "<metadata>Matplotlib v3</metadata><text>0 1 2</text></svg></div>"
        '<div class="attn-heatmap-select" role="group"><button>head 0</button></div>'
        '<svg class="icon"></svg><svgx>'
    )
    got = search_tex.exclude_figures(page)
    assert got.count("data-search-exclude") == 3
    assert '<svg data-search-exclude xmlns="http://www.w3.org/2000/svg">' in got
    assert '<div class="attn-heatmap-select" data-search-exclude role="group">' in got
    assert "<svgx>" in got


class _Page:
    def __init__(self, src_uri: str, meta: dict[str, object]) -> None:
        self.file = type("File", (), {"src_uri": src_uri})()
        self.meta = meta


@pytest.mark.parametrize(
    ("src_uri", "meta", "search"),
    [
        ("modern/rope.md", {}, {"boost": search_tex.CHAPTER_BOOST}),
        ("article/05-attention-weights.md", {}, {"boost": search_tex.CHAPTER_BOOST}),
        ("beyond/ring-attention.md", {"search": {"boost": 2}}, {"boost": 2}),  # its own
        ("beyond/x.md", {"search": {"exclude": True}}, {"exclude": True}),
        ("reference/rules.md", {}, None),
        ("index.md", {}, None),
    ],
)
def test_chapters_are_boosted(src_uri: str, meta: dict[str, object], search: object) -> None:
    page = _Page(src_uri, meta)
    search_tex.on_page_content("<p>x</p>", page, None, None)
    assert page.meta.get("search") == search
