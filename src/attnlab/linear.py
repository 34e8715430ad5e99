r"""Linear attention and the (gated) delta rule: attention as an RNN with a matrix state.

Linear attention (Katharopoulos et al., "Transformers are RNNs", 2020,
https://arxiv.org/abs/2006.16236) replaces the softmax's $\exp(q^\top k)$ by a product of
feature maps $\phi(q)^\top \phi(k)$. Written that way, the causal output

$$
o_t = \frac{\phi(q_t)^\top S_t}{\phi(q_t)^\top z_t}, \qquad
S_t = S_{t-1} + \phi(k_t) v_t^\top, \qquad z_t = z_{t-1} + \phi(k_t)
$$

reads a state $S_t$ of `d_k x d_v` numbers, whatever the context length.
[`linear_attention`][attnlab.linear.linear_attention] computes it as a masked
`t x t` matrix (`form="parallel"`) or with that state (`form="recurrent"`);
[`LinearSelfAttention`][attnlab.linear.LinearSelfAttention] is a multi-head layer of it,
a drop-in for the attention of a [`TinyTransformer`][attnlab.model.TinyTransformer] block.

The delta rule (DeltaNet: Schlag et al. 2021; Yang et al., "Parallelizing Linear
Transformers with the Delta Rule over Sequence Length", 2024) writes to the state only
what it does not already predict, at a rate $\beta_t \in (0, 1)$; its gated form (Gated
DeltaNet: Yang, Kautz and Hatamizadeh, "Gated Delta Networks", 2024,
https://arxiv.org/abs/2412.06464) also shrinks the old state by $\alpha_t = e^{g_t}$:

$$
S_t = \alpha_t \left(I - \beta_t k_t k_t^\top\right) S_{t-1} + \beta_t k_t v_t^\top,
\qquad o_t = S_t^\top q_t
$$

[`delta_rule`][attnlab.linear.delta_rule] computes it token by token with that matrix
(`mode="naive"`), token by token as a rank-one update (`"recurrent"`, what decoding
runs) or chunk by chunk (`"chunk"`, what training and prefill run): inside a chunk the
recurrence becomes a unit lower-triangular solve (the WY/UT transform), so a chunk of
`C` tokens costs a few `C x C` and `C x d` matrix products instead of `C` steps.
[`GatedDeltaNet`][attnlab.linear.GatedDeltaNet] is the layer of Qwen3-Next around it:
projections, a short causal convolution, the gates, a gated RMSNorm, with a
[`GatedDeltaNetState`][attnlab.linear.GatedDeltaNetState] carried from prefill to decode.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._precision import compute_dtype
from attnlab._validation import (
    _shape,
    check_bool,
    check_choice,
    check_features,
    check_min_rank,
    check_multiple,
    check_padding_mask,  # re-exported: its home is _validation, used by llm and sparse too
    check_padding_of,
    check_positive_float,
    check_positive_int,
    check_rank,
    check_same_dtype_device,
    check_tensor,
    check_tokens,
    is_validation_enabled,
)
from attnlab.gqa import rms_normalize
from attnlab.masks import band_impl

__all__ = [
    "DELTA_RULE_MODES",
    "GatedDeltaNet",
    "GatedDeltaNetState",
    "LinearSelfAttention",
    "check_padding_mask",
    "delta_rule",
    "elu_feature_map",
    "linear_attention",
]

DELTA_RULE_MODES = ("chunk", "recurrent", "naive")
"""The three ways [`delta_rule`][attnlab.linear.delta_rule] computes the same outputs."""

_FORMS = ("parallel", "recurrent")
_EPS = 1e-6


def elu_feature_map(x: Tensor) -> Tensor:
    r"""Katharopoulos et al.'s feature map $\phi(x) = \operatorname{elu}(x) + 1$, positive.

    Examples:
        >>> elu_feature_map(torch.tensor([-1.0, 0.0, 2.0]))
        tensor([0.3679, 1.0000, 3.0000])
    """
    return F.elu(x) + 1.0


# --- linear attention -------------------------------------------------------------------


def linear_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    is_causal: bool = True,
    form: str = "parallel",
    feature_map: Callable[[Tensor], Tensor] = elu_feature_map,
    causal: bool | None = None,
) -> Tensor:
    r"""Linear attention: softmax attention with $\exp(q^\top k)$ replaced by $\phi(q)^\top\phi(k)$.

    Each output is a weighted mean of the values with weights
    $\phi(q_i)^\top \phi(k_j) / \sum_{j'} \phi(q_i)^\top \phi(k_{j'})$, over keys
    $j \le i$ if `is_causal`. `form="parallel"` builds that `t x t` weight matrix (masked
    if causal); `form="recurrent"` never does: it carries the sums
    $S = \sum_j \phi(k_j) v_j^\top$ `(d_k, d_v)` and $z = \sum_j \phi(k_j)$ `(d_k,)`,
    token by token if causal, once over all keys if not. The two are equal.

    Args:
        query: `(..., t, d_k)`.
        key: `(..., t, d_k)`, the same leading shape.
        value: `(..., t, d_v)`.
        is_causal: Whether query `i` sees only keys `j <= i` (the name of every other
            attention function and of `LinearSelfAttention.forward`).
        form: `"parallel"` or `"recurrent"`.
        feature_map: $\phi$, applied to queries and keys; its values must be positive for
            the weights to be a mean (the default, elu + 1, is).
        causal: Deprecated name of `is_causal` (a `DeprecationWarning`); when given, it
            is used.

    Returns:
        `(..., t, d_v)`.

    Raises:
        TypeError: If an input is not a floating-point tensor.
        ValueError: If the shapes do not fit together or `form` is unknown.

    Examples:
        >>> q, k, v = torch.randn(2, 5, 3), torch.randn(2, 5, 3), torch.randn(2, 5, 4)
        >>> out = linear_attention(q, k, v)
        >>> torch.allclose(out, linear_attention(q, k, v, form="recurrent"), atol=1e-6)
        True
    """
    if causal is not None:
        warnings.warn(
            "linear_attention(causal=...) is deprecated: use is_causal=",
            DeprecationWarning,
            stacklevel=2,
        )
        is_causal = check_bool("causal", causal)
    check_choice("form", form, _FORMS)
    check_bool("is_causal", is_causal)
    if is_validation_enabled():
        _check_linear_inputs(query, key, value)
    return _linear_attention_impl(query, key, value, is_causal, form, feature_map)


def _linear_attention_impl(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    is_causal: bool,
    form: str,
    feature_map: Callable[[Tensor], Tensor],
) -> Tensor:
    q, k = feature_map(query), feature_map(key)
    # The normaliser gets Katharopoulos et al.'s epsilon: a query whose features all
    # underflow to 0 (elu + 1 of a large negative input) then reads 0, not 0 / 0.
    if form == "parallel":
        weights = q @ k.transpose(-1, -2)  # (..., t, t)
        if is_causal:
            weights = weights.tril()
        return (weights @ value) / (weights.sum(-1, keepdim=True) + _EPS)
    if not is_causal:
        state = k.transpose(-1, -2) @ value  # (..., d_k, d_v)
        norm = k.sum(-2)  # (..., d_k)
        return (q @ state) / (q @ norm.unsqueeze(-1) + _EPS)
    state = q.new_zeros((*q.shape[:-2], q.shape[-1], value.shape[-1]))  # (..., d_k, d_v)
    norm = q.new_zeros((*q.shape[:-2], q.shape[-1]))  # (..., d_k)
    outputs = []
    for t in range(q.shape[-2]):
        k_t, q_t = k[..., t, :], q[..., t, :]  # (..., d_k)
        state = state + k_t.unsqueeze(-1) * value[..., t, :].unsqueeze(-2)
        norm = norm + k_t
        read = (q_t.unsqueeze(-1) * state).sum(-2)  # (..., d_v)
        outputs.append(read / ((q_t * norm).sum(-1, keepdim=True) + _EPS))
    return torch.stack(outputs, dim=-2)  # (..., t, d_v)


class LinearSelfAttention(nn.Module):
    """Multi-head self-attention with [`linear_attention`][attnlab.linear.linear_attention].

    One projection `qkv` makes queries, keys and values of `num_heads` heads of
    `d_model // num_heads` features; each head attends with elu + 1 features in the
    masked parallel form, and `out` projects the concatenated heads back. It has the
    call that a [`TinyTransformer`][attnlab.model.TinyTransformer] block makes of its
    attention (`forward_impl(x, is_causal=True)`) and the same number of parameters as
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

    def forward(self, x: Tensor, *, is_causal: bool = True) -> Tensor:
        """Attend over `x` `(b, t, d_model)`; query `i` sees keys `j <= i` if `is_causal`.

        Raises:
            TypeError: If `x` is not a floating-point tensor or `is_causal` not a bool.
            ValueError: If `x` is not `(b, t, d_model)`.
        """
        if is_validation_enabled():
            x = check_tensor("x", x)
            check_rank("x", x, (3,), "(b, t, d_model)")
            check_features("x", x, self.d_model, "LinearSelfAttention", "d_model")
            check_bool("is_causal", is_causal)
        return self.forward_impl(x, is_causal=is_causal)

    def forward_impl(self, x: Tensor, is_causal: bool = True) -> Tensor:
        """[`forward`][attnlab.linear.LinearSelfAttention.forward] without its checks."""
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # (b, num_heads, t, head_dim) each
        heads = _linear_attention_impl(q, k, v, is_causal, "parallel", elu_feature_map)
        out: Tensor = self.out(heads.transpose(1, 2).reshape(b, t, d))  # (b, t, d_model)
        return out


