"""RoPE's context extension (`attnlab.rules.rope_scaling.RopeScaling`) equals transformers' rules.

The frequencies of every rule against `ROPE_INIT_FUNCTIONS` (the dynamic one at several
lengths, as `dynamic_rope_update` asks for them), then the rules inside attnlab's layers:
`GroupedQueryAttention.from_hf` against `LlamaAttention` fed by `LlamaRotaryEmbedding`,
and `Decoder.from_hf` against a small `LlamaForCausalLM` with Llama 3.1-style scaling.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
from transformers.masking_utils import create_causal_mask
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

from attnlab.caches.kv import DynamicKVCache
from attnlab.layers.gqa import GroupedQueryAttention
from attnlab.models.decoder import Decoder
from attnlab.models.hf_config import hf_rope
from attnlab.rules.rope import rope_cos_sin, rope_frequencies
from attnlab.rules.rope_scaling import RopeScaling

TOL = {"atol": 1e-5, "rtol": 1e-5}
LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
# Small configs whose pairs fall on both sides of each rule's thresholds: with head_dim
# 16 and L = 64 tokens of pre-training, the fastest pair turns every 6 tokens, the
# slowest every ~2e5 (base 5e5).
SCALINGS: dict[str, dict[str, Any]] = {
    "llama3-32": {"rope_type": "llama3", "factor": 32.0, **LLAMA3},  # Llama 3.2
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0},  # Qwen2.5's long-context recipe
}


def _config(name: str, *, max_positions: int = 512, **sizes: Any) -> LlamaConfig:
    params = {"rope_theta": 5e5, **SCALINGS[name]}
    if name != "dynamic" and name != "linear":
        params["original_max_position_embeddings"] = 64
    common = {
        "hidden_size": 40,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 1,
        "vocab_size": 50,
        "max_position_embeddings": max_positions if name != "dynamic" else 64,
    }
    config = LlamaConfig(**(common | sizes), rope_parameters=params)
    config._attn_implementation = "eager"
    return config


def test_frequencies_equal_transformers_rules() -> None:
    cases = [
        ("linear", {"rope_theta": 1e4, "factor": 4.0}, {}),
        ("llama3", {"rope_theta": 5e5, "factor": 8.0, **LLAMA3}, {"max": 131072}),
        ("yarn", {"rope_theta": 1e6, "factor": 4.0}, {}),
        # DeepSeek-V3's form, with mscale != mscale_all_dim so the factor is not 1
        ("yarn", {"rope_theta": 1e4, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.5}, {}),
        ("yarn", {"rope_theta": 1e4, "factor": 8.0, "truncate": False, "beta_fast": 16.0}, {}),
        ("dynamic", {"rope_theta": 1e4, "factor": 2.0}, {}),
    ]
    for kind, params, extra in cases:
        config = LlamaConfig(
            hidden_size=2048,
            num_attention_heads=16,
            head_dim=128,
            max_position_embeddings=extra.get("max", 64),
            rope_parameters={
                "rope_type": kind,
                "original_max_position_embeddings": 8192 if kind == "llama3" else 16,
            }
            | params,
        )
        ours = RopeScaling.from_hf(config)
        # dynamic: at init (None), within L, past it, and as the tensor the update passes
        lengths: list[Any] = [None, 64, 100, torch.tensor(3000)] if kind == "dynamic" else [None]
        for n in lengths:
            theirs, factor = ROPE_INIT_FUNCTIONS[kind](config, None, seq_len=n)
            got = ours.frequencies(128, params["rope_theta"], seq_len=n)
            assert torch.equal(got, theirs), (kind, params, n)
            assert ours.attention_scaling() == factor, (kind, params)
        if kind != "dynamic":  # each rule changes the slow pairs: the test can fail
            assert not torch.equal(got, rope_frequencies(128, base=params["rope_theta"]))


def test_llama3_keeps_fast_pairs_and_divides_slow_ones() -> None:
    """The rule by hand: wavelength < 8192/4 kept, > 8192 divided by 8, a mix between."""
    base = rope_frequencies(128, base=5e5).double()
    got = RopeScaling("llama3", 8.0, 8192).frequencies(128, 5e5).double()
    wavelength = 2 * torch.pi / base
    fast, slow = wavelength < 2048, wavelength > 8192
    assert fast.sum() > 0
    assert slow.sum() > 0
    assert (~fast & ~slow).sum() > 0
    assert_close(got[fast], base[fast], rtol=1e-6, atol=0)
    assert_close(got[slow], base[slow] / 8, rtol=1e-6, atol=0)
    between = got[~fast & ~slow]
    assert bool((between < base[~fast & ~slow]).all() and (between > base[~fast & ~slow] / 8).all())


def test_hf_rope_reads_every_kind_of_config() -> None:
    # The one reader of a config's RoPE behind every from_hf (GQA, MLA, Decoder's
    # Llama, Gemma and Qwen3-Next paths): the base and the scaling, per layer type too.
    from transformers import Gemma3TextConfig

    plain = LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    assert hf_rope(plain) == (5e5, None)
    assert hf_rope(plain, "sliding_attention") == (5e5, None)  # one RoPE for all layers
    linear = {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}
    assert hf_rope(LlamaConfig(rope_parameters=linear)) == (1e4, RopeScaling("linear", 4.0))
    gemma = Gemma3TextConfig(
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {**linear, "rope_theta": 1e6, "factor": 8.0},
        }
    )
    assert hf_rope(gemma, "sliding_attention") == (1e4, None)
    assert hf_rope(gemma, "full_attention") == (1e6, RopeScaling("linear", 8.0))
    with pytest.raises(ValueError, match=r"a RoPE per layer type .* layer_type=None"):
        hf_rope(gemma)
    # Older transformers kept the base on the config; without one it is 10000.
    assert hf_rope(SimpleNamespace(rope_theta=300.0)) == (300.0, None)
    assert hf_rope(SimpleNamespace()) == (10000.0, None)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: RopeScaling("longrope"), ValueError, "rope_type must be one of"),
        (lambda: RopeScaling("linear", factor=0.5), ValueError, "factor must be"),
        (lambda: RopeScaling("yarn", 4.0), ValueError, "needs original_max_positions"),
        (lambda: RopeScaling("llama3", 8.0, 64, high_freq_factor=1.0), ValueError, "high_freq"),
        (lambda: RopeScaling("linear", factor="2"), TypeError, "factor must be a positive float"),
        (
            lambda: RopeScaling.from_hf(  # transformers' config would refuse it too
                SimpleNamespace(rope_parameters={"rope_type": "llama3", "factor": 8.0})
            ),
            ValueError,
            "needs 'original_max_position_embeddings'",
        ),
    ],
)
def test_bad_scaling_is_named(make: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        make()


def _hf_attention(x: Tensor, layer: Any, rotary: Any, cache: Any = None) -> Tensor:
    past = 0 if cache is None else cache.get_seq_length()
    positions = torch.arange(past, past + x.shape[1])[None]  # (1, t)
    mask = create_causal_mask(
        config=layer.config,
        inputs_embeds=x,
        attention_mask=None,
        cache=cache,
        position_ids=positions,
    )
    embeddings = rotary(x, positions)
    out: Tensor = layer(x, position_embeddings=embeddings, attention_mask=mask, cache=cache)[0]
    return out


@pytest.mark.parametrize("name", list(SCALINGS))
def test_gqa_scaled_rope_equals_llama_attention(name: str) -> None:
    """Outputs and gradients over 80 tokens (past L = 64), then cached decoding."""
    config = _config(name)
    layer = LlamaAttention(config, layer_idx=0).eval()
    rotary = LlamaRotaryEmbedding(config)
    ours = GroupedQueryAttention.from_hf(layer)
    assert ours.rope is not None
    assert ours.rope.scaling == RopeScaling.from_hf(config)
    x = torch.randn(2, 80, 40)
    x_ours, x_hf = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected, got = _hf_attention(x_hf, layer, rotary), ours(x_ours)
    assert_close(got, expected, **TOL)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    got.backward(grad)
    assert x_ours.grad is not None
    assert x_hf.grad is not None
    assert_close(x_ours.grad, x_hf.grad, **TOL)
    # Unscaled RoPE differs: the test sees the scaling.
    plain = GroupedQueryAttention.from_hf(layer)
    assert plain.rope is not None
    plain.rope = dataclasses.replace(plain.rope, scaling=None)
    assert not torch.allclose(plain(x), expected, atol=1e-3)

    # Prefill 70 tokens, then one at a time: dynamic's frequencies grow at each step.
    rotary, cache, hf_cache = LlamaRotaryEmbedding(config), DynamicKVCache(), DynamicCache()
    with torch.no_grad():
        for start, stop in ((0, 70), (70, 71), (71, 72), (72, 73)):
            chunk = x[:, start:stop]
            theirs = _hf_attention(chunk, layer, rotary, hf_cache)
            assert_close(ours(chunk, cache=cache), theirs, **TOL)


@pytest.mark.parametrize("name", ["llama3-8", "dynamic"])
def test_decoder_scaled_rope_equals_llama_for_causal_lm(name: str) -> None:
    """Llama 3.1's rule (factor 8) and dynamic NTK past max_position_embeddings."""
    if name == "llama3-8":
        config = _config("llama3-32", num_hidden_layers=2)
        config.rope_parameters["factor"] = 8.0
    else:
        config = _config("dynamic", num_hidden_layers=2)
    hf = LlamaForCausalLM(config).eval()
    ours = Decoder.from_hf(hf)
    assert ours.config.rope_scaling == RopeScaling.from_hf(config)
    ids = torch.randint(0, 50, (2, 90))  # past L = 64
    logits = hf(ids).logits
    got = ours(ids)
    assert_close(got, logits, **TOL)
    grad = torch.randn_like(logits)
    logits.backward(grad)
    got.backward(grad)
    theirs = hf.model.layers[0].self_attn.q_proj.weight.grad
    mine = ours.layers[0].self_attn.q_proj.weight.grad
    assert theirs is not None
    assert mine is not None
    assert_close(mine, theirs, **TOL)

    # transformers' dynamic rule keeps the frequencies of the 90 tokens above until a call
    # shorter than L: a fresh rotary embedding, as a new generation would meet.
    hf.model.rotary_emb = LlamaRotaryEmbedding(config)
    cache, hf_cache = ours.make_cache(2, 96, kind="static"), DynamicCache(config=config)
    with torch.no_grad():
        for start, stop in ((0, 80), (80, 81), (81, 82)):
            theirs_step = hf(ids[:, start:stop], cache=hf_cache, use_cache=True).logits
            assert_close(ours(ids[:, start:stop], cache=cache), theirs_step, **TOL)


