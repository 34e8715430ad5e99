r"""Every attnlab mask and score change as a FlexAttention `mask_mod` or `score_mod`.

PyTorch's FlexAttention (Dong et al., 2024, https://arxiv.org/abs/2412.05496;
`torch.nn.attention.flex_attention`) takes the variants of attention as small functions
of indices instead of tensors:

- a `mask_mod(b, h, q_idx, kv_idx) -> bool` says whether query `q_idx` of batch entry
  `b` and head `h` may attend to key `kv_idx` (the allowed convention of
  [`attnlab.rules.masks`][attnlab.rules.masks]: True = attend);
- a `score_mod(score, b, h, q_idx, kv_idx) -> score` changes one scaled score before the
  softmax (a bias such as ALiBi, a squashing such as softcapping).

`create_block_mask` evaluates a `mask_mod` once over tiles of the score matrix and keeps
for each tile whether it is empty (skipped), full (no mask) or partial (masked by the
`mask_mod`): a sparse mask costs what it keeps.

This module writes each rule of attnlab in that form: the masks of
[`attnlab.rules.masks`][attnlab.rules.masks] ([`causal_mod`][attnlab.functional.flex.causal_mod]
with both
alignments, [`sliding_window_mod`][attnlab.functional.flex.sliding_window_mod],
[`sink_window_mod`][attnlab.functional.flex.sink_window_mod],
[`padding_mod`][attnlab.functional.flex.padding_mod]), which state the same rules as the dense
builders there and are tested equal to them, and the masks and score changes that have
no dense builder in attnlab ([`prefix_lm_mod`][attnlab.functional.flex.prefix_lm_mod],
[`document_mod`][attnlab.functional.flex.document_mod] for packed sequences,
[`alibi_mod`][attnlab.functional.flex.alibi_mod],
[`softcap_mod`][attnlab.functional.flex.softcap_mod]).
[`to_dense`][attnlab.functional.flex.to_dense] materialises any of them over all (query, key)
pairs; [`block_mask`][attnlab.functional.flex.block_mask],
[`block_map`][attnlab.functional.flex.block_map]
and [`block_fraction`][attnlab.functional.flex.block_fraction] build a block mask and say how much
of it is computed.

FlexAttention has no term for learned attention sinks (gpt-oss: one logit $s_h$ per head
in the softmax's denominator). [`attention`][attnlab.functional.flex.attention] adds it
from the log-sum-exp $\ell_i$ that FlexAttention returns (and hands that back with
`return_lse=True`): the output of row $i$ is scaled by $\sigma(\ell_i - s_h)$
([`apply_sinks`][attnlab.functional.flex.apply_sinks]). The compiled CPU kernel does not
return the log-sum-exp (PyTorch 2.13): there a sink must be one more key instead.

On a CPU, FlexAttention runs compiled (`torch.compile`, inference only: its CPU backward
raises `NotImplementedError`) or eagerly, where it materialises the whole score matrix
and warns that it is not the fused kernel: fine for checking a mask, slow otherwise.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypedDict, Unpack, get_args, overload

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import (
    AuxRequest,
    BlockMask,
    create_block_mask,
    flex_attention,
)

from attnlab.functional.flash import merge_sinks
from attnlab.rules._validation import (
    check_block_size,
    check_bool,
    check_choice,
    check_device,
    check_index_tensor,
    check_int_sequence,
    check_nonnegative_int,
    check_positive_int,
    check_qkv,
    check_scale,
    check_sinks,
    check_softcap,
)
from attnlab.rules.masks import Alignment, alignment_offset, visible

__all__ = [
    "MaskMod",
    "ScoreMod",
    "alibi_mod",
    "alibi_slopes",
    "apply_sinks",
    "attention",
    "block_fraction",
    "block_map",
    "block_mask",
    "causal_mod",
    "chunked_mod",
    "document_ids",
    "document_mod",
    "padding_mod",
    "prefix_lm_mod",
    "sink_window_mod",
    "sliding_window_mod",
    "softcap_mod",
    "to_dense",
]

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
"""`mask_mod(b, h, q_idx, kv_idx) -> bool tensor`: True where the query sees the key."""
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
"""`score_mod(score, b, h, q_idx, kv_idx) -> tensor`: the changed scaled score."""

_MASK_ARGS = "(b, h, q_idx, kv_idx)"
_SCORE_ARGS = "(score, b, h, q_idx, kv_idx)"


def _positional_range(fn: Callable[..., Any]) -> tuple[int, float] | None:
    """How many positional arguments `fn` takes, (fewest, most); None if unknown."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return None
    fewest, most = 0, 0.0
    for p in signature.parameters.values():
        if p.kind == p.VAR_POSITIONAL:
            most = float("inf")
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            most += 1
            fewest += p.default is p.empty
        elif p.kind == p.KEYWORD_ONLY and p.default is p.empty:
            return (-1, -1)  # a required keyword argument: flex never passes one
    return fewest, most


