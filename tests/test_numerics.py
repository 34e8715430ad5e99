"""Edge cases and numerics of every module and function: empty sequences, fully masked rows,
large scores, dtypes and devices, and gradients checked by finite differences.

One registry, `ENTRIES`, lists every public way to run attention, with the inputs it takes;
the tests run each property over all of it, so a new entry point gets every check by being
added there. Tensors on the `meta` device (shapes and dtypes without data) stand in for a
second device.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from attnlab import CrossAttention, MultiHeadAttention, SelfAttention, validation
from attnlab import functional as AF
from attnlab.article import toy
from attnlab.rules import masks

sys.path.insert(0, str(Path(__file__).parent))  # the shared registry, tests/entry_points.py
from entry_points import (
    D_CTX,
    D_IN,
    D_KQ,
    D_OUT,
    D_V,
    ENTRIES,
    HEADS,
    B,
    Entry,
    S,
    T,
    build_mha,
    make_inputs,
    make_module,
    run,
)

sdpa_torch = nn.functional.scaled_dot_product_attention


# -- large scores stay finite -----------------------------------------------------------


@pytest.mark.parametrize(("dtype", "scale"), [(torch.float32, 1e4), (torch.bfloat16, 300.0)])
@pytest.mark.parametrize("name", list(ENTRIES))
def test_large_inputs_give_finite_outputs_and_gradients(
    name: str, dtype: torch.dtype, scale: float
) -> None:
    entry = ENTRIES[name]
    module = make_module(entry, dtype)
    inputs = make_inputs(entry, dtype=dtype, scale=scale, requires_grad=True)
    out = run(entry, inputs, module)
    assert out.dtype == dtype
    assert torch.isfinite(out).all(), f"{name} returned NaN or inf for inputs scaled by {scale}"
    if entry.weights and entry.huge_scores:  # these inputs make scores of 1e8 and more
        rows = out.float().sum(-1)
        # Rows sum to 1, or to 0 where every key is masked (padding, causal); never NaN.
        ok = torch.isclose(rows, torch.ones_like(rows), atol=1e-2) | (rows == 0)
        assert ok.all()
    if not entry.differentiable:
        assert not out.requires_grad  # for reading only (weights_from_lse)
        return
    out.float().square().mean().backward()
    for input_name, tensor in inputs.items():
        assert tensor.grad is not None
        assert torch.isfinite(tensor.grad).all(), f"gradient of {input_name} is not finite"


def test_scaled_softmax_of_huge_scores_equals_float64() -> None:
    # exp(1e4) overflows any float; subtracting each row's maximum first keeps every exponent
    # <= 0, so float32 agrees with float64 on scores far beyond exp's range.
    scores = torch.tensor([[1e4, 1e4 + 2.0, 1e4 - 3.0], [-5e4, -5e4, -5e4 + 1.0]])
    expected = AF.scaled_softmax(scores.double(), d_k=4)
    torch.testing.assert_close(AF.scaled_softmax(scores, d_k=4), expected.float())
    assert torch.isinf(torch.exp(scores / 2)).any()  # the naive formula would overflow


# -- fully masked rows give zeros -------------------------------------------------------


def test_scaled_softmax_fully_masked_rows_are_zero() -> None:
    scores = torch.randn(3, 4, requires_grad=True)
    mask = torch.tensor([[True, False, True, True], [False] * 4, [True] * 4])
    weights = AF.scaled_softmax(scores, d_k=4, mask=mask)
    torch.testing.assert_close(weights[1], torch.zeros(4))
    torch.testing.assert_close(weights.sum(-1), torch.tensor([1.0, 0.0, 1.0]))
    weights.square().sum().backward()
    assert scores.grad is not None
    assert torch.isfinite(scores.grad).all()
    torch.testing.assert_close(scores.grad[1], torch.zeros(4))


def test_scaled_softmax_rows_of_minus_infinity_are_zero_without_a_mask() -> None:
    scores = torch.tensor([[float("-inf")] * 3, [0.0, float("-inf"), 0.0]])
    torch.testing.assert_close(
        AF.scaled_softmax(scores, d_k=1), torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.0, 0.5]])
    )


FULLY_MASKED = {
    "bool mask, one row blocked": lambda: torch.tensor(
        [[True] * S] + [[False] * S] + [[True, False] * (S // 2)] * (T - 2)
    ),
    "additive mask, one row of -inf": lambda: masks.allowed_to_additive(
        torch.tensor([[True] * S] + [[False] * S] + [[False] * (S - 1) + [True]] * (T - 2))
    ),
    "padding, an empty sequence": lambda: masks.key_padding([4, 0], max_len=S),
    "bottom-right causal, more queries than keys": lambda: masks.causal(T, 2, align="bottom-right"),
}


def _keys_for(mask: Tensor) -> int:
    return mask.shape[-1]


@pytest.mark.parametrize("case", list(FULLY_MASKED))
def test_sdpa_fully_masked_rows_are_zero_like_torch(case: str) -> None:
    mask = FULLY_MASKED[case]()
    s = _keys_for(mask)
    q = torch.randn(B, HEADS, T, D_KQ, requires_grad=True)
    k = torch.randn(B, HEADS, s, D_KQ, requires_grad=True)
    v = torch.randn(B, HEADS, s, D_V, requires_grad=True)
    out = AF.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    expected = sdpa_torch(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected)
    blocked = ~(mask if mask.dtype == torch.bool else mask == 0).any(-1)  # (..., L)
    assert blocked.any()
    assert (out.masked_select(blocked.expand(B, HEADS, T)[..., None]) == 0).all()
    weights = AF.attention_weights(q, k, attn_mask=mask)
    assert (weights.sum(-1).masked_select(blocked.expand(B, HEADS, T)) == 0).all()
    out.square().sum().backward()
    for tensor in (q, k, v):
        assert tensor.grad is not None
        assert torch.isfinite(tensor.grad).all()


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_multihead_sequence_with_no_keys_gives_output_bias(backend: str) -> None:
    module = build_mha(backend, cross=True)()
    x, context = torch.randn(B, T, D_IN), torch.randn(B, S, D_CTX, requires_grad=True)
    mask = masks.key_padding([S, 0])  # the second sequence has no real token at all
    out = module(x, context, attn_mask=mask)
    # Its heads are all zeros, so what is left is the output projection's bias.
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[1], module.out_proj.bias.expand(T, D_OUT))
    out.sum().backward()
    assert context.grad is not None
    assert torch.isfinite(context.grad).all()


# -- empty sequences ----------------------------------------------------------------------


def _with(entry: Entry, **sizes: int) -> dict[str, Tensor]:
    """Inputs of `entry` with some lengths changed, e.g. the queries' to 0."""
    inputs = make_inputs(entry)
    out = {}
    for name, t in inputs.items():
        shape = list(t.shape)
        if name in sizes:
            shape[-2] = sizes[name]
        out[name] = torch.randn(shape)
    return out


