r"""Ring attention: exact attention over a sequence sharded across processes.

When one sequence no longer fits one device, context parallelism splits it along the
positions: each of $P$ ranks holds $T/P$ queries, keys and values. Attention needs every
key for every query, so the key/value blocks travel around a ring of ranks: at each of
$P$ steps a rank attends its queries to the block it holds, and meanwhile sends that block
to the next rank and receives the next one from the previous rank (Ring Attention, Liu et
al., 2023, https://arxiv.org/abs/2310.01889). The partial results of the steps are merged
with the online-softmax rule of FlashAttention, so nothing of size $T \times T$, nor even
the whole sequence, is ever held by one rank.

The attention of one query block to one key block is `attnlab.functional.flash`'s tiled kernel,
reused as is: its forward returns the output and the log-sum-exp of each row, which is
all the merge needs, and its backward accumulates the gradients of a block given the
final output and log-sum-exp, which is all the ring backward needs; its causal and
sliding-window rules, placed at a block's global positions, mask the blocks that need a
mask. Precision follows the package's one rule (`attnlab.rules._precision`): blocks are
attended in at least float32, and autocast casts the inputs as it casts those of
PyTorch's attention. The chapter "Attention across devices" explains the schedule, the
merge, the causal load balancing and the sliding window.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any, Literal, NamedTuple, get_args

import torch
import torch.distributed as dist
from torch import Tensor

from attnlab.functional.flash import (
    FlashOptions,
    flash_backward,
    flash_forward,
    key_range,
    merge_partials,
    tile_kind,
)
from attnlab.rules._precision import autocast_kernel, autocast_off, compute_dtype, softmax_scale
from attnlab.rules._validation import (
    check_bool,
    check_choice,
    check_positive_int,
    check_qkv,
    check_scale,
    is_validation_enabled,
)
from attnlab.rules.masks import check_window, is_causal_window

__all__ = [
    "RingStats",
    "ShardLayout",
    "ring_attention",
    "shard_ranges",
    "shard_sequence",
    "unshard_sequence",
]

ShardLayout = Literal["contiguous", "zigzag"]
"""How a sequence is split over the ranks: `"contiguous"` or `"zigzag"`."""


_KV_TAG, _DKV_TAG = 0, 1
# shard_sequence records on each shard the positions it holds, so that ring_attention
# can tell a shard cut with one layout from a shard cut with another even when their
# lengths agree: (length of the whole sequence, ((start, end), ...)).
_POSITIONS = "_attnlab_shard_positions"


# --8<-- [start:layout]
def shard_ranges(
    length: int, world_size: int, layout: ShardLayout = "contiguous"
) -> list[list[tuple[int, int]]]:
    """The positions `[start, end)` of a sequence that each rank holds, in local order.

    The sequence is cut into chunks whose lengths differ by at most one (the first
    `length % chunks` chunks are one longer, as in `torch.tensor_split`).
    `"contiguous"` cuts it into `world_size` chunks and gives chunk `r` to rank `r`.
    `"zigzag"` cuts it into `2 * world_size` chunks and gives rank `r` chunks `r` and
    `2 * world_size - 1 - r`, one from each end, so that under a causal mask every rank
    has about the same number of (query, key) pairs to compute.

    Args:
        length: Number of positions `T` of the whole sequence.
        world_size: Number of ranks `P`.
        layout: `"contiguous"` or `"zigzag"`.

    Returns:
        For each rank, the list of its `(start, end)` ranges; its local tensor is their
        concatenation along the sequence.

    Raises:
        TypeError: If `length` or `world_size` is not an int.
        ValueError: If `world_size` is not positive, `length` is negative, or `layout` is
            unknown.

    Examples:
        >>> shard_ranges(10, 2)
        [[(0, 5)], [(5, 10)]]
        >>> shard_ranges(10, 2, "zigzag")
        [[(0, 3), (8, 10)], [(3, 6), (6, 8)]]
    """
    if isinstance(length, bool) or not isinstance(length, int):
        raise TypeError(f"length must be an int, got {length!r} ({type(length).__name__})")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    check_positive_int("world_size", world_size)
    check_choice("layout", layout, get_args(ShardLayout))
    chunks = world_size if layout == "contiguous" else 2 * world_size
    base, extra = divmod(length, chunks)
    bounds = [0]
    for i in range(chunks):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    if layout == "contiguous":
        return [[(bounds[r], bounds[r + 1])] for r in range(world_size)]
    last = chunks - 1
    return [
        [(bounds[r], bounds[r + 1]), (bounds[last - r], bounds[last - r + 1])]
        for r in range(world_size)
    ]


# --8<-- [end:layout]


def shard_sequence(
    x: Tensor, world_size: int, rank: int, *, layout: ShardLayout = "contiguous", dim: int = -2
) -> Tensor:
    """The part of `x` that `rank` holds under `layout`.

    The ranges are those of [`shard_ranges`][attnlab.distributed.shard_ranges].

    Args:
        x: The whole sequence, e.g. queries of shape `(..., T, E)`.
        world_size: Number of ranks `P`.
        rank: This rank, `0 <= rank < world_size`.
        layout: `"contiguous"` or `"zigzag"`.
        dim: The sequence dimension of `x`; default the second to last.

    Returns:
        The local shard: the ranges of `rank` concatenated along `dim` (a copy). When
        `dim` is the second to last, the shard remembers which positions it holds, and
        [`ring_attention`][attnlab.distributed.ring_attention] checks them against its
        own `layout`. The record is lost by operations that make a new tensor
        (`.detach()`, `.to(dtype)`); `.requires_grad_()` keeps it.

    Raises:
        ValueError: If `rank` is not in `[0, world_size)`, or `layout` is unknown.

    Examples:
        >>> x = torch.arange(10.0).reshape(1, 10, 1)
        >>> shard_sequence(x, 2, 1, layout="zigzag").flatten().tolist()
        [3.0, 4.0, 5.0, 6.0, 7.0]
    """
    ranges = shard_ranges(x.shape[dim], world_size, layout)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    shard = torch.cat([x.narrow(dim, start, end - start) for start, end in ranges[rank]], dim)
    if x.ndim >= 2 and dim in (-2, x.ndim - 2):
        setattr(shard, _POSITIONS, (x.shape[dim], tuple(ranges[rank])))
    return shard


def unshard_sequence(
    shards: Sequence[Tensor], *, layout: ShardLayout = "contiguous", dim: int = -2
) -> Tensor:
    """Put the shards of all ranks back into one sequence; the inverse of `shard_sequence`.

    Args:
        shards: The local tensors of ranks `0, 1, ..., P - 1`, in that order.
        layout: The layout they were sharded with.
        dim: The sequence dimension.

    Returns:
        The whole sequence, of length the sum of the shards' lengths.

    Raises:
        ValueError: If `shards` is empty, or their lengths are not those that
            `shard_ranges` gives for their total.

    Examples:
        >>> x = torch.arange(7.0).reshape(1, 7, 1)
        >>> parts = [shard_sequence(x, 3, r, layout="zigzag") for r in range(3)]
        >>> torch.equal(unshard_sequence(parts, layout="zigzag"), x)
        True
    """
    if len(shards) == 0:
        raise ValueError("shards must hold at least one tensor, got an empty sequence")
    lengths = [s.shape[dim] for s in shards]
    ranges = shard_ranges(sum(lengths), len(shards), layout)
    expected = [sum(end - start for start, end in r) for r in ranges]
    if lengths != expected:
        raise ValueError(
            f"shards have lengths {lengths} along dim {dim}, but layout {layout!r} of "
            f"{sum(lengths)} positions over {len(shards)} ranks gives {expected}"
        )
    pieces: list[tuple[int, Tensor]] = []
    for shard, rank_ranges in zip(shards, ranges, strict=True):
        offset = 0
        for start, end in rank_ranges:
            pieces.append((start, shard.narrow(dim, offset, end - start)))
            offset += end - start
    return torch.cat([p for _, p in sorted(pieces, key=lambda item: item[0])], dim)


# --8<-- [end:merge]


@dataclasses.dataclass
class RingStats:
    """What one rank did in `ring_attention` calls; pass one as `stats=` to fill it.

    Counters add up over calls, forward and backward.

    Attributes:
        score_entries: (query, key) scores computed, per batch and head entry; the
            measure of work that causal load balancing evens out.
        bytes_sent: Bytes this rank sent to its ring neighbour.
        bytes_received: Bytes it received from the other one.
        compute_seconds: Wall time in the attention of blocks (and merges).
        wait_seconds: Wall time blocked on communication that compute did not hide.
    """

    score_entries: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    compute_seconds: float = 0.0
    wait_seconds: float = 0.0


class _Tile(NamedTuple):
    """One tile of a ring step: the query piece, its rows, the key columns in hand."""

    piece: int  # index of the query piece among the rank's own
    rows: slice  # of the local queries
    cols: slice  # of the block in hand
    options: FlashOptions  # the flash kernel's options for the tile


@dataclasses.dataclass(frozen=True)
class _Ring:
    """Everything a rank knows about the ring, fixed for one call."""

    group: dist.ProcessGroup | None
    rank: int
    size: int
    ranges: list[list[tuple[int, int]]]
    n: int
    e: int
    e_v: int
    is_causal: bool  # True with a window too: a window is causal
    window: int | None
    steps: int  # ring steps that some rank needs; P unless a window hides the rest
    scale: float
    block_q: int
    block_k: int
    stats: RingStats

    def pieces(self, rank: int) -> list[tuple[int, int, int]]:
        """(start, end, local offset) of each range of `rank`."""
        out, offset = [], 0
        for start, end in self.ranges[rank]:
            out.append((start, end, offset))
            offset += end - start
        return out

    def length(self, rank: int) -> int:
        return sum(end - start for start, end in self.ranges[rank])

    def kv_numel(self, rank: int) -> int:
        return self.n * self.length(rank) * (self.e + self.e_v)

    def wide(self, x: Tensor) -> Tensor:
        """A block in the dtype attention is computed in (a no-op if it is already)."""
        return x.to(compute_dtype(x.dtype))

    def exchange(self, send: Tensor, recv: Tensor, tag: int, hops: int = 1) -> list[Any]:
        """Start sending `send` `hops` ranks on and receiving `recv` from `hops` ranks back.

        One hop is the ring's step to the next rank; more is a shortcut home.
        """
        to, source = (self.rank + hops) % self.size, (self.rank - hops) % self.size
        ops = [
            dist.P2POp(dist.isend, send, group=self.group, group_peer=to, tag=tag),
            dist.P2POp(dist.irecv, recv, group=self.group, group_peer=source, tag=tag),
        ]
        self.stats.bytes_sent += send.numel() * send.element_size()
        self.stats.bytes_received += recv.numel() * recv.element_size()
        return list(dist.batch_isend_irecv(ops))

    def tiles(self, mine: list[tuple[int, int, int]], source: int) -> Iterator[_Tile]:
        """The (query piece, key piece) pairs of a step that some query sees.

        FlashAttention's tile rule at the blocks' global positions: a key chunk no query
        sees is skipped, one the diagonal or the window's edge crosses is masked. Counts
        the score entries of each tile it yields.
        """
        for i, (q0, q1, qo) in enumerate(mine):
            for k0, k1, ko in self.pieces(source):
                kind = tile_kind(q0, q1, k0, k1, is_causal=self.is_causal, window=self.window)
                if kind == "none":
                    continue
                self.stats.score_entries += _work(kind, q1 - q0, k1 - k0, q0 - k0, self.window)
                masked = kind == "masked"
                options = FlashOptions(
                    is_causal=masked,
                    scale=self.scale,
                    block_q=self.block_q,
                    block_k=self.block_k,
                    window=self.window if masked else None,
                    offset=q0 - k0 if masked else 0,
                )
                yield _Tile(i, slice(qo, qo + q1 - q0), slice(ko, ko + k1 - k0), options)

    def wait(self, requests: list[Any]) -> None:
        start = time.perf_counter()
        for request in requests:
            request.wait()
        self.stats.wait_seconds += time.perf_counter() - start


def _work(kind: str, rows: int, cols: int, offset: int, window: int | None) -> int:
    """(query, key) pairs a block shows: all, none, or those of the causal/window band."""
    if kind != "masked":
        return rows * cols if kind == "full" else 0
    # Each query's positions among the keys; what it sees is FlashAttention's key range.
    return sum(len(key_range(i, i + 1, cols, True, window)) for i in range(offset, offset + rows))


def _steps(ranges: list[list[tuple[int, int]]], is_causal: bool, window: int | None) -> int:
    """How many ring steps some rank needs: 1 + the last step it attends to a block at.

    After that step no rank sees a key of the block it would receive, so the ring stops.
    Every rank computes this from the same ranges and flags, and so agrees on it.
    """
    size, last = len(ranges), 0
    for rank in range(size):
        for step in range(size):
            source = (rank - step) % size
            if any(
                tile_kind(q0, q1, k0, k1, is_causal=is_causal, window=window) != "none"
                for q0, q1 in ranges[rank]
                for k0, k1 in ranges[source]
            ):
                last = max(last, step)
    return last + 1


def _pack(k: Tensor, v: Tensor) -> Tensor:
    """K and V of a block in one flat buffer, so that one message carries both."""
    return torch.cat([k.reshape(-1), v.reshape(-1)])


def _unpack(buf: Tensor, n: int, length: int, e: int, e_v: int) -> tuple[Tensor, Tensor]:
    split = n * length * e
    return buf[:split].view(n, length, e), buf[split:].view(n, length, e_v)


# --8<-- [start:forward]
def _ring_forward(ring: _Ring, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Out (n, t, Ev) and log-sum-exp (n, t) of the local queries over the whole sequence.

    Keys and values travel in their own dtype; out and lse are in the compute dtype.
    """
    mine = ring.pieces(ring.rank)
    partial: list[tuple[Tensor, Tensor] | None] = [None] * len(mine)
    q = ring.wide(q)
    buf = _pack(k, v)  # the block in hand: ours at step 0, then our ring neighbours'
    for step in range(ring.steps):
        source = (ring.rank - step) % ring.size  # whose keys and values `buf` holds
        requests: list[Any] = []
        if step < ring.steps - 1:
            # Pass the block on while we compute with it: the next one arrives meanwhile.
            incoming = buf.new_empty(ring.kv_numel((source - 1) % ring.size))
            requests = ring.exchange(buf, incoming, _KV_TAG)
        start = time.perf_counter()
        k_src, v_src = _unpack(ring.wide(buf), ring.n, ring.length(source), ring.e, ring.e_v)
        for i, rows, cols, options in ring.tiles(mine, source):
            q_tile = q[:, rows]
            out = q.new_empty(ring.n, q_tile.shape[1], ring.e_v)
            lse = q.new_empty(ring.n, q_tile.shape[1])
            flash_forward(q_tile, k_src[:, cols], v_src[:, cols], out, lse, options)
            # A row of a masked block may see none of its keys (lse -inf). Step 0
            # holds every query's own chunk, so such a row meets a finite partial
            # result first or later, never only other empty ones: no NaN.
            before = partial[i]
            partial[i] = (out, lse) if before is None else merge_partials(*before, out, lse)
        ring.stats.compute_seconds += time.perf_counter() - start
        ring.wait(requests)
        if requests:
            buf = incoming
    out = q.new_empty(ring.n, q.shape[1], ring.e_v)
    lse = q.new_empty(ring.n, q.shape[1])
    for (q0, q1, qo), result in zip(mine, partial, strict=True):
        if result is not None:  # None only for an empty chunk
            out[:, qo : qo + q1 - q0], lse[:, qo : qo + q1 - q0] = result
    return out, lse


