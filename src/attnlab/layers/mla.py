r"""Multi-head latent attention (MLA), equal to Hugging Face's `DeepseekV3Attention`.

Multi-head latent attention (DeepSeek-AI, "DeepSeek-V2", 2024,
https://arxiv.org/abs/2405.04434; also used by DeepSeek-V3) shrinks the KV cache by
caching, per token, one small *latent* vector $c^{KV}_j$ shared by all heads instead of
a key and a value per head. Each head's key and value are linear functions of it:

$$
c^{KV}_j = \operatorname{RMSNorm}(W^{DKV} x_j), \qquad
k^{C}_{j,h} = W^{UK}_h c^{KV}_j, \qquad v_{j,h} = W^{UV}_h c^{KV}_j
$$

RoPE cannot be applied to $k^{C}$ without spoiling the decode-time trick below, so
position enters through a separate, *decoupled* key $k^{R}_j = \operatorname{RoPE}(W^{KR}
x_j)$ of `qk_rope_head_dim` features, also shared by all heads and also cached. A head's
query is split the same way, $q_{i,h} = [q^{C}_{i,h}; \operatorname{RoPE}(q^{R}_{i,h})]$
(from a low-rank projection of $x_i$ when `q_lora_rank` is set), and the score is

$$
s_{ijh} = \tau\left( q^{C\top}_{i,h} W^{UK}_h c^{KV}_j + q^{R\top}_{i,h} k^{R}_j \right)
$$

with $\tau$ the softmax scale. Because $W^{UK}_h$ sits between the query and the cached
latent, it can be folded into the query ("absorbed"): attention then runs directly on
the cached latents, as multi-query attention with one key/value head of
`kv_lora_rank + qk_rope_head_dim` features, and $W^{UV}_h$ is applied after the
weighted sum. [`MultiHeadLatentAttention`][attnlab.layers.mla.MultiHeadLatentAttention] computes
both forms; they are equal.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnlab.caches.kv import KVCache, StaticKVCache
from attnlab.functional.backends import Backend, BackendProperty, attend, check_backend_call
from attnlab.layers.gqa import check_attention_inputs
from attnlab.rules._validation import (
    check_bool,
    check_positive_float,
    check_positive_int,
    check_probability,
    check_scale,
    check_tensor,
    checking,
    entry,
)
from attnlab.rules.masks import check_window, needs_mask
from attnlab.rules.rope import (
    RopeLayout,
    check_base,
    check_head_dim,
    check_layout,
    default_positions,
    rope_cos_sin,
    rotate,
)
from attnlab.rules.rope_scaling import yarn_mscale
from attnlab.rules.scores import ScoreRule

__all__ = ["MultiHeadLatentAttention", "mla_softmax_scale"]


def mla_softmax_scale(
    qk_head_dim: int, *, rope_factor: float = 1.0, mscale_all_dim: float = 0.0
) -> float:
    r"""The softmax scale of DeepSeek's attention, with YaRN's correction when RoPE is scaled.

    Without RoPE scaling it is the usual $1/\sqrt{d}$ over the whole query/key head,
    $d$ = `qk_nope_head_dim + qk_rope_head_dim`. DeepSeek-V3 extends its context with YaRN
    (Peng et al., 2023, https://arxiv.org/abs/2309.00071), which sharpens the softmax by
    $m = 0.1 \cdot \text{mscale\_all\_dim} \cdot \ln(\text{factor}) + 1$; DeepSeek applies
    it to both the query and the key, so the scale is multiplied by $m^2$ (as Hugging
    Face's `DeepseekV3Attention.scaling`). Nothing changes when `rope_factor <= 1` or
    `mscale_all_dim` is 0.

    Args:
        qk_head_dim: Features per query/key head, `qk_nope_head_dim + qk_rope_head_dim`.
        rope_factor: YaRN's context-extension `factor` (1 = no scaling).
        mscale_all_dim: YaRN's `mscale_all_dim` (0 = no correction).

    Returns:
        The factor that multiplies the scores.

    Raises:
        TypeError: If `qk_head_dim` is not an int or a factor is not a number.
        ValueError: If `qk_head_dim` is not positive or a factor is not finite.

    Examples:
        >>> mla_softmax_scale(192) == 192**-0.5
        True
        >>> round(mla_softmax_scale(192, rope_factor=40.0, mscale_all_dim=1.0), 6)
        0.135234
    """
    check_positive_int("qk_head_dim", qk_head_dim)
    factor = check_scale("rope_factor", rope_factor)
    mscale_all = check_scale("mscale_all_dim", mscale_all_dim)
    assert factor is not None  # a number was given
    assert mscale_all is not None
    scale: float = float(qk_head_dim) ** -0.5
    m = yarn_mscale(factor, mscale_all)  # 1 without stretching (or with mscale 0)
    return scale * m * m


def _deinterleave(x: Tensor) -> Tensor:
    """Reorder features `(x0, x1, x2, x3, ...)` as `(x0, x2, ..., x1, x3, ...)`.

    RoPE on interleaved pairs `(x0, x1), (x2, x3), ...`, written in this order, is RoPE in
    the half-split layout: the pair of feature `i` moves to `(i, i + d/2)`. DeepSeek's
    checkpoints (and Hugging Face's `apply_rotary_pos_emb_interleave`) use it this way.
    """
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)  # (..., d)


class MultiHeadLatentAttention(nn.Module):
    r"""DeepSeek's multi-head latent attention, with a naive and an absorbed form.

    The layers, with Hugging Face's names, the weights `from_hf` copies (all
    `nn.Linear` weights are `(out_features, in_features)`, as in PyTorch):

    | attnlab | shape of `weight` | Hugging Face `DeepseekV3Attention` |
    | --- | --- | --- |
    | `q_proj` (`q_lora_rank=None`) | `(num_heads * qk_head_dim, d_model)` | `q_proj` |
    | `q_down` | `(q_lora_rank, d_model)` | `q_a_proj` |
    | `q_norm` (RMSNorm) | `(q_lora_rank,)` | `q_a_layernorm` |
    | `q_up` | `(num_heads * qk_head_dim, q_lora_rank)` | `q_b_proj` |
    | `kv_down` | `(kv_lora_rank + qk_rope_head_dim, d_model)` | `kv_a_proj_with_mqa` |
    | `kv_norm` (RMSNorm) | `(kv_lora_rank,)` | `kv_a_layernorm` |
    | `kv_up` | `(num_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank)` | `kv_b_proj` |
    | `out_proj` | `(d_model, num_heads * v_head_dim)` | `o_proj` |

    Rows of `q_up` (or `q_proj`) are grouped by head, each head's `qk_head_dim` rows
    first the `qk_nope_head_dim` no-RoPE features, then the `qk_rope_head_dim` RoPE ones;
    rows of `kv_down` are the `kv_lora_rank` latent features, then the shared RoPE key;
    rows of `kv_up` are grouped by head, each `qk_nope_head_dim` key rows then
    `v_head_dim` value rows. `q_down`, `kv_down` and `out_proj` have a bias if `bias`.

    `forward(..., absorb=False)` expands the cached latents into per-head keys and values
    (what training does); `absorb=True` folds `kv_up`'s key rows into the queries and its
    value rows into the output, and attends over the latents themselves. Its cache (a
    [`KVCache`][attnlab.caches.kv.KVCache] of one head, e.g. from
    [`new_cache`][attnlab.layers.mla.MultiHeadLatentAttention.new_cache]) holds per token only
    the latent `(b, 1, t, kv_lora_rank)` as its keys and the rotated RoPE key
    `(b, 1, t, qk_rope_head_dim)` as its values, whichever form reads it.

    Args:
        d_model: Features per token, of the input and of the output.
        num_heads: Attention heads.
        kv_lora_rank: Features of the cached latent $c^{KV}$.
        qk_nope_head_dim: Features per head of the query/key part without RoPE.
        qk_rope_head_dim: Features of the RoPE part of each query head and of the shared
            RoPE key; even.
        v_head_dim: Features per value head.
        q_lora_rank: Rank of the low-rank query projection; None for a full `q_proj`.
        rope_base: RoPE's base $\theta$ (`rope_theta`).
        rope_frequencies: The `qk_rope_head_dim // 2` rotation frequencies, replacing
            those of `rope_base`: e.g. YaRN's, which DeepSeek-V3 uses to extend its
            context and which `from_hf` copies from Hugging Face's rotary embedding.
        rope_scale: Factor on the rotated queries and keys (Hugging Face's
            `attention_scaling` of the rotary embedding; 1 for plain RoPE and for
            DeepSeek-V3's YaRN settings).
        rope_layout: Which features RoPE pairs ([`RopeLayout`][attnlab.rules.rope.RopeLayout]):
            `"interleaved"` neighbours (DeepSeek's checkpoints, Hugging Face's
            `rope_interleave=True`, the default) or `"half"` the two halves.
        softmax_scale: Factor on the scores; default `qk_head_dim ** -0.5`
            (see [`mla_softmax_scale`][attnlab.layers.mla.mla_softmax_scale] for YaRN).
        bias: Whether `q_down`, `kv_down` and `out_proj` have a bias
            (`attention_bias`).
        norm_eps: Epsilon of the two RMSNorms.
        dropout: Probability of dropping an attention weight, in training mode only.
        window: Sliding-window size of the causal mask (keys per query, itself
            included), or None; it applies with `forward(..., is_causal=True)`.
        backend: `"torch"`, `"scratch"` or `"flash"` (no `attn_mask`, no dropout): which
            scaled dot-product attention both forms run.

    Shapes:
        x: `(b, t, d_model)` or unbatched `(t, d_model)`. Output: the same shape.

    Raises:
        TypeError: If a size is not an int, a number is not a number, a flag not a bool
            or `rope_frequencies` not a floating-point tensor.
        ValueError: If a size or `rope_scale` is not positive, `rope_base` is not above 1
            (RoPE's one rule, [`check_base`][attnlab.rules.rope.check_base]),
            `qk_rope_head_dim` is odd, `rope_frequencies` does not have
            `qk_rope_head_dim // 2` elements, `dropout` is not in [0, 1) or a number is not
            finite, or `backend` is unknown.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> mla = MultiHeadLatentAttention(
        ...     d_model=32, num_heads=4, kv_lora_rank=12, qk_nope_head_dim=6,
        ...     qk_rope_head_dim=4, v_head_dim=5, q_lora_rank=10)
        >>> x = torch.randn(2, 7, 32)
        >>> out = mla(x, is_causal=True)
        >>> out.shape
        torch.Size([2, 7, 32])
        >>> torch.allclose(mla(x, is_causal=True, absorb=True), out, atol=1e-6)
        True
        >>> cache = mla.new_cache(batch_size=2, max_length=16)
        >>> _ = mla(x[:, :5], cache=cache, is_causal=True)  # prefill 5 tokens
        >>> step = mla(x[:, 5:6], cache=cache, absorb=True)  # decode the 6th
        >>> torch.allclose(step, out[:, 5:6], atol=1e-6)
        True
        >>> cache.length, cache.nbytes // (2 * 16)  # bytes per token: (12 + 4) * 4
        (6, 64)
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        rope_base: float = 10000.0,
        rope_frequencies: Tensor | None = None,
        rope_scale: float = 1.0,
        rope_layout: RopeLayout = "interleaved",
        softmax_scale: float | None = None,
        bias: bool = False,
        norm_eps: float = 1e-6,
        dropout: float = 0.0,
        window: int | None = None,
        backend: Backend = "torch",
    ) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.kv_lora_rank = check_positive_int("kv_lora_rank", kv_lora_rank)
        self.qk_nope_head_dim = check_positive_int("qk_nope_head_dim", qk_nope_head_dim)
        self.qk_rope_head_dim = check_head_dim(qk_rope_head_dim, "qk_rope_head_dim")
        self.v_head_dim = check_positive_int("v_head_dim", v_head_dim)
        self.q_lora_rank = (
            None if q_lora_rank is None else check_positive_int("q_lora_rank", q_lora_rank)
        )
        self.rope_base = check_base(rope_base, "rope_base")
        self.rope_frequencies: Tensor | None = None
        if rope_frequencies is not None:
            freqs = check_tensor("rope_frequencies", rope_frequencies)
            if tuple(freqs.shape) != (qk_rope_head_dim // 2,):
                raise ValueError(
                    f"rope_frequencies must have shape (qk_rope_head_dim // 2,) = "
                    f"({qk_rope_head_dim // 2},), got {tuple(freqs.shape)}"
                )
            # A plain float32 attribute, not a buffer: module.to(torch.bfloat16) must not
            # round the frequencies (it is moved to the positions' device when used).
            self.rope_frequencies = freqs.detach().float().clone()
        self.rope_scale = check_positive_float("rope_scale", rope_scale)
        self.rope_layout = check_layout(rope_layout, "rope_layout")
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        scale = check_scale("softmax_scale", softmax_scale)
        self.scale = float(self.qk_head_dim) ** -0.5 if scale is None else scale  # resolved
        self.bias = check_bool("bias", bias)
        eps = check_positive_float("norm_eps", norm_eps)
        self.dropout = check_probability("dropout", dropout)
        self.window = check_window(window, None)
        self.backend = backend

        h, r, dr = num_heads, kv_lora_rank, qk_rope_head_dim
        self.q_proj: nn.Linear | None = None
        self.q_down: nn.Linear | None = None
        self.q_norm: nn.RMSNorm | None = None
        self.q_up: nn.Linear | None = None
        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, h * self.qk_head_dim, bias=False)
        else:
            self.q_down = nn.Linear(d_model, self.q_lora_rank, bias=bias)
            self.q_norm = nn.RMSNorm(self.q_lora_rank, eps=eps)
            self.q_up = nn.Linear(self.q_lora_rank, h * self.qk_head_dim, bias=False)
        self.kv_down = nn.Linear(d_model, r + dr, bias=bias)
        self.kv_norm = nn.RMSNorm(r, eps=eps)
        self.kv_up = nn.Linear(r, h * (qk_nope_head_dim + v_head_dim), bias=False)
        self.out_proj = nn.Linear(h * v_head_dim, d_model, bias=bias)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, "
            f"kv_lora_rank={self.kv_lora_rank}, qk_nope_head_dim={self.qk_nope_head_dim}, "
            f"qk_rope_head_dim={self.qk_rope_head_dim}, v_head_dim={self.v_head_dim}, "
            f"q_lora_rank={self.q_lora_rank}, rope_base={self.rope_base}, "
            f"rope_frequencies={'custom' if self.rope_frequencies is not None else None}, "
            f"rope_scale={self.rope_scale}, "
            f"rope_layout={self.rope_layout!r}, softmax_scale={self.scale}, "
            f"bias={self.bias}, dropout={self.dropout}, window={self.window}, "
            f"backend={self.backend!r}"
        )

    backend = BackendProperty()
    """`"torch"`, `"scratch"` or `"flash"`: which attention `forward` runs (checked when set)."""

    # -- the cache -----------------------------------------------------------------------

    def new_cache(
        self,
        batch_size: int,
        max_length: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> StaticKVCache:
        """A preallocated latent cache for this module: latents as keys, RoPE keys as values.

        It is a [`StaticKVCache`][attnlab.caches.kv.StaticKVCache] with one key/value head,
        `head_dim = kv_lora_rank` and `v_head_dim = qk_rope_head_dim`; its `nbytes` is
        `batch_size * max_length * (kv_lora_rank + qk_rope_head_dim)` elements, whatever
        the number of heads.

        Args:
            batch_size: Sequences decoded together.
            max_length: Most tokens it can hold, prompt included.
            dtype: Element type; defaults to the module's parameters'.
            device: Where to allocate it; defaults to the module's parameters'.

        Returns:
            An empty cache.

        Raises:
            TypeError: As `StaticKVCache`.
            ValueError: As `StaticKVCache`.
        """
        weight = self.kv_down.weight
        return StaticKVCache(
            batch_size,
            max_length,
            num_kv_heads=1,
            head_dim=self.kv_lora_rank,
            v_head_dim=self.qk_rope_head_dim,
            dtype=weight.dtype if dtype is None else dtype,
            device=weight.device if device is None else device,
        )

    # -- input checks --------------------------------------------------------------------

    def _check_inputs(
        self,
        x: object,
        positions: object,
        position_embeddings: object,
        cache: object,
        attn_mask: object,
        is_causal: object,
        absorb: object,
    ) -> None:
        """Raise if the arguments of `forward` do not fit this module (see `Raises:` there).

        The same rules as `GroupedQueryAttention`'s: positions and RoPE tables by `rope`,
        the cache's append by the cache itself (in its `update`).
        """
        shape = (1, self.kv_lora_rank, self.qk_rope_head_dim)  # (heads, head_dim, v_head_dim)
        checked = KVCache.check(  # one message for any cache that is not this layer's kind
            cache,
            needs=f"{type(self).__name__}'s latent cache from new_cache (one head of "
            f"kv_lora_rank={shape[1]} latent and qk_rope_head_dim={shape[2]} RoPE features "
            "per token)",
            fits=lambda c: c.layout is None or c.layout[1:4] == shape,
        )
        check_attention_inputs(
            x,
            d_model=self.d_model,
            owner=type(self).__name__,
            like=self.kv_down.weight,
            rope_dims=self.qk_rope_head_dim,
            positions=positions,
            position_embeddings=position_embeddings,
            cache=checked,
            attn_mask=attn_mask,
            num_heads=self.num_heads,
            is_causal=is_causal,
            window=self.window,
        )
        check_bool("absorb", absorb)

    # -- computation ---------------------------------------------------------------------

    def rope_tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """RoPE's `(cos, sin)` for integer `positions`, `(..., t, qk_rope_head_dim / 2)` each.

        `forward` builds them once and rotates queries and keys with the same tables;
        [`queries`][attnlab.layers.mla.MultiHeadLatentAttention.queries] and
        [`latents`][attnlab.layers.mla.MultiHeadLatentAttention.latents] take them. Hugging
        Face folds the rotary embedding's `attention_scaling` into cos and sin; so does
        this, with `rope_scale`. The positions are not checked here.
        """
        cos, sin = rope_cos_sin(
            positions, self.qk_rope_head_dim, base=self.rope_base, frequencies=self.rope_frequencies
        )  # (..., t, d_rope / 2) each
        if self.rope_scale != 1.0:
            cos, sin = cos * self.rope_scale, sin * self.rope_scale
        return cos, sin

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        if self.rope_layout == "interleaved":
            # Hugging Face's order: the same scores as rotating the pairs in place.
            x = _deinterleave(x)  # (..., t, qk_rope_head_dim)
        return rotate(x, cos, sin, layout="half")

    def queries(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """The queries of `x` `(b, t, d_model)`, split as MLA scores them.

        Args:
            x: Tokens `(b, t, d_model)`, not checked here.
            cos: From [`rope_tables`][attnlab.layers.mla.MultiHeadLatentAttention.rope_tables].
            sin: From the same call.

        Returns:
            The part without RoPE `(b, h, t, qk_nope_head_dim)` and the rotated part
            `(b, h, t, qk_rope_head_dim)`.
        """
        b, t, _ = x.shape
        if self.q_proj is not None:
            q = self.q_proj(x)  # (b, t, h * qk_head_dim)
        else:
            assert self.q_down is not None
            assert self.q_norm is not None
            assert self.q_up is not None
            q = self.q_up(self.q_norm(self.q_down(x)))  # (b, t, h * qk_head_dim)
        q = q.view(b, t, self.num_heads, self.qk_head_dim).transpose(1, 2)  # (b, h, t, d_qk)
        q_nope, q_rope = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], -1)
        return q_nope, self._rope(q_rope, cos, sin)  # (b, h, t, d_nope), (b, h, t, d_rope)

    def latents(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """What MLA's cache keeps of `x` `(b, t, d_model)`: one latent and one RoPE key.

        Args:
            x: Tokens `(b, t, d_model)`, not checked here.
            cos: From [`rope_tables`][attnlab.layers.mla.MultiHeadLatentAttention.rope_tables].
            sin: From the same call.

        Returns:
            The normed latent `(b, 1, t, kv_lora_rank)` and the rotated key
            `(b, 1, t, qk_rope_head_dim)` that every head shares.
        """
        b, t, _ = x.shape
        latent = self.kv_down(x)  # (b, t, r + d_rope)
        c_kv, k_rope = torch.split(latent, [self.kv_lora_rank, self.qk_rope_head_dim], -1)
        c_kv = self.kv_norm(c_kv).view(b, 1, t, self.kv_lora_rank)  # (b, 1, t, r)
        k_rope = k_rope.view(b, 1, t, self.qk_rope_head_dim)  # (b, 1, t, d_rope)
        return c_kv, self._rope(k_rope, cos, sin)

    def up_weights(self) -> tuple[Tensor, Tensor]:
        """`kv_up`'s weight split per head: W_UK `(h, d_nope, r)` and W_UV `(h, d_v, r)`.

        Views, not copies: folding W_UK into the queries and W_UV after the values is
        how the absorbed (cached) path attends to the latents directly.
        """
        w = self.kv_up.weight.view(
            self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank
        )  # (h, d_nope + d_v, r)
        w_uk, w_uv = torch.split(w, [self.qk_nope_head_dim, self.v_head_dim], 1)
        return w_uk, w_uv

    def absorbed_qk(
        self, q_nope: Tensor, q_rope: Tensor, c_kv: Tensor, k_rope: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The absorbed form's queries and keys, whose dot products are MLA's scores.

        Args:
            q_nope: From [`queries`][attnlab.layers.mla.MultiHeadLatentAttention.queries],
                `(b, h, t, qk_nope_head_dim)`.
            q_rope: From the same call, `(b, h, t, qk_rope_head_dim)`.
            c_kv: From [`latents`][attnlab.layers.mla.MultiHeadLatentAttention.latents] (or a
                cache), `(b, 1, s, kv_lora_rank)`.
            k_rope: From the same call, `(b, 1, s, qk_rope_head_dim)`.

        Returns:
            Queries `(b, h, t, kv_lora_rank + qk_rope_head_dim)`, W_UK folded into them,
            and keys `(b, 1, s, kv_lora_rank + qk_rope_head_dim)`: the latents themselves,
            one head that every query head shares.
        """
        w_uk, _ = self.up_weights()
        # q_nope . (W_UK c) = (W_UK^T q_nope) . c: move W_UK onto the query side, once per
        # query instead of once per cached token and head.
        q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # (b, h, t, r)
        q = torch.cat([q_latent, q_rope], dim=-1)  # (b, h, t, r + d_rope)
        k = torch.cat([c_kv, k_rope], dim=-1)  # (b, 1, s, r + d_rope): one shared head
        return q, k

    def _attend_naive(
        self,
        q_nope: Tensor,
        q_rope: Tensor,
        c_kv: Tensor,
        k_rope: Tensor,
        mask: Tensor | None,
        is_causal: bool,
    ) -> Tensor:
        """Expand the latents into per-head keys and values; heads `(b, h, t, v_head_dim)`."""
        b, _, s, _ = c_kv.shape
        h = self.num_heads
        kv = self.kv_up(c_kv.squeeze(1))  # (b, s, h * (d_nope + d_v))
        kv = kv.view(b, s, h, self.qk_nope_head_dim + self.v_head_dim).transpose(1, 2)
        k_nope, v = torch.split(kv, [self.qk_nope_head_dim, self.v_head_dim], -1)  # (b,h,s,.)
        k = torch.cat([k_nope, k_rope.expand(b, h, s, self.qk_rope_head_dim)], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (b, h, t, qk_head_dim)
        return self._attend(q, k, v, mask, is_causal)  # (b, h, t, d_v)

    def _attend_absorbed(
        self,
        q_nope: Tensor,
        q_rope: Tensor,
        c_kv: Tensor,
        k_rope: Tensor,
        mask: Tensor | None,
        is_causal: bool,
    ) -> Tensor:
        """Attend over the latents themselves; heads `(b, h, t, v_head_dim)`."""
        q, k = self.absorbed_qk(q_nope, q_rope, c_kv, k_rope)
        _, w_uv = self.up_weights()
        # Multi-query attention whose values are the latents; W_UV comes after the sum.
        b, h, t, _ = q.shape
        if mask is None and not (is_causal and needs_mask(t, k.shape[2], window=self.window)):
            # Every query sees every key (a decode step, or no mask at all): fold the heads
            # into the query length, one "head" of h * t rows over the one latent head
            # (FlashMLA's layout). enable_gqa would copy the shared head h times on CPU.
            q = q.reshape(b, 1, h * t, q.shape[-1])  # (b, 1, h * t, r + d_rope)
            o_latent = self._attend(q, k, c_kv, None, False).view(b, h, t, -1)  # (b,h,t,r)
        else:
            o_latent = self._attend(q, k, c_kv, mask, is_causal, enable_gqa=True)  # (b,h,t,r)
        return torch.einsum("bhtr,hvr->bhtv", o_latent, w_uv)  # (b, h, t, d_v)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        enable_gqa: bool = False,
    ) -> Tensor:
        """Both forms' attention, on the module's backend; causal in absolute positions."""
        window = self.window if is_causal else None
        # The queries are the last t of the s cached tokens.
        rule = ScoreRule(scale=self.scale, is_causal=is_causal, align="bottom-right", window=window)
        dropout_p = self.dropout if self.training else 0.0
        return attend(
            self.backend, q, k, v, rule, attn_mask=mask, dropout_p=dropout_p, enable_gqa=enable_gqa
        )

    @entry
    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        position_embeddings: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = True,
        absorb: bool = False,
    ) -> Tensor:
        """Attend from the tokens of `x` to themselves and to the cached ones.

        With a `cache`, the latents and RoPE keys of `x` are appended to it first, and
        the queries attend to all `s = cache.length` tokens it then holds (`x` last).
        Checks run once, here: the arguments before any work, the cache's append inside
        its `update`.

        Args:
            x: Tokens, `(b, t, d_model)` or `(t, d_model)`.
            positions: Integer RoPE positions of the tokens of `x`, `(t,)`, `(1, t)` or
                `(b, t)`; default `cache.seen + arange(t)` (counted before this call), or
                `arange(t)` without a cache. The same rule as
                [`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention]: positions
                only rotate, so any non-negative ones are accepted (checking reads them, a
                host sync skipped while compiling).
            position_embeddings: RoPE's `(cos, sin)` computed once for all layers, instead
                of `positions`: `(..., t, qk_rope_head_dim // 2)` from
                [`rope_cos_sin`][attnlab.rules.rope.rope_cos_sin], or Hugging Face's rotary
                embedding output `(b, t, qk_rope_head_dim)`; taken as they are (Hugging
                Face's already hold `attention_scaling`, this module's `rope_scale`).
            cache: A [`KVCache`][attnlab.caches.kv.KVCache] with one key/value head,
                `head_dim = kv_lora_rank`, `v_head_dim = qk_rope_head_dim`, see
                [`new_cache`][attnlab.layers.mla.MultiHeadLatentAttention.new_cache]; updated in
                place.
            attn_mask: Bool mask (True = attend) or float mask added to the scores,
                broadcastable to `(b, num_heads, t, s)`; combined with the causal one when
                `is_causal` (as in `GroupedQueryAttention`).
            is_causal: Hide from each query the keys after it, in absolute positions: with
                a cache the mask is aligned bottom-right (`x` are the last `t` of the `s`
                tokens); one new token needs no mask at all. The module's `window` applies
                with it. True by default, as in `GroupedQueryAttention`: a decoder's layer
                is causal; False attends to every key, which a module with a window
                refuses.
            absorb: Attend over the latents directly (decode form) instead of
                expanding them into per-head keys and values (training form). When
                every query sees every key (one new token, or no mask), the heads are
                folded into the query length: one attention of `num_heads * t` rows
                over the single latent head, FlashMLA's layout.

        Returns:
            `(b, t, d_model)` or `(t, d_model)`.

        Raises:
            TypeError: If `x` is not a floating-point tensor, `positions` not an integer
                tensor, `cache` not this module's latent cache (e.g. a grouped-query
                layer's), the mask has a wrong dtype or a flag is not a bool.
            ValueError: If the rank, feature size, dtype or device of `x` does not fit
                the module; `positions` has the wrong shape or device or is negative, or
                comes with `position_embeddings` (or those do not fit); the cache cannot
                take the new latents (batch size, dtype, device, or no room for `t` more
                tokens); the mask does not broadcast to `(b, num_heads, t, s)`; the
                module has a window and `is_causal` is False; or `backend="flash"` gets
                a mask or dropout.
        """
        if checking():
            self._check_inputs(
                x, positions, position_embeddings, cache, attn_mask, is_causal, absorb
            )
        # Before the projections and the cache's append: a call flash cannot serve leaves
        # the cache as it was.
        dropout_p = self.dropout if self.training else 0.0
        check_backend_call(self.backend, attn_mask=attn_mask, dropout_p=dropout_p)
        unbatched = x.ndim == 2
        if unbatched:
            x = x.unsqueeze(0)  # (1, t, d_model)
        b, t, _ = x.shape
        if position_embeddings is None:
            if positions is None:
                past = 0 if cache is None else cache.seen
                positions = default_positions(past, t, x.device)  # (t,)
            position_embeddings = self.rope_tables(positions)
        cos, sin = position_embeddings
        q_nope, q_rope = self.queries(x, cos, sin)
        c_kv, k_rope = self.latents(x, cos, sin)  # (b, 1, t, r), (b, 1, t, d_rope)
        if cache is not None:
            c_kv, k_rope = cache.update(c_kv, k_rope)  # (b, 1, s, r), (b, 1, s, d_rope)
        attend_heads = self._attend_absorbed if absorb else self._attend_naive
        heads = attend_heads(q_nope, q_rope, c_kv, k_rope, attn_mask, is_causal)  # (b,h,t,d_v)
        concat = heads.transpose(1, 2).reshape(b, t, self.num_heads * self.v_head_dim)
        out: Tensor = self.out_proj(concat)  # (b, t, d_model)
        return out[0] if unbatched else out

    # -- interoperability with Hugging Face ----------------------------------------------

    @classmethod
    def from_hf(cls, layer: nn.Module, *, ignore: Sequence[str] = ()) -> MultiHeadLatentAttention:
        """A `MultiHeadLatentAttention` with the weights of a Hugging Face MLA layer.

        Accepts any layer with the structure of `transformers`' `DeepseekV3Attention`,
        whatever its class name: the sizes, `scaling`, `attention_dropout` and `config`
        it reads, the projections and norms of the class docstring's table (`q_proj`, or
        `q_a_proj`/`q_a_layernorm`/`q_b_proj`) and no other submodule or parameter, and a
        `forward` that takes `position_embeddings` (it applies RoPE). That covers
        DeepSeek-V2/V3, structural copies in `transformers` (e.g. GLM-4 MoE Lite's
        `Glm4MoeLiteAttention`) and user subclasses; it refuses layers that add parts
        this module does not compute (DeepSeek-V3.2's sparse-attention `indexer`, output
        gates, attention sinks) or apply no RoPE (Kimi Linear's MLA). It copies
        the weights, the softmax scale (`layer.scaling`, YaRN's correction included), RoPE
        base and layout (`config.rope_interleave`, default True, as `rope_layout`),
        RMSNorm epsilons, dropout and training mode. When the config scales RoPE with
        fixed frequencies (`rope_type` `"yarn"`, as DeepSeek-V3's checkpoints, `"linear"`
        or `"llama3"`), the frequencies and the factor on cos/sin come from attnlab's
        [`RopeScaling`][attnlab.rules.rope_scaling.RopeScaling] (tested equal to
        `transformers`' own rules), as `rope_frequencies` and `rope_scale`.

        Args:
            layer: The Hugging Face attention layer.
            ignore: Names of the layer's extra submodules or parameters that the caller
                computes itself and this copy leaves out, e.g. `("indexer",)` for
                [`DeepSeekSparseAttention.from_hf`][attnlab.layers.sparse.DeepSeekSparseAttention.from_hf],
                which ports DeepSeek-V3.2's indexer on its own.

        Returns:
            A new module on the layer's device and dtype, sharing no storage with it.

        Raises:
            TypeError: If `layer` does not have that structure (the message says how it
                differs), or `ignore` is not a sequence of names.
            ValueError: If its RoPE frequencies change with the sequence length
                (`rope_type` `"dynamic"` or `"longrope"`), which this module does not do,
                or `ignore` names a part the layer does not have (or one this copy needs).
        """
        from attnlab.models import interop  # a folder above this one: imported when called

        return interop.mla_from_hf(cls, layer, ignore=ignore)
