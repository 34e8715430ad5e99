"""Sizes of the benchmark suites, their modes and baselines, and the JSON schema version."""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEMA_VERSION = 2
"""Version of the layout of `bench.json`; bumped when a field changes meaning.

2: the `window` and `decode` suites, `kv_memory`, `tokens_per_call` in decode results.
"""

FORWARD = "forward"
FORWARD_BACKWARD = "forward+backward"
MODES = (FORWARD, FORWARD_BACKWARD)
DECODE = "decode"
"""The decode suite's only mode: generate tokens one at a time after a prompt, no grad."""


@dataclass(frozen=True)
class SuiteConfig:
    """Sizes of one suite: batch, heads, head or model width, and the lengths per mode.

    `longest` caps the length for some (implementation, mode) pairs: the naive kernel
    would need 16 GiB at 8192 tokens. `window` is the sliding window of the `window`
    suite; `kv_heads` and `steps` (tokens decoded per timed call) belong to `decode`,
    whose lengths are the context already in the cache.
    """

    batch: int
    heads: int
    width: int  # head_dim for "kernels" and "window", d_model for "modules" and "decode"
    seq_lens: dict[str, tuple[int, ...]]
    longest: dict[tuple[str, str], int] = field(default_factory=dict)
    window: int | None = None
    kv_heads: int | None = None
    steps: int = 1

    def runs(self, impl: str, mode: str, seq_len: int) -> bool:
        """Whether `impl` is measured at `seq_len` in `mode`."""
        return seq_len <= self.longest.get((impl, mode), seq_len)


FULL = {
    "kernels": SuiteConfig(
        batch=4,
        heads=8,
        width=64,
        seq_lens={
            FORWARD: (256, 512, 1024, 2048, 4096, 8192),
            FORWARD_BACKWARD: (256, 512, 1024, 2048, 4096),
        },
        longest={("naive", FORWARD): 4096, ("naive", FORWARD_BACKWARD): 2048},
    ),
    "modules": SuiteConfig(
        batch=4,
        heads=8,
        width=512,
        seq_lens={FORWARD: (128, 256, 512, 1024), FORWARD_BACKWARD: (128, 256, 512, 1024)},
    ),
    "window": SuiteConfig(
        batch=4, heads=8, width=64, seq_lens={FORWARD: (2048, 4096, 8192)}, window=512
    ),
    "decode": SuiteConfig(
        batch=1,
        heads=16,
        width=1024,
        seq_lens={DECODE: (512, 2048, 8192)},
        kv_heads=4,
        steps=8,
    ),
}
QUICK = {
    "kernels": SuiteConfig(
        batch=1,
        heads=2,
        width=8,
        seq_lens={FORWARD: (16, 24), FORWARD_BACKWARD: (16, 24)},
        longest={("naive", FORWARD_BACKWARD): 16},
    ),
    "modules": SuiteConfig(
        batch=1, heads=2, width=16, seq_lens={FORWARD: (16, 24), FORWARD_BACKWARD: (16, 24)}
    ),
    "window": SuiteConfig(
        batch=1,
        heads=2,
        width=8,
        seq_lens={FORWARD: (16, 32), FORWARD_BACKWARD: (16,)},
        window=8,
    ),
    "decode": SuiteConfig(
        batch=1, heads=4, width=16, seq_lens={DECODE: (8, 16)}, kv_heads=2, steps=2
    ),
}
BASELINES = {
    "kernels": "torch_sdpa",
    "modules": "nn.MultiheadAttention[need_weights=False]",
    "window": "flash_attention",
    "decode": "recompute",
}
SUITES = ("kernels", "modules", "window", "decode", "kv_memory")
"""Every suite, in the order they run; `kv_memory` measures bytes, not time."""

SERVING_GOALS = {
    "decode": ("<=", 1.3),
    "memory": ("<=", 1.05),
    "throughput": (">=", 2.0),
}
"""The serving benchmark's goal (issue 15) for each ratio: (sense, target)."""
