r"""Key/value caches for incremental decoding, and what they cost in memory.

A decoder generates one token at a time, and each new token attends to every earlier one.
The keys and values of the earlier tokens do not change (causal attention never lets a
token see a later one), so recomputing them at every step is wasted work: a *KV cache*
keeps them, and each step projects only the new tokens, appends their keys and values,
and attends from the new queries to everything cached.

Two caches share one interface, [`KVCache`][attnlab.kv_cache.KVCache]:

- [`DynamicKVCache`][attnlab.kv_cache.DynamicKVCache] grows with `torch.cat` at every
  step: nothing to size in advance, but each step copies the whole cache.
- [`StaticKVCache`][attnlab.kv_cache.StaticKVCache] allocates `max_length` positions
  once and writes each step in place: fixed memory and fixed addresses (what
  `torch.compile` and CUDA graphs want), at the price of reserving the maximum up front.

The memory per token is pure arithmetic,
[`kv_cache_bytes_per_token`][attnlab.kv_cache.kv_cache_bytes_per_token]: 2 tensors (keys
and values) x layers x key/value heads x head size x bytes per element. Grouped-query
attention (Ainslie et al., 2023, https://arxiv.org/abs/2305.13245) shrinks it by sharing
each key/value head among several query heads.
"""

from __future__ import annotations

import abc

import torch
from torch import Tensor

from attnlab._validation import (
    check_device,
    check_positive_int,
    check_rank,
    check_tensor,
    is_validation_enabled,
)

__all__ = ["DynamicKVCache", "KVCache", "StaticKVCache", "kv_cache_bytes_per_token"]


def kv_cache_bytes_per_token(
    *,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    head_dim_v: int | None = None,
) -> int:
    r"""Bytes that a KV cache holds per token of context, over all layers.

    $$
    \text{bytes per token} = \text{num\_layers} \cdot \text{num\_kv\_heads} \cdot
    (\text{head\_dim} + \text{head\_dim\_v}) \cdot \text{bytes per element}
    $$

    Every layer caches one key of `head_dim` and one value of `head_dim_v` features per
    key/value head. The number of *query* heads does not appear: that is the whole point
    of grouped- and multi-query attention.

    Args:
        num_layers: Attention layers, each with its own cache.
        num_kv_heads: Key/value heads per layer (= query heads for multi-head attention,
            1 for multi-query attention).
        head_dim: Features per key.
        dtype: Element type of the cache, e.g. `torch.bfloat16` (2 bytes).
        head_dim_v: Features per value; defaults to `head_dim`.

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
    head_dim_v = head_dim if head_dim_v is None else check_positive_int("head_dim_v", head_dim_v)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r} ({type(dtype).__name__})")
    return num_layers * num_kv_heads * (head_dim + head_dim_v) * dtype.itemsize


class KVCache(abc.ABC):
    r"""The interface of attnlab's key/value caches (one cache serves one attention layer).

    A cache is handed keys and values of shape `(b, num_kv_heads, t_new, head_dim)` (and
    `head_dim_v` for values) by [`update`][attnlab.kv_cache.KVCache.update], and returns
    all it holds, the new tokens last. The first update fixes what a dynamic cache holds
    (batch size, heads, feature sizes, dtype, device); later ones must match it, and a
    mismatch raises instead of broadcasting or casting silently.
    """

    @property
    @abc.abstractmethod
    def length(self) -> int:
        """Tokens cached so far (per sequence of the batch)."""

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes of memory the cache has allocated for keys and values."""

    @abc.abstractmethod
    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append the keys and values of new tokens; return everything cached.

        Args:
            key: Keys of the new tokens, `(b, num_kv_heads, t_new, head_dim)`.
            value: Values of the new tokens, `(b, num_kv_heads, t_new, head_dim_v)`.

        Returns:
            `(keys, values)`, of shapes `(b, num_kv_heads, length, head_dim)` and
            `(b, num_kv_heads, length, head_dim_v)`, where `length` counts the new tokens.
        """

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget every cached token (a static cache keeps its memory)."""

    def __len__(self) -> int:
        return self.length

    @abc.abstractmethod
    def _layout(self) -> tuple[int, int, int, int, torch.dtype, torch.device] | None:
        """`(batch_size, num_kv_heads, head_dim, head_dim_v, dtype, device)` that an update
        must match, or None while anything goes (an empty dynamic cache)."""


