"""MultiHeadLatentAttention: equal to Hugging Face's DeepseekV3Attention after from_hf.

The reference layer is built from a small random `DeepseekV3Config` (nothing downloaded)
with eager attention, called as `DeepseekV3Model` calls it: cos/sin from
`DeepseekV3RotaryEmbedding`, a 4-d additive mask, and `transformers.DynamicCache` when
decoding. Its RMSNorm weights and biases are perturbed so that a weight copied to the
wrong place, or not at all, changes the output.

All sizes differ: b=2, heads=3, v_head_dim=5, qk_nope_head_dim=6, t=7,
qk_rope_head_dim=8, kv_lora_rank=11, q_lora_rank=13, d_model=24.

Hugging Face has no absorbed (decode-time) form of MLA: `DeepseekV3Attention` always
expands the cached latents with `kv_b_proj`. The absorbed form is compared with the HF
layer through the outputs, and with attnlab's own naive form.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from transformers import DeepseekV3Config, DynamicCache
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)

import attnlab
from attnlab.caches.kv import DynamicKVCache, StaticKVCache
from attnlab.layers.mla import MultiHeadLatentAttention, mla_softmax_scale
from attnlab.rules import masks
from attnlab.rules.rope import Rope, rope_cos_sin

B, T = 2, 7
D_MODEL, HEADS = 24, 3
Q_LORA, KV_LORA, NOPE, ROPE, V = 13, 11, 6, 8, 5
ATOL = 1e-5

# attnlab's parameter -> Hugging Face's, for comparing gradients.
HF_NAMES = {
    "q_proj": "q_proj",
    "q_down": "q_a_proj",
    "q_norm": "q_a_layernorm",
    "q_up": "q_b_proj",
    "kv_down": "kv_a_proj_with_mqa",
    "kv_norm": "kv_a_layernorm",
    "kv_up": "kv_b_proj",
    "out_proj": "o_proj",
}


def _config(
    *, q_lora_rank: int | None = Q_LORA, interleave: bool = True, bias: bool = False, **extra: Any
) -> DeepseekV3Config:
    config = DeepseekV3Config(
        vocab_size=17,
        hidden_size=D_MODEL,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=KV_LORA,
        qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE,
        v_head_dim=V,
        rope_interleave=interleave,
        attention_bias=bias,
        **({"max_position_embeddings": 64} | extra),
    )
    config._attn_implementation = "eager"
    return config


def _hf_layer(config: DeepseekV3Config) -> DeepseekV3Attention:
    layer = DeepseekV3Attention(config, layer_idx=0)
    with torch.no_grad():  # norms start at 1 and biases at 0: make them matter
        for name, p in layer.named_parameters():
            if "layernorm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return layer.eval()


def _causal_additive(t_q: int, t_k: int) -> Tensor:
    """HF's 4-d additive causal mask, bottom-right aligned: `(1, 1, t_q, t_k)`."""
    i = torch.arange(t_q)[:, None] + (t_k - t_q)
    j = torch.arange(t_k)[None, :]
    mask = torch.zeros(t_q, t_k).masked_fill(j > i, torch.finfo(torch.float32).min)
    return mask[None, None]


def _hf_forward(
    layer: DeepseekV3Attention,
    x: Tensor,
    positions: Tensor,
    mask: Tensor | None,
    cache: DynamicCache | None = None,
) -> Tensor:
    rotary = DeepseekV3RotaryEmbedding(layer.config)
    cos_sin = rotary(x, positions if positions.ndim == 2 else positions[None])
    out, _ = layer(x, cos_sin, mask, cache=cache)
    return out


# -- equal to Hugging Face: outputs and gradients --------------------------------------


@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("q_lora_rank", [Q_LORA, None], ids=["q-lora", "q-full"])
@pytest.mark.parametrize("interleave", [True, False], ids=["interleaved", "half"])
def test_mla_equals_hf_outputs_and_gradients(
    interleave: bool, q_lora_rank: int | None, bias: bool, absorb: bool
) -> None:
    hf = _hf_layer(_config(q_lora_rank=q_lora_rank, interleave=interleave, bias=bias))
    ours = MultiHeadLatentAttention.from_hf(hf)
    x = torch.randn(B, T, D_MODEL)
    x_hf, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()

    expected = _hf_forward(hf, x_hf, torch.arange(T), _causal_additive(T, T))
    got = ours(x_ours, is_causal=True, absorb=absorb)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)

    grad_out = torch.randn_like(expected)
    expected.backward(grad_out)
    got.backward(grad_out)
    assert x_ours.grad is not None
    assert x_hf.grad is not None
    torch.testing.assert_close(x_ours.grad, x_hf.grad, atol=ATOL, rtol=0)
    hf_params = dict(hf.named_parameters())
    compared = 0
    for name, p in ours.named_parameters():
        module, kind = name.split(".")
        ref = hf_params[f"{HF_NAMES[module]}.{kind}"]
        assert p.grad is not None, name
        assert ref.grad is not None, name
        torch.testing.assert_close(p.grad, ref.grad, atol=ATOL, rtol=0, msg=name)
        compared += 1
    assert compared == len(hf_params)


