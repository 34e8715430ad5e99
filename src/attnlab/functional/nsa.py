r"""Native Sparse Attention (NSA), as kernels: three branches mixed by gates.

NSA (Yuan et al., 2025, https://arxiv.org/abs/2502.11089, DeepSeek) gives each query
three views of its past and adds them, each weighted by a learned gate $g^c_t \in (0, 1)$:

- **compressed**: every block of `block` tokens (a new one every `stride` tokens) becomes
  one key and one value, [`compress_blocks`][attnlab.functional.nsa.compress_blocks];
  the query attends to every complete block.
- **selected**: the query reads whole blocks of `select_block` tokens, the `top_n` that
  its compressed attention weighted most (summed over the heads that share a key/value
  head, so that a group reads the same blocks), chosen by
  [`nsa_select`][attnlab.functional.nsa.nsa_select]; the first block and the query's own
  block and the one before it are always read, as in the paper.
- **window**: its last `window` tokens.

$$o_t = g^{\text{cmp}}_t\, o^{\text{cmp}}_t + g^{\text{slc}}_t\, o^{\text{slc}}_t
+ g^{\text{win}}_t\, o^{\text{win}}_t$$

[`nsa_attention`][attnlab.functional.nsa.nsa_attention] computes the three, gathering
the selected blocks and the window by index: a query costs
$O(S / \text{stride} + \text{top\_n} \cdot \text{select\_block} + \text{window})$ keys.
A block's importance for selection is the compressed attention summed over the
compressed blocks that overlap it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.rules._validation import (
    check_index_tensor,
    check_multiple,
    check_positive_int,
    check_rank,
    check_tensor,
)

__all__ = ["compress_blocks", "nsa_attention", "nsa_select"]


def compress_blocks(x: Tensor, block: int, stride: int, weight: Tensor | None = None) -> Tensor:
    r"""One key (or value) per block of `block` tokens, a new block every `stride` tokens.

    Args:
        x: Keys or values `(b, h, s, D)`.
        block: Tokens per block, $l$.
        stride: Tokens between the starts of two blocks, $d \le l$.
        weight: NSA's learned map $\varphi$ of a block's `block * D` features to `D`,
            `(D, block * D)`; None for the block's mean.

    Returns:
        `(b, h, n, D)` with `n = (s - block) // stride + 1` complete blocks (0 if `s <
        block`); block `i` covers tokens `i * stride` to `i * stride + block - 1`.
    """
    b, h, s, d = x.shape
    if s < block:
        return x.new_zeros(b, h, 0, d)
    blocks = x.unfold(2, block, stride).transpose(-1, -2)  # (b, h, n, block, D)
    if weight is None:
        return blocks.mean(-2)
    return blocks.flatten(-2) @ weight.T  # (b, h, n, D)


def _check_sizes(query: object, keys: object, **sizes: int) -> tuple[Tensor, Tensor]:
    """`query` `(b, h, t, D)` and `keys` `(b, h_kv, ., D)` checked, with every size a
    positive int and the query heads in whole groups; raise naming the argument."""
    for name, size in sizes.items():
        check_positive_int(name, size)
    q, k = check_tensor("query", query), check_tensor("keys", keys)
    check_rank("query", q, (4,), "(b, h, t, D)")
    check_rank("keys", k, (4,), "(b, h_kv, s, D)")
    check_multiple("num_heads", q.shape[1], "num_kv_heads", k.shape[1])
    if k.shape[0] != q.shape[0] or k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"query and keys must share b and D, got query.shape={tuple(q.shape)} and "
            f"keys.shape={tuple(k.shape)}"
        )
    return q, k


def _block_visible(positions: Tensor, n: int, block: int, stride: int) -> Tensor:
    """`(t, n)`: True where compressed block `i` is complete at the query's position."""
    ends = torch.arange(n, device=positions.device) * stride + block - 1
    return ends <= positions[:, None]


