"""Interoperability with Hugging Face `transformers`: porting its models into attnlab's.

[`Decoder.from_hf`][attnlab.models.decoder.Decoder.from_hf] hands off here: the classes it
accepts, the state dict renamed key for key, and Qwen3-Next's fused query-and-gate rows
split into [`GatedAttention`][attnlab.layers.gated.GatedAttention]'s two projections.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor, nn

from attnlab.layers.linear import GatedDeltaNet
from attnlab.models.config import DecoderConfig

if TYPE_CHECKING:
    from attnlab.models.decoder import Decoder

__all__ = ["HF_DECODER_CLASSES", "decoder_from_hf"]

HF_DECODER_CLASSES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Qwen3NextForCausalLM",
)
"""The `transformers` causal LMs (and their subclasses) that a `Decoder` ports."""

D = TypeVar("D", bound="Decoder")


def decoder_from_hf(decoder_class: type[D], model: nn.Module) -> D:
    """The body of [`Decoder.from_hf`][attnlab.models.decoder.Decoder.from_hf] (see there)."""
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
