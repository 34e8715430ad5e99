"""MultiHeadAttention: equal to nn.MultiheadAttention after from_torch, both backends, and to
the article's MultiHeadAttentionWrapper after copying its per-head weights.

Tests of the module alone use d_in != d_out != d_context and head_dim != num_heads, so a
projection applied to the wrong tensor, or a transposed head split, cannot pass.
`nn.MultiheadAttention` has a single embed_dim for input and output, so the cases that
compare with it have d_in == d_out (but still a different d_context for cross-attention).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.nn.attention.bias import causal_lower_right

import attnlab
import attnlab.functional as AF
from attnlab import MultiHeadAttention, MultiHeadAttentionWrapper
from attnlab.rules import masks

PROPERTY_SETTINGS = settings(max_examples=20, deadline=None)
B, T, S = 3, 5, 7  # batch, queries, context tokens
E, H, KDIM = 12, 3, 10  # embed_dim, heads (head_dim 4), context features for cross-attention
D_IN, D_OUT, D_CONTEXT, NUM_HEADS = 6, 10, 7, 2  # for the module alone (head_dim 5)


# -- equal to nn.MultiheadAttention after from_torch -----------------------------------


def _torch_mha(kind: str, bias: bool) -> nn.MultiheadAttention:
    kdim = E if kind == "self" else KDIM
    module = nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=kdim, batch_first=True)
    if bias:  # PyTorch initialises the biases to 0; make them matter
        with torch.no_grad():
            module.in_proj_bias.normal_()
            module.out_proj.bias.normal_()
    return module.eval()


def _inputs(kind: str) -> tuple[Tensor, Tensor]:
    x = torch.randn(B, T, E, requires_grad=True)
    if kind == "self":
        return x, x
    return x, torch.randn(B, S, KDIM, requires_grad=True)


# Each mask as (ours: allowed convention or additive, PyTorch's: blocked or additive, kwargs).
MaskPair = tuple[Tensor | None, dict[str, object], bool]


def _masks(name: str, t: int, s: int) -> MaskPair:
    """(our attn_mask, nn.MultiheadAttention keyword arguments, our is_causal)."""
    if name == "none":
        return None, {}, False
    if name == "bool-2d":
        allowed = torch.rand(t, s) > 0.4
        allowed[:, 0] = True
        return allowed, {"attn_mask": masks.allowed_to_blocked(allowed)}, False
    if name == "bool-per-sequence-and-head":
        allowed = torch.rand(B, H, t, s) > 0.4
        allowed[..., 0] = True
        # PyTorch wants (b * num_heads, t, s); ours broadcasts (b, num_heads, t, s).
        blocked = masks.allowed_to_blocked(allowed).reshape(B * H, t, s)
        return allowed, {"attn_mask": blocked}, False
    if name == "additive":
        additive = torch.randn(t, s)
        return additive, {"attn_mask": additive}, False
    if name == "key-padding":
        lengths = [s, s - 2, 1]
        key_padding = masks.allowed_to_blocked(masks.padding(lengths, max_len=s))
        return masks.key_padding(lengths, max_len=s), {"key_padding_mask": key_padding}, False
    if name == "causal":
        blocked = masks.allowed_to_blocked(masks.causal(t, s))
        return None, {"attn_mask": blocked, "is_causal": True}, True
    raise AssertionError(name)


MASKS = ["none", "bool-2d", "bool-per-sequence-and-head", "additive", "key-padding", "causal"]


def _torch_layout_grads(ours: MultiHeadAttention, packed: bool) -> dict[str, Tensor | None]:
    """Our parameter gradients, arranged like nn.MultiheadAttention's parameters."""
    q, k, v = (lin.weight.grad for lin in (ours.W_query, ours.W_key, ours.W_value))
    assert q is not None
    assert k is not None
    assert v is not None
    grads: dict[str, Tensor | None] = {"out_proj.weight": ours.out_proj.weight.grad}
    if packed:
        grads["in_proj_weight"] = torch.cat([q, k, v])
    else:
        grads.update(q_proj_weight=q, k_proj_weight=k, v_proj_weight=v)
    if ours.bias:
        biases = [lin.bias for lin in (ours.W_query, ours.W_key, ours.W_value)]
        grads["in_proj_bias"] = torch.cat(
            [b.grad for b in biases if b is not None and b.grad is not None]
        )
        assert ours.out_proj.bias is not None
        grads["out_proj.bias"] = ours.out_proj.bias.grad
    return grads


