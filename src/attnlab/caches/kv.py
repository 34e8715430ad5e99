r"""Key/value caches for incremental decoding, and what they cost in memory.

A decoder generates one token at a time, and each new token attends to every earlier one.
The keys and values of the earlier tokens do not change (causal attention never lets a
token see a later one), so recomputing them at every step is wasted work: a *KV cache*
keeps them, and each step projects only the new tokens, appends their keys and values,
and attends from the new queries to everything cached.

Three caches share one interface, [`KVCache`][attnlab.caches.kv.KVCache], the
[`AttentionCache`][attnlab.caches.kv.AttentionCache] that stores its keys and values in
one tensor each (every per-layer state speaks the
[`LayerCache`][attnlab.caches.base.LayerCache] protocol):

- [`DynamicKVCache`][attnlab.caches.kv.DynamicKVCache] grows with `torch.cat` at every
  step: nothing to size in advance, but each step copies the whole cache.
- [`StaticKVCache`][attnlab.caches.kv.StaticKVCache] allocates `max_length` positions
  once and writes each step in place: fixed memory and fixed addresses (what
  `torch.compile` and CUDA graphs want), at the price of reserving the maximum up front.
- [`RollingKVCache`][attnlab.caches.kv.RollingKVCache] serves a sliding-window layer: it
  keeps only the last `window - 1` tokens (all a query can still see next to itself),
  so its memory stops growing once the window is full, however long the context.

Layers may also share one cache (Gemma 4's KV sharing): a
[`SharedKVCache`][attnlab.caches.shared.SharedKVCache] wraps the cache of the layer that
computes the keys and values and lends them, step by step, to the later layers that read
them through its [`reader`][attnlab.caches.shared.SharedKVCache.reader]s, which hold nothing.

The memory per token is pure arithmetic,
[`kv_cache_bytes_per_token`][attnlab.caches.kv.kv_cache_bytes_per_token]: 2 tensors (keys
and values) x layers x key/value heads x head size x bytes per element. Grouped-query
attention (Ainslie et al., 2023, https://arxiv.org/abs/2305.13245) shrinks it by sharing
each key/value head among several query heads. For a stack that mixes sliding-window and
global layers (Mistral 7B v0.1, Gemma 2/3, gpt-oss),
[`kv_cache_bytes`][attnlab.caches.kv.kv_cache_bytes] sums what each layer holds at a given
context.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from attnlab.caches.base import LayerCache
from attnlab.rules._validation import (
    check_device,
    check_float_dtype,
    check_positive_int,
    check_rank,
    check_same_dtype_device,
    check_tensor,
    is_validation_enabled,
)

Kernel = Callable[[Tensor, Tensor, Tensor], Tensor]
"""A layer's attention `(query, keys, values) -> heads`, as an attention cache runs it."""

__all__ = [
    "AttentionCache",
    "CacheLayout",
    "DynamicKVCache",
    "KVCache",
    "RollingKVCache",
    "StaticKVCache",
    "kv_buffers",
    "kv_cache_bytes",
    "kv_cache_bytes_per_token",
    "resolve_v_head_dim",
]


class CacheLayout(NamedTuple):
    """What every token a cache holds looks like; an update must match it.

    Attributes:
        batch_size: Sequences cached together.
        num_kv_heads: Key/value heads.
        head_dim: Features per key.
        v_head_dim: Features per value.
        dtype: Element type of keys and values.
        device: Where they live.
    """

    batch_size: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    dtype: torch.dtype
    device: torch.device


_MISMATCH = {
    "batch_size": "key has batch size {got} but the cache holds {want} sequences "
    "(key.shape={shape}); call reset() or use one cache per batch size",
    "num_kv_heads": "key has num_kv_heads={got} but the cache holds num_kv_heads={want} "
    "(key.shape={shape})",
    "head_dim": "key has head_dim={got} but the cache holds head_dim={want} (key.shape={shape})",
    "v_head_dim": "value has v_head_dim={got} but the cache holds v_head_dim={want} "
    "(value.shape={shape})",
    "dtype": "key has dtype {got} but the cache holds {want}; convert the inputs or build the "
    "cache with their dtype",
    "device": "key is on {got} but the cache is on {want}; move the inputs or build the cache "
    "on their device",
}
"""What [`check_update`][attnlab.caches.kv.KVCache.check_update] says when a field of the new
tokens' [`CacheLayout`][attnlab.caches.kv.CacheLayout] differs from the cache's."""


