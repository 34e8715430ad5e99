r"""Pure functions of attention: the math that every module in attnlab calls.

Scaled dot-product attention (Vaswani et al., 2017, "Attention Is All You Need",
https://arxiv.org/abs/1706.03762) in four steps, one function each:

1. scores $\omega = Q K^\top$ ([`attention_scores`][attnlab.functional.attention_scores]);
2. weights $\alpha = \operatorname{softmax}(\omega / \sqrt{d_k})$, with an optional mask
   ([`scaled_softmax`][attnlab.functional.scaled_softmax]);
3. context vectors $z = \alpha V$ ([`context_vectors`][attnlab.functional.context_vectors]);
4. for decoders, a causal mask that hides later tokens
   ([`causal_mask`][attnlab.functional.causal_mask]).

Shapes follow PyTorch: any leading batch dimensions, then sequence, then features.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnlab._validation import check_positive_int

__all__ = [
    "attention_scores",
    "causal_mask",
    "context_vectors",
    "scaled_softmax",
]


def attention_scores(queries: Tensor, keys: Tensor) -> Tensor:
    r"""Unnormalized attention weights $\omega_{ij} = q^{(i)} \cdot k^{(j)}$.

    Args:
        queries: Query vectors, shape `(..., t_q, d_k)`.
        keys: Key vectors, shape `(..., t_k, d_k)`.

    Returns:
        The scores $Q K^\top$, shape `(..., t_q, t_k)`.

    Raises:
        ValueError: If the feature sizes of `queries` and `keys` differ.

    Examples:
        >>> q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> k = torch.tensor([[1.0, 1.0], [3.0, 0.0], [0.0, 1.0]])
        >>> attention_scores(q, k)
        tensor([[1., 3., 0.],
                [2., 0., 2.]])
    """
    if queries.shape[-1] != keys.shape[-1]:
        raise ValueError(
            f"queries and keys must have the same feature size d_k, got "
            f"queries.shape={tuple(queries.shape)} and keys.shape={tuple(keys.shape)}"
        )
    return queries @ keys.transpose(-2, -1)  # (..., t_q, t_k)


def scaled_softmax(scores: Tensor, d_k: int, mask: Tensor | None = None) -> Tensor:
    r"""Attention weights $\alpha = \operatorname{softmax}(\omega / \sqrt{d_k})$ over the last axis.

    Dividing by $\sqrt{d_k}$ keeps the variance of the scores near 1 whatever the key size,
    so the softmax does not saturate as $d_k$ grows.

    Where `mask` is False the score is replaced by $-\infty$ before the softmax, so that
    position receives weight exactly 0 and the remaining weights of the row still sum to 1.
    A row whose positions are all masked gets all-zero weights (not NaN), as in
    `torch.nn.functional.scaled_dot_product_attention`.

    Args:
        scores: Unnormalized weights, shape `(..., t_q, t_k)`.
        d_k: Size of the query and key vectors.
        mask: Optional bool tensor broadcastable to `scores`; True where a query may
            attend to a key.

    Returns:
        Weights of the same shape as `scores`; each unmasked row sums to 1.

    Raises:
        TypeError: If `mask` is not a bool tensor.
        ValueError: If `d_k` is not a positive int or `mask` does not broadcast.

    Examples:
        >>> scaled_softmax(torch.tensor([0.0, 2.0]), d_k=4)
        tensor([0.2689, 0.7311])
        >>> scaled_softmax(torch.tensor([[0.0, 2.0]]), d_k=4, mask=torch.tensor([[True, False]]))
        tensor([[1., 0.]])
    """
    check_positive_int("d_k", d_k)
    if mask is None:
        return torch.softmax(scores / math.sqrt(d_k), dim=-1)
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a bool tensor (True = attend), got {got}")
    try:
        masked = scores.masked_fill(~mask, float("-inf"))
    except RuntimeError:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape "
            f"{tuple(scores.shape)}"
        ) from None
    weights = torch.softmax(masked / math.sqrt(d_k), dim=-1)
    # A fully masked row is all -inf, and softmax of it is 0/0 = NaN; give it zeros instead.
    return weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)


def context_vectors(weights: Tensor, values: Tensor) -> Tensor:
    r"""Context vectors $z^{(i)} = \sum_j \alpha_{ij} v^{(j)}$, i.e. $Z = \alpha V$.

    Args:
        weights: Attention weights, shape `(..., t_q, t_k)`.
        values: Value vectors, shape `(..., t_k, d_v)`.

    Returns:
        One context vector per query, shape `(..., t_q, d_v)`.

    Examples:
        >>> context_vectors(torch.tensor([[0.25, 0.75]]), torch.tensor([[4.0], [8.0]]))
        tensor([[7.]])
    """
    return weights @ values  # (..., t_q, d_v)


def causal_mask(
    t_q: int, t_k: int | None = None, *, device: torch.device | str | None = None
) -> Tensor:
    r"""Bool mask that lets query $i$ see key $j$ only when $j \le i$.

    True marks a position that takes part (the convention of
    `torch.nn.functional.scaled_dot_product_attention`). The diagonal is aligned to the
    top-left corner, as PyTorch's `is_causal=True` does when `t_q != t_k`.

    Args:
        t_q: Number of queries (rows).
        t_k: Number of keys (columns); defaults to `t_q`.
        device: Where to create the mask.

    Returns:
        A bool tensor of shape `(t_q, t_k)`, True on and below the diagonal.

    Examples:
        >>> causal_mask(3)
        tensor([[ True, False, False],
                [ True,  True, False],
                [ True,  True,  True]])
    """
    t_k = t_q if t_k is None else t_k
    if isinstance(t_q, bool) or not isinstance(t_q, int) or t_q < 0:
        raise ValueError(f"t_q must be a non-negative int, got {t_q!r}")
    if isinstance(t_k, bool) or not isinstance(t_k, int) or t_k < 0:
        raise ValueError(f"t_k must be a non-negative int, got {t_k!r}")
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril()
