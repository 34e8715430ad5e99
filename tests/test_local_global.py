"""Local (sliding-window) and global layers: the rolling cache, its bytes, and Gemma 3.

The rolling cache is checked against a full cache (the same logits and tokens for
sequences longer than the window, prefill chunks longer than the window, a left-padded
batch) and against transformers' own sliding-window cache, which keeps the same
`window - 1` tokens; the bytes of whole stacks against numbers worked out by hand.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from attnlab.caches.kv import DynamicKVCache, RollingKVCache, kv_cache_bytes
from attnlab.layers.gqa import GroupedQueryAttention
from attnlab.models.config import DecoderConfig
from attnlab.models.decoder import Decoder
from attnlab.rules.rope_scaling import RopeScaling
from attnlab.rules.scores import ScoreRule

transformers = pytest.importorskip("transformers")

GIB = 2**30


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread: None) -> None:
    """Every test here runs tiny models (see conftest's `one_thread`)."""


# -- the rolling cache on its own --------------------------------------------------------


def test_rolling_cache_returns_the_reachable_keys_and_keeps_the_window() -> None:
    torch.manual_seed(0)
    window, b, h, d, d_v = 4, 2, 3, 5, 7
    cache = RollingKVCache(window)
    assert cache.nbytes == 0
    assert cache.layout is None
    keys = torch.randn(b, h, 20, d)
    values = torch.randn(b, h, 20, d_v)
    start = 0
    for t in (2, 1, 6, 1, 1, 3, 1):  # chunks shorter and longer than the window
        got_k, got_v = cache.update(keys[:, :, start : start + t], values[:, :, start : start + t])
        held_before = min(start, window - 1)
        torch.testing.assert_close(got_k, keys[:, :, start - held_before : start + t])
        torch.testing.assert_close(got_v, values[:, :, start - held_before : start + t])
        start += t
        assert (cache.seen, cache.length, len(cache)) == (start, *[min(start, window - 1)] * 2)
        # Two buffers of window - 1 tokens: (3 * 5 + 3 * 7) * 3 float32 numbers per row.
        assert cache.nbytes == b * (window - 1) * h * (d + d_v) * 4 == 864
    cache.reset()
    assert (cache.seen, len(cache), cache.nbytes) == (0, 0, 0)
    one = RollingKVCache(1)  # a window of one: each query sees itself only
    k, _ = one.update(keys[:, :, :3], values[:, :, :3])
    k, _ = one.update(keys[:, :, 3:4], values[:, :, 3:4])
    assert torch.equal(k, keys[:, :, 3:4])
    assert (one.seen, len(one)) == (4, 0)


def test_rolling_cache_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="window must be a positive int, got 0"):
        RollingKVCache(0)
    cache = RollingKVCache(3)
    cache.update(torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4))
    with pytest.raises(ValueError, match="key has head_dim=5 but the cache holds head_dim=4"):
        cache.update(torch.randn(1, 2, 1, 5), torch.randn(1, 2, 1, 4))


# -- in a model, against a full cache and transformers' sliding cache ---------------------

WINDOW = 4


def _mistral() -> Any:
    torch.manual_seed(3)
    config = transformers.MistralConfig(
        vocab_size=61,
        hidden_size=24,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=WINDOW,
        pad_token_id=0,
        attn_implementation="eager",
    )
    return transformers.MistralForCausalLM(config).eval()


@pytest.fixture(scope="module")
def mistral() -> tuple[Any, Decoder]:
    hf = _mistral()
    return hf, Decoder.from_hf(hf)


