r"""Causal (masked) self-attention: each token attends only to itself and earlier tokens."""

from __future__ import annotations

from torch import Tensor

from attnlab.article.self_attention import SelfAttention
from attnlab.rules import masks

__all__ = ["CausalSelfAttention"]


class CausalSelfAttention(SelfAttention):
    r"""[`SelfAttention`][attnlab.SelfAttention] with a causal mask, as in GPT-style decoders.

    Scores of future tokens ($j > i$) are set to $-\infty$ before the softmax, so their
    weights are exactly 0 and each row of the remaining weights still sums to 1. This gives
    the same weights as zeroing the future weights after the softmax and renormalizing the
    rows, in one step.

    Parameters are created exactly as in `SelfAttention` (same shapes, same order).

    Args:
        d_in: Features per input token.
        d_out_kq: Size of query and key vectors.
        d_out_v: Size of value (and output) vectors.

    Shapes:
        x: `(t, d_in)` or `(b, t, d_in)`. Output: `(t, d_out_v)` or `(b, t, d_out_v)`.

    Raises:
        TypeError: As [`SelfAttention`][attnlab.SelfAttention].
        ValueError: As [`SelfAttention`][attnlab.SelfAttention].

    Examples:
        >>> import torch
        >>> _ = torch.manual_seed(123)
        >>> csa = CausalSelfAttention(d_in=3, d_out_kq=2, d_out_v=4)
        >>> w = csa.attention_weights(torch.rand(4, 3))
        >>> w.triu(diagonal=1).abs().sum().item()  # nothing above the diagonal
        0.0
    """

    def _mask(self, x: Tensor) -> Tensor:
        """Token $i$ sees tokens $0, \\dots, i$: `attention_weights` is zero above the
        diagonal, and `forward` mixes no future token."""
        t = x.shape[-2]
        return masks.band(t, t, "top-left", None, x.device)  # (t, t), over the batch
