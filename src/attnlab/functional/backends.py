r"""The one home of attnlab's attention backends: names, the registry, the switch, dispatch.

Every attention module of the package (MHA, GQA, MLA) runs its scaled dot-product
attention through this module, so a backend is added or changed in one place, the way
Hugging Face's `ALL_ATTENTION_FUNCTIONS` registry serves every model:

- `"torch"`: PyTorch's fused `torch.nn.functional.scaled_dot_product_attention`;
- `"scratch"`: attnlab's
  [`scaled_dot_product_attention`][attnlab.functional.sdpa.scaled_dot_product_attention];
- `"flash"`: attnlab's [`flash_attention`][attnlab.functional.flash.flash_attention] (in tiles, with
  its own backward pass);
- `"triton"`: the same algorithm as Triton kernels,
  [`triton_flash_attention`][attnlab.functional.triton_flash.triton_flash_attention]
  (compiled on a CUDA GPU, run in Triton's interpreter on CPU tensors without one; needs
  `pip install "attnlab[triton]"`, and naming the backend without Triton says so).

FlashAttention takes no arbitrary mask and no dropout: it masks only by position
(causal, sliding window). A call that asks `"flash"` or `"triton"` for either raises a
`ValueError` that names the backend and the argument, even with validation off: silently
ignoring a mask would give wrong results, and falling back to another kernel would hide
that the memory saving the user chose is not there.

ALiBi (`rule.alibi_slopes`, one slope per query head) runs on every backend: `"torch"`
and `"scratch"` get its bias [`alibi_bias`][attnlab.rules.scores.alibi_bias] as a float
mask `(Hq, L, S)` combined with the causal or window mask and `attn_mask` (PyTorch's
fused kernel adds it to the scores; the causal flag cannot carry it, so causality
becomes a mask too), and `"flash"` computes it tile by tile from the slopes, never
holding the `(L, S)` bias.

Two score changes of 2024-2025 models pass through to every kernel that has them:
`softcap` (Gemma 2's $c \tanh(x / c)$ on the scaled scores) and `sink_logits` (gpt-oss's one
learned logit per query head, shape `(Hq,)`, in every row's softmax). PyTorch's fused
SDPA has neither. For `"torch"`, sink logits are emulated exactly: one extra key of zeros with
a zero value, whose score (0) plus a float-mask column holding the sink logit gives the
sink's share of the softmax and adds nothing to the output, so PyTorch's kernel still
runs (and differentiates the sink logits through the mask). A tanh of the scores cannot be
written as a mask, so `"torch"` refuses `softcap` with a `ValueError` naming the backend
and the two that have it, rather than quietly running another kernel.

API (internal; modules import these names):

- `Backend`: `Literal["torch", "scratch", "flash", "triton"]`, re-exported as
  `attnlab.layers.multihead.Backend`.
- `BACKEND_NAMES`: the names, in that order.
- `AttentionCall`: one call of the registry, `(query, key, value, rule, attn_mask,
  dropout_p, enable_gqa)`, a named tuple: the registry's signature, written once.
- `BACKENDS: Mapping[Backend, AttentionFunction]`: name -> function of an
  `AttentionCall`. Each runs *after* the checks: called from a module's `forward`, the
  kernel trusts what that `forward` checked.
- `check_backend(value) -> Backend`: the name, or `ValueError` naming `backend` and the
  choices.
- `BackendProperty()`: a descriptor; `backend = BackendProperty()` in a class body gives
  every instance a `backend` attribute checked by `check_backend` on each assignment
  (stored as `_backend`).
- `attend(backend, query, key, value, rule=ScoreRule(), *, attn_mask=None,
  dropout_p=0.0, enable_gqa=False)`: run attention on the named backend without
  validating (the caller checked at its public boundary). The
  [`ScoreRule`][attnlab.rules.scores.ScoreRule] carries the scale, causality and its
  alignment, the window, the softcap, the sink logits and ALiBi's slopes: one object the
  layers hand down, and `AttentionCall` holds the arguments, so this signature is written
  once.
  `query (..., L, E)`, `key (..., S, E)`, `value (..., S, Ev)`; with `enable_gqa`, `H`
  key/value heads at dim -3 serve `Hq` query heads.
- `attention_weights(query, key, rule=ScoreRule(), *, ...)`: the weights `(..., L, S)`
  that `attend` mixes the values with, whatever the backend (computed from scratch:
  fused kernels do not return them); same keywords as `attend`.
- `attend_with_lse(backend, query, key, value, rule=ScoreRule(), **options)`: `attend`
  and each row's log-sum-exp, on `"flash"` and `"triton"` only (`"torch"` and
  `"scratch"` refuse by name; `returns_lse(backend)` says which), from which
  [`weights_from_rule`][attnlab.functional.lse_weights.weights_from_rule] recovers the
  weights in one pass over the keys.
- `check_backend_call(backend, rule=None, *, attn_mask, dropout_p)`: the `ValueError`
  of a request the backend cannot serve; `attend` calls it, modules may call it before
  their projections.
- `backend_for(softcap)`: the backend a layer that needs any mask and dropout (a ported
  or decoder layer) runs: the fastest that also serves its softcap.
- `materialize(attn_mask, device)`: PyTorch's `CausalBias` as its bool mask (other
  masks unchanged), for combining it with another mask.

Causal masking, one rule: `rule.is_causal` hides key $j$ from query $i$ when $j > i + o$,
and `rule.window=w` (which implies causal) also when $j \le i + o - w$, where the offset
$o$ places the queries among the keys' positions: $o = 0$ for `rule.align="top-left"` (the
queries are the first `L` positions, PyTorch's `is_causal`), $o = S - L$ for
`align="bottom-right"` (the queries are the last `L` positions: new tokens after a KV
cache). Modules thus pass `align="bottom-right"` after a cache and get causality in
absolute positions; both alignments agree when `L == S`. With `attn_mask` as well, the
causal or window mask and `attn_mask` are combined
([`masks.combine`][attnlab.rules.masks.combine]): a key takes part only if both allow it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType, ModuleType
from typing import Literal, NamedTuple, TypedDict, Unpack, overload

import torch
from torch import Tensor
from torch.nn.attention.bias import CausalBias

from attnlab.functional import sdpa as F
from attnlab.functional.flash import flash_attention
from attnlab.rules import masks
from attnlab.rules.scores import ScoreRule, alibi_bias, temperature_tuned

__all__ = [
    "BACKENDS",
    "BACKEND_NAMES",
    "AttentionCall",
    "AttentionFunction",
    "Backend",
    "BackendProperty",
    "CallOptions",
    "attend",
    "attend_with_lse",
    "attention_weights",
    "backend_for",
    "check_backend",
    "check_backend_call",
    "materialize",
    "returns_lse",
    "takes_mask",
]

Backend = Literal["torch", "scratch", "flash", "triton"]
"""Which scaled dot-product attention a module runs.