@pytest.mark.parametrize("backend", ["torch", "scratch"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_from_torch_equals_torch_forward_and_backward(
    kind: str, bias: bool, mask: str, backend: str
) -> None:
    reference = _torch_mha(kind, bias)
    ours = MultiHeadAttention.from_torch(reference, backend=backend)  # type: ignore[arg-type]
    x, context = _inputs(kind)
    t, s = x.shape[1], context.shape[1]
    attn_mask, torch_kwargs, is_causal = _masks(mask, t, s)

    expected, _ = reference(x, context, context, need_weights=False, **torch_kwargs)  # type: ignore[arg-type]
    got = ours(x, None if kind == "self" else context, attn_mask=attn_mask, is_causal=is_causal)
    torch.testing.assert_close(got, expected)

    grad_out = torch.randn_like(got)
    inputs = (x,) if kind == "self" else (x, context)
    got_input_grads = torch.autograd.grad(got, inputs, grad_out, retain_graph=True)
    expected_input_grads = torch.autograd.grad(expected, inputs, grad_out, retain_graph=True)
    for g, e in zip(got_input_grads, expected_input_grads, strict=True):
        torch.testing.assert_close(g, e)

    got.backward(grad_out)
    expected.backward(grad_out)
    packed = kind == "self"
    for name, grad in _torch_layout_grads(ours, packed).items():
        torch.testing.assert_close(grad, reference.get_parameter(name).grad, msg=name)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_attention_weights_equal_torch_per_head_weights(kind: str, bias: bool, mask: str) -> None:
    reference = _torch_mha(kind, bias)
    ours = MultiHeadAttention.from_torch(reference)
    x, context = _inputs(kind)
    attn_mask, torch_kwargs, is_causal = _masks(mask, x.shape[1], context.shape[1])
    _, expected = reference(x, context, context, average_attn_weights=False, **torch_kwargs)  # type: ignore[arg-type]
    got = ours.attention_weights(x, context, attn_mask=attn_mask, is_causal=is_causal)
    assert got.shape == (B, H, x.shape[1], context.shape[1])
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_from_torch_equals_torch_in_training_with_dropout_same_seed(backend: str) -> None:
    reference = nn.MultiheadAttention(E, H, dropout=0.3, kdim=KDIM, vdim=KDIM, batch_first=True)
    ours = MultiHeadAttention.from_torch(reference, backend=backend)  # type: ignore[arg-type]
    assert ours.training
    assert ours.dropout == 0.3
    x, context = torch.randn(B, T, E), torch.randn(B, S, KDIM)
    torch.manual_seed(5)
    expected, _ = reference(x, context, context, need_weights=False)
    torch.manual_seed(5)
    torch.testing.assert_close(ours(x, context), expected)


def test_from_torch_equals_torch_unbatched_seq_first_module() -> None:
    reference = nn.MultiheadAttention(E, H, kdim=KDIM, vdim=KDIM).eval()  # (t, b, e) layout
    ours = MultiHeadAttention.from_torch(reference)
    x, context = torch.randn(T, E), torch.randn(S, KDIM)  # unbatched: same in both layouts
    expected, _ = reference(x, context, context)
    torch.testing.assert_close(ours(x, context), expected)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_to_torch_from_torch_round_trip_is_exact(kind: str, bias: bool) -> None:
    reference = _torch_mha(kind, bias)
    ours = MultiHeadAttention.from_torch(reference)
    back = ours.to_torch()
    assert back.batch_first
    assert (back.in_proj_weight is None) == (kind == "cross")
    assert back.state_dict().keys() == reference.state_dict().keys()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    again = MultiHeadAttention.from_torch(back)
    for name, tensor in ours.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def test_to_torch_equals_ours_cross_attention() -> None:
    ours = MultiHeadAttention(E, E, H, d_context=KDIM, backend="scratch").eval()
    x, context = torch.randn(B, T, E), torch.randn(B, S, KDIM)
    mask = masks.key_padding([S, 3, 4], max_len=S)
    expected, _ = ours.to_torch()(
        x, context, context, key_padding_mask=masks.allowed_to_blocked(mask[:, 0, 0])
    )
    torch.testing.assert_close(ours(x, context, attn_mask=mask), expected)


def test_from_torch_keeps_dtype_and_copies_storage() -> None:
    reference = nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    ours = MultiHeadAttention.from_torch(reference)
    assert ours.W_query.weight.dtype == torch.float64
    with torch.no_grad():
        ours.W_query.weight.zero_()
    assert bool(reference.in_proj_weight.ne(0).any())


def test_from_torch_rejects_unsupported_modules() -> None:
    with pytest.raises(TypeError, match=r"nn\.MultiheadAttention"):
        MultiHeadAttention.from_torch(nn.Linear(3, 3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))


def test_to_torch_rejects_different_in_and_out_sizes() -> None:
    with pytest.raises(ValueError, match="d_in=6 and d_out=10"):
        MultiHeadAttention(D_IN, D_OUT, NUM_HEADS).to_torch()


# -- the module alone: d_in != d_out != d_context --------------------------------------


def _module(**kwargs: object) -> MultiHeadAttention:
    return MultiHeadAttention(D_IN, D_OUT, NUM_HEADS, d_context=D_CONTEXT, **kwargs).eval()  # type: ignore[arg-type]


BACKEND_CASES: dict[str, Callable[[], dict[str, object]]] = {
    "none": dict,
    "causal": lambda: {"is_causal": True},
    "bool-2d": lambda: {"attn_mask": torch.rand(T, S) > 0.3},
    "float-4d": lambda: {"attn_mask": torch.randn(B, NUM_HEADS, T, S)},
    "key-padding": lambda: {"attn_mask": masks.key_padding([7, 2, 5], max_len=S)},
    "fully-masked-rows": lambda: {"attn_mask": torch.zeros(B, 1, T, S, dtype=torch.bool)},
}


@pytest.mark.parametrize("case", BACKEND_CASES)
def test_backends_agree_cross_attention(case: str) -> None:
    mha = _module()
    x, context = torch.randn(B, T, D_IN), torch.randn(B, S, D_CONTEXT)
    kwargs = BACKEND_CASES[case]()
    fused = mha(x, context, **kwargs)  # type: ignore[arg-type]
    mha.backend = "scratch"
    scratch = mha(x, context, **kwargs)  # type: ignore[arg-type]
    assert scratch.shape == (B, T, D_OUT)
    torch.testing.assert_close(scratch, fused)


def test_backends_agree_self_attention_with_dropout_same_seed() -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, NUM_HEADS, dropout=0.25).train()
    x = torch.randn(B, T, D_IN)
    torch.manual_seed(3)
    fused = mha(x, is_causal=True)
    mha.backend = "scratch"
    torch.manual_seed(3)
    torch.testing.assert_close(mha(x, is_causal=True), fused)


def test_backend_argument_and_attribute() -> None:
    assert _module().backend == "torch"
    assert _module(backend="scratch").backend == "scratch"
    assert _module(backend="flash").backend == "flash"
    with pytest.raises(
        ValueError, match="backend must be one of 'torch', 'scratch', 'flash', 'triton'"
    ):
        _module(backend="cuda")  # type: ignore[arg-type]
    mha = _module()
    with pytest.raises(ValueError, match="backend"):
        mha.backend = "cuda"  # type: ignore[assignment]
    assert "backend='torch'" in repr(mha)


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_forward_equals_weights_times_projected_values(backend: str) -> None:
    mha = _module(backend=backend)
    x, context = torch.randn(B, T, D_IN), torch.randn(B, S, D_CONTEXT)
    weights = mha.attention_weights(x, context)  # (b, h, t, s)
    values = mha.W_value(context).view(B, S, NUM_HEADS, D_OUT // NUM_HEADS).transpose(1, 2)
    heads = weights @ values  # (b, h, t, head_dim)
    expected = mha.out_proj(heads.transpose(1, 2).reshape(B, T, D_OUT))
    torch.testing.assert_close(mha(x, context), expected)


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_unbatched_equals_first_of_batch(backend: str) -> None:
    mha = _module(backend=backend)
    x, context = torch.randn(B, T, D_IN), torch.randn(B, S, D_CONTEXT)
    mask = torch.rand(T, S) > 0.3
    batched = mha(x, context, attn_mask=mask)
    single = mha(x[1], context[1], attn_mask=mask)
    assert single.shape == (T, D_OUT)
    torch.testing.assert_close(single, batched[1])
    assert mha.attention_weights(x[1], context[1]).shape == (NUM_HEADS, T, S)


def test_batch_items_are_independent() -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, NUM_HEADS)
    x = torch.randn(B, T, D_IN)
    batched = mha(x, is_causal=True)
    for i in range(B):
        torch.testing.assert_close(batched[i], mha(x[i], is_causal=True))


@pytest.mark.parametrize("backend", ["torch", "scratch"])
@pytest.mark.parametrize(
    ("b", "t", "s"), [(B, T, 0), (0, T, S), (B, 0, S)], ids=["no-keys", "no-batch", "no-queries"]
)
def test_empty_inputs_give_empty_or_bias_outputs(backend: str, b: int, t: int, s: int) -> None:
    mha = _module(backend=backend)
    x, context = torch.randn(b, t, D_IN), torch.randn(b, s, D_CONTEXT)
    out = mha(x, context)
    assert out.shape == (b, t, D_OUT)
    assert mha.attention_weights(x, context).shape == (b, NUM_HEADS, t, s)
    if s == 0:  # no key: each query's context vector is zero, so out_proj adds its bias alone
        torch.testing.assert_close(out, mha.out_proj.bias.expand(b, t, D_OUT))


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_fully_masked_rows_give_output_bias_and_finite_grads(backend: str) -> None:
    mha = _module(backend=backend)
    x = torch.randn(B, T, D_IN, requires_grad=True)
    context = torch.randn(B, S, D_CONTEXT)
    mask = masks.key_padding([S, 0, 3], max_len=S)  # sequence 1 has no real token
    out = mha(x, context, attn_mask=mask)
    assert mha.out_proj.bias is not None
    torch.testing.assert_close(out[1], mha.out_proj.bias.expand(T, D_OUT))
    out.sum().backward()
    assert x.grad is not None
    assert bool(x.grad.isfinite().all())
    torch.testing.assert_close(x.grad[1], torch.zeros(T, D_IN))


def test_dropout_only_in_training() -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, NUM_HEADS, dropout=0.5)
    no_dropout = MultiHeadAttention(D_IN, D_OUT, NUM_HEADS)
    no_dropout.load_state_dict(mha.state_dict())
    x = torch.randn(B, T, D_IN)
    train_a, train_b = mha(x), mha(x)
    assert not torch.allclose(train_a, train_b)
    mha.eval()
    torch.testing.assert_close(mha(x), no_dropout(x))
    torch.testing.assert_close(mha(x), mha(x))


