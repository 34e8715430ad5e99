"""Plots of a run: time (and, for kernels and modules, peak memory) against length.

The figures are SVG drawn for a phone as much as for a desktop: 4.6 inches wide (442 px
at their natural size, which the site never enlarges), panels stacked, and no text
smaller than 10.5 pt, so that on a 390 px wide phone column, where the figure shrinks to
fit, every label is still at least 11 px high. Each figure sits on an opaque white card
with dark text (#333333, 12.6:1 against the card), like the site's diagrams: no single
colour reaches the 4.5:1 contrast of WCAG on both Material's white and its slate
background, so the card, not the page, is what the text is read against. The lines use
the Okabe-Ito colours (colour-blind safe), every implementation its own colour and
marker, PyTorch's references in black.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from attnlab.tools.bench.config import DECODE, FORWARD, FORWARD_BACKWARD, MODES

WIDTH_IN = 4.6
"""Width of every figure, inches (331 pt of viewBox)."""
CARD = "#ffffff"
"""The figure's background: an opaque card."""
TEXT = "#333333"
"""Text and axes: 12.6:1 against the card."""
_GRID = "#8a8a8a"  # drawn at 35% opacity: a light grid, not text
MIN_FONT_PT = 10.5
"""The smallest text in a figure, in points (viewBox units)."""

# Okabe-Ito colours; black for the baselines that PyTorch provides.
_STYLE = {
    "naive": ("#d55e00", "o", "-"),
    "flash_attention": ("#0072b2", "s", "-"),
    "torch_sdpa": ("#000000", "^", "--"),
    "SelfAttention": ("#e69f00", "o", "-"),
    "MultiHeadAttentionWrapper": ("#009e73", "v", "-"),
    "MultiHeadAttention[torch]": ("#0072b2", "s", "-"),
    "MultiHeadAttention[scratch]": ("#cc79a7", "D", "-"),
    "nn.MultiheadAttention[need_weights=False]": ("#000000", "^", "--"),
    "nn.MultiheadAttention[default]": ("#d55e00", "x", "--"),
    "kv_cache": ("#009e73", "o", "-"),
    "recompute": ("#d55e00", "s", "-"),
}
_SCORES_LINE = "#cc79a7"  # the size of one score tensor, dotted: no kernel is purple
_SCORES_LABEL = "one b·h·T·T fp32 score tensor"

# Suites whose memory gets a figure; the others' memory is in the page's tables.
MEMORY_PLOTS = ("kernels", "modules")

_SUITE_TITLES = {
    "kernels": "attention kernels",
    "modules": "attention modules",
    "window": "window vs full causal",
}
_MODE_TITLES = {FORWARD: "forward", FORWARD_BACKWARD: "forward and backward"}


def _style(impl: str) -> tuple[str, str, str]:
    if impl.startswith("flash_attention[window"):
        return "#009e73", "D", "-"
    return _STYLE.get(impl, ("#56b4e9", "o", "-"))


def _title(suite: str, mode: str) -> str:
    if mode == DECODE:
        return "decoding, per generated token"
    return f"{_SUITE_TITLES.get(suite, suite)}, {_MODE_TITLES.get(mode, mode)}"


def rc_params() -> Any:  # matplotlib types the keys as a Literal of every rcParam
    """The matplotlib settings of every benchmark figure, for `matplotlib.rc_context`."""
    return {
        "font.size": 11,
        "axes.titlesize": 12,
        "axes.labelsize": 11,
        "legend.fontsize": MIN_FONT_PT,
        "xtick.labelsize": MIN_FONT_PT,
        "ytick.labelsize": MIN_FONT_PT,
        "text.color": TEXT,
        "axes.labelcolor": TEXT,
        "axes.edgecolor": TEXT,
        "xtick.color": TEXT,
        "ytick.color": TEXT,
        "grid.color": _GRID,
        "legend.edgecolor": TEXT,
        "legend.framealpha": 0.0,
        "svg.fonttype": "none",  # text stays text: the browser's font, selectable
        "font.family": "sans-serif",
    }


