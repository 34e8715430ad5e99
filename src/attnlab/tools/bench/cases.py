"""The implementations under test: each suite builds `Case`s that run one call each.

`kernels` and `window` call attention functions on ready-made `(b, h, T, head_dim)`
tensors; `modules` calls whole layers on `(b, t, d_model)` tokens; `decode` generates
tokens with [`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention] after a prompt,
with a [`StaticKVCache`][attnlab.caches.kv.StaticKVCache] or by recomputing the whole
sequence for each token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

import attnlab
from attnlab.functional.flash import flash_attention
from attnlab.tools.bench.config import DECODE, FORWARD, FORWARD_BACKWARD, SuiteConfig

# ---------------------------------------------------------------------------------------
# Implementations


def naive_attention(query: Tensor, key: Tensor, value: Tensor, *, is_causal: bool) -> Tensor:
    r"""Attention that stores the scores: $\operatorname{softmax}(QK^\top / \sqrt{E})\,V$.

    The textbook version, written to hold as little as a materializing implementation can:
    the `(..., L, S)` scores are masked in place, so only the scores and the weights are
    held at once.

    Args:
        query: Queries, `(..., L, E)`.
        key: Keys, `(..., S, E)`.
        value: Values, `(..., S, Ev)`.
        is_causal: Hide key $j$ from query $i$ when $j > i$ (top-left aligned).

    Returns:
        Context vectors, `(..., L, Ev)`.

    Examples:
        >>> q = k = v = torch.eye(2)
        >>> naive_attention(q, k, v, is_causal=True)
        tensor([[1.0000, 0.0000],
                [0.3302, 0.6698]])
    """
    scores = (query / math.sqrt(query.shape[-1])) @ key.transpose(-2, -1)  # (..., L, S)
    if is_causal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores.masked_fill_(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ value  # (..., L, Ev)


@dataclass
class Case:
    """One implementation at one size: `call()` runs it once, as the mode says.

    `flops` counts one call; a call of the decode suite generates `tokens` tokens, and
    its times are reported per token.
    """

    suite: str
    impl: str
    mode: str
    seq_len: int
    call: Callable[[], None]
    flops: float
    tokens: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


def count_flops(suite: str, config: SuiteConfig, seq_len: int, impl: str, mode: str) -> float:
    r"""Useful floating-point operations of one call, counting matmuls only.

    A matmul of `(m, k)` by `(k, n)` counts $2mkn$. Attention over $P$ visible
    (query, key) pairs costs $2 \cdot 2 P d$ per head (scores, then weights times values);
    causal attention with `L = S = T` has $P = T(T+1)/2$, the pairs a kernel must compute,
    whatever extra it computes in practice. Projections of `t` tokens from $d$ to $d$
    features cost $2 t d^2$ each: three for the article's modules, four with the output
    projection. The backward pass is counted as twice the forward, so forward+backward is
    three times the forward: work a kernel redoes (FlashAttention's recomputed scores)
    is not counted as useful.

    A sliding window of $w$ keys leaves $\sum_i \min(i + 1, w)$ pairs. A decode step
    with $c$ tokens cached projects one token (queries and output over all heads, keys
    and values over the key/value heads) and attends from it to $c + 1$ keys;
    recomputing projects all $c + 1$ tokens and runs causal attention over them. Decode
    counts are for one call of the suite (`config.steps` cached steps, or one
    recomputation).

    Args:
        suite: `"kernels"`, `"modules"`, `"window"` or `"decode"`.
        config: The suite's sizes.
        seq_len: Sequence length $T$ (for `decode`, the context cached before the call).
        impl: Name of the implementation (the projections differ between modules).
        mode: `"forward"`, `"forward+backward"` or `"decode"`.

    Returns:
        The number of operations.

    Examples:
        >>> config = SuiteConfig(batch=1, heads=1, width=2, seq_lens={})
        >>> count_flops("kernels", config, 3, "torch_sdpa", "forward")  # 6 pairs * 2 * 2 * 2
        48.0
    """
    b, h, w, t = config.batch, config.heads, config.width, seq_len
    if suite == "kernels" or (suite == "window" and "window" not in impl):
        forward = 4.0 * b * h * w * (t * (t + 1) // 2)
    elif suite == "window":
        forward = 4.0 * b * h * w * window_pairs(t, config.window or t)
    elif suite == "decode":
        return _decode_flops(config, t, impl)
    else:
        projections = 3 if impl in ("SelfAttention", "MultiHeadAttentionWrapper") else 4
        forward = 2.0 * b * t * w * w * projections + 4.0 * b * t * t * w
    return forward if mode == FORWARD else 3.0 * forward


def window_pairs(seq_len: int, window: int) -> int:
    r"""(query, key) pairs that causal attention with a window of `window` keys computes.

    Query $i$ sees keys $\max(0, i - w + 1) \dots i$: $\min(i + 1, w)$ of them.

    Args:
        seq_len: Sequence length $T$.
        window: Keys per query, itself included.

    Returns:
        $\sum_{i < T} \min(i + 1, w)$.

    Examples:
        >>> window_pairs(5, 2)  # 1 + 2 + 2 + 2 + 2
        9
    """
    full = min(seq_len, window)
    return full * (full + 1) // 2 + (seq_len - full) * window


def _decode_flops(config: SuiteConfig, context: int, impl: str) -> float:
    d, h, kv = config.width, config.heads, config.kv_heads or config.heads
    hd = d // h
    per_token = 2.0 * d * hd * (2 * h + 2 * kv)  # q and o over h heads, k and v over kv
    b = config.batch
    if impl == "recompute":
        t = context + 1
        return b * (t * per_token + 4.0 * h * hd * (t * (t + 1) // 2))
    keys = sum(context + 1 + i for i in range(config.steps))
    return b * (config.steps * per_token + 4.0 * h * hd * keys)


def _timed_call(
    fn: Callable[[], Tensor], inputs: Sequence[Tensor], mode: str
) -> Callable[[], None]:
    """Wrap `fn` into one forward (no grad) or one forward+backward call."""
    if mode == FORWARD:

        def forward() -> None:
            with torch.no_grad():
                fn()

        return forward

    grad: list[Tensor] = []

    def forward_backward() -> None:
        out = fn()
        if not grad:
            grad.append(torch.randn_like(out))
        out.backward(grad[0])  # type: ignore[no-untyped-call]
        for x in inputs:
            x.grad = None

    return forward_backward


Kernels = Callable[[Tensor, Tensor, Tensor], dict[str, Callable[[], Tensor]]]
"""`(q, k, v) -> {name: call}`: the kernels a suite times on the same inputs."""


def _qkv_cases(
    suite: str, kernels: Kernels, config: SuiteConfig, seq_len: int, mode: str
) -> Iterator[Case]:
    """One case per kernel, each timed on the same `(b, h, seq_len, width)` inputs."""
    b, h, d = config.batch, config.heads, config.width
    needs_grad = mode == FORWARD_BACKWARD
    q, k, v = (torch.randn(b, h, seq_len, d, requires_grad=needs_grad) for _ in range(3))
    for name, fn in kernels(q, k, v).items():
        yield Case(
            suite,
            name,
            mode,
            seq_len,
            _timed_call(fn, (q, k, v), mode),
            count_flops(suite, config, seq_len, name, mode),
        )


def _kernel_cases(config: SuiteConfig, seq_len: int, mode: str) -> Iterator[Case]:
    def kernels(q: Tensor, k: Tensor, v: Tensor) -> dict[str, Callable[[], Tensor]]:
        return {
            "naive": lambda: naive_attention(q, k, v, is_causal=True),
            "flash_attention": lambda: flash_attention(q, k, v, is_causal=True),
            "torch_sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True
            ),
        }

    return _qkv_cases("kernels", kernels, config, seq_len, mode)


def module_impls(config: SuiteConfig) -> dict[str, nn.Module]:
    """The modules compared, built fresh (random weights) with the suite's sizes."""
    d, heads = config.width, config.heads
    modules: dict[str, nn.Module] = {
        "SelfAttention": attnlab.SelfAttention(d, d, d),
        "MultiHeadAttentionWrapper": attnlab.MultiHeadAttentionWrapper(
            d, d // heads, d // heads, heads
        ),
    }
    mha = getattr(attnlab, "MultiHeadAttention", None)
    if mha is not None:
        modules["MultiHeadAttention[torch]"] = mha(d, d, heads, backend="torch")
        modules["MultiHeadAttention[scratch]"] = mha(d, d, heads, backend="scratch")
    modules["nn.MultiheadAttention[need_weights=False]"] = nn.MultiheadAttention(
        d, heads, batch_first=True
    )
    modules["nn.MultiheadAttention[default]"] = nn.MultiheadAttention(d, heads, batch_first=True)
    return modules


def _module_call(name: str, module: nn.Module, x: Tensor) -> Callable[[], Tensor]:
    """One forward of `module` on `x`, as each kind of module is called."""
    if name == "nn.MultiheadAttention[need_weights=False]":
        return lambda: module(x, x, x, need_weights=False)[0]
    if name == "nn.MultiheadAttention[default]":
        return lambda: module(x, x, x)[0]
    return lambda: module(x)


def _module_cases(config: SuiteConfig, seq_len: int, mode: str) -> Iterator[Case]:
    x = torch.randn(config.batch, seq_len, config.width, requires_grad=mode == FORWARD_BACKWARD)
    for name, module in module_impls(config).items():
        module.eval()  # no dropout; lets nn.MultiheadAttention take its fast path in inference
        call = _timed_call(_module_call(name, module, x), (x, *module.parameters()), mode)
        yield Case(
            "modules",
            name,
            mode,
            seq_len,
            call,
            count_flops("modules", config, seq_len, name, mode),
        )


def _window_cases(config: SuiteConfig, seq_len: int, mode: str) -> Iterator[Case]:
    w = config.window

    def kernels(q: Tensor, k: Tensor, v: Tensor) -> dict[str, Callable[[], Tensor]]:
        return {
            "flash_attention": lambda: flash_attention(q, k, v, is_causal=True),
            f"flash_attention[window={w}]": lambda: flash_attention(q, k, v, window=w),
        }

    return _qkv_cases("window", kernels, config, seq_len, mode)


def _decode_cases(config: SuiteConfig, context: int, mode: str) -> Iterator[Case]:
    """Generate `config.steps` tokens after `context` cached ones, or recompute once.

    The cached case rewinds its cache to the prompt before each call, so every call
    decodes the same tokens at the same context; the recomputing case runs the layer
    over the prompt and one new token, and keeps the last output, as a decoder without a
    cache must for each token.
    """
    from attnlab.caches.kv import StaticKVCache
    from attnlab.layers.gqa import GroupedQueryAttention

    class RewindableCache(StaticKVCache):
        def rewind(self, length: int) -> None:
            self._length = length  # the buffers beyond `length` are simply overwritten

    if mode != DECODE:
        raise ValueError(f"the decode suite runs in mode {DECODE!r}, got {mode!r}")
    b, d, h, steps = config.batch, config.width, config.heads, config.steps
    kv = config.kv_heads or h
    layer = GroupedQueryAttention(d, h, kv).eval()
    prompt = torch.randn(b, context, d)  # (b, context, d_model)
    new = torch.randn(b, steps, d)  # (b, steps, d_model)
    cache = RewindableCache(b, context + steps, kv, d // h)
    with torch.no_grad():
        layer(prompt, cache=cache)
    whole = torch.cat([prompt, new[:, :1]], dim=1)  # (b, context + 1, d_model)

    def cached() -> None:
        cache.rewind(context)
        with torch.no_grad():
            for i in range(steps):
                layer(new[:, i : i + 1], cache=cache)  # (b, 1, d_model)

    def recompute() -> None:
        with torch.no_grad():
            layer(whole)[:, -1:]  # (b, 1, d_model): the only new output

    yield Case(
        "decode",
        "kv_cache",
        mode,
        context,
        cached,
        count_flops("decode", config, context, "kv_cache", mode),
        tokens=steps,
    )
    yield Case(
        "decode",
        "recompute",
        mode,
        context,
        recompute,
        count_flops("decode", config, context, "recompute", mode),
    )


CASES = {
    "kernels": _kernel_cases,
    "modules": _module_cases,
    "window": _window_cases,
    "decode": _decode_cases,
}


def impl_names(suite: str, config: SuiteConfig) -> list[str]:
    """Names of the implementations that a timed suite compares."""
    if suite == "modules":
        return list(module_impls(config))
    if suite == "window":
        return ["flash_attention", f"flash_attention[window={config.window}]"]
    if suite == "decode":
        return ["kv_cache", "recompute"]
    return ["naive", "flash_attention", "torch_sdpa"]
