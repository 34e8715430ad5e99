"""Logit softcapping and learned attention sinks, equal to Gemma 2's and gpt-oss's attention.

The references are the attention functions of Hugging Face `transformers`, run on the
layers of small random configs (nothing is downloaded):
`transformers.models.gemma2.modeling_gemma2.eager_attention_forward` with the layer's
`softcap` and `scaling` (from `query_pre_attn_scalar`), and
`transformers.models.gpt_oss.modeling_gpt_oss.eager_attention_forward`, which reads the
layer's `sinks`. The masks come from `transformers.masking_utils`' own mask functions,
evaluated on index grids, so the window rule (gpt-oss: 128 keys on every other layer) is
theirs, not attnlab's. Both kernels are checked: the from-scratch
`scaled_dot_product_attention` (grouped-query heads through `enable_gqa`) and the tiled
`flash_attention` (heads repeated first: it has no GQA), forward and backward, and the
hand-written backward by `torch.autograd.gradcheck` in float64.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

transformers = pytest.importorskip("transformers")

from transformers import Gemma2Config, GptOssConfig  # noqa: E402
from transformers.masking_utils import (  # noqa: E402
    add_offsets_to_mask_function,
    causal_mask_function,
    sliding_window_causal_mask_function,
)
from transformers.models.gemma2 import modeling_gemma2  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: E402

import attnlab  # noqa: E402
from attnlab.functional.flash import flash_attention  # noqa: E402
from attnlab.functional.sdpa import attention_weights, scaled_dot_product_attention  # noqa: E402
from attnlab.rules import masks  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, B = 4, 2, 8, 2
# The sizes of both configs; the layers' projections are not used, only their settings.
SIZES: dict[str, Any] = {
    "vocab_size": 32,
    "hidden_size": 24,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "num_hidden_layers": 2,
}
TOL: dict[str, Any] = {"atol": 1e-5, "rtol": 1e-5}


def _qkv(t_q: int, t_k: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> Any:
    """Queries of HEADS heads, keys and values of KV_HEADS, as the layers' projections give."""
    q = torch.randn(B, HEADS, t_q, HEAD_DIM, dtype=dtype) * scale  # (b, h, L, E)
    k = torch.randn(B, KV_HEADS, t_k, HEAD_DIM, dtype=dtype) * scale  # (b, kvh, S, E)
    v = torch.randn(B, KV_HEADS, t_k, HEAD_DIM + 3, dtype=dtype)  # (b, kvh, S, Ev)
    return q, k, v


