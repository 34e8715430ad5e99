r"""A paged KV cache: fixed-size blocks, block tables, prefix sharing and copy-on-write.

A server decodes many sequences at once, of lengths it does not know in advance. A
contiguous cache per sequence must reserve the longest length up front, and most of
that memory holds nothing. PagedAttention (Kwon et al., 2023,
https://arxiv.org/abs/2309.06180, the idea behind vLLM) cuts the cache into *blocks* of
`block_size` tokens taken from one shared pool: a sequence holds only the blocks it
has filled, listed in its *block table*. Three things follow from the indirection:

- memory is wasted only in the last, partly filled block of each sequence;
- a block may appear in several tables: a sequence forked for parallel sampling shares
  all of its parent's blocks, and requests that begin with the same prompt share the
  blocks of that prefix (*prefix caching*), with reference counts saying when a block is
  free again;
- a shared block must not change under the other sequences, so a write into one first
  copies it (*copy-on-write*). Only the last, partly filled block is ever written, so at
  most one block is copied per fork.

The pieces, smallest first: [`BlockAllocator`][attnlab.serving.cache.BlockAllocator] (a
free list and reference counts), [`block_hashes`][attnlab.serving.cache.block_hashes] (the
prefix identity of each full block) and [`PagedKVCache`][attnlab.serving.cache.PagedKVCache]
(the pools, the tables, fork, free and prefix caching). Attention through the tables is
the kernel [`paged_attention`][attnlab.functional.paged.paged_attention].
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from attnlab.caches.kv import kv_buffers
from attnlab.functional.backends import Backend
from attnlab.functional.paged import check_paged, check_tree_mask
from attnlab.functional.paged_fast import paged_attention_fast
from attnlab.rules._precision import autocast_inputs
from attnlab.rules._validation import (
    check_bool,
    check_int_sequence,
    check_nonnegative_int,
    check_positive_int,
    check_rank,
    check_tensor,
    checking,
    entry,
)
from attnlab.rules.rope import default_positions

__all__ = [
    "BlockAllocator",
    "Method",
    "OutOfBlocksError",
    "PagedKVCache",
    "block_hashes",
]

Method = Literal["gather", "online"]
"""How [`paged_attention`][attnlab.functional.paged.paged_attention] reads the blocks."""

_METHODS: tuple[Method, ...] = ("gather", "online")


class OutOfBlocksError(RuntimeError):
    """More blocks were asked for than are free; nothing was allocated or written.

    An engine catches it to preempt a sequence (free it and recompute it later) or to
    wait. `requested` and `free` say how many blocks were asked for and how many were
    free.
    """

    def __init__(self, requested: int, free: int) -> None:
        super().__init__(
            f"out of KV cache blocks: {requested} requested but only {free} free; free a "
            "sequence (or preempt one) first, or build the cache with more blocks"
        )
        self.requested = requested
        self.free = free


def _check_id(name: str, value: object, count: int, what: str) -> int:
    """Return `value` if it is an int in [0, count); raise naming the argument otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if not 0 <= value < count:
        raise ValueError(f"{name} must be in [0, {count}) (the {what}), got {value}")
    return value


