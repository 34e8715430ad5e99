r"""Attention masks: builders, and conversions between the conventions you will meet.

Three conventions are in common use, and mixing them up is a classic silent bug:

| convention | dtype | a key is hidden where | used by |
|---|---|---|---|
| *allowed* | bool | False | PyTorch's `scaled_dot_product_attention`, all of attnlab |
| *blocked* | bool | True | `nn.MultiheadAttention` (`attn_mask`, `key_padding_mask`) |
| *additive* | float | $-\infty$ | added to the scores; accepted by all of the above |

Every builder here returns an *allowed* mask (True = this query may attend to this key),
the convention of PyTorch's `scaled_dot_product_attention`; the `*_to_*` functions convert.
Builders return `(t_q, t_k)` masks that broadcast over batch and heads, except the padding
masks, which are per sequence. [`combine`][attnlab.rules.masks.combine] merges masks of either
kind into one, and [`decode_mask`][attnlab.rules.masks.decode_mask] is the mask of new tokens
attending after a KV cache, or None when they need none. Every attention module of
attnlab builds its masks with these functions.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Literal, get_args, overload

import torch
from torch import Tensor

from attnlab.rules._validation import (
    check_bool,
    check_choice,
    check_device,
    check_float_dtype,
    check_int_sequence,
    check_nonnegative_int,
    check_positive_int,
    checking,
    entry,
    tracing,
    value_checks_enabled,
)

__all__ = [
    "Alignment",
    "additive_to_allowed",
    "alignment_offset",
    "allowed_to_additive",
    "allowed_to_blocked",
    "blocked_to_allowed",
    "causal",
    "check_causal_mask",
    "check_causal_window",
    "check_padding_mask",
    "check_padding_of",
    "check_window",
    "chunked",
    "combine",
    "decode_mask",
    "is_causal_window",
    "key_padding",
    "needs_mask",
    "padding",
    "padding_attention_mask",
    "sink_window",
    "sliding_window",
    "visible",
]

Alignment = Literal["top-left", "bottom-right"]
"""Where the diagonal of a causal mask sits when `t_q != t_k`."""


def alignment_offset(t_q: int, t_k: int, align: str) -> int:
    """The key position of query 0: 0 for `"top-left"`, `t_k - t_q` for `"bottom-right"`.

    The one meaning of the two alignments (PyTorch's `causal_upper_left` and
    `causal_lower_right`): query `i` sits at key position `i + offset`. Unchecked; the
    callers check `align` at their boundary.

    Examples:
        >>> alignment_offset(2, 5, "top-left"), alignment_offset(2, 5, "bottom-right")
        (0, 3)
    """
    return t_k - t_q if align == "bottom-right" else 0


@overload
def visible(i: Tensor, j: Tensor | int, window: int | None = None) -> Tensor: ...


@overload
def visible(i: int, j: Tensor, window: int | None = None) -> Tensor: ...


@overload
def visible(i: int, j: int, window: int | None = None) -> bool: ...


def visible(i: Tensor | int, j: Tensor | int, window: int | None = None) -> Tensor | bool:
    """Whether the query at position `i` sees the key at position `j`: the causal rule.

    The one statement of the causal/window relation: key `j` is seen if it is not in the
    query's future (`j <= i`) and, with a `window`, not `window` or more positions behind
    it (`j > i - window`). Positions are in one frame (a query's position among the
    keys: see [`alignment_offset`][attnlab.rules.masks.alignment_offset]). Works on ints
    and on index tensors that broadcast: FlexAttention's `mask_mod`s, the paged kernels'
    masks and FlashAttention's tile rule ask it, and `band_at` builds the same relation
    densely (tested equal). Unchecked.

    Examples:
        >>> visible(5, 3), visible(5, 3, window=2), visible(3, 5)
        (True, False, False)
    """
    seen = j <= i
    if window is not None:
        seen = seen & (j > i - window)
    return seen


def band(
    t_q: int, t_k: int, align: str, window: int | None, device: torch.device | str | None
) -> Tensor:
    """Allowed mask `(t_q, t_k)`: query i sees key j if i + offset - window < j <= i + offset.

    The causal/window relation itself, behind [`causal`][attnlab.rules.masks.causal] and
    [`sliding_window`][attnlab.rules.masks.sliding_window] (`window=None`: causal only). It
    takes no check: its callers are those builders and the kernels, which checked the sizes
    at their boundary.

    Query i sits at key position `i + offset`: `offset = 0` when the queries are the first
    `t_q` tokens (top-left), `t_k - t_q` when they are the last ones (bottom-right, as
    when decoding after a cache). Built at its own size, so one decoded query against a
    long cache costs a row, not a square over the whole sequence.
    """
    return band_at(t_q, t_k, alignment_offset(t_q, t_k, align), window, device)


def band_at(
    t_q: int, t_k: int, offset: int, window: int | None, device: torch.device | str | None
) -> Tensor:
    """[`band`][attnlab.rules.masks.band] with the queries at any `offset`.

    Query i sits at key position `i + offset`, whatever that is: FlashAttention's tiles
    and ring attention's blocks place a tile of queries `i0 - j0` positions after its
    tile of keys. Unchecked, like `band`.

    Examples:
        >>> band_at(2, 4, 1, 2, "cpu").long()  # queries at key positions 1 and 2
        tensor([[1, 1, 0, 0],
                [0, 1, 1, 0]])
    """
    # visible(i + offset, j, window) for every pair, as two triangles of a ones matrix:
    # one kernel each, faster than comparing index tensors (a decode step's row too).
    ones = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
    mask = ones.tril(offset)  # j <= i + offset
    if window is not None:
        mask &= ones.triu(offset - window + 1)  # j > i + offset - window
    return mask  # (t_q, t_k)


def _check_sizes(t_q: object, t_k: object, align: object, device: object) -> tuple[int, int]:
    q = check_nonnegative_int("t_q", t_q)
    k = q if t_k is None else check_nonnegative_int("t_k", t_k)
    check_choice("align", align, get_args(Alignment))
    check_device("device", device)
    return q, k


def causal(
    t_q: int,
    t_k: int | None = None,
    *,
    align: Alignment = "top-left",
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Causal mask: query $i$ may attend to key $j$ only if $j$ is not in its future.

    With `t_q == t_k` both alignments give the same lower-triangular mask. They differ
    when the lengths differ:

    - `"top-left"`: query $i$ sees keys $0 \dots i$, as `is_causal=True` does in
      PyTorch's `scaled_dot_product_attention` (and attnlab's
      [`scaled_dot_product_attention`][attnlab.functional.sdpa.scaled_dot_product_attention]).
    - `"bottom-right"`: the queries are the *last* `t_q` positions of the keys' sequence,
      so query $i$ sees keys $0 \dots i + t_k - t_q$. This is what decoding with a KV cache
      needs (`t_q` new tokens, `t_k` cached plus new), and what `flash_attn`'s `causal=True`
      does. With `t_q > t_k` its first `t_q - t_k` rows are fully masked.

    Args:
        t_q: Number of queries (rows).
        t_k: Number of keys (columns); defaults to `t_q`.
        align: `"top-left"` or `"bottom-right"`.
        device: Where to create the mask.

    Returns:
        An allowed-convention bool mask `(t_q, t_k)`.

    Raises:
        TypeError: If a length is not an int.
        ValueError: If a length is negative, `align` is unknown or `device` names no
            device.

    Examples:
        >>> causal(2, 4)
        tensor([[ True, False, False, False],
                [ True,  True, False, False]])
        >>> causal(2, 4, align="bottom-right")
        tensor([[ True,  True,  True, False],
                [ True,  True,  True,  True]])
    """
    t_q, t_k = _check_sizes(t_q, t_k, align, device)
    return band(t_q, t_k, align, None, device)


