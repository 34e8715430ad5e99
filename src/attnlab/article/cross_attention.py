r"""Cross-attention: queries from one sequence, keys and values from another."""

from __future__ import annotations

from torch import Tensor

from attnlab.article.self_attention import SelfAttention
from attnlab.rules._validation import check_same_batch, checking, entry

__all__ = ["CrossAttention"]


class CrossAttention(SelfAttention):
    r"""Single-head attention of the tokens of `x` over the tokens of `context`.

    $$
    \operatorname{CrossAttention}(X, C) =
    \operatorname{softmax}\!\left(\frac{(X W_q)(C W_k)^\top}{\sqrt{d_k}}\right) C W_v
    $$

    Queries come from `x` (e.g. a decoder's tokens), keys and values from `context`
    (e.g. an encoder's output, or an image's patches). The two sequences may have different
    lengths; both have `d_in` features. With `context = x` it is exactly
    [`SelfAttention`][attnlab.SelfAttention].

    Args:
        d_in: Features per token of `x` and of `context`.
        d_out_kq: Size of query and key vectors.
        d_out_v: Size of value (and output) vectors.

    Shapes:
        x: `(t_q, d_in)` or `(b, t_q, d_in)`. context: `(t_k, d_in)` or `(b, t_k, d_in)`.
        Output: `(t_q, d_out_v)` or `(b, t_q, d_out_v)`.

    Raises:
        TypeError: If a size is not an int; in `forward`, if `x` or `context` is not a
            floating-point tensor.
        ValueError: If a size is not positive; in `forward`, if `x` or `context` has
            another rank, number of features, dtype or device than the module, or they
            differ in batch size. An empty `context` is allowed: every query then gets a
            zero vector, as in PyTorch's `scaled_dot_product_attention`.

    Examples:
        >>> import torch
        >>> _ = torch.manual_seed(123)
        >>> ca = CrossAttention(d_in=3, d_out_kq=2, d_out_v=4)
        >>> ca(torch.rand(6, 3), torch.rand(8, 3)).shape
        torch.Size([6, 4])
    """

    def _check_pair(self, x: Tensor, context: Tensor) -> None:
        if not checking():
            return
        check_same_batch("context", self._check("x", x), self._check("context", context))

    @entry
    def attention_weights(self, x: Tensor, context: Tensor) -> Tensor:  # type: ignore[override]
        """Weights `(t_q, t_k)` or `(b, t_q, t_k)` of each token of `x` over the tokens of
        `context` (both as in `forward`); each row sums to 1.
        """
        self._check_pair(x, context)
        return self._weights(x, context, None)

    @entry
    def forward(self, x: Tensor, context: Tensor) -> Tensor:  # type: ignore[override]
        """Context vectors of the tokens of `x`, mixed from the values of `context`.

        Args:
            x: Query tokens, `(t_q, d_in)` or `(b, t_q, d_in)`.
            context: Key/value tokens, `(t_k, d_in)` or `(b, t_k, d_in)`.

        Returns:
            Context vectors, `(t_q, d_out_v)` or `(b, t_q, d_out_v)`.
        """
        self._check_pair(x, context)
        return self._attend(x, context, None)
