"""Markdown tables of a run for the Benchmarks page: results, goals, provenance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# ---------------------------------------------------------------------------------------
# Reports: Markdown tables for the Benchmarks page, PNG plots


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _time_range(t: dict[str, float]) -> str:
    """'12.3 ms (11.9–13)': median, then min–max, in the median's unit."""
    scale, unit = next((u for u in ((1.0, "s"), (1e-3, "ms")) if t["median"] >= u[0]), (1e-6, "µs"))
    med, low, high = (_num(t[key] / scale) for key in ("median", "min", "max"))
    return f"{med} {unit} ({low}–{high})"


def _num(x: float) -> str:
    """Three significant digits, without an exponent (1460, not 1.46e+03)."""
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _name(impl: str) -> str:
    """An implementation's name as code that does not wrap inside a narrow table column."""
    return f'<code style="white-space: nowrap">{impl}</code>'


def results_markdown(data: dict[str, Any], suite: str, mode: str) -> str:
    """Markdown tables of one suite and mode: implementations down, lengths across.

    Four tables, each in a content tab: the time (median, then the fastest and slowest
    round), the time relative to the baseline (median of the per-round ratios), the
    peak extra memory, and the FLOP rate with its share of the machine's matmul peak.
    Implementations are sorted by their ratio to the baseline at the longest length
    each was measured at.

    Args:
        data: The dict that `run` returns (or `bench.json` loaded).
        suite: `"kernels"` or `"modules"`.
        mode: `"forward"` or `"forward+backward"`.

    Returns:
        The Markdown, or a sentence saying there are no results.
    """
    rows = [r for r in data["suites"].get(suite, {}).get("results", []) if r["mode"] == mode]
    if not rows:
        return f"*No {suite} results for {mode} in this run.*"
    lengths = sorted({r["seq_len"] for r in rows})
    cell = {(r["impl"], r["seq_len"]): r for r in rows}

    def at_longest(impl: str) -> float:
        """The ratio to the baseline (else the time) at the longest length measured."""
        r = cell[impl, max(t for t in lengths if (impl, t) in cell)]
        ratio = r["ratio_to_baseline"]
        return float(r["time_s"]["median"] if ratio is None else ratio["median"])

    impls = sorted({r["impl"] for r in rows}, key=at_longest)

    def ratio(r: dict[str, Any]) -> str:
        return "" if r["ratio_to_baseline"] is None else f"{r['ratio_to_baseline']['median']:.2f}"

    tables: dict[str, Callable[[dict[str, Any]], str]] = {
        "Time": lambda r: _time_range(r["time_s"]).replace(" (", "<br><small>(") + "</small>",
        "Time / baseline": ratio,
        "Peak extra memory": lambda r: _bytes(r["peak_extra_bytes"]),
        "GFLOP/s (% of matmul peak)": lambda r: (
            f"{r['gflops']:.1f} ({100 * r['share_of_peak']:.0f}%)"
        ),
    }
    out: list[str] = []
    for title, show in tables.items():
        out += [f'=== "{title}"', ""]
        out.append("    | T = | " + " | ".join(str(t) for t in lengths) + " |")
        out.append("    |:--|" + "--:|" * len(lengths))
        for impl in impls:
            cells = [show(cell[impl, t]) if (impl, t) in cell else "" for t in lengths]
            out.append(f"    | {_name(impl)} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def provenance_markdown(data: dict[str, Any]) -> str:
    """A Markdown table of where and how a run was made: command, versions, machine, load.

    Args:
        data: The dict that `run` returns (or `bench.json` loaded).

    Returns:
        The table.
    """
    prov, peak = data["provenance"], data["matmul_peak"]
    share = prov.get("other_processes_cpu_share")
    rows = [
        ("command", f"`{prov['command']}`"),
        ("date (UTC)", prov["date"].replace("T", " ").removesuffix("+00:00")),
        ("duration", f"{prov['duration_s'] / 60:.1f} min"),
        ("PyTorch", prov["torch"]),
        ("Python", prov["python"]),
        ("CPU", f"{prov['cpu_model']}, {prov['logical_cpus']} logical CPUs"),
        ("PyTorch threads", str(prov["torch_threads"])),
        ("platform", prov["platform"]),
        (
            "float32 matmul peak",
            f"{peak['gflops']:.0f} GFLOP/s (best rate, reached at {peak['size']} x {peak['size']})",
        ),
        (
            "load average (1, 5, 15 min) before / after",
            " / ".join(
                ", ".join(f"{x:.2f}" for x in prov[key])
                for key in ("load_average_before", "load_average_after")
            ),
        ),
        (
            "CPU time used by other processes",
            "not measured" if share is None else f"{100 * share:.0f}% of the machine",
        ),
        ("repeats per size", str(prov["repeats"])),
    ]
    if prov.get("note"):
        rows.append(("note", prov["note"]))
    lines = ["| | |", "|:--|:--|", *(f"| {k} | {v} |" for k, v in rows)]
    return "\n".join(lines)


def goals_markdown(data: dict[str, Any]) -> str:
    """A Markdown table of the goals this run decides: value, target, met or not.

    Args:
        data: The dict that `run` returns (or `bench.json` loaded).

    Returns:
        The table, or a sentence saying this run decides no goal.
    """
    if not data["goals"]:
        return "*This run measured none of the goals' configurations.*"
    lines = ["| goal | measured | target | met |", "|:--|--:|:--|:--|"]
    for g in data["goals"]:
        lines.append(
            f"| {g['goal']} | {g['value']:.3g} | {g['target']} | {'yes' if g['met'] else 'no'} |"
        )
    return "\n".join(lines)