def sliding_window(
    t_q: int,
    t_k: int | None = None,
    *,
    window: int,
    align: Alignment = "top-left",
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Causal mask that also forgets the distant past: each query sees its last `window` keys.

    Query at position $i$ attends to keys at positions $j$ with $i - \text{window} < j \le i$,
    itself included (local attention as in Longformer, Mistral or Gemma). With
    `window >= max(t_q, t_k)` it equals [`causal`][attnlab.rules.masks.causal].

    Args:
        t_q: Number of queries.
        t_k: Number of keys; defaults to `t_q`.
        window: How many keys (the query's own position included) each query sees.
        align: `"top-left"` or `"bottom-right"`, as for `causal`.
        device: Where to create the mask.

    Returns:
        An allowed-convention bool mask `(t_q, t_k)`.

    Raises:
        TypeError: If a size is not an int.
        ValueError: If a length is negative, `window` is not positive, `align` is
            unknown or `device` names no device.

    Examples:
        >>> sliding_window(4, window=2)
        tensor([[ True, False, False, False],
                [ True,  True, False, False],
                [False,  True,  True, False],
                [False, False,  True,  True]])
    """
    t_q, t_k = _check_sizes(t_q, t_k, align, device)
    check_positive_int("window", window)
    return band(t_q, t_k, align, window, device)


def chunked(
    t_q: int,
    t_k: int | None = None,
    *,
    chunk_size: int,
    align: Alignment = "top-left",
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Causal mask within fixed chunks: a query sees the keys of its own chunk up to itself.

    Positions are cut into chunks of `chunk_size`, and the query at position $i$ attends
    to keys $j \le i$ with $\lfloor j / C \rfloor = \lfloor i / C \rfloor$ (Llama 4's
    "chunked attention" on its RoPE layers, `attention_chunk_size`). Unlike a sliding
    window it resets at each chunk's start: the first token of a chunk sees only itself,
    the last one the whole chunk. With `chunk_size >= t_k` it equals
    [`causal`][attnlab.rules.masks.causal]. It takes the arguments of
    [`sliding_window`][attnlab.rules.masks.sliding_window], with `chunk_size` (positions per
    chunk, a positive int) in place of `window`, raises as it does, and returns an
    allowed-convention bool mask `(t_q, t_k)`.

    Examples:
        >>> chunked(5, chunk_size=2).long()
        tensor([[1, 0, 0, 0, 0],
                [1, 1, 0, 0, 0],
                [0, 0, 1, 0, 0],
                [0, 0, 1, 1, 0],
                [0, 0, 0, 0, 1]])
    """
    t_q, t_k = _check_sizes(t_q, t_k, align, device)
    check_positive_int("chunk_size", chunk_size)
    i = torch.arange(t_q, device=device)[:, None] + alignment_offset(t_q, t_k, align)
    j = torch.arange(t_k, device=device)
    return visible(i, j) & (i // chunk_size == j // chunk_size)  # (t_q, t_k)


def sink_window(
    t_q: int,
    t_k: int | None = None,
    *,
    window: int,
    num_sink_tokens: int,
    align: Alignment = "top-left",
    device: torch.device | str | None = None,
) -> Tensor:
    r"""A sliding window that never forgets the first `num_sink_tokens` keys: attention sinks.

    Query at position $i$ attends to key $j \le i$ if $i - \text{window} < j$ (the
    window of [`sliding_window`][attnlab.rules.masks.sliding_window]) or $j < n$, the
    `num_sink_tokens`. This is the attention of StreamingLLM (Xiao et al., 2023,
    https://arxiv.org/abs/2309.17453), whose cache keeps the first few tokens, on which
    trained models park much of their attention, besides the most recent ones. As one
    mask over a whole sequence it gives each query the keys such a cache would hold
    when that query is decoded (positions stay the sequence's own). With
    `num_sink_tokens=0` it is `sliding_window`.

    Args:
        t_q: Number of queries.
        t_k: Number of keys; defaults to `t_q`.
        window: How many of the most recent keys (the query's own included) each query
            sees.
        num_sink_tokens: How many keys from the start every query sees as well (those not in its
            future).
        align: `"top-left"` or `"bottom-right"`, as for [`causal`][attnlab.rules.masks.causal].
        device: Where to create the mask.

    Returns:
        An allowed-convention bool mask `(t_q, t_k)`.

    Raises:
        TypeError: If a size is not an int.
        ValueError: If a length or `num_sink_tokens` is negative, `window` is not positive, `align`
            is unknown or `device` names no device.

    Examples:
        >>> sink_window(5, window=2, num_sink_tokens=1).int()
        tensor([[1, 0, 0, 0, 0],
                [1, 1, 0, 0, 0],
                [1, 1, 1, 0, 0],
                [1, 0, 1, 1, 0],
                [1, 0, 0, 1, 1]], dtype=torch.int32)
    """
    t_q, t_k = _check_sizes(t_q, t_k, align, device)
    check_positive_int("window", window)
    check_nonnegative_int("num_sink_tokens", num_sink_tokens)
    mask = band(t_q, t_k, align, window, device)  # (t_q, t_k): the window
    first = torch.arange(t_k, device=device) < num_sink_tokens  # (t_k,): the sink keys
    return mask | (band(t_q, t_k, align, None, device) & first)  # not the future


def check_causal_window(is_causal: object, window: int | None) -> bool:
    """Return `is_causal` if it is a bool that fits `window`: a sliding window is causal.

    The rule of the modules built with a `window`
    ([`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention],
    [`MultiHeadLatentAttention`][attnlab.layers.mla.MultiHeadLatentAttention]): their
    `forward` refuses `is_causal=False`, which would ask for the window to be dropped.
    Where `window` is an argument of the call instead
    ([`scaled_dot_product_attention`][attnlab.functional.sdpa.scaled_dot_product_attention],
    [`flash_attention`][attnlab.functional.flash.flash_attention],
    [`MultiHeadAttention`][attnlab.MultiHeadAttention]), passing it asks for the causal
    sliding window, and [`check_window`][attnlab.rules.masks.check_window] checks it.

    Raises:
        TypeError: If `is_causal` is not a bool.
        ValueError: If it is False while a `window` is set.

    Examples:
        >>> check_causal_window(True, 4)
        True
    """
    causal = check_bool("is_causal", is_causal)
    if not causal and window is not None:
        raise ValueError(
            f"is_causal=False with window={window}: a sliding window is a causal mask; pass "
            "is_causal=True, or build the module with window=None for attention to every key"
        )
    return causal


def check_causal_mask(attn_mask: object, is_causal: object) -> bool:
    """Return `is_causal` if it is a bool that comes without `attn_mask` when True.

    The rule of PyTorch's `scaled_dot_product_attention`, which the functional kernels
    and [`MultiHeadAttention`][attnlab.MultiHeadAttention] follow: the causal mask is
    built by the call, so an explicit mask next to it would be a second one. (GQA and MLA
    instead always apply their causal rule and take `attn_mask` as padding on top.)

    Raises:
        TypeError: If `is_causal` is not a bool.
        ValueError: If it is True and `attn_mask` is given too.
    """
    causal = check_bool("is_causal", is_causal)
    if causal and attn_mask is not None:
        raise ValueError(
            "pass either attn_mask or is_causal=True, not both; to combine them, build the "
            "causal mask (attnlab.rules.masks.causal) and AND it with yours"
        )
    return causal


def is_causal_window(is_causal: bool, window: int | None) -> bool:
    """Whether attention is causal: `is_causal`, or any `window` (a window is causal).

    Examples:
        >>> is_causal_window(False, 4), is_causal_window(False, None)
        (True, False)
    """
    return is_causal or window is not None


def check_window(window: object, attn_mask: object) -> int | None:
    """Return `window` if it is None or a positive int that comes without `attn_mask`.

    The one rule of the calls that take a `window`: it builds the causal sliding-window
    mask itself, so an explicit `attn_mask` next to it would be a second mask.

    Raises:
        TypeError: If `window` is neither None nor an int.
        ValueError: If it is not positive, or `attn_mask` is given too.

    Examples:
        >>> check_window(4, None)
        4
    """
    if window is None:
        return None
    checked = check_positive_int("window", window)
    if attn_mask is not None:
        raise ValueError("pass either attn_mask or window, not both")
    return checked


@entry
def decode_mask(
    t_q: int,
    t_k: int,
    *,
    window: int | None = None,
    device: torch.device | str | None = None,
) -> Tensor | None:
    r"""The mask of `t_q` new queries after a KV cache, or None when they need none.

    The queries are the last `t_q` of the `t_k` key positions (the cache, then the new
    tokens), so the causal diagonal is bottom-right aligned
    ([`causal`][attnlab.rules.masks.causal] with `align="bottom-right"`); with `window`, each
    query also forgets keys `window` or more positions behind it
    ([`sliding_window`][attnlab.rules.masks.sliding_window]). When no key is hidden from any
    query, as for one decoded token without a window (or with a window that covers all
    `t_k` keys), it returns None: attention then runs with no mask at all, the fastest
    path of every kernel, and no `(1, t_k)` mask is built at each step.

    Args:
        t_q: New tokens (queries).
        t_k: Keys: cached plus new tokens.
        window: Sliding-window size (keys per query, itself included), or None.
        device: Where to create the mask.

    Returns:
        An allowed-convention bool mask `(t_q, t_k)`, or None.

    Raises:
        TypeError: If a size is not an int.
        ValueError: If a length is negative, `window` is not positive or `device` names
            no device.

    Examples:
        >>> decode_mask(1, 5) is None  # one new token sees the whole cache
        True
        >>> decode_mask(2, 4)
        tensor([[ True,  True,  True, False],
                [ True,  True,  True,  True]])
        >>> decode_mask(1, 4, window=2)
        tensor([[False, False,  True,  True]])
    """
    if checking():
        t_q, t_k = _check_decode(t_q, t_k, window, device)
    if not needs_mask(t_q, t_k, window=window):
        return None
    return band(t_q, t_k, "bottom-right", window, device)  # (t_q, t_k)


@entry
def needs_mask(t_q: int, t_k: int, *, window: int | None = None) -> bool:
    """Whether causal attention of `t_q` new tokens over `t_k` keys hides any key.

    The rule behind [`decode_mask`][attnlab.rules.masks.decode_mask]'s None: the queries are
    the last `t_q` of the `t_k` positions (bottom-right), and a key is hidden when it is
    in a query's future or `window` or more positions behind it. False means every query
    sees every key, so attention may run with no mask, and a module may take a path that
    needs none (MLA's absorbed decode step folds its heads into the query length).

    Args:
        t_q: New tokens (queries).
        t_k: Keys: cached plus new tokens.
        window: Sliding-window size (keys per query, itself included), or None.

    Returns:
        True when some query must not see some key.

    Raises:
        TypeError: If a size is not an int.
        ValueError: If a length is negative or `window` is not positive.

    Examples:
        >>> needs_mask(1, 6), needs_mask(1, 6, window=64), needs_mask(1, 6, window=4)
        (False, False, True)
        >>> needs_mask(2, 6)
        True
    """
    if checking():
        t_q, t_k = _check_decode(t_q, t_k, window, None)
    return not (t_q <= 1 and (window is None or window >= t_k))


def _check_decode(t_q: object, t_k: object, window: object, device: object) -> tuple[int, int]:
    sizes = _check_sizes(t_q, t_k, "bottom-right", device)
    check_window(window, None)
    return sizes


@entry
def check_padding_mask(
    mask: object, batch: int, length: int, *, like: Tensor, what: str = "(b, t)"
) -> Tensor:
    """Check a padding mask, Hugging Face's `attention_mask`; return it as bool.

    It must be a bool or integer tensor of shape `(batch, length)` (`what` names that
    shape in the message), on the device of `like`, 1 (True) at real tokens and 0 at
    padding, padding on the left, with a token at the end of every row. Reading the
    values is a host sync, skipped while compiling or exporting.

    Raises:
        TypeError: If `mask` is not a bool or integer tensor.
        ValueError: If its shape or device is wrong, it holds values other than 0 and 1,
            pads on the right (or in the middle) or has a row without tokens.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(
            f"padding_mask must be a tensor, 1 (or True) at real tokens and 0 at padding, "
            f"got {type(mask).__name__}"
        )
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise TypeError(
            f"padding_mask must be a bool or integer tensor (1 = token, 0 = padding), got "
            f"dtype {mask.dtype}"
        )
    if tuple(mask.shape) != (batch, length):
        raise ValueError(
            f"padding_mask must have shape {what} = {(batch, length)}, got {tuple(mask.shape)}"
        )
    if mask.device != like.device:
        raise ValueError(f"padding_mask is on {mask.device} but the module on {like.device}")
    if value_checks_enabled():  # reads the mask: a host sync, skipped while tracing
        m = mask.long()
        if not bool(((m == 0) | (m == 1)).all()):
            raise ValueError("padding_mask must hold only 0 and 1 (or False and True)")
        if not bool((m[:, 1:] >= m[:, :-1]).all()):
            raise ValueError(
                "padding_mask must pad on the left (zeros before the tokens of each row): "
                "pass tokenizer(..., padding_side='left') output"
            )
        if length and not bool(m[:, -1].all()):
            raise ValueError("padding_mask has a row without tokens")
    return mask.bool()


def check_padding_of(mask: object, x: Tensor, length: int, *, what: str = "(b, t)") -> Tensor:
    """[`check_padding_mask`][attnlab.rules.masks.check_padding_mask] for a layer's tokens.

    The rule of every layer that takes a `padding_mask` next to its tokens `x` (checked
    already): a padding mask has a batch axis, so `x` must have one too; the mask is then
    `(b, length)` on the device of `x`.

    Raises:
        TypeError: As `check_padding_mask`.
        ValueError: If `x` is unbatched `(t, d_model)`, or as `check_padding_mask`.
    """
    if x.ndim == 2:
        raise ValueError("padding_mask needs batched x (b, t, d_model)")
    return check_padding_mask(mask, x.shape[0], length, like=x, what=what)


def padding_attention_mask(padding_mask: Tensor, t: int) -> Tensor:
    """The keys that each of the last `t` tokens may see under a padding mask, `(b, t, T)`.

    `padding_mask` `(b, T)` is Hugging Face's `attention_mask`: 1 (True) at real tokens,
    0 at left padding, the `t` queries being the last `t` of the `T` tokens (those after a
    cache). A key at padding is hidden from every query, except that a padded query still
    sees itself: no row is all hidden, since softmax over nothing is NaN, which would
    reach the values. Combine it with the causal mask; it is not causal itself.

    Args:
        padding_mask: `(b, T)`, bool or integer, padding on the left.
        t: Queries, `t <= T`.

    Returns:
        An allowed-convention bool mask `(b, t, T)`.

    Raises:
        TypeError: If `padding_mask` is not a bool or integer tensor or `t` not an int.
        ValueError: If `padding_mask` is not `(b, T)` with `T >= t`, holds values other
            than 0 and 1, pads on the right or has a row without tokens.

    Examples:
        >>> padding_attention_mask(torch.tensor([[0, 1, 1]]), 2)
        tensor([[[False,  True,  True],
                 [False,  True,  True]]])
        >>> padding_attention_mask(torch.tensor([[0, 0, 1]]), 3)[0, 0]  # itself only
        tensor([ True, False,  True])
    """
    if checking():
        t = check_nonnegative_int("t", t)
        if not isinstance(padding_mask, Tensor):
            raise TypeError(
                f"padding_mask must be a bool or integer tensor (b, T), "
                f"got {type(padding_mask).__name__}"
            )
        if padding_mask.ndim != 2 or padding_mask.shape[1] < t:
            raise ValueError(
                f"padding_mask must have shape (b, T) with T >= t={t}, "
                f"got {tuple(padding_mask.shape)}"
            )
        b, total = padding_mask.shape
        check_padding_mask(padding_mask, b, total, like=padding_mask, what="(b, T)")
    pad = padding_mask.bool()
    b, total = pad.shape
    allowed = pad[:, None, :].expand(b, t, total).clone()  # (b, t, T)
    new = torch.arange(t, device=pad.device)
    allowed[:, new, total - t + new] = True  # each query sees itself: no empty row
    return allowed


@entry
def combine(*masks: Tensor | None) -> Tensor | None:
    r"""One mask that hides every key that any of `masks` hides; None entries are skipped.

    Bool masks (allowed convention) combine by logical AND; additive float masks by
    their sum. When both kinds are given, each bool mask first becomes additive
    ([`allowed_to_additive`][attnlab.rules.masks.allowed_to_additive], in the promoted dtype of
    the float masks), so a bias such as ALiBi survives. The result broadcasts the
    masks' shapes, as attention would; a single mask is returned as it is.

    Args:
        *masks: Masks to combine: bool (True = attend), float (added to the scores) or
            None (no mask).

    Returns:
        The combined mask, or None if every entry is None.

    Raises:
        TypeError: If an entry is neither None nor a bool or floating-point tensor.
        ValueError: If the shapes do not broadcast together.

    Examples:
        >>> combine(None, causal(3), padding([2], max_len=3)[0])
        tensor([[ True, False, False],
                [ True,  True, False],
                [ True,  True, False]])
        >>> combine(causal(2), torch.tensor([[0.0, 0.5], [1.0, 2.0]]))
        tensor([[0.0000,   -inf],
                [1.0000, 2.0000]])
        >>> combine(None, None) is None
        True
    """
    given = [m for m in masks if m is not None]
    if checking():
        for i, m in enumerate(masks):
            if m is not None and (
                not isinstance(m, Tensor) or not (m.dtype == torch.bool or m.is_floating_point())
            ):
                got = f"a {m.dtype} tensor" if isinstance(m, Tensor) else type(m).__name__
                raise TypeError(
                    f"masks[{i}] must be None or a bool or floating-point tensor, got {got}"
                )
        try:
            torch.broadcast_shapes(*(m.shape for m in given))  # type: ignore[no-untyped-call]
        except RuntimeError:
            shapes = ", ".join(str(tuple(m.shape)) for m in given)
            raise ValueError(f"masks must broadcast together, got shapes {shapes}") from None
    if len(given) <= 1:
        return given[0] if given else None
    floats = [m.dtype for m in given if m.dtype != torch.bool]
    if not floats:
        return functools.reduce(torch.logical_and, given)
    dtype = functools.reduce(torch.promote_types, floats)
    additive = [allowed_to_additive(m, dtype) if m.dtype == torch.bool else m for m in given]
    return functools.reduce(torch.add, additive)


def _lengths_tensor(lengths: Tensor | Sequence[int], device: torch.device | str | None) -> Tensor:
    check_device("device", device)
    n = check_int_sequence("lengths", lengths)  # lengths >= 0 (unread while tracing)
    if isinstance(n, Tensor):
        return n.to(device) if device is not None else n
    return torch.tensor(n, dtype=torch.long, device=device)


def padding(
    lengths: Tensor | Sequence[int],
    max_len: int | None = None,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Padding mask of a right-padded batch: True at real tokens, False at padding.

    Sequence $b$ has `lengths[b]` real tokens followed by padding up to `max_len`. This
    `(b, s)` mask is in the allowed convention; `nn.MultiheadAttention`'s
    `key_padding_mask` wants the opposite, `allowed_to_blocked(padding(...))`. To use it
    with SDPA or [`MultiHeadAttention`][attnlab.MultiHeadAttention], it must hide *keys*,
    which is [`key_padding`][attnlab.rules.masks.key_padding].

    Checking a tensor of lengths reads its values, a host sync on an accelerator; the
    checks are skipped while compiling or exporting (`_validation.tracing()`).
    Without `max_len` the longest length must be read to size the mask: pass `max_len`
    where that matters.

    Args:
        lengths: Real length of each sequence, `(b,)` ints.
        max_len: Padded length `s`; defaults to `max(lengths)`.
        device: Where to create the mask (default: that of `lengths`, or the CPU).

    Returns:
        A bool tensor `(b, s)`.

    Raises:
        TypeError: If `lengths` is not a sequence of ints or a 1-d integer tensor.
        ValueError: If a length is negative or longer than `max_len`.

    Examples:
        >>> padding([3, 1], max_len=4)
        tensor([[ True,  True,  True, False],
                [ True, False, False, False]])
    """
    n = _lengths_tensor(lengths, device)
    checked = n.numel() > 0 and not tracing()  # the check reads values
    if max_len is None:
        s = int(n.max()) if n.numel() else 0  # the mask's size: read even while compiling
    else:
        s = check_nonnegative_int("max_len", max_len)
        if checked and int(n.max()) > s:
            raise ValueError(f"lengths must be at most max_len={s}, got {n.tolist()}")
    positions = torch.arange(s, device=n.device)  # (s,)
    return positions < n[:, None]  # (b, s)


def key_padding(
    lengths: Tensor | Sequence[int],
    max_len: int | None = None,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Padding mask shaped to hide padded *keys* in attention: `(b, 1, 1, s)`.

    The singleton axes stand for heads and queries, so the mask broadcasts against the
    weights `(b, num_heads, t, s)`. Passing the `(b, s)` mask of
    [`padding`][attnlab.rules.masks.padding] instead would line its batch axis up with the
    *queries* (broadcasting aligns trailing axes): an error at best, a silently wrong
    result when `b == t`.

    Combine it with a causal mask by `&`: `key_padding(lengths) & causal(t)` has shape
    `(b, 1, t, t)`.

    Args:
        lengths: Real length of each sequence, `(b,)` ints.
        max_len: Padded length `s`; defaults to `max(lengths)`.
        device: Where to create the mask.

    Returns:
        An allowed-convention bool tensor `(b, 1, 1, s)`.

    Raises:
        TypeError: As `padding`.
        ValueError: As `padding`.

    Examples:
        >>> key_padding([3, 1], max_len=4).shape
        torch.Size([2, 1, 1, 4])
    """
    return padding(lengths, max_len, device=device)[:, None, None, :]  # (b, 1, 1, s)


def _check_bool_mask(name: str, mask: object) -> Tensor:
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = f"a {mask.dtype} tensor" if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"{name} must be a bool tensor, got {got}")
    return mask


def allowed_to_blocked(mask: Tensor) -> Tensor:
    """Convert an allowed mask (True = attend, SDPA) to a blocked one (True = hide).

    Use it to hand an attnlab or SDPA mask to `nn.MultiheadAttention` (`attn_mask` or
    `key_padding_mask`).

    Args:
        mask: Bool mask, True where a query may attend to a key.

    Returns:
        The logical negation: True where the key is hidden.

    Raises:
        TypeError: If `mask` is not a bool tensor (a float mask is additive; see
            `additive_to_allowed`).

    Examples:
        >>> allowed_to_blocked(causal(2))
        tensor([[False,  True],
                [False, False]])
    """
    return ~_check_bool_mask("mask", mask)


def blocked_to_allowed(mask: Tensor) -> Tensor:
    """Convert a blocked mask (True = hide, `nn.MultiheadAttention`) to an allowed one.

    Args:
        mask: Bool mask, True where a key is hidden from a query.

    Returns:
        The logical negation: True where the query may attend to the key.

    Raises:
        TypeError: If `mask` is not a bool tensor.

    Examples:
        >>> blocked_to_allowed(torch.tensor([False, True]))
        tensor([ True, False])
    """
    return ~_check_bool_mask("mask", mask)


@entry
def allowed_to_additive(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    r"""Convert an allowed mask to an additive one: 0 where True, $-\infty$ where False.

    Added to the scores before the softmax it has the same effect as the bool mask in
    every PyTorch attention function (a hidden key gets weight exactly 0).

    Args:
        mask: Bool mask, True where a query may attend to a key.
        dtype: Floating-point dtype of the result; use the dtype of your queries.

    Returns:
        A float tensor of `mask`'s shape.

    Raises:
        TypeError: If `mask` is not a bool tensor or `dtype` is not floating-point.

    Examples:
        >>> allowed_to_additive(causal(2))
        tensor([[0., -inf],
                [0., 0.]])
    """
    if checking():
        _check_bool_mask("mask", mask)
        check_float_dtype("dtype", dtype)
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(~mask, float("-inf"))


def additive_to_allowed(mask: Tensor) -> Tensor:
    r"""Convert an additive mask of 0 and $-\infty$ back to an allowed bool mask.

    Values at or below the dtype's lowest finite number (some libraries use
    `torch.finfo(dtype).min` instead of $-\infty$) also count as hidden. Checking that
    there are no other values reads the mask (a host sync), so it is skipped while
    compiling or exporting.

    Args:
        mask: Float mask whose entries are 0 (attend) or $-\infty$ (hide).

    Returns:
        A bool tensor of `mask`'s shape, True where the query may attend.

    Raises:
        TypeError: If `mask` is not a floating-point tensor.
        ValueError: If `mask` holds other values: such a mask is a bias (e.g. ALiBi),
            not only a mask, and a bool mask cannot represent it.

    Examples:
        >>> additive_to_allowed(torch.tensor([[0.0, float("-inf")]]))
        tensor([[ True, False]])
    """
    if not isinstance(mask, Tensor) or not mask.is_floating_point():
        got = f"a {mask.dtype} tensor" if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a floating-point (additive) tensor, got {got}")
    hidden = mask <= torch.finfo(mask.dtype).min
    if not tracing() and not bool(((mask == 0) | hidden).all()):
        others = sorted(set(mask[(mask != 0) & ~hidden].tolist()))[:5]
        raise ValueError(
            f"mask must hold only 0 and -inf to convert to bool, got other values such as "
            f"{others}; it adds a bias, which a bool mask cannot express"
        )
    return ~hidden
