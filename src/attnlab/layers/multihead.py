r"""Production multi-head attention, equal to PyTorch's `nn.MultiheadAttention`.

Multi-head attention (Vaswani et al., 2017, https://arxiv.org/abs/1706.03762) projects the
tokens once per role for all heads together, splits the projections into `num_heads`
heads of `head_dim = d_out / num_heads` features, runs scaled dot-product attention in
every head at once, and mixes the concatenated heads with an output projection:

$$
\operatorname{MHA}(X, C) = \operatorname{concat}_h\left(
\operatorname{softmax}\left(\frac{Q_h K_h^\top}{\sqrt{d_h}}\right) V_h\right) W_o + b_o,
\quad Q = X W_q + b_q,\ K = C W_k + b_k,\ V = C W_v + b_v
$$
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from attnlab.functional import sdpa as F
from attnlab.functional.backends import (
    Backend,
    BackendProperty,
    attend,
    attention_weights,
    check_backend_call,
    materialize,
)
from attnlab.layers.heads import merge_heads, split_heads
from attnlab.rules import masks
from attnlab.rules._validation import (
    check_attn_mask,
    check_bool,
    check_multiple,
    check_positive_int,
    check_probability,
    check_same_batch,
    check_tokens,
    checking,
    entry,
    mask_float_dtypes,
)
from attnlab.rules.scores import ScoreRule, check_alibi_slopes

__all__ = [
    "MultiHeadAttention",
]


class MultiHeadAttention(nn.Module):
    r"""Batch-first multi-head self- and cross-attention with fused projections.

    Each of `W_query`, `W_key`, `W_value` is one `nn.Linear` that projects for all heads at
    once (the article's [`MultiHeadAttentionWrapper`][attnlab.MultiHeadAttentionWrapper]
    keeps one small matrix per head instead); `out_proj` mixes the heads. Queries come from
    `x`; keys and values from `context` if given (cross-attention), else from `x`; values
    from a separate `value` tensor where they differ from the keys' tokens (`d_value`, the
    `vdim` of `nn.MultiheadAttention`). All backends give the same outputs; switch at any
    time by assigning `module.backend`.

    Args:
        d_in: Features per token of `x`.
        d_out: Features of the output, split over the heads; a multiple of `num_heads`.
        num_heads: Number of heads.
        d_context: Features per token of `context` (the keys' tokens); defaults to `d_in`.
        d_value: Features per token of `value` (the values' tokens); defaults to
            `d_context`.
        dropout: Probability of dropping an attention weight, in training mode only.
        bias: Whether the four projections have a bias.
        alibi_slopes: ALiBi (BLOOM, MPT): one slope per head, `(num_heads,)`, the
            [`ScoreRule`][attnlab.rules.scores.ScoreRule] field of that name, kept as a
            buffer; e.g. [`alibi_slopes`][attnlab.functional.flex.alibi_slopes]`(num_heads)`.
        backend: `"torch"` (PyTorch's fused kernel), `"scratch"` (attnlab's),
            `"flash"` (attnlab's FlashAttention: no mask but `is_causal`/`window`, no
            dropout) or `"triton"` (the same as Triton kernels; needs Triton).

    Shapes:
        x: `(b, t, d_in)` or unbatched `(t, d_in)`. context: `(b, s, d_context)` or
        `(s, d_context)`, batched like `x`. value: `(b, s, d_value)` or `(s, d_value)`.
        Output: `(b, t, d_out)` or `(t, d_out)`.

    Raises:
        TypeError: If a size is not an int, `dropout` not a number or `bias` not a bool.
        ValueError: If a size is not positive, `d_out` is not a multiple of `num_heads`,
            `dropout` is not in [0, 1), `alibi_slopes` is not one slope per head or
            `backend` is unknown.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> x, context = torch.randn(3, 4, 6), torch.randn(3, 7, 5)
        >>> self_attn = MultiHeadAttention(d_in=6, d_out=8, num_heads=2)
        >>> self_attn(x, is_causal=True).shape
        torch.Size([3, 4, 8])
        >>> cross_attn = MultiHeadAttention(d_in=6, d_out=8, num_heads=2, d_context=5)
        >>> cross_attn(x, context).shape
        torch.Size([3, 4, 8])
        >>> cross_attn.attention_weights(x, context).shape  # (b, num_heads, t, s)
        torch.Size([3, 2, 4, 7])
        >>> padding = torch.tensor([[False] * 7, [False] * 5 + [True] * 2, [False] * 7])
        >>> out, weights = cross_attn(x, context, key_padding_mask=padding, need_weights=True)
        >>> weights.shape  # averaged over heads: (b, t, s)
        torch.Size([3, 4, 7])
        >>> bool((weights[1, :, 5:] == 0).all())  # no weight on the padding
        True
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        num_heads: int,
        *,
        d_context: int | None = None,
        d_value: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        alibi_slopes: Tensor | None = None,
        backend: Backend = "torch",
    ) -> None:
        super().__init__()
        self.d_in = check_positive_int("d_in", d_in)
        self.d_out = check_positive_int("d_out", d_out)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.d_context = d_in if d_context is None else check_positive_int("d_context", d_context)
        self.d_value = self.d_context if d_value is None else check_positive_int("d_value", d_value)
        self.head_dim = check_multiple("d_out", d_out, "num_heads", num_heads)
        self.dropout = check_probability("dropout", dropout)
        self.bias = check_bool("bias", bias)
        slopes = check_alibi_slopes("alibi_slopes", alibi_slopes, self.num_heads)
        self.register_buffer("alibi_slopes", slopes, persistent=False)  # moves with .to()
        self.alibi_slopes: Tensor | None
        self.backend = backend
        self.W_query = nn.Linear(self.d_in, d_out, bias=bias)
        self.W_key = nn.Linear(self.d_context, d_out, bias=bias)
        self.W_value = nn.Linear(self.d_value, d_out, bias=bias)
        self.out_proj = nn.Linear(d_out, d_out, bias=bias)

    backend = BackendProperty()
    """Which kernel `forward` runs: a name of the registry's `BACKEND_NAMES` (checked)."""

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, d_out={self.d_out}, num_heads={self.num_heads}, "
            f"d_context={self.d_context}, "
            + (f"d_value={self.d_value}, " if self.d_value != self.d_context else "")
            + f"dropout={self.dropout}, bias={self.bias}, "
            + ("" if self.alibi_slopes is None else "alibi=True, ")
            + f"backend={self.backend!r}"
        )

    def _check_inputs(
        self,
        x: object,
        context: object,
        value: object,
        attn_mask: object,
        is_causal: object,
        window: object,
        key_padding_mask: object,
        *,
        needs_values: bool = True,
    ) -> None:
        """Raise if the arguments of `forward` do not fit this module (see `Raises:` there)."""
        tokens = functools.partial(
            check_tokens, owner=type(self).__name__, like=self.W_query.weight
        )
        x = tokens("x", x, features=self.d_in, param="d_in")
        if context is None:
            if self.d_context != self.d_in:
                roles = "keys" if value is not None else "keys and values"
                raise ValueError(
                    f"context is required: this module's {roles} have "
                    f"d_context={self.d_context} features but x has d_in={self.d_in}"
                )
            context = x
        else:
            context = tokens("context", context, features=self.d_context, param="d_context")
            check_same_batch("context", x, context)
        if value is None:
            if needs_values and self.d_value != self.d_context:
                raise ValueError(
                    f"value is required: this module's values have d_value={self.d_value} "
                    f"features but its keys have d_context={self.d_context}"
                )
        else:
            value = tokens("value", value, features=self.d_value, param="d_value")
            check_same_batch("value", x, value)
            _check_value_tokens(value, context, x)
        b, s = (x.shape[0] if x.ndim == 3 else 1), context.shape[-2]
        target = (b, self.num_heads, x.shape[-2], s)  # (b, h, t, s)
        check_attn_mask("attn_mask", attn_mask, target, x, query_name="x")
        masks.check_causal_mask(attn_mask, is_causal)
        masks.check_window(window, attn_mask)
        _check_key_padding_mask(key_padding_mask, x, b, s)

    @entry
    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        value: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        window: int | None = None,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        average_attn_weights: bool = True,
    ) -> Tensor | tuple[Tensor, Tensor]:
        r"""Attend from the tokens of `x` to those of `context` (or of `x` itself).

        The call `m(x, context, value, key_padding_mask=..., need_weights=True)` mirrors
        `nn.MultiheadAttention`'s `m(query, key, value, ...)`, except for two conventions:
        a bool `attn_mask` here is True where a query **may** attend (PyTorch's module:
        where it may not), and the result is a tuple only with `need_weights=True`.

        Args:
            x: Query tokens, `(b, t, d_in)` or `(t, d_in)`.
            context: Key tokens (and value tokens unless `value` is given),
                `(b, s, d_context)` or `(s, d_context)`; None for self-attention.
            value: Value tokens, `(b, s, d_value)` or `(s, d_value)`, where they differ from
                the keys' tokens; None takes the values from the keys' tokens.
            attn_mask: Bool mask (True = attend) or float mask added to the scores,
                broadcastable to `(b, num_heads, t, s)`; e.g. `(t, s)` for all sequences,
                `(b, 1, 1, s)` from [`masks.key_padding`][attnlab.rules.masks.key_padding], or
                PyTorch's `causal_upper_left(t, s)` / `causal_lower_right(t, s)`.
            is_causal: Hide key $j$ from query $i$ when $j > i$, in absolute positions:
                query $i$ and key $i$ are the same token (top-left aligned when
                `t != s`, as PyTorch's `is_causal`).
            window: Sliding-window attention: also hide key $j$ when $j \le i - w$, so
                each query sees its last `window` keys, itself included. Implies
                `is_causal`; not together with `attn_mask`.
            key_padding_mask: Keys to ignore in each sequence, `(b, s)` or `(s,)`: a bool
                mask that is **True at padding** (the convention of
                `nn.MultiheadAttention`), or a float mask added to the scores. Combines
                with `attn_mask` or `is_causal`.
            need_weights: Also return the attention weights this very call used (dropout
                included, in training mode). They are computed by
                [`attention_weights`][attnlab.functional.sdpa.attention_weights] whatever the
                backend, as PyTorch's module leaves its fused kernel to return them.
            average_attn_weights: With `need_weights`, average the weights over the heads.

        Returns:
            Context vectors mixed by `out_proj`, `(b, t, d_out)` or `(t, d_out)`; with
            `need_weights=True` the tuple `(output, weights)`, the weights of shape
            `(b, t, s)` averaged over heads, or `(b, num_heads, t, s)` with
            `average_attn_weights=False` (without `b` for unbatched input).

        Raises:
            TypeError: If an input is not a floating-point tensor, a mask has a wrong
                dtype or a flag is not a bool.
            ValueError: If the rank, feature size, dtype or device of `x`, `context` or
                `value` does not fit the module, their batch sizes or the numbers of key
                and value tokens differ, `context` (or `value`) is missing while
                `d_context != d_in` (or `d_value != d_context`), `attn_mask` does not
                broadcast to `(b, num_heads, t, s)`, `key_padding_mask` is not `(b, s)`,
                a mask is on another device, both `attn_mask` and `is_causal` (or
                `window`) are given, `window` is not positive, or `backend="flash"` (or
                `"triton"`) is asked for a mask or for dropout (training mode with `dropout > 0`).
        """
        if checking():
            self._check_inputs(x, context, value, attn_mask, is_causal, window, key_padding_mask)
            check_bool("need_weights", need_weights)
            check_bool("average_attn_weights", average_attn_weights)
        p = self.dropout if self.training else 0.0
        x, context, value, unbatched = _batched(x, context, value)
        mask = _with_key_padding(attn_mask, key_padding_mask, unbatched)
        if not need_weights:  # before the projections: a request flash cannot serve
            check_backend_call(self.backend, attn_mask=mask, dropout_p=p)
        rule = ScoreRule(is_causal=is_causal, window=window, alibi_slopes=self.alibi_slopes)
        q = split_heads(self.W_query(x), self.num_heads)  # (b, h, t, head_dim)
        k = split_heads(self.W_key(context), self.num_heads)  # (b, h, s, head_dim)
        v = split_heads(self.W_value(value), self.num_heads)  # (b, h, s, head_dim)
        if not need_weights:
            heads = attend(self.backend, q, k, v, rule, attn_mask=mask, dropout_p=p)
            out: Tensor = self.out_proj(merge_heads(heads))  # (b, t, d_out)
            return out[0] if unbatched else out
        # The weights first, then the output from these very weights (same dropout).
        weights = attention_weights(q, k, rule, attn_mask=mask, dropout_p=p)  # (b, h, t, s)
        out = self.out_proj(merge_heads(F.context_vectors(weights, v)))  # (b, t, d_out)
        if average_attn_weights:
            weights = weights.mean(dim=1)  # (b, t, s)
        return (out[0], weights[0]) if unbatched else (out, weights)

    @entry
    def attention_weights(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        window: int | None = None,
        key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Per-head attention weights, for pictures and inspection (never with dropout).

        They are the weights `forward` uses in evaluation mode, whatever the backend
        (PyTorch's fused kernel does not return them). For the weights of one training
        step, dropout included, call `forward` with `need_weights=True`. The arguments are
        those of `forward` (the weights do not depend on the values).

        Returns:
            Weights `(b, num_heads, t, s)` or `(num_heads, t, s)`; each row sums to 1 except
            fully masked rows, which are 0.

        Raises:
            TypeError: As `forward`.
            ValueError: As `forward`.
        """
        if checking():
            self._check_inputs(
                x, context, None, attn_mask, is_causal, window, key_padding_mask, needs_values=False
            )
        x, context, _, unbatched = _batched(x, context, None)
        q = split_heads(self.W_query(x), self.num_heads)  # (b, h, t, head_dim)
        k = split_heads(self.W_key(context), self.num_heads)  # (b, h, s, head_dim)
        mask = _with_key_padding(attn_mask, key_padding_mask, unbatched)
        rule = ScoreRule(is_causal=is_causal, window=window, alibi_slopes=self.alibi_slopes)
        weights = attention_weights(q, k, rule, attn_mask=mask)
        return weights[0] if unbatched else weights  # (b, h, t, s)

    # -- interoperability with PyTorch ---------------------------------------------------

    @classmethod
    def from_torch(
        cls, module: nn.MultiheadAttention, *, backend: Backend = "torch"
    ) -> MultiHeadAttention:
        """A `MultiHeadAttention` with the weights of PyTorch's `nn.MultiheadAttention`.

        PyTorch keeps the three input projections packed in one `in_proj_weight` when
        `kdim == vdim == embed_dim`, and as `q_proj_weight`, `k_proj_weight`,
        `v_proj_weight` otherwise; both layouts are copied exactly (as are the biases, the
        output projection, `dropout` and the training mode). The result has
        `d_in = d_out = embed_dim`, `d_context = kdim` and `d_value = vdim`; call it as
        `mha(query, key, value)` where PyTorch's module takes `(query, key, value)`.

        Mind the masks: `nn.MultiheadAttention` hides a key where its bool `attn_mask` is
        True, this module where it is False;
        [`masks.allowed_to_blocked`][attnlab.rules.masks.allowed_to_blocked] converts. The
        `key_padding_mask` has PyTorch's convention in both (True = padding).

        Args:
            module: The module to copy. Its `batch_first` does not matter (it changes the
                input layout, not the weights).
            backend: Backend of the new module.

        Returns:
            A new module on the same device and dtype, sharing no storage with `module`.

        Raises:
            TypeError: If `module` is not an `nn.MultiheadAttention`.
            ValueError: If it uses features this module does not have: `add_bias_kv` or
                `add_zero_attn`.

        Examples:
            >>> torch_mha = nn.MultiheadAttention(embed_dim=8, num_heads=2, batch_first=True)
            >>> mha = MultiHeadAttention.from_torch(torch_mha).eval()
            >>> x = torch.randn(3, 5, 8)
            >>> torch.allclose(mha(x), torch_mha.eval()(x, x, x)[0], atol=1e-6)
            True
        """
        from attnlab.models import interop  # a folder above this one: imported when called

        return interop.mha_from_torch(cls, module, backend=backend)

    def to_torch(self) -> nn.MultiheadAttention:
        """A batch-first `nn.MultiheadAttention` with this module's weights.

        The inverse of [`from_torch`][attnlab.MultiHeadAttention.from_torch]: PyTorch's
        module gets packed `in_proj_weight` when `d_context == d_value == d_out`, separate
        `q/k/v_proj_weight` otherwise (`kdim = d_context`, `vdim = d_value`). Call it as
        `m(x, context, context)` (or `m(x, context, value)`) and convert bool attention
        masks with [`masks.allowed_to_blocked`][attnlab.rules.masks.allowed_to_blocked].

        Returns:
            A new `nn.MultiheadAttention` (`batch_first=True`, same device, dtype, dropout
            and training mode).

        Raises:
            ValueError: If `d_in != d_out` (PyTorch's module has one `embed_dim` for both)
                or the module has `alibi_slopes` (PyTorch's has no ALiBi).

        Examples:
            >>> mha = MultiHeadAttention(d_in=8, d_out=8, num_heads=4, d_context=6).eval()
            >>> torch_mha = mha.to_torch()
            >>> torch_mha.k_proj_weight.shape
            torch.Size([8, 6])
            >>> x, c = torch.randn(2, 3, 8), torch.randn(2, 5, 6)
            >>> torch.allclose(mha(x, c), torch_mha(x, c, c)[0], atol=1e-6)
            True
        """
        if self.alibi_slopes is not None:
            raise ValueError(
                "nn.MultiheadAttention has no ALiBi: a module with alibi_slopes has no equal there"
            )
        from attnlab.models import interop  # a folder above this one: imported when called

        return interop.mha_to_torch(self)


def _check_value_tokens(value: Tensor, context: Tensor, x: Tensor) -> None:
    """Raise unless `value` has one token per key token (`context`, or `x` itself)."""
    if value.shape[-2] != context.shape[-2]:
        keys = "context" if context is not x else "x (the keys' tokens)"
        raise ValueError(
            f"value must have as many tokens as {keys}, got value.shape="
            f"{tuple(value.shape)} and {keys.split()[0]}.shape={tuple(context.shape)}"
        )


def _check_key_padding_mask(mask: object, x: Tensor, b: int, s: int) -> None:
    """Raise unless `mask` is None or a bool/float `(b, s)` (`(s,)` for unbatched `x`)."""
    if mask is None:
        return
    if not isinstance(mask, Tensor):
        raise TypeError(
            f"key_padding_mask must be a torch.Tensor or None, got {type(mask).__name__}"
        )
    if mask.dtype != torch.bool and mask.dtype not in mask_float_dtypes(x):
        raise TypeError(
            "key_padding_mask must be a bool tensor (True = padding, as in "
            "nn.MultiheadAttention) or a float tensor to add to the scores, got "
            f"{mask.dtype}"
        )
    expected = (b, s) if x.ndim == 3 else (s,)
    if tuple(mask.shape) != expected:
        layout = "(b, s)" if x.ndim == 3 else "(s,) for unbatched x"
        raise ValueError(
            f"key_padding_mask must have shape {layout} = {expected}, one entry per key "
            f"token of each sequence, got {tuple(mask.shape)}"
        )
    if mask.device != x.device:
        raise ValueError(f"key_padding_mask is on {mask.device} but x is on {x.device}")


def _batched(
    x: Tensor, context: Tensor | None, value: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, bool]:
    """`(b, t, d_in)`, `(b, s, d_context)`, `(b, s, d_value)`, and whether x was unbatched."""
    context = x if context is None else context
    value = context if value is None else value
    unbatched = x.ndim == 2
    if unbatched:  # (1, t, d_in), (1, s, d_context), (1, s, d_value)
        x, context, value = x.unsqueeze(0), context.unsqueeze(0), value.unsqueeze(0)
    return x, context, value, unbatched


def _with_key_padding(
    attn_mask: Tensor | None, key_padding_mask: Tensor | None, unbatched: bool
) -> Tensor | None:
    """`attn_mask` with the key padding merged in; causality is `attend`'s."""
    if key_padding_mask is None:
        return attn_mask
    if unbatched:
        key_padding_mask = key_padding_mask.unsqueeze(0)  # (1, s)
    if key_padding_mask.dtype == torch.bool:  # True = padding, nn.MultiheadAttention's
        key_padding_mask = ~key_padding_mask  # allowed convention (checked in forward)
    padding = key_padding_mask[:, None, None, :]  # (b, 1, 1, s)
    return masks.combine(materialize(attn_mask, padding.device), padding)  # (b, h|1, t, s)
