"""The figures of the serving benchmark: decode time against context, and each ratio
against its goal, drawn from a record of
[`attnlab.tools.bench.serving`][attnlab.tools.bench.serving].
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.tools.bench.config import SERVING_GOALS as GOALS

__all__ = ["FIGURES", "write_serving_plots"]

FIGURES = ("serving_decode.svg", "serving_ratios.svg")
"""The figures `write_serving_plots` draws."""


_COLORS = {
    "paged": ("#0072b2", "s", "-"),
    "teaching": ("#cc79a7", "D", ":"),
    "contiguous": ("#000000", "^", "--"),
    "flex": ("#e69f00", "o", "-."),
}


def write_serving_plots(data: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw `serving_decode.svg` (decode attention time against context, each path)
    and `serving_ratios.svg` (each measured ratio against its goal).

    Returns:
        The paths written.
    """
    import matplotlib
    from matplotlib.figure import Figure

    from attnlab.tools.bench.plots import CARD, WIDTH_IN, log_axis, rc_params

    written = []
    points = data["decode"]
    xs = [p["context"] for p in points]
    lines = {
        "paged": [p["paged_ms"] for p in points],
        "teaching": [p["teaching_ms"] for p in points],
        "contiguous": [p["contiguous_ms"] for p in points],
    }
    flex = data.get("flex")
    if flex:
        by_context = {p["context"]: p["flex_ms"] for p in flex["points"]}
        if all(x in by_context for x in xs):
            lines["flex"] = [by_context[x] for x in xs]
    labels = {
        "paged": "paged",
        "teaching": "paged, teaching path",
        "contiguous": "contiguous (SDPA)",
        "flex": "torch flex, paged",
    }
    with matplotlib.rc_context(rc_params()):
        fig = Figure(figsize=(WIDTH_IN, 4.2), layout="constrained", facecolor=CARD)
        ax = fig.subplots()
        for name, ys in lines.items():
            color, marker, style = _COLORS[name]
            ax.plot(
                xs,
                [y / 1e3 for y in ys],
                label=labels[name],
                color=color,
                marker=marker,
                linestyle=style,
                markersize=5,
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.set_yscale("log")
        log_axis(ax, [y / 1e3 for ys in lines.values() for y in ys], seconds=True)
        ax.set_xlabel("context per sequence (tokens)")
        ax.set_ylabel("one decode step of attention")
        ax.set_title(f"{data['settings']['batch']} sequences, 9 q / 3 kv heads")
        ax.grid(True, which="major", alpha=0.35)
        fig.legend(loc="outside upper center", ncols=2, frameon=False)
        path = out_dir / FIGURES[0]
        fig.savefig(path, format="svg", facecolor=CARD, metadata={"Date": None})
        written.append(path)

        bars = [
            *((f"decode {p['context']}", p["ratio"], "decode") for p in points),
            ("memory, paged", data["memory"]["paged_ratio"], "memory"),
            ("memory, contiguous", data["memory"]["contiguous_ratio"], None),
            ("throughput", data["throughput"]["ratio"], "throughput"),
        ]
        fig = Figure(figsize=(WIDTH_IN, 3.9), layout="constrained", facecolor=CARD)
        ax = fig.subplots()
        for y, (_, value, part) in enumerate(bars):
            met = part is not None and data["goals"][part]["met"] is not False
            if part == "decode":
                met = value <= GOALS["decode"][1]
            color = "#009e73" if met else "#d55e00"
            ax.barh(y, value, color=color if part else "#8a8a8a", height=0.6)
            if part is not None:
                target = GOALS[part][1]
                ax.plot([target, target], [y - 0.4, y + 0.4], color="#000000", linewidth=1.5)
            ax.annotate(
                f"{value:.2f}x",
                (value, y),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
            )
        ax.set_yticks(range(len(bars)), [b[0] for b in bars])
        ax.invert_yaxis()
        ax.set_xlim(0, max(b[1] for b in bars) * 1.25)
        ax.set_xlabel("ratio (black tick: the goal)")
        ax.grid(True, axis="x", alpha=0.35)
        path = out_dir / FIGURES[1]
        fig.savefig(path, format="svg", facecolor=CARD, metadata={"Date": None})
        written.append(path)
    return written
