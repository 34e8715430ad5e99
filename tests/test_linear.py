"""attnlab.linear: linear attention's two forms, the delta rule's three modes (with one
decay per head, Gated DeltaNet, or per key channel, Kimi Delta Attention, each against
Hugging Face's PyTorch kernels), and the Gated DeltaNet layer against Hugging Face's
`Qwen3NextGatedDeltaNet` (outputs, gradients, and the decode state carried from prefill)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.testing import assert_close
from transformers import DynamicCache, Qwen3NextConfig
from transformers.models.kimi_linear.modeling_kimi_linear import (
    chunk_kimi_delta_attention,
    recurrent_kimi_delta_attention,
)
from transformers.models.qwen3_next.modeling_qwen3_next import (
    Qwen3NextGatedDeltaNet,
    torch_chunk_gated_delta_rule,
)

from attnlab import validation
from attnlab.functional.linear import delta_rule, elu_feature_map, linear_attention
from attnlab.layers.linear import (
    DeltaGates,
    GatedDeltaNet,
    GatedDeltaNetState,
    LinearSelfAttention,
)
from attnlab.models.interop import split_deltanet_projections

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("causal", [True, False])
def test_linear_attention_forms_equal_sdpa_with_log_weights(causal: bool) -> None:
    # Independent reference: softmax of log(phi(q) . phi(k)) is the normalised kernel
    # weights, so SDPA with zero queries and that additive mask is linear attention.
    q, k, v = torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 5)
    weights = elu_feature_map(q) @ elu_feature_map(k).transpose(-1, -2)
    if causal:
        weights = weights.tril()
    reference = F.scaled_dot_product_attention(torch.zeros_like(q), k, v, weights.log())
    for form in ("parallel", "recurrent"):
        assert_close(linear_attention(q, k, v, is_causal=causal, form=form), reference)


@pytest.mark.parametrize("causal", [True, False])
def test_linear_self_attention_equals_the_quadratic_form_by_hand(causal: bool) -> None:
    # Reference built from the layer's weights one query at a time, in float64: weights
    # phi(q_i) . phi(k_j) over the keys j it sees, normalised to sum to one.
    b, t, d_model, num_heads = 2, 7, 12, 3
    layer = LinearSelfAttention(d_model, num_heads).double()
    x = torch.randn(b, t, d_model, dtype=torch.float64)
    w, bias = layer.qkv.weight, layer.qkv.bias
    phi = lambda z: torch.where(z > 0, z + 1, z.exp())  # noqa: E731 (elu + 1 by hand)
    heads = torch.empty(b, t, d_model, dtype=torch.float64)
    for h in range(num_heads):
        cols = slice(4 * h, 4 * h + 4)  # head h's features within q, k and v
        q, k, v = (x @ w[d_model * i :][cols].T + bias[d_model * i :][cols] for i in range(3))
        for i in range(t):
            seen = slice(0, i + 1) if causal else slice(0, t)
            weights = phi(k[:, seen]) @ phi(q[:, i]).unsqueeze(-1)  # (b, keys, 1)
            heads[:, i, cols] = (weights * v[:, seen]).sum(1) / weights.sum(1)
    expected = heads @ layer.out.weight.T + layer.out.bias
    with torch.no_grad():
        assert_close(layer(x, is_causal=causal), expected, atol=1e-6, rtol=1e-6)
    with torch.no_grad(), validation(False):  # unchecked, as a model's blocks run it
        assert_close(layer(x, is_causal=causal), expected, atol=1e-6, rtol=1e-6)


def test_linear_self_attention_names_the_bad_argument() -> None:
    with pytest.raises(ValueError, match="d_model must be a multiple of num_heads"):
        LinearSelfAttention(10, 4)
    with pytest.raises(TypeError, match="num_heads must be a positive int"):
        LinearSelfAttention(8, 2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="d_model must be a positive int"):
        LinearSelfAttention(0, 1)
    layer = LinearSelfAttention(8, 2)
    with pytest.raises(ValueError, match=r"x has 7 features.*d_model=8 \(x.shape=\(2, 3, 7\)\)"):
        layer(torch.randn(2, 3, 7))
    with pytest.raises(ValueError, match=r"x must have 3 dimensions \(b, t, d_model\)"):
        layer(torch.randn(3, 8))
    with pytest.raises(TypeError, match="x must have a floating-point dtype"):
        layer(torch.ones(2, 3, 8, dtype=torch.long))
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        layer(torch.randn(2, 3, 8), is_causal=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("gate", [None, "head", "channel"])
def test_delta_rule_modes_equal(gate: str | None) -> None:
    b, h, t, d_k, d_v = 2, 3, 10, 4, 5
    q, v = torch.randn(b, h, t, d_k, dtype=torch.float64), torch.randn(b, h, t, d_v).double()
    k = F.normalize(torch.randn(b, h, t, d_k, dtype=torch.float64), dim=-1)
    beta = torch.rand(b, h, t, dtype=torch.float64)
    shape = {None: None, "head": (b, h, t), "channel": (b, h, t, d_k)}[gate]
    g = None if shape is None else -torch.rand(shape, dtype=torch.float64)
    s0 = torch.randn(b, h, d_k, d_v, dtype=torch.float64)
    naive = delta_rule(q, k, v, beta, g, mode="naive", initial_state=s0)
    for mode, size in (("recurrent", 64), ("chunk", 4), ("chunk", 64)):
        out, state = delta_rule(q, k, v, beta, g, mode=mode, chunk_size=size, initial_state=s0)
        assert_close(out, naive[0])
        assert_close(state, naive[1])


def test_delta_rule_chunk_from_a_state_equals_hugging_faces_kernel() -> None:
    # Hugging Face's kernel: (b, t, h, d) layout, queries scaled by d_k ** -0.5 inside,
    # chunks of 64 padded at the end; ours: (b, h, t, d), chunks of 5, the last one short.
    b, h, t, d_k, d_v = 2, 3, 12, 4, 5
    q, v = torch.randn(b, t, h, d_k), torch.randn(b, t, h, d_v)
    k = F.normalize(torch.randn(b, t, h, d_k), dim=-1)
    beta, g = torch.rand(b, t, h), -torch.rand(b, t, h)
    s0 = torch.randn(b, h, d_k, d_v)
    expected, state = torch_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True
    )
    heads = [x.transpose(1, 2) for x in (q * d_k**-0.5, k, v, beta, g)]
    out, our_state = delta_rule(*heads, chunk_size=5, initial_state=s0)
    assert_close(out.transpose(1, 2), expected)
    assert_close(our_state, state)


def test_delta_rule_per_channel_equals_kimi_delta_attentions_kernels() -> None:
    # Kimi Linear's PyTorch kernels (transformers' fallbacks: no FLA here, so nothing
    # else can run): (b, t, h, d) layout, L2-normalised queries and keys, queries scaled
    # by d_k ** -0.5 inside, a decay per key channel; chunks of 64 padded at the end.
    assert importlib.util.find_spec("fla") is None
    b, h, t, d_k, d_v = 2, 3, 13, 4, 5
    q, k, v = torch.randn(b, t, h, d_k), torch.randn(b, t, h, d_k), torch.randn(b, t, h, d_v)
    beta, g = torch.rand(b, t, h), -torch.rand(b, t, h, d_k)
    s0 = torch.randn(b, h, d_k, d_v)
    kw = {"initial_state": s0, "output_final_state": True, "use_qk_l2norm_in_kernel": True}
    chunked, chunk_state = chunk_kimi_delta_attention(q, k, v, g, beta, **kw)
    stepped, step_state = recurrent_kimi_delta_attention(q, k, v, g, beta, **kw)
    unit_q, unit_k = (x / (x.square().sum(-1, keepdim=True) + 1e-6).sqrt() for x in (q, k))
    heads = [x.transpose(1, 2) for x in (unit_q * d_k**-0.5, unit_k, v, beta, g)]
    for mode, theirs, state in (
        ("chunk", chunked, chunk_state),
        ("recurrent", stepped, step_state),
    ):
        out, our_state = delta_rule(*heads, mode=mode, chunk_size=5, initial_state=s0)
        assert_close(out.transpose(1, 2), theirs)
        assert_close(our_state, state)
    # One decay per head is the special case of equal channels.
    q_, k_, v_, beta_, g_ = heads
    per_head = delta_rule(q_, k_, v_, beta_, g_[..., 0], chunk_size=5, initial_state=s0)
    equal = g_[..., :1].expand_as(g_)
    assert_close(per_head, delta_rule(q_, k_, v_, beta_, equal, chunk_size=5, initial_state=s0))


def test_delta_rule_overwrites_where_linear_attention_adds() -> None:
    # Two writes under one unit key with beta = 1: the delta rule keeps the last value,
    # plain (unnormalised) linear attention, the same recurrence without the correction,
    # their sum.
    key = torch.tensor([0.6, 0.8]).expand(1, 1, 2, 2)
    value = torch.tensor([[1.0, 0.0], [0.0, 2.0]]).view(1, 1, 2, 2)
    out, _ = delta_rule(key, key, value, torch.ones(1, 1, 2), mode="recurrent")
    assert_close(out[0, 0, 1], torch.tensor([0.0, 2.0]))
    assert_close(key[0, 0, 0] @ (key[0, 0].T @ value[0, 0]), torch.tensor([1.0, 2.0]))
    # With beta = 0.5 and a decay of 0.5 at each step, half of v1 is written, then the
    # decay and the half erase each halve it (0.125 left) while half of v2 comes in.
    g = torch.full((1, 1, 2), 0.5).log()
    out, _ = delta_rule(key, key, value, torch.full((1, 1, 2), 0.5), g, mode="naive")
    assert_close(out[0, 0, 1], torch.tensor([0.125, 1.0]))


def _hf_layer(**overrides: Any) -> tuple[Qwen3NextGatedDeltaNet, Qwen3NextConfig]:
    settings: dict[str, Any] = dict(
        hidden_size=24, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=6, linear_value_head_dim=5, linear_conv_kernel_dim=3,
        num_hidden_layers=1, layer_types=["linear_attention"], num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, vocab_size=10, intermediate_size=8,
        moe_intermediate_size=8, num_experts=2, num_experts_per_tok=1,
    )  # fmt: skip
    config = Qwen3NextConfig(**(settings | overrides))
    layer = Qwen3NextGatedDeltaNet(config, layer_idx=0)
    with torch.no_grad():  # fresh norm weights are ones and dt_bias ones: vary them
        layer.norm.weight.uniform_(0.5, 1.5)
        layer.dt_bias.uniform_(-1.0, 1.0)
    return layer, config


def _assert_same_outputs_and_gradients(hf: Any, ours: GatedDeltaNet, x: Tensor) -> None:
    """Both layers on copies of `x`: equal outputs, then one upstream gradient through
    each, equal gradients of the input (the parameters' are left in `.grad`)."""
    x_hf, x_ours = (x.detach().clone().requires_grad_() for _ in range(2))
    expected, got = hf(x_hf), ours(x_ours)
    assert_close(got, expected, atol=1e-5, rtol=1e-5)
    upstream = torch.randn_like(expected)
    (expected * upstream).sum().backward()
    (got * upstream).sum().backward()
    assert x_hf.grad is not None
    assert x_ours.grad is not None
    assert_close(x_ours.grad, x_hf.grad, atol=1e-5, rtol=1e-5)


def test_gated_delta_net_from_hf_outputs_and_gradients() -> None:
    hf, _ = _hf_layer()
    ours = GatedDeltaNet.from_hf(hf, chunk_size=3)  # 7 tokens: chunks of 3, 3, 1
    x = torch.randn(2, 7, 24)
    _assert_same_outputs_and_gradients(hf, ours, x)

    def grad(p: torch.nn.Parameter) -> Tensor:
        assert p.grad is not None
        return p.grad

    hf_parts = split_deltanet_projections(
        grad(hf.in_proj_qkvz.weight), grad(hf.in_proj_ba.weight), 2, 6, 2 * 5
    )
    for name, hf_grad in zip("qkvzba", hf_parts, strict=True):
        assert_close(grad(getattr(ours, f"{name}_proj").weight), hf_grad, atol=1e-5, rtol=1e-5)
    pairs = [
        (ours.conv_weight, grad(hf.conv1d.weight).squeeze(1)),
        (ours.A_log, grad(hf.A_log)),
        (ours.dt_bias, grad(hf.dt_bias)),
        (ours.norm_weight, grad(hf.norm.weight)),
        (ours.out_proj.weight, grad(hf.out_proj.weight)),
    ]
    for param, hf_grad in pairs:
        assert_close(grad(param), hf_grad, atol=1e-5, rtol=1e-5)


def test_gated_delta_net_from_hf_qwen3_5_layer() -> None:
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    config = Qwen3_5TextConfig(
        hidden_size=24, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=6, linear_value_head_dim=5, linear_conv_kernel_dim=3,
        num_hidden_layers=1, layer_types=["linear_attention"], num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, vocab_size=10, intermediate_size=8,
    )  # fmt: skip
    hf = Qwen3_5GatedDeltaNet(config, layer_idx=0)
    with torch.no_grad():
        hf.norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 7, 24)
    assert_close(GatedDeltaNet.from_hf(hf, chunk_size=3)(x), hf(x), atol=1e-5, rtol=1e-5)


