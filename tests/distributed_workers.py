"""Functions that the spawned ranks of tests/test_distributed.py run.

A spawned process finds its function by importing its module by name, so this module is
imported as `distributed_workers` with its folder on `sys.path` (the test module puts it
there while it spawns; the processes inherit the parent's `sys.path`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import ipaddress
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from attnlab.distributed import RingStats, ring_attention, shard_sequence


def run_cases(rank: int, world_size: int, cases: list[dict[str, Any]]) -> list[Any]:
    """Run each case on a subgroup of ranks; return this rank's results, case by case.

    A case has `ranks` (the members of its group, in order), `inputs` (the whole `q, k,
    v, grad_out`, each rank takes its own shard), `kwargs` for `ring_attention`, and
    optional `bad` (rank -> replacement of that rank's local `(q, k, v)`), `skip` (ranks
    that do not call at all), `timeout` (seconds, for the subgroup), `default_group`
    (call without `group=`; `ranks` must then be every rank), `shard_layout` (shard with
    this layout instead of the call's), `no_grad` (ranks whose inputs do not require
    gradients) and `autocast` (call under `torch.autocast("cpu", dtype=bfloat16)`). A
    result is `None` off the group, `("ok", out, dq, dk, dv, stats)` or
    `("error", type, message)`.
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
        layout = case.get("shard_layout", case["kwargs"].get("layout", "contiguous"))
        q, k, v, grad_out = (
            shard_sequence(x, size, group_rank, layout=layout) for x in case["inputs"]
        )
        if group_rank in case.get("bad", {}):
            q, k, v = (x.detach() for x in case["bad"][group_rank])
        needs_grad = group_rank not in case.get("no_grad", ())
        for x in (q, k, v):  # in place: the shards keep the positions they hold
            x.requires_grad_(needs_grad and x.is_floating_point())
        stats = RingStats()
        autocast = torch.autocast("cpu", dtype=torch.bfloat16)
        try:
            with autocast if case.get("autocast") else contextlib.nullcontext():
                out = ring_attention(q, k, v, group=group, stats=stats, **case["kwargs"])
            forward = dataclasses.asdict(stats)  # the forward pass's work and bytes
            torch.autograd.backward(out, grad_out.to(out.dtype))
            results.append(("ok", out.detach(), q.grad, k.grad, v.grad, forward))
        except Exception as error:  # the test checks which error every rank raised
            results.append(("error", type(error).__name__, str(error)))
    return results


def _address(hex_address: str) -> str:
    """An address of /proc/net/tcp{,6}: 32-bit words in the host's (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening_sockets(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket that these processes listen on (Linux)."""
    owner: dict[str, int] = {}
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):  # a file closed meanwhile
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    owner[link[len("socket:[") : -1]] = pid
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/net/{table}", encoding="ascii") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in owner:  # 0A: LISTEN
                    address, port = local.split(":")
                    found.append((owner[inode], _address(address), int(port, 16)))
    return found


def run_world(rank: int, world_size: int, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """The cases, then the sockets this rank and the parent (the store) listen on."""
    results = run_cases(rank, world_size, cases)
    sockets = listening_sockets([os.getpid(), os.getppid()])
    return {
        "cases": results,
        "pid": os.getpid(),
        "parent": os.getppid(),
        "store_port": int(os.environ["MASTER_PORT"]),
        "listening": sockets,
    }


def fail_on_last_rank(rank: int, world_size: int) -> None:
    """The last rank raises; the others wait for it at a barrier and time out."""
    if rank == world_size - 1:
        raise ValueError("rank failed on purpose")
    dist.barrier()


def sleep(rank: int, world_size: int, seconds: float) -> None:
    """Sleep, ignoring the ring: for the launcher's kill-on-deadline test."""
    time.sleep(seconds)