`"torch"` is PyTorch's fused `torch.nn.functional.scaled_dot_product_attention`;
`"scratch"` is attnlab's own
[`scaled_dot_product_attention`][attnlab.functional.sdpa.scaled_dot_product_attention];
`"flash"` is attnlab's [`flash_attention`][attnlab.functional.flash.flash_attention] (no
`attn_mask`, no dropout); `"triton"` is the same algorithm as Triton kernels,
[`triton_flash_attention`][attnlab.functional.triton_flash.triton_flash_attention] (no
`attn_mask`, no dropout; needs Triton).
"""

BACKEND_NAMES: tuple[Backend, ...] = ("torch", "scratch", "flash", "triton")


_PLAIN = ScoreRule()
"""The score rule of plain attention: default scale, every key seen, no softcap or sink logits."""


class AttentionCall(NamedTuple):
    """One call of the registry, as every entry of
    [`BACKENDS`][attnlab.functional.backends.BACKENDS] takes it: the one place where the
    registry's signature is written (`attend` and `attention_weights` take these fields
    as their arguments)."""

    query: Tensor  # (..., L, E); (..., Hq, L, E) with enable_gqa
    key: Tensor  # (..., S, E); (..., H, S, E) with enable_gqa
    value: Tensor | None  # (..., S, Ev); None: the weights, not the output
    rule: ScoreRule = _PLAIN
    attn_mask: Tensor | None = None  # bool (True = attend), float (added), or a CausalBias
    dropout_p: float = 0.0
    enable_gqa: bool = False


class CallOptions(TypedDict, total=False):
    """The keywords of [`attend`][attnlab.functional.backends.attend] and
    [`attention_weights`][attnlab.functional.backends.attention_weights] after `rule`:
    the fields of [`AttentionCall`][attnlab.functional.backends.AttentionCall] with their
    defaults there."""

    attn_mask: Tensor | None
    dropout_p: float
    enable_gqa: bool


AttentionFunction = Callable[[AttentionCall], Tensor]
"""What every entry of [`BACKENDS`][attnlab.functional.backends.BACKENDS] is: a call, run."""


def check_backend(value: object) -> Backend:
    """Return `value` if it names a backend; raise `ValueError` naming the choices.

    Examples:
        >>> check_backend("flash")
        'flash'
    """
    if not isinstance(value, str) or value not in BACKEND_NAMES:
        allowed = ", ".join(repr(c) for c in BACKEND_NAMES)
        raise ValueError(f"backend must be one of {allowed}, got {value!r}")
    if value == "triton":  # asked for by name: say now how to install Triton if it is missing
        _triton().kernels()
    return value


class BackendProperty:
    """A validated `backend` attribute: `backend = BackendProperty()` in a class body.

    Reading gives the backend's name; assigning checks it with
    [`check_backend`][attnlab.functional.backends.check_backend], at construction and whenever a
    user switches (`module.backend = "flash"`). The value is stored as `_backend`.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}"

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> BackendProperty: ...

    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> Backend: ...

    def __get__(self, obj: object, objtype: type | None = None) -> Backend | BackendProperty:
        if obj is None:
            return self
        value: Backend = obj.__dict__[self._slot]
        return value

    def __set__(self, obj: object, value: Backend) -> None:
        obj.__dict__[self._slot] = check_backend(value)