def test_rolling_decoding_equals_the_full_cache_and_transformers(
    mistral: tuple[Any, Decoder],
) -> None:
    hf, decoder = mistral
    ids = torch.randint(1, 61, (2, 7))  # a prompt longer than the window
    rolling = decoder.make_cache(2, 30)
    assert all(isinstance(c, RollingKVCache) for c in rolling)
    full = decoder.make_cache(2, 30, kind="dynamic", rolling=False)
    assert all(isinstance(c, DynamicKVCache) for c in full)
    with torch.no_grad():
        steps_r = [decoder(ids, cache=rolling)]
        steps_f = [decoder(ids, cache=full)]
        for i in range(8):
            token = torch.randint(1, 61, (2, 1 + i % 2))  # one token, or a chunk of two
            steps_r.append(decoder(token, cache=rolling))
            steps_f.append(decoder(token, cache=full))
            ids = torch.cat([ids, token], dim=1)
            kept = [(c.seen, len(c)) for c in rolling if isinstance(c, RollingKVCache)]
            assert kept == [(ids.shape[1], WINDOW - 1)] * 2
        whole = hf(ids).logits
    torch.testing.assert_close(torch.cat(steps_r, 1), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(steps_f, 1), whole, atol=1e-5, rtol=1e-5)
    # Bounded: WINDOW - 1 tokens per layer, against all 19 for the full cache.
    per_token = 2 * 2 * 8 * 2 * 4  # (keys + values) * b * head_dim * kv heads * 4 bytes
    assert sum(c.nbytes for c in rolling) == 2 * (WINDOW - 1) * per_token
    assert sum(c.nbytes for c in full) == 2 * ids.shape[1] * per_token

    # transformers' generate keeps its own sliding cache: the same tokens, the same held.
    prompt = ids[:, :6]
    out = hf.generate(prompt, max_new_tokens=10, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(decoder.generate(prompt, 10), out.sequences)
    cache = decoder.make_cache(2, 16)
    decoder.generate(prompt, 10, cache=cache)
    held = out.past_key_values.layers[0].keys.shape[2]
    first = cache[0]
    assert isinstance(first, RollingKVCache)
    assert held == len(first) == WINDOW - 1


def test_rolling_cache_len_is_what_it_holds_over_many_steps(
    mistral: tuple[Any, Decoder],
) -> None:
    # len() counts the tokens kept (never more than the window's), `seen` the positions:
    # 40 decode steps place every token where a full cache places it.
    _, decoder = mistral
    prompt = torch.randint(1, 61, (2, 5))
    rolling = decoder.make_cache(2, 44)
    full = decoder.make_cache(2, 44, kind="dynamic", rolling=False)
    out = decoder.generate(prompt, 40, cache=rolling)
    assert torch.equal(out, decoder.generate(prompt, 40, cache=full))
    kept = [(c.seen, len(c)) for c in rolling if isinstance(c, RollingKVCache)]
    assert kept == [(44, WINDOW - 1)] * 2
    assert [(c.seen, len(c)) for c in full if isinstance(c, DynamicKVCache)] == [(44, 44)] * 2


def test_rolling_cache_with_a_padded_batch(mistral: tuple[Any, Decoder]) -> None:
    _, decoder = mistral
    ids = torch.randint(1, 61, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :3] = 0  # the second prompt has 3 tokens, padded on the left
    rolling = decoder.generate(ids, 9, padding_mask=mask)
    caches = decoder.make_cache(2, 14, rolling=False)
    full = decoder.generate(ids, 9, padding_mask=mask, cache=caches)
    assert torch.equal(rolling, full)
    assert torch.equal(rolling[1, 6:], decoder.generate(ids[1, 3:], 9)[3:])


def test_a_layer_alone_with_a_rolling_cache_and_a_mask_equals_the_full_cache() -> None:
    # The mask spans every token seen; the rolling cache returns only the last window.
    torch.manual_seed(0)
    layer = GroupedQueryAttention(16, 4, 2, scores=ScoreRule(window=3)).eval()
    x = torch.randn(2, 9, 16)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[0, 5] = False  # one key hidden from every query of row 0
    outs = []
    for cache in (DynamicKVCache(), RollingKVCache(window=3)):
        steps = [layer(x[:, :4], cache=cache, attn_mask=keep[:, None, None, :4])]
        for i in range(4, 9):  # decode past the window
            mask = keep[:, None, None, : i + 1]  # (b, 1, 1, i + 1): every key seen
            steps.append(layer(x[:, i : i + 1], cache=cache, attn_mask=mask))
        outs.append(torch.cat(steps, dim=1))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-6, rtol=1e-5)
    full = layer(x, attn_mask=keep[:, None, None, :])  # no cache at all
    torch.testing.assert_close(outs[1], full, atol=1e-6, rtol=1e-5)


