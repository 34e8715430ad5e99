"""Interoperability with PyTorch and Hugging Face `transformers`: porting their modules.

The one home of every port. The classmethods users call (`GroupedQueryAttention.from_hf`,
`MultiHeadAttention.from_torch`, `DecoderConfig.from_hf`, `Decoder.from_hf`, ...) keep
their documentation and hand off here; this module reads the other library's classes,
configs and state dicts, and builds attnlab's modules from them. Ports are tested equal
to the originals (outputs, gradients, cached decoding) in `tests/`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch
from torch import Tensor, nn

from attnlab.functional.backends import Backend, backend_for
from attnlab.layers.compressed import CompressedAttention, CompressedConfig, Kind
from attnlab.layers.gqa import GroupedQueryAttention, HeadGates
from attnlab.layers.linear import DeltaGates, GatedDeltaNet
from attnlab.layers.mla import MultiHeadLatentAttention, latent_sizes
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.layers.norms import QKNormSpec
from attnlab.layers.sparse import DeepSeekSparseAttention, LightningIndexer
from attnlab.models.config import DecoderConfig
from attnlab.models.hf_config import hf_rope
from attnlab.rules.rope import Rope
from attnlab.rules.scores import ScoreRule

if TYPE_CHECKING:
    from attnlab.models.decoder import Decoder

__all__ = [
    "HF_ATTENTION_CLASSES",
    "HF_DECODER_CLASSES",
    "compressed_from_hf",
    "decoder_from_hf",
    "dsa_from_hf",
    "gated_deltanet_from_hf",
    "gated_deltanet_state_dict",
    "gqa_from_hf",
    "mha_from_torch",
    "mha_to_torch",
    "mla_from_hf",
    "split_deltanet_projections",
]

G = TypeVar("G", bound=GroupedQueryAttention)
M = TypeVar("M", bound=MultiHeadAttention)
L = TypeVar("L", bound=MultiHeadLatentAttention)
S = TypeVar("S", bound=DeepSeekSparseAttention)
N = TypeVar("N", bound=GatedDeltaNet)
C = TypeVar("C", bound=DecoderConfig)
D = TypeVar("D", bound="Decoder")
V = TypeVar("V", bound=CompressedAttention)
K = TypeVar("K")


# -- attention layers ---------------------------------------------------------------------

HF_ATTENTION_CLASSES = (
    "LlamaAttention",
    "MistralAttention",
    "Qwen2Attention",
    "StableLmAttention",
    "SmolLM3Attention",
    "Qwen3Attention",
    "Olmo2Attention",
    "Gemma2Attention",
    "Gemma3Attention",
    "GptOssAttention",
)
"""The `transformers` attention layers (and their subclasses) that
[`GroupedQueryAttention.from_hf`][attnlab.layers.gqa.GroupedQueryAttention.from_hf] ports."""


def gqa_from_hf(cls: type[G], module: nn.Module, *, backend: Backend | None = None) -> G:
    """The body of
    [`GroupedQueryAttention.from_hf`][attnlab.layers.gqa.GroupedQueryAttention.from_hf]."""
    names = {c.__name__ for c in type(module).__mro__}
    if not names & set(HF_ATTENTION_CLASSES):
        raise TypeError(
            f"module must be a transformers {', '.join(HF_ATTENTION_CLASSES)}, got "
            f"{type(module).__name__}"
        )
    hf: Any = module
    config: Any = hf.config
    if getattr(hf, "qk_layernorm", False):
        raise ValueError(
            f"module normalises queries and keys (qk_layernorm=True); "
            f"GroupedQueryAttention.from_hf does not port that from {type(module).__name__}"
        )
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError(
            f"module attends both ways (config.use_bidirectional_attention=True); "
            f"GroupedQueryAttention is causal: call forward(..., is_causal=False) on a "
            f"port of the causal {type(module).__name__}"
        )
    # Gemma 3 has one RoPE per layer type (local layers 1e4, global 1e6 and scaling).
    rope_base, scaling = hf_rope(config, getattr(hf, "layer_type", None))
    head_dim = int(hf.head_dim)
    rope_dims = int(getattr(hf, "rotary_ndims", head_dim))
    if hasattr(hf, "sliding_window"):  # per layer: None on full-attention layers
        window = hf.sliding_window
    else:
        window = getattr(config, "sliding_window", None)
    scale = float(getattr(hf, "scaling", head_dim**-0.5))
    qk_norm: QKNormSpec | None = None
    q_norm: Any = getattr(hf, "q_norm", None)
    if q_norm is not None:
        qk_norm = QKNormSpec(
            "head" if q_norm.weight.numel() == head_dim else "projection",
            eps=float(getattr(q_norm, "variance_epsilon", getattr(q_norm, "eps", 1e-6))),
            unit_offset="Gemma3Attention" in names,  # Gemma's RMSNorm scales by 1 + weight
        )
    # Gemma 3 keeps attn_logit_softcapping in its config but never applies it.
    softcap = getattr(hf, "attn_logit_softcapping", None) if "Gemma2Attention" in names else None
    weight = hf.q_proj.weight
    new = cls(
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        head_dim=head_dim,
        bias=_biases(hf.q_proj.bias is not None, hf.o_proj.bias is not None),
        rope=Rope(rope_base, "half", None if rope_dims == head_dim else rope_dims, scaling)
        if getattr(hf, "use_rope", True)
        else None,
        scores=ScoreRule(
            scale=None if scale == head_dim**-0.5 else scale, window=window, softcap=softcap
        ),
        qk_norm=qk_norm,
        gates=HeadGates(learned_sinks=isinstance(getattr(hf, "sinks", None), nn.Parameter)),
        dropout=float(getattr(config, "attention_dropout", 0.0) or 0.0),
        backend=backend_for(softcap) if backend is None else backend,
    ).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        for name, ours_p in new.named_parameters():
            ours_p.copy_(module.get_parameter(_hf_name(name)))
    return new.train(module.training)


def _biases(qkv: bool, out: bool) -> bool | Literal["qkv"]:
    """GQA's `bias` for biases on the q, k, v projections (`qkv`) and on the output."""
    if out and not qkv:
        raise ValueError("a bias on o_proj only (none on q, k, v) is not a layout attnlab builds")
    return "qkv" if qkv and not out else qkv


