"""A process group of one rank in this process, for tests that call `ring_attention`.

`ring_attention` runs in an initialised `torch.distributed` process group, and
`init_process_group` raises if the default group exists already. The tests of
`test_distributed.py` and the entries of the shared registry (`entry_points.py`) both
need a group of one rank; `one_rank_group` gives them one without clashing: it uses
the group that is there (if it has one rank) or makes one (gloo, an in-memory store: no
port, no other process) and destroys only what it made.

It does not keep a group for the whole test session: pytest runs the doctests of `src/`
and the pages of `docs/` in the same process afterwards, and those, like
`tests/test_bench.py`, initialise their own group of one rank.

A group of one rank sends no message in either pass of `ring_attention`
(`test_distributed.py` tests this), so a gradient computed after the group is gone is
still right: the registry's entries differentiate their outputs after the call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """The default process group, of one gloo rank in this process, while open.

    Raises:
        RuntimeError: If a default group of more than one rank is initialised.
    """
    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise RuntimeError(
                f"one_rank_group: a process group of {dist.get_world_size()} ranks is "
                "initialised already; the tests need one of 1 rank"
            )
        yield  # someone else's group of one rank: use it, leave it
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
