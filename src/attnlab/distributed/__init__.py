"""Attention across processes: ring (context-parallel) attention on torch.distributed.

See the chapter "Attention across devices".
"""

from attnlab.distributed.launch import free_port, spawn
from attnlab.distributed.ring import (
    RingStats,
    ShardLayout,
    merge_partials,
    ring_attention,
    shard_ranges,
    shard_sequence,
    unshard_sequence,
)

__all__ = [
    "RingStats",
    "ShardLayout",
    "free_port",
    "merge_partials",
    "ring_attention",
    "shard_ranges",
    "shard_sequence",
    "spawn",
    "unshard_sequence",
]


def __getattr__(name: str) -> object:
    if name == "Layout":  # deprecated: attnlab.distributed.ring warns and returns ShardLayout
        from attnlab.distributed import ring

        return ring.Layout
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
