r"""Gated attention: a sigmoid gate per head on the output of grouped-query attention.

Qwen3-Next's full-attention layers (Qiu et al., "Gated Attention for Large Language
Models", 2025, https://arxiv.org/abs/2505.06708) multiply each head's output by
$\sigma(x W_g)$ before the output projection, which lets a head write nothing.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import torch
from torch import Tensor, nn

from attnlab.caches.kv import AttentionCache
from attnlab.layers.gqa import GroupedQueryAttention

__all__ = ["GatedAttention"]


class GatedAttention(nn.Module):
    r"""Attention whose heads are gated before the output projection (Qwen3-Next).

    $\operatorname{out\_proj}(\operatorname{heads}(x) \odot
    \sigma(\operatorname{gate\_proj}(x)))$: each feature of each head's output is scaled
    by a sigmoid of the token's own projection (Qiu et al., "Gated Attention for Large
    Language Models", 2025, https://arxiv.org/abs/2505.06708), which lets a head output
    nothing without parking its attention on a sink token.

    Built around a [`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention], whose
    `out_proj` it takes over (the inner module then returns the concatenated heads).

    Args:
        attention: The attention; its `out_proj` becomes this module's.
    """

    def __init__(self, attention: GroupedQueryAttention) -> None:
        super().__init__()
        if not isinstance(attention, GroupedQueryAttention):
            raise TypeError(
                f"attention must be a GroupedQueryAttention, got {type(attention).__name__}"
            )
        features = attention.num_heads * attention.head_dim
        self.gate_proj = nn.Linear(attention.d_model, features, bias=attention.bias)
        self.out_proj = attention.out_proj
        attention.out_proj = nn.Identity()  # type: ignore[assignment]
        self.attention = attention

    def _gate(self, x: Tensor, heads: Tensor) -> Tensor:
        out: Tensor = self.out_proj(heads * torch.sigmoid(self.gate_proj(x)))  # (b, t, d_model)
        return out

    def check_cache(self, cache: object, **kwargs: Any) -> AttentionCache | None:
        """The attention's [`check_cache`][attnlab.layers.gqa.GroupedQueryAttention.check_cache]."""
        return self.attention.check_cache(cache, **kwargs)

    @overload
    def forward(
        self, x: Tensor, *, need_weights: Literal[False] = False, **kwargs: Any
    ) -> Tensor: ...

    @overload
    def forward(
        self, x: Tensor, *, need_weights: Literal[True], **kwargs: Any
    ) -> tuple[Tensor, Tensor]: ...

    def forward(
        self, x: Tensor, *, need_weights: bool = False, **kwargs: Any
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The attention's `forward` (same arguments and checks, there), gated."""
        if need_weights:
            heads, weights = self.attention(x, need_weights=True, **kwargs)
            return self._gate(x, heads), weights
        return self._gate(x, self.attention(x, **kwargs))
