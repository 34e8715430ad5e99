"""The heatmaps and diagrams in a real browser: headless Chromium reads what a reader sees.

A page with a heatmap from `attnlab.plotting.interactive_heatmap`, the site's script
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

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from attnlab.plotting import interactive_heatmap

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "assets" / "javascripts" / "attention-heatmap.js"
STYLESHEET = ROOT / "docs" / "assets" / "stylesheets" / "extra.css"
KATEX_INIT = ROOT / "docs" / "assets" / "javascripts" / "katex-init.js"
KATEX = ROOT / "docs" / "assets" / "katex"
IMAGES = ROOT / "docs" / "assets" / "images"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((path for name in BROWSERS if (path := shutil.which(name))), None)

pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason="no Chromium on PATH (install it with: apt-get install -y chromium)",
)

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
    assert BROWSER is not None
    command = [
        BROWSER,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,1000",
        "--virtual-time-budget=3000",
        "--dump-dom",
        page.as_uri(),
    ]
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

    from attnlab.plotting import figure_to_svg, heatmap

    weights = torch.softmax(torch.randn(6, 6, generator=torch.Generator().manual_seed(0)), -1)
    words = ["Life", "is", "short", "eat", "dessert", "first"]
    wide = Figure(figsize=(8, 3.4), layout="constrained")
    wide.add_subplot().plot([0, 1, 2], [1, 0, 2], label="a line")
    wide.axes[0].set_title("a wide figure, as on the GQA page")
    return [figure_to_svg(heatmap(weights, words, words, title="weights")), figure_to_svg(wide)]


@pytest.fixture(scope="module")
def offline_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-page site built with the real theme, scripts and stylesheet, as on the site."""
    root = tmp_path_factory.mktemp("offline")
    docs = root / "docs"
    for sub in ("images", "javascripts", "stylesheets"):
        (docs / "assets" / sub).mkdir(parents=True)
    shutil.copy(SCRIPT, docs / "assets" / "javascripts")
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
    (root / "mkdocs.yml").write_text(
        "site_name: offline\n"
        "use_directory_urls: false\n"
        f"theme:\n  name: material\n  font: false\n  custom_dir: {ROOT / 'docs' / 'overrides'}\n"
        "  features: [navigation.instant]\n"
        "plugins: []\n"
        "markdown_extensions: [admonition, attr_list, md_in_html, pymdownx.details,"
        " pymdownx.superfences, {toc: {permalink: true}}, {pymdownx.arithmatex: {generic: true}}]\n"
        "extra_css: [assets/katex/katex.min.css, assets/stylesheets/extra.css]\n"
        "extra_javascript: [assets/katex/katex.min.js, assets/katex/contrib/auto-render.min.js,"
        " assets/javascripts/katex-init.js, assets/javascripts/attention-heatmap.js]\n"
        "nav: [index.md, diagrams.md, text.md]\n",
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
    return root / "site"


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
