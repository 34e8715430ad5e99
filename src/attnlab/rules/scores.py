r"""The score rule: how one call turns $q \cdot k$ into the weights of its softmax.

Every attention layer hands its kernel one [`ScoreRule`][attnlab.rules.scores.ScoreRule]
instead of a list of keywords, the way `torch.nn.attention.flex_attention` takes one
`score_mod`: the scale, which keys each query may see (causal, its alignment, a sliding
window), Gemma 2's softcap and gpt-oss's learned sink logits. The kernel registry
([`attend`][attnlab.functional.backends.attend]) takes the rule and each backend reads the
fields it implements, so a new rule is one field here and one branch per kernel, not a
keyword threaded through every layer and every signature.

The rule does not check its fields: the layer that builds it checked them at its
boundary (its constructor, its `forward`), and the public kernels check the keywords
they take from users.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from attnlab.rules.masks import Alignment

__all__ = ["ScoreRule"]


@dataclass(frozen=True, eq=False)
class ScoreRule:
    r"""The rules of one attention call's scores, read by every backend.

    The scores of query $i$ and key $j$ are $x_{ij} = s\, q_i \cdot k_j$, then
    $c \tanh(x_{ij} / c)$ with a `softcap` $c$; key $j$ is hidden from query $i$ when
    $j > i + o$ (`is_causal`) and also when $j \le i + o - w$ (`window` $w$, which
    implies causal), where $o = 0$ for `align="top-left"` and $o = S - L$ for
    `"bottom-right"` (the queries are the last `L` of `S` positions, after a KV cache);
    a head's `sink_logits` entry joins each row's softmax with no value.

    Attributes:
        scale: The factor $s$, a number or a 0-d tensor; None for $1 / \sqrt{E}$.
        is_causal: Hide the keys after each query.
        align: Where the queries sit among the keys for `is_causal` and `window`.
        window: Sliding-window size (keys per query, itself included), or None.
        softcap: Logit softcapping (Gemma 2), a positive float, or None.
        sink_logits: Learned attention sinks (gpt-oss): one logit per query head,
            shape `(Hq,)`, or None.

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
