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