# --8<-- [end:forward]


# --8<-- [start:backward]
def _ring_backward(
    ring: _Ring, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of the local shard: K/V go round again, each with its gradient.

    Keys and values travel in their own dtype, as in the forward pass; the gradients of
    keys and values travel in the compute dtype, since every rank adds its share to a
    block's gradient on the way, and rounding after each of P additions would add up.
    dq, dk, dv are returned in the compute dtype.
    """
    mine = ring.pieces(ring.rank)
    q = ring.wide(q)
    dq = torch.zeros_like(q)
    buf = _pack(k, v)
    sending: tuple[Tensor, Tensor, list[Any]] | None = None  # dKV out, dKV in, requests
    for step in range(ring.steps):
        source = (ring.rank - step) % ring.size
        kv_requests: list[Any] = []
        if step < ring.steps - 1:
            incoming = buf.new_empty(ring.kv_numel((source - 1) % ring.size))
            kv_requests = ring.exchange(buf, incoming, _KV_TAG)
        start = time.perf_counter()
        length = ring.length(source)
        k_src, v_src = _unpack(ring.wide(buf), ring.n, length, ring.e, ring.e_v)
        # Our queries' share of the gradient of the block of `source`.
        dkv = q.new_zeros(ring.kv_numel(source))
        dk_src, dv_src = _unpack(dkv, ring.n, length, ring.e, ring.e_v)
        for _, rows, cols, options in ring.tiles(mine, source):
            flash_backward(
                q[:, rows],
                k_src[:, cols],
                v_src[:, cols],
                out[:, rows],  # the FINAL output and log-sum-exp, not this
                lse[:, rows],  # block's: P_ij = exp(s_ij - lse_i) is then exact
                grad_out[:, rows],
                dq[:, rows],
                dk_src[:, cols],
                dv_src[:, cols],
                options,
            )
        ring.stats.compute_seconds += time.perf_counter() - start
        if sending is not None:
            # The ranks before us on the ring have added their shares to this block's
            # gradient: add ours, then pass it on (it reaches the owner after P hops).
            _, received, requests = sending
            ring.wait(requests)
            dkv.add_(received)
        if step < ring.steps - 1:
            received = q.new_empty(ring.kv_numel((source - 1) % ring.size))
            sending = (dkv, received, ring.exchange(dkv, received, _DKV_TAG))
        elif ring.steps > 1:
            # The last hop goes straight home: the block's owner is `step` ranks back
            # (the next rank when the ring went all the way round), and our own block's
            # gradient comes from the rank `step` ranks on.
            received = q.new_empty(ring.kv_numel(ring.rank))
            sending = (dkv, received, ring.exchange(dkv, received, _DKV_TAG, -step))
        ring.wait(kv_requests)
        if kv_requests:
            buf = incoming
    if sending is not None:
        _, dkv, requests = sending
        ring.wait(requests)  # the gradient of our own block, summed over every rank
    dk, dv = _unpack(dkv, ring.n, ring.length(ring.rank), ring.e, ring.e_v)
    return dq, dk, dv


# --8<-- [end:backward]


class _RingAttention(torch.autograd.Function):
    """q, k, v in their own dtype; the output in the compute dtype (at least float32)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, ring: _Ring) -> Tensor:
        out, lse = _ring_forward(ring, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        if torch.is_grad_enabled():  # create_graph=True; every rank of the ring raises
            raise RuntimeError(
                "ring_attention does not support create_graph=True (a derivative of its "
                "gradients): its backward pass is computed in place, block by block, and "
                "is not itself differentiable. For second derivatives use "
                "torch.nn.functional.scaled_dot_product_attention on the whole sequence."
            )
        q, k, v, out, lse = ctx.saved_tensors
        with autocast_off(q.device.type):
            grad = grad_out.to(out.dtype).contiguous()
            dq, dk, dv = _ring_backward(ctx.ring, q, k, v, out, lse, grad)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def ring_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    is_causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    layout: ShardLayout = "contiguous",
    block_size: int = 256,
    stats: RingStats | None = None,
) -> Tensor:
    r"""Attention of this rank's queries to the whole sequence, sharded over a process group.

    Every rank of `group` calls this with its own shard of one sequence (the ranges that
    [`shard_ranges`][attnlab.distributed.shard_ranges] gives it for `layout`; use
    [`shard_sequence`][attnlab.distributed.shard_sequence]) and gets the attention outputs
    of its own queries: those of
    `torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=is_causal,
    scale=scale)` on the whole sequence (with `window`, that of the
    [`sliding_window`][attnlab.rules.masks.sliding_window] mask), restricted to its positions.
    Keys and values go
    around the ring with `torch.distributed` point-to-point messages, each transfer
    overlapping the computation on the block before it; partial results are merged with
    [`merge_partials`][attnlab.functional.flash.merge_partials]. The backward pass sends the
    keys and values round again, each block followed by its gradient. A rank holds at most
    two blocks of keys and values at a time (with 16-bit inputs, also a float32 copy of
    the one it computes with), never the whole sequence.

    Precision is that of [`flash_attention`][attnlab.functional.flash.flash_attention]: float16 and
    bfloat16 blocks are attended in float32 and the output rounded once to the input
    dtype; inside `torch.autocast` the inputs are cast to the autocast dtype first, as
    PyTorch's `scaled_dot_product_attention` casts them, and so is the output. Keys and
    values travel in the input dtype (a bfloat16 block is half the bytes of a float32
    one); their gradients travel in float32, because each rank adds its share to a
    block's gradient on the way round. A backward pass with `create_graph=True` raises
    an error (on every rank that asks for it, before any message): the backward pass is
    written in place and is not itself differentiable.

    With `window=w` (sliding-window attention), query $i$ sees only keys
    $i - w < j \le i$, in global positions. The rule is that of
    [`scaled_dot_product_attention`][attnlab.functional.sdpa.scaled_dot_product_attention] and
    [`flash_attention`][attnlab.functional.flash.flash_attention]: a window is causal, so it implies
    `is_causal=True`, and queries and keys are one sequence (so top-left and bottom-right
    alignment agree). What the window hides is skipped at three levels, in the forward
    and the backward pass: a pair of a query chunk and a key chunk that it hides
    entirely is not computed (as a chunk in the queries' future is not); in a pair that
    its edge crosses, FlashAttention skips the tiles outside the band; and the ring stops
    after the last step at which some rank still sees a key of the block it holds, so the
    blocks that no query would see are never sent, and the last hop of each block's
    gradient goes straight back to its owner. With the contiguous layout and a window no
    wider than a shard that is 2 steps instead of $P$, and the work is about even across
    ranks without the zigzag; the zigzag layout keeps all $P$ steps (each rank's late
    chunk needs the block of the next rank, which arrives last).

    A group of one rank sends no message in either pass.

    Shapes, dtypes, flags, the layout, the positions each shard holds and whether it
    needs gradients are exchanged first (one `all_gather_object`), so a mistake on any
    rank raises the same error on every rank instead of leaving the others waiting. If a
    rank dies, the others fail after the process group's `timeout`.

    Args:
        query: This rank's queries, shape `(..., t, E)`.
        key: This rank's keys, shape `(..., t, E)`.
        value: This rank's values, shape `(..., t, Ev)`.
        group: The process group of the ring; default the default group. Ranks are
            ordered by their rank in it.
        is_causal: Hide key $j$ from query $i$ when $j > i$ (global positions).
        window: If given, also hide key $j$ from query $i$ when $j \le i - w$, so each
            query sees its last `window` keys, itself included; implies `is_causal`.
        scale: Factor applied to the scores; default $1 / \sqrt{E}$.
        layout: How the sequence is split: `"contiguous"`, or `"zigzag"` to balance the
            work under a causal mask. Every rank must use the same.
        block_size: Tile size of the attention of one block to another (as in
            [`flash_attention`][attnlab.functional.flash.flash_attention]).
        stats: If given, filled with this rank's work, bytes and time.

    Returns:
        The context vectors of this rank's queries, shape `(..., t, Ev)`.

    Raises:
        RuntimeError: If `torch.distributed` is not initialised, or this process is not
            a member of `group`; in the backward pass, if it is asked for a graph of the
            gradients (`create_graph=True`).
        TypeError: If an input is not a floating-point tensor, or a flag has the wrong
            type (on every rank, naming the rank).
        ValueError: If `window` is not a positive int, shapes, dtypes or flags differ
            across ranks, the shards do not
            follow `layout` (their lengths, or the positions that
            [`shard_sequence`][attnlab.distributed.shard_sequence] recorded on them),
            some ranks' inputs need gradients and others' do not, or the group has more
            ranks than the sequence has positions (on every rank, naming the rank).

    Examples:
        A process group of one rank, so that the example runs in a single process; with
        more, every rank runs the same call on its own shard.

        >>> import torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(2, 3, 10, 8), torch.randn(2, 3, 10, 8), torch.randn(2, 3, 10, 5)
        >>> out = ring_attention(q, k, v, is_causal=True)
        >>> reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> torch.allclose(out, reference, atol=1e-6)
        True
        >>> from attnlab.rules.masks import sliding_window
        >>> out = ring_attention(q, k, v, window=3, layout="zigzag")
        >>> reference = torch.nn.functional.scaled_dot_product_attention(
        ...     q, k, v, attn_mask=sliding_window(10, window=3))
        >>> torch.allclose(out, reference, atol=1e-6)
        True
        >>> dist.destroy_process_group()
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "ring_attention needs torch.distributed to be initialised: call "
            "torch.distributed.init_process_group first (or start the processes with "
            "attnlab.distributed.spawn or torchrun)"
        )
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise RuntimeError("ring_attention: this process is not a member of group")
    positions = [getattr(x, _POSITIONS, None) for x in (query, key, value)]
    flags = (is_causal, window, scale, layout, block_size)
    return _ring(query, key, value, group, rank, size, positions, flags, stats)


@autocast_kernel(inputs=3)
def _ring(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    group: dist.ProcessGroup | None,
    rank: int,
    size: int,
    positions: list[Any],
    flags: tuple[bool, int | None, float | None, ShardLayout, int],
    stats: RingStats | None,
) -> Tensor:
    """`ring_attention`'s work on inputs cast as autocast casts them: checks agreed by every
    rank, then the ring, with autocast off."""
    is_causal, window, scale, layout, block_size = flags
    problem = None
    try:
        if is_validation_enabled():
            _check_local(query, key, value, is_causal, window, scale, layout, block_size)
    except (TypeError, ValueError) as error:
        problem = (type(error).__name__, str(error))
    tensors = [x for x in (query, key, value) if isinstance(x, Tensor)]
    mine = {
        "problem": problem,
        "shapes": [tuple(getattr(x, "shape", ())) for x in (query, key, value)],
        "dtype": str(getattr(query, "dtype", None)),
        "flags": (is_causal, scale, layout, window),
        "positions": positions,
        # autograd records the call (and every rank must then run the backward) iff:
        "grad": torch.is_grad_enabled() and any(x.requires_grad for x in tensors),
    }
    every: list[dict[str, Any]] = [{}] * size
    dist.all_gather_object(every, mine, group=group)
    _check_across_ranks(every)
    t_q, e = query.shape[-2:]
    e_v = value.shape[-1]
    lengths = [info["shapes"][0][-2] for info in every]
    ranges = shard_ranges(sum(lengths), size, layout)
    *batch, _, _ = query.shape
    n = math.prod(batch)
    causal = is_causal_window(is_causal, window)  # as in flash_attention
    ring = _Ring(
        group=group,
        rank=rank,
        size=size,
        ranges=ranges,
        n=n,
        e=e,
        e_v=e_v,
        is_causal=causal,
        window=window,
        steps=_steps(ranges, causal, window),
        scale=softmax_scale(e, scale),
        block_q=block_size,
        block_k=block_size,
        stats=RingStats() if stats is None else stats,
    )
    out: Tensor = _RingAttention.apply(  # type: ignore[no-untyped-call]
        query.reshape(n, t_q, e).contiguous(),  # (n, t, E), n = prod(batch)
        key.reshape(n, t_q, e).contiguous(),  # (n, t, E)
        value.reshape(n, t_q, e_v).contiguous(),  # (n, t, Ev)
        ring,
    )
    return out.reshape(*batch, t_q, e_v)  # (..., t, Ev)


def _check_local(
    query: object,
    key: object,
    value: object,
    is_causal: object,
    window: object,
    scale: object,
    layout: object,
    block_size: object,
) -> None:
    q, k, v = check_qkv(query, key, value)  # what every attention kernel checks
    assert v is not None
    if not q.shape[:-1] == k.shape[:-1] == v.shape[:-1]:  # and one shard's rule
        raise ValueError(
            f"ring_attention needs query, key and value of one shard of one sequence: the "
            f"same batch dimensions and positions, and E features in query and key; got "
            f"query.shape={tuple(q.shape)}, key.shape={tuple(k.shape)}, "
            f"value.shape={tuple(v.shape)}"
        )
    check_bool("is_causal", is_causal)
    check_window(window, None)
    check_scale("scale", scale)
    check_choice("layout", layout, get_args(ShardLayout))
    check_positive_int("block_size", block_size)


def _merged(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges with neighbours joined: (0, 3), (3, 6) holds what (0, 6) holds."""
    out: list[tuple[int, int]] = []
    for start, end in ranges:
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], end)
        elif end > start:
            out.append((start, end))
    return out


