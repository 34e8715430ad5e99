"""Run the suites: interleaved timed rounds, memory, and the goals the data decides."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from attnlab.rules._provenance import begin
from attnlab.tools.bench.cases import CASES, impl_names
from attnlab.tools.bench.config import (
    BASELINES,
    DECODE,
    FORWARD,
    FORWARD_BACKWARD,
    FULL,
    MODES,
    SCHEMA_VERSION,
    SUITES,
    SuiteConfig,
)
from attnlab.tools.bench.kv_memory import KV_FULL, KVShape, measure_kv_memory
from attnlab.tools.bench.measure import (
    CpuUse,
    measure_matmul_peak,
    peak_extra_bytes,
    round_floats,
    summary,
)


def run(
    *,
    suites: Sequence[str] = SUITES,
    modes: Sequence[str] = MODES,
    plan: dict[str, SuiteConfig] | None = None,
    kv_shape: KVShape = KV_FULL,
    repeats: int = 7,
    seed: int = 0,
    progress: bool = True,
    matmul_sizes: Sequence[int] = (1024, 2048),
    command: str = "",
) -> dict[str, Any]:
    """Run the benchmarks and return the results as a JSON-ready dict.

    Args:
        suites: Which suites to run, among `"kernels"`, `"modules"`, `"window"`,
            `"decode"` and `"kv_memory"`.
        modes: Which modes, among `"forward"` and `"forward+backward"`, for the suites
            that have them; `decode` always runs in its own mode.
        plan: Sizes per suite; the full sizes (`FULL`) by default.
        kv_shape: The model shape of the `kv_memory` suite.
        repeats: Timed rounds per size and mode (each runs every implementation once).
        seed: Seed of the inputs, the weights and the shuffled order of each round.
        progress: Show a progress bar (tqdm) on stderr.
        matmul_sizes: Square matmul sizes used to measure the machine's peak.
        command: The command line to record in the provenance.

    Returns:
        A dict with `schema`, `provenance`, `matmul_peak`, `memory_method`, `suites`
        (each timed suite with its `config`, `baseline` and `results`; `decode` also
        with `slopes`), `kv_memory` (if run) and `goals`. Decode times are per token.
    """
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    plan = FULL if plan is None else plan
    for suite in suites:
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}; choose from {list(SUITES)}")
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose from {list(MODES)}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    torch.manual_seed(seed)
    order = random.Random(seed)
    begun = begin()
    cpu_use = CpuUse()
    peak = measure_matmul_peak(matmul_sizes)
    timed = [s for s in SUITES if s in suites and s in CASES]
    groups = [
        (s, m, t)
        for s in timed
        for m, lengths in plan[s].seq_lens.items()
        if m in modes or m == DECODE
        for t in lengths
    ]
    names = {s: impl_names(s, plan[s]) for s in timed}
    total = (repeats + 2) * sum(sum(plan[s].runs(i, m, t) for i in names[s]) for s, m, t in groups)
    out_suites: dict[str, dict[str, Any]] = {
        s: {"config": _config_json(s, plan[s]), "baseline": BASELINES[s], "results": []}
        for s in timed
    }
    with tqdm(total=total, disable=not progress, unit="call", dynamic_ncols=True) as bar:
        for suite, mode, seq_len in groups:
            bar.set_description(f"{suite} {mode} T={seq_len}")
            cases = [
                c
                for c in CASES[suite](plan[suite], seq_len, mode)
                if plan[suite].runs(c.impl, mode, seq_len)
            ]
            for case in cases:  # warm-up: first-call costs, and the gradient buffer
                case.call()
                bar.update()
            times: dict[str, list[float]] = {c.impl: [] for c in cases}
            for _ in range(repeats):
                order.shuffle(cases)
                for case in cases:
                    start = time.perf_counter()
                    case.call()
                    times[case.impl].append((time.perf_counter() - start) / case.tokens)
                    bar.update()
            baseline = times.get(BASELINES[suite])
            for case in sorted(cases, key=lambda c: c.impl):
                memory = peak_extra_bytes(case.call)
                bar.update()
                median = statistics.median(times[case.impl])
                flops = case.flops / case.tokens
                ratios = (
                    [t / b for t, b in zip(times[case.impl], baseline, strict=True)]
                    if baseline
                    else None
                )
                out_suites[suite]["results"].append(
                    {
                        "impl": case.impl,
                        "mode": mode,
                        "seq_len": seq_len,
                        "time_s": {**summary(times[case.impl]), "repeats": len(times[case.impl])},
                        "ratio_to_baseline": None if ratios is None else summary(ratios),
                        "peak_extra_bytes": memory,
                        "flops": flops,
                        "gflops": flops / median / 1e9,
                        "share_of_peak": flops / median / 1e9 / peak["gflops"],
                        **({"tokens_per_call": case.tokens} if suite == "decode" else {}),
                    }
                )
            del cases  # frees this size's inputs before the next size allocates its own
    kv_memory = measure_kv_memory(kv_shape, seed=seed) if "kv_memory" in suites else None
    data: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "provenance": cpu_use.provenance(command, begun, repeats=repeats, seed=seed),
        "matmul_peak": {
            "gflops": peak["gflops"],
            "size": peak["size"],
            "per_size": {str(n): r for n, r in peak["per_size"].items()},
        },
        "memory_method": (
            "torch.profiler allocation events (profile_memory=True): the largest running "
            "total of CPU tensor bytes during one call, minus the total at its start"
        ),
        "suites": out_suites,
    }
    if "decode" in out_suites:
        out_suites["decode"]["slopes"] = decode_slopes(out_suites["decode"]["results"])
    if "kv_memory" in suites:
        data["kv_memory"] = kv_memory
    data["goals"] = evaluate_goals(data)
    return round_floats(data)  # type: ignore[no-any-return]


def _config_json(suite: str, config: SuiteConfig) -> dict[str, Any]:
    """The sizes of a timed suite as `bench.json` records them."""
    out: dict[str, Any] = {"batch": config.batch, "heads": config.heads}
    if suite in ("kernels", "window"):
        out["head_dim"] = config.width
    else:
        out["d_model"] = config.width
    out["causal"] = suite != "modules"
    if suite == "window":
        out["window"] = config.window
    if suite == "decode":
        out["kv_heads"] = config.kv_heads or config.heads
        out["head_dim"] = config.width // config.heads
        out["steps_per_call"] = config.steps
        out["layer"] = "GroupedQueryAttention (RoPE), one layer"
        out["cache"] = "StaticKVCache"
    out["dtype"] = "float32"
    return out


def decode_slopes(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """How the time per token grows with the context, per implementation of `decode`.

    A least-squares line through (context, median time per token) gives the slope,
    reported in microseconds per 1,000 tokens of context; `growth` is the time per token
    at the longest context over the time at the shortest.

    Args:
        results: The decode suite's results (time per token in `time_s`).

    Returns:
        `{impl: {"slope_us_per_1k_context", "growth", "context_growth"}}`.

    Examples:
        >>> rows = [{"impl": "kv_cache", "seq_len": n, "time_s": {"median": 1e-3 + n * 1e-9}}
        ...         for n in (1000, 3000)]
        >>> decode_slopes(rows)["kv_cache"]["slope_us_per_1k_context"]
        1.0
    """
    out: dict[str, dict[str, float]] = {}
    for impl in sorted({r["impl"] for r in results}):
        points = sorted(
            (float(r["seq_len"]), float(r["time_s"]["median"]))
            for r in results
            if r["impl"] == impl
        )
        if len(points) < 2:
            continue
        xs, ys = [x for x, _ in points], [y for _, y in points]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
        out[impl] = {
            "slope_us_per_1k_context": round(slope * 1e9, 6),
            "growth": ys[-1] / ys[0],
            "context_growth": xs[-1] / xs[0],
        }
    return out


def _find(data: dict[str, Any], suite: str, impl: str, mode: str, t: int) -> dict[str, Any] | None:
    for r in data["suites"].get(suite, {}).get("results", []):
        if r["impl"] == impl and r["mode"] == mode and r["seq_len"] == t:
            return r  # type: ignore[no-any-return]
    return None


def evaluate_goals(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals that this run's data can decide, each with its value, target and verdict.

    Args:
        data: The dict that `run` builds (or `bench.json` loaded).

    Returns:
        One dict per goal: `goal` (what is measured), `value`, `target` and `met`.
    """
    goals: list[dict[str, Any]] = []
    kernels = data["suites"].get("kernels")
    if kernels is not None:
        cfg = kernels["config"]
        heads = cfg["batch"] * cfg["heads"]
        flash = _find(data, "kernels", "flash_attention", FORWARD, 4096)
        if flash is not None:
            scores = heads * 4096 * 4096 * 4
            goals.append(
                {
                    "goal": "flash_attention forward, T=4096: time / torch SDPA",
                    "value": flash["ratio_to_baseline"]["median"],
                    "target": "<= 1.3",
                    "met": flash["ratio_to_baseline"]["median"] <= 1.3,
                }
            )
            goals.append(
                {
                    "goal": "flash_attention forward, T=4096: peak extra memory / score tensor",
                    "value": flash["peak_extra_bytes"] / scores,
                    "target": "<= 0.10",
                    "met": flash["peak_extra_bytes"] <= 0.10 * scores,
                }
            )
        flash = _find(data, "kernels", "flash_attention", FORWARD_BACKWARD, 2048)
        naive = _find(data, "kernels", "naive", FORWARD_BACKWARD, 2048)
        if flash is not None:
            goals.append(
                {
                    "goal": "flash_attention forward+backward, T=2048: time / torch SDPA",
                    "value": flash["ratio_to_baseline"]["median"],
                    "target": "<= 3.0",
                    "met": flash["ratio_to_baseline"]["median"] <= 3.0,
                }
            )
        if flash is not None and naive is not None and naive["peak_extra_bytes"] > 0:
            goals.append(
                {
                    "goal": "flash_attention forward+backward, T=2048: peak memory / naive's",
                    "value": flash["peak_extra_bytes"] / naive["peak_extra_bytes"],
                    "target": "<= 0.25",
                    "met": flash["peak_extra_bytes"] <= 0.25 * naive["peak_extra_bytes"],
                }
            )
    modules = data["suites"].get("modules", {}).get("results", [])
    for r in sorted(modules, key=lambda r: r["seq_len"]):
        if r["impl"] != "MultiHeadAttention[torch]" or r["mode"] != FORWARD:
            continue
        if r["seq_len"] < 128:
            continue  # the tiny sizes of --quick decide nothing
        speed = 1.0 / r["ratio_to_baseline"]["median"]
        goals.append(
            {
                "goal": f"MultiHeadAttention (fused) forward, t={r['seq_len']}: speed / "
                "nn.MultiheadAttention(need_weights=False)",
                "value": speed,
                "target": ">= 0.95",
                "met": speed >= 0.95,
            }
        )
    window = data["suites"].get("window")
    if window is not None:
        name = f"flash_attention[window={window['config']['window']}]"
        rows = {
            r["seq_len"]: r["time_s"]["median"]
            for r in window["results"]
            if r["impl"] == name and r["mode"] == FORWARD
        }
        for t in sorted(rows):
            # From 4 windows on: shorter sequences still have many queries whose window
            # is cut by the start of the sequence, so their cost is not yet linear.
            if 2 * t in rows and t >= 4 * window["config"]["window"]:
                growth = rows[2 * t] / (2 * rows[t])
                goals.append(
                    {
                        "goal": f"{name} forward, T={t} to {2 * t}: growth of the time per token",
                        "value": growth,
                        "target": "<= 1.2",
                        "met": growth <= 1.2,
                    }
                )
    return goals
