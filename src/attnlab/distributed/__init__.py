"""Attention across processes: ring (context-parallel) attention on torch.distributed.

See the chapter "Attention across devices".
"""

from attnlab.distributed.launch import free_port, spawn
from attnlab.distributed.ring import (
    RingStats,
    ShardLayout,
    ring_attention,
    shard_ranges,
    shard_sequence,
    unshard_sequence,
)

__all__ = [
    "RingStats",
    "ShardLayout",
    "free_port",
    "ring_attention",
    "shard_ranges",
    "shard_sequence",
    "spawn",
    "unshard_sequence",
]
