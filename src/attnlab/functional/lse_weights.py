r"""Attention weights recovered from a fused kernel's log-sum-exp, in memory linear in length.

A fused kernel never holds the weights $P = \operatorname{softmax}(S)$: it keeps, for
every query $i$, one number, the log-sum-exp $\ell_i = \ln \sum_j e^{s_{ij}}$ of its
scores, which FlashAttention-2's backward pass (Dao, 2023,
https://arxiv.org/abs/2307.08691) uses to recompute each tile of $P$ as
$e^{s_{ij} - \ell_i}$. The same identity gives the weights to a reader who wants to see
them (`output_attentions=True` with FlashAttention, transformers issue 33996): one pass
over the keys, tile by tile, for the rows asked, without the $L \times S$ matrix.

[`weights_from_lse`][attnlab.functional.lse_weights.weights_from_lse] takes the
log-sum-exp of [`flash_attention`][attnlab.functional.flash.flash_attention] or of
FlexAttention ([`attention`][attnlab.functional.flex.attention]), both with
`return_lse=True`, and the score rule they ran;
[`weights_from_rule`][attnlab.functional.lse_weights.weights_from_rule] reads that rule
from a [`ScoreRule`][attnlab.rules.scores.ScoreRule], for the log-sum-exp of the
backends' `"flash"` entry
([`attend_with_lse`][attnlab.functional.backends.attend_with_lse]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from attnlab.functional.flash import (
    _LOG2_E,
    FlashOptions,
    _key_starts,
    _needs_bias,
    _per_row,
    _q_factor,
    check_rule,
    rule_options,
)
from attnlab.rules._precision import autocast_inputs, autocast_kernel, compute_dtype
from attnlab.rules._validation import (
    check_bool,
    check_int_sequence,
    check_multiple,
    check_positive_int,
    check_qkv,
    check_tensor,
    checking,
    entry,
)
from attnlab.rules.masks import Alignment, visible
from attnlab.rules.scores import ScoreRule, alibi_bias, temperature_tuned

__all__ = ["Rows", "weights_from_lse", "weights_from_rule"]

Rows = Tensor | Sequence[int] | slice | None
"""Which queries' weights: a 1-d integer tensor or a sequence of indices, a slice, or all."""
_PLAIN = ScoreRule()


@entry
def weights_from_lse(
    query: Tensor,
    key: Tensor,
    lse: Tensor,
    *,
    rows: Rows = None,
    is_causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    align: Alignment = "top-left",
    softcap: float | None = None,
    sink_logits: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    enable_gqa: bool = False,
    block_size: int = 256,
) -> Tensor:
    r"""The attention weights of some rows, recovered from each row's log-sum-exp.

    $$
    P_{ij} = e^{s_{ij} - \ell_i}, \qquad \ell_i = \ln\Big(\sum_j e^{s_{ij}}\Big)
    $$

    with $s_{ij}$ the score of query $i$ and key $j$ by the rule of
    [`flash_attention`][attnlab.functional.flash.flash_attention]: the scale, then the
    softcap $c \tanh(x / c)$, then ALiBi's $m_h (j - i - o)$, and $-\infty$ where the
    causal or window mask (at the offset $o$ of `align`) hides the key. Pass the same
    keywords that the kernel which returned `lse` ran with. One pass over the keys in
    tiles of `block_size` fills the `(..., R, S)` result; tiles outside the causal band
    or the window are skipped (their weights are 0), and besides the result only one
    `(..., R, block_size)` tile of scores is held: the extra memory is $O(R \times S)$,
    never $O(L \times S)$.

    With learned sinks, `lse` already holds the sink ($\ell_i = \ln(\sum_j e^{s_{ij}} +
    e^{s_h})$, as `flash_attention` and FlexAttention's `attention` return it), so the
    weights over the keys sum to $1 - p_{i,\text{sink}}$, the sink's share being
    $p_{i,\text{sink}} = e^{s_h - \ell_i}$. `sink_logits` is therefore only checked,
    not used: it is taken so that the kernel's keywords can be passed unchanged.

    With `enable_gqa`, key head $g$ serves the query heads $g \cdot G$ to $g \cdot G +
    G - 1$ ($G$ = `H // Hkv`), as in PyTorch; the queries are regrouped per key head, and
    the keys are never copied per query head. A row that saw no key (and no sink) gets
    zeros. A tensor of `rows` is read once (a host sync) for the span of keys it needs.
    The result is for reading, not training: it carries no gradient (the log-sum-exp is
    a constant here, so a gradient through it would not be the softmax's).

    Args:
        query: Queries `(..., H, L, E)` (or `(L, E)`), as the kernel got them.
        key: Keys `(..., H, S, E)`; `(..., Hkv, S, E)` with `enable_gqa`.
        lse: The kernel's log-sum-exp, natural log, shape `query.shape[:-1]`.
        rows: The queries whose weights to return: indices in `[0, L)` (any order,
            repeats allowed), a slice, or None for all `L`.
        is_causal: As for `flash_attention`.
        window: As for `flash_attention`; implies `is_causal`.
        scale: As for `flash_attention`; default $1/\sqrt{E}$.
        align: As for `flash_attention`.
        softcap: As for `flash_attention`.
        sink_logits: One logit per head `(H,)`; checked only (see above).
        alibi_slopes: One ALiBi slope per query head `(H,)`.
        enable_gqa: Let `H` be a multiple of `Hkv`.
        block_size: Keys per tile.

    Returns:
        The weights `(..., H, R, S)` of the `R` rows, in the query's dtype (computed in
        float32, float64 for float64 inputs).

    Raises:
        TypeError: If an input is not a floating-point tensor, a flag or size has the
            wrong type, or `rows` is neither indices, a slice nor None.
        ValueError: If the shapes do not fit (`lse` must be `query.shape[:-1]`), a row is
            outside `[0, L)`, or an option is out of range as for `flash_attention`.

    Examples:
        >>> from attnlab.functional.flash import flash_attention
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 4)
        >>> out, lse = flash_attention(q, k, v, is_causal=True, return_lse=True)
        >>> p = weights_from_lse(q, k, lse, rows=[5, 0], is_causal=True)
        >>> p.shape
        torch.Size([1, 2, 2, 6])
        >>> hidden = torch.ones(6, 6, dtype=torch.bool).triu(1)
        >>> s = (q @ k.mT / 8**0.5).masked_fill(hidden, float("-inf"))
        >>> torch.allclose(p, s.softmax(-1)[..., [5, 0], :], atol=1e-6)
        True
    """
    if checking():
        query, key = autocast_inputs(query, key)  # as the kernel sees them
        heads = _check_inputs(query, key, lse, enable_gqa)
        scores = (is_causal, window, scale, align, softcap, sink_logits, alibi_slopes)
        check_rule(query, heads, *scores)
        check_positive_int("block_size", block_size)
        _check_rows(rows, query.shape[-2])
    t_q = query.shape[-2]
    slopes = _per_row(alibi_slopes, list(query.shape[:-2]), compute_dtype(query.dtype))
    # The rows are one tile of queries: block_q is not used.
    rule = (is_causal, window, scale, align, softcap, slopes)
    options = rule_options(query, key.shape[-2], *rule, block_q=block_size, block_k=block_size)
    return _recover(query, key, lse, _positions(rows, t_q, query.device), options)