def test_gated_delta_net_state_from_prefill_to_decode_equals_hf_cache() -> None:
    hf, config = _hf_layer()
    ours = GatedDeltaNet.from_hf(hf, chunk_size=4)
    x = torch.randn(2, 8, 24)
    cache = DynamicCache(config=config)
    state = ours.new_state(2)
    with torch.no_grad():
        assert_close(ours(x[:, :6], state), hf(x[:, :6], cache=cache), atol=1e-5, rtol=1e-5)
        ours.mode = "recurrent"  # decode one token at a time, as Hugging Face does
        for i in (6, 7):
            step = hf(x[:, i : i + 1], cache=cache)
            assert_close(ours(x[:, i : i + 1], state), step, atol=1e-5, rtol=1e-5)
    assert state.seen == 8
    assert_close(state.recurrent, cache.get_recurrent_state(0), atol=1e-5, rtol=1e-5)
    # Hugging Face's conv state keeps kernel_size inputs, the last kernel_size - 1 are used.
    assert_close(state.conv, cache.get_conv_state(0)[..., 1:])
    assert state.nbytes == 2 * 4 * (44 * 2 + 4 * 6 * 5)  # float32, batch 2: no token count


def test_gated_delta_net_unbatched_and_modes_agree() -> None:
    layer = GatedDeltaNet(8, num_k_heads=1, num_v_heads=2, head_k_dim=3, head_v_dim=4)
    layer.double()
    x = torch.randn(5, 8, dtype=torch.float64)
    out = layer(x)
    assert_close(out, layer(x.unsqueeze(0))[0])
    layer.mode = "naive"
    assert_close(layer(x), out)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda q: linear_attention(q, q, q, form="fast"), ValueError, "form"),
        (lambda q: linear_attention(q, q, q, is_causal=1), TypeError, "is_causal must be"),
        (
            lambda q: linear_attention(q[0, 0, 0], q, q),
            ValueError,
            r"query must have at least 2 dimensions \(\.\.\., t, features\), got 1",
        ),
        (lambda q: linear_attention(q, q[..., :3, :], q), ValueError, "key.shape"),
        (lambda q: delta_rule(q, q, q, q[..., 0], mode="fast"), ValueError, "mode"),
        (lambda q: delta_rule(q, q, q, q[..., 0], chunk_size=0), ValueError, "chunk_size"),
        (lambda q: delta_rule(q, q, q, q[..., 0], chunk_size=2.0), TypeError, "chunk_size"),
        (lambda q: delta_rule(q, q, q, q[..., :1, 0]), ValueError, "beta"),
        (lambda q: delta_rule(q, q, q, q[..., 0], q[..., 0].int()), TypeError, "log_decay"),
        (
            lambda q: delta_rule(q, q, q, q[..., 0], q[..., 0].double()),
            TypeError,
            "log_decay must have query's dtype torch.float32, got torch.float64",
        ),
        (
            lambda q: delta_rule(q, q, q, q[..., 0], q[..., :2]),
            ValueError,
            r"log_decay must be \(b, h, t\) = \(2, 3, 5\) or \(b, h, t, d_k\) = \(2, 3, 5, 4\)",
        ),
        (lambda q: delta_rule(q[0], q[0], q[0], q[0, ..., 0]), ValueError, "query"),
        (
            lambda q: delta_rule(q, q, q, q[..., 0], initial_state=q),
            ValueError,
            r"initial_state.*\(2, 3, 4, 4\)",
        ),
    ],
)
def test_functions_name_the_bad_argument(call: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call(torch.randn(2, 3, 5, 4))


def test_gated_delta_net_names_the_bad_argument() -> None:
    with pytest.raises(ValueError, match="num_v_heads must be a multiple of num_k_heads"):
        GatedDeltaNet(8, num_k_heads=2, num_v_heads=3, head_k_dim=2, head_v_dim=2)
    with pytest.raises(ValueError, match="mode"):
        GatedDeltaNet(8, num_k_heads=1, num_v_heads=1, head_k_dim=2, head_v_dim=2, mode="x")
    layer = GatedDeltaNet(8, num_k_heads=1, num_v_heads=2, head_k_dim=2, head_v_dim=3)
    with pytest.raises(ValueError, match="mode"):
        layer.mode = "fused"
    x = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match=r"x has 7 features.*d_model=8"):
        layer(x[..., :7])
    with pytest.raises(ValueError, match=r"state.conv must be \(2, 10, 3\).*batch of 2"):
        layer(x, layer.new_state(1))
    state = layer.new_state(2)
    state.recurrent = state.recurrent.double()
    with pytest.raises(ValueError, match=r"state\.recurrent must be torch\.float32"):
        layer(x, state)
    with pytest.raises(TypeError, match="state must be a GatedDeltaNetState"):
        layer(x, (state.conv, state.recurrent))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="GatedDeltaNet has no conv1d, norm, in_proj_qkvz"):
        GatedDeltaNet.from_hf(layer)
    assert isinstance(layer.new_state(1), GatedDeltaNetState)


