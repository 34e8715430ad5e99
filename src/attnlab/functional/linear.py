r"""Linear attention and the (gated) delta rule as pure functions: the recurrences.

Linear attention (Katharopoulos et al., "Transformers are RNNs", 2020,
https://arxiv.org/abs/2006.16236) replaces the softmax's $\exp(q^\top k)$ by a product of
feature maps $\phi(q)^\top \phi(k)$, so the causal output reads a state $S_t$ of
`d_k x d_v` numbers, whatever the context length:

$$
o_t = \frac{\phi(q_t)^\top S_t}{\phi(q_t)^\top z_t}, \qquad
S_t = S_{t-1} + \phi(k_t) v_t^\top, \qquad z_t = z_{t-1} + \phi(k_t)
$$

[`linear_attention`][attnlab.functional.linear.linear_attention] computes it as a masked
`t x t` matrix (`form="parallel"`) or with that state (`form="recurrent"`).

The gated delta rule (Yang, Kautz and Hatamizadeh, "Gated Delta Networks", 2024,
https://arxiv.org/abs/2412.06464) writes to the state only what it does not already
predict, at a rate $\beta_t$, and shrinks the old state by $\alpha_t = e^{g_t}$:
$S_t = \alpha_t (I - \beta_t k_t k_t^\top) S_{t-1} + \beta_t k_t v_t^\top$, $o_t = S_t^\top q_t$.
Kimi Delta Attention (KDA, Kimi Team, "Kimi Linear", 2025, https://arxiv.org/abs/2510.26692)
decays each key channel at its own rate, $\operatorname{Diag}(\alpha_t)$ for the scalar
$\alpha_t$. [`delta_rule`][attnlab.functional.linear.delta_rule] computes both (a
`log_decay` of one value per head and token, or one per key channel) in three modes that
agree:
token by token with that matrix (`"naive"`), as a rank-one update (`"recurrent"`, what
decoding runs) and chunk by chunk (`"chunk"`, what training and prefill run: inside a
chunk the recurrence becomes a unit lower-triangular solve, the WY/UT transform). The
layers around them are in [`attnlab.layers.linear`][attnlab.layers.linear].
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.rules._precision import compute_dtype
from attnlab.rules._validation import (
    _shape,
    check_bool,
    check_choice,
    check_min_rank,
    check_positive_int,
    check_rank,
    check_same_dtype_device,
    check_tensor,
    checking,
    entry,
)
from attnlab.rules.masks import band

__all__ = [
    "DELTA_RULE_MODES",
    "delta_rule",
    "elu_feature_map",
    "linear_attention",
]

DELTA_RULE_MODES = ("chunk", "recurrent", "naive")
"""The three ways [`delta_rule`][attnlab.functional.linear.delta_rule] computes the same outputs."""

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


@entry
def linear_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    is_causal: bool = True,
    form: str = "parallel",
    feature_map: Callable[[Tensor], Tensor] = elu_feature_map,
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
    check_choice("form", form, _FORMS)
    check_bool("is_causal", is_causal)
    if checking():
        _check_linear_inputs(query, key, value)
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


def _check_qkv(
    query: object,
    key: object,
    value: object,
    check_layout: Callable[[str, Tensor], object],
    rule: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """query, key and value as tensors of one layout, dtype and device; key shaped as query,
    value as query but for its features (`rule` says so in the error)."""
    q, k, v = (check_tensor(n, x) for n, x in (("query", query), ("key", key), ("value", value)))
    for name, x in (("query", q), ("key", k), ("value", v)):
        check_layout(name, x)
    if k.shape != q.shape or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(
            f"{rule}, got query.shape={_shape(q)}, key.shape={_shape(k)}, value.shape={_shape(v)}"
        )
    check_same_dtype_device("query", q, key=k, value=v)
    return q, k, v


def _check_linear_inputs(query: object, key: object, value: object) -> None:
    _check_qkv(
        query,
        key,
        value,
        lambda name, x: check_min_rank(name, x, 2, "(..., t, features)"),
        "query and key must have the same shape (..., t, d_k) and value (..., t, d_v) "
        "the same leading shape",
    )


# --- the delta rule ---------------------------------------------------------------------


@entry
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
    r"""The delta rule (DeltaNet), or with `log_decay` the gated delta rule (Gated
    DeltaNet, one decay per head) or Kimi Delta Attention (one decay per key channel).

    With the state $S$ `(d_k, d_v)` starting at `initial_state` (zeros if None), each token
    $t$ updates it and reads it:

    $$
    S_t = \left(I - \beta_t k_t k_t^\top\right) \operatorname{Diag}(\alpha_t) S_{t-1}
    + \beta_t k_t v_t^\top, \qquad o_t = S_t^\top q_t, \qquad \alpha_t = e^{g_t}
    $$

    ($\alpha_t = 1$ without `log_decay`; a scalar $\alpha_t$ per head is the Gated
    DeltaNet form $\alpha_t (I - \beta_t k_t k_t^\top) S_{t-1} + \beta_t k_t v_t^\top$).
    `S^T k` is what the state predicts for key $k$; the update moves that prediction a
    fraction $\beta_t$ of the way to $v_t$. Queries and keys are used as given: scale and
    normalise them first (Gated DeltaNet and KDA L2-normalise both and scale queries by
    `d_k ** -0.5`; with unit keys and $\beta \le 1$ the transition
    $I - \beta k k^\top$ has no eigenvalue above 1, so the state stays bounded).

    The modes compute the same thing: `"naive"` builds the `(d_k, d_k)` transition of
    every token, `"recurrent"` applies it as a rank-one update, `"chunk"` processes
    `chunk_size` tokens at a time with one triangular solve per chunk (see the module's
    docstring); all three return the same outputs and final state up to rounding.

    Args:
        query: `(b, h, t, d_k)`.
        key: `(b, h, t, d_k)`.
        value: `(b, h, t, d_v)`.
        beta: `(b, h, t)`, the writing strength, usually in (0, 1).
        log_decay: $g_t \le 0$ (Hugging Face's `g`): `(b, h, t)`, one per head (Gated
            DeltaNet), or `(b, h, t, d_k)`, one per key channel (KDA); None for DeltaNet.
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
    if checking():
        _check_delta_inputs(query, key, value, beta, log_decay, initial_state)
    dtype = query.dtype
    wide = compute_dtype(dtype)
    if wide != dtype:  # half precision: compute in float32, return the outputs in dtype
        query, key, value, beta = (x.to(wide) for x in (query, key, value, beta))
        log_decay = None if log_decay is None else log_decay.to(wide)
        initial_state = None if initial_state is None else initial_state.to(wide)
        out, state = delta_rule(
            query,
            key,
            value,
            beta,
            log_decay,
            mode=mode,
            chunk_size=chunk_size,
            initial_state=initial_state,
        )
        return out.to(dtype), state
    if initial_state is None:
        b, h, _, d_k = key.shape
        initial_state = value.new_zeros((b, h, d_k, value.shape[-1]))
    if log_decay is None:
        log_decay = beta.new_zeros(beta.shape)
    if log_decay.ndim == 3:  # one decay per head: a channel axis of 1 that broadcasts
        log_decay = log_decay.unsqueeze(-1)  # (b, h, t, 1 or d_k) from here on
    if mode == "chunk":
        return _delta_chunk(query, key, value, beta, log_decay, initial_state, chunk_size)
    step = _delta_step_naive if mode == "naive" else _delta_step
    state, outputs = initial_state, []
    for t in range(query.shape[-2]):
        state = step(state, key[..., t, :], value[..., t, :], beta[..., t], log_decay[..., t, :])
        outputs.append((query[..., t, :].unsqueeze(-1) * state).sum(-2))  # S^T q: (b, h, d_v)
    if not outputs:
        return value.new_zeros(value.shape), state
    return torch.stack(outputs, dim=-2), state  # (b, h, t, d_v)


