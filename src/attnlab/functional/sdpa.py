r"""Scaled dot-product attention from scratch: the math that every module in attnlab calls.

Scaled dot-product attention (Vaswani et al., 2017, "Attention Is All You Need",
https://arxiv.org/abs/1706.03762) in three steps, one function each:

1. scores $\omega = Q K^\top$ ([`attention_scores`][attnlab.functional.sdpa.attention_scores]);
2. weights $\alpha = \operatorname{softmax}(\omega / \sqrt{d_k})$, with an optional mask
   ([`scaled_softmax`][attnlab.functional.sdpa.scaled_softmax]);
3. context vectors $z = \alpha V$ ([`context_vectors`][attnlab.functional.sdpa.context_vectors]).

For decoders, the causal mask that hides later tokens comes from
[`masks.causal`][attnlab.rules.masks.causal], the home of every mask builder.

[`scaled_dot_product_attention`][attnlab.functional.sdpa.scaled_dot_product_attention] puts the
steps together with the exact semantics of PyTorch's
`torch.nn.functional.scaled_dot_product_attention` (masks, dropout, custom scale,
grouped-query attention), and
[`attention_weights`][attnlab.functional.sdpa.attention_weights] returns the weights it uses.

Shapes follow PyTorch: any leading batch dimensions, then sequence, then features.

Each function checks its arguments when it is called from outside attnlab, and trusts
them when a module of attnlab that checked them already calls it (the rule of
[`entry`][attnlab.rules._validation.entry]): the arguments of a call are checked once, at
the outermost public boundary.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn.attention.bias import CausalBias, CausalVariant

from attnlab.rules import masks
from attnlab.rules._precision import (
    autocast_inputs,
    autocast_kernel,
    compute_dtype,
    softmax_scale,
)
from attnlab.rules._validation import (
    broadcast_shape,
    check_attn_mask,
    check_bool,
    check_broadcast,
    check_min_rank,
    check_positive_int,
    check_probability,
    check_qkv,
    check_same_dtype_device,
    check_scale,
    check_score_changes,
    check_tensor,
    checking,
    entry,
)
from attnlab.rules.masks import Alignment

__all__ = [
    "attention_scores",
    "attention_weights",
    "context_vectors",
    "scaled_dot_product_attention",
    "scaled_softmax",
]


def _check_product_operands(
    left: tuple[str, Tensor, str],
    right: tuple[str, Tensor, str],
    *,
    inner_axis: int,
    mismatch: str,
) -> None:
    """Checks shared by the teaching products `left @ right` (or `left @ right.mT`).

    `left` and `right` are `(name, tensor, layout)`; the last axis of `left` must match
    axis `inner_axis` of `right`, else `mismatch` is raised, formatted with both shapes
    (`left`, `right`) and both sizes (`left_size`, `right_size`).
    """
    (a_name, a, a_layout), (b_name, b, b_layout) = left, right
    check_tensor(a_name, a)
    check_tensor(b_name, b)
    check_min_rank(a_name, a, 1, a_layout)
    check_min_rank(b_name, b, 2, b_layout)
    if a.shape[-1] != b.shape[inner_axis]:
        raise ValueError(
            mismatch.format(
                left=tuple(a.shape),
                right=tuple(b.shape),
                left_size=a.shape[-1],
                right_size=b.shape[inner_axis],
            )
        )
    check_same_dtype_device(a_name, a, **{b_name: b})
    check_broadcast(
        "batch dimensions", **{a_name: tuple(a.shape[:-2]), b_name: tuple(b.shape[:-2])}
    )


@entry
def attention_scores(queries: Tensor, keys: Tensor) -> Tensor:
    r"""Unnormalized attention weights $\omega_{ij} = q^{(i)} \cdot k^{(j)}$.

    Args:
        queries: Query vectors, shape `(..., t_q, d_k)`, or one query `(d_k,)`.
        keys: Key vectors, shape `(..., t_k, d_k)`.

    Returns:
        The scores $Q K^\top$, shape `(..., t_q, t_k)` (`(..., t_k)` for one query).

    Raises:
        TypeError: If an input is not a floating-point tensor.
        ValueError: If the feature sizes of `queries` and `keys` differ, `keys` has fewer
            than 2 dimensions, the batch dimensions do not broadcast, or the dtypes or
            devices differ.

    Examples:
        >>> q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> k = torch.tensor([[1.0, 1.0], [3.0, 0.0], [0.0, 1.0]])
        >>> attention_scores(q, k)
        tensor([[1., 3., 0.],
                [2., 0., 2.]])
    """
    if checking():
        _check_product_operands(
            ("queries", queries, "(..., t_q, d_k) or (d_k,)"),
            ("keys", keys, "(..., t_k, d_k)"),
            inner_axis=-1,
            mismatch="queries and keys must have the same feature size d_k, got "
            "queries.shape={left} and keys.shape={right}",
        )
    return queries @ keys.transpose(-2, -1)  # (..., t_q, t_k)


@entry
def scaled_softmax(scores: Tensor, d_k: int, mask: Tensor | None = None) -> Tensor:
    r"""Attention weights $\alpha = \operatorname{softmax}(\omega / \sqrt{d_k})$ over the last axis.

    Dividing by $\sqrt{d_k}$ keeps the variance of the scores near 1 whatever the key size,
    so the softmax does not saturate as $d_k$ grows.

    Where `mask` is False the score is replaced by $-\infty$ before the softmax, so that
    position receives weight exactly 0 and the remaining weights of the row still sum to 1.
    A row whose positions are all masked (or all $-\infty$ already) gets all-zero weights,
    not NaN, as in `torch.nn.functional.scaled_dot_product_attention`.

    Args:
        scores: Unnormalized weights, shape `(..., t_q, t_k)`.
        d_k: Size of the query and key vectors.
        mask: Optional bool tensor broadcastable to `scores`; True where a query may
            attend to a key.

    Returns:
        Weights of the same shape as `scores`; each row sums to 1, except a fully masked
        row, which is all zeros.

    Raises:
        TypeError: If `scores` is not a floating-point tensor, `d_k` not an int or `mask`
            not a bool tensor.
        ValueError: If `d_k` is not positive, `scores` is 0-d, or `mask` is on another
            device or does not broadcast to `scores`' shape.

    Examples:
        >>> scaled_softmax(torch.tensor([0.0, 2.0]), d_k=4)
        tensor([0.2689, 0.7311])
        >>> scaled_softmax(torch.tensor([[0.0, 2.0]]), d_k=4, mask=torch.tensor([[True, False]]))
        tensor([[1., 0.]])
    """
    if checking():
        check_tensor("scores", scores)
        check_min_rank("scores", scores, 1, "(..., t_q, t_k)")
        check_positive_int("d_k", d_k)
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
                raise TypeError(f"mask must be a bool tensor (True = attend), got {got}")
            if mask.device != scores.device:
                raise ValueError(f"mask is on {mask.device} but scores is on {scores.device}")
            if broadcast_shape(tuple(mask.shape), tuple(scores.shape)) != tuple(scores.shape):
                raise ValueError(
                    f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' "
                    f"shape {tuple(scores.shape)}"
                )
    # Divided, not multiplied by 1 / sqrt(d_k): the article's own numbers, to the last bit.
    return _softmax_or_zeros(with_mask(scores, mask) / math.sqrt(d_k))


@entry
def context_vectors(weights: Tensor, values: Tensor) -> Tensor:
    r"""Context vectors $z^{(i)} = \sum_j \alpha_{ij} v^{(j)}$, i.e. $Z = \alpha V$.

    Args:
        weights: Attention weights, shape `(..., t_q, t_k)`, or one query's `(t_k,)`.
        values: Value vectors, shape `(..., t_k, d_v)`.

    Returns:
        One context vector per query, shape `(..., t_q, d_v)` (`(..., d_v)` for one query).

    Raises:
        TypeError: If an input is not a floating-point tensor.
        ValueError: If `weights` has not one weight per row of `values`, `values` has
            fewer than 2 dimensions, the batch dimensions do not broadcast, or the dtypes
            or devices differ.

    Examples:
        >>> context_vectors(torch.tensor([[0.25, 0.75]]), torch.tensor([[4.0], [8.0]]))
        tensor([[7.]])
    """
    if checking():
        _check_product_operands(
            ("weights", weights, "(..., t_q, t_k) or (t_k,)"),
            ("values", values, "(..., t_k, d_v)"),
            inner_axis=-2,
            mismatch="weights has {left_size} keys per query but values has {right_size} "
            "positions; they must match (weights.shape={left}, values.shape={right})",
        )
    return weights @ values  # (..., t_q, d_v)


def _softmax_or_zeros(logits: Tensor) -> Tensor:
    """Softmax over the last axis, with all-zero weights for rows that are entirely -inf."""
    # A row whose every logit is -inf (every key masked) has no defined softmax: 0/0 = NaN.
    # PyTorch's SDPA returns zero weights there (its "safe softmax"), and so do we. Filling
    # those rows with 0 *before* the softmax too keeps NaN out of the backward pass: the
    # gradient that reaches a fully masked row is then exactly 0, as in PyTorch.
    blocked = torch.isneginf(logits).all(dim=-1, keepdim=True)  # (..., t_q, 1)
    weights = torch.softmax(logits.masked_fill(blocked, 0.0), dim=-1)
    return weights.masked_fill(blocked, 0.0)


def with_mask(logits: Tensor, attn_mask: Tensor | None) -> Tensor:
    """`logits` with `attn_mask` applied, broadcast together: `-inf` where a bool mask is
    False, a float mask added."""
    if attn_mask is None:
        return logits
    if attn_mask.dtype == torch.bool:
        # False = this key is hidden from this query: its score becomes -inf, weight 0.
        return logits.masked_fill(~attn_mask, float("-inf"))
    # A float mask is a bias added to the scores (-inf hides, finite values nudge).
    return logits + attn_mask.to(logits.dtype)


def with_sinks(logits: Tensor, sink_logits: Tensor) -> Tensor:
    """`logits (..., H, L, S)` with each head's learned sink logit as one more key, `S + 1`.

    The one home of gpt-oss's sinks for the kernels that see the scores whole (this
    module's, and PyTorch's SDPA with the sink as an extra key): the sink is one more
    entry of each row's softmax, the same for every query of its head, with no value;
    the softmax's last column is its share. Kernels that return a log-sum-exp instead
    merge it after the fact ([`merge_sinks`][attnlab.functional.flash.merge_sinks]).
    `logits` may lack the head dimension (a mask `(L, S)`): it is broadcast to `(H, L, S)`.
    """
    sink = sink_logits.to(logits.dtype)[:, None, None]  # (H, 1, 1): one per head
    lead = torch.broadcast_shapes(logits.shape[:-2], sink.shape[:-2])  # type: ignore[no-untyped-call]
    t_q, t_k = logits.shape[-2], logits.shape[-1]
    column = sink.expand(*lead, t_q, 1)  # (..., H, L, 1)
    return torch.cat([logits.expand(*lead, t_q, t_k), column], dim=-1)  # (..., H, L, S + 1)


def repeat_heads(x: Tensor, num_heads: int) -> Tensor:
    """Repeat each key/value head so that `num_heads` query heads share it (GQA)."""
    # Head g of x serves query heads g * r ... g * r + r - 1, as in PyTorch's reference.
    return x.repeat_interleave(num_heads // x.size(-3), dim=-3)  # (..., num_heads, s, e)


def causal_bias_alignment(bias: CausalBias) -> Alignment:
    """Where PyTorch's `CausalBias` puts its diagonal, in `attnlab.rules.masks`' terms.

    Upper left: query i sees keys 0..i. Lower right: the queries are the last `L`
    positions of the keys' sequence, so the diagonal moves right by `S - L`.
    """
    return "top-left" if bias.variant == CausalVariant.UPPER_LEFT else "bottom-right"


def causal_bias_mask(bias: CausalBias, device: torch.device) -> Tensor:
    """The bool mask (True = attend) of PyTorch's `causal_upper_left` / `causal_lower_right`."""
    align = causal_bias_alignment(bias)
    return masks.band(bias.seq_len_q, bias.seq_len_kv, align, None, device)  # (L, S)


