"""Run the suites: interleaved timed rounds, memory, and the goals the data decides."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

import attnlab
from attnlab.bench.cases import CASES, module_impls
from attnlab.bench.config import (
    BASELINES,
    FORWARD,
    FORWARD_BACKWARD,
    FULL,
    MODES,
    QUICK,
    SCHEMA_VERSION,
    SuiteConfig,
)
from attnlab.bench.measure import (
    CpuUse,
    cpu_model,
    measure_matmul_peak,
    peak_extra_bytes,
    round_floats,
    summary,
)


def run(
    *,
    suites: Sequence[str] = ("kernels", "modules"),
    modes: Sequence[str] = MODES,
    plan: dict[str, SuiteConfig] | None = None,
    repeats: int = 7,
    seed: int = 0,
    progress: bool = True,
    matmul_sizes: Sequence[int] = (1024, 2048),
) -> dict[str, Any]:
    """Run the benchmarks and return the results as a JSON-ready dict.

    Args:
        suites: Which suites to run, among `"kernels"` and `"modules"`.
        modes: Which modes, among `"forward"` and `"forward+backward"`.
        plan: Sizes per suite; the full sizes (`FULL`) by default.
        repeats: Timed rounds per size and mode (each runs every implementation once).
        seed: Seed of the inputs, the weights and the shuffled order of each round.
        progress: Show a progress bar (tqdm) on stderr.
        matmul_sizes: Square matmul sizes used to measure the machine's peak.

    Returns:
        A dict with `schema`, `provenance`, `matmul_peak`, `memory_method`, `suites`
        (each with its `config`, `baseline` and `results`) and `goals`.
    """
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    plan = FULL if plan is None else plan
    for suite in suites:
        if suite not in CASES:
            raise ValueError(f"unknown suite {suite!r}; choose from {sorted(CASES)}")
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose from {list(MODES)}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    torch.manual_seed(seed)
    order = random.Random(seed)
    load_before = os.getloadavg()
    cpu_use = CpuUse()
    started = _dt.datetime.now(_dt.timezone.utc)
    peak = measure_matmul_peak(matmul_sizes)
    groups = [(s, m, t) for s in suites for m in modes for t in plan[s].seq_lens.get(m, ())]
    names = {"kernels": ["naive", "flash_attention", "torch_sdpa"]}
    names["modules"] = list(module_impls(QUICK["modules"]))
    total = (repeats + 2) * sum(sum(plan[s].runs(i, m, t) for i in names[s]) for s, m, t in groups)
    out_suites: dict[str, dict[str, Any]] = {
        s: {
            "config": {
                "batch": plan[s].batch,
                "heads": plan[s].heads,
                ("head_dim" if s == "kernels" else "d_model"): plan[s].width,
                "causal": s == "kernels",
                "dtype": "float32",
            },
            "baseline": BASELINES[s],
            "results": [],
        }
        for s in suites
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
                    times[case.impl].append(time.perf_counter() - start)
                    bar.update()
            baseline = times.get(BASELINES[suite])
            for case in sorted(cases, key=lambda c: c.impl):
                memory = peak_extra_bytes(case.call)
                bar.update()
                median = statistics.median(times[case.impl])
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
                        "flops": case.flops,
                        "gflops": case.flops / median / 1e9,
                        "share_of_peak": case.flops / median / 1e9 / peak["gflops"],
                    }
                )
            del cases  # frees this size's inputs before the next size allocates its own
    finished = _dt.datetime.now(_dt.timezone.utc)
    data: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "provenance": {
            "command": "",
            "date": started.isoformat(timespec="seconds"),
            "duration_s": (finished - started).total_seconds(),
            "torch": torch.__version__,
            "attnlab": attnlab.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_model": cpu_model(),
            "logical_cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
            "other_processes_cpu_share": cpu_use.others_share(),
            "repeats": repeats,
            "seed": seed,
        },
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
    data["goals"] = evaluate_goals(data)
    return round_floats(data)  # type: ignore[no-any-return]


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
    mha = _find(data, "modules", "MultiHeadAttention[torch]", FORWARD, 1024)
    if mha is not None:
        speed = 1.0 / mha["ratio_to_baseline"]["median"]
        goals.append(
            {
                "goal": "MultiHeadAttention (fused) forward, t=1024: speed / "
                "nn.MultiheadAttention(need_weights=False)",
                "value": speed,
                "target": ">= 0.95",
                "met": speed >= 0.95,
            }
        )
    return goals
