r"""Layers of linear attention: a multi-head linear self-attention and Gated DeltaNet.

[`LinearSelfAttention`][attnlab.layers.linear.LinearSelfAttention] is a multi-head layer
of [`linear_attention`][attnlab.functional.linear.linear_attention], a drop-in for the
attention of a [`TinyTransformer`][attnlab.models.tiny.TinyTransformer] block.
[`GatedDeltaNet`][attnlab.layers.linear.GatedDeltaNet] is the layer of Qwen3-Next
(Qwen Team, 2025) around [`delta_rule`][attnlab.functional.linear.delta_rule]:
projections, a short causal convolution, the gates, a gated RMSNorm, with a
[`GatedDeltaNetState`][attnlab.layers.linear.GatedDeltaNetState] carried from prefill to
decode; `from_hf` ports `transformers`' `Qwen3NextGatedDeltaNet`. With
[`DeltaGates`][attnlab.layers.linear.DeltaGates] for a decay per key channel and low-rank
gates, the same layer is Kimi Linear's Kimi Delta Attention (`KimiLinearDeltaAttention`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.caches.base import LayerCache
from attnlab.functional.linear import DELTA_RULE_MODES, delta_rule, linear_attention
from attnlab.layers.heads import merge_heads, split_heads
from attnlab.layers.norms import rms_normalize
from attnlab.rules._precision import compute_dtype
from attnlab.rules._validation import (
    _shape,
    check_bool,
    check_choice,
    check_multiple,
    check_positive_float,
    check_positive_int,
    check_rank,
    check_tokens,
    checking,
    entry,
)
from attnlab.rules.masks import check_padding_of

__all__ = [
    "DeltaGates",
    "GatedDeltaNet",
    "GatedDeltaNetState",
    "LinearSelfAttention",
]


class LinearSelfAttention(nn.Module):
    """Multi-head self-attention with
    [`linear_attention`][attnlab.functional.linear.linear_attention].

    One projection `qkv` makes queries, keys and values of `num_heads` heads of
    `d_model // num_heads` features; each head attends with elu + 1 features in the
    masked parallel form, and `out` projects the concatenated heads back. It has the
    call that a [`TinyTransformer`][attnlab.models.tiny.TinyTransformer] block makes of its
    attention (`attn(x, is_causal=True)`) and the same number of parameters as
    the [`MultiHeadAttention`][attnlab.MultiHeadAttention] it replaces, so a block's
    `attn` can be swapped for it. It has no softmax weights to return, so
    `attention_maps` and head scores do not apply to a model that uses it.

    Args:
        d_model: Features per token, in and out.
        num_heads: Heads; must divide `d_model`.

    Shapes:
        x: `(b, t, d_model)`. Output: the same shape.

    Raises:
        TypeError: If a size is not an int.
        ValueError: If a size is not positive or `num_heads` does not divide `d_model`.

    Examples:
        >>> layer = LinearSelfAttention(8, num_heads=2)
        >>> x = torch.randn(3, 5, 8)
        >>> out = layer(x)
        >>> torch.allclose(out[:, :2], layer(x[:, :2]), atol=1e-6)  # causal
        True
    """

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.num_heads = check_positive_int("num_heads", num_heads)
        check_multiple("d_model", d_model, "num_heads", num_heads)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}"

    @entry
    def forward(self, x: Tensor, *, is_causal: bool = True) -> Tensor:
        """Attend over `x` `(b, t, d_model)`; query `i` sees keys `j <= i` if `is_causal`.

        Raises:
            TypeError: If `x` is not a floating-point tensor or `is_causal` not a bool.
            ValueError: If `x` is not `(b, t, d_model)`.
        """
        if checking():
            x = check_tokens(
                "x", x, features=self.d_model, param="d_model", owner="LinearSelfAttention",
                like=self.qkv.weight,
            )  # fmt: skip
            check_rank("x", x, (3,), "(b, t, d_model)")
            check_bool("is_causal", is_causal)
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # (b, num_heads, t, head_dim) each
        heads = linear_attention(q, k, v, is_causal=is_causal)
        out: Tensor = self.out(merge_heads(heads))  # (b, t, d_model)
        return out


@dataclasses.dataclass(repr=False)
class GatedDeltaNetState(LayerCache):
    """What a [`GatedDeltaNet`][attnlab.layers.linear.GatedDeltaNet] carries from one call to the
    next: the [`LayerCache`][attnlab.caches.base.LayerCache] of a linear-attention layer.

    Its size does not grow with the context: that is the point of the layer. It takes
    new state, not keys and values: [`update`][attnlab.layers.linear.GatedDeltaNetState.update]
    replaces both tensors after a call over `t` new tokens.

    Attributes:
        conv: `(b, conv_dim, kernel_size - 1)`, the last inputs of the causal convolution
            (queries, keys and values before it), zeros before the first token.
        recurrent: `(b, num_v_heads, head_k_dim, head_v_dim)`, the delta rule's state $S$.
        seen: Tokens processed so far (the position of the next token), as every
            cache's [`seen`][attnlab.caches.base.LayerCache.seen].
    """

    conv: Tensor
    recurrent: Tensor
    seen: int = 0

    def __repr__(self) -> str:
        return f"GatedDeltaNetState(batch_size={self.batch_size}, seen={self.seen})"

    @property
    def nbytes(self) -> int:
        """Bytes the two state tensors hold."""
        return sum(x.numel() * x.element_size() for x in (self.conv, self.recurrent))

    @property
    def batch_size(self) -> int:
        """Sequences the state holds."""
        return int(self.conv.shape[0])

    def mask_sizes(self, t: int, window: int | None = None) -> tuple[int, int]:
        """`(t, seen)`: the new tokens read no keys, only the state; they come after
        the `seen` ones (their only mask is their own padding)."""
        return t, self.seen

    def update(self, conv: Tensor, recurrent: Tensor, t: int) -> None:
        """Take the state after `t` more tokens: the convolution's last inputs and the
        recurrence's state, in place of the old ones."""
        self.conv, self.recurrent, self.seen = conv, recurrent, self.seen + t

    def reset(self) -> None:
        """Back to before the first token: zeros, nothing seen (the memory is kept)."""
        self.conv.zero_()
        self.recurrent.zero_()
        self.seen = 0