def _softmax_rows(scores: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over the allowed entries; a row with none allowed gives zeros."""
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return weights.nan_to_num(0.0)


def nsa_select(
    query: Tensor,
    key_cmp: Tensor,
    num_keys: int,
    *,
    block: int,
    stride: int,
    select_block: int,
    top_n: int,
    scale: float | None = None,
) -> Tensor:
    """The blocks each query reads in NSA's selected branch, `(b, h_kv, t, top_n)`.

    Args:
        query: `(b, h, t, D)`, the last `t` of `num_keys` tokens.
        key_cmp: The compressed keys `(b, h_kv, n, D)` of
            [`compress_blocks`][attnlab.functional.nsa.compress_blocks].
        num_keys: Tokens `s` the queries may read (themselves the last `t`).
        block: Tokens per compressed block.
        stride: Tokens between the starts of two compressed blocks.
        select_block: Tokens per selection block, $l'$.
        top_n: Blocks read per query (the forced ones included).
        scale: Factor on the scores; default `D ** -0.5`.

    Returns:
        Block indices, best first, -1 where fewer blocks exist; block `j` holds tokens
        `j * select_block` to `(j + 1) * select_block - 1`.

    Raises:
        TypeError: If `query` or `key_cmp` is not a tensor.
        ValueError: If a size is not a positive int, the heads do not group evenly, the
            shapes do not fit, or there are more queries than keys.
    """
    sizes = {"block": block, "stride": stride, "select_block": select_block, "top_n": top_n}
    _check_sizes(query, key_cmp, num_keys=num_keys, **sizes)
    b, h, t, d = query.shape
    if t > num_keys:
        raise ValueError(
            f"query has t={t} tokens but num_keys={num_keys}: the queries are keys too"
        )
    kv_heads, n = key_cmp.shape[1], key_cmp.shape[2]
    positions = torch.arange(num_keys - t, num_keys, device=query.device)
    q = query.view(b, kv_heads, h // kv_heads, t, d)
    scores = torch.einsum("bkgtd,bknd->bkgtn", q, key_cmp) * (scale or d**-0.5)
    p_cmp = _softmax_rows(scores, _block_visible(positions, n, block, stride)).sum(2)
    m = -(-num_keys // select_block)  # selection blocks
    starts = torch.arange(n, device=query.device) * stride
    edges = torch.arange(m, device=query.device) * select_block
    overlap = (starts[:, None] < edges + select_block) & (starts[:, None] + block > edges)
    importance = p_cmp @ overlap.to(p_cmp.dtype)  # (b, h_kv, t, m)
    own = positions // select_block  # (t,)
    blocks = torch.arange(m, device=query.device)
    forced = (blocks == 0) | (blocks == own[:, None]) | (blocks == own[:, None] - 1)
    importance = importance.masked_fill(forced, float("inf"))
    importance = importance.masked_fill(blocks > own[:, None], float("-inf"))
    top = importance.topk(min(top_n, m), dim=-1)
    chosen = torch.where(top.values > float("-inf"), top.indices, -1)
    if top_n > m:  # fewer blocks than top_n: pad with "none"
        chosen = torch.cat([chosen, chosen.new_full((b, kv_heads, t, top_n - m), -1)], -1)
    return chosen


def nsa_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_cmp: Tensor,
    value_cmp: Tensor,
    chosen: Tensor,
    gates: Tensor,
    *,
    block: int,
    stride: int,
    select_block: int,
    window: int,
    scale: float | None = None,
) -> Tensor:
    """NSA's three branches, each gathered by index, mixed by `gates`.

    Args:
        query: `(b, h, t, D)`, the last `t` of the `s` tokens of `key`.
        key: The tokens' keys `(b, h_kv, s, D)`, which the selected and the window
            branch read (NSA may give each branch projections of its own).
        value: Their values `(b, h_kv, s, Dv)`.
        key_cmp: The compressed blocks' keys `(b, h_kv, n, D)`.
        value_cmp: Their values `(b, h_kv, n, Dv)`.
        chosen: The selected blocks `(b, h_kv, t, top_n)` of
            [`nsa_select`][attnlab.functional.nsa.nsa_select], -1 for none.
        gates: Each query head's gate per branch (compressed, selected, window),
            `(b, h, t, 3)`, e.g. a sigmoid of a linear map of the token.
        block: Tokens per compressed block.
        stride: Tokens between the starts of two compressed blocks.
        select_block: Tokens per selection block.
        window: Tokens of the sliding window, the query's own included.
        scale: Factor on the scores; default `D ** -0.5`.

    Returns:
        `(b, h, t, Dv)`.

    Raises:
        TypeError: If a tensor is not a tensor or `chosen` holds no integers.
        ValueError: If a size is not a positive int, the shapes do not fit (ranks, whole
            groups of heads, `chosen` `(b, h_kv, t, top_n)`, `gates` `(b, h, t, 3)`) or
            `gates` has another dtype than `query`.
    """
    sizes = {"block": block, "stride": stride, "select_block": select_block, "window": window}
    _check_sizes(query, key, **sizes)
    b, h, t, d = query.shape
    chosen = check_index_tensor("chosen", chosen, (4,), "(b, h_kv, t, top_n)")
    if chosen.shape[:3] != (b, key.shape[1], t):
        raise ValueError(
            f"chosen must be (b, h_kv, t, top_n) = {(b, key.shape[1], t)} + (top_n,), got "
            f"chosen.shape={tuple(chosen.shape)}"
        )
    gates = check_tensor("gates", gates)
    if tuple(gates.shape) != (b, h, t, 3):
        raise ValueError(
            f"gates must be (b, h, t, 3) = {(b, h, t, 3)}, one gate per head and branch, "
            f"got gates.shape={tuple(gates.shape)}"
        )
    if gates.dtype != query.dtype:
        raise ValueError(f"gates has dtype {gates.dtype} but query {query.dtype}")
    kv_heads, s = key.shape[1], key.shape[2]
    scale = scale or d**-0.5
    positions = torch.arange(s - t, s, device=query.device)
    q = query.view(b, kv_heads, h // kv_heads, t, d)  # a group of heads per key head

    def attend(keys: Tensor, values: Tensor, allowed: Tensor) -> Tensor:
        """Each query over its own keys `(b, h_kv, t, L, D)` where `allowed`."""
        scores = torch.einsum("bkgtd,bktld->bkgtl", q, keys) * scale
        weights = _softmax_rows(scores, allowed[:, :, None])
        return torch.einsum("bkgtl,bktle->bkgte", weights, values)

    n = key_cmp.shape[2]
    visible = _block_visible(positions, n, block, stride)  # (t, n)
    every = visible.expand(b, kv_heads, t, n)
    compressed = attend(key_cmp[:, :, None].expand(-1, -1, t, -1, -1),
                        value_cmp[:, :, None].expand(-1, -1, t, -1, -1), every)  # fmt: skip
    slots = chosen[..., None] * select_block + torch.arange(select_block, device=key.device)
    slots = slots.flatten(-2)  # (b, h_kv, t, top_n * select_block): token ids
    readable = (chosen >= 0).repeat_interleave(select_block, -1) & (slots <= positions[:, None])
    index = slots.clamp(0, s - 1)
    selected = attend(_gather(key, index), _gather(value, index), readable)
    offsets = torch.arange(-window + 1, 1, device=key.device)
    near = positions[:, None] + offsets  # (t, window)
    in_window = (near >= 0).expand(b, kv_heads, t, window)
    near_index = near.clamp(min=0).expand(b, kv_heads, t, window)
    local = attend(_gather(key, near_index), _gather(value, near_index), in_window)
    branches = torch.stack([compressed, selected, local], -1)  # (b, h_kv, g, t, Dv, 3)
    mixed = (branches * gates.view(b, kv_heads, h // kv_heads, t, 1, 3)).sum(-1)
    return mixed.reshape(b, h, t, -1)


def _gather(x: Tensor, index: Tensor) -> Tensor:
    """`x` `(b, h_kv, s, D)` at token ids `index` `(b, h_kv, t, L)`: `(b, h_kv, t, L, D)`."""
    b, k, t, length = index.shape
    flat = index.reshape(b, k, t * length, 1).expand(-1, -1, -1, x.shape[-1])
    return torch.gather(x, 2, flat).view(b, k, t, length, x.shape[-1])
