"""Ring attention on several processes of this machine, checked against one process.

Two ways to start it:

    python -m attnlab.distributed.demo --world-size 4      # spawns 4 processes
    torchrun --nproc-per-node 4 -m attnlab.distributed.demo

Every rank draws the same random batch from one seed, keeps its shard, runs
[`ring_attention`][attnlab.distributed.ring_attention] forward and backward, and
compares its outputs and gradients with PyTorch's single-process
`scaled_dot_product_attention` on the whole sequence. Rank 0 (or the parent) prints one
row per rank: the positions it holds, its work, the bytes it sent and the largest
difference from the reference.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from attnlab.distributed.launch import spawn
from attnlab.distributed.ring import (
    RingStats,
    ShardLayout,
    ring_attention,
    shard_ranges,
    shard_sequence,
)
from attnlab.rules._provenance import begin, command_line, provenance

__all__ = [
    "add_shape_arguments",
    "demo_rank",
    "format_rows",
    "hello",
    "main",
    "run_demo",
    "torch_context_parallel",
]


def hello(rank: int, world_size: int) -> str:
    """The smallest function for `spawn`: say which rank this is."""
    return f"rank {rank} of {world_size}"


def demo_rank(
    rank: int,
    world_size: int,
    length: int = 1000,
    heads: int = 4,
    head_dim: int = 16,
    is_causal: bool = True,
    layout: ShardLayout = "zigzag",
    seed: int = 0,
) -> dict[str, Any]:
    """One rank of the demo (the process group is already initialised); returns its row."""
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    g = torch.Generator().manual_seed(seed)
    # (b, h, T, d): the same whole batch on every rank, from one seed
    q, k, v, grad_out = (torch.randn(2, heads, length, head_dim, generator=g) for _ in range(4))
    local = [
        shard_sequence(x, world_size, rank, layout=layout).to(device) for x in (q, k, v, grad_out)
    ]
    mine = [x.requires_grad_() for x in local[:3]]
    stats = RingStats()
    out = ring_attention(*mine, is_causal=is_causal, layout=layout, stats=stats)
    forward = dataclasses.replace(stats)
    torch.autograd.backward(out, local[3])
    # The reference: one process, the whole sequence, then this rank's rows of it.
    whole = [x.clone().requires_grad_() for x in (q, k, v)]
    reference = torch.nn.functional.scaled_dot_product_attention(
        whole[0], whole[1], whole[2], is_causal=is_causal
    )
    torch.autograd.backward(reference, grad_out)
    expected = [reference.detach(), *(x.grad for x in whole)]
    got = [out.detach(), *(x.grad for x in mine)]
    errors = [
        (a.cpu() - shard_sequence(b, world_size, rank, layout=layout)).abs().max().item()
        for a, b in zip(got, expected, strict=True)
        if a is not None and b is not None
    ]
    return {
        "rank": rank,
        "ranges": shard_ranges(length, world_size, layout)[rank],
        "score_entries": forward.score_entries,
        "bytes_sent": forward.bytes_sent,
        "max_error_out": errors[0],
        "max_error_grad": max(errors[1:]),
    }


def torch_context_parallel(
    rank: int, world_size: int, length: int = 1000, heads: int = 4, head_dim: int = 16
) -> dict[str, Any]:
    """Try PyTorch's own context parallelism on this rank; return its error or result.

    `torch.distributed.tensor.experimental.context_parallel` shards the given buffers
    along the sequence on a device mesh and replaces `scaled_dot_product_attention` by a
    ring over the mesh while the context is open. Each rank compares its shard of the
    output with the single-process result.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, heads, length, head_dim, generator=g) for _ in range(3))
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    q, k, v, reference = (x.to(device) for x in (q, k, v, reference))
    try:
        mesh = init_device_mesh(device, (world_size,))
        buffers = [q, k, v, reference]  # sharded in place along dim 2 by the context
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2, 2]):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return {"rank": rank, "max_error_out": (out - reference).abs().max().item()}
    except Exception as error:  # what it raises here is the result we report
        return {"rank": rank, "error": f"{type(error).__name__}: {error}"}