def takes_mask(backend: Backend) -> bool:
    """Whether `backend` can apply an arbitrary mask (FlashAttention, in PyTorch or Triton,
    masks only by position: `is_causal` and `window`).

    Examples:
        >>> takes_mask("torch"), takes_mask("flash"), takes_mask("triton")
        (True, False, False)
    """
    return backend not in _LSE


def returns_lse(backend: Backend) -> bool:
    """Whether `backend` returns each row's log-sum-exp
    ([`attend_with_lse`][attnlab.functional.backends.attend_with_lse]): the FlashAttention
    kernels.

    Examples:
        >>> [returns_lse(b) for b in BACKEND_NAMES]
        [False, False, True, True]
    """
    return backend in _LSE


def check_backend_call(
    backend: Backend, rule: ScoreRule | None = None, *, attn_mask: object, dropout_p: float
) -> None:
    """Raise `ValueError` if `backend` cannot serve a call with this mask, dropout, rule.

    Cheap (attribute reads only), so it runs with validation off too.
    """
    softcap = None if rule is None else rule.softcap
    if backend == "torch" and softcap is not None:
        raise ValueError(
            f"backend='torch' has no softcap (PyTorch's scaled_dot_product_attention cannot "
            f"apply tanh to the scores), but softcap={softcap}; use backend='scratch' or "
            "'flash'"
        )
    if takes_mask(backend):
        return
    if attn_mask is not None and not isinstance(attn_mask, CausalBias):
        raise ValueError(
            f"backend={backend!r} takes no attn_mask or key_padding_mask (FlashAttention "
            "masks only by position: is_causal, window); use backend='torch' or 'scratch'"
        )
    if dropout_p > 0.0:
        raise ValueError(
            f"backend={backend!r} has no dropout, but dropout_p={dropout_p} (training mode "
            "with dropout > 0); call module.eval(), set dropout=0.0, or use "
            "backend='torch' or 'scratch'"
        )


def backend_for(softcap: float | None) -> Backend:
    """The first backend, fastest first (`BACKEND_NAMES`' order), that can run every call
    a layer may get: any mask, dropout in training, and the layer's softcap.

    Examples:
        >>> backend_for(None), backend_for(50.0)
        ('torch', 'scratch')
    """
    for name in BACKEND_NAMES:
        if not takes_mask(name):  # FlashAttention takes neither a mask nor dropout
            continue
        try:
            check_backend_call(name, ScoreRule(softcap=softcap), attn_mask=None, dropout_p=0.0)
        except ValueError:  # e.g. "torch" has no softcap
            continue
        return name
    raise AssertionError(f"no backend of {BACKEND_NAMES} serves softcap={softcap}")


