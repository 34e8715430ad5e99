"""Demo: placeholder"""

from __future__ import annotations


def hello(rank: int, world_size: int) -> str:
    return f"rank {rank} of {world_size}"
