r"""FlexAttention, timed: compiled `flex_attention` against SDPA and `flash_attention`.

Run it as `python -m attnlab.tools.bench.flex --json docs/assets/bench/flex.json`. Three masks
at T = 1024, 2048 and 4096 tokens (batch 1, 8 heads of 64 features, float32, forward
only, under `torch.inference_mode`: FlexAttention's compiled CPU kernel has no
backward), each run three ways:

| mask | FlexAttention (compiled) | torch SDPA | `flash_attention` |
|:--|:--|:--|:--|
| causal | `causal_mod()` | `is_causal=True` | `is_causal=True` |
| window of 256 | `sliding_window_mod(window=256)` | a dense bool mask | `window=256` |
| documents | `document_mod(ids)` | a dense bool mask | a causal call per document |

The mods are those of [`attnlab.functional.flex`][attnlab.functional.flex]. The documents are five
packed
sequences of 1/8, 1/4, 1/16, 5/16 and 1/4 of T. The block masks use FlexAttention's
tiles of 128; each is built once per length (its time is recorded) and the compiled
kernel reuses it. `flex_attention` is compiled with `dynamic=False` (a new length or
mask is a new compile). The first compile runs in a fresh, empty inductor cache folder
(cold); after `torch._dynamo.reset()` the same one again finds its code on disk (warm);
every later compile is recorded with its case.

Rounds are interleaved: each round runs the three once, in a shuffled order, so a busy
spell of the shared machine slows them all; ratios are the median of per-round ratios.
The provenance records the load average before and after and the CPU share of other
processes.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from attnlab.functional import flex
from attnlab.functional.flash import flash_attention
from attnlab.rules._provenance import begin
from attnlab.rules.sizes import Sizes, size
from attnlab.tools.bench import _command, measure
from attnlab.tools.bench.measure import CpuUse, interleaved, ratio_summary, round_floats, summary

__all__ = [
    "FIGURE",
    "IMPLS",
    "MASKS",
    "FlexSettings",
    "document_lengths",
    "main",
    "measure_flex",
    "write_flex_plot",
]

FIGURE = "flex_time.svg"
"""The figure `write_flex_plot` draws."""
IMPLS = ("flex", "torch_sdpa", "flash_attention")
"""The three sides: compiled FlexAttention, PyTorch's SDPA and attnlab's tiled kernel."""
MASKS = ("causal", "window", "documents")
"""The three masks."""


@dataclass(frozen=True)
class FlexSettings(Sizes):
    """What the run measures.

    Attributes:
        lengths: Sequence lengths T.
        window: The sliding window (keys per query, itself included).
        batch: Batch size.
        heads: Heads (queries, keys and values alike).
        head_dim: Features per head.
        rounds: Timed rounds per case, after one untimed round.
        block_size: FlexAttention's tile, for its block masks.
    """

    lengths: tuple[int, ...] = size((1024, 2048, 4096), at_least=16)  # document_lengths' five
    window: int = 256
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    rounds: int = 5
    block_size: int = 128


def document_lengths(t: int) -> list[int]:
    """Five documents packed into `t` tokens: 1/8, 1/4, 1/16, 5/16 and the rest.

    Examples:
        >>> document_lengths(1024)
        [128, 256, 64, 320, 256]
    """
    parts = [t // 8, t // 4, t // 16, 5 * t // 16]
    return [*parts, t - sum(parts)]


def _calls(
    mask: str, t: int, q: Tensor, k: Tensor, v: Tensor, settings: FlexSettings
) -> tuple[dict[str, Callable[[], Tensor]], BlockMask, float]:
    """The three calls of one case, its block mask and the seconds that mask took."""
    w, lengths = settings.window, document_lengths(t)
    if mask == "causal":
        mod = flex.causal_mod()
    elif mask == "window":
        mod = flex.sliding_window_mod(window=w)
    else:
        mod = flex.document_mod(flex.document_ids(lengths))
    start = time.perf_counter()
    blocks = flex.block_mask(mod, t, block_size=settings.block_size)
    mask_s = time.perf_counter() - start
    dense = None if mask == "causal" else flex.to_dense(mod, t)[0, 0]  # (t, t) for SDPA
    kernel = torch.compile(flex_attention, dynamic=False)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]

    def flash() -> Tensor:
        if mask == "causal":
            return flash_attention(q, k, v, is_causal=True)
        if mask == "window":
            return flash_attention(q, k, v, window=w)
        parts = [  # one causal call per document: what a varlen kernel does in one
            flash_attention(
                q[..., a : a + n, :], k[..., a : a + n, :], v[..., a : a + n, :], is_causal=True
            )
            for a, n in zip(starts, lengths, strict=True)
        ]
        return torch.cat(parts, dim=-2)  # (b, h, t, head_dim)

    calls: dict[str, Callable[[], Tensor]] = {
        "flex": lambda: kernel(q, k, v, block_mask=blocks),
        "torch_sdpa": lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=dense is None, attn_mask=dense
        ),
        "flash_attention": flash,
    }
    return calls, blocks, mask_s


def measure_flex(
    settings: FlexSettings | None = None, *, seed: int = 0, command: str = ""
) -> dict[str, Any]:
    """Every case, as the JSON record: `provenance`, `settings`, `compile`, `cases`.

    Args:
        settings: What to measure; `FlexSettings()` by default.
        seed: Seed of the inputs and of the round orders.
        command: The command line, for the provenance.

    Returns:
        `compile` holds `cold_s` and `warm_s` (the first case's compile, see the
        module); each entry of `cases` holds `mask`, `t`, `fraction` (of FlexAttention's
        tiles computed), `block_mask_ms`, `compile_s`, `max_abs_diff` (flex against
        SDPA), per side `time_s` (median, min, max) and the ratios `flex_over_sdpa` and
        `flex_over_flash` (medians of per-round ratios).
    """
    settings = FlexSettings() if settings is None else settings
    started, cpu_use = begin(), CpuUse()
    order = random.Random(seed)
    cases: list[dict[str, Any]] = []
    cold = warm = 0.0
    # Every case is a recompile of the same function: past dynamo's limit (8) it would
    # silently run the rest eagerly.
    limit = torch._dynamo.config.patch(recompile_limit=2 * len(MASKS) * len(settings.lengths))
    with measure.empty_inductor_cache(), limit, torch.inference_mode(), warnings.catch_warnings():
        # and if it ever did, flex_attention would warn that it runs uncompiled: fail then
        warnings.filterwarnings("error", "flex_attention called without torch.compile")
        for t in settings.lengths:
            g = torch.Generator().manual_seed(seed + t)
            shape = (settings.batch, settings.heads, t, settings.head_dim)
            q, k, v = (torch.randn(shape, generator=g) for _ in range(3))  # (b, h, t, hd)
            for mask in MASKS:
                calls, blocks, mask_s = _calls(mask, t, q, k, v, settings)
                start = time.perf_counter()
                out = calls["flex"]()  # compiles
                compile_s = time.perf_counter() - start
                if not cases:  # the first compile was cold: the same again, warm
                    cold = compile_s
                    torch._dynamo.reset()
                    calls, blocks, mask_s = _calls(mask, t, q, k, v, settings)
                    start = time.perf_counter()
                    calls["flex"]()
                    warm = time.perf_counter() - start
                diff = float((out - calls["torch_sdpa"]()).abs().max())
                interleaved(calls, 1, order)  # warm-up
                times = interleaved(calls, settings.rounds, order)
                over_sdpa = ratio_summary(times["flex"], times["torch_sdpa"])["median"]
                over_flash = ratio_summary(times["flex"], times["flash_attention"])["median"]
                cases.append(
                    {
                        "mask": mask,
                        "t": t,
                        "fraction": flex.block_fraction(blocks),
                        "block_mask_ms": mask_s * 1e3,
                        "compile_s": compile_s,
                        "max_abs_diff": diff,
                        "time_s": {name: summary(times[name]) for name in IMPLS},
                        "flex_over_sdpa": over_sdpa,
                        "flex_over_flash": over_flash,
                    }
                )
                print(
                    f"{mask:>9} T={t}: flex/sdpa {cases[-1]['flex_over_sdpa']:.2f}, "
                    f"flex/flash {cases[-1]['flex_over_flash']:.2f}, compile {compile_s:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    record = {
        "provenance": cpu_use.provenance(command, started, seed=seed),
        "settings": asdict(settings),
        "compile": {"cold_s": cold, "warm_s": warm},
        "cases": cases,
    }
    return round_floats(record)  # type: ignore[no-any-return]


_TITLES = {
    "causal": "causal",
    "window": "sliding window of {window}",
    "documents": "five documents packed",
}
_LABELS = {"flex": "flex_attention (compiled)"}


def write_flex_plot(data: dict[str, Any], out_dir: Path) -> Path:
    """Draw `flex_time.svg`: time against T for each mask, one panel each, in the style
    of the Benchmarks page's figures.

    Args:
        data: What `measure_flex` returns.
        out_dir: Folder to write into.

    Returns:
        The path written.
    """
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    from attnlab.tools.bench.config import FORWARD
    from attnlab.tools.bench.plots import CARD, WIDTH_IN, draw_panel, rc_params

    with matplotlib.rc_context(rc_params()):
        fig = Figure(
            figsize=(WIDTH_IN, 1.2 + 3.0 * len(MASKS)), layout="constrained", facecolor=CARD
        )
        legend: dict[str, Any] = {}
        for ax, mask in zip(fig.subplots(len(MASKS), 1, squeeze=False)[:, 0], MASKS, strict=True):
            results = [
                {
                    "impl": _LABELS.get(impl, impl),
                    "mode": FORWARD,
                    "seq_len": case["t"],
                    "time_s": case["time_s"][impl],
                }
                for case in data["cases"]
                if case["mask"] == mask
                for impl in IMPLS
            ]
            draw_panel(ax, "flex", {"results": results}, FORWARD, "time")
            ax.set_title(_TITLES[mask].format(window=data["settings"]["window"]))
            ax.xaxis.set_minor_locator(NullLocator())
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                legend.setdefault(label, handle)
        fig.legend(
            list(legend.values()), list(legend), loc="outside upper center", ncols=1, frameon=False
        )
        path = out_dir / FIGURE
        fig.savefig(path, format="svg", facecolor=CARD, metadata={"Date": None})
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `python -m attnlab.tools.bench.flex [--json PATH] [--rounds N] ...`."""
    return _command.run(BENCH, list(sys.argv[1:] if argv is None else argv))


def _measure(settings: FlexSettings, args: argparse.Namespace, command: str) -> dict[str, Any]:
    data = measure_flex(settings, seed=args.seed, command=command)
    data["figures"] = [FIGURE]
    return data


def _write_flex_plots(data: dict[str, Any], out_dir: Path) -> list[Path]:
    return [write_flex_plot(data, out_dir)]


BENCH = _command.Bench(
    "flex", __doc__, FlexSettings, ("lengths", "window", "rounds"), _measure, _write_flex_plots
)
"""The command line's settings, measurement and figure."""


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