def test_mla_from_hf_copies_every_weight_and_setting() -> None:
    hf = _hf_layer(
        _config(bias=True, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    )
    ours = MultiHeadLatentAttention.from_hf(hf)
    hf_params = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        module, kind = name.split(".")
        assert torch.equal(p, hf_params[f"{HF_NAMES[module]}.{kind}"]), name
        assert p.data_ptr() != hf_params[f"{HF_NAMES[module]}.{kind}"].data_ptr()
    assert ours.rope == Rope(500.0, "interleaved")
    assert ours.scale == hf.scaling == (NOPE + ROPE) ** -0.5
    assert not hasattr(ours, "softmax_scale")  # the name of a function, not of the factor
    assert not ours.training


def test_mla_padded_batch_with_positions_equals_hf() -> None:
    """Left padding: per-sequence positions `(b, t)` and an explicit 4-d mask."""
    hf = _hf_layer(_config())
    ours = MultiHeadLatentAttention.from_hf(hf)
    x = torch.randn(B, T, D_MODEL)
    pad = torch.tensor([0, 3])  # the second sequence starts at index 3
    positions = (torch.arange(T)[None] - pad[:, None]).clamp(min=0)  # (b, t)
    keep = torch.arange(T)[None] >= pad[:, None]  # (b, t): real tokens
    allowed = torch.ones(T, T, dtype=torch.bool).tril() & keep[:, None, None, :]  # (b,1,t,t)
    allowed = allowed | torch.eye(T, dtype=torch.bool)  # padded queries see themselves
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)

    expected = _hf_forward(hf, x, positions, additive)
    for absorb in (False, True):
        got = ours(x, positions=positions, attn_mask=allowed, absorb=absorb)
        torch.testing.assert_close(got[keep], expected[keep], atol=ATOL, rtol=0)


def test_mla_unbatched_equals_batched() -> None:
    mla = MultiHeadLatentAttention.from_hf(_hf_layer(_config()))
    x = torch.randn(B, T, D_MODEL)
    torch.testing.assert_close(mla(x[1], is_causal=True), mla(x, is_causal=True)[1])


@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
def test_mla_causal_future_tokens_change_nothing_before(absorb: bool) -> None:
    mla = _mla()
    x = torch.randn(B, T, D_MODEL)
    changed = x.clone()
    changed[:, 4:] = torch.randn(B, T - 4, D_MODEL)
    before = mla(x, is_causal=True, absorb=absorb)
    after = mla(changed, is_causal=True, absorb=absorb)
    torch.testing.assert_close(after[:, :4], before[:, :4], atol=ATOL, rtol=0)
    assert not torch.allclose(after[:, 4:], before[:, 4:])


def test_mla_validation_off_gives_the_same_outputs() -> None:
    mla = _mla()
    x = torch.randn(B, T, D_MODEL)
    cache = mla.new_cache(B, max_length=T)
    expected = mla(x, cache=cache, is_causal=True)
    with attnlab.validation(False):
        cache.reset()
        got = mla(x, cache=cache, is_causal=True)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


# -- cached decoding -------------------------------------------------------------------