@dataclasses.dataclass(frozen=True)
class DeltaGates:
    r"""How a [`GatedDeltaNet`][attnlab.layers.linear.GatedDeltaNet] computes its decay and its
    output gate.

    The default is Qwen3-Next's: one decay per value head and token, from `a_proj`
    (`d_model` to `num_v_heads`), and an output gate `z_proj` of full rank through a
    SiLU. Kimi Linear's Kimi Delta Attention is
    `DeltaGates(decay="channel", rank=head_dim, activation="sigmoid")`: a decay per key
    channel (`a_proj` gives `num_v_heads * head_k_dim` numbers), and both `a_proj` and
    `z_proj` low-rank, two linear maps through `rank` features.

    Attributes:
        decay: `"head"`, one decay per head, or `"channel"`, one per key channel.
        rank: The inner width of low-rank `a_proj` and `z_proj`, or None for one linear
            map each.
        activation: The output gate's, `"silu"` or `"sigmoid"`.

    Examples:
        >>> kda = DeltaGates(decay="channel", rank=8, activation="sigmoid")
        >>> layer = GatedDeltaNet(16, num_k_heads=2, num_v_heads=2, head_k_dim=8,
        ...                       head_v_dim=8, gates=kda)
        >>> layer.a_proj
        Sequential(
          (0): Linear(in_features=16, out_features=8, bias=False)
          (1): Linear(in_features=8, out_features=16, bias=False)
        )
    """

    decay: Literal["head", "channel"] = "head"
    rank: int | None = None
    activation: Literal["silu", "sigmoid"] = "silu"

    def __post_init__(self) -> None:
        check_choice("decay", self.decay, ("head", "channel"))
        if self.rank is not None:
            check_positive_int("rank", self.rank)
        check_choice("activation", self.activation, ("silu", "sigmoid"))

    def projection(self, d_in: int, d_out: int) -> nn.Module:
        """`a_proj` or `z_proj`: one linear map, or two through `rank` features."""
        if self.rank is None:
            return nn.Linear(d_in, d_out, bias=False)
        return nn.Sequential(
            nn.Linear(d_in, self.rank, bias=False), nn.Linear(self.rank, d_out, bias=False)
        )


