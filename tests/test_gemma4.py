"""Gemma 4's attention: KV sharing, keys as values, the value norm, proportional RoPE.

`Decoder.from_hf(Gemma4ForCausalLM)` from small random configs is held to transformers'
logits, greedy tokens (static and dynamic caches, a left-padded batch) and every layer's
attention map; the pieces it is made of are held to their dense forms.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gemma4.modeling_gemma4 import Gemma4ForCausalLM

from attnlab.caches.kv import DynamicKVCache, RollingKVCache, StaticKVCache
from attnlab.caches.shared import SharedKVCache, SharedKVReader
from attnlab.layers.gqa import GroupedQueryAttention
from attnlab.layers.norms import QKNormSpec
from attnlab.models.config import (
    DecoderConfig,
    GlobalAttentionConfig,
    LatentAttentionConfig,
    decoder_cache_bytes,
)
from attnlab.models.decoder import Decoder
from attnlab.rules.rope import Rope, rope_cos_sin, rotate
from attnlab.rules.rope_scaling import RopeScaling
from attnlab.rules.scores import ScoreRule

S, F = "sliding_attention", "full_attention"
TYPES = [S, S, F, S, F, S, F]  # layers 4-6 read layers 2 (global) and 3 (sliding)


def _gemma4(k_eq_v: bool, **overrides: Any) -> Any:
    """A small random Gemma 4 (text), its norms and block scalars off their defaults."""
    torch.manual_seed(3)
    settings: dict[str, Any] = {
        "vocab_size": 97,
        "hidden_size": 48,
        "intermediate_size": 64,
        "num_hidden_layers": 7,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 32,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": k_eq_v,
        "num_kv_shared_layers": 3,
        "sliding_window": 4,
        "hidden_size_per_layer_input": 0,
        "max_position_embeddings": 64,
        "layer_types": TYPES,
        "final_logit_softcapping": 30.0,
        "pad_token_id": 0,
        "attn_implementation": "eager",  # returns the attention maps
    }
    hf = Gemma4ForCausalLM(transformers.Gemma4TextConfig(**(settings | overrides))).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:  # ones at first: a norm of weight w must scale by w
                p.add_(0.3 * torch.randn_like(p))
        for i, layer in enumerate(hf.model.layers):
            layer.layer_scalar.fill_(0.5 + 0.1 * i)
    return hf


@pytest.fixture(scope="module", params=[True, False], ids=["k_eq_v", "k_and_v"])
def ported(request: pytest.FixtureRequest) -> tuple[Any, Decoder]:
    hf = _gemma4(request.param)
    return hf, Decoder.from_hf(hf).eval()


def test_gemma4_equals_transformers(ported: tuple[Any, Decoder]) -> None:
    hf, ours = ported
    c = ours.config
    k_eq_v = hf.config.attention_k_eq_v
    assert c.kv_sources == (None, None, None, None, 2, 3, 2)
    assert c.global_attention == GlobalAttentionConfig(32, 1 if k_eq_v else 2, k_eq_v)
    assert c.windows == (4, 4, None, 4, None, 4, None)
    assert c.rope_scaling == RopeScaling("proportional", fraction=0.25)
    global_attn = ours.layers[2].self_attn
    assert isinstance(global_attn, GroupedQueryAttention)
    assert (global_attn.v_proj is None) == k_eq_v
    assert global_attn.head_dim == 32
    assert ours.layers[4].self_attn.k_proj is None  # type: ignore[union-attr]
    torch.manual_seed(0)
    ids = torch.randint(1, 97, (2, 11))
    pad = torch.ones(2, 11, dtype=torch.long)
    pad[1, :3] = 0  # the second prompt is 8 tokens, padded on the left
    with torch.no_grad():
        theirs = hf(ids, attention_mask=pad, output_attentions=True)
        real = pad.bool()
        # Scores unscaled (QK-norm sets their size) and logits near 30: float32 to 5e-5.
        logits = ours(ids, padding_mask=pad)[real]
        torch.testing.assert_close(logits, theirs.logits[real], atol=5e-5, rtol=1e-5)
        maps = ours.attention_maps(ids[:1])  # every layer's, the readers' too
        first = hf(ids[:1], output_attentions=True).attentions
        for ours_map, their_map in zip(maps, first, strict=True):
            torch.testing.assert_close(ours_map, their_map, atol=5e-5, rtol=0)
        greedy = hf.generate(
            ids, attention_mask=pad, max_new_tokens=8, do_sample=False, eos_token_id=None
        )
    assert torch.equal(ours.generate(ids, 8, padding_mask=pad), greedy)
    assert torch.equal(ours.generate(ids, 8, padding_mask=pad, cache="dynamic"), greedy)
    caches = ours.make_cache(2, 18, rolling=False)  # windowed layers keep every token too
    assert torch.equal(ours.generate(ids, 8, padding_mask=pad, cache=caches), greedy)
    for cache in caches:  # reset together, the list serves again
        cache.reset()
    assert torch.equal(ours.generate(ids, 8, padding_mask=pad, cache=caches), greedy)
    with torch.no_grad():  # a batch with padding: the real queries' rows
        padded = ours.attention_maps(ids, padding_mask=pad)
        for ours_map, their_map in zip(padded, theirs.attentions, strict=True):
            torch.testing.assert_close(ours_map[0], their_map[0], atol=5e-5, rtol=0)
            torch.testing.assert_close(ours_map[1, :, 3:], their_map[1, :, 3:], atol=5e-5, rtol=0)


def test_gemma4_norms_round_as_transformers_in_bfloat16(ported: tuple[Any, Decoder]) -> None:
    """Gemma 4's RMSNorm multiplies by its weight in float32, then rounds once, as
    `torch.nn.RMSNorm` does (Llama's rounds before the weight: not equal in bf16)."""
    hf, ours = ported
    torch.manual_seed(5)
    x = torch.randn(3, 48).bfloat16()
    with torch.no_grad():
        norm = ours.norm.to(torch.bfloat16)
        theirs = hf.model.norm.to(torch.bfloat16)
        theirs.weight.copy_(torch.linspace(0.5, 1.5, 48))
        norm.weight.copy_(theirs.weight)
        assert torch.equal(norm(x), theirs(x))
        ours.norm.float(), hf.model.norm.float()


def test_shared_layers_hold_no_cache(ported: tuple[Any, Decoder]) -> None:
    _, ours = ported
    caches = ours.make_cache(1, 20)
    assert [type(c).__name__ for c in caches[2:5]] == [
        "SharedKVCache", "SharedKVCache", "SharedKVReader"
    ]  # fmt: skip
    torch.manual_seed(1)
    ids = torch.randint(1, 97, (1, 9))
    with torch.no_grad():  # a prompt longer than the window: the readers see all 9
        out = torch.cat([ours(ids[:, :7], cache=caches), ours(ids[:, 7:], cache=caches)], 1)
        torch.testing.assert_close(out, ours(ids), atol=1e-5, rtol=0)
    kv_heads = ours.config.global_attention.num_kv_heads  # type: ignore[union-attr]
    per_layer = [c.nbytes for c in caches]
    assert per_layer[4:] == [0, 0, 0]  # the readers hold nothing
    assert [len(c) for c in caches[4:]] == [0, 0, 0]
    stray = [*caches[:6], SharedKVCache(DynamicKVCache()).reader()]  # not layer 2's
    with pytest.raises(ValueError, match=r"cache\[6\] must be a reader of cache\[2\]"):
        ours(ids[:, :1], cache=stray)
    assert per_layer[2] == 2 * 20 * kv_heads * 32 * 4  # keys and values, 20 slots, float32
    assert per_layer[3] == 2 * 3 * 2 * 16 * 4  # a rolling cache: window - 1 tokens


def test_keys_as_values_equal_a_value_projection_that_copies_the_keys() -> None:
    torch.manual_seed(2)
    rope, norm = Rope(base=100.0), QKNormSpec("head", values=True)
    tied = GroupedQueryAttention(24, 4, 2, head_dim=8, rope=rope, qk_norm=norm, kv="keys")
    dense = GroupedQueryAttention(24, 4, 2, head_dim=8, rope=rope, qk_norm=norm)
    state = tied.state_dict() | {"v_proj.weight": tied.k_proj.weight}  # type: ignore[union-attr]
    dense.load_state_dict(state)
    x = torch.randn(2, 6, 24)
    torch.testing.assert_close(tied(x), dense(x))
    # The values the layer caches: the key projection, each head at unit mean square
    # (the norm has no weight), not rotated; the keys, RoPE(v * w_k).
    with torch.no_grad():
        tied.k_norm.weight.normal_(1.0, 0.3)  # type: ignore[union-attr]
        cache = DynamicKVCache()
        tied(x, cache=cache)
    assert cache.held is not None
    keys, values = cache.held
    raw = tied.k_proj(x).view(2, 6, 2, 8).transpose(1, 2)  # type: ignore[union-attr]
    unit = raw * torch.rsqrt(raw.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(values, unit)
    cos, sin = rope_cos_sin(torch.arange(6), 8, base=100.0)
    weight = tied.k_norm.weight  # type: ignore[union-attr]
    torch.testing.assert_close(keys, rotate(values * weight, cos, sin))


@pytest.mark.parametrize("window", [None, 3])
def test_a_reader_attends_over_its_source_keys(window: int | None) -> None:
    """A `kv="shared"` layer equals a layer that owns its source's key and value weights."""
    torch.manual_seed(4)
    kw: dict[str, Any] = {"head_dim": 8, "scores": ScoreRule(window=window)}
    source = GroupedQueryAttention(24, 4, 2, **kw)
    reader = GroupedQueryAttention(24, 4, 2, **kw, kv="shared")
    owner = GroupedQueryAttention(24, 4, 2, **kw)
    owner.load_state_dict(reader.state_dict() | {
        k: v for k, v in source.state_dict().items() if k.startswith(("k_proj", "v_proj"))
    })  # fmt: skip
    x, y = torch.randn(1, 7, 24), torch.randn(1, 7, 24)  # the two layers' inputs
    inner = DynamicKVCache() if window is None else RollingKVCache(window)
    shared = SharedKVCache(inner)
    readers, outs = shared.reader(), []
    for lo, hi in ((0, 5), (5, 6), (6, 7)):  # a prefill, then two decoding steps
        source(x[:, lo:hi], cache=shared)
        outs.append(reader(y[:, lo:hi], cache=readers))
    expected = _attend_with_keys_of(owner, x, y)
    torch.testing.assert_close(torch.cat(outs, 1), expected)
    assert readers.nbytes == 0
    assert shared.seen == readers.seen == 7


def _attend_with_keys_of(owner: GroupedQueryAttention, x: torch.Tensor, y: torch.Tensor) -> Any:
    """`owner` attending from `y`'s queries to `x`'s keys and values, by hand."""
    b, t, _ = x.shape
    cos, sin = rope_cos_sin(torch.arange(t), 8)
    q = rotate(owner.q_proj(y).view(b, t, 4, 8).transpose(1, 2), cos, sin)
    k = rotate(owner.k_proj(x).view(b, t, 2, 8).transpose(1, 2), cos, sin)
    v = owner.v_proj(x).view(b, t, 2, 8).transpose(1, 2)  # type: ignore[union-attr]
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = q @ k.transpose(-1, -2) / 8**0.5
    i, j = torch.arange(t)[:, None], torch.arange(t)
    seen = (j <= i) & ((i - j) < (owner.window or t))
    heads = scores.masked_fill(~seen, float("-inf")).softmax(-1) @ v
    return owner.out_proj(heads.transpose(1, 2).reshape(b, t, 32))


SHARES = [(32, 0.25, 1.0), (512, 0.25, 1.0), (64, 1.0, 2.0), (48, 0.5, 1.0)]


@pytest.mark.parametrize(("head_dim", "fraction", "factor"), SHARES)
def test_proportional_rope_equals_transformers(
    head_dim: int, fraction: float, factor: float
) -> None:
    params = {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": fraction}
    config = transformers.LlamaConfig(
        head_dim=head_dim, rope_parameters=params | {"factor": factor}
    )
    theirs, _ = ROPE_INIT_FUNCTIONS["proportional"](config)
    rule = RopeScaling.from_hf(config)
    assert rule == RopeScaling("proportional", factor, fraction=fraction)
    ours = rule.frequencies(head_dim, base=1e6)
    assert torch.equal(ours, theirs)
    turning = int(fraction * head_dim // 2)
    assert bool((ours[:turning] > 0).all())
    assert bool((ours[turning:] == 0).all())


def test_gemma4_bad_input_is_refused_by_name() -> None:
    from attnlab.serving.engine import Engine

    sizes: dict[str, Any] = {"vocab_size": 11, "d_model": 8, "num_layers": 3, "num_heads": 2,
                             "num_kv_heads": 1, "head_dim": 4, "hidden_dim": 8}  # fmt: skip
    for sources, message in [
        ((None, 2, None), r"kv_sources\[1\]=2 must be an earlier layer \(an int in \[0, 1\)\)"),
        ((None, None, -1), r"kv_sources\[2\]=-1 must be an earlier layer"),
        ((None, 0, 1), r"kv_sources\[2\]=1 reads layer 1, which itself reads layer 0"),
        ((None, None), r"kv_sources must give one entry per layer \(num_layers=3\), got 2"),
    ]:
        with pytest.raises(ValueError, match=message):
            DecoderConfig(**sizes, kv_sources=sources)
    with pytest.raises(TypeError, match=r"kv_sources must be a tuple .* got list"):
        DecoderConfig(**sizes, kv_sources=[None, None, 0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"kv_sources\[2\]=0: .* differ in kind, window"):
        DecoderConfig(**sizes, windows=(4, None, None), kv_sources=(None, None, 0))
    with pytest.raises(ValueError, match="family='gemma4' normalises values with QK-norm"):
        DecoderConfig(**sizes, family="gemma4")
    for off, message in [
        ({"hidden_size_per_layer_input": 8}, r"config.hidden_size_per_layer_input=8: not ported"),
        (
            {
                "enable_moe_block": True,
                "num_experts": 2,
                "top_k_experts": 1,
                "moe_intermediate_size": 8,
            },
            r"config.enable_moe_block=True",
        ),
        ({"use_double_wide_mlp": True}, r"config.use_double_wide_mlp=True"),
        ({"use_bidirectional_attention": "all"}, r"use_bidirectional_attention='all'"),
        ({"num_kv_shared_layers": 7}, r"num_kv_shared_layers=7 leaves no layer that computes"),
    ]:
        with pytest.raises(ValueError, match=message):
            Decoder.from_hf(_gemma4(True, **off))
    sharing = Decoder(DecoderConfig(**sizes, kv_sources=(None, 0, 1 - 1)))
    with pytest.raises(ValueError, match=r"Gemma 4: config.global_attention, config.kv_sources"):
        Engine(sharing, num_blocks=8, block_size=4)
    reader = GroupedQueryAttention(8, 2, 1, kv="shared")
    x = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match=r"cache must be the SharedKVReader .* got None"):
        reader(x)
    with pytest.raises(TypeError, match=r"cache must be a SharedKVReader .* got DynamicKVCache"):
        reader(x, cache=DynamicKVCache())
    shared = SharedKVCache(StaticKVCache(1, 8, 1, 4))
    with pytest.raises(ValueError, match="the source layer has not attended over these 3 tokens"):
        reader(x, cache=shared.reader())
    with pytest.raises(TypeError, match=r"cache must be an attnlab KVCache .* got SharedKVReader"):
        GroupedQueryAttention(8, 2, 1)(x, cache=shared.reader())
    source, late = GroupedQueryAttention(8, 2, 1), shared.reader()
    source(x, cache=shared)
    windowed = GroupedQueryAttention(8, 2, 1, scores=ScoreRule(window=2), kv="shared")
    with pytest.raises(ValueError, match=r"window=2 differs from its source's window=None"):
        windowed(x, cache=late)
    with pytest.raises(ValueError, match="a layer that reads them takes its reader"):
        shared.attend(x, None, None, lambda q, k, v: q, window=None)
    with pytest.raises(TypeError, match="inner must be the source layer's own AttentionCache"):
        SharedKVCache(shared.reader())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"kv must be one of .* got 'tied'"):
        GroupedQueryAttention(8, 2, 1, kv="tied")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"qk_norm.values needs qk_norm.over='head'"):
        GroupedQueryAttention(8, 2, 1, qk_norm=QKNormSpec("projection", values=True))
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\], got 1.5"):
        RopeScaling("proportional", fraction=1.5)
    with pytest.raises(ValueError, match=r"fraction=0\.5 is a setting of rope_type='proportional'"):
        RopeScaling("linear", 2.0, fraction=0.5)
    text = _gemma4(True, use_bidirectional_attention="vision")  # "vision": images only
    assert DecoderConfig.from_hf(text.config).kv_sources == (None, None, None, None, 2, 3, 2)
    with pytest.raises(TypeError, match="values_only must be a bool"):
        decoder_cache_bytes(DecoderConfig(**sizes), 8, dtype=torch.float32, values_only=1)  # type: ignore[arg-type]
    mla = LatentAttentionConfig(8, 4, 2, 4)
    latent = DecoderConfig(**sizes, latent=mla, rope_layers=(False,) * 3)
    with pytest.raises(ValueError, match=r"config\.latent is set: an MLA cache holds latents"):
        decoder_cache_bytes(latent, 8, dtype=torch.float32)
    assert isinstance(SharedKVCache().reader(), SharedKVReader)