@pytest.mark.parametrize("cache_kind", ["static", "dynamic"])
@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
def test_mla_cached_decode_equals_hf_cache_and_full_forward(cache_kind: str, absorb: bool) -> None:
    """Prefill 3 tokens, a chunk of 2, then 2 single tokens; HF with its DynamicCache."""
    hf = _hf_layer(_config())
    ours = MultiHeadLatentAttention.from_hf(hf)
    x = torch.randn(B, T, D_MODEL)
    full = _hf_forward(hf, x, torch.arange(T), _causal_additive(T, T))
    hf_cache = DynamicCache(config=hf.config)
    cache = ours.new_cache(B, max_length=T) if cache_kind == "static" else DynamicKVCache()
    start = 0
    for t_new in (3, 2, 1, 1):
        chunk = x[:, start : start + t_new]
        positions = torch.arange(start, start + t_new)
        mask = _causal_additive(t_new, start + t_new) if t_new > 1 else None
        expected = _hf_forward(hf, chunk, positions, mask, cache=hf_cache)
        with torch.no_grad():
            got = ours(chunk, cache=cache, is_causal=True, absorb=absorb)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(got, full[:, start : start + t_new], atol=ATOL, rtol=0)
        start += t_new
    # Both caches hold the same two tensors per token: the normed latent and the rotated
    # RoPE key, (b, 1, length, kv_lora_rank) and (b, 1, length, qk_rope_head_dim).
    empty = (torch.zeros(B, 1, 0, KV_LORA), torch.zeros(B, 1, 0, ROPE))
    latents, rope_keys = cache.update(*empty)
    assert cache.length == hf_cache.get_seq_length() == T
    torch.testing.assert_close(latents, hf_cache.layers[0].keys, atol=ATOL, rtol=0)
    torch.testing.assert_close(rope_keys, hf_cache.layers[0].values, atol=ATOL, rtol=0)


def test_mla_cache_holds_only_latent_and_rope_key() -> None:
    """The cache's size depends on kv_lora_rank + qk_rope_head_dim, not on the heads."""
    sizes = {}
    for heads in (1, HEADS, 16):
        mla = MultiHeadLatentAttention(
            D_MODEL, heads, kv_lora_rank=KV_LORA, qk_nope_head_dim=NOPE,
            qk_rope_head_dim=ROPE, v_head_dim=V,
        )  # fmt: skip
        cache = mla.new_cache(B, max_length=T)
        mla(torch.randn(B, T, D_MODEL), cache=cache, is_causal=True)
        sizes[heads] = cache.nbytes
    assert set(sizes.values()) == {B * T * (KV_LORA + ROPE) * 4}


# -- absorbed form = naive form (Hugging Face has no absorbed form) --------------------


@pytest.mark.parametrize("q_lora_rank", [Q_LORA, None], ids=["q-lora", "q-full"])
def test_mla_absorbed_equals_naive(q_lora_rank: int | None) -> None:
    mla = MultiHeadLatentAttention(
        D_MODEL, HEADS, kv_lora_rank=KV_LORA, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE,
        v_head_dim=V, q_lora_rank=q_lora_rank, bias=True,
    )  # fmt: skip
    x = torch.randn(B, T, D_MODEL, requires_grad=True)
    naive = mla(x, is_causal=True)
    absorbed = mla(x, is_causal=True, absorb=True)
    torch.testing.assert_close(absorbed, naive, atol=ATOL, rtol=0)
    grad_naive = torch.autograd.grad(naive.sum(), [x, *mla.parameters()])
    grad_absorbed = torch.autograd.grad(absorbed.sum(), [x, *mla.parameters()])
    for a, n in zip(grad_absorbed, grad_naive, strict=True):
        torch.testing.assert_close(a, n, atol=ATOL, rtol=0)


def test_mla_absorbed_decode_equals_naive_at_every_length() -> None:
    mla = MultiHeadLatentAttention(
        D_MODEL, HEADS, kv_lora_rank=KV_LORA, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE,
        v_head_dim=V, q_lora_rank=Q_LORA,
    )  # fmt: skip
    x = torch.randn(B, T, D_MODEL)
    full = mla(x, is_causal=True)
    cache = mla.new_cache(B, max_length=T)
    for i in range(T):
        step = mla(x[:, i : i + 1], cache=cache, absorb=True)
        torch.testing.assert_close(step, full[:, i : i + 1], atol=ATOL, rtol=0)


# -- scaled RoPE: YaRN (DeepSeek-V3's checkpoints), linear -----------------------------

YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 16,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
SCALED_ROPE = {
    "yarn": YARN,
    # mscale != mscale_all_dim: HF's rotary embedding then scales cos and sin too
    "yarn-attention-factor": YARN | {"mscale_all_dim": 0.5},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
}


def test_mla_softmax_scale_equals_hf_with_yarn() -> None:
    """DeepSeek-V3's checkpoints use YaRN; the scale gains mscale**2 (HF: layer.scaling)."""
    hf = _hf_layer(_config(rope_parameters=YARN, max_position_embeddings=640))
    expected = mla_softmax_scale(NOPE + ROPE, rope_factor=40.0, mscale_all_dim=1.0)
    assert math.isclose(hf.scaling, expected, rel_tol=1e-12)
    assert expected > (NOPE + ROPE) ** -0.5