_HF_NAMES = {"out_proj": "o_proj", "sink_logits": "sinks"}
"""Transformers' names of the attention parameters attnlab spells otherwise (PyTorch's
`out_proj`; `sink_logits`, since a sink is also StreamingLLM's kept token)."""


def _hf_name(name: str) -> str:
    """The transformers name of attnlab's attention parameter `name` (`out_proj.weight`
    is `o_proj.weight` there)."""
    head, dot, rest = name.partition(".")
    return _HF_NAMES.get(head, head) + dot + rest


def _from_hf_names(key: str) -> str:
    """A transformers state-dict key as attnlab's: its attention's `o_proj` and `sinks`
    renamed (`layers.0.self_attn.o_proj.weight` -> `layers.0.self_attn.out_proj.weight`)."""
    prefix, attn, name = key.partition(".self_attn.")
    if not attn:
        return key
    ours = {theirs: mine for mine, theirs in _HF_NAMES.items()}
    head, dot, rest = name.partition(".")
    return prefix + attn + ours.get(head, head) + dot + rest


def mha_from_torch(cls: type[M], module: nn.MultiheadAttention, *, backend: Backend) -> M:
    """The body of [`MultiHeadAttention.from_torch`][attnlab.MultiHeadAttention.from_torch]."""
    if not isinstance(module, nn.MultiheadAttention):
        raise TypeError(
            f"module must be a torch.nn.MultiheadAttention, got {type(module).__name__}"
        )
    if module.bias_k is not None or module.add_zero_attn:
        raise ValueError(
            "module uses add_bias_kv or add_zero_attn, which MultiHeadAttention does not implement"
        )
    weight = module.out_proj.weight
    d_model = module.embed_dim  # PyTorch's one width for the input and the output
    new = cls(
        d_model,
        d_model,
        module.num_heads,
        d_context=module.kdim,
        d_value=module.vdim,
        dropout=module.dropout,
        bias=module.in_proj_bias is not None,
        backend=backend,
    ).to(device=weight.device, dtype=weight.dtype)
    if module.kdim == module.vdim == module.embed_dim:  # packed: rows are [W_q; W_k; W_v]
        w_q, w_k, w_v = module.in_proj_weight.chunk(3)
    else:
        w_q, w_k, w_v = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
    with torch.no_grad():
        new.W_query.weight.copy_(w_q)
        new.W_key.weight.copy_(w_k)
        new.W_value.weight.copy_(w_v)
        new.out_proj.weight.copy_(module.out_proj.weight)
        if module.in_proj_bias is not None:
            b_q, b_k, b_v = module.in_proj_bias.chunk(3)
            for linear, b in ((new.W_query, b_q), (new.W_key, b_k), (new.W_value, b_v)):
                assert linear.bias is not None
                linear.bias.copy_(b)
            assert new.out_proj.bias is not None
            new.out_proj.bias.copy_(module.out_proj.bias)
    return new.train(module.training)


