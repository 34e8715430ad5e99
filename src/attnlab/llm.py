r"""A Llama-family decoder built from attnlab's attention: the model file of a real LLM.

Llama (Touvron et al., 2023, https://arxiv.org/abs/2302.13971), Mistral, Qwen2 and
SmolLM2 share one architecture. Each of `num_layers` pre-norm residual blocks runs

$$
h = x + \operatorname{GQA}(\operatorname{RMSNorm}(x)), \qquad
y = h + W_{\text{down}}\big(\operatorname{silu}(W_{\text{gate}} \bar h) \odot
W_{\text{up}} \bar h\big), \quad \bar h = \operatorname{RMSNorm}(h),
$$

between a token embedding and a final RMSNorm followed by the unembedding (often tied to
the embedding). The attention is [`GroupedQueryAttention`][attnlab.gqa.GroupedQueryAttention]
with RoPE; the norms are `torch.nn.RMSNorm` and the projections plain `nn.Linear`, named
as in Hugging Face's `LlamaForCausalLM`, so [`Decoder.from_hf`][attnlab.llm.Decoder.from_hf]
copies its state dict key for key.

As in `transformers`, the RoPE tables and the mask are built once per forward and passed
to every layer, and the input is checked once, at the model's boundary; the layers run
their unchecked [`forward_impl`][attnlab.gqa.GroupedQueryAttention.forward_impl].
[`Decoder.generate`][attnlab.llm.Decoder.generate] decodes greedily or by sampling from a
static or dynamic [`KVCache`][attnlab.kv_cache.KVCache] per layer, for one prompt or a
left-padded batch; [`Decoder.stream`][attnlab.llm.Decoder.stream] yields the tokens as
they come. Real weights: [`attnlab.pretrained`][attnlab.pretrained].

The same file runs Gemma 3's text decoder (Gemma Team, 2025,
https://arxiv.org/abs/2503.19786) with `family="gemma"`: its RMSNorms scale by
$1 + w$, the embedding is multiplied by $\sqrt{d_\text{model}}$, the MLP's gate is a tanh
GELU, and each block normalises the outputs of its attention and its MLP too, four norms
in all:

$$
h = x + \operatorname{RMSNorm}(\operatorname{GQA}(\operatorname{RMSNorm}(x))), \qquad
y = h + \operatorname{RMSNorm}(\operatorname{MLP}(\operatorname{RMSNorm}(h))).
$$

Its attention normalises each query and key head (QK-norm) and scales the scores by
`query_pre_attn_scalar`$^{-1/2}$; five sliding-window layers with RoPE base $10^4$
alternate with one global layer with base $10^6$, and each sliding layer decodes from a
[`RollingKVCache`][attnlab.kv_cache.RollingKVCache] that keeps only its window. Gemma 2
(https://arxiv.org/abs/2408.00118) has the same block without QK-norm, local and global
layers one to one, and caps its scores and logits by $c \tanh(x / c)$.

A hybrid stack picks each block's token mixer (`layer_kinds`): full attention, a
sliding window, or linear attention, a [`GatedDeltaNet`][attnlab.linear.GatedDeltaNet]
that decodes from a fixed-size [`GatedDeltaNetState`][attnlab.linear.GatedDeltaNetState]
instead of a KV cache. Qwen3-Next (Qwen Team, 2025) interleaves three Gated DeltaNet
blocks with one full-attention block whose heads are gated by a sigmoid
([`GatedAttention`][attnlab.llm.GatedAttention]), rotates a quarter of each head, and
replaces the MLP by a mixture of experts with a shared expert
([`SparseMoE`][attnlab.llm.SparseMoE]); `Decoder.from_hf` ports its
`Qwen3NextForCausalLM`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._validation import (
    check_attn_mask,
    check_bool,
    check_int_sequence,
    check_multiple,
    check_padding_mask,
    check_positive_float,
    check_positive_int,
    check_softcap,
    check_token_id_set,
    check_token_ids,
    is_integer_dtype,
    is_validation_enabled,
)
from attnlab.gqa import QK_NORMS, GroupedQueryAttention, QKNorm, RMSNorm
from attnlab.kv_cache import (
    AttendingCache,
    DynamicKVCache,
    KVCache,
    RollingKVCache,
    StaticKVCache,
)
from attnlab.linear import GatedDeltaNet, GatedDeltaNetState
from attnlab.masks import combine_impl, padding_attention_mask_impl
from attnlab.rope import (
    RopeScaling,
    check_base,
    check_positions,
    check_rope_dims,
    default_positions,
    hf_rope,
    rope_cos_sin,
)

__all__ = [
    "LAYER_KINDS",
    "Decoder",
    "DecoderBlock",
    "DecoderConfig",
    "GatedAttention",
    "LinearAttentionConfig",
    "MoEConfig",
    "SparseMoE",
    "SwiGLU",
]

CacheKind = Literal["static", "dynamic"]
Family = Literal["llama", "gemma", "qwen3_next"]
LayerKind = Literal["full", "sliding", "linear"]
LayerState = KVCache | GatedDeltaNetState
LayerCache = KVCache | AttendingCache | GatedDeltaNetState
_HF_CLASSES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Qwen3NextForCausalLM",
)
_FAMILIES: tuple[Family, ...] = ("llama", "gemma", "qwen3_next")
LAYER_KINDS: tuple[LayerKind, ...] = ("full", "sliding", "linear")
"""What a block of a [`Decoder`][attnlab.llm.Decoder] mixes its tokens with: full causal
attention, sliding-window attention, or a linear-attention
[`GatedDeltaNet`][attnlab.linear.GatedDeltaNet]."""


@dataclass(frozen=True)
class LinearAttentionConfig:
    """Sizes of the [`GatedDeltaNet`][attnlab.linear.GatedDeltaNet] layers of a hybrid
    [`Decoder`][attnlab.llm.Decoder] (Qwen3-Next's `linear_*` settings).

    Attributes:
        num_k_heads: Query/key heads (`linear_num_key_heads`).
        num_v_heads: Value heads, a multiple of `num_k_heads` (`linear_num_value_heads`).
        head_k_dim: Features per query/key head (`linear_key_head_dim`).
        head_v_dim: Features per value head (`linear_value_head_dim`).
        kernel_size: Taps of the short causal convolution (`linear_conv_kernel_dim`).
        chunk_size: Tokens per chunk of the delta rule in prefill.
    """

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    kernel_size: int = 4
    chunk_size: int = 64

    def __post_init__(self) -> None:
        for name in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"):
            check_positive_int(name, getattr(self, name))
        check_positive_int("kernel_size", self.kernel_size)
        check_positive_int("chunk_size", self.chunk_size)
        check_multiple("num_v_heads", self.num_v_heads, "num_k_heads", self.num_k_heads)


@dataclass(frozen=True)
class MoEConfig:
    """Sizes of a [`SparseMoE`][attnlab.llm.SparseMoE] MLP (Qwen3-Next's, Qwen3-MoE's).

    Attributes:
        num_experts: Routed experts (`num_experts`).
        top_k: Experts per token (`num_experts_per_tok`), at most `num_experts`.
        expert_dim: Hidden width of each expert (`moe_intermediate_size`).
        shared_dim: Hidden width of the shared expert every token also runs, gated by a
            sigmoid (`shared_expert_intermediate_size`); None for no shared expert.
        norm_topk_prob: Renormalise the chosen experts' router probabilities to sum to 1.
    """

    num_experts: int
    top_k: int
    expert_dim: int
    shared_dim: int | None = None
    norm_topk_prob: bool = True

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "expert_dim"):
            check_positive_int(name, getattr(self, name))
        if self.shared_dim is not None:
            check_positive_int("shared_dim", self.shared_dim)
        check_bool("norm_topk_prob", self.norm_topk_prob)
        if self.top_k > self.num_experts:
            raise ValueError(
                f"top_k must be at most num_experts={self.num_experts}, got {self.top_k}"
            )


@dataclass(frozen=True)
class DecoderConfig:
    """Sizes and settings of a [`Decoder`][attnlab.llm.Decoder].

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
            ([`RopeScaling`][attnlab.rope.RopeScaling], e.g. Llama 3.1's `"llama3"`),
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
            `1 + weight` (QK-norm's too).
        layer_kinds: Per layer, `"full"`, `"sliding"` (needs its entry in `windows`) or
            `"linear"` (a [`GatedDeltaNet`][attnlab.linear.GatedDeltaNet] of sizes
            `linear`); None: `"sliding"` where `windows` gives a window, else `"full"`.
        linear: The sizes of the linear-attention layers; needed if any layer is
            `"linear"`.
        attn_output_gate: The attention layers gate their heads by a sigmoid before the
            output projection ([`GatedAttention`][attnlab.llm.GatedAttention],
            Qwen3-Next).
        rope_dims: Features of each head that RoPE rotates (partial RoPE, Qwen3-Next's
            `partial_rotary_factor`); None: all `head_dim`.
        moe: The sizes of a mixture-of-experts MLP ([`SparseMoE`][attnlab.llm.SparseMoE]);
            None: every MLP a SwiGLU of `hidden_dim`.
        moe_layers: Per layer, whether its MLP is the mixture of experts (the others
            are SwiGLUs of `hidden_dim`); None with `moe`: every layer.
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
    family: Family = "llama"
    layer_kinds: tuple[LayerKind, ...] | None = None
    linear: LinearAttentionConfig | None = None
    attn_output_gate: bool = False
    rope_dims: int | None = None
    moe: MoEConfig | None = None
    moe_layers: tuple[bool, ...] | None = None

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
        if self.family not in _FAMILIES:
            raise ValueError(f"family must be one of {_FAMILIES}, got {self.family!r}")
        check_positive_float("norm_eps", self.norm_eps)
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
        if self.moe_layers is not None:
            if self.moe is None:
                raise ValueError("moe_layers needs moe= (the experts' sizes)")
            if len(self.moe_layers) != self.num_layers:
                raise ValueError(
                    f"moe_layers must give one entry per layer, got {len(self.moe_layers)} "
                    f"for num_layers={self.num_layers}"
                )

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

    def rope(self, layer: int) -> tuple[float, RopeScaling | None]:
        """RoPE's base and context extension in block `layer` (local or global)."""
        if self.window(layer) is not None and self.local_rope_base is not None:
            return self.local_rope_base, self.local_rope_scaling
        return self.rope_base, self.rope_scaling

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
        """The settings of a Hugging Face Llama, Mistral, Qwen2, Gemma 2, Gemma 3 or
        Qwen3-Next config.

        Gemma 3's `rope_parameters` hold one entry per layer type: `"full_attention"`
        gives `rope_base` and `rope_scaling`, `"sliding_attention"` `local_rope_base`
        and `local_rope_scaling`; `layer_types` gives `windows`.

        RoPE's context extension comes from
        [`RopeScaling.from_hf`][attnlab.rope.RopeScaling.from_hf]. With `"dynamic"`,
        `max_position_embeddings` is the context of pre-training that the rule stretches,
        so `max_positions` is `factor` times it (the length the rule is meant for);
        the other rules' configs already give the extended length.

        Raises:
            ValueError: If the config uses a RoPE type `RopeScaling` does not implement
                (e.g. `"longrope"`) or an activation other than SiLU.
        """
        model_type = config.model_type
        if model_type in ("gemma2", "gemma3_text"):
            return cls._from_gemma(config)
        if model_type == "qwen3_next":
            return cls._from_qwen3_next(config)
        rope_base, scaling = hf_rope(config)
        max_positions = int(config.max_position_embeddings)
        if scaling is not None and scaling.is_dynamic:
            max_positions = int(max_positions * scaling.factor)
        if config.hidden_act != "silu":
            raise ValueError(f"config.hidden_act must be 'silu', got {config.hidden_act!r}")
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        qwen2 = model_type == "qwen2"
        windows: tuple[int | None, ...] | None = None
        if qwen2 and getattr(config, "use_sliding_window", False):
            windows = tuple(
                config.sliding_window if kind == "sliding_attention" else None
                for kind in config.layer_types
            )
        elif model_type == "mistral" and getattr(config, "sliding_window", None):
            windows = (int(config.sliding_window),) * config.num_hidden_layers
        attention_bias = bool(getattr(config, "attention_bias", False))
        return cls(
            vocab_size=config.vocab_size,
            d_model=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=int(head_dim),
            hidden_dim=config.intermediate_size,
            rope_base=rope_base,
            norm_eps=float(config.rms_norm_eps),
            max_positions=max_positions,
            tie_embeddings=bool(config.tie_word_embeddings),
            qkv_bias=True if qwen2 else attention_bias,
            out_bias=False if qwen2 else attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            windows=windows,
            rope_scaling=scaling,
        )

    @classmethod
    def _from_gemma(cls, config: Any) -> DecoderConfig:
        """Gemma 2 and Gemma 3 (text): the same block; Gemma 3 adds QK-norm and a RoPE
        per layer type, Gemma 2 caps its scores (Gemma 3 keeps the setting unused)."""
        if config.hidden_activation != "gelu_pytorch_tanh":
            raise ValueError(
                f"config.hidden_activation must be 'gelu_pytorch_tanh', got "
                f"{config.hidden_activation!r}"
            )
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError(
                "config.use_bidirectional_attention=True: Decoder is causal and does not port it"
            )
        kinds = {"full_attention": None, "sliding_attention": int(config.sliding_window)}
        if not set(config.layer_types) <= set(kinds):
            raise ValueError(
                f"config.layer_types must name {sorted(kinds)}, got {config.layer_types}"
            )
        gemma3 = config.model_type == "gemma3_text"
        local_base: float | None = None
        local_scaling: RopeScaling | None = None
        base, scaling = hf_rope(config, "full_attention")
        if gemma3:  # one RoPE per layer type
            local_base, local_scaling = hf_rope(config, "sliding_attention")
        bias = bool(config.attention_bias)
        return cls(
            vocab_size=config.vocab_size,
            d_model=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=int(config.head_dim),
            hidden_dim=config.intermediate_size,
            rope_base=base,
            rope_scaling=scaling,
            local_rope_base=local_base,
            local_rope_scaling=local_scaling,
            norm_eps=float(config.rms_norm_eps),
            max_positions=int(config.max_position_embeddings),
            tie_embeddings=bool(config.tie_word_embeddings),
            qkv_bias=bias,
            out_bias=bias,
            windows=tuple(kinds[kind] for kind in config.layer_types),
            query_pre_attn_scalar=float(config.query_pre_attn_scalar),
            qk_norm="head" if gemma3 else None,
            attn_softcap=None if gemma3 else config.attn_logit_softcapping,
            final_softcap=config.final_logit_softcapping,
            family="gemma",
        )

    @classmethod
    def _from_qwen3_next(cls, config: Any) -> DecoderConfig:
        """Qwen3-Next: Gated DeltaNet and gated full-attention layers (`layer_types`),
        partial RoPE, QK-norm, `1 + weight` norms, a mixture of experts with a shared
        expert in the layers `decoder_sparse_step` and `mlp_only_layers` pick."""
        if config.hidden_act != "silu":
            raise ValueError(f"config.hidden_act must be 'silu', got {config.hidden_act!r}")
        names: dict[str, LayerKind] = {"full_attention": "full", "linear_attention": "linear"}
        if not set(config.layer_types) <= set(names):
            raise ValueError(
                f"config.layer_types must name {sorted(names)}, got {config.layer_types}"
            )
        params = config.rope_parameters  # also holds partial_rotary_factor
        rope_base, scaling = hf_rope(config)
        head_dim = int(config.head_dim)
        n = config.num_hidden_layers
        moe, moe_layers = None, None
        if config.num_experts > 0:
            moe = MoEConfig(
                num_experts=config.num_experts,
                top_k=config.num_experts_per_tok,
                expert_dim=config.moe_intermediate_size,
                shared_dim=config.shared_expert_intermediate_size,
                norm_topk_prob=bool(config.norm_topk_prob),
            )
            step, dense = config.decoder_sparse_step, set(config.mlp_only_layers)
            moe_layers = tuple(i not in dense and (i + 1) % step == 0 for i in range(n))
        bias = bool(config.attention_bias)
        return cls(
            vocab_size=config.vocab_size,
            d_model=config.hidden_size,
            num_layers=n,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            hidden_dim=config.intermediate_size,
            rope_base=rope_base,
            rope_scaling=scaling,
            norm_eps=float(config.rms_norm_eps),
            max_positions=int(config.max_position_embeddings),
            tie_embeddings=bool(config.tie_word_embeddings),
            qkv_bias=bias,
            out_bias=bias,
            qk_norm="head",
            family="qwen3_next",
            layer_kinds=tuple(names[kind] for kind in config.layer_types),
            linear=LinearAttentionConfig(
                num_k_heads=config.linear_num_key_heads,
                num_v_heads=config.linear_num_value_heads,
                head_k_dim=config.linear_key_head_dim,
                head_v_dim=config.linear_value_head_dim,
                kernel_size=config.linear_conv_kernel_dim,
            ),
            attn_output_gate=True,
            rope_dims=int(head_dim * params.get("partial_rotary_factor", 1.0)),
            moe=moe,
            moe_layers=moe_layers,
        )


class SwiGLU(nn.Module):
    r"""The gated MLP of Llama: $W_{\text{down}}(\operatorname{silu}(W_{\text{gate}} x)
    \odot W_{\text{up}} x)$ (Shazeer, 2020, https://arxiv.org/abs/2002.05202).

    With `activation="gelu_tanh"` the gate is the tanh approximation of GELU (GeGLU,
    Gemma's `gelu_pytorch_tanh`).
    """

    def __init__(
        self,
        d_model: int,
        hidden_dim: int,
        *,
        bias: bool = False,
        activation: Literal["silu", "gelu_tanh"] = "silu",
    ) -> None:
        super().__init__()
        if activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"activation must be 'silu' or 'gelu_tanh', got {activation!r}")
        self.activation = activation
        self.gate_proj = nn.Linear(d_model, hidden_dim, bias=bias)
        self.up_proj = nn.Linear(d_model, hidden_dim, bias=bias)
        self.down_proj = nn.Linear(hidden_dim, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        g = self.gate_proj(x)  # (b, t, hidden_dim)
        if self.activation == "silu":
            gate = nn.functional.silu(g)
        else:
            gate = nn.functional.gelu(g, approximate="tanh")
        out: Tensor = self.down_proj(gate * self.up_proj(x))  # (b, t, d_model)
        return out


class _Experts(nn.Module):
    """The routed experts' weights, stacked as in Hugging Face (`gate_up_proj`
    `(num_experts, 2 expert_dim, d_model)`, `down_proj` `(num_experts, d_model, expert_dim)`)."""

    def __init__(self, d_model: int, num_experts: int, expert_dim: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(num_experts, 2 * expert_dim, d_model))
        self.down_proj = nn.Parameter(torch.randn(num_experts, d_model, expert_dim))
        with torch.no_grad():
            self.gate_up_proj.mul_(d_model**-0.5)
            self.down_proj.mul_(expert_dim**-0.5)

    def forward(self, x: Tensor, chosen: Tensor, weights: Tensor) -> Tensor:
        """Run each token `x` `(n, d_model)` through its `chosen` experts `(n, top_k)` and
        sum their outputs weighted by `weights` `(n, top_k)`."""
        out = torch.zeros_like(x)  # (n, d_model)
        # Only the experts some token chose run: reading which is a host sync, as in
        # Hugging Face's loop (a dense layer would run every expert on every token).
        for e in torch.unique(chosen).tolist():
            token, slot = torch.where(chosen == e)  # (m,) each
            gate, up = F.linear(x[token], self.gate_up_proj[e]).chunk(2, dim=-1)  # (m, I)
            y = F.linear(F.silu(gate) * up, self.down_proj[e])  # (m, d_model)
            out.index_add_(0, token, (y * weights[token, slot, None]).to(out.dtype))
        return out


class SparseMoE(nn.Module):
    r"""A mixture-of-experts MLP with a shared expert, as in Qwen3-Next (and Qwen2-MoE).

    A router `gate` scores the `num_experts` experts for each token; the token runs
    through its `top_k` best, SwiGLU MLPs of width `expert_dim`, whose outputs are summed
    weighted by the router's softmax probabilities (renormalised over the chosen ones if
    `norm_topk_prob`). Every token also runs the shared expert, a SwiGLU of width
    `shared_dim`, scaled by $\sigma(	ext{shared\_expert\_gate}(x))$ (Shazeer et al., 2017,
    https://arxiv.org/abs/1701.06538; Qwen2-MoE's shared experts).

    Parameters are named as in `Qwen3NextSparseMoeBlock`: `gate.weight`,
    `experts.gate_up_proj`, `experts.down_proj`, `shared_expert.{gate,up,down}_proj`,
    `shared_expert_gate`.
    """

    def __init__(self, d_model: int, config: MoEConfig) -> None:
        super().__init__()
        if not isinstance(config, MoEConfig):
            raise TypeError(f"config must be a MoEConfig, got {type(config).__name__}")
        self.config = config
        self.gate = nn.Linear(d_model, config.num_experts, bias=False)
        self.experts = _Experts(d_model, config.num_experts, config.expert_dim)
        self.shared_expert: SwiGLU | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if config.shared_dim is not None:
            self.shared_expert = SwiGLU(d_model, config.shared_dim)
            self.shared_expert_gate = nn.Linear(d_model, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """`x` `(..., d_model)` to `(..., d_model)`."""
        flat = x.reshape(-1, x.shape[-1])  # (n, d_model)
        logits = self.gate(flat)  # (n, num_experts)
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        weights, chosen = probs.topk(self.config.top_k, dim=-1)  # (n, top_k) each
        if self.config.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out: Tensor = self.experts(flat, chosen, weights.to(logits.dtype))  # (n, d_model)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.reshape(x.shape)


class GatedAttention(nn.Module):
    r"""Attention whose heads are gated before the output projection (Qwen3-Next).

    $\operatorname{o\_proj}(\operatorname{heads}(x) \odot
    \sigma(\operatorname{gate\_proj}(x)))$: each feature of each head's output is scaled
    by a sigmoid of the token's own projection (Qiu et al., "Gated Attention for Large
    Language Models", 2025, https://arxiv.org/abs/2505.06708), which lets a head output
    nothing without parking its attention on a sink token.

    Built around a [`GroupedQueryAttention`][attnlab.gqa.GroupedQueryAttention], whose
    `o_proj` it takes over (the inner module then returns the concatenated heads).

    Args:
        attention: The attention; its `o_proj` becomes this module's.
    """

    def __init__(self, attention: GroupedQueryAttention) -> None:
        super().__init__()
        if not isinstance(attention, GroupedQueryAttention):
            raise TypeError(
                f"attention must be a GroupedQueryAttention, got {type(attention).__name__}"
            )
        features = attention.num_heads * attention.head_dim
        self.gate_proj = nn.Linear(attention.d_model, features, bias=attention.bias)
        self.o_proj = attention.o_proj
        attention.o_proj = nn.Identity()  # type: ignore[assignment]
        self.attention = attention

    def _gate(self, x: Tensor, heads: Tensor) -> Tensor:
        out: Tensor = self.o_proj(heads * torch.sigmoid(self.gate_proj(x)))  # (b, t, d_model)
        return out

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        """The attention's `forward` (same arguments and checks), gated."""
        return self._gate(x, self.attention(x, **kwargs))

    @overload
    def forward_impl(
        self, x: Tensor, *, need_weights: Literal[False] = False, **kwargs: Any
    ) -> Tensor: ...

    @overload
    def forward_impl(
        self, x: Tensor, *, need_weights: Literal[True], **kwargs: Any
    ) -> tuple[Tensor, Tensor]: ...

    def forward_impl(
        self, x: Tensor, *, need_weights: bool = False, **kwargs: Any
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The attention's unchecked `forward_impl`, gated."""
        if need_weights:
            heads, weights = self.attention.forward_impl(x, need_weights=True, **kwargs)
            return self._gate(x, heads), weights
        return self._gate(x, self.attention.forward_impl(x, **kwargs))


class DecoderBlock(nn.Module):
    """One pre-norm block: attention, then the MLP, each added to the residual stream.

    In the Gemma family the outputs of the attention and of the MLP are normalised too
    before they are added (`post_attention_layernorm`, `post_feedforward_layernorm`;
    `pre_feedforward_layernorm` is the MLP's input norm), as in `Gemma3DecoderLayer`.

    A `"linear"` block (`config.kind(layer)`) mixes its tokens with a
    [`GatedDeltaNet`][attnlab.linear.GatedDeltaNet], `linear_attn`, instead of the
    attention `self_attn` (None there), and carries a
    [`GatedDeltaNetState`][attnlab.linear.GatedDeltaNetState] instead of a KV cache, as
    `Qwen3NextDecoderLayer`; with `config.attn_output_gate` the attention is a
    [`GatedAttention`][attnlab.llm.GatedAttention], and a mixture-of-experts layer's MLP
    a [`SparseMoE`][attnlab.llm.SparseMoE].

    `forward` does not check its input: it runs inside a
    [`Decoder`][attnlab.llm.Decoder], which checked the tokens at its boundary.
    """

    def __init__(self, config: DecoderConfig, layer: int = 0) -> None:
        super().__init__()
        gemma = config.family == "gemma"
        unit_offset = config.family != "llama"
        self.kind = config.kind(layer)
        self.input_layernorm = _norm(config)
        self.self_attn: GroupedQueryAttention | GatedAttention | None = None
        self.linear_attn: GatedDeltaNet | None = None
        if self.kind == "linear":
            lin = config.linear
            assert lin is not None  # checked by the config
            self.linear_attn = GatedDeltaNet(
                config.d_model,
                num_k_heads=lin.num_k_heads,
                num_v_heads=lin.num_v_heads,
                head_k_dim=lin.head_k_dim,
                head_v_dim=lin.head_v_dim,
                kernel_size=lin.kernel_size,
                chunk_size=lin.chunk_size,
                norm_eps=float(config.norm_eps),
            )
        else:
            base, scaling = config.rope(layer)
            attention = GroupedQueryAttention(
                config.d_model,
                config.num_heads,
                config.num_kv_heads,
                head_dim=config.head_dim,
                bias=config.qkv_bias,
                out_bias=config.out_bias,
                rope_base=base,
                rope_scaling=scaling,
                rope_dims=config.rope_dims,
                window=config.window(layer),
                scale=config.scale,
                qk_norm=config.qk_norm,
                qk_norm_eps=float(config.norm_eps),
                qk_norm_unit_offset=unit_offset,
                softcap=config.attn_softcap,
                backend="torch" if config.attn_softcap is None else "scratch",
            )
            self.self_attn = GatedAttention(attention) if config.attn_output_gate else attention
        self.post_attention_layernorm = _norm(config)
        self.pre_feedforward_layernorm = _norm(config) if gemma else None
        self.post_feedforward_layernorm = _norm(config) if gemma else None
        activation: Literal["silu", "gelu_tanh"] = "gelu_tanh" if gemma else "silu"
        self.mlp: SwiGLU | SparseMoE
        if config.is_moe(layer):
            assert config.moe is not None
            self.mlp = SparseMoE(config.d_model, config.moe)
        else:
            self.mlp = SwiGLU(
                config.d_model, config.hidden_dim, bias=config.mlp_bias, activation=activation
            )

    def _residual(self, x: Tensor, attn: Tensor) -> Tensor:
        """Add the attention's output, then the MLP's, to the residual stream."""
        pre, post = self.pre_feedforward_layernorm, self.post_feedforward_layernorm
        if pre is None or post is None:
            h = x + attn  # (b, t, d_model)
            mlp = self.mlp(self.post_attention_layernorm(h))
        else:  # Gemma: the outputs are normalised before they are added
            h = x + self.post_attention_layernorm(attn)  # (b, t, d_model)
            mlp = post(self.mlp(pre(h)))
        out: Tensor = h + mlp
        return out

    def forward(
        self,
        x: Tensor,
        position_embeddings: tuple[Tensor, Tensor],
        cache: LayerCache | None = None,
        attn_mask: Tensor | None = None,
        padding: Tensor | None = None,
    ) -> Tensor:
        """The block on `x` `(b, t, d_model)`; `attn_mask` is the attention layers' mask,
        `padding` `(b, t)` (or None) the new tokens' padding mask for a linear layer."""
        if self.linear_attn is not None:
            state = cast("GatedDeltaNetState | None", cache)
            mixed = self.linear_attn.forward_impl(
                self.input_layernorm(x), state, padding_mask=padding
            )
            return self._residual(x, mixed)
        assert self.self_attn is not None
        # The model's mask covers every token seen; GQA keeps the columns of the keys it
        # attends to (the last ones, when a rolling cache forgot the oldest).
        attn = self.self_attn.forward_impl(
            self.input_layernorm(x),
            position_embeddings=position_embeddings,
            cache=cast("KVCache | AttendingCache | None", cache),
            attn_mask=attn_mask,
        )
        return self._residual(x, attn)

    def forward_with_weights(
        self,
        x: Tensor,
        position_embeddings: tuple[Tensor, Tensor],
        attn_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """`forward` (without a cache) and the attention weights `(b, heads, t, t)`."""
        if self.self_attn is None:
            raise ValueError("a linear-attention block has no attention weights")
        attn, weights = self.self_attn.forward_impl(
            self.input_layernorm(x),
            position_embeddings=position_embeddings,
            attn_mask=attn_mask,
            need_weights=True,
        )
        return self._residual(x, attn), weights


class Decoder(nn.Module):
    r"""A decoder-only language model of the Llama family, on attnlab's attention.

    Parameters are named as in `LlamaForCausalLM` without its `model.` prefix:
    `embed_tokens`, `layers.{i}.input_layernorm`, `layers.{i}.self_attn.{q,k,v,o}_proj`,
    `layers.{i}.post_attention_layernorm`, `layers.{i}.mlp.{gate,up,down}_proj`, `norm`
    and `lm_head` (the embedding's own weight when `tie_embeddings`). The Gemma family
    adds `layers.{i}.pre_feedforward_layernorm` and `post_feedforward_layernorm`, and
    QK-norm `layers.{i}.self_attn.{q,k}_norm`, as in `Gemma3ForCausalLM`.

    Args:
        config: The sizes and settings.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> config = DecoderConfig(vocab_size=50, d_model=24, num_layers=2, num_heads=4,
        ...                        num_kv_heads=2, head_dim=6, hidden_dim=40)
        >>> model = Decoder(config).eval()
        >>> ids = torch.tensor([[3, 14, 15, 9]])
        >>> model(ids).shape  # a score for every next token, after every token
        torch.Size([1, 4, 50])
        >>> out = model.generate(ids, 5)  # greedy, with a static KV cache
        >>> out.shape, torch.equal(out, model.generate(ids, 5, cache="dynamic"))
        (torch.Size([1, 9]), True)
    """

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        if not isinstance(config, DecoderConfig):
            raise TypeError(f"config must be a DecoderConfig, got {type(config).__name__}")
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(DecoderBlock(config, i) for i in range(config.num_layers))
        self.norm = _norm(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        # Every matrix is stored transposed in memory (same shape, strides (1, rows)):
        # decoding multiplies one token's row by each matrix, and on the CPU the
        # product with an (in, out)-contiguous matrix is the faster kernel (measured on
        # SmolLM2-135M: 1.3x for the projections and the unembedding, the same results).
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                module.weight = _column_major(module.weight)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"layers={c.num_layers}, d_model={c.d_model}, heads={c.num_heads}, "
            f"kv_heads={c.num_kv_heads}, vocab={c.vocab_size}"
        )

    # -- caches --------------------------------------------------------------------------

    def make_cache(
        self,
        batch_size: int = 1,
        max_length: int | None = None,
        *,
        kind: CacheKind = "static",
        rolling: bool = True,
    ) -> list[Any]:
        """One empty KV cache per layer, on the model's device and in its dtype.

        A sliding-window layer gets a [`RollingKVCache`][attnlab.kv_cache.RollingKVCache]
        (it keeps only the last `window - 1` tokens, whatever `kind`), unless `rolling`
        is False; a linear-attention layer its fixed-size
        [`GatedDeltaNetState`][attnlab.linear.GatedDeltaNetState] (for `batch_size`
        sequences, whatever `kind`); every other layer gets a cache of `kind`.

        Args:
            batch_size: Sequences decoded together (a static cache's batch size).
            max_length: Tokens a static cache holds; default `config.max_positions`.
            kind: `"static"` (preallocated, written in place) or `"dynamic"` (grows).
            rolling: Whether sliding-window layers get a rolling cache (False: the same
                kind as the others, holding every token).

        Returns:
            A list of `num_layers` caches, to pass as `cache=` to `forward` and `generate`:
            a `KVCache` per attention layer, a `GatedDeltaNetState` per linear one (typed
            `list[Any]` so that code written for attention-only models keeps its
            `KVCache` methods).
        """
        check_bool("rolling", rolling)
        if kind not in ("static", "dynamic"):
            raise ValueError(f"kind must be 'static' or 'dynamic', got {kind!r}")
        c = self.config
        length = c.max_positions if max_length is None else max_length
        if kind == "static":  # a dynamic or rolling cache sizes itself
            check_positive_int("max_length", length)
        if kind == "static" and length > c.max_positions:
            raise ValueError(
                f"max_length={length} is past the model's max_positions={c.max_positions}"
            )
        weight = self.embed_tokens.weight

        def one(layer: int) -> LayerState:
            linear = cast(DecoderBlock, self.layers[layer]).linear_attn
            if linear is not None:
                return linear.new_state(batch_size)
            window = c.window(layer)
            if rolling and window is not None:
                return RollingKVCache(window)
            if kind == "dynamic":
                return DynamicKVCache()
            return StaticKVCache(
                batch_size,
                length,
                c.num_kv_heads,
                c.head_dim,
                dtype=weight.dtype,
                device=weight.device,
            )

        return [one(i) for i in range(c.num_layers)]

    # -- input checks --------------------------------------------------------------------

    def _check_ids(self, ids: object) -> Tensor:
        ids = check_token_ids("ids", ids, self.config.vocab_size)  # the range reads values
        if ids.shape[-1] == 0:
            raise ValueError(
                f"ids is empty (ids.shape={tuple(ids.shape)}): give at least one token"
            )
        device = self.embed_tokens.weight.device
        if ids.device != device:
            raise ValueError(f"ids is on {ids.device} but the model is on {device}")
        return ids

    def _check_cache(self, cache: object, batch: int) -> int:
        """Check a per-layer cache list; return how many tokens it holds."""
        if cache is None:
            return 0
        n = self.config.num_layers
        if not isinstance(cache, Sequence) or len(cache) != n:
            got = len(cache) if isinstance(cache, Sequence) else type(cache).__name__
            raise TypeError(
                f"cache must be a list of {n} KVCache objects (one per layer, from "
                f"make_cache), got {got}"
            )
        lengths = set()
        for i, c in enumerate(cache):
            if self.config.kind(i) == "linear":
                if not isinstance(c, GatedDeltaNetState):
                    raise TypeError(
                        f"cache[{i}] must be a GatedDeltaNetState (layer {i} is linear "
                        f"attention), got {type(c).__name__}; use make_cache"
                    )
                linear = cast(DecoderBlock, self.layers[i]).linear_attn
                assert linear is not None
                linear.check_state(c, batch)
                lengths.add(c.length)
                continue
            if not isinstance(c, KVCache):
                raise TypeError(f"cache must hold KVCache objects, got {type(c).__name__}")
            window = self.config.window(i)
            if isinstance(c, RollingKVCache) and (window is None or window > c.window):
                raise ValueError(
                    f"cache[{i}] is a RollingKVCache(window={c.window}) but layer {i} sees "
                    f"{'every token' if window is None else f'{window} tokens'}: it would "
                    "lose keys the layer attends to"
                )
            lengths.add(c.length)
            layout = c.layout
            if layout is not None and layout.batch_size != batch:
                raise ValueError(f"cache holds {layout.batch_size} sequences but ids has {batch}")
        if len(lengths) != 1:
            raise ValueError(f"the layers' caches hold different lengths {sorted(lengths)}")
        return lengths.pop()

    def _check_logits_at(self, logits_at: object, ids: Tensor) -> None:
        b, t = (1, ids.shape[0]) if ids.ndim == 1 else ids.shape
        if not isinstance(logits_at, Tensor) or not is_integer_dtype(logits_at.dtype):
            raise TypeError(f"logits_at must be an integer tensor, got {logits_at!r}")
        if tuple(logits_at.shape) != (b,):
            raise ValueError(
                f"logits_at must have shape (b,) = ({b},), one index per row, got "
                f"{tuple(logits_at.shape)}"
            )
        check_int_sequence("logits_at", logits_at, low=0, high=t, within=f"the t={t} tokens ")

    def _check_attending(
        self, cache: Sequence[object], positions: object, padding_mask: object, attn_mask: object
    ) -> None:
        n = self.config.num_layers
        if len(cache) != n or not all(isinstance(c, AttendingCache) for c in cache):
            raise TypeError(f"cache must be {n} AttendingCache objects (one per layer)")
        if positions is None:
            raise ValueError("positions must be given with an AttendingCache (paged) cache")
        if padding_mask is not None or attn_mask is not None:
            raise ValueError(
                "an AttendingCache (paged) cache decides what each query sees: pass no "
                "padding_mask or attn_mask"
            )

    def _check_padding(self, mask: object, batch: int, total: int) -> Tensor:
        weight = self.embed_tokens.weight
        return check_padding_mask(mask, batch, total, like=weight, what="(b, cached + t)")

    # -- the forward pass ----------------------------------------------------------------

    def _prepare(
        self,
        ids: Tensor,
        cache: Sequence[LayerCache] | None,
        positions: Tensor | None,
        padding_mask: Tensor | None,
        attn_mask: Tensor | None,
        validate: bool,
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]], Tensor | None, Tensor | None]:
        """Embed; build the RoPE tables (one per kind of layer), the attention mask and
        the new tokens' padding mask `(b, t)` for the linear layers, once."""
        c = self.config
        b, t = ids.shape
        if cache and any(isinstance(layer, AttendingCache) for layer in cache):
            # A paged cache of sequences of different lengths: the caller places every
            # token, and the cache decides what each query sees.
            x = self._embed(ids)  # (b, t, d_model)
            if validate:
                self._check_attending(cache, positions, padding_mask, attn_mask)
                check_positions(positions, x, low=0, high=c.max_positions, x_name="ids")
            assert positions is not None
            return x, self._rope_tables(positions), None, None
        kv = cast("Sequence[LayerState] | None", cache)
        past = self._check_cache(kv, b) if validate else (kv[0].length if kv else 0)
        if validate and past + t > c.max_positions:
            raise ValueError(
                f"ids has t={t} tokens after {past} cached: {past + t} positions, past "
                f"the model's max_positions={c.max_positions}"
            )
        x = self._embed(ids)  # (b, t, d_model)
        mask = new_padding = None
        if padding_mask is not None:
            pad = self._check_padding(padding_mask, b, past + t) if validate else padding_mask
            pad = pad.bool()
            if t > 1:  # one new token is never padding (it ends every row)
                new_padding = pad[:, past:]  # (b, t)
            if positions is None:  # count only real tokens, as transformers does
                positions = (pad.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # (b, t)
            if t > 1 or not bool(pad.all()):
                # Keys at padding are hidden; a padded query sees itself, so that no row
                # is all masked (softmax of nothing is NaN, which would reach the values).
                mask = padding_attention_mask_impl(pad, t)[:, None]  # (b, 1, t, T)
        if attn_mask is not None:
            if validate:
                target = (b, c.num_heads, t, past + t)
                check_attn_mask("attn_mask", attn_mask, target, x, query_name="ids")
            mask = combine_impl(mask, attn_mask)
        if positions is None:
            positions = default_positions(past, t, ids.device)  # (t,)
        elif validate:
            check_positions(positions, x, low=0, high=c.max_positions, x_name="ids")
        return x, self._rope_tables(positions), mask, new_padding

    def _embed(self, ids: Tensor) -> Tensor:
        x: Tensor = self.embed_tokens(ids)  # (b, t, d_model)
        if self.config.family == "gemma":
            # Gemma scales the embedding by sqrt(d_model), rounded to the weights' dtype.
            x = x * x.new_tensor(self.config.d_model**0.5)
        return x

    def _rope_tables(self, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """RoPE's (cos, sin) for every layer: one table per distinct base and scaling."""
        c = self.config
        tables: dict[tuple[float, RopeScaling | None], tuple[Tensor, Tensor]] = {}
        per_layer = []
        for i in range(c.num_layers):
            key = c.rope(i)
            if key not in tables:
                base, scaling = key  # (..., t, rope_dims / 2) each
                dims = c.head_dim if c.rope_dims is None else c.rope_dims
                tables[key] = rope_cos_sin(positions, dims, base=base, scaling=scaling)
            per_layer.append(tables[key])
        return per_layer

    def forward(
        self,
        ids: Tensor,
        *,
        cache: Sequence[LayerCache] | None = None,
        positions: Tensor | None = None,
        padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        last_only: bool = False,
        logits_at: Tensor | None = None,
    ) -> Tensor:
        """The logits of the next token after each token of `ids`.

        Args:
            ids: Token ids, `(b, t)` or `(t,)`, integers in `[0, vocab_size)`.
            cache: From [`make_cache`][attnlab.llm.Decoder.make_cache]: the earlier
                tokens' keys and values, one cache per layer; the new ones are appended.
                Or one [`AttendingCache`][attnlab.kv_cache.AttendingCache] per layer (a
                paged cache of sequences of different lengths), with `positions`.
            positions: Positions of the tokens, `(t,)` or `(b, t)`; default: after the
                cached tokens, counting only real tokens where there is padding.
            padding_mask: `(b, cached + t)`, 1 (True) at real tokens and 0 at padding,
                padding on the left (Hugging Face's `attention_mask`).
            attn_mask: An extra mask for every layer, bool (True = attend) or float,
                broadcastable to `(b, num_heads, t, cached + t)`; combined with the
                causal mask and the padding.
            last_only: Return only the last token's logits, `(b, 1, vocab_size)` (what
                decoding needs: the unembedding is a large matrix).
            logits_at: `(b,)` integer tensor: return only the logits after token
                `logits_at[i]` of row `i`, `(b, 1, vocab_size)` (rows of different real
                lengths, right-padded, as a serving engine batches them).

        Returns:
            Logits `(b, t, vocab_size)` (or `(t, vocab_size)` for unbatched `ids`).

        Raises:
            TypeError: If `ids` is not an integer tensor, `cache` not a list of one
                `KVCache` per layer, or `padding_mask` is not a bool or integer tensor.
            ValueError: If `ids` is empty, has a token id outside the vocabulary or more
                positions than the model has; the caches do not fit; `padding_mask` has
                the wrong shape, pads on the right or has a row without tokens.
        """
        if is_validation_enabled():
            ids = self._check_ids(ids)
            check_bool("last_only", last_only)
            if logits_at is not None:
                self._check_logits_at(logits_at, ids)
        unbatched = ids.ndim == 1
        ids2 = ids[None] if unbatched else ids  # (b, t)
        logits = self._logits(
            ids2,
            cache,
            positions,
            padding_mask,
            attn_mask,
            last_only,
            logits_at,
            validate=is_validation_enabled(),
        )
        return logits[0] if unbatched else logits

    def _logits(
        self,
        ids: Tensor,
        cache: Sequence[LayerCache] | None,
        positions: Tensor | None,
        padding_mask: Tensor | None,
        attn_mask: Tensor | None,
        last_only: bool,
        logits_at: Tensor | None,
        *,
        validate: bool,
    ) -> Tensor:
        """`forward` on batched `(b, t)` ids that were checked; the rest checked if `validate`."""
        x, tables, mask, padding = self._prepare(
            ids, cache, positions, padding_mask, attn_mask, validate
        )
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache[i]
            x = layer(x, tables[i], layer_cache, mask, padding)  # (b, t, d_model)
        if logits_at is not None:
            rows = torch.arange(x.shape[0], device=x.device)  # (b,)
            x = x[rows, logits_at][:, None]  # (b, 1, d_model)
        elif last_only:
            x = x[:, -1:]  # (b, 1, d_model)
        logits: Tensor = self.lm_head(self.norm(x))  # (b, t, vocab_size)
        cap = self.config.final_softcap
        if cap is not None:  # Gemma 2: the logits squashed into (-cap, cap)
            logits = torch.tanh(logits / cap) * cap
        return logits

    def attention_maps(
        self,
        ids: Tensor,
        *,
        padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
    ) -> list[Tensor]:
        """The attention weights of every layer on `ids`, `(b, num_heads, t, t)` each.

        Computed from scratch beside the normal forward (the fused kernels do not return
        them), without a cache, under `torch.no_grad()`; dropout is not applied.

        Args:
            ids: Token ids, `(b, t)` or `(t,)` (then each map is `(num_heads, t, t)`).
            padding_mask: As in `forward`.
            attn_mask: As in `forward`.

        Returns:
            One tensor per layer; row `i` of head `h` is how token `i` spreads its
            attention over the tokens up to it (each row sums to 1).
        """
        if is_validation_enabled():
            ids = self._check_ids(ids)
        unbatched = ids.ndim == 1
        ids2 = ids[None] if unbatched else ids
        maps = []
        with torch.no_grad():
            validate = is_validation_enabled()
            if "linear" in map(self.config.kind, range(self.config.num_layers)):
                raise ValueError("a model with linear-attention layers has no attention maps")
            x, tables, mask, _ = self._prepare(ids2, None, None, padding_mask, attn_mask, validate)
            for layer, table in zip(self.layers, tables, strict=True):
                assert isinstance(layer, DecoderBlock)
                x, weights = layer.forward_with_weights(x, table, mask)
                maps.append(weights[0] if unbatched else weights)
        return maps

    # -- generation ----------------------------------------------------------------------

    def stream(
        self,
        ids: Tensor,
        max_new_tokens: int,
        *,
        padding_mask: Tensor | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        cache: CacheKind | Sequence[LayerState] = "static",
        generator: torch.Generator | None = None,
    ) -> Iterator[Tensor]:
        """Generate tokens one at a time: yield each step's new token ids, `(b,)`.

        Same arguments as [`generate`][attnlab.llm.Decoder.generate] (less `on_token`);
        the checks run when the iteration starts. Stops after `max_new_tokens` steps, or
        once every sequence has produced an end token.
        """
        if is_validation_enabled():
            ids = self._check_ids(ids)
        ids2 = ids[None] if ids.ndim == 1 else ids  # (b, t)
        b, t = ids2.shape
        steps = check_positive_int("max_new_tokens", max_new_tokens)
        sample = _Sampler(temperature, top_k, top_p, generator)
        eos = check_token_id_set("eos_token_id", eos_token_id, self.config.vocab_size)
        pad = _pad_token(pad_token_id, eos, self.config.vocab_size)
        caches = self._generation_cache(cache, b, t, steps)
        past = caches[0].length
        if padding_mask is None:
            mask = None
        else:
            total = past + t
            mask = (
                self._check_padding(padding_mask, b, total)
                if is_validation_enabled()
                else padding_mask.bool()
            )
        if past + t + steps > self.config.max_positions:
            raise ValueError(
                f"ids has {t} tokens (after {past} cached) and max_new_tokens={steps}: "
                f"{past + t + steps} positions, past the model's "
                f"max_positions={self.config.max_positions}"
            )
        unfinished = torch.ones(b, dtype=torch.bool, device=ids2.device)
        new, step = ids2, 0
        while True:
            # Inference mode (no autograd bookkeeping at all: ~5% faster per token than
            # no_grad here) around each step only, never across a yield: the caller's code
            # between two tokens runs in its own mode.
            with torch.inference_mode():
                # Checked once, above: the steps skip the per-forward checks (the id
                # range and the padding mask are host syncs).
                logits = self._logits(new, caches, None, mask, None, True, None, validate=False)
                token = sample(logits[:, -1])  # (b,)
                if eos:
                    token = torch.where(unfinished, token, torch.full_like(token, pad))
                    unfinished &= ~_isin(token, eos)
            yield token.clone()  # a normal tensor, usable anywhere
            step += 1
            if step == steps or (eos and not bool(unfinished.any())):
                return
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1)  # (b, total + 1)
            new = token[:, None]  # (b, 1)

    def generate(
        self,
        ids: Tensor,
        max_new_tokens: int,
        *,
        padding_mask: Tensor | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        cache: CacheKind | Sequence[LayerState] = "static",
        generator: torch.Generator | None = None,
        on_token: Callable[[Tensor], object] | None = None,
    ) -> Tensor:
        """Continue `ids` by up to `max_new_tokens` tokens, decoding from a KV cache.

        Greedy by default (`temperature=0`: the most likely token, as `transformers`'
        `generate(do_sample=False)`); with `temperature > 0`, sampled from the softmax of
        the logits divided by `temperature`, restricted to the `top_k` most likely tokens
        and then to the smallest set whose probability reaches `top_p` (the order of
        `transformers`' logits warpers). A batch of prompts of different lengths is
        padded on the left, with `padding_mask`; once a sequence produces an end token,
        it gets `pad_token_id` until all are done (then decoding stops).

        Each step runs under `torch.inference_mode()`. A cache passed in therefore holds
        inference tensors afterwards: fine for more decoding or a forward under
        `torch.no_grad()`, not for a forward that autograd records.

        Args:
            ids: Prompt token ids, `(b, t)` or `(t,)`.
            max_new_tokens: Most tokens to add.
            padding_mask: `(b, t)` (plus cached tokens), 1 at tokens, 0 at left padding.
            temperature: 0 for greedy decoding, else the softmax temperature.
            top_k: Sample only among the `top_k` most likely tokens.
            top_p: Sample only among the most likely tokens whose probabilities sum to at
                least `top_p` (nucleus sampling), in `(0, 1]`.
            eos_token_id: The token id (or ids) that ends a sequence.
            pad_token_id: What a finished sequence gets; default the first end token.
            cache: `"static"` (preallocated for prompt plus new tokens), `"dynamic"`
                (grows), or a list from [`make_cache`][attnlab.llm.Decoder.make_cache]
                (which may hold earlier tokens that `ids` continue).
            generator: The random generator for sampling.
            on_token: Called with each step's new tokens `(b,)` as they are produced.

        Returns:
            `ids` followed by the new tokens, `(b, t + n)` (or `(t + n,)`), `n` at most
            `max_new_tokens`.

        Raises:
            TypeError: As `forward`, or if a sampling setting has the wrong type.
            ValueError: As `forward`; if `max_new_tokens` is not positive, the prompt
                plus `max_new_tokens` is longer than the model's positions or than a
                given static cache, or a sampling setting is out of range.
        """
        tokens = []
        for token in self.stream(
            ids,
            max_new_tokens,
            padding_mask=padding_mask,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            cache=cache,
            generator=generator,
        ):
            if on_token is not None:
                on_token(token)
            tokens.append(token)
        new = torch.stack(tokens, dim=-1)  # (b, n)
        return torch.cat([ids, new[0] if ids.ndim == 1 else new], dim=-1)

    def _generation_cache(
        self, cache: object, batch: int, t: int, steps: int
    ) -> Sequence[LayerState]:
        if isinstance(cache, str):
            if cache not in ("static", "dynamic"):
                raise ValueError(
                    f"cache must be 'static', 'dynamic' or a list from make_cache, got {cache!r}"
                )
            # The last new token is never fed back: t + steps - 1 tokens are cached.
            length = min(t + steps - 1, self.config.max_positions)
            return self.make_cache(batch, max(length, 1), kind=cache)  # type: ignore[arg-type]
        past = self._check_cache(cache, batch)
        assert isinstance(cache, Sequence)
        for c in cache:
            if isinstance(c, StaticKVCache) and past + t + steps - 1 > c.max_length:
                raise ValueError(
                    f"the static cache holds max_length={c.max_length} tokens but "
                    f"{past} cached + {t} in ids + max_new_tokens={steps} - 1 must fit; "
                    "make it with a larger max_length"
                )
        return cache

    # -- interoperability with Hugging Face transformers ---------------------------------

    @classmethod
    def from_hf(cls, model: nn.Module) -> Decoder:
        """A `Decoder` with the weights and settings of a Hugging Face causal LM.

        Accepts `transformers`' `LlamaForCausalLM`, `MistralForCausalLM`,
        `Qwen2ForCausalLM`, `Gemma2ForCausalLM`, `Gemma3ForCausalLM` (text only) and
        `Qwen3NextForCausalLM` (and subclasses): the
        state dict maps key for key, less the
        `model.` prefix ([`DecoderConfig.from_hf`][attnlab.llm.DecoderConfig.from_hf]
        reads the settings). The attention layers are the ones
        [`GroupedQueryAttention.from_hf`][attnlab.gqa.GroupedQueryAttention.from_hf]
        would build. Qwen3-Next's fused projections are split: each head's rows of
        `q_proj` hold its query, then its output gate (`self_attn.attention.q_proj` and
        `self_attn.gate_proj` here), and the Gated DeltaNet layers' weights are the ones
        [`GatedDeltaNet.from_hf`][attnlab.linear.GatedDeltaNet.from_hf] copies.

        Args:
            model: The Hugging Face model.

        Returns:
            A new `Decoder` on the same device and dtype, in the same training mode.

        Raises:
            TypeError: If `model` is not one of the supported classes.
            ValueError: As [`DecoderConfig.from_hf`][attnlab.llm.DecoderConfig.from_hf].
        """
        names = {c.__name__ for c in type(model).__mro__}
        if not names & set(_HF_CLASSES):
            raise TypeError(
                f"model must be a transformers {', '.join(_HF_CLASSES)}, got {type(model).__name__}"
            )
        hf: Any = model
        config = DecoderConfig.from_hf(hf.config)
        weight = hf.model.embed_tokens.weight
        with torch.device("meta"):
            new = cls(config)
        new = new.to_empty(device=weight.device).to(weight.dtype)
        if config.tie_embeddings:
            new.lm_head.weight = new.embed_tokens.weight
        state = {
            key.removeprefix("model."): value
            for key, value in hf.state_dict().items()
            if "rotary_emb" not in key and ".linear_attn." not in key
        }
        if config.attn_output_gate:
            state = _split_output_gates(state, config)
        for i, layer in enumerate(hf.model.layers):
            if config.kind(i) == "linear":
                ported = GatedDeltaNet.state_dict_from_hf(layer.linear_attn)
                state |= {f"layers.{i}.linear_attn.{k}": v for k, v in ported.items()}
        new.load_state_dict(state, strict=True)
        return new.train(model.training)


def _split_output_gates(state: dict[str, Tensor], config: DecoderConfig) -> dict[str, Tensor]:
    """Qwen3-Next's attention keys as a [`GatedAttention`][attnlab.llm.GatedAttention]'s.

    Its `q_proj` rows (and bias) hold, per head, `head_dim` query rows then `head_dim`
    gate rows; `o_proj` moves to the wrapper, the rest to the inner attention.
    """
    out = {}
    h, hd = config.num_heads, config.head_dim
    for key, value in state.items():
        if ".self_attn." not in key:
            out[key] = value
            continue
        prefix, name = key.split(".self_attn.")
        if name.startswith("q_proj."):
            query, gate = torch.split(value.reshape(h, 2 * hd, *value.shape[1:]), hd, dim=1)
            out[f"{prefix}.self_attn.attention.{name}"] = query.reshape(h * hd, *value.shape[1:])
            out[f"{prefix}.self_attn.gate_{name[2:]}"] = gate.reshape(h * hd, *value.shape[1:])
        elif name.startswith("o_proj."):
            out[key] = value
        else:
            out[f"{prefix}.self_attn.attention.{name}"] = value
    return out


def _norm(config: DecoderConfig) -> nn.Module:
    """The RMSNorm of the family: `weight` (Llama) or `1 + weight` (Gemma, Qwen3-Next)."""
    if config.family != "llama":  # Gemma, Qwen3-Next
        return RMSNorm(config.d_model, float(config.norm_eps), unit_offset=True)
    return nn.RMSNorm(config.d_model, eps=config.norm_eps)


def _column_major(weight: Tensor) -> nn.Parameter:
    """The same matrix, stored transposed: `(out, in)` with strides `(1, out)`.

    `load_state_dict`, `to_empty` and `.to(dtype)` keep the strides, so a loaded model
    keeps the layout.
    """
    data = weight.detach().t().contiguous().t()  # (out, in), column-major
    return nn.Parameter(data, requires_grad=weight.requires_grad)


# -- sampling ----------------------------------------------------------------------------


class _Sampler:
    """Pick the next token from logits `(b, vocab)`: greedy, or by (top-k, top-p) sampling."""

    def __init__(
        self,
        temperature: object,
        top_k: object,
        top_p: object,
        generator: object,
    ) -> None:
        if isinstance(temperature, bool) or not isinstance(temperature, float | int):
            raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        self.temperature = float(temperature)
        self.top_k = None if top_k is None else check_positive_int("top_k", top_k)
        if top_p is not None:
            if isinstance(top_p, bool) or not isinstance(top_p, float | int):
                raise TypeError(f"top_p must be a number, got {type(top_p).__name__}")
            if not 0 < top_p <= 1:
                raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.top_p = None if top_p is None else float(top_p)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        self.generator = generator

    def __call__(self, logits: Tensor) -> Tensor:
        if self.temperature == 0:
            return logits.argmax(dim=-1)  # (b,)
        scores = logits.float() / self.temperature
        if self.top_k is not None and self.top_k < scores.shape[-1]:
            kth = scores.topk(self.top_k, dim=-1).values[..., -1:]  # (b, 1)
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1:
            ordered, order = scores.sort(dim=-1)  # ascending
            # Drop the least likely tokens while what they hold together is <= 1 - top_p;
            # the most likely token always stays.
            drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1 - self.top_p
            drop[..., -1] = False
            scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        probs = scores.softmax(dim=-1)  # (b, vocab)
        return torch.multinomial(probs, 1, generator=self.generator)[:, 0]  # (b,)


def _pad_token(pad_token_id: object, eos: tuple[int, ...], vocab: int) -> int:
    pad = check_token_id_set("pad_token_id", pad_token_id, vocab)
    return pad[0] if pad else eos[0] if eos else 0


def _isin(token: Tensor, ids: Sequence[int]) -> Tensor:
    return torch.isin(token, torch.tensor(ids, device=token.device))
