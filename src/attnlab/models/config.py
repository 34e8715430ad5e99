r"""What a [`Decoder`][attnlab.models.decoder.Decoder] is made of: its configuration.

One frozen dataclass holds every size and every variant of the decoders attnlab runs
(Llama, Mistral, Qwen2, SmolLM2 and SmolLM3, Gemma 2, 3 and 4, Qwen3-Next, Kimi Linear,
Llama 4); `from_hf` reads it from a `transformers` config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import torch

from attnlab.caches.kv import kv_cache_bytes
from attnlab.caches.shared import KVSource
from attnlab.layers.linear import DeltaGates
from attnlab.layers.mlp import Activation, MoEConfig
from attnlab.layers.norms import QK_NORMS, QKNorm
from attnlab.rules._validation import (
    check_bool,
    check_choice,
    check_multiple,
    check_positive_float,
    check_positive_int,
    check_softcap,
)
from attnlab.rules.rope import RopeLayout, check_base, check_rope_dims
from attnlab.rules.rope_scaling import RopeScaling
from attnlab.rules.scores import check_temperature

__all__ = [
    "FAMILIES",
    "LAYER_KINDS",
    "DecoderConfig",
    "Family",
    "GlobalAttentionConfig",
    "LatentAttentionConfig",
    "LinearAttentionConfig",
    "decoder_cache_bytes",
]

CacheKind = Literal["static", "dynamic", "int8", "int4"]
CACHE_KINDS: tuple[CacheKind, ...] = ("static", "dynamic", "int8", "int4")
FamilyName = Literal["llama", "gemma", "gemma4", "qwen3_next"]
LayerKind = Literal["full", "sliding", "linear"]


@dataclass(frozen=True)
class Family:
    r"""What sets one family of decoders apart from Llama's block: data, not branches.

    A [`Decoder`][attnlab.models.decoder.Decoder] reads these fields where Llama, Gemma and
    Qwen3-Next differ; the sizes and the layer pattern (which layers slide, which are
    linear) differ between models of one family, so they live in
    [`DecoderConfig`][attnlab.models.config.DecoderConfig].

    Attributes:
        name: The `DecoderConfig.family` that picks it.
        norm_unit_offset: Every RMSNorm (QK-norm's too) scales by `1 + weight`, not `weight`.
        embed_scale: The embedding is multiplied by $\sqrt{d_\text{model}}$.
        mlp_activation: The gate of the MLP: `"silu"` (SwiGLU) or `"gelu_tanh"` (GeGLU).
        sandwich_norms: The outputs of the attention and the MLP are normalised too before
            they are added, four norms per block.
        value_norm: The attention normalises each value head by an RMSNorm without weight
            (with QK-norm; [`QKNormSpec`][attnlab.layers.norms.QKNormSpec]'s `values`).
        layer_scale: Each block multiplies its output (the whole residual stream) by a
            learned scalar, the buffer `layer_scalar`.
    """

    name: FamilyName
    norm_unit_offset: bool = False
    embed_scale: bool = False
    mlp_activation: Activation = "silu"
    sandwich_norms: bool = False
    value_norm: bool = False
    layer_scale: bool = False


FAMILIES: Mapping[FamilyName, Family] = MappingProxyType(
    {
        "llama": Family("llama"),
        "gemma": Family(
            "gemma",
            norm_unit_offset=True,
            embed_scale=True,
            mlp_activation="gelu_tanh",
            sandwich_norms=True,
        ),
        "gemma4": Family(
            "gemma4",
            embed_scale=True,
            mlp_activation="gelu_tanh",
            sandwich_norms=True,
            value_norm=True,
            layer_scale=True,
        ),
        "qwen3_next": Family("qwen3_next", norm_unit_offset=True),
    }
)
"""Each family's differences from Llama's block, by `DecoderConfig.family`."""

LAYER_KINDS: tuple[LayerKind, ...] = ("full", "sliding", "linear")
"""What a block of a [`Decoder`][attnlab.models.decoder.Decoder] mixes its tokens with: full
causal attention, sliding-window attention, or a linear-attention
[`GatedDeltaNet`][attnlab.layers.linear.GatedDeltaNet]."""


@dataclass(frozen=True)
class LinearAttentionConfig:
    """Sizes of the [`GatedDeltaNet`][attnlab.layers.linear.GatedDeltaNet] layers of a hybrid
    [`Decoder`][attnlab.models.decoder.Decoder] (Qwen3-Next's `linear_*` settings).

    Attributes:
        num_k_heads: Query/key heads (`linear_num_key_heads`).
        num_v_heads: Value heads, a multiple of `num_k_heads` (`linear_num_value_heads`).
        head_k_dim: Features per query/key head (`linear_key_head_dim`).
        head_v_dim: Features per value head (`linear_value_head_dim`).
        kernel_size: Taps of the short causal convolution (`linear_conv_kernel_dim`).
        chunk_size: Tokens per chunk of the delta rule in prefill.
        gates: How the layers compute their decay and output gate
            ([`DeltaGates`][attnlab.layers.linear.DeltaGates]): Qwen3-Next's by default,
            Kimi Delta Attention's per-channel decay for Kimi Linear.
    """

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    kernel_size: int = 4
    chunk_size: int = 64
    gates: DeltaGates = field(default_factory=DeltaGates)

    def __post_init__(self) -> None:
        for name in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"):
            check_positive_int(name, getattr(self, name))
        check_positive_int("kernel_size", self.kernel_size)
        check_positive_int("chunk_size", self.chunk_size)
        check_multiple("num_v_heads", self.num_v_heads, "num_k_heads", self.num_k_heads)
        if not isinstance(self.gates, DeltaGates):
            raise TypeError(f"gates must be a DeltaGates, got {type(self.gates).__name__}")


@dataclass(frozen=True)
class GlobalAttentionConfig:
    """How the global (full-attention) layers of a local/global stack differ from its
    sliding-window layers (Gemma 4's `global_head_dim`, `num_global_key_value_heads`,
    `attention_k_eq_v`).

    Attributes:
        head_dim: Features per head of the global layers.
        num_kv_heads: Their key/value heads, a divisor of `num_heads`.
        keys_are_values: Their values are the keys' projection (no `v_proj`:
            [`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention]'s
            `kv="keys"`).
    """

    head_dim: int
    num_kv_heads: int
    keys_are_values: bool = False

    def __post_init__(self) -> None:
        check_positive_int("global_attention.head_dim", self.head_dim)
        check_positive_int("global_attention.num_kv_heads", self.num_kv_heads)
        check_bool("global_attention.keys_are_values", self.keys_are_values)


@dataclass(frozen=True)
class LatentAttentionConfig:
    """Sizes of the [`MultiHeadLatentAttention`][attnlab.layers.mla.MultiHeadLatentAttention]
    that replaces grouped-query attention in every attention block of a
    [`Decoder`][attnlab.models.decoder.Decoder] (Kimi Linear's full layers).

    Attributes:
        kv_lora_rank: Features of the cached latent.
        qk_nope_head_dim: Query/key features per head taken from the latent.
        qk_rope_head_dim: Features of the key part every head shares (DeepSeek rotates
            it; Kimi Linear, the one model ported with it, does not).
        v_head_dim: Features per value head.
        q_lora_rank: Rank of a low-rank query projection; None for a full one.
    """

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            check_positive_int(name, getattr(self, name))
        if self.q_lora_rank is not None:
            check_positive_int("q_lora_rank", self.q_lora_rank)


@dataclass(frozen=True)
class DecoderConfig:
    """Sizes and settings of a [`Decoder`][attnlab.models.decoder.Decoder].

    Attributes:
        vocab_size: Distinct tokens.
        d_model: Features per token in the residual stream (`hidden_size`).
        num_layers: Blocks.
        num_heads: Query heads per layer.
        num_kv_heads: Key/value heads per layer, a divisor of `num_heads`.
        head_dim: Features per head.
        hidden_dim: Width of the SwiGLU MLP (`intermediate_size`).
        rope_base: RoPE's base $\\theta$ (`rope_theta`).
        rope_scaling: RoPE's context extension
            ([`RopeScaling`][attnlab.rules.rope_scaling.RopeScaling], e.g. Llama 3.1's `"llama3"`),
            or None.
        norm_eps: The epsilon of every RMSNorm.
        max_positions: Longest sequence the model handles (`max_position_embeddings`).
        tie_embeddings: Whether the unembedding is the embedding matrix.
        qkv_bias: Bias on the query, key and value projections (Qwen2).
        out_bias: Bias on the attention's output projection.
        mlp_bias: Bias on the MLP's projections.
        windows: Per layer, its sliding-window size or None (full causal attention);
            None: every layer full.
        local_rope_base: RoPE's base in the sliding-window layers, with
            `local_rope_scaling` (Gemma 3: $10^4$ and none, its global layers $10^6$ and
            linear scaling); None: they rotate as the global layers do.
        local_rope_scaling: The sliding-window layers' context extension, with
            `local_rope_base`.
        query_pre_attn_scalar: Scores are scaled by its $-1/2$ power instead of
            `head_dim`'s (Gemma); None: `head_dim`.
        qk_norm: QK-norm in every layer (`"head"`: Qwen3, Gemma 3; `"projection"`:
            OLMo 2), with `norm_eps`; None for none.
        attn_softcap: Logit softcapping of every layer's scores, $c \\tanh(x / c)$
            (Gemma 2: 50); the layers then run attnlab's own kernel
            (`backend="scratch"`: PyTorch's has no softcap).
        final_softcap: The same cap on the output logits (Gemma 2: 30).
        family: `"llama"`; `"gemma"`: norms scaling by `1 + weight` (QK-norm's too),
            the embedding times $\\sqrt{d_\\text{model}}$, a tanh-GELU gate and four
            norms per block; `"qwen3_next"`: Llama's block with norms scaling by
            `1 + weight` (QK-norm's too). Each name's differences are a
            [`Family`][attnlab.models.config.Family] in
            [`FAMILIES`][attnlab.models.config.FAMILIES] (`traits`).
        layer_kinds: Per layer, `"full"`, `"sliding"` (needs its entry in `windows`) or
            `"linear"` (a [`GatedDeltaNet`][attnlab.layers.linear.GatedDeltaNet] of sizes
            `linear`); None: `"sliding"` where `windows` gives a window, else `"full"`.
        linear: The sizes of the linear-attention layers; needed if any layer is
            `"linear"`.
        attn_output_gate: The attention layers gate their heads by a sigmoid before the
            output projection (Qwen3-Next; the `output_gate` of
            [`HeadGates`][attnlab.layers.gqa.HeadGates]).
        rope_dims: Features of each head that RoPE rotates (partial RoPE, Qwen3-Next's
            `partial_rotary_factor`); None: all `head_dim`.
        moe: The sizes of a mixture-of-experts MLP ([`SparseMoE`][attnlab.layers.mlp.SparseMoE]);
            None: every MLP a SwiGLU of `hidden_dim`.
        moe_layers: Per layer, whether its MLP is the mixture of experts (the others
            are SwiGLUs of `hidden_dim`); None with `moe`: every layer.
        rope_layers: Per layer, whether its attention rotates queries and keys by RoPE;
            False makes it a NoPE layer, which sees positions only through the causal
            mask (SmolLM3's `no_rope_layers`: every fourth layer). None: every layer.
        rope_layout: How RoPE pairs a head's features, `"half"` (Llama, most models) or
            `"interleaved"` (Llama 4's complex-number rotation).
        chunks: Per layer, the size of its attention chunks (Llama 4's
            `attention_chunk_size` on its RoPE layers: a query sees the keys of its own
            chunk up to itself, [`masks.chunked`][attnlab.rules.masks.chunked]) or None.
        temperature: Llama 4's attention temperature tuning `(floor_scale, attn_scale)` in
            the layers that do not rotate (ScoreRule's `temperature`); None for none.
        global_attention: The sizes of the global layers where they differ from the
            sliding ones ([`GlobalAttentionConfig`][attnlab.models.config.GlobalAttentionConfig]:
            Gemma 4); None: every layer has `num_kv_heads` and `head_dim`.
        kv_sources: Per layer, the earlier layer whose keys and values it reads instead of
            computing its own (KV sharing: Gemma 4's last `num_kv_shared_layers` layers
            read the last earlier layer of their kind), or None; the source must be of
            the same kind, window, sizes and RoPE, and compute its own. None: none shares.
        latent: The sizes of latent attention (MLA) in every attention block instead of
            grouped-query attention; None for none. Only without RoPE (every entry of
            `rope_layers` False: Kimi Linear's MLA), and without QK-norm, softcap or
            output gate.
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_dim: int
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    max_positions: int = 2048
    tie_embeddings: bool = True
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    windows: tuple[int | None, ...] | None = None
    rope_scaling: RopeScaling | None = None
    local_rope_base: float | None = None
    local_rope_scaling: RopeScaling | None = None
    query_pre_attn_scalar: float | None = None
    qk_norm: QKNorm | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    family: FamilyName = "llama"
    layer_kinds: tuple[LayerKind, ...] | None = None
    linear: LinearAttentionConfig | None = None
    attn_output_gate: bool = False
    rope_dims: int | None = None
    moe: MoEConfig | None = None
    moe_layers: tuple[bool, ...] | None = None
    rope_layers: tuple[bool, ...] | None = None
    rope_layout: RopeLayout = "half"
    chunks: tuple[int | None, ...] | None = None
    temperature: tuple[float, float] | None = None
    latent: LatentAttentionConfig | None = None
    global_attention: GlobalAttentionConfig | None = None
    kv_sources: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "d_model",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "hidden_dim",
            "max_positions",
        ):
            check_positive_int(name, getattr(self, name))
        for name in ("tie_embeddings", "qkv_bias", "out_bias", "mlp_bias"):
            check_bool(name, getattr(self, name))
        check_base(self.rope_base, "rope_base")
        for name in ("rope_scaling", "local_rope_scaling"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, RopeScaling):
                raise TypeError(f"{name} must be a RopeScaling or None, got {type(value).__name__}")
        if self.local_rope_base is not None:
            check_base(self.local_rope_base, "local_rope_base")
        elif self.local_rope_scaling is not None:
            raise ValueError(
                "local_rope_scaling needs local_rope_base (else local layers "
                "rotate as the global ones do)"
            )
        if self.query_pre_attn_scalar is not None:
            check_positive_float("query_pre_attn_scalar", self.query_pre_attn_scalar)
        if self.qk_norm is not None and self.qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm must be one of {QK_NORMS} or None, got {self.qk_norm!r}")
        check_softcap("attn_softcap", self.attn_softcap)
        check_softcap("final_softcap", self.final_softcap)
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {tuple(FAMILIES)}, got {self.family!r}")
        check_positive_float("norm_eps", self.norm_eps)
        if self.out_bias and not self.qkv_bias:
            raise ValueError(
                "out_bias=True needs qkv_bias=True (a bias on o_proj only is not built)"
            )
        if self.windows is not None and len(self.windows) != self.num_layers:
            raise ValueError(
                f"windows must give one entry per layer, got {len(self.windows)} for "
                f"num_layers={self.num_layers}"
            )
        self._check_hybrid()

    def _check_hybrid(self) -> None:
        """The per-layer kinds, the linear layers' sizes, partial RoPE and the MoE."""
        check_bool("attn_output_gate", self.attn_output_gate)
        kinds = self.layer_kinds
        if kinds is not None:
            if len(kinds) != self.num_layers:
                raise ValueError(
                    f"layer_kinds must give one entry per layer, got {len(kinds)} for "
                    f"num_layers={self.num_layers}"
                )
            for i, kind in enumerate(kinds):
                if kind not in LAYER_KINDS:
                    raise ValueError(f"layer_kinds[{i}] must be one of {LAYER_KINDS}, got {kind!r}")
                if (kind == "sliding") != (self.window(i) is not None):
                    raise ValueError(
                        f"layer_kinds[{i}]={kind!r} but windows[{i}]={self.window(i)}: a "
                        "'sliding' layer needs a window and only a sliding layer has one"
                    )
        if self.linear is not None and not isinstance(self.linear, LinearAttentionConfig):
            raise TypeError(
                f"linear must be a LinearAttentionConfig or None, got {type(self.linear).__name__}"
            )
        if self.linear is None and kinds is not None and "linear" in kinds:
            raise ValueError("layer_kinds has 'linear' layers: give their sizes in linear=")
        if self.rope_dims is not None:
            check_rope_dims(self.rope_dims, self.head_dim)
        if self.moe is not None and not isinstance(self.moe, MoEConfig):
            raise TypeError(f"moe must be a MoEConfig or None, got {type(self.moe).__name__}")
        if self.moe_layers is not None and self.moe is None:
            raise ValueError("moe_layers needs moe= (the experts' sizes)")
        for name in ("moe_layers", "rope_layers"):
            flags = getattr(self, name)
            if flags is None:
                continue
            if not isinstance(flags, tuple):
                raise TypeError(
                    f"{name} must be a tuple of bools (one per layer) or None, "
                    f"got {type(flags).__name__}"
                )
            if len(flags) != self.num_layers:
                raise ValueError(
                    f"{name} must give one entry per layer, got {len(flags)} "
                    f"for num_layers={self.num_layers}"
                )
            for i, flag in enumerate(flags):
                check_bool(f"{name}[{i}]", flag)
        self._check_latent()
        self._check_llama4()
        _check_sharing(self)

    def heads(self, layer: int) -> tuple[int, int]:
        """`(num_kv_heads, head_dim)` of block `layer`: `global_attention`'s on a global
        layer, if given."""
        g = self.global_attention
        if g is None or self.window(layer) is not None:
            return self.num_kv_heads, self.head_dim
        return g.num_kv_heads, g.head_dim

    def kv_source(self, layer: int) -> int | None:
        """The layer whose keys and values block `layer` reads, or None (its own)."""
        return None if self.kv_sources is None else self.kv_sources[layer]

    def kv(self, layer: int) -> KVSource:
        """Where block `layer`'s attention takes its keys and values from
        ([`KVSource`][attnlab.caches.shared.KVSource])."""
        if self.kv_source(layer) is not None:
            return "shared"
        g = self.global_attention
        if g is not None and g.keys_are_values and self.window(layer) is None:
            return "keys"
        return "projected"

    def _check_llama4(self) -> None:
        """RoPE's layout, chunked layers and temperature tuning."""
        check_choice("rope_layout", self.rope_layout, ("half", "interleaved"))
        if self.chunks is not None:
            if len(self.chunks) != self.num_layers:
                raise ValueError(
                    f"chunks must give one entry per layer, got {len(self.chunks)} for "
                    f"num_layers={self.num_layers}"
                )
            for i, chunk in enumerate(self.chunks):
                if chunk is not None:
                    check_positive_int(f"chunks[{i}]", chunk)
        check_temperature("temperature", self.temperature)

    def chunk(self, layer: int) -> int | None:
        """The attention chunk size of block `layer`, or None."""
        return None if self.chunks is None else self.chunks[layer]

    def _check_latent(self) -> None:
        """Latent attention: its sizes, and none of what MLA does not do here."""
        latent = self.latent
        if latent is None:
            return
        if not isinstance(latent, LatentAttentionConfig):
            raise TypeError(
                f"latent must be a LatentAttentionConfig or None, got {type(latent).__name__}"
            )
        if self.rope_layers is None or any(self.rope_layers):
            raise ValueError(
                "latent attention in a Decoder rotates nothing (Kimi Linear's MLA): give "
                "rope_layers=(False,) * num_layers"
            )
        unsupported = {
            "qk_norm": self.qk_norm,
            "attn_softcap": self.attn_softcap,
            "attn_output_gate": self.attn_output_gate or None,
            "temperature": self.temperature,
            "query_pre_attn_scalar": self.query_pre_attn_scalar,
            "rope_layout": None if self.rope_layout == "half" else self.rope_layout,
            "out_bias": None if self.out_bias == self.qkv_bias else self.out_bias,
        }
        given = [f"{k}={v!r}" for k, v in unsupported.items() if v is not None]
        if given:
            raise ValueError(f"latent attention has no {', '.join(given)}")

    def kind(self, layer: int) -> LayerKind:
        """What block `layer` mixes tokens with: `"full"`, `"sliding"` or `"linear"`."""
        if self.layer_kinds is not None:
            return self.layer_kinds[layer]
        return "full" if self.window(layer) is None else "sliding"

    def is_moe(self, layer: int) -> bool:
        """Whether block `layer`'s MLP is the mixture of experts."""
        return self.moe is not None and (self.moe_layers is None or self.moe_layers[layer])

    def window(self, layer: int) -> int | None:
        """The sliding-window size of block `layer`, or None for full causal attention."""
        return None if self.windows is None else self.windows[layer]

    def rope(self, layer: int) -> tuple[float, RopeScaling | None] | None:
        """RoPE's base and context extension in block `layer` (local or global), or None
        for a NoPE layer."""
        if self.rope_layers is not None and not self.rope_layers[layer]:
            return None
        if self.window(layer) is not None and self.local_rope_base is not None:
            return self.local_rope_base, self.local_rope_scaling
        return self.rope_base, self.rope_scaling

    @property
    def traits(self) -> Family:
        """What the block of this config's `family` does differently from Llama's."""
        return FAMILIES[self.family]

    @property
    def scale(self) -> float | None:
        """The factor of the attention scores, or None for `head_dim ** -0.5`."""
        qpas = self.query_pre_attn_scalar
        return None if qpas is None else float(qpas) ** -0.5

    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain dict, e.g. for a JSON record."""
        return asdict(self)

    @classmethod
    def from_hf(cls, config: Any) -> DecoderConfig:
        """The settings of a Hugging Face Llama, Mistral, Qwen2, SmolLM3, Gemma 2,
        Gemma 3, Gemma 4, Qwen3-Next, Kimi Linear or Llama 4 (text) config.

        Gemma 4 gives `global_attention` (its global layers' sizes and keys as values)
        and `kv_sources` (each of its last `num_kv_shared_layers` layers reads the last
        earlier layer of its type); its per-layer input embeddings, experts and
        double-wide MLPs are refused unless off.

        SmolLM3's `no_rope_layers` gives `rope_layers` (its NoPE layers). Kimi Linear
        gives `latent` (its MLA layers, which rotate nothing: `rope_layers` all False)
        and Kimi Delta Attention's gates in `linear`; its mixture of experts is refused.

        Gemma 3's `rope_parameters` hold one entry per layer type: `"full_attention"`
        gives `rope_base` and `rope_scaling`, `"sliding_attention"` `local_rope_base`
        and `local_rope_scaling`; `layer_types` gives `windows`.

        RoPE's context extension comes from
        [`RopeScaling.from_hf`][attnlab.rules.rope_scaling.RopeScaling.from_hf]. With `"dynamic"`,
        `max_position_embeddings` is the context of pre-training that the rule stretches,
        so `max_positions` is `factor` times it (the length the rule is meant for);
        the other rules' configs already give the extended length.

        Raises:
            ValueError: If the config uses a RoPE type `RopeScaling` does not implement
                (e.g. `"longrope"`) or an activation other than SiLU.
        """
        from attnlab.models import hf_config  # it imports this module: imported when called

        return hf_config.config_from_hf(cls, config)


def _check_sharing(config: DecoderConfig) -> None:
    """The checks of `config.global_attention` and `config.kv_sources` (Gemma 4), by name."""
    g = config.global_attention
    if g is not None:
        if not isinstance(g, GlobalAttentionConfig):
            raise TypeError(
                f"global_attention must be a GlobalAttentionConfig or None, got {type(g).__name__}"
            )
        check_multiple(
            "num_heads", config.num_heads, "global_attention.num_kv_heads", g.num_kv_heads
        )
        if config.rope_dims is not None:
            raise ValueError("global_attention with rope_dims is not built (give rope_dims=None)")
    if config.traits.value_norm and config.qk_norm != "head":
        raise ValueError(
            f"family={config.family!r} normalises values with QK-norm: give qk_norm='head'"
        )
    sources = config.kv_sources
    if sources is None:
        return
    if not isinstance(sources, tuple):
        raise TypeError(
            "kv_sources must be a tuple (one entry per layer) or None, got "
            f"{type(sources).__name__}"
        )
    if len(sources) != config.num_layers:
        raise ValueError(
            "kv_sources must give one entry per layer "
            f"(num_layers={config.num_layers}), got {len(sources)}"
        )
    for i, j in enumerate(sources):
        if j is None:
            continue
        if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < i:
            raise ValueError(
                f"kv_sources[{i}]={j!r} must be an earlier layer (an int in [0, {i})) or None"
            )
        if sources[j] is not None:
            raise ValueError(
                f"kv_sources[{i}]={j} reads layer {j}, which itself reads layer {sources[j]}"
            )
        differ = [
            name
            for name, of in (
                ("kind", config.kind),
                ("window", config.window),
                ("sizes", config.heads),
                ("rope", config.rope),
                ("chunk", config.chunk),
            )
            if of(i) != of(j)
        ]
        if config.kind(i) == "linear" or config.latent is not None:
            differ.append("kind: only grouped-query attention shares")
        if differ:
            raise ValueError(
                f"kv_sources[{i}]={j}: layer {i} cannot read layer {j}'s keys and values "
                f"(they differ in {', '.join(differ)})"
            )


def decoder_cache_bytes(
    config: DecoderConfig, context: int, *, dtype: torch.dtype, values_only: bool = False
) -> int:
    r"""Bytes the KV caches of a decoder's attention layers hold at `context` tokens.

    Each layer that computes its keys and values holds them for every token of the
    context (a global layer) or for its window (a sliding one, as
    [`kv_cache_bytes`][attnlab.caches.kv.kv_cache_bytes] counts), with its own key/value
    heads and head size ([`heads`][attnlab.models.config.DecoderConfig.heads]); a layer
    that reads another's (`kv_sources`) holds nothing.

    Args:
        config: The decoder's settings (its linear layers are not counted; latent
            attention is refused: its cache is a latent, not keys and values).
        context: Tokens of context.
        dtype: Element type of the caches.
        values_only: Count one tensor, not two, for a layer whose values are its keys'
            projection (`kv="keys"`): its keys are $\operatorname{RoPE}(v \odot w_k)$
            (up to rounding in low precision), since the key norm is the weightless
            value norm times its weight $w_k$, so a cache may keep the values alone
            (`transformers` keeps both).

    Returns:
        The bytes held by all layers together.

    Examples:
        >>> config = DecoderConfig(vocab_size=8, d_model=8, num_layers=3, num_heads=2,
        ...     num_kv_heads=1, head_dim=4, hidden_dim=8, kv_sources=(None, None, 1))
        >>> decoder_cache_bytes(config, 10, dtype=torch.float32)  # 2 layers * 10 * 2 * 4 * 4
        640
    """
    check_bool("values_only", values_only)
    check_positive_int("context", context)
    if config.latent is not None:
        raise ValueError("config.latent is set: an MLA cache holds latents, not keys and values")
    held = 0
    for layer in range(config.num_layers):
        if config.kind(layer) == "linear" or config.kv_source(layer) is not None:
            continue
        num_kv_heads, head_dim = config.heads(layer)
        one = values_only and config.kv(layer) == "keys"
        held += kv_cache_bytes(
            [config.window(layer)],
            context,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
        ) // (2 if one else 1)
    return held
