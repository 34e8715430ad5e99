r"""Layers that share one cache: the keys and values of one layer, read by later layers.

Gemma 4 computes keys and values in its first layers only: each of its last
`num_kv_shared_layers` layers reads those of the last earlier layer of its kind (sliding
or global), so those layers add queries but no cache. Here the source layer's cache is a
[`SharedKVCache`][attnlab.caches.shared.SharedKVCache] around its own
[`AttentionCache`][attnlab.caches.kv.AttentionCache], and every layer that reads it gets a
[`SharedKVReader`][attnlab.caches.shared.SharedKVReader] of it, which holds nothing: the
layers speak the cache protocol as always (`attend`), and the reader hands them, at each
step, the keys and values the source attended over.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from attnlab.caches.kv import AttentionCache, Kernel

__all__ = ["KV_SOURCES", "KVSource", "SharedKVCache", "SharedKVReader"]

Keys = Tensor | None
"""A source layer's new keys (or values), or None from a layer that reads them."""

KVSource = Literal["projected", "keys", "shared"]
"""Where an attention layer's keys and values come from: its own `k_proj` and `v_proj`
(`"projected"`), its key projection for both (`"keys"`: Gemma 4's global layers), or an
earlier layer, through a [`SharedKVReader`][attnlab.caches.shared.SharedKVReader] (`"shared"`)."""

KV_SOURCES: tuple[KVSource, ...] = ("projected", "keys", "shared")