def _check_new_tokens(
    key: object,
    value: object,
    expected: tuple[int, int, int, int, torch.dtype, torch.device] | None,
    owner: str,
) -> None:
    """Check `update`'s arguments, against what the cache holds if `expected` is given.

    `expected` is `(batch_size, num_kv_heads, head_dim, head_dim_v, dtype, device)`.
    """
    layout = "(b, num_kv_heads, t_new, head_dim)"
    k = check_tensor("key", key)
    v = check_tensor("value", value)
    check_rank("key", k, (4,), layout)
    check_rank("value", v, (4,), layout.replace("head_dim", "head_dim_v"))
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            "key and value must agree in (b, num_kv_heads, t_new), got "
            f"key.shape={tuple(k.shape)} and value.shape={tuple(v.shape)}"
        )
    if v.dtype != k.dtype or v.device != k.device:
        raise ValueError(
            f"key and value must have one dtype and device, got key {k.dtype} on {k.device} "
            f"and value {v.dtype} on {v.device}"
        )
    if expected is None:
        return
    b, h, hd, hd_v, dtype, device = expected
    if k.shape[0] != b:
        raise ValueError(
            f"key has batch size {k.shape[0]} but the {owner} holds {b} sequences "
            f"(key.shape={tuple(k.shape)}); call reset() or use one cache per batch size"
        )
    for name, got, want in (
        ("num_kv_heads", k.shape[1], h),
        ("head_dim", k.shape[3], hd),
        ("head_dim_v", v.shape[3], hd_v),
    ):
        if got != want:
            tensor = "value" if name == "head_dim_v" else "key"
            shape = v.shape if tensor == "value" else k.shape
            raise ValueError(
                f"{tensor} has {name}={got} but the {owner} holds {name}={want} "
                f"({tensor}.shape={tuple(shape)})"
            )
    if k.dtype != dtype:
        raise ValueError(
            f"key has dtype {k.dtype} but the {owner} holds {dtype}; convert the inputs or "
            "build the cache with their dtype"
        )
    if k.device != device:
        raise ValueError(
            f"key is on {k.device} but the {owner} is on {device}; move the inputs or "
            "build the cache on their device"
        )


class DynamicKVCache(KVCache):
    r"""A KV cache that grows by concatenation: allocate nothing in advance.

    Each [`update`][attnlab.kv_cache.DynamicKVCache.update] concatenates the new keys and
    values to the old ones along the sequence axis, so step $n$ copies $n$ tokens: simple,
    and the memory held is exactly what is cached. The first update fixes the batch size,
    heads, feature sizes, dtype and device; [`reset`][attnlab.kv_cache.DynamicKVCache.reset]
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
    """

    def __init__(self) -> None:
        self._keys: Tensor | None = None
        self._values: Tensor | None = None

    def __repr__(self) -> str:
        if self._keys is None or self._values is None:
            return "DynamicKVCache(empty)"
        b, h, t, hd = self._keys.shape
        return (
            f"DynamicKVCache(length={t}, batch_size={b}, num_kv_heads={h}, head_dim={hd}, "
            f"head_dim_v={self._values.shape[-1]}, dtype={self._keys.dtype})"
        )

    @property
    def length(self) -> int:
        """Tokens cached so far."""
        return 0 if self._keys is None else self._keys.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached keys and values (0 when empty)."""
        if self._keys is None or self._values is None:
            return 0
        return self._keys.nbytes + self._values.nbytes

    def _layout(self) -> tuple[int, int, int, int, torch.dtype, torch.device] | None:
        if self._keys is None or self._values is None:
            return None
        b, h, _, hd = self._keys.shape
        return (b, h, hd, self._values.shape[-1], self._keys.dtype, self._keys.device)

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append the keys and values of new tokens; return everything cached.

        Args:
            key: Keys of the new tokens, `(b, num_kv_heads, t_new, head_dim)`.
            value: Values of the new tokens, `(b, num_kv_heads, t_new, head_dim_v)`.

        Returns:
            `(keys, values)`: all cached tokens, `(b, num_kv_heads, length, head_dim)` and
            `(b, num_kv_heads, length, head_dim_v)`.

        Raises:
            TypeError: If `key` or `value` is not a floating-point tensor.
            ValueError: If they are not 4-d, disagree with each other, or differ from
                what the cache holds in batch size, heads, feature size, dtype or device.
        """
        if is_validation_enabled():
            _check_new_tokens(key, value, self._layout(), "cache")
        if self._keys is None or self._values is None:
            self._keys, self._values = key, value
        else:
            self._keys = torch.cat([self._keys, key], dim=2)  # (b, h_kv, length, head_dim)
            self._values = torch.cat([self._values, value], dim=2)  # (b, h_kv, length, hd_v)
        return self._keys, self._values

    def reset(self) -> None:
        """Forget every cached token, and the sizes, dtype and device of the first update."""
        self._keys = self._values = None