def _check_mod(name: str, fn: object, n: int, args: str) -> Callable[..., Tensor]:
    """Raise TypeError unless `fn` is a function that accepts `n` positional arguments."""
    if not callable(fn):
        raise TypeError(f"{name} must be a function {args}, got {type(fn).__name__}")
    found = _positional_range(fn)
    if found is not None and not found[0] <= n <= found[1]:
        label = getattr(fn, "__name__", type(fn).__name__)
        raise TypeError(
            f"{name} must take {n} positional arguments {args}, got {label}{inspect.signature(fn)}"
        )
    return fn


def _mod_kind(name: str, fn: object) -> str:
    """'mask' or 'score': which of the two signatures `fn` has; TypeError if neither."""
    if callable(fn):
        found = _positional_range(fn)
        if found is None or found[0] <= 4 <= found[1]:
            return "mask"
        if found[0] <= 5 <= found[1]:
            return "score"
    label = getattr(fn, "__name__", type(fn).__name__)
    raise TypeError(
        f"{name} must be a mask_mod {_MASK_ARGS} or a score_mod {_SCORE_ARGS}, got {label}"
        + (f"{inspect.signature(fn)}" if callable(fn) else "")
    )


def _offset(t_q: object, t_k: object, align: object) -> int:
    """Key position of query 0: 0 for top-left, `t_k - t_q` for bottom-right."""
    check_choice("align", align, get_args(Alignment))
    if align == "top-left":
        return 0
    if t_q is None or t_k is None:
        raise ValueError(
            f"align='bottom-right' places the queries at the end of the keys, so it needs "
            f"both lengths, got t_q={t_q!r} and t_k={t_k!r}"
        )
    t_q, t_k = check_nonnegative_int("t_q", t_q), check_nonnegative_int("t_k", t_k)
    return alignment_offset(t_q, t_k, "bottom-right")


def causal_mod(
    t_q: int | None = None, t_k: int | None = None, *, align: Alignment = "top-left"
) -> MaskMod:
    r"""The causal mask of [`masks.causal`][attnlab.rules.masks.causal] as a `mask_mod`.

    Query $i$ sits at key position $i + o$ ($o = 0$ top-left, $o = t_k - t_q$
    bottom-right) and sees the keys $j \le i + o$: the rule of
    [`masks.causal`][attnlab.rules.masks.causal], stated on indices.

    Args:
        t_q: Number of queries; needed for `align="bottom-right"` only.
        t_k: Number of keys; needed for `align="bottom-right"` only.
        align: `"top-left"` (PyTorch's `is_causal`) or `"bottom-right"` (the queries are
            the last `t_q` of the `t_k` positions, as after a KV cache).

    Returns:
        `mask_mod(b, h, q_idx, kv_idx)`.

    Raises:
        TypeError: If a length is not an int.
        ValueError: If `align` is unknown, or bottom-right lacks a length.

    Examples:
        >>> to_dense(causal_mod(2, 4, align="bottom-right"), 2, 4)[0, 0]
        tensor([[ True,  True,  True, False],
                [ True,  True,  True,  True]])
    """
    offset = _offset(t_q, t_k, align)

    def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return visible(q_idx + offset, kv_idx)

    return causal


