r"""Paged attention: attention of new tokens to keys and values read through block tables.

The keys and values of many sequences lie in fixed-size blocks of one shared pool (the
[`PagedKVCache`][attnlab.serving.cache.PagedKVCache] of serving); a block table per
sequence lists its blocks in token order.
[`paged_attention`][attnlab.functional.paged.paged_attention] is a pure function over the
pools and the tables, with two implementations tested equal: one gathers a sequence's
blocks into contiguous keys and values and calls attention; the other walks the table
tile by tile and merges the partial results with FlashAttention's online-softmax rule
([`merge_partials`][attnlab.functional.flash.merge_partials]), never holding a sequence's
cache in one piece.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Literal, NamedTuple, TypedDict, get_args

import torch
from torch import Tensor

from attnlab.functional.backends import Backend, attend, check_backend, takes_mask
from attnlab.functional.flash import merge_partials
from attnlab.rules._precision import autocast_inputs, autocast_kernel, compute_dtype, softmax_scale
from attnlab.rules._validation import (
    check_choice,
    check_features,
    check_index_tensor,
    check_positive_int,
    check_rank,
    check_same_dtype_device,
    check_scale,
    check_tensor,
    checking,
    entry,
    value_checks_enabled,
)
from attnlab.rules.masks import visible
from attnlab.rules.scores import ScoreRule

__all__ = ["Method", "paged_attention"]

Method = Literal["gather", "online"]
"""How [`paged_attention`][attnlab.functional.paged.paged_attention] reads the blocks."""


class PagedOptions(TypedDict, total=False):
    """The keywords of [`paged_attention`][attnlab.functional.paged.paged_attention], for
    the functions that take the same (the fast path); their defaults are there."""

    query_lengths: Tensor | None
    scale: float | None
    method: Method
    blocks_per_tile: int
    backend: Backend
    tree_mask: Tensor | None


# --- attention through the block table --------------------------------------------


@entry
def paged_attention(
    query: Tensor,
    key_pool: Tensor,
    value_pool: Tensor,
    block_tables: Tensor,
    lengths: Tensor,
    *,
    query_lengths: Tensor | None = None,
    scale: float | None = None,
    method: Method = "online",
    blocks_per_tile: int = 32,
    backend: Backend = "torch",
    tree_mask: Tensor | None = None,
) -> Tensor:
    r"""Attention of new tokens to their sequences' cached keys and values, read by block.

    Sequence $b$ holds `lengths[b]` tokens: token $p$ sits in block
    `block_tables[b, p // block_size]` at slot `p % block_size` of the pools. Its last
    `query_lengths[b]` tokens (by default all `t_q`) are the queries, already appended
    to the cache; query $i$ sits at position `lengths[b] - query_lengths[b] + i` and
    sees every key at that position or before it (causal in absolute positions). With
    `t_q = 1` this is a decode step; with more it is a chunk of a prompt (chunked
    prefill) attending to the cached tokens and causally to itself; rows
    `i >= query_lengths[b]` are padding and get zeros, so decode steps and prompt chunks
    of different sizes can share one batch. `num_heads` query heads share the
    `num_kv_heads` key/value heads in groups (grouped-query attention; multi-head when
    they are equal).

    Two methods give the same result:

    - `"gather"`: copy each sequence's blocks into contiguous keys and values
      `(num_kv_heads, b, max_blocks * block_size, head_dim)` and run scaled dot-product
      attention with a mask, on `backend`: PyTorch's fused kernel (`"torch"`) or
      attnlab's
      [`scaled_dot_product_attention`][attnlab.functional.sdpa.scaled_dot_product_attention]
      (`"scratch"`). Easy to read; it materialises every sequence's cache.
    - `"online"`: walk the table `blocks_per_tile` blocks at a time; for each tile,
      gather only that tile's keys and values, compute its partial attention and its
      log-sum-exp, and fold it into the running result with
      [`merge_partials`][attnlab.functional.flash.merge_partials], the online-softmax rule of
      FlashAttention. The memory beyond the output is one tile per sequence. This is
      what paged kernels do, one tile per thread block. Each tile's scores, mask and
      softmax are spelled out, whatever `backend`: merging needs each tile's
      log-sum-exp, which PyTorch's public SDPA does not return.

    This is the readable kernel. The serving engine and the benchmarks run
    [`paged_attention_fast`][attnlab.functional.paged_fast.paged_attention_fast], tested
    equal to it, which on the CPU reads a decode step's keys where they lie and attends
    a prompt chunk's tiles with PyTorch's fused kernel.

    float16 and bfloat16 are computed in float32 and rounded back. Inside
    `torch.autocast` the query and the pools are first cast to the autocast dtype
    (float64 excepted), and so is the result, with either method, as PyTorch's SDPA does
    (cheap when the cache already holds that dtype: a float32 cache is cast whole). No
    dropout, no gradient intended (inference).

    Args:
        query: Queries, shape `(b, num_heads, t_q, head_dim)`.
        key_pool: One layer's key blocks, `(num_kv_heads, num_blocks, block_size,
            head_dim)`, e.g. `PagedKVCache.key_pools[layer]`.
        value_pool: Its value blocks, `(num_kv_heads, num_blocks, block_size, v_head_dim)`.
        block_tables: Block ids, `(b, max_blocks)` integers; entries past a sequence's
            length are padding (any valid id).
        lengths: Tokens in the cache per sequence, the new ones included, `(b,)` integers.
        query_lengths: Real queries per sequence, `(b,)` integers in `[0, t_q]`; default
            `t_q` for all.
        scale: Factor applied to the scores; default $1 / \sqrt{\text{head\_dim}}$.
        method: `"online"` (tile by tile) or `"gather"` (contiguous copy, then SDPA).
        blocks_per_tile: Blocks per tile of the `"online"` method; any positive number
            gives the same result (1: block by block). The default, 32 (512 keys at
            block size 16), was among the fastest of 8 to 64 for 4 sequences of 9
            query and 3 key/value heads of 64 features at 512 to 8192 tokens, on a
            shared 2-core CPU (no clear winner there).
        backend: How the whole copy of `"gather"` is attended: PyTorch's fused kernel
            (`"torch"`) or attnlab's spelled-out one (`"scratch"`).
        tree_mask: `(b, t_q, t_q)` bool, True = attend: which of a sequence's new tokens
            each new query may see, on top of the causal rule; the tokens cached before
            them stay visible to all. A draft tree verified in one pass puts its nodes
            in the cache in order and passes its
            [`tree_mask`][attnlab.models.speculative.tree_mask] here (each node sees its
            ancestors only). Each query must see itself. None: causal only.

    Returns:
        The context vectors, shape `(b, num_heads, t_q, v_head_dim)`.

    Raises:
        TypeError: If a tensor has the wrong kind of dtype or an option the wrong type.
        ValueError: If shapes, dtypes or devices do not fit together, `num_heads` is not
            a multiple of `num_kv_heads`, or (values read, skipped while compiling) a
            length exceeds the table, a query length exceeds `t_q` or its length, or a
            block id is out of range.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> k_pool, v_pool = torch.randn(2, 6, 4, 8), torch.randn(2, 6, 4, 8)  # 6 blocks of 4
        >>> tables = torch.tensor([[5, 2, 0], [1, 4, 3]])  # (b, max_blocks)
        >>> lengths = torch.tensor([7, 12])
        >>> q = torch.randn(2, 6, 1, 8)  # 6 query heads share 2 kv heads
        >>> out = paged_attention(q, k_pool, v_pool, tables, lengths)
        >>> out.shape
        torch.Size([2, 6, 1, 8])
        >>> keys = k_pool[:, tables[0]].reshape(2, 12, 8)[:, :7]  # (kv, 7, head_dim)
        >>> values = v_pool[:, tables[0]].reshape(2, 12, 8)[:, :7]
        >>> sdpa = torch.nn.functional.scaled_dot_product_attention
        >>> torch.allclose(out[0], sdpa(q[0], keys, values, enable_gqa=True), atol=1e-6)
        True
        >>> gather = paged_attention(q, k_pool, v_pool, tables, lengths, method="gather")
        >>> torch.allclose(out, gather, atol=1e-6)
        True
    """
    if checking():
        # Checked as autocast casts them; run_kernel then finds them cast.
        query, key_pool, value_pool = autocast_inputs(query, key_pool, value_pool)
        check_paged(
            query,
            key_pool,
            value_pool,
            block_tables,
            lengths,
            query_lengths,
            scale,
            method,
            backend,
        )
        check_positive_int("blocks_per_tile", blocks_per_tile)
        check_tree_mask(tree_mask, query)
    kernel = _kernel(method, backend, blocks_per_tile, tree_rule(tree_mask, lengths, query_lengths))
    return run_kernel(
        query, key_pool, value_pool, block_tables, lengths, query_lengths, scale, kernel
    )


def _kernel(
    method: Method, backend: Backend, blocks_per_tile: int, tree: Tree | None = None
) -> Kernel:
    """The kernel of `method`, with its options bound."""
    if method == "gather":
        return functools.partial(_gather_attention, backend=backend, tree=tree)
    return functools.partial(_online_attention, blocks_per_tile=blocks_per_tile, tree=tree)


Tree = tuple[Tensor, Tensor]
"""`(tree_mask (b, t_q, t_q), the position of each sequence's first new token (b,))`."""


def tree_rule(
    tree_mask: Tensor | None, lengths: Tensor, query_lengths: Tensor | None
) -> Tree | None:
    """The tree mask with where each sequence's new tokens start (after its cached ones)."""
    if tree_mask is None:
        return None
    new = tree_mask.shape[1] if query_lengths is None else query_lengths
    return tree_mask, lengths - new


def check_tree_mask(tree_mask: object, query: Tensor) -> None:
    if tree_mask is None:
        return
    b, _, t_q, _ = query.shape
    if not isinstance(tree_mask, Tensor):
        raise TypeError(f"tree_mask must be a torch.Tensor, got {type(tree_mask).__name__}")
    mask = tree_mask
    if mask.dtype != torch.bool or tuple(mask.shape) != (b, t_q, t_q):
        raise ValueError(
            f"tree_mask must be a bool tensor (b, t_q, t_q) = ({b}, {t_q}, {t_q}), got "
            f"{mask.dtype} {tuple(mask.shape)}"
        )
    if mask.device != query.device:
        raise ValueError(f"tree_mask is on {mask.device} but query is on {query.device}")
    if value_checks_enabled() and not bool(mask.diagonal(dim1=1, dim2=2).all()):
        raise ValueError("tree_mask must let each new token see itself (its diagonal True)")


def _tree_allowed(tree: Tree | None, key_positions: Tensor, group: int) -> Tensor | bool:
    """Which keys each grouped query row may see under the tree mask, `(b, g * t_q, T)`
    for keys at `key_positions (T,)`: every cached key, and among the new ones those
    the mask allows (True for all without a tree)."""
    if tree is None:
        return True
    mask, starts = tree
    b, t_q, _ = mask.shape
    rel = key_positions[None, :] - starts[:, None]  # (b, T): the key among the new ones
    index = rel.clamp(0, t_q - 1)[:, None, :].expand(b, t_q, -1)  # (b, t_q, T)
    allowed = mask.gather(2, index) | (rel < 0)[:, None, :]  # (b, t_q, T)
    return allowed.repeat(1, group, 1)  # (b, g * t_q, T), rows as _group_queries orders them


class Pages(NamedTuple):
    """What a paged kernel reads: the queries, one layer's pools, and where each query is."""

    query: Tensor  # (b, num_heads, t_q, head_dim)
    key_pool: Tensor  # (num_kv_heads, num_blocks, block_size, head_dim)
    value_pool: Tensor  # (num_kv_heads, num_blocks, block_size, v_head_dim)
    block_tables: Tensor  # (b, max_blocks), int64
    positions: Tensor  # (b, t_q): each query row sees its sequence's keys up to there
    scale: float


Kernel = Callable[[Pages], Tensor]
"""`pages -> out (b, num_heads, t_q, v_head_dim)`: paged attention, after `run_kernel`'s
part (autocast, the positions, the padding rows)."""


@autocast_kernel(inputs=3)
def run_kernel(
    query: Tensor,
    key_pool: Tensor,
    value_pool: Tensor,
    block_tables: Tensor,
    lengths: Tensor,
    query_lengths: Tensor | None,
    scale: float | None,
    kernel: Kernel,
) -> Tensor:
    """What every paged kernel shares: autocast, the scale, the query positions, the padding rows.

    The kernel widens each tile it reads to the compute dtype; the result comes back in the
    query's dtype, as `autocast_kernel` returns it.
    """
    b, h, t_q, e = query.shape
    if b == 0:  # no sequence: nothing to read (and no positions to take a max of)
        return query.new_zeros(0, h, t_q, value_pool.shape[-1])
    positions, real = _query_positions(lengths, query_lengths, t_q)
    block_tables = block_tables.long()  # index_select takes int64 (or int32) ids
    pages = Pages(query, key_pool, value_pool, block_tables, positions, softmax_scale(e, scale))
    out = kernel(pages)
    if real is None:  # no padding rows
        return out
    return out.masked_fill(~real[:, None, :, None], 0.0)  # padding rows: zeros


def _query_positions(
    lengths: Tensor, query_lengths: Tensor | None, t_q: int
) -> tuple[Tensor, Tensor | None]:
    """Position of each query row among its sequence's keys, and which rows are real.

    Both `(b, t_q)`; None for the second when every row is real (no `query_lengths`). A
    padding row takes the position of the sequence's last real query (and at least 0),
    so that it sees key 0: every row of every tile sequence then has a finite
    log-sum-exp from the first tile on, and the row is zeroed at the end.
    """
    if query_lengths is None:  # the last t_q tokens: a decode step when t_q = 1
        offsets = torch.arange(1 - t_q, 1, device=lengths.device)  # (t_q,)
        return (lengths.unsqueeze(1) - 1 + offsets).clamp_min(0), None  # (b, t_q)
    rows = torch.arange(t_q, device=lengths.device)  # (t_q,)
    n = query_lengths
    real = rows < n[:, None]  # (b, t_q)
    last = (n - 1).clamp_min(0)[:, None]  # (b, 1)
    positions = (lengths - n)[:, None] + torch.minimum(rows, last)  # (b, t_q)
    return positions.clamp_min(0), real


def _group_queries(query: Tensor, num_kv_heads: int) -> Tensor:
    """`(b, num_heads, t_q, e)` as `(num_kv_heads, b, group * t_q, e)`.

    The query heads that share a key/value head become rows of one matrix: row
    `r * t_q + i` is query `i` of the group's head `r`, so no key is repeated.
    """
    b, h, t_q, e = query.shape
    grouped = query.reshape(b, num_kv_heads, h // num_kv_heads, t_q, e)  # (b, kv, g, t_q, e)
    g = h // num_kv_heads  # no -1 below: with e = 0 features it would be ambiguous
    return grouped.transpose(0, 1).reshape(num_kv_heads, b, g * t_q, e)  # (kv, b, g * t_q, e)


def _ungroup(out: Tensor, num_heads: int, t_q: int) -> Tensor:
    """`(num_kv_heads, b, group * t_q, e_v)` back to `(b, num_heads, t_q, e_v)`."""
    kv, b, _, e_v = out.shape
    grouped = out.reshape(kv, b, num_heads // kv, t_q, e_v)  # (kv, b, g, t_q, e_v)
    return grouped.transpose(0, 1).reshape(b, num_heads, t_q, e_v)  # (b, h, t_q, e_v)


def _blocks(pool: Tensor, ids: Tensor) -> Tensor:
    """The blocks `ids (b, n)` of `pool (kv, num_blocks, bs, e)`, as `(kv, b, n * bs, e)`.

    One copy (`index_select`, several times faster here than `pool[:, ids]`), and the
    reshape is free: heads first, then sequences, then their tokens in order.
    """
    kv, _, bs, e = pool.shape
    b, n = ids.shape
    return pool.index_select(1, ids.reshape(-1)).view(kv, b, n * bs, e)  # (kv, b, T, e)


def _gather_attention(pages: Pages, backend: Backend, tree: Tree | None = None) -> Tensor:
    """Copy every sequence's blocks into contiguous K/V, then attention with a mask."""
    query, key_pool, value_pool, block_tables, positions, scale = pages
    kv = key_pool.shape[0]
    h, t_q = query.shape[1], query.shape[2]
    keys = _blocks(key_pool, block_tables)  # (kv, b, S, e), S = max_blocks * bs
    values = _blocks(value_pool, block_tables)  # (kv, b, S, e_v)
    key_positions = torch.arange(keys.shape[2], device=query.device)  # (S,)
    rows = positions.repeat(1, h // kv)  # (b, g * t_q), the position of each query row
    seen = visible(rows[:, :, None], key_positions) & _tree_allowed(tree, key_positions, h // kv)
    mask = seen[None]  # (1, b, g * t_q, S)
    q = _group_queries(query, kv)  # (kv, b, g * t_q, e)
    rule = ScoreRule(scale=scale)
    out = attend(backend, q, keys, values, rule, attn_mask=mask)  # (kv, b, g*t_q, e_v)
    return _ungroup(out, h, t_q)  # (b, num_heads, t_q, v_head_dim)


def _online_attention(pages: Pages, blocks_per_tile: int, tree: Tree | None = None) -> Tensor:
    """Tile by tile through the block tables, merging partial results (online softmax).

    Each tile's scores, mask and softmax are spelled out: merging needs each tile's
    log-sum-exp, which PyTorch's public SDPA does not return.
    """
    query, key_pool, value_pool, block_tables, positions, scale = pages
    kv = key_pool.shape[0]
    h, t_q = query.shape[1], query.shape[2]
    wide = compute_dtype(query.dtype)
    # Fold the scale into the queries once.
    q = _group_queries(query.to(wide) * scale, kv)  # (kv, b, g * t_q, e)
    rows = positions.repeat(1, h // kv)  # (b, g * t_q), the position of each query row
    merged = None
    tiles = _tiles(block_tables, block_tables.shape[1], blocks_per_tile, key_pool, value_pool)
    for start, (k, v) in tiles:
        k, v = k.to(wide), v.to(wide)  # (kv, b, T, e), (kv, b, T, e_v)
        scores = q @ k.transpose(-1, -2)  # (kv, b, g * t_q, T)
        key_positions = torch.arange(start, start + k.shape[2], device=query.device)
        seen = visible(rows[:, :, None], key_positions)  # (b, g * t_q, T), broadcast over kv
        seen = seen & _tree_allowed(tree, key_positions, h // kv)
        scores = scores.where(seen, float("-inf"))
        merged = _fold(merged, *_partial_attention(scores, v))
    assert merged is not None  # block_tables has at least one column (checked)
    return _ungroup(merged[0], h, t_q)  # (b, num_heads, t_q, v_head_dim), wide


def _tiles(
    block_tables: Tensor, used: int, blocks_per_tile: int, *pools: Tensor
) -> Iterator[tuple[int, tuple[Tensor, ...]]]:
    """The first `used` blocks of every table, `blocks_per_tile` at a time.

    Yields `(start, tiles)`: the position of the tile's first key and, per pool
    `(kv, num_blocks, bs, e)`, the tile copied out of it, `(kv, b, n * bs, e)`.
    """
    bs = pools[0].shape[2]
    for j0 in range(0, used, blocks_per_tile):
        ids = block_tables[:, j0 : min(j0 + blocks_per_tile, used)]  # (b, n)
        yield j0 * bs, tuple(_blocks(pool, ids) for pool in pools)


def _fold(merged: tuple[Tensor, Tensor] | None, out: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
    """Fold one tile's output and log-sum-exp into the running result (online softmax).

    Without a tree mask the first tile holds key 0, which every query sees; with one, a
    row may have seen no key yet (a new token with nothing cached before it, whose own
    key lies in a later tile): it stays zero with log-sum-exp -inf instead of the NaN
    that merging two empty results would give.
    """
    if merged is None:
        return out, lse
    empty = torch.isneginf(merged[1]) & torch.isneginf(lse)  # (..., t_q)
    out, lse = merge_partials(*merged, out, lse)
    return out.masked_fill(empty[..., None], 0.0), lse.masked_fill(empty, float("-inf"))


def _partial_attention(scores: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """Softmax-weighted values of one tile and the log-sum-exp of its scores.

    A row that sees no key of the tile gets output 0 and log-sum-exp -inf, which
    `merge_partials` then weighs by exp(-inf) = 0.
    """
    lse = scores.logsumexp(dim=-1)  # (..., t_q)
    # Subtract a finite number where a row is all -inf, or -inf - -inf gives NaN.
    finite = lse.masked_fill(torch.isneginf(lse), 0.0)
    weights = torch.exp(scores - finite[..., None])  # (..., t_q, T), 0 where hidden
    return weights @ values, lse  # (..., t_q, e_v), (..., t_q)


def check_paged(
    query: object,
    key_pool: object,
    value_pool: object,
    block_tables: object,
    lengths: object,
    query_lengths: object,
    scale: object,
    method: object,
    backend: object,
    *,
    own: bool = False,
) -> None:
    """The checks of a paged attention call (the last ones read values).

    The callers cast the tensors as autocast does first, so they are checked as the
    kernel will see them (and the kernel then finds them cast); of the options, `blocks_per_tile`
    is paged_attention's alone and checked there. `own=True`: the tables and lengths
    come from a `PagedKVCache`, right by construction; their values are not read
    (query_lengths' still are).
    """
    check_scale("scale", scale)
    check_choice("method", method, get_args(Method))
    if not takes_mask(check_backend(backend)):  # the backends' own rule
        raise ValueError(
            f"backend={backend!r} masks only by position, but paged attention masks by "
            "block table and length; use backend='torch' or 'scratch'"
        )
    q = check_tensor("query", query)
    k = check_tensor("key_pool", key_pool)
    v = check_tensor("value_pool", value_pool)
    check_rank("query", q, (4,), "(b, num_heads, t_q, head_dim)")
    check_rank("key_pool", k, (4,), "(num_kv_heads, num_blocks, block_size, head_dim)")
    check_rank("value_pool", v, (4,), "(num_kv_heads, num_blocks, block_size, v_head_dim)")
    check_same_dtype_device("query", q, key_pool=k, value_pool=v)
    check_features("key_pool", k, q.shape[-1], "query", "head_dim")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"key_pool and value_pool must agree in (num_kv_heads, num_blocks, block_size), "
            f"got key_pool.shape={tuple(k.shape)} and value_pool.shape={tuple(v.shape)}"
        )
    if q.shape[1] % k.shape[0]:
        raise ValueError(
            f"query's num_heads={q.shape[1]} must be a multiple of key_pool's "
            f"num_kv_heads={k.shape[0]} (query.shape={tuple(q.shape)}, "
            f"key_pool.shape={tuple(k.shape)})"
        )
    b = q.shape[0]
    tables = check_index_tensor("block_tables", block_tables, (2,), "(b, max_blocks)")
    n = check_index_tensor("lengths", lengths, (1,), "(b,)")
    given = {"block_tables": tables, "lengths": n}
    if query_lengths is not None:
        given["query_lengths"] = check_index_tensor("query_lengths", query_lengths, (1,), "(b,)")
    for name, x in given.items():
        if x.shape[0] != b:
            raise ValueError(
                f"{name} has {x.shape[0]} rows but query has b={b} sequences "
                f"({name}.shape={tuple(x.shape)}, query.shape={tuple(q.shape)})"
            )
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but query is on {q.device}")
    if tables.shape[1] == 0:
        raise ValueError("block_tables must have at least one column (max_blocks >= 1)")
    if not value_checks_enabled() or b == 0:
        return
    # Reads values: a host sync on an accelerator, skipped while compiling.
    capacity = tables.shape[1] * k.shape[2]
    if not own and (int(n.min()) < 0 or int(n.max()) > capacity):
        raise ValueError(
            f"lengths must be in [0, max_blocks * block_size = {capacity}], got {n.tolist()}"
        )
    if not own and (int(tables.min()) < 0 or int(tables.max()) >= k.shape[1]):
        raise ValueError(
            f"block_tables must hold block ids in [0, num_blocks={k.shape[1]}), got ids "
            f"from {int(tables.min())} to {int(tables.max())}"
        )
    if query_lengths is not None:
        m = given["query_lengths"]
        if int(m.min()) < 0 or bool((m > q.shape[2]).any()) or bool((m > n).any()):
            raise ValueError(
                f"query_lengths must be in [0, min(t_q={q.shape[2]}, lengths)], got "
                f"{m.tolist()} with lengths {n.tolist()}"
            )
    elif bool((n < q.shape[2]).any()):
        raise ValueError(
            f"every sequence must hold its t_q={q.shape[2]} queries' tokens, got lengths "
            f"{n.tolist()}; append them to the cache first, or pass query_lengths"
        )
