"""The benchmark plots: readable on a phone, in both colour schemes, all of them shown.

The committed SVGs under docs/assets/bench/ are checked as a reader gets them: the text
size a 390 px wide phone column renders (an image is shrunk to fit the column and never
enlarged past its natural size), the contrast of every label against the figure's card,
and that every plot is on a page and every suite's plot exists.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from attnlab.tools.bench import write_plots
from attnlab.tools.bench.plots import CARD, MEMORY_PLOTS, log_ticks

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs/assets/bench"
SVGS = sorted(BENCH.glob("*.svg"))
NS = "{http://www.w3.org/2000/svg}"
PHONE_COLUMN_PX = 390
MIN_TEXT_PX = 11.0


def _luminance(colour: str) -> float:
    """WCAG 2 relative luminance of `#rrggbb`."""
    channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two colours."""
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_contrast_matches_known_values() -> None:
    assert contrast("#000000", "#ffffff") == pytest.approx(21.0)
    assert contrast("#8a8a8a", "#ffffff") == pytest.approx(3.45, abs=0.01)
    assert contrast("#767676", "#ffffff") == pytest.approx(4.54, abs=0.01)


def _style(element: ET.Element, key: str) -> str | None:
    match = re.search(rf"(?:^|;)\s*{key}:\s*([^;]+)", element.get("style", ""))
    return match.group(1).strip() if match else None


def _texts(root: ET.Element) -> list[ET.Element]:
    return [t for t in root.iter(f"{NS}text") if "".join(t.itertext()).strip()]


def test_every_plot_is_committed_and_shown() -> None:
    pages = "".join(p.read_text("utf-8") for p in (ROOT / "docs").rglob("*.md"))
    shown = set(re.findall(r"assets/bench/([\w-]+\.svg)\)", pages))
    expected: set[str] = set()
    for path in sorted(BENCH.glob("*.json")):  # every committed run of the harness
        data = json.loads(path.read_text("utf-8"))
        for suite in data.get("suites", {}):
            expected.add(f"{suite}_time.svg")
            if suite in MEMORY_PLOTS:
                expected.add(f"{suite}_memory.svg")
        expected.update(data.get("figures", []))  # a record with figures of its own
    assert {p.name for p in SVGS} == expected  # no plot missing, none left over
    assert shown == expected  # and every one is on a page


@pytest.mark.parametrize("path", SVGS, ids=[p.name for p in SVGS])
def test_plot_text_is_at_least_11_px_on_a_phone(path: Path) -> None:
    root = ET.fromstring(path.read_text("utf-8"))
    width_pt = float(root.get("width", "").removesuffix("pt"))
    viewbox_width = float(root.get("viewBox", "").split()[2])
    rendered_px = min(PHONE_COLUMN_PX, width_pt * 4 / 3)  # shrunk to fit, never enlarged
    texts = _texts(root)
    assert len(texts) > 10
    for text in texts:
        size = _style(text, "font-size")
        assert size is not None
        assert size.endswith("px")
        effective = float(size.removesuffix("px")) * rendered_px / viewbox_width
        label = "".join(text.itertext())
        assert effective >= MIN_TEXT_PX, f"{label!r} is {effective:.1f} px at 390 px"


@pytest.mark.parametrize("path", SVGS, ids=[p.name for p in SVGS])
def test_plot_text_contrasts_with_its_card(path: Path) -> None:
    root = ET.fromstring(path.read_text("utf-8"))
    # The first shape is the opaque card, as large as the figure.
    first = next(root.iter(f"{NS}path"))
    assert _style(first, "fill") == CARD
    assert contrast(CARD, "#ffffff") == 1.0  # the same card in either colour scheme
    for text in _texts(root):
        fill = _style(text, "fill") or "#000000"
        assert contrast(fill, CARD) >= 4.5, "".join(text.itertext())


# Figures of bars, one per measured ratio, with no implementations to tell apart.
BAR_CHARTS = {"serving_ratios.svg"}
LINE_PLOTS = [p for p in SVGS if p.name not in BAR_CHARTS]


@pytest.mark.parametrize("path", LINE_PLOTS, ids=[p.name for p in LINE_PLOTS])
def test_plot_lines_have_one_colour_per_implementation(path: Path) -> None:
    root = ET.fromstring(path.read_text("utf-8"))
    legend = next((g for g in root.iter(f"{NS}g") if g.get("id") == "legend_1"), None)
    assert legend is not None, f"{path.name} has no legend"
    names = ["".join(t.itertext()) for t in _texts(legend)]
    strokes = []
    for g in legend.iter(f"{NS}g"):
        for line in g.findall(f"{NS}path"):
            stroke = _style(line, "stroke")
            if stroke and "fill: none" in line.get("style", ""):
                strokes.append(stroke)
                break
    assert len(names) >= 2
    colours = list(dict.fromkeys(strokes))
    assert len(colours) == len(names), (names, strokes)


def test_plot_titles_name_suite_and_mode_once(tmp_path: Path) -> None:
    data = json.loads((BENCH / "modern.json").read_text("utf-8"))
    write_plots(data, tmp_path)
    titles = {
        "".join(t.itertext())
        for p in tmp_path.glob("*.svg")
        for t in _texts(ET.fromstring(p.read_text("utf-8")))
        if _style(t, "font-size") == "12px"
    }
    assert titles == {"window vs full causal, forward", "decoding, per generated token"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decode_time.svg", "window_time.svg"]


@pytest.mark.parametrize(
    ("low", "high"), [(0.0016, 1.8), (0.19, 3.3), (0.0044, 2.5), (2.1, 8500.0), (0.04, 0.09)]
)
def test_log_ticks_put_a_label_below_and_above_every_value(low: float, high: float) -> None:
    ticks = log_ticks(low, high)
    assert ticks == sorted(ticks)
    assert len(ticks) >= 3
    assert ticks[0] <= low
    assert ticks[-1] >= high
    assert ticks[1] > low  # no useless tick below the one under the data
    assert ticks[-2] < high