def test_attention_weights_ignore_dropout() -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, NUM_HEADS, dropout=0.9).train()
    w = mha.attention_weights(torch.randn(B, T, D_IN))
    torch.testing.assert_close(w.sum(-1), torch.ones(B, NUM_HEADS, T))


def test_no_bias_module_has_no_biases() -> None:
    mha = _module(bias=False)
    assert all("bias" not in name for name, _ in mha.named_parameters())
    # Without biases, a linear map of zeros is zero all the way through.
    assert mha(torch.zeros(T, D_IN), torch.zeros(S, D_CONTEXT)).abs().max() == 0


# -- teaching variants equal after copying weights -------------------------------------


def _mha_from_wrapper(wrapper: MultiHeadAttentionWrapper) -> MultiHeadAttention:
    """MultiHeadAttention computing exactly what `wrapper` computes.

    Requires d_out_kq == d_out_v (one head size, as in PyTorch). Head h's matrices become
    rows h * head_dim ... of the fused projections (nn.Linear stores W.T); no biases, and
    an identity output projection, which the wrapper does not have.
    """
    heads = list(wrapper.heads)
    d_in, head_dim = heads[0].d_in, heads[0].d_out_v
    assert heads[0].d_out_kq == head_dim
    d_out = head_dim * len(heads)
    mha = MultiHeadAttention(d_in, d_out, len(heads), bias=False)
    with torch.no_grad():
        mha.W_query.weight.copy_(torch.cat([h.W_query for h in heads], dim=1).T)
        mha.W_key.weight.copy_(torch.cat([h.W_key for h in heads], dim=1).T)
        mha.W_value.weight.copy_(torch.cat([h.W_value for h in heads], dim=1).T)
        mha.out_proj.weight.copy_(torch.eye(d_out))
    return mha


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_wrapper_equals_multihead_after_copying_weights(backend: str) -> None:
    wrapper = MultiHeadAttentionWrapper(d_in=5, d_out_kq=3, d_out_v=3, num_heads=4)
    mha = _mha_from_wrapper(wrapper)
    mha.backend = backend  # type: ignore[assignment]
    x = torch.rand(2, 6, 5)
    torch.testing.assert_close(mha(x), wrapper(x))
    weights = mha.attention_weights(x)  # (b, h, t, t)
    for h, head in enumerate(wrapper.heads):
        torch.testing.assert_close(weights[:, h], head.attention_weights(x))


