"""Reading `transformers` configs: RoPE's settings and the settings of a decoder.

[`hf_rope`][attnlab.models.hf_config.hf_rope] reads a config's RoPE for every port;
[`config_from_hf`][attnlab.models.hf_config.config_from_hf] is the body of
[`DecoderConfig.from_hf`][attnlab.models.config.DecoderConfig.from_hf], one reader per
family of configs. The modules themselves are ported in
[`attnlab.models.interop`][attnlab.models.interop].
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

from attnlab.layers.linear import DeltaGates
from attnlab.layers.mlp import MoEConfig
from attnlab.models.config import (
    DecoderConfig,
    GlobalAttentionConfig,
    LatentAttentionConfig,
    LayerKind,
    LinearAttentionConfig,
)
from attnlab.rules.rope_scaling import RopeScaling

__all__ = ["config_from_hf", "hf_rope"]

C = TypeVar("C", bound=DecoderConfig)
K = TypeVar("K")


# -- RoPE ---------------------------------------------------------------------------------


def hf_rope(config: Any, layer_type: str | None = None) -> tuple[float, RopeScaling | None]:
    """The RoPE base and scaling of a Hugging Face config, as a port's arguments.

    The one reader of a config's RoPE for every `from_hf`: the base is
    `rope_parameters["rope_theta"]` (`config.rope_theta` in older `transformers`, then
    10000), the scaling is
    [`RopeScaling.from_hf`][attnlab.rules.rope_scaling.RopeScaling.from_hf]'s,
    or `None` for plain RoPE. Gemma 3's `rope_parameters` hold one entry per layer
    type: `layer_type` (e.g. `"sliding_attention"`) picks one; a config with one RoPE
    for every layer ignores it.

    Raises:
        ValueError: As `RopeScaling.from_hf`, and if the config has a RoPE per layer
            type but none for `layer_type`.

    Examples:
        >>> from transformers import LlamaConfig
        >>> hf_rope(LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 5e5}))
        (500000.0, None)
    """
    params = dict(getattr(config, "rope_parameters", None) or {})
    per_type = {k: v for k, v in params.items() if isinstance(v, dict)}
    if per_type:  # one RoPE per layer type
        if layer_type not in per_type:
            raise ValueError(
                f"config.rope_parameters hold a RoPE per layer type {sorted(per_type)}, "
                f"got layer_type={layer_type!r}"
            )
        params = dict(per_type[layer_type])
        one = _OneRope(params, getattr(config, "max_position_embeddings", None))
        scaling = RopeScaling.from_hf(one)
    else:
        scaling = RopeScaling.from_hf(config)
    base = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    return base, None if scaling.rope_type == "default" else scaling


@dataclass(frozen=True)
class _OneRope:
    """The part of a config `RopeScaling.from_hf` reads, for one layer type's RoPE."""

    rope_parameters: dict[str, Any]
    max_position_embeddings: int | None


# -- decoders' configs --------------------------------------------------------------------