@pytest.mark.parametrize("name", [n for n, e in ENTRIES.items() if e.query is not None])
def test_no_queries_give_an_empty_output(name: str) -> None:
    entry = ENTRIES[name]
    query_name = entry.query
    assert query_name is not None
    full = run(entry, make_inputs(entry), make_module(entry))
    out = run(entry, _with(entry, **{query_name: 0}), make_module(entry))
    expected = list(full.shape)
    expected[-2] = 0
    if entry.weights and set(entry.shapes) == {"x"}:
        expected[-1] = 0  # self-attention weights: no queries means no keys either
    assert list(out.shape) == expected


def test_scaled_softmax_of_no_scores() -> None:
    assert AF.scaled_softmax(torch.randn(B, 0, S), d_k=D_KQ).shape == (B, 0, S)
    assert AF.scaled_softmax(torch.randn(B, T, 0), d_k=D_KQ).shape == (B, T, 0)
    empty = torch.zeros(B, 0, 0, dtype=torch.bool)
    assert AF.scaled_softmax(torch.randn(B, 0, 0), d_k=D_KQ, mask=empty).shape == (B, 0, 0)


def test_batch_of_no_sequences_gives_an_empty_batch() -> None:
    for backend in ("torch", "scratch"):
        module = build_mha(backend, cross=True)()
        assert module(torch.randn(0, T, D_IN), torch.randn(0, S, D_CTX)).shape == (0, T, D_OUT)
    q, k, v = (
        torch.randn(0, HEADS, T, D_KQ),
        torch.randn(0, HEADS, S, D_KQ),
        torch.randn(0, HEADS, S, D_V),
    )
    assert AF.scaled_dot_product_attention(q, k, v).shape == (0, HEADS, T, D_V)
    assert AF.flash_attention(q, k, v).shape == (0, HEADS, T, D_V)
    assert SelfAttention(D_IN, D_KQ, D_V)(torch.randn(0, T, D_IN)).shape == (0, T, D_V)


