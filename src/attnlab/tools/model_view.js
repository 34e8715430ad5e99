// The model view of attnlab.tools.model_view: every attention head of a decoder at once.
//
// ModelView.html() writes a <div data-attn-model-view> holding its data as JSON (one entry
// per text; the encoding is in model_view.py's docstring). This script builds the view in
// that div: buttons for the texts, a layer range, a strip of the text's tokens, a grid of
// thumbnails (one per layer and query head, the query heads grouped under the key/value
// head they share) and, for a chosen head, its large view: lines from each token to the
// tokens it attends to, and its heatmap.
//
// Speed: pointing at a token lights its row in all thumbnails by setting one CSS property
// on the grid (every thumbnail's band is placed by it), so no thumbnail is redrawn; the
// large view redraws one canvas. Data are decoded once per text (zlib, with the browser's
// DecompressionStream), when the text is first shown.
//
// Keyboard: Tab reaches the text buttons, the layer range, the token strip, the grid and
// the large view's two drawings; in the strip, the grid and the drawings the arrow keys,
// Home and End move, Enter or Space opens a head or pins a token, Escape closes the large
// view. Taps work as clicks. Plain JavaScript, no dependencies; started when the DOM is
// ready and on every emission of Material's `document$` (instant navigation); each view
// is built once (`data-attn-mv-ready`). The same file runs inline in ModelView.standalone().
(function () {
  "use strict";

  var STYLE_ID = "attn-mv-style";
  var ACCENT = "255,110,66";
  var CSS = [
    ".attn-mv{margin:1em 0;font-size:.8rem}",
    ".attn-mv button{font:inherit;cursor:pointer}",
    ".attn-mv-controls{display:flex;flex-wrap:wrap;gap:.4em .8em;align-items:center;margin-bottom:.5em}",
    ".attn-mv-texts{display:flex;flex-wrap:wrap;gap:.3em}",
    ".attn-mv-texts button,.attn-mv-close{padding:.2em .6em;border-radius:.2em;background:transparent;",
    "color:inherit;border:1px solid var(--md-default-fg-color--lighter,#999)}",
    ".attn-mv-texts button[aria-pressed=true]{color:var(--md-primary-bg-color,#fff);",
    "background:var(--md-primary-fg-color,#3f51b5);border-color:var(--md-primary-fg-color,#3f51b5)}",
    ".attn-mv select{font:inherit;color:inherit;background:transparent}",
    ".attn-mv-tokens{max-height:9.5em;overflow-y:auto;line-height:1.9;padding:.3em;",
    "border:1px solid var(--md-default-fg-color--lightest,#ddd);border-radius:.2em;overflow-wrap:anywhere}",
    ".attn-mv-token{padding:.1em .15em;border-radius:.2em;white-space:pre;cursor:default;",
    "background:var(--md-code-bg-color,#f5f5f5);margin-right:1px}",
    ".attn-mv-token.is-lit{background:rgba(" + ACCENT + ",.35);outline:1px solid rgb(" + ACCENT + ")}",
    ".attn-mv-token.is-pinned{outline:2px solid rgb(" + ACCENT + ")}",
    ".attn-mv-readout{min-height:2.6em;margin:.4em 0;padding:.2em .5em;border-radius:.2em;",
    "background:var(--md-code-bg-color,#f5f5f5);font-variant-numeric:tabular-nums}",
    ".attn-mv-head,.attn-mv-layer{display:grid;grid-template-columns:2.2em repeat(3,minmax(0,1fr));",
    "gap:0 .5em;align-items:center}",
    ".attn-mv-layer[hidden]{display:none}",
    ".attn-mv-grid{max-width:40em}",
    ".attn-mv-group{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:2px;margin:1px 0}",
    ".attn-mv-head .attn-mv-group{text-align:center;font-size:.85em;opacity:.8}",
    ".attn-mv-kv{grid-column:1/4;border-bottom:1px solid var(--md-default-fg-color--lighter,#999)}",
    ".attn-mv-lname{text-align:right;font-size:.85em;opacity:.8;font-variant-numeric:tabular-nums}",
    ".attn-mv-thumb{position:relative;display:block;width:100%;aspect-ratio:1;padding:0;margin:0;",
    "border:1px solid var(--md-default-fg-color--lightest,#ddd);background:#f7fbff;overflow:hidden}",
    ".attn-mv-thumb:focus-visible,.attn-mv-thumb[aria-pressed=true]{outline:2px solid rgb(" + ACCENT + ");",
    "outline-offset:1px;z-index:1}",
    ".attn-mv-thumb{background-repeat:no-repeat;background-origin:content-box;image-rendering:pixelated}",
    // A band covers its thumbnail and is clipped to one row by its view's own rule: one
    // rule moves all bands, with no layout, exact at any size (a row may be under 1 px).
    ".attn-mv-band{position:absolute;inset:0;display:none;pointer-events:none;",
    "background:rgba(" + ACCENT + ",.6)}",
    ".attn-mv-live{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0)}",
    ".attn-mv-grid.is-lit .attn-mv-band{display:block}",
    ".attn-mv-detail{margin:.6em 0;padding:.5em;border:1px solid var(--md-default-fg-color--lighter,#999);",
    "border-radius:.2em}",
    ".attn-mv-detail-title{display:flex;gap:.8em;align-items:baseline;justify-content:space-between}",
    ".attn-mv-detail-title strong{font-size:1.05em}",
    ".attn-mv-panes{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}",
    ".attn-mv-lines-box{flex:1 1 18em;min-width:0;max-height:30em;overflow:auto}",
    ".attn-mv-heat-box{position:relative;flex:0 1 20em;min-width:0;max-width:100%}",
    ".attn-mv-heat-box canvas{display:block;width:100%;aspect-ratio:1;image-rendering:pixelated;",
    "border:1px solid var(--md-default-fg-color--lightest,#ddd)}",
    ".attn-mv canvas:focus-visible{outline:2px solid rgb(" + ACCENT + ")}",
    ".attn-mv-cursor{position:absolute;pointer-events:none;box-shadow:0 0 0 2px rgb(" + ACCENT + ")}",
    ".attn-mv-fallback{display:none}",
  ].join("");

  // The site's heatmap colours (matplotlib's Blues), 256 steps.
  var STOPS = [[247, 251, 255], [222, 235, 247], [198, 219, 239], [158, 202, 225],
    [107, 174, 214], [66, 146, 198], [33, 113, 181], [8, 81, 156], [8, 48, 107]];
  var LUT = (function () {
    var lut = new Uint8ClampedArray(256 * 4);
    for (var v = 0; v < 256; v++) {
      var x = v / 255 * (STOPS.length - 1), lo = Math.min(Math.floor(x), STOPS.length - 2);
      var f = x - lo;
      for (var c = 0; c < 3; c++) lut[4 * v + c] = Math.round(STOPS[lo][c] + (STOPS[lo + 1][c] - STOPS[lo][c]) * f);
      lut[4 * v + 3] = 255;
    }
    return lut;
  })();

  function addStyle() {
    if (document.getElementById(STYLE_ID)) return;
    var style = document.createElement("style");
    style.id = STYLE_ID;
    style.textContent = CSS;
    document.head.appendChild(style);
  }

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    for (var name in attrs || {}) node.setAttribute(name, attrs[name]);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function shown(token) {
    // Spaces and line ends made visible, so that " the" and "\n" can be told apart.
    return token.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5") || "\u2205";
  }

  // -- data -----------------------------------------------------------------------------

  var decoded = typeof WeakMap !== "undefined" ? new WeakMap() : null;

  function inflate(base64) {
    var raw = atob(base64), bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    if (typeof DecompressionStream === "undefined") {
      return Promise.reject(new Error("this browser has no DecompressionStream"));
    }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer().then(function (buffer) { return new Uint8Array(buffer); });
  }

  // An entry's arrays: thumbnails (layers, heads, cells, cells) and the large view's rows.
  function decode(entry) {
    if (decoded && decoded.has(entry)) return decoded.get(entry);
    var promise = inflate(entry.data).then(function (bytes) {
      var heads = entry.layers * entry.heads, t = entry.t, k = entry.k;
      var nThumb = entry.thumbs ? heads * entry.cells * entry.cells : 0;
      var out = {entry: entry, thumbs: bytes.subarray(0, nThumb)};
      if (entry.mode === "full") {
        var tri = t * (t + 1) / 2;
        out.full = bytes.subarray(nThumb, nThumb + heads * tri);
        if (nThumb + heads * tri !== bytes.length) throw new Error("data do not fit their sizes");
        if (!entry.thumbs) out.thumbs = unpack(out.full, heads, t);
      } else {
        var n = heads * t * k, keys = new Uint16Array(n);
        if (nThumb + 3 * n !== bytes.length) throw new Error("data do not fit their sizes");
        var low = nThumb, high = nThumb + n; // each key: its distance from the row's last
        for (var r = 0; r < n; r += k) {
          var at = 0;
          for (var j = 0; j < k; j++) { at += bytes[low + r + j] | bytes[high + r + j] << 8; keys[r + j] = at; }
        }
        out.keys = keys;
        out.values = bytes.subarray(nThumb + 2 * n, nThumb + 3 * n);
      }
      return out;
    });
    if (decoded) decoded.set(entry, promise);
    return promise;
  }

  // Full lower-triangular maps (row i: i + 1 weights) as square ones, (heads, t, t).
  function unpack(full, heads, t) {
    var square = new Uint8Array(heads * t * t), at = 0;
    for (var head = 0; head < heads; head++) {
      for (var i = 0; i < t; i++) {
        square.set(full.subarray(at, at + i + 1), (head * t + i) * t);
        at += i + 1;
      }
    }
    return square;
  }

  // Row i of head (l, h): {keys, weights} of the weights kept, and the rest's mass.
  function row(data, l, h, i) {
    var e = data.entry, t = e.t, keys = [], weights = [], sum = 0, j;
    var head = l * e.heads + h;
    if (data.full) {
      var start = head * (t * (t + 1) / 2) + i * (i + 1) / 2;
      for (j = 0; j <= i; j++) { keys.push(j); weights.push(data.full[start + j] / 255); }
    } else {
      var base = (head * t + i) * e.k;
      for (j = 0; j < e.k; j++) {
        var w = data.values[base + j] / 255;
        if (w > 0 && data.keys[base + j] <= i) { keys.push(data.keys[base + j]); weights.push(w); }
      }
    }
    for (j = 0; j < weights.length; j++) sum += weights[j];
    return {keys: keys, weights: weights, rest: data.full ? 0 : Math.max(0, 1 - sum),
      others: i + 1 - keys.length};
  }

  // -- one view -------------------------------------------------------------------------

  function View(root) {
    this.root = root;
    this.entries = JSON.parse(root.querySelector(".attn-mv-data").textContent);
    this.data = null;
    this.text = -1;
    this.lit = null; // the token lit by pointer or focus
    this.pinned = null; // the token lit by a click or tap, kept when the pointer leaves
    this.head = null; // [l, h] of the large view
    this.cell = [0, 0]; // the heatmap's keyboard cursor
    this.pointing = false; // the pointer is on the large view's lines
    var sheet = el("style");
    root.appendChild(sheet);
    root.setAttribute("data-attn-mv-id", String(++View.count));
    var scope = '[data-attn-mv-id="' + View.count + '"] ';
    sheet.sheet.insertRule(scope + ".attn-mv-band{}", 0);
    sheet.sheet.insertRule(scope + ".attn-mv-thumb{}", 1);
    this.band = sheet.sheet.cssRules[0].style; // moves every band of this view at once
    this.sheet = sheet.sheet.cssRules[1].style; // every thumbnail's image: one for all
    this.build();
    this.selectText(0);
  }

  View.count = 0;

  View.prototype.build = function () {
    var self = this, root = this.root, first = this.entries[0];
    var fallback = root.querySelector(".attn-mv-fallback");
    if (fallback) fallback.hidden = true;
    var controls = el("div", {"class": "attn-mv-controls"});
    var texts = el("div", {"class": "attn-mv-texts", role: "group", "aria-label": "Text"});
    this.entries.forEach(function (entry, n) {
      var button = el("button", {type: "button", "aria-pressed": "false", "data-text": n},
        entry.name + " (" + entry.t + ")");
      button.addEventListener("click", function () { self.selectText(n); });
      texts.appendChild(button);
    });
    controls.appendChild(texts);
    var range = el("span", {"class": "attn-mv-range"});
    this.from = el("select", {"aria-label": "First layer shown"});
    this.to = el("select", {"aria-label": "Last layer shown"});
    for (var l = 0; l < first.layers; l++) {
      this.from.appendChild(el("option", {value: l}, "L" + l));
      this.to.appendChild(el("option", {value: l}, "L" + l));
    }
    this.to.value = String(first.layers - 1);
    this.from.addEventListener("change", function () { self.showLayers(); });
    this.to.addEventListener("change", function () { self.showLayers(); });
    range.appendChild(document.createTextNode("Layers "));
    range.appendChild(this.from);
    range.appendChild(document.createTextNode(" to "));
    range.appendChild(this.to);
    controls.appendChild(range);
    root.appendChild(controls);

    this.tokens = el("div", {"class": "attn-mv-tokens", role: "toolbar", "aria-label": "Tokens: " +
      "point at, focus or tap one to light its row in every head"});
    root.appendChild(this.tokens);
    this.readout = el("p", {"class": "attn-mv-readout"});
    root.appendChild(this.readout);
    // What the keyboard changes is read out by screen readers; pointer moves are not.
    this.live = el("p", {"class": "attn-mv-live", "aria-live": "polite"});
    root.appendChild(this.live);

    this.detail = el("section", {"class": "attn-mv-detail", hidden: ""});
    var title = el("div", {"class": "attn-mv-detail-title"});
    this.detailName = el("strong");
    this.close = el("button", {type: "button", "class": "attn-mv-close"}, "Close");
    this.close.addEventListener("click", function () { self.closeHead(true); });
    title.appendChild(this.detailName);
    title.appendChild(this.close);
    this.detail.appendChild(title);
    var panes = el("div", {"class": "attn-mv-panes"});
    var linesBox = el("div", {"class": "attn-mv-lines-box"});
    this.lines = el("canvas", {tabindex: "0", role: "img", "class": "attn-mv-lines",
      "aria-label": "Lines from each token (left) to the tokens it attends to (right); " +
      "arrow keys choose the token"});
    linesBox.appendChild(this.lines);
    var heatBox = el("div", {"class": "attn-mv-heat-box"});
    this.heat = el("canvas", {tabindex: "0", role: "img", "class": "attn-mv-heat",
      "aria-label": "Heatmap of the head: a row per query, a column per key; arrow keys move"});
    this.cursor = el("div", {"class": "attn-mv-cursor", hidden: ""});
    heatBox.appendChild(this.heat);
    heatBox.appendChild(this.cursor);
    panes.appendChild(linesBox);
    panes.appendChild(heatBox);
    this.detail.appendChild(panes);
    root.appendChild(this.detail);

    this.grid = el("div", {"class": "attn-mv-grid", role: "group",
      "aria-label": "Every head: a row per layer; arrow keys move, Enter opens a head"});
    var header = el("div", {"class": "attn-mv-head", "aria-hidden": "true"});
    header.appendChild(el("span"));
    var group = first.heads / first.kvHeads, g, h;
    for (g = 0; g < first.kvHeads; g++) {
      var names = el("div", {"class": "attn-mv-group"});
      names.appendChild(el("span", {"class": "attn-mv-kv"}, "kv head " + g));
      for (h = g * group; h < (g + 1) * group; h++) names.appendChild(el("span", {}, "H" + h));
      header.appendChild(names);
    }
    this.grid.appendChild(header);
    this.thumbs = [];
    for (l = 0; l < first.layers; l++) {
      var line = el("div", {"class": "attn-mv-layer", "data-layer": l});
      line.appendChild(el("span", {"class": "attn-mv-lname", "aria-hidden": "true"}, "L" + l));
      for (g = 0; g < first.kvHeads; g++) {
        var cells = el("div", {"class": "attn-mv-group"});
        for (h = g * group; h < (g + 1) * group; h++) {
          var thumb = el("button", {type: "button", "class": "attn-mv-thumb", tabindex: "-1",
            "data-layer": l, "data-head": h, "aria-pressed": "false",
            "aria-label": "Layer " + l + ", head " + h + " (kv head " + g + ")"});
          thumb.appendChild(el("span", {"class": "attn-mv-band"}));
          cells.appendChild(thumb);
          this.thumbs.push(thumb);
        }
        line.appendChild(cells);
      }
      this.grid.appendChild(line);
    }
    this.thumbs[0].tabIndex = 0;
    root.appendChild(this.grid);
    this.listen();
  };

  View.prototype.listen = function () {
    var self = this;
    // Keys with a modifier belong to the browser (Alt+Left: back), and nothing answers
    // before the first text is decoded.
    function ours(event) {
      if (!self.data || event.altKey || event.ctrlKey || event.metaKey) return false;
      self.keyboard = true;
      return true;
    }
    this.root.addEventListener("pointerdown", function (event) {
      self.keyboard = false;
      self.touch = event.pointerType === "touch";
    });
    this.root.addEventListener("mousemove", function () { self.keyboard = false; });
    function tokenOf(target) {
      var span = target.closest && target.closest(".attn-mv-token");
      return span ? Number(span.getAttribute("data-i")) : null;
    }
    this.tokens.addEventListener("mouseover", function (event) {
      var i = tokenOf(event.target);
      if (i !== null) self.light(i);
    });
    this.tokens.addEventListener("mouseleave", function () { self.light(null); });
    this.tokens.addEventListener("focusin", function (event) {
      var i = tokenOf(event.target);
      if (i !== null) self.light(i);
    });
    this.tokens.addEventListener("focusout", function () { self.light(null); });
    this.tokens.addEventListener("click", function (event) {
      var i = tokenOf(event.target);
      if (i === null || !self.data) return;
      self.pin(i);
      if (self.touch) self.light(null, true); // a tap has no hover to keep: the pin decides
    });
    this.tokens.addEventListener("keydown", function (event) {
      var i = tokenOf(event.target);
      if (i === null || !ours(event)) return;
      var next = moveIndex(event.key, i, self.data.entry.t, 1);
      if (event.key === "Enter" || event.key === " ") { self.pin(i); event.preventDefault(); return; }
      if (next === null) return;
      event.preventDefault();
      self.focusToken(next);
    });
    this.grid.addEventListener("click", function (event) {
      var thumb = event.target.closest && event.target.closest(".attn-mv-thumb");
      if (thumb && self.data) self.openHead(Number(thumb.getAttribute("data-layer")), Number(thumb.getAttribute("data-head")));
    });
    this.grid.addEventListener("keydown", function (event) {
      var thumb = event.target.closest && event.target.closest(".attn-mv-thumb");
      if (!thumb || !ours(event)) return;
      var e = self.data.entry, l = Number(thumb.getAttribute("data-layer"));
      var h = Number(thumb.getAttribute("data-head")), lo = Number(self.from.value);
      var hi = Math.max(lo, Number(self.to.value)), key = event.key;
      if (key === "ArrowLeft") h = Math.max(0, h - 1);
      else if (key === "ArrowRight") h = Math.min(e.heads - 1, h + 1);
      else if (key === "ArrowUp") l = Math.max(lo, l - 1);
      else if (key === "ArrowDown") l = Math.min(hi, l + 1);
      else if (key === "Home") h = 0;
      else if (key === "End") h = e.heads - 1;
      else if (key === "Enter" || key === " ") {
        event.preventDefault(); // the button's own click would follow on key up
        self.openHead(l, h);
        return;
      } else if (key === "Escape") { self.closeHead(false); return; } else return;
      event.preventDefault();
      self.focusThumb(l, h);
    });
    this.detail.addEventListener("keydown", function (event) {
      if (event.key === "Escape" && ours(event)) { event.preventDefault(); self.closeHead(true); }
    });
    function lineAt(event) {
      var rect = self.lines.getBoundingClientRect();
      return Math.max(0, Math.min(self.data.entry.t - 1, Math.floor((event.clientY - rect.top - 4) / self.rowH)));
    }
    this.lines.addEventListener("mousemove", function (event) {
      if (!self.data) return;
      self.pointing = true; // the pointer is on the lines: do not scroll them under it
      self.light(lineAt(event));
    });
    this.lines.addEventListener("mouseleave", function () { self.pointing = false; self.light(null); });
    this.lines.addEventListener("click", function (event) { if (self.data) self.pin(lineAt(event)); });
    this.lines.addEventListener("pointerdown", function () { self.pointing = true; });
    this.lines.addEventListener("keydown", function (event) {
      if (!ours(event)) return;
      self.pointing = false;
      var i = self.current(), t = self.data.entry.t;
      var next = moveIndex(event.key, i === null ? -1 : i, t, 0);
      if (next === null) return;
      event.preventDefault();
      self.pin(next, true);
    });
    function cellAt(event) {
      var rect = self.heat.getBoundingClientRect(), t = self.data.entry.t;
      var i = Math.floor((event.clientY - rect.top) / rect.height * t);
      var j = Math.floor((event.clientX - rect.left) / rect.width * t);
      return [Math.max(0, Math.min(t - 1, i)), Math.max(0, Math.min(t - 1, j))];
    }
    this.heat.addEventListener("mousemove", function (event) { if (self.head) self.pointCell(cellAt(event)); });
    this.heat.addEventListener("click", function (event) { if (self.head) self.pointCell(cellAt(event)); });
    this.heat.addEventListener("mouseleave", function () { self.cursor.hidden = true; self.say(); });
    this.heat.addEventListener("keydown", function (event) {
      if (!ours(event)) return;
      var t = self.data.entry.t, i = self.cell[0], j = self.cell[1], key = event.key;
      if (key === "ArrowUp") i = Math.max(0, i - 1);
      else if (key === "ArrowDown") i = Math.min(t - 1, i + 1);
      else if (key === "ArrowLeft") j = Math.max(0, j - 1);
      else if (key === "ArrowRight") j = Math.min(t - 1, j + 1);
      else if (key === "Home") j = 0;
      else if (key === "End") j = i;
      else return;
      event.preventDefault();
      self.pointCell([i, j]);
    });
    this.heat.addEventListener("focus", function () { if (self.head) self.pointCell(self.cell); });
    this.heat.addEventListener("blur", function () { self.cursor.hidden = true; });
    window.addEventListener("resize", function () { if (self.head) self.drawLines(); });
  };

  // Arrow keys, Home and End over positions 0..n-1 (step: the first key moves from -1).
  function moveIndex(key, i, n) {
    if (key === "ArrowLeft" || key === "ArrowUp") return Math.max(0, i - 1);
    if (key === "ArrowRight" || key === "ArrowDown") return Math.min(n - 1, i + 1);
    if (key === "Home") return 0;
    if (key === "End") return n - 1;
    return null;
  }

  View.prototype.selectText = function (n) {
    var self = this, entry = this.entries[n];
    this.text = n;
    Array.prototype.forEach.call(this.root.querySelectorAll(".attn-mv-texts button"), function (b) {
      b.setAttribute("aria-pressed", String(Number(b.getAttribute("data-text")) === n));
    });
    this.root.setAttribute("aria-busy", "true");
    return decode(entry).then(function (data) {
      if (self.text !== n) return;
      self.data = data;
      self.lit = self.pinned = null;
      self.cell = [0, 0];
      self.fillTokens();
      self.drawThumbs();
      self.grid.style.setProperty("--mv-cells", String(entry.cells));
      self.light(null, true);
      if (self.head) self.openHead(self.head[0], self.head[1], true);
      self.root.removeAttribute("aria-busy");
      self.root.setAttribute("data-attn-mv-text", String(n));
    }, function (error) {
      self.root.removeAttribute("aria-busy");
      self.readout.textContent = "The data could not be read: " + (error.message || error);
    });
  };

  View.prototype.fillTokens = function () {
    var strip = this.tokens, frag = document.createDocumentFragment();
    strip.textContent = "";
    this.data.entry.tokens.forEach(function (token, i) {
      frag.appendChild(el("span", {"class": "attn-mv-token", "data-i": i, role: "button",
        "aria-pressed": "false",
        tabindex: i === 0 ? "0" : "-1", title: "token " + i}, shown(token)));
    });
    strip.appendChild(frag);
    this.spans = strip.children;
  };

  // Every thumbnail is one tile of a single image (a sheet of layers x heads tiles), which
  // each thumbnail shows as its background: one bitmap to draw, not one canvas each.
  View.prototype.drawThumbs = function () {
    var data = this.data, e = data.entry, n = e.cells, size = n * n;
    var sheet = document.createElement("canvas");
    sheet.width = e.heads * n;
    sheet.height = e.layers * n;
    var ctx = sheet.getContext("2d"), image = ctx.createImageData(sheet.width, sheet.height);
    var px = image.data, src = data.thumbs, stride = sheet.width;
    for (var k = 0; k < this.thumbs.length; k++) {
      var x0 = (k % e.heads) * n, y0 = Math.floor(k / e.heads) * n, base = k * size;
      for (var p = 0; p < size; p++) {
        var v = 4 * src[base + p], q = 4 * ((y0 + Math.floor(p / n)) * stride + x0 + p % n);
        px[q] = LUT[v]; px[q + 1] = LUT[v + 1]; px[q + 2] = LUT[v + 2]; px[q + 3] = 255;
      }
    }
    ctx.putImageData(image, 0, 0);
    this.sheet.backgroundImage = "url(" + sheet.toDataURL("image/png") + ")";
    this.sheet.backgroundSize = e.heads * 100 + "% " + e.layers * 100 + "%";
    var across = e.heads > 1 ? e.heads - 1 : 1, down = e.layers > 1 ? e.layers - 1 : 1;
    for (k = 0; k < this.thumbs.length; k++) {
      this.thumbs[k].style.backgroundPosition = (k % e.heads) / across * 100 + "% " + Math.floor(k / e.heads) / down * 100 + "%";
    }
  };

  View.prototype.showLayers = function () {
    var lo = Number(this.from.value), hi = Number(this.to.value);
    if (hi < lo) { this.to.value = String(lo); hi = lo; }
    Array.prototype.forEach.call(this.grid.querySelectorAll(".attn-mv-layer"), function (line) {
      var l = Number(line.getAttribute("data-layer"));
      line.hidden = l < lo || l > hi;
    });
    var focused = this.grid.querySelector('.attn-mv-thumb[tabindex="0"]');
    var l0 = Number(focused.getAttribute("data-layer"));
    if (l0 < lo || l0 > hi) this.focusThumb(Math.min(Math.max(l0, lo), hi), Number(focused.getAttribute("data-head")), true);
  };

  View.prototype.focusThumb = function (l, h, quiet) {
    // The grid's one Tab stop stays on a layer that is shown.
    var lo = Number(this.from.value), hi = Math.max(lo, Number(this.to.value));
    l = Math.min(Math.max(l, lo), hi);
    var e = this.entries[0], next = this.thumbs[l * e.heads + h];
    this.thumbs.forEach(function (thumb) { thumb.tabIndex = -1; });
    next.tabIndex = 0;
    if (!quiet) next.focus();
  };

  View.prototype.focusToken = function (i) {
    var spans = this.spans;
    for (var k = 0; k < spans.length; k++) spans[k].tabIndex = -1;
    spans[i].tabIndex = 0;
    spans[i].focus();
  };

  View.prototype.current = function () { return this.lit !== null ? this.lit : this.pinned; };

  // Light token i (null: the pinned one, if any) in every thumbnail and the large view.
  View.prototype.light = function (i, force) {
    if (!this.data) return;
    var before = this.current();
    this.lit = i;
    var now = this.current();
    if (now === before && !force) return;
    if (this.litSpan) this.litSpan.classList.remove("is-lit");
    this.litSpan = now === null ? null : this.spans[now];
    if (now === null) {
      this.grid.classList.remove("is-lit");
    } else {
      this.litSpan.classList.add("is-lit");
      var cells = this.data.entry.cells, row = Math.floor(now / this.data.entry.pool);
      this.band.clipPath = "inset(" + 100 * row / cells + "% 0 " + 100 * (cells - row - 1) / cells + "% 0)";
      this.grid.classList.add("is-lit");
    }
    this.root.setAttribute("data-attn-mv-lit", now === null ? "" : String(now));
    if (this.head) {
      this.drawLines();
      if (now !== null && !this.pointing) this.showLine(now);
    }
    this.say();
  };

  // Scroll the large view's lines to token i, if it is out of sight.
  View.prototype.showLine = function (i) {
    var box = this.lines.parentNode, y = 4 + i * this.rowH;
    if (y < box.scrollTop || y + this.rowH > box.scrollTop + box.clientHeight) {
      box.scrollTop = Math.max(0, y - box.clientHeight / 2);
    }
  };

  View.prototype.pin = function (i, keep) {
    var old = this.pinned !== null ? this.spans[this.pinned] : null;
    if (old) { old.classList.remove("is-pinned"); old.setAttribute("aria-pressed", "false"); }
    this.pinned = this.pinned === i && !keep ? null : i;
    if (this.pinned !== null) {
      this.spans[this.pinned].classList.add("is-pinned");
      this.spans[this.pinned].setAttribute("aria-pressed", "true");
    }
    this.light(this.lit === null ? null : i, true);
  };

  function fixed(x) { return x.toFixed(2); }

  View.prototype.say = function () {
    var e = this.data.entry, i = this.current(), text;
    if (i === null) {
      text = this.head
        ? "Layer " + this.head[0] + ", head " + this.head[1] + ": point at a token, a line or a cell."
        : "Point at, focus or tap a token to light its row in every head; click a head for its lines and heatmap.";
    } else {
      text = "Token " + i + " \u201c" + shown(e.tokens[i]) + "\u201d";
      if (e.pool > 1) {
        var lo = Math.floor(i / e.pool) * e.pool;
        text += " (the thumbnails' row of tokens " + lo + "\u2013" + Math.min(e.t - 1, lo + e.pool - 1) + ")";
      }
      if (this.head) {
        var r = row(this.data, this.head[0], this.head[1], i), order = r.keys.map(function (_, n) { return n; });
        order.sort(function (a, b) { return r.weights[b] - r.weights[a]; });
        var best = order.slice(0, 4).map(function (n) {
          return "\u201c" + shown(e.tokens[r.keys[n]]) + "\u201d " + r.keys[n] + ": " + fixed(r.weights[n]);
        });
        text += " attends to " + best.join(", ");
        if (r.others > 0 && !this.data.full) text += "; the other " + r.others + " keys: " + fixed(r.rest);
      }
    }
    this.tell(text);
  };

  View.prototype.openHead = function (l, h, again) {
    var e = this.data.entry;
    if (this.head) this.thumbs[this.head[0] * e.heads + this.head[1]].setAttribute("aria-pressed", "false");
    this.head = [l, h];
    this.thumbs[l * e.heads + h].setAttribute("aria-pressed", "true");
    this.focusThumb(l, h, true);
    var g = Math.floor(h / (e.heads / e.kvHeads));
    this.detailName.textContent = "Layer " + l + ", head " + h + " (kv head " + g + ") on \u201c" + e.name + "\u201d";
    this.detail.hidden = false;
    this.drawHeat();
    this.drawLines();
    this.root.setAttribute("data-attn-mv-head", l + "," + h);
    this.say();
    if (!again && this.detail.scrollIntoView) this.detail.scrollIntoView({block: "nearest"});
  };

  View.prototype.closeHead = function (focus) {
    if (!this.head) return;
    var thumb = this.thumbs[this.head[0] * this.data.entry.heads + this.head[1]];
    thumb.setAttribute("aria-pressed", "false");
    this.head = null;
    this.detail.hidden = true;
    this.root.setAttribute("data-attn-mv-head", "");
    if (focus) this.focusThumb(Number(thumb.getAttribute("data-layer")), Number(thumb.getAttribute("data-head")));
    this.say();
  };

  View.prototype.drawHeat = function () {
    var e = this.data.entry, t = e.t, canvas = this.heat;
    canvas.width = canvas.height = t;
    var ctx = canvas.getContext("2d"), image = ctx.createImageData(t, t), px = image.data;
    for (var p = 0; p < 4 * t * t; p += 4) { px[p] = LUT[0]; px[p + 1] = LUT[1]; px[p + 2] = LUT[2]; px[p + 3] = 255; }
    for (var i = 0; i < t; i++) {
      var r = row(this.data, this.head[0], this.head[1], i);
      for (var n = 0; n < r.keys.length; n++) {
        var v = 4 * Math.round(r.weights[n] * 255), q = 4 * (i * t + r.keys[n]);
        px[q] = LUT[v]; px[q + 1] = LUT[v + 1]; px[q + 2] = LUT[v + 2];
      }
    }
    ctx.putImageData(image, 0, 0);
  };

  View.prototype.pointCell = function (cell) {
    var e = this.data.entry, t = e.t;
    var i = Math.min(cell[0], t - 1), j = Math.min(cell[1], t - 1);
    this.cell = [i, j];
    var size = this.heat.clientWidth / t;
    this.cursor.style.left = (1 + j * size) + "px";
    this.cursor.style.top = (1 + i * size) + "px";
    this.cursor.style.width = this.cursor.style.height = Math.max(2, size) + "px";
    this.cursor.hidden = false;
    var r = row(this.data, this.head[0], this.head[1], i), n = r.keys.indexOf(j);
    var w = n >= 0 ? fixed(r.weights[n]) : j > i ? "0 (a later token: masked)" : "below the kept " + e.k + " (part of the other keys' " + fixed(r.rest) + ")";
    this.tell("Query " + i + " \u201c" + shown(e.tokens[i]) + "\u201d \u2192 key " + j +
      " \u201c" + shown(e.tokens[j]) + "\u201d: " + w);
  };

  // The read-out line; a screen reader hears it when the keyboard made it.
  View.prototype.tell = function (text) {
    this.readout.textContent = text;
    if (this.keyboard) this.live.textContent = text;
  };

  View.prototype.drawLines = function () {
    var e = this.data.entry, t = e.t, canvas = this.lines, ratio = window.devicePixelRatio || 1;
    var width = Math.max(200, Math.min(560, canvas.parentNode.clientWidth || 400));
    var rowH = this.rowH = 16, height = t * rowH + 8;
    if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
      canvas.style.width = width + "px";
      canvas.style.height = height + "px";
    }
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    var style = getComputedStyle(this.root), fg = style.color || "#222";
    ctx.font = "12px " + (style.fontFamily || "sans-serif");
    var col = Math.min(width * 0.36, 130), x0 = col + 4, x1 = width - col - 4;
    var chosen = this.current(), l = this.head[0], h = this.head[1], i, n, r;
    function y(k) { return 4 + k * rowH + rowH / 2; }
    ctx.lineWidth = 1.5;
    for (i = 0; i < t; i++) {
      if (chosen !== null && i !== chosen) continue;
      r = row(this.data, l, h, i);
      for (n = 0; n < r.keys.length; n++) {
        var w = r.weights[n];
        if (w < 0.02) continue;
        ctx.strokeStyle = "rgba(" + (chosen === null ? "33,113,181," + (0.6 * w) : ACCENT + "," + Math.max(0.08, w)) + ")";
        ctx.beginPath();
        ctx.moveTo(x0, y(i));
        ctx.lineTo(x1, y(r.keys[n]));
        ctx.stroke();
      }
    }
    var weights = null;
    if (chosen !== null) {
      r = row(this.data, l, h, chosen);
      weights = {};
      for (n = 0; n < r.keys.length; n++) weights[r.keys[n]] = r.weights[n];
    }
    ctx.textBaseline = "middle";
    for (i = 0; i < t; i++) {
      var label = shown(e.tokens[i]);
      if (label.length > 16) label = label.slice(0, 15) + "\u2026";
      if (weights && weights[i] > 0) {
        ctx.fillStyle = "rgba(" + ACCENT + "," + (0.15 + 0.85 * weights[i]) + ")";
        ctx.fillRect(x1 + 2, y(i) - rowH / 2 + 1, col - 2, rowH - 2);
      }
      if (i === chosen) {
        ctx.fillStyle = "rgba(" + ACCENT + ",.35)";
        ctx.fillRect(0, y(i) - rowH / 2 + 1, col, rowH - 2);
      }
      ctx.fillStyle = fg;
      ctx.textAlign = "right";
      ctx.fillText(label, col - 2, y(i), col - 4);
      ctx.textAlign = "left";
      ctx.fillText(label, x1 + 4, y(i), col - 6);
    }
  };

  function start() {
    addStyle();
    var roots = document.querySelectorAll("[data-attn-model-view]:not([data-attn-mv-ready])");
    Array.prototype.forEach.call(roots, function (root) {
      root.setAttribute("data-attn-mv-ready", "");
      root.attnModelView = new View(root);
    });
  }

  window.attnModelView = {decode: decode, row: row, start: start};
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
  if (typeof document$ !== "undefined" && document$.subscribe) document$.subscribe(start);
})();
