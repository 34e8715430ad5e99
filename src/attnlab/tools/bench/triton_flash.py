r"""attnlab's Triton FlashAttention against PyTorch's fused attention: equality and speed.

The prepared script for a machine with a CUDA GPU, run from the repository's root as
`python -m attnlab.tools.bench.triton_flash --json docs/assets/bench/triton_flash.json`.
It compiles [`triton_flash_attention`][attnlab.functional.triton_flash.triton_flash_attention]'s
kernels, checks them against `torch.nn.functional.scaled_dot_product_attention` in each
dtype (outputs and the gradients of query, key and value, with the error of the same
computation in float64 beside them), then times the forward pass and forward plus
backward of both at every length in `tokens`, causal and not, with `batch * T` fixed at
`tokens_per_batch` (the FlashAttention-2 paper's set-up, at 16k tokens a batch), and
reports each as TFLOP/s of the attention's matrix products.

Without a GPU the same command runs in Triton's interpreter on the CPU (`bfloat16`
is left out there, and lengths must be small: a smoke run, which the tests make); its
record says so in `device`, so its times are never read as a GPU's.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.nn import functional as F

from attnlab.functional import triton_flash
from attnlab.rules._provenance import begin
from attnlab.rules.sizes import Sizes
from attnlab.tools.bench import _command
from attnlab.tools.bench.measure import (
    CpuUse,
    interleaved,
    ratio_summary,
    round_floats,
    summary,
)

__all__ = ["BENCH", "TritonSettings", "compare", "main", "time_pair"]


@dataclass(frozen=True)
class TritonSettings(Sizes):
    """What the run measures.

    Attributes:
        tokens: The lengths `T` timed.
        tokens_per_batch: `batch * T` at every length (batch at least 1).
        heads: Query heads, each with its own key/value head.
        head_dim: Features per head.
        check_tokens: The length of the equality check.
        rounds: Timed calls of each function, the four interleaved in every round.
        warmups: Untimed calls before them (compilation, caches, the allocator).
    """

    tokens: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)
    tokens_per_batch: int = 16384
    heads: int = 16
    head_dim: int = 64
    check_tokens: int = 1024
    rounds: int = 10
    warmups: int = 2


def _inputs(
    batch: int, heads: int, t: int, e: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    shape = (batch, heads, t, e)
    q, k, v = (torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
               for _ in range(3))  # fmt: skip
    return q, k, v


def compare(
    t: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> dict[str, float]:
    """The largest differences of triton's output and gradients from SDPA's in `dtype`,
    and of SDPA's own in `dtype` from SDPA in float64 (the rounding to expect), causal.

    Examples:
        >>> d = compare(20, 1, 16, torch.float32, torch.device("cpu"))
        >>> d["out"] < 1e-5, d["out"] < 10 * d["sdpa_out"] + 1e-6
        (True, True)
    """
    q, k, v = _inputs(1, heads, t, head_dim, dtype, device)
    grad = torch.randn_like(q)
    results = {}
    for name, fn in (
        ("triton", triton_flash.triton_flash_attention),
        ("sdpa", F.scaled_dot_product_attention),
    ):
        out = fn(q, k, v, is_causal=True)
        results[name] = (out, *torch.autograd.grad(out, (q, k, v), grad))
    high = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out = F.scaled_dot_product_attention(high[0], high[1], high[2], is_causal=True)
    exact = [out, *torch.autograd.grad(out, high, grad.double())]
    names = ("out", "dq", "dk", "dv")
    record = {}
    for n, ours, theirs, best in zip(names, results["triton"], results["sdpa"], exact, strict=True):
        ours, theirs, best = ours.detach().double(), theirs.detach().double(), best.detach()
        record[n] = float((ours - theirs).abs().max())
        record[f"sdpa_{n}"] = float((theirs - best).abs().max())
    return record


def _synced(fn: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """`fn`, then a wait for the GPU to finish it (a CUDA launch returns at once)."""

    def call() -> None:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return call


def time_pair(
    settings: TritonSettings, t: int, causal: bool, dtype: torch.dtype, device: torch.device
) -> dict[str, Any]:
    """Forward and forward + backward times of triton and SDPA at length `t`, interleaved
    round by round, their rates in TFLOP/s (the matrix products: 4 B H T^2 E forward,
    2.5 times that backward, halved when causal) and triton's time over SDPA's."""
    s = settings
    batch = max(1, s.tokens_per_batch // t)
    q, k, v = _inputs(batch, s.heads, t, s.head_dim, dtype, device)
    grad = torch.randn_like(q)
    flops = 4 * batch * s.heads * t * t * s.head_dim / (2 if causal else 1)
    kernels: dict[str, Callable[..., torch.Tensor]] = {
        "triton": triton_flash.triton_flash_attention,
        "sdpa": F.scaled_dot_product_attention,
    }
    calls: dict[str, Callable[[], None]] = {}
    for name, fn in kernels.items():

        def forward(fn: Callable[..., torch.Tensor] = fn) -> object:
            with torch.no_grad():
                return fn(q, k, v, is_causal=causal)

        def both(fn: Callable[..., torch.Tensor] = fn) -> object:
            return torch.autograd.grad(fn(q, k, v, is_causal=causal), (q, k, v), grad)

        calls[f"{name} forward"] = _synced(forward, device)
        calls[f"{name} forward_backward"] = _synced(both, device)
    for _ in range(s.warmups):  # compilation, caches, the allocator
        for call in calls.values():
            call()
    times = interleaved(calls, s.rounds, random.Random(t))
    record: dict[str, Any] = {"tokens": t, "batch": batch, "causal": causal}
    for name in kernels:
        fwd, fwd_bwd = times[f"{name} forward"], times[f"{name} forward_backward"]
        record[name] = {
            "forward_s": summary(fwd),
            "forward_backward_s": summary(fwd_bwd),
            "forward_tflops": flops / statistics.median(fwd) / 1e12,
            "forward_backward_tflops": 3.5 * flops / statistics.median(fwd_bwd) / 1e12,
        }
    record["triton_over_sdpa"] = {
        part: ratio_summary(times[f"triton {part}"], times[f"sdpa {part}"])
        for part in ("forward", "forward_backward")
    }
    return record


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `python -m attnlab.tools.bench.triton_flash [--json PATH] ...`."""
    return _command.run(BENCH, list(sys.argv[1:] if argv is None else argv))


