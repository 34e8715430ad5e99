"""The heatmaps and diagrams in a real browser: headless Chromium reads what a reader sees.

A page with a heatmap from `attnlab.tools.plotting.interactive_heatmap`, the site's script
(`docs/assets/javascripts/attention-heatmap.js`) and a small driver script is opened from
a file with `chromium --headless --dump-dom`. The driver finds a cell by its position on
screen (`document.elementFromPoint`, so the cell must be the topmost thing there), sends
the mouse and key events a reader would send, clicks a head's button, and writes what the
page shows into the DOM, which the test reads back and compares with the weights.

A small site built with the real theme and the site's stylesheet is opened the way an
offline copy is, from `file://`, at a phone's width: its heatmap must work there, and every
diagram of `docs/assets/images` must show its smallest text at 11 px or more.

Skipped when no Chromium is installed; install it with `apt-get install -y chromium`.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch

from _browser import BROWSER, MISSING, headless  # tests/_browser.py, via pythonpath
from attnlab.models.tiny import TinyTransformer, repeated_tokens
from attnlab.tools.plotting import _predictions_html, interactive_heatmap, live_model_widget
from attnlab.tools.train import load_run

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "assets" / "javascripts" / "attention-heatmap.js"
STYLESHEET = ROOT / "docs" / "assets" / "stylesheets" / "extra.css"
KATEX_INIT = ROOT / "docs" / "assets" / "javascripts" / "katex-init.js"
KATEX = ROOT / "docs" / "assets" / "katex"
IMAGES = ROOT / "docs" / "assets" / "images"
LIVE_SCRIPT = ROOT / "docs" / "assets" / "javascripts" / "live-model.js"
LIVE_HOOK = ROOT / "docs" / "hooks" / "live_model.py"
MODEL_RUN = ROOT / "docs" / "assets" / "model"
SITE = "site"  # the small site's folder, and its path on the test server

pytestmark = pytest.mark.skipif(BROWSER is None, reason=MISSING)

# Runs after the page's load event, so after the heatmap script has revealed its controls.
DRIVER = """
window.addEventListener("load", function () {
  function visible(el) { return !!el && el.getClientRects().length > 0; }
  function hover(panel, q, k) {
    var cell = document.querySelector(
      '.attn-heatmap-panel[data-panel="' + panel + '"] .attn-heatmap-cell[data-q="' + q +
      '"][data-k="' + k + '"] rect');
    var box = cell.getBoundingClientRect();
    var x = box.left + box.width / 2, y = box.top + box.height / 2;
    var hit = document.elementFromPoint(x, y);
    ["pointerover", "mouseover", "pointermove", "mousemove"].forEach(function (type) {
      hit.dispatchEvent(new MouseEvent(type, {bubbles: true, clientX: x, clientY: y}));
    });
    var readout = document.querySelector(".attn-heatmap-readout");
    return {hit: hit === cell, readout: readout.textContent};
  }
  var result = {};
  var select = document.querySelector(".attn-heatmap-select");
  result.selectVisible = visible(select);
  result.readoutVisible = visible(document.querySelector(".attn-heatmap-readout"));
  result.buttons = Array.from(select.querySelectorAll("button")).map(function (b) {
    return b.textContent;
  });
  result.visibleBefore = Array.from(document.querySelectorAll(".attn-heatmap-panel"))
    .map(visible);
  result.hoverFirst = hover(0, 1, 2);
  select.querySelectorAll("button")[2].click();
  result.visibleAfter = Array.from(document.querySelectorAll(".attn-heatmap-panel"))
    .map(visible);
  result.pressed = Array.from(select.querySelectorAll("button")).map(function (b) {
    return b.getAttribute("aria-pressed");
  });
  result.hoverThird = hover(2, 3, 0);
  var out = document.createElement("pre");
  out.id = "result";
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
"""

ROWS = ["The", "cat", "sat", "down"]
COLS = ["k1", "k2", "k3", "k4", "k5"]


def _page(tmp_path: Path, snippet: str) -> Path:
    shutil.copy(SCRIPT, tmp_path / "attention-heatmap.js")
    page = tmp_path / "page.html"
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>heatmap</title></head>"
        f"<body>{snippet}<script src='attention-heatmap.js'></script>"
        f"<script>{DRIVER}</script></body></html>",
        encoding="utf-8",
    )
    return page


def _dump_dom(page: Path, tmp_path: Path) -> str:
    command = headless(
        tmp_path / "profile",
        "--window-size=1280,1000",
        "--virtual-time-budget=3000",
        "--dump-dom",
        page.as_uri(),
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_browser_hover_reads_out_and_buttons_switch_heads(tmp_path: Path) -> None:
    torch.manual_seed(7)
    weights = torch.softmax(torch.randn(3, 4, 5), dim=-1)  # (heads, t_q, t_k)
    page = _page(tmp_path, interactive_heatmap(weights, ROWS, COLS, title="three heads"))

    dom = _dump_dom(page, tmp_path)
    found = re.search(r'<pre id="result">(.*?)</pre>', dom, re.S)
    assert found, "the driver script did not run: " + dom[-1000:]
    result = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))

    # The script revealed the controls; only the first head shows until a button is pressed.
    assert result["selectVisible"]
    assert result["readoutVisible"]
    assert result["buttons"] == ["head 1", "head 2", "head 3"]
    assert result["visibleBefore"] == [True, False, False]
    # Hovering cell (query 1, key 2) of head 1 names both tokens and the weight it holds.
    assert result["hoverFirst"]["hit"], "the cell is not the topmost element at its centre"
    expected = f"head 1, query 1 (cat) → key 2 (k3): weight {weights[0, 1, 2].item():.4f}"
    assert result["hoverFirst"]["readout"] == expected
    # The third button shows head 3 alone, pressed; its cells read out head 3's weights.
    assert result["visibleAfter"] == [False, False, True]
    assert result["pressed"] == ["false", "false", "true"]
    assert result["hoverThird"]["hit"]
    expected = f"head 3, query 3 (down) → key 0 (k1): weight {weights[2, 3, 0].item():.4f}"
    assert result["hoverThird"]["readout"] == expected


# Material's instant navigation swaps the page's content without loading the scripts
# again, then emits on its `document$` observable. A stand-in observable lets the test do
# the same: the first page's figure is replaced by another, and the emission must reveal
# its controls, with the delegated listeners (added once) serving its cells.
INSTANT = """
<script>
var subscribers = [];
window.document$ = {subscribe: function (fn) { subscribers.push(fn); fn(document); }};
</script>
"""

NAVIGATE = """
window.addEventListener("load", function () {
  var result = {subscribers: subscribers.length};
  document.getElementById("page").innerHTML = document.getElementById("next").textContent;
  result.readyBefore = !!document.querySelector("#page [data-attn-heatmap][data-attn-ready]");
  subscribers.forEach(function (fn) { fn(document); });  // what Material does after a swap
  var fig = document.querySelector("#page [data-attn-heatmap]");
  result.readyAfter = fig.hasAttribute("data-attn-ready");
  fig.querySelectorAll(".attn-heatmap-select button")[1].click();
  var cell = fig.querySelector(
    '.attn-heatmap-panel[data-panel="1"] .attn-heatmap-cell[data-q="0"][data-k="1"]');
  cell.dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));
  result.readout = fig.querySelector(".attn-heatmap-readout").textContent;
  result.styles = document.querySelectorAll("#attn-heatmap-style").length;
  var out = document.createElement("pre");
  out.id = "result";
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
"""


def test_browser_new_page_after_instant_navigation_is_interactive(tmp_path: Path) -> None:
    first = interactive_heatmap(torch.eye(2), ["a", "b"], ["a", "b"])
    weights = torch.tensor([[[0.5, 0.5], [0.2, 0.8]], [[0.1, 0.9], [0.3, 0.7]]])
    second = interactive_heatmap(weights, ["x", "y"], ["u", "v"])
    shutil.copy(SCRIPT, tmp_path / "attention-heatmap.js")
    page = tmp_path / "page.html"
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>nav</title></head><body>"
        f"{INSTANT}<div id='page'>{first}</div>"
        f"<script type='text/plain' id='next'>{second}</script>"
        f"<script src='attention-heatmap.js'></script><script>{NAVIGATE}</script>"
        "</body></html>",
        encoding="utf-8",
    )
    found = re.search(r'<pre id="result">(.*?)</pre>', _dump_dom(page, tmp_path), re.S)
    assert found, "the driver script did not run"
    result = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert result["subscribers"] == 1  # the script subscribed to document$
    assert result["readyBefore"] is False  # the swapped-in figure is not revealed yet...
    assert result["readyAfter"] is True  # ...until document$ emits
    assert result["readout"] == "head 2, query 0 (x) → key 1 (v): weight 0.9000"
    assert result["styles"] == 1  # its stylesheet is added once, not per page


def _result(dom: str) -> dict[str, object]:
    found = re.search(r'<pre id="result">(.*?)</pre>', dom, re.S)
    assert found, "the driver script did not run: " + dom[-1000:]
    text = found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
    loaded: dict[str, object] = json.loads(text.replace("&amp;", "&"))
    return loaded


# Tab reaches one cell per panel; the arrow keys, Home and End move from cell to cell. The
# outline of the active cell must be the topmost thing over it, and must let the pointer
# through to the cell; the turned axis name must keep clear of the row labels.
KEYBOARD = """
window.addEventListener("load", function () {
  function key(name) {
    document.activeElement.dispatchEvent(
      new KeyboardEvent("keydown", {key: name, bubbles: true, cancelable: true}));
    var cell = document.activeElement;
    return [cell.getAttribute("data-q"), cell.getAttribute("data-k")].join(",");
  }
  var fig = document.querySelector("[data-attn-heatmap]");
  var panel = fig.querySelector('.attn-heatmap-panel[data-panel="0"]');
  var result = {};
  result.tabbable = Array.from(fig.querySelectorAll(".attn-heatmap-panel")).map(function (p) {
    return p.querySelectorAll('.attn-heatmap-cell[tabindex="0"]').length;
  });
  result.focusable = panel.querySelectorAll('.attn-heatmap-cell[tabindex="-1"]').length;
  panel.querySelector('.attn-heatmap-cell[tabindex="0"]').focus();
  result.moves = [key("ArrowRight"), key("ArrowDown"), key("ArrowDown"), key("End"),
                  key("ArrowRight"), key("Home"), key("ArrowUp"), key("ArrowUp")];
  result.readout = fig.querySelector(".attn-heatmap-readout").textContent;
  result.tabindex = document.activeElement.getAttribute("tabindex");
  var outline = panel.querySelector(".attn-heatmap-outline");
  var rect = document.activeElement.querySelector("rect");
  result.outlineVisible = outline.getAttribute("visibility");
  result.outlineLast = outline === outline.parentNode.lastElementChild;
  var o = outline.getBoundingClientRect(), c = rect.getBoundingClientRect();
  result.outlineInside = o.left > c.left && o.right < c.right && o.top > c.top &&
    o.bottom < c.bottom;
  var hit = document.elementFromPoint(o.left + 1.5, o.top + o.height / 2);
  result.pointerReachesCell = hit === rect;
  var title = panel.querySelector("svg > text:nth-of-type(2)").getBoundingClientRect();
  var rows = Array.from(panel.querySelectorAll(".attn-heatmap-row")).map(function (r) {
    return r.getBoundingClientRect().left;
  });
  result.titleGap = Math.min.apply(null, rows) - title.right;
  var out = document.createElement("pre");
  out.id = "result";
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
"""


def test_browser_keyboard_moves_between_cells_and_reads_positions(tmp_path: Path) -> None:
    torch.manual_seed(3)
    weights = torch.softmax(torch.randn(2, 4, 5), dim=-1)
    rows = ["the", "WWWWWWWW", "the", "mm"]  # a repeated token and wide labels
    snippet = interactive_heatmap(weights, rows, COLS, cell_size=30)
    page = _page(tmp_path, snippet).read_text(encoding="utf-8")
    page = page.replace(DRIVER, KEYBOARD)
    (tmp_path / "page.html").write_text(page, encoding="utf-8")
    result = _result(_dump_dom(tmp_path / "page.html", tmp_path))
    assert result["tabbable"] == [1, 1]  # one Tab stop per panel, not one per cell
    assert result["focusable"] == 4 * 5 - 1
    # Right, down, down, End (row end), right (at the edge: stays), Home, up, up.
    assert result["moves"] == ["0,1", "1,1", "2,1", "2,4", "2,4", "2,0", "1,0", "0,0"]
    assert result["tabindex"] == "0"  # the focused cell is the panel's Tab stop now
    # The read-out tells the two "the" apart by position.
    assert result["readout"] == f"head 1, query 0 (the) → key 0 (k1): weight {weights[0, 0, 0]:.4f}"
    assert result["outlineVisible"] == "visible"
    assert result["outlineLast"] is True
    assert result["outlineInside"] is True
    assert result["pointerReachesCell"] is True
    assert isinstance(result["titleGap"], float | int)
    assert result["titleGap"] >= 4, "the turned 'query' title touches the row labels"


def _min_font_px(svg: Path) -> tuple[float, float]:
    """Smallest font size of any text in `svg` (viewBox units) and the viewBox width.

    The sizes are read by tests/test_diagrams.py's `_font_sizes`, the one reader of them.
    """
    spec = importlib.util.spec_from_file_location(
        "diagram_fonts", ROOT / "tests" / "test_diagrams.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root = ET.parse(svg).getroot()
    smallest = min(size for size, _ in module._font_sizes(root, 16.0))
    return smallest, float((root.get("viewBox") or "").split()[2])


def _figures() -> list[str]:
    """Matplotlib figures as the chapters make them: a heatmap, and a wide line plot."""
    from matplotlib.figure import Figure

    from attnlab.tools.plotting import figure_to_svg, heatmap

    weights = torch.softmax(torch.randn(6, 6, generator=torch.Generator().manual_seed(0)), -1)
    words = ["Life", "is", "short", "eat", "dessert", "first"]
    wide = Figure(figsize=(8, 3.4), layout="constrained")
    wide.add_subplot().plot([0, 1, 2], [1, 0, 2], label="a line")
    wide.axes[0].set_title("a wide figure, as on the GQA page")
    return [figure_to_svg(heatmap(weights, words, words, title="weights")), figure_to_svg(wide)]


@pytest.fixture(scope="module")
def offline_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small site built with the real theme, scripts, stylesheet and hook, as on the site."""
    root = tmp_path_factory.mktemp("offline")
    docs = root / "docs"
    for sub in ("images", "javascripts", "stylesheets"):
        (docs / "assets" / sub).mkdir(parents=True)
    shutil.copy(SCRIPT, docs / "assets" / "javascripts")
    shutil.copy(LIVE_SCRIPT, docs / "assets" / "javascripts")
    shutil.copytree(MODEL_RUN, docs / "assets" / "model")  # the hook writes its weights
    shutil.copy(KATEX_INIT, docs / "assets" / "javascripts")
    shutil.copytree(KATEX, docs / "assets" / "katex")
    shutil.copy(STYLESHEET, docs / "assets" / "stylesheets")
    for path in IMAGES.glob("*.svg"):
        shutil.copy(path, docs / "assets" / "images")
    names = sorted(path.name for path in IMAGES.glob("*.svg") if "-narrow" not in path.stem)
    weights = torch.tensor([[[0.5, 0.5], [0.2, 0.8]], [[0.1, 0.9], [0.3, 0.7]]])
    (docs / "index.md").write_text(
        "# Heatmap\n\n" + interactive_heatmap(weights, ["x", "y"], ["u", "v"]) + "\n",
        encoding="utf-8",
    )
    (docs / "diagrams.md").write_text(
        "# Diagrams\n\n"
        + "".join(f"![{name}](assets/images/{name})\n\n" for name in names)
        + "".join(f'<div class="attn-figure">{svg}</div>\n\n' for svg in _figures()),
        encoding="utf-8",
    )
    (docs / "text.md").write_text(
        "# Grouped-query and multi-query attention\n\nThe scale is $1/\\sqrt{d_k}$.\n\n"
        "```python\nx = 1\n```\n\n"
        '??? success "Solution"\n\n    ```python\n    y = 2\n    ```\n\n'
        '!!! note "Note"\n\n    ```python\n    z = 3\n    ```\n',
        encoding="utf-8",
    )
    model = _model()
    (docs / "live.md").write_text(
        "# Live\n\n" + live_model_widget(model, LIVE_TOKENS, panel_names=LIVE_NAMES) + "\n",
        encoding="utf-8",
    )
    (root / "mkdocs.yml").write_text(
        "site_name: offline\n"
        # Material's instant navigation needs the site's URL: served as test_browser_live_
        # widget_after_real_instant_navigation serves it (from file:// it is not used).
        f"site_url: http://127.0.0.1/{SITE}/\n"
        "use_directory_urls: false\n"
        f"hooks: [{LIVE_HOOK}]\n"
        f"theme:\n  name: material\n  font: false\n  custom_dir: {ROOT / 'docs' / 'overrides'}\n"
        "  features: [navigation.instant]\n"
        "plugins: []\n"
        "markdown_extensions: [admonition, attr_list, md_in_html, pymdownx.details,"
        " pymdownx.superfences, {toc: {permalink: true}}, {pymdownx.arithmatex: {generic: true}}]\n"
        "extra_css: [assets/katex/katex.min.css, assets/stylesheets/extra.css]\n"
        "extra_javascript: [assets/katex/katex.min.js, assets/katex/contrib/auto-render.min.js,"
        " assets/javascripts/katex-init.js, assets/javascripts/attention-heatmap.js,"
        " assets/javascripts/live-model.js]\n"
        "nav: [index.md, diagrams.md, text.md, live.md]\n",
        encoding="utf-8",
    )
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(root / "mkdocs.yml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return root / SITE


def _with_driver(site: Path, page: str, driver: str, width: int | None = None) -> Path:
    """A copy of a built page that runs `driver` after the page's own scripts.

    With `width`, the copy is shown in an iframe that wide (headless Chromium's window is
    at least about 500 px): the driver posts its result to the frame's parent, which
    writes it into its own DOM for `--dump-dom`.
    """
    html = (site / page).read_text(encoding="utf-8")
    copy = site / ("driven-" + page)
    copy.write_text(html.replace("</body>", f"<script>{driver}</script></body>"), "utf-8")
    if width is None:
        return copy
    frame = site / ("frame-" + page)
    frame.write_text(
        "<!doctype html><html><body style='margin:0'>"
        f"<iframe src='{copy.name}' width='{width}' height='900' style='border:0'></iframe>"
        "<script>window.addEventListener('message', function (event) {"
        "var out = document.createElement('pre'); out.id = 'result';"
        "out.textContent = event.data; document.body.appendChild(out); });</script>"
        "</body></html>",
        encoding="utf-8",
    )
    return frame


# Material's instant navigation does not emit `document$` on a page opened from file://;
# the heatmap must work there anyway. The driver waits for the page to settle first.
OFFLINE = """
window.addEventListener("load", function () { setTimeout(function () {
  var fig = document.querySelector("[data-attn-heatmap]");
  var result = {material: typeof document$ !== "undefined",
                ready: fig.hasAttribute("data-attn-ready"),
                selectShown: fig.querySelector(".attn-heatmap-select").getClientRects().length > 0};
  fig.querySelectorAll(".attn-heatmap-select button")[1].click();
  result.shown = Array.from(fig.querySelectorAll(".attn-heatmap-panel")).map(function (p) {
    return p.getClientRects().length > 0;
  });
  var cell = fig.querySelector(
    '.attn-heatmap-panel[data-panel="1"] .attn-heatmap-cell[data-q="1"][data-k="0"]');
  cell.dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));
  result.readout = fig.querySelector(".attn-heatmap-readout").textContent;
  var out = document.createElement("pre");
  out.id = "result";
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
}, 300); });
"""


def test_browser_heatmap_works_in_a_built_page_opened_from_file(
    offline_site: Path, tmp_path: Path
) -> None:
    page = _with_driver(offline_site, "index.html", OFFLINE)
    result = _result(_dump_dom(page, tmp_path))
    assert result["material"] is True  # the theme's bundle ran: this is Material's page
    assert result["ready"] is True
    assert result["selectShown"] is True
    assert result["shown"] == [False, True]
    assert result["readout"] == "head 2, query 1 (y) → key 0 (u): weight 0.3000"


MEASURE = """
document.documentElement.style.scrollbarWidth = "none";  // a phone's scrollbars overlay
window.addEventListener("load", function () { setTimeout(function () {
  var result = {column: document.querySelector("article.md-typeset").clientWidth,
                viewport: window.innerWidth,
                page: document.documentElement.scrollWidth, images: {}};
  document.querySelectorAll("article img").forEach(function (img) {
    var box = img.parentElement;
    // A stylesheet may show a narrow redraw instead: content: url(".../NAME-narrow.svg").
    var shown = /url\\("?[^")]*\\/([^"/)]+)"?\\)/.exec(getComputedStyle(img).content);
    result.images[img.getAttribute("alt")] = {
      file: shown ? shown[1] : img.getAttribute("alt"),
      width: img.getBoundingClientRect().width,
      scrolls: box.scrollWidth > box.clientWidth && getComputedStyle(box).overflowX === "auto",
      hint: getComputedStyle(box, "::after").content,
    };
  });
  result.figures = Array.from(document.querySelectorAll(".attn-figure")).map(function (box) {
    var svg = box.querySelector("svg");
    var scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
    var sizes = Array.from(svg.querySelectorAll("text")).map(function (t) {
      return parseFloat(getComputedStyle(t).fontSize) * scale;
    });
    return {smallest: Math.min.apply(null, sizes),
            scrolls: box.scrollWidth > box.clientWidth,
            hint: getComputedStyle(box, "::after").content};
  });
  parent.postMessage(JSON.stringify(result), "*");
}, 300); });
"""


MATH = """
window.addEventListener("load", function () { setTimeout(function () {
  var out = document.createElement("pre");
  out.id = "result";
  out.textContent = JSON.stringify({
    rendered: document.querySelectorAll("article .katex").length,
    errors: document.querySelectorAll("article .katex-error").length,
  });
  document.body.appendChild(out);
}, 300); });
"""


def test_browser_math_renders_in_a_page_opened_from_file(
    offline_site: Path, tmp_path: Path
) -> None:
    # katex-init.js waited for Material's document$ alone, which never emits from file://:
    # an offline copy of the site showed every formula as TeX source.
    page = _with_driver(offline_site, "text.html", MATH)
    assert _result(_dump_dom(page, tmp_path)) == {"rendered": 1, "errors": 0}


def test_browser_every_diagram_shows_11px_text_on_a_phone(
    offline_site: Path, tmp_path: Path
) -> None:
    page = _with_driver(offline_site, "diagrams.html", MEASURE, width=390)
    result = _result(_dump_dom(page, tmp_path))
    assert isinstance(result["column"], int)
    assert 300 < result["column"] < 390  # the theme's phone layout: a column of ~358 px
    assert result["viewport"] == 390
    assert result["page"] == 390  # a diagram scrolls in its box, the page does not
    images = result["images"]
    assert isinstance(images, dict)
    assert sorted(images) == sorted(p.name for p in IMAGES.glob("*.svg") if "-narrow" not in p.stem)
    # The widest drawings are replaced by their narrow redraws on a phone.
    redrawn = {name for name, shown in images.items() if shown["file"] != name}
    assert redrawn == {p.name.replace("-narrow", "") for p in IMAGES.glob("*-narrow.svg")}
    for name, shown in images.items():
        smallest, view_width = _min_font_px(IMAGES / shown["file"])
        effective = smallest * shown["width"] / view_width
        assert effective >= 11, f"{shown['file']}: smallest text {effective:.1f} px at 390 px"
        if shown["width"] > result["column"]:
            assert shown["scrolls"], f"{name} is wider than the column but does not scroll"
            assert "scroll sideways" in shown["hint"]
        else:
            assert shown["hint"] == "none", f"{name} fits but says it scrolls"
    # Matplotlib figures keep the width at which their smallest text is 11 px, and scroll.
    figures = result["figures"]
    assert isinstance(figures, list)
    assert len(figures) == 2
    for figure in figures:
        assert figure["smallest"] >= 11 - 0.05  # the width is rounded to whole pixels
        assert figure["scrolls"]
        assert "scroll sideways" in figure["hint"]


# Code in a collapsed solution or an admonition has the size of code elsewhere; a
# heading's permalink never wraps onto a line of its own, at any column width.
TEXT = """
window.addEventListener("load", function () { setTimeout(function () {
  function size(selector) {
    return getComputedStyle(document.querySelector(selector)).fontSize;
  }
  var result = {viewport: window.innerWidth,
                code: size("article > .highlight pre > code"),
                solution: size("article details pre > code"),
                note: size("article .admonition pre > code"),
                alone: []};
  var article = document.querySelector("article.md-typeset");
  var heading = article.querySelector("h1");
  var link = heading.querySelector(".headerlink");
  var text = document.createRange();
  text.selectNodeContents(heading.firstChild);
  for (var width = 200; width <= 700; width += 2) {
    article.style.width = width + "px";
    var lines = text.getClientRects();
    var last = lines[lines.length - 1];
    if (link.getBoundingClientRect().top > last.bottom - 1) result.alone.push(width);
  }
  var out = document.createElement("pre");
  out.id = "result";
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
}, 300); });
"""


def test_browser_solution_code_and_permalinks(offline_site: Path, tmp_path: Path) -> None:
    page = _with_driver(offline_site, "text.html", TEXT)
    result = _result(_dump_dom(page, tmp_path))
    assert result["viewport"] == 1280  # a desktop width, where code is set smaller
    assert result["solution"] == result["code"], "code in a solution is smaller"
    assert result["note"] == result["code"]
    assert result["alone"] == [], "widths at which the permalink wraps alone"


def test_noscript_line_on_pages_with_formulas_only(offline_site: Path) -> None:
    # Without JavaScript, KaTeX does not run and formulas show as TeX: the page says so.
    line = '<noscript><p class="attn-noscript">'
    assert line in (offline_site / "text.html").read_text(encoding="utf-8")
    assert line not in (offline_site / "diagrams.html").read_text(encoding="utf-8")


# The live model -------------------------------------------------------------------------
#
# live-model.js runs the committed induction model in the page. One run of the browser on
# the small site's live page computes the model on several sequences, draws heatmaps and
# prediction tables from given numbers, and drives the widget; the tests below read that
# run's result and compare it with PyTorch and with the Python renderers.

LIVE_TOKENS = [11, 40, 3, 27, 58, 16, 11, 40, 3, 27, 58, 16]
LIVE_NAMES = [f"L{layer + 1} H{head}" for layer in range(2) for head in range(4)]
NEXT_TOKENS = [1, 2, 3, 1, 2, 3]


@functools.cache
def _model() -> TinyTransformer:
    """The committed model, loaded once per session."""
    return load_run(MODEL_RUN)[0]


def _sequences() -> list[list[int]]:
    """Sequences of 1, 5, 24 (repeated), 37 and 48 (repeated) tokens."""
    g = torch.Generator().manual_seed(18)
    return [
        [7],
        torch.randint(0, 64, (5,), generator=g).tolist(),
        repeated_tokens(1, 12, 64, generator=g)[0].tolist(),
        torch.randint(0, 64, (37,), generator=g).tolist(),
        repeated_tokens(1, 24, 64, generator=g)[0].tolist(),
    ]


# Weights with exact ties at the rounding of the read-out (0.03125 to 4 decimals, 0.125
# to 2) and of the colour channels (0.0625 of the scale), labels that need escaping.
HEATMAP_CASES: list[dict[str, object]] = [
    {
        "weights": [
            [[0.125, 0.5, 0.03125, 0.34375], [0.0625, 1 / 3, 0.00005, 0.6], [1.0, 0, 0, 0]],
            [[0.25, 0.25, 0.25, 0.25], [0.9, 0.05, 0.025, 0.025], [0.6875, 0.3, 0.01, 0.0025]],
        ],
        "rows": ["The", "W&M", '"q"'],
        "cols": ["<a>", "it's", "Zz", "a longer label"],
        "options": {"title": 'Ties & "quotes"', "panelNames": ["one", "two"], "cellSize": 30},
    },
    {"weights": [[[0.5, 0.5], [0.0625, 0.9375]]], "rows": ["a", "b"], "cols": ["c", "d"]},
    {
        "weights": [[[0.2, 0.8]], [[0.7, 0.3]], [[1.0, 0.0]]],
        "rows": ["q"],
        "cols": ["k0", "k1"],
        "options": {"vmin": 0.1, "vmax": 2.0, "xlabel": "to", "ylabel": "from", "annotate": False},
    },
]


def _python_heatmap(case: dict[str, object]) -> str:
    options = dict(case.get("options", {}))  # type: ignore[call-overload]
    renames = {"panelNames": "panel_names", "cellSize": "cell_size"}
    kwargs = {renames.get(key, key): value for key, value in options.items()}
    weights = torch.tensor(case["weights"], dtype=torch.float64)
    return interactive_heatmap(weights, case["rows"], case["cols"], **kwargs)  # type: ignore[arg-type]


PREDICTION_CASES: list[dict[str, list[float] | list[int]]] = [
    {"tokens": [4, 9, 4, 9], "best": [9, 4, 9, 1], "probabilities": [0.125, 0.5, 0.995, 1 / 3]},
    {"tokens": [63], "best": [0], "probabilities": [0.015]},
]

LIVE_DRIVER = """
window.addEventListener("load", function () { setTimeout(function () {
  var DATA = __DATA__;
  function state(widget) {
    var fig = widget.querySelector("[data-attn-heatmap]");
    var error = widget.querySelector(".attn-live-error");
    var pressed = fig.querySelector(".attn-heatmap-select button[aria-pressed=true]");
    var rows = widget.querySelectorAll(".attn-live-table tr");
    function cells(r) {
      return Array.from(rows[r].querySelectorAll("td")).map(function (td) {
        return td.textContent;
      });
    }
    var panels = Array.from(fig.querySelectorAll(".attn-heatmap-panel"));
    var drawn = panels.map(function (p) {
      return p.querySelectorAll(".attn-heatmap-cell").length;
    });
    var shown = panels.map(function (p) { return p.getClientRects().length > 0; }).indexOf(true);
    // Visit every panel (each is drawn when its button is first pressed), then go back.
    var visited = Array.from(fig.querySelectorAll(".attn-heatmap-select button")).map(
      function (button) {
        button.click();
        var p = fig.querySelector(
          '.attn-heatmap-panel[data-panel="' + button.getAttribute("data-panel") + '"]');
        var last = p.querySelectorAll(".attn-heatmap-row").length - 1;
        return {
          cells: p.querySelectorAll(".attn-heatmap-cell").length,
          lastRow: Array.from(p.querySelectorAll('.attn-heatmap-cell[data-q="' + last + '"]'))
            .map(function (c) { return Number(c.getAttribute("data-w")); }),
        };
      });
    if (pressed) pressed.click();
    return {
      value: widget.querySelector(".attn-live-input").value,
      rendered: widget.getAttribute("data-attn-live-tokens"),
      error: error.getClientRects().length ? error.textContent : null,
      stale: widget.querySelector(".attn-live-output").classList.contains("is-stale"),
      controls: widget.querySelector(".attn-live-controls").getClientRects().length > 0,
      ready: fig.hasAttribute("data-attn-ready"),
      drawn: drawn,
      cells: visited.map(function (v) { return v.cells; }),
      shown: shown,
      pressed: pressed ? pressed.textContent : null,
      tokens: cells(1), predicts: cells(2), probabilities: cells(3),
      hits: Array.from(rows[2].querySelectorAll("td.attn-live-hit")).length,
      summary: widget.querySelector(".attn-live-summary").textContent,
      lastRows: visited.map(function (v) { return v.lastRow; }),
    };
  }
  function type(widget, text) {
    var input = widget.querySelector(".attn-live-input");
    input.value = text;
    input.dispatchEvent(new Event("input", {bubbles: true}));
    return state(widget);
  }
  function press(widget, action) {
    widget.querySelector('[data-attn-live-action="' + action + '"]').click();
    return state(widget);
  }
  attnLive.load(function (model, problem) {
    var result = {problem: problem || null};
    var widget = document.querySelector("[data-attn-live]");
    result.initial = state(widget);
    result.forward = DATA.sequences.map(function (s) { return attnLive.forward(model, s); });
    result.heatmaps = DATA.heatmaps.map(function (c) {
      return attnHeatmap.html(c.weights, c.rows, c.cols, c.options);
    });
    result.predictions = DATA.predictions.map(function (c) {
      return attnLive.predictionsHtml(c.tokens, c.best, c.probabilities);
    });
    widget.querySelector('.attn-heatmap-select button[data-panel="5"]').click();
    result.edited = type(widget, "3 1 4 1 5 9 2 6");
    result.repeated = press(widget, "repeat");
    type(widget, DATA.thirty);
    result.clipped = press(widget, "repeat");
    result.bad = ["1 2 x", "1, 64", DATA.fortyNine, " , "].map(function (text) {
      return type(widget, text);
    });
    type(widget, "5 5 x");
    result.badRepeat = press(widget, "repeat");
    result.recovered = type(widget, "7, 8,9");
    result.reset = press(widget, "reset");
    // Instant navigation: Material swaps the article, then emits on document$ (here the
    // stand-in of INSTANT: from file:// Material's own has completed and never emits).
    document.querySelector("article").innerHTML = DATA.next;
    var swapped = document.querySelector("[data-attn-live]");
    result.beforeEmit = swapped.hasAttribute("data-attn-live-ready");
    result.subscribers = subscribers.length;
    subscribers.forEach(function (fn) { fn(document); });
    setTimeout(function () {
      result.navigated = state(swapped);
      result.styles = document.querySelectorAll("#attn-live-style").length;
      var out = document.createElement("pre");
      out.id = "result";
      out.textContent = JSON.stringify(result);
      document.body.appendChild(out);
    }, 100);
  });
}, 300); });
"""


@pytest.fixture(scope="module")
def live_run(offline_site: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    model = _model()
    g = torch.Generator().manual_seed(30)
    data = {
        "sequences": _sequences(),
        "heatmaps": HEATMAP_CASES,
        "predictions": PREDICTION_CASES,
        "thirty": " ".join(map(str, torch.randint(0, 64, (30,), generator=g).tolist())),
        "fortyNine": " ".join(["1"] * 49),
        "next": live_model_widget(model, NEXT_TOKENS, title=None),
    }
    driver = LIVE_DRIVER.replace("__DATA__", json.dumps(data))
    page = _with_driver(offline_site, "live.html", driver)
    html = page.read_text(encoding="utf-8")
    first = '<script src="assets/javascripts/attention-heatmap.js"'
    assert html.count(first) == 1
    page.write_text(html.replace(first, INSTANT + first), encoding="utf-8")
    return _result(_dump_dom(page, tmp_path_factory.mktemp("live")))


def test_browser_live_forward_equals_pytorch(live_run: dict[str, Any]) -> None:
    model = _model()
    assert live_run["problem"] is None
    for sequence, js in zip(_sequences(), live_run["forward"], strict=True):
        tokens = torch.tensor([sequence])
        logits = torch.tensor(js["logits"], dtype=torch.float64)
        expected = model(tokens)[0].double()
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
        maps = model.attention_maps(tokens)
        assert len(js["attention"]) == len(maps) == 2
        for layer, weights in enumerate(maps):
            got = torch.tensor(js["attention"][layer], dtype=torch.float64)  # (h, t, t)
            torch.testing.assert_close(got, weights[0].double(), atol=1e-5, rtol=0)


def test_browser_live_heatmap_and_table_markup_equal_pythons(live_run: dict[str, Any]) -> None:
    for case, js in zip(HEATMAP_CASES, live_run["heatmaps"], strict=True):
        assert js == _python_heatmap(case)
    for numbers, js in zip(PREDICTION_CASES, live_run["predictions"], strict=True):
        tokens, best, probabilities = numbers["tokens"], numbers["best"], numbers["probabilities"]
        assert js == _predictions_html(tokens, best, probabilities)  # type: ignore[arg-type]


def _expected_state(tokens: list[int]) -> dict[str, Any]:
    """What the widget must show for `tokens`, from PyTorch."""
    model = _model()
    batch = torch.tensor([tokens])
    probabilities = torch.softmax(model(batch)[0].double(), dim=-1)
    top, best = probabilities.max(dim=-1)
    maps = torch.cat([m[0] for m in model.attention_maps(batch)])  # (8, t, t)
    return {
        "tokens": [str(t) for t in tokens],
        "predicts": [str(b) for b in best.tolist()],
        "probabilities": top.tolist(),
        "lastRows": maps[:, -1].tolist(),
        "hits": sum(int(best[i]) == tokens[i + 1] for i in range(len(tokens) - 1)),
    }


def _check_state(state: dict[str, Any], tokens: list[int]) -> None:
    expected = _expected_state(tokens)
    assert state["error"] is None
    assert state["stale"] is False
    assert state["rendered"] == " ".join(map(str, tokens))
    assert state["ready"] is True
    # The chosen panel is drawn at once, each other one when its button is pressed.
    assert state["drawn"] == [len(tokens) ** 2 if p == state["shown"] else 0 for p in range(8)]
    assert state["cells"] == [len(tokens) ** 2] * 8
    assert state["tokens"] == expected["tokens"]
    assert state["predicts"] == expected["predicts"]
    shown = [float(p) for p in state["probabilities"]]
    assert shown == pytest.approx(expected["probabilities"], abs=0.005 + 1e-9)
    assert state["hits"] == expected["hits"]
    assert f"at {expected['hits']} of the {len(tokens) - 1} positions" in state["summary"]
    for got, want in zip(state["lastRows"], expected["lastRows"], strict=True):
        assert got == pytest.approx(want, abs=5e-5 + 1e-9)  # four decimals in data-w


def test_browser_live_widget_updates_on_edit_and_repeat(live_run: dict[str, Any]) -> None:
    initial = live_run["initial"]
    assert initial["controls"] is True  # revealed by the script
    assert initial["value"] == " ".join(map(str, LIVE_TOKENS))
    _check_state(initial, LIVE_TOKENS)
    assert initial["pressed"] == "L1 H0"
    # An edit reruns the model; the head the reader chose stays chosen.
    edited = live_run["edited"]
    _check_state(edited, [3, 1, 4, 1, 5, 9, 2, 6])
    assert edited["pressed"] == LIVE_NAMES[5]
    assert edited["shown"] == 5
    repeated = live_run["repeated"]
    assert repeated["value"] == "3 1 4 1 5 9 2 6 3 1 4 1 5 9 2 6"
    _check_state(repeated, [3, 1, 4, 1, 5, 9, 2, 6] * 2)
    clipped = live_run["clipped"]
    tokens = [int(t) for t in clipped["value"].split()]
    assert len(tokens) == 48  # 60 cut at max_len
    assert tokens[30:] == tokens[:18]
    _check_state(clipped, tokens)
    _check_state(live_run["recovered"], [7, 8, 9])
    _check_state(live_run["reset"], LIVE_TOKENS)


def test_browser_live_widget_names_bad_input(live_run: dict[str, Any]) -> None:
    errors = [state["error"] for state in live_run["bad"]]
    assert errors == [
        "“x” (token 3) is not a token id: use whole numbers from 0 to 63.",
        "64 (token 2) is outside the vocabulary: ids go from 0 to 63.",
        "49 tokens: the model has positions for 48 at most.",
        "No tokens: type at least one id, 0 to 63.",
    ]
    last_good = live_run["clipped"]
    for state in [*live_run["bad"], live_run["badRepeat"]]:
        # The last good picture stays, faded; nothing is drawn from the bad input.
        assert state["stale"] is True
        assert state["rendered"] == last_good["rendered"]
        assert state["cells"] == last_good["cells"]
        assert state["predicts"] == last_good["predicts"]
    assert live_run["badRepeat"]["error"].startswith("“x” (token 3)")
    assert live_run["badRepeat"]["value"] == "5 5 x"  # repeat does not double bad input


def test_browser_live_widget_after_instant_navigation(live_run: dict[str, Any]) -> None:
    assert live_run["subscribers"] == 2  # the heatmap's script and the live model's
    assert live_run["beforeEmit"] is False
    navigated = live_run["navigated"]
    _check_state(navigated, NEXT_TOKENS)
    assert navigated["pressed"] == "layer 1 · head 1"  # the default names
    assert live_run["styles"] == 1


LIVE_PHONE = """
document.documentElement.style.scrollbarWidth = "none";
window.addEventListener("load", function () { setTimeout(function () {
  attnLive.load(function () {
    var widget = document.querySelector("[data-attn-live]");
    var input = widget.querySelector(".attn-live-input");
    input.value = __TOKENS__;
    input.dispatchEvent(new Event("input", {bubbles: true}));
    var column = document.querySelector("article.md-typeset").getBoundingClientRect();
    var heatmap = widget.querySelector(".attn-heatmap-scroll");
    var table = widget.querySelector(".attn-live-scroll");
    function inside(el) {
      var box = el.getBoundingClientRect();
      return box.left >= column.left - 0.5 && box.right <= column.right + 0.5;
    }
    var hint = widget.querySelector(".attn-heatmap-hint");
    parent.postMessage(JSON.stringify({
      viewport: window.innerWidth,
      page: document.documentElement.scrollWidth,
      rendered: widget.getAttribute("data-attn-live-tokens").split(" ").length,
      inside: [widget, input, heatmap, table].map(inside),
      heatmapScrolls: heatmap.scrollWidth > heatmap.clientWidth,
      tableScrolls: table.scrollWidth > table.clientWidth,
      hint: hint.getClientRects().length > 0,
      buttons: Array.from(widget.querySelectorAll("button")).map(inside).every(Boolean),
    }), "*");
  });
}, 300); });
"""


def test_browser_live_widget_fits_a_phone(offline_site: Path, tmp_path: Path) -> None:
    tokens = json.dumps(" ".join(str(t % 64) for t in range(5, 53)))  # 48 tokens
    page = _with_driver(offline_site, "live.html", LIVE_PHONE.replace("__TOKENS__", tokens), 390)
    result = _result(_dump_dom(page, tmp_path))
    assert result["viewport"] == 390
    assert result["page"] == 390  # nothing widens the page...
    assert result["rendered"] == 48
    assert result["inside"] == [True, True, True, True]  # ...the widget keeps to its column
    assert result["heatmapScrolls"] is True  # the wide parts scroll in their boxes
    assert result["tableScrolls"] is True
    assert result["hint"] is True
    assert result["buttons"] is True


# Material's own instant navigation, served over HTTP: it only runs on the default port
# (elsewhere every click is a full load), so the test needs port 80 and skips without it.
REAL_NAVIGATION = """
window.__samePage = true;  // gone if the click loads a new page instead of swapping
window.addEventListener("load", function () { setTimeout(function () {
  document.querySelector('nav a[href$="live.html"]').click();
  var tries = 0;
  (function check() {
    var widget = document.querySelector("[data-attn-live]");
    if ((!widget || !widget.hasAttribute("data-attn-live-tokens")) && ++tries < 580) {
      // up to 58 s of the 60 s virtual-time budget: virtual time runs ahead while the
      // page waits, so a busy machine's slow fetches once used up 18 s of 20
      return setTimeout(check, 100);
    }
    if (!widget) {  // report it, rather than fail on a null without a result
      var missing = document.createElement("pre");
      missing.id = "result";
      missing.textContent = JSON.stringify({samePage: window.__samePage === true,
                                            url: location.pathname, widget: false});
      return document.body.appendChild(missing);
    }
    var input = widget.querySelector(".attn-live-input");
    var figure = widget.querySelector("[data-attn-heatmap]");
    var result = {samePage: window.__samePage === true, url: location.pathname,
                  tokens: widget.getAttribute("data-attn-live-tokens"),
                  figure: figure.hasAttribute("data-attn-ready")};
    input.value = "1 2 3 1 2 3";
    input.dispatchEvent(new Event("input", {bubbles: true}));
    result.edited = widget.getAttribute("data-attn-live-tokens");
    var out = document.createElement("pre");
    out.id = "result";
    out.textContent = JSON.stringify(result);
    document.body.appendChild(out);
  })();
}, 300); });
"""


def test_browser_live_widget_after_real_instant_navigation(
    offline_site: Path, tmp_path: Path
) -> None:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(offline_site.parent))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 80), handler)
    except OSError as err:  # not root, or port 80 taken
        pytest.skip(f"cannot serve on port 80, which instant navigation needs: {err}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        page = _with_driver(offline_site, "index.html", REAL_NAVIGATION)
        assert BROWSER is not None
        command = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic"]
        command += ["--no-first-run", "--disable-background-networking", "--disable-sync"]
        command += [f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=60000"]
        command += ["--dump-dom", f"http://127.0.0.1/{SITE}/{page.name}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    finally:
        server.shutdown()
        server.server_close()
    result = _result(done.stdout)
    assert result["samePage"] is True, "the click loaded a page: no instant navigation"
    assert result["url"] == f"/{SITE}/live.html"
    assert result.get("widget", True), "no live widget 58 s (virtual) after the click"
    assert result["tokens"] == " ".join(map(str, LIVE_TOKENS))  # set up after the swap
    assert result["figure"] is True
    assert result["edited"] == "1 2 3 1 2 3"  # and it reruns on an edit