def _repeat(x: Tensor) -> Tensor:
    """Key/value heads repeated for flash_attention, which has no enable_gqa."""
    return x.repeat_interleave(HEADS // KV_HEADS, dim=1)  # (b, h, S, e)


def _hf_mask(fn: Callable[..., Any], t_q: int, t_k: int, dtype: torch.dtype) -> Tensor:
    """transformers' mask function on index grids, as its eager layers add it: (L, S)."""
    allowed = fn(0, 0, torch.arange(t_q)[:, None], torch.arange(t_k)[None, :])  # (L, S)
    return torch.zeros(t_q, t_k, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


# -- softcapping: Gemma 2 -----------------------------------------------------------------


def _gemma2_layer() -> Any:
    config = Gemma2Config(
        **SIZES,
        query_pre_attn_scalar=12,  # scaling 12 ** -0.5, not head_dim ** -0.5
        attn_logit_softcapping=50.0,
    )
    layer = modeling_gemma2.Gemma2Attention(config, layer_idx=1).eval()
    assert layer.attn_logit_softcapping == 50.0
    assert layer.scaling == 12**-0.5
    return layer


def _capped_reference(q: Tensor, k: Tensor, v: Tensor, scale: float, cap: float) -> Tensor:
    """Dense float64 softcapped causal attention, written out: c tanh(s q.k / c), then mask."""
    q, k, v = q.double(), _repeat(k).double(), _repeat(v).double()
    scores = cap * torch.tanh(scale * q @ k.mT / cap)  # (b, h, L, S)
    hidden = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
    return scores.masked_fill(hidden, -math.inf).softmax(-1) @ v


def test_softcap_equals_gemma2_attention_and_float64() -> None:
    layer, t = _gemma2_layer(), 11
    # Inputs scaled by 9: scores of about +-100, well past the cap, so the tanh bites.
    q, k, v = _qkv(t, t, scale=9.0)
    mask = _hf_mask(causal_mask_function, t, t, q.dtype)
    expected, _ = modeling_gemma2.eager_attention_forward(
        layer, q, k, v, mask, scaling=layer.scaling, softcap=layer.attn_logit_softcapping
    )
    expected = expected.transpose(1, 2)  # (b, h, L, Ev): transformers returns (b, L, h, Ev)
    kwargs: dict[str, Any] = {"is_causal": True, "scale": layer.scaling, "softcap": 50.0}
    ours = scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    flash = flash_attention(q, _repeat(k), _repeat(v), block_size=(4, 3), **kwargs)
    torch.testing.assert_close(ours, expected, **TOL)
    torch.testing.assert_close(flash, expected, **TOL)
    reference = _capped_reference(q, k, v, layer.scaling, 50.0).float()
    torch.testing.assert_close(flash, reference, **TOL)
    # The cap changed the result: without it the outputs differ.
    uncapped = flash_attention(q, _repeat(k), _repeat(v), is_causal=True, scale=layer.scaling)
    assert (uncapped - expected).abs().max() > 1e-2


def test_softcap_gradients_equal_gemma2_autograd() -> None:
    layer, t = _gemma2_layer(), 10
    q, k, v = (x.requires_grad_() for x in _qkv(t, t, scale=9.0))
    mask = _hf_mask(causal_mask_function, t, t, q.dtype)
    expected, _ = modeling_gemma2.eager_attention_forward(
        layer, q, k, v, mask, scaling=layer.scaling, softcap=layer.attn_logit_softcapping
    )
    grad = torch.randn_like(expected)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    flash = flash_attention(
        q, _repeat(k), _repeat(v), is_causal=True, scale=layer.scaling, softcap=50.0
    )
    got = torch.autograd.grad(flash.transpose(1, 2), (q, k, v), grad)
    for name, a, b in zip("qkv", got, want, strict=True):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, n=name: f"d{n}: {m}")


def test_softcap_bounds_the_logits() -> None:
    # Every capped score lies in (-c, c), so no weight can exceed e^(2c) times another.
    q, k, _ = _qkv(5, 5, scale=30.0)
    w = attention_weights(q, _repeat(k), softcap=2.0)
    ratio = w.amax(-1) / w.amin(-1)
    assert ratio.max() <= math.exp(4.0) * (1 + 1e-5)


# -- learned sinks: gpt-oss ---------------------------------------------------------------


def _gpt_oss_layers() -> list[Any]:
    config = GptOssConfig(
        **SIZES,
        num_local_experts=2,
        num_experts_per_tok=1,
        intermediate_size=8,
        sliding_window=128,
    )
    assert config.layer_types == ["sliding_attention", "full_attention"]
    layers = [modeling_gpt_oss.GptOssAttention(config, layer_idx=i).eval() for i in (0, 1)]
    for layer in layers:
        with torch.no_grad():
            layer.sinks.normal_(0.0, 2.0)  # torch.empty until the model's init: set them
    return layers


def _gpt_oss_mask(layer: Any, t_q: int, t_k: int, dtype: torch.dtype) -> Tensor:
    """The layer's mask, the queries being the last t_q of t_k positions (after a cache)."""
    window = layer.sliding_window
    fn = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    return _hf_mask(add_offsets_to_mask_function(fn, t_k - t_q, 0), t_q, t_k, dtype)


@pytest.mark.parametrize(
    ("layer_idx", "t_q", "t_k"),
    [(0, 150, 150), (0, 40, 150), (1, 40, 150)],
    ids=["sliding-128-prefill", "sliding-128-chunk", "full-chunk"],
)
def test_sinks_equal_gpt_oss_attention(layer_idx: int, t_q: int, t_k: int) -> None:
    layer = _gpt_oss_layers()[layer_idx]
    assert layer.sliding_window == (128 if layer_idx == 0 else None)
    q, k, v = (x.requires_grad_() for x in _qkv(t_q, t_k, scale=2.0))
    mask = _gpt_oss_mask(layer, t_q, t_k, q.dtype)
    expected, _ = modeling_gpt_oss.eager_attention_forward(
        layer, q, k, v, mask, scaling=layer.scaling
    )
    expected = expected.transpose(1, 2)  # (b, h, L, Ev)
    sinks = layer.sinks.detach().clone().requires_grad_()
    window = layer.sliding_window
    flash = flash_attention(
        q,
        _repeat(k),
        _repeat(v),
        is_causal=True,
        window=window,
        align="bottom-right",
        sink_logits=sinks,
    )
    torch.testing.assert_close(flash, expected, **TOL)
    if window is None:
        band = masks.causal(t_q, t_k, align="bottom-right")  # (L, S)
    else:
        band = masks.sliding_window(t_q, t_k, window=window, align="bottom-right")
    ours = scaled_dot_product_attention(q, k, v, band, enable_gqa=True, sink_logits=layer.sinks)
    torch.testing.assert_close(ours, expected, **TOL)
    # Gradients, the sinks' included, equal transformers' autograd.
    grad = torch.randn_like(expected)
    want = torch.autograd.grad(expected, (q, k, v, layer.sinks), grad)
    got = torch.autograd.grad(flash, (q, k, v, sinks), grad)
    for name, a, b in zip(["dq", "dk", "dv", "dsinks"], got, want, strict=True):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_sinks_take_weight_and_give_no_value() -> None:
    q, k, v = _qkv(3, 5)
    k, v = _repeat(k), _repeat(v)
    sinks = torch.tensor([-1.0, 0.0, 2.0, 30.0])
    w = attention_weights(q, k, sink_logits=sinks)  # (b, h, L, S)
    scores = q @ k.mT / math.sqrt(HEAD_DIM)
    # The missing weight of each row is the sink's share: e^sink / (e^sink + sum e^s).
    share = sinks[:, None].exp() / (sinks[:, None].exp() + scores.exp().sum(-1))
    torch.testing.assert_close(1 - w.sum(-1), share)
    # A sink of 30 takes almost everything: that head's output is almost 0.
    out = flash_attention(q, k, v, sink_logits=sinks, block_size=2)
    assert out[:, 3].abs().max() < 1e-9 < out[:, 0].abs().max()


def test_sinks_with_no_visible_key_give_zeros_and_finite_gradients() -> None:
    # Bottom-right with more queries than keys: the first 4 queries see no key at all.
    q, k, v = (x.requires_grad_() for x in _qkv(9, 5))
    k2, v2, sinks = _repeat(k), _repeat(v), torch.randn(HEADS, requires_grad=True)
    ours = scaled_dot_product_attention(
        q, k2, v2, masks.causal(9, 5, align="bottom-right"), sink_logits=sinks
    )
    flash = flash_attention(
        q, k2, v2, is_causal=True, align="bottom-right", sink_logits=sinks, block_size=3
    )
    assert ours[:, :, :4].abs().max() == 0 == flash[:, :, :4].abs().max()
    torch.testing.assert_close(flash, ours, **TOL)
    grad = torch.randn_like(ours)
    got = torch.autograd.grad(flash, (q, k, v, sinks), grad)
    want = torch.autograd.grad(ours, (q, k, v, sinks), grad)
    for a, b in zip(got, want, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, **TOL)


# -- the hand-written backward, by finite differences ---------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"softcap": 0.8},
        {"softcap": 0.8, "window": 2, "align": "bottom-right"},
        {"is_causal": True, "align": "bottom-right"},  # more queries than keys
    ],
    ids=["softcap", "softcap-window", "bottom-right"],
)
def test_flash_gradcheck_with_softcap_and_sinks(kwargs: dict[str, Any]) -> None:
    q = torch.randn(1, 2, 6, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 4, 2, dtype=torch.float64, requires_grad=True)
    sinks = torch.randn(2, dtype=torch.float64, requires_grad=True)

    def fn(q: Tensor, k: Tensor, v: Tensor, sinks: Tensor) -> Tensor:
        return flash_attention(q, k, v, sink_logits=sinks, block_size=(4, 3), **kwargs)

    assert torch.autograd.gradcheck(fn, (q, k, v, sinks))


