"""The interactive heatmap in a real browser: headless Chromium hovers and switches heads.

A page with a heatmap from `attnlab.plotting.interactive_heatmap`, the site's script
(`docs/assets/javascripts/attention-heatmap.js`) and a small driver script is opened from
a file with `chromium --headless --dump-dom`. The driver finds a cell by its position on
screen (`document.elementFromPoint`, so the cell must be the topmost thing there), sends
the mouse events a pointer would send, clicks a head's button, and writes what the page
shows into the DOM, which the test reads back and compares with the weights.

Skipped when no Chromium is installed; install it with `apt-get install -y chromium`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from attnlab.plotting import interactive_heatmap

SCRIPT = Path(__file__).parents[1] / "docs" / "assets" / "javascripts" / "attention-heatmap.js"
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
    expected = f"head 1, query cat → key k3: weight {weights[0, 1, 2].item():.4f}"
    assert result["hoverFirst"]["readout"] == expected
    # The third button shows head 3 alone, pressed; its cells read out head 3's weights.
    assert result["visibleAfter"] == [False, False, True]
    assert result["pressed"] == ["false", "false", "true"]
    assert result["hoverThird"]["hit"]
    expected = f"head 3, query down → key k1: weight {weights[2, 3, 0].item():.4f}"
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
    assert result["readout"] == "head 2, query x → key v: weight 0.9000"
    assert result["styles"] == 1  # its stylesheet is added once, not per page
