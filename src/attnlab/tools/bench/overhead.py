"""What attnlab's argument checks cost on the hot path: ``python -m attnlab.tools.bench.overhead``.

Times the forward pass of [`MultiHeadAttention`][attnlab.MultiHeadAttention] with
validation on and off, interleaved in one process (each round runs both, in a random
order, so that a change in machine load hits both alike), and prints one JSON line:

- ``forward_ms``: the median forward time with validation on and off;
- ``ratio``: median on / median off, and ``paired_ratio``: the median and spread of the
  per-round ratios (the robust figure on a shared machine);
- ``checks_us``: the checks alone, timed in a tight loop on the same input: the shared
  rules of `attnlab.rules._validation` that the forward applies to self-attention without a
  mask (the token check of ``x`` against the module's parameters and the checks of its
  three flags), and ``checks_share``: that time divided by the median forward pass
  without checks;
- ``provenance``: where and when it ran (the keys every recorder of the package writes).

Defaults are the sizes of one attention layer of a small language model: b=4, t=1024,
d_in=d_out=512, 8 heads, PyTorch's fused backend, forward only under
``torch.inference_mode()``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from attnlab.layers.multihead import MultiHeadAttention
from attnlab.rules._provenance import begin, command_line, provenance
from attnlab.rules._validation import check_bool, check_tokens, validation

__all__ = ["main", "measure"]


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def measure(
    *,
    batch: int = 4,
    seq: int = 1024,
    dim: int = 512,
    heads: int = 8,
    backend: str = "torch",
    repeats: int = 60,
    warmup: int = 3,
    check_calls: int = 2000,
    seed: int = 0,
    command: str = "",
) -> dict[str, Any]:
    """Time the forward pass with validation on and off; see the module's docstring.

    Args:
        batch: Batch size `b`.
        seq: Sequence length `t`.
        dim: `d_in = d_out`.
        heads: Number of heads.
        backend: `"torch"` or `"scratch"`.
        repeats: Rounds; each runs one forward with and one without validation.
        warmup: Untimed rounds first.
        check_calls: Calls of the checks alone, timed together.
        seed: Seed of the weights, the input and the order within each round.
        command: The command line to record in the provenance.

    Returns:
        The measurements, as printed by `python -m attnlab.tools.bench.overhead`.
    """
    begun = begin()
    torch.manual_seed(seed)
    module = MultiHeadAttention(dim, dim, heads, backend=backend).eval()  # type: ignore[arg-type]
    x = torch.randn(batch, seq, dim)
    order = random.Random(seed)
    times: dict[bool, list[float]] = {True: [], False: []}
    with torch.inference_mode():
        for round_ in range(warmup + repeats):
            flags = [True, False]
            order.shuffle(flags)
            for flag in flags:
                with validation(flag):
                    began = time.perf_counter()
                    module(x)
                    elapsed = time.perf_counter() - began
                if round_ >= warmup:
                    times[flag].append(elapsed)
        # The checks alone, without the noise of the forward pass around them (a
        # difference of two forward times would drown them on a shared machine).
        owner, like = type(module).__name__, module.W_query.weight
        began = time.perf_counter()
        for _ in range(check_calls):
            check_tokens("x", x, features=dim, param="d_in", owner=owner, like=like)
            for name in ("is_causal", "need_weights", "average_attn_weights"):
                check_bool(name, False)
        checks_s = (time.perf_counter() - began) / check_calls
    on, off = statistics.median(times[True]), statistics.median(times[False])
    paired = [a / b for a, b in zip(times[True], times[False], strict=True)]
    return {
        "config": {
            "batch": batch,
            "seq": seq,
            "d_in": dim,
            "d_out": dim,
            "heads": heads,
            "backend": backend,
            "repeats": repeats,
            "mode": "forward, torch.inference_mode()",
        },
        "forward_ms": {"validation_on": on * 1e3, "validation_off": off * 1e3},
        "ratio": on / off,
        "paired_ratio": {
            "median": statistics.median(paired),
            "p10": _quantile(paired, 0.1),
            "p25": _quantile(paired, 0.25),
            "p75": _quantile(paired, 0.75),
            "p90": _quantile(paired, 0.9),
        },
        "spread_ms": {
            "validation_on_iqr": (_quantile(times[True], 0.75) - _quantile(times[True], 0.25))
            * 1e3,
            "validation_off_iqr": (_quantile(times[False], 0.75) - _quantile(times[False], 0.25))
            * 1e3,
        },
        "checks_us": checks_s * 1e6,
        "checks_share": checks_s / off,
        "provenance": provenance(command, begun),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: measure with the given sizes and print one JSON line.

    Args:
        argv: Arguments, without the program name; `sys.argv[1:]` when omitted.

    Returns:
        The exit status, 0.
    """
    parser = argparse.ArgumentParser(
        prog="python -m attnlab.tools.bench.overhead",
        description="Forward time of MultiHeadAttention with validation on vs off.",
    )
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--backend", choices=["torch", "scratch"], default="torch")
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the JSON to this file (e.g. for the docs)")
    argv = list(sys.argv[1:] if argv is None else argv)
    options = vars(parser.parse_args(argv))
    out = options.pop("out")  # every other option is an argument of `measure`
    result = measure(**options, command=command_line("attnlab.tools.bench.overhead", argv))
    line = json.dumps(result)
    print(line)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
