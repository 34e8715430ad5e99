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
logit softcapping (Gemma 2) and learned attention sinks (gpt-oss).
[`GroupedQueryAttention.from_hf`][attnlab.layers.gqa.GroupedQueryAttention.from_hf] copies the
weights of their Hugging Face implementations, and the tests check that the outputs,
gradients and cached decoding agree.
"""

from __future__ import annotations

from typing import Literal, overload

import torch
from torch import Tensor, nn

from attnlab.caches.base import LayerCache
from attnlab.caches.kv import AttentionCache
from attnlab.functional.backends import (
    Backend,
    BackendProperty,
    attend,
    attention_weights,
    check_backend_call,
)
from attnlab.layers.norms import QKNorm, QKNormSpec, RMSNorm
from attnlab.rules._validation import (
    check_attn_mask,
    check_bool,
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
from attnlab.rules.scores import ScoreRule

__all__ = ["GroupedQueryAttention", "check_attention_inputs"]


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


def _check_scores(scores: object) -> tuple[int | None, float | None, float | None]:
    """A layer's `scores` rule as its `(window, scale, softcap)`; raise naming `scores`.

    Causality and learned sinks are the layer's per call and its own parameter, so a
    rule that sets them is refused rather than silently overridden.
    """
    if not isinstance(scores, ScoreRule):
        raise TypeError(f"scores must be a ScoreRule, got {type(scores).__name__}")
    if scores.is_causal or scores.align != "top-left" or scores.sink_logits is not None:
        raise ValueError(
            "scores sets is_causal, align or sink_logits, which a layer decides itself: "
            "pass forward(..., is_causal=...) and learned_sinks=True instead"
        )
    window = check_window(scores.window, None)
    scale = check_scale("scores.scale", scores.scale)
    return window, scale, check_softcap("scores.softcap", scores.softcap)


class GroupedQueryAttention(nn.Module):
    r"""Causal grouped-query self-attention with optional RoPE, sliding window and KV cache.

    The projections are named as in Hugging Face's Llama: `q_proj` maps `d_model` to
    `num_heads * head_dim` features, `k_proj` and `v_proj` to `num_kv_heads * head_dim`,
    and `out_proj` maps the concatenated heads back to `d_model`. The attention runs on
    PyTorch's `scaled_dot_product_attention` (`backend="torch"`), attnlab's
    [`scaled_dot_product_attention`][attnlab.functional.sdpa.scaled_dot_product_attention]
    (`backend="scratch"`) or [`flash_attention`][attnlab.functional.flash.flash_attention]
    (`backend="flash"`, no `attn_mask` and no dropout), the first two with
    `enable_gqa=True`, so the key/value heads are never copied per query head.

    Every query sees itself and the tokens before it (`forward(..., is_causal=False)`
    lifts that); with `window`, only its last `window` tokens (itself included), as in
    Mistral. Causality holds in absolute positions: with a
    [`KVCache`][attnlab.caches.kv.KVCache], `forward` appends the new tokens' keys and
    values to the cache and attends from the new queries to all cached tokens, the causal
    mask bottom-right aligned ([`masks.decode_mask`][attnlab.rules.masks.decode_mask]: none at
    all for one new token), and cached decoding gives the outputs of one forward pass
    over the whole sequence.

    Args:
        d_model: Features per token, in and out.
        num_heads: Query heads.
        num_kv_heads: Key/value heads; a divisor of `num_heads`. Default `num_heads`
            (multi-head attention); 1 is multi-query attention.
        head_dim: Features per head; default `d_model // num_heads` (then `d_model` must
            be a multiple of `num_heads`). Even with a `rope` that rotates all of it.
        bias: Whether `q_proj`, `k_proj` and `v_proj` have a bias (Qwen2: True).
        out_bias: Whether `out_proj` has a bias; default `bias` (Llama's `attention_bias`
            sets all four, Qwen2 has none on `out_proj`).
        rope: Rotate queries and keys by their positions, by the rule of a
            [`Rope`][attnlab.rules.rope.Rope] (its base, layout, rotated features and
            context-extension scaling; [`apply_rope`][attnlab.rules.rope.apply_rope]);
            None for a NoPE layer (SmolLM3 leaves every fourth layer unrotated).
        scores: The layer's [`ScoreRule`][attnlab.rules.scores.ScoreRule]: its `window`
            (sliding-window size, keys per query, itself included, as in Mistral), its
            `scale` (the factor of the scores $q \cdot k$; default
            $1 / \sqrt{\text{head\_dim}}$, Gemma: `query_pre_attn_scalar ** -0.5`) and
            its `softcap` (Gemma 2: the scaled scores $x$ become $c \tanh(x / c)$ before
            the mask; PyTorch's SDPA cannot do it: needs `backend="scratch"` or
            `"flash"`). Causality is `forward`'s `is_causal`, and learned sinks are
            `learned_sinks`, so the rule leaves `is_causal`, `align` and `sink_logits`
            unset.
        qk_norm: QK-norm ([`QKNormSpec`][attnlab.layers.norms.QKNormSpec]): an
            [`RMSNorm`][attnlab.layers.norms.RMSNorm] of the queries and the keys before
            RoPE, learned weights `q_norm` and `k_norm`, over each head's `head_dim`
            features (`"head"`; weights `(head_dim,)` shared by the heads; Qwen3,
            Gemma 3) or over the whole projection before the split into heads
            (`"projection"`; weights `(num_heads * head_dim,)` and
            `(num_kv_heads * head_dim,)`; OLMo 2); None for none.
        learned_sinks: Learned attention sinks (gpt-oss): a parameter `sink_logits` of
            shape `(num_heads,)`, one logit per query head that joins every row's softmax
            with no value (initialised to zeros), on every backend.
        dropout: Probability of dropping an attention weight, in training mode only.
        backend: `"torch"`, `"scratch"` or `"flash"`: which attention `forward` runs.

    Shapes:
        x: `(b, t, d_model)` or unbatched `(t, d_model)`. Output: the same shape.

    Raises:
        TypeError: If a size is not an int, a flag not a bool, `rope`, `scores` or
            `qk_norm` not of its class, or `dropout`, `scores.scale`, `scores.softcap`
            or `qk_norm.eps` not a number.
        ValueError: If a size is not positive, `num_heads` is not a multiple of
            `num_kv_heads`, `d_model` is not a multiple of `num_heads` without
            `head_dim`, the features `rope` rotates (`rope.dims`, else `head_dim`) are
            odd or above `head_dim`, `rope.base` is not above 1, `scores.scale` is not
            finite, `scores.softcap` or `qk_norm.eps` is not positive, `scores` sets
            `is_causal`, `align` or `sink_logits`, `qk_norm.over` is not `"head"` or
            `"projection"`, `dropout`, `rope.layout` or `backend` is out of range, or
            `backend="torch"` comes with a softcap.

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
        bias: bool = False,
        out_bias: bool | None = None,
        rope: Rope | None = Rope(),
        scores: ScoreRule = ScoreRule(),
        qk_norm: QKNormSpec | None = None,
        learned_sinks: bool = False,
        dropout: float = 0.0,
        backend: Backend = "torch",
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
            head_dim = check_multiple(
                "d_model",
                d_model,
                "num_heads",
                num_heads,
                why=" when head_dim is not given",
                hint="; or pass head_dim",
            )
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.bias = check_bool("bias", bias)
        self.out_bias = bias if out_bias is None else check_bool("out_bias", out_bias)
        self.rope_dims = check_rope(rope, self.head_dim) or self.head_dim
        self.rope = rope
        self.window, self.scale, self.softcap = _check_scores(scores)
        if qk_norm is not None and not isinstance(qk_norm, QKNormSpec):
            raise TypeError(f"qk_norm must be a QKNormSpec or None, got {type(qk_norm).__name__}")
        self.qk_norm = None if qk_norm is None else qk_norm.check()
        self.dropout = check_probability("dropout", dropout)
        self.backend = backend
        check_backend_call(backend, ScoreRule(softcap=self.softcap), attn_mask=None, dropout_p=0.0)
        self.sink_logits: nn.Parameter | None = None
        if check_bool("learned_sinks", learned_sinks):
            self.sink_logits = nn.Parameter(torch.zeros(self.num_heads))
        q_features = self.num_heads * self.head_dim
        kv_features = self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, q_features, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_features, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_features, bias=bias)
        self.out_proj = nn.Linear(q_features, d_model, bias=self.out_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if self.qk_norm is not None:
            per_head = self.qk_norm.over == "head"
            q_dim, k_dim = (self.head_dim, self.head_dim) if per_head else (q_features, kv_features)
            eps, unit_offset = self.qk_norm.eps, self.qk_norm.unit_offset
            self.q_norm = RMSNorm(q_dim, eps, unit_offset=unit_offset)
            self.k_norm = RMSNorm(k_dim, eps, unit_offset=unit_offset)

    backend = BackendProperty()
    """`"torch"`, `"scratch"` or `"flash"`: which attention `forward` runs (checked when set)."""

    @property
    def group_size(self) -> int:
        """Query heads per key/value head, `num_heads // num_kv_heads`."""
        return self.num_heads // self.num_kv_heads

    def extra_repr(self) -> str:
        rope = "rope=None" if self.rope is None else f"rope={self.rope}"
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, {rope}, "
            f"window={self.window}, bias={self.bias}, out_bias={self.out_bias}, "
            + ("" if self.scale is None else f"scale={self.scale}, ")
            + ("" if self.qk_norm is None else f"qk_norm={self.qk_norm}, ")
            + ("" if self.softcap is None else f"softcap={self.softcap}, ")
            + ("" if self.sink_logits is None else "learned_sinks=True, ")
            + f"dropout={self.dropout}, backend={self.backend!r}"
        )

    # -- input checks --------------------------------------------------------------------

    def check_cache(
        self, cache: object, *, name: str = "cache", owner: str = "", optional: bool = True
    ) -> AttentionCache | None:
        """Return `cache` (or None, when `optional`) if this layer can attend with it: an
        [`AttentionCache`][attnlab.caches.kv.AttentionCache] that keeps every key the
        window sees; raise TypeError (ValueError for a rolling cache narrower than the
        window) naming the `owner` and the cache's `name` otherwise."""
        checked = AttentionCache.check(
            cache,
            needs="an attnlab KVCache for GroupedQueryAttention's keys and values "
            "(DynamicKVCache, StaticKVCache or RollingKVCache)",
            name=name,
            optional=optional,
        )
        if checked is not None:
            checked.check_window(self.window, name=name, owner=owner or type(self).__name__)
        return checked

    def _check_inputs(
        self,
        x: object,
        positions: object,
        position_embeddings: object,
        cache: object,
        attn_mask: object,
        is_causal: object,
    ) -> None:
        """Raise if the arguments of `forward` do not fit this module (see `Raises:` there).

        The cache checks its own append (in `update`, once per forward); RoPE's rules are
        `rope`'s.
        """
        if position_embeddings is not None and self.rope is None:
            raise ValueError(
                "position_embeddings needs a module built with rope (a Rope, not None)"
            )
        checked = self.check_cache(cache)
        check_attention_inputs(
            x,
            d_model=self.d_model,
            owner=type(self).__name__,
            like=self.q_proj.weight,
            rope_dims=self.rope_dims,
            positions=positions,
            position_embeddings=position_embeddings,
            cache=checked,
            attn_mask=attn_mask,
            num_heads=self.num_heads,
            is_causal=is_causal,
            window=self.window,
        )
        logits = self.sink_logits
        if logits is not None and tuple(logits.shape) != (self.num_heads,):
            raise ValueError(  # a user may have assigned another tensor to module.sink_logits
                f"sink_logits must hold one logit per query head, shape ({self.num_heads},), "
                f"got sink_logits.shape={tuple(logits.shape)}"
            )

    # -- computation ---------------------------------------------------------------------

    @overload
    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        position_embeddings: tuple[Tensor, Tensor] | None = None,
        cache: AttentionCache | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = True,
        need_weights: Literal[False] = False,
    ) -> Tensor: ...

    @overload
    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        position_embeddings: tuple[Tensor, Tensor] | None = None,
        cache: AttentionCache | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = True,
        need_weights: Literal[True],
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

        Checks run once, here: the arguments (`x`, positions, the mask) before any work,
        the cache's append inside its `update`.

        Args:
            x: Tokens, `(b, t, d_model)` or `(t, d_model)`.
            positions: Integer position of each token for RoPE, `(t,)`, `(1, t)` or
                `(b, t)`; default `cache.seen + arange(t)` (or `arange(t)` without a
                cache). Positions only rotate queries and keys: which keys a query sees
                follows the order of the tokens in the cache, so any non-negative
                positions keep causality and are accepted, as in Hugging Face's layers
                (prefilling an empty cache at positions 100 to 104, say). Checking that
                none is negative reads them (a host sync, skipped while compiling).
            position_embeddings: RoPE's `(cos, sin)` tables computed once for all layers
                of a model, instead of `positions`: from
                [`rope_cos_sin`][attnlab.rules.rope.rope_cos_sin] (`(..., t, head_dim // 2)`)
                or Hugging Face's rotary embedding (`(b, t, head_dim)`).
            cache: A [`KVCache`][attnlab.caches.kv.KVCache] that holds the earlier
                tokens' keys and values; the new ones are appended to it, and the
                queries attend to the ones it says they see
                ([`attend`][attnlab.caches.kv.KVCache.attend]).
                Or another [`AttentionCache`][attnlab.caches.kv.AttentionCache], such as
                one layer's view of a paged cache of many sequences (`ragged`), which
                stores the rotated keys and values and attends itself; then `positions`
                (or `position_embeddings`) must place the tokens, and there is no
                `attn_mask`, window, dropout or `need_weights`.
            attn_mask: An extra mask, combined with the causal one: bool (True = attend;
                e.g. [`masks.key_padding`][attnlab.rules.masks.key_padding]) or float (added to
                the scores), broadcastable to `(b, num_heads, t, cache.seen + t)`.
            is_causal: Hide from each query the keys after it in absolute positions (the
                mask is bottom-right aligned after a cache). False attends to every key
                (e.g. an encoder), which a module with a `window` refuses.
            need_weights: Also return the attention weights `(b, num_heads, t, t_k)`
                (without dropout: call it in eval mode), computed from scratch from the
                same queries and keys whatever the backend; `t_k` is the number of keys
                attended to (a window drops older cached keys).

        Returns:
            `(b, t, d_model)` or `(t, d_model)`, like `x`; with `need_weights`, the pair
            `(out, weights)`.

        Raises:
            TypeError: If `x` is not a floating-point tensor, `positions` not an integer
                tensor, `cache` not a `KVCache`, `attn_mask` of a wrong dtype or
                `is_causal` or `need_weights` not a bool.
            ValueError: If the rank, feature size, dtype or device of `x` does not fit
                the module; `positions` has a wrong shape or a negative value, or comes
                with `position_embeddings` (or those do not fit); the cache cannot take
                the new keys and values (batch size, heads, head size, dtype, device, or
                a full static cache) or is a rolling cache narrower than the window; the
                mask does not broadcast; `is_causal=False` with a window; `sink_logits` was
                replaced by a tensor not of shape `(num_heads,)`; `backend="flash"` gets
                a mask or dropout; or `backend="torch"` is set on a module with a
                `softcap`.
        """
        if checking():
            self._check_inputs(x, positions, position_embeddings, cache, attn_mask, is_causal)
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
        )
        check_backend_call(self.backend, rule, attn_mask=attn_mask, dropout_p=dropout_p)
        unbatched = x.ndim == 2
        if unbatched:
            x = x.unsqueeze(0)  # (1, t, d_model)
        b, t, _ = x.shape
        h, h_kv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        q, k = self.q_proj(x), self.k_proj(x)  # (b, t, h * head_dim), (b, t, h_kv * head_dim)
        q, k = self._qk_normed(q, k, "projection")  # OLMo 2: over all heads' features
        q = q.view(b, t, h, hd).transpose(1, 2)  # (b, h, t, head_dim)
        k = k.view(b, t, h_kv, hd).transpose(1, 2)  # (b, h_kv, t, head_dim)
        v = self.v_proj(x).view(b, t, h_kv, hd).transpose(1, 2)  # (b, h_kv, t, head_dim)
        q, k = self._qk_normed(q, k, "head")  # Qwen3, Gemma 3: each head on its own

        if self.rope is not None:
            if position_embeddings is None:
                if positions is None:
                    past = 0 if cache is None else cache.seen
                    positions = default_positions(past, t, x.device)  # (t,)
                # One table for queries and keys, computed once per forward.
                base, scaling = self.rope.base, self.rope.scaling
                position_embeddings = rope_cos_sin(
                    positions, self.rope_dims, base=base, scaling=scaling
                )
            q = self._rotate(q, position_embeddings)  # (b, h, t, head_dim)
            k = self._rotate(k, position_embeddings)  # (b, h_kv, t, head_dim)
        rules = (attn_mask, self.window, self.scale, self.softcap, self.sink_logits)
        unserved = dropout_p or need_weights or any(r is not None for r in rules)
        if cache is not None and cache.ragged and unserved:
            raise ValueError(
                f"{type(cache).__name__} attends by its own rule: it takes no attn_mask, "
                "window, dropout, need_weights, scale, softcap or sink_logits"
            )
        attended: list[tuple[Tensor, Tensor | None]] = []  # keys and mask, for need_weights

        def kernel(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            mask = attn_mask
            if mask is not None and mask.shape[-1] > k.shape[2]:
                # The mask spans every token seen (as checked); the keys are the last of
                # them: the window dropped the oldest, or a RollingKVCache forgot them.
                mask = mask[..., -k.shape[2] :]
            attended.append((k, mask))
            out = attend(
                self.backend, q, k, v, rule, attn_mask=mask, dropout_p=dropout_p, enable_gqa=True
            )
            return out  # (b, h, t, head_dim)

        # The cache stores the new keys and values and runs the kernel over the ones the
        # queries see (a paged view reads its blocks instead).
        heads = kernel(q, k, v) if cache is None else cache.attend(q, k, v, kernel, window=window)
        concat = heads.transpose(1, 2).reshape(b, t, h * hd)  # (b, t, num_heads * head_dim)
        out: Tensor = self.out_proj(concat)  # (b, t, d_model)
        out = out[0] if unbatched else out
        if not need_weights:
            return out
        k, mask = attended[0]
        weights = attention_weights(q, k, rule, attn_mask=mask, enable_gqa=True)  # (b, h, t, t_k)
        return out, weights[0] if unbatched else weights

    def _qk_normed(self, q: Tensor, k: Tensor, where: QKNorm) -> tuple[Tensor, Tensor]:
        """QK-norm of `q` and `k` if this module normalises at `where`; else them unchanged."""
        if self.qk_norm is None or self.qk_norm.over != where:
            return q, k
        if self.q_norm is None or self.k_norm is None:
            return q, k
        return self.q_norm(q), self.k_norm(k)

    def _rotate(self, x: Tensor, cos_sin: tuple[Tensor, Tensor]) -> Tensor:
        """RoPE on the first `rope_dims` features of each head; the rest pass (partial RoPE)."""
        cos, sin = cos_sin
        layout = "half" if self.rope is None else self.rope.layout
        if self.rope_dims == self.head_dim:
            return rotate(x, cos, sin, layout=layout)
        turned, kept = x[..., : self.rope_dims], x[..., self.rope_dims :]  # (..., t, d_rot)
        return torch.cat((rotate(turned, cos, sin, layout=layout), kept), dim=-1)

    # -- interoperability with Hugging Face transformers ---------------------------------

    @classmethod
    def from_hf(cls, module: nn.Module, *, backend: Backend | None = None) -> GroupedQueryAttention:
        """A `GroupedQueryAttention` with the weights and settings of a Hugging Face layer.

        Accepts `transformers`' `LlamaAttention`, `MistralAttention`, `Qwen2Attention`,
        `StableLmAttention` (partial RoPE, without its `qk_layernorm`),
        `SmolLM3Attention` (NoPE layers), `Qwen3Attention` and `Gemma3Attention`
        (QK-norm per head), `Olmo2Attention` (QK-norm over the projections),
        `Gemma2Attention` (logit softcapping), `GptOssAttention` (learned sinks), and
        subclasses. The weights map one to one, as `nn.Linear` weights of shape
        `(out_features, in_features)`, with no permutation (all use the `"half"` RoPE
        layout):

        | Hugging Face | attnlab | weight shape |
        |---|---|---|
        | `q_proj` | `q_proj` | `(num_heads * head_dim, d_model)` |
        | `k_proj` | `k_proj` | `(num_kv_heads * head_dim, d_model)` |
        | `v_proj` | `v_proj` | `(num_kv_heads * head_dim, d_model)` |
        | `o_proj` | `out_proj` | `(d_model, num_heads * head_dim)` |
        | `q_norm`, `k_norm` | `q_norm`, `k_norm` | `(head_dim,)`; OLMo 2: the projections' |
        | `sinks` | `sink_logits` | `(num_heads,)` |

        Biases follow the layer: Qwen2 has them on `q_proj`, `k_proj`, `v_proj` but not
        `o_proj` (`bias=True, out_bias=False`); Llama has all four or none
        (`config.attention_bias`); Mistral has none.

        From the config and the layer: `hidden_size` (`d_model`), `num_attention_heads`,
        `num_key_value_heads`, the layer's `head_dim`, its `scaling` (as `scores.scale`
        where it is not `head_dim ** -0.5`: Gemma's `query_pre_attn_scalar ** -0.5`),
        `rope_parameters["rope_theta"]` (`rope_theta` in older versions; Gemma 3's
        `rope_parameters` hold one entry per layer type, read for this layer's
        `layer_type`), `attention_dropout`, and the sliding window: the layer's
        `sliding_window` (Qwen2, Qwen3, SmolLM3, Gemma 3 set it only on layers whose
        `layer_types` entry is `"sliding_attention"`), else Mistral's
        `config.sliding_window`; QK-norm from the layer's `q_norm` and `k_norm` (their
        epsilon, and Gemma's `1 + weight` as `qk_norm.unit_offset`); partial RoPE
        (`module.rotary_ndims`, StableLM's `head_dim * partial_rotary_factor`) as
        `rope.dims`; Gemma 2's `attn_logit_softcapping` as `scores.softcap`; gpt-oss's
        `sinks` (as `learned_sinks`, the logits in `sink_logits`); SmolLM3's NoPE layers
        (`module.use_rope` False, from `config.no_rope_layers`) as `rope=None`; and
        RoPE's context extension
        ([`RopeScaling.from_hf`][attnlab.rules.rope_scaling.RopeScaling.from_hf]: `"linear"`,
        `"dynamic"`, `"yarn"`, `"llama3"` as in Llama 3.1/3.2). Gemma 3's layer keeps
        `attn_logit_softcapping` but does not apply it, so neither does the port.

        Args:
            module: The Hugging Face attention layer.
            backend: Backend of the new module. None picks the fastest that runs every
                call the layer may get (any mask, dropout, its softcap): `"torch"`, or
                `"scratch"` for a softcapped layer (Gemma 2), which PyTorch's kernel
                cannot run; the new module's `backend` (shown in its repr) says which.
                Given explicitly, a backend that cannot run the layer is refused.

        Returns:
            A new module on the same device and dtype, in the same training mode.

        Raises:
            TypeError: If `module` is not one of the supported classes.
            ValueError: If it uses a RoPE type `RopeScaling` does not implement (e.g.
                `"longrope"`), or its scaling misses a key, or it normalises its queries
                and keys by LayerNorm (StableLM's `qk_layernorm`), or it attends both ways
                (`use_bidirectional_attention`), or `backend="torch"` is asked for a
                softcapped layer.

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