def test_wrapper_heads_equal_fused_projection_slices_with_different_kq_and_v_sizes() -> None:
    # The article's wrapper has d_out_kq != d_out_v, which one-head-size modules cannot hold;
    # the fused projections with per-head slices still reproduce it exactly.
    d_in, d_kq, d_v, h = 5, 3, 2, 4
    wrapper = MultiHeadAttentionWrapper(d_in=d_in, d_out_kq=d_kq, d_out_v=d_v, num_heads=h)
    W_q = torch.cat([head.W_query for head in wrapper.heads], dim=1)  # (d_in, h * d_kq)
    W_k = torch.cat([head.W_key for head in wrapper.heads], dim=1)  # (d_in, h * d_kq)
    W_v = torch.cat([head.W_value for head in wrapper.heads], dim=1)  # (d_in, h * d_v)
    x = torch.rand(2, 6, d_in)
    b, t = x.shape[:2]
    q = (x @ W_q).view(b, t, h, d_kq).transpose(1, 2)  # (b, h, t, d_kq)
    k = (x @ W_k).view(b, t, h, d_kq).transpose(1, 2)  # (b, h, t, d_kq)
    v = (x @ W_v).view(b, t, h, d_v).transpose(1, 2)  # (b, h, t, d_v)
    fused = AF.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, h * d_v)
    torch.testing.assert_close(fused, wrapper(x))
    for i, head in enumerate(wrapper.heads):
        torch.testing.assert_close(fused[..., i * d_v : (i + 1) * d_v], head(x))


# -- validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"d_out": 9}, ValueError, "d_out must be a multiple of num_heads, got d_out=9"),
        ({"num_heads": 0}, ValueError, "num_heads must be a positive int"),
        ({"d_in": 6.0}, TypeError, "d_in must be a positive int"),
        ({"dropout": 1.2}, ValueError, r"dropout must be in \[0, 1\)"),
        ({"bias": 1}, TypeError, "bias must be a bool"),
        ({"d_context": -2}, ValueError, "d_context must be a positive int"),
    ],
)
def test_constructor_rejects_bad_arguments(
    kwargs: dict[str, object], error: type[Exception], pattern: str
) -> None:
    args: dict[str, object] = {"d_in": D_IN, "d_out": D_OUT, "num_heads": NUM_HEADS, **kwargs}
    with pytest.raises(error, match=pattern):
        MultiHeadAttention(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (
            lambda m: m(torch.randn(B, T, 4), torch.randn(B, S, D_CONTEXT)),
            ValueError,
            r"x has 4 features but MultiHeadAttention expects d_in=6 \(x.shape=\(3, 5, 4\)\)",
        ),
        (
            lambda m: m(torch.randn(B, T, D_IN), torch.randn(B, S, 3)),
            ValueError,
            "context has 3 features.*d_context=7",
        ),
        (lambda m: m(torch.randn(B, T, D_IN)), ValueError, "context is required.*d_context=7"),
        (
            lambda m: m(torch.randn(B, T, D_IN), torch.randn(2, S, D_CONTEXT)),
            ValueError,
            "same batch size",
        ),
        (
            lambda m: m(torch.randn(T, D_IN), torch.randn(B, S, D_CONTEXT)),
            ValueError,
            "both be unbatched",
        ),
        (
            lambda m: m(torch.randn(1, B, T, D_IN), torch.randn(B, S, D_CONTEXT)),
            ValueError,
            "x must have 2 or 3 dimensions",
        ),
        (
            lambda m: m(torch.ones(B, T, D_IN, dtype=torch.long), None),
            TypeError,
            "x must have a floating-point",
        ),
        (
            lambda m: m(torch.randn(B, T, D_IN).double(), torch.randn(B, S, D_CONTEXT).double()),
            ValueError,
            "x has dtype torch.float64",
        ),
        (
            lambda m: m(
                torch.randn(B, T, D_IN),
                torch.randn(B, S, D_CONTEXT),
                attn_mask=torch.ones(T, T, dtype=torch.bool),
            ),
            ValueError,
            r"\(5, 5\) does not broadcast.*\(3, 2, 5, 7\)",
        ),
        (
            lambda m: m(
                torch.randn(B, T, D_IN),
                torch.randn(B, S, D_CONTEXT),
                attn_mask=torch.ones(T, S, dtype=torch.bool),
                is_causal=True,
            ),
            ValueError,
            "not both",
        ),
        (
            lambda m: m(
                torch.randn(B, T, D_IN),
                torch.randn(B, S, D_CONTEXT),
                attn_mask=torch.ones(T, S, dtype=torch.int32),
            ),
            TypeError,
            "attn_mask must be a bool",
        ),
        (
            lambda m: m.attention_weights(torch.randn(B, T, D_IN), torch.randn(B, S, 2)),
            ValueError,
            "context has 2 features",
        ),
    ],
)
@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_forward_rejects_bad_input(
    call: Callable[[MultiHeadAttention], object], error: type[Exception], pattern: str, backend: str
) -> None:
    with pytest.raises(error, match=pattern):
        call(_module(backend=backend))


# -- properties ------------------------------------------------------------------------

small = st.integers(min_value=1, max_value=4)


def _module64(
    d_in: int, head_dim: int, heads: int, d_context: int, backend: str
) -> MultiHeadAttention:
    mha = MultiHeadAttention(d_in, head_dim * heads, heads, d_context=d_context, backend=backend)  # type: ignore[arg-type]
    return mha.double().eval()


@PROPERTY_SETTINGS
@given(
    b=small,
    t=st.integers(2, 7),
    d_in=small,
    head_dim=small,
    heads=small,
    cut=st.integers(1, 6),
    backend=st.sampled_from(["torch", "scratch"]),
    seed=st.integers(0, 999),
)
def test_causal_future_tokens_do_not_change_past(
    b: int, t: int, d_in: int, head_dim: int, heads: int, cut: int, backend: str, seed: int
) -> None:
    torch.manual_seed(seed)
    cut = min(cut, t - 1)
    mha = _module64(d_in, head_dim, heads, d_in, backend)
    x = torch.randn(b, t, d_in, dtype=torch.float64)
    changed = x.clone()
    changed[:, cut:] = torch.randn(b, t - cut, d_in, dtype=torch.float64)
    with torch.no_grad():
        before, after = mha(x, is_causal=True), mha(changed, is_causal=True)
    torch.testing.assert_close(after[:, :cut], before[:, :cut])