class SharedKVCache(AttentionCache):
    r"""The cache of a layer whose keys and values later layers read too (KV sharing).

    In Gemma 4 the last `num_kv_shared_layers` layers compute no keys or values: each
    reads those of the last earlier layer of its kind (sliding or global), so only the
    earlier layers are cached. This cache wraps the source layer's own cache (`inner`,
    or None for a forward without one): at each call the source stores its new keys and
    values there, and the keys and values its kernel attends over (with a window, those
    the window reaches) are lent to the [`reader`][attnlab.caches.shared.SharedKVCache.reader]s
    for that step. A reader holds nothing, so a shared layer adds no memory.

    Args:
        inner: The source layer's cache, or None (then nothing is kept between calls).

    Raises:
        TypeError: If `inner` is not an `AttentionCache` that stores its own keys, or None.

    Examples:
        >>> import torch
        >>> from attnlab.caches.kv import DynamicKVCache
        >>> shared = SharedKVCache(DynamicKVCache())
        >>> reader = shared.reader()
        >>> def kernel(q, k, v):  # the layers' attention: here the sum of the values
        ...     return v.sum(2, keepdim=True).expand(*q.shape[:3], v.shape[-1])
        >>> q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.ones(1, 2, 3, 4)
        >>> shared.attend(q, k, v, kernel, window=None)[0, 0, 0]  # the source layer
        tensor([3., 3., 3., 3.])
        >>> reader.attend(q, None, None, kernel, window=None)[0, 0, 0]  # a later layer
        tensor([3., 3., 3., 3.])
        >>> shared.nbytes, reader.nbytes  # one cache of 3 tokens for the two layers
        (192, 0)
    """

    def __init__(self, inner: AttentionCache | None = None) -> None:
        lends = isinstance(inner, SharedKVReader | SharedKVCache)
        if inner is not None and (not isinstance(inner, AttentionCache) or lends or inner.ragged):
            raise TypeError(
                "inner must be the source layer's own AttentionCache (e.g. a DynamicKVCache; "
                f"not a paged view) or None, got {type(inner).__name__}"
            )
        self.inner = inner
        self._seen = 0  # tokens passed through, when there is no inner cache
        self._lent: tuple[Tensor, Tensor, int | None] | None = None  # keys, values, window
        self._readers = self._reads = 0  # readers made; of them, those that read this step

    def __repr__(self) -> str:
        return f"SharedKVCache({self.inner!r})"

    @property
    def seen(self) -> int:
        """Tokens the source layer has seen."""
        return self._seen if self.inner is None else self.inner.seen

    @property
    def length(self) -> int:
        """Tokens the inner cache holds (0 without one)."""
        return 0 if self.inner is None else self.inner.length

    @property
    def nbytes(self) -> int:
        """Bytes of the inner cache: the memory of the source and all its readers."""
        return 0 if self.inner is None else self.inner.nbytes

    @property
    def batch_size(self) -> int | None:
        return None if self.inner is None else self.inner.batch_size

    @property
    def max_length(self) -> int | None:
        return None if self.inner is None else self.inner.max_length

    def check_window(self, window: int | None, *, name: str = "cache", owner: str) -> None:
        """The inner cache's check: a rolling one serves only a narrow enough window."""
        if self.inner is not None:
            self.inner.check_window(window, name=name, owner=owner)

    def reader(self) -> SharedKVReader:
        """A cache for a layer that reads this layer's keys and values, from now on."""
        self._readers += 1
        return SharedKVReader(self)

    def _read(self) -> tuple[Tensor, Tensor, int | None] | None:
        """What was lent this step; forgotten once every reader has read it."""
        lent = self._lent
        self._reads += 1
        if self._reads >= self._readers:  # the last reader: free the keys (a prefill's)
            self._lent = None
        return lent

    def attend(
        self, query: Tensor, key: Keys, value: Keys, kernel: Kernel, *, window: int | None
    ) -> Tensor:
        """Store the source layer's new keys and values (in `inner`), attend, and lend the
        keys and values the kernel attended over to the readers of this step."""
        if key is None or value is None:
            raise ValueError(
                "key and value are None, but a SharedKVCache is the cache of the layer that "
                "computes them; a layer that reads them takes its reader()"
            )

        def lend(q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
            self._lent, self._reads = (keys, values, window), 0
            return kernel(q, keys, values)

        if self.inner is None:
            self._seen += key.shape[2]
            return lend(query, key, value)
        return self.inner.attend(query, key, value, lend, window=window)

    def reset(self) -> None:
        """Forget every token (the inner cache's too) and what was lent."""
        if self.inner is not None:
            self.inner.reset()
        self._seen, self._lent, self._reads = 0, None, 0


class SharedKVReader(AttentionCache):
    """The cache of a layer that reads another layer's keys and values: it holds none.

    Made by [`SharedKVCache.reader`][attnlab.caches.shared.SharedKVCache.reader]. At each
    step, after the source layer ran on the same new tokens, the reading layer's
    `attend(query, None, None, kernel, window=...)` runs its kernel over the keys and
    values the source attended over (with the same window).
    """

    def __init__(self, source: SharedKVCache) -> None:
        if not isinstance(source, SharedKVCache):
            raise TypeError(f"source must be a SharedKVCache, got {type(source).__name__}")
        self.source = source
        self._seen = source.seen

    def __repr__(self) -> str:
        return f"SharedKVReader(seen={self._seen}, source={self.source!r})"

    @property
    def seen(self) -> int:
        """Tokens this layer has read (the source has seen as many between steps)."""
        return self._seen

    @property
    def length(self) -> int:
        """0: the tokens are held by the source."""
        return 0

    @property
    def nbytes(self) -> int:
        """0: the keys and values are the source's."""
        return 0

    @property
    def batch_size(self) -> int | None:
        return self.source.batch_size

    @property
    def max_length(self) -> int | None:
        return self.source.max_length

    def check_window(self, window: int | None, *, name: str = "cache", owner: str) -> None:
        self.source.check_window(window, name=name, owner=owner)

    def attend(
        self, query: Tensor, key: Keys, value: Keys, kernel: Kernel, *, window: int | None
    ) -> Tensor:
        """Run `kernel` from `query` over the keys and values the source lent this step.

        Raises:
            ValueError: If keys or values are given, the source has not attended over
                these tokens yet, or attended with another window.
        """
        if key is not None or value is not None:
            raise ValueError(
                "a SharedKVReader lends the source layer's keys and values: its layer "
                "computes none (key and value must be None)"
            )
        t, source_seen = query.shape[2], self.source.seen
        lent = self.source._read() if self._seen + t == source_seen else None
        if lent is None:
            raise ValueError(
                f"the source layer has not attended over these {t} tokens yet (it has "
                f"seen {source_seen}, this reader {self._seen}): run it first, and reset a "
                "source and its readers together"
            )
        keys, values, lent_window = lent
        if window != lent_window:
            raise ValueError(
                f"the reading layer's window={window} differs from its source's "
                f"window={lent_window}: they must see the same keys"
            )
        self._seen += t
        return kernel(query, keys, values)

    def reset(self) -> None:
        """Start again from no tokens, as the source does when it is reset (reset the
        two together)."""
        self._seen = 0