def _delta_step_naive(state: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor) -> Tensor:
    """One token of the gated delta rule with its transition matrix written out; `g`
    `(b, h, 1 or d_k)`."""
    beta = beta[..., None, None]
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)
    kk = k.unsqueeze(-1) * k.unsqueeze(-2)  # (b, h, d_k, d_k)
    transition = (eye - beta * kk) * g.exp().unsqueeze(-2)  # (I - b k k^T) Diag(alpha)
    return transition @ state + beta * (k.unsqueeze(-1) * v.unsqueeze(-2))


def _delta_step(state: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor) -> Tensor:
    """One token of the gated delta rule as a rank-one update (what decoding runs)."""
    state = state * g.exp().unsqueeze(-1)  # each key channel's row decays: Diag(alpha) S
    predicted = (k.unsqueeze(-1) * state).sum(-2)  # S^T k: (b, h, d_v)
    correction = beta.unsqueeze(-1) * (v - predicted)  # (b, h, d_v)
    return state + k.unsqueeze(-1) * correction.unsqueeze(-2)


def _delta_chunk(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, state: Tensor, size: int
) -> tuple[Tensor, Tensor]:
    r"""The gated delta rule chunk by chunk; `g` `(b, h, t, 1 or d_k)`.

    In a chunk that starts from state $S_0$, let $\Gamma_i = \prod_{j \le i} \alpha_j$
    (decay from the chunk's start to token $i$, one number per key channel) and
    $u_i = \beta_i (v_i - S_{i-1}^\top (\alpha_i \odot k_i))$ the correction that token
    $i$ writes, so that $S_i = \operatorname{Diag}(\Gamma_i) S_0 + \sum_{j \le i}
    \operatorname{Diag}(\Gamma_i / \Gamma_j) k_j u_j^\top$. Substituting $S_{i-1}$ into
    $u_i$ gives a unit lower-triangular system for all $u$ of the chunk,

    $$
    (I + L)\,U = \beta \odot V - \beta \odot (\Gamma \odot K)\,S_0, \qquad
    L_{ij} = \beta_i\, k_i^\top \operatorname{Diag}(\Gamma_i / \Gamma_j)\, k_j \ (j < i),
    $$

    solved once per chunk; then the outputs are $O = (\Gamma \odot Q) S_0 + A\,U$ with
    $A_{ij} = q_i^\top \operatorname{Diag}(\Gamma_i / \Gamma_j)\, k_j$ for $j \le i$
    (0 above), and the state at the chunk's end $S_C = \operatorname{Diag}(\Gamma_C) S_0 +
    (K \odot \Gamma_C / \Gamma)^\top U$. With one decay per head (a channel axis of 1)
    the products factor into $q_i^\top k_j\, \Gamma_i / \Gamma_j$, one matrix product.
    Only the last line is sequential across chunks.
    """
    outputs = []
    for start in range(0, q.shape[-2], size):
        chunk = slice(start, start + size)
        q_c, k_c, v_c = q[..., chunk, :], k[..., chunk, :], v[..., chunk, :]  # (b, h, c, d)
        beta_c, cum = beta[..., chunk], g[..., chunk, :].cumsum(-2)  # (b, h, c, 1 or d_k)
        c = q_c.shape[-2]
        causal = band(c, c, "top-left", None, q.device)  # (c, c): j <= i
        # log(Gamma_i / Gamma_j), masked above the diagonal before exp: it is > 0 there
        # and could overflow.
        log_ratio = cum.unsqueeze(-2) - cum.unsqueeze(-3)  # (b, h, c, c, 1 or d_k)
        ratio = log_ratio.masked_fill(~causal[..., None], -torch.inf).exp()
        gamma = cum.exp()  # (b, h, c, 1 or d_k)
        k_beta = k_c * beta_c.unsqueeze(-1)  # (b, h, c, d_k)
        system = _decayed(k_beta, k_c, ratio).tril(-1)  # L: (b, h, c, c)
        system = system + torch.eye(c, dtype=q.dtype, device=q.device)
        rhs = torch.cat([v_c * beta_c.unsqueeze(-1), k_beta * gamma], dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        values, keys = torch.split(solved, [v.shape[-1], k.shape[-1]], dim=-1)
        u = values - keys @ state  # (b, h, c, d_v)
        outputs.append((q_c * gamma) @ state + _decayed(q_c, k_c, ratio) @ u)
        to_end = (cum[..., -1:, :] - cum).exp()  # Gamma_C / Gamma_j: (b, h, c, 1 or d_k)
        state = state * gamma[..., -1, :, None] + (k_c * to_end).transpose(-1, -2) @ u
    if not outputs:
        return v.new_zeros(v.shape), state
    return torch.cat(outputs, dim=-2), state  # (b, h, t, d_v)


def _decayed(a: Tensor, b: Tensor, ratio: Tensor) -> Tensor:
    r"""`(..., c, c)`: $a_i^\top \operatorname{Diag}(r_{ij})\, b_j$ for `a`, `b`
    `(..., c, d)` and decay ratios `ratio` `(..., c, c, 1 or d)`; one matrix product when
    `ratio` has one channel."""
    if ratio.shape[-1] == 1:
        return (a @ b.transpose(-1, -2)) * ratio[..., 0]
    return (a.unsqueeze(-2) * b.unsqueeze(-3) * ratio).sum(-1)


def _check_delta_inputs(
    query: object,
    key: object,
    value: object,
    beta: object,
    log_decay: object,
    initial_state: object,
) -> None:
    q, _, v = _check_qkv(
        query,
        key,
        value,
        lambda name, x: check_rank(name, x, (4,), "(b, h, t, features)"),
        "query and key must be (b, h, t, d_k) and value (b, h, t, d_v) with the same b, h, t",
    )
    gates = {"beta": beta} if log_decay is None else {"beta": beta, "log_decay": log_decay}
    for name, gate in gates.items():
        y = check_tensor(name, gate)
        per_channel = name == "log_decay" and y.shape == q.shape  # KDA: one per key channel
        if y.shape != q.shape[:-1] and not per_channel:
            also = f" or (b, h, t, d_k) = {_shape(q)}" if name == "log_decay" else ""
            raise ValueError(
                f"{name} must be (b, h, t) = {_shape(q)[:-1]}{also}, got {name}.shape={_shape(y)}"
            )
        if y.device != q.device:
            raise ValueError(f"{name} is on {y.device} but query is on {q.device}")
        if y.dtype != q.dtype:
            raise TypeError(f"{name} must have query's dtype {q.dtype}, got {y.dtype}")
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