@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
@pytest.mark.parametrize("rope", list(SCALED_ROPE))
def test_mla_scaled_rope_equals_hf(rope: str, absorb: bool) -> None:
    """Positions past original_max_position_embeddings=16, a prefill and 2 decode steps."""
    hf = _hf_layer(_config(rope_parameters=SCALED_ROPE[rope], max_position_embeddings=640))
    ours = MultiHeadLatentAttention.from_hf(hf)
    assert ours.rope.scaling is not None
    assert ours.rope.scaling.rope_type == SCALED_ROPE[rope]["rope_type"]
    x = torch.randn(B, T, D_MODEL)
    x_hf, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    positions = torch.arange(T) * 9  # up to 54
    expected = _hf_forward(hf, x_hf, positions, _causal_additive(T, T))
    got = ours(x_ours, positions=positions, is_causal=True, absorb=absorb)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    grad_out = torch.randn_like(expected)
    expected.backward(grad_out)
    got.backward(grad_out)
    assert x_ours.grad is not None
    assert x_hf.grad is not None
    torch.testing.assert_close(x_ours.grad, x_hf.grad, atol=ATOL, rtol=0)

    hf_cache, cache = DynamicCache(config=hf.config), ours.new_cache(B, max_length=T)
    for start, stop in ((0, T - 2), (T - 2, T - 1), (T - 1, T)):
        mask = _causal_additive(stop - start, stop) if stop - start > 1 else None
        chunk, pos = x[:, start:stop], positions[start:stop]
        with torch.no_grad():
            expected = _hf_forward(hf, chunk, pos, mask, cache=hf_cache)
            got = ours(chunk, positions=pos, cache=cache, is_causal=True, absorb=absorb)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def test_mla_from_hf_refuses_rope_that_changes_with_length() -> None:
    dynamic = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    hf = _hf_layer(_config(rope_parameters=dynamic))
    with pytest.raises(ValueError, match="rope_type='dynamic', whose frequencies change"):
        MultiHeadLatentAttention.from_hf(hf)


# -- one rule with GQA: positions, precomputed tables, windows, backends, dtypes -------


@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
def test_mla_positions_of_one_row_broadcast_and_start_past_the_cache(absorb: bool) -> None:
    """HF's default `position_ids` `(1, t)`, prefilling an empty cache at 100.. (HF allows)."""
    hf = _hf_layer(_config(max_position_embeddings=256))
    ours = MultiHeadLatentAttention.from_hf(hf)
    x = torch.randn(B, T, D_MODEL)
    hf_cache, cache = DynamicCache(config=hf.config), ours.new_cache(B, max_length=T)
    for start, stop in ((0, 5), (5, 6), (6, T)):
        row = torch.arange(100 + start, 100 + stop)[None]  # (1, t)
        mask = _causal_additive(stop - start, stop) if stop - start > 1 else None
        with torch.no_grad():
            expected = _hf_forward(hf, x[:, start:stop], row, mask, cache=hf_cache)
            got = ours(x[:, start:stop], positions=row, cache=cache, is_causal=True, absorb=absorb)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def test_mla_takes_hf_position_embeddings() -> None:
    """HF's rotary output `(cos, sin)`, computed once per model forward, as the layer gets it."""
    config = _config(rope_parameters=SCALED_ROPE["yarn-attention-factor"])
    config.max_position_embeddings = 640
    hf = _hf_layer(config)
    ours = MultiHeadLatentAttention.from_hf(hf)
    x = torch.randn(B, T, D_MODEL)
    positions = torch.arange(T)[None] * 5
    cos_sin = DeepseekV3RotaryEmbedding(config)(x, positions)  # (1, t, qk_rope_head_dim)
    expected, _ = hf(x, cos_sin, _causal_additive(T, T))
    got = ours(x, position_embeddings=cos_sin, is_causal=True)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(ours(x, positions=positions, is_causal=True), got)


def test_mla_float64_equals_hf_float64() -> None:
    """RoPE rotates in float64 for float64 input (it used to round to float32).

    HF's RMSNorm and eager softmax compute in float32 whatever the input; the comparison
    uses HF's SDPA attention and replaces the norm by its formula in float64, so that the
    rotation's precision is what is compared.
    """
    config = _config()
    config._attn_implementation = "sdpa"
    hf = _hf_layer(config).double()
    ours = MultiHeadLatentAttention.from_hf(hf)
    for norm in (hf.q_a_layernorm, hf.kv_a_layernorm):

        def float64_norm(h: Tensor, norm: Any = norm) -> Tensor:
            variance = h.pow(2).mean(-1, keepdim=True)
            return norm.weight * (h * torch.rsqrt(variance + norm.variance_epsilon))

        norm.forward = float64_norm
    x = torch.randn(B, T, D_MODEL, dtype=torch.float64)
    positions = torch.arange(T) + 3000
    expected = _hf_forward(hf, x, positions, _causal_additive(T, T).double())
    for absorb in (False, True):
        got = ours(x, positions=positions, is_causal=True, absorb=absorb)
        torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)


