"""Attention across processes: ring (context-parallel) attention on torch.distributed.

See the chapter "Attention across devices".
"""

from attnlab.distributed.launch import free_port, spawn
from attnlab.distributed.ring import (
    Layout,
    RingStats,
    ShardLayout,
    merge_partials,
    ring_attention,
    shard_ranges,
    shard_sequence,
    unshard_sequence,
)

__all__ = [
    "Layout",
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
