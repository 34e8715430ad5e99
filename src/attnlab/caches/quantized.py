r"""A KV cache that stores its keys and values in 8 or 4 bits: KIVI.

KIVI (Liu et al., 2024, https://arxiv.org/abs/2402.02750) quantizes a KV cache without
retraining by looking at how keys and values differ. A few *channels* of the keys carry
values far larger than the rest, the same channels at every token, so keys are quantized
per channel: each group of `group` consecutive tokens of one channel gets its own range.
Values have no such channels, and each token's value is mixed by the attention weights
as a whole, so values are quantized per token: each group of `group` consecutive channels
of one token gets its own range. Every group is quantized asymmetrically to $2^b$ levels
between its minimum and maximum:

$$
q = \operatorname{round}\!\left(\frac{x - m}{s}\right), \quad
s = \frac{\max - m}{2^b - 1}, \quad m = \min, \qquad \hat x = q\,s + m,
$$

with $s$ and $m$ kept in float16, and the codes packed two to a byte at 4 bits. The most
recent tokens stay in full precision (a window of at most `residual` tokens), so that a
group of keys is quantized only once all its `group` tokens have come; whenever the
window reaches `residual` tokens, its oldest tokens are quantized in whole groups.

[`QuantizedKVCache`][attnlab.caches.quantized.QuantizedKVCache] is a
[`KVCache`][attnlab.caches.kv.KVCache]: a layer appends to it and attends over what it
returns, the quantized tokens dequantized in one place
([`dequantize`][attnlab.caches.quantized.dequantize]) followed by the window.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

from attnlab.caches.kv import CacheLayout, KVCache
from attnlab.rules._validation import check_positive_int

__all__ = ["Bits", "Quantized", "QuantizedKVCache", "dequantize", "quantize"]

Bits = Literal[4, 8]


class Quantized(NamedTuple):
    """A tensor quantized in groups: its codes, and each group's float16 scale and minimum.

    `codes` is uint8, the last dimension halved at 4 bits (two codes to a byte, the
    first in the low half); `scale` and `minimum` have the tensor's shape with the
    grouped dimension divided by the group size.
    """

    codes: Tensor
    scale: Tensor
    minimum: Tensor

    @property
    def nbytes(self) -> int:
        """Bytes of the codes, scales and minima."""
        return self.codes.nbytes + self.scale.nbytes + self.minimum.nbytes


def _half_toward(x: Tensor, direction: int) -> Tensor:
    """`x` in float16, rounded down (`direction` -1) or up (+1) where nearest would cross."""
    half = x.half()
    crossed = half.to(x.dtype) > x if direction < 0 else half.to(x.dtype) < x
    beyond = torch.full_like(half, float("-inf") if direction < 0 else float("inf"))
    return torch.where(crossed, torch.nextafter(half, beyond), half)


def _check_grouping(shape: torch.Size, bits: object, group: object, dim: object, name: str) -> None:
    """Raise naming the argument unless `shape` groups by `group` along `dim` at `bits`."""
    _check_bits(bits)
    check_positive_int("group", group)
    if type(dim) is not int or not 0 <= dim < len(shape):
        raise ValueError(f"dim must be an int in [0, {len(shape)}) for {name}, got {dim!r}")
    assert isinstance(group, int)
    if shape[dim] % group:
        raise ValueError(
            f"group={group} must divide {name}.shape[{dim}]={shape[dim]}: groups do not straddle"
        )


def _grouped(x: Tensor, group: int, dim: int) -> Tensor:
    """`x` with dimension `dim` split into `(n, group)`: the group axis is `dim + 1`."""
    shape = list(x.shape)
    shape[dim : dim + 1] = [shape[dim] // group, group]
    return x.reshape(shape)


def quantize(x: Tensor, bits: Bits, group: int, dim: int) -> Quantized:
    """Quantize `x` asymmetrically in groups of `group` along `dim` (KIVI's rule).

    Args:
        x: A floating-point tensor; `x.shape[dim]` a multiple of `group`, and at 4 bits
            its last dimension even.
        bits: 8 or 4.
        group: Elements per group.
        dim: The dimension grouped (non-negative): the tokens for KIVI's keys (per
            channel), the channels for its values (per token).

    Returns:
        The [`Quantized`][attnlab.caches.quantized.Quantized] codes and ranges.

    Examples:
        >>> q = quantize(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), 8, 4, dim=1)
        >>> q.codes.tolist(), q.scale.tolist()  # 255 levels between 0 and 3
        ([[0, 85, 170, 255]], [[0.01177215576171875]])
    """
    _check_grouping(x.shape, bits, group, dim, "x")
    levels = (1 << bits) - 1
    grouped = _grouped(x, group, dim)
    wide = grouped.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    low, high = wide.amin(dim + 1, keepdim=True), wide.amax(dim + 1, keepdim=True)
    minimum = _half_toward(low, -1)  # at or below every value of its group
    scale = _half_toward((high - minimum.to(wide.dtype)) / levels, +1)  # reaches the top
    if not (torch.isfinite(minimum).all() and torch.isfinite(scale).all()):
        raise ValueError(
            "x has values beyond float16's range (|x| > 65504) or not finite: "
            "the float16 ranges of the groups cannot hold them"
        )
    step = scale.to(wide.dtype).masked_fill(scale == 0, 1.0)  # a constant group: codes 0
    codes = ((wide - minimum.to(wide.dtype)) / step).round().clamp(0, levels)
    codes = codes.to(torch.uint8).reshape(x.shape)
    if bits == 4:
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return Quantized(codes, scale.squeeze(dim + 1), minimum.squeeze(dim + 1))


def dequantize(q: Quantized, bits: Bits, group: int, dim: int, dtype: torch.dtype) -> Tensor:
    r"""$\hat x = q\,s + m$ per group: the inverse of
    [`quantize`][attnlab.caches.quantized.quantize] up to its rounding, in `dtype`.

    Examples:
        >>> x = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
        >>> dequantize(quantize(x, 4, 4, dim=1), 4, 4, dim=1, dtype=torch.float32)
        tensor([[0.0000, 1.0004, 2.0007, 3.0011]])

        (the float16 step is 3/15 rounded up, 0.2002, so that the range covers 3).
    """
    codes = q.codes
    unpacked = (*codes.shape[:-1], codes.shape[-1] * (2 if bits == 4 else 1))
    _check_grouping(torch.Size(unpacked), bits, group, dim, "the codes")
    if bits == 4:  # two codes to a byte, the first in the low half
        codes = torch.stack([codes & 15, codes >> 4], dim=-1).flatten(-2)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    grouped = _grouped(codes.to(wide), group, dim)
    scale, minimum = q.scale.unsqueeze(dim + 1), q.minimum.unsqueeze(dim + 1)
    x = grouped * scale.to(wide) + minimum.to(wide)
    return x.reshape(codes.shape).to(dtype)


class QuantizedKVCache(KVCache):
    r"""A KV cache that keeps keys per channel and values per token in 8 or 4 bits (KIVI).

    Each [`update`][attnlab.caches.kv.KVCache.update] returns every token held, oldest
    first, as attention reads it: the quantized tokens read back from their codes, then
    those still in full precision, so the layer attends over all of them as from any
    other cache (the tokens of the current step always in full precision). After the
    update the cache quantizes as KIVI does:

    - keys per channel (a group is `group` tokens of one channel), so a group can be
      quantized only once its tokens have all come: once the keys in full precision
      number `residual` or more, the oldest are quantized in whole groups, leaving fewer
      than `residual`;
    - values per token (a group is `group` channels of one token): the last `residual`
      values stay in full precision, and each older one is quantized as it leaves them.

    Scales and minima are float16, the minimum rounded down and the scale up so that
    every group's range is covered. Memory per token and key/value head, at $d$
    features, $b$ bits, group $G$: $2 d b/8$ bytes of codes and $2 \cdot 2 \cdot 2\,d/G$
    bytes of ranges, plus up to `residual` tokens of each in the model's dtype; in
    float32 at $d = G = 64$ that is 136 bytes (8 bits) or 72 (4 bits) against 512. What
    shrinks is what is stored between steps: each update reads the whole cache back
    into a float tensor for the layer's kernel.

    Args:
        bits: 8 or 4.
        group: Tokens per key group and channels per value group; it must divide the
            value head size.
        residual: Tokens kept in full precision (KIVI's $R$), a multiple of `group`.

    Raises:
        ValueError: If `bits` is not 4 or 8, a size is not positive, or `residual` is
            not a multiple of `group`; at the first update, if `group` does not divide
            the value head size or, at 4 bits, a head size is odd; at an update, if a
            key or value lies beyond float16's range.

    Examples:
        >>> cache = QuantizedKVCache(bits=8, group=4, residual=4)
        >>> k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
        >>> keys, values = cache.update(k, v)  # this step reads all 6 in full precision
        >>> torch.equal(keys, k), len(cache), cache.quantized  # then 4 keys, 2 values
        (True, 6, (4, 2))
        >>> keys, _ = cache.update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
        >>> float((keys[:, :, :4] - k[:, :, :4]).abs().max()) < 0.05  # read back from 8 bits
        True
    """

    def __init__(self, bits: Bits = 8, group: int = 64, residual: int = 64) -> None:
        self.bits: Bits = _check_bits(bits)
        self.group = check_positive_int("group", group)
        self.residual = check_positive_int("residual", residual)
        if residual % group:
            raise ValueError(
                f"residual={residual} must be a multiple of group={group}: the keys are "
                "quantized in whole groups of tokens"
            )
        self.reset()

    def __repr__(self) -> str:
        return (
            f"QuantizedKVCache(bits={self.bits}, group={self.group}, residual={self.residual}, "
            f"length={self.length})"
        )

    def reset(self) -> None:
        """Forget every token, and the sizes of the first update."""
        self._keys = self._values = None  # the tokens in full precision, (b, h, ·, d)
        self._qkeys: list[Quantized] = []  # one per quantized run of tokens
        self._qvalues: list[Quantized] = []
        self._quantized = (0, 0)  # keys, values
        self._layout: CacheLayout | None = None

    @property
    def quantized(self) -> tuple[int, int]:
        """How many keys and how many values are held in `bits` bits."""
        return self._quantized

    @property
    def length(self) -> int:
        """Tokens held, quantized or not."""
        return self._quantized[0] + (0 if self._keys is None else self._keys.shape[2])

    @property
    def layout(self) -> CacheLayout | None:
        return self._layout

    @property
    def nbytes(self) -> int:
        """Bytes of the codes, the float16 ranges and the tokens in full precision."""
        full = sum(x.nbytes for x in (self._keys, self._values) if x is not None)
        return full + sum(q.nbytes for q in self._qkeys + self._qvalues)

    @property
    def held(self) -> tuple[Tensor, Tensor] | None:
        """Every token's key and value as attention reads them, or None before the first
        update."""
        if self._layout is None or self._keys is None or self._values is None:
            return None
        return self._read(self._keys, self._values, self._layout.dtype)

    def _read(self, keys: Tensor, values: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The quantized tokens read back (the one place they are), then `keys`, `values`."""
        k = [dequantize(q, self.bits, self.group, 2, dtype) for q in self._qkeys]
        v = [dequantize(q, self.bits, self.group, 3, dtype) for q in self._qvalues]
        return torch.cat([*k, keys], dim=2), torch.cat([*v, values], dim=2)

    def _check_sizes(self, key: Tensor, value: Tensor) -> None:
        if value.shape[-1] % self.group:
            raise ValueError(
                f"group={self.group} must divide the value head size v_head_dim="
                f"{value.shape[-1]}: values are quantized in groups of channels"
            )
        if self.bits == 4 and (key.shape[-1] % 2 or value.shape[-1] % 2):
            raise ValueError(
                f"4-bit codes are packed two to a byte: head sizes must be even, got "
                f"head_dim={key.shape[-1]} and v_head_dim={value.shape[-1]}"
            )

    def _append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Return every token held and the new ones; then quantize as KIVI does."""
        if self._layout is None:
            self._check_sizes(key, value)
            b, h, _, d = key.shape
            self._layout = CacheLayout(b, h, d, value.shape[-1], key.dtype, key.device)
        if self._keys is not None and self._values is not None:
            key = torch.cat([self._keys, key], dim=2)  # (b, h, full + t, d)
            value = torch.cat([self._values, value], dim=2)
        out = self._read(key, value, self._layout.dtype)
        n, group, residual = key.shape[2], self.group, self.residual
        keys_out = (n - residual) // group * group + group if n >= residual else 0
        values_out = max(value.shape[2] - residual, 0)  # all but the last `residual`
        if keys_out:  # whole groups of tokens, per channel
            self._qkeys.append(quantize(key[:, :, :keys_out], self.bits, group, dim=2))
        if values_out:  # each token on its own, per token
            self._qvalues.append(quantize(value[:, :, :values_out], self.bits, group, dim=3))
        self._quantized = (self._quantized[0] + keys_out, self._quantized[1] + values_out)
        # Copies: a view would keep the whole concatenation (the quantized tokens) alive.
        self._keys, self._values = key[:, :, keys_out:].clone(), value[:, :, values_out:].clone()
        return out


def _check_bits(bits: object) -> Bits:
    if type(bits) is not int or bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    return 8 if bits == 8 else 4
