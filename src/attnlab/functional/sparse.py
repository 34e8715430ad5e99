r"""Sparse attention's selection, as pure functions: each query's top-k keys or blocks.

DeepSeek-V3.2 (DeepSeek-AI, 2025, https://arxiv.org/abs/2512.02556) lets each query
attend to only `topk` past tokens, those with the highest scores $I_{t,s}$ of a small
*lightning indexer*. [`topk_indices`][attnlab.functional.sparse.topk_indices] picks the
keys per query (never a future one), [`selection_mask`][attnlab.functional.sparse.selection_mask]
turns them into a boolean mask, and [`indexer_loss`][attnlab.functional.sparse.indexer_loss]
is the KL objective that teaches the indexer to imitate the main attention. The indexer
and the sparse layer are in [`attnlab.layers.sparse`][attnlab.layers.sparse].

MoBA (Lu et al., 2025, https://arxiv.org/abs/2502.13189) chooses blocks instead of
tokens, with no parameters: [`moba_blocks`][attnlab.functional.sparse.moba_blocks] scores
each block of keys by its mean key, and
[`moba_attention`][attnlab.functional.sparse.moba_attention] attends to the chosen blocks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.rules._validation import (
    check_index_tensor,
    check_multiple,
    check_positive_int,
    check_qkv,
    check_rank,
    check_scale,
    check_tensor,
    checking,
    entry,
    value_checks_enabled,
)
from attnlab.rules.masks import band

__all__ = [
    "indexer_loss",
    "moba_attention",
    "moba_blocks",
    "selection_mask",
    "topk_indices",
]


def hide_future(scores: Tensor) -> Tensor:
    """`scores` `(..., t, s)` with -inf at each query's future keys.

    The `t` queries are the last `t` of the `s` positions (bottom-right alignment), so
    query `i` may see keys `0 .. i + s - t`: the causal mask of `masks`.
    """
    t, s = scores.shape[-2], scores.shape[-1]
    allowed = band(t, s, "bottom-right", None, scores.device)  # (t, s)
    return scores.masked_fill(~allowed, float("-inf"))


def _check_scores(scores: object) -> Tensor:
    scores = check_tensor("scores", scores)
    check_rank("scores", scores, (2, 3), "(t, s) or (b, t, s)")
    t, s = scores.shape[-2], scores.shape[-1]
    if t > s:
        raise ValueError(
            f"scores must have at least as many keys as queries (the queries are the last "
            f"t of the s tokens), got t={t} > s={s} (scores.shape={tuple(scores.shape)})"
        )
    return scores


@entry
def topk_indices(scores: Tensor, k: int) -> Tensor:
    """The `k` keys of highest score for each query, never a future one.

    The queries are the last `t` of the `s` tokens (bottom-right aligned, as with a
    cache), so query `i` may pick among keys `0 .. i + s - t`. A query with fewer than
    `k` such keys gets all of them, and the remaining slots hold -1. Keys whose score is
    -inf (e.g. padding) are never picked either.

    Args:
        scores: Indexer scores `(b, t, s)` or `(t, s)`, e.g. from
            [`LightningIndexer`][attnlab.layers.sparse.LightningIndexer].
        k: Keys per query, a positive int (`index_topk`); may exceed `s`.

    Returns:
        Key indices `(b, t, min(k, s))` (or `(t, min(k, s))`), int64, in decreasing order
        of score; -1 marks an empty slot.

    Raises:
        TypeError: If `scores` is not a floating-point tensor or `k` not an int.
        ValueError: If `k` is not positive, `scores` is not 2-d or 3-d or has more
            queries than keys.

    Examples:
        >>> scores = torch.tensor([[[5.0, 9.0, 1.0], [3.0, 2.0, 7.0], [4.0, 8.0, 6.0]]])
        >>> topk_indices(scores, 2)
        tensor([[[ 0, -1],
                 [ 0,  1],
                 [ 1,  2]]])
    """
    if checking():
        check_positive_int("k", k)
        _check_scores(scores)
    masked = hide_future(scores)
    values, indices = masked.topk(min(k, scores.shape[-1]), dim=-1)  # (b, t, k)
    # topk fills a short row with hidden keys (score -inf): mark those slots empty.
    return indices.masked_fill(values == float("-inf"), -1)


@entry
def selection_mask(indices: Tensor, num_keys: int) -> Tensor:
    """A boolean mask `(b, t, num_keys)` (or `(t, num_keys)`), True at the selected keys.

    Args:
        indices: Key indices `(b, t, k)` or `(t, k)` from
            [`topk_indices`][attnlab.functional.sparse.topk_indices]; -1 marks an empty slot.
        num_keys: Keys `s` of the mask.

    Returns:
        The allowed-convention bool mask (True = attend).

    Raises:
        TypeError: If `indices` is not an integer tensor or `num_keys` not an int.
        ValueError: If `indices` is not 2-d or 3-d or holds an index outside
            `-1 .. num_keys - 1`.

    Examples:
        >>> selection_mask(torch.tensor([[[0, -1], [1, 0]]]), 3)
        tensor([[[ True, False, False],
                 [ True,  True, False]]])
    """
    if checking():
        _check_indices(indices, num_keys)
    # An extra column takes the empty slots (-1), then is dropped: scattering into the
    # real columns would let an empty slot overwrite a selected key.
    slots = torch.where(indices < 0, num_keys, indices).long()
    mask = torch.zeros(
        *indices.shape[:-1], num_keys + 1, dtype=torch.bool, device=indices.device
    )  # (..., t, s + 1)
    return mask.scatter(-1, slots, True)[..., :num_keys]  # (b, t, s)


def _check_indices(indices: object, num_keys: object) -> None:
    check_positive_int("num_keys", num_keys)
    assert isinstance(num_keys, int)
    indices = check_index_tensor("indices", indices, (2, 3), "(t, k) or (b, t, k)")
    if (
        value_checks_enabled()
        and indices.numel()
        and (int(indices.min()) < -1 or int(indices.max()) >= num_keys)
    ):  # reads the values: a host sync, skipped while compiling or exporting
        raise ValueError(
            f"indices must lie in -1 .. num_keys - 1 = {num_keys - 1}, got values in "
            f"{int(indices.min())} .. {int(indices.max())}"
        )


@entry
def indexer_loss(scores: Tensor, weights: Tensor, indices: Tensor | None = None) -> Tensor:
    r"""DeepSeek-V3.2's training objective for the indexer: KL from the main attention.

    The target of query $t$ is the main attention's distribution summed over its heads
    and renormalised, $p_{t,:}$; the indexer's is $\operatorname{softmax}(I_{t,:})$. The
    loss is $D_{KL}(p_{t,:} \,\|\, \operatorname{softmax}(I_{t,:}))$, averaged over the
    queries and the batch (the report sums over tokens: a constant factor). The weights
    are detached: the loss trains the indexer only. In the report's dense warm-up both
    distributions run over all past keys (`indices=None`); in its sparse stage over each
    query's selected keys only (`indices` from
    [`topk_indices`][attnlab.functional.sparse.topk_indices]).

    Args:
        scores: Indexer scores `(b, t, s)` or `(t, s)`, -inf at hidden keys.
        weights: The main attention's weights `(b, num_heads, t, s)` (or
            `(num_heads, t, s)`), e.g. from
            [`DeepSeekSparseAttention.attention_weights`][attnlab.layers.sparse.DeepSeekSparseAttention.attention_weights].
        indices: Selected keys `(b, t, k)` or `(t, k)` (-1: empty slot), or None for all
            keys.

    Returns:
        The loss, a scalar tensor.

    Raises:
        TypeError: If `scores` or `weights` is not a floating-point tensor.
        ValueError: If `weights` does not have one axis (the heads) more than `scores`,
            or does not fit it, or `indices` does not fit `scores` (or holds an index
            outside `-1 .. s - 1`).

    Examples:
        >>> scores = torch.tensor([[[0.0, -float("inf")], [0.0, 0.0]]])
        >>> weights = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])  # one head
        >>> float(indexer_loss(scores, weights))  # the indexer already agrees
        0.0
    """
    if checking():
        _check_loss_inputs(scores, weights, indices)
    target = weights.detach().sum(-3).to(scores.dtype)  # (..., t, s)
    s = scores.shape[-1]
    if indices is not None:
        keep = selection_mask(indices, s)  # (..., t, s)
        target = target * keep
        scores = scores.masked_fill(~keep, float("-inf"))
    target = target / target.sum(-1, keepdim=True)
    log_q = torch.log_softmax(scores, dim=-1)  # (..., t, s)
    # Keys the target gives nothing add nothing (0 log 0 = 0), even where log_q is -inf.
    terms = torch.where(target > 0, target * (target.log() - log_q), 0.0)
    return terms.sum(-1).mean()


def _check_loss_inputs(scores: object, weights: object, indices: object) -> None:
    scores = _check_scores(scores)
    weights = check_tensor("weights", weights)
    batch = tuple(scores.shape[:-2])
    shape_fits = weights.shape[:-3] == batch and weights.shape[-2:] == scores.shape[-2:]
    if weights.ndim != scores.ndim + 1 or not shape_fits:
        t, s = scores.shape[-2:]
        raise ValueError(
            f"weights must have shape {'(b, ' if batch else '('}num_heads, t, s) = "
            f"({f'b={batch[0]}, ' if batch else ''}num_heads, t={t}, s={s}) to fit scores, "
            f"got weights.shape={tuple(weights.shape)}"
        )
    if indices is not None:
        _check_indices(indices, scores.shape[-1])
        assert isinstance(indices, Tensor)
        if tuple(indices.shape[:-1]) != tuple(scores.shape[:-1]):
            raise ValueError(
                f"indices must have the batch and query axes of scores {tuple(scores.shape[:-1])}, "
                f"got indices.shape={tuple(indices.shape)}"
            )


# -- MoBA: blocks chosen by their mean key ------------------------------------------------


@entry
def moba_blocks(query: Tensor, key: Tensor, block_size: int, top_k: int) -> Tensor:
    r"""MoBA's choice: which blocks of keys each query attends to.

    The `s` keys are cut into $n = \lceil s / B \rceil$ blocks of `block_size` $B$ (the
    last may be shorter), and block $j$ is scored for query $q_i$ by its mean key,
    $g_{ij} = q_i \cdot \bar k_j$ (means and scores in float32 at least). Each
    query takes the block that holds its own position, always, plus the `top_k - 1`
    best-scoring blocks that lie wholly before that one; a block that starts after the
    query is never chosen, and inside its own block the query sees only the keys up to
    itself (that is [`moba_attention`][attnlab.functional.sparse.moba_attention]'s causal
    mask). The queries are the last `t` of the `s` positions, so a decode step of one
    query chooses as the last row of a prefill does.

    Args:
        query: `(b, Hq, t, E)`.
        key: `(b, Hkv, s, E)`, `Hkv` dividing `Hq` (each key head serves a group of query
            heads, as in grouped-query attention), `s >= t`.
        block_size: Keys per block, a positive int.
        top_k: Blocks per query, the query's own included, a positive int; a query with
            fewer blocks behind it takes them all.

    Returns:
        A bool tensor `(b, Hq, t, n)`, True at the chosen blocks.

    Raises:
        TypeError: If `query` or `key` is not a floating-point tensor, or `block_size`
            or `top_k` not an int.
        ValueError: If they are not 4-d, differ in batch or features, `Hkv` does not
            divide `Hq`, there are no keys or more queries than keys, or `block_size` or
            `top_k` is not positive.

    Examples:
        >>> q, k = torch.ones(1, 1, 4, 2), torch.ones(1, 1, 4, 2)
        >>> moba_blocks(q, k, block_size=2, top_k=2)[0, 0]  # 4 queries, 2 blocks
        tensor([[ True, False],
                [ True, False],
                [ True,  True],
                [ True,  True]])
    """
    if checking():
        _check_moba(query, key, None, block_size, top_k)
    b, hq, t, _ = query.shape
    h_kv, s = key.shape[1], key.shape[2]
    n = math.ceil(s / block_size)
    # The mean key of each block, summed in float32 at least (a half-precision sum of
    # thousands of keys can overflow); padding the last block with zeros changes its sum
    # only.
    work = torch.promote_types(query.dtype, torch.float32)
    padded = F.pad(key.to(work), (0, 0, 0, n * block_size - s))  # (b, Hkv, n B, E)
    sums = padded.view(b, h_kv, n, block_size, key.shape[-1]).sum(3)  # (b, Hkv, n, E)
    starts = torch.arange(n, device=key.device) * block_size
    counts = (s - starts).clamp(max=block_size)  # (n,) keys in each block
    means = (sums / counts[:, None]).repeat_interleave(hq // h_kv, dim=1)  # (b, Hq, n, E)
    gate = query.to(work) @ means.transpose(-1, -2)  # (b, Hq, t, n)
    own = (torch.arange(t, device=query.device) + s - t) // block_size  # (t,) block of query i
    blocks = torch.arange(n, device=query.device)
    behind = blocks < own[:, None]  # (t, n) blocks wholly before the query's own
    chosen = blocks == own[:, None]  # (t, n)
    extra = min(top_k - 1, n - 1)
    if extra == 0:
        return chosen.expand(b, hq, t, n)
    values, picks = gate.masked_fill(~behind, float("-inf")).topk(extra, dim=-1)
    # A query with fewer blocks behind it than `extra` fills its slots with -inf: skip those.
    picked = torch.zeros_like(gate, dtype=torch.bool).scatter(-1, picks, values > -math.inf)
    return picked | chosen  # (b, Hq, t, n)


@entry
def moba_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    block_size: int,
    top_k: int,
    scale: float | None = None,
) -> Tensor:
    r"""Causal attention over the blocks MoBA chooses (Lu et al., 2025).

    Each query attends, causally, to the keys of the blocks
    [`moba_blocks`][attnlab.functional.sparse.moba_blocks] chooses for it: its own block
    up to itself and the `top_k - 1` past blocks whose mean key scores highest. With
    `top_k` at least the number of blocks, every past block is chosen and this is causal
    attention; with `top_k=1` it is attention within fixed chunks
    ([`masks.chunked`][attnlab.rules.masks.chunked]). This function builds the mask and
    runs PyTorch's SDPA with it, so its cost is a dense attention's: it shows what MoBA
    computes. A MoBA kernel reads only
    the chosen blocks, `top_k * block_size` keys per query, plus one mean key per block.

    Args:
        query: `(b, Hq, t, E)`.
        key: `(b, Hkv, s, E)`, `Hkv` dividing `Hq`, `s >= t` (the queries are the last
            `t` positions).
        value: `(b, Hkv, s, Ev)`.
        block_size: Keys per block, a positive int.
        top_k: Blocks per query, its own included, a positive int.
        scale: The scores' factor; None for $1 / \sqrt{E}$.

    Returns:
        `(b, Hq, t, Ev)`.

    Raises:
        TypeError: If an input is not a floating-point tensor, or `block_size` or `top_k`
            not an int.
        ValueError: As [`moba_blocks`][attnlab.functional.sparse.moba_blocks], or if
            `value` does not fit `key`, or `scale` is not a finite number.

    Examples:
        >>> q = k = v = torch.randn(1, 2, 8, 4)
        >>> causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> torch.allclose(moba_attention(q, k, v, block_size=4, top_k=2), causal, atol=1e-6)
        True
    """
    if checking():
        _check_moba(query, key, value, block_size, top_k)
        check_scale("scale", scale)
    t, s = query.shape[-2], key.shape[-2]
    chosen = moba_blocks(query, key, block_size, top_k)  # (b, Hq, t, n)
    keys_chosen = chosen.repeat_interleave(block_size, dim=-1)[..., :s]  # (b, Hq, t, s)
    mask = keys_chosen & band(t, s, "bottom-right", None, query.device)
    out: Tensor = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out  # (b, Hq, t, Ev)


def _check_moba(
    query: object, key: object, value: object, block_size: object, top_k: object
) -> None:
    q, k, v = check_qkv(query, key, value)
    check_rank("query", q, (4,), "(b, Hq, t, E)")
    check_rank("key", k, (4,), "(b, Hkv, s, E)")
    if v is not None:
        check_rank("value", v, (4,), "(b, Hkv, s, Ev)")
    for name, x, what in (("value", v, "batch and heads"), ("query", q, "batch")):
        dims = 2 if name == "value" else 1
        if x is not None and x.shape[:dims] != k.shape[:dims]:
            raise ValueError(
                f"{name} must have the {what} of key, got key.shape={tuple(k.shape)} "
                f"and {name}.shape={tuple(x.shape)}"
            )
    check_multiple("query.shape[1]", q.shape[1], "key.shape[1]", k.shape[1])
    if k.shape[2] == 0:
        raise ValueError(f"key must have at least one position, got key.shape={tuple(k.shape)}")
    if q.shape[2] > k.shape[2]:
        raise ValueError(
            f"key must have at least as many positions as query (the queries are the last "
            f"t of the s positions), got t={q.shape[2]} > s={k.shape[2]}"
        )
    check_positive_int("block_size", block_size)
    check_positive_int("top_k", top_k)
