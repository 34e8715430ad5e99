// Interactive attention heatmaps made by attnlab.plotting.interactive_heatmap.
//
// Each heatmap is a <figure data-attn-heatmap> holding one SVG per panel (head, or layer
// and head), a hidden row of buttons and a hidden read-out. Without this script the first
// panel shows and every cell still has a <title> tooltip. With it, the buttons switch
// panels and the read-out names the cell under the pointer (or the tapped/focused one).
//
// Listeners are delegated from `document`, so they are added once and serve heatmaps that
// Material's instant navigation swaps in later; `document$` (Material's page observable)
// reveals the controls of each new page. Plain JavaScript, no dependencies.
(function () {
  "use strict";

  var STYLE_ID = "attn-heatmap-style";
  var CSS = [
    ".attn-heatmap-select button{font:inherit;font-size:.75em;cursor:pointer;",
    "padding:.25em .7em;border-radius:.2em;color:var(--md-default-fg-color,#222);",
    "background:transparent;border:1px solid var(--md-default-fg-color--lighter,#999)}",
    ".attn-heatmap-select button[aria-pressed=true]{color:var(--md-primary-bg-color,#fff);",
    "background:var(--md-primary-fg-color,#3f51b5);border-color:var(--md-primary-fg-color,#3f51b5)}",
    ".attn-heatmap-select button:focus-visible{outline:2px solid var(--md-accent-fg-color,#ff6e42)}",
    ".attn-heatmap-readout{padding:.2em .5em;border-radius:.2em;",
    "background:var(--md-code-bg-color,#f5f5f5);font-variant-numeric:tabular-nums}",
    ".attn-heatmap-cell.is-active rect{stroke:var(--md-accent-fg-color,#ff6e42);stroke-width:3}",
    ".attn-heatmap-row.is-active,.attn-heatmap-col.is-active{font-weight:700;",
    "fill:var(--md-accent-fg-color,#ff6e42)}",
  ].join("");

  function addStyle() {
    if (document.getElementById(STYLE_ID)) return;
    var style = document.createElement("style");
    style.id = STYLE_ID;
    style.textContent = CSS;
    document.head.appendChild(style);
  }

  function reveal(root) {
    var figures = root.querySelectorAll("[data-attn-heatmap]:not([data-attn-ready])");
    for (var i = 0; i < figures.length; i++) {
      var figure = figures[i];
      var select = figure.querySelector(".attn-heatmap-select");
      if (select) {
        select.hidden = false;
        select.style.display = "flex";
      }
      var readout = figure.querySelector(".attn-heatmap-readout");
      if (readout) {
        readout.hidden = false;
        readout.style.display = "block";
      }
      figure.setAttribute("data-attn-ready", "");
    }
  }

  function label(panel, cls, attr, index) {
    return panel.querySelector("." + cls + "[" + attr + '="' + index + '"]');
  }

  function clearActive(figure) {
    var active = figure.querySelectorAll(".is-active");
    for (var i = 0; i < active.length; i++) active[i].classList.remove("is-active");
  }

  function show(cell) {
    var figure = cell.closest("[data-attn-heatmap]");
    var panel = cell.closest(".attn-heatmap-panel");
    if (!figure || !panel) return;
    var q = cell.getAttribute("data-q");
    var k = cell.getAttribute("data-k");
    var row = label(panel, "attn-heatmap-row", "data-q", q);
    var col = label(panel, "attn-heatmap-col", "data-k", k);
    clearActive(figure);
    cell.classList.add("is-active");
    if (row) row.classList.add("is-active");
    if (col) col.classList.add("is-active");
    var readout = figure.querySelector(".attn-heatmap-readout");
    if (!readout) return;
    var text =
      "query " + (row ? row.textContent : q) + " \u2192 key " + (col ? col.textContent : k) +
      ": weight " + cell.getAttribute("data-w");
    readout.textContent = (figure.querySelector(".attn-heatmap-select") ? panel.getAttribute("data-name") + ", " : "") + text;
  }

  function select(button) {
    var figure = button.closest("[data-attn-heatmap]");
    if (!figure) return;
    var panel = button.getAttribute("data-panel");
    var buttons = figure.querySelectorAll(".attn-heatmap-select button");
    for (var i = 0; i < buttons.length; i++) {
      buttons[i].setAttribute("aria-pressed", buttons[i] === button ? "true" : "false");
    }
    var panels = figure.querySelectorAll(".attn-heatmap-panel");
    for (var j = 0; j < panels.length; j++) {
      panels[j].hidden = panels[j].getAttribute("data-panel") !== panel;
    }
    clearActive(figure);
    var readout = figure.querySelector(".attn-heatmap-readout");
    if (readout) readout.textContent = "Showing " + button.textContent + ".";
  }

  function cellOf(event) {
    var target = event.target;
    return target && target.closest ? target.closest(".attn-heatmap-cell") : null;
  }

  document.addEventListener("mouseover", function (event) {
    var cell = cellOf(event);
    if (cell) show(cell);
  });
  document.addEventListener("click", function (event) {
    var cell = cellOf(event);
    if (cell) {
      show(cell); // a tap on a phone, where there is no hover
      return;
    }
    var button = event.target && event.target.closest
      ? event.target.closest(".attn-heatmap-select button")
      : null;
    if (button) select(button);
  });

  function start() {
    addStyle();
    reveal(document);
  }
  if (typeof document$ !== "undefined" && document$.subscribe) {
    // Material: runs on the first page and after every instant navigation.
    document$.subscribe(start);
  } else if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
