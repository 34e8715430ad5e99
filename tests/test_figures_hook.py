"""docs/hooks/figures.py: no paragraph opens on a figure, table or heatmap."""

from __future__ import annotations

from hooks.figures import unwrap_block_paragraphs  # docs/hooks, via pythonpath


def test_tab_figure_loses_its_paragraph() -> None:
    html = '<div class="tabbed-block">\n<p><figure><svg></svg></figure></p>\n</div>'
    assert unwrap_block_paragraphs(html) == (
        '<div class="tabbed-block">\n<figure><svg></svg></figure>\n</div>'
    )


def test_nested_elements_of_the_same_tag_are_kept_whole() -> None:
    html = '<p><div class="heatmap"><div>a</div><p>note</p><div>b</div></div></p><p>x</p>'
    assert unwrap_block_paragraphs(html) == (
        '<div class="heatmap"><div>a</div><p>note</p><div>b</div></div><p>x</p>'
    )


def test_inline_content_after_the_block_keeps_a_paragraph() -> None:
    html = "<p><table><tr><td>1</td></tr></table>\n<img src='a.svg' /></p>"
    assert unwrap_block_paragraphs(html) == (
        "<table><tr><td>1</td></tr></table><p>\n<img src='a.svg' /></p>"
    )


def test_ordinary_paragraphs_and_unclosed_blocks_are_untouched() -> None:
    for html in ("<p>text <code>div</code></p>", "<p><div>never closed</p>"):
        assert unwrap_block_paragraphs(html) == html
