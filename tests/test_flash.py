"""attnlab.flash: FlashAttention from scratch, equal to PyTorch's attention forward and backward.

The reference is `torch.nn.functional.scaled_dot_product_attention` (outputs and the
gradients of all three inputs), plus `torch.autograd.gradcheck` in float64 for the custom
backward. Sizes are all different (batch 2, heads 3, E 8, Ev 6, L != S), and the block
sizes do not divide the lengths, so a swapped axis or an off-by-one tile edge cannot pass.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attnlab
from attnlab.flash import flash_attention

TorchSDPA = torch.nn.functional.scaled_dot_product_attention
TOL = {"rtol": 1e-5, "atol": 1e-6}

LENGTHS = [(13, 9), (9, 13), (16, 16), (1, 5), (7, 1)]
BLOCKS: list[int | tuple[int, int]] = [4, (3, 5), (5, 3), 128]


def _inputs(t_q: int, t_k: int, *batch: int, grad: bool = False) -> tuple[torch.Tensor, ...]:
    shapes = [(*batch, t_q, 8), (*batch, t_k, 8), (*batch, t_k, 6)]
    return tuple(torch.randn(s, requires_grad=grad) for s in shapes)


@pytest.mark.parametrize("block_size", BLOCKS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(("t_q", "t_k"), LENGTHS)
def test_flash_attention_forward_matches_torch(
    t_q: int, t_k: int, is_causal: bool, block_size: int | tuple[int, int]
) -> None:
    q, k, v = _inputs(t_q, t_k, 2, 3)
    out = flash_attention(q, k, v, is_causal=is_causal, block_size=block_size)
    torch.testing.assert_close(out, TorchSDPA(q, k, v, is_causal=is_causal), **TOL)


@pytest.mark.parametrize("block_size", BLOCKS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(("t_q", "t_k"), LENGTHS)
def test_flash_attention_backward_matches_torch(
    t_q: int, t_k: int, is_causal: bool, block_size: int | tuple[int, int]
) -> None:
    q, k, v = _inputs(t_q, t_k, 2, 3, grad=True)
    grad_out = torch.randn(2, 3, t_q, 6)
    out = flash_attention(q, k, v, is_causal=is_causal, block_size=block_size)
    ours = torch.autograd.grad(out, (q, k, v), grad_out)
    expected = torch.autograd.grad(TorchSDPA(q, k, v, is_causal=is_causal), (q, k, v), grad_out)
    for name, got, want in zip("qkv", ours, expected, strict=True):
        torch.testing.assert_close(got, want, **TOL, msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize("batch", [(), (4,), (2, 1, 3)])
def test_flash_attention_batch_dimensions_match_torch(batch: tuple[int, ...]) -> None:
    q, k, v = _inputs(11, 6, *batch, grad=True)
    out = flash_attention(q, k, v, block_size=4)
    assert out.shape == (*batch, 11, 6)
    expected = TorchSDPA(q, k, v)
    torch.testing.assert_close(out, expected, **TOL)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    for got, want in zip(grads, torch.autograd.grad(expected.sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_flash_attention_scale_matches_torch() -> None:
    q, k, v = _inputs(10, 12, 2, grad=True)
    out = flash_attention(q, k, v, is_causal=True, scale=0.3, block_size=(4, 5))
    expected = TorchSDPA(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(out, expected, **TOL)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_flash_attention_gradcheck_float64() -> None:
    q, k, v = (x.double() for x in _inputs(5, 7, 2))
    for x in (q, k, v):
        x.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, is_causal=True, block_size=(2, 3)), (q, k, v)
    )


def test_flash_attention_rescales_when_later_tiles_have_larger_scores() -> None:
    # Each key is larger than the one before, so every new tile raises the running maximum
    # by a lot: the rescaling by exp(m_old - m_new) has to be right, or the result is off.
    q = torch.ones(1, 3, 8)
    k = torch.linspace(0, 40, 20)[:, None].expand(20, 8)[None].contiguous()
    v = torch.randn(1, 20, 6)
    out = flash_attention(q, k, v, block_size=(3, 4))
    torch.testing.assert_close(out, TorchSDPA(q, k, v), **TOL)


def test_flash_attention_large_scores_do_not_overflow() -> None:
    q, k, v = _inputs(9, 14, 2, grad=True)
    with torch.no_grad():
        q.mul_(60.0)  # scores in the hundreds: exp() of them overflows float32
    out = flash_attention(q, k, v, is_causal=True, block_size=4)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, TorchSDPA(q, k, v, is_causal=True), **TOL)
    (dq,) = torch.autograd.grad(out.sum(), q)
    assert torch.isfinite(dq).all()


def test_flash_attention_no_keys_gives_zeros_like_torch() -> None:
    q, k, v = _inputs(4, 0, 2, grad=True)
    out = flash_attention(q, k, v)
    torch.testing.assert_close(out, TorchSDPA(q, k, v))
    assert not out.isnan().any()
    (dq,) = torch.autograd.grad(out.sum(), q)
    torch.testing.assert_close(dq, torch.zeros_like(q))


def test_flash_attention_no_queries_gives_empty_output() -> None:
    q, k, v = _inputs(0, 5, 2)
    assert flash_attention(q, k, v, is_causal=True).shape == (2, 0, 6)


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_attention_no_features_equals_torch(is_causal: bool) -> None:
    # E = 0: all scores are 0 and the default scale must not divide by zero.
    q, k = torch.randn(2, 5, 0, requires_grad=True), torch.randn(2, 4, 0)
    v = torch.randn(2, 4, 6, requires_grad=True)
    out = flash_attention(q, k, v, is_causal=is_causal, block_size=3)
    expected = TorchSDPA(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, expected, **TOL)
    grad_out = torch.randn(2, 5, 6)
    dv, dv_ref = (torch.autograd.grad(o, v, grad_out)[0] for o in (out, expected))
    torch.testing.assert_close(dv, dv_ref, **TOL)


def test_flash_attention_causal_output_ignores_future_keys() -> None:
    q, k, v = _inputs(12, 12, 2)
    out = flash_attention(q, k, v, is_causal=True, block_size=5)
    k2, v2 = k.clone(), v.clone()
    k2[:, 7:], v2[:, 7:] = torch.randn(2, 5, 8), torch.randn(2, 5, 6)
    out2 = flash_attention(q, k2, v2, is_causal=True, block_size=5)
    torch.testing.assert_close(out2[:, :7], out[:, :7], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_attention_low_precision_computes_in_float32(dtype: torch.dtype) -> None:
    q, k, v = _inputs(10, 7, 2)
    out = flash_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True, block_size=3)
    assert out.dtype == dtype
    expected = TorchSDPA(*(x.to(dtype).float() for x in (q, k, v)), is_causal=True)
    torch.testing.assert_close(out, expected.to(dtype))


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operation returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_flash_attention_never_materializes_the_scores() -> None:
    n, t_q, t_k = 2, 48, 40
    q, k, v = _inputs(t_q, t_k, n, grad=True)
    with _LargestTensor() as mode:
        out = flash_attention(q, k, v, is_causal=True, block_size=(8, 16))
        out.backward(torch.randn_like(out))
    # The largest tensors are the inputs' and gradients' (n, L, E); a tile is n * 8 * 16.
    assert mode.largest == n * t_q * 8 < n * t_q * t_k


def test_flash_attention_saves_logsumexp_not_probabilities() -> None:
    q, k, v = _inputs(13, 9, 2, 3, grad=True)
    out = flash_attention(q, k, v, block_size=4)
    node = out.grad_fn
    while node is not None and not hasattr(node, "saved_tensors"):
        node = node.next_functions[0][0]
    assert node is not None
    shapes = sorted(tuple(t.shape) for t in node.saved_tensors)
    # q, k, v, out and one log-sum-exp per query; nothing of shape (L, S).
    assert shapes == sorted([(6, 13, 8), (6, 9, 8), (6, 9, 6), (6, 13, 6), (6, 13)])


def test_flash_attention_without_validation_gives_the_same_result() -> None:
    q, k, v = _inputs(9, 6, 2)
    checked = flash_attention(q, k, v, is_causal=True, block_size=(4, 5))
    with attnlab.validation(False):
        unchecked = flash_attention(q, k, v, is_causal=True, block_size=(4, 5))
    torch.testing.assert_close(unchecked, checked, rtol=0, atol=0)


def test_functional_reexports_flash_attention() -> None:
    assert attnlab.functional.flash_attention is flash_attention
    assert "flash_attention" in attnlab.functional.__all__


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"key": torch.randn(2, 9, 5)}, ValueError, r"key has 5 features but query expects E=8"),
        ({"value": torch.randn(2, 8, 6)}, ValueError, r"same number of positions S.*\(2, 9, 8\)"),
        ({"key": torch.randn(3, 9, 8)}, ValueError, r"same batch.*query.shape=\(2, 13, 8\)"),
        ({"query": torch.ones(2, 13, 8, dtype=torch.long)}, TypeError, "query must have a float"),
        ({"value": torch.randn(2, 9, 6).double()}, ValueError, "value has dtype torch.float64"),
        ({"query": torch.randn(8)}, ValueError, r"query must have at least 2 dimensions"),
        ({"block_size": 0}, ValueError, "block_size must be a positive int, got 0"),
        ({"block_size": (4, 0)}, ValueError, r"block_size\[1\] must be a positive int"),
        ({"block_size": (4, 4, 4)}, ValueError, "block_size must be an int or a pair"),
        ({"block_size": 2.5}, TypeError, "block_size must be a positive int"),
        ({"is_causal": 1}, TypeError, "is_causal must be a bool"),
        ({"scale": float("nan")}, ValueError, "scale must be finite"),
    ],
)
def test_flash_attention_rejects_bad_input_naming_it(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    args: dict[str, Any] = {
        "query": torch.randn(2, 13, 8),
        "key": torch.randn(2, 9, 8),
        "value": torch.randn(2, 9, 6),
    }
    args.update(kwargs)
    with pytest.raises(error, match=match):
        flash_attention(**args)