def weights_from_rule(
    query: Tensor,
    key: Tensor,
    lse: Tensor,
    rule: ScoreRule = _PLAIN,
    *,
    rows: Rows = None,
    enable_gqa: bool = False,
    block_size: int = 256,
) -> Tensor:
    """[`weights_from_lse`][attnlab.functional.lse_weights.weights_from_lse] with the
    fields of a [`ScoreRule`][attnlab.rules.scores.ScoreRule].

    For the `lse` of [`attend_with_lse`][attnlab.functional.backends.attend_with_lse]:
    the same `query`, `key`, `rule` and `enable_gqa`; the rule's temperature is applied
    to the queries as `attend` applies it
    ([`temperature_tuned`][attnlab.rules.scores.temperature_tuned]).

    Returns:
        The weights `(..., R, S)`.
    """
    if not isinstance(rule, ScoreRule):
        raise TypeError(f"rule must be a ScoreRule, got {type(rule).__name__}")
    query, rule = temperature_tuned(query, key, rule)
    return weights_from_lse(
        query, key, lse, rows=rows, enable_gqa=enable_gqa, block_size=block_size,
        **rule.keywords(),
    )  # fmt: skip


def _check_inputs(query: object, key: object, lse: object, enable_gqa: object) -> int | None:
    """Check the tensors and their shapes; return the number of query heads (None: none)."""
    q, k, _ = check_qkv(query, key, None)
    if check_bool("enable_gqa", enable_gqa):
        if q.ndim < 3 or k.ndim != q.ndim or q.shape[:-3] != k.shape[:-3]:
            raise ValueError(
                f"enable_gqa needs query (..., H, L, E) and key (..., Hkv, S, E) with the same "
                f"batch dimensions, got query.shape={tuple(q.shape)}, key.shape={tuple(k.shape)}"
            )
        why = " (each key head serves a group of query heads)"
        check_multiple("query.shape[-3]", q.shape[-3], "key.shape[-3]", k.shape[-3], why=why)
    elif q.shape[:-2] != k.shape[:-2]:
        raise ValueError(
            f"weights_from_lse needs the same batch (and head) dimensions in query and key, "
            f"got query.shape={tuple(q.shape)}, key.shape={tuple(k.shape)}; pass "
            "enable_gqa=True for fewer key heads"
        )
    ell = check_tensor("lse", lse)
    if ell.shape != q.shape[:-1]:
        raise ValueError(
            f"lse must hold one log-sum-exp per query, shape query.shape[:-1]="
            f"{tuple(q.shape[:-1])}, got lse.shape={tuple(ell.shape)}"
        )
    if ell.device != q.device:
        raise ValueError(f"lse is on {ell.device} but query is on {q.device}")
    return q.shape[-3] if q.ndim > 2 else None


