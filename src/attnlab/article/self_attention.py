r"""The article's single-head self-attention, and the wrapper that stacks heads.

Both follow "Understanding and Coding Self-Attention, Multi-Head Attention,
Causal-Attention, and Cross-Attention in LLMs" (S. Raschka, 2024): parameters are drawn
with `torch.rand` in the order query, key, value, so that after `torch.manual_seed(123)`
they reproduce the article's numbers exactly.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from attnlab.functional import sdpa as F
from attnlab.rules._validation import check_positive_int, check_tokens, checking, entry

__all__ = ["MultiHeadAttentionWrapper", "SelfAttention"]


class SelfAttention(nn.Module):
    r"""Single-head scaled dot-product self-attention, as built in the article.

    $$
    \operatorname{SelfAttention}(X) =
    \operatorname{softmax}\!\left(\frac{(X W_q)(X W_k)^\top}{\sqrt{d_k}}\right) X W_v
    $$

    with $W_q, W_k \in \mathbb{R}^{d_{in} \times d_k}$ and
    $W_v \in \mathbb{R}^{d_{in} \times d_v}$, each initialised uniformly on $[0, 1)$.

    Args:
        d_in: Features per input token, $d_{in}$.
        d_out_kq: Size of query and key vectors, $d_k$.
        d_out_v: Size of value (and output) vectors, $d_v$.

    Shapes:
        x: `(t, d_in)` or `(b, t, d_in)`. Output: `(t, d_out_v)` or `(b, t, d_out_v)`.

    Raises:
        TypeError: If a size is not an int; in `forward`, if `x` is not a floating-point
            tensor.
        ValueError: If a size is not positive; in `forward`, if `x` has another rank,
            number of features, dtype or device than the module.

    Examples:
        >>> _ = torch.manual_seed(123)
        >>> sa = SelfAttention(d_in=3, d_out_kq=2, d_out_v=4)
        >>> sa(torch.ones(6, 3)).shape
        torch.Size([6, 4])
    """

    W_query: nn.Parameter
    """Query projection, `(d_in, d_out_kq)`, drawn first."""
    W_key: nn.Parameter
    """Key projection, `(d_in, d_out_kq)`, drawn second."""
    W_value: nn.Parameter
    """Value projection, `(d_in, d_out_v)`, drawn third."""

    def __init__(self, d_in: int, d_out_kq: int, d_out_v: int) -> None:
        super().__init__()
        self.d_in = check_positive_int("d_in", d_in)
        self.d_out_kq = check_positive_int("d_out_kq", d_out_kq)
        self.d_out_v = check_positive_int("d_out_v", d_out_v)
        # Filled one after the other from the global generator, so this order (query,
        # key, value) decides which numbers each matrix gets; `uniform_()` draws exactly
        # what `torch.rand` would, which is how the article's numbers come out.
        widths = {"W_query": d_out_kq, "W_key": d_out_kq, "W_value": d_out_v}
        for name, width in widths.items():
            matrix = torch.empty(d_in, width).uniform_()  # (d_in, width), U[0, 1)
            self.register_parameter(name, nn.Parameter(matrix))

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out_kq={self.d_out_kq}, d_out_v={self.d_out_v}"

    def _check(self, name: str, x: Tensor) -> Tensor:
        if not checking():
            return x
        owner = type(self).__name__
        return check_tokens(
            name, x, features=self.d_in, param="d_in", owner=owner, like=self.W_query
        )

    def _mask(self, x: Tensor) -> Tensor | None:
        """Which keys of `x` each token of `x` sees: None, all of them (variants narrow it)."""
        return None

    def _weights(self, x: Tensor, context: Tensor, mask: Tensor | None) -> Tensor:
        queries = x @ self.W_query  # (..., t_q, d_out_kq)
        keys = context @ self.W_key  # (..., t_k, d_out_kq)
        scores = F.attention_scores(queries, keys)  # (..., t_q, t_k)
        return F.scaled_softmax(scores, self.d_out_kq, mask)

    def _attend(self, x: Tensor, context: Tensor, mask: Tensor | None) -> Tensor:
        weights = self._weights(x, context, mask)  # (..., t_q, t_k)
        values = context @ self.W_value  # (..., t_k, d_out_v)
        return F.context_vectors(weights, values)  # (..., t_q, d_out_v)

    @entry
    def attention_weights(self, x: Tensor) -> Tensor:
        """Attention weights of `x` attending to itself.

        Args:
            x: Input tokens, `(t, d_in)` or `(b, t, d_in)`.

        Returns:
            Weights `(t, t)` or `(b, t, t)`; each row sums to 1.
        """
        x = self._check("x", x)
        return self._weights(x, x, self._mask(x))

    @entry
    def forward(self, x: Tensor) -> Tensor:
        """Context vectors of `x` attending to itself.

        Args:
            x: Input tokens, `(t, d_in)` or `(b, t, d_in)`.

        Returns:
            Context vectors, `(t, d_out_v)` or `(b, t, d_out_v)`.
        """
        x = self._check("x", x)
        return self._attend(x, x, self._mask(x))


class MultiHeadAttentionWrapper(nn.Module):
    r"""Multi-head attention as `num_heads` independent [`SelfAttention`][attnlab.SelfAttention]s.

    The heads run one after the other and their outputs are concatenated along the
    feature axis, so the output has `num_heads * d_out_v` features. It is the article's
    first, deliberately simple take on multi-head attention; `attnlab.MultiHeadAttention`
    computes the same thing with one fused projection.

    Args:
        d_in: Features per input token.
        d_out_kq: Size of query and key vectors of each head.
        d_out_v: Size of value vectors of each head.
        num_heads: Number of heads.

    Shapes:
        x: `(t, d_in)` or `(b, t, d_in)`. Output: `(..., t, num_heads * d_out_v)`.

    Raises:
        TypeError: As [`SelfAttention`][attnlab.SelfAttention], and if `num_heads` is not
            an int.
        ValueError: As [`SelfAttention`][attnlab.SelfAttention], and if `num_heads` is not
            positive.

    Examples:
        >>> _ = torch.manual_seed(123)
        >>> mha = MultiHeadAttentionWrapper(d_in=3, d_out_kq=2, d_out_v=1, num_heads=4)
        >>> mha(torch.ones(6, 3)).shape
        torch.Size([6, 4])
    """

    def __init__(self, d_in: int, d_out_kq: int, d_out_v: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        # Head r is built after heads 0 .. r-1, so it draws the next numbers of the stream.
        self.heads = nn.ModuleList()
        for _ in range(num_heads):
            self.heads.append(SelfAttention(d_in, d_out_kq, d_out_v))

    @entry
    def forward(self, x: Tensor) -> Tensor:
        """Concatenate the heads' context vectors along the last axis.

        Args:
            x: Input tokens, `(t, d_in)` or `(b, t, d_in)`.

        Returns:
            Context vectors, `(..., t, num_heads * d_out_v)`.
        """
        # nn.ModuleList types its items as nn.Module; each is a SelfAttention (built in
        # __init__), so this cast informs the type checker and drops no head.
        heads = cast("list[SelfAttention]", list(self.heads))
        if checking():
            first, owner = heads[0], type(self).__name__
            check_tokens("x", x, features=first.d_in, param="d_in", owner=owner, like=first.W_query)
        # Checked once here, for every head.
        per_head = [head._attend(x, x, None) for head in heads]  # num_heads x (..., t, d_out_v)
        return torch.cat(per_head, dim=-1)  # (..., t, num_heads * d_out_v)