class GatedDeltaNet(nn.Module):
    r"""Gated DeltaNet layer as in Qwen3-Next (Hugging Face's `Qwen3NextGatedDeltaNet`).

    For input $x$ `(b, t, d_model)`: queries, keys and values are projected
    (`q_proj`, `k_proj`: `num_k_heads * head_k_dim` features each; `v_proj`:
    `num_v_heads * head_v_dim`), pass together through a depthwise causal convolution of
    `kernel_size` taps and a SiLU, and queries and keys are L2-normalised per head
    (queries then scaled by `head_k_dim ** -0.5`). Per value head and token,
    $\beta = \sigma(b\_proj(x))$ and $g = -e^{A\_log} \cdot \operatorname{softplus}(
    a\_proj(x) + dt\_bias)$ feed [`delta_rule`][attnlab.functional.linear.delta_rule]; each key head
    serves `num_v_heads // num_k_heads` consecutive value heads. Its output is
    RMS-normalised per head (weight `norm_weight`), multiplied by
    $\operatorname{SiLU}(z\_proj(x))$ and projected back by `out_proj`.

    Hugging Face's layer fuses `q_proj`, `k_proj`, `v_proj`, `z_proj` into `in_proj_qkvz`
    and `b_proj`, `a_proj` into `in_proj_ba` (rows grouped by key head);
    [`from_hf`][attnlab.layers.linear.GatedDeltaNet.from_hf] splits them.

    Args:
        d_model: Features per token, in and out.
        num_k_heads: Query/key heads.
        num_v_heads: Value heads, a multiple of `num_k_heads`.
        head_k_dim: Features per query/key head.
        head_v_dim: Features per value head.
        kernel_size: Taps of the causal convolution (Qwen3-Next: 4).
        mode: How [`delta_rule`][attnlab.functional.linear.delta_rule] runs: `"chunk"`,
            `"recurrent"` or `"naive"`; an attribute, may be changed later.
        chunk_size: Tokens per chunk in `"chunk"` mode (Hugging Face: 64).
        norm_eps: Epsilon of the gated RMSNorm.
        gates: How the decay and the output gate are computed
            ([`DeltaGates`][attnlab.layers.linear.DeltaGates]: Qwen3-Next's by default, a decay
            per key channel and low-rank gates for Kimi Delta Attention).

    Shapes:
        x: `(b, t, d_model)` or unbatched `(t, d_model)`. Output: the same shape.

    Raises:
        TypeError: If a size is not an int.
        ValueError: If a size is not positive, `num_v_heads` is not a multiple of
            `num_k_heads` or `mode` is unknown.

    Examples:
        >>> layer = GatedDeltaNet(16, num_k_heads=2, num_v_heads=4, head_k_dim=4,
        ...                       head_v_dim=3, chunk_size=4)
        >>> x = torch.randn(2, 9, 16)
        >>> state = layer.new_state(2)
        >>> prefill, step = layer(x[:, :8], state), layer(x[:, 8:], state)
        >>> torch.allclose(torch.cat([prefill, step], 1), layer(x), atol=1e-6)
        True
    """

    def __init__(
        self,
        d_model: int,
        *,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        kernel_size: int = 4,
        mode: str = "chunk",
        chunk_size: int = 64,
        norm_eps: float = 1e-6,
        gates: DeltaGates = DeltaGates(),  # frozen: one shared default is safe
    ) -> None:
        super().__init__()
        if not isinstance(gates, DeltaGates):
            raise TypeError(f"gates must be a DeltaGates, got {type(gates).__name__}")
        self.gates = gates
        self.d_model = check_positive_int("d_model", d_model)
        self.num_k_heads = check_positive_int("num_k_heads", num_k_heads)
        self.num_v_heads = check_positive_int("num_v_heads", num_v_heads)
        check_multiple("num_v_heads", num_v_heads, "num_k_heads", num_k_heads)
        self.head_k_dim = check_positive_int("head_k_dim", head_k_dim)
        self.head_v_dim = check_positive_int("head_v_dim", head_v_dim)
        self.kernel_size = check_positive_int("kernel_size", kernel_size)
        self.mode = mode
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.norm_eps = check_positive_float("norm_eps", norm_eps)
        key_dim, value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.q_proj = nn.Linear(d_model, key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, value_dim, bias=False)
        decay_dim = num_v_heads * (head_k_dim if gates.decay == "channel" else 1)
        self.z_proj = gates.projection(d_model, value_dim)
        self.b_proj = nn.Linear(d_model, num_v_heads, bias=False)
        self.a_proj = gates.projection(d_model, decay_dim)
        conv = nn.Conv1d(self.conv_dim, self.conv_dim, kernel_size, groups=self.conv_dim)
        self.conv_weight = nn.Parameter(conv.weight.detach().squeeze(1))  # (conv_dim, kernel)
        self.dt_bias = nn.Parameter(torch.ones(decay_dim))
        self.A_log = nn.Parameter(torch.empty(num_v_heads).uniform_(0.01, 16).log())
        self.norm_weight = nn.Parameter(torch.ones(head_v_dim))
        self.out_proj = nn.Linear(value_dim, d_model, bias=False)

    @property
    def mode(self) -> str:
        """`"chunk"`, `"recurrent"` or `"naive"`: how the delta rule runs."""
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        self._mode = check_choice("mode", value, DELTA_RULE_MODES)

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution: queries, keys and values together."""
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_k_heads={self.num_k_heads}, "
            f"num_v_heads={self.num_v_heads}, head_k_dim={self.head_k_dim}, "
            f"head_v_dim={self.head_v_dim}, kernel_size={self.kernel_size}, "
            f"mode={self.mode!r}, chunk_size={self.chunk_size}"
            + ("" if self.gates == DeltaGates() else f", gates={self.gates}")
        )

    def new_state(self, batch_size: int) -> GatedDeltaNetState:
        """An empty state for `batch_size` sequences (as if before the first token).

        The recurrent state is kept in float32 for half-precision layers (as Hugging
        Face's kernels do) and in the parameters' dtype otherwise.
        """
        check_positive_int("batch_size", batch_size)
        like = self.out_proj.weight
        wide = compute_dtype(like.dtype)
        conv = like.new_zeros((batch_size, self.conv_dim, self.kernel_size - 1))
        shape = (batch_size, self.num_v_heads, self.head_k_dim, self.head_v_dim)
        return GatedDeltaNetState(conv, torch.zeros(shape, dtype=wide, device=like.device))

    @entry
    def forward(
        self,
        x: Tensor,
        state: GatedDeltaNetState | None = None,
        *,
        padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Apply the layer to `x` `(b, t, d_model)` or `(t, d_model)`.

        In `"chunk"` mode a single token runs the recurrent step (a chunk of one token
        is that step), as Hugging Face's layer decodes.

        Args:
            x: The tokens, after the ones `state` has seen (if any).
            state: A state from [`new_state`][attnlab.layers.linear.GatedDeltaNet.new_state] or an
                earlier call, updated in place (its tensors replaced), or None to start
                from nothing and keep nothing.
            padding_mask: `(b, t)`, 1 (True) at real tokens and 0 at left padding (Hugging
                Face's `attention_mask` over the tokens of `x`). As in Hugging Face's
                layer, the inputs at padding are zeroed before the projections: they
                write nothing to the convolution or the state, so the real tokens' outputs
                and the state are those of the unpadded rows.

        Returns:
            The output, the shape of `x`.

        Raises:
            TypeError: If `x` is not a floating-point tensor, `state` not a
                `GatedDeltaNetState` or `padding_mask` not a bool or integer tensor.
            ValueError: If `x` has the wrong rank, features, dtype or device, the
                state's tensors do not fit this layer and batch, or `padding_mask` has
                the wrong shape, values other than 0 and 1, pads on the right or has a
                row without tokens.
        """
        if checking():
            x = check_tokens(
                "x", x, features=self.d_model, param="d_model", owner="GatedDeltaNet",
                like=self.out_proj.weight,
            )  # fmt: skip
            b = x.shape[0] if x.ndim == 3 else 1
            if state is not None:
                self.check_state(state, b)
            if padding_mask is not None:
                check_padding_of(padding_mask, x, x.shape[1])
        unbatched = x.ndim == 2
        if unbatched:
            x = x.unsqueeze(0)  # (1, t, d_model)
        b, t, _ = x.shape
        if padding_mask is not None:  # Hugging Face's apply_mask_to_padding_states
            x = x * padding_mask[:, :, None].to(x.dtype)  # (b, t, d_model)
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1)  # (b, t, conv)
        qkv, conv_state = self._conv(qkv.transpose(1, 2), None if state is None else state.conv)
        key_dim = self.num_k_heads * self.head_k_dim
        value_dim = self.num_v_heads * self.head_v_dim
        q, k, v = torch.split(qkv.transpose(1, 2), [key_dim, key_dim, value_dim], -1)
        wide = compute_dtype(x.dtype)
        repeat = self.num_v_heads // self.num_k_heads
        q, k = (
            _l2norm(y.reshape(b, t, self.num_k_heads, self.head_k_dim).to(wide))
            .repeat_interleave(repeat, dim=2)
            .transpose(1, 2)  # (b, num_v_heads, t, head_k_dim)
            for y in (q, k)
        )
        v = split_heads(v, self.num_v_heads).to(wide)  # (b, num_v_heads, t, head_v_dim)
        beta = self.b_proj(x).to(wide).sigmoid().transpose(1, 2)  # (b, num_v_heads, t)
        dt = F.softplus(self.a_proj(x).to(wide) + self.dt_bias.to(wide))  # (b, t, h [* d_k])
        dt = dt.view(b, t, self.num_v_heads, dt.shape[-1] // self.num_v_heads)  # 1 or d_k
        g = (-self.A_log.to(wide).exp()[:, None] * dt).transpose(1, 2)  # (b, h, t, 1 or d_k)
        g = g.squeeze(-1) if self.gates.decay == "head" else g
        mode = "recurrent" if t == 1 and self.mode == "chunk" else self.mode
        out, recurrent = delta_rule(
            q * self.head_k_dim**-0.5, k, v, beta, g, mode=mode, chunk_size=self.chunk_size,
            initial_state=None if state is None else state.recurrent,
        )  # fmt: skip
        if state is not None:
            state.update(conv_state, recurrent, t)
        out = out.transpose(1, 2)  # (b, t, num_v_heads, head_v_dim)
        z = self.z_proj(x).reshape(b, t, self.num_v_heads, self.head_v_dim)
        out = self._gated_norm(out.to(x.dtype), z).flatten(-2)  # (b, t, value_dim)
        y: Tensor = self.out_proj(out)  # (b, t, d_model)
        return y.squeeze(0) if unbatched else y

    def _conv(self, x: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor]:
        """Depthwise causal convolution + SiLU of `x` `(b, conv_dim, t)` after `state`."""
        if state is None:
            state = x.new_zeros((x.shape[0], x.shape[1], self.kernel_size - 1))
        if x.shape[-1] == 0:  # no new tokens: nothing to convolve, the state stays
            return x, state
        padded = torch.cat([state, x], dim=-1)  # (b, conv_dim, kernel - 1 + t)
        weight = self.conv_weight.unsqueeze(1)  # (conv_dim, 1, kernel)
        out = F.silu(F.conv1d(padded, weight, groups=self.conv_dim))  # (b, conv_dim, t)
        return out, padded[..., padded.shape[-1] - (self.kernel_size - 1) :]

    def _gated_norm(self, x: Tensor, z: Tensor) -> Tensor:
        """RMSNorm of each head's output (in float32 or wider), times the activated gate."""
        # Rounded to x's dtype before the weight, as Hugging Face's gated norm does (unlike
        # RMSNorm, which applies its weight in float32): the core is shared, not the order.
        normed = self.norm_weight * rms_normalize(x, self.norm_eps).to(x.dtype)
        act = F.silu if self.gates.activation == "silu" else torch.sigmoid
        return (normed * act(z.to(normed.dtype))).to(x.dtype)

    def check_state(self, state: object, batch_size: int, *, name: str = "state") -> None:
        """Check that `state` can carry this layer's recurrence for `batch_size` rows.

        `forward` calls it once when handed a state; a decoder that holds one state per
        layer calls it for every layer before its first step.

        Args:
            state: The state.
            batch_size: Rows of the input.
            name: Its name in the messages, e.g. `"cache[0]"`.

        Raises:
            TypeError: If `state` is not a
                [`GatedDeltaNetState`][attnlab.layers.linear.GatedDeltaNetState].
            ValueError: If its `conv` or `recurrent` tensor has another shape, dtype or
                device than [`new_state`][attnlab.layers.linear.GatedDeltaNet.new_state] gives.
        """
        state = GatedDeltaNetState.check(
            state,
            needs="a GatedDeltaNetState (GatedDeltaNet is linear attention: it carries a "
            "state, not keys and values; make one with new_state or Decoder.make_cache)",
            name=name,
            optional=False,
        )
        assert state is not None
        expected = self.new_state(batch_size)
        for part in ("conv", "recurrent"):
            got, want = getattr(state, part), getattr(expected, part)
            if not isinstance(got, Tensor) or got.shape != want.shape:
                shape = _shape(got) if isinstance(got, Tensor) else type(got).__name__
                raise ValueError(
                    f"state.{part} must be {_shape(want)} for this layer and a batch of "
                    f"{batch_size}, got {shape}"
                )
            if got.dtype != want.dtype or got.device != want.device:
                raise ValueError(
                    f"state.{part} must be {want.dtype} on {want.device}, got {got.dtype} "
                    f"on {got.device}; start from layer.new_state(batch_size)"
                )

    @classmethod
    def from_hf(cls, layer: Any, *, mode: str = "chunk", chunk_size: int = 64) -> GatedDeltaNet:
        """Copy Hugging Face's `Qwen3NextGatedDeltaNet`, `Qwen3_5GatedDeltaNet` or Kimi
        Linear's `KimiLinearDeltaAttention` (Kimi Delta Attention: the copy gets
        `DeltaGates(decay="channel", rank=head_dim, activation="sigmoid")`).

        Qwen3-Next's fused projections are split by rows: `in_proj_qkvz` holds, per key
        head, `head_k_dim` query rows, `head_k_dim` key rows, then the value and the `z`
        rows of its `num_v_heads // num_k_heads` value heads; `in_proj_ba` holds, per
        key head, the `b` rows then the `a` rows of those value heads. Qwen3.5's layer
        computes the same with `in_proj_qkv` (all query rows, all key rows, all value
        rows) and separate `in_proj_z`, `in_proj_b`, `in_proj_a`.

        Args:
            layer: A `Qwen3NextGatedDeltaNet`, `Qwen3_5GatedDeltaNet` or
                `KimiLinearDeltaAttention` (transformers 5), or a layer with the same
                attributes.
            mode: The new layer's `mode`.
            chunk_size: The new layer's `chunk_size`.

        Returns:
            A `GatedDeltaNet` with copies of the layer's weights, on their device and dtype.

        Raises:
            ValueError: If `layer` lacks a part this copy needs, or computes something it
                does not (a convolution bias, an activation other than SiLU).
        """
        from attnlab.models import interop  # a folder above this one: imported when called

        return interop.gated_deltanet_from_hf(cls, layer, mode=mode, chunk_size=chunk_size)

    @staticmethod
    def state_dict_from_hf(layer: Any) -> dict[str, Tensor]:
        """The weights of a Hugging Face Gated DeltaNet layer under this module's names.

        What [`from_hf`][attnlab.layers.linear.GatedDeltaNet.from_hf] loads (the fused
        projections split as it describes); a model that holds these layers
        ([`attnlab.models.decoder.Decoder`][attnlab.models.decoder.Decoder]) loads them under its
        own prefix.

        Raises:
            ValueError: As `from_hf`.
        """
        from attnlab.models import interop  # a folder above this one: imported when called

        return interop.gated_deltanet_state_dict(layer)


def _l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """`x / sqrt(|x|^2 + eps)` over the last dimension: FLA's and Hugging Face's form."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)