def test_gated_delta_net_bfloat16_error_at_most_twice_hugging_faces() -> None:
    # flash-attention's rule: judge low precision against the reference run in the same
    # precision, both measured from float64 (our layer: Hugging Face's kernels cast to
    # float32 inside, so they have no float64 run). Weights are rounded to bfloat16 first,
    # so that all three runs share them exactly.
    hf, _ = _hf_layer()
    hf.to(torch.bfloat16)
    x = torch.randn(2, 9, 24).to(torch.bfloat16)
    exact = GatedDeltaNet.from_hf(hf, chunk_size=4).double()
    ours = GatedDeltaNet.from_hf(hf, chunk_size=4)
    with torch.no_grad():
        reference = exact(x.double())
        hf_error = (hf(x).double() - reference).abs().max()
        our_error = (ours(x).double() - reference).abs().max()
    assert 0 < our_error <= 2 * hf_error


def test_gated_delta_net_left_padded_batch_equals_hf_and_unpadded_rows() -> None:
    hf, _ = _hf_layer()
    ours = GatedDeltaNet.from_hf(hf, chunk_size=3)
    x = torch.randn(3, 8, 24)
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[1, :2], mask[2, :5] = 0, 0
    state = ours.new_state(3)
    with torch.no_grad():
        expected = hf(x, attention_mask=mask)
        got = ours(x, state, padding_mask=mask)
        alone_state = ours.new_state(1)
        alone = ours(x[2:, 5:], alone_state)
    assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # Padding writes nothing: the short row's outputs and state are those without it.
    assert_close(got[2, 5:], alone[0], atol=1e-5, rtol=1e-5)
    assert_close(state.recurrent[2:], alone_state.recurrent, atol=1e-5, rtol=1e-5)
    # Without the mask the padding's inputs would reach the state.
    assert not torch.allclose(ours(x)[2, 5:], alone[0], atol=1e-3)


