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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from attnlab._validation import (
    check_attn_mask,
    check_bool,
    check_positive_int,
    check_softcap,
    is_validation_enabled,
    value_checks_enabled,
)
from attnlab.gqa import QK_NORMS, GroupedQueryAttention, QKNorm, RMSNorm
from attnlab.kv_cache import (
    AttendingCache,
    DynamicKVCache,
    KVCache,
    RollingKVCache,
    StaticKVCache,
)
from attnlab.masks import combine_impl
from attnlab.rope import RopeScaling, check_base, check_positions, rope_cos_sin

__all__ = ["Decoder", "DecoderBlock", "DecoderConfig", "SwiGLU"]

CacheKind = Literal["static", "dynamic"]
Family = Literal["llama", "gemma"]
LayerCache = KVCache | AttendingCache
_HF_CLASSES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
)
_FAMILIES: tuple[Family, ...] = ("llama", "gemma")


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
        family: `"llama"`, or `"gemma"`: norms scaling by `1 + weight` (QK-norm's too),
            the embedding times $\\sqrt{d_\\text{model}}$, a tanh-GELU gate and four
            norms per block.
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
        qpas = self.query_pre_attn_scalar
        if qpas is not None and (
            isinstance(qpas, bool) or not isinstance(qpas, float | int) or not qpas > 0
        ):
            raise ValueError(f"query_pre_attn_scalar must be a positive number, got {qpas!r}")
        if self.qk_norm is not None and self.qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm must be one of {QK_NORMS} or None, got {self.qk_norm!r}")
        check_softcap("attn_softcap", self.attn_softcap)
        check_softcap("final_softcap", self.final_softcap)
        if self.family not in _FAMILIES:
            raise ValueError(f"family must be one of {_FAMILIES}, got {self.family!r}")
        if not isinstance(self.norm_eps, float | int) or not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be a positive number, got {self.norm_eps!r}")
        if self.windows is not None and len(self.windows) != self.num_layers:
            raise ValueError(
                f"windows must give one entry per layer, got {len(self.windows)} for "
                f"num_layers={self.num_layers}"
            )

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
        """The settings of a Hugging Face Llama, Mistral, Qwen2, Gemma 2 or Gemma 3 config.

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
        rope = dict(getattr(config, "rope_parameters", None) or {})
        scaling = RopeScaling.from_hf(config)
        max_positions = int(config.max_position_embeddings)
        if scaling.is_dynamic:
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
            rope_base=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            norm_eps=float(config.rms_norm_eps),
            max_positions=max_positions,
            tie_embeddings=bool(config.tie_word_embeddings),
            qkv_bias=True if qwen2 else attention_bias,
            out_bias=False if qwen2 else attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            windows=windows,
            rope_scaling=None if scaling.rope_type == "default" else scaling,
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

        def rope(kind: str | None) -> tuple[float, RopeScaling | None]:
            params = config.rope_parameters if kind is None else config.rope_parameters[kind]
            one = SimpleNamespace(
                rope_parameters=params, max_position_embeddings=config.max_position_embeddings
            )
            scaling = RopeScaling.from_hf(one)
            return float(params["rope_theta"]), None if scaling.rope_type == "default" else scaling

        if gemma3:  # one RoPE per layer type
            (base, scaling), (local_base, local_scaling) = (
                rope("full_attention"),
                rope("sliding_attention"),
            )
        else:
            (base, scaling), local_base, local_scaling = rope(None), None, None
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


class DecoderBlock(nn.Module):
    """One pre-norm block: attention, then the MLP, each added to the residual stream.

    In the Gemma family the outputs of the attention and of the MLP are normalised too
    before they are added (`post_attention_layernorm`, `post_feedforward_layernorm`;
    `pre_feedforward_layernorm` is the MLP's input norm), as in `Gemma3DecoderLayer`.

    `forward` does not check its input: it runs inside a
    [`Decoder`][attnlab.llm.Decoder], which checked the tokens at its boundary.
    """

    def __init__(self, config: DecoderConfig, layer: int = 0) -> None:
        super().__init__()
        gemma = config.family == "gemma"
        base, scaling = config.rope(layer)
        self.input_layernorm = _norm(config)
        self.self_attn = GroupedQueryAttention(
            config.d_model,
            config.num_heads,
            config.num_kv_heads,
            head_dim=config.head_dim,
            bias=config.qkv_bias,
            out_bias=config.out_bias,
            rope_base=base,
            rope_scaling=scaling,
            window=config.window(layer),
            scale=config.scale,
            qk_norm=config.qk_norm,
            qk_norm_eps=float(config.norm_eps),
            qk_norm_unit_offset=gemma,
            softcap=config.attn_softcap,
            backend="torch" if config.attn_softcap is None else "scratch",
        )
        self.post_attention_layernorm = _norm(config)
        self.pre_feedforward_layernorm = _norm(config) if gemma else None
        self.post_feedforward_layernorm = _norm(config) if gemma else None
        activation: Literal["silu", "gelu_tanh"] = "gelu_tanh" if gemma else "silu"
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
    ) -> Tensor:
        if isinstance(cache, RollingKVCache) and attn_mask is not None and attn_mask.shape[-1] > 1:
            # The model's mask covers every token seen; a rolling cache hands the layer
            # only its held tokens and the new ones, the last columns.
            attn_mask = attn_mask[..., -(cache.held + x.shape[1]) :]
        attn = self.self_attn.forward_impl(
            self.input_layernorm(x),
            position_embeddings=position_embeddings,
            cache=cache,
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
    ) -> list[KVCache]:
        """One empty KV cache per layer, on the model's device and in its dtype.

        A sliding-window layer gets a [`RollingKVCache`][attnlab.kv_cache.RollingKVCache]
        (it keeps only the last `window - 1` tokens, whatever `kind`), unless `rolling`
        is False; every other layer gets a cache of `kind`.

        Args:
            batch_size: Sequences decoded together (a static cache's batch size).
            max_length: Tokens a static cache holds; default `config.max_positions`.
            kind: `"static"` (preallocated, written in place) or `"dynamic"` (grows).
            rolling: Whether sliding-window layers get a rolling cache (False: the same
                kind as the others, holding every token).

        Returns:
            A list of `num_layers` caches, to pass as `cache=` to `forward` and `generate`.
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

        def one(layer: int) -> KVCache:
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
        if not isinstance(ids, Tensor):
            raise TypeError(f"ids must be a torch.Tensor of token ids, got {type(ids).__name__}")
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(
                f"ids must be an integer tensor of token ids, got dtype {ids.dtype} "
                f"(ids.shape={tuple(ids.shape)}); e.g. tokenizer(text, return_tensors='pt')"
            )
        if ids.ndim not in (1, 2):
            raise ValueError(
                f"ids must be (t,) or (b, t) token ids, got ids.shape={tuple(ids.shape)}"
            )
        if ids.shape[-1] == 0:
            raise ValueError(
                f"ids is empty (ids.shape={tuple(ids.shape)}): give at least one token"
            )
        device = self.embed_tokens.weight.device
        if ids.device != device:
            raise ValueError(f"ids is on {ids.device} but the model is on {device}")
        vocab = self.config.vocab_size
        if value_checks_enabled():  # reads the ids: a host sync, skipped while tracing
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= vocab:
                raise ValueError(
                    f"ids must be token ids in [0, vocab_size={vocab}), got values from "
                    f"{low} to {high}"
                )
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
        if not isinstance(logits_at, Tensor) or logits_at.dtype.is_floating_point:
            raise TypeError(f"logits_at must be an integer tensor, got {logits_at!r}")
        if tuple(logits_at.shape) != (b,):
            raise ValueError(
                f"logits_at must have shape (b,) = ({b},), one index per row, got "
                f"{tuple(logits_at.shape)}"
            )
        if value_checks_enabled() and b and not bool(((logits_at >= 0) & (logits_at < t)).all()):
            raise ValueError(f"logits_at must index the t={t} tokens, got {logits_at.tolist()}")

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
        if not isinstance(mask, Tensor):
            raise TypeError(
                f"padding_mask must be a tensor, 1 (or True) at real tokens and 0 at "
                f"padding, got {type(mask).__name__}"
            )
        if mask.dtype.is_floating_point or mask.dtype.is_complex:
            raise TypeError(
                f"padding_mask must be a bool or integer tensor (1 = token, 0 = padding), "
                f"got dtype {mask.dtype}"
            )
        if tuple(mask.shape) != (batch, total):
            raise ValueError(
                f"padding_mask must have shape (b, cached + t) = {(batch, total)} (one "
                f"entry per cached and new token), got {tuple(mask.shape)}"
            )
        if mask.device != self.embed_tokens.weight.device:
            raise ValueError(f"padding_mask is on {mask.device}, the model elsewhere")
        if value_checks_enabled():  # reads the mask: a host sync, skipped while tracing
            m = mask.long()
            if not bool(((m == 0) | (m == 1)).all()):
                raise ValueError("padding_mask must hold only 0 and 1 (or False and True)")
            if not bool((m[:, 1:] >= m[:, :-1]).all()):
                raise ValueError(
                    "padding_mask must pad on the left (zeros before the tokens of each "
                    "row): pass tokenizer(..., padding_side='left') output"
                )
            if not bool(m[:, -1].all()):
                raise ValueError("padding_mask has a row without tokens")
        return mask.bool()

    # -- the forward pass ----------------------------------------------------------------

    def _prepare(
        self,
        ids: Tensor,
        cache: Sequence[LayerCache] | None,
        positions: Tensor | None,
        padding_mask: Tensor | None,
        attn_mask: Tensor | None,
        validate: bool,
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]], Tensor | None]:
        """Embed; build the RoPE tables (one per kind of layer) and the mask, once."""
        c = self.config
        b, t = ids.shape
        if cache and isinstance(cache[0], AttendingCache):
            # A paged cache of sequences of different lengths: the caller places every
            # token, and the cache decides what each query sees.
            x = self._embed(ids)  # (b, t, d_model)
            if validate:
                self._check_attending(cache, positions, padding_mask, attn_mask)
                check_positions(positions, x, low=0, high=c.max_positions, x_name="ids")
            assert positions is not None
            return x, self._rope_tables(positions), None
        kv = cast("Sequence[KVCache] | None", cache)
        past = self._check_cache(kv, b) if validate else (kv[0].length if kv else 0)
        if validate and past + t > c.max_positions:
            raise ValueError(
                f"ids has t={t} tokens after {past} cached: {past + t} positions, past "
                f"the model's max_positions={c.max_positions}"
            )
        x = self._embed(ids)  # (b, t, d_model)
        mask = None
        if padding_mask is not None:
            pad = self._check_padding(padding_mask, b, past + t) if validate else padding_mask
            pad = pad.bool()
            if positions is None:  # count only real tokens, as transformers does
                positions = (pad.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # (b, t)
            if t > 1 or not bool(pad.all()):
                # Keys at padding are hidden; a padded query sees itself, so that no row
                # is all masked (softmax of nothing is NaN, which would reach the values).
                mask = pad[:, None, None, :].expand(b, 1, t, past + t).clone()  # (b, 1, t, T)
                diag = torch.arange(t, device=ids.device)
                mask[:, 0, diag, past + diag] = True
        if attn_mask is not None:
            if validate:
                target = (b, c.num_heads, t, past + t)
                check_attn_mask("attn_mask", attn_mask, target, x, query_name="ids")
            mask = combine_impl(mask, attn_mask)
        if positions is None:
            positions = torch.arange(past, past + t, device=ids.device)  # (t,)
        elif validate:
            check_positions(positions, x, low=0, high=c.max_positions, x_name="ids")
        return x, self._rope_tables(positions), mask

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
                base, scaling = key  # (..., t, head_dim / 2) each
                tables[key] = rope_cos_sin(positions, c.head_dim, base=base, scaling=scaling)
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
        x, tables, mask = self._prepare(ids, cache, positions, padding_mask, attn_mask, validate)
        for i, layer in enumerate(self.layers):
            x = layer(x, tables[i], None if cache is None else cache[i], mask)  # (b, t, d_model)
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
            x, tables, mask = self._prepare(ids2, None, None, padding_mask, attn_mask, validate)
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
        cache: CacheKind | Sequence[KVCache] = "static",
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
        eos = _token_set("eos_token_id", eos_token_id, self.config.vocab_size)
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
        cache: CacheKind | Sequence[KVCache] = "static",
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

    def _generation_cache(self, cache: object, batch: int, t: int, steps: int) -> Sequence[KVCache]:
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
        `Qwen2ForCausalLM`, `Gemma2ForCausalLM` and `Gemma3ForCausalLM` (text only;
        and subclasses): the
        state dict maps key for key, less the
        `model.` prefix ([`DecoderConfig.from_hf`][attnlab.llm.DecoderConfig.from_hf]
        reads the settings). The attention layers are the ones
        [`GroupedQueryAttention.from_hf`][attnlab.gqa.GroupedQueryAttention.from_hf]
        would build.

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
            if "rotary_emb" not in key
        }
        new.load_state_dict(state, strict=True)
        return new.train(model.training)


def _norm(config: DecoderConfig) -> nn.Module:
    """The RMSNorm of the family: `weight` (Llama) or `1 + weight` (Gemma)."""
    if config.family == "gemma":
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


def _token_set(name: str, value: object, vocab: int) -> list[int]:
    if value is None:
        return []
    items = [value] if isinstance(value, int) else value
    if not isinstance(items, Sequence) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in items
    ):
        raise TypeError(f"{name} must be an int, a sequence of ints or None, got {value!r}")
    ids = list(items)
    if any(not 0 <= i < vocab for i in ids):
        raise ValueError(f"{name} must be in [0, vocab_size={vocab}), got {value!r}")
    return ids


def _pad_token(pad_token_id: object, eos: list[int], vocab: int) -> int:
    if pad_token_id is None:
        return eos[0] if eos else 0
    return _token_set("pad_token_id", pad_token_id, vocab)[0]


def _isin(token: Tensor, ids: list[int]) -> Tensor:
    return torch.isin(token, torch.tensor(ids, device=token.device))