@pytest.mark.parametrize("fn", ["scaled_dot_product_attention", "flash_attention"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_functions_with_no_keys_give_zeros_like_torch(fn: str, is_causal: bool) -> None:
    q = torch.randn(B, HEADS, T, D_KQ, requires_grad=True)
    k, v = torch.randn(B, HEADS, 0, D_KQ), torch.randn(B, HEADS, 0, D_V)
    out = getattr(AF, fn)(q, k, v, is_causal=is_causal)
    expected = sdpa_torch(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out, torch.zeros(B, HEADS, T, D_V))
    out.sum().backward()
    assert q.grad is not None
    torch.testing.assert_close(q.grad, torch.zeros_like(q))


def test_functional_steps_with_no_keys() -> None:
    assert AF.attention_scores(torch.randn(T, D_KQ), torch.randn(0, D_KQ)).shape == (T, 0)
    assert AF.attention_weights(torch.randn(T, D_KQ), torch.randn(0, D_KQ)).shape == (T, 0)
    torch.testing.assert_close(
        AF.context_vectors(torch.randn(T, 0), torch.randn(0, D_V)), torch.zeros(T, D_V)
    )


@pytest.mark.parametrize("method", ["forward", "attention_weights"])
def test_cross_attention_with_empty_context_gives_zeros_like_torch(method: str) -> None:
    module = CrossAttention(D_IN, D_KQ, D_V)
    x, context = torch.randn(B, T, D_IN), torch.randn(B, 0, D_IN)
    out = getattr(module, method)(x, context)
    if method == "forward":
        q, k, v = x @ module.W_query, context @ module.W_key, context @ module.W_value
        torch.testing.assert_close(out, sdpa_torch(q, k, v))
        torch.testing.assert_close(out, torch.zeros(B, T, D_V))
    else:
        assert out.shape == (B, T, 0)


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_multihead_with_empty_context_equals_torch_module(backend: str) -> None:
    ours = MultiHeadAttention(D_OUT, D_OUT, HEADS, d_context=D_CTX, backend=backend).eval()  # type: ignore[arg-type]
    with torch.no_grad():
        ours.out_proj.bias.normal_()  # nonzero, so that "zeros, then the bias" is visible
    theirs = ours.to_torch().eval()
    x, context = torch.randn(B, T, D_OUT), torch.randn(B, 0, D_CTX)
    expected = theirs(x, context, context, need_weights=False)[0]
    torch.testing.assert_close(ours(x, context), expected)
    torch.testing.assert_close(ours(x, context), ours.out_proj.bias.expand(B, T, D_OUT))
    assert ours.attention_weights(x, context).shape == (B, HEADS, T, 0)


def test_multihead_unbatched_empty_sequence() -> None:
    module = build_mha("scratch", cross=False)()
    assert module(torch.randn(0, D_IN)).shape == (0, D_OUT)
    assert module.attention_weights(torch.randn(0, D_IN)).shape == (HEADS, 0, 0)


def test_mask_builders_and_toy_data_of_length_zero() -> None:
    assert masks.causal(0).shape == (0, 0)
    assert masks.causal(0, 3, align="bottom-right").shape == (0, 3)
    assert masks.sliding_window(0, 4, window=2).shape == (0, 4)
    assert masks.padding([]).shape == (0, 0)
    assert not masks.key_padding([0, 0]).any()
    assert masks.key_padding([0, 0]).shape == (2, 1, 1, 0)
    ids = toy.encode("")
    assert ids.shape == (0,)
    assert ids.dtype == torch.long
    assert toy.embed_sentence("", d=4).shape == (0, 4)


# -- dtype and device follow the input ----------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(ENTRIES))
def test_output_dtype_follows_the_input(name: str, dtype: torch.dtype) -> None:
    entry = ENTRIES[name]
    out = run(entry, make_inputs(entry, dtype=dtype), make_module(entry, dtype))
    assert out.dtype == dtype
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", list(ENTRIES))
def test_output_device_follows_the_input(name: str) -> None:
    entry = ENTRIES[name]
    out = run(entry, make_inputs(entry, device="meta"), make_module(entry, device="meta"))
    assert out.device.type == "meta"
    reference = run(entry, make_inputs(entry), make_module(entry))
    assert out.shape == reference.shape


@pytest.mark.parametrize("name", list(ENTRIES))
def test_float64_agrees_with_float32(name: str) -> None:
    entry = ENTRIES[name]
    inputs = make_inputs(entry, dtype=torch.float64)
    module = make_module(entry, torch.float64)
    out64 = run(entry, inputs, module)
    inputs32 = {k: v.float() for k, v in inputs.items()}
    module32 = None if module is None else module.float()
    out32 = run(entry, inputs32, module32)
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out32, out64.float(), rtol=1e-4, atol=1e-5)


# -- gradients checked by finite differences ----------------------------------------------


# Only the hand-written backward passes: elsewhere gradcheck would test PyTorch's autograd.
# fast_mode compares one random projection of the Jacobian instead of all of it.
@pytest.mark.parametrize("name", [n for n, e in ENTRIES.items() if e.custom_backward])
def test_gradcheck_float64(name: str) -> None:
    entry = ENTRIES[name]
    inputs = make_inputs(entry, dtype=torch.float64, requires_grad=True)
    input_names = list(inputs)
    assert entry.build is None  # a function: its inputs are all there is to differentiate

    def fn(*args: Tensor) -> Tensor:
        return entry.call(None, dict(zip(input_names, args, strict=True)))

    assert torch.autograd.gradcheck(fn, tuple(inputs.values()), fast_mode=True)


# -- half precision -------------------------------------------------------------------------

# The production paths compute attention in float32 for float16/bfloat16 inputs, as PyTorch
# does on the CPU. The teaching modules (SelfAttention and its relatives) stay literal, with
# scores in the input's dtype: in float16 those overflow once q.k passes 65504.
HALF_SAFE = [
    name
    for name in ENTRIES
    if name.startswith(
        (
            *("MultiHeadAttention[", "MultiHeadAttention.", "scaled_dot", "attention_weights"),
            *("flash", "GroupedQueryAttention", "MultiHeadLatentAttention", "rope.", "DynamicKV"),
            # Not the bare delta rule: its outputs are S^T q, of size |q| |v| (9e4 at this
            # scale), past float16's range whatever precision it computes in.
            *("StaticKV", "ring_attention", "GatedDeltaNet"),
            *("LightningIndexer", "topk_indices", "DeepSeekSparseAttention"),
        )
    )
]


@pytest.mark.parametrize("name", HALF_SAFE)
def test_float16_inputs_scaled_by_300_give_finite_outputs(name: str) -> None:
    entry = ENTRIES[name]
    out = run(
        entry,
        make_inputs(entry, dtype=torch.float16, scale=300.0),
        make_module(entry, torch.float16),
    )
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("scale", [1.0, 300.0])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sdpa_half_precision_equals_torch(dtype: torch.dtype, scale: float) -> None:
    q = (torch.randn(B, HEADS, T, 64) * scale).to(dtype)
    k = (torch.randn(B, HEADS, S, 64) * scale).to(dtype)
    v = torch.randn(B, HEADS, S, D_V).to(dtype)
    mask = torch.tensor([[True, False, True, True], [False, True, True, False], [True] * S])
    out = AF.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, sdpa_torch(q, k, v, attn_mask=mask))
    weights = AF.attention_weights(q, k, attn_mask=mask)
    assert weights.dtype == dtype
    torch.testing.assert_close(
        weights.float(),
        AF.attention_weights(q.float(), k.float(), attn_mask=mask).to(dtype).float(),
    )