def run_demo(world_size: int, *, timeout: float = 60.0, **kwargs: Any) -> list[dict[str, Any]]:
    """Spawn `world_size` processes on 127.0.0.1 and return the row of every rank.

    Args:
        world_size: Number of processes.
        timeout: Seconds any rank may wait for another before it fails.
        **kwargs: `length`, `heads`, `head_dim`, `is_causal`, `layout`, `seed` of
            `demo_rank`.

    Returns:
        One dict per rank.
    """
    names = ("length", "heads", "head_dim", "is_causal", "layout", "seed")
    defaults = dict(zip(names, demo_rank.__defaults__ or (), strict=True))
    args = [kwargs.get(name, defaults[name]) for name in names]
    return spawn(demo_rank, world_size, *args, timeout=timeout)


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """The demo's table: one line per rank.

    Examples:
        >>> row = {"rank": 0, "ranges": [(0, 3), (5, 8)], "score_entries": 21,
        ...        "bytes_sent": 4096, "max_error_out": 1e-7, "max_error_grad": 2e-7}
        >>> print(format_rows([row]))
        rank  positions          fwd scores  fwd sent KiB  max |out - sdpa|  max |grad - sdpa|
           0  0:3 5:8                    21           4.0           1.0e-07            2.0e-07
    """
    lines = [
        "rank  positions          fwd scores  fwd sent KiB  max |out - sdpa|  max |grad - sdpa|"
    ]
    for row in rows:
        where = " ".join(f"{a}:{b}" for a, b in row["ranges"])
        lines.append(
            f"{row['rank']:>4}  {where:<17} {row['score_entries']:>11,} "
            f"{row['bytes_sent'] / 1024:>13.1f} {row['max_error_out']:>17.1e} "
            f"{row['max_error_grad']:>18.1e}"
        )
    return "\n".join(lines)


def add_shape_arguments(
    parser: argparse.ArgumentParser, *, length: int, heads: int, head_dim: int
) -> None:
    """The flags of a ring run's shape, `--length`, `--heads` and `--head-dim`, with these
    defaults: the demo's and the ring benchmark's command lines take the same three."""
    parser.add_argument("--length", type=int, default=length, help="positions T")
    parser.add_argument("--heads", type=int, default=heads, help="attention heads")
    parser.add_argument("--head-dim", type=int, default=head_dim, help="features per head")


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: spawn `--world-size` processes, or join the group `torchrun` made."""
    parser = argparse.ArgumentParser(prog="python -m attnlab.distributed.demo")
    parser.add_argument("--world-size", type=int, help="processes to spawn (not with torchrun)")
    add_shape_arguments(parser, length=1000, heads=4, head_dim=16)
    parser.add_argument("--layout", choices=["contiguous", "zigzag"], default="zigzag")
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a rank may wait")
    parser.add_argument(
        "--torch-context-parallel",
        action="store_true",
        help="also try torch.distributed.tensor.experimental.context_parallel",
    )
    parser.add_argument("--json", type=Path, help="save the rows and provenance here")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    begun = begin()
    config = (args.length, args.heads, args.head_dim, args.causal, args.layout, 0)
    title = (
        f"ring attention, T={args.length}, {args.heads} heads of {args.head_dim}, "
        f"{'causal' if args.causal else 'not causal'}, layout {args.layout}"
    )
    if args.world_size is None and "RANK" in os.environ:  # started by torchrun
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
        try:
            row = demo_rank(dist.get_rank(), dist.get_world_size(), *config)
            rows: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(rows, row)
        finally:
            dist.destroy_process_group()
        if row["rank"] == 0:
            print(f"{title}, {len(rows)} ranks ({backend}, torchrun)")
            print(format_rows(rows))
        return
    world_size = 2 if args.world_size is None else args.world_size
    rows = spawn(demo_rank, world_size, *config, timeout=args.timeout)
    print(f"{title}, {world_size} ranks (gloo, spawned)")
    print(format_rows(rows))
    record: dict[str, Any] = {"title": title, "world_size": world_size, "rows": rows}
    if args.torch_context_parallel:
        torch_rows = spawn(torch_context_parallel, world_size, *config[:3], timeout=args.timeout)
        record["torch_context_parallel"] = torch_rows
        for row in torch_rows:
            result = row.get("error") or f"max |out - sdpa| {row['max_error_out']:.1e}"
            print(f"torch context_parallel, rank {row['rank']}: {result}")
    if args.json is not None:
        record["provenance"] = provenance(command_line("attnlab.distributed.demo", argv), begun)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