@pytest.mark.parametrize(
    ("mask", "error", "match"),
    [
        (torch.ones(2, 4), TypeError, "padding_mask must be a bool or integer tensor"),
        (torch.ones(2, 3, dtype=torch.long), ValueError, r"shape \(b, t\) = \(2, 4\)"),
        (torch.full((2, 4), 2), ValueError, "only 0 and 1"),
        (torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]), ValueError, "pad on the left"),
        (torch.zeros(2, 4, dtype=torch.bool), ValueError, "row without tokens"),
        ([[1, 1, 1, 1]] * 2, TypeError, "padding_mask must be a tensor"),
    ],
)
def test_gated_delta_net_names_a_bad_padding_mask(mask: Any, error: type, match: str) -> None:
    layer = GatedDeltaNet(8, num_k_heads=1, num_v_heads=2, head_k_dim=2, head_v_dim=3)
    with pytest.raises(error, match=match):
        layer(torch.randn(2, 4, 8), padding_mask=mask)


def _kimi_layer() -> tuple[Any, Any]:
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    config = KimiLinearConfig(
        hidden_size=24, linear_num_heads=2, linear_head_dim=6, linear_conv_kernel_dim=3,
        num_hidden_layers=1, layer_types=["linear_attention"], vocab_size=10,
        num_attention_heads=2, num_key_value_heads=2, intermediate_size=8,
        moe_intermediate_size=8, num_local_experts=2,
    )  # fmt: skip
    layer = KimiLinearDeltaAttention(config, layer_idx=0)
    with torch.no_grad():  # created empty or as ones: give them values
        layer.forget_gate.A_log.uniform_(-1.0, 1.0)
        layer.forget_gate.dt_bias.uniform_(-1.0, 1.0)
        layer.o_norm.weight.uniform_(0.5, 1.5)
    return layer, config


