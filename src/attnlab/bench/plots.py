"""Plots of a run: time and peak memory against sequence length, one figure per suite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.bench.config import MODES

_STYLE = {
    "naive": ("tab:red", "o"),
    "flash_attention": ("tab:blue", "s"),
    "torch_sdpa": ("black", "^"),
    "SelfAttention": ("tab:orange", "o"),
    "MultiHeadAttentionWrapper": ("tab:red", "v"),
    "MultiHeadAttention[torch]": ("tab:blue", "s"),
    "MultiHeadAttention[scratch]": ("tab:cyan", "D"),
    "nn.MultiheadAttention[need_weights=False]": ("black", "^"),
    "nn.MultiheadAttention[default]": ("tab:gray", "x"),
}


def write_plots(data: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw `<suite>_time.png` and `<suite>_memory.png` for each suite in `data`.

    Each figure has one panel per mode, with the sequence length on a log axis; time
    panels show the median with a bar from min to max.

    Args:
        data: The dict that `run` returns.
        out_dir: Folder to write into.

    Returns:
        The paths written.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    written: list[Path] = []
    for suite, content in data["suites"].items():
        results = content["results"]
        modes = [m for m in MODES if any(r["mode"] == m for r in results)]
        if not modes:
            continue
        for what in ("time", "memory"):
            fig = Figure(figsize=(5.2 * len(modes), 4.2), layout="constrained")
            axes = fig.subplots(1, len(modes), squeeze=False)[0]
            for ax, mode in zip(axes, modes, strict=True):
                impls = sorted({r["impl"] for r in results if r["mode"] == mode})
                for impl in impls:
                    rs = sorted(
                        (r for r in results if r["mode"] == mode and r["impl"] == impl),
                        key=lambda r: r["seq_len"],
                    )
                    xs = [r["seq_len"] for r in rs]
                    color, marker = _STYLE.get(impl, (None, "o"))
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
                            capsize=3,
                            markersize=4,
                        )
                    else:
                        ys = [max(r["peak_extra_bytes"], 1) / 2**20 for r in rs]
                        ax.plot(xs, ys, label=impl, color=color, marker=marker, markersize=4)
                if what == "memory" and suite == "kernels":
                    cfg = content["config"]
                    ts = sorted({r["seq_len"] for r in results if r["mode"] == mode})
                    ax.plot(
                        ts,
                        [cfg["batch"] * cfg["heads"] * t * t * 4 / 2**20 for t in ts],
                        color="tab:red",
                        linestyle=":",
                        label="one b·h·T·T fp32 score tensor",
                    )
                ax.set_xscale("log", base=2)
                lengths = sorted({r["seq_len"] for r in results if r["mode"] == mode})
                ax.set_xticks(lengths, [str(t) for t in lengths], minor=False)
                ax.xaxis.set_minor_locator(NullLocator())
                ax.set_yscale("log")
                ax.set_xlabel("sequence length T")
                ax.set_ylabel(
                    "seconds (median, min-max)" if what == "time" else "peak extra memory (MiB)"
                )
                ax.set_title(f"{suite}: {mode}")
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=7)
            path = out_dir / f"{suite}_{what}.png"
            fig.savefig(path, dpi=100)
            written.append(path)
    return written