def test_dynamic_tables_follow_the_longest_position() -> None:
    """One batch, one set of frequencies: that of its largest position + 1 (no host sync)."""
    ntk = RopeScaling("dynamic", 2.0, 16)
    positions = torch.tensor([[0, 1, 2], [30, 31, 32]])
    cos, _ = rope_cos_sin(positions, 8, scaling=ntk)
    freqs = ntk.frequencies(8, seq_len=33)
    assert_close(cos, torch.cos(positions[..., None].float() * freqs))
    short = rope_cos_sin(torch.arange(16), 8, scaling=ntk)[0]
    assert torch.equal(short, rope_cos_sin(torch.arange(16), 8)[0])  # within L: plain


def _partial_and_nope_layers() -> list[tuple[str, Any, Any, bool]]:
    """StableLM (a quarter of each head rotated, with YaRN) and SmolLM3 (a NoPE layer)."""
    from transformers import SmolLM3Config, StableLmConfig
    from transformers.models.smollm3.modeling_smollm3 import (
        SmolLM3Attention,
        SmolLM3RotaryEmbedding,
    )
    from transformers.models.stablelm.modeling_stablelm import (
        StableLmAttention,
        StableLmRotaryEmbedding,
    )

    sizes = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
    stable = StableLmConfig(
        **sizes,
        use_qkv_bias=True,
        max_position_embeddings=512,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "partial_rotary_factor": 0.25,
        },
    )
    # no_rope_layers: 1 = RoPE, 0 = NoPE (SmolLM3 leaves every 4th layer unrotated)
    smol = SmolLM3Config(**sizes, num_hidden_layers=1, no_rope_layers=[0])
    layers = []
    for config, layer, rotary in (
        (stable, StableLmAttention, StableLmRotaryEmbedding),
        (smol, SmolLM3Attention, SmolLM3RotaryEmbedding),
    ):
        config._attn_implementation = "eager"
        module = layer(config, layer_idx=0).eval()
        with torch.no_grad():
            for p in module.parameters():
                p.normal_(0.0, 0.2)
        rotated = bool(getattr(module, "use_rope", True))
        layers.append((type(module).__name__, module, rotary(config), rotated))
    return layers


def test_partial_rope_and_nope_layers_equal_transformers() -> None:
    for name, layer, rotary, rotated in _partial_and_nope_layers():
        ours = GroupedQueryAttention.from_hf(layer)
        has_rope = ours.rope is not None
        assert (has_rope, ours.rope_dims) == ((True, 4) if rotated else (False, 16)), name
        x = torch.randn(2, 80, 64)
        x_ours, x_hf = x.clone().requires_grad_(), x.clone().requires_grad_()
        expected, got = _hf_attention(x_hf, layer, rotary), ours(x_ours)
        assert_close(got, expected, **TOL, msg=name)
        grad = torch.randn_like(expected)
        expected.backward(grad)
        got.backward(grad)
        assert x_ours.grad is not None
        assert x_hf.grad is not None
        assert_close(x_ours.grad, x_hf.grad, **TOL, msg=name)
        cache, hf_cache = DynamicKVCache(), DynamicCache()
        with torch.no_grad():
            for start, stop in ((0, 70), (70, 71), (71, 72)):
                chunk = x[:, start:stop]
                theirs = _hf_attention(chunk, layer, rotary, hf_cache)
                assert_close(ours(chunk, cache=cache), theirs, **TOL, msg=name)
