r"""Benchmark harness: time, peak memory and FLOP rate of every attention in attnlab.

Run it as `python -m attnlab.bench` (or `attnlab-bench`); `--help` lists the options. It
sweeps the sequence length for two suites:

- **kernels**: attention on ready-made `(b, h, T, head_dim)` queries, keys and values,
  causal: the naive `softmax(QK^T)V` that stores the scores,
  [`flash_attention`][attnlab.flash.flash_attention], and PyTorch's fused
  `scaled_dot_product_attention` (the baseline);
- **modules**: self-attention layers on `(b, t, d_model)` tokens: the article's
  [`SelfAttention`][attnlab.SelfAttention] (one head as wide as the model) and
  [`MultiHeadAttentionWrapper`][attnlab.MultiHeadAttentionWrapper],
  [`MultiHeadAttention`][attnlab.MultiHeadAttention] on PyTorch's fused kernel and on
  attnlab's from-scratch one, and `nn.MultiheadAttention` with `need_weights=False`
  (the baseline, which runs the fused kernel) and with its default `need_weights=True`.

Each configuration runs in two modes: `forward` (under `torch.no_grad()`, modules in
eval mode) and `forward+backward` (the forward, then `backward()` of a fixed random
output gradient into the inputs and parameters). For each it reports:

- the median, min and max wall time over repeats that are *interleaved*: round $r$ runs
  every implementation once, in a shuffled order, before round $r + 1$ starts, so a
  slow spell of a shared machine hits all of them alike;
- the ratio to the suite's baseline, as the median of the per-round ratios;
- the peak extra memory: the most bytes held by tensors allocated during one call above
  what was held when it started (outputs and gradients included), read from the
  allocation events of PyTorch's profiler, which sees every CPU tensor allocation, also
  those inside fused kernels (allocations of MKL's own workspace are not seen);
- the achieved GFLOP/s of the useful matmul work (see `count_flops`) and its share of the
  machine's matmul peak, measured at start as the best rate of large float32 matmuls.

It writes `bench.json` (results and provenance: versions, CPU, threads, date, command, how
busy the machine was) and one PNG of time and one of memory per suite.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import attnlab
from attnlab.flash import flash_attention

__all__ = [
    "SCHEMA_VERSION",
    "SuiteConfig",
    "count_flops",
    "goals_markdown",
    "main",
    "measure_matmul_peak",
    "naive_attention",
    "peak_extra_bytes",
    "provenance_markdown",
    "results_markdown",
    "run",
    "write_plots",
]

SCHEMA_VERSION = 1
"""Version of the layout of `bench.json`; bumped when a field changes meaning."""

FORWARD = "forward"
FORWARD_BACKWARD = "forward+backward"
MODES = (FORWARD, FORWARD_BACKWARD)


@dataclass(frozen=True)
class SuiteConfig:
    """Sizes of one suite: batch, heads, head or model width, and the lengths per mode.

    `longest` caps the length for some (implementation, mode) pairs: the naive kernel
    would need 16 GiB at 8192 tokens.
    """

    batch: int
    heads: int
    width: int  # head_dim for "kernels", d_model for "modules"
    seq_lens: dict[str, tuple[int, ...]]
    longest: dict[tuple[str, str], int] = field(default_factory=dict)

    def runs(self, impl: str, mode: str, seq_len: int) -> bool:
        """Whether `impl` is measured at `seq_len` in `mode`."""
        return seq_len <= self.longest.get((impl, mode), seq_len)


FULL = {
    "kernels": SuiteConfig(
        batch=4,
        heads=8,
        width=64,
        seq_lens={
            FORWARD: (256, 512, 1024, 2048, 4096, 8192),
            FORWARD_BACKWARD: (256, 512, 1024, 2048, 4096),
        },
        longest={("naive", FORWARD): 4096, ("naive", FORWARD_BACKWARD): 2048},
    ),
    "modules": SuiteConfig(
        batch=4,
        heads=8,
        width=512,
        seq_lens={FORWARD: (128, 256, 512, 1024), FORWARD_BACKWARD: (128, 256, 512, 1024)},
    ),
}
QUICK = {
    "kernels": SuiteConfig(
        batch=1,
        heads=2,
        width=8,
        seq_lens={FORWARD: (16, 24), FORWARD_BACKWARD: (16, 24)},
        longest={("naive", FORWARD_BACKWARD): 16},
    ),
    "modules": SuiteConfig(
        batch=1, heads=2, width=16, seq_lens={FORWARD: (16, 24), FORWARD_BACKWARD: (16, 24)}
    ),
}
BASELINES = {"kernels": "torch_sdpa", "modules": "nn.MultiheadAttention[need_weights=False]"}


# ---------------------------------------------------------------------------------------
# Implementations


def naive_attention(query: Tensor, key: Tensor, value: Tensor, *, is_causal: bool) -> Tensor:
    r"""Attention that stores the scores: $\operatorname{softmax}(QK^\top / \sqrt{E})\,V$.

    The textbook version, written to hold as little as a materializing implementation can:
    the `(..., L, S)` scores are masked in place, so only the scores and the weights are
    held at once.

    Args:
        query: Queries, `(..., L, E)`.
        key: Keys, `(..., S, E)`.
        value: Values, `(..., S, Ev)`.
        is_causal: Hide key $j$ from query $i$ when $j > i$ (top-left aligned).

    Returns:
        Context vectors, `(..., L, Ev)`.

    Examples:
        >>> q = k = v = torch.eye(2)
        >>> naive_attention(q, k, v, is_causal=True)
        tensor([[1.0000, 0.0000],
                [0.3302, 0.6698]])
    """
    scores = (query / math.sqrt(query.shape[-1])) @ key.transpose(-2, -1)  # (..., L, S)
    if is_causal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores.masked_fill_(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ value  # (..., L, Ev)


@dataclass
class Case:
    """One implementation at one size: `call()` runs it once, as the mode says."""

    suite: str
    impl: str
    mode: str
    seq_len: int
    call: Callable[[], None]
    flops: float
    extra: dict[str, Any] = field(default_factory=dict)


def count_flops(suite: str, config: SuiteConfig, seq_len: int, impl: str, mode: str) -> float:
    r"""Useful floating-point operations of one call, counting matmuls only.

    A matmul of `(m, k)` by `(k, n)` counts $2mkn$. Attention over $P$ visible
    (query, key) pairs costs $2 \cdot 2 P d$ per head (scores, then weights times values);
    causal attention with `L = S = T` has $P = T(T+1)/2$, the pairs a kernel must compute,
    whatever extra it computes in practice. Projections of `t` tokens from $d$ to $d$
    features cost $2 t d^2$ each: three for the article's modules, four with the output
    projection. The backward pass is counted as twice the forward, so forward+backward is
    three times the forward: work a kernel redoes (FlashAttention's recomputed scores)
    is not counted as useful.

    Args:
        suite: `"kernels"` or `"modules"`.
        config: The suite's sizes.
        seq_len: Sequence length $T$.
        impl: Name of the implementation (the projections differ between modules).
        mode: `"forward"` or `"forward+backward"`.

    Returns:
        The number of operations.

    Examples:
        >>> config = SuiteConfig(batch=1, heads=1, width=2, seq_lens={})
        >>> count_flops("kernels", config, 3, "torch_sdpa", "forward")  # 6 pairs * 2 * 2 * 2
        48.0
    """
    b, h, w, t = config.batch, config.heads, config.width, seq_len
    if suite == "kernels":
        forward = 4.0 * b * h * w * (t * (t + 1) // 2)
    else:
        projections = 3 if impl in ("SelfAttention", "MultiHeadAttentionWrapper") else 4
        forward = 2.0 * b * t * w * w * projections + 4.0 * b * t * t * w
    return forward if mode == FORWARD else 3.0 * forward


def _timed_call(
    fn: Callable[[], Tensor], inputs: Sequence[Tensor], mode: str
) -> Callable[[], None]:
    """Wrap `fn` into one forward (no grad) or one forward+backward call."""
    if mode == FORWARD:

        def forward() -> None:
            with torch.no_grad():
                fn()

        return forward

    grad: list[Tensor] = []

    def forward_backward() -> None:
        out = fn()
        if not grad:
            grad.append(torch.randn_like(out))
        out.backward(grad[0])  # type: ignore[no-untyped-call]
        for x in inputs:
            x.grad = None

    return forward_backward


def _kernel_cases(config: SuiteConfig, seq_len: int, mode: str) -> Iterator[Case]:
    b, h, d = config.batch, config.heads, config.width
    needs_grad = mode == FORWARD_BACKWARD
    q, k, v = (torch.randn(b, h, seq_len, d, requires_grad=needs_grad) for _ in range(3))
    impls: dict[str, Callable[[], Tensor]] = {
        "naive": lambda: naive_attention(q, k, v, is_causal=True),
        "flash_attention": lambda: flash_attention(q, k, v, is_causal=True),
        "torch_sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True
        ),
    }
    for name, fn in impls.items():
        yield Case(
            "kernels",
            name,
            mode,
            seq_len,
            _timed_call(fn, (q, k, v), mode),
            count_flops("kernels", config, seq_len, name, mode),
        )


def _module_impls(config: SuiteConfig) -> dict[str, nn.Module]:
    """The modules compared, built fresh (random weights) with the suite's sizes."""
    d, heads = config.width, config.heads
    modules: dict[str, nn.Module] = {
        "SelfAttention": attnlab.SelfAttention(d, d, d),
        "MultiHeadAttentionWrapper": attnlab.MultiHeadAttentionWrapper(
            d, d // heads, d // heads, heads
        ),
    }
    mha = getattr(attnlab, "MultiHeadAttention", None)
    if mha is not None:
        modules["MultiHeadAttention[torch]"] = mha(d, d, heads, backend="torch")
        modules["MultiHeadAttention[scratch]"] = mha(d, d, heads, backend="scratch")
    modules["nn.MultiheadAttention[need_weights=False]"] = nn.MultiheadAttention(
        d, heads, batch_first=True
    )
    modules["nn.MultiheadAttention[default]"] = nn.MultiheadAttention(d, heads, batch_first=True)
    return modules


def _module_call(name: str, module: nn.Module, x: Tensor) -> Callable[[], Tensor]:
    """One forward of `module` on `x`, as each kind of module is called."""
    if name == "nn.MultiheadAttention[need_weights=False]":
        return lambda: module(x, x, x, need_weights=False)[0]
    if name == "nn.MultiheadAttention[default]":
        return lambda: module(x, x, x)[0]
    return lambda: module(x)


def _module_cases(config: SuiteConfig, seq_len: int, mode: str) -> Iterator[Case]:
    x = torch.randn(config.batch, seq_len, config.width, requires_grad=mode == FORWARD_BACKWARD)
    for name, module in _module_impls(config).items():
        module.eval()  # no dropout; lets nn.MultiheadAttention take its fast path in inference
        call = _timed_call(_module_call(name, module, x), (x, *module.parameters()), mode)
        yield Case(
            "modules",
            name,
            mode,
            seq_len,
            call,
            count_flops("modules", config, seq_len, name, mode),
        )


_CASES = {"kernels": _kernel_cases, "modules": _module_cases}


# ---------------------------------------------------------------------------------------
# Measurements


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send what C++ code writes to file descriptor 2 to /dev/null for a moment."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 to redirect
        yield
        return
    try:
        with open(os.devnull, "w", encoding="ascii") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_extra_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes of CPU tensors allocated while `fn()` runs, above the level at its start.

    Runs `fn` once under `torch.profiler.profile(profile_memory=True)` and replays the
    allocation events it records: each carries the allocator's running total, so the peak
    is the largest total seen minus the total before the first event. Every tensor
    allocation through PyTorch's CPU allocator is seen, including the temporaries of
    fused kernels; memory that a library such as MKL allocates for itself is not.

    Args:
        fn: The call to measure; its result is dropped inside the measurement.

    Returns:
        The peak extra bytes (0 if `fn` allocates nothing).

    Examples:
        >>> peak_extra_bytes(lambda: torch.empty(1024, dtype=torch.float32))
        4096
    """
    from torch._C._profiler import _ExtraFields_Allocation
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():  # the profiler writes a line to fd 2 when it starts and stops
        prof.start()
    try:
        fn()
    finally:
        with _quiet_stderr():
            prof.stop()
    results = prof.profiler.kineto_results if prof.profiler is not None else None
    if results is None:
        return 0
    events: list[tuple[int, int, int]] = []  # (time, bytes allocated (<0: freed), total after)
    stack = list(results.experimental_event_tree())
    while stack:
        event = stack.pop()
        extra = event.extra_fields
        if isinstance(extra, _ExtraFields_Allocation) and extra.device.type == "cpu":
            events.append((event.start_time_ns, extra.alloc_size, extra.total_allocated))
        stack.extend(event.children)
    if not events:
        return 0
    events.sort()
    start = events[0][2] - events[0][1]
    return max(0, max(total for _, _, total in events) - start)


def measure_matmul_peak(sizes: Sequence[int] = (1024, 2048), repeats: int = 5) -> dict[str, Any]:
    """The machine's float32 matmul rate: the best GFLOP/s of `repeats` square matmuls.

    Args:
        sizes: Sides `n` of the `(n, n) @ (n, n)` products to try.
        repeats: Timed products per size, after one warm-up.

    Returns:
        `{"gflops": best rate, "size": n of the best, "per_size": {n: best rate}}`.

    Examples:
        >>> peak = measure_matmul_peak(sizes=(64,), repeats=2)
        >>> peak["gflops"] > 0
        True
    """
    per_size: dict[int, float] = {}
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # warm-up
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        per_size[n] = 2.0 * n**3 / best / 1e9
    size = max(per_size, key=lambda n: per_size[n])
    return {"gflops": per_size[size], "size": size, "per_size": per_size}


class _CpuUse:
    """CPU time used by other processes while the benchmark runs (Linux /proc only)."""

    def __init__(self) -> None:
        self.start = self._read()
        self.wall = time.perf_counter()

    @staticmethod
    def _read() -> tuple[float, float] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = [float(x) for x in f.readline().split()[1:]]
            with open("/proc/self/stat", encoding="ascii") as f:
                own = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError, IndexError):
            return None
        ticks = float(os.sysconf("SC_CLK_TCK"))
        busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0.0)  # - idle, iowait
        return busy / ticks, (float(own[11]) + float(own[12])) / ticks  # utime + stime

    def others_share(self) -> float | None:
        """Share of all CPUs' time, since start, that other processes used (0 to 1)."""
        end = self._read()
        if self.start is None or end is None:
            return None
        wall = time.perf_counter() - self.wall
        others = (end[0] - self.start[0]) - (end[1] - self.start[1])
        return max(0.0, others / (wall * (os.cpu_count() or 1)))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def _round(x: Any, digits: int = 4) -> Any:
    """Round floats to `digits` significant digits, recursively, so the JSON stays small."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _round(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v, digits) for v in x]
    return x


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
        if suite not in _CASES:
            raise ValueError(f"unknown suite {suite!r}; choose from {sorted(_CASES)}")
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose from {list(MODES)}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    torch.manual_seed(seed)
    order = random.Random(seed)
    load_before = os.getloadavg()
    cpu_use = _CpuUse()
    started = _dt.datetime.now(_dt.timezone.utc)
    peak = measure_matmul_peak(matmul_sizes)
    groups = [(s, m, t) for s in suites for m in modes for t in plan[s].seq_lens.get(m, ())]
    names = {"kernels": ["naive", "flash_attention", "torch_sdpa"]}
    names["modules"] = list(_module_impls(QUICK["modules"]))
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
                for c in _CASES[suite](plan[suite], seq_len, mode)
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
                        "time_s": {**_summary(times[case.impl]), "repeats": len(times[case.impl])},
                        "ratio_to_baseline": None if ratios is None else _summary(ratios),
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
            "cpu_model": _cpu_model(),
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
    data["goals"] = _goals(data)
    return _round(data)  # type: ignore[no-any-return]


def _find(data: dict[str, Any], suite: str, impl: str, mode: str, t: int) -> dict[str, Any] | None:
    for r in data["suites"].get(suite, {}).get("results", []):
        if r["impl"] == impl and r["mode"] == mode and r["seq_len"] == t:
            return r  # type: ignore[no-any-return]
    return None


def _goals(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals that this run's data can decide, each with its value and target."""
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


# ---------------------------------------------------------------------------------------
# Command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attnlab.bench",
        description="Time and measure the memory of attnlab's attention implementations "
        "against PyTorch's, and write bench.json and PNG plots.",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("bench-results"),
        help="folder for bench.json and the plots (default: %(default)s)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, 2 repeats: checks that everything runs (seconds)",
    )
    parser.add_argument(
        "--suites", nargs="+", choices=sorted(_CASES), default=["kernels", "modules"]
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--seq-lens",
        nargs="+",
        type=int,
        default=None,
        help="override every suite's sequence lengths",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed rounds per size (default: 7, or 2 with --quick)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads before running (default: PyTorch's)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--note", default="", help="free text stored in the provenance, e.g. what else ran"
    )
    parser.add_argument("--no-plots", action="store_true", help="write bench.json only")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m attnlab.bench` and `attnlab-bench`.

    Args:
        argv: Command-line arguments (default: `sys.argv[1:]`).

    Returns:
        The exit status, 0 on success.
    """
    args = _parser().parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        return _main(args, argv)
    finally:
        torch.set_num_threads(threads)


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    base = QUICK if args.quick else FULL
    plan = base
    if args.seq_lens is not None:
        plan = {
            s: SuiteConfig(
                c.batch, c.heads, c.width, {m: tuple(args.seq_lens) for m in MODES}, c.longest
            )
            for s, c in base.items()
        }
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 7)
    data = run(
        suites=args.suites,
        modes=args.modes,
        plan=plan,
        repeats=repeats,
        seed=args.seed,
        progress=not args.no_progress,
        matmul_sizes=(128,) if args.quick else (1024, 2048),
    )
    data["provenance"]["command"] = shlex.join(["python", "-m", "attnlab.bench", *argv])
    data["provenance"]["note"] = args.note
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench.json"
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    written = [path] if args.no_plots else [path, *write_plots(data, out_dir)]
    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