@PROPERTY_SETTINGS
@given(
    b=small,
    t=small,
    s=small,
    pad=small,
    d_in=small,
    head_dim=small,
    heads=small,
    d_context=small,
    backend=st.sampled_from(["torch", "scratch"]),
    seed=st.integers(0, 999),
)
def test_padded_context_tokens_change_nothing(
    b: int,
    t: int,
    s: int,
    pad: int,
    d_in: int,
    head_dim: int,
    heads: int,
    d_context: int,
    backend: str,
    seed: int,
) -> None:
    torch.manual_seed(seed)
    mha = _module64(d_in, head_dim, heads, d_context, backend)
    x = torch.randn(b, t, d_in, dtype=torch.float64)
    context = torch.randn(b, s, d_context, dtype=torch.float64)
    junk = 1e3 * torch.randn(b, pad, d_context, dtype=torch.float64)
    padded = torch.cat([context, junk], dim=1)
    with torch.no_grad():
        expected = mha(x, context)
        got = mha(x, padded, attn_mask=masks.key_padding([s] * b, max_len=s + pad))
        # The same padding as PyTorch's key_padding_mask (True = padding), and as a float one.
        blocked = ~masks.padding([s] * b, max_len=s + pad)  # (b, s + pad)
        by_key_padding = mha(x, padded, key_padding_mask=blocked)
        additive = torch.zeros(b, s + pad, dtype=torch.float64).masked_fill(blocked, -math.inf)
        by_additive = mha(x, padded, key_padding_mask=additive)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(by_key_padding, expected)
    torch.testing.assert_close(by_additive, expected)


@PROPERTY_SETTINGS
@given(
    b=small,
    t=small,
    s=st.integers(2, 6),
    d_in=small,
    head_dim=small,
    heads=small,
    d_context=small,
    backend=st.sampled_from(["torch", "scratch"]),
    seed=st.integers(0, 999),
)
def test_permuting_context_tokens_changes_nothing(
    b: int,
    t: int,
    s: int,
    d_in: int,
    head_dim: int,
    heads: int,
    d_context: int,
    backend: str,
    seed: int,
) -> None:
    # Keys and values both come from the context, so permuting its tokens permutes both.
    torch.manual_seed(seed)
    mha = _module64(d_in, head_dim, heads, d_context, backend)
    x = torch.randn(b, t, d_in, dtype=torch.float64)
    context = torch.randn(b, s, d_context, dtype=torch.float64)
    mask = torch.rand(b, 1, t, s) > 0.3
    perm = torch.randperm(s)
    with torch.no_grad():
        expected = mha(x, context, attn_mask=mask)
        got = mha(x, context[:, perm], attn_mask=mask[..., perm])
    torch.testing.assert_close(got, expected)


# -- nn.MultiheadAttention's forward arguments: key_padding_mask, need_weights, value ----

VDIM = 9  # value features, different from KDIM: a separate value tensor
LENGTHS = [S, S - 3, 2]  # key 0 is never padding, so no row is fully masked


def _torch_mha_kv(vdim: int = VDIM, dropout: float = 0.0) -> nn.MultiheadAttention:
    module = nn.MultiheadAttention(E, H, dropout=dropout, kdim=KDIM, vdim=vdim, batch_first=True)
    with torch.no_grad():
        module.in_proj_bias.normal_()
        module.out_proj.bias.normal_()
    return module


def _kv_inputs() -> tuple[Tensor, Tensor, Tensor]:
    return (
        torch.randn(B, T, E, requires_grad=True),
        torch.randn(B, S, KDIM, requires_grad=True),
        torch.randn(B, S, VDIM, requires_grad=True),
    )


def _padding(kind: str) -> Tensor:
    """A key padding mask in PyTorch's convention: True (or -inf) at padding."""
    padded = ~masks.padding(LENGTHS, max_len=S)  # (b, s), True = padding
    if kind == "bool":
        return padded
    additive = torch.randn(B, S)  # a float key padding mask is added to the scores
    return additive.masked_fill(padded, float("-inf"))


# (our attn_mask and is_causal, PyTorch's attn_mask and is_causal) for each combination.
def _combined(name: str) -> tuple[dict[str, object], dict[str, object]]:
    if name == "none":
        return {}, {}
    if name == "bool":
        allowed = torch.rand(T, S) > 0.4
        allowed[:, 0] = True
        return {"attn_mask": allowed}, {"attn_mask": masks.allowed_to_blocked(allowed)}
    if name == "float":
        additive = torch.randn(T, S)
        return {"attn_mask": additive}, {"attn_mask": additive}
    if name == "causal":
        blocked = masks.allowed_to_blocked(masks.causal(T, S))
        return {"is_causal": True}, {"attn_mask": blocked, "is_causal": True}
    raise AssertionError(name)