def _check_across_ranks(every: list[dict[str, Any]]) -> None:
    """Raise the same error on every rank if any rank's input is wrong or differs."""
    for rank, info in enumerate(every):
        if info["problem"] is not None:
            kind, message = info["problem"]
            error = TypeError if kind == "TypeError" else ValueError
            # The message first, as every check of the package words it, then the rank.
            raise error(f"{message} (on rank {rank} of ring_attention's group)")
    first = every[0]
    names = ("query", "key", "value")
    for rank, info in enumerate(every[1:], start=1):
        for name, got, want in zip(names, info["shapes"], first["shapes"], strict=True):
            if len(got) != len(want) or got[:-2] != want[:-2] or got[-1] != want[-1]:
                raise ValueError(
                    f"ring_attention: {name}.shape is {got} on rank {rank} but {want} on "
                    f"rank 0; every rank must hold the same batch dimensions and features "
                    f"(only the number of positions may differ)"
                )
        for what, got, want in (
            ("dtype", info["dtype"], first["dtype"]),
            ("is_causal, scale, layout, window", info["flags"], first["flags"]),
        ):
            if got != want:
                raise ValueError(
                    f"ring_attention: {what} is {got} on rank {rank} but {want} on rank 0; "
                    f"every rank must pass the same"
                )
    size = len(every)
    lengths = [info["shapes"][0][-2] for info in every]
    total, layout = sum(lengths), first["flags"][2]
    if total == 0:
        raise ValueError(
            f"ring_attention: every shard is empty (the sequence has no positions); the "
            f"ring needs at least one position on each of its {size} ranks"
        )
    if total < size:
        raise ValueError(
            f"ring_attention: the group has {size} ranks but the sequence only {total} "
            f"positions (shards of lengths {lengths}); use at most {total} ranks"
        )
    ranges = shard_ranges(total, size, layout)
    expected = [sum(end - start for start, end in r) for r in ranges]
    if lengths != expected:
        raise ValueError(
            f"ring_attention: the shards have lengths {lengths} but layout {layout!r} of "
            f"{total} positions over {size} ranks gives {expected}; split the sequence "
            f"with attnlab.distributed.shard_sequence"
        )
    for rank, info in enumerate(every):
        for name, held in zip(names, info["positions"], strict=True):
            if held is not None and (held[0], _merged(held[1])) != (total, _merged(ranges[rank])):
                raise ValueError(
                    f"ring_attention: {name} on rank {rank} holds positions "
                    f"{list(held[1])} of {held[0]} (as shard_sequence cut it), but layout "
                    f"{layout!r} of {total} positions over {size} ranks gives rank {rank} "
                    f"{ranges[rank]}; shard with the layout you pass to ring_attention"
                )
    grads = [info["grad"] for info in every]
    if any(grads) and not all(grads):
        needs = [rank for rank, grad in enumerate(grads) if grad]
        raise ValueError(
            f"ring_attention: the inputs of ranks {needs} need gradients but those of "
            f"ranks {[r for r in range(size) if r not in needs]} do not; the backward "
            f"pass is a ring too, so every rank must take part in it, or none"
        )