def sliding_window_mod(
    t_q: int | None = None,
    t_k: int | None = None,
    *,
    window: int,
    align: Alignment = "top-left",
) -> MaskMod:
    r"""The sliding window of [`masks.sliding_window`][attnlab.rules.masks.sliding_window].

    Query $i$ (at key position $i + o$, as in [`causal_mod`][attnlab.functional.flex.causal_mod])
    sees the keys $i + o - w < j \le i + o$: its last `window` keys, itself included.

    Args:
        t_q: Number of queries; needed for `align="bottom-right"` only.
        t_k: Number of keys; needed for `align="bottom-right"` only.
        window: Keys each query sees, itself included; a positive int.
        align: As for [`causal_mod`][attnlab.functional.flex.causal_mod].

    Returns:
        `mask_mod(b, h, q_idx, kv_idx)`.

    Raises:
        TypeError: If `window` or a length is not an int.
        ValueError: If `window` is not positive, `align` is unknown, or bottom-right
            lacks a length.

    Examples:
        >>> to_dense(sliding_window_mod(window=2), 4)[0, 0].int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    w = check_positive_int("window", window)
    offset = _offset(t_q, t_k, align)

    def sliding_window(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return visible(q_idx + offset, kv_idx, w)  # at the query's position among the keys

    return sliding_window


def chunked_mod(
    t_q: int | None = None,
    t_k: int | None = None,
    *,
    chunk_size: int,
    align: Alignment = "top-left",
) -> MaskMod:
    r"""The chunks of [`masks.chunked`][attnlab.rules.masks.chunked] (Llama 4's local layers).

    Query $i$, at key position $p = i + o$ as in
    [`causal_mod`][attnlab.functional.flex.causal_mod], sees the keys $j \le p$ with
    $\lfloor j / C \rfloor = \lfloor p / C \rfloor$. It takes the arguments of
    [`sliding_window_mod`][attnlab.functional.flex.sliding_window_mod], with `chunk_size` $C$
    (a positive int) in place of `window`, raises as it does, and returns a
    `mask_mod(b, h, q_idx, kv_idx)`.

    Examples:
        >>> to_dense(chunked_mod(chunk_size=2), 4)[0, 0].int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 0, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    size = check_positive_int("chunk_size", chunk_size)
    offset = _offset(t_q, t_k, align)

    def chunked(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        p = q_idx + offset  # the query's position among the keys
        return visible(p, kv_idx) & (p // size == kv_idx // size)

    return chunked


def sink_window_mod(
    t_q: int | None = None,
    t_k: int | None = None,
    *,
    window: int,
    num_sink_tokens: int,
    align: Alignment = "top-left",
) -> MaskMod:
    r"""StreamingLLM's window that keeps the first keys, as a `mask_mod`.

    The rule of [`masks.sink_window`][attnlab.rules.masks.sink_window]: query $i$ (at key
    position $i + o$) sees key $j \le i + o$ if $j > i + o - w$ or $j < n$, the
    `num_sink_tokens`. These sink *tokens* are a mask; the learned sink *logits* of
    gpt-oss are the `sink_logits` argument of
    [`attention`][attnlab.functional.flex.attention].

    Args:
        t_q: Number of queries; needed for `align="bottom-right"` only.
        t_k: Number of keys; needed for `align="bottom-right"` only.
        window: Most recent keys each query sees, itself included; a positive int.
        num_sink_tokens: How many keys from the start every query sees as well (not its future).
        align: As for [`causal_mod`][attnlab.functional.flex.causal_mod].

    Returns:
        `mask_mod(b, h, q_idx, kv_idx)`.

    Raises:
        TypeError: If a size is not an int.
        ValueError: If `window` is not positive, `num_sink_tokens` is negative, `align` is unknown
            or bottom-right lacks a length.

    Examples:
        >>> to_dense(sink_window_mod(window=2, num_sink_tokens=1), 4)[0, 0].int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [1, 1, 1, 0],
                [1, 0, 1, 1]], dtype=torch.int32)
    """
    w = check_positive_int("window", window)
    n = check_nonnegative_int("num_sink_tokens", num_sink_tokens)
    offset = _offset(t_q, t_k, align)

    def sink_window(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        position = q_idx + offset
        return visible(position, kv_idx, w) | (visible(position, kv_idx) & (kv_idx < n))

    return sink_window


def _lengths(name: str, lengths: object) -> Tensor:
    """A 1-d int64 tensor of non-negative lengths (a tensor's values unread while tracing)."""
    n = check_int_sequence(name, lengths)
    return n.long() if isinstance(n, Tensor) else torch.tensor(n, dtype=torch.long)


def padding_mod(lengths: Tensor | Sequence[int]) -> MaskMod:
    r"""The key padding of [`masks.key_padding`][attnlab.rules.masks.key_padding] as a `mask_mod`.

    Batch entry $b$ holds `lengths[b]` real tokens, then padding: every query sees key
    $j$ only if $j < \text{lengths}[b]$. Combine it with a causal mask by
    `torch.nn.attention.flex_attention.and_masks`. Build its block mask with the batch
    size (`b=len(lengths)` in [`block_mask`][attnlab.functional.flex.block_mask]).

    Args:
        lengths: Real length of each sequence, `(b,)` ints.

    Returns:
        `mask_mod(b, h, q_idx, kv_idx)`.

    Raises:
        TypeError: If `lengths` is not a sequence of ints or a 1-d integer tensor.
        ValueError: If a length is negative.

    Examples:
        >>> to_dense(padding_mod([3, 1]), 2, 4, b=2)[:, 0, 0]
        tensor([[ True,  True,  True, False],
                [ True, False, False, False]])
    """
    n = _lengths("lengths", lengths)

    def padding(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx < n[b]

    return padding


def prefix_lm_mod(prefix_lengths: int | Tensor | Sequence[int]) -> MaskMod:
    r"""Prefix-LM: the prefix attends both ways, the rest causally (T5's prefix LM, PaliGemma).

    Query $i$ sees key $j$ if $j \le i$ (causal, top-left) or $j < p$, with $p$ the
    prefix's length: every token sees the whole prefix (a prompt, an image), and the
    tokens after it see the past only. One $p$ for the batch, or one per batch entry.

    Args:
        prefix_lengths: Length of the prefix, an int or `(b,)` ints.

    Returns:
        `mask_mod(b, h, q_idx, kv_idx)`.

    Raises:
        TypeError: If `prefix_lengths` is neither an int nor a sequence of ints.
        ValueError: If a length is negative.

    Examples:
        >>> to_dense(prefix_lm_mod(2), 4)[0, 0].int()
        tensor([[1, 1, 0, 0],
                [1, 1, 0, 0],
                [1, 1, 1, 0],
                [1, 1, 1, 1]], dtype=torch.int32)
    """
    if isinstance(prefix_lengths, int) and not isinstance(prefix_lengths, bool):
        p = check_nonnegative_int("prefix_lengths", prefix_lengths)

        def prefix_lm(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return visible(q_idx, kv_idx) | (kv_idx < p)

        return prefix_lm
    n = _lengths("prefix_lengths", prefix_lengths)

    def prefix_lm_batch(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return visible(q_idx, kv_idx) | (kv_idx < n[b])

    return prefix_lm_batch


def document_ids(lengths: Tensor | Sequence[int]) -> Tensor:
    """The document of each token when documents of `lengths` are packed into one row.

    Args:
        lengths: Tokens of each document, in order, `(n,)` ints.

    Returns:
        An int64 tensor `(sum(lengths),)`: token `t` holds the index of its document.

    Raises:
        TypeError: If `lengths` is not a sequence of ints or a 1-d integer tensor.
        ValueError: If a length is negative.

    Examples:
        >>> document_ids([2, 3, 1])
        tensor([0, 0, 1, 1, 1, 2])
    """
    n = _lengths("lengths", lengths)
    return torch.repeat_interleave(torch.arange(len(n), device=n.device), n)


def document_mod(document_ids: Tensor, *, is_causal: bool = True) -> MaskMod:
    r"""Document masking: packed sequences (jagged batches) attend within their own document.

    Several sequences of different lengths packed into one row, with no padding: query
    $i$ sees key $j$ only if both belong to the same document (and, with `is_causal`,
    $j \le i$). Build the ids from the lengths with
    [`document_ids`][attnlab.functional.flex.document_ids].

    Args:
        document_ids: The document of each token, `(t,)` for one packing shared by the
            batch or `(b, t)` for one per batch entry; integers.
        is_causal: Also hide each query's future.

    Returns:
        `mask_mod(b, h, q_idx, kv_idx)`.

    Raises:
        TypeError: If `document_ids` is not an integer tensor or `is_causal` not a bool.
        ValueError: If `document_ids` has neither 1 nor 2 dimensions.

    Examples:
        >>> to_dense(document_mod(document_ids([2, 2])), 4)[0, 0].int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 0, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    ids = check_index_tensor("document_ids", document_ids, (1, 2), "(t,) or (b, t)")
    is_causal = check_bool("is_causal", is_causal)
    if ids.ndim == 1:

        def same(b: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return ids[q_idx] == ids[kv_idx]

    else:

        def same(b: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return ids[b, q_idx] == ids[b, kv_idx]

    def document(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        inside = same(b, q_idx, kv_idx)
        return inside & visible(q_idx, kv_idx) if is_causal else inside

    return document


def alibi_slopes(num_heads: int) -> Tensor:
    r"""ALiBi's slope of each head (Press et al., 2022, https://arxiv.org/abs/2108.12409).

    For $n$ heads, $n$ a power of 2, head $h$ gets $m_h = 2^{-8(h + 1)/n}$: the geometric
    sequence $2^{-8/n}, 2^{-16/n}, \dots, 2^{-8}$. For other $n$, the paper's rule: the
    slopes of the largest power of 2 below $n$, then every other slope of twice that
    power for the remaining heads (BLOOM's and MPT's code do the same).

    Args:
        num_heads: Number of heads; a positive int.

    Returns:
        A float32 tensor `(num_heads,)`.

    Raises:
        TypeError: If `num_heads` is not an int.
        ValueError: If it is not positive.

    Examples:
        >>> alibi_slopes(4)
        tensor([0.2500, 0.0625, 0.0156, 0.0039])
    """
    n = check_positive_int("num_heads", num_heads)
    power = 1 << (n.bit_length() - 1)  # the largest power of 2 <= n

    def geometric(k: int) -> Tensor:
        return 2.0 ** (-8.0 * torch.arange(1, k + 1, dtype=torch.float64) / k)

    extra = geometric(2 * power)[0::2][: n - power]  # the odd steps of the finer sequence
    return torch.cat([geometric(power), extra]).float()


def alibi_mod(num_heads: int) -> ScoreMod:
    r"""ALiBi as a `score_mod`: each head's scores fall linearly with the distance.

    Head $h$ adds $m_h (j - i)$ to the score of query $i$ and key $j$, with the slopes
    $m_h$ of [`alibi_slopes`][attnlab.functional.flex.alibi_slopes]: a key $d$ positions in the
    past costs $m_h d$, no position embedding needed. Use it with a causal mask.

    Args:
        num_heads: Number of (query) heads.

    Returns:
        `score_mod(score, b, h, q_idx, kv_idx)`.

    Raises:
        TypeError: If `num_heads` is not an int.
        ValueError: If it is not positive.

    Examples:
        >>> to_dense(alibi_mod(2), 3, h=2)[0, 1]  # head 1's bias: slope 1/256
        tensor([[ 0.0000,  0.0039,  0.0078],
                [-0.0039,  0.0000,  0.0039],
                [-0.0078, -0.0039,  0.0000]])
    """
    slopes = alibi_slopes(num_heads)

    def alibi(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + slopes[h] * (kv_idx - q_idx)

    return alibi


def softcap_mod(softcap: float) -> ScoreMod:
    r"""Gemma 2's logit softcapping as a `score_mod`: $x \mapsto c \tanh(x / c)$.

    The same change as `softcap=` of
    [`scaled_dot_product_attention`][attnlab.functional.sdpa.scaled_dot_product_attention]
    and [`flash_attention`][attnlab.functional.flash.flash_attention], on the scaled score before
    the mask.

    Args:
        softcap: The cap $c$; a positive finite float (Gemma 2: 50).

    Returns:
        `score_mod(score, b, h, q_idx, kv_idx)`.

    Raises:
        TypeError: If `softcap` is not a number.
        ValueError: If it is not positive and finite.

    Examples:
        >>> mod = softcap_mod(2.0)
        >>> i = torch.tensor(0)
        >>> mod(torch.tensor([1.0, 100.0]), i, i, i, i)
        tensor([0.9242, 2.0000])
    """
    cap = check_softcap("softcap", softcap)
    assert cap is not None  # check_softcap returns None only for None

    def softcapped(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return cap * torch.tanh(score / cap)

    return softcapped


def _sizes(t_q: object, t_k: object, b: object, h: object) -> tuple[int, int, int, int]:
    q = check_nonnegative_int("t_q", t_q)
    k = q if t_k is None else check_nonnegative_int("t_k", t_k)
    nb = 1 if b is None else check_positive_int("b", b)
    nh = 1 if h is None else check_positive_int("h", h)
    return q, k, nb, nh


def to_dense(
    mod: MaskMod | ScoreMod,
    t_q: int,
    t_k: int | None = None,
    *,
    b: int | None = None,
    h: int | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Materialise a `mask_mod` or `score_mod` over every (query, key) pair.

    A `mask_mod` gives the dense allowed mask, to compare with the builders of
    [`attnlab.rules.masks`][attnlab.rules.masks] or to hand to SDPA; a `score_mod` gives what it
    makes of a score of 0, which for an additive change (ALiBi) is its bias. The mod is
    called once, on index tensors shaped to broadcast to `(b, h, t_q, t_k)`, so it must
    be written with tensor operations, as FlexAttention requires anyway.

    Args:
        mod: `mask_mod(b, h, q_idx, kv_idx)` or `score_mod(score, b, h, q_idx, kv_idx)`.
        t_q: Number of queries.
        t_k: Number of keys; defaults to `t_q`.
        b: Batch size, for mods that read the batch index; default 1.
        h: Number of heads, for mods that read the head index; default 1.
        device: Where to build it.

    Returns:
        A `(b, h, t_q, t_k)` bool tensor for a `mask_mod`, float for a `score_mod`.

    Raises:
        TypeError: If `mod` takes neither 4 nor 5 positional arguments, or a size is
            not an int.
        ValueError: If a size is negative (`b`, `h`: not positive).

    Examples:
        >>> to_dense(causal_mod(), 2, 3).shape
        torch.Size([1, 1, 2, 3])
    """
    kind = _mod_kind("mod", mod)
    q, k, nb, nh = _sizes(t_q, t_k, b, h)
    check_device("device", device)
    shape = (nb, nh, q, k)
    index = [
        torch.arange(n, device=device).view([-1 if d == i else 1 for d in range(4)])
        for i, n in enumerate(shape)
    ]  # b (nb, 1, 1, 1), h (1, nh, 1, 1), q_idx (1, 1, q, 1), kv_idx (1, 1, 1, k)
    if kind == "mask":
        return mod(*index).expand(shape)
    zeros = torch.zeros(shape, device=device)
    return mod(zeros, *index).expand(shape)


def block_mask(
    mask_mod: MaskMod,
    t_q: int,
    t_k: int | None = None,
    *,
    b: int | None = None,
    h: int | None = None,
    block_size: int | tuple[int, int] = 128,
    device: torch.device | str | None = None,
) -> BlockMask:
    """FlexAttention's block mask of `mask_mod`: `create_block_mask`, with checks.

    Tiles of `block_size` queries by `block_size` keys are classified once: empty
    (skipped by the kernel), full (computed without calling `mask_mod`) or partial.

    Args:
        mask_mod: `mask_mod(b, h, q_idx, kv_idx) -> bool tensor`.
        t_q: Number of queries.
        t_k: Number of keys; defaults to `t_q`.
        b: Batch size, for a mask that differs between batch entries; None: one mask
            broadcast over the batch.
        h: Number of heads, for a mask that differs between heads; None: broadcast.
        block_size: Rows and columns of a tile (one int for both); FlexAttention's
            default is 128.
        device: Where the mask lives (that of the queries).

    Returns:
        A `torch.nn.attention.flex_attention.BlockMask`.

    Raises:
        TypeError: If `mask_mod` does not take 4 positional arguments, or a size is
            not an int.
        ValueError: If a size is negative, or `b`, `h` or a block size is not positive.

    Examples:
        >>> block_map(block_mask(causal_mod(), 8, block_size=4))[0, 0]
        tensor([[2, 0],
                [1, 2]])
    """
    _check_mod("mask_mod", mask_mod, 4, _MASK_ARGS)
    q = check_nonnegative_int("t_q", t_q)
    k = q if t_k is None else check_nonnegative_int("t_k", t_k)
    nb = None if b is None else check_positive_int("b", b)
    nh = None if h is None else check_positive_int("h", h)
    block_q, block_k = check_block_size(block_size)
    check_device("device", device)
    return create_block_mask(
        mask_mod, nb, nh, q, k, device=device or "cpu", BLOCK_SIZE=(block_q, block_k)
    )


def _check_block_mask(mask: object) -> BlockMask:
    if not isinstance(mask, BlockMask):
        raise TypeError(f"block_mask must be a BlockMask, got {type(mask).__name__}")
    return mask


def block_map(block_mask: BlockMask) -> Tensor:
    """Which tiles the kernel computes: 0 skipped, 1 computed whole, 2 computed and masked.

    The convention of [`flash.tile_map`][attnlab.functional.flash.tile_map]: a 1 is a full tile,
    which the kernel computes without calling the `mask_mod`; a 2 is a partial tile,
    where the `mask_mod` hides some entries.

    Args:
        block_mask: A block mask (from [`block_mask`][attnlab.functional.flex.block_mask] or
            `create_block_mask`).

    Returns:
        An int64 tensor `(b, h, query tiles, key tiles)`.

    Raises:
        TypeError: If `block_mask` is not a `BlockMask`.

    Examples:
        >>> block_map(block_mask(sliding_window_mod(window=4), 12, block_size=4))[0, 0]
        tensor([[2, 0, 0],
                [2, 2, 0],
                [0, 2, 2]])
    """
    mask = _check_block_mask(block_mask)
    n_q, n_k = mask.kv_indices.shape[-2], mask.kv_indices.shape[-1]
    computed = mask.to_dense().long()[..., :n_q, :n_k]  # partial or full
    if mask.full_kv_num_blocks is None or mask.full_kv_indices is None:
        return computed * 2  # no full tiles kept apart: every tile calls the mask_mod
    columns = mask.full_kv_indices.long()  # (b, h, n_q, n_k): the first counts are valid
    valid = torch.arange(columns.shape[-1], device=columns.device)
    kept = (valid < mask.full_kv_num_blocks[..., None]).long()
    # Added, not written: an invalid entry may repeat a valid column, and adds 0 to it.
    full = torch.zeros_like(computed).scatter_add_(-1, columns[..., :n_q, :], kept)
    return computed * 2 - full.clamp(max=1)[..., :n_q, :n_k]  # full: 1, partial: 2


def block_fraction(block_mask: BlockMask) -> float:
    """The fraction of tiles the kernel computes (full or partial), from 0 to 1.

    Counted in tiles, the work of a kernel that skips the empty ones. PyTorch's
    `BlockMask.sparsity()` instead counts the tiles' area against the score matrix's,
    which differs when a length is not a multiple of the block size.

    Args:
        block_mask: A block mask.

    Returns:
        Computed tiles over all tiles of every batch entry and head.

    Raises:
        TypeError: If `block_mask` is not a `BlockMask`.

    Examples:
        >>> block_fraction(block_mask(causal_mod(), 1024))  # 36 of 64 tiles of 128
        0.5625
    """
    grid = block_map(block_mask)
    return float((grid > 0).sum()) / max(grid.numel(), 1)


def apply_sinks(out: Tensor, lse: Tensor, sink_logits: Tensor) -> Tensor:
    r"""Add learned attention sinks to FlexAttention's output, from its log-sum-exp.

    A sink logit $s_h$ joins the softmax's denominator and brings no value, so the output
    of row $i$ is FlexAttention's scaled by $\sigma(\ell_i - s_h)$: the rule of
    [`merge_sinks`][attnlab.functional.flash.merge_sinks], which flash_attention follows too.

    Args:
        out: FlexAttention's output `(b, H, L, Ev)`.
        lse: Its log-sum-exp (natural log) `(b, H, L)`: `return_aux=AuxRequest(lse=True)`.
        sink_logits: One logit per head `(H,)`.

    Returns:
        The output with the sinks, `(b, H, L, Ev)`, in `out`'s dtype.

    Examples:
        >>> out = torch.ones(1, 2, 1, 3)
        >>> apply_sinks(out, torch.zeros(1, 2, 1), torch.tensor([0.0, -100.0]))[..., 0]
        tensor([[[0.5000],
                 [1.0000]]])
    """
    return merge_sinks(out, lse.float(), sink_logits)[0]  # (b, H, L, Ev)


@functools.cache
def _compiled_flex() -> Callable[..., Any]:
    """`flex_attention` compiled once per process; static shapes (see the toolchain note:
    dynamic shapes emitted C++ that did not build for a third mask on torch 2.13 CPU)."""
    return torch.compile(flex_attention, dynamic=False)


class FlexKeywords(TypedDict, total=False):
    """The keywords of [`attention`][attnlab.functional.flex.attention] besides
    `return_lse` (for its typed overloads)."""

    block_mask: BlockMask | None
    score_mod: ScoreMod | None
    sink_logits: Tensor | None
    scale: float | None
    enable_gqa: bool
    compiled: bool


@overload
def attention(
    query: Tensor, key: Tensor, value: Tensor, *, return_lse: Literal[False] = False,
    **options: Unpack[FlexKeywords],
) -> Tensor: ...  # fmt: skip


@overload
def attention(
    query: Tensor, key: Tensor, value: Tensor, *, return_lse: Literal[True],
    **options: Unpack[FlexKeywords],
) -> tuple[Tensor, Tensor]: ...  # fmt: skip


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    block_mask: BlockMask | None = None,
    score_mod: ScoreMod | None = None,
    sink_logits: Tensor | None = None,
    scale: float | None = None,
    enable_gqa: bool = False,
    compiled: bool = False,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""FlexAttention with attnlab's checks, and learned sink logits added from the log-sum-exp.

    PyTorch's `flex_attention(query, key, value, score_mod, block_mask, scale,
    enable_gqa)`, then, with `sink_logits`, [`apply_sinks`][attnlab.functional.flex.apply_sinks].
    Eager by default (PyTorch warns that it materialises the scores); `compiled=True`
    runs it compiled by `torch.compile` (once per shape and mask: seconds on a CPU,
    inference only there; past dynamo's `recompile_limit` of 8, eagerly again).

    Args:
        query: Queries `(b, H, L, E)`.
        key: Keys `(b, Hkv, S, E)`.
        value: Values `(b, Hkv, S, Ev)`.
        block_mask: Which keys each query sees ([`block_mask`][attnlab.functional.flex.block_mask]);
            None: all.
        score_mod: A change of each scaled score, e.g.
            [`alibi_mod`][attnlab.functional.flex.alibi_mod] or
            [`softcap_mod`][attnlab.functional.flex.softcap_mod].
        sink_logits: Learned sink logits, one per query head `(H,)` (gpt-oss).
        scale: Factor of the scores; default $1/\sqrt{E}$.
        enable_gqa: Let `H` be a multiple of `Hkv` (grouped-query attention).
        compiled: Run the compiled kernel.
        return_lse: Also return the log-sum-exp `(b, H, L)` (natural log, the sinks in it),
            for [`weights_from_lse`][attnlab.functional.lse_weights.weights_from_lse].

    Returns:
        The context vectors `(b, H, L, Ev)`; with `return_lse`, the pair `(out, lse)`.

    Raises:
        TypeError: If an input is not a floating-point tensor, `block_mask` is not a
            `BlockMask`, `score_mod` does not take 5 positional arguments, or a flag is
            not a bool.
        ValueError: If the inputs are not 4-d or do not fit, or `sink_logits` not one per head.
        NotImplementedError: For `sink_logits` or `return_lse` with `compiled=True` on a
            CPU, whose compiled kernel does not return the log-sum-exp (PyTorch 2.13).

    Examples:
        >>> import warnings
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")  # eager flex: not the fused kernel
        ...     out = attention(q, k, v, block_mask=block_mask(causal_mod(), 6))
        >>> sdpa = torch.nn.functional.scaled_dot_product_attention
        >>> torch.allclose(out, sdpa(q, k, v, is_causal=True), atol=1e-6)
        True
    """
    q, k, v = check_qkv(query, key, value)
    assert v is not None  # check_qkv returns the value it was given
    for name, x in (("query", q), ("key", k), ("value", v)):
        if x.ndim != 4:
            raise ValueError(
                f"{name} must be (b, H, L, E) for FlexAttention, got {name}.shape={tuple(x.shape)}"
            )
    if block_mask is not None:
        _check_block_mask(block_mask)
    if score_mod is not None:
        _check_mod("score_mod", score_mod, 5, _SCORE_ARGS)
    check_sinks("sink_logits", sink_logits, q, q.shape[1])
    check_scale("scale", scale)
    check_bool("enable_gqa", enable_gqa)
    check_bool("compiled", compiled)
    needs_lse = check_bool("return_lse", return_lse) or sink_logits is not None
    if compiled and needs_lse and q.device.type == "cpu":
        raise NotImplementedError(
            f"{'return_lse' if sink_logits is None else 'sinks'} with compiled=True needs "
            "FlexAttention's log-sum-exp, which its compiled CPU kernel does not return; run "
            "it eagerly (compiled=False), or make a sink one more key of zero value whose "
            "score a score_mod sets to the sink's logit"
        )
    kernel: Callable[..., Any] = flex_attention
    kernel = _compiled_flex() if compiled else kernel
    args = {"score_mod": score_mod, "block_mask": block_mask, "scale": scale}
    if not needs_lse:
        out: Tensor = kernel(q, k, v, **args, enable_gqa=enable_gqa)
        return out
    out, aux = kernel(q, k, v, **args, enable_gqa=enable_gqa, return_aux=AuxRequest(lse=True))
    lse = aux.lse  # (b, H, L), natural log
    if sink_logits is not None:
        out, lse = merge_sinks(out, lse, sink_logits)
    return (out, lse) if return_lse else out