# -- bad input ----------------------------------------------------------------------------

BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"softcap": 0.0}, ValueError, r"^softcap must be a positive finite float .*got 0\.0"),
    ({"softcap": -50.0}, ValueError, r"^softcap must be a positive .*got -50\.0"),
    ({"softcap": math.inf}, ValueError, r"^softcap must be a positive finite"),
    ({"softcap": "50"}, TypeError, r"^softcap must be a positive float or None, got '50'"),
    ({"softcap": True}, TypeError, r"^softcap must be .*got True \(bool\)"),
    ({"softcap": torch.tensor(50.0)}, TypeError, r"^softcap must be .*\(Tensor\)"),
    (
        {"sink_logits": torch.zeros(2)},
        ValueError,
        r"^sink_logits must hold one logit per head, shape \(4,\) .* got sink_logits\.shape=\(2,\) "
        r"\(query\.shape=\(2, 4, 3, 8\)\)",
    ),
    (
        {"sink_logits": torch.zeros(1, 4)},
        ValueError,
        r"^sink_logits must .*got sink_logits\.shape=\(1, 4\)",
    ),
    ({"sink_logits": torch.zeros(4, dtype=torch.int64)}, TypeError, r"^sink_logits .*torch\.int64"),
    ({"sink_logits": [0.0] * 4}, TypeError, r"^sink_logits must be a torch\.Tensor, got list"),
    (
        {"sink_logits": torch.zeros(4, device="meta")},
        ValueError,
        r"^sink_logits is on meta but query",
    ),
]


