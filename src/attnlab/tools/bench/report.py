"""Markdown tables of a run for the Benchmarks page: results, goals, provenance, KV memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"))
_BYTE_UNITS = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))


def _bytes(n: float) -> str:
    size, unit = next((u for u in _BYTE_UNITS if n >= u[0]), _BYTE_UNITS[-1])
    return f"{_num(n / size)} {unit}"


def _unit(smallest: float, units: tuple[tuple[float, str], ...]) -> tuple[float, str]:
    """The largest unit in which `smallest` is at least 1 (the last unit otherwise)."""
    return next((u for u in units if smallest >= u[0]), units[-1])


def _num(x: float) -> str:
    """Three significant digits, without an exponent (1460, not 1.46e+03)."""
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _name(impl: str) -> str:
    """An implementation's name as code, its `[variant]` on a second, smaller line.

    Keeps the first column narrow: `nn.MultiheadAttention[need_weights=False]` on one line
    would take half the page's width.
    """
    base, bracket, rest = impl.partition("[")
    if not bracket:
        return f'<code style="white-space: nowrap">{impl}</code>'
    return f'<code style="white-space: nowrap">{base}</code><br><small>{rest.rstrip("]")}</small>'


def peak_exceeded(data: dict[str, Any]) -> bool:
    """Whether some result of the run went faster than the run's matmul peak.

    The peak is measured once, at the start of a run; a busy spell then gives a peak
    that later measurements beat. A share of more than 100% shows it, and then no share
    of that run means anything.

    Args:
        data: The dict that `run` returns (or its JSON loaded).

    Returns:
        True if any result's `share_of_peak` is above 1.
    """
    return any(
        r.get("share_of_peak", 0.0) > 1.0
        for content in data["suites"].values()
        for r in content.get("results", [])
    )


def results_markdown(data: dict[str, Any], suite: str, mode: str) -> str:
    """Markdown tables of one suite and mode, one per content tab.

    The more numerous of lengths and implementations run down the table, the other
    across, so that the columns fit the page. The tabs: the time (median, then the
    fastest and slowest round), the time relative to the baseline (median of the
    per-round ratios), the peak extra memory, and the rate of useful floating-point work
    with, below it, its share of the machine's matmul peak, unless a result of the run
    beat that peak (`peak_exceeded`). Each table states its unit once, in its tab's
    title, which keeps the cells narrow. The decode suite's times are per generated
    token, and it has one more tab: tokens per second. Implementations are sorted by
    their ratio to the baseline at the longest length each was measured at.

    Args:
        data: The dict that `run` returns (or `bench.json` loaded).
        suite: `"kernels"`, `"modules"`, `"window"` or `"decode"`.
        mode: `"forward"` or `"forward+backward"` (`"decode"` for the decode suite).

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
    t_scale, t_unit = _unit(min(r["time_s"]["median"] for r in rows), _TIME_UNITS)
    m_scale, m_unit = _unit(
        min((r["peak_extra_bytes"] for r in rows if r["peak_extra_bytes"]), default=1),
        _BYTE_UNITS,
    )

    def time(r: dict[str, Any]) -> str:
        med, low, high = (_num(r["time_s"][k] / t_scale) for k in ("median", "min", "max"))
        return f"{med}<br><small>{low}–{high}</small>"

    def ratio(r: dict[str, Any]) -> str:
        if r["ratio_to_baseline"] is None:
            return ""
        x = r["ratio_to_baseline"]["median"]
        return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"  # 0.0029, not 0.00

    per_token = suite == "decode"
    tables: dict[str, Callable[[dict[str, Any]], str]] = {
        f"Time{' per token' if per_token else ''} ({t_unit})": time,
    }
    if per_token:
        tables["Tokens/s"] = lambda r: _num(1.0 / r["time_s"]["median"])
    tables[f"Time / {data['suites'][suite].get('baseline', 'baseline')}"] = ratio
    memory = f"Peak extra memory{' per call' if per_token else ''}"
    if max(r["peak_extra_bytes"] for r in rows) > 1000 * m_scale:  # too wide for one unit
        tables[memory] = lambda r: _bytes(r["peak_extra_bytes"])
    else:
        tables[f"{memory} ({m_unit})"] = lambda r: _num(r["peak_extra_bytes"] / m_scale)
    if peak_exceeded(data):
        tables["GFLOP/s"] = lambda r: _num(r["gflops"])
    else:
        tables["GFLOP/s (% of matmul peak)"] = lambda r: (
            f"{_num(r['gflops'])}<br><small>{100 * r['share_of_peak']:.0f}%</small>"
        )
    # Material gives every header cell a minimum width of 5rem: seven columns would run off
    # the page. The longer of lengths and implementations goes down, the shorter across.
    first = "context" if per_token else "T"
    across_lengths = len(lengths) <= len(impls)
    out: list[str] = []
    for title, show in tables.items():
        out += [f'=== "{title}"', ""]
        if across_lengths:
            out.append(f"    | {first} = | " + " | ".join(str(t) for t in lengths) + " |")
            out.append("    |:--|" + "--:|" * len(lengths))
            for impl in impls:
                cells = [show(cell[impl, t]) if (impl, t) in cell else "" for t in lengths]
                out.append(f"    | {_name(impl)} | " + " | ".join(cells) + " |")
        else:
            out.append(f"    | {first} | " + " | ".join(_name(i) for i in impls) + " |")
            out.append("    |--:|" + "--:|" * len(impls))
            for t in lengths:
                cells = [show(cell[impl, t]) if (impl, t) in cell else "" for impl in impls]
                out.append(f"    | {t} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def decode_slopes_markdown(data: dict[str, Any]) -> str:
    """A Markdown table of how decoding's time per token grows with the context.

    Args:
        data: The dict that `run` returns (or its JSON loaded), with the decode suite.

    Returns:
        The table (slope of the least-squares line, and the growth from the shortest to
        the longest context), or a sentence saying the run has no decode results.
    """
    slopes = data["suites"].get("decode", {}).get("slopes")
    if not slopes:
        return "*No decode results in this run.*"
    lines = [
        "| | slope: µs per token, per 1,000 tokens of context | time per token, "
        "longest / shortest context |",
        "|:--|--:|--:|",
    ]
    for impl, s in sorted(slopes.items()):
        growth = f"{s['growth']:.2f}x (context {s['context_growth']:.0f}x)"
        lines.append(f"| {_name(impl)} | {_num(s['slope_us_per_1k_context'])} | {growth} |")
    return "\n".join(lines)


def kv_memory_markdown(data: dict[str, Any]) -> str:
    """A Markdown table of the measured KV cache bytes per token of each variant.

    Args:
        data: The dict that `run` returns (or its JSON loaded), with `kv_memory`.

    Returns:
        The table, or a sentence saying the run did not measure it.
    """
    kv = data.get("kv_memory")
    if not kv:
        return "*This run did not measure the KV cache memory.*"
    layers = kv["shape"]["num_layers"]
    lines = [
        f"| | K/V heads | numbers cached per token and layer "
        f"| bytes per token, {layers} layers | / MHA | formula |",
        "|:--|--:|--:|--:|--:|:--|",
    ]
    for r in kv["results"]:
        check = "equal" if r["bytes_per_token"] == r["formula_bytes_per_token"] else "differs"
        lines.append(
            f"| {r['variant']} | {r['num_kv_heads']} | {r['features_per_token_per_layer']} "
            f"| {_bytes(r['bytes_per_token'])} "
            f"| {r['ratio_to_mha']:.3g} | {check} |"
        )
    return "\n".join(lines)


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
            "float32 matmul peak, measured once at the start",
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
    lines = ["| recorded | value |", "|:--|:--|", *(f"| {k} | {v} |" for k, v in rows)]
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
    # "met" first: the goal's text is the widest cell, and on a phone the columns after
    # it scroll out of sight.
    lines = ["| met | goal | measured | target |", "|:--|:--|--:|:--|"]
    for g in data["goals"]:
        lines.append(
            f"| {'yes' if g['met'] else 'no'} | {g['goal']} | {g['value']:.3g} | {g['target']} |"
        )
    return "\n".join(lines)