def resolve_v_head_dim(head_dim: int, v_head_dim: int | None) -> int:
    """The value size of a cache: `v_head_dim`, or `head_dim` when it is None.

    The one rule of every cache that takes both sizes (the paged cache too).

    Raises:
        ValueError: If `v_head_dim` is not a positive int.

    Examples:
        >>> resolve_v_head_dim(64, None), resolve_v_head_dim(64, 32)
        (64, 32)
    """
    return head_dim if v_head_dim is None else check_positive_int("v_head_dim", v_head_dim)


def kv_buffers(
    shape: tuple[int, ...],
    head_dim: int,
    v_head_dim: int | None,
    dtype: torch.dtype,
    device: torch.device | str | None,
) -> tuple[Tensor, Tensor]:
    """The zeroed key and value buffers of a cache that allocates up front.

    The one rule of the static cache and the paged pools: `head_dim` and `v_head_dim`
    (None: `head_dim`) are checked, and `dtype` (floating point) and `device`; the
    sizes in `shape` are the caller's, checked by it.

    Returns:
        `(keys, values)` of shapes `shape + (head_dim,)` and `shape + (v_head_dim,)`.

    Raises:
        TypeError: If a size is not an int, `dtype` is not a floating-point
            `torch.dtype` or `device` is of the wrong type.
        ValueError: If a size is not positive or `device` names no device.

    Examples:
        >>> keys, values = kv_buffers((2, 3), 8, 4, torch.float16, "cpu")
        >>> tuple(keys.shape), tuple(values.shape), values.dtype
        ((2, 3, 8), (2, 3, 4), torch.float16)
    """
    check_positive_int("head_dim", head_dim)
    v_head_dim = resolve_v_head_dim(head_dim, v_head_dim)
    check_float_dtype("dtype", dtype)
    check_device("device", device)
    keys = torch.zeros(*shape, head_dim, dtype=dtype, device=device)  # (*shape, head_dim)
    return keys, torch.zeros(*shape, v_head_dim, dtype=dtype, device=device)


def kv_cache_bytes_per_token(
    *,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    v_head_dim: int | None = None,
) -> int:
    r"""Bytes that a KV cache holds per token of context, over all layers.

    $$
    \text{bytes per token} = \text{num\_layers} \cdot \text{num\_kv\_heads} \cdot
    (\text{head\_dim} + \text{v\_head\_dim}) \cdot \text{bytes per element}
    $$

    Every layer caches one key of `head_dim` and one value of `v_head_dim` features per
    key/value head. The number of *query* heads does not appear: that is the whole point
    of grouped- and multi-query attention.

    Args:
        num_layers: Attention layers, each with its own cache.
        num_kv_heads: Key/value heads per layer (= query heads for multi-head attention,
            1 for multi-query attention).
        head_dim: Features per key.
        dtype: Element type of the cache, e.g. `torch.bfloat16` (2 bytes).
        v_head_dim: Features per value; defaults to `head_dim`.

    Returns:
        The number of bytes per cached token.

    Raises:
        TypeError: If a size is not an int or `dtype` is not a `torch.dtype`.
        ValueError: If a size is not positive.

    Examples:
        >>> kv_cache_bytes_per_token(num_layers=2, num_kv_heads=4, head_dim=8,
        ...                          dtype=torch.float32)  # 2 * 4 * (8 + 8) * 4
        512
    """
    check_positive_int("num_layers", num_layers)
    check_positive_int("num_kv_heads", num_kv_heads)
    check_positive_int("head_dim", head_dim)
    v_head_dim = resolve_v_head_dim(head_dim, v_head_dim)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r} ({type(dtype).__name__})")
    return num_layers * num_kv_heads * (head_dim + v_head_dim) * dtype.itemsize