def _check_rows(rows: object, t_q: int) -> None:
    """Raise unless `rows` is None, a slice of ints, or indices in `[0, t_q)`."""
    if rows is None:
        return
    if isinstance(rows, slice):
        try:
            range(t_q)[rows]
        except (TypeError, ValueError) as error:  # a step of 0, a float bound
            raise type(error)(f"rows is a slice that cannot index {t_q} queries: {error}") from None
        return
    check_int_sequence("rows", rows, low=0, high=t_q, within=f"the {t_q} queries ")


def _positions(rows: Rows, t_q: int, device: torch.device) -> Tensor | None:
    """The picked queries' indices as a 1-d int64 tensor; None for all of them."""
    if rows is None:
        return None
    if isinstance(rows, slice):
        picked = range(t_q)[rows]
        return torch.arange(picked.start, picked.stop, picked.step, device=device)
    if isinstance(rows, Tensor):
        return rows.to(device=device, dtype=torch.long)
    return torch.tensor(list(rows), dtype=torch.long, device=device)


@autocast_kernel(inputs=2)
@torch.no_grad()
def _recover(
    query: Tensor, key: Tensor, lse: Tensor, picked: Tensor | None, options: FlashOptions
) -> Tensor:
    """`weights_from_lse` after its checks: `P = 2^(s - lse log2 e)`, one key tile at a time.

    The scores are computed in base 2 as `flash_forward` computes them (the same factors),
    so the recovered weights meet the kernel's log-sum-exp with its own rounding.
    """
    is_causal, scale, _, block_k, window, offset, softcap, slopes = options
    *batch, t_q, e = query.shape
    t_k = key.shape[-2]
    if picked is None:  # every row: no copy of the queries
        q_r, lse_r = query, lse
        positions = torch.arange(t_q, device=query.device)
        lo, hi = offset, t_q + offset  # the rows' span among the keys' positions
    else:
        q_r, lse_r, positions = query.index_select(-2, picked), lse.index_select(-1, picked), picked
        lo, hi = (
            (int(picked.min()) + offset, int(picked.max()) + 1 + offset) if len(picked) else (0, 0)
        )
    r = positions.shape[0]
    out = query.new_zeros(*batch, r, t_k)  # (..., H, R, S): the skipped tiles stay 0
    if r == 0 or t_k == 0:
        return out
    n_q, n_kv = math.prod(batch), math.prod(key.shape[:-2])  # query heads, key heads (flat)
    rows = n_q // n_kv * r  # each key head's rows: its G query heads' R rows each
    wide = compute_dtype(query.dtype)
    q2 = (q_r.to(wide) * _q_factor(scale, softcap)).reshape(n_kv, rows, e)  # (n_kv, G R, E)
    k_t = key.to(wide).reshape(n_kv, t_k, e).transpose(1, 2)  # (n_kv, E, S)
    lse2 = (lse_r.to(wide) * _LOG2_E).reshape(n_kv, rows, 1)  # base 2, like the scores
    # A row that saw no key has lse = -inf: make its P_ij = 2^(-inf) = 0, as the backward.
    lse2 = lse2.masked_fill(lse2 == float("-inf"), float("inf"))
    alibi2 = None if slopes is None else slopes * _LOG2_E  # (n_q,), base 2
    where = positions + offset  # (R,) the rows' positions among the keys
    weights = out.view(n_kv, rows, t_k)  # (n_kv, G R, S)
    tile = q2.new_empty(n_kv * rows * min(block_k, t_k))  # the one tile of scores
    for j0 in _key_starts(lo, hi, t_k, is_causal, window, block_k):
        j1 = min(j0 + block_k, t_k)
        s = tile[: n_kv * rows * (j1 - j0)].view(n_kv, rows, j1 - j0)
        torch.bmm(q2, k_t[:, :, j0:j1], out=s)  # this tile's scores
        if softcap is not None:  # s = x / c: now c tanh(x / c), in base 2
            s.tanh_().mul_(softcap * _LOG2_E)
        per_head = s.view(n_q, r, j1 - j0)  # (n_q, R, cols): one query head per row
        if alibi2 is not None:
            per_head.add_(alibi_bias(alibi2, where, range(j0, j1)))
        if _needs_bias(lo, hi, j0, j1, is_causal, window):
            keys = torch.arange(j0, j1, device=s.device)
            per_head.masked_fill_(~visible(where[:, None], keys, window), float("-inf"))
        weights[:, :, j0:j1] = s.sub_(lse2).exp2_()  # P_ij = exp(s_ij - lse_i)
    return out
