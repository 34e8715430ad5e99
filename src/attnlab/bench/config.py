"""Sizes of the benchmark suites, their modes and baselines, and the JSON schema version."""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEMA_VERSION = 1
"""Version of the layout of `bench.json`; bumped when a field changes meaning."""

FORWARD = "forward"
FORWARD_BACKWARD = "forward+backward"
MODES = (FORWARD, FORWARD_BACKWARD)


@dataclass(frozen=True)
class SuiteConfig:
    """Sizes of one suite: batch, heads, head or model width, and the lengths per mode.

    `longest` caps the length for some (implementation, mode) pairs: the naive kernel
    would need 16 GiB at 8192 tokens.
    """

    batch: int
    heads: int
    width: int  # head_dim for "kernels", d_model for "modules"
    seq_lens: dict[str, tuple[int, ...]]
    longest: dict[tuple[str, str], int] = field(default_factory=dict)

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
}
BASELINES = {"kernels": "torch_sdpa", "modules": "nn.MultiheadAttention[need_weights=False]"}