def _check_attention_args(
    query: object,
    key: object,
    value: object | None,
    attn_mask: object,
    dropout_p: object,
    is_causal: object,
    scale: object,
    enable_gqa: object,
) -> tuple[Tensor, Tensor, Tensor | None, tuple[int, ...]]:
    """Validate the arguments shared by the two public functions.

    Returns the tensors and the shape of the attention weights, `(..., L, S)`.
    `attn_mask` may still be a `CausalBias` here (it is materialized after the checks).
    """
    q, k, v = check_qkv(query, key, value)
    check_probability("dropout_p", dropout_p)
    check_scale("scale", scale)
    check_bool("is_causal", is_causal)
    if check_bool("enable_gqa", enable_gqa):
        check_min_rank("query", q, 3, "(..., Hq, L, E) with enable_gqa=True")
        for name, t in (("key", k), ("value", v)):
            if t is None:
                continue
            check_min_rank(name, t, 3, "(..., H, S, E) with enable_gqa=True")
            if q.size(-3) % t.size(-3) != 0:
                raise ValueError(
                    f"with enable_gqa=True the {t.size(-3)} heads of {name} must divide the "
                    f"{q.size(-3)} heads of query (query.shape={tuple(q.shape)}, "
                    f"{name}.shape={tuple(t.shape)})"
                )
        k_batch = (*k.shape[:-3], q.size(-3))
        v_batch = None if v is None else (*v.shape[:-3], q.size(-3))
    else:
        k_batch = tuple(k.shape[:-2])
        v_batch = None if v is None else tuple(v.shape[:-2])
    batches = [tuple(q.shape[:-2]), k_batch] + ([] if v_batch is None else [v_batch])
    batch = broadcast_shape(*batches)
    if batch is None:
        shapes = ", ".join(
            f"{n}.shape={tuple(t.shape)}"
            for n, t in (("query", q), ("key", k), ("value", v))
            if t is not None
        )
        raise ValueError(
            f"the batch (and head) dimensions of query, key and value do not broadcast: "
            f"{shapes}; for fewer key/value heads than query heads pass enable_gqa=True"
        )
    target = (*batch, q.shape[-2], k.shape[-2])  # (..., L, S)
    check_attn_mask("attn_mask", attn_mask, target, q)
    masks.check_causal_mask(attn_mask, is_causal)
    return q, k, v, target


