r"""Paged attention, fast on the CPU: what the serving engine and the benchmarks run.

[`paged_attention_fast`][attnlab.functional.paged_fast.paged_attention_fast] computes
what [`paged_attention`][attnlab.functional.paged.paged_attention] computes, the tests
hold the two equal, and it runs the readable kernel wherever none of its own applies.
Two kernels are its own, for inference on the CPU:

- a decode step (one query per sequence, float32 or float64, contiguous pools) copies
  nothing: the block tables are a sparsity pattern over the pools' rows, the scores a
  product sampled at that pattern (`torch.sparse.sampled_addmm`, each key read where it
  lies), one softmax follows over the few scores, and `embedding_bag` sums the value
  rows through the same pattern;
- otherwise (a prompt chunk, or half precision) a tile of the online method goes through
  PyTorch's fused CPU attention kernel, which returns the log-sum-exp as well, so a
  tile's keys are read once while they are still in the processor's cache; tiles wholly
  past every query are skipped and a tile that every query sees whole gets no mask.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Unpack

import torch
from torch import Tensor

from attnlab.functional.backends import attend
from attnlab.functional.paged import (
    Kernel,
    PagedOptions,
    Pages,
    _fold,
    _group_queries,
    _kernel,
    _online_attention,
    _tiles,
    _ungroup,
    run_kernel,
    tree_rule,
)
from attnlab.rules import masks
from attnlab.rules._precision import autocast_inputs, compute_dtype
from attnlab.rules.masks import visible
from attnlab.rules.scores import ScoreRule

__all__: list[str] = []  # paged_attention_fast is unchecked: its callers check first


def paged_attention_fast(
    query: Tensor,
    key_pool: Tensor,
    value_pool: Tensor,
    block_tables: Tensor,
    lengths: Tensor,
    **options: Unpack[PagedOptions],
) -> Tensor:
    """[`paged_attention`][attnlab.functional.paged.paged_attention], fast on the CPU.

    The same arguments (the keywords of `PagedOptions`, with `paged_attention`'s
    defaults) and the same result (to float round-off), without the checks:
    its callers check first
    ([`PagedKVCache.attend`][attnlab.serving.cache.PagedKVCache.attend] does). With
    `method="online"` and `backend="torch"`, on the CPU, without gradient and not
    compiling, it runs the module's own kernels; otherwise `paged_attention`'s.
    """
    method, backend = options.get("method", "online"), options.get("backend", "torch")
    blocks_per_tile = options.get("blocks_per_tile", 32)
    tree = tree_rule(options.get("tree_mask"), lengths, options.get("query_lengths"))
    kernel: Kernel
    if tree is not None:  # a draft tree's mask: the readable kernels take it
        kernel = _kernel(method, backend, blocks_per_tile, tree)
    elif (
        method != "online" or backend != "torch" or not _host_inference(query, key_pool, value_pool)
    ):
        kernel = _kernel(method, backend, blocks_per_tile)
    else:
        # The kernel is chosen for the dtype it will see: cast as autocast casts first.
        query, key_pool, value_pool = autocast_inputs(query, key_pool, value_pool)
        fast: Callable[..., Tensor] = _online_attention
        if _sparse_decode(query, key_pool, value_pool):
            fast = _decode_attention
        elif key_pool.shape[-1] == value_pool.shape[-1]:  # the fused kernel takes one e
            fast = _fused_online_attention
        kernel = functools.partial(fast, blocks_per_tile=blocks_per_tile)
    query_lengths, scale = options.get("query_lengths"), options.get("scale")
    return run_kernel(
        query, key_pool, value_pool, block_tables, lengths, query_lengths, scale, kernel
    )


# PyTorch's fused CPU attention (what SDPA runs on the CPU), which also returns the
# log-sum-exp of each query's scores: what merging tiles needs, and what the public SDPA
# does not return. A private op, so it lives here and not in the teaching kernel. The
# public alternative, the used blocks gathered whole and one public SDPA call, is as fast
# at short contexts but not at long ones, measured (PyTorch 2.13, one thread of a shared
# 2-core CPU, 4 sequences, 9 query heads over 3 kv heads of 64, blocks of 16, median of
# 15): 12.7 ms against 20.4 for a bfloat16 decode step at 8192 tokens, 56 against 129 for
# a 16-token float32 chunk at 8192, 197 against 240 for a 128-token chunk at 8192 (at 512
# tokens: 0.58 against 0.56, 3.0 against 2.0, 12.3 against 12.3).
_CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _host_inference(query: Tensor, key_pool: Tensor, value_pool: Tensor) -> bool:
    """Whether the CPU paths may serve the step: on the CPU, no gradient, not compiling."""
    wants_grad = query.requires_grad or key_pool.requires_grad or value_pool.requires_grad
    return (
        query.device.type == "cpu"
        and not (torch.is_grad_enabled() and wants_grad)
        and not torch.compiler.is_compiling()  # they read positions on the host
    )


def _sparse_decode(query: Tensor, key_pool: Tensor, value_pool: Tensor) -> bool:
    """Whether `_decode_attention` serves the step: one query, float32/64, whole pools."""
    return (
        query.shape[2] == 1
        and query.dtype in (torch.float32, torch.float64)
        and key_pool.is_contiguous()
        and value_pool.is_contiguous()
    )


def _reach(positions: Tensor, max_blocks: int, block_size: int) -> tuple[int, int]:
    """The first query position, and how many leading blocks of the tables any query sees.

    Reads the positions on the host (free on the CPU).
    """
    low, high = positions.aminmax()
    return int(low), min(max_blocks, int(high) // block_size + 1)


def _decode_attention(pages: Pages, blocks_per_tile: int) -> Tensor:
    """One query per sequence, reading every key and value where it lies in the pool.

    The block tables are a sparsity pattern over the pools' rows: query head `k` of
    sequence `i` needs the rows that hold sequence `i`'s tokens in the kv head of `k`'s
    group. The scores are then a *sampled* product, computed only at that pattern
    (`torch.sparse.sampled_addmm`: one dot product per entry, each key read where it
    lies), the softmax runs over the few scores, and `embedding_bag` sums the value
    rows through the same pattern, weighted by the softmax. Nothing is copied out of
    the pools. A row of the pattern is one tile (`blocks_per_tile` blocks) for one
    query head, and the heads of a group take the same tile one after the other, so
    they reread its keys and values while these are still in the processor's cache.
    """
    query, key_pool, value_pool, block_tables, positions, scale = pages
    kv, num_blocks, bs, e = key_pool.shape
    b, h = query.shape[0], query.shape[1]
    g = h // kv
    first, used = _reach(positions, block_tables.shape[1], bs)
    per_tile = min(blocks_per_tile, used)
    c = -(-used // per_tile)  # tiles
    tables = block_tables[:, :used]
    if c * per_tile > used:  # the last tile is padded with block 0, hidden below
        tables = torch.nn.functional.pad(tables, (0, c * per_tile - used))
    n = per_tile * bs  # keys per tile
    t = c * n
    n_rows = kv * num_blocks * bs  # rows of a pool viewed as (n_rows, features)
    ids = torch.int32 if n_rows < 2**31 else torch.long
    # The row holding token p of sequence i in kv head j: the first row of its block
    # plus j * num_blocks * bs + p % bs (`within`), the same for each head of j's group.
    firsts = tables.to(ids).mul(bs).view(b, 1, c, 1, per_tile, 1)
    within = _rows_within(kv, g, num_blocks, bs, ids, query.device)  # (1, kv, 1, g, 1, bs)
    rows = (firsts + within).view(-1)  # b * h * T, in the order (i, j, c, r, block, slot)
    starts = torch.arange(0, rows.numel() + 1, n, dtype=ids, device=query.device)
    pattern = _csr(starts, rows, (b * kv * c * g, n_rows), query.dtype)  # row (i, j, c, r)
    # One query per row (no -1 in the shape: with e = 0 features it would be ambiguous).
    q = query.reshape(b, kv, 1, g, e).expand(b, kv, c, g, e).reshape(b * kv * c * g, e)
    keys = key_pool.view(n_rows, e)
    # In place (out=pattern): the pattern's zeros become the scores, nothing is copied.
    torch.sparse.sampled_addmm(pattern, q, keys.t(), beta=0.0, alpha=scale, out=pattern)
    scores = pattern.values().view(b, kv, c, g, n).transpose(2, 3).reshape(b, h, t)
    if not visible(first, t - 1):  # some sequence is shorter than the blocks read
        seen = visible(positions, torch.arange(t, device=query.device))  # (b, T)
        scores = scores.where(seen[:, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (b, h, T), back in the pattern's order:
    weights = weights.view(b, kv, g, c, n).transpose(2, 3).reshape(-1)
    out = torch.nn.functional.embedding_bag(
        rows,
        value_pool.view(n_rows, value_pool.shape[-1]),
        starts,
        mode="sum",
        per_sample_weights=weights,
        include_last_offset=True,
    )  # (b * kv * c * g, v_head_dim): each tile's weighted sum
    out = out.view(b, kv, c, g, -1).sum(dim=2) if c > 1 else out
    return out.view(b, h, 1, -1)  # (b, num_heads, 1, v_head_dim)


@functools.lru_cache(maxsize=16)
def _rows_within(
    kv: int, g: int, num_blocks: int, bs: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """`j * num_blocks * bs + s` for kv head j and slot s, `(1, kv, 1, g, 1, bs)`.

    Repeated for the `g` query heads of each group, so that adding a step's block
    offsets gives the pattern's column indices in their final order in one operation.
    The same few numbers every step, so they are kept (read only).
    """
    heads = torch.arange(0, kv * num_blocks * bs, num_blocks * bs, dtype=dtype, device=device)
    slots = torch.arange(bs, dtype=dtype, device=device)
    within = (heads[:, None] + slots).view(1, kv, 1, 1, 1, bs)
    return within.expand(1, kv, 1, g, 1, bs).contiguous()


@functools.cache
def _spend_csr_beta_warning() -> None:
    """Build one empty CSR tensor with PyTorch's beta warning silenced.

    PyTorch warns once per process that sparse CSR support is in beta, which is no news
    here; spent once, silenced, it is not raised again, so later patterns need no
    `warnings.catch_warnings` (which edits the process's filters at every call).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
        none = torch.zeros(0, dtype=torch.long)
        torch.sparse_csr_tensor(
            none.new_zeros(2), none, none.float(), (1, 1), check_invariants=False
        )


def _csr(starts: Tensor, columns: Tensor, size: tuple[int, int], dtype: torch.dtype) -> Tensor:
    """A sparse CSR pattern of zeros with the given row starts and column indices.

    Built without PyTorch's O(nnz) invariant check (the indices are ours).
    """
    _spend_csr_beta_warning()
    values = torch.zeros(columns.numel(), dtype=dtype, device=columns.device)
    return torch.sparse_csr_tensor(starts, columns, values, size=size, check_invariants=False)


def _fused_online_attention(pages: Pages, blocks_per_tile: int) -> Tensor:
    """`_online_attention` with each tile attended by PyTorch's fused CPU kernel.

    Reads the positions on the host (free on the CPU) to skip the tiles no query sees
    and the masks of tiles every query sees whole: a decode step of equal lengths
    builds no mask at all, and one that fits in a tile needs no log-sum-exp either.
    """
    query, key_pool, value_pool, block_tables, positions, scale = pages
    kv, _, bs, _ = key_pool.shape
    h, t_q = query.shape[1], query.shape[2]
    wide = compute_dtype(query.dtype)
    q = _group_queries(query.to(wide), kv)  # (kv, b, g * t_q, e)
    first, used = _reach(positions, block_tables.shape[1], bs)
    # The position of each query row, (b, g * t_q); needed only where a tile is masked.
    rows = positions if visible(first, used * bs - 1) else positions.repeat(1, h // kv)
    merged = None
    for start, (k, v) in _tiles(block_tables, used, blocks_per_tile, key_pool, value_pool):
        k, v = k.to(wide), v.to(wide)  # (kv, b, T, e), (kv, b, T, e_v)
        end = start + k.shape[2]
        seen = None
        if not visible(first, end - 1):  # some query does not see every key of the tile
            key_positions = torch.arange(start, end, device=query.device)  # (T,)
            seen = visible(rows[:, :, None], key_positions)[None]  # (1, b, g * t_q, T)
        if used <= blocks_per_tile:  # one tile, which holds key 0: no merging
            rule = ScoreRule(scale=scale)
            out = attend("torch", q, k, v, rule, attn_mask=seen)  # (kv, b, g*t_q, e_v)
            return _ungroup(out, h, t_q)  # (b, num_heads, t_q, v_head_dim), wide
        mask = None
        if seen is not None:  # the kernel takes an additive mask of the query's dtype
            mask = masks.allowed_to_additive(seen, wide)  # (1, b, g * t_q, T)
        tile_out, tile_lse = _CPU_FLASH(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
        tile_lse = tile_lse.to(wide)  # (kv, b, g * t_q)
        if not visible(first, start):  # a row may see none of the tile's keys: the
            # kernel gives it lse 0, and it must be -inf (it does not see the first key)
            tile_lse = tile_lse.where(visible(rows, start)[None], float("-inf"))
        merged = _fold(merged, tile_out, tile_lse)
    assert merged is not None  # block_tables has at least one column (checked)
    return _ungroup(merged[0], h, t_q)  # (b, num_heads, t_q, v_head_dim), wide
