r"""A paged KV cache in 8 or 4 bits: KIVI's groupings, block by block.

[`QuantizedKVCache`][attnlab.caches.quantized.QuantizedKVCache] keeps one sequence's
keys and values in KIVI's form (Liu et al., 2024, https://arxiv.org/abs/2402.02750):
keys per channel, values per token, the newest tokens in full precision.
[`QuantizedPagedKVCache`][attnlab.serving.quantized.QuantizedPagedKVCache] does the same
for the blocks of a [`PagedKVCache`][attnlab.serving.cache.PagedKVCache], whose tables,
prefix cache, forks and copy-on-write it keeps unchanged: only where the numbers live
differs. A block is written in full precision until it is full in a layer; then that
layer's part of it is quantized: its keys per channel over the block's tokens (the key
group is the block: 64 tokens with blocks of 64), its values per token in groups of
`group` channels, every range a float16 minimum and step. The open block of each
sequence, at most `block_size - 1` tokens, is the full-precision window. Attention reads
the blocks of a step through [`dequantize`][attnlab.caches.quantized.dequantize], in one
place ([`read_blocks`][attnlab.serving.quantized.QuantizedPagedKVCache.read_blocks]), then
runs the same paged kernel as the float cache.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnlab.caches.quantized import Bits, Quantized, dequantize, quantize
from attnlab.rules._validation import check_positive_int
from attnlab.serving.cache import PagedKVCache

__all__ = ["QuantizedPagedKVCache"]


class QuantizedPagedKVCache(PagedKVCache):
    """A [`PagedKVCache`][attnlab.serving.cache.PagedKVCache] whose full blocks are kept in
    8 or 4 bits, KIVI's way (see the module).

    Args:
        bits: 8 or 4.
        group: Channels per group of a value (KIVI's per-token groups); it must divide
            `v_head_dim`.
        **sizes: As for [`PagedKVCache`][attnlab.serving.cache.PagedKVCache] (`dtype` is
            the full-precision dtype of the open blocks and of what attention reads).

    Raises:
        ValueError: If `bits` is not 4 or 8, `group` does not divide `v_head_dim`, or
            (at 4 bits) a head size is odd; as `PagedKVCache` otherwise.

    Examples:
        >>> cache = QuantizedPagedKVCache(bits=8, group=4, num_layers=1, num_blocks=4,
        ...                               block_size=4, num_kv_heads=1, head_dim=4)
        >>> seq, _ = cache.add_sequence()
        >>> cache.append(seq, 0, torch.randn(1, 6, 4), torch.randn(1, 6, 4))
        >>> cache.quantized_blocks(0)  # the first block is full; the second is open
        [0]
    """

    def __init__(self, *, bits: Bits = 8, group: int = 64, **sizes: Any) -> None:
        if bits not in (4, 8) or isinstance(bits, bool):
            raise ValueError(f"bits must be 4 or 8, got {bits!r}")
        self.bits: Bits = bits
        self.group = check_positive_int("group", group)
        super().__init__(**sizes)
        if self.v_head_dim % group:
            raise ValueError(
                f"group={group} must divide the value head size v_head_dim={self.v_head_dim}"
            )
        if bits == 4 and (self.head_dim % 2 or self.v_head_dim % 2):
            raise ValueError(
                f"head sizes must be even at 4 bits, got head_dim={self.head_dim}, "
                f"v_head_dim={self.v_head_dim}"
            )
        # Each open block's full-precision keys and values in every layer, and the
        # layers whose part of it is quantized already.
        self._open: dict[int, tuple[Tensor, Tensor, set[int]]] = {}

    def _pools(self, shape: tuple[int, ...], *sizes: Any) -> tuple[Tensor, Tensor]:
        """Codes and float16 ranges in place of float pools; `key_pools`/`value_pools` are
        empty float tensors that say the full-precision dtype and device."""
        head_dim, v_head_dim, dtype, device = sizes
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        layers, kv, blocks, bs = shape
        pack = 2 if self.bits == 4 else 1
        u8, half = (
            {"dtype": torch.uint8, "device": device},
            {"dtype": torch.float16, "device": device},
        )
        self._keys = Quantized(
            torch.zeros(layers, kv, blocks, bs, head_dim // pack, **u8),
            torch.zeros(layers, kv, blocks, 1, head_dim, **half),
            torch.zeros(layers, kv, blocks, 1, head_dim, **half),
        )  # per channel over the block's tokens
        per_token = (layers, kv, blocks, bs, v_head_dim // self.group)
        self._values = Quantized(
            torch.zeros(layers, kv, blocks, bs, v_head_dim // pack, **u8),
            torch.zeros(per_token, **half),
            torch.zeros(per_token, **half),
        )
        empty = (layers, kv, 0, bs)
        return (
            torch.zeros(*empty, head_dim, dtype=dtype, device=device),
            torch.zeros(*empty, v_head_dim, dtype=dtype, device=device),
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the codes and ranges of every block, used or not, and of the open
        blocks' full-precision keys and values."""
        opened = sum(k.nbytes + v.nbytes for k, v, _ in self._open.values())
        return self._keys.nbytes + self._values.nbytes + opened

    def quantized_blocks(self, layer: int) -> list[int]:
        """The blocks held in `layer` as codes (not open), in id order."""
        used = {b for s in self.sequences for b in self.block_table(s)}
        return sorted(b for b in used if b not in self._open or layer in self._open[b][2])

    def _store(self, table: list[int], layer: int, start: int, *kv: Tensor, copies: Any) -> None:
        """Write into the open blocks; quantize this layer's part of each block it fills."""
        for old, copy in copies:  # copy-on-write: codes, ranges and an open block's floats
            for q in (self._keys, self._values):
                for part in q:
                    part[:, :, copy] = part[:, :, old]
            if old in self._open:
                k, v, done = self._open[old]
                self._open[copy] = (k.clone(), v.clone(), set(done))
        key, value = kv
        bs, end = self.block_size, start + key.shape[1]
        for index in range(start // bs, -(-end // bs)):
            block, first = table[index], index * bs
            if block not in self._open:
                self._open[block] = self._fresh()
            k, v, done = self._open[block]
            lo, hi = max(start, first), min(end, first + bs)
            k[layer, :, lo - first : hi - first] = key[:, lo - start : hi - start]
            v[layer, :, lo - first : hi - first] = value[:, lo - start : hi - start]
            if hi == first + bs:  # full in this layer: its codes replace its floats
                self._quantize(layer, block, k[layer], v[layer])
                done.add(layer)
                if len(done) == self.num_layers:
                    del self._open[block]

    def _fresh(self) -> tuple[Tensor, Tensor, set[int]]:
        shape = (self.num_layers, self.num_kv_heads, self.block_size)
        like = self.key_pools
        keys = like.new_zeros(*shape, self.head_dim)
        return keys, like.new_zeros(*shape, self.v_head_dim), set()

    def _quantize(self, layer: int, block: int, keys: Tensor, values: Tensor) -> None:
        """KIVI's groupings of one block `(kv, block_size, features)` in one layer."""
        per_channel = quantize(keys, self.bits, self.block_size, dim=1)
        per_token = quantize(values, self.bits, self.group, dim=2)
        for stored, new in ((self._keys, per_channel), (self._values, per_token)):
            for part, value in zip(stored, new, strict=True):
                part[layer, :, block] = value

    def read_blocks(self, layer: int, blocks: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values of `blocks (n,)` in `layer`, `(kv, n, block_size, features)`
        in the cache's dtype: the one place the codes are read back (open blocks: their
        full-precision numbers)."""
        dtype = self.key_pools.dtype
        keys = dequantize(Quantized(*(p[layer][:, blocks] for p in self._keys)),
                          self.bits, self.block_size, 2, dtype)  # fmt: skip
        values = dequantize(Quantized(*(p[layer][:, blocks] for p in self._values)),
                            self.bits, self.group, 3, dtype)  # fmt: skip
        for block, (k, v, done) in self._open.items():  # few: one per sequence at most
            if layer not in done:
                at = (blocks == block).nonzero().flatten()  # (0 or 1,)
                keys[:, at], values[:, at] = k[layer, :, None], v[layer, :, None]
        return keys, values

    def _read(self, layer: int, tables: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The step's blocks as small float pools
        ([`read_blocks`][attnlab.serving.quantized.QuantizedPagedKVCache.read_blocks]) and
        the tables pointing into them: what the float cache's attention then reads."""
        used, local = torch.unique(tables, return_inverse=True)  # (n,), (b, max_blocks)
        return (*self.read_blocks(layer, used), local)

    def free(self, seq_id: int) -> None:
        """Drop sequence `seq_id`; its blocks that no one else holds become free (an open
        one's full-precision numbers go with it)."""
        table = self.block_table(seq_id)
        super().free(seq_id)
        self._forget_free(table)

    def truncate(self, seq_id: int, length: int) -> None:
        """As [`PagedKVCache.truncate`][attnlab.serving.cache.PagedKVCache.truncate], but
        only back to a block boundary or into an open block: a quantized block cannot
        give back its last tokens exactly.

        Raises:
            ValueError: If `length` falls inside a block quantized in some layer.
        """
        table, bs = self.block_table(seq_id), self.block_size
        if length % bs and length // bs < len(table):
            block = table[length // bs]
            if block not in self._open or self._open[block][2]:
                raise ValueError(
                    f"length={length} falls inside block {block}, already quantized: a "
                    f"quantized cache takes tokens back only to a multiple of {bs}"
                )
        super().truncate(seq_id, length)
        self._forget_free(table)

    def _forget_free(self, blocks: list[int]) -> None:
        """Drop the full-precision numbers of those `blocks` that no sequence holds now."""
        for block in blocks:
            if not self.allocator.refcount(block):
                self._open.pop(block, None)
