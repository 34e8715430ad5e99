// Interactive attention heatmaps made by attnlab.plotting.interactive_heatmap.
//
// Each heatmap is a <figure data-attn-heatmap> holding one SVG per panel (head, or layer
// and head), a hidden row of buttons, a hidden scroll hint and a hidden read-out. Without
// this script the first panel shows, every cell still has a <title> tooltip and a
// <noscript> line names the other panels. With it, the buttons switch panels, the cells
// can be reached with the keyboard (Tab to the panel's active cell, then the arrow keys,
// Home and End), the read-out names the cell under the pointer, tapped or focused, by
// position and token, and a line says when the drawing is wider than its box.
//
// Listeners are delegated from `document`, so they are added once and serve heatmaps that
// Material's instant navigation swaps in later. The controls of a page are revealed when
// the page's DOM is ready, and again on every emission of `document$` (Material's page
// observable) where there is one: opened from file://, Material's instant navigation
// never emits, and the DOM-ready start alone makes the figures work. Revealing is
// idempotent (`data-attn-ready`). Plain JavaScript, no dependencies.
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
    // The outline is one rect drawn after every cell, so no neighbour paints over it.
    ".attn-heatmap-outline{stroke:var(--md-accent-fg-color,#ff6e42)}",
    ".attn-heatmap-cell{outline:none}",
    ".attn-heatmap-row.is-active,.attn-heatmap-col.is-active{font-weight:700;",
    "fill:var(--md-accent-fg-color,#ff6e42)}",
    ".attn-heatmap-hint{opacity:.75}",
  ].join("");

  function addStyle() {
    if (document.getElementById(STYLE_ID)) return;
    var style = document.createElement("style");
    style.id = STYLE_ID;
    style.textContent = CSS;
    document.head.appendChild(style);
  }

  function unhide(element, display) {
    if (!element) return;
    element.hidden = false;
    element.style.display = display;
  }

  // One cell of each panel is in the Tab order (roving tabindex); the arrow keys move it.
  function makeFocusable(panel) {
    var cells = panel.querySelectorAll(".attn-heatmap-cell");
    for (var i = 0; i < cells.length; i++) {
      cells[i].setAttribute("tabindex", i === 0 ? "0" : "-1");
    }
  }

  function updateHint(figure) {
    var box = figure.querySelector(".attn-heatmap-scroll");
    var hint = figure.querySelector(".attn-heatmap-hint");
    if (!box || !hint) return;
    var wide = box.scrollWidth > box.clientWidth + 1;
    hint.hidden = !wide;
    hint.style.display = wide ? "block" : "none";
  }

  function reveal(root) {
    var figures = root.querySelectorAll("[data-attn-heatmap]:not([data-attn-ready])");
    for (var i = 0; i < figures.length; i++) {
      var figure = figures[i];
      unhide(figure.querySelector(".attn-heatmap-select"), "flex");
      unhide(figure.querySelector(".attn-heatmap-readout"), "block");
      var panels = figure.querySelectorAll(".attn-heatmap-panel");
      for (var j = 0; j < panels.length; j++) makeFocusable(panels[j]);
      figure.setAttribute("data-attn-ready", "");
      updateHint(figure);
    }
  }

  function updateHints() {
    var figures = document.querySelectorAll("[data-attn-heatmap][data-attn-ready]");
    for (var i = 0; i < figures.length; i++) updateHint(figures[i]);
  }

  function label(panel, cls, attr, index) {
    return panel.querySelector("." + cls + "[" + attr + '="' + index + '"]');
  }

  function clearActive(figure) {
    var active = figure.querySelectorAll(".is-active");
    for (var i = 0; i < active.length; i++) active[i].classList.remove("is-active");
    var outlines = figure.querySelectorAll(".attn-heatmap-outline");
    for (var j = 0; j < outlines.length; j++) outlines[j].setAttribute("visibility", "hidden");
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
    var rect = cell.querySelector("rect");
    var outline = panel.querySelector(".attn-heatmap-outline");
    if (rect && outline) {
      outline.setAttribute("x", parseFloat(rect.getAttribute("x")) + 1.5);
      outline.setAttribute("y", parseFloat(rect.getAttribute("y")) + 1.5);
      outline.setAttribute("visibility", "visible");
    }
    var readout = figure.querySelector(".attn-heatmap-readout");
    if (!readout) return;
    // Positions as the tensor is indexed, and the tokens: a repeated token is ambiguous.
    var text =
      "query " + q + (row ? " (" + row.textContent + ")" : "") +
      " \u2192 key " + k + (col ? " (" + col.textContent + ")" : "") +
      ": weight " + cell.getAttribute("data-w");
    var named = figure.querySelector(".attn-heatmap-select");
    readout.textContent = (named ? panel.getAttribute("data-name") + ", " : "") + text;
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
    updateHint(figure);
  }

  function cellOf(event) {
    var target = event.target;
    return target && target.closest ? target.closest(".attn-heatmap-cell") : null;
  }

  // The cell the key moves to from `cell`, or null at an edge (or for another key).
  function neighbour(cell, key) {
    var panel = cell.closest(".attn-heatmap-panel");
    var q = Number(cell.getAttribute("data-q"));
    var k = Number(cell.getAttribute("data-k"));
    var rows = panel.querySelectorAll(".attn-heatmap-row").length;
    var cols = panel.querySelectorAll(".attn-heatmap-col").length;
    var moves = {
      ArrowUp: [q - 1, k],
      ArrowDown: [q + 1, k],
      ArrowLeft: [q, k - 1],
      ArrowRight: [q, k + 1],
      Home: [q, 0],
      End: [q, cols - 1],
    };
    var to = moves[key];
    if (!to || to[0] < 0 || to[0] >= rows || to[1] < 0 || to[1] >= cols) return null;
    return panel.querySelector(
      '.attn-heatmap-cell[data-q="' + to[0] + '"][data-k="' + to[1] + '"]'
    );
  }

  document.addEventListener("mouseover", function (event) {
    var cell = cellOf(event);
    if (cell) show(cell);
  });
  document.addEventListener("focusin", function (event) {
    var cell = cellOf(event);
    if (cell) show(cell);
  });
  document.addEventListener("keydown", function (event) {
    var cell = cellOf(event);
    if (!cell || event.altKey || event.ctrlKey || event.metaKey) return;
    var next = neighbour(cell, event.key);
    if (!next) return;
    event.preventDefault(); // the arrows move between cells, not the page
    cell.setAttribute("tabindex", "-1");
    next.setAttribute("tabindex", "0");
    next.focus();
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
  window.addEventListener("resize", updateHints);

  function start() {
    addStyle();
    reveal(document);
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
  if (typeof document$ !== "undefined" && document$.subscribe) {
    // Material: emits on the first page and after every instant navigation.
    document$.subscribe(start);
  }
})();
