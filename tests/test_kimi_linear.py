"""Kimi Linear as an attnlab Decoder: Kimi Delta Attention layers and MLA layers without
RoPE, against transformers' KimiLinearForCausalLM on small random configs (dense MLPs:
its mixture of experts is not ported): logits, gradients, greedy generation with both
caches, and the caches after a prefill."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close
from transformers import DynamicCache, KimiLinearConfig, KimiLinearForCausalLM

from attnlab.caches.kv import KVCache
from attnlab.layers.linear import DeltaGates, GatedDeltaNetState
from attnlab.layers.mla import MultiHeadLatentAttention
from attnlab.models.config import DecoderConfig, LatentAttentionConfig, LinearAttentionConfig
from attnlab.models.decoder import Decoder
from attnlab.serving.engine import Engine

pytestmark = pytest.mark.usefixtures("one_thread")
ATOL = 1e-5
VOCAB = 97


def _hf_model(**overrides: Any) -> KimiLinearForCausalLM:
    # Three KDA layers to one MLA layer, as the released model; every MLP dense. All
    # sizes differ; weights five times the default scale, so that logits spread and
    # greedy steps are far from ties.
    settings: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=40, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=12, q_lora_rank=10,
        qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, initializer_range=0.1,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        mlp_layer_types=["dense"] * 4, linear_attn_config={"head_dim": 6, "num_heads": 3,
        "short_conv_kernel_size": 3}, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    model = KimiLinearForCausalLM(KimiLinearConfig(**(settings | overrides))).eval()
    with torch.no_grad():  # fresh norms are exactly 1 and dt_bias fixed: vary them
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight", "dt_bias")):
                p.uniform_(0.5, 1.5)
    return model


def _ours(hf: KimiLinearForCausalLM) -> Decoder:
    model = Decoder.from_hf(hf)
    for layer in model.layers:  # short chunks: prompts span several
        if layer.linear_attn is not None:
            layer.linear_attn.chunk_size = 4
    return model


def test_config_from_kimi_linear() -> None:
    hf = _hf_model()
    ours = _ours(hf)
    c = ours.config
    assert c.layer_kinds == ("linear", "linear", "linear", "full")
    kda = DeltaGates(decay="channel", rank=6, activation="sigmoid")
    assert c.linear == LinearAttentionConfig(3, 3, 6, 6, kernel_size=3, gates=kda)
    assert c.latent == LatentAttentionConfig(12, 6, 4, 5, q_lora_rank=10)
    assert c.rope_layers == (False,) * 4
    attn = ours.layers[3].self_attn
    assert isinstance(attn, MultiHeadLatentAttention)
    assert attn.rope is None


@pytest.mark.parametrize(
    "settings",
    [{}, {"q_lora_rank": None, "attention_bias": True, "tie_word_embeddings": True}],
    ids=["kimi-linear", "full-q-bias-tied"],
)
def test_logits_equal_kimi_linear(settings: dict[str, Any]) -> None:
    hf = _hf_model(**settings)
    ours = _ours(hf)
    ids = torch.randint(3, VOCAB, (2, 11))
    with torch.no_grad():
        assert_close(ours(ids), hf(ids).logits, atol=ATOL, rtol=0)
    # transformers' Kimi Linear ties nothing, whatever tie_word_embeddings says
    assert ours.lm_head.weight is not ours.embed_tokens.weight


def test_gradients_equal_kimi_linear() -> None:
    hf = _hf_model()
    ours = _ours(hf)
    ids = torch.randint(3, VOCAB, (2, 9))
    hf(ids).logits.square().mean().backward()
    ours(ids).square().mean().backward()
    pairs = {
        "embed_tokens.weight": "embed_tokens.weight",
        "layers.0.linear_attn.a_proj.0.weight": "layers.0.self_attn.forget_gate.f_a_proj.weight",
        "layers.3.self_attn.kv_up.weight": "layers.3.self_attn.kv_b_proj.weight",
        "layers.3.mlp.up_proj.weight": "layers.3.mlp.up_proj.weight",
    }
    for name, hf_name in pairs.items():
        theirs = hf.get_parameter(f"model.{hf_name}").grad
        assert theirs is not None
        assert_close(ours.get_parameter(name).grad, theirs, atol=ATOL, rtol=1e-4)


def test_greedy_generation_equals_kimi_linear_with_caches() -> None:
    hf = _hf_model()
    ours = _ours(hf)
    ids = torch.randint(3, VOCAB, (2, 7))
    with torch.no_grad():
        expected = hf.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)
    assert torch.equal(ours.generate(ids, 12), expected)
    assert torch.equal(ours.generate(ids, 12, cache="dynamic"), expected)


def test_caches_after_prefill_equal_hugging_faces() -> None:
    hf = _hf_model()
    ours = _ours(hf)
    ids = torch.randint(3, VOCAB, (2, 9))
    cache = DynamicCache(config=hf.config)
    caches = ours.make_cache(2, 16)
    assert [type(c).__name__ for c in caches] == ["GatedDeltaNetState"] * 3 + ["StaticKVCache"]
    with torch.no_grad():
        hf(ids[:, :8], cache=cache, use_cache=True)
        ours(ids[:, :8], cache=caches)
        step = hf(ids[:, 8:], cache=cache, use_cache=True).logits
        assert_close(ours(ids[:, 8:], cache=caches), step, atol=ATOL, rtol=0)
    for i in range(3):
        state = caches[i]
        assert isinstance(state, GatedDeltaNetState)
        assert_close(state.recurrent, cache.get_recurrent_state(i), atol=ATOL, rtol=1e-4)
    latents = caches[3]
    assert isinstance(latents, KVCache)
    # The MLA layer caches one latent (12) and one shared key part (4) per token, as
    # transformers' cache holds them.
    keys, values = latents.update(torch.empty(2, 1, 0, 12), torch.empty(2, 1, 0, 4))
    assert_close(keys, cache.layers[3].keys, atol=ATOL, rtol=1e-4)
    assert_close(values, cache.layers[3].values, atol=ATOL, rtol=1e-4)


def test_what_is_not_ported_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"mixture of experts .* is not ported"):
        Decoder.from_hf(_hf_model(mlp_layer_types=["dense", "sparse", "sparse", "sparse"]))
    ours = _ours(_hf_model())
    with pytest.raises(ValueError, match="has no attention maps"):
        ours.attention_maps(torch.randint(3, VOCAB, (1, 5)))
    c = ours.config
    all_mla = Decoder(DecoderConfig(**{**c.__dict__, "layer_kinds": None, "linear": None}))
    with pytest.raises(ValueError, match="attention is latent"):
        Engine(all_mla, num_blocks=8, block_size=4)
    with pytest.raises(ValueError, match="latent attention in a Decoder rotates nothing"):
        DecoderConfig(**{**c.__dict__, "rope_layers": None})
    with pytest.raises(ValueError, match="latent attention has no qk_norm='head'"):
        DecoderConfig(**{**c.__dict__, "qk_norm": "head"})
