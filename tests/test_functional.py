"""attnlab.functional: the teaching steps, and scaled dot-product attention equal to PyTorch's.

The reference for `scaled_dot_product_attention` is PyTorch's own
`torch.nn.functional.scaled_dot_product_attention`, forward and backward. The reference for
`attention_weights` is the same PyTorch function applied to identity values (`V = I_S`
turns the output into the weights). Dimensions are all different in every case, so a
transposed or swapped axis cannot pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.bias import CausalBias, CausalVariant, causal_lower_right

import attnlab.functional as AF
from attnlab import validation
from attnlab.functional import backends as _backends
from attnlab.rules import masks
from attnlab.rules.scores import ScoreRule

TorchSDPA = torch.nn.functional.scaled_dot_product_attention
PROPERTY_SETTINGS = settings(max_examples=25, deadline=None)


# -- the teaching steps ----------------------------------------------------------------


def test_attention_scores_hand_computed() -> None:
    q = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    k = torch.tensor([[3.0, 1.0], [1.0, 1.0], [-2.0, 0.5]])
    expected = torch.tensor([[5.0, 3.0, -1.0], [-1.0, -1.0, -0.5]])
    torch.testing.assert_close(AF.attention_scores(q, k), expected)


def test_attention_scores_batched_matches_einsum() -> None:
    q, k = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 6, 5)
    torch.testing.assert_close(AF.attention_scores(q, k), torch.einsum("bhle,bhse->bhls", q, k))


def test_attention_scores_feature_mismatch_raises() -> None:
    with pytest.raises(ValueError, match=r"queries.shape=\(4, 5\).*keys.shape=\(6, 3\)"):
        AF.attention_scores(torch.randn(4, 5), torch.randn(6, 3))


def test_scaled_softmax_divides_by_sqrt_dk() -> None:
    scores = torch.randn(3, 4, 7)
    expected = torch.softmax(scores / math.sqrt(5), dim=-1)
    torch.testing.assert_close(AF.scaled_softmax(scores, d_k=5), expected)


def test_scaled_softmax_mask_renormalizes_visible_positions() -> None:
    scores = torch.randn(4, 6)
    mask = torch.rand(4, 6) > 0.4
    mask[:, 0] = True  # every row keeps at least one key
    weights = AF.scaled_softmax(scores, d_k=3, mask=mask)
    assert bool((weights[~mask] == 0).all())
    torch.testing.assert_close(weights.sum(-1), torch.ones(4))
    # Same as softmax over the visible scores only, row by row.
    for i in range(4):
        visible = torch.softmax(scores[i, mask[i]] / math.sqrt(3), dim=-1)
        torch.testing.assert_close(weights[i, mask[i]], visible)


def test_scaled_softmax_fully_masked_row_is_zero_with_zero_grad() -> None:
    scores = torch.randn(3, 5, requires_grad=True)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    weights = AF.scaled_softmax(scores, d_k=4, mask=mask)
    torch.testing.assert_close(weights[1], torch.zeros(5))
    weights.backward(torch.randn(3, 5))
    assert scores.grad is not None
    torch.testing.assert_close(scores.grad[1], torch.zeros(5))
    assert bool(scores.grad.isfinite().all())


def test_scaled_softmax_rejects_float_mask() -> None:
    with pytest.raises(TypeError, match="bool tensor"):
        AF.scaled_softmax(torch.randn(2, 3), d_k=2, mask=torch.zeros(2, 3))


def test_scaled_softmax_rejects_unbroadcastable_mask() -> None:
    with pytest.raises(ValueError, match=r"\(4,\).*\(2, 3\)"):
        AF.scaled_softmax(torch.randn(2, 3), d_k=2, mask=torch.ones(4, dtype=torch.bool))


@pytest.mark.parametrize("d_k", [0, -3, 2.0, True])
def test_scaled_softmax_rejects_bad_dk(d_k: object) -> None:
    with pytest.raises((TypeError, ValueError), match="d_k"):
        AF.scaled_softmax(torch.randn(2, 3), d_k=d_k)  # type: ignore[arg-type]


def test_context_vectors_hand_computed() -> None:
    weights = torch.tensor([[0.5, 0.5, 0.0], [0.1, 0.2, 0.7]])
    values = torch.tensor([[2.0, 0.0], [4.0, 1.0], [10.0, -1.0]])
    expected = torch.tensor([[3.0, 0.5], [8.0, -0.5]])
    torch.testing.assert_close(AF.context_vectors(weights, values), expected)


def test_causal_mask_has_one_home() -> None:
    # masks.causal is the one builder (tested in test_masks); functional keeps no twin.
    assert not hasattr(AF, "causal_mask")
    assert "causal_mask" not in AF.__all__


# -- scaled_dot_product_attention equals PyTorch's -------------------------------------


@dataclass(frozen=True)
class Case:
    """Shapes and options of one equivalence case (query, key, value, mask)."""

    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    mask: str | None = None  # kind of mask, built by `_mask`
    mask_shape: tuple[int, ...] | None = None
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False


CASES = {
    "4d": Case((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7)),
    "unbatched-2d": Case((4, 5), (6, 5), (6, 7)),
    "3d": Case((3, 4, 5), (3, 6, 5), (3, 6, 7)),
    "5d": Case((2, 3, 2, 4, 5), (2, 3, 2, 6, 5), (2, 3, 2, 6, 7)),
    "broadcast-batch": Case((2, 3, 4, 5), (1, 3, 6, 5), (3, 6, 7)),
    "one-kv-head-broadcast": Case((2, 3, 4, 5), (2, 1, 6, 5), (2, 1, 6, 7)),
    "custom-scale": Case((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), scale=0.3),
    "bool-mask-full": Case((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), "bool", (2, 3, 4, 6)),
    "bool-mask-2d": Case((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), "bool", (4, 6)),
    "bool-mask-per-head": Case((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), "bool", (3, 1, 6)),
    "bool-key-padding": Case((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), "padding", (2, 1, 1, 6)),
    "bool-fully-masked-rows": Case((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), "empty-rows", (4, 6)),
    "float-mask-full": Case((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), "float", (2, 3, 4, 6)),
    "float-mask-broadcast": Case((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), "float", (1, 4, 6)),
    "additive-inf-mask": Case((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), "additive", (4, 6)),
    "additive-fully-masked-rows": Case(
        (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), "additive-empty-rows", (4, 6)
    ),
    "mask-and-scale": Case((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), "bool", (4, 6), scale=2.0),
    "causal-square": Case((2, 3, 6, 5), (2, 3, 6, 5), (2, 3, 6, 7), is_causal=True),
    "causal-L<S": Case((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), is_causal=True),
    "causal-L>S": Case((2, 3, 7, 5), (2, 3, 4, 5), (2, 3, 4, 6), is_causal=True),
    "causal-unbatched": Case((4, 5), (6, 5), (6, 7), is_causal=True),
    "gqa": Case((2, 6, 4, 5), (2, 2, 7, 5), (2, 2, 7, 3), enable_gqa=True),
    "gqa-causal": Case((2, 6, 4, 5), (2, 3, 7, 5), (2, 3, 7, 3), is_causal=True, enable_gqa=True),
    "gqa-mask": Case(
        (2, 6, 4, 5), (2, 2, 7, 5), (2, 2, 7, 3), "bool", (2, 6, 4, 7), enable_gqa=True
    ),
}
DTYPES = [torch.float32, torch.float64]


def _mask(case: Case, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor | None:
    if case.mask is None or case.mask_shape is None:
        return None
    shape = case.mask_shape
    allowed = torch.rand(shape, generator=gen) > 0.35
    allowed[..., 0] = True  # no fully masked rows unless the case asks for them
    if case.mask == "bool":
        return allowed
    if case.mask == "padding":
        lengths = [6, 3]
        return masks.key_padding(lengths, max_len=shape[-1])
    if case.mask == "empty-rows":
        allowed[1] = False
        allowed[3] = False
        return allowed
    if case.mask == "float":
        return torch.randn(shape, generator=gen, dtype=dtype)
    if case.mask == "additive":
        return masks.allowed_to_additive(allowed, dtype)
    if case.mask == "additive-empty-rows":
        allowed[2] = False
        return masks.allowed_to_additive(allowed, dtype)
    raise AssertionError(case.mask)


def _inputs(
    case: Case, dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(shape, generator=gen, dtype=dtype, requires_grad=True)
        for shape in (case.q, case.k, case.v)
    )
    return q, k, v, _mask(case, dtype, gen)


def _kwargs(case: Case, mask: torch.Tensor | None) -> dict[str, object]:
    return {
        "attn_mask": mask,
        "is_causal": case.is_causal,
        "scale": case.scale,
        "enable_gqa": case.enable_gqa,
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", CASES)
def test_sdpa_equals_torch_forward_and_backward(name: str, dtype: torch.dtype) -> None:
    case = CASES[name]
    q, k, v, mask = _inputs(case, dtype)
    out = AF.scaled_dot_product_attention(q, k, v, **_kwargs(case, mask))  # type: ignore[arg-type]
    expected = TorchSDPA(q, k, v, **_kwargs(case, mask))  # type: ignore[arg-type]
    torch.testing.assert_close(out, expected)

    grad_out = torch.randn(out.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad_out)
    for name_, got, want in zip("qkv", grads, expected_grads, strict=True):
        assert bool(got.isfinite().all()), f"non-finite grad of {name_}"
        torch.testing.assert_close(got, want, msg=lambda m, n=name_: f"grad of {n}: {m}")


@pytest.mark.parametrize("name", CASES)
def test_attention_weights_equals_torch_with_identity_values(name: str) -> None:
    case = CASES[name]
    q, k, _, mask = _inputs(case, torch.float64)
    s = k.shape[-2]
    eye = torch.eye(s, dtype=torch.float64)  # values = I_S: each output row is a weight row
    if case.enable_gqa:
        eye = eye.expand(*k.shape[:-2], s, s)
    weights = AF.attention_weights(q, k, **_kwargs(case, mask))  # type: ignore[arg-type]
    expected = TorchSDPA(q, k, eye, **_kwargs(case, mask))  # type: ignore[arg-type]
    torch.testing.assert_close(weights, expected)


def test_sdpa_fully_masked_row_gives_zeros() -> None:
    q, k, v = torch.randn(2, 4, 5), torch.randn(2, 6, 5), torch.randn(2, 6, 7)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False
    out = AF.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out[:, 2], torch.zeros(2, 7))
    assert bool(out.isfinite().all())


@pytest.mark.parametrize("fn", ["scaled_dot_product_attention", "attention_weights"])
def test_sdpa_with_no_features_averages_values_like_torch(fn: str) -> None:
    # E = 0: every score is 0, so each query weighs all keys equally (PyTorch's result);
    # the default scale 1/sqrt(E) must not divide by zero on the way.
    q, k, v = torch.randn(2, 4, 0), torch.randn(2, 6, 0), torch.randn(2, 6, 3)
    if fn == "attention_weights":
        got = AF.attention_weights(q, k)
        expected = TorchSDPA(q, k, torch.eye(6).expand(2, 6, 6))
    else:
        got, expected = AF.scaled_dot_product_attention(q, k, v), TorchSDPA(q, k, v)
    torch.testing.assert_close(got, expected)


def test_sdpa_is_causal_equals_explicit_top_left_mask() -> None:
    q, k, v = torch.randn(2, 4, 5), torch.randn(2, 7, 5), torch.randn(2, 7, 3)
    torch.testing.assert_close(
        AF.scaled_dot_product_attention(q, k, v, is_causal=True),
        AF.scaled_dot_product_attention(q, k, v, attn_mask=masks.causal(4, 7)),
    )


def test_sdpa_bool_mask_equals_additive_mask() -> None:
    q, k, v = torch.randn(2, 4, 5), torch.randn(2, 6, 5), torch.randn(2, 6, 3)
    allowed = torch.rand(2, 4, 6) > 0.3
    torch.testing.assert_close(
        AF.scaled_dot_product_attention(q, k, v, attn_mask=allowed),
        AF.scaled_dot_product_attention(q, k, v, attn_mask=masks.allowed_to_additive(allowed)),
    )


def test_attention_weights_rows_sum_to_one() -> None:
    w = AF.attention_weights(torch.randn(2, 3, 4, 5), torch.randn(2, 3, 6, 5), is_causal=True)
    assert w.shape == (2, 3, 4, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 4))


def test_sdpa_uses_attention_weights() -> None:
    q, k, v = torch.randn(3, 4, 5), torch.randn(3, 6, 5), torch.randn(3, 6, 2)
    weights = AF.attention_weights(q, k, scale=0.7)
    torch.testing.assert_close(AF.scaled_dot_product_attention(q, k, v, scale=0.7), weights @ v)


# -- PyTorch's CausalBias masks and scale types -----------------------------------------

# (L, S) with fewer, more and as many queries as keys; lower-right with L > S leaves its
# first L - S rows fully masked (PyTorch warns about NaN; the CPU gives zeros, as we do).
BIAS_SIZES = [(4, 6), (6, 4), (5, 5)]


def _causal_bias(variant: CausalVariant, t_q: int, t_k: int) -> CausalBias:
    if variant == CausalVariant.LOWER_RIGHT and t_q > t_k:
        with pytest.warns(UserWarning, match="will produce NaNs"):
            return CausalBias(variant, t_q, t_k)
    return CausalBias(variant, t_q, t_k)


@pytest.mark.parametrize("variant", list(CausalVariant), ids=lambda v: v.name)
@pytest.mark.parametrize(("t_q", "t_k"), BIAS_SIZES)
def test_sdpa_causal_bias_equals_torch_forward_and_backward(
    variant: CausalVariant, t_q: int, t_k: int
) -> None:
    # Issue 11: a CausalBias was added to the scores as if it were a float mask (its storage
    # is uninitialised) and the result was a CausalBias object, wrong by up to 1.5.
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, t_q, 8, generator=gen, requires_grad=True)
    k = torch.randn(2, 3, t_k, 8, generator=gen, requires_grad=True)
    v = torch.randn(2, 3, t_k, 5, generator=gen, requires_grad=True)
    bias = _causal_bias(variant, t_q, t_k)
    out = AF.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    expected = TorchSDPA(q, k, v, attn_mask=bias)
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, expected)
    align = "top-left" if variant == CausalVariant.UPPER_LEFT else "bottom-right"
    torch.testing.assert_close(
        out, AF.scaled_dot_product_attention(q, k, v, attn_mask=masks.causal(t_q, t_k, align=align))
    )
    grad_out = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    for got, want in zip(grads, torch.autograd.grad(expected, (q, k, v), grad_out), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("variant", list(CausalVariant), ids=lambda v: v.name)
def test_attention_weights_causal_bias_equals_torch_with_identity_values(
    variant: CausalVariant,
) -> None:
    q, k = torch.randn(2, 4, 5, dtype=torch.float64), torch.randn(2, 7, 5, dtype=torch.float64)
    bias = _causal_bias(variant, 4, 7)
    weights = AF.attention_weights(q, k, attn_mask=bias)
    expected = TorchSDPA(q, k, torch.eye(7, dtype=torch.float64).expand(2, 7, 7), attn_mask=bias)
    torch.testing.assert_close(weights, expected)


def test_sdpa_causal_bias_without_validation() -> None:
    q, k, v = torch.randn(2, 4, 5), torch.randn(2, 6, 5), torch.randn(2, 6, 3)
    bias = causal_lower_right(4, 6)
    with validation(False):
        out = AF.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(out, TorchSDPA(q, k, v, attn_mask=bias))


@pytest.mark.parametrize(
    "scale",
    [torch.tensor(0.3), torch.tensor(0.3, dtype=torch.float64), torch.tensor(2), np.float32(0.3)],
    ids=["tensor-float32", "tensor-float64", "tensor-int", "numpy-float32"],
)
@pytest.mark.parametrize("check", [True, False], ids=["validated", "unvalidated"])
def test_sdpa_scale_as_tensor_or_numpy_equals_torch(scale: object, check: bool) -> None:
    # Issue 11: PyTorch accepts a 0-d tensor or a NumPy float as scale; we raised TypeError.
    q, k, v = torch.randn(2, 4, 5), torch.randn(2, 6, 5), torch.randn(2, 6, 3)
    with validation(check):
        out = AF.scaled_dot_product_attention(q, k, v, scale=scale)  # type: ignore[arg-type]
        weights = AF.attention_weights(q, k, scale=scale)  # type: ignore[arg-type]
    expected = TorchSDPA(q, k, v, scale=float(scale))  # type: ignore[arg-type]
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out, TorchSDPA(q, k, v, scale=scale))  # type: ignore[arg-type]
    torch.testing.assert_close(weights @ v, expected)


# -- dropout ---------------------------------------------------------------------------


def test_sdpa_dropout_equals_torch_with_same_seed() -> None:
    # Both draw one Bernoulli mask of the weights' shape from the global generator, so the
    # same seed gives the same dropped weights (PyTorch's math backend, which the CPU uses
    # for dropout).
    q, k, v = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 6, 5), torch.randn(2, 3, 6, 7)
    torch.manual_seed(7)
    out = AF.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    torch.manual_seed(7)
    expected = TorchSDPA(q, k, v, dropout_p=0.3)
    torch.testing.assert_close(out, expected)


def test_sdpa_dropout_equals_dropped_weights_times_values() -> None:
    q, k, v = torch.randn(3, 4, 5), torch.randn(3, 6, 5), torch.randn(3, 6, 2)
    torch.manual_seed(11)
    weights = AF.attention_weights(q, k, dropout_p=0.4)
    torch.manual_seed(11)
    out = AF.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    torch.testing.assert_close(out, weights @ v)
    undropped = AF.attention_weights(q, k)
    kept = weights != 0
    torch.testing.assert_close(weights[kept], undropped[kept] / 0.6)


def test_attention_weights_dropout_statistics() -> None:
    q, k = torch.randn(64, 16, 5), torch.randn(64, 24, 5)
    dropped = AF.attention_weights(q, k, dropout_p=0.25)
    clean = AF.attention_weights(q, k)
    zero_fraction = (dropped == 0).float().mean().item()
    assert abs(zero_fraction - 0.25) < 0.02  # 24576 draws: std of the fraction is 0.003
    # Rescaling by 1 / (1 - p) keeps every row's expected sum at 1.
    assert abs(dropped.sum(-1).mean().item() - clean.sum(-1).mean().item()) < 0.02


def test_sdpa_dropout_one_is_rejected() -> None:
    # PyTorch returns zeros for dropout_p=1.0; attnlab refuses it (issue 4): it drops every
    # weight, which is never what a caller meant.
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\), got 1.0"):
        AF.scaled_dot_product_attention(
            torch.randn(4, 5), torch.randn(6, 5), torch.randn(6, 3), dropout_p=1.0
        )


# -- validation ------------------------------------------------------------------------


def _qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.randn(2, 3, 4, 5), torch.randn(2, 3, 6, 5), torch.randn(2, 3, 6, 7)


@pytest.mark.parametrize(
    ("change", "error", "pattern"),
    [
        ({"query": [[1.0]]}, TypeError, "query must be a torch.Tensor"),
        ({"key": torch.ones(2, 3, 6, 5, dtype=torch.long)}, TypeError, "key must have a float"),
        ({"value": torch.randn(7)}, ValueError, r"value must have at least 2.*\(7,\)"),
        ({"key": torch.randn(2, 3, 6, 4)}, ValueError, r"key has 4 features.*E=5"),
        ({"value": torch.randn(2, 3, 5, 7)}, ValueError, r"same number of positions S"),
        ({"key": torch.randn(2, 3, 6, 5).double()}, ValueError, "key has dtype torch.float64"),
        ({"key": torch.randn(2, 2, 6, 5)}, ValueError, r"do not broadcast.*enable_gqa"),
        ({"attn_mask": torch.ones(4, 6, dtype=torch.int64)}, TypeError, "attn_mask must be a bool"),
        (
            {"attn_mask": torch.ones(4, 5, dtype=torch.bool)},
            ValueError,
            r"\(4, 5\).*\(2, 3, 4, 6\)",
        ),
        (
            {"attn_mask": torch.ones(2, 6, dtype=torch.bool)},
            ValueError,
            r"mask\[:, None, None, :\]",
        ),
        (
            {"attn_mask": torch.ones(4, 6, dtype=torch.bool), "is_causal": True},
            ValueError,
            "not both",
        ),
        ({"dropout_p": 1.5}, ValueError, r"dropout_p must be in \[0, 1\)"),
        ({"dropout_p": "0.1"}, TypeError, "dropout_p"),
        ({"is_causal": 1}, TypeError, "is_causal must be a bool"),
        ({"scale": float("nan")}, ValueError, "scale must be finite"),
        (
            {"enable_gqa": True, "key": torch.randn(2, 2, 6, 5)},
            ValueError,
            "2 heads of key must divide the 3",
        ),
    ],
)
def test_sdpa_rejects_bad_input(
    change: dict[str, object], error: type[Exception], pattern: str
) -> None:
    q, k, v = _qkv()
    args: dict[str, object] = {"query": q, "key": k, "value": v, **change}
    with pytest.raises(error, match=pattern):
        AF.scaled_dot_product_attention(**args)  # type: ignore[arg-type]


def test_attention_weights_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=r"key has 4 features but query expects E=5"):
        AF.attention_weights(torch.randn(3, 5), torch.randn(6, 4))


# -- properties ------------------------------------------------------------------------

dims = st.integers(min_value=1, max_value=5)


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64)


@PROPERTY_SETTINGS
@given(
    b=dims, t=st.integers(2, 7), e=dims, ev=dims, cut=st.integers(1, 6), seed=st.integers(0, 999)
)
def test_sdpa_causal_future_tokens_do_not_change_past(
    b: int, t: int, e: int, ev: int, cut: int, seed: int
) -> None:
    cut = min(cut, t - 1)  # positions >= cut get new content
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _randn(gen, b, t, e), _randn(gen, b, t, e), _randn(gen, b, t, ev)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for x in (q2, k2, v2):
        x[:, cut:] = _randn(gen, *x[:, cut:].shape)
    before = AF.scaled_dot_product_attention(q, k, v, is_causal=True)
    after = AF.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
    torch.testing.assert_close(after[:, :cut], before[:, :cut])


@PROPERTY_SETTINGS
@given(b=dims, lq=dims, s=dims, pad=dims, e=dims, ev=dims, seed=st.integers(0, 999))
def test_sdpa_padded_keys_change_nothing(
    b: int, lq: int, s: int, pad: int, e: int, ev: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _randn(gen, b, lq, e), _randn(gen, b, s, e), _randn(gen, b, s, ev)
    k_padded = torch.cat([k, 1e3 * _randn(gen, b, pad, e)], dim=1)  # junk, even huge
    v_padded = torch.cat([v, 1e3 * _randn(gen, b, pad, ev)], dim=1)
    mask = masks.padding([s] * b, max_len=s + pad)[:, None, :]  # (b, 1, s + pad)
    expected = AF.scaled_dot_product_attention(q, k, v)
    got = AF.scaled_dot_product_attention(q, k_padded, v_padded, attn_mask=mask)
    torch.testing.assert_close(got, expected)


@PROPERTY_SETTINGS
@given(b=dims, lq=dims, s=st.integers(2, 7), e=dims, ev=dims, seed=st.integers(0, 999))
def test_sdpa_permuting_keys_and_values_changes_nothing(
    b: int, lq: int, s: int, e: int, ev: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _randn(gen, b, lq, e), _randn(gen, b, s, e), _randn(gen, b, s, ev)
    mask = torch.rand(b, lq, s, generator=gen) > 0.3
    perm = torch.randperm(s, generator=gen)
    expected = AF.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = AF.scaled_dot_product_attention(q, k[:, perm], v[:, perm], attn_mask=mask[..., perm])
    torch.testing.assert_close(got, expected)


# -- the backend registry every module runs through ------------------------------------


@pytest.mark.parametrize("backend", ["torch", "scratch", "flash"])
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize(("t_q", "t_k"), [(3, 7), (7, 3), (5, 5), (1, 6)])
def test_backend_registry_causal_rule_equals_the_explicit_mask(
    backend: str, align: str, window: int | None, t_q: int, t_k: int
) -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, t_q, 8, generator=gen)
    k, v = torch.randn(2, 2, t_k, 8, generator=gen), torch.randn(2, 2, t_k, 5, generator=gen)
    mask = (
        masks.causal(t_q, t_k, align=align)  # type: ignore[arg-type]
        if window is None
        else masks.sliding_window(t_q, t_k, window=window, align=align)  # type: ignore[arg-type]
    )
    expected = TorchSDPA(q, k, v, attn_mask=mask, enable_gqa=True)
    rule = ScoreRule(is_causal=True, window=window, align=align)  # type: ignore[arg-type]
    out = _backends.attend(backend, q, k, v, rule, enable_gqa=True)  # type: ignore[arg-type]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    weights = _backends.attention_weights(q, k, rule, enable_gqa=True)
    torch.testing.assert_close(weights, AF.attention_weights(q, k, mask, enable_gqa=True))


def test_backend_registry_combines_a_mask_with_the_causal_rule() -> None:
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 5)
    padding = masks.key_padding([6, 4], max_len=6)  # (b, 1, 1, s)
    allowed = masks.causal(4, 6, align="bottom-right") & padding
    expected = TorchSDPA(q, k, v, attn_mask=allowed)
    for backend in ("torch", "scratch"):
        rule = ScoreRule(is_causal=True, align="bottom-right")
        out = _backends.attend(backend, q, k, v, rule, attn_mask=padding)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="backend='flash' takes no attn_mask"):
        _backends.attend("flash", q, k, v, ScoreRule(is_causal=True), attn_mask=padding)
    with pytest.raises(
        ValueError, match="backend must be one of 'torch', 'scratch', 'flash', 'triton'"
    ):
        _backends.check_backend("cuda")


@pytest.mark.parametrize(("t_q", "t_k", "window"), [(7, 7, 3), (4, 9, 2), (9, 4, 1)])
def test_sdpa_window_equals_the_sliding_window_mask_and_flash(
    t_q: int, t_k: int, window: int
) -> None:
    """`window` (implies causal) is the top-left sliding-window mask, as flash takes it."""
    from attnlab.functional.flash import flash_attention
    from attnlab.rules import masks

    gen = torch.Generator().manual_seed(11)
    q, k = torch.randn(2, 3, t_q, 5, generator=gen), torch.randn(2, 3, t_k, 5, generator=gen)
    v = torch.randn(2, 3, t_k, 6, generator=gen)
    got = AF.scaled_dot_product_attention(q, k, v, window=window)
    mask = masks.sliding_window(t_q, t_k, window=window)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, flash_attention(q, k, v, window=window, block_size=2))
    assert torch.equal(got, AF.scaled_dot_product_attention(q, k, v, is_causal=True, window=window))


def test_sdpa_window_is_checked() -> None:
    q = torch.randn(4, 5)
    with pytest.raises(ValueError, match="window must be a positive int, got 0"):
        AF.scaled_dot_product_attention(q, q, q, window=0)
    with pytest.raises(ValueError, match="pass either attn_mask or window, not both"):
        AF.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 4).bool(), window=2)


# -- softcap and sinks (the transformers references are in test_softcap_sinks.py) ------------


def test_sdpa_softcap_and_sinks_compose_with_window_dropout_and_float_masks() -> None:
    q, k, v = torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 5)
    extra = {"softcap": 1.5, "sink_logits": torch.tensor([0.5, -1.0, 2.0])}
    band = masks.sliding_window(6, window=3)
    windowed = AF.scaled_dot_product_attention(q, k, v, window=3, **extra)
    torch.testing.assert_close(windowed, AF.scaled_dot_product_attention(q, k, v, band, **extra))
    additive = masks.allowed_to_additive(band)
    torch.testing.assert_close(
        windowed, AF.scaled_dot_product_attention(q, k, v, additive, **extra)
    )
    # Dropout acts on the weights after the sink took its share: seeded the same,
    # attention_weights draws the same dropout mask, and its weights times v are the output.
    torch.manual_seed(7)
    dropped = AF.scaled_dot_product_attention(q, k, v, band, dropout_p=0.5, **extra)
    torch.manual_seed(7)
    weights = AF.attention_weights(q, k, band, dropout_p=0.5, **extra)
    torch.testing.assert_close(dropped, weights @ v)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sdpa_softcap_and_sinks_in_half_precision_compute_in_float32(dtype: torch.dtype) -> None:
    q, k, v = (torch.randn(2, 3, 5, 8).mul(20).to(dtype) for _ in range(3))
    sinks = torch.tensor([1.0, 0.0, -3.0], dtype=dtype)
    out = AF.scaled_dot_product_attention(q, k, v, is_causal=True, softcap=30.0, sink_logits=sinks)
    wide = AF.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True, softcap=30.0, sink_logits=sinks.float()
    )
    assert out.dtype == dtype
    torch.testing.assert_close(out, wide.to(dtype), rtol=0, atol=0)


def test_temperature_tuning_scales_each_query_by_its_position_on_every_backend() -> None:
    """Llama 4's rule, once in `attend`: query i at position p (the last L of S keys)
    times 1 + a * log(1 + floor((p + 1) / f)), whatever the backend."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    tuned = ScoreRule(is_causal=True, align="bottom-right", temperature=(4.0, 0.5))
    positions = torch.tensor([6.0, 7.0, 8.0])  # the last 3 of 9
    factor = 1 + 0.5 * torch.log1p(torch.floor((positions + 1) / 4))  # 1.55, 1.69, 1.69
    plain = ScoreRule(is_causal=True, align="bottom-right")
    expected = _backends.attend("scratch", q * factor[:, None], k, v, plain)
    assert not torch.allclose(expected, _backends.attend("scratch", q, k, v, plain))
    for backend in _backends.BACKEND_NAMES:
        got = _backends.attend(backend, q, k, v, tuned)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0, msg=backend)
    weights = _backends.attention_weights(q, k, tuned)
    torch.testing.assert_close(weights, _backends.attention_weights(q * factor[:, None], k, plain))


def test_a_layer_refuses_temperature_it_cannot_place() -> None:
    from attnlab.layers.gqa import GroupedQueryAttention

    with pytest.raises(ValueError, match=r"scores\.temperature needs a layer without a window"):
        GroupedQueryAttention(16, 2, scores=ScoreRule(window=4, temperature=(4.0, 0.1)))
    with pytest.raises(ValueError, match=r"scores.temperature \(attn_scale\) must be"):
        GroupedQueryAttention(16, 2, scores=ScoreRule(temperature=(4.0, -1.0)))
