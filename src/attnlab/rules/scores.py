r"""The score rule: how one call turns $q \cdot k$ into the weights of its softmax.

Every attention layer hands its kernel one [`ScoreRule`][attnlab.rules.scores.ScoreRule]
instead of a list of keywords, the way `torch.nn.attention.flex_attention` takes one
`score_mod`: the scale, which keys each query may see (causal, its alignment, a sliding
window), Gemma 2's softcap, gpt-oss's learned sink logits and ALiBi's slopes. The kernel
registry ([`attend`][attnlab.functional.backends.attend]) takes the rule and each backend
reads the fields it implements, so a new rule is one field here and one branch per
kernel, not a keyword threaded through every layer and every signature.

The rule does not check its fields: the layer that builds it checked them at its
boundary (its constructor, its `forward`), and the public kernels check the keywords
they take from users.

ALiBi (Press et al., 2022, "Train Short, Test Long", https://arxiv.org/abs/2108.12409;
BLOOM, MPT) adds to each score a bias that falls linearly with the distance from the
query to the key, one slope per head, instead of rotating or embedding positions. Its
slopes have one home, [`flex.alibi_slopes`][attnlab.functional.flex.alibi_slopes], and
its bias one formula, [`alibi_bias`][attnlab.rules.scores.alibi_bias], which the kernels
evaluate over the whole score matrix (`"torch"`, `"scratch"`) or tile by tile
(`"flash"`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypedDict

import torch
from torch import Tensor

from attnlab.rules._validation import check_positive_float, check_tensor

if TYPE_CHECKING:  # for annotations only: at run time it would lengthen the kernels' imports
    from attnlab.rules.masks import Alignment

__all__ = [
    "RuleKeywords",
    "ScoreRule",
    "alibi_bias",
    "check_alibi_slopes",
    "check_temperature",
    "temperature_tuned",
]


@dataclass(frozen=True, eq=False)
class ScoreRule:
    r"""The rules of one attention call's scores, read by every backend.

    The scores of query $i$ and key $j$ are $x_{ij} = s\, q_i \cdot k_j$, then
    $c \tanh(x_{ij} / c)$ with a `softcap` $c$, then $+\, m_h (j - i - o)$ with ALiBi's
    slope $m_h$ for head $h$ (`alibi_slopes`); key $j$ is hidden from query $i$ when
    $j > i + o$ (`is_causal`) and also when $j \le i + o - w$ (`window` $w$, which
    implies causal), where $o = 0$ for `align="top-left"` and $o = S - L$ for
    `"bottom-right"` (the queries are the last `L` of `S` positions, after a KV cache);
    a head's `sink_logits` entry joins each row's softmax with no value.

    The order is the one every backend follows: scale, softcap, ALiBi's bias, the mask,
    then the softmax with the sink. The softcap bounds the content term $q \cdot k$ only,
    so ALiBi's penalty keeps growing with the distance (capped after the bias, every
    far key would sit at $-c$ and the recency ordering that lets ALiBi extrapolate would
    be lost). The bias is measured from the query's own position ($0$ on the diagonal,
    $-m_h d$ for a key $d$ tokens back), as in the paper, not from the first token as
    BLOOM's `build_alibi_tensor` does: the two differ by a constant per row, which the
    softmax ignores, but a learned sink's logit or a softcap does not, and the distance
    keeps the sink's share independent of how far into the sequence the query sits.

    Attributes:
        scale: The factor $s$, a number or a 0-d tensor; None for $1 / \sqrt{E}$.
        is_causal: Hide the keys after each query.
        align: Where the queries sit among the keys for `is_causal` and `window`.
        window: Sliding-window size (keys per query, itself included), or None.
        softcap: Logit softcapping (Gemma 2), a positive float, or None.
        sink_logits: Learned attention sinks (gpt-oss): one logit per query head,
            shape `(Hq,)`, or None.
        alibi_slopes: ALiBi: one slope per query head, shape `(Hq,)` (e.g.
            [`alibi_slopes`][attnlab.functional.flex.alibi_slopes]`(Hq)`), or None.
        temperature: Llama 4's attention temperature tuning, `(floor_scale, attn_scale)`:
            query $i$, at position $p = i + o$ among the keys, is first multiplied by
            $1 + \text{attn\_scale} \cdot \log(1 + \lfloor (p + 1) /
            \text{floor\_scale} \rfloor)$, so that scores sharpen as the context grows
            (its NoPE layers); None for none. Applied once, by
            [`temperature_tuned`][attnlab.rules.scores.temperature_tuned], which
            [`attend`][attnlab.functional.backends.attend] calls for every backend.

    Examples:
        >>> rule = ScoreRule(is_causal=True, align="bottom-right", window=4)
        >>> rule.window, rule.softcap
        (4, None)
    """

    scale: float | Tensor | None = None
    is_causal: bool = False
    align: Alignment = "top-left"
    window: int | None = None
    softcap: float | None = None
    sink_logits: Tensor | None = None
    alibi_slopes: Tensor | None = None
    temperature: tuple[float, float] | None = None

    def keywords(self) -> RuleKeywords:
        """The rule as the tiled kernels' keywords (`flash_attention`,
        `triton_flash_attention`, `weights_from_lse`): every field but `temperature`,
        which [`temperature_tuned`][attnlab.rules.scores.temperature_tuned] applies to
        the queries first; the scale as a float.

        Examples:
            >>> ScoreRule(scale=torch.tensor(0.5), window=4).keywords()["scale"]
            0.5
        """
        # A dict literal, not RuleKeywords(...): torch.compile cannot trace a call of a
        # TypedDict with optional keys, and the layers call this inside compiled code.
        return {
            "is_causal": self.is_causal,
            "window": self.window,
            "scale": None if self.scale is None else float(self.scale),
            "align": self.align,
            "softcap": self.softcap,
            "sink_logits": self.sink_logits,
            "alibi_slopes": self.alibi_slopes,
        }


class RuleKeywords(TypedDict, total=False):
    """A [`ScoreRule`][attnlab.rules.scores.ScoreRule] as keywords: what
    [`ScoreRule.keywords`][attnlab.rules.scores.ScoreRule.keywords] returns (all of
    them), and the rule's part of the tiled kernels' keywords (any of them)."""

    is_causal: bool
    window: int | None
    scale: float | None
    align: Alignment
    softcap: float | None
    sink_logits: Tensor | None
    alibi_slopes: Tensor | None


def alibi_bias(slopes: Tensor, queries: range | Tensor, keys: range) -> Tensor:
    r"""ALiBi's bias $m_h (j - i)$ for the queries at positions `queries` and keys at `keys`.

    The one formula of the bias: the kernels that hold all scores call it once over
    `range(o, o + L)` and `range(S)` (with $o$ the queries' offset among the keys), and
    FlashAttention once per tile, over that tile's positions.

    Args:
        slopes: One slope per head (or per flattened batch-and-head row), shape `(n,)`.
        queries: The queries' positions, in the keys' frame: a range, or a 1-d integer
            tensor of any of them (a selection of rows).
        keys: The keys' positions.

    Returns:
        The bias `(n, len(queries), len(keys))`, in the slopes' dtype and on their device.

    Examples:
        >>> alibi_bias(torch.tensor([0.5]), range(2, 4), range(4))
        tensor([[[-1.0000, -0.5000,  0.0000,  0.5000],
                 [-1.5000, -1.0000, -0.5000,  0.0000]]])
    """
    if isinstance(queries, Tensor):
        i = queries.to(slopes.device)  # (L,)
    else:
        i = torch.arange(queries.start, queries.stop, device=slopes.device)  # (L,)
    j = torch.arange(keys.start, keys.stop, device=slopes.device)  # (S,)
    distance = (j[None, :] - i[:, None]).to(slopes.dtype)  # (L, S), <= 0 where causal
    return slopes[:, None, None] * distance  # (n, L, S)


def check_alibi_slopes(
    name: str, slopes: object, num_heads: int | None, like: Tensor | None = None
) -> Tensor | None:
    """Check ALiBi's slopes: None, or a floating-point tensor of shape `(num_heads,)`.

    `num_heads` is None for queries without a head dimension, which take no slopes. With
    `like`, the slopes must also be on its device (the kernels' inputs); a layer keeps
    its slopes as a buffer, which moves with the layer.

    Raises:
        TypeError: If `slopes` is not a floating-point tensor (or None).
        ValueError: If it does not hold one slope per head, or is on another device.

    Examples:
        >>> check_alibi_slopes("alibi_slopes", torch.tensor([0.5, 0.25]), 2)
        tensor([0.5000, 0.2500])
    """
    if slopes is None:
        return None
    s = check_tensor(name, slopes)
    if num_heads is None:
        raise ValueError(
            f"{name} holds one ALiBi slope per head, but the queries have no head "
            "dimension: they must be (..., H, L, E)"
        )
    if tuple(s.shape) != (num_heads,):
        raise ValueError(
            f"{name} must hold one ALiBi slope per query head, shape ({num_heads},), got "
            f"{name}.shape={tuple(s.shape)}"
        )
    if like is not None and s.device != like.device:
        raise ValueError(f"{name} is on {s.device} but query is on {like.device}")
    return s


def check_temperature(name: str, value: object) -> tuple[float, float] | None:
    """`value` if it is None or a `(floor_scale, attn_scale)` pair of positive numbers
    (ScoreRule's `temperature`); raise naming `name` otherwise.

    Examples:
        >>> check_temperature("temperature", (8192.0, 0.1))
        (8192.0, 0.1)
    """
    if value is None:
        return None
    if not isinstance(value, tuple) or len(value) != 2:
        raise TypeError(f"{name} must be (floor_scale, attn_scale), got {value!r}")
    for part, number in zip(("floor_scale", "attn_scale"), value, strict=True):
        check_positive_float(f"{name} ({part})", number)
    return value


def temperature_tuned(query: Tensor, key: Tensor, rule: ScoreRule) -> tuple[Tensor, ScoreRule]:
    """The queries multiplied by `rule.temperature`'s factor, and the rule without it.

    The one place temperature tuning happens: every backend's call
    ([`attend`][attnlab.functional.backends.attend]) and the weights recovered from a
    log-sum-exp go through it. Query `i` sits at position `i + o` among the `S` keys
    (`o` of `rule.align`).

    Examples:
        >>> q, rule = torch.ones(1, 3, 2), ScoreRule(temperature=(2.0, 1.0))
        >>> tuned, rest = temperature_tuned(q, torch.ones(1, 3, 2), rule)
        >>> tuned[0, :, 0], rest.temperature
        (tensor([1.0000, 1.6931, 1.6931]), None)
    """
    if rule.temperature is None:
        return query, rule
    floor_scale, attn_scale = rule.temperature
    t, s = query.shape[-2], key.shape[-2]
    first = s - t if rule.align == "bottom-right" else 0
    p = torch.arange(first, first + t, device=query.device, dtype=torch.float32)
    factor = torch.log1p(torch.floor((p + 1.0) / floor_scale)) * attn_scale + 1.0
    return (query * factor[:, None]).to(query.dtype), replace(rule, temperature=None)
