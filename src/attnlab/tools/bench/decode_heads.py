r"""Decode time per token of one attention layer with MHA, GQA, MQA and MLA caches.

Run it as `python -m attnlab.tools.bench.decode_heads --json decode_heads.json`. One layer of
each kind, all with the same number of query heads, decodes `steps` tokens one at a time
after a context already in its [`StaticKVCache`][attnlab.caches.kv.StaticKVCache]:

- `MHA`, `GQA`, `MQA`: [`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention] with
  as many key/value heads as query heads, a quarter of them, and one;
- `MLA naive` and `MLA absorbed`:
  [`MultiHeadLatentAttention`][attnlab.layers.mla.MultiHeadLatentAttention] (no query
  compression), expanding the cached latents into per-head keys and values at every
  step, or attending over the latents directly (`absorb=True`).

The context is written into the cache as random numbers (the time of a decode step does
not depend on their values, and a real prefill of every layer would cost more than the
measurement). Rounds are interleaved: each round runs every layer once, in a shuffled
order, on a freshly filled cache. Two smaller tables follow: MLA's two forms on a prompt
(no cache), where the naive form is the cheaper one; and the attention kernel of the
absorbed decode step alone, `scaled_dot_product_attention` of all query heads against the
one shared latent head, called with `enable_gqa=True` (as the module did until it folded
its heads) and with the heads folded into the query length (one query "head" of
`num_heads` rows, the layout of DeepSeek's FlashMLA, and the module's decode step now),
which gives the same numbers.

Times on a shared CPU vary from run to run; compare the layers by their ratios within
one run. Ratios are taken between the fastest of the rounds of each layer, the least
disturbed by other processes; medians are recorded too. The provenance records the load
average and the share of the CPUs that other processes used.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from attnlab.caches.kv import StaticKVCache
from attnlab.layers.gqa import GroupedQueryAttention
from attnlab.layers.mla import MultiHeadLatentAttention, latent_sizes
from attnlab.rules._provenance import begin, command_line
from attnlab.tools.bench.measure import CpuUse, interleaved, round_floats, summary

__all__ = [
    "IMPLS",
    "DecodeShape",
    "absorbed_kernel",
    "decode_steps",
    "main",
    "measure_decode_heads",
]

IMPLS = ("MHA", "GQA", "MQA", "MLA naive", "MLA absorbed")


@dataclass(frozen=True)
class DecodeShape:
    """Sizes of the layers and of the run.

    Attributes:
        d_model: Features per token.
        num_heads: Query heads of every layer.
        head_dim: Features per head of MHA, GQA and MQA.
        gqa_kv_heads: Key/value heads of the GQA layer.
        kv_lora_rank: MLA's cached latent.
        qk_nope_head_dim: MLA's per-head query/key features without RoPE.
        qk_rope_head_dim: MLA's RoPE features (its shared RoPE key is cached too).
        v_head_dim: MLA's per-head value features.
        batch_size: Sequences decoded together.
        contexts: Tokens already cached before the timed steps.
        steps: Tokens decoded, one at a time, per timed call.
        prompt: Length of the prompt on which MLA's two forms are timed without a cache.
    """

    d_model: int = 2048
    num_heads: int = 16
    head_dim: int = 128
    gqa_kv_heads: int = 4
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    batch_size: int = 1
    contexts: tuple[int, ...] = (1024, 4096)
    steps: int = 2
    prompt: int = 1024


def _layers(shape: DecodeShape) -> dict[str, nn.Module]:
    gqa_heads = {"MHA": shape.num_heads, "GQA": shape.gqa_kv_heads, "MQA": 1}
    layers: dict[str, nn.Module] = {
        name: GroupedQueryAttention(
            shape.d_model, shape.num_heads, kv_heads, head_dim=shape.head_dim
        ).eval()
        for name, kv_heads in gqa_heads.items()
    }
    mla = MultiHeadLatentAttention(
        shape.d_model,
        shape.num_heads,
        **latent_sizes(shape),
    ).eval()
    layers["MLA naive"] = layers["MLA absorbed"] = mla
    return layers


def _filled_cache(layer: nn.Module, shape: DecodeShape, context: int) -> StaticKVCache:
    """A cache holding `context` random tokens, with room for `shape.steps` more."""
    b, room = shape.batch_size, context + shape.steps
    if isinstance(layer, MultiHeadLatentAttention):
        cache = layer.new_cache(b, room)
    else:
        assert isinstance(layer, GroupedQueryAttention)
        cache = StaticKVCache(b, room, layer.num_kv_heads, layer.head_dim)
    keys = torch.randn(b, cache.num_kv_heads, context, cache.head_dim)
    values = torch.randn(b, cache.num_kv_heads, context, cache.v_head_dim)
    cache.update(keys, values)
    return cache


def decode_steps(
    name: str, layer: nn.Module, cache: StaticKVCache, tokens: torch.Tensor
) -> torch.Tensor:
    """Decode `tokens` `(b, steps, d_model)` one at a time with `layer` and `cache`.

    Args:
        name: One of `IMPLS`; `"MLA absorbed"` decodes with `absorb=True`.
        layer: The layer `name` stands for.
        cache: Its cache, holding the context; the new tokens are appended.
        tokens: The tokens to decode.

    Returns:
        The outputs of the steps, `(b, steps, d_model)`.
    """
    kwargs = {"absorb": True} if name == "MLA absorbed" else {}
    outputs = [layer(tokens[:, i : i + 1], cache=cache, **kwargs) for i in range(tokens.shape[1])]
    return torch.cat(outputs, dim=1)


def absorbed_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, fold_heads: bool
) -> torch.Tensor:
    """Attention of `q` `(b, h, t, d)` against one shared head `k`, `v` `(b, 1, s, .)`.

    Args:
        q: Queries of all heads, in latent space (the absorbed form's).
        k: The shared key head (latents and RoPE keys).
        v: The shared value head (the latents).
        fold_heads: Run the `h` heads as `h * t` rows of one head (no mask: meant for
            decode steps, where every query sees every cached key) instead of passing
            `enable_gqa=True`.

    Returns:
        `(b, h, t, v.shape[-1])`.
    """
    if not fold_heads:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    b, h, t, d = q.shape
    rows = q.reshape(b, 1, h * t, d)  # (b, 1, h * t, d): heads become query rows
    out = torch.nn.functional.scaled_dot_product_attention(rows, k, v)
    return out.view(b, h, t, v.shape[-1])  # (b, h, t, d_v)


def _timed(fn: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def _warm_interleaved(
    calls: Mapping[str, Callable[[], object]], rounds: int, order: random.Random
) -> dict[str, list[float]]:
    """`interleaved` after one round of warm-up, which is not kept."""
    times = interleaved(calls, rounds + 1, order)
    return {name: t[1:] for name, t in times.items()}


def _with_ratios(times: dict[str, list[float]], baseline: str) -> dict[str, dict[str, float]]:
    best = min(times[baseline])
    return {name: {**summary(t), "ratio": min(t) / best} for name, t in times.items()}


def measure_decode_heads(
    shape: DecodeShape | None = None,
    *,
    rounds: int = 15,
    seed: int = 0,
    command: str = "",
) -> dict[str, Any]:
    """Time decoding per token for every layer of `IMPLS`, and MLA's forms on a prompt.

    Args:
        shape: Sizes of the layers and of the run; `DecodeShape()` by default.
        rounds: Timed rounds (after one untimed warm-up round).
        seed: Seed of the weights, the cached numbers, the tokens and the orders.
        command: The command line, for the provenance.

    Returns:
        A JSON-ready dict: `provenance`, `shape`, `cache_bytes_per_token` (float32, per
        sequence and layer, read from the real caches), `decode` (per context and layer:
        per-token seconds, and `ratio`, the fastest round's time over MHA's), `prompt`
        (MLA naive and absorbed on `shape.prompt` tokens, causal, without a cache;
        `ratio` to naive) and `absorbed_kernel` (the absorbed decode step's attention at
        the longest context, `enable_gqa` vs heads folded).

    Raises:
        ValueError: If `rounds` is less than 1.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    shape = DecodeShape() if shape is None else shape
    torch.manual_seed(seed)
    order = random.Random(seed)
    layers = _layers(shape)
    started = begin()
    cpu_use = CpuUse()
    bytes_per_token: dict[str, int] = {}
    decode: dict[str, dict[str, Any]] = {}
    with torch.no_grad():
        for context in shape.contexts:
            tokens = torch.randn(shape.batch_size, shape.steps, shape.d_model)
            times: dict[str, list[float]] = {name: [] for name in IMPLS}
            for r in range(rounds + 1):  # round 0 warms up and is not kept
                names = list(IMPLS)
                order.shuffle(names)
                for name in names:
                    layer = layers[name]
                    cache = _filled_cache(layer, shape, context)
                    bytes_per_token[name] = cache.nbytes // (cache.max_length * cache.batch_size)
                    seconds = _timed(decode_steps, name, layer, cache, tokens)
                    if r > 0:
                        times[name].append(seconds / shape.steps)
            decode[str(context)] = _with_ratios(times, "MHA")
        mla = layers["MLA naive"]
        prompt = torch.randn(shape.batch_size, shape.prompt, shape.d_model)
        prompt_forms = {
            "MLA naive": functools.partial(mla, prompt, is_causal=True, absorb=False),
            "MLA absorbed": functools.partial(mla, prompt, is_causal=True, absorb=True),
        }
        prompt_results = _with_ratios(_warm_interleaved(prompt_forms, rounds, order), "MLA naive")
        context = max(shape.contexts)
        b, h = shape.batch_size, shape.num_heads
        r, dr = shape.kv_lora_rank, shape.qk_rope_head_dim
        q = torch.randn(b, h, 1, r + dr)  # (b, h, 1, r + d_rope): one decoded token
        k = torch.randn(b, 1, context, r + dr)  # (b, 1, s, r + d_rope)
        v = torch.randn(b, 1, context, r)  # (b, 1, s, r)
        kernel_forms = {
            "enable_gqa": functools.partial(absorbed_kernel, q, k, v, fold_heads=False),
            "heads folded": functools.partial(absorbed_kernel, q, k, v, fold_heads=True),
        }
        kernel_results: dict[str, Any] = {
            "context": context,
            **_with_ratios(_warm_interleaved(kernel_forms, rounds, order), "enable_gqa"),
        }
    data = {
        "provenance": cpu_use.provenance(
            command, started, rounds=rounds, seed=seed, dtype="float32"
        ),
        "shape": asdict(shape),
        "cache_bytes_per_token": {name: bytes_per_token[name] for name in IMPLS},
        "decode": decode,
        "prompt": prompt_results,
        "absorbed_kernel": kernel_results,
    }
    return round_floats(data)  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `python -m attnlab.tools.bench.decode_heads [--json PATH] [--rounds N]`."""
    parser = argparse.ArgumentParser(
        prog="python -m attnlab.tools.bench.decode_heads", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds (default 15)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: a shared CPU)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    argv = list(sys.argv[1:] if argv is None else argv)  # as recorded, not only as parsed
    command = command_line("attnlab.tools.bench.decode_heads", argv)
    data = measure_decode_heads(rounds=args.rounds, seed=args.seed, command=command)
    text = json.dumps(data, indent=1)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