def test_mla_from_hf_accepts_subclasses_and_structural_copies() -> None:
    """Accepted by structure: a user's subclass, and GLM-4 MoE Lite's copy of the layer."""
    from transformers import Glm4MoeLiteConfig
    from transformers.models.glm4_moe_lite.modeling_glm4_moe_lite import (
        Glm4MoeLiteAttention,
        Glm4MoeLiteRotaryEmbedding,
    )

    class MyAttention(DeepseekV3Attention):
        pass

    sub = MyAttention(_config(), layer_idx=0).eval()
    x = torch.randn(B, T, D_MODEL)
    expected = _hf_forward(sub, x, torch.arange(T), _causal_additive(T, T))
    got = MultiHeadLatentAttention.from_hf(sub)(x, is_causal=True)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)

    config = Glm4MoeLiteConfig(
        vocab_size=17, hidden_size=D_MODEL, num_hidden_layers=1, num_attention_heads=HEADS,
        num_key_value_heads=HEADS, q_lora_rank=Q_LORA, kv_lora_rank=KV_LORA,
        qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V, attention_bias=True,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 300.0},
    )  # fmt: skip
    config._attn_implementation = "eager"
    glm = Glm4MoeLiteAttention(config, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in glm.named_parameters():
            if "layernorm" in name:
                p.uniform_(0.5, 1.5)
    positions = torch.arange(T)[None] + 2
    expected, _ = glm(x, Glm4MoeLiteRotaryEmbedding(config)(x, positions), _causal_additive(T, T))
    ours = MultiHeadLatentAttention.from_hf(glm)
    assert ours.rope.base == 300.0
    for absorb in (False, True):
        got = ours(x, positions=positions, is_causal=True, absorb=absorb)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def test_mla_from_hf_refuses_layers_with_parts_it_does_not_compute() -> None:
    """Structural look-alikes that compute more are refused, not half-copied."""
    gated = _hf_layer(_config())
    gated.g_proj = nn.Linear(D_MODEL, HEADS)  # an output gate, as some copies add
    with pytest.raises(TypeError, match="parts MultiHeadLatentAttention does not compute: g_proj"):
        MultiHeadLatentAttention.from_hf(gated)
    # A caller that computes the extra part itself names it: the MLA part is copied.
    x = torch.randn(2, 5, D_MODEL)
    copied = MultiHeadLatentAttention.from_hf(gated, ignore=["g_proj"])
    del gated.g_proj
    plain = MultiHeadLatentAttention.from_hf(gated)
    torch.testing.assert_close(copied(x), plain(x), atol=0, rtol=0)
    gated.g_proj = nn.Linear(D_MODEL, HEADS)
    with pytest.raises(ValueError, match="ignore names h_proj, o_proj"):
        MultiHeadLatentAttention.from_hf(gated, ignore=("h_proj", "o_proj"))
    with pytest.raises(TypeError, match="ignore must be a sequence of part names"):
        MultiHeadLatentAttention.from_hf(gated, ignore="g_proj")
    sinks = _hf_layer(_config())
    sinks.sinks = nn.Parameter(torch.zeros(HEADS))
    with pytest.raises(TypeError, match="does not compute: sinks"):
        MultiHeadLatentAttention.from_hf(sinks)


@pytest.mark.parametrize(("window", "folded"), [(None, True), (64, True), (6, True), (5, False)])
def test_mla_decode_step_takes_the_maskless_path_by_masks_rule(
    window: int | None, folded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # masks.needs_mask is the one rule: a window covering all 6 keys hides none, so the
    # absorbed step folds the heads into the query length (one shared-head attention).
    plain, mla = _mla(), _mla()
    mla.window = window
    mla.load_state_dict(plain.state_dict())
    x = torch.randn(B, 6, D_MODEL)
    cache = mla.new_cache(B, max_length=6)
    mla(x[:, :5], cache=cache, is_causal=True)
    seen: list[tuple[int, ...]] = []
    attend = mla._attend

    def spy(q: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        seen.append(tuple(q.shape))
        return attend(q, *args, **kwargs)

    monkeypatch.setattr(mla, "_attend", spy)
    step = mla(x[:, 5:], cache=cache, is_causal=True, absorb=True)
    assert masks.needs_mask(1, 6, window=window) is not folded
    assert seen[0][:3] == ((B, 1, HEADS) if folded else (B, HEADS, 1))
    band = masks.causal(6) if window is None else masks.sliding_window(6, window=window)
    expected = plain(x, attn_mask=band)[:, 5:]
    torch.testing.assert_close(step, expected, atol=ATOL, rtol=0)


def test_mla_window_is_the_sliding_window_mask() -> None:
    plain, windowed = _mla(), _mla()
    windowed.window = 3
    windowed.load_state_dict(plain.state_dict())
    x = torch.randn(B, T, D_MODEL)
    expected = plain(x, attn_mask=masks.sliding_window(T, window=3))
    torch.testing.assert_close(windowed(x, is_causal=True), expected, atol=ATOL, rtol=0)
    cache = windowed.new_cache(B, max_length=T)
    steps = [windowed(x[:, :4], cache=cache, is_causal=True)]
    steps += [
        windowed(x[:, i : i + 1], cache=cache, is_causal=True, absorb=True) for i in (4, 5, 6)
    ]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="is_causal=False with window=3"):
        windowed(x, is_causal=False)


def test_mla_mask_combines_with_is_causal() -> None:
    """As in GroupedQueryAttention: an extra mask is ANDed with the causal one."""
    mla = _mla()
    x = torch.randn(B, T, D_MODEL)
    padding = masks.key_padding([T, 5], max_len=T)
    expected = mla(x, attn_mask=padding & masks.causal(T))
    torch.testing.assert_close(mla(x, attn_mask=padding, is_causal=True), expected)


@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
def test_mla_backends_agree(absorb: bool) -> None:
    mla = _mla()
    x = torch.randn(B, T, D_MODEL)
    expected = mla(x, is_causal=True, absorb=absorb)
    for backend in ("scratch", "flash"):
        mla.backend = backend  # type: ignore[assignment]
        got = mla(x, is_causal=True, absorb=absorb)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=backend)
        cache = mla.new_cache(B, max_length=T)
        steps = [mla(x[:, :5], cache=cache, is_causal=True, absorb=absorb)]
        steps += [mla(x[:, i : i + 1], cache=cache, absorb=absorb) for i in (5, 6)]
        torch.testing.assert_close(torch.cat(steps, 1), expected, atol=ATOL, rtol=0, msg=backend)


@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
def test_mla_decode_step_runs_without_a_mask(absorb: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """One new token sees every cached key: no `(1, s)` mask is built (masks.decode_mask)."""
    mla = _mla()
    x = torch.randn(B, T, D_MODEL)
    cache = mla.new_cache(B, max_length=T)
    mla(x[:, :-1], cache=cache, is_causal=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    seen: list[object] = []

    def recording(*args: Any, **kwargs: Any) -> Tensor:
        q, k = args[0], args[1]
        seen.append((kwargs.get("attn_mask"), q.shape[-3:-1], k.shape[-3], kwargs["enable_gqa"]))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    step = mla(x[:, -1:], cache=cache, is_causal=True, absorb=absorb)
    # Absorbed, the heads are folded into the query length: one "head" of num_heads rows
    # over the one latent head (enable_gqa would copy that head num_heads times on CPU).
    heads = (1, mla.num_heads) if absorb else (mla.num_heads, 1)
    assert seen == [(None, heads, 1 if absorb else mla.num_heads, False)]
    monkeypatch.undo()
    torch.testing.assert_close(step, mla(x, is_causal=True)[:, -1:], atol=ATOL, rtol=0)


def test_mla_exports_with_validation_on() -> None:
    mla = _mla()
    x, positions = torch.randn(B, T, D_MODEL), torch.arange(T)[None] + 3
    kwargs = {"positions": positions, "is_causal": True, "absorb": True}
    exported = torch.export.export(mla, (x,), kwargs=kwargs)
    torch.testing.assert_close(exported.module()(x, **kwargs), mla(x, **kwargs))


# -- bad input -------------------------------------------------------------------------


def _mla() -> MultiHeadLatentAttention:
    return MultiHeadLatentAttention(
        D_MODEL, HEADS, kv_lora_rank=KV_LORA, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE,
        v_head_dim=V,
    )  # fmt: skip


BAD_CALLS: dict[str, tuple[type[Exception], str, Any]] = {
    "features": (ValueError, r"x has 5 features .* d_model=24", lambda m: m(torch.randn(B, T, 5))),
    "x-int": (
        TypeError,
        "x must have a floating-point dtype",
        lambda m: m(torch.ones(B, T, 24, dtype=torch.long)),
    ),
    "x-dtype": (
        ValueError,
        "x has dtype torch.float64",
        lambda m: m(torch.randn(B, T, 24).double()),
    ),
    "positions-float": (
        TypeError,
        r"positions must be an integer tensor \(t,\) or \(b, t\), got torch.float32",
        lambda m: m(torch.randn(B, T, 24), positions=torch.arange(T).float()),
    ),
    "positions-shape": (
        ValueError,
        r"positions has 6 positions but x has 7 tokens \(positions.shape=\(6,\), x.shape",
        lambda m: m(torch.randn(B, T, 24), positions=torch.arange(6)),
    ),
    "positions-negative": (
        ValueError,
        "positions must be non-negative .*, got positions from -1 to 5",
        lambda m: m(torch.randn(B, T, 24), positions=torch.arange(-1, T - 1)),
    ),
    # A wrong cache gets one message, that names the layer's own kind of cache (issue 27).
    "cache-type": (
        TypeError,
        r"cache must be MultiHeadLatentAttention's latent cache from new_cache \(one head of "
        rf"kv_lora_rank={KV_LORA} latent and qk_rope_head_dim={ROPE} RoPE features per token\) "
        "or None, got DynamicCache",
        lambda m: m(torch.randn(B, T, 24), cache=DynamicCache()),
    ),
    "cache-sizes": (  # a grouped-query layer's cache, with 3 key/value heads
        TypeError,
        r"cache must be MultiHeadLatentAttention's latent cache from new_cache .* or None, "
        r"got StaticKVCache\(length=0, max_length=7, batch_size=2, num_kv_heads=3",
        lambda m: m(torch.randn(B, T, 24), cache=StaticKVCache(B, T, 3, KV_LORA, v_head_dim=ROPE)),
    ),
    "cache-batch": (
        ValueError,
        "key has batch size 2 but the cache holds 3 sequences",
        lambda m: m(torch.randn(B, T, 24), cache=m.new_cache(3, T)),
    ),
    "cache-dtype": (
        ValueError,
        "key has dtype torch.float32 but the cache holds torch.float64",
        lambda m: m(torch.randn(B, T, 24), cache=m.new_cache(B, T, dtype=torch.float64)),
    ),
    "cache-overflow": (
        ValueError,
        r"key has t_new=7 tokens but the static cache has room for max_length - length = "
        "6 - 0 = 6",
        lambda m: m(torch.randn(B, T, 24), cache=m.new_cache(B, 6)),
    ),
    "mask-shape": (
        ValueError,
        r"attn_mask of shape \(7, 6\) does not broadcast",
        lambda m: m(torch.randn(B, T, 24), attn_mask=torch.ones(T, 6, dtype=torch.bool)),
    ),
    "positions-and-tables": (
        ValueError,
        "pass either positions or position_embeddings, not both",
        lambda m: m(
            torch.randn(B, T, 24),
            positions=torch.arange(T),
            position_embeddings=rope_cos_sin(torch.arange(T), ROPE),
        ),
    ),
    "tables-shape": (
        ValueError,
        r"cos has 6 positions but x has 7 tokens",
        lambda m: m(torch.randn(B, T, 24), position_embeddings=rope_cos_sin(torch.arange(6), ROPE)),
    ),
    "flash-mask": (
        ValueError,
        "backend='flash' takes no attn_mask",
        lambda m: (
            m.__setattr__("backend", "flash")
            or m(torch.randn(B, T, 24), attn_mask=torch.ones(T, T, dtype=torch.bool))
        ),
    ),
    "absorb": (
        TypeError,
        "absorb must be a bool, got 1",
        lambda m: m(torch.randn(B, T, 24), absorb=1),
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_mla_bad_call_raises(case: str) -> None:
    error, message, call = BAD_CALLS[case]
    with pytest.raises(error, match=message):
        call(_mla())


def test_mla_dynamic_cache_batch_mismatch_raises() -> None:
    mla = _mla()
    cache = DynamicKVCache()
    mla(torch.randn(B, T, 24), cache=cache, is_causal=True)
    with pytest.raises(ValueError, match="batch size 3 but the cache holds 2 sequences"):
        mla(torch.randn(3, 1, 24), cache=cache)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"qk_rope_head_dim": 7}, ValueError, "qk_rope_head_dim must be even .* got 7"),
        ({"kv_lora_rank": 0}, ValueError, "kv_lora_rank must be a positive int, got 0"),
        ({"q_lora_rank": 2.0}, TypeError, "q_lora_rank must be a positive int, got 2.0"),
        ({"dropout": 1.0}, ValueError, r"dropout must be in \[0, 1\), got 1.0"),
        ({"rope": Rope(-1.0)}, ValueError, "rope.base must be a finite float greater than 1"),
        ({"rope": Rope(0.5)}, ValueError, "rope.base must be a finite float greater than 1"),
        ({"window": 0}, ValueError, "window must be a positive int, got 0"),
        (
            {"backend": "cuda"},
            ValueError,
            "backend must be one of 'torch', 'scratch', 'flash', 'triton'",
        ),
        (
            {"rope": Rope(layout="yes")},
            ValueError,
            "rope.layout must be one of 'half', 'interleaved'",
        ),
        (
            {"rope": Rope(dims=2)},
            ValueError,
            r"rope.dims must be None or qk_rope_head_dim=8 \(the RoPE part is rotated whole\), "
            "got rope.dims=2",
        ),
        ({"rope": Rope(dims=10)}, ValueError, "rope.dims must be at most head_dim=8"),
        ({"rope": 10000.0}, TypeError, "rope must be a Rope .* got float"),
    ],
)
def test_mla_bad_config_raises(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    sizes: dict[str, Any] = {
        "kv_lora_rank": KV_LORA,
        "qk_nope_head_dim": NOPE,
        "qk_rope_head_dim": ROPE,
        "v_head_dim": V,
    }
    with pytest.raises(error, match=message):
        MultiHeadLatentAttention(D_MODEL, HEADS, **(sizes | kwargs))


def test_mla_from_hf_rejects_other_modules() -> None:
    with pytest.raises(
        TypeError,
        match="layer must have the structure of a transformers MLA layer such as "
        "DeepseekV3Attention, but Linear has no config; no hidden_size; ",
    ):
        MultiHeadLatentAttention.from_hf(nn.Linear(2, 3))


def test_mla_flash_refusal_leaves_the_cache_as_it_was() -> None:
    """A mask on the flash backend is refused before the latents are appended."""
    mla = _mla().eval()
    mla.backend = "flash"
    x = torch.randn(B, T, D_MODEL)
    cache = DynamicKVCache()
    mla(x[:, :3], cache=cache, is_causal=True)
    with pytest.raises(ValueError, match="backend='flash'"):
        mla(x[:, 3:4], cache=cache, attn_mask=torch.ones(1, 4, dtype=torch.bool))
    assert cache.length == 3


# -- Kimi Linear's MLA: no RoPE at all -------------------------------------------------


def _kimi_layer() -> nn.Module:
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearAttention

    config = KimiLinearConfig(
        hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=HEADS,
        kv_lora_rank=KV_LORA, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V,
        q_lora_rank=Q_LORA,
    )  # fmt: skip
    config._attn_implementation = "eager"
    layer = KimiLinearAttention(config, layer_idx=0)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "layernorm" in name:
                p.uniform_(0.5, 1.5)
    return layer.eval()


@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
def test_kimi_linear_nope_mla_equals_hf(absorb: bool) -> None:
    """Kimi Linear's MLA takes no position embeddings: its "RoPE" features are a shared key
    part that nothing rotates. `from_hf` copies it with `rope=None`; outputs, input
    gradients and a prefill-then-decode through the latent cache equal transformers'."""
    hf = _kimi_layer()
    ours = MultiHeadLatentAttention.from_hf(hf)
    assert ours.rope is None
    x = torch.randn(B, T, D_MODEL)
    x_hf, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected, _ = hf(x_hf, _causal_additive(T, T))
    got = ours(x_ours, is_causal=True, absorb=absorb)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    grad_out = torch.randn_like(expected)
    expected.backward(grad_out)
    got.backward(grad_out)
    assert x_ours.grad is not None
    assert x_hf.grad is not None
    torch.testing.assert_close(x_ours.grad, x_hf.grad, atol=ATOL, rtol=0)
    # Without RoPE positions mean nothing: positions or tables handed in are refused.
    with torch.no_grad():
        cos_sin = rope_cos_sin(torch.arange(T), ROPE)
        with pytest.raises(ValueError, match=r"position_embeddings given, but .* rope=None"):
            ours(x, position_embeddings=cos_sin)
        with pytest.raises(ValueError, match=r"positions given, but .* rotates nothing"):
            ours(x, positions=torch.arange(T) + 100)
        cache = ours.new_cache(batch_size=B, max_length=T)
        first = ours(x[:, : T - 1], cache=cache, is_causal=True, absorb=absorb)
        step = ours(x[:, T - 1 :], cache=cache, is_causal=True, absorb=absorb)
    torch.testing.assert_close(torch.cat([first, step], 1), expected.detach(), atol=ATOL, rtol=0)
