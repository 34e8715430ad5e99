r"""Attention weights of a few rows from FlashAttention's log-sum-exp: memory and time.

Run it as `python -m attnlab.tools.bench.lse_weights --json
docs/assets/bench/lse_weights.json` from the repository's root. For `rows` queries (the
last ones, which see every key) of a causal sequence of `tokens` tokens (batch 1, `heads`
heads of `head_dim` features, float32), it records:

- the bytes of the recovered weights `(heads, rows, T)`, of one tile of scores, and of
  the materialised `(heads, T, T)` matrix (computed: 4 GiB for one head at 32,768
  tokens, more than this machine would hold beside the rest);
- the peak extra memory of
  [`weights_from_lse`][attnlab.functional.lse_weights.weights_from_lse], measured by
  [`peak_extra_bytes`][attnlab.tools.bench.peak_extra_bytes];
- the wall time of the flash forward that returns the log-sum-exp
  ([`flash_attention`][attnlab.functional.flash.flash_attention], `return_lse=True`) and
  of the recovery pass (medians of `rounds` after a warm-up);
- the largest difference from the softmax of the same rows' scores, in float64.

At `small_tokens` tokens, where the matrix fits, the same record adds the measured peak
of the materialised weights, attnlab's
[`attention_weights`][attnlab.functional.sdpa.attention_weights].
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from attnlab.functional.flash import flash_attention
from attnlab.functional.lse_weights import weights_from_lse
from attnlab.functional.sdpa import attention_weights
from attnlab.rules._provenance import begin
from attnlab.rules.sizes import Sizes
from attnlab.tools.bench import _command
from attnlab.tools.bench.measure import CpuUse, peak_extra_bytes, round_floats, summary

__all__ = ["BENCH", "LseWeightsSettings", "main", "measure_rows"]

_FLOAT32 = 4  # bytes


@dataclass(frozen=True)
class LseWeightsSettings(Sizes):
    """What the run measures.

    Attributes:
        tokens: The sequence's length `T`.
        rows: Queries whose weights are recovered (the last ones).
        heads: Heads (batch 1).
        head_dim: Features per head.
        small_tokens: A length at which the `(T, T)` weights are materialised too.
        block_size: Keys per tile, of the flash forward and of the recovery.
        rounds: Timed calls of each, after one warm-up.
    """

    tokens: int = 32768
    rows: int = 64
    heads: int = 1
    head_dim: int = 64
    small_tokens: int = 4096
    block_size: int = 256
    rounds: int = 3


def _timed(fn: Callable[[], object], rounds: int) -> dict[str, float]:
    fn()  # warm-up
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return summary(seconds)


def measure_rows(
    settings: LseWeightsSettings, tokens: int, *, materialise: bool = False
) -> dict[str, Any]:
    """Memory, time and error of recovering `settings.rows` rows at `tokens` tokens.

    Args:
        settings: The run's settings (all but `tokens` and `small_tokens` are read).
        tokens: The sequence's length.
        materialise: Also measure the peak of the materialised `(heads, T, T)` weights.

    Returns:
        The bytes (`weights_bytes`, `tile_bytes`, `matrix_bytes`, `recover_peak_bytes`
        and, with `materialise`, `materialised_peak_bytes`), the time summaries
        `flash_forward_s` and `recover_s`, and `max_abs_error`.

    Examples:
        >>> small = LseWeightsSettings(rows=2, head_dim=4, block_size=8, rounds=1)
        >>> r = measure_rows(small, 32)
        >>> r["weights_bytes"], r["matrix_bytes"], r["max_abs_error"] < 1e-6
        (256, 4096, True)
    """
    s = settings
    rows = min(s.rows, tokens)
    q, k, v = (torch.randn(1, s.heads, tokens, s.head_dim) for _ in range(3))
    picked = torch.arange(tokens - rows, tokens)  # the last rows: each sees every key
    block = s.block_size
    with torch.no_grad():
        _, lse = flash_attention(q, k, v, is_causal=True, block_size=block, return_lse=True)

        def forward() -> object:
            return flash_attention(q, k, v, is_causal=True, block_size=block, return_lse=True)

        def recover() -> torch.Tensor:
            return weights_from_lse(q, k, lse, rows=picked, is_causal=True, block_size=block)

        weights = recover()
        scores = q[:, :, picked].double() @ k.double().mT / math.sqrt(s.head_dim)
        hidden = picked[:, None] < torch.arange(tokens)[None, :]  # the future of each row
        reference = scores.masked_fill(hidden, float("-inf")).softmax(-1)  # (1, h, rows, T)
        record: dict[str, Any] = {
            "tokens": tokens,
            "rows": rows,
            "weights_bytes": s.heads * rows * tokens * _FLOAT32,
            "tile_bytes": s.heads * rows * min(block, tokens) * _FLOAT32,
            "matrix_bytes": s.heads * tokens * tokens * _FLOAT32,
            "recover_peak_bytes": peak_extra_bytes(recover),
            "max_abs_error": float((weights.double() - reference).abs().max()),
        }
        if materialise:
            full = peak_extra_bytes(lambda: attention_weights(q, k, is_causal=True))
            record["materialised_peak_bytes"] = full
        record["flash_forward_s"] = _timed(forward, s.rounds)
        record["recover_s"] = _timed(recover, s.rounds)
    return record


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `python -m attnlab.tools.bench.lse_weights [--json PATH] [--tokens N] ...`."""
    return _command.run(BENCH, list(sys.argv[1:] if argv is None else argv))


def _measure(
    settings: LseWeightsSettings, args: argparse.Namespace, command: str
) -> dict[str, Any]:
    started, cpu_use = begin(), CpuUse()
    torch.manual_seed(args.seed)
    results = {
        "tokens": measure_rows(settings, settings.tokens),
        "small_tokens": measure_rows(settings, settings.small_tokens, materialise=True),
    }
    return {
        "provenance": cpu_use.provenance(command, started, seed=args.seed),
        "settings": asdict(settings),
        "dtype": "float32",
        "causal": True,
        "results": round_floats(results),
    }


OPTIONS = tuple(asdict(LseWeightsSettings()))  # every setting is an option
BENCH = _command.Bench("lse_weights", __doc__, LseWeightsSettings, OPTIONS, _measure)
"""The command line's settings and measurement."""


if __name__ == "__main__":  # the command line: python -m attnlab.tools.bench.lse_weights
    raise SystemExit(main(sys.argv[1:]))