def _measure(settings: TritonSettings, args: argparse.Namespace, command: str) -> dict[str, Any]:
    started, cpu_use = begin(), CpuUse()
    torch.manual_seed(args.seed)
    interpreted = triton_flash.kernels().INTERPRET
    device = torch.device("cpu" if interpreted else "cuda")
    names = ["float16"] if interpreted else ["float16", "bfloat16"]
    dtypes = {name: getattr(torch, name) for name in names}
    s = settings
    results: dict[str, Any] = {}
    for name, dtype in dtypes.items():
        results[name] = {
            "check": compare(s.check_tokens, s.heads, s.head_dim, dtype, device),
            "times": [
                time_pair(s, t, causal, dtype, device) for t in s.tokens for causal in (True, False)
            ],
        }
    where = "cpu (Triton's interpreter: not a GPU's speed)"
    import triton

    return {
        "provenance": cpu_use.provenance(command, started, seed=args.seed),
        "device": where if interpreted else torch.cuda.get_device_name(device),
        "triton": triton.__version__,
        "settings": asdict(settings),
        "results": round_floats(results),
    }


OPTIONS = tuple(asdict(TritonSettings()))
BENCH = _command.Bench("triton_flash", __doc__, TritonSettings, OPTIONS, _measure)
"""The command line's settings and measurement."""


if __name__ == "__main__":  # the command line: python -m attnlab.tools.bench.triton_flash
    raise SystemExit(main(sys.argv[1:]))