def kv_cache_bytes(
    windows: Sequence[int | None],
    context: int,
    *,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    v_head_dim: int | None = None,
) -> int:
    r"""Bytes the caches of a stack of layers hold at `context` tokens, window by window.

    A global layer (window None) keeps every token; a sliding-window layer keeps at most
    its `window` (the last `window - 1` between steps plus the token being decoded, as
    [`RollingKVCache`][attnlab.caches.kv.RollingKVCache] does):

    $$
    \text{bytes} = \sum_{\ell} \min(\text{context}, w_\ell) \cdot
    \text{num\_kv\_heads} \cdot (\text{head\_dim} + \text{v\_head\_dim}) \cdot
    \text{bytes per element}, \qquad w_\ell = \infty \text{ for a global layer.}
    $$

    Divided by `context`, it is the average bytes per token of context; with every
    window None it is `context` times
    [`kv_cache_bytes_per_token`][attnlab.caches.kv.kv_cache_bytes_per_token].

    Args:
        windows: One entry per layer: its sliding-window size, or None for a global
            (full causal) layer, e.g. `DecoderConfig.windows`.
        context: Tokens of context (prompt and generated).
        num_kv_heads: Key/value heads per layer.
        head_dim: Features per key.
        dtype: Element type of the cache.
        v_head_dim: Features per value; defaults to `head_dim`.

    Returns:
        The bytes held by all layers' caches together.

    Raises:
        TypeError: If `windows` is not a sequence of ints and Nones, a size not an int or
            `dtype` not a `torch.dtype`.
        ValueError: If `windows` is empty, or a window or size is not positive.

    Examples:
        >>> local, full = 4, None  # a 4-token window, and a global layer
        >>> kv_cache_bytes([local, full], 10, num_kv_heads=1, head_dim=2,
        ...                dtype=torch.float32)  # (4 + 10) tokens * (2 + 2) * 4 bytes
        224
    """
    if isinstance(windows, str | bytes) or not isinstance(windows, Sequence):
        raise TypeError(
            f"windows must be a sequence with one window (or None) per layer, got "
            f"{type(windows).__name__}"
        )
    if not windows:
        raise ValueError("windows must have one entry per layer, got an empty sequence")
    for i, w in enumerate(windows):
        if w is not None:
            check_positive_int(f"windows[{i}]", w)
    check_positive_int("context", context)
    per_token = kv_cache_bytes_per_token(
        num_layers=1,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        v_head_dim=v_head_dim,
    )
    held = sum(context if w is None else min(w, context) for w in windows)
    return held * per_token


class AttentionCache(LayerCache):
    """The cache of an attention layer: it takes the new tokens' keys and values and
    attends from their queries.

    [`attend`][attnlab.caches.kv.AttentionCache.attend] is the one call an attention
    layer makes to its cache. A [`KVCache`][attnlab.caches.kv.KVCache] stores the keys
    and values, keeps the ones the new queries can see (the cache owns its window) and
    runs the layer's own kernel over them. A cache that keeps them elsewhere, such as one
    layer's view of a paged cache shared by sequences of different lengths, reads them
    where they are instead (causality, and which tokens each query sees, are then the
    cache's rule): one hook, so a new cache layout needs no new flag in the layer.
    """

    @abc.abstractmethod
    def attend(
        self, query: Tensor, key: Tensor, value: Tensor, kernel: Kernel, *, window: int | None
    ) -> Tensor:
        """Store the new tokens' keys and values, then attend from their queries.

        Args:
            query: `(b, num_heads, t, head_dim)`, rotated.
            key: `(b, num_kv_heads, t, head_dim)`, rotated.
            value: `(b, num_kv_heads, t, v_head_dim)`.
            kernel: The layer's attention `(query, keys, values) -> heads`, causal and
                bottom-right aligned (the new queries are the last `t` of the keys).
            window: The layer's sliding window (keys per query, itself included), or
                None.

        Returns:
            `(b, num_heads, t, v_head_dim)`: each query's mix of the values it may see.
        """

    def check_window(self, window: int | None, *, name: str = "cache", owner: str) -> None:
        """Raise if a layer with this `window` (None: global) would miss keys it attends to.

        A cache that keeps every token serves any layer (this default); a rolling cache
        only a layer whose window fits in it.

        Args:
            window: The layer's window, or None for a global layer.
            name: The cache's name in the message.
            owner: The layer, in the message.

        Raises:
            ValueError: If the cache forgets tokens the layer's queries still see.
        """