class StaticKVCache(KVCache):
    r"""A KV cache preallocated for `max_length` tokens and written in place.

    The key and value buffers, `(batch_size, num_kv_heads, max_length, head_dim)` and
    `(..., head_dim_v)`, are allocated once; each
    [`update`][attnlab.kv_cache.StaticKVCache.update] copies the new tokens into the next
    free positions and returns views of the filled part. Its memory does not depend on
    how many tokens are cached, and it never reallocates. It is meant for inference: a
    later update overwrites the buffer that an earlier step's autograd graph saw.

    Args:
        batch_size: Sequences decoded together.
        max_length: Most tokens the cache can hold, prompt included.
        num_kv_heads: Key/value heads.
        head_dim: Features per key.
        head_dim_v: Features per value; defaults to `head_dim`.
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

    def __init__(
        self,
        batch_size: int,
        max_length: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        head_dim_v: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.max_length = check_positive_int("max_length", max_length)
        self.num_kv_heads = check_positive_int("num_kv_heads", num_kv_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.head_dim_v = (
            head_dim if head_dim_v is None else check_positive_int("head_dim_v", head_dim_v)
        )
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        check_device("device", device)
        shape = (batch_size, num_kv_heads, max_length)
        self._keys = torch.zeros(*shape, head_dim, dtype=dtype, device=device)
        self._values = torch.zeros(*shape, self.head_dim_v, dtype=dtype, device=device)
        self._length = 0

    def __repr__(self) -> str:
        return (
            f"StaticKVCache(length={self._length}, max_length={self.max_length}, "
            f"batch_size={self.batch_size}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, head_dim_v={self.head_dim_v}, dtype={self.dtype})"
        )

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

    def _layout(self) -> tuple[int, int, int, int, torch.dtype, torch.device]:
        return (
            self.batch_size,
            self.num_kv_heads,
            self.head_dim,
            self.head_dim_v,
            self.dtype,
            self.device,
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the two preallocated buffers, independent of `length`."""
        return self._keys.nbytes + self._values.nbytes

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Write the keys and values of new tokens after the cached ones; return all.

        Args:
            key: Keys of the new tokens, `(batch_size, num_kv_heads, t_new, head_dim)`.
            value: Values of the new tokens, `(batch_size, num_kv_heads, t_new,
                head_dim_v)`.

        Returns:
            `(keys, values)`: views of the filled part of the buffers,
            `(batch_size, num_kv_heads, length, head_dim)` and `(..., head_dim_v)`.

        Raises:
            TypeError: If `key` or `value` is not a floating-point tensor.
            ValueError: If they are not 4-d, disagree with each other or with the
                cache's batch size, heads, feature sizes, dtype or device, or if the new
                tokens do not fit in `max_length` (checked even with validation off).
        """
        if is_validation_enabled():
            _check_new_tokens(key, value, self._layout(), "cache")
        start, t_new = self._length, key.shape[2]
        if start + t_new > self.max_length:
            raise ValueError(
                f"key has t_new={t_new} tokens but the static cache has room for "
                f"max_length - length = {self.max_length} - {start} = {self.max_length - start}"
                "; build it with a larger max_length"
            )
        self._keys[:, :, start : start + t_new] = key
        self._values[:, :, start : start + t_new] = value
        self._length = start + t_new
        keys = self._keys[:, :, : self._length]  # (b, h_kv, length, head_dim)
        values = self._values[:, :, : self._length]  # (b, h_kv, length, head_dim_v)
        return keys, values

    def reset(self) -> None:
        """Forget every cached token; the buffers stay allocated (their contents are stale)."""
        self._length = 0