@pytest.mark.parametrize("backend", ["torch", "scratch"])
@pytest.mark.parametrize("combined", ["none", "bool", "float", "causal"])
@pytest.mark.parametrize("padding", ["bool", "float"])
def test_key_padding_mask_equals_torch_forward_and_backward(
    padding: str, combined: str, backend: str
) -> None:
    reference = _torch_mha_kv().eval()
    ours = MultiHeadAttention.from_torch(reference, backend=backend)  # type: ignore[arg-type]
    x, context, value = _kv_inputs()
    key_padding_mask = _padding(padding)
    our_kwargs, torch_kwargs = _combined(combined)
    # PyTorch deprecates a bool mask beside a float one (we take them mixed): give it both
    # as floats, -inf where its bool mask is True.
    torch_padding = key_padding_mask
    torch_mask = torch_kwargs.get("attn_mask")
    if isinstance(torch_mask, Tensor) and torch_mask.dtype != key_padding_mask.dtype:
        if torch_mask.dtype == torch.bool:
            torch_kwargs["attn_mask"] = torch.zeros(T, S).masked_fill(torch_mask, float("-inf"))
        else:
            torch_padding = torch.zeros(B, S).masked_fill(key_padding_mask, float("-inf"))
    expected, _ = reference(
        x, context, value, key_padding_mask=torch_padding, need_weights=False, **torch_kwargs
    )  # type: ignore[arg-type]
    got = ours(x, context, value, key_padding_mask=key_padding_mask, **our_kwargs)  # type: ignore[arg-type]
    assert isinstance(got, Tensor)
    torch.testing.assert_close(got, expected)
    grad_out = torch.randn_like(got)
    for g, e in zip(
        torch.autograd.grad(got, (x, context, value), grad_out),
        torch.autograd.grad(expected, (x, context, value), grad_out),
        strict=True,
    ):
        torch.testing.assert_close(g, e)
    weights = ours.attention_weights(x, context, key_padding_mask=key_padding_mask, **our_kwargs)  # type: ignore[arg-type]
    _, expected_weights = reference(
        x,
        context,
        value,
        key_padding_mask=torch_padding,
        average_attn_weights=False,
        **torch_kwargs,
    )  # type: ignore[arg-type]
    torch.testing.assert_close(weights, expected_weights)


def test_key_padding_mask_with_causal_bias_equals_explicit_mask() -> None:
    ours = MultiHeadAttention.from_torch(_torch_mha_kv()).eval()
    x, context, value = _kv_inputs()
    padding = _padding("bool")
    got = ours(x, context, value, attn_mask=causal_lower_right(T, S), key_padding_mask=padding)
    allowed = masks.causal(T, S, align="bottom-right") & ~padding[:, None, None, :]
    torch.testing.assert_close(got, ours(x, context, value, attn_mask=allowed))


@pytest.mark.parametrize("average", [True, False], ids=["averaged", "per-head"])
@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_need_weights_equals_torch(backend: str, average: bool) -> None:
    reference = _torch_mha_kv().eval()
    ours = MultiHeadAttention.from_torch(reference, backend=backend)  # type: ignore[arg-type]
    x, context, value = _kv_inputs()
    padding = _padding("bool")
    allowed = torch.rand(T, S) > 0.3
    allowed[:, 0] = True
    expected, expected_weights = reference(
        x,
        context,
        value,
        key_padding_mask=padding,
        attn_mask=masks.allowed_to_blocked(allowed),
        average_attn_weights=average,
    )
    result = ours(
        x,
        context,
        value,
        attn_mask=allowed,
        key_padding_mask=padding,
        need_weights=True,
        average_attn_weights=average,
    )
    assert isinstance(result, tuple)
    got, weights = result
    assert weights.shape == ((B, T, S) if average else (B, H, T, S))
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(weights, expected_weights)
    # Both outputs of the tuple carry gradients, as PyTorch's do.
    grads = torch.autograd.grad((got.sum(), weights.sum()), (x, context))
    expected_grads = torch.autograd.grad((expected.sum(), expected_weights.sum()), (x, context))
    for g, e in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_need_weights_in_training_are_the_dropped_weights_of_the_same_forward(
    backend: str,
) -> None:
    # PyTorch's module returns the weights after dropout; so do we, and the output is made
    # of exactly these weights. With the same seed both draw the same dropout mask.
    reference = _torch_mha_kv(dropout=0.4).train()
    ours = MultiHeadAttention.from_torch(reference, backend=backend)  # type: ignore[arg-type]
    x, context, value = _kv_inputs()
    padding = _padding("bool")
    torch.manual_seed(9)
    expected, expected_weights = reference(
        x, context, value, key_padding_mask=padding, average_attn_weights=False
    )
    torch.manual_seed(9)
    got, weights = ours(  # type: ignore[misc]
        x, context, value, key_padding_mask=padding, need_weights=True, average_attn_weights=False
    )
    assert bool((weights == 0).any())  # dropout did drop weights
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(got, expected)
    v = ours.W_value(value).view(B, S, H, E // H).transpose(1, 2)  # (b, h, s, head_dim)
    heads = (weights @ v).transpose(1, 2).reshape(B, T, E)  # (b, t, e)
    torch.testing.assert_close(got, ours.out_proj(heads))


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_separate_value_equals_torch_forward_and_backward(backend: str) -> None:
    reference = _torch_mha_kv().eval()
    ours = MultiHeadAttention.from_torch(reference, backend=backend)  # type: ignore[arg-type]
    assert (ours.d_context, ours.d_value) == (KDIM, VDIM)
    assert ours.W_value.weight.shape == (E, VDIM)
    x, context, value = _kv_inputs()
    expected, _ = reference(x, context, value, need_weights=False)
    got = ours(x, context, value)
    torch.testing.assert_close(got, expected)
    grad_out = torch.randn_like(expected)
    got.backward(grad_out)  # type: ignore[union-attr]
    expected.backward(grad_out)
    for name, grad in _torch_layout_grads(ours, packed=False).items():
        torch.testing.assert_close(grad, reference.get_parameter(name).grad, msg=name)
    for tensor in (x, context, value):
        assert tensor.grad is not None


def test_separate_value_round_trip_through_torch_is_exact() -> None:
    reference = _torch_mha_kv()
    back = MultiHeadAttention.from_torch(reference).to_torch()
    assert (back.kdim, back.vdim, back.in_proj_weight) == (KDIM, VDIM, None)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    ours = MultiHeadAttention(E, E, H, d_context=E, d_value=VDIM)
    assert ours.to_torch().in_proj_weight is None  # kdim == embed_dim but vdim differs


def test_value_tokens_default_to_the_keys_tokens() -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, NUM_HEADS, d_context=D_CONTEXT).eval()
    x, context = torch.randn(B, T, D_IN), torch.randn(B, S, D_CONTEXT)
    torch.testing.assert_close(mha(x, context), mha(x, context, context))
    self_attn = MultiHeadAttention(D_IN, D_OUT, NUM_HEADS).eval()
    torch.testing.assert_close(self_attn(x), self_attn(x, x, x))


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_unbatched_key_padding_mask_and_weights_equal_torch(backend: str) -> None:
    reference = _torch_mha_kv().eval()
    ours = MultiHeadAttention.from_torch(reference, backend=backend)  # type: ignore[arg-type]
    x, context, value = torch.randn(T, E), torch.randn(S, KDIM), torch.randn(S, VDIM)
    padding = torch.zeros(S, dtype=torch.bool)
    padding[4:] = True
    expected, expected_weights = reference(x, context, value, key_padding_mask=padding)
    got, weights = ours(x, context, value, key_padding_mask=padding, need_weights=True)  # type: ignore[misc]
    assert (got.shape, weights.shape) == ((T, E), (T, S))
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(weights, expected_weights)