class KVCache(AttentionCache):
    r"""A cache that holds the keys and values of the tokens a layer can still attend to.

    A cache is handed keys and values of shape `(b, num_kv_heads, t_new, head_dim)` (and
    `v_head_dim` for values) by [`update`][attnlab.caches.kv.KVCache.update], and returns
    all it holds, the new tokens last. The first update fixes what a dynamic cache holds
    (its [`layout`][attnlab.caches.kv.KVCache.layout]: batch size, heads, feature sizes,
    dtype, device); later ones must match it, and a mismatch raises instead of
    broadcasting or casting silently. The checks of an append live here, in
    [`check_update`][attnlab.caches.kv.KVCache.check_update], and run once per update:
    attention layers hand their keys and values to the cache
    ([`attend`][attnlab.caches.kv.KVCache.attend], or `update` for a layer that attends
    in its own way, such as MLA) and do not check the append themselves.

    Each cache keeps its keys and values in two tensors, `(b, num_kv_heads, slots,
    head_dim)` and `(..., v_head_dim)` (None before a dynamic or rolling cache's first
    update), and stores new tokens in its own way (`_append`).
    """

    _keys: Tensor | None
    _values: Tensor | None

    @property
    @abc.abstractmethod
    def length(self) -> int:
        """Tokens the cache holds (per sequence of the batch), also `len(cache)`."""

    @property
    def seen(self) -> int:
        """Tokens seen so far, held or forgotten: the position of the next token.

        A cache that forgets nothing has seen what it holds, its
        [`length`][attnlab.caches.kv.KVCache.length].
        """
        return self.length

    @property
    def layout(self) -> CacheLayout | None:
        """The [`CacheLayout`][attnlab.caches.kv.CacheLayout] an update must match: that of
        the tensors held, or None while anything goes (an empty dynamic cache)."""
        keys, values = self._keys, self._values
        if keys is None or values is None:
            return None
        b, h, _, hd = keys.shape
        return CacheLayout(b, h, hd, values.shape[-1], keys.dtype, keys.device)

    @property
    def nbytes(self) -> int:
        """Bytes of the key and value tensors held (0 before there are any)."""
        keys, values = self._keys, self._values
        return 0 if keys is None or values is None else keys.nbytes + values.nbytes

    @property
    def held(self) -> tuple[Tensor, Tensor] | None:
        """The keys and values held, oldest first, `(b, num_kv_heads, length, head_dim)`
        and `(..., v_head_dim)` (views of the cache's tensors), or None before the first
        update.

        Examples:
            >>> cache = RollingKVCache(window=3)
            >>> _ = cache.update(torch.arange(5.0).view(1, 1, 5, 1), torch.zeros(1, 1, 5, 1))
            >>> cache.held[0].flatten().tolist()  # the last window - 1 tokens' keys
            [3.0, 4.0]
        """
        keys, values = self._keys, self._values
        if keys is None or values is None:
            return None
        return keys[:, :, : self.length], values[:, :, : self.length]

    @property
    def batch_size(self) -> int | None:
        """Sequences it holds (from its layout), or None while that is open."""
        held = self.layout
        return None if held is None else held.batch_size

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append the keys and values of new tokens; return everything cached.

        While validation is on, [`check_update`][attnlab.caches.kv.KVCache.check_update]
        checks them first, once; then the cache stores them in its own way.

        Args:
            key: Keys of the new tokens, `(b, num_kv_heads, t_new, head_dim)`.
            value: Values of the new tokens, `(b, num_kv_heads, t_new, v_head_dim)`.

        Returns:
            `(keys, values)`, of shapes `(b, num_kv_heads, n, head_dim)` and
            `(b, num_kv_heads, n, v_head_dim)`, where `n` is the tokens held before the
            call plus the new ones, oldest first (for a static cache, views of its
            buffers).

        Raises:
            TypeError: If `key` or `value` is not a floating-point tensor.
            ValueError: As [`check_update`][attnlab.caches.kv.KVCache.check_update], or if
                the new tokens do not fit in a static cache's `max_length` (checked even
                with validation off).
        """
        if is_validation_enabled():
            self.check_update(key, value)
        return self._append(key, value)

    @abc.abstractmethod
    def _append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Store checked keys and values of new tokens; return what `update` returns."""

    def attend(
        self, query: Tensor, key: Tensor, value: Tensor, kernel: Kernel, *, window: int | None
    ) -> Tensor:
        """Append the new keys and values, then run `kernel` over those the queries see.

        They are the last `kv_length` tokens held, from
        [`mask_sizes`][attnlab.caches.base.LayerCache.mask_sizes]: with a window, keys
        older than the window of the first new query are hidden from every new query
        and left out, so that a decode step costs O(window), not O(context).
        """
        kv_length, _ = self.mask_sizes(query.shape[2], window)
        keys, values = self.update(key, value)
        if kv_length < keys.shape[2]:
            keys, values = keys[:, :, -kv_length:], values[:, :, -kv_length:]  # (b, h_kv, s, d)
        return kernel(query, keys, values)

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget every cached token (a static cache keeps its memory)."""

    def crop(self, length: int) -> None:
        """Keep the first `length` tokens held and forget the others (speculative decoding
        takes back the keys of rejected drafts this way).

        Raises:
            ValueError: If `length` is negative or above what the cache holds, or the
                cache cannot take tokens back (a rolling cache has forgotten the ones
                before; a quantized one has merged them into groups).
        """
        raise ValueError(f"{type(self).__name__} cannot take tokens back (crop)")

    def retain(self, indices: Sequence[int]) -> None:
        """Keep the tokens held at `indices` (increasing), moved to the front in that order,
        and forget the others: a tree of drafts verified in one pass keeps the path it
        accepted, whose tokens need not be next to each other.

        Only a cache that can [`crop`][attnlab.caches.kv.KVCache.crop] can do this; the
        tokens before the first index that moves stay where they are.

        Args:
            indices: Positions among the tokens held, strictly increasing.

        Raises:
            ValueError: If an index is not an int in `[0, length)`, the indices do not
                increase, or the cache cannot take tokens back.

        Examples:
            >>> cache = DynamicKVCache()
            >>> _ = cache.update(torch.arange(5.0).view(1, 1, 5, 1), torch.zeros(1, 1, 5, 1))
            >>> cache.retain([0, 1, 3])  # tokens 0 and 1 stay; token 3 moves to slot 2
            >>> cache.held[0].flatten().tolist()
            [0.0, 1.0, 3.0]
        """
        held, kept = self.length, list(indices)
        ints = all(isinstance(i, int) and not isinstance(i, bool) for i in kept)
        if not ints or any(not 0 <= i < held for i in kept) or kept != sorted(set(kept)):
            raise ValueError(
                f"indices must be strictly increasing ints in [0, {held}) (the tokens "
                f"held), got {kept!r}"
            )
        same = next((n for n, i in enumerate(kept) if i != n), len(kept))
        rows = self.held
        moved = None
        if rows is not None and same < len(kept):
            index = torch.tensor(kept[same:], device=rows[0].device)
            moved = rows[0].index_select(2, index), rows[1].index_select(2, index)
        self.crop(same)  # raises for a cache that cannot take tokens back
        if moved is not None:
            self._append(*moved)

    def _check_crop(self, length: object) -> int:
        held = self.length
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= held:
            raise ValueError(
                f"length must be an int in [0, {held}] (the tokens held), got {length!r}"
            )
        return length

    def check_update(self, key: object, value: object) -> None:
        """Raise if `update(key, value)` would not fit what the cache holds.

        `update` calls it while validation is on (cheap: attribute reads only). Whether a
        static cache has room is checked by `update` itself, always.

        Raises:
            TypeError: If `key` or `value` is not a floating-point tensor.
            ValueError: If they are not 4-d, disagree with each other in
                `(b, num_kv_heads, t_new)`, dtype or device, or differ from
                [`layout`][attnlab.caches.kv.KVCache.layout].
        """
        shape = "(b, num_kv_heads, t_new, head_dim)"
        k = check_tensor("key", key)
        v = check_tensor("value", value)
        check_rank("key", k, (4,), shape)
        check_rank("value", v, (4,), shape.replace("head_dim", "v_head_dim"))
        if k.shape[:3] != v.shape[:3]:
            raise ValueError(
                "key and value must agree in (b, num_kv_heads, t_new), got "
                f"key.shape={tuple(k.shape)} and value.shape={tuple(v.shape)}"
            )
        check_same_dtype_device("key", k, value=v)
        held = self.layout
        if held is None:
            return
        # The new tokens must look like those held, field by field in the layout's order.
        new = CacheLayout(k.shape[0], k.shape[1], k.shape[3], v.shape[3], k.dtype, k.device)
        for field, got, want in zip(CacheLayout._fields, new, held, strict=True):
            if got != want:
                tensor = v if field == "v_head_dim" else k
                raise ValueError(
                    _MISMATCH[field].format(got=got, want=want, shape=tuple(tensor.shape))
                )


class DynamicKVCache(KVCache):
    r"""A KV cache that grows by concatenation: allocate nothing in advance.

    Each [`update`][attnlab.caches.kv.KVCache.update] concatenates the new keys and
    values to the old ones along the sequence axis, so step $n$ copies $n$ tokens: simple,
    and the memory held is exactly what is cached. The first update fixes the batch size,
    heads, feature sizes, dtype and device; [`reset`][attnlab.caches.kv.DynamicKVCache.reset]
    forgets them. Gradients flow through the cached tensors.

    Examples:
        >>> cache = DynamicKVCache()
        >>> k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 5)  # prefill 4 tokens
        >>> keys, values = cache.update(k, v)
        >>> keys, values = cache.update(k[:, :, :1], v[:, :, :1])  # decode 1 token
        >>> cache.length, tuple(keys.shape), tuple(values.shape)
        (5, (2, 3, 5, 8), (2, 3, 5, 5))
        >>> cache.nbytes  # 2 * 3 * 5 * (8 + 5) float32 numbers of 4 bytes
        1560
        >>> cache.layout.v_head_dim
        5
    """

    def __init__(self) -> None:
        self._keys: Tensor | None = None
        self._values: Tensor | None = None

    def __repr__(self) -> str:
        held = self.layout
        if held is None:
            return "DynamicKVCache(empty)"
        return (
            f"DynamicKVCache(length={self.length}, batch_size={held.batch_size}, "
            f"num_kv_heads={held.num_kv_heads}, head_dim={held.head_dim}, "
            f"v_head_dim={held.v_head_dim}, dtype={held.dtype})"
        )

    @property
    def length(self) -> int:
        """Tokens cached so far."""
        return 0 if self._keys is None else self._keys.shape[2]

    def _append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Concatenate the new tokens after the cached ones; return all of them."""
        if self._keys is None or self._values is None:
            self._keys, self._values = key, value
        else:
            self._keys = torch.cat([self._keys, key], dim=2)  # (b, h_kv, length, head_dim)
            self._values = torch.cat([self._values, value], dim=2)  # (b, h_kv, length, d_v)
        return self._keys, self._values

    def reset(self) -> None:
        """Forget every cached token, and the sizes, dtype and device of the first update."""
        self._keys = self._values = None

    croppable = True

    def crop(self, length: int) -> None:
        """Keep the first `length` tokens (see [`KVCache.crop`][attnlab.caches.kv.KVCache.crop])."""
        keep = self._check_crop(length)
        if self._keys is not None and self._values is not None:
            self._keys, self._values = self._keys[:, :, :keep], self._values[:, :, :keep]