class BlockAllocator:
    """A pool of `num_blocks` block ids: a free list and a reference count per block.

    A block is *free* at reference count 0 and *used* above it. `allocate` takes free
    blocks (count 1), `incref` adds a holder to a used block, and `free` removes one; a
    block whose last holder leaves returns to the free list. The free list is kept in the
    order blocks were freed and `allocate` takes the longest-free block first, so a block
    that was just freed keeps its contents as long as possible: a prefix cache can still
    find it and [`take`][attnlab.serving.cache.BlockAllocator.take] it back.

    Args:
        num_blocks: How many blocks the pool has.

    Raises:
        TypeError: If `num_blocks` is not an int.
        ValueError: If it is not positive.

    Examples:
        >>> pool = BlockAllocator(4)
        >>> pool.allocate(3)
        [0, 1, 2]
        >>> pool.incref(1)  # a second sequence shares block 1
        >>> pool.free(1), pool.free(1)  # its holders leave: free once no one holds it
        (False, True)
        >>> pool.num_free_blocks, pool.refcount(0)
        (2, 1)
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = check_positive_int("num_blocks", num_blocks)
        self._refcounts = [0] * num_blocks
        # An OrderedDict is a free list with O(1) removal of any block (take).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        """Blocks no one holds."""
        return len(self._free)

    def refcount(self, block_id: int) -> int:
        """How many holders (sequence table entries) block `block_id` has; 0 when free."""
        return self._refcounts[_check_id("block_id", block_id, self.num_blocks, "block ids")]

    def allocate(self, n: int = 1) -> list[int]:
        """Take `n` free blocks, each with reference count 1.

        Raises:
            OutOfBlocksError: If fewer than `n` blocks are free (nothing is taken).
        """
        n = check_nonnegative_int("n", n)
        if n > len(self._free):
            raise OutOfBlocksError(n, len(self._free))
        taken = [self._free.popitem(last=False)[0] for _ in range(n)]
        for block in taken:
            self._refcounts[block] = 1
        return taken

    def take(self, block_id: int) -> None:
        """Take the particular free block `block_id` (a prefix-cache hit no one holds)."""
        block = _check_id("block_id", block_id, self.num_blocks, "block ids")
        if self._refcounts[block]:
            raise ValueError(f"block_id {block} is in use; incref it to share it")
        del self._free[block]
        self._refcounts[block] = 1

    def incref(self, block_id: int) -> None:
        """Add a holder to the used block `block_id`."""
        block = _check_id("block_id", block_id, self.num_blocks, "block ids")
        if not self._refcounts[block]:
            raise ValueError(f"block_id {block} is free: allocate or take it, not incref")
        self._refcounts[block] += 1

    def free(self, block_id: int) -> bool:
        """Remove a holder of block `block_id`; return whether the block is now free.

        Raises:
            ValueError: If the block is already free (freed twice) or the id is unknown.
        """
        block = _check_id("block_id", block_id, self.num_blocks, "block ids")
        if not self._refcounts[block]:
            raise ValueError(f"block_id {block} is already free (freed twice?)")
        self._refcounts[block] -= 1
        if self._refcounts[block]:
            return False
        self._free[block] = None  # last in line to be reallocated
        return True


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[str]:
    r"""The prefix hash of each full block of `token_ids`: its tokens and all before them.

    Block $i$ holds tokens $i \cdot$ `block_size` to $(i + 1) \cdot$ `block_size` $- 1$;
    its hash is SHA-256 of the hash of block $i - 1$ followed by its own tokens, so two
    blocks have the same hash exactly when their tokens and every token before them
    agree (what attention's keys and values at those positions depend on). A last,
    partly filled block has no hash: it will still change.

    Args:
        token_ids: Token ids of a sequence, ints.
        block_size: Tokens per block.

    Returns:
        One hex digest per full block, `len(token_ids) // block_size` of them.

    Raises:
        TypeError: If a token id or `block_size` is not an int.
        ValueError: If `block_size` is not positive.

    Examples:
        >>> a = block_hashes([1, 2, 3, 4, 5], block_size=2)
        >>> len(a), a == block_hashes([1, 2, 3, 4], 2)
        (2, True)
        >>> b = block_hashes([9, 2, 3, 4], 2)  # same second block, other prefix
        >>> a[1] == b[1]
        False
    """
    block_size = check_positive_int("block_size", block_size)
    return _block_hashes(_token_list(token_ids), block_size)


def _block_hashes(tokens: list[int], block_size: int) -> list[str]:
    """[`block_hashes`][attnlab.serving.cache.block_hashes] of checked arguments."""
    hashes: list[str] = []
    parent = b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        chunk = tokens[start : start + block_size]
        digest = hashlib.sha256(parent)
        digest.update(b"".join(t.to_bytes(8, "little", signed=True) for t in chunk))
        parent = digest.digest()
        hashes.append(digest.hexdigest())
    return hashes


def _token_list(token_ids: object) -> list[int]:
    """`token_ids` checked (any ints, as the hash encodes them signed) and as a list."""
    ids = check_int_sequence("token_ids", token_ids, low=None)
    return ids.tolist() if isinstance(ids, Tensor) else ids


@dataclasses.dataclass
class _Sequence:
    """What the cache knows of one sequence."""

    table: list[int]  # block ids, in token order
    filled: list[int]  # tokens written, per layer
    hashes: list[str]  # prefix hashes of the prompt's full blocks
    registered: int  # leading blocks already matched or offered to the prefix cache


class _BlockPool:
    """The block ids of a paged cache: who holds each, and which prompt prefix each caches.

    It knows ids only, never contents: the cache copies keys and values where a
    copy-on-write says so. A block keeps its prefix hash while it is free, until
    `allocate` hands it out again (longest-free first), so a prompt that returns soon
    still finds it.
    """

    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator
        self._block_of_hash: dict[str, int] = {}
        self._hash_of_block: dict[int, str] = {}

    def allocate(self, n: int) -> list[int]:
        """Allocate n blocks; a block handed out again loses its cached prefix hash."""
        blocks = self.allocator.allocate(n)
        for block in blocks:
            digest = self._hash_of_block.pop(block, None)
            if digest is not None:
                del self._block_of_hash[digest]
        return blocks

    def lookup(self, hashes: Sequence[str]) -> list[int]:
        """The cached blocks of the leading `hashes`, each now held once more."""
        matched: list[int] = []
        for digest in hashes:
            block = self._block_of_hash.get(digest)
            if block is None:
                break
            matched.append(block)
        for block in matched:
            if self.allocator.refcount(block):
                self.allocator.incref(block)
            else:  # freed, contents kept: take it back from the free list
                self.allocator.take(block)
        return matched

    def register(self, hashes: Sequence[str], blocks: Sequence[int]) -> None:
        """Cache each full prompt block under its prefix hash."""
        for digest, block in zip(hashes, blocks, strict=True):
            # The first writer of a prefix is the one cached; a twin written at the same
            # time keeps its block private.
            if digest not in self._block_of_hash and block not in self._hash_of_block:
                self._block_of_hash[digest] = block
                self._hash_of_block[block] = digest

    def keep_registered(self, seq: _Sequence, length: int, block_size: int) -> None:
        """Before `seq` keeps only its first `length` tokens: its registered prompt blocks
        stop at them, and the block `length` falls inside, if `seq` alone holds it and
        will write into it again, leaves the prefix cache, whose hash would no longer
        describe it (a block another sequence holds is copied before any write)."""
        first = length // block_size
        if first < seq.registered and length % block_size:
            block = seq.table[first]
            if self.allocator.refcount(block) == 1 and block in self._hash_of_block:
                del self._block_of_hash[self._hash_of_block.pop(block)]
        seq.registered = min(seq.registered, first)

    def hash_of(self, block: int) -> str | None:
        """The prefix hash `block` is cached under, or None."""
        return self._hash_of_block.get(block)

    def make_private(self, table: list[int], first: int, last: int) -> list[tuple[int, int]]:
        """Make entries [first, last) of `table` present and held by it alone.

        Shared blocks are replaced by fresh ones and new blocks appended, all allocated
        at once (raising before any change); returns the `(old, copy)` pairs whose
        contents the caller must copy.
        """
        shared = [
            i for i in range(first, min(last, len(table))) if self.allocator.refcount(table[i]) > 1
        ]
        new = max(0, last - len(table))
        if not shared and not new:
            return []
        fresh = self.allocate(len(shared) + new)  # all or nothing: raises before a write
        copies = []
        for i, copy in zip(shared, fresh[: len(shared)], strict=True):
            copies.append((table[i], copy))
            self.allocator.free(table[i])  # one holder fewer; the others still hold it
            table[i] = copy
        table.extend(fresh[len(shared) :])
        return copies


class _BlockTables:
    """The sequences of a paged cache by id, and their tables as the tensor attention reads.

    Ids are ints handed out in order and never reused. The padded tables tensor of the
    last batch is kept while no table changed: a decode step reads it in every layer.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sequences: dict[int, _Sequence] = {}
        self._next_id = 0
        self._version = 0  # bumped whenever a table changes or a sequence leaves
        self._memo: tuple[tuple[int, ...], int, Tensor] | None = None

    def add(self, seq: _Sequence) -> int:
        """Hold `seq` under a new id; return the id."""
        seq_id = self._next_id
        self._next_id += 1
        self.sequences[seq_id] = seq
        return seq_id

    def get(self, seq_id: object) -> _Sequence:
        """The sequence `seq_id`; raise naming it if it is not one held."""
        if isinstance(seq_id, bool) or not isinstance(seq_id, int):
            raise TypeError(f"seq_id must be an int, got {seq_id!r} ({type(seq_id).__name__})")
        seq = self.sequences.get(seq_id)
        if seq is not None:
            return seq
        if 0 <= seq_id < self._next_id:
            raise ValueError(f"seq_id {seq_id} was freed already (freed twice, or used after)")
        raise ValueError(f"seq_id {seq_id} is not a sequence of this cache")

    def remove(self, seq_id: int) -> None:
        """Forget sequence `seq_id`."""
        del self.sequences[seq_id]
        self.changed()

    def changed(self) -> None:
        """A table changed: the kept tensor is stale."""
        self._version += 1

    def tensor(self, seq_ids: Sequence[int]) -> Tensor:
        """The tables of `seq_ids` as one `(b, max_blocks)` int64 tensor, padded with 0."""
        tables = [self.get(s).table for s in seq_ids]
        width = max([1, *(len(t) for t in tables)])
        rows = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(rows, dtype=torch.long, device=self.device).reshape(
            len(rows), width
        )  # (b, max_blocks)

    def kept_tensor(self, seq_ids: Sequence[int]) -> Tensor:
        """`tensor(seq_ids)`, reused while no table changed."""
        key = tuple(seq_ids)
        memo = self._memo
        if memo is not None and memo[0] == key and memo[1] == self._version:
            return memo[2]
        tables = self.tensor(seq_ids)
        self._memo = (key, self._version, tables)
        return tables


def _check_kv(key: object, value: object, key_pools: Tensor, value_pools: Tensor) -> None:
    """Check that `key` and `value` are `t` new tokens that fit the pools, naming each."""
    k = check_tensor("key", key)
    v = check_tensor("value", value)
    check_rank("key", k, (3,), "(num_kv_heads, t, head_dim)")
    check_rank("value", v, (3,), "(num_kv_heads, t, v_head_dim)")
    num_kv_heads = key_pools.shape[1]
    want = {"key": (k, key_pools.shape[-1]), "value": (v, value_pools.shape[-1])}
    for name, (x, features) in want.items():
        if x.shape[0] != num_kv_heads or x.shape[2] != features:
            raise ValueError(
                f"{name} must have shape (num_kv_heads={num_kv_heads}, t, "
                f"{features}), got {name}.shape={tuple(x.shape)}"
            )
    if k.shape[1] != v.shape[1]:
        raise ValueError(
            f"key and value must have the same number of tokens t, got "
            f"key.shape={tuple(k.shape)} and value.shape={tuple(v.shape)}"
        )
    for name, x in (("key", k), ("value", v)):
        if x.dtype != key_pools.dtype or x.device != key_pools.device:
            raise ValueError(
                f"{name} is {x.dtype} on {x.device} but the cache holds "
                f"{key_pools.dtype} on {key_pools.device}"
            )


def _write(
    pools: tuple[Tensor, Tensor],
    layer: int,
    table: list[int],
    start: int,
    key: Tensor,
    value: Tensor,
) -> None:
    """Write `t` tokens' keys and values at positions `start, ...` of a sequence into `layer`."""
    key_pools, value_pools = pools
    block_size = key_pools.shape[3]
    if key.shape[1] == 1:  # a decode step: one slot, plain indexing
        block, slot = table[start // block_size], start % block_size
        key_pools[layer, :, block, slot] = key[:, 0]  # (kv, head_dim)
        value_pools[layer, :, block, slot] = value[:, 0]  # (kv, v_head_dim)
        return
    positions = default_positions(start, key.shape[1], key_pools.device)  # (t,)
    table_ = torch.tensor(table, dtype=torch.long, device=key_pools.device)
    blocks = table_[positions // block_size]  # (t,) physical block of each token
    slots = positions % block_size  # (t,) its place in the block
    # Adjacent advanced indices stay in place: pool[:, blocks, slots] is (kv, t, hd).
    key_pools[layer][:, blocks, slots] = key  # (kv, t, head_dim)
    value_pools[layer][:, blocks, slots] = value  # (kv, t, v_head_dim)


class PagedKVCache:
    r"""Keys and values of many sequences in one pool of blocks, for every layer.

    One object holds the pools of all `num_layers` layers, and one block table per
    sequence serves them all, as in vLLM and `transformers`' `PagedAttentionCache`: block
    $i$ of a sequence is block $i$ of its table in each layer's pool, so allocation,
    reference counts, forks and prefix lookups happen once per token, not once per layer.
    Each layer still counts its own written tokens, since a model writes layer by layer:
    [`append`][attnlab.serving.cache.PagedKVCache.append] to layer $l$ writes after what layer $l$
    holds, and the first layer that needs a new block allocates it for all.

    Prefix caching: [`add_sequence`][attnlab.serving.cache.PagedKVCache.add_sequence] takes the
    prompt's token ids and returns how many of them are already cached. A full block of
    a prompt is registered under its [`block_hashes`][attnlab.serving.cache.block_hashes] entry
    once every layer has written it; a later prompt with the same leading blocks starts
    with those blocks in its table (reference counts shared), so an engine computes only
    the rest. At least one prompt token is always left to compute, so that the model
    produces logits for the next token. A freed block keeps its contents and its hash
    until it is handed out again, longest-free first. Only prompt tokens are hashed.

    Copy-on-write: [`fork`][attnlab.serving.cache.PagedKVCache.fork] gives a new sequence the
    same table; the first write into a block that another sequence also holds copies it
    (in every layer) to a fresh block first. Every out-of-blocks condition raises
    [`OutOfBlocksError`][attnlab.serving.cache.OutOfBlocksError] before anything is written or
    allocated.

    Pools: `key_pools` `(num_layers, num_kv_heads, num_blocks, block_size, head_dim)`
    and `value_pools` with `v_head_dim` features, zeros at first (padding positions are
    read, then masked: zeros keep them finite). Heads come before blocks, as in
    PyTorch's `PagedAttention`: gathering a sequence's blocks along dimension 1 yields
    keys in the `(num_kv_heads, ..., tokens, head_dim)` order attention multiplies in,
    with no transpose. Sequence ids are ints handed out in order and never reused.

    Args:
        num_layers: Attention layers.
        num_blocks: Blocks in the pool (each of `block_size` tokens, in every layer).
        block_size: Tokens per block.
        num_kv_heads: Key/value heads per layer.
        head_dim: Features per key.
        v_head_dim: Features per value; defaults to `head_dim`.
        dtype: Element type of the pools.
        device: Where the pools live (default: the CPU).
        prefix_caching: Whether `add_sequence` looks up and registers prompt blocks.

    Raises:
        TypeError: If a size is not an int, `dtype` is not a `torch.dtype` or `device`
            is not a device.
        ValueError: If a size is not positive.

    Examples:
        >>> cache = PagedKVCache(num_layers=1, num_blocks=8, block_size=4, num_kv_heads=2,
        ...                      head_dim=3)
        >>> seq, cached = cache.add_sequence([5, 6, 7, 8, 9])
        >>> k, v = torch.randn(2, 5, 3), torch.randn(2, 5, 3)  # (num_kv_heads, t, head_dim)
        >>> cache.append(seq, 0, k, v)
        >>> cache.block_table(seq), cache.num_free_blocks
        ([0, 1], 6)
        >>> other, cached = cache.add_sequence([5, 6, 7, 8, 1, 2])
        >>> cached, cache.block_table(other)  # the first block is shared
        (4, [0])
        >>> q = torch.randn(2, 4, 1, 3)  # (b, num_heads, t_q, head_dim): GQA, 2 per kv head
        >>> cache.attend(0, q[:1], [seq]).shape
        torch.Size([1, 4, 1, 3])
        >>> cache.free(seq); cache.free(other); cache.num_free_blocks
        8
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        v_head_dim: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        prefix_caching: bool = True,
    ) -> None:
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.block_size = check_positive_int("block_size", block_size)
        self.num_kv_heads = check_positive_int("num_kv_heads", num_kv_heads)
        self.prefix_caching = check_bool("prefix_caching", prefix_caching)
        self.allocator = BlockAllocator(num_blocks)
        self._blocks = _BlockPool(self.allocator)
        shape = (num_layers, num_kv_heads, num_blocks, block_size)
        self.key_pools, self.value_pools = self._pools(shape, head_dim, v_head_dim, dtype, device)
        self.head_dim, self.v_head_dim = head_dim, self.value_pools.shape[-1]
        self._tables = _BlockTables(self.key_pools.device)

    # --- sizes --------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self.allocator.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks that no sequence holds (a freed prefix block counts, cached or not)."""
        return self.allocator.num_free_blocks

    @property
    def nbytes(self) -> int:
        """Bytes of the key and value pools, all layers, used or not."""
        return self.key_pools.nbytes + self.value_pools.nbytes

    @property
    def sequences(self) -> list[int]:
        """Ids of the sequences held, in the order they were added."""
        return list(self._tables.sequences)

    # --- sequences ----------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Tokens the whole cache can hold: `num_blocks * block_size`."""
        return self.num_blocks * self.block_size

    @entry
    def add_sequence(self, token_ids: Sequence[int] | Tensor = ()) -> tuple[int, int]:
        """Start a sequence; return its id and how many of its prompt tokens are cached.

        With prefix caching on, the leading full blocks of `token_ids` that some
        sequence wrote before (and whose blocks were not handed out since) join the new
        sequence's table, and every layer counts them as written: the engine skips the
        prefill of those tokens and appends keys and values from there on. At least one
        token is left uncached. Nothing is allocated for the other tokens until they are
        appended.

        Args:
            token_ids: The prompt's token ids (a sequence of ints or a 1-d integer
                tensor); empty to start a sequence without prefix caching.

        Returns:
            `(seq_id, num_cached_tokens)`; `num_cached_tokens` is a multiple of
            `block_size`.

        Raises:
            TypeError: If `token_ids` is not a sequence of ints.
            ValueError: If the prompt is longer than the whole cache.
        """
        if checking():
            tokens = _token_list(token_ids)
            capacity = self.capacity
            if len(tokens) > capacity:
                raise ValueError(
                    f"token_ids has {len(tokens)} tokens but the cache holds at most "
                    f"{capacity} (num_blocks={self.num_blocks} x block_size={self.block_size})"
                )
        else:  # e.g. the serving engine's call: it checked the prompt when it came in
            tokens = token_ids.tolist() if isinstance(token_ids, Tensor) else list(token_ids)
        hashes = _block_hashes(tokens, self.block_size) if self.prefix_caching else []
        # At least one token is left to compute, for the logits of the next one.
        matched = self._blocks.lookup(hashes[: max(0, len(tokens) - 1) // self.block_size])
        cached = len(matched) * self.block_size
        seq = _Sequence(matched, [cached] * self.num_layers, hashes, registered=len(matched))
        return self._tables.add(seq), cached

    def fork(self, seq_id: int) -> int:
        """A new sequence that shares every block of `seq_id` (copy-on-write); its id.

        Raises:
            ValueError: If `seq_id` is unknown or was freed.
        """
        seq = self._tables.get(seq_id)
        for block in seq.table:
            self.allocator.incref(block)
        return self._tables.add(
            dataclasses.replace(
                seq, table=list(seq.table), filled=list(seq.filled), hashes=list(seq.hashes)
            )
        )

    def free(self, seq_id: int) -> None:
        """Drop sequence `seq_id`; its blocks that no one else holds become free.

        Raises:
            ValueError: If `seq_id` is unknown or was already freed.
        """
        seq = self._tables.get(seq_id)
        for block in seq.table:
            self.allocator.free(block)
        self._tables.remove(seq_id)

    def truncate(self, seq_id: int, length: int) -> None:
        """Keep the first `length` tokens of `seq_id` in every layer and free the blocks
        past them (a speculative step takes back rejected drafts, a failed step what it
        wrote); a prompt block it cuts into leaves the prefix cache. Raises ValueError if
        `seq_id` is unknown or `length` is not in `[0, tokens written]`."""
        seq = self._tables.get(seq_id)
        high = max(seq.filled)
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= high:
            raise ValueError(
                f"length must be an int in [0, {high}] (the tokens written), got {length!r}"
            )
        self._blocks.keep_registered(seq, length, self.block_size)
        seq.filled = [min(n, length) for n in seq.filled]
        keep = -(-length // self.block_size)
        for block in seq.table[keep:]:
            self.allocator.free(block)
        if keep < len(seq.table):
            del seq.table[keep:]
            self._tables.changed()

    def block_table(self, seq_id: int) -> list[int]:
        """The block ids of sequence `seq_id`, in token order (a copy)."""
        return list(self._tables.get(seq_id).table)

    def length(self, seq_id: int, layer: int | None = None) -> int:
        """Tokens of `seq_id` written in `layer`, or in every layer if `layer` is None."""
        seq = self._tables.get(seq_id)
        if layer is None:
            return min(seq.filled)
        return seq.filled[_check_id("layer", layer, self.num_layers, "layers")]

    def block_hash(self, block_id: int) -> str | None:
        """The prefix hash block `block_id` is cached under, or None."""
        return self._blocks.hash_of(_check_id("block_id", block_id, self.num_blocks, "block ids"))

    # --- writing ------------------------------------------------------------------

    @entry
    def append(self, seq_id: int, layer: int, key: Tensor, value: Tensor) -> None:
        """Write the keys and values of `t` new tokens of `seq_id` into `layer`.

        They go after the tokens `layer` holds. Blocks are allocated as needed, and a
        block that another sequence shares is copied first (copy-on-write).

        Args:
            seq_id: The sequence.
            layer: The layer, in `[0, num_layers)`.
            key: Keys, shape `(num_kv_heads, t, head_dim)`, of the pools' dtype and device.
            value: Values, shape `(num_kv_heads, t, v_head_dim)`.

        Raises:
            TypeError: If an id is not an int or `key`/`value` is not a float tensor.
            ValueError: If an id is unknown, or `key`/`value` do not fit the pools (checked
                while [validation][attnlab.set_validation] is on; the ids always).
            OutOfBlocksError: If the blocks needed are not free (nothing is written).
        """
        seq = self._tables.get(seq_id)
        layer = _check_id("layer", layer, self.num_layers, "layers")
        if checking():
            _check_kv(key, value, self.key_pools, self.value_pools)
        start = seq.filled[layer]
        end = start + key.shape[1]
        if end == start:
            return
        bs, size = self.block_size, len(seq.table)
        copies = self._blocks.make_private(seq.table, start // bs, -(-end // bs))
        self._store(seq.table, layer, start, key, value, copies=copies)
        if copies or len(seq.table) != size:
            self._tables.changed()
        seq.filled[layer] = end
        # Offer to the prefix cache the prompt blocks that every layer has filled.
        done = min(min(seq.filled) // bs, len(seq.hashes))
        if done > seq.registered:
            self._blocks.register(
                seq.hashes[seq.registered : done], seq.table[seq.registered : done]
            )
            seq.registered = done

    def _pools(self, shape: tuple[int, ...], *sizes: Any) -> tuple[Tensor, Tensor]:
        return kv_buffers(shape, *sizes)  # zeros, shape + (head_dim,) and (v_head_dim,)

    def _read(self, layer: int, tables: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.key_pools[layer], self.value_pools[layer], tables  # what attention reads

    def _store(self, table: list[int], layer: int, start: int, *kv: Tensor, copies: Any) -> None:
        """Copy each `(old, copy)` block in every layer (copy-on-write), then write `kv`."""
        for old, copy in copies:  # the other holders keep `old`
            self.key_pools[:, :, copy] = self.key_pools[:, :, old]
            self.value_pools[:, :, copy] = self.value_pools[:, :, old]
        _write((self.key_pools, self.value_pools), layer, table, start, *kv)

    # --- reading ------------------------------------------------------------------

    def block_tables(self, seq_ids: Sequence[int]) -> Tensor:
        """The tables of `seq_ids` as one `(b, max_blocks)` int64 tensor, padded with 0.

        Padding entries point at block 0; attention masks them by the lengths.
        """
        return self._tables.tensor(seq_ids)

    def lengths(self, seq_ids: Sequence[int], layer: int) -> Tensor:
        """Tokens written in `layer` for each of `seq_ids`, a `(b,)` int64 tensor."""
        layer = _check_id("layer", layer, self.num_layers, "layers")
        counts = [self._tables.get(s).filled[layer] for s in seq_ids]
        return torch.tensor(counts, dtype=torch.long, device=self.key_pools.device)

    @entry
    def attend(
        self,
        layer: int,
        query: Tensor,
        seq_ids: Sequence[int],
        *,
        query_lengths: Tensor | None = None,
        scale: float | None = None,
        method: Method = "online",
        backend: Backend = "torch",
        tree_mask: Tensor | None = None,
    ) -> Tensor:
        """[`paged_attention`][attnlab.functional.paged.paged_attention] of `query` over `layer`.

        Run by [`paged_attention_fast`][attnlab.functional.paged_fast.paged_attention_fast],
        the same result, faster on the CPU.

        Append the new tokens' keys and values to `layer` first: the queries are the
        last `t_q` (or `query_lengths[i]`) tokens of each sequence.

        Args:
            layer: The layer whose pools to read.
            query: Queries, `(b, num_heads, t_q, head_dim)`, row `i` for `seq_ids[i]`.
            seq_ids: The `b` sequences (the other arguments: as for `paged_attention`).

        Returns:
            `(b, num_heads, t_q, v_head_dim)`.
        """
        lengths = self.lengths(seq_ids, layer)  # checks layer and seq_ids
        key_pool, value_pool, tables = self._read(layer, self._tables.kept_tensor(seq_ids))
        if checking():  # the tables and lengths are the cache's own
            query, key_pool, value_pool = autocast_inputs(query, key_pool, value_pool)
            check_paged(
                query,
                key_pool,
                value_pool,
                tables,
                lengths,
                query_lengths,
                scale,
                method,
                backend,
                own=True,
            )
            check_tree_mask(tree_mask, query)
        return paged_attention_fast(
            query,
            key_pool,
            value_pool,
            tables,
            lengths,
            query_lengths=query_lengths,
            scale=scale,
            method=method,
            backend=backend,
            tree_mask=tree_mask,
        )
