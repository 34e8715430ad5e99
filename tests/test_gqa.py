"""GroupedQueryAttention: equal to a per-head loop written here, cached decoding equal to
the full forward, and clear errors.

The reference below computes every head on its own, with the key/value head of query head
h taken as h // group and the causal / sliding-window mask written as a condition on the
positions, so neither PyTorch's `enable_gqa` nor `attnlab.rules.masks` is trusted. The
equivalence with Hugging Face's layers is in tests/test_hf_equivalence.py.

Dimensions all differ: d_model 20, 6 query heads, 3 (or 1, or 6) key/value heads, head_dim
4 (so num_heads * head_dim = 24 is not d_model), batch 2, 9 tokens, window 3.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right

from attnlab import validation
from attnlab.caches.kv import DynamicKVCache, KVCache, StaticKVCache
from attnlab.functional import backends as _backends
from attnlab.layers.gqa import GroupedQueryAttention, HeadGates, check_attention_inputs
from attnlab.layers.linear import GatedDeltaNet
from attnlab.layers.mla import MultiHeadLatentAttention
from attnlab.layers.norms import QKNormSpec, RMSNorm, rms_normalize
from attnlab.layers.sparse import DeepSeekSparseAttention, LightningIndexer
from attnlab.models.config import DecoderConfig
from attnlab.rules import masks
from attnlab.rules.rope import Rope, apply_rope, rope_cos_sin
from attnlab.rules.rope_scaling import RopeScaling
from attnlab.rules.scores import ScoreRule

D_MODEL, H, HD, B, T, WINDOW = 20, 6, 4, 2, 9, 3


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread: None) -> None:
    """Every test here runs tiny layers (see conftest's `one_thread`)."""


def _module(num_kv_heads: int = 3, **kwargs: object) -> GroupedQueryAttention:
    module = GroupedQueryAttention(D_MODEL, H, num_kv_heads, head_dim=HD, **kwargs)  # type: ignore[arg-type]
    return module.eval()


def reference(module: GroupedQueryAttention, x: Tensor, positions: Tensor | None = None) -> Tensor:
    """The layer as a loop over heads, in float64."""
    b, t, _ = x.shape
    x64 = x.double()
    w = {n: getattr(module, n) for n in ("q_proj", "k_proj", "v_proj", "out_proj")}

    def project(name: str, heads: int) -> Tensor:
        lin = w[name]
        y = x64 @ lin.weight.double().T
        if lin.bias is not None:
            y = y + lin.bias.double()
        return y.view(b, t, heads, module.head_dim).transpose(1, 2)  # (b, heads, t, hd)

    q, k, v = (
        project("q_proj", module.num_heads),
        *(project(n, module.num_kv_heads) for n in ("k_proj", "v_proj")),
    )
    if module.rope is not None:
        pos = torch.arange(t) if positions is None else positions
        q = apply_rope(q, pos, base=module.rope.base, layout=module.rope.layout)
        k = apply_rope(k, pos, base=module.rope.base, layout=module.rope.layout)
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    allowed = j <= i
    if module.window is not None:
        allowed = allowed & (i - j < module.window)
    group = module.num_heads // module.num_kv_heads
    heads = []
    for h in range(module.num_heads):
        kv = h // group  # query heads 0..group-1 share key/value head 0, and so on
        scores = q[:, h] @ k[:, kv].transpose(-1, -2) / math.sqrt(module.head_dim)
        scores = scores.masked_fill(~allowed, float("-inf"))
        heads.append(scores.softmax(-1) @ v[:, kv])  # (b, t, hd)
    concat = torch.cat(heads, dim=-1)  # (b, t, num_heads * hd)
    if module.gate_proj is not None:  # Qwen3-Next: each feature of each head gated by its token
        gate = x64 @ module.gate_proj.weight.double().T
        if module.gate_proj.bias is not None:
            gate = gate + module.gate_proj.bias.double()
        concat = concat * torch.sigmoid(gate)
    out = concat @ w["out_proj"].weight.double().T
    if w["out_proj"].bias is not None:
        out = out + w["out_proj"].bias.double()
    return out.to(x.dtype)


CONFIGS = {
    "gqa": {"num_kv_heads": 3},
    "mqa": {"num_kv_heads": 1},
    "mha": {"num_kv_heads": 6},
    "gqa-window": {"num_kv_heads": 3, "scores": ScoreRule(window=WINDOW)},
    "mqa-window-interleaved": {
        "num_kv_heads": 1,
        "scores": ScoreRule(window=WINDOW),
        "rope": Rope(layout="interleaved"),
    },
    "gqa-no-rope": {"num_kv_heads": 3, "rope": None},
    "mha-window-no-rope-bias": {
        "num_kv_heads": 6,
        "scores": ScoreRule(window=WINDOW),
        "rope": None,
        "bias": True,
    },
    "qwen2-biases": {"num_kv_heads": 2, "bias": "qkv", "rope": Rope(base=300.0)},
    "gqa-gated-biases": {"num_kv_heads": 3, "bias": True, "gates": HeadGates(output_gate=True)},
}


@pytest.mark.parametrize("backend", ["torch", "scratch"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_equals_per_head_reference(name: str, backend: str) -> None:
    module = _module(**{**CONFIGS[name], "backend": backend})
    if module.bias:
        with torch.no_grad():
            for lin in module.modules():
                if isinstance(lin, torch.nn.Linear) and lin.bias is not None:
                    lin.bias.normal_()  # the gate's too
    x = torch.randn(B, T, D_MODEL)
    torch.testing.assert_close(module(x), reference(module, x), atol=1e-5, rtol=1e-5)


def test_backends_agree_in_gradients() -> None:
    torch_module = _module(scores=ScoreRule(window=WINDOW))
    scratch = _module(scores=ScoreRule(window=WINDOW), backend="scratch")
    scratch.load_state_dict(torch_module.state_dict())
    x1 = torch.randn(B, T, D_MODEL, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    torch_module(x1).square().sum().backward()
    scratch(x2).square().sum().backward()
    assert x1.grad is not None
    assert x2.grad is not None
    torch.testing.assert_close(x2.grad, x1.grad)
    for (name, p1), p2 in zip(torch_module.named_parameters(), scratch.parameters(), strict=True):
        assert p1.grad is not None, name
        assert p2.grad is not None, name
        torch.testing.assert_close(p2.grad, p1.grad, msg=name)


def test_sinks_on_torch_equal_scratch_with_masks_and_gradients() -> None:
    """PyTorch's SDPA has no sinks: the torch backend adds one key of zeros whose score is
    the sink logit (a float-mask column). It must equal the scratch kernel's sinks on the
    fused causal path, with a bool padding mask and with a float one, gradients included."""
    torch_module = _module(gates=HeadGates(learned_sinks=True))
    with torch.no_grad():
        assert torch_module.sink_logits is not None
        torch_module.sink_logits.normal_(0.0, 2.0)
    scratch = _module(gates=HeadGates(learned_sinks=True), backend="scratch")
    scratch.load_state_dict(torch_module.state_dict())
    x1 = torch.randn(B, T, D_MODEL, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    pad = masks.key_padding([T, 6], max_len=T)
    outs = []
    for mask in (None, pad, masks.allowed_to_additive(pad)):
        outs.append((torch_module(x1, attn_mask=mask), scratch(x2, attn_mask=mask)))
        torch.testing.assert_close(*outs[-1])
    torch.stack([a.square().sum() for a, _ in outs]).sum().backward()
    torch.stack([b.square().sum() for _, b in outs]).sum().backward()
    assert x1.grad is not None
    assert x2.grad is not None
    assert torch_module.sink_logits is not None
    assert scratch.sink_logits is not None
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(torch_module.sink_logits.grad, scratch.sink_logits.grad)
    # The sink takes its share: every row of weights sums to less than 1.
    _, weights = torch_module(x1, need_weights=True)
    assert weights.sum(-1).max() < 1.0


def test_sinks_agree_on_every_backend_with_a_causal_bias() -> None:
    """The torch backend's extra sink key also under PyTorch's CausalBias (bottom-right)."""
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 6)
    sinks = torch.randn(4)
    bias = causal_lower_right(3, 5)
    causal = ScoreRule(is_causal=True, align="bottom-right", sink_logits=sinks)
    expected = _backends.attend("flash", q, k, v, causal, enable_gqa=True)
    for backend in ("torch", "scratch"):
        rule = ScoreRule(sink_logits=sinks)
        got = _backends.attend(backend, q, k, v, rule, attn_mask=bias, enable_gqa=True)
        torch.testing.assert_close(got, expected, msg=backend)


def test_softcap_runs_on_scratch_and_flash_and_torch_refuses_it() -> None:
    scratch = _module(scores=ScoreRule(softcap=0.5), backend="scratch")
    flash = _module(scores=ScoreRule(softcap=0.5), backend="flash")
    plain = _module(backend="scratch")
    flash.load_state_dict(scratch.state_dict())
    plain.load_state_dict(scratch.state_dict())
    x = torch.randn(B, T, D_MODEL)
    out = scratch(x)
    torch.testing.assert_close(flash(x), out)
    assert (plain(x) - out).abs().max() > 1e-3  # the cap changed the scores
    scratch.backend = "torch"
    with pytest.raises(
        ValueError, match=r"backend='torch' has no softcap .* use backend='scratch' or 'flash'"
    ):
        scratch(x)


def test_group_size_and_repr() -> None:
    module = _module(2)
    assert module.group_size == 3
    assert repr(module) == (
        "GroupedQueryAttention(\n  d_model=20, num_heads=6, num_kv_heads=2, head_dim=4, "
        "rope=Rope(base=10000.0, layout='half', dims=None, scaling=None), window=None, "
        "bias=False, out_bias=False, "
        "dropout=0.0, backend='torch'\n"
        "  (q_proj): Linear(in_features=20, out_features=24, bias=False)\n"
        "  (k_proj): Linear(in_features=20, out_features=8, bias=False)\n"
        "  (v_proj): Linear(in_features=20, out_features=8, bias=False)\n"
        "  (out_proj): Linear(in_features=24, out_features=20, bias=False)\n)"
    )


def test_default_head_dim_and_mha() -> None:
    module = GroupedQueryAttention(24, 4).eval()
    assert (module.head_dim, module.num_kv_heads, module.k_proj.out_features) == (6, 4, 24)
    x = torch.randn(B, T, 24)
    torch.testing.assert_close(module(x), reference(module, x).float(), atol=1e-5, rtol=1e-5)


def test_output_gate_is_an_option_of_the_layer() -> None:
    """Qwen3-Next's gate is one more projection of the layer (no wrapper): a closed gate
    silences every head whatever they attend to, and the weights do not see it."""
    module = _module(gates=HeadGates(output_gate=True), bias=True)
    assert [name for name, _ in module.named_parameters()] == [
        f"{proj}.{p}" for proj in ("q_proj", "k_proj", "v_proj", "out_proj", "gate_proj")
        for p in ("weight", "bias")
    ]  # fmt: skip
    assert "gates=HeadGates(learned_sinks=False, output_gate=True), dropout" in repr(module)
    assert "(gate_proj): Linear(in_features=20, out_features=24, bias=True)" in repr(module)
    plain = _module(bias=True)
    plain.load_state_dict(module.state_dict(), strict=False)  # all but the gate
    x = torch.randn(B, T, D_MODEL)
    out, weights = module(x, need_weights=True)
    torch.testing.assert_close(weights, plain(x, need_weights=True)[1])
    torch.testing.assert_close(module(x[0]), out[0])  # unbatched
    assert module.gate_proj is not None
    with torch.no_grad():
        module.gate_proj.bias.fill_(-1e4)  # sigmoid 0: every feature of every head closed
    assert module.out_proj.bias is not None
    torch.testing.assert_close(module(x), module.out_proj.bias.expand(B, T, D_MODEL))


# -- properties ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gqa", "gqa-window"])
def test_future_tokens_do_not_change_earlier_outputs(name: str) -> None:
    module = _module(**CONFIGS[name])
    x = torch.randn(B, T, D_MODEL)
    changed = x.clone()
    changed[:, 5:] = torch.randn(B, T - 5, D_MODEL)
    torch.testing.assert_close(module(changed)[:, :5], module(x)[:, :5])
    assert not torch.allclose(module(changed)[:, 5:], module(x)[:, 5:])


def test_window_forgets_tokens_beyond_it() -> None:
    module = _module(scores=ScoreRule(window=WINDOW))
    x = torch.randn(B, T, D_MODEL)
    changed = x.clone()
    changed[:, 0] = torch.randn(B, D_MODEL)
    # Token 0 is within the window of tokens 0 .. WINDOW - 1 only.
    out, out_changed = module(x), module(changed)
    torch.testing.assert_close(out_changed[:, WINDOW:], out[:, WINDOW:])
    assert not torch.allclose(out_changed[:, WINDOW - 1], out[:, WINDOW - 1])


def test_rope_sees_only_relative_positions() -> None:
    module = _module()
    x = torch.randn(B, T, D_MODEL)
    shifted = module(x, positions=torch.arange(T) + 17)
    torch.testing.assert_close(shifted, module(x), atol=1e-5, rtol=1e-5)


def test_per_sequence_positions_equal_separate_calls() -> None:
    module = _module()
    x = torch.randn(B, T, D_MODEL)
    positions = torch.stack([torch.arange(T), torch.arange(T) * 2 + 3])  # (b, t)
    both = module(x, positions=positions)
    for s in range(B):
        alone = module(x[s : s + 1], positions=positions[s])
        torch.testing.assert_close(both[s : s + 1], alone)
        torch.testing.assert_close(both[s], reference(module, x[s : s + 1], positions[s])[0])


def test_unbatched_equals_batch_of_one() -> None:
    module = _module()
    x = torch.randn(T, D_MODEL)
    torch.testing.assert_close(module(x), module(x[None])[0])


def test_padding_mask_combines_with_the_causal_mask() -> None:
    module = _module(scores=ScoreRule(window=WINDOW))
    x = torch.randn(B, T, D_MODEL)
    lengths = [T, 6]
    out = module(x, attn_mask=masks.key_padding(lengths, max_len=T))
    # Right padding hides only keys after a sequence's end: its real tokens never see them.
    torch.testing.assert_close(out[1, :6], module(x[1:, :6])[0])
    torch.testing.assert_close(out[0], module(x[:1])[0])
    additive = masks.allowed_to_additive(masks.key_padding(lengths, max_len=T))
    torch.testing.assert_close(module(x, attn_mask=additive)[1, :6], out[1, :6])


def test_dropout_only_in_training() -> None:
    module = _module(dropout=0.5)
    x = torch.randn(B, T, D_MODEL)
    torch.testing.assert_close(module(x), reference(module, x), atol=1e-5, rtol=1e-5)
    module.train()
    assert not torch.allclose(module(x), reference(module, x), atol=1e-3)


# -- KV-cached decoding equals the full forward ------------------------------------------


def _decode(
    module: GroupedQueryAttention, x: Tensor, schedule: list[int], cache: KVCache
) -> Tensor:
    outs, start = [], 0
    for n in schedule:
        outs.append(module(x[:, start : start + n], cache=cache))
        start += n
    return torch.cat(outs, dim=1)


SCHEDULES = {
    "prompt1": [1] * 11,
    "prompt4": [4, 1, 1, 1, 1, 1, 1, 1],
    "prompt7": [7, 1, 1, 1, 1],
    "chunks": [2, 5, 1, 3],
    "prompt11": [11],
}


# Every schedule with the sliding window (crossing its boundary inside the prompt and while
# decoding) and each cache; the other configurations with two schedules, one per cache.
DECODE_CASES = [
    *(("gqa-window", schedule, cache) for schedule in SCHEDULES for cache in ("dynamic", "static")),
    *(
        case
        for name in ("gqa", "mqa", "mha", "mqa-window-interleaved", "gqa-no-rope")
        for case in ((name, "prompt4", "dynamic"), (name, "chunks", "static"))
    ),
    ("mha", "prompt1", "static"),
    ("gqa-no-rope", "prompt1", "dynamic"),
    ("gqa-gated-biases", "prompt4", "dynamic"),
    ("gqa-gated-biases", "chunks", "static"),
]


@pytest.mark.parametrize(("name", "schedule", "cache_kind"), DECODE_CASES)
def test_cached_decoding_equals_full_forward(name: str, schedule: str, cache_kind: str) -> None:
    module = _module(**CONFIGS[name])
    steps = SCHEDULES[schedule]
    x = torch.randn(B, sum(steps), D_MODEL)
    cache: KVCache = (
        DynamicKVCache()
        if cache_kind == "dynamic"
        else StaticKVCache(B, 12, module.num_kv_heads, HD)
    )
    with torch.no_grad():
        got = _decode(module, x, steps, cache)
        expected = module(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert cache.length == sum(steps)


def test_cached_decoding_with_both_backends_and_gradients() -> None:
    module = _module(scores=ScoreRule(window=WINDOW), backend="scratch")
    x = torch.randn(B, 8, D_MODEL, requires_grad=True)
    cache = DynamicKVCache()
    got = _decode(module, x, [3, 1, 1, 2, 1], cache)
    expected = module(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    (grad_got,) = torch.autograd.grad(got.sum(), x)
    (grad_expected,) = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(grad_got, grad_expected, atol=1e-5, rtol=1e-5)


def test_default_positions_continue_after_the_cache() -> None:
    module = _module()
    x = torch.randn(B, 5, D_MODEL)
    implicit, explicit = DynamicKVCache(), DynamicKVCache()
    module(x[:, :3], cache=implicit)
    module(x[:, :3], cache=explicit, positions=torch.arange(3))
    torch.testing.assert_close(
        module(x[:, 3:], cache=implicit),
        module(x[:, 3:], cache=explicit, positions=torch.tensor([3, 4])),
    )


def test_decode_step_mask_is_bottom_right_aligned() -> None:
    # After 4 cached tokens, 2 new queries see keys 0..4 and 0..5: the diagonal of the
    # causal mask sits at the bottom right. A top-left mask would hide tokens 2..4.
    mask = masks.causal(2, 6, align="bottom-right")
    assert mask.tolist() == [
        [True, True, True, True, True, False],
        [True, True, True, True, True, True],
    ]
    module = _module(rope=None)
    x = torch.randn(B, 6, D_MODEL)
    cache = DynamicKVCache()
    module(x[:, :4], cache=cache)
    torch.testing.assert_close(module(x[:, 4:], cache=cache), module(x)[:, 4:])


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"num_heads": 6, "num_kv_heads": 4},
            ValueError,
            "num_heads must be a multiple of num_kv_heads .* got num_heads=6 and num_kv_heads=4",
        ),
        ({"num_kv_heads": 0}, ValueError, "num_kv_heads must be a positive int, got 0"),
        (
            {"d_model": 21, "head_dim": None},
            ValueError,
            "d_model must be a multiple of num_heads when head_dim is not given, got "
            "d_model=21 and num_heads=6",
        ),
        ({"head_dim": 5}, ValueError, r"head_dim must be even \(RoPE rotates pairs.*got 5"),
        ({"scores": ScoreRule(window=0)}, ValueError, "window must be a positive int, got 0"),
        ({"rope": Rope(base=1.0)}, ValueError, r"rope\.base must be a finite float greater than 1"),
        (
            {"rope": Rope(base="big")},
            TypeError,
            r"rope\.base must be a float greater than 1, got 'big'",
        ),
        ({"rope": Rope(base=0.5)}, ValueError, r"rope\.base must be a finite float greater than 1"),
        (
            {"rope": Rope(layout="pairs")},
            ValueError,
            r"rope\.layout must be one of 'half', 'interleaved'",
        ),
        (
            {"backend": "cuda"},
            ValueError,
            "backend must be one of 'torch', 'scratch', 'flash', 'triton'",
        ),
        ({"bias": 1}, TypeError, r"bias must be True, False or 'qkv', got 1"),
        ({"dropout": 1.0}, ValueError, r"dropout must be in \[0, 1\)"),
        (
            {"scores": ScoreRule(softcap=0.0)},
            ValueError,
            r"softcap must be a positive finite float .* got 0.0",
        ),
        (
            {"scores": ScoreRule(softcap=30.0)},
            ValueError,
            r"backend='torch' has no softcap .* softcap=30.0",
        ),
        (
            {"gates": HeadGates(learned_sinks=1)},  # type: ignore[arg-type]
            TypeError,
            r"gates\.learned_sinks must be a bool, got 1 \(int\)",
        ),
        (
            {"gates": HeadGates(output_gate="yes")},  # type: ignore[arg-type]
            TypeError,
            r"gates\.output_gate must be a bool, got 'yes' \(str\)",
        ),
        ({"gates": True}, TypeError, "gates must be a HeadGates or None, got bool"),
        ({"rope": True}, TypeError, r"rope must be a Rope or None \(no RoPE\), got bool"),
        ({"rope": Rope(dims=6)}, ValueError, r"rope\.dims must be at most head_dim=4"),
        ({"scores": {"window": 2}}, TypeError, "scores must be a ScoreRule, got dict"),
        (
            {"scores": ScoreRule(is_causal=True)},
            ValueError,
            r"scores sets is_causal, align or sink_logits.*forward\(\.\.\., is_causal=\.\.\.\)",
        ),
        (
            {"scores": ScoreRule(sink_logits=torch.zeros(H))},
            ValueError,
            r"gates=HeadGates\(learned_sinks=True\) instead",
        ),
    ],
)
def test_constructor_rejects_bad_configuration(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    args: dict[str, object] = {
        "d_model": D_MODEL,
        "num_heads": H,
        "num_kv_heads": 3,
        "head_dim": HD,
    }
    args.update(kwargs)
    with pytest.raises(error, match=message):
        GroupedQueryAttention(**args)  # type: ignore[arg-type]


def test_odd_head_dim_is_fine_without_rope() -> None:
    module = GroupedQueryAttention(D_MODEL, H, 3, head_dim=5, rope=None).eval()
    x = torch.randn(B, T, D_MODEL)
    torch.testing.assert_close(module(x), reference(module, x).float(), atol=1e-5, rtol=1e-5)


def _prefilled(cache: KVCache, module: GroupedQueryAttention, t: int = 4) -> KVCache:
    module(torch.randn(B, t, D_MODEL), cache=cache)
    return cache


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_forward_rejects_a_cache_that_does_not_fit(kind: str) -> None:
    """The cache checks its own append (one rule, `KVCache.check_update`), in its terms."""
    module = _module()
    cache: KVCache = DynamicKVCache() if kind == "dynamic" else StaticKVCache(B, 6, 3, HD)
    _prefilled(cache, module)
    with pytest.raises(ValueError, match=r"key has batch size 3 but the cache holds 2 sequences"):
        module(torch.randn(3, 1, D_MODEL), cache=cache)
    with pytest.raises(
        ValueError, match=re.escape("key has dtype torch.float64 but the cache holds torch.float32")
    ):
        module.double()(torch.randn(B, 1, D_MODEL, dtype=torch.float64), cache=cache)
    module.float()
    other = _module(num_kv_heads=1)
    with pytest.raises(
        ValueError, match="key has num_kv_heads=1 but the cache holds num_kv_heads=3"
    ):
        other(torch.randn(B, 1, D_MODEL), cache=cache)
    assert cache.length == 4  # nothing was appended


def test_forward_rejects_overflowing_a_static_cache() -> None:
    module = _module()
    cache = _prefilled(StaticKVCache(B, 6, 3, HD), module)
    message = r"t_new=3 tokens but the static cache has room for max_length - length = 6 - 4 = 2"
    with pytest.raises(ValueError, match=message):
        module(torch.randn(B, 3, D_MODEL), cache=cache)
    with validation(False), pytest.raises(ValueError, match=message):  # checked even then
        module(torch.randn(B, 3, D_MODEL), cache=cache)
    assert cache.length == 4


@pytest.mark.parametrize(
    ("positions", "error", "message"),
    [
        (
            torch.tensor([-1]),
            ValueError,
            r"positions must be non-negative .*, got positions from -1 to -1",
        ),
        (
            torch.tensor([4.0]),
            TypeError,
            r"positions must be an integer tensor \(t,\) or \(b, t\), got torch.float32",
        ),
        (
            torch.tensor([[4], [4], [4]]),
            ValueError,
            re.escape(
                "positions of shape (b, t)=(3, 1) need x batched with the same b first "
                "(or b = 1), got x.shape=(2, 1, 20)"
            ),
        ),
        (
            torch.tensor([4, 5]),
            ValueError,
            re.escape("positions has 2 positions but x has 1 tokens"),
        ),
        ([4], TypeError, r"positions must be an integer tensor \(t,\) or \(b, t\), got list"),
    ],
)
def test_forward_rejects_bad_positions(
    positions: object, error: type[Exception], message: str
) -> None:
    module = _module()
    cache = _prefilled(DynamicKVCache(), module)
    with pytest.raises(error, match=message):
        module(torch.randn(B, 1, D_MODEL), cache=cache, positions=positions)  # type: ignore[arg-type]
    assert cache.length == 4


def test_positions_past_the_cache_are_accepted_and_only_rotate() -> None:
    """Positions start anywhere (HF allows it): prefill an empty cache at 100..103."""
    module = _module()
    x = torch.randn(B, 6, D_MODEL)
    cache = DynamicKVCache()
    prefill = module(x[:, :4], cache=cache, positions=torch.arange(100, 104))
    step = module(x[:, 4:], cache=cache, positions=torch.tensor([104, 105]))
    got = torch.cat([prefill, step], dim=1)
    # RoPE sees only offsets, so the shift by 100 changes nothing.
    torch.testing.assert_close(got, module(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, reference(module, x).float(), atol=1e-5, rtol=1e-5)


def test_positions_of_one_row_broadcast_over_the_batch() -> None:
    module = _module()
    x = torch.randn(B, T, D_MODEL)
    row = (torch.arange(T) * 3)[None]  # (1, t), HF's default position_ids
    expected = reference(module, x, row[0]).float()
    torch.testing.assert_close(module(x, positions=row), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(module(x, positions=row), module(x, positions=row[0]))


def test_precomputed_position_embeddings_equal_positions() -> None:
    module = _module(scores=ScoreRule(window=WINDOW))
    x = torch.randn(B, T, D_MODEL)
    positions = torch.stack([torch.arange(T), torch.arange(T) + 5])
    tables = rope_cos_sin(positions, HD, base=10000.0)
    expected = module(x, positions=positions)
    torch.testing.assert_close(module(x, position_embeddings=tables), expected)
    cos, sin = tables
    hf_style = (torch.cat([cos, cos], -1), torch.cat([sin, sin], -1))  # (b, t, head_dim)
    torch.testing.assert_close(module(x, position_embeddings=hf_style), expected)
    with pytest.raises(ValueError, match="either positions or position_embeddings"):
        module(x, positions=positions, position_embeddings=tables)
    with pytest.raises(ValueError, match="position_embeddings needs a module built with rope"):
        _module(rope=None)(x, position_embeddings=tables)


def test_rope_tables_are_built_once_per_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """One decode step: one cos/sin table for queries and keys, positions checked once."""
    import attnlab.layers.gqa as gqa_module
    import attnlab.rules.rope as rope_module

    calls = {"tables": 0, "checks": 0}
    real_tables, real_check = rope_module.rope_cos_sin, rope_module.check_positions

    def tables(*args: object, **kwargs: object) -> tuple[Tensor, Tensor]:
        calls["tables"] += 1
        return real_tables(*args, **kwargs)  # type: ignore[arg-type]

    def check(*args: object, **kwargs: object) -> Tensor:
        calls["checks"] += 1
        return real_check(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gqa_module, "rope_cos_sin", tables)
    monkeypatch.setattr(rope_module, "check_positions", check)
    module = _module()
    cache = _prefilled(DynamicKVCache(), module)
    calls.update(tables=0, checks=0)
    module(torch.randn(B, 1, D_MODEL), cache=cache, positions=torch.tensor([4]))
    assert calls == {"tables": 1, "checks": 1}


def test_float64_gradcheck_with_rope() -> None:
    """RoPE rotates in float64 for float64 input, so the layer gradchecks (it used not to)."""
    module = _module(scores=ScoreRule(window=WINDOW)).double()
    x = torch.randn(1, 5, D_MODEL, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([0, 1, 2, 40, 41])
    # The one gradcheck of a layer without a custom backward: issue 19 found that it
    # failed while RoPE rotated float64 input in float32.
    assert torch.autograd.gradcheck(lambda t: module(t, positions=positions), (x,), fast_mode=True)


@pytest.mark.parametrize(
    "name", ["gqa", "gqa-window", "mqa-window-interleaved", "gqa-gated-biases"]
)
def test_flash_backend_equals_torch(name: str) -> None:
    module = _module(**CONFIGS[name])
    flash = _module(**CONFIGS[name], backend="flash")
    flash.load_state_dict(module.state_dict())
    x = torch.randn(B, T, D_MODEL, requires_grad=True)
    x_flash = x.detach().clone().requires_grad_(True)
    expected, got = module(x), flash(x_flash)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    expected.square().sum().backward()
    got.square().sum().backward()
    assert x.grad is not None
    assert x_flash.grad is not None
    torch.testing.assert_close(x_flash.grad, x.grad, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        cached = _decode(flash, x.detach(), [4, 1, 1, 3], DynamicKVCache())
    torch.testing.assert_close(cached, expected.detach(), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="backend='flash' takes no attn_mask"):
        flash(x, attn_mask=masks.key_padding([T, 5], max_len=T))


def test_exports_with_validation_on() -> None:
    """The positions' value check (a host sync) is skipped while exporting, not in eager."""
    module = _module(scores=ScoreRule(window=WINDOW))
    x, positions = torch.randn(B, T, D_MODEL), torch.arange(T) + 5
    exported = torch.export.export(module, (x,), kwargs={"positions": positions})
    expected = module(x, positions=positions)
    torch.testing.assert_close(exported.module()(x, positions=positions), expected)


def test_not_causal_attends_to_every_key() -> None:
    module = _module(rope=None)
    x = torch.randn(B, T, D_MODEL)
    q = module.q_proj(x).view(B, T, H, HD).transpose(1, 2)
    k = module.k_proj(x).view(B, T, 3, HD).transpose(1, 2)
    v = module.v_proj(x).view(B, T, 3, HD).transpose(1, 2)
    heads = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    )
    expected = module.out_proj(heads.transpose(1, 2).reshape(B, T, H * HD))
    torch.testing.assert_close(module(x, is_causal=False), expected)
    with pytest.raises(ValueError, match="is_causal=False with window=3"):
        _module(scores=ScoreRule(window=WINDOW))(x, is_causal=False)


def test_forward_rejects_other_inputs() -> None:
    module = _module()
    with pytest.raises(TypeError, match=r"cache must be an attnlab KVCache .* got dict"):
        module(torch.randn(B, 1, D_MODEL), cache={})  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match="x has 21 features but GroupedQueryAttention expects d_model=20"
    ):
        module(torch.randn(B, 1, 21))
    with pytest.raises(
        ValueError,
        match=re.escape("does not broadcast to the attention weights' shape (2, 6, 9, 9)"),
    ):
        module(torch.randn(B, T, D_MODEL), attn_mask=torch.ones(T, T + 1, dtype=torch.bool))
    with_sinks = _module(gates=HeadGates(learned_sinks=True))
    with_sinks.sink_logits = torch.nn.Parameter(torch.zeros(3))  # one per key/value head: wrong
    with pytest.raises(
        ValueError, match=r"sink_logits must hold one logit per query head, shape \(6,\)"
    ):
        with_sinks(torch.randn(B, T, D_MODEL))


def test_validation_off_gives_the_same_outputs() -> None:
    module = _module(scores=ScoreRule(window=WINDOW))
    x = torch.randn(B, 7, D_MODEL)
    expected = _decode(module, x, [4, 1, 2], StaticKVCache(B, 8, 3, HD))
    with validation(False):
        got = _decode(module, x, [4, 1, 2], StaticKVCache(B, 8, 3, HD))
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["mask", "dropout"])
def test_flash_refusal_leaves_the_cache_as_it_was(dropout: float) -> None:
    """A call the flash backend cannot serve is refused before the cache is appended to."""
    module = _module(backend="flash", dropout=dropout).train(dropout > 0)
    cache = DynamicKVCache()
    x = torch.randn(B, T, D_MODEL)
    module.eval()(x[:, :3], cache=cache)
    nbytes = cache.nbytes
    mask = None if dropout else torch.ones(1, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="backend='flash'"):
        module.train(dropout > 0)(x[:, 3:4], cache=cache, attn_mask=mask)
    assert (cache.length, cache.nbytes) == (3, nbytes)


_POSITIVE_FLOATS: dict[str, Any] = {
    "RMSNorm eps": lambda v: RMSNorm(4, eps=v),
    "GQA qk_norm.eps": lambda v: GroupedQueryAttention(8, 2, qk_norm=QKNormSpec(eps=v)),
    "GatedDeltaNet norm_eps": lambda v: GatedDeltaNet(
        8, num_k_heads=1, num_v_heads=2, head_k_dim=3, head_v_dim=4, norm_eps=v
    ),
    "DecoderConfig norm_eps": lambda v: DecoderConfig(**_DECODER_SIZES, norm_eps=v),
    "DecoderConfig query_pre_attn_scalar": lambda v: DecoderConfig(
        **_DECODER_SIZES, query_pre_attn_scalar=v
    ),
    "MLA norm_eps": lambda v: MultiHeadLatentAttention(8, 2, **_MLA_SIZES, norm_eps=v),
    "RopeScaling attention_factor": lambda v: RopeScaling("yarn", 4.0, 16, attention_factor=v),
    "RopeScaling beta_fast": lambda v: RopeScaling("yarn", 4.0, 16, beta_fast=v),
    "LightningIndexer norm_eps": lambda v: LightningIndexer(8, 2, 4, norm_eps=v),
}
_DECODER_SIZES: dict[str, Any] = {
    "vocab_size": 10, "d_model": 8, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
    "head_dim": 4, "hidden_dim": 12,
}  # fmt: skip
_MLA_SIZES: dict[str, Any] = {
    "kv_lora_rank": 4, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 3,
}  # fmt: skip


@pytest.mark.parametrize("where", list(_POSITIVE_FLOATS))
@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (True, TypeError, "must be a positive float, got True"),
        ("1e-6", TypeError, "must be a positive float, got '1e-6'"),
        (0.0, ValueError, "must be a positive finite float, got 0.0"),
        (-1, ValueError, "must be a positive finite float, got -1.0"),
        (math.inf, ValueError, "must be a positive finite float, got inf"),
        (math.nan, ValueError, "must be a positive finite float, got nan"),
    ],
)
def test_positive_floats_follow_one_rule(
    where: str, value: object, error: type[Exception], message: str
) -> None:
    # One rule (_validation.check_positive_float) for every eps and positive scalar: before
    # it, GatedDeltaNet took True and inf, MLA took norm_eps=0.0 and linear raised
    # ValueError for a string.
    name = where.split()[-1]
    with pytest.raises(error, match=f"^{name} {message}"):
        _POSITIVE_FLOATS[where](value)
    _POSITIVE_FLOATS[where](2)  # an int is a number: accepted


def test_rms_normalize_is_the_float32_core_of_rmsnorm() -> None:
    # The one RMS core of RMSNorm and GatedDeltaNet's gated norm: float32 for bf16 input,
    # PyTorch's rms_norm of the widened input, and RMSNorm is it times the weight.
    x = torch.randn(3, 5, 8).bfloat16()
    got = rms_normalize(x, 1e-5)
    assert got.dtype == torch.float32
    expected = torch.nn.functional.rms_norm(x.float(), (8,), eps=1e-5)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    norm = RMSNorm(8, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
    assert torch.equal(norm(x), (got * norm.weight).bfloat16())


def _attention_layers() -> dict[str, torch.nn.Module]:
    def mla() -> MultiHeadLatentAttention:
        return MultiHeadLatentAttention(8, 2, **_MLA_SIZES)

    return {
        "gqa": GroupedQueryAttention(8, 2, num_kv_heads=1),
        "mla": mla(),
        "dsa": DeepSeekSparseAttention(mla(), LightningIndexer(8, 2, 4, rope_dim=2), topk=2),
    }


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda m: m(torch.zeros(1, 3, 5)), ValueError, "x has 5 features"),
        (lambda m: m(torch.zeros(1, 3, 8, dtype=torch.long)), TypeError, "floating-point"),
        (lambda m: m(torch.zeros(1, 3, 8), positions=torch.zeros(3)), TypeError, "positions"),
        (lambda m: m(torch.zeros(1, 3, 8), positions=torch.arange(4)), ValueError, "positions"),
    ],
)
def test_gqa_mla_and_dsa_share_one_sequence_of_call_checks(
    call: Any, error: type[Exception], message: str
) -> None:
    # gqa.check_attention_inputs is the one home: the same bad call, the same message.
    x_like = torch.zeros(1, 8)
    seen = set()
    for layer in _attention_layers().values():
        with pytest.raises(error, match=message) as info:
            call(layer)
        seen.add(str(info.value).replace(type(layer).__name__, "<owner>"))
    assert len(seen) == 1, seen
    with pytest.raises(error, match=message):
        call(
            lambda x, positions=None: check_attention_inputs(
                x, d_model=8, owner="<owner>", like=x_like, rope_dims=2, positions=positions
            )
        )