class StaticKVCache(KVCache):
    r"""A KV cache preallocated for `max_length` tokens and written in place.

    The key and value buffers, `(batch_size, num_kv_heads, max_length, head_dim)` and
    `(..., v_head_dim)`, are allocated once; each
    [`update`][attnlab.caches.kv.KVCache.update] copies the new tokens into the next
    free positions and returns views of the filled part (tokens past `max_length` raise,
    even with validation off). Its memory does not depend on how many tokens are cached,
    and it never reallocates. It is meant for inference: a later update overwrites the
    buffer that an earlier step's autograd graph saw.

    Args:
        batch_size: Sequences decoded together.
        max_length: Most tokens the cache can hold, prompt included.
        num_kv_heads: Key/value heads.
        head_dim: Features per key.
        v_head_dim: Features per value; defaults to `head_dim`.
        dtype: Element type of the buffers; inputs must have it.
        device: Where to allocate the buffers; inputs must be there.

    Raises:
        TypeError: If a size is not an int, `dtype` is not a floating-point
            `torch.dtype` or `device` is of the wrong type.
        ValueError: If a size is not positive or `device` names no device.

    Examples:
        >>> cache = StaticKVCache(2, 16, num_kv_heads=3, head_dim=8)
        >>> keys, values = cache.update(torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8))
        >>> cache.length, tuple(keys.shape)
        (4, (2, 3, 4, 8))
        >>> cache.nbytes  # 2 buffers of 2 * 3 * 16 * 8 float32 numbers, whatever is used
        6144
    """

    _keys: Tensor  # allocated at construction: never None
    _values: Tensor

    def __init__(
        self,
        batch_size: int,
        max_length: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        v_head_dim: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self._batch_size = check_positive_int("batch_size", batch_size)
        self._max_length = check_positive_int("max_length", max_length)
        self.num_kv_heads = check_positive_int("num_kv_heads", num_kv_heads)
        shape = (batch_size, num_kv_heads, max_length)
        self._keys, self._values = kv_buffers(shape, head_dim, v_head_dim, dtype, device)
        self.head_dim, self.v_head_dim = head_dim, self._values.shape[-1]
        self._length = 0

    def __repr__(self) -> str:
        return (
            f"StaticKVCache(length={self._length}, max_length={self.max_length}, "
            f"batch_size={self._batch_size}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, v_head_dim={self.v_head_dim}, dtype={self.dtype})"
        )

    @property
    def max_length(self) -> int:
        """Most tokens the cache can hold, prompt included."""
        return self._max_length

    @property
    def dtype(self) -> torch.dtype:
        """Element type of the buffers."""
        return self._keys.dtype

    @property
    def device(self) -> torch.device:
        """Device of the buffers."""
        return self._keys.device

    @property
    def length(self) -> int:
        """Tokens cached so far."""
        return self._length

    @property
    def layout(self) -> CacheLayout:
        """The sizes, dtype and device the buffers were allocated with."""
        return CacheLayout(
            self._batch_size,
            self.num_kv_heads,
            self.head_dim,
            self.v_head_dim,
            self.dtype,
            self.device,
        )

    @property
    def batch_size(self) -> int:
        """Sequences the buffers hold, as their layout says."""
        return self._batch_size

    def _append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new tokens after the cached ones; return views of the filled part.

        Whether they fit in `max_length` is checked here, even with validation off: the
        one place this overflow is checked.
        """
        start, t_new = self._length, key.shape[2]
        if start + t_new > self.max_length:
            room = self.max_length - start
            raise ValueError(
                f"key has t_new={t_new} tokens but the static cache has room for "
                f"max_length - length = {self.max_length} - {start} = {room}"
                "; build it with a larger max_length"
            )
        self._keys[:, :, start : start + t_new] = key
        self._values[:, :, start : start + t_new] = value
        self._length = start + t_new
        keys = self._keys[:, :, : self._length]  # (b, h_kv, length, head_dim)
        values = self._values[:, :, : self._length]  # (b, h_kv, length, v_head_dim)
        return keys, values

    def reset(self) -> None:
        """Forget every cached token; the buffers stay allocated (their contents are stale)."""
        self._length = 0

    croppable = True

    def crop(self, length: int) -> None:
        """Keep the first `length` tokens (see [`KVCache.crop`][attnlab.caches.kv.KVCache.crop]):
        the next update writes over the others."""
        self._length = self._check_crop(length)


class RollingKVCache(KVCache):
    r"""A KV cache for a sliding-window layer that keeps only the last `window - 1` tokens.

    A layer with window $w$ lets each query see itself and the $w - 1$ tokens before it.
    Once a token is $w - 1$ places behind the newest one, no later query can see it, so
    the cache may forget it: the memory held stops growing at $w - 1$ tokens, however
    long the context (Mistral 7B's "rolling buffer cache"; `transformers` keeps the same
    `sliding_window - 1` tokens in its sliding-window cache layers).

    Each [`update`][attnlab.caches.kv.KVCache.update] returns the kept tokens
    followed by all the new ones, in order, so a chunk of $t$ new queries gets the
    $w - 1 + t$ keys its window can reach and the layer's bottom-right causal window
    mask stays right. It then copies the last $w - 1$ of them into a buffer of fixed
    size, allocated at the first update (which fixes the sizes, dtype and device):
    a roll, not a ring, so the keys always come back oldest first. Keys are stored
    already rotated by RoPE, so forgetting old ones changes no position.

    [`length`][attnlab.caches.kv.RollingKVCache.length] (and `len(cache)`) counts the
    tokens kept, at most `window - 1`;
    [`seen`][attnlab.caches.kv.RollingKVCache.seen] counts every token seen (the next
    token's position, what a model reads to place new tokens). The cache owns its
    window: [`attend`][attnlab.caches.kv.KVCache.attend] hands a layer's kernel the keys
    its queries see, and only a layer with a window of at most `window` may use it
    ([`check_window`][attnlab.caches.kv.RollingKVCache.check_window] refuses a global
    layer, which would lose its old keys). Like
    [`StaticKVCache`][attnlab.caches.kv.StaticKVCache], it is meant for inference.

    Args:
        window: The layer's window: keys per query, itself included.

    Raises:
        TypeError: If `window` is not an int.
        ValueError: If it is not positive.

    Examples:
        >>> cache = RollingKVCache(window=4)
        >>> keys, _ = cache.update(torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8))
        >>> tuple(keys.shape), cache.seen, len(cache)  # prefill: all 6 go to attention
        ((1, 2, 6, 8), 6, 3)
        >>> keys, _ = cache.update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
        >>> tuple(keys.shape), cache.seen, len(cache)  # decode: the window, no more
        ((1, 2, 4, 8), 7, 3)
        >>> cache.nbytes  # 2 buffers of 1 * 2 * 3 * 8 float32 numbers, forever
        384
    """

    def __init__(self, window: int) -> None:
        self.window = check_positive_int("window", window)
        self._keys: Tensor | None = None  # (b, h_kv, window - 1, head_dim)
        self._values: Tensor | None = None  # (b, h_kv, window - 1, v_head_dim)
        self._held = 0
        self._seen = 0

    def __repr__(self) -> str:
        return f"RollingKVCache(window={self.window}, length={self._held}, seen={self._seen})"

    def check_window(self, window: int | None, *, name: str = "cache", owner: str) -> None:
        """Raise unless the layer's `window` fits: a global layer, or a wider window,
        would lose keys it attends to.

        Raises:
            ValueError: If `window` is None or larger than this cache's.
        """
        if window is None or window > self.window:
            sees = "every token" if window is None else f"{window} tokens"
            raise ValueError(
                f"{name} is a RollingKVCache(window={self.window}) but {owner} sees {sees}: "
                "it would lose keys the layer attends to"
            )

    @property
    def length(self) -> int:
        """Tokens kept: `min(seen, window - 1)`, also `len(cache)`."""
        return self._held

    @property
    def seen(self) -> int:
        """Tokens seen so far (kept or forgotten): the position of the next token."""
        return self._seen

    def _append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Return the kept tokens and the new ones; keep the last `window - 1` of them."""
        if self._keys is None or self._values is None:
            b, h, _, hd = key.shape
            room = (b, h, self.window - 1)
            self._keys = key.new_zeros(*room, hd)
            self._values = value.new_zeros(*room, value.shape[-1])
        held = self._held
        if held:
            keys = torch.cat([self._keys[:, :, :held], key], dim=2)  # (b, h_kv, held + t, d)
            values = torch.cat([self._values[:, :, :held], value], dim=2)  # (.., held + t, d_v)
        else:
            keys, values = key, value
        keep = min(self.window - 1, keys.shape[2])
        if keep:
            # keys is a new tensor (or the input): no overlap with the buffer it fills.
            self._keys[:, :, :keep] = keys[:, :, -keep:]
            self._values[:, :, :keep] = values[:, :, -keep:]
        self._held = keep
        self._seen += key.shape[2]
        return keys, values

    def reset(self) -> None:
        """Forget every token, and the sizes, dtype and device of the first update."""
        self._keys = self._values = None
        self._held = self._seen = 0