def test_a_rolling_cache_on_a_global_layer_is_refused(mistral: tuple[Any, Decoder]) -> None:
    _, decoder = mistral
    small = [RollingKVCache(WINDOW - 1), RollingKVCache(WINDOW)]
    with pytest.raises(ValueError, match=r"cache\[0\] is a RollingKVCache\(window=3\)"):
        decoder(torch.tensor([[1, 2]]), cache=small)


# -- bytes of whole stacks ---------------------------------------------------------------


def test_cache_bytes_of_llama_gemma_and_mistral_stacks() -> None:
    context, bf16 = 128 * 1024, torch.bfloat16
    # Llama-3-8B: 32 global layers, 8 kv heads of 128: 32 * 8 * 256 * 2 = 128 KiB a token.
    llama = kv_cache_bytes([None] * 32, context, num_kv_heads=8, head_dim=128, dtype=bf16)
    assert llama == 16 * GIB
    # Gemma 3 12B: 48 layers, every sixth global (8 of them), window 1024, 8 kv heads of
    # 256 (8 KiB a layer and token): 8 * 128k * 8 KiB + 40 * 1024 * 8 KiB.
    gemma = [None if (i + 1) % 6 == 0 else 1024 for i in range(48)]
    got = kv_cache_bytes(gemma, context, num_kv_heads=8, head_dim=256, dtype=bf16)
    assert got == 8 * GIB + 320 * 2**20
    # Mistral 7B v0.1: 32 layers of window 4096, Llama-3-8B's kv heads: 1/32 of Llama.
    mistral = kv_cache_bytes([4096] * 32, context, num_kv_heads=8, head_dim=128, dtype=bf16)
    assert mistral == llama // 32 == 512 * 2**20
    # Below the window, a local layer holds the whole context like a global one.
    short = kv_cache_bytes([4096, None], 100, num_kv_heads=1, head_dim=2, dtype=torch.float32)
    assert short == 2 * 100 * 16


def test_cache_bytes_checks_its_windows() -> None:
    with pytest.raises(ValueError, match="windows must have one entry per layer"):
        kv_cache_bytes([], 10, num_kv_heads=1, head_dim=2, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"windows\[1\] must be a positive int"):
        kv_cache_bytes([None, 0], 10, num_kv_heads=1, head_dim=2, dtype=torch.float32)
    with pytest.raises(TypeError, match="windows must be a sequence"):
        kv_cache_bytes(4, 10, num_kv_heads=1, head_dim=2, dtype=torch.float32)  # type: ignore[arg-type]


# -- Gemma 3: five local layers to one global, end to end ---------------------------------

GEMMA_WINDOW = 4


def _gemma3() -> Any:
    torch.manual_seed(5)
    config = transformers.Gemma3TextConfig(
        vocab_size=67,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=12,
        query_pre_attn_scalar=20,  # not head_dim: the scale must come from it
        sliding_window=GEMMA_WINDOW,
        max_position_embeddings=64,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
        pad_token_id=0,
        attn_implementation="eager",
    )
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # norms start at zero (1 + 0 = 1): make the offset matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.5)
    return model