def test_call_checks_size_the_mask_with_the_cache_and_the_window() -> None:
    x, like = torch.zeros(2, 3, 8), torch.zeros(1, 8)
    cache = DynamicKVCache()
    cache.update(torch.zeros(2, 1, 4, 4), torch.zeros(2, 1, 4, 4))  # 4 cached tokens
    ok = torch.ones(2, 1, 3, 7, dtype=torch.bool)  # (b, h, t, cached + t)
    args: dict[str, Any] = {"d_model": 8, "owner": "M", "like": like, "rope_dims": 4}
    assert check_attention_inputs(x, cache=cache, attn_mask=ok, num_heads=2, **args) is x
    with pytest.raises(ValueError, match=r"attn_mask .*\(2, 2, 3, 7\)"):
        check_attention_inputs(x, cache=cache, attn_mask=ok[..., :5], num_heads=2, **args)
    with pytest.raises(ValueError, match="is_causal=False with window=4"):
        check_attention_inputs(x, is_causal=False, window=4, **args)
    for cls in (GroupedQueryAttention, MultiHeadLatentAttention):
        kwargs: dict[str, Any] = {"scores": ScoreRule(window="4")}  # type: ignore[arg-type]
        if cls is MultiHeadLatentAttention:
            kwargs = dict(_MLA_SIZES) | {"window": "4"}
        with pytest.raises(TypeError, match="window must be a positive int"):
            cls(8, 2, **kwargs)  # masks.check_window, the one rule of a window