def mha_to_torch(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """The body of [`MultiHeadAttention.to_torch`][attnlab.MultiHeadAttention.to_torch]."""
    if mha.d_in != mha.d_out:
        raise ValueError(
            f"nn.MultiheadAttention has a single embed_dim for input and output, but this "
            f"module has d_in={mha.d_in} and d_out={mha.d_out}"
        )
    weight = mha.W_query.weight
    module = nn.MultiheadAttention(
        mha.d_out,
        mha.num_heads,
        dropout=mha.dropout,
        bias=mha.bias,
        kdim=mha.d_context,
        vdim=mha.d_value,
        batch_first=True,
        device=weight.device,
        dtype=weight.dtype,
    )
    with torch.no_grad():
        weights = (mha.W_query.weight, mha.W_key.weight, mha.W_value.weight)
        if mha.d_context == mha.d_value == mha.d_out:  # packed into in_proj_weight
            module.in_proj_weight.copy_(torch.cat(weights))  # (3 * d_out, d_out)
        else:
            module.q_proj_weight.copy_(weights[0])
            module.k_proj_weight.copy_(weights[1])
            module.v_proj_weight.copy_(weights[2])
        module.out_proj.weight.copy_(mha.out_proj.weight)
        if mha.bias:
            biases = [lin.bias for lin in (mha.W_query, mha.W_key, mha.W_value)]
            assert module.in_proj_bias is not None
            module.in_proj_bias.copy_(torch.cat([b for b in biases if b is not None]))
            module.out_proj.bias.copy_(mha.out_proj.bias)
    return module.train(mha.training)


_STATIC_ROPE_TYPES = ("default", "yarn", "linear", "llama3")
"""Hugging Face `rope_type`s whose frequencies do not depend on the sequence length."""

_MLA_STRUCTURE = (
    "config",
    "hidden_size",
    "num_heads",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "q_lora_rank",
    "scaling",
    "attention_dropout",
    "kv_a_proj_with_mqa",
    "kv_a_layernorm",
    "kv_b_proj",
    "o_proj",
)
"""What `mla_from_hf` reads from a Hugging Face MLA layer (besides its query projection)."""

_MLA_Q_LORA = ("q_a_proj", "q_a_layernorm", "q_b_proj")

_MLA_MODULES = frozenset(
    ("q_proj", *_MLA_Q_LORA, "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")
)
"""The submodules an MLA layer may have for `mla_from_hf` to copy all it computes."""


def _mla_structure_problems(layer: nn.Module, ignore: Sequence[str] = ()) -> list[str]:
    """What keeps `layer` from being a copy of DeepSeek's MLA layer, in words (or []);
    the parts named in `ignore` are the caller's to compute."""
    problems = [f"no {name}" for name in _MLA_STRUCTURE if not hasattr(layer, name)]
    if not (hasattr(layer, "q_proj") or all(hasattr(layer, n) for n in _MLA_Q_LORA)):
        problems.append("no q_proj (or q_a_proj, q_a_layernorm, q_b_proj)")
    # Parts MLA does not compute (a sparse-attention indexer, output gates, attention
    # sinks): copying the rest would give other outputs without a word.
    extra = [n for n, _ in layer.named_children() if n not in _MLA_MODULES]
    extra += [n for n, _ in layer.named_parameters(recurse=False)]
    extra = [n for n in extra if n not in ignore]
    if extra:
        problems.append(f"parts MultiHeadLatentAttention does not compute: {', '.join(extra)}")
    return problems


def _applies_rope(layer: nn.Module) -> bool:
    """Whether an MLA layer rotates: one that takes no position embeddings applies no RoPE
    (Kimi Linear's MLA), and is copied with `rope=None`."""
    return "position_embeddings" in inspect.signature(type(layer).forward).parameters


def _mla_rope(config: Any) -> Rope:
    """The RoPE of a Hugging Face MLA layer's config; refuses one that changes with length."""
    rope_base, scaling = hf_rope(config)
    rope_type = "default" if scaling is None else scaling.rope_type
    if rope_type not in _STATIC_ROPE_TYPES:
        static = ", ".join(repr(t) for t in _STATIC_ROPE_TYPES)
        raise ValueError(
            f"layer's config has rope_type={rope_type!r}, whose frequencies change with "
            f"the sequence length; MultiHeadLatentAttention supports {static}"
        )
    interleave = getattr(config, "rope_interleave", True)
    return Rope(rope_base, "interleaved" if interleave else "half", None, scaling)


def mla_from_hf(cls: type[L], layer: nn.Module, *, ignore: Sequence[str] = ()) -> L:
    """The body of
    [`MultiHeadLatentAttention.from_hf`][attnlab.layers.mla.MultiHeadLatentAttention.from_hf]."""
    if isinstance(ignore, str) or not all(isinstance(n, str) for n in ignore):
        raise TypeError(f"ignore must be a sequence of part names, got {ignore!r}")
    parts = {n for n, _ in layer.named_children()}
    parts |= {n for n, _ in layer.named_parameters(recurse=False)}
    unknown = [n for n in ignore if n not in parts or n in _MLA_MODULES]
    if unknown:
        raise ValueError(
            f"ignore names {', '.join(unknown)}, which {type(layer).__name__} does not "
            "have as an extra part (its MLA parts cannot be ignored)"
        )
    problems = _mla_structure_problems(layer, ignore)
    if problems:
        raise TypeError(
            f"layer must have the structure of a transformers MLA layer such as "
            f"DeepseekV3Attention, but {type(layer).__name__} has {'; '.join(problems)}"
        )
    hf: Any = layer
    weight = hf.kv_b_proj.weight
    mla = cls(
        hf.hidden_size,
        hf.num_heads,
        **latent_sizes(hf),
        q_lora_rank=hf.q_lora_rank,
        rope=_mla_rope(hf.config) if _applies_rope(layer) else None,
        softmax_scale=float(hf.scaling),
        bias=hf.kv_a_proj_with_mqa.bias is not None,
        norm_eps=float(hf.kv_a_layernorm.variance_epsilon),
        dropout=float(hf.attention_dropout),
    ).to(device=weight.device, dtype=weight.dtype)
    pairs: list[tuple[nn.Module | None, nn.Module | None]] = [
        (mla.q_proj, getattr(hf, "q_proj", None)),
        (mla.q_down, getattr(hf, "q_a_proj", None)),
        (mla.q_norm, getattr(hf, "q_a_layernorm", None)),
        (mla.q_up, getattr(hf, "q_b_proj", None)),
        (mla.kv_down, hf.kv_a_proj_with_mqa),
        (mla.kv_norm, hf.kv_a_layernorm),
        (mla.kv_up, hf.kv_b_proj),
        (mla.out_proj, hf.o_proj),
    ]
    for ours, theirs in pairs:
        if ours is not None and theirs is not None:
            # Same parameter names ("weight", "bias") and shapes on both sides.
            ours.load_state_dict(theirs.state_dict())
    if mla.q_norm is not None:
        mla.q_norm.eps = float(hf.q_a_layernorm.variance_epsilon)
    return mla.train(hf.training)


def dsa_from_hf(cls: type[S], layer: nn.Module) -> S:
    """The body of
    [`DeepSeekSparseAttention.from_hf`][attnlab.layers.sparse.DeepSeekSparseAttention.from_hf]."""
    hf: Any = layer
    index = getattr(layer, "indexer", None)
    needed = ("wq_b", "wk", "k_norm", "weights_proj", "n_heads", "head_dim", "index_topk")
    missing = [n for n in needed if not hasattr(index, n)]
    if index is None or missing:
        raise TypeError(
            f"layer must have the structure of transformers' DeepseekV32Attention, but "
            f"{type(layer).__name__} has "
            + ("no indexer" if index is None else f"an indexer without {', '.join(missing)}")
        )
    mla = MultiHeadLatentAttention.from_hf(layer, ignore=("indexer",))
    hi: Any = index
    weight = hi.wk.weight
    indexer = LightningIndexer(
        hf.hidden_size,
        hi.n_heads,
        hi.head_dim,
        d_query=hi.wq_b.in_features,
        rope_dim=hi.qk_rope_head_dim,
        norm_eps=float(hi.k_norm.eps),
    ).to(device=weight.device, dtype=weight.dtype)
    pairs = [
        (indexer.q_proj, hi.wq_b),
        (indexer.k_proj, hi.wk),
        (indexer.k_norm, hi.k_norm),
        (indexer.weights_proj, hi.weights_proj),
    ]
    for ours, theirs in pairs:
        ours.load_state_dict(theirs.state_dict())
    return cls(mla, indexer, topk=int(hi.index_topk)).train(hf.training)


_V4_KINDS: dict[str, Kind] = {"sliding_attention": "window", "compressed_sparse_attention": "csa"}
_V4_KINDS |= {"heavily_compressed_attention": "hca"}


def compressed_from_hf(cls: type[V], layer: Any) -> V:
    """The body of
    [`CompressedAttention.from_hf`][attnlab.layers.compressed.CompressedAttention.from_hf]."""
    if not {"compressor", "o_a_proj", "sinks"} <= set(dir(layer)):
        raise TypeError(
            f"layer must be a transformers DeepseekV4Attention, got {type(layer).__name__}"
        )
    c, kind = layer.config, _V4_KINDS[layer.layer_type]
    ropes = {name: c.rope_parameters[name] for name in ("main", "compress")}
    if (main := ropes["main"]["rope_type"]) != "default":
        raise ValueError(
            f"layer.config.rope_parameters['main']['rope_type']={main!r}: the window "
            "layers' RoPE is ported unscaled only ('default')"
        )
    _, compress_scaling = hf_rope(c, "compress")  # the released V4: YaRN
    ratio = c.compress_rates.get(layer.layer_type, 1)
    config = CompressedConfig(
        kind, c.num_attention_heads, c.head_dim, c.q_lora_rank, c.sliding_window,
        int(c.head_dim * ropes["compress"]["partial_rotary_factor"]), ratio, c.o_groups,
        c.o_lora_rank, ropes["main"]["rope_theta"], ropes["compress"]["rope_theta"],
        c.index_n_heads, c.index_head_dim, c.index_topk, c.rms_norm_eps, compress_scaling,
    )  # fmt: skip
    names = {"q_down": "q_a_proj", "q_norm": "q_a_norm", "q_up": "q_b_proj", "out_up": "o_b_proj"}
    names |= {"kv_proj": "kv_proj", "kv_norm": "kv_norm", "sink_logits": "sinks"}
    if kind == "csa":
        names |= {
            "index_compressor": "compressor.indexer",
            "index_q_up": "compressor.indexer.q_b_proj",
        }
        names |= {"index_weights": "compressor.indexer.scorer.weights_proj"}
    weight = layer.kv_proj.weight
    new = cls(c.hidden_size, config).to(device=weight.device, dtype=weight.dtype)
    state = {"out_down": layer.o_a_proj.weight.view(c.o_groups, c.o_lora_rank, -1)}
    for key in new.state_dict():
        ours, _, rest = key.partition(".")
        if key != "out_down":
            theirs = names.get(ours, ours)  # "compressor" is "compressor"
            state[key] = layer.get_parameter(f"{theirs}.{rest}" if rest else theirs)
    new.load_state_dict({k: v.detach().clone() for k, v in state.items()})
    return new.train(layer.training)


# -- linear attention ---------------------------------------------------------------------

_DELTANET_SPLIT = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
"""Qwen3.5's separate projections; Qwen3-Next fuses them into `in_proj_qkvz`, `in_proj_ba`."""


def gated_deltanet_from_hf(cls: type[N], layer: Any, *, mode: str, chunk_size: int) -> N:
    """The body of [`GatedDeltaNet.from_hf`][attnlab.layers.linear.GatedDeltaNet.from_hf]."""
    _check_deltanet(layer)
    kimi = _is_kimi(layer)
    if kimi:  # one set of heads for keys and values, a decay per key channel
        d, heads = layer.head_dim, layer.num_heads
        sizes = {"num_k_heads": heads, "num_v_heads": heads, "head_k_dim": d, "head_v_dim": d}
        gates = DeltaGates(decay="channel", rank=d, activation="sigmoid")
        norm, weight = layer.o_norm, layer.o_proj.weight
    else:
        sizes = {n: getattr(layer, n) for n in ("num_k_heads", "num_v_heads")}
        sizes |= {n: getattr(layer, n) for n in ("head_k_dim", "head_v_dim")}
        gates, norm, weight = DeltaGates(), layer.norm, layer.out_proj.weight
    new = cls(
        layer.hidden_size, **sizes, kernel_size=layer.conv_kernel_size, mode=mode,
        chunk_size=chunk_size, norm_eps=norm.variance_epsilon, gates=gates,
    )  # fmt: skip
    new.to(device=weight.device, dtype=weight.dtype)
    if kimi:  # transformers keeps the decay's parameters in float32 (fp32-strict)
        for name in ("dt_bias", "A_log"):
            param = getattr(new, name)
            param.data = param.data.to(getattr(layer.forget_gate, name).dtype)
    new.load_state_dict(gated_deltanet_state_dict(layer))
    return new


def _is_kimi(layer: Any) -> bool:
    """Whether `layer` is Kimi Linear's `KimiLinearDeltaAttention` (its gates in a
    `forget_gate` module and low-rank `g_a_proj`, `g_b_proj`)."""
    return hasattr(layer, "forget_gate")


def _kimi_state_dict(layer: Any) -> dict[str, Tensor]:
    """`KimiLinearDeltaAttention`'s weights under `GatedDeltaNet`'s names."""
    gate = layer.forget_gate
    return {
        **{f"{n}_proj.weight": getattr(layer, f"{n}_proj").weight for n in "qkvb"},
        "conv_weight": layer.conv1d.weight.squeeze(1),
        "a_proj.0.weight": gate.f_a_proj.weight,
        "a_proj.1.weight": gate.f_b_proj.weight,
        "dt_bias": gate.dt_bias,
        "A_log": gate.A_log.reshape(-1),  # (1, 1, heads, 1) there
        "z_proj.0.weight": layer.g_a_proj.weight,
        "z_proj.1.weight": layer.g_b_proj.weight,
        "norm_weight": layer.o_norm.weight,
        "out_proj.weight": layer.o_proj.weight,
    }


def gated_deltanet_state_dict(layer: Any) -> dict[str, Tensor]:
    """The body of
    [`GatedDeltaNet.state_dict_from_hf`][attnlab.layers.linear.GatedDeltaNet.state_dict_from_hf]."""
    _check_deltanet(layer)
    if _is_kimi(layer):
        return _kimi_state_dict(layer)
    d_k, key_dim = layer.head_k_dim, layer.num_k_heads * layer.head_k_dim
    if not all(hasattr(layer, name) for name in _DELTANET_SPLIT):  # Qwen3-Next's fused rows
        group_v = layer.num_v_heads // layer.num_k_heads * layer.head_v_dim
        parts = split_deltanet_projections(
            layer.in_proj_qkvz.weight, layer.in_proj_ba.weight, layer.num_k_heads, d_k, group_v
        )
    else:
        value_dim = layer.num_v_heads * layer.head_v_dim
        qkv = torch.split(layer.in_proj_qkv.weight, [key_dim, key_dim, value_dim])
        parts = (*qkv, *(getattr(layer, name).weight for name in _DELTANET_SPLIT[1:]))
    state = {f"{n}_proj.weight": w for n, w in zip("qkvzba", parts, strict=True)}
    return state | {
        "conv_weight": layer.conv1d.weight.squeeze(1),
        "dt_bias": layer.dt_bias,
        "A_log": layer.A_log,
        "norm_weight": layer.norm.weight,
        "out_proj.weight": layer.out_proj.weight,
    }


def _check_deltanet(layer: Any) -> None:
    """Raise unless `layer` has what `GatedDeltaNet.from_hf` copies and computes as it does."""
    fused = not all(hasattr(layer, name) for name in _DELTANET_SPLIT)  # Qwen3-Next, not 3.5
    needed: tuple[str, ...] = ("conv1d", "dt_bias", "A_log", "norm", "out_proj")
    needed += ("in_proj_qkvz", "in_proj_ba") if fused else _DELTANET_SPLIT
    if _is_kimi(layer):
        needed = ("q_proj", "k_proj", "v_proj", "b_proj", "conv1d", "g_a_proj", "g_b_proj")
        needed += ("o_norm", "o_proj", "head_dim", "num_heads", "conv_kernel_size")
        gate = ("f_a_proj", "f_b_proj", "dt_bias", "A_log")
        needed += tuple(f"forget_gate.{n}" for n in gate if not hasattr(layer.forget_gate, n))
    missing = [name for name in needed if "." in name or not hasattr(layer, name)]
    if missing:
        raise ValueError(
            "layer must be a Qwen3NextGatedDeltaNet, Qwen3_5GatedDeltaNet or "
            f"KimiLinearDeltaAttention; {type(layer).__name__} has no {', '.join(missing)}"
        )
    if layer.conv1d.bias is not None or getattr(layer, "activation", "silu") != "silu":
        raise ValueError(
            "layer computes what GatedDeltaNet does not: a convolution bias or an "
            f"activation other than silu (activation={getattr(layer, 'activation', None)!r})"
        )


def split_deltanet_projections(
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


HF_DECODER_CLASSES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma4ForCausalLM",
    "Qwen3NextForCausalLM",
    "SmolLM3ForCausalLM",
    "KimiLinearForCausalLM",
    "Llama4ForCausalLM",
)
"""The `transformers` causal LMs (and their subclasses) that a `Decoder` ports."""


def decoder_from_hf(decoder_class: type[D], model: nn.Module) -> D:
    """The body of [`Decoder.from_hf`][attnlab.models.decoder.Decoder.from_hf].

    The state dict maps key for key, less the `model.` prefix
    ([`DecoderConfig.from_hf`][attnlab.models.config.DecoderConfig.from_hf] reads the
    settings). The attention layers are the ones
    [`GroupedQueryAttention.from_hf`][attnlab.layers.gqa.GroupedQueryAttention.from_hf]
    would build. Qwen3-Next's fused projections are split: each head's rows of `q_proj`
    hold its query, then its output gate (`self_attn.q_proj` and
    `self_attn.gate_proj` here), and the Gated DeltaNet layers' weights are the ones
    [`GatedDeltaNet.from_hf`][attnlab.layers.linear.GatedDeltaNet.from_hf] copies.
    """
    names = {c.__name__ for c in type(model).__mro__}
    if not names & set(HF_DECODER_CLASSES):
        supported = ", ".join(HF_DECODER_CLASSES)
        raise TypeError(f"model must be a transformers {supported}, got {type(model).__name__}")
    hf: Any = model
    config = DecoderConfig.from_hf(hf.config)
    weight = hf.model.embed_tokens.weight
    with torch.device("meta"):
        new = decoder_class(config)
    new = new.to_empty(device=weight.device).to(weight.dtype)
    if config.tie_embeddings:
        new.lm_head.weight = new.embed_tokens.weight
    latent = config.latent is not None  # Kimi Linear: both kinds of layer are `self_attn`
    state = {
        _from_hf_names(key.removeprefix("model.").replace(".feed_forward.", ".mlp.")): value
        for key, value in hf.state_dict().items()
        if "rotary_emb" not in key
        and ".linear_attn." not in key
        and not (latent and ".self_attn." in key)
    }
    if config.attn_output_gate:
        state = _split_output_gates(state, config)
    for i, layer in enumerate(hf.model.layers):
        mixer = getattr(layer, "linear_attn", None) or layer.self_attn
        if config.kind(i) == "linear":
            ported = gated_deltanet_state_dict(mixer)
            state |= {f"layers.{i}.linear_attn.{k}": v for k, v in ported.items()}
        elif latent:  # the weights MultiHeadLatentAttention.from_hf copies
            ported = mla_from_hf(MultiHeadLatentAttention, mixer).state_dict()
            state |= {f"layers.{i}.self_attn.{k}": v for k, v in ported.items()}
    new.load_state_dict(state, strict=True)
    return new.train(model.training)


def _split_output_gates(state: dict[str, Tensor], config: DecoderConfig) -> dict[str, Tensor]:
    """Qwen3-Next's fused `q_proj` keys as the `q_proj` and `gate_proj` of a
    [`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention] with an output gate.

    Its `q_proj` rows (and bias) hold, per head, `head_dim` query rows then `head_dim`
    gate rows; every other key is the same.
    """
    out = {}
    h, hd = config.num_heads, config.head_dim
    for key, value in state.items():
        prefix, fused, name = key.partition(".self_attn.q_proj.")
        if not fused:
            out[key] = value
            continue
        query, gate = torch.split(value.reshape(h, 2 * hd, *value.shape[1:]), hd, dim=1)
        out[key] = query.reshape(h * hd, *value.shape[1:])
        out[f"{prefix}.self_attn.gate_proj.{name}"] = gate.reshape(h * hd, *value.shape[1:])
    return out