def materialize(attn_mask: Tensor | None, device: torch.device) -> Tensor | None:
    """`attn_mask` as a tensor: PyTorch's `CausalBias` becomes its bool mask `(L, S)`.

    For callers that combine a user's mask with another one (key padding).
    """
    if not isinstance(attn_mask, CausalBias):
        return attn_mask
    return F.causal_bias_mask(attn_mask, device)  # (L, S)


def _positional_mask(
    query: Tensor, key: Tensor, attn_mask: Tensor | None, rule: ScoreRule
) -> tuple[Tensor | None, bool]:
    """`(attn_mask, is_causal)` for an SDPA-style kernel, with causality, window and ALiBi in it.

    The fused causal flag is kept where it means the same (top-left, no window, no other
    mask, no bias); otherwise the causal or window mask is built and combined with
    `attn_mask` and ALiBi's bias `(Hq, L, S)`, measured from each query's position among
    the keys (the rule's alignment), so that a sink logit meets the same scores wherever
    the queries sit.
    """
    t_q, t_k, device = query.shape[-2], key.shape[-2], query.device
    window, align, slopes = rule.window, rule.align, rule.alibi_slopes
    causal = rule.is_causal or window is not None
    if not causal and slopes is None:
        return attn_mask, False
    plain = window is None and attn_mask is None and slopes is None  # causal only
    if plain and (align == "top-left" or t_q == t_k):
        return None, True  # PyTorch's own top-left is_causal: the fused path
    attn_mask = materialize(attn_mask, device)  # combined with another rule
    band, bias = None, None  # no causal rule, no ALiBi
    if causal and align == "bottom-right":
        band = masks.decode_mask(t_q, t_k, window=window, device=device)  # None: all seen
    elif causal:
        band = masks.band(t_q, t_k, "top-left", window, device)  # (L, S)
    if slopes is not None:  # a float mask: PyTorch's causal flag cannot carry a bias
        o = masks.alignment_offset(t_q, t_k, align)
        bias = alibi_bias(slopes.to(query.dtype), range(o, o + t_q), range(t_k))  # (Hq, L, S)
    if band is None and bias is None:  # a decode step that sees every key: nothing to add
        return attn_mask, False
    return masks.combine(bias, band, attn_mask), False


def _with_positional_mask(kernel: Callable[..., Tensor]) -> AttentionFunction:
    """The registry's entry for an SDPA-style kernel, `(query, key, [value,] attn_mask,
    dropout_p, is_causal, scale, enable_gqa, *, softcap, sink_logits)` with PyTorch's top-left
    `is_causal`: causality and window become its mask (no `value`: the weights' kernel)."""

    def run(call: AttentionCall) -> Tensor:
        query, key, value, rule, attn_mask, dropout_p, enable_gqa = call
        mask, causal = _positional_mask(query, key, attn_mask, rule)
        tensors = (query, key) if value is None else (query, key, value)
        opts = (dropout_p, causal, rule.scale, enable_gqa)
        return kernel(*tensors, mask, *opts, softcap=rule.softcap, sink_logits=rule.sink_logits)

    return run