def _weights(
    query: Tensor,
    key: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | Tensor | None,
    enable_gqa: bool,
    softcap: float | None,
    sink_logits: Tensor | None,
) -> Tensor:
    if enable_gqa:
        key = repeat_heads(key, query.size(-3))  # (..., Hq, S, E)
    # softmax_scale counts E = 0 features as 1: every score is 0 then whatever the scale
    # (PyTorch then averages the values), and 1 / sqrt(0) would raise ZeroDivisionError.
    s = softmax_scale(query.size(-1), scale)
    logits = attention_scores(query, key) * s  # (..., L, S)
    if softcap is not None:
        # Gemma 2: squash the scores smoothly into (-softcap, softcap) before the mask,
        # so no score can grow without bound; small scores pass almost unchanged.
        logits = softcap * torch.tanh(logits / softcap)
    if is_causal:
        # The relation itself: the lengths come from tensors checked at the boundary.
        attn_mask = masks.band(query.size(-2), key.size(-2), "top-left", None, query.device)
    logits = with_mask(logits, attn_mask)
    if sink_logits is None:
        weights = _softmax_or_zeros(logits)  # (..., L, S)
    else:
        # gpt-oss: one more logit per head joins every row's softmax and takes its share
        # of the weight, but has no value, so a row's weights sum to less than 1. A row
        # whose keys are all masked gives the sink everything: zero weights, no NaN.
        with_sink = with_sinks(logits, sink_logits)  # (..., H, L, S + 1)
        weights = torch.softmax(with_sink, dim=-1)[..., :-1]  # (..., H, L, S)
    if dropout_p > 0.0:
        # Drop whole weights, not values, and rescale the survivors by 1 / (1 - p), like
        # PyTorch; the same seed draws the same dropout mask as torch's math backend.
        weights = torch.nn.functional.dropout(weights, p=dropout_p, training=True)
    return weights


