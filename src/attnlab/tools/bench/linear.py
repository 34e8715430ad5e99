r"""Decoding with linear attention, timed: a KV cache against a fixed-size state.

Run it as `python -m attnlab.tools.bench.linear --json docs/assets/bench/linear.json`. Three
[`Decoder`][attnlab.models.decoder.Decoder]s of one Qwen3-Next-like shape, reduced in width to
fit a CPU run (`LinearSettings`: 4 layers of width 512; full attention with 8 query and
2 key/value heads of 64 features, gated output and RoPE on a quarter of each head;
Gated DeltaNet with 8 query/key and 16 value heads of 64 features; a SwiGLU MLP; float32,
batch 1), differ only in their token mixers:

| model | layers |
|:--|:--|
| `softmax` | full attention in every layer, a static KV cache each |
| `linear` | Gated DeltaNet in every layer, a `GatedDeltaNetState` each |
| `hybrid` | three Gated DeltaNet layers to one full-attention layer (Qwen3-Next's 3 : 1) |

For each context length (512, 2048, 8192) each model prefills that many random tokens
(timed once, recorded), then decodes one token per call from its caches: the time per
decoded token is the median over interleaved rounds (each round runs the three once, in
a shuffled order, so a busy spell of the shared machine slows them all), and the ratios
are medians of per-round ratios against `softmax`, after three untimed rounds. Each
call appends a token, so the context grows by at most `rounds + 4` tokens over a case.
The bytes the caches hold are read off the cache objects: a static cache's buffer per
filled position times the context, a state's whole size. The provenance records the
load average before and after and the CPU share of other processes.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from attnlab.caches.base import LayerCache
from attnlab.models.config import DecoderConfig, LayerKind, LinearAttentionConfig
from attnlab.models.decoder import Decoder
from attnlab.models.layout import cpu_decode_layout
from attnlab.rules._provenance import begin
from attnlab.rules._validation import validation
from attnlab.rules.sizes import Sizes, size
from attnlab.tools.bench import _command
from attnlab.tools.bench.measure import CpuUse, interleaved, ratio_summary, round_floats, summary

__all__ = [
    "MODELS",
    "LinearSettings",
    "cache_bytes",
    "decoder_config",
    "main",
    "measure_linear",
]

MODELS = ("softmax", "linear", "hybrid")
"""The three token-mixer stacks, the first the baseline of the ratios."""
_WARMUP = 3  # untimed rounds per context: the first calls of a shape allocate


@dataclass(frozen=True)
class LinearSettings(Sizes):
    """What the run measures.

    Attributes:
        contexts: Context lengths to decode after.
        num_layers: Layers per model (a multiple of 4 for the 3 : 1 hybrid).
        d_model: Width of the residual stream.
        num_heads: Query heads of the full-attention layers.
        num_kv_heads: Their key/value heads.
        head_dim: Their features per head.
        linear_k_heads: Query/key heads of the Gated DeltaNet layers.
        linear_v_heads: Their value heads.
        linear_head_dim: Their features per head (keys and values).
        hidden_dim: Width of the SwiGLU MLP.
        vocab_size: Distinct tokens.
        rounds: Timed rounds per context, after three untimed rounds.
    """

    contexts: tuple[int, ...] = (512, 2048, 8192)
    num_layers: int = size(4, multiple_of=4, why=" (the 3 : 1 hybrid)")
    d_model: int = 512
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 64
    linear_k_heads: int = 8
    linear_v_heads: int = 16
    linear_head_dim: int = 64
    hidden_dim: int = 1024
    vocab_size: int = 1024
    rounds: int = 20


def decoder_config(model: str, settings: LinearSettings) -> DecoderConfig:
    """The `DecoderConfig` of one of `MODELS` at the settings' shape.

    Examples:
        >>> decoder_config("hybrid", LinearSettings()).layer_kinds
        ('linear', 'linear', 'linear', 'full')
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    s = settings
    every: dict[str, tuple[LayerKind, ...]] = {
        "softmax": ("full",) * 4,
        "linear": ("linear",) * 4,
        "hybrid": ("linear", "linear", "linear", "full"),
    }
    return DecoderConfig(
        vocab_size=s.vocab_size,
        d_model=s.d_model,
        num_layers=s.num_layers,
        num_heads=s.num_heads,
        num_kv_heads=s.num_kv_heads,
        head_dim=s.head_dim,
        hidden_dim=s.hidden_dim,
        max_positions=max(s.contexts) + s.rounds + _WARMUP + 1,
        tie_embeddings=False,
        qk_norm="head",
        family="qwen3_next",
        layer_kinds=every[model] * (s.num_layers // 4),
        linear=LinearAttentionConfig(
            s.linear_k_heads, s.linear_v_heads, s.linear_head_dim, s.linear_head_dim
        ),
        attn_output_gate=True,
        rope_dims=s.head_dim // 4,
    )


def cache_bytes(caches: Sequence[object], context: int) -> int:
    """Bytes that `caches` hold for `context` tokens of one batch.

    Asked of each through the cache protocol
    ([`LayerCache`][attnlab.caches.base.LayerCache]): a cache preallocated for
    `max_length` tokens (a static cache) counts its bytes per position times `context`
    (what a cache sized to the context would hold); any other what it holds now
    (`nbytes`), e.g. a `GatedDeltaNetState`'s whole size, whatever the context.

    Raises:
        TypeError: If an entry of `caches` is not a `LayerCache`.
    """
    total = 0
    for i, cache in enumerate(caches):
        if not isinstance(cache, LayerCache):
            raise TypeError(f"caches[{i}] must be a LayerCache, got {type(cache).__name__}")
        max_length = cache.max_length
        total += cache.nbytes if max_length is None else cache.nbytes // max_length * context
    return total


def measure_linear(
    settings: LinearSettings | None = None, *, seed: int = 0, command: str = ""
) -> dict[str, Any]:
    """Every context, as the JSON record: `provenance`, `settings`, `cases`.

    Args:
        settings: What to measure; `LinearSettings()` by default.
        seed: Seed of the weights, the tokens and the round orders.
        command: The command line, for the provenance.

    Returns:
        `parameters` holds each model's parameter count (its layers' widths differ:
        a Gated DeltaNet layer projects to more features than an attention layer, as in
        Qwen3-Next). Each entry of `cases` holds `context`; per model `time_s` (per decoded token:
        median, min, max over rounds), `prefill_s` (one run), `cache_bytes` and
        `bytes_per_token` (of context); and `over_softmax`, per model the median of
        per-round time ratios against `softmax`.
    """
    settings = LinearSettings() if settings is None else settings
    started, cpu_use = begin(), CpuUse()
    order = random.Random(seed)
    models = {}
    for i, name in enumerate(MODELS):
        torch.manual_seed(seed + i)
        models[name] = cpu_decode_layout(Decoder(decoder_config(name, settings)).eval())
    cases: list[dict[str, Any]] = []
    with torch.inference_mode(), validation(False):
        for context in settings.contexts:
            g = torch.Generator().manual_seed(seed + context)
            ids = torch.randint(0, settings.vocab_size, (1, context), generator=g)
            token = ids[:, -1:]  # (1, 1), fed back at every step
            caches, prefill = {}, {}
            for name, model in models.items():
                caches[name] = model.make_cache(1, context + settings.rounds + _WARMUP + 1)
                start = time.perf_counter()
                model(ids, cache=caches[name], last_only=True)
                prefill[name] = time.perf_counter() - start
            sizes = {name: cache_bytes(caches[name], context) for name in MODELS}

            calls = {name: _step(models[name], token, caches[name]) for name in MODELS}
            interleaved(calls, _WARMUP, order)
            times = interleaved(calls, settings.rounds, order)
            cases.append(
                {
                    "context": context,
                    "time_s": {name: summary(times[name]) for name in MODELS},
                    "prefill_s": prefill,
                    "cache_bytes": sizes,
                    "bytes_per_token": {name: sizes[name] / context for name in MODELS},
                    "over_softmax": {
                        name: ratio_summary(times[name], times["softmax"])["median"]
                        for name in MODELS[1:]
                    },
                }
            )
            ms = {name: 1e3 * cases[-1]["time_s"][name]["median"] for name in MODELS}
            print(
                f"context {context}: " + ", ".join(f"{name} {ms[name]:.2f} ms" for name in MODELS),
                file=sys.stderr,
                flush=True,
            )
    record = {
        "provenance": cpu_use.provenance(command, started, seed=seed),
        "settings": asdict(settings),
        "parameters": {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()},
        "cases": cases,
    }
    return round_floats(record)  # type: ignore[no-any-return]


def _step(model: Decoder, token: torch.Tensor, caches: list[Any]) -> Callable[[], object]:
    """One decode step of `model` from `caches` (which it extends by one token)."""
    return lambda: model(token, cache=caches, last_only=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `python -m attnlab.tools.bench.linear [--json PATH] [--rounds N] ...`."""
    return _command.run(BENCH, list(sys.argv[1:] if argv is None else argv))


def _measure(settings: LinearSettings, args: argparse.Namespace, command: str) -> dict[str, Any]:
    return measure_linear(settings, seed=args.seed, command=command)


BENCH = _command.Bench("linear", __doc__, LinearSettings, ("contexts", "rounds"), _measure)
"""The command line's settings and measurement (no figures)."""


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
