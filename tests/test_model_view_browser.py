"""The model view in a real browser, at a phone's width, opened from a file.

`ModelView.save` writes a self-contained page; a frame 390 px wide shows it, and a driver
script acts as a reader: it points at and taps tokens, clicks and keys through the grid,
opens a head, points at its heatmap, changes the layers and the text; then it reports
what the page shows and what its script decoded. The decoded weights must be the model's
(tests/test_model_view.py holds those equal to the materialised softmax) within half the
encoding's step of 1/255. tests/test_site.py does the same for the real page and SmolLM2.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest
import torch

from _browser import BROWSER, MISSING, headless  # tests/_browser.py, via pythonpath
from attnlab.models.config import DecoderConfig
from attnlab.models.decoder import Decoder
from attnlab.tools import model_view as mv
from test_model_view import STEP, CharTokenizer

pytestmark = pytest.mark.skipif(BROWSER is None, reason=MISSING)
PHONE = 390

# Runs in the frame, once the view has decoded its first text.
DRIVER = r"""
(function () {
  var out = {};
  function wait(test, then) {
    var tries = 0;
    (function poll() {
      if (test()) return then();
      if (++tries > 200) { out.error = "timed out"; return done(); }
      setTimeout(poll, 10);
    })();
  }
  function done() { parent.postMessage(JSON.stringify(out), "*"); }
  function center(node) {
    node.scrollIntoView({block: "center"});
    var r = node.getBoundingClientRect();
    return [r.left + r.width / 2, r.top + r.height / 2];
  }
  function top(node) {  // what a reader's pointer reaches at the node's centre
    var c = center(node);
    return document.elementFromPoint(c[0], c[1]);
  }
  function mouse(node, type, x, y) {
    node.dispatchEvent(new MouseEvent(type, {bubbles: true, clientX: x, clientY: y}));
  }
  function band(b) {  // where a band's row starts, as a share of its thumbnail's height
    var inset = getComputedStyle(b).clipPath.match(/inset\(([\d.]+)%/);
    return inset ? Number(inset[1]) / 100 : null;
  }
  function key(node, name) {
    node.dispatchEvent(new KeyboardEvent("keydown", {key: name, bubbles: true}));
  }
  var root = document.querySelector("[data-attn-model-view]");
  wait(function () { return root.getAttribute("data-attn-mv-text") === "0"; }, function () {
    var api = window.attnModelView, entries = root.attnModelView.entries;
    out.fallbackShown = root.querySelector(".attn-mv-fallback").getClientRects().length > 0;
    Promise.all(entries.map(api.decode)).then(function (all) {
      out.decoded = all.map(function (d) {
        return {thumbs: Array.from(d.thumbs), full: d.full ? Array.from(d.full) : null,
                keys: d.keys ? Array.from(d.keys) : null,
                values: d.values ? Array.from(d.values) : null};
      });
      interact(entries);
    });
  });
  function interact(entries) {
    var grid = root.querySelector(".attn-mv-grid");
    var spans = root.querySelectorAll(".attn-mv-token");
    // 1. Point at token 5: its row lights in every thumbnail, at the same place.
    var hit = top(spans[5]);
    mouse(hit, "mouseover");
    var bands = Array.from(root.querySelectorAll(".attn-mv-band"));
    out.hover = {hit: hit === spans[5], lit: grid.classList.contains("is-lit"),
      tokenLit: spans[5].classList.contains("is-lit"),
      shown: bands.filter(function (b) { return getComputedStyle(b).display === "block"; }).length,
      bands: bands.length,
      tops: bands.map(band)};
    // 2. Tap token 7 (pointer events, then a click): it stays lit when the pointer leaves.
    hit = top(spans[7]);
    ["pointerdown", "pointerup"].forEach(function (type) {
      hit.dispatchEvent(new PointerEvent(type, {bubbles: true, pointerType: "touch"}));
    });
    hit.click();
    mouse(root.querySelector(".attn-mv-tokens"), "mouseleave");
    out.tap = {pinned: spans[7].classList.contains("is-pinned"),
      lit: root.getAttribute("data-attn-mv-lit")};
    // 3. Click the thumbnail of layer 1, head 2: its large view opens.
    var thumb = root.querySelector('.attn-mv-thumb[data-layer="1"][data-head="2"]');
    var rect = thumb.getBoundingClientRect();
    out.thumbSize = [Math.round(rect.width), Math.round(rect.height)];
    hit = top(thumb);
    hit.click();
    var detail = root.querySelector(".attn-mv-detail");
    out.open = {hit: hit === thumb || thumb.contains(hit), shown: !detail.hidden,
      head: root.getAttribute("data-attn-mv-head"), pressed: thumb.getAttribute("aria-pressed"),
      title: detail.querySelector(".attn-mv-detail-title strong").textContent,
      readout: root.querySelector(".attn-mv-readout").textContent};
    // 4. Point at the heatmap's cell (query 7, key 3).
    var heat = root.querySelector(".attn-mv-heat"), t = entries[0].t;
    var ctx = heat.getContext("2d");
    out.pixels = [[7, 3], [3, 7], [7, 7]].map(function (c) {
      return Array.from(ctx.getImageData(c[1], c[0], 1, 1).data.slice(0, 3));
    });
    out.position = thumb.style.backgroundPosition;
    heat.scrollIntoView({block: "center"});
    var hr = heat.getBoundingClientRect();
    mouse(heat, "mousemove", hr.left + (3.5 / t) * hr.width, hr.top + (7.5 / t) * hr.height);
    out.cell = root.querySelector(".attn-mv-readout").textContent;
    key(heat, "ArrowRight");
    out.cellKey = root.querySelector(".attn-mv-readout").textContent;
    // 5. Keyboard in the grid: Escape closes (focus back on the thumbnail), arrows move,
    //    Enter opens.
    key(detail, "Escape");
    out.closed = {hidden: detail.hidden, focus: document.activeElement.getAttribute("aria-label")};
    key(document.activeElement, "ArrowRight");
    key(document.activeElement, "ArrowDown");
    var focused = document.activeElement;
    out.moved = [focused.getAttribute("data-layer"), focused.getAttribute("data-head"),
      focused.tabIndex, root.querySelectorAll('.attn-mv-thumb[tabindex="0"]').length];
    key(focused, "Enter");
    out.entered = root.getAttribute("data-attn-mv-head");
    // 6. Keys in the token strip move the focus and light the token.
    spans[0].focus();
    key(spans[0], "ArrowRight");
    key(document.activeElement, "ArrowRight");
    out.strip = [document.activeElement.getAttribute("data-i"),
      root.getAttribute("data-attn-mv-lit")];
    // 7. The layer range hides the layers outside it.
    var from = root.querySelector(".attn-mv-range select");
    from.value = "1";
    from.dispatchEvent(new Event("change", {bubbles: true}));
    out.layers = Array.from(root.querySelectorAll(".attn-mv-layer")).map(function (line) {
      return line.hidden;
    });
    out.width = [document.documentElement.scrollWidth, document.documentElement.clientWidth];
    // 8. Another text.
    root.querySelector('.attn-mv-texts button[data-text="1"]').click();
    wait(function () { return root.getAttribute("data-attn-mv-text") === "1"; }, function () {
      var button = root.querySelector('.attn-mv-texts button[data-text="1"]');
      out.second = {tokens: root.querySelectorAll(".attn-mv-token").length,
        pressed: button.getAttribute("aria-pressed"),
        head: root.getAttribute("data-attn-mv-head"),
        cells: grid.style.getPropertyValue("--mv-cells")};
      out.width2 = document.documentElement.scrollWidth;
      // The last token's row: the last of 32 cells, in every thumbnail (all layers shown).
      from.value = "0";
      from.dispatchEvent(new Event("change", {bubbles: true}));
      var last = root.querySelectorAll(".attn-mv-token");
      mouse(top(last[last.length - 1]), "mouseover");
      out.lastTops = Array.from(root.querySelectorAll(".attn-mv-band")).map(function (b) {
        var box = b.parentNode.getBoundingClientRect(), r = b.getBoundingClientRect();
        return [band(b), getComputedStyle(b).display];
      });
      out.thumbHeight = root.querySelector(".attn-mv-thumb").clientHeight;
      // What the large view reads of a row kept as its top weights.
      var data = root.attnModelView.data;
      out.rows = [10, 63].map(function (i) { return window.attnModelView.row(data, 0, 0, i); });
      done();
    });
  }
})();
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.manual_seed(1)
    config = DecoderConfig(
        vocab_size=61, d_model=24, num_layers=3, num_heads=6, num_kv_heads=2, head_dim=6,
        hidden_dim=40,
    )  # fmt: skip
    decoder = Decoder(config).eval()
    tokenizer = CharTokenizer()
    long = ("the dog sat on the log. " * 3)[:64]  # 32 cells of 2 tokens: rows under 2 px
    texts = {"short": "the cat sat on the mat", "long": long}
    view = mv.model_view(decoder, tokenizer, texts, top_k=4, full_up_to=24, thumb=32)
    folder = tmp_path_factory.mktemp("view")
    page = view.save(folder / "view.html")
    html = page.read_text("utf-8").replace("</body>", f"<script>{DRIVER}</script></body>")
    page.write_text(html, "utf-8")
    frame = folder / "frame.html"
    frame.write_text(
        "<!doctype html><html><body style='margin:0'>"
        f"<iframe src='view.html' width='{PHONE}' height='800' style='border:0'></iframe>"
        "<script>window.addEventListener('message', function (event) {"
        "var out = document.createElement('pre'); out.id = 'result';"
        "out.textContent = event.data; document.body.appendChild(out); });</script>"
        "</body></html>",
        encoding="utf-8",
    )
    command = headless(
        folder / "profile",
        "--window-size=800,900",
        "--allow-file-access-from-files",
        "--virtual-time-budget=10000",
        "--dump-dom",
        frame.as_uri(),
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    found = re.search(r'<pre id="result">(.*?)</pre>', done.stdout, flags=re.S)
    assert found, "the driver did not finish: " + done.stderr[-2000:]
    import html as html_module

    result: dict[str, Any] = json.loads(html_module.unescape(found[1]))
    assert "error" not in result, result.get("error")
    maps = [
        mv.attention_weights(decoder, torch.tensor(tokenizer.encode(text)))
        for text in texts.values()
    ]
    return {"result": result, "view": view, "maps": maps}


def test_browser_model_view_decodes_the_models_weights(run: dict[str, Any]) -> None:
    result, view, maps = run["result"], run["view"], run["maps"]
    short, long = view.texts
    assert (short["mode"], long["mode"]) == ("full", "top")
    for entry, decoded, weights in zip(view.texts, result["decoded"], maps, strict=True):
        t, pool, cells = entry["t"], entry["pool"], entry["cells"]
        padded = torch.zeros(3, 6, cells * pool, cells * pool)
        padded[..., :t, :t] = weights
        pooled = padded.reshape(3, 6, cells, pool, cells, pool).amax(dim=(3, 5))
        thumbs = torch.tensor(decoded["thumbs"], dtype=torch.float32).reshape(3, 6, cells, cells)
        torch.testing.assert_close(thumbs / 255, pooled, atol=STEP, rtol=0)
        if decoded["full"] is not None:
            rows, cols = torch.tril_indices(t, t)
            full = torch.tensor(decoded["full"], dtype=torch.float32).reshape(3, 6, -1) / 255
            torch.testing.assert_close(full, weights[..., rows, cols], atol=STEP, rtol=0)
            continue
        keys = torch.tensor(decoded["keys"]).reshape(3, 6, t, entry["k"])
        values = torch.tensor(decoded["values"], dtype=torch.float32).reshape(keys.shape) / 255
        torch.testing.assert_close(values, weights.gather(-1, keys), atol=STEP, rtol=0)
        assert bool((keys == weights.topk(entry["k"], dim=-1).indices.sort(-1).values).all())


def test_browser_model_view_hover_tap_click_and_keys(run: dict[str, Any]) -> None:
    r, short = run["result"], run["view"].texts[0]
    assert r["fallbackShown"] is False
    # Pointing at token 5 lights row 5 // pool of all 18 thumbnails, at the same height.
    hover = r["hover"]
    assert hover["hit"]
    assert hover["lit"]
    assert hover["tokenLit"]
    assert hover["shown"] == hover["bands"] == 18
    row = (5 // short["pool"]) / short["cells"]
    assert hover["tops"] == pytest.approx([row] * 18, abs=0.01)
    assert r["tap"] == {"pinned": True, "lit": "7"}
    assert r["thumbSize"][0] >= 24
    assert r["thumbSize"][0] == r["thumbSize"][1]
    opened = r["open"]
    assert opened["hit"]
    assert opened["shown"]
    assert (opened["head"], opened["pressed"]) == ("1,2", "true")
    assert opened["title"] == "Layer 1, head 2 (kv head 0) on \u201cshort\u201d"
    weights = run["maps"][0][1, 2]  # (t, t) of layer 1, head 2
    best = int(weights[7].argmax())
    assert opened["readout"].startswith("Token 7 \u201c")
    assert "attends to \u201c" in opened["readout"]
    shown = (weights * 255).round() / 255  # as the page decodes them
    assert f"{best}: {shown[7, best]:.2f}" in opened["readout"]
    tokens = short["tokens"]  # letters: shown as they are
    for text, key in ((r["cell"], 3), (r["cellKey"], 4)):  # pointed at, then one key right
        assert text == (
            f"Query 7 \u201c{tokens[7]}\u201d \u2192 key {key} \u201c{tokens[key]}\u201d: "
            f"{shown[7, key]:.2f}"
        )
    # The heatmap's pixels: a weight in the site's blues, a masked pair the lightest one.
    from attnlab.tools.plotting import _blues

    def rgb(weight: float) -> list[int]:
        colour = _blues(round(weight * 255) / 255)
        return [int(colour[k : k + 2], 16) for k in (1, 3, 5)]

    for (i, j), got in zip([(7, 3), (3, 7), (7, 7)], r["pixels"], strict=True):
        want = rgb(float(weights[i, j])) if j <= i else rgb(0.0)
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1, (i, j)
    assert r["position"] == "40% 50%"  # layer 1 of 3, head 2 of 6: its tile of the sheet
    assert r["closed"] == {"hidden": True, "focus": "Layer 1, head 2 (kv head 0)"}
    assert r["moved"] == ["2", "3", 0, 1]  # one tab stop in the grid
    assert r["entered"] == "2,3"
    assert r["strip"] == ["2", "2"]
    assert r["layers"] == [True, False, False]


def test_browser_model_view_fits_a_phone_and_switches_texts(run: dict[str, Any]) -> None:
    r, long = run["result"], run["view"].texts[1]
    assert (long["mode"], long["pool"], long["cells"]) == ("top", 2, 32)
    scroll, width = r["width"]  # the frame's width, less its vertical scroll bar
    assert scroll == width
    assert PHONE - 20 <= width <= PHONE
    assert r["width2"] == width
    # On a phone the rows of 32 cells are under 2 px, and the last one still shows.
    assert r["thumbHeight"] < 64
    assert all(display == "block" for _, display in r["lastTops"])
    assert [top for top, _ in r["lastTops"]] == pytest.approx([31 / 32] * 18, abs=0.01)
    # A row kept as its top weights: the keys up to the query (its own included).
    weights = run["maps"][1][0, 0]
    for i, got in zip((10, 63), r["rows"], strict=True):
        keep = weights[i].topk(long["k"]).indices.sort().values
        keep = [int(j) for j in keep if j <= i and round(float(weights[i, j]) * 255) > 0]
        assert got["keys"] == keep
        assert got["rest"] == pytest.approx(1 - sum(got["weights"]))
    assert r["second"] == {
        "tokens": long["t"],
        "pressed": "true",
        "head": "2,3",  # the open head stays open on the new text
        "cells": str(long["cells"]),
    }


def test_frame_time_benchmark_smoke(run: dict[str, Any]) -> None:
    # The benchmark's measurement, on the small view: three tokens lit per way.
    from attnlab.tools.bench.model_view import ViewSettings, frame_times

    settings = ViewSettings(tokens=50, hovers=3, layer=1, head=2)
    times = frame_times(run["view"].standalone(), settings)
    assert set(times) == {"ready_ms", "grid", "grid and lines"}
    for way in ("grid", "grid and lines"):
        assert times[way]["n"] == 3
        assert 0 < times[way]["median"] <= times[way]["p95"] <= times[way]["max"]