def test_forward_returns_a_tensor_unless_weights_are_asked_for() -> None:
    mha = _module()
    x, context = torch.randn(B, T, D_IN), torch.randn(B, S, D_CONTEXT)
    out = mha(x, context)
    assert isinstance(out, Tensor)
    result = mha(x, context, need_weights=True)
    assert isinstance(result, tuple)
    torch.testing.assert_close(result[0], out)
    torch.testing.assert_close(result[1], mha.attention_weights(x, context).mean(dim=1))


def _kv_module(**kwargs: object) -> MultiHeadAttention:
    return MultiHeadAttention(
        D_IN,
        D_OUT,
        NUM_HEADS,
        d_context=D_CONTEXT,
        d_value=VDIM,
        **kwargs,  # type: ignore[arg-type]
    ).eval()


def _call(**kwargs: object) -> Callable[[MultiHeadAttention], object]:
    x, context, value = (
        torch.randn(B, T, D_IN),
        torch.randn(B, S, D_CONTEXT),
        torch.randn(B, S, VDIM),
    )
    args: dict[str, object] = {"x": x, "context": context, "value": value, **kwargs}
    return lambda m: m(**args)


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (
            _call(key_padding_mask=torch.zeros(S, B, dtype=torch.bool)),
            ValueError,
            r"key_padding_mask must have shape \(b, s\) = \(3, 7\), one entry per key token "
            r"of each sequence, got \(7, 3\)",
        ),
        (
            _call(key_padding_mask=torch.zeros(B, 1, 1, S, dtype=torch.bool)),
            ValueError,
            r"key_padding_mask must have shape \(b, s\) = \(3, 7\).*got \(3, 1, 1, 7\)",
        ),
        (
            _call(key_padding_mask=torch.zeros(B, S, dtype=torch.int64)),
            TypeError,
            r"key_padding_mask must be a bool tensor \(True = padding, as in "
            r"nn.MultiheadAttention\) or a float tensor to add to the scores, got torch.int64",
        ),
        (
            _call(key_padding_mask=[[False] * S] * B),
            TypeError,
            "key_padding_mask must be a torch.Tensor or None, got list",
        ),
        (
            _call(key_padding_mask=torch.zeros(B, S, dtype=torch.bool, device="meta")),
            ValueError,
            "key_padding_mask is on meta but x is on cpu",
        ),
        (
            _call(value=torch.randn(B, S, D_CONTEXT)),
            ValueError,
            r"value has 7 features but MultiHeadAttention expects d_value=9",
        ),
        (
            _call(value=torch.randn(B, S - 1, VDIM)),
            ValueError,
            r"value must have as many tokens as context, got value.shape=\(3, 6, 9\) and "
            r"context.shape=\(3, 7, 7\)",
        ),
        (
            _call(value=torch.randn(2, S, VDIM)),
            ValueError,
            r"x and value must both be unbatched or have the same batch size",
        ),
        (
            _call(value=None),
            ValueError,
            "value is required: this module's values have d_value=9 features but its keys "
            "have d_context=7",
        ),
        (_call(need_weights=1), TypeError, r"need_weights must be a bool, got 1 \(int\)"),
        (
            _call(need_weights=True, average_attn_weights="no"),
            TypeError,
            r"average_attn_weights must be a bool, got 'no' \(str\)",
        ),
        (
            lambda m: m.attention_weights(
                torch.randn(T, D_IN),
                torch.randn(S, D_CONTEXT),
                key_padding_mask=torch.zeros(B, S, dtype=torch.bool),
            ),
            ValueError,
            r"key_padding_mask must have shape \(s,\) for unbatched x = \(7,\)",
        ),
    ],
)
def test_new_forward_arguments_reject_bad_input(
    call: Callable[[MultiHeadAttention], object], error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=pattern):
        call(_kv_module())


def test_constructor_rejects_bad_d_value() -> None:
    with pytest.raises(ValueError, match="d_value must be a positive int, got 0"):
        MultiHeadAttention(D_IN, D_OUT, NUM_HEADS, d_value=0)


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_causal_bias_mask_equals_explicit_mask(backend: str) -> None:
    mha = _module(backend=backend)
    x, context = torch.randn(B, T, D_IN), torch.randn(B, S, D_CONTEXT)
    allowed = masks.causal(T, S, align="bottom-right")
    torch.testing.assert_close(
        mha(x, context, attn_mask=causal_lower_right(T, S)), mha(x, context, attn_mask=allowed)
    )
    torch.testing.assert_close(
        mha.attention_weights(x, context, attn_mask=causal_lower_right(T, S)),
        mha.attention_weights(x, context, attn_mask=allowed),
    )


# -- every backend of the registry, and the sliding window ------------------------------


