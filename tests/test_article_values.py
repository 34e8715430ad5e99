"""The chapters show the article's own numbers, not just numbers their code prints.

docs/hooks/outputs.py checks that each output shown on a page is what its code prints.
This file checks the other side: every `Out:` block of the article (tests/data/
article_outputs.json) is shown, as the output of a code block, on the page the JSON names.
A changed seed therefore fails one way or the other: the stale outputs fail the checker,
regenerated outputs fail here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from hooks import outputs

from attnlab import SelfAttention
from attnlab.article.toy import embed_sentence

ROOT = Path(__file__).resolve().parent.parent
ARTICLE = json.loads((ROOT / "tests/data/article_outputs.json").read_text(encoding="utf-8"))
TOLERANCE = 1e-4 + 1e-9  # one unit in the article's 4th decimal (rounding ties differ)


def shown_outputs(page: str) -> list[str]:
    """The output fences of `page` that sit under a runnable code block."""
    blocks = outputs.parse_blocks((ROOT / page).read_text(encoding="utf-8"))
    return [b.output for b in blocks if b.output is not None]


def _split(text: str) -> tuple[list[str], list[float]]:
    flat = " ".join(text.split())
    words = [" ".join(part.split()) for part in outputs.NUMBER.split(flat)]
    return words, [float(n) for n in outputs.NUMBER.findall(flat)]


def same_output(shown: str, article: str) -> bool:
    """Same text up to whitespace, same count of numbers, each within TOLERANCE."""
    shown_words, shown_numbers = _split(shown)
    article_words, article_numbers = _split(article)
    if shown_words != article_words or len(shown_numbers) != len(article_numbers):
        return False
    return all(abs(a - b) <= TOLERANCE for a, b in zip(shown_numbers, article_numbers, strict=True))


@pytest.mark.parametrize("item", ARTICLE["outputs"], ids=lambda item: item["id"])
def test_article_output_shown_on_its_page(item: dict[str, str]) -> None:
    page = item["page"]
    assert (ROOT / page).is_file(), f"{page} (article output {item['id']!r}) does not exist"
    shown = shown_outputs(page)
    assert any(same_output(s, item["text"]) for s in shown), (
        f"{page}: no output fence shows the article's output {item['id']!r}:\n{item['text']}"
    )


def test_article_outputs_cover_every_chapter_with_code() -> None:
    pages = {item["page"] for item in ARTICLE["outputs"]}
    for number in range(2, 10):
        (chapter,) = (ROOT / "docs/article").glob(f"{number:02d}-*.md")
        assert str(chapter.relative_to(ROOT)) in pages


def _tensor_rows(text: str) -> list[list[float]] | None:
    """The rows of the first 2-d tensor printed in `text`, or None if there is none."""
    match = re.search(r"tensor\(\[\[(.*?)\]\]", text, flags=re.S)
    if match is None:
        return None
    return [
        [float(n) for n in outputs.NUMBER.findall(row)]
        for row in re.split(r"\]\s*,\s*\[", match.group(1))
    ]


def test_cross_attention_page_shows_six_by_four_output() -> None:
    page = "docs/article/10-cross-attention.md"
    found = [
        text
        for text in shown_outputs(page)
        if (rows := _tensor_rows(text)) is not None
        and len(rows) == 6
        and all(len(row) == 4 for row in rows)
        and "torch.Size([6, 4])" in text
    ]
    assert found, f"{page}: no output shows a 6x4 tensor with its shape torch.Size([6, 4])"


def test_same_output_tolerates_the_rounding_tie_only() -> None:
    article = "tensor([-0.2627,  0.5313], grad_fn=<MmBackward0>)"
    assert same_output("tensor([-0.2626, 0.5313], grad_fn=<MmBackward0>)", article)
    assert not same_output("tensor([-0.2625, 0.5313], grad_fn=<MmBackward0>)", article)
    assert not same_output("tensor([-0.2627, 0.5313])", article)  # text differs
    assert not same_output("tensor([-0.2627, 0.5313, 1.0], grad_fn=<MmBackward0>)", article)


def test_hand_drawn_diagram_shows_the_packages_weights() -> None:
    """The chapter 01 SVG is drawn by hand; its printed weights must still be the real ones."""
    svg = (ROOT / "docs/assets/images/self-attention-one-token.svg").read_text("utf-8")
    shown = [float(v) for v in re.findall(r">(\d\.\d\d)</text>", svg)]
    torch.manual_seed(123)
    weights = SelfAttention(3, 2, 4).attention_weights(embed_sentence())[1]
    assert shown == [round(w, 2) for w in weights.tolist()]
