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
//
// `window.attnHeatmap.html(weights, rows, cols, options)` writes, from data, the very
// markup that attnlab.plotting.interactive_heatmap writes in Python (tests/test_browser.py
// checks that the two strings are equal), and `window.attnHeatmap.render(target, ...)`
// puts it in place of `target` and makes it interactive: so a page's own script (the live
// model of "Watching heads learn") can redraw a heatmap the build drew first.
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

  // A figure drawn by `render` starts with one panel drawn; the others are drawn when
  // their button is first pressed (eight panels of 48 x 48 cells take a while to lay out).
  function fill(figure, panel) {
    var empty = figure.querySelector('.attn-heatmap-panel[data-panel="' + panel + '"]:empty');
    if (!empty || !figure.attnDraw) return;
    var holder = document.createElement("div");
    holder.innerHTML = figure.attnDraw(Number(panel));
    var drawn = holder.firstChild;
    empty.parentNode.replaceChild(drawn, empty);
    makeFocusable(drawn);
  }

  function select(button) {
    var figure = button.closest("[data-attn-heatmap]");
    if (!figure) return;
    var panel = button.getAttribute("data-panel");
    var buttons = figure.querySelectorAll(".attn-heatmap-select button");
    for (var i = 0; i < buttons.length; i++) {
      buttons[i].setAttribute("aria-pressed", buttons[i] === button ? "true" : "false");
    }
    fill(figure, panel);
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

  // -- Drawing from data: a port of plotting.interactive_heatmap and _panel_svg. --------

  var BLUES = [
    [0xf7, 0xfb, 0xff], [0xde, 0xeb, 0xf7], [0xc6, 0xdb, 0xef], [0x9e, 0xca, 0xe1],
    [0x6b, 0xae, 0xd6], [0x42, 0x92, 0xc6], [0x21, 0x71, 0xb5], [0x08, 0x51, 0x9c],
    [0x08, 0x30, 0x6b],
  ];
  var FONT = 12, TITLE_GAP = 30;

  // Python's round(): halves go to the even neighbour (Math.round takes them up).
  function roundHalfEven(x) {
    var r = Math.round(x);
    return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
  }

  // Python's f"{x:.{digits}f}": the exact binary value, ties to even (toFixed takes
  // them away from zero). toFixed(100) is exact, so it shows whether x is a tie.
  function fixed(x, digits) {
    var text = x.toFixed(digits);
    var exact = Math.abs(x).toFixed(100);
    var point = exact.indexOf(".");
    if (!/^50*$/.test(exact.slice(point + 1 + digits))) return text;
    var kept = exact.slice(0, digits ? point + 1 + digits : point);
    var last = Number(kept.charAt(kept.length - 1));
    if (last % 2 !== 0) return text; // rounding up reaches the even neighbour
    return (x < 0 ? "-" : "") + kept;
  }

  // Python's html.escape(text, quote=True).
  function escapeHtml(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;").replace(/'/g, "&#x27;");
  }

  function labelWidth(text) {
    var width = 0;
    for (var i = 0; i < text.length; i++) {
      var ch = text.charAt(i);
      width += "MWmw@%".indexOf(ch) >= 0 ? 12 : "ijlft.,:;!|'()[] ".indexOf(ch) >= 0 ? 4.5
        : ch !== ch.toLowerCase() ? 9.5 : 7.5;
    }
    return width;
  }

  function blues(position) {
    position = Math.min(Math.max(position, 0), 1) * (BLUES.length - 1);
    var low = Math.min(Math.floor(position), BLUES.length - 2);
    var frac = position - low, hex = "#";
    for (var c = 0; c < 3; c++) {
      var a = BLUES[low][c], b = BLUES[low + 1][c];
      hex += ("0" + roundHalfEven(a + (b - a) * frac).toString(16)).slice(-2);
    }
    return hex;
  }

  function maxOf(values) {
    return values.reduce(function (a, b) { return Math.max(a, b); }, -Infinity);
  }

  function panelSvg(matrix, rows, cols, o) {
    var tq = matrix.length, tk = matrix[0].length, cell = o.cell;
    var left = TITLE_GAP + roundHalfEven(maxOf(rows.map(labelWidth))) + 8;
    var longest = maxOf(cols.map(labelWidth));
    var top = 20 + roundHalfEven(longest * 0.71) + 10;
    var right = Math.max(4, roundHalfEven(longest * 0.71) - Math.floor(cell / 2) + 4);
    var width = left + tk * cell + right, height = top + tq * cell + 4;
    var span = o.vmax - o.vmin, name = escapeHtml(o.name);
    var parts = [
      '<div class="attn-heatmap-panel" data-panel="' + o.panel + '" data-name="' + name +
        '"' + (o.hidden ? " hidden" : "") + ">" +
        '<svg xmlns="http://www.w3.org/2000/svg" width="' + width + '" height="' + height +
        '" viewBox="0 0 ' + width + " " + height + '" font-size="' + FONT + '" ' +
        'style="display:block;margin:0 auto;max-width:none" role="group" aria-label="' +
        name + '">',
      "<title>" + name + "</title>",
      '<text x="' + (left + tk * cell / 2) + '" y="12" text-anchor="middle" ' +
        'fill="currentColor" font-weight="600">' + escapeHtml(o.xlabel) + "</text>",
      '<text transform="translate(13 ' + (top + tq * cell / 2) + ') rotate(-90)" ' +
        'text-anchor="middle" fill="currentColor" font-weight="600">' +
        escapeHtml(o.ylabel) + "</text>",
    ];
    var i, j;
    for (j = 0; j < tk; j++) {
      parts.push('<text class="attn-heatmap-col" data-k="' + j + '" transform="translate(' +
        (left + j * cell + cell / 2) + " " + (top - 6) + ') rotate(-45)" ' +
        'fill="currentColor">' + escapeHtml(cols[j]) + "</text>");
    }
    for (i = 0; i < tq; i++) {
      parts.push('<text class="attn-heatmap-row" data-q="' + i + '" x="' + (left - 8) +
        '" y="' + (top + i * cell + cell / 2) + '" text-anchor="end" ' +
        'dominant-baseline="central" fill="currentColor">' + escapeHtml(rows[i]) + "</text>");
    }
    for (i = 0; i < tq; i++) {
      for (j = 0; j < tk; j++) {
        var value = matrix[i][j];
        var position = span > 0 ? (value - o.vmin) / span : 0;
        var x = left + j * cell, y = top + i * cell;
        var readout = "query " + i + " (" + rows[i] + ") \u2192 key " + j + " (" + cols[j] +
          "): " + fixed(value, 4);
        parts.push('<g class="attn-heatmap-cell" data-q="' + i + '" data-k="' + j +
          '" data-w="' + fixed(value, 4) + '"><title>' + escapeHtml(readout) + "</title>" +
          '<rect x="' + x + '" y="' + y + '" width="' + cell + '" height="' + cell +
          '" fill="' + blues(position) + '" stroke="#ffffff" stroke-width="1"/>' +
          (o.annotate
            ? '<text x="' + (x + cell / 2) + '" y="' + (y + cell / 2) +
              '" text-anchor="middle" dominant-baseline="central" font-size="11" ' +
              'pointer-events="none" fill="' + (position > 0.55 ? "#ffffff" : "#1a1a1a") +
              '">' + fixed(value, 2) + "</text>"
            : "") +
          "</g>");
      }
    }
    parts.push('<rect class="attn-heatmap-outline" x="' + (left + 1.5) + '" y="' +
      (top + 1.5) + '" width="' + (cell - 3) + '" height="' + (cell - 3) +
      '" fill="none" stroke-width="3" visibility="hidden" pointer-events="none"/>');
    parts.push("</svg></div>");
    return parts.join("");
  }

  // weights: panels of rows of numbers, [panel][query][key] (the Python function's
  // (heads, t_q, t_k) layout; give layer-major panels and their names for several layers).
  // options: title, panelNames, xlabel, ylabel, vmin, vmax, cellSize, annotate, with the
  // Python function's defaults. Checks only what a page's own script could get wrong.
  function html(weights, rows, cols, options) {
    return markup(spec(weights, rows, cols, options), null);
  }

  // The checked arguments, the names of the panels and a function that draws one panel.
  function spec(weights, rows, cols, options) {
    var o = options || {};
    if (!weights.length || !weights[0].length || !weights[0][0].length) {
      throw new Error("weights is empty: there is no weight to draw");
    }
    if (rows.length !== weights[0].length || cols.length !== weights[0][0].length) {
      throw new Error("rows and cols must have one label per query and per key");
    }
    var names = o.panelNames || (weights.length === 1 ? ["weights"]
      : weights.map(function (_, h) { return "head " + (h + 1); }));
    if (names.length !== weights.length) throw new Error("give one name per panel");
    var vmin = o.vmin === undefined ? 0 : o.vmin;
    var vmax = o.vmax === undefined || o.vmax === null
      ? maxOf(weights.map(function (p) { return maxOf(p.map(maxOf)); })) : o.vmax;
    var title = o.title === undefined ? null : o.title;
    rows = rows.map(String);
    cols = cols.map(String);
    function panel(index) {
      return panelSvg(weights[index], rows, cols, {
        panel: index, name: names[index], vmin: vmin, vmax: vmax,
        xlabel: o.xlabel === undefined ? "key" : o.xlabel,
        ylabel: o.ylabel === undefined ? "query" : o.ylabel,
        hidden: index > 0, cell: o.cellSize === undefined ? 40 : o.cellSize,
        annotate: o.annotate === undefined ? true : o.annotate,
      });
    }
    return {names: names, title: title, panel: panel};
  }

  // The figure; with `only`, that panel alone is drawn, the others left empty.
  function markup(s, only) {
    var names = s.names, title = s.title;
    var label = escapeHtml(title || "attention weights");
    var out = [
      '<figure class="attn-heatmap" data-attn-heatmap aria-label="' + label + '" ' +
        'style="display:block;width:auto;max-width:100%;margin:1em 0;text-align:center">',
    ];
    if (title !== null) {
      out.push('<figcaption style="font-weight:600;font-style:normal;max-width:none;' +
        'margin:0 0 .4em">' + escapeHtml(title) + "</figcaption>");
    }
    if (names.length > 1) {
      out.push('<div class="attn-heatmap-select" role="group" aria-label="choose a panel" ' +
        'hidden style="flex-wrap:wrap;justify-content:center;gap:.3em;margin:0 0 .5em">');
      names.forEach(function (name, panel) {
        out.push('<button type="button" data-panel="' + panel + '" aria-pressed="' +
          (panel === 0 ? "true" : "false") + '">' + escapeHtml(name) + "</button>");
      });
      out.push("</div>");
      out.push('<noscript><p class="attn-heatmap-noscript" data-search-exclude ' +
        'style="font-size:.8em;margin:0 0 .5em">Showing ' + escapeHtml(names[0]) +
        ", the first of " + names.length + " panels; the others (" +
        escapeHtml(names.slice(1).join(", ")) + ") need JavaScript to be shown.</p></noscript>");
    }
    out.push('<div class="attn-heatmap-scroll" ' +
      'style="overflow-x:auto;max-width:100%;padding:0 0 .3em">');
    names.forEach(function (name, panel) {
      out.push(only === null || only === panel ? s.panel(panel)
        : '<div class="attn-heatmap-panel" data-panel="' + panel + '" data-name="' +
          escapeHtml(name) + '" hidden></div>');
    });
    out.push("</div>");
    out.push('<p class="attn-heatmap-hint" hidden data-search-exclude ' +
      'style="font-size:.75em;margin:.1em 0 0">' +
      "Wider than the screen: scroll sideways to see every column.</p>");
    out.push('<output class="attn-heatmap-readout" aria-live="polite" hidden ' +
      'data-search-exclude style="min-height:1.6em;font-size:.8em;margin:.2em 0 0">' +
      "Point at a cell, tap it, or focus it (Tab, then the arrow keys) to read its " +
      "weight.</output>");
    out.push("</figure>");
    return out.join("");
  }

  // Replace `target` (a heatmap figure, or any element) by a heatmap of `weights`, made
  // interactive; a figure keeps the panel its reader had chosen. Only that panel is drawn
  // now, each other one when its button is first pressed: the figure ends up as `html`
  // writes it. Returns the new figure.
  function render(target, weights, rows, cols, options) {
    var s = spec(weights, rows, cols, options);
    var pressed = target.querySelector(".attn-heatmap-select button[aria-pressed=true]");
    var chosen = pressed ? Number(pressed.getAttribute("data-panel")) : 0;
    if (!(chosen < s.names.length)) chosen = 0;
    var holder = document.createElement("div");
    holder.innerHTML = markup(s, chosen);
    var figure = holder.firstChild;
    figure.attnDraw = s.panel;
    target.parentNode.replaceChild(figure, target);
    addStyle();
    reveal(figure.parentNode);
    var button = figure.querySelector('.attn-heatmap-select button[data-panel="' + chosen + '"]');
    if (button && chosen !== 0) select(button);
    return figure;
  }

  window.attnHeatmap = {html: html, render: render, fixed: fixed, escape: escapeHtml};

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