def test_gemma3_equals_transformers_end_to_end() -> None:
    hf = _gemma3()
    decoder = Decoder.from_hf(hf)
    c = decoder.config
    assert c.windows == (4, 4, 4, 4, 4, None)
    assert (c.rope(0)[0], c.rope(5)[0]) == (1e4, 1e6)
    assert c.rope(5)[1] == RopeScaling("linear", 8.0)
    assert c.rope(0)[1] is None
    assert c.scale == 20**-0.5
    ids = torch.randint(1, 67, (2, 9))  # longer than the window
    with torch.no_grad():
        torch.testing.assert_close(decoder(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)
        theirs = hf.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None)
    cache = decoder.make_cache(2, 16)
    assert sum(isinstance(k, RollingKVCache) for k in cache) == 5
    assert torch.equal(decoder.generate(ids, 8, cache=cache), theirs)
    # The five local layers hold WINDOW - 1 tokens each; the global one all 16.
    per_token = 2 * 2 * 2 * 12 * 4  # (keys + values) * b * kv heads * head_dim * 4 bytes
    assert sum(k.nbytes for k in cache) == (5 * (GEMMA_WINDOW - 1) + 16) * per_token


def test_per_layer_settings_are_checked() -> None:
    sizes: dict[str, Any] = {
        "vocab_size": 10,
        "d_model": 8,
        "num_layers": 2,
        "num_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 4,
        "hidden_dim": 12,
    }
    linear = RopeScaling("linear", 8.0)
    with pytest.raises(ValueError, match="local_rope_scaling needs local_rope_base"):
        DecoderConfig(**sizes, local_rope_scaling=linear)
    with pytest.raises(ValueError, match="query_pre_attn_scalar must be a positive finite float"):
        DecoderConfig(**sizes, query_pre_attn_scalar=0)
    with pytest.raises(ValueError, match="family must be one of"):
        DecoderConfig(**sizes, family="gemma2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="qk_norm must be one of"):
        DecoderConfig(**sizes, qk_norm="layer")  # type: ignore[arg-type]
    # Local layers rotate as the global ones unless given their own base.
    config = DecoderConfig(**sizes, windows=(4, None), rope_base=5e5, rope_scaling=linear)
    assert config.rope(0) == config.rope(1) == (5e5, linear)
    config = DecoderConfig(**sizes, windows=(4, None), rope_base=1e6, local_rope_base=1e4)
    assert (config.rope(0), config.rope(1)) == ((1e4, None), (1e6, None))


def test_gemma2_softcaps_equal_transformers() -> None:
    torch.manual_seed(6)
    config = transformers.Gemma2Config(
        vocab_size=53,
        hidden_size=24,
        intermediate_size=40,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        query_pre_attn_scalar=12,
        sliding_window=3,
        max_position_embeddings=64,
        attn_logit_softcapping=0.5,  # small caps, so that both bite on a random model
        final_logit_softcapping=0.3,
        pad_token_id=0,
        attn_implementation="eager",
    )
    hf = transformers.Gemma2ForCausalLM(config).eval()
    with torch.no_grad():  # scores of a fresh model are tiny: make them reach the cap
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(40.0)
    decoder = Decoder.from_hf(hf)
    c = decoder.config
    assert (c.windows, c.attn_softcap, c.final_softcap) == ((3, None, 3, None), 0.5, 0.3)
    assert c.qk_norm is None
    ids = torch.randint(1, 53, (2, 8))
    with torch.no_grad():
        logits = decoder(ids)
        torch.testing.assert_close(logits, hf(ids).logits, atol=1e-5, rtol=1e-5)
        theirs = hf.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None)
    assert float(logits.abs().max()) < 0.3  # the final cap holds
    assert torch.equal(decoder.generate(ids, 6), theirs)
    uncapped = Decoder(dataclasses.replace(c, attn_softcap=None)).eval()
    uncapped.load_state_dict(decoder.state_dict())
    with torch.no_grad():  # the attention cap bites: without it the logits move
        assert float((uncapped(ids) - logits).abs().max()) > 1e-3
