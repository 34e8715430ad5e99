"""Measurements: peak extra memory of one call, the machine's matmul peak, its load."""

from __future__ import annotations

import contextlib
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from attnlab.rules._provenance import Start, provenance

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


@contextlib.contextmanager
def empty_inductor_cache() -> Iterator[None]:
    """A fresh, empty inductor cache folder for the block, and dynamo's caches reset on
    the way in and out, so that the block's first compile is a cold one; the folder goes
    afterwards and the previous `TORCHINDUCTOR_CACHE_DIR` comes back."""
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="attnlab-inductor-") as folder:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
        torch._dynamo.reset()
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
            torch._dynamo.reset()


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


class CpuUse:
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

    def provenance(self, command: str, since: Start, **extra: Any) -> dict[str, Any]:
        """A benchmark record's provenance: `attnlab.rules._provenance.provenance`, then the
        share of CPU time other processes took since this object was made, then `extra`
        (the recorder's own keys, e.g. its seed), in that order."""
        return {
            **provenance(command, since=since),
            "other_processes_cpu_share": self.others_share(),
            **extra,
        }


def summary(values: Sequence[float]) -> dict[str, float]:
    """The median, min and max of `values`."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def interleaved(
    calls: Mapping[str, Callable[[], object]], rounds: int, order: random.Random
) -> dict[str, list[float]]:
    """Wall seconds of each call per round; every round runs all once, shuffled.

    Interleaving spreads a spell of load on a shared machine over every side alike,
    so ratios taken round by round (`ratio_summary`) are fair.
    """
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        names = list(calls)
        order.shuffle(names)
        for name in names:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return times


def ratio_summary(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, float]:
    """`summary` of the per-round ratios `numerator[i] / denominator[i]`."""
    return summary([a / b for a, b in zip(numerator, denominator, strict=True)])


def round_floats(x: Any, digits: int = 4) -> Any:
    """Round floats to `digits` significant digits, recursively, so the JSON stays small."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: round_floats(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [round_floats(v, digits) for v in x]
    return x