def _sink_as_key(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    sink_logits: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Learned sink logits for a kernel without them: one more key and value of zeros per row.

    The extra key's score is 0 whatever the query, so a float-mask column holding the
    sink logit makes it exactly that logit; its value of zeros adds nothing to the
    output. Returns `(key, value, attn_mask)` with `S + 1` keys and a float mask
    `(..., Hq, L, S + 1)`; `is_causal` (top-left) is folded into the mask.
    """
    t_q, t_k = query.shape[-2], key.shape[-2]
    if is_causal:
        attn_mask = masks.band(t_q, t_k, "top-left", None, query.device)  # (L, S)
    attn_mask = materialize(attn_mask, query.device)  # a CausalBias as its bool mask
    bias = torch.zeros((t_q, t_k), dtype=query.dtype, device=query.device)  # (L, S)
    bias = F.with_mask(bias, attn_mask)  # (..., L, S): the mask as a float bias
    zeros = key.new_zeros(*key.shape[:-2], 1, key.shape[-1])  # (..., H, 1, E)
    nothing = value.new_zeros(*value.shape[:-2], 1, value.shape[-1])  # (..., H, 1, Ev)
    key, value = torch.cat([key, zeros], dim=-2), torch.cat([value, nothing], dim=-2)
    return key, value, F.with_sinks(bias, sink_logits)  # (..., Hq, L, S + 1)


def _torch(call: AttentionCall) -> Tensor:
    """PyTorch's fused SDPA: causality and window as its mask, sink logits as one more key."""
    query, key, value, rule, attn_mask, dropout_p, enable_gqa = call
    assert value is not None  # attend's calls have values
    if rule.softcap is not None:  # PyTorch's kernel cannot apply tanh to the scores
        check_backend_call("torch", rule, attn_mask=None, dropout_p=0.0)
    mask, is_causal = _positional_mask(query, key, attn_mask, rule)
    if rule.sink_logits is not None:
        key, value, mask = _sink_as_key(query, key, value, mask, is_causal, rule.sink_logits)
        is_causal = False
    return torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=None if rule.scale is None else float(rule.scale),
        enable_gqa=enable_gqa,
    )


def _flash_rule(backend: Backend, rule: ScoreRule, attn_mask: object) -> ScoreRule:
    """The rule flash runs: a `CausalBias` `attn_mask` becomes its causality and alignment."""
    if not isinstance(attn_mask, CausalBias):
        return rule
    if rule.is_causal or rule.window is not None:
        raise ValueError(
            f"backend={backend!r} cannot combine a CausalBias attn_mask with is_causal or a "
            "window; pass one of them"
        )
    return replace(rule, is_causal=True, align=F.causal_bias_alignment(attn_mask))


def _flash_lse(call: AttentionCall) -> tuple[Tensor, Tensor]:
    """`flash_attention` of the call: its output and log-sum-exp (which it computes anyway)."""
    query, key, value, rule, attn_mask, dropout_p, enable_gqa = call
    assert value is not None  # attend's calls have values
    check_backend_call("flash", attn_mask=attn_mask, dropout_p=dropout_p)
    rule = _flash_rule("flash", rule, attn_mask)
    if enable_gqa:  # FlashAttention here needs one key/value head per query head
        key = F.repeat_heads(key, query.size(-3))  # (..., Hq, S, E)
        value = F.repeat_heads(value, query.size(-3))  # (..., Hq, S, Ev)
    query, key, value = _broadcast(query, key, value, keep=2)  # flash does not broadcast
    # sink logits and slopes are one per query head: after repeat_heads as before
    return flash_attention(query, key, value, return_lse=True, **rule.keywords())


def _broadcast(query: Tensor, key: Tensor, value: Tensor, keep: int) -> tuple[Tensor, ...]:
    """The three expanded to one batch shape, each keeping its last `keep` dimensions
    (`(L, E)`, or `(H, L, E)` where key/value heads stay fewer than the query's)."""
    batch = torch.broadcast_shapes(  # type: ignore[no-untyped-call]
        query.shape[:-keep], key.shape[:-keep], value.shape[:-keep]
    )
    return tuple(t.expand(*batch, *t.shape[-keep:]) for t in (query, key, value))


def _triton() -> ModuleType:
    """The Triton backend's module, loaded when the backend is first named (it imports
    Triton itself only then too)."""
    from attnlab.functional import triton_flash

    return triton_flash


def _triton_lse(call: AttentionCall) -> tuple[Tensor, Tensor]:
    """`triton_flash_attention` of the call: its output and log-sum-exp; GQA without copies."""
    query, key, value, rule, attn_mask, dropout_p, enable_gqa = call
    assert value is not None  # attend's calls have values
    check_backend_call("triton", attn_mask=attn_mask, dropout_p=dropout_p)
    rule = _flash_rule("triton", rule, attn_mask)
    query, key, value = _broadcast(query, key, value, keep=3 if enable_gqa else 2)
    kernel = _triton().triton_flash_attention
    lse: tuple[Tensor, Tensor] = kernel(
        query, key, value, enable_gqa=enable_gqa, return_lse=True, **rule.keywords()
    )
    return lse