@pytest.mark.parametrize("kernel", ["scratch", "flash"])
@pytest.mark.parametrize(("kwargs", "error", "pattern"), BAD)
def test_bad_softcap_and_sinks_are_refused_by_name(
    kernel: str, kwargs: dict[str, Any], error: type[Exception], pattern: str
) -> None:
    q, k, v = _qkv(3, 5)
    k, v = _repeat(k), _repeat(v)
    fn = scaled_dot_product_attention if kernel == "scratch" else flash_attention
    with pytest.raises(error, match=pattern):
        fn(q, k, v, **kwargs)


@pytest.mark.parametrize("kernel", ["scratch", "flash"])
def test_sinks_need_a_head_dimension(kernel: str) -> None:
    q, k, v = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5, 2)
    fn = scaled_dot_product_attention if kernel == "scratch" else flash_attention
    pattern = re.escape("query has no head dimension: it must be (..., H, L, E)")
    with pytest.raises(ValueError, match=pattern):
        fn(q, k, v, sink_logits=torch.zeros(3))


def test_checks_off_give_the_same_result() -> None:
    q, k, v = _qkv(6, 7)
    k, v = _repeat(k), _repeat(v)
    kwargs: dict[str, Any] = {"softcap": 3.0, "sink_logits": torch.randn(HEADS)}
    checked = flash_attention(q, k, v, window=3, align="bottom-right", **kwargs)
    with attnlab.validation(False):
        unchecked = flash_attention(q, k, v, window=3, align="bottom-right", **kwargs)
        scratch = scaled_dot_product_attention(q, k, v, **kwargs)
    torch.testing.assert_close(unchecked, checked, rtol=0, atol=0)
    torch.testing.assert_close(scratch, scaled_dot_product_attention(q, k, v, **kwargs))