# -- torch.autocast --------------------------------------------------------------------

AUTOCAST_DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("check", [True, False], ids=["validated", "unvalidated"])
@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
def test_sdpa_under_autocast_equals_torch(dtype: torch.dtype, check: bool) -> None:
    # Issue 11: under autocast the matmuls ran in `dtype` and the values stayed float32, so
    # validation raised "values has dtype torch.float32 but weights has dtype ..." and, with
    # it off, the output came back float32. PyTorch casts SDPA's inputs (the float mask
    # too) to the autocast dtype and returns that dtype; the gradients reach the float32
    # leaves in float32.
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(B, HEADS, T, D_KQ, generator=gen, requires_grad=True)
    k = torch.randn(B, HEADS, S, D_KQ, generator=gen).to(dtype).requires_grad_()  # mixed
    v = torch.randn(B, HEADS, S, D_V, generator=gen, requires_grad=True)
    bias = torch.randn(T, S, generator=gen)
    with validation(check), torch.autocast("cpu", dtype=dtype):
        out = AF.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        expected = sdpa_torch(q, k, v, attn_mask=bias)
        weights = AF.attention_weights(q, k, attn_mask=bias)
    assert out.dtype == expected.dtype == weights.dtype == dtype
    torch.testing.assert_close(out, expected)
    # The same computation as outside autocast on inputs cast by hand.
    cast = [x.detach().to(dtype) for x in (q, k, v, bias)]
    torch.testing.assert_close(out, AF.scaled_dot_product_attention(*cast), rtol=0, atol=0)
    torch.testing.assert_close(weights, AF.attention_weights(*cast[:2], attn_mask=cast[3]))
    grad_out = torch.randn(out.shape, generator=gen).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    for got, want, leaf in zip(
        grads, torch.autograd.grad(expected, (q, k, v), grad_out), (q, k, v), strict=True
    ):
        assert got.dtype == want.dtype == leaf.dtype
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
def test_sdpa_under_autocast_leaves_float64_alone_like_torch(dtype: torch.dtype) -> None:
    q, k, v = (torch.randn(B, n, D_KQ, dtype=torch.float64) for n in (T, S, S))
    with torch.autocast("cpu", dtype=dtype):
        out = AF.scaled_dot_product_attention(q, k, v)
        expected = sdpa_torch(q, k, v)
    assert out.dtype == expected.dtype == torch.float64
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("inputs", ["float32", "autocast dtype"])
@pytest.mark.parametrize("check", [True, False], ids=["validated", "unvalidated"])
@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
def test_multihead_under_autocast_equals_torch(
    dtype: torch.dtype, check: bool, inputs: str
) -> None:
    # Tokens of the autocast dtype go into float32 projections under autocast, as in
    # PyTorch's module; validation accepts them there (and only there).
    torch.manual_seed(6)
    reference = nn.MultiheadAttention(D_OUT, HEADS, kdim=D_CTX, vdim=D_CTX, batch_first=True)
    reference.eval()
    x, context = torch.randn(B, T, D_OUT), torch.randn(B, S, D_CTX)
    if inputs != "float32":
        x, context = x.to(dtype), context.to(dtype)
    with validation(check), torch.autocast("cpu", dtype=dtype):
        expected, _ = reference(x, context, context, need_weights=False)
        outputs = {
            backend: MultiHeadAttention.from_torch(reference, backend=backend)(x, context)  # type: ignore[arg-type]
            for backend in ("torch", "scratch")
        }
    for out in outputs.values():
        assert out.dtype == expected.dtype == dtype
        # Projections rounded to `dtype` in a different order: a unit or two in the last place.
        torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(outputs["scratch"], outputs["torch"], rtol=1e-2, atol=1e-3)


def test_multihead_refuses_half_tokens_outside_autocast() -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, HEADS)
    with pytest.raises(ValueError, match=r"x has dtype torch\.bfloat16 but MultiHeadAttention"):
        mha(torch.randn(B, T, D_IN, dtype=torch.bfloat16))
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(ValueError, match="bfloat16"):
        mha(torch.randn(B, T, D_IN, dtype=torch.bfloat16))  # not the autocast dtype