@pytest.mark.parametrize("unbatched", [False, True])
@pytest.mark.parametrize(
    ("cross", "kwargs"),
    [
        (False, {}),
        (False, {"is_causal": True}),
        (False, {"window": 2}),
        (True, {}),
        (True, {"is_causal": True}),  # t != s: top-left, as PyTorch's is_causal
        (True, {"window": 3}),
    ],
)
def test_flash_backend_equals_torch_forward_and_backward(
    cross: bool, kwargs: dict[str, object], unbatched: bool
) -> None:
    torch.manual_seed(0)
    ref = MultiHeadAttention(D_IN, D_OUT, NUM_HEADS, d_context=D_CONTEXT if cross else None)
    flash = MultiHeadAttention(
        D_IN, D_OUT, NUM_HEADS, d_context=D_CONTEXT if cross else None, backend="flash"
    )
    flash.load_state_dict(ref.state_dict())
    x = torch.randn(B, T, D_IN, requires_grad=True)
    context = torch.randn(B, S, D_CONTEXT, requires_grad=True) if cross else None
    if unbatched:
        x = x[0].detach().requires_grad_()
        context = None if context is None else context[0].detach().requires_grad_()
    args = (x,) if context is None else (x, context)
    out, expected = flash(*args, **kwargs), ref(*args, **kwargs)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    leaves = [t for t in (x, context, *flash.parameters()) if t is not None]
    ref_leaves = [t for t in (x, context, *ref.parameters()) if t is not None]
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, grad_out)
    want = torch.autograd.grad(expected, ref_leaves, grad_out)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "scratch", "flash"])
@pytest.mark.parametrize(("t", "s", "window"), [(T, T, 2), (T, S, 3), (S, T, 1), (T, T, 99)])
def test_window_equals_the_sliding_window_mask(backend: str, t: int, s: int, window: int) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(D_IN, D_OUT, NUM_HEADS, d_context=D_CONTEXT).eval()
    x, context = torch.randn(B, t, D_IN), torch.randn(B, s, D_CONTEXT)
    mask = masks.sliding_window(t, s, window=window)
    expected = mha(x, context, attn_mask=mask)  # the "torch" backend with an explicit mask
    mha.backend = backend  # type: ignore[assignment]
    torch.testing.assert_close(mha(x, context, window=window), expected, rtol=1e-5, atol=1e-6)
    weights = mha.attention_weights(x, context, window=window)
    torch.testing.assert_close(weights, mha.attention_weights(x, context, attn_mask=mask))
    # Each query sees at most `window` keys, itself included.
    assert int((weights > 0).sum(-1).max()) <= window
    if window >= max(t, s):  # a window covering everything is the causal mask
        torch.testing.assert_close(mha(x, context, window=window), mha(x, context, is_causal=True))


def test_window_combines_with_the_key_padding_mask() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(D_IN, D_OUT, NUM_HEADS).eval()
    x = torch.randn(B, T, D_IN)
    padding = ~masks.padding([T, 3, 1], max_len=T)  # True = padding
    allowed = masks.sliding_window(T, window=2) & ~padding[:, None, None, :]
    expected = mha(x, attn_mask=allowed)
    for backend in ("torch", "scratch"):
        mha.backend = backend  # type: ignore[assignment]
        got = mha(x, window=2, key_padding_mask=padding)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_need_weights_gives_a_tensor_or_a_pair() -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, NUM_HEADS).eval()
    x = torch.randn(B, T, D_IN)
    out: Tensor = mha(x)
    pair: tuple[Tensor, Tensor] = mha(x, need_weights=True)
    torch.testing.assert_close(pair[0], out)
    torch.testing.assert_close(pair[1], mha.attention_weights(x).mean(dim=1))


@pytest.mark.parametrize("t", [T, S])  # (PyTorch warns about lower-right with t > S)
@pytest.mark.parametrize("variant", ["upper_left", "lower_right"])
def test_flash_takes_pytorch_causal_bias_as_a_positional_mask(variant: str, t: int) -> None:
    from torch.nn.attention import bias

    make = bias.causal_upper_left if variant == "upper_left" else bias.causal_lower_right
    align = "top-left" if variant == "upper_left" else "bottom-right"
    mha = _module(backend="flash").eval()
    x, context = torch.randn(B, t, D_IN), torch.randn(B, S, D_CONTEXT)
    out = mha(x, context, attn_mask=make(t, S))
    mha.backend = "torch"
    expected = mha(x, context, attn_mask=masks.causal(t, S, align=align))  # type: ignore[arg-type]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_float_masks_of_the_autocast_dtype_are_taken_as_attn_mask_takes_them(
    backend: str,
) -> None:
    """Under autocast a bfloat16 additive key_padding_mask is accepted, as a bfloat16
    attn_mask is (one rule: _validation.mask_float_dtypes), and hides what the bool
    key_padding_mask hides."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 8, 2, backend=backend)
    x, context = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    blocked = ~masks.padding([5, 3], max_len=5)  # (b, s), True = padding
    additive = torch.zeros(2, 5).masked_fill(blocked, -math.inf).to(torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        by_bool = mha(x, context, key_padding_mask=blocked)
        by_float = mha(x, context, key_padding_mask=additive)
        by_attn_mask = mha(x, context, attn_mask=additive[:, None, None, :])
    torch.testing.assert_close(by_float, by_bool)
    torch.testing.assert_close(by_attn_mask, by_bool)
    with torch.no_grad():
        plain = mha(x[1:], context[1:, :3])  # the second sequence has 3 real keys
    torch.testing.assert_close(by_bool[1:].float(), plain, atol=0.03, rtol=0.03)


def test_attention_weights_unchecked_are_the_checked_weights() -> None:
    """Without the checks (validation off, or called from inside attnlab) the same weights
    (here with a window and padding), and bad input is not looked at: a float64 x next to
    float32 weights fails inside torch, not with our message."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 8, 2)
    x = torch.randn(2, 6, 8)
    padding = ~masks.padding([6, 4], max_len=6)  # True = padding
    kwargs = {"window": 3, "key_padding_mask": padding}
    checked = mha.attention_weights(x, **kwargs)
    with attnlab.validation(False):
        torch.testing.assert_close(mha.attention_weights(x, **kwargs), checked, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"x has dtype torch\.float64 but MultiHeadAttention"):
        mha.attention_weights(x.double())
    with pytest.raises(RuntimeError), attnlab.validation(False):
        mha.attention_weights(x.double())