def write_plots(data: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw `<suite>_time.svg` for each timed suite in `data`, and `<suite>_memory.svg`
    for the suites of `MEMORY_PLOTS`.

    Each figure stacks one panel per mode, with the sequence length (the context, for
    `decode`) on a log axis; time panels show the median with a bar from min to max.

    Args:
        data: The dict that `run` returns.
        out_dir: Folder to write into.

    Returns:
        The paths written.
    """
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    written: list[Path] = []
    for suite, content in data["suites"].items():
        results = content["results"]
        modes = [m for m in (*MODES, DECODE) if any(r["mode"] == m for r in results)]
        if not modes:
            continue
        for what in ("time", "memory") if suite in MEMORY_PLOTS else ("time",):
            with matplotlib.rc_context(rc_params()):
                labels = {r["impl"] for r in results}
                if what == "memory" and suite == "kernels":
                    labels.add(_SCORES_LABEL)
                long_names = max(len(name) for name in labels) > 18  # one per row
                fig = Figure(
                    figsize=(WIDTH_IN, 0.9 + 0.3 * len(labels) * long_names + 3.1 * len(modes)),
                    layout="constrained",
                    facecolor=CARD,
                )
                axes = fig.subplots(len(modes), 1, squeeze=False)[:, 0]
                legend: dict[str, Any] = {}
                for ax, mode in zip(axes, modes, strict=True):
                    draw_panel(ax, suite, content, mode, what)
                    ax.xaxis.set_minor_locator(NullLocator())
                    for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                        legend.setdefault(label, handle)
                # One legend above the panels: inside them it would hide the lines.
                fig.legend(
                    list(legend.values()),
                    list(legend),
                    loc="outside upper center",
                    ncols=1 if long_names else min(len(legend), 3),
                    frameon=False,
                )
                path = out_dir / f"{suite}_{what}.svg"
                fig.savefig(path, format="svg", facecolor=CARD, metadata={"Date": None})
            written.append(path)
    return written


def format_seconds(y: float) -> str:
    """`y` seconds with a unit of its size, to three digits.

    Examples:
        >>> format_seconds(0.0213), format_seconds(2.5e-6), format_seconds(3.0)
        ('21.3 ms', '2.5 µs', '3 s')
    """
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if y >= scale * (1 - 1e-9):
            return f"{y / scale:.3g} {unit}"
    return f"{y * 1e9:.3g} ns"


def log_ticks(low: float, high: float) -> list[float]:
    """Ticks for a log axis holding data from `low` to `high`: the powers of ten, and
    the 2s and 5s between them when that gives fewer than four, with one tick at or
    below `low` and one at or above `high`, so that every point has a label beneath
    and above it.

    Examples:
        >>> log_ticks(0.0016, 1.8)
        [0.001, 0.01, 0.1, 1.0, 10.0]
        >>> log_ticks(0.19, 0.7)
        [0.1, 0.2, 0.5, 1.0]
    """
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    for subs in ((1.0,), (1.0, 2.0, 5.0)):
        ticks = [m * 10.0**e for e in range(first, last + 1) for m in subs]
        below = max(t for t in ticks if t <= low * (1 + 1e-9))
        above = min(t for t in ticks if t >= high * (1 - 1e-9))
        ticks = [float(f"{t:.6g}") for t in ticks if below <= t <= above]
        if len(ticks) >= 4:
            break
    return ticks


def log_axis(ax: Any, values: list[float], *, seconds: bool) -> None:
    """Labelled ticks on the log y axis (`20 ms`, not $2 \\times 10^{-2}$)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    ticks = log_ticks(min(values), max(values))
    ax.set_ylim(ticks[0] / 1.15, ticks[-1] * 1.15)
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(
        FuncFormatter(lambda y, _: format_seconds(y) if seconds else f"{y:g}")
    )
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())


def draw_panel(ax: Any, suite: str, content: dict[str, Any], mode: str, what: str) -> None:
    """Draw one panel: `what` ("time" or "memory") of `content`'s results in `mode`."""
    results = [r for r in content["results"] if r["mode"] == mode]
    values: list[float] = []
    for impl in sorted({r["impl"] for r in results}):
        rs = sorted((r for r in results if r["impl"] == impl), key=lambda r: r["seq_len"])
        xs = [r["seq_len"] for r in rs]
        color, marker, line = _style(impl)
        if what == "time":
            ys = [r["time_s"]["median"] for r in rs]
            err = [
                [y - r["time_s"]["min"] for y, r in zip(ys, rs, strict=True)],
                [r["time_s"]["max"] - y for y, r in zip(ys, rs, strict=True)],
            ]
            ax.errorbar(
                xs,
                ys,
                yerr=err,
                label=impl,
                color=color,
                marker=marker,
                linestyle=line,
                capsize=3,
                markersize=5,
            )
            values += [r["time_s"]["min"] for r in rs] + [r["time_s"]["max"] for r in rs]
        else:
            ys = [max(r["peak_extra_bytes"], 1) / 2**20 for r in rs]
            ax.plot(xs, ys, label=impl, color=color, marker=marker, linestyle=line, markersize=5)
            values += ys
    lengths = sorted({r["seq_len"] for r in results})
    if what == "memory" and suite == "kernels":
        cfg = content["config"]
        scores = [cfg["batch"] * cfg["heads"] * t * t * 4 / 2**20 for t in lengths]
        ax.plot(lengths, scores, color=_SCORES_LINE, linestyle=":", label=_SCORES_LABEL)
        values += scores
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(t) for t in lengths], minor=False)
    ax.set_yscale("log")
    ax.set_xlabel("context already cached" if suite == "decode" else "sequence length T")
    if what == "time":
        ax.set_ylabel("time per token" if suite == "decode" else "time (median, min–max)")
    else:
        ax.set_ylabel("peak extra memory (MiB)")
    log_axis(ax, values, seconds=what == "time")
    ax.set_title(_title(suite, mode))
    ax.grid(True, which="major", alpha=0.35)