def test_kimi_delta_attention_from_hf_outputs_gradients_and_decode() -> None:
    # KimiLinearDeltaAttention is GatedDeltaNet with a decay per key channel and low-rank
    # gates (DeltaGates); its kernels here are transformers' PyTorch ones (no FLA).
    hf, config = _kimi_layer()
    ours = GatedDeltaNet.from_hf(hf, chunk_size=3)  # 7 tokens: chunks of 3, 3, 1
    assert ours.gates == DeltaGates(decay="channel", rank=6, activation="sigmoid")
    x = torch.randn(2, 7, 24)
    _assert_same_outputs_and_gradients(hf, ours, x)
    gate = hf.forget_gate
    pairs = {
        "a_proj.1.weight": gate.f_b_proj.weight,
        "dt_bias": gate.dt_bias,
        "A_log": gate.A_log,
        "z_proj.0.weight": hf.g_a_proj.weight,
        "conv_weight": hf.conv1d.weight,
    }
    params = dict(ours.named_parameters())
    for name, theirs in pairs.items():
        mine, their_grad = params[name].grad, theirs.grad
        assert mine is not None
        assert their_grad is not None
        assert_close(mine, their_grad.reshape(mine.shape), atol=1e-5, rtol=1e-5)
    # Prefill 5 tokens, then decode 2 one at a time: the state carries what the cache does.
    cache, state = DynamicCache(config=config), ours.new_state(2)
    with torch.no_grad():
        assert_close(ours(x[:, :5], state), hf(x[:, :5], cache=cache), atol=1e-5, rtol=1e-5)
        for i in (5, 6):
            step = ours(x[:, i : i + 1], state)
            assert_close(step, hf(x[:, i : i + 1], cache=cache), atol=1e-5, rtol=1e-5)
    assert state.seen == 7


def test_kimi_delta_attention_port_keeps_the_decay_in_float32() -> None:
    # transformers keeps dt_bias (and A_log) in float32 in a bfloat16 model; rounding
    # them to bfloat16 would shift every channel's decay at every token.
    hf, _ = _kimi_layer()
    hf = hf.to(torch.bfloat16)
    for name in ("dt_bias", "A_log"):
        part = getattr(hf.forget_gate, name)
        part.data = part.data.float()
    ours = GatedDeltaNet.from_hf(hf, chunk_size=3)
    assert ours.dt_bias.dtype == ours.A_log.dtype == torch.float32
    assert ours.q_proj.weight.dtype == torch.bfloat16
    assert torch.equal(ours.dt_bias, hf.forget_gate.dt_bias)
    x = torch.randn(2, 7, 24, dtype=torch.bfloat16)
    with torch.no_grad():
        assert_close(ours(x), hf(x), atol=3e-2, rtol=3e-2)