_LSE: Mapping[Backend, Callable[[AttentionCall], tuple[Tensor, Tensor]]] = MappingProxyType(
    {"flash": _flash_lse, "triton": _triton_lse}
)
"""The backends that return a log-sum-exp, and their calls that return it."""

BACKENDS: Mapping[Backend, AttentionFunction] = MappingProxyType(
    {
        "torch": _torch,
        "scratch": _with_positional_mask(F.scaled_dot_product_attention),
        "flash": lambda call: _flash_lse(call)[0],
        "triton": lambda call: _triton_lse(call)[0],
    }
)
"""Backend name -> attention function (unvalidated) of one `AttentionCall`."""


def attend(
    backend: Backend,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    rule: ScoreRule = _PLAIN,
    **options: Unpack[CallOptions],
) -> Tensor:
    """Scaled dot-product attention on `backend`, after the caller's checks.

    See the module docstring for the arguments and the causal rule; `rule` holds the
    scale, causality, window, softcap, sink logits and ALiBi slopes (each `(Hq,)`, one per
    query head), and the keywords `attn_mask=None`, `dropout_p=0.0` and `enable_gqa=False`
    are those of [`AttentionCall`][attnlab.functional.backends.AttentionCall]. Raises
    `ValueError` only for a request the backend cannot serve (`"flash"` with a mask or
    dropout, `"torch"` with a softcap).

    Examples:
        >>> q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 5)
        >>> rule = ScoreRule(window=2, align="bottom-right")
        >>> outs = [attend(b, q, k, v, rule) for b in BACKEND_NAMES]
        >>> all(torch.allclose(o, outs[0], atol=1e-6) for o in outs)
        True
    """
    query, rule = temperature_tuned(query, key, rule)
    return BACKENDS[backend](AttentionCall(query, key, value, rule, **options))


def attend_with_lse(
    backend: Backend,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    rule: ScoreRule = _PLAIN,
    **options: Unpack[CallOptions],
) -> tuple[Tensor, Tensor]:
    """[`attend`][attnlab.functional.backends.attend], and each row's log-sum-exp `(..., L)`.

    Only `"flash"` and `"triton"` return one (natural log, the sinks in it, float32 or
    float64); give
    it with the same `query`, `key`, `rule` and `enable_gqa` to
    [`weights_from_rule`][attnlab.functional.lse_weights.weights_from_rule] for the
    weights (without a `CausalBias` `attn_mask`, which that does not read).

    Raises:
        ValueError: For `"torch"` and `"scratch"`, named: they return no log-sum-exp
            (PyTorch's fused kernel keeps it internal); and as `attend` does.

    Examples:
        >>> q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 3)
        >>> rule = ScoreRule(is_causal=True)
        >>> from attnlab.functional.lse_weights import weights_from_rule
        >>> out, lse = attend_with_lse("flash", q, k, v, rule, enable_gqa=True)
        >>> p = weights_from_rule(q, k, lse, rule, enable_gqa=True)
        >>> w = attention_weights(q, k, rule, enable_gqa=True)
        >>> torch.allclose(p, w, atol=1e-6), lse.shape
        (True, torch.Size([1, 4, 5]))
    """
    if not returns_lse(backend):
        raise ValueError(
            f"backend={backend!r} returns no log-sum-exp (PyTorch's fused kernel keeps it "
            "internal); use backend='flash' or 'triton', or FlexAttention's "
            "attnlab.functional.flex.attention(..., return_lse=True)"
        )
    query, rule = temperature_tuned(query, key, rule)
    return _LSE[backend](AttentionCall(query, key, value, rule, **options))


_WEIGHTS = _with_positional_mask(F.attention_weights)


def attention_weights(
    query: Tensor, key: Tensor, rule: ScoreRule = _PLAIN, **options: Unpack[CallOptions]
) -> Tensor:
    """The weights `(..., L, S)` that [`attend`][attnlab.functional.backends.attend] mixes values
    with; the same keywords.

    Every backend computes the same weights; fused kernels do not return them, so they
    come from attnlab's from-scratch
    [`attention_weights`][attnlab.functional.sdpa.attention_weights].
    """
    query, rule = temperature_tuned(query, key, rule)
    return _WEIGHTS(AttentionCall(query, key, None, rule, **options))