def _check_linear_inputs(query: object, key: object, value: object) -> None:
    q, k, v = (check_tensor(n, x) for n, x in (("query", query), ("key", key), ("value", value)))
    for name, x in (("query", q), ("key", k), ("value", v)):
        check_min_rank(name, x, 2, "(..., t, features)")
    if k.shape != q.shape or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(
            "query and key must have the same shape (..., t, d_k) and value (..., t, d_v) "
            f"the same leading shape, got query.shape={_shape(q)}, key.shape={_shape(k)}, "
            f"value.shape={_shape(v)}"
        )
    check_same_dtype_device("query", q, key=k, value=v)


# --- the delta rule ---------------------------------------------------------------------


def delta_rule(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    beta: Tensor,
    log_decay: Tensor | None = None,
    *,
    mode: str = "chunk",
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The delta rule (DeltaNet), or with `log_decay` the gated delta rule (Gated DeltaNet).

    With the state $S$ `(d_k, d_v)` starting at `initial_state` (zeros if None), each token
    $t$ updates it and reads it:

    $$
    S_t = \alpha_t \left(I - \beta_t k_t k_t^\top\right) S_{t-1} + \beta_t k_t v_t^\top,
    \qquad o_t = S_t^\top q_t, \qquad \alpha_t = e^{g_t}
    $$

    ($\alpha_t = 1$ without `log_decay`). `S^T k` is what the state predicts for key $k$;
    the update moves that prediction a fraction $\beta_t$ of the way to $v_t$. Queries and
    keys are used as given: scale and normalise them first (Gated DeltaNet L2-normalises
    both and scales queries by `d_k ** -0.5`; with unit keys and $\beta \le 1$ the
    transition $I - \beta k k^\top$ has no eigenvalue above 1, so the state stays bounded).

    The modes compute the same thing: `"naive"` builds the `(d_k, d_k)` transition of
    every token, `"recurrent"` applies it as a rank-one update, `"chunk"` processes
    `chunk_size` tokens at a time with one triangular solve per chunk (see the module's
    docstring); all three return the same outputs and final state up to rounding.

    Args:
        query: `(b, h, t, d_k)`.
        key: `(b, h, t, d_k)`.
        value: `(b, h, t, d_v)`.
        beta: `(b, h, t)`, the writing strength, usually in (0, 1).
        log_decay: `(b, h, t)`, $g_t \le 0$ (Hugging Face's `g`), or None for DeltaNet.
        mode: `"chunk"`, `"recurrent"` or `"naive"`.
        chunk_size: Tokens per chunk in `"chunk"` mode (the last chunk may be shorter).
        initial_state: `(b, h, d_k, d_v)`, the state before the first token, or None.

    Returns:
        The outputs `(b, h, t, d_v)` and the state after the last token `(b, h, d_k, d_v)`.
        Float16 and bfloat16 inputs are computed in float32: the outputs come back in
        the inputs' dtype, the state stays float32 (as Hugging Face's kernels keep it).

    Raises:
        TypeError: If an input is not a floating-point tensor or `chunk_size` not an int.
        ValueError: If shapes do not fit together, `mode` is unknown or `chunk_size` is
            not positive.

    Examples:
        >>> q, k = torch.randn(1, 2, 6, 3), F.normalize(torch.randn(1, 2, 6, 3), dim=-1)
        >>> v, beta = torch.randn(1, 2, 6, 4), torch.rand(1, 2, 6)
        >>> out, state = delta_rule(q, k, v, beta, chunk_size=4)
        >>> out2, state2 = delta_rule(q, k, v, beta, mode="recurrent")
        >>> torch.allclose(out, out2, atol=1e-6), state.shape
        (True, torch.Size([1, 2, 3, 4]))
    """
    check_choice("mode", mode, DELTA_RULE_MODES)
    check_positive_int("chunk_size", chunk_size)
    if is_validation_enabled():
        _check_delta_inputs(query, key, value, beta, log_decay, initial_state)
    return delta_rule_impl(query, key, value, beta, log_decay, mode, chunk_size, initial_state)


def delta_rule_impl(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    beta: Tensor,
    log_decay: Tensor | None,
    mode: str,
    chunk_size: int,
    initial_state: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """[`delta_rule`][attnlab.linear.delta_rule] without its checks (for the layers)."""
    dtype = query.dtype
    wide = compute_dtype(dtype)
    if wide != dtype:  # half precision: compute in float32, return the outputs in dtype
        query, key, value, beta = (x.to(wide) for x in (query, key, value, beta))
        log_decay = None if log_decay is None else log_decay.to(wide)
        initial_state = None if initial_state is None else initial_state.to(wide)
        out, state = delta_rule_impl(
            query, key, value, beta, log_decay, mode, chunk_size, initial_state
        )
        return out.to(dtype), state
    if initial_state is None:
        b, h, _, d_k = key.shape
        initial_state = value.new_zeros((b, h, d_k, value.shape[-1]))
    if log_decay is None:
        log_decay = beta.new_zeros(beta.shape)
    if mode == "chunk":
        return _delta_chunk(query, key, value, beta, log_decay, initial_state, chunk_size)
    step = _delta_step_naive if mode == "naive" else _delta_step
    state, outputs = initial_state, []
    for t in range(query.shape[-2]):
        state = step(state, key[..., t, :], value[..., t, :], beta[..., t], log_decay[..., t])
        outputs.append((query[..., t, :].unsqueeze(-1) * state).sum(-2))  # S^T q: (b, h, d_v)
    if not outputs:
        return value.new_zeros(value.shape), state
    return torch.stack(outputs, dim=-2), state  # (b, h, t, d_v)


def _delta_step_naive(state: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor) -> Tensor:
    """One token of the gated delta rule with its transition matrix written out."""
    beta, alpha = beta[..., None, None], g.exp()[..., None, None]
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)
    kk = k.unsqueeze(-1) * k.unsqueeze(-2)  # (b, h, d_k, d_k)
    transition = alpha * (eye - beta * kk)
    return transition @ state + beta * (k.unsqueeze(-1) * v.unsqueeze(-2))


def _delta_step(state: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor) -> Tensor:
    """One token of the gated delta rule as a rank-one update (what decoding runs)."""
    state = state * g.exp()[..., None, None]
    predicted = (k.unsqueeze(-1) * state).sum(-2)  # S^T k: (b, h, d_v)
    correction = beta.unsqueeze(-1) * (v - predicted)  # (b, h, d_v)
    return state + k.unsqueeze(-1) * correction.unsqueeze(-2)


def _delta_chunk(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, state: Tensor, size: int
) -> tuple[Tensor, Tensor]:
    r"""The gated delta rule chunk by chunk.

    In a chunk that starts from state $S_0$, let $\Gamma_i = \prod_{j \le i} \alpha_j$
    (decay from the chunk's start to token $i$) and $u_i = \beta_i (v_i - \alpha_i
    S_{i-1}^\top k_i)$ the correction that token $i$ writes, so that
    $S_i = \Gamma_i S_0 + \sum_{j \le i} (\Gamma_i / \Gamma_j) k_j u_j^\top$. Substituting
    $S_{i-1}$ into $u_i$ gives a unit lower-triangular system for all $u$ of the chunk,

    $$
    (I + L)\,U = \beta \odot V - (\beta \odot \Gamma \odot K)\,S_0, \qquad
    L_{ij} = \beta_i \tfrac{\Gamma_i}{\Gamma_j} k_i^\top k_j \ (j < i),
    $$

    solved once per chunk; then the outputs are $O = (\Gamma \odot Q) S_0 + (Q K^\top
    \odot D)\,U$ with $D_{ij} = \Gamma_i / \Gamma_j$ for $j \le i$ (0 above), and the state
    at the chunk's end $S_C = \Gamma_C S_0 + (K \odot \Gamma_C / \Gamma)^\top U$. Only the
    last line is sequential across chunks.
    """
    outputs = []
    for start in range(0, q.shape[-2], size):
        chunk = slice(start, start + size)
        q_c, k_c, v_c = q[..., chunk, :], k[..., chunk, :], v[..., chunk, :]  # (b, h, c, d)
        beta_c, cum = beta[..., chunk], g[..., chunk].cumsum(-1)  # (b, h, c)
        c = q_c.shape[-2]
        causal = band_impl(c, c, "top-left", None, q.device)  # (c, c): j <= i
        # log(Gamma_i / Gamma_j), masked above the diagonal before exp: it is > 0 there
        # and could overflow.
        log_ratio = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(~causal, -torch.inf)
        ratio = log_ratio.exp()  # (b, h, c, c), D
        gamma = cum.exp().unsqueeze(-1)  # (b, h, c, 1)
        k_beta = k_c * beta_c.unsqueeze(-1)  # (b, h, c, d_k)
        system = (k_beta @ k_c.transpose(-1, -2) * ratio).tril(-1)  # L: (b, h, c, c)
        system = system + torch.eye(c, dtype=q.dtype, device=q.device)
        rhs = torch.cat([v_c * beta_c.unsqueeze(-1), k_beta * gamma], dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        values, keys = torch.split(solved, [v.shape[-1], k.shape[-1]], dim=-1)
        u = values - keys @ state  # (b, h, c, d_v)
        outputs.append((q_c * gamma) @ state + (q_c @ k_c.transpose(-1, -2) * ratio) @ u)
        to_end = (cum[..., -1:] - cum).exp().unsqueeze(-1)  # Gamma_C / Gamma_j: (b, h, c, 1)
        state = state * gamma[..., -1:, :] + (k_c * to_end).transpose(-1, -2) @ u
    if not outputs:
        return v.new_zeros(v.shape), state
    return torch.cat(outputs, dim=-2), state  # (b, h, t, d_v)


def _check_delta_inputs(
    query: object,
    key: object,
    value: object,
    beta: object,
    log_decay: object,
    initial_state: object,
) -> None:
    q, k, v = (check_tensor(n, x) for n, x in (("query", query), ("key", key), ("value", value)))
    for name, x in (("query", q), ("key", k), ("value", v)):
        check_rank(name, x, (4,), "(b, h, t, features)")
    if k.shape != q.shape or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(
            "query and key must be (b, h, t, d_k) and value (b, h, t, d_v) with the same "
            f"b, h, t, got query.shape={_shape(q)}, key.shape={_shape(k)}, "
            f"value.shape={_shape(v)}"
        )
    check_same_dtype_device("query", q, key=k, value=v)
    gates = {"beta": beta} if log_decay is None else {"beta": beta, "log_decay": log_decay}
    for name, gate in gates.items():
        y = check_tensor(name, gate)
        if y.shape != q.shape[:-1]:
            raise ValueError(
                f"{name} must be (b, h, t) = {_shape(q)[:-1]}, got {name}.shape={_shape(y)}"
            )
        if y.device != q.device:
            raise ValueError(f"{name} is on {y.device} but query is on {q.device}")
    if initial_state is not None:
        s = check_tensor("initial_state", initial_state)
        expected = (*q.shape[:2], q.shape[-1], v.shape[-1])
        if s.shape != expected:
            raise ValueError(
                f"initial_state must be (b, h, d_k, d_v) = {expected}, "
                f"got initial_state.shape={_shape(s)}"
            )
        if s.device != q.device:
            raise ValueError(f"initial_state is on {s.device} but query is on {q.device}")


# --- padding ----------------------------------------------------------------------------


# --- the layer --------------------------------------------------------------------------


@dataclasses.dataclass
class GatedDeltaNetState:
    """What a [`GatedDeltaNet`][attnlab.linear.GatedDeltaNet] carries from one call to the next.

    Its size does not grow with the context: that is the point of the layer.

    Attributes:
        conv: `(b, conv_dim, kernel_size - 1)`, the last inputs of the causal convolution
            (queries, keys and values before it), zeros before the first token.
        recurrent: `(b, num_v_heads, head_k_dim, head_v_dim)`, the delta rule's state $S$.
        seen: Tokens processed so far.
    """

    conv: Tensor
    recurrent: Tensor
    seen: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes the two state tensors hold."""
        return sum(x.numel() * x.element_size() for x in (self.conv, self.recurrent))

    @property
    def length(self) -> int:
        """Tokens seen so far, as a KV cache's `length` (the position of the next token)."""
        return self.seen

    @property
    def batch_size(self) -> int:
        """Sequences the state holds."""
        return int(self.conv.shape[0])


class GatedDeltaNet(nn.Module):
    r"""Gated DeltaNet layer as in Qwen3-Next (Hugging Face's `Qwen3NextGatedDeltaNet`).

    For input $x$ `(b, t, d_model)`: queries, keys and values are projected
    (`q_proj`, `k_proj`: `num_k_heads * head_k_dim` features each; `v_proj`:
    `num_v_heads * head_v_dim`), pass together through a depthwise causal convolution of
    `kernel_size` taps and a SiLU, and queries and keys are L2-normalised per head
    (queries then scaled by `head_k_dim ** -0.5`). Per value head and token,
    $\beta = \sigma(b\_proj(x))$ and $g = -e^{A\_log} \cdot \operatorname{softplus}(
    a\_proj(x) + dt\_bias)$ feed [`delta_rule`][attnlab.linear.delta_rule]; each key head
    serves `num_v_heads // num_k_heads` consecutive value heads. Its output is
    RMS-normalised per head (weight `norm_weight`), multiplied by
    $\operatorname{SiLU}(z\_proj(x))$ and projected back by `out_proj`.

    Hugging Face's layer fuses `q_proj`, `k_proj`, `v_proj`, `z_proj` into `in_proj_qkvz`
    and `b_proj`, `a_proj` into `in_proj_ba` (rows grouped by key head);
    [`from_hf`][attnlab.linear.GatedDeltaNet.from_hf] splits them.

    Args:
        d_model: Features per token, in and out.
        num_k_heads: Query/key heads.
        num_v_heads: Value heads, a multiple of `num_k_heads`.
        head_k_dim: Features per query/key head.
        head_v_dim: Features per value head.
        kernel_size: Taps of the causal convolution (Qwen3-Next: 4).
        mode: How [`delta_rule`][attnlab.linear.delta_rule] runs: `"chunk"`,
            `"recurrent"` or `"naive"`; an attribute, may be changed later.
        chunk_size: Tokens per chunk in `"chunk"` mode (Hugging Face: 64).
        norm_eps: Epsilon of the gated RMSNorm.

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
    ) -> None:
        super().__init__()
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
        self.z_proj = nn.Linear(d_model, value_dim, bias=False)
        self.b_proj = nn.Linear(d_model, num_v_heads, bias=False)
        self.a_proj = nn.Linear(d_model, num_v_heads, bias=False)
        conv = nn.Conv1d(self.conv_dim, self.conv_dim, kernel_size, groups=self.conv_dim)
        self.conv_weight = nn.Parameter(conv.weight.detach().squeeze(1))  # (conv_dim, kernel)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
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

    def forward(
        self,
        x: Tensor,
        state: GatedDeltaNetState | None = None,
        *,
        padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Apply the layer to `x` `(b, t, d_model)` or `(t, d_model)`.

        Args:
            x: The tokens, after the ones `state` has seen (if any).
            state: A state from [`new_state`][attnlab.linear.GatedDeltaNet.new_state] or an
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
        if is_validation_enabled():
            x = check_tokens(
                "x", x, features=self.d_model, param="d_model", owner="GatedDeltaNet",
                like=self.out_proj.weight,
            )  # fmt: skip
            b = x.shape[0] if x.ndim == 3 else 1
            if state is not None:
                self.check_state(state, b)
            if padding_mask is not None:
                check_padding_of(padding_mask, x, x.shape[1])
        return self.forward_impl(x, state, padding_mask=padding_mask)

    def forward_impl(
        self,
        x: Tensor,
        state: GatedDeltaNetState | None = None,
        *,
        padding_mask: Tensor | None = None,
    ) -> Tensor:
        """[`forward`][attnlab.linear.GatedDeltaNet.forward] without its checks (for a
        model that checked its input at its own boundary).

        In `"chunk"` mode a single token runs the recurrent step (a chunk of one token
        is that step), as Hugging Face's layer decodes.
        """
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
        v = v.reshape(b, t, self.num_v_heads, self.head_v_dim).transpose(1, 2).to(wide)
        beta = self.b_proj(x).to(wide).sigmoid().transpose(1, 2)  # (b, num_v_heads, t)
        dt = F.softplus(self.a_proj(x).to(wide) + self.dt_bias.to(wide))  # (b, t, h)
        g = (-self.A_log.to(wide).exp() * dt).transpose(1, 2)  # (b, num_v_heads, t)
        mode = "recurrent" if t == 1 and self.mode == "chunk" else self.mode
        out, recurrent = delta_rule_impl(
            q * self.head_k_dim**-0.5, k, v, beta, g, mode, self.chunk_size,
            None if state is None else state.recurrent,
        )  # fmt: skip
        if state is not None:
            state.conv, state.recurrent, state.seen = conv_state, recurrent, state.seen + t
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
        """RMSNorm of each head's output (in float32 or wider), times SiLU of the gate."""
        # Rounded to x's dtype before the weight, as Hugging Face's gated norm does (unlike
        # RMSNorm, which applies its weight in float32): the core is shared, not the order.
        normed = self.norm_weight * rms_normalize(x, self.norm_eps).to(x.dtype)
        return (normed * F.silu(z.to(normed.dtype))).to(x.dtype)

    def check_state(self, state: object, batch_size: int) -> None:
        """Check that `state` can carry this layer's recurrence for `batch_size` rows.

        `forward` calls it once when handed a state; a decoder that holds one state per
        layer calls it for every layer before its first step.

        Raises:
            TypeError: If `state` is not a
                [`GatedDeltaNetState`][attnlab.linear.GatedDeltaNetState].
            ValueError: If its `conv` or `recurrent` tensor has another shape, dtype or
                device than [`new_state`][attnlab.linear.GatedDeltaNet.new_state] gives.
        """
        if not isinstance(state, GatedDeltaNetState):
            raise TypeError(f"state must be a GatedDeltaNetState, got {type(state).__name__}")
        expected = self.new_state(batch_size)
        for name in ("conv", "recurrent"):
            got, want = getattr(state, name), getattr(expected, name)
            if not isinstance(got, Tensor) or got.shape != want.shape:
                shape = _shape(got) if isinstance(got, Tensor) else type(got).__name__
                raise ValueError(
                    f"state.{name} must be {_shape(want)} for this layer and a batch of "
                    f"{batch_size}, got {shape}"
                )
            if got.dtype != want.dtype or got.device != want.device:
                raise ValueError(
                    f"state.{name} must be {want.dtype} on {want.device}, got {got.dtype} "
                    f"on {got.device}; start from layer.new_state(batch_size)"
                )

    @classmethod
    def from_hf(cls, layer: Any, *, mode: str = "chunk", chunk_size: int = 64) -> GatedDeltaNet:
        """Copy Hugging Face's `Qwen3NextGatedDeltaNet` or `Qwen3_5GatedDeltaNet`.

        Qwen3-Next's fused projections are split by rows: `in_proj_qkvz` holds, per key
        head, `head_k_dim` query rows, `head_k_dim` key rows, then the value and the `z`
        rows of its `num_v_heads // num_k_heads` value heads; `in_proj_ba` holds, per
        key head, the `b` rows then the `a` rows of those value heads. Qwen3.5's layer
        computes the same with `in_proj_qkv` (all query rows, all key rows, all value
        rows) and separate `in_proj_z`, `in_proj_b`, `in_proj_a`.

        Args:
            layer: A `Qwen3NextGatedDeltaNet` or `Qwen3_5GatedDeltaNet` (transformers
                5), or a layer with the same attributes.
            mode: The new layer's `mode`.
            chunk_size: The new layer's `chunk_size`.

        Returns:
            A `GatedDeltaNet` with copies of the layer's weights, on their device and dtype.

        Raises:
            ValueError: If `layer` lacks a part this copy needs, or computes something it
                does not (a convolution bias, an activation other than SiLU).
        """
        _check_hf_layer(layer)
        new = cls(
            layer.hidden_size, num_k_heads=layer.num_k_heads, num_v_heads=layer.num_v_heads,
            head_k_dim=layer.head_k_dim, head_v_dim=layer.head_v_dim,
            kernel_size=layer.conv_kernel_size, mode=mode, chunk_size=chunk_size,
            norm_eps=layer.norm.variance_epsilon,
        )  # fmt: skip
        weight = layer.out_proj.weight
        new.to(device=weight.device, dtype=weight.dtype)
        new.load_state_dict(cls.state_dict_from_hf(layer))
        return new

    @staticmethod
    def state_dict_from_hf(layer: Any) -> dict[str, Tensor]:
        """The weights of a Hugging Face Gated DeltaNet layer under this module's names.

        What [`from_hf`][attnlab.linear.GatedDeltaNet.from_hf] loads (the fused
        projections split as it describes); a model that holds these layers
        ([`attnlab.llm.Decoder`][attnlab.llm.Decoder]) loads them under its own prefix.

        Raises:
            ValueError: As `from_hf`.
        """
        _check_hf_layer(layer)
        split = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
        d_k, key_dim = layer.head_k_dim, layer.num_k_heads * layer.head_k_dim
        if not all(hasattr(layer, name) for name in split):  # Qwen3-Next's fused rows
            group_v = layer.num_v_heads // layer.num_k_heads * layer.head_v_dim
            parts = _split_hf_projections(
                layer.in_proj_qkvz.weight, layer.in_proj_ba.weight, layer.num_k_heads, d_k,
                group_v,
            )  # fmt: skip
        else:
            value_dim = layer.num_v_heads * layer.head_v_dim
            qkv = torch.split(layer.in_proj_qkv.weight, [key_dim, key_dim, value_dim])
            parts = (*qkv, *(getattr(layer, name).weight for name in split[1:]))
        state = {f"{n}_proj.weight": w for n, w in zip("qkvzba", parts, strict=True)}
        return state | {
            "conv_weight": layer.conv1d.weight.squeeze(1),
            "dt_bias": layer.dt_bias,
            "A_log": layer.A_log,
            "norm_weight": layer.norm.weight,
            "out_proj.weight": layer.out_proj.weight,
        }


def _check_hf_layer(layer: Any) -> None:
    """Raise unless `layer` has what `GatedDeltaNet.from_hf` copies and computes as it does."""
    split = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
    fused = not all(hasattr(layer, name) for name in split)  # Qwen3-Next, not 3.5
    needed: tuple[str, ...] = ("conv1d", "dt_bias", "A_log", "norm", "out_proj")
    needed += ("in_proj_qkvz", "in_proj_ba") if fused else split
    missing = [name for name in needed if not hasattr(layer, name)]
    if missing:
        raise ValueError(
            "layer must be a Qwen3NextGatedDeltaNet or Qwen3_5GatedDeltaNet; "
            f"{type(layer).__name__} has no {', '.join(missing)}"
        )
    if layer.conv1d.bias is not None or getattr(layer, "activation", "silu") != "silu":
        raise ValueError(
            "layer computes what GatedDeltaNet does not: a convolution bias or an "
            f"activation other than silu (activation={getattr(layer, 'activation', None)!r})"
        )


def _l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """`x / sqrt(|x|^2 + eps)` over the last dimension: FLA's and Hugging Face's form."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def _split_hf_projections(
    qkvz: Tensor, ba: Tensor, num_k_heads: int, head_k_dim: int, group_v: int
) -> tuple[Tensor, ...]:
    """Hugging Face's fused `in_proj_qkvz`, `in_proj_ba` rows as (q, k, v, z, b, a) weights.

    `group_v` is the value features of one key head's group of value heads. Also splits
    gradients of the fused weights the same way.
    """
    d = qkvz.shape[-1]
    grouped = qkvz.reshape(num_k_heads, -1, d)  # (num_k_heads, 2 d_k + 2 group_v, d)
    q, k, v, z = torch.split(grouped, [head_k_dim, head_k_dim, group_v, group_v], dim=1)
    b, a = ba.reshape(num_k_heads, 2, -1, d).unbind(1)  # (num_k_heads, per group, d) each
    return tuple(x.reshape(-1, d) for x in (q, k, v, z, b, a))
