"""Benchmark of ring attention: per-rank memory, time and bytes at 1, 2, 4 and 8 ranks.

    python -m attnlab.tools.bench.ring --out docs/assets/ring/bench.json

Each world size is a fresh group of spawned processes (gloo on 127.0.0.1). A rank draws
the whole batch from one seed, keeps its shard and frees the rest, then measures one
forward and backward pass of [`ring_attention`][attnlab.distributed.ring_attention]:
its peak resident memory above what it held before (Linux: `VmHWM` of
`/proc/self/status`, reset through `/proc/self/clear_refs`), the wall time of each pass
(the slowest rank's is the step time) and the bytes it sent. With the default sizes
(T=8192, b=1, h=8, d=64, causal) the committed run took about a minute on an otherwise
idle 2-core machine, with `MALLOC_MMAP_THRESHOLD_=131072` set for steadier figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from attnlab.distributed.demo import add_shape_arguments
from attnlab.distributed.launch import spawn
from attnlab.distributed.ring import RingStats, ShardLayout, ring_attention, shard_sequence
from attnlab.rules._provenance import begin, command_line, provenance
from attnlab.tools.bench.measure import peak_extra_bytes

__all__ = ["bench_rank", "format_results", "main", "run_bench"]


def _memory_kib() -> dict[str, int]:
    """VmRSS and VmHWM (peak) of this process, in KiB."""
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(("VmRSS", "VmHWM")):
                name, value = line.split(":")
                found[name] = int(value.split()[0])
    return found


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # "reset the peak resident set size" (Linux >= 4.0)


def bench_rank(
    rank: int,
    world_size: int,
    length: int,
    heads: int,
    head_dim: int,
    layout: ShardLayout,
    is_causal: bool = True,
) -> dict[str, Any]:
    """One rank of the benchmark (the group is initialised); returns its measurements."""
    g = torch.Generator().manual_seed(0)
    local = []
    for _ in range(4):  # q, k, v and the gradient of the output, (1, h, T, d) each
        whole = torch.randn(1, heads, length, head_dim, generator=g)
        local.append(shard_sequence(whole, world_size, rank, layout=layout))
        del whole
    gc.collect()
    q, k, v = (x.requires_grad_() for x in local[:3])
    # Warm-up on 2 positions per rank: gloo connects the ring's pairs on first use.
    tiny = torch.randn(1, 1, 2 * world_size, 8, generator=g)
    tiny = shard_sequence(tiny, world_size, rank).requires_grad_()
    torch.autograd.backward(ring_attention(tiny, tiny, tiny, is_causal=is_causal).sum())
    _reset_peak()
    before = _memory_kib()["VmRSS"]
    stats = RingStats()
    dist.barrier()
    start = time.perf_counter()
    out = ring_attention(q, k, v, is_causal=is_causal, layout=layout, stats=stats)
    forward_seconds = time.perf_counter() - start
    forward = dataclasses.replace(stats)  # a copy, before the backward adds to it
    dist.barrier()
    start = time.perf_counter()
    torch.autograd.backward(out, local[3])
    backward_seconds = time.perf_counter() - start
    peak = _memory_kib()["VmHWM"]
    # A second, untimed pass counts the tensors that ring attention allocates (output,
    # log-sum-exp, gradients, blocks in flight, tiles) with PyTorch's allocator: exact,
    # where the resident pages above also hold what the allocator keeps for reuse.
    del out
    q.grad = k.grad = v.grad = None
    dist.barrier()

    def step() -> None:
        out = ring_attention(q, k, v, is_causal=is_causal, layout=layout)
        torch.autograd.backward(out, local[3])

    tensor_peak = peak_extra_bytes(step)
    return {
        "rank": rank,
        "positions": q.shape[-2],
        "input_bytes": sum(x.numel() * x.element_size() for x in local),
        "peak_extra_bytes": (peak - before) * 1024,
        "tensor_peak_bytes": tensor_peak,
        "forward_seconds": forward_seconds,
        "backward_seconds": backward_seconds,
        "forward_score_entries": forward.score_entries,
        "forward_bytes_sent": forward.bytes_sent,
        "forward_compute_seconds": forward.compute_seconds,
        "bytes_sent": stats.bytes_sent,
        "compute_seconds": stats.compute_seconds,
        "wait_seconds": stats.wait_seconds,
    }


def run_bench(
    world_sizes: Sequence[int] = (1, 2, 4, 8),
    *,
    length: int = 8192,
    heads: int = 8,
    head_dim: int = 64,
    layouts: Sequence[ShardLayout] = ("contiguous", "zigzag"),
    timeout: float = 600.0,
    command: str = "",
) -> dict[str, Any]:
    """Measure every world size and layout; return the results with their provenance.

    `command` is the command line recorded in the provenance.
    """
    begun = begin()
    runs = []
    for world_size in world_sizes:
        for layout in layouts if world_size > 1 else layouts[:1]:
            ranks = spawn(bench_rank, world_size, length, heads, head_dim, layout, timeout=timeout)
            runs.append({"world_size": world_size, "layout": layout, "ranks": ranks})
    return {
        "config": {
            "length": length,
            "batch": 1,
            "heads": heads,
            "head_dim": head_dim,
            "is_causal": True,
            "dtype": "float32",
            "backend": "gloo",
        },
        "provenance": provenance(command, begun),
        "runs": runs,
    }


def format_results(results: dict[str, Any]) -> str:
    """A table with one line per world size and layout.

    *tensors* is the largest rank's shard (q, k, v and the output's gradient) plus the
    peak of the tensors ring attention allocates on top, counted by PyTorch's allocator;
    *RSS* is the shard plus the peak resident memory on top, as the operating system
    counts it (it also holds what the allocator keeps for reuse). *vs 1* divides by the
    one-rank figure. Times are the slowest rank's; *MiB sent* is per rank, forward and
    backward; *work* is the ratio of the largest to the smallest count of score entries
    computed in the forward pass, *busy* the same ratio of the seconds spent computing
    (measured).
    """
    runs = results["runs"]

    def tensors(ranks: list[dict[str, Any]]) -> int:
        return max(int(r["tensor_peak_bytes"] + r["input_bytes"]) for r in ranks)

    def rss(ranks: list[dict[str, Any]]) -> int:
        return max(int(r["peak_extra_bytes"] + r["input_bytes"]) for r in ranks)

    base_tensors, base_rss = tensors(runs[0]["ranks"]), rss(runs[0]["ranks"])
    lines = [
        "ranks  layout      tensors MiB  vs 1  RSS MiB  vs 1  fwd+bwd (s)  MiB sent  work  busy"
    ]
    for run in runs:
        ranks = run["ranks"]
        step = max(r["forward_seconds"] + r["backward_seconds"] for r in ranks)
        sent = max(r["bytes_sent"] for r in ranks)
        work = [r["forward_score_entries"] for r in ranks]
        busy = [r["forward_compute_seconds"] for r in ranks]  # measured, forward
        lines.append(
            f"{run['world_size']:>5}  {run['layout']:<10} "
            f"{tensors(ranks) / 2**20:>11.1f} {tensors(ranks) / base_tensors:>5.2f} "
            f"{rss(ranks) / 2**20:>8.1f} {rss(ranks) / base_rss:>5.2f} {step:>12.2f} "
            f"{sent / 2**20:>9.1f} {max(work) / max(1, min(work)):>5.2f} "
            f"{max(busy) / min(busy):>5.2f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: run the benchmark, print the table, optionally save JSON."""
    parser = argparse.ArgumentParser(prog="python -m attnlab.tools.bench.ring")
    add_shape_arguments(parser, length=8192, heads=8, head_dim=64)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    results = run_bench(
        args.world_sizes,
        length=args.length,
        heads=args.heads,
        head_dim=args.head_dim,
        command=command_line("attnlab.tools.bench.ring", argv),
    )
    print(format_results(results))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
