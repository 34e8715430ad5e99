"""Start a group of processes on this machine, one per rank, and collect what they return.

A small, test-friendly stand-in for `torchrun`: every process joins one process group
over TCP on 127.0.0.1, runs a function, leaves the group, and returns its result to the
parent. Nothing listens beyond this machine: the parent holds the rendezvous store
(a `TCPStore` served from a socket it bound to 127.0.0.1, as `torchrun`'s agent holds
its store), and gloo is pinned to the loopback interface. Nothing hangs: the process
group has a timeout, and the parent can kill whatever is still running after a
deadline.
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # not in its __all__

from attnlab.rules._validation import check_positive_int

__all__ = ["free_port", "spawn"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it).

    Returns:
        The port number.

    Examples:
        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _loopback_interface() -> str | None:
    """The name of the loopback network interface (`lo` on Linux, `lo0` on macOS)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:  # pragma: no cover - platforms without if_nameindex
        return None
    return next((name for name in names if name.startswith("lo")), None)


def _loopback_store(timeout: float) -> tuple[TCPStore, int]:
    """A rendezvous store served from a socket bound to 127.0.0.1; and its port.

    `TCPStore(..., is_master=True)` alone listens on every interface; given the socket
    (`master_listen_fd`), it serves from that one. Binding port 0 lets the OS pick a
    free port, and keeping the socket means no other process can take it meanwhile.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        port: int = listener.getsockname()[1]
        store = TCPStore(
            "127.0.0.1",
            port,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout),
            master_listen_fd=listener.fileno(),
        )
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store owns the socket now, and closes it when freed
    return store, port


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    join_timeout: float | None = None,
    backend: str = "gloo",
) -> list[Any]:
    """Run `fn(rank, world_size, *args)` in `world_size` new processes forming one group.

    The parent serves the rendezvous store on 127.0.0.1 only; each process sets
    `MASTER_ADDR=127.0.0.1`, `MASTER_PORT` (the store's), `RANK`, `WORLD_SIZE`, and
    `GLOO_SOCKET_IFNAME` and `NCCL_SOCKET_IFNAME` (the loopback interface), calls
    `torch.distributed.init_process_group(backend, store=..., timeout=timeout)` with a
    client of that store, runs `fn`, and destroys the group, also when `fn` raises.
    Like `torchrun`, it divides the CPU cores between the processes
    (`torch.set_num_threads`), so that they do not compete for them. `fn` and `args`
    must be picklable (a function defined at the top level of an importable module),
    and so must the results.

    Args:
        fn: The function every rank runs.
        world_size: Number of processes.
        *args: Further arguments of `fn`.
        timeout: Seconds a collective or point-to-point operation may wait before it
            fails (the process group's timeout).
        join_timeout: Seconds the parent waits for all processes, their start-up
            included, before it kills them; default no limit (a long computation is
            not a hang, and every wait on another rank is bounded by `timeout`).
        backend: `"gloo"` (CPU) or `"nccl"` (one GPU per rank).

    Returns:
        What `fn` returned on each rank, in rank order.

    Raises:
        RuntimeError: If `fn` raised on any rank; the message has every failing rank's
            exception.
        TimeoutError: If the processes did not finish in time; they are killed.

    Examples:
        >>> from attnlab.distributed.demo import hello
        >>> spawn(hello, 2)
        ['rank 0 of 2', 'rank 1 of 2']
    """
    check_positive_int("world_size", world_size)
    store, port = _loopback_store(timeout)
    try:
        return _run(fn, world_size, args, port, backend, timeout, join_timeout)
    finally:
        del store  # stops serving: the port is closed when spawn returns


def _run(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...],
    port: int,
    backend: str,
    timeout: float,
    join_timeout: float | None,
) -> list[Any]:
    """Start the processes, wait for them (or kill them), collect their results."""
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="attnlab-spawn-") as tmp:
        processes = [
            context.Process(
                target=_run_rank,
                args=(fn, rank, world_size, port, backend, timeout, tmp, args),
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        deadline = None if join_timeout is None else time.monotonic() + join_timeout
        for process in processes:
            process.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        stuck = [rank for rank, p in enumerate(processes) if p.is_alive()]
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
        if stuck:
            raise TimeoutError(
                f"ranks {stuck} of {world_size} were still running after "
                f"{join_timeout:g} s and were killed"
            )
        results, failures = [], []
        for rank, process in enumerate(processes):
            path = Path(tmp) / f"{rank}.pt"
            if not path.exists():
                failures.append(f"rank {rank}: exited with code {process.exitcode}, no result")
                continue
            status, value = torch.load(path, weights_only=False)
            if status == "error":
                failures.append(f"rank {rank}: {value}")
            results.append(value)
    if failures:
        raise RuntimeError(f"{len(failures)} of {world_size} ranks failed:\n" + "\n".join(failures))
    return results


def _run_rank(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout: float,
    tmp: str,
    args: tuple[Any, ...],
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
    )
    loopback = _loopback_interface()
    if loopback is not None:  # gloo's (and NCCL's bootstrap) sockets: on loopback
        os.environ["GLOO_SOCKET_IFNAME"] = loopback
        os.environ["NCCL_SOCKET_IFNAME"] = loopback
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    result: tuple[str, Any]
    try:
        wait = datetime.timedelta(seconds=timeout)
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=wait)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=wait
        )
        try:
            result = ("ok", fn(rank, world_size, *args))
        finally:
            dist.destroy_process_group()
    except Exception as error:  # reported to the parent, which raises
        last = traceback.extract_tb(error.__traceback__)[-1]
        where = f"{Path(last.filename).name}:{last.lineno}"
        result = ("error", f"{type(error).__name__}: {error} ({where})")
    partial = Path(tmp) / f"{rank}.part"
    torch.save(result, partial)
    partial.rename(Path(tmp) / f"{rank}.pt")