@autocast_kernel(inputs=4)
def _attend(
    query: Tensor,
    key: Tensor,
    value: Tensor | None,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | Tensor | None,
    enable_gqa: bool,
    softcap: float | None = None,
    sink_logits: Tensor | None = None,
) -> Tensor:
    """The weights (`value` None) or the output of attention, without the checks."""
    if isinstance(attn_mask, CausalBias):
        attn_mask = causal_bias_mask(attn_mask, query.device)  # (L, S)
    wide = compute_dtype(query.dtype)  # float16/bfloat16 are attended in float32
    query, key = query.to(wide), key.to(wide)
    args = (dropout_p, is_causal, scale, enable_gqa, softcap, sink_logits)
    weights = _weights(query, key, attn_mask, *args)
    if value is None:
        return weights  # (..., L, S)
    value = value.to(wide)
    if enable_gqa:
        value = repeat_heads(value, query.size(-3))  # (..., Hq, S, Ev)
    return context_vectors(weights, value)  # (..., L, Ev)


_Options = tuple[float, bool, float | Tensor | None, bool]
"""`(dropout_p, is_causal, scale, enable_gqa)`, as the two public functions take them."""


def _checked_attend(
    query: Tensor,
    key: Tensor,
    value: Tensor | None,
    attn_mask: Tensor | None,
    opts: _Options,
    softcap: float | None,
    sink_logits: Tensor | None,
    window: int | None = None,
) -> Tensor:
    """The body of the two public functions: their checks, then `_attend`.

    The inputs are checked as autocast casts them (as they came with validation off),
    so that `_attend` finds them cast and does not convert them a second time.
    """
    if checking():
        if isinstance(query, Tensor):  # else the checks name what query is instead
            query, key = autocast_inputs(query, key)
            value, attn_mask = autocast_inputs(value, attn_mask, device=query.device)
        q, _, _, target = _check_attention_args(query, key, value, attn_mask, *opts)
        check_score_changes(softcap, sink_logits, q, target[-3] if len(target) > 2 else None)
        masks.check_window(window, attn_mask)
    if window is not None:  # the window is the mask, causal (top-left) included
        t_q, t_k = query.shape[-2], key.shape[-2]
        attn_mask = masks.band(t_q, t_k, "top-left", window, query.device)  # (L, S)
        opts = (opts[0], False, *opts[2:])
    return _attend(query, key, value, attn_mask, *opts, softcap, sink_logits)