def _hf_common(config: Any, rope_layer: str | None = None, sizes: Any = None) -> dict[str, Any]:
    """What every supported Hugging Face decoder config states the same way: the sizes,
    RoPE (of the layers of type `rope_layer`, where each type has its own), the biases.
    The key/value heads and head size are read from `sizes` (default: `config`)."""
    heads = config.num_attention_heads
    sizes = config if sizes is None else sizes
    rope_base, scaling = hf_rope(config, rope_layer)
    bias = bool(getattr(config, "attention_bias", False))
    return {
        "vocab_size": config.vocab_size,
        "d_model": config.hidden_size,
        "num_layers": config.num_hidden_layers,
        "num_heads": heads,
        "num_kv_heads": sizes.num_key_value_heads,
        "head_dim": int(getattr(sizes, "head_dim", None) or config.hidden_size // heads),
        "hidden_dim": config.intermediate_size,
        "norm_eps": float(config.rms_norm_eps),
        "max_positions": int(config.max_position_embeddings),
        "tie_embeddings": bool(config.tie_word_embeddings),
        "rope_base": rope_base,
        "rope_scaling": scaling,
        "qkv_bias": bias,
        "out_bias": bias,
    }


def _layer_kinds(config: Any, kinds: dict[str, K]) -> tuple[K, ...]:
    """`config.layer_types`, each as `kinds` names it; raise on a type it does not name."""
    if not set(config.layer_types) <= set(kinds):
        raise ValueError(f"config.layer_types must name {sorted(kinds)}, got {config.layer_types}")
    return tuple(kinds[kind] for kind in config.layer_types)


def config_from_hf(cls: type[C], config: Any) -> C:
    """The body of [`DecoderConfig.from_hf`][attnlab.models.config.DecoderConfig.from_hf]."""
    model_type = config.model_type
    if model_type in ("gemma2", "gemma3_text"):
        return _gemma_config(cls, config)
    if model_type == "gemma4_text":
        return _gemma4_config(cls, config)
    if model_type == "qwen3_next":
        return _qwen3_next_config(cls, config)
    if model_type == "kimi_linear":
        return _kimi_linear_config(cls, config)
    if model_type == "llama4_text":
        return _llama4_config(cls, config)
    common = _hf_common(config)
    scaling = common["rope_scaling"]
    if scaling is not None and scaling.is_dynamic:
        common["max_positions"] = int(common["max_positions"] * scaling.factor)
    if config.hidden_act != "silu":
        raise ValueError(f"config.hidden_act must be 'silu', got {config.hidden_act!r}")
    qwen2 = model_type == "qwen2"
    windows: tuple[int | None, ...] | None = None
    if model_type in ("qwen2", "smollm3") and getattr(config, "use_sliding_window", False):
        windows = tuple(
            config.sliding_window if kind == "sliding_attention" else None
            for kind in config.layer_types
        )
    elif model_type == "mistral" and getattr(config, "sliding_window", None):
        windows = (int(config.sliding_window),) * config.num_hidden_layers
    if qwen2:  # biases on the q, k, v projections and none on the output, always
        common.update(qkv_bias=True, out_bias=False)
    # SmolLM3: `no_rope_layers[i]` is 1 where layer i rotates, 0 for its NoPE layers.
    nope = getattr(config, "no_rope_layers", None) if model_type == "smollm3" else None
    return cls(
        **common,
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
        windows=windows,
        rope_layers=None if nope is None else tuple(bool(f) for f in nope),
    )


def _gemma_config(cls: type[C], config: Any) -> C:
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
    windows = _layer_kinds(
        config, {"full_attention": None, "sliding_attention": int(config.sliding_window)}
    )
    gemma3 = config.model_type == "gemma3_text"
    local_base: float | None = None
    local_scaling: RopeScaling | None = None
    if gemma3:  # one RoPE per layer type
        local_base, local_scaling = hf_rope(config, "sliding_attention")
    return cls(
        **_hf_common(config, "full_attention"),
        local_rope_base=local_base,
        local_rope_scaling=local_scaling,
        windows=windows,
        query_pre_attn_scalar=float(config.query_pre_attn_scalar),
        qk_norm="head" if gemma3 else None,
        attn_softcap=None if gemma3 else config.attn_logit_softcapping,
        final_softcap=config.final_logit_softcapping,
        family="gemma",
    )


def _gemma4_config(cls: type[C], config: Any) -> C:
    """Gemma 4 (text): Gemma's block with plain-weight norms, a weightless value norm and
    a learned scalar per block; global layers with their own head size, key/value heads
    and keys as values, "proportional" RoPE; the last layers reading earlier layers' keys
    and values. What is not attention is refused unless off: the per-layer input
    embeddings, the mixture of experts and the double-wide MLP of the shared layers."""
    off = {
        "hidden_size_per_layer_input": config.hidden_size_per_layer_input or None,
        "enable_moe_block": config.enable_moe_block or None,
        "use_double_wide_mlp": bool(config.use_double_wide_mlp and config.num_kv_shared_layers)
        or None,
    }
    if on := [f"config.{k}={v!r}" for k, v in off.items() if v is not None]:
        raise ValueError(
            f"{', '.join(on)}: not ported (not attention); a Gemma 4 config with "
            "hidden_size_per_layer_input=0, enable_moe_block=False, no double-wide MLP "
            "and causal attention is"
        )
    if config.use_bidirectional_attention == "all":  # "vision": image tokens only
        raise ValueError(
            "config.use_bidirectional_attention='all': the text decoder attends both ways; "
            "Decoder is causal"
        )
    if config.num_kv_shared_layers >= config.num_hidden_layers:
        raise ValueError(
            f"config.num_kv_shared_layers={config.num_kv_shared_layers} leaves no layer that "
            f"computes keys and values (num_hidden_layers={config.num_hidden_layers})"
        )
    if config.hidden_activation != "gelu_pytorch_tanh":
        raise ValueError(
            f"config.hidden_activation must be 'gelu_pytorch_tanh', got "
            f"{config.hidden_activation!r}"
        )
    types = list(config.layer_types)
    windows = _layer_kinds(
        config, {"full_attention": None, "sliding_attention": int(config.sliding_window)}
    )
    # Each layer type has its sizes (config.num_key_value_heads is refused as ambiguous).
    sizes: dict[str, set[tuple[int, int]]] = {}
    for i, kind in enumerate(types):
        layer = config.per_layer_config[i]
        sizes.setdefault(kind, set()).add((int(layer.num_key_value_heads), int(layer.head_dim)))
    if any(len(found) > 1 for found in sizes.values()):
        raise ValueError(
            f"config.per_layer_config gives layers of one type different sizes {sizes}: "
            "a Decoder has one (num_key_value_heads, head_dim) per layer type"
        )
    full = config.per_layer_config[types.index("full_attention")]
    sliding = "sliding_attention" if "sliding_attention" in types else "full_attention"
    local = config.per_layer_config[types.index(sliding)]
    local_base, local_scaling = hf_rope(config, "sliding_attention")
    # "reuse" layers read the last earlier layer of their type that is not one ("store").
    modes = config.kv_sharing_modes
    sources = tuple(
        max(j for j in range(i) if modes[j] != "reuse" and types[j] == types[i])
        if mode == "reuse"
        else None
        for i, mode in enumerate(modes)
    )
    return cls(
        **_hf_common(config, "full_attention", sizes=local),
        local_rope_base=local_base,
        local_rope_scaling=local_scaling,
        windows=windows,
        query_pre_attn_scalar=1.0,  # Gemma 4 scales its scores by 1: QK-norm sets them
        qk_norm="head",
        final_softcap=config.final_logit_softcapping,
        family="gemma4",
        global_attention=GlobalAttentionConfig(
            int(full.head_dim),
            int(full.num_key_value_heads),
            keys_are_values=bool(config.attention_k_eq_v),
        ),
        kv_sources=sources if any(j is not None for j in sources) else None,
    )


def _qwen3_next_config(cls: type[C], config: Any) -> C:
    """Qwen3-Next: Gated DeltaNet and gated full-attention layers (`layer_types`),
    partial RoPE, QK-norm, `1 + weight` norms, a mixture of experts with a shared
    expert in the layers `decoder_sparse_step` and `mlp_only_layers` pick."""
    if config.hidden_act != "silu":
        raise ValueError(f"config.hidden_act must be 'silu', got {config.hidden_act!r}")
    names: dict[str, LayerKind] = {"full_attention": "full", "linear_attention": "linear"}
    layer_kinds = _layer_kinds(config, names)
    params = config.rope_parameters  # also holds partial_rotary_factor
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
    return cls(
        **_hf_common(config),
        qk_norm="head",
        family="qwen3_next",
        layer_kinds=layer_kinds,
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


def _kimi_linear_config(cls: type[C], config: Any) -> C:
    """Kimi Linear: Kimi Delta Attention layers and MLA layers without RoPE, 3 : 1 in the
    released model; Llama's block otherwise. Its mixture of experts is not ported."""
    if "sparse" in config.mlp_layer_types:
        raise ValueError(
            f"config.mlp_layer_types has 'sparse' layers ({config.mlp_layer_types}): Kimi "
            "Linear's mixture of experts (DeepSeek-V3's grouped sigmoid router) is not "
            "ported; a config whose layers are all 'dense' is"
        )
    if config.hidden_act != "silu":
        raise ValueError(f"config.hidden_act must be 'silu', got {config.hidden_act!r}")
    h, d = config.linear_num_heads, config.linear_head_dim  # as many value heads as key heads
    names: dict[str, LayerKind] = {"full_attention": "full", "linear_attention": "linear"}
    # KimiLinearForCausalLM ties no weights (`_tied_weights_keys = {}`) whatever
    # tie_word_embeddings says: its lm_head is its own.
    return cls(
        **(_hf_common(config) | {"tie_embeddings": False}),
        layer_kinds=_layer_kinds(config, names),
        linear=LinearAttentionConfig(
            h, h, d, d, config.linear_conv_kernel_dim, gates=DeltaGates("channel", d, "sigmoid")
        ),
        rope_layers=(False,) * config.num_hidden_layers,
        # LatentAttentionConfig's fields carry transformers' names
        latent=LatentAttentionConfig(
            **{f.name: getattr(config, f.name) for f in fields(LatentAttentionConfig)}
        ),
    )


def _llama4_config(cls: type[C], config: Any) -> C:
    """Llama 4 (text): iRoPE (`no_rope_layers[i]` is 1 where layer i rotates), chunks on
    the RoPE layers, weightless QK-norm after RoPE, temperature tuning on the others."""
    if config.moe_layers:
        raise ValueError(
            f"config.moe_layers={config.moe_layers}: Llama 4's mixture of experts is not "
            "ported; a config with moe_layers=[] (every MLP dense) is"
        )
    if config.hidden_act != "silu":
        raise ValueError(f"config.hidden_act must be 'silu', got {config.hidden_act!r}")
    rotates = tuple(bool(flag) for flag in config.no_rope_layers)
    chunk = config.attention_chunk_size
    tuning = config.attn_temperature_tuning
    return cls(
        **(_hf_common(config) | {"hidden_dim": config.intermediate_size_mlp}),
        rope_layers=rotates,
        rope_layout="interleaved",
        chunks=None if chunk is None else tuple(chunk if r else None for r in rotates),
        qk_norm="rotated" if config.use_qk_norm else None,
        temperature=(float(config.floor_scale), float(config.attn_scale)) if tuning else None,
    )
