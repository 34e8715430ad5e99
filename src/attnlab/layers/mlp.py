r"""The feed-forward half of a decoder block: a SwiGLU MLP and a sparse mixture of experts.

Llama's MLP (Shazeer, "GLU Variants Improve Transformer", 2020,
https://arxiv.org/abs/2002.05202) gates one projection by the SiLU of another;
[`SparseMoE`][attnlab.layers.mlp.SparseMoE] routes each token to its `top_k` experts
of that shape, plus a shared expert, as Qwen3-Next does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.rules._validation import (
    check_bool,
    check_positive_int,
)

__all__ = ["Activation", "MoEConfig", "SparseMoE", "SwiGLU"]

Activation = Literal["silu", "gelu_tanh"]
"""The gate of a [`SwiGLU`][attnlab.layers.mlp.SwiGLU]: SiLU (Llama) or tanh-GELU (Gemma)."""


@dataclass(frozen=True)
class MoEConfig:
    """Sizes of a [`SparseMoE`][attnlab.layers.mlp.SparseMoE] MLP (Qwen3-Next's, Qwen3-MoE's).

    Attributes:
        num_experts: Routed experts (`num_experts`).
        top_k: Experts per token (`num_experts_per_tok`), at most `num_experts`.
        expert_dim: Hidden width of each expert (`moe_intermediate_size`).
        shared_dim: Hidden width of the shared expert every token also runs, gated by a
            sigmoid (`shared_expert_intermediate_size`); None for no shared expert.
        norm_topk_prob: Renormalise the chosen experts' router probabilities to sum to 1.
    """

    num_experts: int
    top_k: int
    expert_dim: int
    shared_dim: int | None = None
    norm_topk_prob: bool = True

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "expert_dim"):
            check_positive_int(name, getattr(self, name))
        if self.shared_dim is not None:
            check_positive_int("shared_dim", self.shared_dim)
        check_bool("norm_topk_prob", self.norm_topk_prob)
        if self.top_k > self.num_experts:
            raise ValueError(
                f"top_k must be at most num_experts={self.num_experts}, got {self.top_k}"
            )


class SwiGLU(nn.Module):
    r"""The gated MLP of Llama: $W_{\text{down}}(\operatorname{silu}(W_{\text{gate}} x)
    \odot W_{\text{up}} x)$ (Shazeer, 2020, https://arxiv.org/abs/2002.05202).

    With `activation="gelu_tanh"` the gate is the tanh approximation of GELU (GeGLU,
    Gemma's `gelu_pytorch_tanh`).
    """

    def __init__(
        self,
        d_model: int,
        hidden_dim: int,
        *,
        bias: bool = False,
        activation: Activation = "silu",
    ) -> None:
        super().__init__()
        if activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"activation must be 'silu' or 'gelu_tanh', got {activation!r}")
        self.activation = activation
        self.gate_proj = nn.Linear(d_model, hidden_dim, bias=bias)
        self.up_proj = nn.Linear(d_model, hidden_dim, bias=bias)
        self.down_proj = nn.Linear(hidden_dim, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        g = self.gate_proj(x)  # (b, t, hidden_dim)
        if self.activation == "silu":
            gate = nn.functional.silu(g)
        else:
            gate = nn.functional.gelu(g, approximate="tanh")
        out: Tensor = self.down_proj(gate * self.up_proj(x))  # (b, t, d_model)
        return out


class _Experts(nn.Module):
    """The routed experts' weights, stacked as in Hugging Face (`gate_up_proj`
    `(num_experts, 2 expert_dim, d_model)`, `down_proj` `(num_experts, d_model, expert_dim)`)."""

    def __init__(self, d_model: int, num_experts: int, expert_dim: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(num_experts, 2 * expert_dim, d_model))
        self.down_proj = nn.Parameter(torch.randn(num_experts, d_model, expert_dim))
        with torch.no_grad():
            self.gate_up_proj.mul_(d_model**-0.5)
            self.down_proj.mul_(expert_dim**-0.5)

    def forward(self, x: Tensor, chosen: Tensor, weights: Tensor) -> Tensor:
        """Run each token `x` `(n, d_model)` through its `chosen` experts `(n, top_k)` and
        sum their outputs weighted by `weights` `(n, top_k)`."""
        out = torch.zeros_like(x)  # (n, d_model)
        # Only the experts some token chose run: reading which is a host sync, as in
        # Hugging Face's loop (a dense layer would run every expert on every token).
        for e in torch.unique(chosen).tolist():
            token, slot = torch.where(chosen == e)  # (m,) each
            gate, up = F.linear(x[token], self.gate_up_proj[e]).chunk(2, dim=-1)  # (m, I)
            y = F.linear(F.silu(gate) * up, self.down_proj[e])  # (m, d_model)
            out.index_add_(0, token, (y * weights[token, slot, None]).to(out.dtype))
        return out


class SparseMoE(nn.Module):
    r"""A mixture-of-experts MLP with a shared expert, as in Qwen3-Next (and Qwen2-MoE).

    A router `gate` scores the `num_experts` experts for each token; the token runs
    through its `top_k` best, SwiGLU MLPs of width `expert_dim`, whose outputs are summed
    weighted by the router's softmax probabilities (renormalised over the chosen ones if
    `norm_topk_prob`). Every token also runs the shared expert, a SwiGLU of width
    `shared_dim`, scaled by $\sigma(\text{shared\_expert\_gate}(x))$ (Shazeer et al., 2017,
    https://arxiv.org/abs/1701.06538; Qwen2-MoE's shared experts).

    Parameters are named as in `Qwen3NextSparseMoeBlock`: `gate.weight`,
    `experts.gate_up_proj`, `experts.down_proj`, `shared_expert.{gate,up,down}_proj`,
    `shared_expert_gate`.
    """

    def __init__(self, d_model: int, config: MoEConfig) -> None:
        super().__init__()
        if not isinstance(config, MoEConfig):
            raise TypeError(f"config must be a MoEConfig, got {type(config).__name__}")
        self.config = config
        self.gate = nn.Linear(d_model, config.num_experts, bias=False)
        self.experts = _Experts(d_model, config.num_experts, config.expert_dim)
        self.shared_expert: SwiGLU | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if config.shared_dim is not None:
            self.shared_expert = SwiGLU(d_model, config.shared_dim)
            self.shared_expert_gate = nn.Linear(d_model, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """`x` `(..., d_model)` to `(..., d_model)`."""
        flat = x.reshape(-1, x.shape[-1])  # (n, d_model)
        logits = self.gate(flat)  # (n, num_experts)
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        weights, chosen = probs.topk(self.config.top_k, dim=-1)  # (n, top_k) each
        if self.config.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out: Tensor = self.experts(flat, chosen, weights.to(logits.dtype))  # (n, d_model)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.reshape(x.shape)
