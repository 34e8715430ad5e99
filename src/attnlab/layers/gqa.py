r"""Grouped-query attention with RoPE, a sliding window and a KV cache: a modern LLM's layer.

Grouped-query attention (GQA; Ainslie et al., 2023, https://arxiv.org/abs/2305.13245)
keeps `num_heads` query heads but only `num_kv_heads` key/value heads; each key/value head
serves a group of `num_heads / num_kv_heads` consecutive query heads. Multi-head attention
is the case `num_kv_heads = num_heads`, multi-query attention (MQA; Shazeer, 2019,
https://arxiv.org/abs/1911.02150) the case `num_kv_heads = 1`. Query head $h$ reads
key/value head $g(h) = \lfloor h / (\text{num\_heads} / \text{num\_kv\_heads}) \rfloor$:

$$
O_h = \operatorname{softmax}\left(\frac{Q_h K_{g(h)}^\top}{\sqrt{d_h}} + M\right)
V_{g(h)},
\qquad \operatorname{GQA}(X) = \operatorname{concat}_h(O_h)\, W_o
$$

with rotary position embeddings applied to $Q$ and $K$ ([`attnlab.rules.rope`][attnlab.rules.rope])
and $M$ a causal or sliding-window mask. The layer is the attention of Llama, Mistral and
Qwen2. The options of the models of 2024-2025 ride along: QK-norm (an
[`RMSNorm`][attnlab.layers.norms.RMSNorm] of queries and keys before RoPE, per head as in Qwen3
and Gemma 3 or over the whole projection as in OLMo 2; Dehghani et al., 2023,
https://arxiv.org/abs/2302.05442), a custom score scale (Gemma's `query_pre_attn_scalar`),
logit softcapping (Gemma 2), and two ways for a head to write nothing
([`HeadGates`][attnlab.layers.gqa.HeadGates]): learned attention sinks (gpt-oss) and an output
gate (Qwen3-Next; Qiu et al., "Gated Attention for Large Language Models", 2025,
https://arxiv.org/abs/2505.06708). Gemma 4's layers take their keys and values in two
more ways (`kv`): values that are the keys' projection, and keys and values read from an
earlier layer's cache.
[`GroupedQueryAttention.from_hf`][attnlab.layers.gqa.GroupedQueryAttention.from_hf] copies the
weights of their Hugging Face implementations, and the tests check that the outputs,
gradients and cached decoding agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict, TypeVar, Unpack, cast, overload

import torch
from torch import Tensor, nn

from attnlab.caches.base import LayerCache
from attnlab.caches.kv import AttentionCache
from attnlab.caches.shared import KV_SOURCES, KVSource, SharedKVReader
from attnlab.functional.backends import (
    Backend,
    BackendProperty,
    CallOptions,
    attend,
    attend_with_lse,
    attention_weights,
    check_backend_call,
    returns_lse,
)
from attnlab.functional.lse_weights import weights_from_rule
from attnlab.layers.heads import merge_heads, split_heads
from attnlab.layers.norms import QKNorm, QKNormSpec, RMSNorm, rms_normalize
from attnlab.rules._validation import (
    check_attn_mask,
    check_bool,
    check_choice,
    check_multiple,
    check_positive_int,
    check_probability,
    check_scale,
    check_softcap,
    check_tokens,
    checking,
    entry,
)
from attnlab.rules.masks import check_causal_window, check_window
from attnlab.rules.rope import (
    Rope,
    check_rope,
    check_rope_inputs,
    default_positions,
    rope_cos_sin,
    rotate,
)
from attnlab.rules.scores import ScoreRule, check_alibi_slopes, check_temperature

__all__ = ["GroupedQueryAttention", "HeadGates", "check_attention_inputs"]

_Spec = TypeVar("_Spec")


@dataclass(frozen=True)
class HeadGates:
    r"""How a layer's heads may scale their outputs down, to write nothing for a token.

    Attributes:
        learned_sinks: Learned attention sinks (gpt-oss): a parameter `sink_logits`, one
            logit $s_h$ per query head (zeros at first), that joins every row's softmax
            with no value, on every backend. Head $h$'s output is then scaled by
            $\sigma(\operatorname{logsumexp}_j \omega_{hj} - s_h)$: a gate read from its
            scores $\omega$.
        output_gate: An output gate (Qwen3-Next; Qiu et al., 2025): a projection
            `gate_proj` from `d_model` to `num_heads * head_dim` (with a bias when
            `q_proj` has one) whose sigmoid multiplies each feature of each head's output
            before `out_proj`: a gate read from the token.

    Examples:
        >>> HeadGates(output_gate=True).learned_sinks
        False
    """

    learned_sinks: bool = False
    output_gate: bool = False

    def check(self, name: str = "gates") -> HeadGates:
        """Return these gates if their fields are valid; raise naming `name.field` otherwise."""
        check_bool(f"{name}.learned_sinks", self.learned_sinks)
        check_bool(f"{name}.output_gate", self.output_gate)
        return self


class _ForwardOptions(TypedDict, total=False):
    """The keywords of `GroupedQueryAttention.forward` that leave its return type alone."""

    positions: Tensor | None
    position_embeddings: tuple[Tensor, Tensor] | None
    cache: AttentionCache | None
    attn_mask: Tensor | None
    is_causal: bool


def check_attention_inputs(
    x: object,
    *,
    d_model: int,
    owner: str,
    like: Tensor,
    rope_dims: int,
    positions: object = None,
    position_embeddings: object = None,
    cache: LayerCache | None = None,
    attn_mask: object = None,
    num_heads: int = 1,
    is_causal: object = True,
    window: int | None = None,
) -> Tensor:
    """Check the arguments that every attention layer of a decoder takes; return `x`.

    The one sequence of checks of
    [`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention],
    [`MultiHeadLatentAttention`][attnlab.layers.mla.MultiHeadLatentAttention] and
    [`DeepSeekSparseAttention`][attnlab.layers.sparse.DeepSeekSparseAttention]: the tokens `x`
    (`(b, t, d_model)` or `(t, d_model)`, on the dtype and device of `like`), RoPE's
    positions or tables (`rope`'s rules, `rope_dims` rotated features), `attn_mask`
    against `(b, num_heads, t, cache.seen + t)` and `is_causal` against `window`. The
    layer checks that `cache` is its kind first (its append is the cache's own check).

    Raises:
        TypeError: As the checks named above.
        ValueError: As the checks named above.
    """
    x = check_tokens("x", x, features=d_model, param="d_model", owner=owner, like=like)
    b, t = (x.shape[0] if x.ndim == 3 else 1), x.shape[-2]
    past = 0 if cache is None else cache.seen
    check_rope_inputs(positions, position_embeddings, x, rope_dims)
    target = (b, num_heads, t, past + t)  # (b, h, t_q, t_k)
    check_attn_mask("attn_mask", attn_mask, target, x, query_name="x")
    check_causal_window(is_causal, window)
    return x


def _check_scores(
    scores: object, num_heads: int
) -> tuple[int | None, float | None, float | None, Tensor | None, tuple[float, float] | None]:
    """A layer's `scores` rule as its `(window, scale, softcap, alibi_slopes, temperature)`;
    raise naming `scores`.

    Causality and learned sinks are the layer's per call and its own parameter, so a
    rule that sets them is refused rather than silently overridden.
    """
    if not isinstance(scores, ScoreRule):
        raise TypeError(f"scores must be a ScoreRule, got {type(scores).__name__}")
    if scores.is_causal or scores.align != "top-left" or scores.sink_logits is not None:
        raise ValueError(
            "scores sets is_causal, align or sink_logits, which a layer decides itself: "
            "pass forward(..., is_causal=...) and gates=HeadGates(learned_sinks=True) instead"
        )
    window = check_window(scores.window, None)
    scale = check_scale("scores.scale", scores.scale)
    softcap = check_softcap("scores.softcap", scores.softcap)
    slopes = check_alibi_slopes("scores.alibi_slopes", scores.alibi_slopes, num_heads)
    temperature = check_temperature("scores.temperature", scores.temperature)
    if temperature is not None and window is not None:  # a window drops the first keys
        raise ValueError("scores.temperature needs a layer without a window")
    return window, scale, softcap, slopes, temperature


def _check_spec(name: str, spec: object, cls: type[_Spec]) -> _Spec | None:
    """`spec` if it is None or a `cls`; raise TypeError naming `name` otherwise."""
    if spec is None or isinstance(spec, cls):
        return spec
    raise TypeError(f"{name} must be a {cls.__name__} or None, got {type(spec).__name__}")


def _qk_norms(
    spec: QKNormSpec | None, head_dim: int, q_features: int, kv_features: int
) -> tuple[RMSNorm | None, RMSNorm | None]:
    """The `q_norm` and `k_norm` of `spec`: over `head_dim` features, or over the projections."""
    if spec is None or spec.over == "rotated":  # Llama 4's: no weight to learn
        return None, None
    q_dim, k_dim = (head_dim, head_dim) if spec.over == "head" else (q_features, kv_features)
    return (
        RMSNorm(q_dim, spec.eps, unit_offset=spec.unit_offset),
        RMSNorm(k_dim, spec.eps, unit_offset=spec.unit_offset),
    )


def _rope_tables(
    rope: Rope, dims: int, positions: Tensor | None, past: int, x: Tensor
) -> tuple[Tensor, Tensor]:
    """RoPE's `(cos, sin)` for the tokens of `x` (`(b, t, d_model)`): at `positions`, by
    default the `t` positions after `past` cached tokens."""
    if positions is None:
        positions = default_positions(past, x.shape[1], x.device)  # (t,)
    return rope_cos_sin(positions, dims, base=rope.base, scaling=rope.scaling)


def _rotate(x: Tensor, cos_sin: tuple[Tensor, Tensor], rope: Rope, dims: int) -> Tensor:
    """RoPE on the first `dims` features of each head; the rest pass (partial RoPE)."""
    cos, sin = cos_sin
    if dims == x.shape[-1]:
        return rotate(x, cos, sin, layout=rope.layout)
    turned, kept = x[..., :dims], x[..., dims:]  # (..., t, dims), (..., t, head_dim - dims)
    return torch.cat((rotate(turned, cos, sin, layout=rope.layout), kept), dim=-1)


class GroupedQueryAttention(nn.Module):
    r"""Causal grouped-query self-attention with optional RoPE, sliding window and KV cache.

    The projections `q_proj`, `k_proj`, `v_proj` and `out_proj` are named and shaped as in
    Hugging Face's Llama (the API page's table). Each query sees itself and the tokens
    before it in absolute positions: with a [`KVCache`][attnlab.caches.kv.KVCache], `forward`
    appends the new keys and values and attends from the new queries to the cached tokens
    (the causal mask bottom-right), so cached decoding equals one pass over the sequence.

    Args:
        d_model: Features per token, in and out.
        num_heads: Query heads.
        num_kv_heads: Key/value heads; a divisor of `num_heads`. Default `num_heads`
            (multi-head attention); 1 is multi-query attention.
        head_dim: Features per head; default `d_model // num_heads` (then `d_model` must
            be a multiple of `num_heads`). Even with a `rope` that rotates all of it.
        bias: Which projections have a bias: True, all (Llama's `attention_bias`,
            gpt-oss); `"qkv"`, those of the queries, keys and values (and `gate_proj`) but
            not `out_proj` (Qwen2); False, none.
        rope: RoPE's rule, a [`Rope`][attnlab.rules.rope.Rope]; None for a NoPE layer.
        scores: A [`ScoreRule`][attnlab.rules.scores.ScoreRule]: `window` (keys per query,
            itself included), `scale`, `softcap` (not on `backend="torch"`), `alibi_slopes`
            (one per query head, kept as a buffer); not causality or sinks, the layer's own.
        qk_norm: Learned RMSNorms `q_norm`, `k_norm` of the queries and keys before RoPE
            ([`QKNormSpec`][attnlab.layers.norms.QKNormSpec]); None for none.
        gates: Learned sinks (`sink_logits`) and an output gate (`gate_proj`) as a
            [`HeadGates`][attnlab.layers.gqa.HeadGates]; None for neither.
        dropout: Probability of dropping an attention weight, in training mode only.
        backend: `"torch"`, `"scratch"`, `"flash"` or `"triton"`: which attention
            `forward` runs.
        kv: Where the keys and values come from ([`KVSource`][attnlab.caches.shared.KVSource]):
            `"projected"`, from `k_proj` and `v_proj`; `"keys"`, the values are the
            keys' projection (before QK-norm and RoPE, normalised only by a value norm),
            and there is no `v_proj` (Gemma 4's global layers, `attention_k_eq_v`);
            `"shared"`, no `k_proj` or `v_proj`: the layer reads the keys and values of an
            earlier layer through a [`SharedKVReader`][attnlab.caches.shared.SharedKVReader]
            cache (Gemma 4's `num_kv_shared_layers`).

    Shapes:
        x: `(b, t, d_model)` or unbatched `(t, d_model)`. Output: the same shape.

    Raises:
        TypeError: If a size is not an int, a flag not a bool, a number not a number, or
            `rope`, `scores`, `qk_norm` or `gates` not of its class.
        ValueError: If a size is not positive or does not divide as above, the features
            `rope` rotates are odd or above `head_dim`, a field of `rope`, `scores` or
            `qk_norm`, `dropout` or `backend` is out of range, `scores` sets `is_causal`,
            `align` or `sink_logits`, or `backend="torch"` comes with a softcap.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> gqa = GroupedQueryAttention(d_model=48, num_heads=6, num_kv_heads=2).eval()
        >>> x = torch.randn(3, 10, 48)
        >>> full = gqa(x)
        >>> from attnlab.caches.kv import StaticKVCache
        >>> cache = StaticKVCache(3, max_length=16, num_kv_heads=2, head_dim=8)
        >>> prefill = gqa(x[:, :7], cache=cache)  # the prompt
        >>> steps = [gqa(x[:, i : i + 1], cache=cache) for i in range(7, 10)]  # decode
        >>> torch.allclose(torch.cat([prefill, *steps], dim=1), full, atol=1e-6)
        True
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        *,
        head_dim: int | None = None,
        bias: bool | Literal["qkv"] = False,
        rope: Rope | None = Rope(),
        scores: ScoreRule = ScoreRule(),
        qk_norm: QKNormSpec | None = None,
        gates: HeadGates | None = None,
        dropout: float = 0.0,
        backend: Backend = "torch",
        kv: KVSource = "projected",
    ) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.num_kv_heads = (
            num_heads if num_kv_heads is None else check_positive_int("num_kv_heads", num_kv_heads)
        )
        why = " (each key/value head serves a group of query heads)"
        check_multiple("num_heads", num_heads, "num_kv_heads", self.num_kv_heads, why=why)
        if head_dim is None:
            why, hint = " when head_dim is not given", "; or pass head_dim"
            head_dim = check_multiple(
                "d_model", d_model, "num_heads", num_heads, why=why, hint=hint
            )
        self.head_dim = check_positive_int("head_dim", head_dim)
        if bias != "qkv" and not isinstance(bias, bool):
            raise TypeError(f"bias must be True, False or 'qkv', got {bias!r}")
        self.bias, self.out_bias = bool(bias), bias is True  # (q, k, v), out_proj
        self.kv = cast(KVSource, check_choice("kv", kv, KV_SOURCES))
        self.rope_dims = check_rope(rope, self.head_dim) or self.head_dim
        self.rope = rope
        checked = _check_scores(scores, self.num_heads)
        self.window, self.scale, self.softcap, slopes, self.temperature = checked
        self.register_buffer("alibi_slopes", slopes, persistent=False)  # moves with .to()
        self.alibi_slopes: Tensor | None
        qk_norm = _check_spec("qk_norm", qk_norm, QKNormSpec)
        self.qk_norm = None if qk_norm is None else qk_norm.check()
        gates = _check_spec("gates", gates, HeadGates)
        self.gates = HeadGates() if gates is None else gates.check()
        self.dropout = check_probability("dropout", dropout)
        self.backend = backend
        check_backend_call(backend, ScoreRule(softcap=self.softcap), attn_mask=None, dropout_p=0.0)
        self.sink_logits: nn.Parameter | None = None
        if self.gates.learned_sinks:
            self.sink_logits = nn.Parameter(torch.zeros(self.num_heads))
        q_features = self.num_heads * self.head_dim
        kv_features = self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, q_features, bias=self.bias)
        own_keys, own_values = self.kv != "shared", self.kv == "projected"
        self.k_proj = nn.Linear(d_model, kv_features, bias=self.bias) if own_keys else None
        self.v_proj = nn.Linear(d_model, kv_features, bias=self.bias) if own_values else None
        self.out_proj = nn.Linear(q_features, d_model, bias=self.out_bias)
        self.gate_proj: nn.Linear | None = None
        if self.gates.output_gate:
            self.gate_proj = nn.Linear(d_model, q_features, bias=self.bias)
        self.q_norm, self.k_norm = _qk_norms(self.qk_norm, self.head_dim, q_features, kv_features)
        if not own_keys:
            self.k_norm = None  # the keys are normalised where they are computed

    backend = BackendProperty()
    """Which kernel `forward` runs: a name of the registry's `BACKEND_NAMES` (checked)."""

    @property
    def group_size(self) -> int:
        """Query heads per key/value head, `num_heads // num_kv_heads`."""
        return self.num_heads // self.num_kv_heads

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, rope={self.rope}, "
            f"window={self.window}, bias={self.bias}, out_bias={self.out_bias}, "
            + ("" if self.scale is None else f"scale={self.scale}, ")
            + ("" if self.qk_norm is None else f"qk_norm={self.qk_norm}, ")
            + ("" if self.softcap is None else f"softcap={self.softcap}, ")
            + ("" if self.gates == HeadGates() else f"gates={self.gates}, ")
            + ("" if self.alibi_slopes is None else "alibi=True, ")
            + ("" if self.kv == "projected" else f"kv={self.kv!r}, ")
            + f"dropout={self.dropout}, backend={self.backend!r}"
        )

    def check_cache(
        self, cache: object, *, name: str = "cache", owner: str = "", optional: bool = True
    ) -> AttentionCache | None:
        """Return `cache` (or None, when `optional`) if this layer can attend with it: an
        [`AttentionCache`][attnlab.caches.kv.AttentionCache] that keeps every key the
        window sees; raise TypeError (ValueError for a rolling cache narrower than the
        window) naming the `owner` and the cache's `name` otherwise."""
        if self.kv == "shared":  # keys and values lent by an earlier layer, never none
            needs = "a SharedKVReader (SharedKVCache.reader()) of the layer it reads keys from"
            reader = SharedKVReader.check(cache, needs=needs, name=name, optional=False)
            assert reader is not None
            reader.check_window(self.window, name=name, owner=owner or type(self).__name__)
            return reader
        checked = AttentionCache.check(
            cache,
            needs="an attnlab KVCache for GroupedQueryAttention's keys and values "
            "(DynamicKVCache, StaticKVCache or RollingKVCache)",
            name=name,
            fits=lambda c: not isinstance(c, SharedKVReader),  # for a layer without keys
            optional=optional,
        )
        if checked is not None:
            checked.check_window(self.window, name=name, owner=owner or type(self).__name__)
        return checked

    @overload
    def forward(
        self, x: Tensor, *, need_weights: Literal[False] = False, **options: Unpack[_ForwardOptions]
    ) -> Tensor: ...

    @overload
    def forward(
        self, x: Tensor, *, need_weights: Literal[True], **options: Unpack[_ForwardOptions]
    ) -> tuple[Tensor, Tensor]: ...

    @entry
    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        position_embeddings: tuple[Tensor, Tensor] | None = None,
        cache: AttentionCache | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = True,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from each token of `x` to itself and the tokens before it (and the cache's).

        Checks run once, here, before any work; the cache checks its own append.

        Args:
            x: Tokens, `(b, t, d_model)` or `(t, d_model)`.
            positions: Integer position of each token for RoPE, `(t,)`, `(1, t)` or
                `(b, t)`, any non-negative (a host sync, skipped while compiling); default
                `cache.seen + arange(t)`.
            position_embeddings: RoPE's `(cos, sin)` computed once for all layers, instead
                of `positions`: [`rope_cos_sin`][attnlab.rules.rope.rope_cos_sin]'s
                `(..., t, head_dim // 2)` or Hugging Face's `(b, t, head_dim)`.
            cache: A [`KVCache`][attnlab.caches.kv.KVCache] to append the new keys and
                values to, or another [`AttentionCache`][attnlab.caches.kv.AttentionCache]
                that attends itself (`ragged`: then with no `attn_mask`, window, dropout,
                scale, softcap, sinks, ALiBi or weights).
            attn_mask: An extra mask, combined with the causal one: bool (True = attend)
                or float (added), broadcastable to `(b, num_heads, t, cache.seen + t)`.
            is_causal: Hide from each query the keys after it in absolute positions;
                False attends to every key (an encoder), which a window refuses.
            need_weights: Also return the attention weights `(b, num_heads, t, t_k)`
                (without dropout) over the `t_k` keys attended to, whatever the backend.
                On `"flash"` they are recovered from the kernel's log-sum-exp, one pass
                over the keys without `(t, t_k)` scores (transformers issue 33996; see
                [`weights_from_lse`][attnlab.functional.lse_weights.weights_from_lse]);
                the other backends compute them from scratch.

        Returns:
            Like `x`; with `need_weights`, the pair `(out, weights)`.

        Raises:
            TypeError: If an argument or `attn_mask`'s dtype is not of its type.
            ValueError: If `x`, `positions`, `position_embeddings`, the mask or the cache
                (room, batch, heads, dtype, device, a rolling cache narrower than the
                window) does not fit; `is_causal=False` with a window; `sink_logits` was
                replaced by one of another shape; or the backend cannot run the call.
        """
        if checking():
            _check_call(self, x, positions, position_embeddings, cache, attn_mask, is_causal)
            check_bool("need_weights", need_weights)
        # Before the projections and the cache's append: a call flash cannot serve leaves
        # the cache as it was.
        dropout_p = self.dropout if self.training else 0.0
        window = self.window if is_causal else None
        # The new queries are the last t of the t_k keys: the causal mask is bottom-right.
        rule = ScoreRule(
            scale=self.scale,
            is_causal=is_causal,
            align="bottom-right",
            window=window,
            softcap=self.softcap,
            sink_logits=self.sink_logits,
            alibi_slopes=self.alibi_slopes,
            temperature=self.temperature,
        )
        check_backend_call(self.backend, rule, attn_mask=attn_mask, dropout_p=dropout_p)
        unbatched = x.ndim == 2
        x = x.unsqueeze(0) if unbatched else x  # (b, t, d_model)
        q, k, v = _project(self, x)  # (b, h, t, head_dim); keys, values (b, h_kv, t, ·) or None
        if self.rope is not None:
            if position_embeddings is None:  # one table for queries and keys
                past = 0 if cache is None else cache.seen
                position_embeddings = _rope_tables(self.rope, self.rope_dims, positions, past, x)
            q = _rotate(q, position_embeddings, self.rope, self.rope_dims)  # (b, h, t, head_dim)
            k = None if k is None else _rotate(k, position_embeddings, self.rope, self.rope_dims)
            q, k = _qk_normed(self, q, k, "rotated")  # Llama 4: after RoPE, no weight
        scores = (self.window, self.scale, self.softcap, self.sink_logits, self.alibi_slopes,
                  self.temperature)  # fmt: skip
        unserved = dropout_p or need_weights or any(r is not None for r in (attn_mask, *scores))
        if cache is not None and cache.ragged and unserved:
            raise ValueError(
                f"{type(cache).__name__} attends by its own rule: it takes no attn_mask, "
                "window, dropout, need_weights, scale, softcap, sink_logits, alibi_slopes or "
                "temperature"
            )
        attended: list[tuple[Tensor, Tensor | None, Tensor | None]] = []  # for need_weights
        # FlashAttention's weights come from its log-sum-exp (not with a CausalBias attn_mask).
        with_lse = need_weights and returns_lse(self.backend) and attn_mask is None

        def kernel(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            mask = attn_mask
            if mask is not None and mask.shape[-1] > k.shape[2]:
                # The mask spans every token seen (as checked); the keys are the last of
                # them: the window dropped the oldest, or a RollingKVCache forgot them.
                mask = mask[..., -k.shape[2] :]
            options: CallOptions = {"attn_mask": mask, "dropout_p": dropout_p, "enable_gqa": True}
            if not with_lse:
                attended.append((k, mask, None))  # keys, mask and the kernel's lse
                return attend(self.backend, q, k, v, rule, **options)  # (b, h, t, head_dim)
            heads, lse = attend_with_lse(self.backend, q, k, v, rule, **options)
            attended.append((k, mask, lse))
            return heads

        # The cache stores the new keys and values and runs the kernel over the ones the
        # queries see (a paged view reads its blocks instead; a reader, another layer's).
        if k is None or v is None:  # kv="shared": the checks made sure of the reader
            heads = cast(SharedKVReader, cache).attend(q, None, None, kernel, window=window)
        elif cache is None:
            heads = kernel(q, k, v)
        else:
            heads = cache.attend(q, k, v, kernel, window=window)
        concat = merge_heads(heads)  # (b, t, num_heads * head_dim)
        if self.gate_proj is not None:  # each feature of each head scaled by its own token
            concat = concat * torch.sigmoid(self.gate_proj(x))
        out: Tensor = self.out_proj(concat)  # (b, t, d_model)
        out = out[0] if unbatched else out
        if not need_weights:
            return out
        k, mask, lse = attended[0]
        if lse is None:  # (b, h, t, t_k)
            weights = attention_weights(q, k, rule, attn_mask=mask, enable_gqa=True)
        else:  # the same queries, keys and rule as the kernel's
            weights = weights_from_rule(q, k, lse, rule, enable_gqa=True)
        return out, weights[0] if unbatched else weights

    # -- interoperability with Hugging Face transformers ---------------------------------

    @classmethod
    def from_hf(cls, module: nn.Module, *, backend: Backend | None = None) -> GroupedQueryAttention:
        """A `GroupedQueryAttention` with the weights and settings of a Hugging Face layer.

        Accepts the attention layers of `transformers`' Llama, Mistral, Qwen2, StableLM
        (partial RoPE), SmolLM3 (NoPE layers), Qwen3, Gemma 3 and OLMo 2 (QK-norm), Gemma 2
        (softcapping), gpt-oss (learned sinks) and their subclasses; the API page lists the
        weights it maps one to one and the settings it reads from the config and the layer.

        Args:
            module: The Hugging Face attention layer.
            backend: Backend of the new module (its `backend` says which). None picks the
                fastest that runs every call the layer may get: `"torch"`, or `"scratch"`
                for a softcapped layer (Gemma 2). Given, one that cannot run it is refused.

        Returns:
            A new module on the same device and dtype, in the same training mode.

        Raises:
            TypeError: If `module` is not one of the supported classes.
            ValueError: If it uses a RoPE type `RopeScaling` does not implement (e.g.
                `"longrope"`) or its scaling misses a key, normalises its queries and keys
                by LayerNorm (StableLM), attends both ways (`use_bidirectional_attention`),
                or `backend="torch"` is asked for a softcapped layer.

        Examples:
            >>> from transformers import Gemma2Config
            >>> from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention
            >>> config = Gemma2Config(hidden_size=32, num_attention_heads=4, head_dim=8,
            ...     num_key_value_heads=2, attn_logit_softcapping=50.0)
            >>> GroupedQueryAttention.from_hf(Gemma2Attention(config, layer_idx=0)).backend
            'scratch'
        """
        from attnlab.models import interop  # a folder above this one: imported when called

        return interop.gqa_from_hf(cls, module, backend=backend)


def _check_call(
    gqa: GroupedQueryAttention,
    x: object,
    positions: object,
    position_embeddings: object,
    cache: object,
    attn_mask: object,
    is_causal: object,
) -> None:
    """Raise if the arguments of `gqa.forward` do not fit `gqa` (see `Raises:` there)."""
    if gqa.kv == "shared" and cache is None:
        raise ValueError(
            "cache must be the SharedKVReader of the layer whose keys and values this layer "
            "reads (kv='shared'), got None"
        )
    if position_embeddings is not None and gqa.rope is None:
        raise ValueError("position_embeddings needs a module built with rope (a Rope, not None)")
    check_attention_inputs(
        x,
        d_model=gqa.d_model,
        owner=type(gqa).__name__,
        like=gqa.q_proj.weight,
        rope_dims=gqa.rope_dims,
        positions=positions,
        position_embeddings=position_embeddings,
        cache=gqa.check_cache(cache),
        attn_mask=attn_mask,
        num_heads=gqa.num_heads,
        is_causal=is_causal,
        window=gqa.window,
    )
    logits = gqa.sink_logits
    if logits is not None and tuple(logits.shape) != (gqa.num_heads,):
        raise ValueError(  # a user may have assigned another tensor to module.sink_logits
            f"sink_logits must hold one logit per query head, shape ({gqa.num_heads},), "
            f"got sink_logits.shape={tuple(logits.shape)}"
        )


def _project(gqa: GroupedQueryAttention, x: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The queries, keys and values of `x` `(b, t, d_model)`, split into heads and
    QK-normed where the spec says before RoPE; no keys or values with `kv="shared"`."""
    raw = None if gqa.k_proj is None else gqa.k_proj(x)  # (b, t, h_kv * head_dim)
    q, k = _qk_normed(gqa, gqa.q_proj(x), raw, "projection")  # OLMo 2
    k = None if k is None else split_heads(k, gqa.num_kv_heads)  # (b, h_kv, t, head_dim)
    q, k = _qk_normed(gqa, split_heads(q, gqa.num_heads), k, "head")  # Qwen3, Gemma 3
    if raw is None:
        return q, None, None
    # kv="keys" (Gemma 4): the values are the keys' projection, before norm and RoPE.
    v = split_heads(raw if gqa.v_proj is None else gqa.v_proj(x), gqa.num_kv_heads)
    if gqa.qk_norm is not None and gqa.qk_norm.values:  # Gemma 4: without weight
        v = rms_normalize(v, gqa.qk_norm.eps).to(v.dtype)
    return q, k, v


def _qk_normed(
    gqa: GroupedQueryAttention, q: Tensor, k: Tensor | None, where: QKNorm
) -> tuple[Tensor, Tensor | None]:
    """QK-norm of `q` and `k` if `gqa` normalises at `where`; else them unchanged."""
    spec, q_norm, k_norm = gqa.qk_norm, gqa.q_norm, gqa.k_norm
    if spec is None or spec.over != where:
        return q, k
    if q_norm is None:  # "rotated": no weight
        plain = [None if y is None else rms_normalize(y, spec.eps).to(y.dtype) for y in (q, k)]
        return cast(Tensor, plain[0]), plain[1]
    return q_norm(q), None if k is None or k_norm is None else k_norm(k)
