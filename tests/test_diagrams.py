"""The hand-drawn diagrams: valid SVG, self-contained, described, used, and readable.

How big their text is on a phone's screen is measured in a browser
(tests/test_browser.py); here, that a drawing shown at its own size has no text below
11 px, which is what the stylesheet does on a phone.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs/assets/images"
NS = {"svg": "http://www.w3.org/2000/svg"}

# diagram -> the chapters that show it
DIAGRAMS = {
    "qkv-projections.svg": ["03-weight-matrices.md"],
    "attention-pipeline.svg": ["04-unnormalized-attention-weights.md", "06-context-vector.md"],
    "multihead-split-concat.svg": ["08-multi-head-attention.md"],
    "causal-mask.svg": ["09-causal-self-attention.md"],
    "cross-attention.svg": ["10-cross-attention.md"],
}


ALL = sorted(path.name for path in IMAGES.glob("*.svg"))


@pytest.mark.parametrize("name", ALL)
def test_diagram_is_self_contained_svg_on_a_white_card(name: str) -> None:
    text = (IMAGES / name).read_text(encoding="utf-8")
    root = ET.fromstring(text)  # well-formed XML
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.get("role") == "img"
    title, desc = root.find("svg:title", NS), root.find("svg:desc", NS)
    assert title is not None
    assert title.text
    assert desc is not None
    assert desc.text
    assert len(desc.text) > 80
    # Nothing from another host, and no web fonts: the site stays offline-clean.
    assert not re.search(r"(?:href|src)=\"(?:https?:)?//", text)
    assert "@import" not in text
    assert "@font-face" not in text
    # The first shape is an opaque white card behind everything: the dark scheme shows
    # the diagram as drawn instead of dark text on a dark page.
    card = root.find("svg:rect", NS)
    assert card is not None
    assert card.get("fill") == "#ffffff"
    width, height = float(root.get("width", 0)), float(root.get("height", 0))
    assert float(card.get("width", 0)) >= width - 1
    assert float(card.get("height", 0)) >= height - 1


@pytest.mark.parametrize(("name", "chapter"), [(n, c) for n, cs in DIAGRAMS.items() for c in cs])
def test_diagram_is_shown_with_alt_text(name: str, chapter: str) -> None:
    page = (ROOT / "docs/article" / chapter).read_text(encoding="utf-8")
    images = re.findall(r"!\[([^\]]*)\]\(\.\./assets/images/" + re.escape(name) + r"\)", page)
    assert len(images) == 1
    assert len(images[0]) > 80, "the alt text should describe the diagram"


SMALLEST_TEXT_PX = 11.0


def _font_sizes(element: ET.Element, inherited: float) -> list[tuple[float, str]]:
    """(font size in viewBox units, text) for every text and tspan that shows text."""
    value = (element.get("font-size") or "").strip()
    size = (
        inherited * float(value[:-1]) / 100
        if value.endswith("%")
        else inherited * float(value[:-2])
        if value.endswith("em")
        else float(value.removesuffix("px"))
        if value
        else inherited
    )
    found = []
    own = (element.text or "").strip()
    if element.tag.rsplit("}", 1)[-1] in ("text", "tspan") and own:
        found.append((size, own))
    for child in element:
        found += _font_sizes(child, size)
    return found


@pytest.mark.parametrize("name", ALL)
def test_diagram_text_is_at_least_11px_at_its_own_size(name: str) -> None:
    root = ET.parse(IMAGES / name).getroot()
    # Shown at its own size, one viewBox unit is one CSS pixel.
    view = [float(v) for v in (root.get("viewBox") or "").split()]
    assert float(root.get("width", 0)) == view[2]
    assert float(root.get("height", 0)) == view[3]
    sizes = _font_sizes(root, 16.0)
    assert sizes, "a diagram without text?"
    small = [(size, text) for size, text in sizes if size < SMALLEST_TEXT_PX]
    assert not small, f"text below {SMALLEST_TEXT_PX} px: {small[:5]}"


@pytest.mark.parametrize("name", [n for n in ALL if n.endswith("-narrow.svg")])
def test_narrow_redraw_fits_a_phone_column_and_replaces_its_diagram(name: str) -> None:
    # The stylesheet swaps it in on phones, whose column is 358 px at 390 px.
    root = ET.parse(IMAGES / name).getroot()
    assert float(root.get("width", 0)) <= 350
    assert (IMAGES / name.replace("-narrow", "")).exists()
    css = (ROOT / "docs/assets/stylesheets/extra.css").read_text(encoding="utf-8")
    assert f'url("../images/{name}")' in css
