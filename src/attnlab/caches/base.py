r"""The one protocol of every per-layer state a decoder carries between steps.

A decoder keeps, for each layer, what that layer needs of the tokens it has seen: keys
and values (dynamic, static or rolling), MLA's latents, DSA's latents and indexer keys,
Gated DeltaNet's fixed-size recurrent state, or one layer's view of a paged cache of
many sequences. They differ in what they store, not in what a model asks of them.
[`LayerCache`][attnlab.caches.base.LayerCache] is that question, the same for all, as
`transformers` asks every layer of its `Cache` (`get_seq_length`, `get_mask_sizes`,
`reset`, `update`):

- [`seen`][attnlab.caches.base.LayerCache.seen]: tokens seen, the position of the next
  one; [`length`][attnlab.caches.base.LayerCache.length] (and `len(cache)`): tokens
  held, fewer when the cache forgets (a sliding window's);
- [`mask_sizes`][attnlab.caches.base.LayerCache.mask_sizes]: how many keys the next
  queries attend over, and the position of the first (the key offset a mask needs);
- `update`: how it takes what the layer makes of new tokens (keys and values for a
  [`KVCache`][attnlab.caches.kv.KVCache], the new state for a recurrent layer), with
  arguments of its kind's own;
- [`reset`][attnlab.caches.base.LayerCache.reset]: forget every token;
- [`nbytes`][attnlab.caches.base.LayerCache.nbytes],
  [`batch_size`][attnlab.caches.base.LayerCache.batch_size] and
  [`max_length`][attnlab.caches.base.LayerCache.max_length]: what it holds and what it
  can take.

A layer checks that the cache it is handed is its kind with
[`check`][attnlab.caches.base.LayerCache.check] on the class it takes: one message that
names the cache the layer needs.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import ClassVar, TypeVar

__all__ = ["LayerCache"]

C = TypeVar("C", bound="LayerCache")


class LayerCache(abc.ABC):
    """What every per-layer cache or state answers, whatever it stores.

    Subclasses: the key/value caches ([`KVCache`][attnlab.caches.kv.KVCache] and the
    paged view, both [`AttentionCache`][attnlab.caches.kv.AttentionCache]),
    [`GatedDeltaNetState`][attnlab.layers.linear.GatedDeltaNetState] and
    [`SparseAttentionCache`][attnlab.layers.sparse.SparseAttentionCache]. Each adds the
    `update` of its kind.
    """

    croppable: ClassVar[bool] = False
    """True for a cache that can take tokens back (`crop`), as speculative decoding needs
    to forget the keys of rejected drafts."""

    ragged: ClassVar[bool] = False
    """True for a view of sequences of different lengths (a paged batch): there is no
    one `seen`, so the caller places every token (`positions`) and the cache decides
    what each query sees (no masks)."""

    @property
    @abc.abstractmethod
    def seen(self) -> int:
        """Tokens seen so far, held or forgotten: the position of the next token.

        A model places new tokens with it (RoPE's positions, masks that span every token
        of the sequence).
        """

    @property
    def length(self) -> int:
        """Tokens held, also `len(cache)`: `seen` unless the cache forgets old tokens."""
        return self.seen

    def __len__(self) -> int:
        """Tokens held: [`length`][attnlab.caches.base.LayerCache.length]."""
        return self.length

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes of memory the cache has allocated."""

    @property
    def batch_size(self) -> int | None:
        """Sequences it holds, or None while that is open (an empty dynamic cache)."""
        return None

    @property
    def max_length(self) -> int | None:
        """Most tokens it can hold, or None when it grows or forgets without bound."""
        return None

    def mask_sizes(self, t: int, window: int | None = None) -> tuple[int, int]:
        """How many keys `t` new queries attend over, and the position of the first.

        The keys are the last of the tokens held and the `t` new ones: all of them, or,
        for a layer with a sliding `window`, the `t + window - 1` that the first new
        query can still see (older ones are hidden from every new query). The offset is
        the position of the first of them; a mask over every token seen keeps its
        columns from there. Asked before the update, as `transformers` asks its cache
        layers' `get_mask_sizes`.

        Args:
            t: New tokens (queries).
            window: The layer's window (keys per query, itself included), or None.

        Returns:
            `(kv_length, kv_offset)`.

        Examples:
            >>> from attnlab.caches.kv import DynamicKVCache
            >>> DynamicKVCache().mask_sizes(5), DynamicKVCache().mask_sizes(5, window=2)
            ((5, 0), (5, 0))
        """
        held = self.length + t
        kv_length = held if window is None else min(held, t + window - 1)
        return kv_length, self.seen + t - kv_length

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget every token."""

    @classmethod
    def check(
        cls: type[C],
        cache: object,
        *,
        needs: str,
        name: str = "cache",
        fits: Callable[[C], bool] | None = None,
        optional: bool = True,
    ) -> C | None:
        """Return `cache` if it is None (when `optional`) or of this class; else raise.

        The one check of a layer's cache argument, on the class of cache the layer
        takes: whatever is wrong with it (another library's cache, another layer's kind,
        keys of other sizes), the message names what the layer needs.

        Args:
            cache: What the layer was handed.
            needs: What the layer needs, in words, e.g. `"MultiHeadLatentAttention's
                latent cache from new_cache"`.
            name: The argument's name in the message.
            fits: A further test of a cache of the right class (e.g. its sizes).
            optional: Whether None is accepted (a layer run without a cache).

        Returns:
            `cache`.

        Raises:
            TypeError: If `cache` is not of this class or fails `fits`.

        Examples:
            >>> from attnlab.caches.kv import KVCache
            >>> KVCache.check({}, needs="a KVCache")
            Traceback (most recent call last):
            ...
            TypeError: cache must be a KVCache or None, got dict
        """
        if cache is None and optional:
            return None
        if isinstance(cache, cls) and (fits is None or fits(cache)):
            return cache
        got = repr(cache) if isinstance(cache, LayerCache) else type(cache).__name__
        raise TypeError(f"{name} must be {needs}{' or None' if optional else ''}, got {got}")
