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
from typing import Any, TypedDict, cast

import torch
from torch import Tensor, nn

from attnlab.caches.kv import KVCache, StaticKVCache
from attnlab.functional.backends import Backend, BackendProperty, attend, check_backend_call
from attnlab.layers.gqa import check_attention_inputs
from attnlab.layers.heads import merge_heads, split_heads
from attnlab.rules._precision import softmax_scale as softmax_scale_of
from attnlab.rules._validation import (
    check_bool,
    check_positive_float,
    check_positive_int,
    check_probability,
    check_scale,
    checking,
    entry,
)
from attnlab.rules.masks import check_window, needs_mask
from attnlab.rules.rope import (
    Rope,
    check_head_dim,
    check_rope,
    default_positions,
    rope_cos_sin,
    rotate,
)
from attnlab.rules.rope_scaling import yarn_mscale
from attnlab.rules.scores import ScoreRule

__all__ = [
    "LATENT_SIZES",
    "LatentSizes",
    "MultiHeadLatentAttention",
    "latent_sizes",
    "mla_softmax_scale",
]


class LatentSizes(TypedDict):
    """The four sizes of MLA's latent layout, named as DeepSeek's configurations and layers
    name them, so that a port and a benchmark read them from any object that carries them."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


LATENT_SIZES = tuple(LatentSizes.__annotations__)
"""The names of [`LatentSizes`][attnlab.layers.mla.LatentSizes], in order."""


def latent_sizes(source: object) -> LatentSizes:
    """The [`LatentSizes`][attnlab.layers.mla.LatentSizes] of `source` (a transformers layer
    or config, a benchmark's shape), as keywords for
    [`MultiHeadLatentAttention`][attnlab.layers.mla.MultiHeadLatentAttention]."""
    return cast(LatentSizes, {name: int(getattr(source, name)) for name in LATENT_SIZES})


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


def _rotate(x: Tensor, cos: Tensor | None, sin: Tensor | None, rope: Rope | None) -> Tensor:
    """RoPE on MLA's rotated features `x` `(..., t, qk_rope_head_dim)`, as Hugging Face does
    (`x` itself where `rope` is None: Kimi Linear's MLA rotates nothing).

    RoPE on interleaved pairs `(x0, x1), (x2, x3), ...` is RoPE in the half-split layout
    on the features reordered `(x0, x2, ..., x1, x3, ...)`: DeepSeek's checkpoints (and
    Hugging Face's `apply_rotary_pos_emb_interleave`) rotate them that way, so the cached
    RoPE keys are exactly Hugging Face's, and the scores the same as in place.
    """
    if rope is None:
        return x
    assert cos is not None  # rope_tables made both
    assert sin is not None
    if rope.layout == "interleaved":
        x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)  # (..., t, d_rope)
    return rotate(x, cos, sin, layout="half")


def _check_mla_rope(rope: object, qk_rope_head_dim: object) -> Rope | None:
    """`rope` if it is None or a [`Rope`][attnlab.rules.rope.Rope] that rotates the whole
    RoPE part of `qk_rope_head_dim` features (a positive even int)."""
    qk_rope_head_dim = check_head_dim(qk_rope_head_dim, "qk_rope_head_dim")
    if rope is None:
        return None
    if not isinstance(rope, Rope):
        raise TypeError(
            f"rope must be a Rope or None (MultiHeadLatentAttention rotates its "
            f"qk_rope_head_dim={qk_rope_head_dim} RoPE features, or none), got "
            f"{type(rope).__name__}"
        )
    dims = check_rope(rope, qk_rope_head_dim)
    if dims != qk_rope_head_dim:
        raise ValueError(
            f"rope.dims must be None or qk_rope_head_dim={qk_rope_head_dim} (the RoPE part "
            f"is rotated whole), got rope.dims={dims}"
        )
    return rope


def _check_latent_inputs(
    mla: MultiHeadLatentAttention, owner: str, x: object, positions: object, **given: Any
) -> Tensor:
    """`check_attention_inputs` with the sizes of `mla`: the rules of MLA's `forward` and of
    the [`DeepSeekSparseAttention`][attnlab.layers.sparse.DeepSeekSparseAttention] around it.

    `owner` names the module in messages; `given` are the other keywords of
    [`check_attention_inputs`][attnlab.layers.gqa.check_attention_inputs]. Returns `x`.
    """
    return check_attention_inputs(
        x,
        d_model=mla.d_model,
        owner=owner,
        like=mla.kv_down.weight,
        rope_dims=mla.qk_rope_head_dim,
        num_heads=mla.num_heads,
        positions=positions,
        **given,
    )


def _check_latent_cache(
    mla: MultiHeadLatentAttention, cache: object, name: str, optional: bool
) -> KVCache | None:
    """The body of [`check_cache`][attnlab.layers.mla.MultiHeadLatentAttention.check_cache]."""
    needs = (1, mla.kv_lora_rank, mla.qk_rope_head_dim)  # (heads, head_dim, v_head_dim)
    return KVCache.check(
        cache,
        needs=f"{type(mla).__name__}'s latent cache from new_cache (one head of "
        f"kv_lora_rank={needs[1]} latent and qk_rope_head_dim={needs[2]} RoPE "
        "features per token)",
        name=name,
        fits=lambda c: c.layout is None or c.layout[1:4] == needs,
        optional=optional,
    )


def _check_call(
    mla: MultiHeadLatentAttention,
    x: object,
    rope_inputs: tuple[object, object],
    cache: object,
    attn_mask: object,
    is_causal: object,
    absorb: object,
) -> None:
    """Raise if the arguments of MLA's `forward` do not fit `mla` (see `Raises:` there).

    The cache must be a latent cache of `mla`'s sizes (one message for any other kind);
    the rest are the rules of `check_attention_inputs`, and the cache checks its append.
    """
    checked = mla.check_cache(cache)
    positions, position_embeddings = rope_inputs
    names = ("positions", "position_embeddings")
    given = [n for n, v in zip(names, rope_inputs, strict=True) if v is not None]
    if mla.rope is None and given:
        raise ValueError(
            f"{' and '.join(given)} given, but this {type(mla).__name__} has rope=None: "
            "it rotates nothing (leave them out)"
        )
    _check_latent_inputs(
        mla,
        type(mla).__name__,
        x,
        positions,
        position_embeddings=position_embeddings,
        cache=checked,
        attn_mask=attn_mask,
        is_causal=is_causal,
        window=mla.window,
    )
    check_bool("absorb", absorb)


class MultiHeadLatentAttention(nn.Module):
    r"""DeepSeek's multi-head latent attention, with a naive and an absorbed form.

    `forward(..., absorb=False)` expands the cached latents into per-head keys and values
    (what training does); `absorb=True` folds `kv_up`'s key rows into the queries and its
    value rows into the output, and attends over the latents themselves. Either form's
    cache ([`new_cache`][attnlab.layers.mla.MultiHeadLatentAttention.new_cache]) holds per
    token only the latent and the rotated RoPE key. The projections, and the Hugging Face
    names `from_hf` copies them from, are tabled on the reference page.

    Args:
        d_model: Features per token, of the input and of the output.
        num_heads: Attention heads.
        q_lora_rank: Rank of the low-rank query projection; None for a full `q_proj`.
        kv_lora_rank: Features of the cached latent $c^{KV}$.
        qk_nope_head_dim: Features per head of the query/key part without RoPE.
        qk_rope_head_dim: Features of the RoPE part of each query head and of the shared
            RoPE key; even.
        v_head_dim: Features per value head.
        rope: How the RoPE part turns ([`Rope`][attnlab.rules.rope.Rope]: base, layout,
            `scaling` such as DeepSeek-V3's YaRN); by default DeepSeek's `"interleaved"`
            layout. It rotates all `qk_rope_head_dim` features (`rope.dims` None or that).
            None rotates nothing (NoPE, Kimi Linear's MLA: the part stays a shared key).
        softmax_scale: Factor on the scores; default `qk_head_dim ** -0.5`
            (see [`mla_softmax_scale`][attnlab.layers.mla.mla_softmax_scale] for YaRN).
        bias: Whether `q_down`, `kv_down` and `out_proj` have a bias.
        norm_eps: Epsilon of the two RMSNorms.
        dropout: Probability of dropping an attention weight, in training mode only.
        window: Sliding-window size of the causal mask (keys per query, itself
            included), or None; it applies with `forward(..., is_causal=True)`.
        backend: `"torch"`, `"scratch"`, `"flash"` or `"triton"` (no `attn_mask`, no dropout).

    Shapes:
        x: `(b, t, d_model)` or unbatched `(t, d_model)`. Output: the same shape.

    Raises:
        TypeError: If a size is not an int, a number is not a number, a flag not a bool
            or `rope` not a `Rope` or None.
        ValueError: If a size is not positive, `qk_rope_head_dim` is odd, `rope` does
            not fit ([`check_rope`][attnlab.rules.rope.check_rope]) or rotates fewer
            features, `dropout` is not in [0, 1) or a number is not finite, or `backend`
            is unknown.

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
        q_lora_rank: int | None = None,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        rope: Rope | None = Rope(layout="interleaved"),
        softmax_scale: float | None = None,
        bias: bool = False,
        norm_eps: float = 1e-6,
        dropout: float = 0.0,
        window: int | None = None,
        backend: Backend = "torch",
    ) -> None:
        super().__init__()
        self.rope = _check_mla_rope(rope, qk_rope_head_dim)
        self.d_model = check_positive_int("d_model", d_model)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.q_lora_rank = (
            None if q_lora_rank is None else check_positive_int("q_lora_rank", q_lora_rank)
        )
        self.kv_lora_rank = check_positive_int("kv_lora_rank", kv_lora_rank)
        self.qk_nope_head_dim = check_positive_int("qk_nope_head_dim", qk_nope_head_dim)
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = check_positive_int("v_head_dim", v_head_dim)
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        scale = check_scale("softmax_scale", softmax_scale)
        self.scale = softmax_scale_of(self.qk_head_dim, scale)  # resolved
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
            f"d_model={self.d_model}, num_heads={self.num_heads}, q_lora_rank={self.q_lora_rank}, "
            f"kv_lora_rank={self.kv_lora_rank}, qk_nope_head_dim={self.qk_nope_head_dim}, "
            f"qk_rope_head_dim={self.qk_rope_head_dim}, v_head_dim={self.v_head_dim}, "
            f"rope={self.rope}, softmax_scale={self.scale}, bias={self.bias}, dropout="
            f"{self.dropout}, window={self.window}, backend={self.backend!r}"
        )

    backend = BackendProperty()
    """Which kernel `forward` runs: a name of the registry's `BACKEND_NAMES` (checked)."""

    def new_cache(
        self,
        batch_size: int,
        max_length: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> StaticKVCache:
        """A [`StaticKVCache`][attnlab.caches.kv.StaticKVCache] for this module: one head of
        latents (`head_dim = kv_lora_rank`) as keys and RoPE keys (`v_head_dim =
        qk_rope_head_dim`) as values, on the parameters' dtype and device unless given."""
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

    def check_cache(
        self, cache: object, *, name: str = "cache", owner: str = "", optional: bool = True
    ) -> KVCache | None:
        """Return `cache` (or None, when `optional`) if it is this module's latent cache;
        raise TypeError naming what it needs otherwise (`owner` is unused: one message)."""
        return _check_latent_cache(self, cache, name, optional)

    # -- computation ---------------------------------------------------------------------

    def rope_tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """RoPE's `(cos, sin)` for integer `positions` (not checked), `(..., t,
        qk_rope_head_dim / 2)` each: built once per forward, for the queries and the keys."""
        rope, dims = self.rope, self.qk_rope_head_dim
        if rope is None:
            raise ValueError("this MultiHeadLatentAttention has rope=None: no tables to build")
        return rope_cos_sin(positions, dims, base=rope.base, scaling=rope.scaling)

    def queries(self, x: Tensor, cos: Tensor | None, sin: Tensor | None) -> tuple[Tensor, Tensor]:
        """The queries of tokens `x` `(b, t, d_model)`, rotated by the tables of
        [`rope_tables`][attnlab.layers.mla.MultiHeadLatentAttention.rope_tables] (nothing
        checked): the part without RoPE `(b, h, t, qk_nope_head_dim)` and the rotated part
        `(b, h, t, qk_rope_head_dim)`."""
        if self.q_proj is not None:
            q = self.q_proj(x)  # (b, t, h * qk_head_dim)
        else:
            assert self.q_down is not None
            assert self.q_norm is not None
            assert self.q_up is not None
            q = self.q_up(self.q_norm(self.q_down(x)))  # (b, t, h * qk_head_dim)
        q = split_heads(q, self.num_heads)  # (b, h, t, qk_head_dim)
        q_nope, q_rope = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], -1)
        return q_nope, _rotate(q_rope, cos, sin, self.rope)  # (b,h,t,d_nope), (b,h,t,d_rope)

    def latents(self, x: Tensor, cos: Tensor | None, sin: Tensor | None) -> tuple[Tensor, Tensor]:
        """What MLA's cache keeps of `x`, as `queries` takes it: the normed latent
        `(b, 1, t, kv_lora_rank)` and the rotated key `(b, 1, t, qk_rope_head_dim)` that
        every head shares."""
        latent = self.kv_down(x).unsqueeze(1)  # (b, 1, t, r + d_rope)
        c_kv, k_rope = torch.split(latent, [self.kv_lora_rank, self.qk_rope_head_dim], -1)
        return self.kv_norm(c_kv), _rotate(k_rope, cos, sin, self.rope)  # (b,1,t,r), (b,1,t,d_r)

    def up_weights(self) -> tuple[Tensor, Tensor]:
        """`kv_up`'s weight split per head, as views: W_UK `(h, d_nope, r)` and W_UV
        `(h, d_v, r)`, which the absorbed form folds into the queries and the output."""
        w = self.kv_up.weight.view(
            self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank
        )  # (h, d_nope + d_v, r)
        w_uk, w_uv = torch.split(w, [self.qk_nope_head_dim, self.v_head_dim], 1)
        return w_uk, w_uv

    def absorbed_qk(
        self, q_nope: Tensor, q_rope: Tensor, c_kv: Tensor, k_rope: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The absorbed form's queries `(b, h, t, r + d_rope)`, W_UK folded in, and keys
        `(b, 1, s, r + d_rope)`, the latents themselves (from `queries` and `latents` or a
        cache): their dot products are MLA's scores."""
        w_uk, _ = self.up_weights()
        # q_nope . (W_UK c) = (W_UK^T q_nope) . c: move W_UK onto the query side, once per
        # query instead of once per cached token and head.
        q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # (b, h, t, r)
        q = torch.cat([q_latent, q_rope], dim=-1)  # (b, h, t, r + d_rope)
        k = torch.cat([c_kv, k_rope], dim=-1)  # (b, 1, s, r + d_rope): one shared head
        return q, k

    def _attend_naive(
        self, q: tuple[Tensor, Tensor], kv: tuple[Tensor, Tensor], mask: Tensor | None, causal: bool
    ) -> Tensor:
        """Expand the latents into per-head keys and values; heads `(b, h, t, v_head_dim)`."""
        (q_nope, q_rope), (c_kv, k_rope) = q, kv
        b, _, s, _ = c_kv.shape
        kv_heads = split_heads(self.kv_up(c_kv.squeeze(1)), self.num_heads)  # (b, h, s, d_nope+d_v)
        k_nope, v = torch.split(kv_heads, [self.qk_nope_head_dim, self.v_head_dim], -1)
        k = torch.cat([k_nope, k_rope.expand(b, self.num_heads, s, -1)], dim=-1)  # (b,h,s,d_qk)
        q_full = torch.cat([q_nope, q_rope], dim=-1)  # (b, h, t, qk_head_dim)
        return self._attend(q_full, k, v, mask, causal)  # (b, h, t, d_v)

    def _attend_absorbed(
        self, q: tuple[Tensor, Tensor], kv: tuple[Tensor, Tensor], mask: Tensor | None, causal: bool
    ) -> Tensor:
        """Attend over the latents themselves; heads `(b, h, t, v_head_dim)`."""
        q_abs, k = self.absorbed_qk(*q, *kv)  # (b, h, t, r + d_rope), (b, 1, s, r + d_rope)
        c_kv, (_, w_uv) = kv[0], self.up_weights()
        # Multi-query attention whose values are the latents; W_UV comes after the sum.
        b, h, t, _ = q_abs.shape
        if mask is None and not (causal and needs_mask(t, k.shape[2], window=self.window)):
            # Every query sees every key (a decode step, or no mask at all): fold the heads
            # into the query length, one "head" of h * t rows over the one latent head
            # (FlashMLA's layout). enable_gqa would copy the shared head h times on CPU.
            q_abs = q_abs.reshape(b, 1, h * t, q_abs.shape[-1])  # (b, 1, h * t, r + d_rope)
            o_latent = self._attend(q_abs, k, c_kv, None, False).view(b, h, t, -1)  # (b,h,t,r)
        else:
            o_latent = self._attend(q_abs, k, c_kv, mask, causal)  # (b, h, t, r)
        return torch.einsum("bhtr,hvr->bhtv", o_latent, w_uv)  # (b, h, t, d_v)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """Both forms' attention, on the module's backend; causal in absolute positions."""
        # The queries are the last t of the s cached tokens.
        window = self.window if causal else None
        rule = ScoreRule(scale=self.scale, is_causal=causal, align="bottom-right", window=window)
        dropout_p = self.dropout if self.training else 0.0
        gqa = q.shape[1] != k.shape[1]  # h query heads over the one latent head
        return attend(
            self.backend, q, k, v, rule, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa
        )

    @entry
    def forward(
        self,
        x: Tensor,
        *,
        absorb: bool = False,
        positions: Tensor | None = None,
        position_embeddings: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = True,
    ) -> Tensor:
        """Attend from the tokens of `x` to themselves and to the cached ones.

        With a `cache`, the latents and RoPE keys of `x` are appended to it first, and
        the queries attend to all `s = cache.length` tokens it then holds (`x` last). The
        other arguments are [`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention]'s,
        with its rules, checked once, here (the cache checks its own append).

        Args:
            x: Tokens, `(b, t, d_model)` or `(t, d_model)`.
            absorb: Attend over the latents directly (decode form) instead of expanding
                them into per-head keys and values (training form); when every query sees
                every key, as FlashMLA: `num_heads * t` query rows over one latent head.
            positions: Integer RoPE positions of the tokens of `x`, `(t,)`, `(1, t)` or
                `(b, t)`; default `cache.seen + arange(t)`, or `arange(t)` without a cache.
            position_embeddings: RoPE's `(cos, sin)` instead of `positions`, computed once
                for all layers by `rope_tables` or Hugging Face's rotary embedding.
            cache: This module's latent cache, e.g. from `new_cache`; updated in place.
            attn_mask: Bool mask (True = attend) or float mask added to the scores,
                broadcastable to `(b, num_heads, t, s)`; combined with the causal one.
            is_causal: Hide from each query the keys after it, in absolute positions (`x`
                are the last `t` of the `s` tokens); the module's `window` applies with it.

        Returns:
            `(b, t, d_model)` or `(t, d_model)`.

        Raises:
            TypeError: If `x` is not a floating-point tensor, `positions` not an integer
                tensor, `cache` not this module's latent cache (e.g. a grouped-query
                layer's), the mask has a wrong dtype or a flag is not a bool.
            ValueError: If `x`, `positions` or `position_embeddings` do not fit (rank,
                features, dtype, device, shape, a negative position, or both given); the
                cache cannot take the new latents (batch size, dtype, device, room); the
                mask does not broadcast; the module has a window and `is_causal` is False;
                or `backend="flash"` (`"triton"`) gets a mask or dropout.
        """
        if checking():
            _check_call(
                self, x, (positions, position_embeddings), cache, attn_mask, is_causal, absorb
            )
        # Before the projections and the cache's append: a call flash cannot serve leaves
        # the cache as it was.
        dropout_p = self.dropout if self.training else 0.0
        check_backend_call(self.backend, attn_mask=attn_mask, dropout_p=dropout_p)
        unbatched = x.ndim == 2
        if unbatched:
            x = x.unsqueeze(0)  # (1, t, d_model)
        if position_embeddings is None and self.rope is not None:
            if positions is None:
                past = 0 if cache is None else cache.seen
                positions = default_positions(past, x.shape[1], x.device)  # (t,)
            position_embeddings = self.rope_tables(positions)
        cos, sin = (None, None) if position_embeddings is None else position_embeddings
        q = self.queries(x, cos, sin)  # (b, h, t, d_nope), (b, h, t, d_rope)
        kv = self.latents(x, cos, sin)  # (b, 1, t, r), (b, 1, t, d_rope)
        if cache is not None:
            kv = cache.update(*kv)  # (b, 1, s, r), (b, 1, s, d_rope)
        attend_heads = self._attend_absorbed if absorb else self._attend_naive
        heads = attend_heads(q, kv, attn_mask, is_causal)  # (b, h, t, d_v)
        out: Tensor = self.out_proj(merge_heads(heads))  # (b, t, d_model)
        return out[0] if unbatched else out

    @classmethod
    def from_hf(cls, layer: nn.Module, *, ignore: Sequence[str] = ()) -> MultiHeadLatentAttention:
        """A `MultiHeadLatentAttention` with the weights of a Hugging Face MLA layer: any
        with the structure of `DeepseekV3Attention` (DeepSeek-V2/V3, GLM-4 MoE Lite,
        Kimi Linear's, which takes no position embeddings: copied with `rope=None`). What
        it copies and refuses is tabled on the reference page; `ignore` names extra parts
        the caller ports itself (`("indexer",)` for
        [`DeepSeekSparseAttention.from_hf`][attnlab.layers.sparse.DeepSeekSparseAttention.from_hf]).

        Raises:
            TypeError: If `layer` does not have that structure (the message says how it
                differs), or `ignore` is not a sequence of names.
            ValueError: If its RoPE frequencies change with the sequence length, or
                `ignore` names a part the layer does not have (or one this copy needs).
        """
        from attnlab.models import interop  # a folder above this one: imported when called

        return interop.mla_from_hf(cls, layer, ignore=ignore)
