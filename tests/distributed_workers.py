"""Functions that spawned ranks run for the tests and the chapter.

They live in the package because a spawned process finds its function by importing it.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Any

import torch
import torch.distributed as dist

from attnlab.distributed.ring import RingStats, ring_attention, shard_sequence


def run_cases(rank: int, world_size: int, cases: list[dict[str, Any]]) -> list[Any]:
    """Run each case on a subgroup of ranks; return this rank's results, case by case.

    A case has `ranks` (the members of its group, in order), `inputs` (the whole `q, k,
    v, grad_out`, each rank takes its own shard), `kwargs` for `ring_attention`, and
    optional `bad` (rank -> replacement of that rank's local `(q, k, v)`), `skip` (ranks
    that do not call at all), `timeout` (seconds, for the subgroup) and `default_group`
    (call without `group=`; `ranks` must then be every rank). A result is
    `None` off the group, `("ok", out, dq, dk, dv, stats)` or `("error", type, message)`.
    """
    results: list[Any] = []
    for case in cases:
        ranks = case["ranks"]
        timeout = datetime.timedelta(seconds=case.get("timeout", 60))
        group = dist.new_group(ranks, timeout=timeout)  # every rank calls new_group
        if case.get("default_group"):
            group = None  # ring_attention's default: the whole world
        if rank not in ranks or rank in case.get("skip", ()):
            results.append(None)
            continue
        group_rank, size = ranks.index(rank), len(ranks)
        layout = case["kwargs"].get("layout", "contiguous")
        q, k, v, grad_out = (
            shard_sequence(x, size, group_rank, layout=layout) for x in case["inputs"]
        )
        q, k, v = case.get("bad", {}).get(group_rank, (q, k, v))
        q, k, v = (x.detach().requires_grad_(x.is_floating_point()) for x in (q, k, v))
        stats = RingStats()
        try:
            out = ring_attention(q, k, v, group=group, stats=stats, **case["kwargs"])
            forward = dataclasses.asdict(stats)  # the forward pass's work and bytes
            torch.autograd.backward(out, grad_out.to(out.dtype))
            results.append(("ok", out.detach(), q.grad, k.grad, v.grad, forward))
        except Exception as error:  # the test checks which error every rank raised
            results.append(("error", type(error).__name__, str(error)))
    return results


def fail_on_last_rank(rank: int, world_size: int) -> None:
    """The last rank raises; the others wait for it at a barrier and time out."""
    if rank == world_size - 1:
        raise ValueError("rank failed on purpose")
    dist.barrier()


def sleep(rank: int, world_size: int, seconds: float) -> None:
    """Sleep, ignoring the ring: for the launcher's kill-on-deadline test."""
    time.sleep(seconds)