@entry
def attention_weights(
    query: Tensor,
    key: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | Tensor | None = None,
    enable_gqa: bool = False,
    *,
    softcap: float | None = None,
    sink_logits: Tensor | None = None,
) -> Tensor:
    r"""Attention weights $\alpha$, the part of scaled dot-product attention before the values.

    $$
    \alpha = \operatorname{dropout}\left(\operatorname{softmax}\left(s\, Q K^\top + B\right)\right)
    $$

    [`scaled_dot_product_attention`][attnlab.functional.sdpa.scaled_dot_product_attention]
    returns $\alpha V$ with these very weights. The arguments are the same, without `value`,
    which the weights do not depend on; see there for the details of each.

    Args:
        query: Queries, shape `(..., L, E)` (`(..., Hq, L, E)` with `enable_gqa`).
        key: Keys, shape `(..., S, E)` (`(..., H, S, E)` with `enable_gqa`).
        attn_mask: None, a bool mask (True = attend), a float mask added to the scores,
            broadcastable to `(..., L, S)`, or PyTorch's `causal_upper_left(L, S)` /
            `causal_lower_right(L, S)` from `torch.nn.attention.bias`.
        dropout_p: Probability of zeroing each weight; the survivors are scaled by
            $1 / (1 - p)$. Applied whenever it is > 0 (pass 0.0 in evaluation).
        is_causal: Hide key $j$ from query $i$ when $j > i$ (top-left aligned).
        scale: Factor $s$ applied to the scores, a finite number (Python or NumPy) or a
            0-d tensor; default $1 / \sqrt{E}$.
        enable_gqa: Let `H` key heads serve `Hq` query heads (`H` must divide `Hq`).
        softcap: Logit softcapping, as in `scaled_dot_product_attention`.
        sink_logits: Learned sink logits `(H,)`, as in `scaled_dot_product_attention`.

    Returns:
        Weights of shape `(..., L, S)`, in the query's dtype (the autocast dtype inside
        `torch.autocast`). Each row sums to 1 (without dropout), except a row whose keys
        are all masked, which is all zeros; with `sink_logits`, a row sums to 1 minus the
        sink's share.

    Raises:
        TypeError: If an argument has the wrong type (non-float tensors, a mask that is
            neither bool nor float, a non-bool flag, a scale that is no real number).
        ValueError: If shapes, dtypes or devices disagree, the mask does not broadcast (or a
            `CausalBias` has other lengths), `dropout_p` is not in [0, 1), `scale` is not
            finite, both `attn_mask` and `is_causal` are given, `softcap` is not
            positive, or `sink_logits` has not one logit per head.

    Examples:
        >>> q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> k = torch.tensor([[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
        >>> attention_weights(q, k, scale=1.0)
        tensor([[0.7870, 0.1065, 0.1065],
                [0.1065, 0.7870, 0.1065]])
        >>> attention_weights(q, k, is_causal=True, scale=1.0)
        tensor([[1.0000, 0.0000, 0.0000],
                [0.1192, 0.8808, 0.0000]])
        >>> attention_weights(q, k, attn_mask=torch.tensor([[True, True, True], [False] * 3]))
        tensor([[0.6728, 0.1636, 0.1636],
                [0.0000, 0.0000, 0.0000]])
    """
    opts = (dropout_p, is_causal, scale, enable_gqa)
    return _checked_attend(query, key, None, attn_mask, opts, softcap, sink_logits)


