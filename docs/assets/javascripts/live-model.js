// The induction model of "Watching heads learn", run in the reader's browser.
//
// attnlab.plotting.live_model_widget writes a <div data-attn-live>: a token box and
// buttons (hidden until this script runs), the model's predictions and its attention as
// the build computed them. This script reveals the controls, loads the weights and reruns
// the model at every edit: predictions and all heads' attention are redrawn, the heatmap
// with attention-heatmap.js (`window.attnHeatmap.render`), so it looks and behaves as the
// heatmaps the build draws.
//
// The weights are a script beside this one (assets/model/induction-weights.js, written
// by docs/hooks/live_model.py from the committed .pt with plotting.live_model_asset): a
// page opened from file:// may load a script, not fetch a file. It is loaded only on a
// page that has a widget, once. The forward is TinyTransformer's (src/attnlab/model.py):
// token and learned position embeddings, per block x + out_proj(attention(LayerNorm(x)))
// with causal softmax(q k^T / sqrt(head_dim)), a final LayerNorm and the unembedding;
// tests/test_browser.py checks its logits and attention against PyTorch's. It computes
// in float64, so it differs from PyTorch's float32 by PyTorch's own rounding.
//
// Started when the DOM is ready and on every emission of Material's `document$` (after
// instant navigation); each widget is set up once (`data-attn-live-ready`). Plain
// JavaScript, no dependencies.
(function () {
  "use strict";

  var GLOBAL = "attnlabLiveModel";
  var LN_EPS = 1e-5; // nn.LayerNorm's default, which the model uses
  var RANDOM_LENGTH = 12;
  var STYLE_ID = "attn-live-style";
  var CSS = [
    ".attn-live-table{font-variant-numeric:tabular-nums}",
    ".attn-live-table th{text-align:right;font-weight:600;white-space:nowrap}",
    ".attn-live-table td{text-align:center;min-width:1.8em}",
    ".attn-live-table .attn-live-hit{font-weight:700;color:var(--md-accent-fg-color,#ff6e42)}",
    ".attn-live-input[aria-invalid=true]{border-color:var(--md-code-hl-special-color,#c62828)}",
    ".attn-live-output.is-stale{opacity:.45}",
  ].join("");
  var script = document.currentScript;
  var WEIGHTS_URL = script && script.src
    ? script.src.replace(/javascripts\/[^\/?#]*([?#].*)?$/, "model/induction-weights.js")
    : null;

  var model = null; // the decoded weights, once loaded
  var waiting = null; // callbacks while the weights script loads

  // -- weights --------------------------------------------------------------------------

  function decode(asset) {
    var bytes = atob(asset.data);
    var view = new DataView(new ArrayBuffer(bytes.length));
    for (var i = 0; i < bytes.length; i++) view.setUint8(i, bytes.charCodeAt(i));
    var tensors = {}, offset = 0;
    asset.tensors.forEach(function (entry) {
      var size = entry[1].reduce(function (a, b) { return a * b; }, 1);
      var values = new Float64Array(size);
      for (var j = 0; j < size; j++) values[j] = view.getFloat32(offset + 4 * j, true);
      tensors[entry[0]] = values;
      offset += 4 * size;
    });
    if (offset !== bytes.length) throw new Error("the weights do not match their shapes");
    if (asset.config.mlp) throw new Error("this forward runs attention-only models");
    return {config: asset.config, tensors: tensors};
  }

  // Calls back with (model) or (null, message).
  function load(callback) {
    if (model) return callback(model);
    if (window[GLOBAL]) {
      model = decode(window[GLOBAL]);
      return callback(model);
    }
    if (waiting) return waiting.push(callback);
    waiting = [callback];
    function done(error) {
      var callbacks = waiting;
      waiting = null;
      if (!error && window[GLOBAL]) {
        try {
          model = decode(window[GLOBAL]);
        } catch (err) {
          error = String(err.message || err);
        }
      }
      callbacks.forEach(function (fn) {
        if (model) fn(model);
        else fn(null, error || "the weights script set nothing");
      });
    }
    if (!WEIGHTS_URL) return done("this script does not know where it was loaded from");
    var tag = document.createElement("script");
    tag.src = WEIGHTS_URL;
    tag.onload = function () { done(null); };
    tag.onerror = function () { done("could not load the model's weights (" + WEIGHTS_URL + ")"); };
    document.head.appendChild(tag);
  }

  // -- forward --------------------------------------------------------------------------

  // y = x W^T (+ b) for every row of x: W is (out, in) row-major, as nn.Linear keeps it.
  function linear(x, weight, bias, dOut) {
    return x.map(function (row) {
      var dIn = row.length, y = new Float64Array(dOut);
      for (var o = 0; o < dOut; o++) {
        var sum = bias ? bias[o] : 0, base = o * dIn;
        for (var i = 0; i < dIn; i++) sum += weight[base + i] * row[i];
        y[o] = sum;
      }
      return y;
    });
  }

  function layerNorm(x, weight, bias) {
    return x.map(function (row) {
      var d = row.length, mean = 0, variance = 0, i;
      for (i = 0; i < d; i++) mean += row[i];
      mean /= d;
      for (i = 0; i < d; i++) variance += (row[i] - mean) * (row[i] - mean);
      var scale = 1 / Math.sqrt(variance / d + LN_EPS); // the biased variance, as PyTorch
      var y = new Float64Array(d);
      for (i = 0; i < d; i++) y[i] = (row[i] - mean) * scale * weight[i] + bias[i];
      return y;
    });
  }

  // Softmax over the first n entries (the keys a causal query sees); the rest are 0.
  function causalSoftmax(scores, n) {
    var top = -Infinity, sum = 0, j;
    for (j = 0; j < n; j++) top = Math.max(top, scores[j]);
    var out = new Float64Array(scores.length);
    for (j = 0; j < n; j++) sum += (out[j] = Math.exp(scores[j] - top));
    for (j = 0; j < n; j++) out[j] /= sum;
    return out;
  }

  // Logits (t, vocab) and attention [layer][head] (t, t) of `tokens`, as arrays of rows.
  function forward(m, tokens) {
    var c = m.config, w = m.tensors, d = c.d_model, t = tokens.length;
    var heads = c.num_heads, hd = d / heads, scale = 1 / Math.sqrt(hd);
    var x = tokens.map(function (token, p) {
      var row = new Float64Array(d);
      for (var i = 0; i < d; i++) {
        row[i] = w["token_embedding.weight"][token * d + i] + w["position_embedding.weight"][p * d + i];
      }
      return row;
    });
    var attention = [];
    for (var layer = 0; layer < c.num_layers; layer++) {
      var p = "blocks." + layer + ".";
      var h = layerNorm(x, w[p + "norm_attn.weight"], w[p + "norm_attn.bias"]);
      var q = linear(h, w[p + "attn.W_query.weight"], w[p + "attn.W_query.bias"], d);
      var k = linear(h, w[p + "attn.W_key.weight"], w[p + "attn.W_key.bias"], d);
      var v = linear(h, w[p + "attn.W_value.weight"], w[p + "attn.W_value.bias"], d);
      var mixed = tokens.map(function () { return new Float64Array(d); }); // (t, d)
      var maps = [];
      for (var head = 0; head < heads; head++) {
        var lo = head * hd, map = [];
        for (var i = 0; i < t; i++) {
          var scores = new Float64Array(t);
          for (var j = 0; j <= i; j++) {
            var dot = 0;
            for (var e = lo; e < lo + hd; e++) dot += q[i][e] * k[j][e];
            scores[j] = dot * scale;
          }
          var weights = causalSoftmax(scores, i + 1);
          for (var e2 = lo; e2 < lo + hd; e2++) {
            var sum = 0;
            for (var j2 = 0; j2 <= i; j2++) sum += weights[j2] * v[j2][e2];
            mixed[i][e2] = sum;
          }
          map.push(Array.prototype.slice.call(weights));
        }
        maps.push(map);
      }
      attention.push(maps);
      var out = linear(mixed, w[p + "attn.out_proj.weight"], w[p + "attn.out_proj.bias"], d);
      x = x.map(function (row, r) {
        return row.map(function (value, i) { return value + out[r][i]; });
      });
    }
    var logits = linear(layerNorm(x, w["norm.weight"], w["norm.bias"]), w["unembed.weight"], null,
      c.vocab_size);
    return {
      logits: logits.map(function (row) { return Array.prototype.slice.call(row); }),
      attention: attention,
    };
  }

  // -- input ----------------------------------------------------------------------------

  // {tokens} or {error}: ids separated by spaces or commas, each in [0, vocab).
  function parse(text, config) {
    var parts = String(text).split(/[\s,]+/).filter(function (part) { return part !== ""; });
    var limit = config.vocab_size - 1;
    if (!parts.length) return {error: "No tokens: type at least one id, 0 to " + limit + "."};
    var tokens = [];
    for (var i = 0; i < parts.length; i++) {
      if (!/^\d+$/.test(parts[i])) {
        return {error: "\u201c" + parts[i] + "\u201d (token " + (i + 1) + ") is not a " +
          "token id: use whole numbers from 0 to " + limit + "."};
      }
      var id = Number(parts[i]);
      if (id > limit) {
        return {error: id + " (token " + (i + 1) + ") is outside the vocabulary: ids go " +
          "from 0 to " + limit + "."};
      }
      tokens.push(id);
    }
    if (tokens.length > config.max_len) {
      return {error: tokens.length + " tokens: the model has positions for " +
        config.max_len + " at most."};
    }
    return {tokens: tokens};
  }

  // -- drawing --------------------------------------------------------------------------

  // The markup of plotting._predictions_html, from the same numbers.
  function predictionsHtml(tokens, best, probabilities) {
    var fixed = window.attnHeatmap.fixed, hits = 0, n = tokens.length - 1;
    function row(name, cells) {
      return '<tr><th scope="row">' + name + "</th>" + cells.join("") + "</tr>";
    }
    var predicted = best.map(function (b, i) {
      var hit = i < n && b === tokens[i + 1];
      if (hit) hits++;
      return hit ? '<td class="attn-live-hit"><b>' + b + "</b></td>" : "<td>" + b + "</td>";
    });
    var html = '<div class="attn-live-scroll" style="overflow-x:auto;max-width:100%">' +
      '<table class="attn-live-table" style="font-size:.75em;margin:0 auto;' +
      'border-collapse:separate;border-spacing:.5em .1em">' +
      row("position", tokens.map(function (_, i) { return "<td>" + i + "</td>"; })) +
      row("token", tokens.map(function (t) { return "<td>" + t + "</td>"; })) +
      row("predicts", predicted) +
      row("probability", probabilities.map(function (p) { return "<td>" + fixed(p, 2) + "</td>"; })) +
      "</table></div>";
    var summary = n > 0
      ? "The top prediction is the token that comes next at " + hits + " of the " + n +
        " positions that have a next token."
      : "One token: its next token is not in the sequence.";
    return html + '<p class="attn-live-summary" style="font-size:.8em">' + summary + "</p>";
  }

  function topPredictions(logits) {
    var best = [], probabilities = [];
    logits.forEach(function (row) {
      var arg = 0, top = -Infinity, sum = 0;
      row.forEach(function (value, i) { if (value > top) { top = value; arg = i; } });
      row.forEach(function (value) { sum += Math.exp(value - top); });
      best.push(arg);
      probabilities.push(1 / sum);
    });
    return {best: best, probabilities: probabilities};
  }

  function showError(widget, message) {
    var error = widget.querySelector(".attn-live-error");
    var input = widget.querySelector(".attn-live-input");
    var output = widget.querySelector(".attn-live-output");
    error.textContent = message || "";
    error.hidden = !message;
    if (input) input.setAttribute("aria-invalid", message ? "true" : "false");
    // The last good state stays, faded, so that a typo does not wipe the picture.
    if (output) output.classList.toggle("is-stale", !!message);
  }

  function update(widget) {
    var input = widget.querySelector(".attn-live-input");
    load(function (m, problem) {
      if (!m) return showError(widget, "The live model is unavailable: " + problem + ".");
      var parsed = parse(input.value, m.config);
      if (parsed.error) return showError(widget, parsed.error);
      showError(widget, null);
      var tokens = parsed.tokens, result;
      try {
        result = forward(m, tokens);
      } catch (err) {
        return showError(widget, "The model failed on this input: " + (err.message || err));
      }
      var top = topPredictions(result.logits);
      var output = widget.querySelector(".attn-live-output");
      var table = output.querySelector(".attn-live-scroll");
      var summary = output.querySelector(".attn-live-summary");
      var holder = document.createElement("div");
      holder.innerHTML = predictionsHtml(tokens, top.best, top.probabilities);
      output.replaceChild(holder.firstChild, table);
      output.replaceChild(holder.firstChild, summary);
      var panels = [];
      result.attention.forEach(function (maps) { panels.push.apply(panels, maps); });
      var names = JSON.parse(widget.getAttribute("data-panel-names") || "null");
      if (!names) {
        names = panels.map(function (_, i) {
          return "layer " + (Math.floor(i / m.config.num_heads) + 1) + " \u00b7 head " +
            (i % m.config.num_heads + 1);
        });
      }
      var labels = tokens.map(String);
      var title = widget.getAttribute("data-title");
      window.attnHeatmap.render(output.querySelector("[data-attn-heatmap]"), panels, labels,
        labels, {title: title || null, panelNames: names, annotate: false,
          cellSize: Number(widget.getAttribute("data-cell-size")) || 16});
      widget.setAttribute("data-attn-live-tokens", tokens.join(" "));
    });
  }

  function act(button) {
    var widget = button.closest("[data-attn-live]");
    if (!widget) return;
    var input = widget.querySelector(".attn-live-input");
    var action = button.getAttribute("data-attn-live-action");
    load(function (m, problem) {
      if (!m) return showError(widget, "The live model is unavailable: " + problem + ".");
      if (action === "reset") {
        input.value = widget.getAttribute("data-tokens");
      } else if (action === "random") {
        var tokens = [];
        for (var i = 0; i < RANDOM_LENGTH; i++) {
          tokens.push(Math.floor(Math.random() * m.config.vocab_size));
        }
        input.value = tokens.join(" ");
      } else if (action === "repeat") {
        var parsed = parse(input.value, m.config);
        if (parsed.error) return showError(widget, parsed.error);
        input.value = parsed.tokens.concat(parsed.tokens).slice(0, m.config.max_len).join(" ");
      }
      update(widget);
    });
  }

  document.addEventListener("input", function (event) {
    var input = event.target;
    if (!input || !input.classList || !input.classList.contains("attn-live-input")) return;
    var widget = input.closest("[data-attn-live]");
    if (widget) update(widget);
  });
  document.addEventListener("click", function (event) {
    var button = event.target && event.target.closest
      ? event.target.closest("[data-attn-live-action]")
      : null;
    if (button) act(button);
  });

  function start() {
    var widgets = document.querySelectorAll("[data-attn-live]:not([data-attn-live-ready])");
    if (!widgets.length) return;
    if (!document.getElementById(STYLE_ID)) {
      var style = document.createElement("style");
      style.id = STYLE_ID;
      style.textContent = CSS;
      document.head.appendChild(style);
    }
    for (var i = 0; i < widgets.length; i++) {
      var widget = widgets[i];
      widget.setAttribute("data-attn-live-ready", "");
      var controls = widget.querySelector(".attn-live-controls");
      if (controls) controls.hidden = false;
      update(widget);
    }
  }

  window.attnLive = {
    load: load,
    forward: forward,
    parse: parse,
    predictionsHtml: predictionsHtml,
    start: start,
  };

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
  if (typeof document$ !== "undefined" && document$.subscribe) {
    document$.subscribe(start); // Material: after every instant navigation
  }
})();
