"""A hybrid attnlab.models.decoder.Decoder (Gated DeltaNet, full and sliding attention per layer)
against transformers' Qwen3NextForCausalLM on small random configs: logits, greedy
generation with the caches (fixed-size states in the linear layers, KV caches in the
others), left-padded batches, and the mixture-of-experts MLP on its own."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close
from transformers import DynamicCache, Qwen3NextConfig, Qwen3NextForCausalLM
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock

from attnlab.caches.kv import KVCache, RollingKVCache
from attnlab.layers.linear import GatedDeltaNetState
from attnlab.layers.mlp import MoEConfig, SparseMoE
from attnlab.models.config import DecoderConfig, LinearAttentionConfig
from attnlab.models.decoder import Decoder

pytestmark = pytest.mark.usefixtures("one_thread")
ATOL = 1e-5


def _hf_model(**overrides: Any) -> Qwen3NextForCausalLM:
    # Three Gated DeltaNet layers to one gated full-attention layer, as Qwen3-Next; a
    # mixture of experts in every layer but layer 1 (a dense SwiGLU); RoPE on half of
    # each head. All sizes differ; weights five times the default scale, so that logits
    # spread (about +-2) and greedy steps are far from ties.
    settings: dict[str, Any] = dict(
        vocab_size=97, hidden_size=32, intermediate_size=40, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        linear_conv_kernel_dim=3, linear_key_head_dim=6, linear_value_head_dim=5,
        linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=12,
        shared_expert_intermediate_size=14, num_experts=5, num_experts_per_tok=2,
        mlp_only_layers=[1], max_position_embeddings=64, initializer_range=0.1,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                         "partial_rotary_factor": 0.5},
    )  # fmt: skip
    model = Qwen3NextForCausalLM(Qwen3NextConfig(**(settings | overrides))).eval()
    with torch.no_grad():  # fresh norms are exactly 1 (+ 0) and dt_bias 1: vary them
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "dt_bias")):
                p.uniform_(-0.5, 0.5)
    return model


def _ours(hf: Qwen3NextForCausalLM, chunk_size: int = 4) -> Decoder:
    model = Decoder.from_hf(hf)
    for layer in model.layers:  # short chunks: prompts span several
        if layer.linear_attn is not None:
            layer.linear_attn.chunk_size = chunk_size
    return model


def test_config_from_qwen3_next() -> None:
    c = Decoder.from_hf(_hf_model()).config
    assert c.layer_kinds == ("linear", "linear", "linear", "full")
    assert c.linear == LinearAttentionConfig(2, 4, 6, 5, kernel_size=3)
    assert c.moe == MoEConfig(5, 2, 12, shared_dim=14)
    assert c.moe_layers == (True, False, True, True)
    assert (c.rope_dims, c.attn_output_gate, c.family, c.qk_norm) == (
        4,
        True,
        "qwen3_next",
        "head",
    )


@pytest.mark.parametrize(
    "settings",
    [
        {},
        # biases on the attention (its output gate's rows too), experts every second
        # layer, tied embeddings, all of RoPE, two full-attention layers of five
        dict(attention_bias=True, decoder_sparse_step=2, mlp_only_layers=[],
             tie_word_embeddings=True, num_hidden_layers=5,
             layer_types=["linear_attention", "full_attention"] * 2 + ["linear_attention"],
             rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                              "partial_rotary_factor": 1.0}),
    ],
    ids=["qwen3-next", "variants"],
)  # fmt: skip
def test_logits_equal_qwen3_next(settings: dict[str, Any]) -> None:
    hf = _hf_model(**settings)
    ours = _ours(hf)
    if settings:
        c = ours.config
        assert c.moe_layers == (False, True, False, True, False)
        assert c.tie_embeddings
        assert c.rope_dims == 8
        assert ours.lm_head.weight is ours.embed_tokens.weight
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids)
    assert_close(got, expected, atol=ATOL, rtol=0)


def test_gradients_equal_qwen3_next() -> None:
    hf = _hf_model()
    ours = _ours(hf)
    ids = torch.randint(0, 97, (2, 9))
    hf(ids).logits.square().mean().backward()
    ours(ids).square().mean().backward()
    for name in ("embed_tokens.weight", "layers.0.linear_attn.A_log", "layers.3.mlp.gate.weight"):
        theirs = hf.get_parameter(f"model.{name}").grad
        assert theirs is not None
        assert_close(ours.get_parameter(name).grad, theirs, atol=ATOL, rtol=1e-4)


def test_greedy_generation_equals_qwen3_next_with_caches() -> None:
    hf = _hf_model()
    ours = _ours(hf)
    ids = torch.randint(0, 97, (2, 7))
    with torch.no_grad():
        expected = hf.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)
    assert torch.equal(ours.generate(ids, 12), expected)
    assert torch.equal(ours.generate(ids, 12, cache="dynamic"), expected)


def test_caches_after_prefill_equal_hugging_faces() -> None:
    hf = _hf_model()
    ours = _ours(hf)
    ids = torch.randint(0, 97, (2, 9))
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
        assert state.seen == 9
        assert_close(state.recurrent, cache.get_recurrent_state(i), atol=ATOL, rtol=1e-4)
        assert_close(state.conv, cache.get_conv_state(i)[..., 1:], atol=ATOL, rtol=1e-4)
    kv = caches[3]
    assert isinstance(kv, KVCache)
    assert kv.length == 9
    keys, values = cache.layers[3].keys, cache.layers[3].values
    assert_close(kv._keys[..., :9, :], keys, atol=ATOL, rtol=0)  # type: ignore[attr-defined]
    assert_close(kv._values[..., :9, :], values, atol=ATOL, rtol=0)  # type: ignore[attr-defined]


def _left_padded() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 97, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, :4], mask[2, :7] = 0, 0
    return ids.masked_fill(mask == 0, 0), mask


def test_left_padded_batch_equals_qwen3_next() -> None:
    hf = _hf_model()
    ours = _ours(hf)
    ids, mask = _left_padded()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask, position_ids=positions).logits
        got = ours(ids, padding_mask=mask)
        alone = ours(ids[2:, 7:])  # the last row without its padding
    real = mask.bool()
    assert_close(got[real], expected[real], atol=ATOL, rtol=0)
    assert_close(got[2, 7:], alone[0], atol=ATOL, rtol=0)
    with torch.no_grad():
        generated = hf.generate(
            ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False
        )
    assert torch.equal(ours.generate(ids, 8, padding_mask=mask), generated)


def test_sparse_moe_equals_qwen3_next_block() -> None:
    hf = _hf_model()
    block = hf.model.layers[0].mlp
    assert isinstance(block, Qwen3NextSparseMoeBlock)
    ours = SparseMoE(32, MoEConfig(5, 2, 12, shared_dim=14))
    ours.load_state_dict(block.state_dict())
    x = torch.randn(3, 6, 32)
    with torch.no_grad():
        assert_close(ours(x), block(x), atol=1e-6, rtol=0)
    ours = SparseMoE(32, MoEConfig(5, 2, 12, norm_topk_prob=False))
    # Without the shared expert and the renormalisation, a token's output is the sum of
    # its two experts times their softmax probabilities: check one token by hand.
    with torch.no_grad():
        token = x[0, 0]
        probs = ours.gate(token).softmax(-1)
        top = probs.topk(2)
        expected = sum(
            p * _expert(ours, int(e), token) for p, e in zip(top.values, top.indices, strict=True)
        )
        assert_close(ours(x)[0, 0], expected, atol=1e-6, rtol=0)


def _expert(moe: SparseMoE, e: int, x: torch.Tensor) -> torch.Tensor:
    gate, up = (moe.experts.gate_up_proj[e] @ x).chunk(2)
    return moe.experts.down_proj[e] @ (torch.nn.functional.silu(gate) * up)


def test_three_kinds_decode_equals_one_pass() -> None:
    # No Hugging Face model mixes all three kinds: the reference is the model's own
    # uncached forward, which the tests above hold equal to Qwen3-Next.
    config = DecoderConfig(
        vocab_size=61, d_model=24, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=6,
        hidden_dim=40, windows=(None, 3, None), layer_kinds=("linear", "sliding", "full"),
        linear=LinearAttentionConfig(2, 4, 3, 5, kernel_size=3, chunk_size=4),
        rope_dims=4, family="qwen3_next", attn_output_gate=True,
    )  # fmt: skip
    model = Decoder(config).eval()
    ids = torch.randint(0, 61, (2, 6))
    out = model.generate(ids, 7)
    caches = model.make_cache(2, 13)
    assert isinstance(caches[1], RollingKVCache)
    assert torch.equal(model.generate(ids, 7, cache=caches), out)
    with torch.no_grad():
        full = model(out[:, :-1])
    assert torch.equal(full.argmax(-1)[:, 5:], out[:, 6:])


def test_rolling_cache_with_padding_equals_a_full_cache() -> None:
    # The model's padding mask spans every token seen; a rolling cache holds only the
    # last window - 1, and GQA keeps the mask's last columns (the one place that does).
    config = DecoderConfig(
        vocab_size=61, d_model=24, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=6,
        hidden_dim=40, windows=(3, None),
    )  # fmt: skip
    model = Decoder(config).eval()
    ids = torch.randint(1, 61, (2, 6))
    pad = torch.ones(2, 6, dtype=torch.long)
    pad[1, :2] = 0  # row 1 is left-padded
    rolling = model.make_cache(2, 13)
    assert isinstance(rolling[0], RollingKVCache)
    out = model.generate(ids, 7, padding_mask=pad, cache=rolling)
    full = model.generate(ids, 7, padding_mask=pad, cache=model.make_cache(2, 13, rolling=False))
    assert (rolling[0].seen, len(rolling[0])) == (12, 2)  # it forgot the older keys
    assert rolling[1].length == 12
    assert torch.equal(out, full)


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        (dict(layer_kinds=("full", "linear")), ValueError, r"give their sizes in linear="),
        (dict(layer_kinds=("full",)), ValueError, "layer_kinds must give one entry per layer"),
        (dict(layer_kinds=("full", "sparse")), ValueError, r"layer_kinds\[1\] must be one of"),
        (dict(layer_kinds=("full", "sliding")), ValueError, r"'sliding' layer needs a window"),
        (dict(windows=(None, 4)), ValueError, r"layer_kinds\[1\]='full' but windows\[1\]=4"),
        (dict(rope_dims=5), ValueError, "rope_dims must be even"),
        (dict(moe_layers=(True, False)), ValueError, "moe_layers needs moe="),
        (dict(linear=(1, 1, 2, 2)), TypeError, "linear must be a LinearAttentionConfig"),
        (dict(attn_output_gate=1), TypeError, "attn_output_gate"),
    ],
)
def test_config_names_the_bad_setting(settings: dict[str, Any], error: type, match: str) -> None:
    base: dict[str, Any] = dict(
        vocab_size=10, d_model=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4,
        hidden_dim=8, layer_kinds=("full", "full"),
    )  # fmt: skip
    if "windows" in settings:
        base.pop("layer_kinds")
        base["layer_kinds"] = ("full", "full")
    with pytest.raises(error, match=match):
        DecoderConfig(**(base | settings))
    with pytest.raises(ValueError, match="num_v_heads must be a multiple of num_k_heads"):
        LinearAttentionConfig(2, 3, 4, 4)
    with pytest.raises(ValueError, match="top_k must be at most num_experts=2"):
        MoEConfig(2, 3, 4)


def test_hybrid_decoder_names_bad_caches() -> None:
    model = _ours(_hf_model())
    ids = torch.randint(0, 97, (2, 5))
    caches = model.make_cache(2, 16)
    with pytest.raises(TypeError, match=r"cache\[0\] must be a GatedDeltaNetState"):
        model(ids, cache=[caches[3], *caches[1:]])
    with pytest.raises(ValueError, match=r"state.conv must be \(2, 44, 2\).*batch of 2"):
        model(ids, cache=[*model.make_cache(1, 16)[:1], *caches[1:]])
    with pytest.raises(ValueError, match="linear-attention or MLA layers has no attention maps"):
        model.attention_maps(ids)
