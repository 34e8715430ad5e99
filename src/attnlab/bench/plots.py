"""Plots of a run: time and peak memory against sequence length, one figure per suite.

The figures are SVG with a transparent background, drawn for the width of the site's
text column (about 700 px): fonts of 11-13 px at that width, and text, axes and grid in
a mid grey that reads on Material's light and dark backgrounds alike; the lines use
colours that keep their contrast on both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.bench.config import DECODE, MODES

_GREY = "#8a8a8a"
"""Text, axes and grid: legible on white and on Material's slate (#1e2129)."""

# Mid-luminance colours (Okabe-Ito, colour-blind safe) that read on both backgrounds.
_STYLE = {
    "naive": ("#d55e00", "o"),
    "flash_attention": ("#0072b2", "s"),
    "torch_sdpa": (_GREY, "^"),
    "SelfAttention": ("#e69f00", "o"),
    "MultiHeadAttentionWrapper": ("#d55e00", "v"),
    "MultiHeadAttention[torch]": ("#0072b2", "s"),
    "MultiHeadAttention[scratch]": ("#56b4e9", "D"),
    "nn.MultiheadAttention[need_weights=False]": (_GREY, "^"),
    "nn.MultiheadAttention[default]": ("#cc79a7", "x"),
    "kv_cache": ("#009e73", "o"),
    "recompute": ("#d55e00", "s"),
}


def _style(impl: str) -> tuple[str, str]:
    if impl.startswith("flash_attention[window"):
        return "#009e73", "D"
    return _STYLE.get(impl, (_GREY, "o"))


def _rc() -> Any:  # matplotlib types the keys as a Literal of every rcParam
    return {
        "font.size": 11,
        "axes.titlesize": 12,
        "axes.labelsize": 11,
        "legend.fontsize": 10,
        "xtick.labelsize": 10,
        "ytick.labelsize": 10,
        "text.color": _GREY,
        "axes.labelcolor": _GREY,
        "axes.edgecolor": _GREY,
        "xtick.color": _GREY,
        "ytick.color": _GREY,
        "grid.color": _GREY,
        "legend.edgecolor": _GREY,
        "legend.framealpha": 0.0,
        "svg.fonttype": "none",  # text stays text: the browser's font, selectable
        "font.family": "sans-serif",
    }


def write_plots(data: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw `<suite>_time.svg` and `<suite>_memory.svg` for each timed suite in `data`.

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
        for what in ("time", "memory"):
            with matplotlib.rc_context(_rc()):
                fig = Figure(figsize=(7.0, 1.0 + 3.2 * len(modes)), layout="constrained")
                axes = fig.subplots(len(modes), 1, squeeze=False)[:, 0]
                legend: dict[str, Any] = {}
                for ax, mode in zip(axes, modes, strict=True):
                    _panel(ax, suite, content, mode, what)
                    ax.xaxis.set_minor_locator(NullLocator())
                    for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                        legend.setdefault(label, handle)
                # One legend above the panels: inside them it would hide the lines.
                fig.legend(
                    list(legend.values()),
                    list(legend),
                    loc="outside upper center",
                    ncols=2 if len(legend) > 3 else len(legend),
                    frameon=False,
                )
                path = out_dir / f"{suite}_{what}.svg"
                fig.savefig(path, format="svg", transparent=True, metadata={"Date": None})
            written.append(path)
    return written


def _seconds(y: float) -> str:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if y >= scale:
            return f"{y / scale:g} {unit}"
    return f"{y * 1e9:g} ns"


def _log_labels(ax: Any, *, seconds: bool) -> None:
    """Plain labels on the log y axis (`20 ms`, not $2 \\times 10^{-2}$), at 1-2-5 steps
    when the data spans less than two decades."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    low, high = ax.get_ylim()
    subs = (1.0, 2.0, 5.0) if high / max(low, 1e-30) < 100 else (1.0,)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: _seconds(y) if seconds else f"{y:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _panel(ax: Any, suite: str, content: dict[str, Any], mode: str, what: str) -> None:
    results = [r for r in content["results"] if r["mode"] == mode]
    for impl in sorted({r["impl"] for r in results}):
        rs = sorted((r for r in results if r["impl"] == impl), key=lambda r: r["seq_len"])
        xs = [r["seq_len"] for r in rs]
        color, marker = _style(impl)
        if what == "time":
            ys = [r["time_s"]["median"] for r in rs]
            err = [
                [y - r["time_s"]["min"] for y, r in zip(ys, rs, strict=True)],
                [r["time_s"]["max"] - y for y, r in zip(ys, rs, strict=True)],
            ]
            ax.errorbar(
                xs, ys, yerr=err, label=impl, color=color, marker=marker, capsize=3, markersize=5
            )
        else:
            ys = [max(r["peak_extra_bytes"], 1) / 2**20 for r in rs]
            ax.plot(xs, ys, label=impl, color=color, marker=marker, markersize=5)
    lengths = sorted({r["seq_len"] for r in results})
    if what == "memory" and suite == "kernels":
        cfg = content["config"]
        ax.plot(
            lengths,
            [cfg["batch"] * cfg["heads"] * t * t * 4 / 2**20 for t in lengths],
            color="#d55e00",
            linestyle=":",
            label="one b·h·T·T fp32 score tensor",
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(t) for t in lengths], minor=False)
    ax.set_yscale("log")
    ax.set_xlabel("context already cached" if suite == "decode" else "sequence length T")
    if what == "time":
        ax.set_ylabel("s per token" if suite == "decode" else "time (median, min–max)")
    else:
        ax.set_ylabel("peak extra memory (MiB)")
    _log_labels(ax, seconds=what == "time")
    ax.set_title(f"{suite}: {mode}")
    ax.grid(True, which="both", alpha=0.35)
