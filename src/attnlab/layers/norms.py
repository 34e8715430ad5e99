r"""Normalisations: RMSNorm and where QK-norm applies it.

RMSNorm (Zhang and Sennrich, 2019, https://arxiv.org/abs/1910.07467) divides by the root
mean square of the features and scales by a learned gain (by $1 + w$ in the Gemma
family). QK-norm applies it to queries and keys before RoPE, per head (Qwen3, Gemma 3)
or over the whole projection (OLMo 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from attnlab.rules._precision import compute_dtype
from attnlab.rules._validation import (
    check_bool,
    check_choice,
    check_positive_float,
    check_positive_int,
)

__all__ = ["QK_NORMS", "QKNorm", "QKNormSpec", "RMSNorm", "rms_normalize"]

QKNorm = Literal["head", "projection", "rotated"]
"""Where QK-norm normalises: `"head"`, each head's `head_dim` features (Qwen3, Gemma 3);
`"projection"`, the whole query or key projection before the split into heads (OLMo 2);
`"rotated"`, each head after RoPE, with no learned weight, in the layers that rotate
(Llama 4's L2 norm)."""

QK_NORMS: tuple[QKNorm, ...] = ("head", "projection", "rotated")


@dataclass(frozen=True)
class QKNormSpec:
    """A layer's QK-norm, as one object: an RMSNorm of the queries and of the keys.

    Attributes:
        over: Where it normalises ([`QKNorm`][attnlab.layers.norms.QKNorm]): `"head"`
            (weights `(head_dim,)` shared by the heads; Qwen3, Gemma 3) or
            `"projection"` (weights over the whole projection; OLMo 2).
        eps: The epsilon of the two norms (`rms_norm_eps` of a config).
        unit_offset: Scale by `1 + weight` (Gemma 3) instead of `weight`.
        values: Normalise each value head too, by an RMSNorm without weight (Gemma 4's
            `v_norm`); with `over="head"` only.

    Examples:
        >>> QKNormSpec("projection", eps=1e-5).unit_offset
        False
    """

    over: QKNorm = "head"
    eps: float = 1e-6
    unit_offset: bool = False
    values: bool = False

    def check(self, name: str = "qk_norm") -> QKNormSpec:
        """Return this spec if its fields are valid; raise naming `name.field` otherwise."""
        check_choice(f"{name}.over", self.over, QK_NORMS)
        check_positive_float(f"{name}.eps", self.eps)
        check_bool(f"{name}.unit_offset", self.unit_offset)
        if check_bool(f"{name}.values", self.values) and self.over != "head":
            raise ValueError(f"{name}.values needs {name}.over='head', got {self.over!r}")
        return self


def rms_normalize(x: Tensor, eps: float) -> Tensor:
    r"""$x / \sqrt{\operatorname{mean}(x^2) + \varepsilon}$ over the last dimension, unweighted.

    The core of every RMSNorm in the package: [`RMSNorm`][attnlab.layers.norms.RMSNorm] and the
    gated norm of [`GatedDeltaNet`][attnlab.layers.linear.GatedDeltaNet]. It computes in
    `compute_dtype(x.dtype)` (float32 for half-precision input) and returns that dtype,
    not `x`'s, so that each caller applies its weight where its model does.

    Examples:
        >>> rms_normalize(torch.tensor([3.0, -3.0]), 0.0)
        tensor([ 1., -1.])
    """
    wide = x.to(compute_dtype(x.dtype))
    return wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    r"""Root-mean-square normalisation over the last dimension, as `transformers` computes it.

    $$
    y = \frac{x}{\sqrt{\operatorname{mean}(x^2) + \varepsilon}} \odot w
    \quad\text{or, with `unit_offset`,}\quad
    y = \frac{x}{\sqrt{\operatorname{mean}(x^2) + \varepsilon}} \odot (1 + w)
    $$

    The second form is Gemma's: its checkpoints store $w$ around zero, and a fresh norm
    (`weight` zeros) is the identity scaling, as a plain one is with `weight` ones. Both
    compute in float32 for half-precision input and cast the result back, as Hugging
    Face's `Olmo2RMSNorm` and `Gemma3RMSNorm` do; in float32 and float64 this equals
    `torch.nn.RMSNorm` (and `Qwen3RMSNorm`) exactly in form.

    Args:
        dim: Size of the last dimension, the features normalised together.
        eps: Added to the mean square; positive.
        unit_offset: Scale by `1 + weight` (Gemma) instead of `weight`.

    Examples:
        >>> x = torch.tensor([[3.0, -3.0, 3.0, -3.0]])
        >>> RMSNorm(4)(x).detach()
        tensor([[ 1.0000, -1.0000,  1.0000, -1.0000]])
        >>> torch.equal(RMSNorm(4)(x), RMSNorm(4, unit_offset=True)(x))  # fresh: w=1, 1+w=1
        True
    """

    def __init__(self, dim: int, eps: float = 1e-6, *, unit_offset: bool = False) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.eps = check_positive_float("eps", eps)
        self.unit_offset = check_bool("unit_offset", unit_offset)
        init = torch.zeros if self.unit_offset else torch.ones
        self.weight = nn.Parameter(init(self.dim))

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, unit_offset={self.unit_offset}"

    def forward(self, x: Tensor) -> Tensor:
        """Normalise `x` `(..., dim)` over its last dimension; the same shape and dtype."""
        normed = rms_normalize(x, self.eps)
        weight = self.weight.to(normed.dtype)
        return (normed * (1.0 + weight if self.unit_offset else weight)).to(x.dtype)