@entry
def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | Tensor | None = None,
    enable_gqa: bool = False,
    *,
    window: int | None = None,
    softcap: float | None = None,
    sink_logits: Tensor | None = None,
) -> Tensor:
    r"""Scaled dot-product attention from scratch, with the semantics of PyTorch's.

    $$
    \operatorname{Attention}(Q, K, V) =
    \operatorname{dropout}\left(\operatorname{softmax}\left(s\, Q K^\top + B\right)\right) V,
    \qquad s = \frac{1}{\sqrt{E}} \text{ by default}
    $$

    A drop-in replacement for `torch.nn.functional.scaled_dot_product_attention` with the
    same arguments, shapes and results, written as plain matmul, mask, softmax, dropout,
    matmul (the weights come from
    [`attention_weights`][attnlab.functional.sdpa.attention_weights]):

    - `attn_mask` is a bool mask where **True takes part** in attention, or a float mask
      *added* to the scores ($-\infty$ hides a key); it broadcasts to `(..., L, S)`.
    - `is_causal=True` hides key $j$ from query $i$ when $j > i$, aligned to the
      **top-left** corner when `L != S` (see `attnlab.rules.masks.causal` for bottom-right).
      PyTorch's `causal_upper_left(L, S)` and `causal_lower_right(L, S)` (from
      `torch.nn.attention.bias`) are accepted as `attn_mask` and mean the same masks.
    - A query whose keys are **all masked** gets an output of zeros, not NaN. That is what
      PyTorch 2.13 returns on the CPU with every backend, including the math one (its
      "safe softmax"); the reference code in PyTorch's docstring would give NaN.
    - Leading dimensions broadcast; with `enable_gqa=True`, `H` key/value heads are each
      repeated `Hq / H` times to serve `Hq` query heads (grouped-query attention).
    - Dropout is applied whenever `dropout_p > 0`: pass `0.0` in evaluation. Seeded the
      same, it draws the same dropout mask as PyTorch's math backend.
    - float16 and bfloat16 inputs are computed in float32 and the result rounded back, as
      PyTorch does on the CPU, so that large scores neither overflow nor lose their digits.
    - Inside `torch.autocast`, the inputs (and a float mask) are cast to the autocast dtype
      and the output has that dtype, as PyTorch's SDPA does; float64 stays float64.

    Args:
        query: Queries, shape `(..., L, E)` (`(..., Hq, L, E)` with `enable_gqa`).
        key: Keys, shape `(..., S, E)` (`(..., H, S, E)` with `enable_gqa`).
        value: Values, shape `(..., S, Ev)` (`(..., H, S, Ev)` with `enable_gqa`).
        attn_mask: None, a bool mask (True = attend), a float mask (of the query's dtype
            or float32) added to the scores, broadcastable to `(..., L, S)`, or a
            `CausalBias` of `L` queries and `S` keys.
        dropout_p: Probability of zeroing each attention weight.
        is_causal: Apply a top-left aligned causal mask; not together with `attn_mask`.
        scale: Factor $s$ applied to the scores, a finite number (Python or NumPy) or a
            0-d tensor; default $1 / \sqrt{E}$.
        enable_gqa: Let `H` key/value heads serve `Hq` query heads (`H` must divide `Hq`).
        window: Sliding-window attention, attnlab's one addition to PyTorch's arguments:
            also hide key $j$ from query $i$ when $j \le i - w$, so each query sees its
            last `window` keys, itself included. A window is causal, so it implies
            `is_causal` (top-left, as [`flash_attention`][attnlab.functional.flash.flash_attention]
            and every module take it); not together with `attn_mask`.
        softcap: Logit softcapping (Gemma 2): the scaled scores $x$ become
            $c \tanh(x / c)$ with $c$ = `softcap` before the mask is applied, so none
            exceeds $c$ in size. A positive float; None (the default) leaves them as
            they are.
        sink_logits: Learned attention sinks (gpt-oss): one logit per head, shape `(H,)` for
            the weights' head dimension `(..., H, L, S)` (the query heads with
            `enable_gqa`). Each joins its head's softmax as one more entry with no
            value, so it takes weight without adding to the output; differentiable.

    Returns:
        The context vectors, shape `(..., L, Ev)`, in the query's dtype (the autocast dtype
        inside `torch.autocast`).

    Raises:
        TypeError: If an argument has the wrong type (non-float tensors, a mask that is
            neither bool nor float, a non-bool flag, a scale that is no real number).
        ValueError: If shapes disagree (feature size of query and key, positions of key and
            value, batch or head dimensions), dtypes or devices differ, the mask does not
            broadcast (or a `CausalBias` has other lengths), `dropout_p` is not in [0, 1),
            `scale` is not finite, both `attn_mask` and `is_causal` (or `window`) are
            given, `window` is not a positive int, `softcap` is not a positive number,
            or `sink_logits` is not one logit per head (shape `(H,)`) on the query's device.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 6)
        >>> out = scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> out.shape
        torch.Size([2, 4, 3, 6])
        >>> reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> torch.allclose(out, reference, atol=1e-6)
        True
        >>> blocked = torch.zeros(3, 5, dtype=torch.bool)  # no query may see any key
        >>> scaled_dot_product_attention(q, k, v, attn_mask=blocked).abs().max()
        tensor(0.)
        >>> from torch.nn.attention.bias import causal_lower_right
        >>> out = scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 5))
        >>> torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(
        ...     q, k, v, attn_mask=causal_lower_right(3, 5)), atol=1e-6)
        True
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     scaled_dot_product_attention(q, k, v, scale=torch.tensor(0.5)).dtype
        torch.bfloat16
    """
    opts = (dropout_p, is_causal, scale, enable_gqa)
    return _checked_attend(query, key, value, attn_mask, opts, softcap, sink_logits, window)
