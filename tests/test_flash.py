"""attnlab.functional.flash: FlashAttention from scratch, equal to PyTorch's attention forward and
backward.

The reference is `torch.nn.functional.scaled_dot_product_attention` (outputs and the
gradients of all three inputs), plus `torch.autograd.gradcheck` in float64 for the custom
backward. Sizes are all different (batch 2, heads 3, E 8, Ev 6, L != S), and the block
sizes do not divide the lengths, so a swapped axis or an off-by-one tile edge cannot pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attnlab
from attnlab.functional.flash import flash_attention, tile_kind, tile_map
from attnlab.rules.masks import Alignment, sliding_window

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
        lambda q, k, v: flash_attention(q, k, v, is_causal=True, block_size=(2, 3)),
        (q, k, v),
        fast_mode=True,
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


@pytest.mark.parametrize("window", [None, 2])
def test_flash_attention_no_keys_gives_zeros_like_torch(window: int | None) -> None:
    q, k, v = _inputs(4, 0, 2, grad=True)
    out = flash_attention(q, k, v, window=window)
    torch.testing.assert_close(out, TorchSDPA(q, k, v))
    assert not out.isnan().any()
    (dq,) = torch.autograd.grad(out.sum(), q)
    torch.testing.assert_close(dq, torch.zeros_like(q))


@pytest.mark.parametrize("window", [None, 2])
def test_flash_attention_no_queries_gives_empty_output(window: int | None) -> None:
    q, k, v = _inputs(0, 5, 2, grad=True)
    out = flash_attention(q, k, v, is_causal=True, window=window)
    assert out.shape == (2, 0, 6)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(not g.any() for g in grads)


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


@pytest.mark.parametrize("window", [None, 3])
def test_flash_attention_without_validation_gives_the_same_result(window: int | None) -> None:
    q, k, v = _inputs(9, 6, 2)
    checked = flash_attention(q, k, v, is_causal=True, window=window, block_size=(4, 5))
    with attnlab.validation(False):
        unchecked = flash_attention(q, k, v, is_causal=True, window=window, block_size=(4, 5))
    torch.testing.assert_close(unchecked, checked, rtol=0, atol=0)


def test_functional_reexports_flash_attention() -> None:
    assert attnlab.functional.flash_attention is flash_attention
    assert "flash_attention" in attnlab.functional.__all__


# Sliding window ------------------------------------------------------------------------

WINDOW_LENGTHS = [(13, 9), (9, 13), (16, 16), (1, 5), (7, 1), (20, 6)]


def _grads(out: torch.Tensor, inputs: tuple[torch.Tensor, ...], grad_out: torch.Tensor) -> Any:
    return torch.autograd.grad(out, inputs, grad_out)


@pytest.mark.parametrize("block_size", BLOCKS)
@pytest.mark.parametrize("window", [1, 3, 5, 40])
@pytest.mark.parametrize(("t_q", "t_k"), WINDOW_LENGTHS)
def test_flash_attention_window_matches_torch_with_the_mask(
    t_q: int, t_k: int, window: int, block_size: int | tuple[int, int]
) -> None:
    # Window 1 (each query sees itself only), windows that divide no block size, a
    # window longer than both lengths, L != S both ways, and with (20, 6) queries that
    # see no key at all (i >= S - 1 + window), which PyTorch answers with zeros.
    q, k, v = _inputs(t_q, t_k, 2, 3, grad=True)
    grad_out = torch.randn(2, 3, t_q, 6)
    out = flash_attention(q, k, v, window=window, block_size=block_size)
    expected = TorchSDPA(q, k, v, attn_mask=sliding_window(t_q, t_k, window=window))
    torch.testing.assert_close(out, expected, **TOL)
    ours, theirs = _grads(out, (q, k, v), grad_out), _grads(expected, (q, k, v), grad_out)
    for name, got, want in zip("qkv", ours, theirs, strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, **TOL, msg=lambda m, n=name: f"d{n}: {m}")


def test_flash_attention_window_gradcheck_float64() -> None:
    q, k, v = (x.double().requires_grad_() for x in _inputs(9, 7, 2))
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, window=3, block_size=(2, 3)),
        (q, k, v),
        fast_mode=True,
    )


def test_flash_attention_window_implies_causal() -> None:
    q, k, v = _inputs(11, 11, 2)
    alone = flash_attention(q, k, v, window=4, block_size=3)
    for is_causal in (False, True):
        with_flag = flash_attention(q, k, v, is_causal=is_causal, window=4, block_size=3)
        torch.testing.assert_close(with_flag, alone, rtol=0, atol=0)


@pytest.mark.parametrize(("t_q", "t_k"), [(12, 12), (12, 7), (7, 12)])
def test_flash_attention_window_as_long_as_the_sequence_is_causal(t_q: int, t_k: int) -> None:
    q, k, v = _inputs(t_q, t_k, 2)
    causal = flash_attention(q, k, v, is_causal=True, block_size=5)
    for window in (max(t_q, t_k), 100):
        windowed = flash_attention(q, k, v, window=window, block_size=5)
        torch.testing.assert_close(windowed, causal, **TOL)


def test_flash_attention_window_output_ignores_keys_outside_it() -> None:
    # Changing keys older than the window of queries 10.. changes none of their outputs.
    q, k, v = _inputs(16, 16, 2)
    out = flash_attention(q, k, v, window=4, block_size=3)
    k2, v2 = k.clone(), v.clone()
    k2[:, :7], v2[:, :7] = torch.randn(2, 7, 8), torch.randn(2, 7, 6)
    out2 = flash_attention(q, k2, v2, window=4, block_size=3)
    torch.testing.assert_close(out2[:, 10:], out[:, 10:], rtol=0, atol=0)


def _tiles_from_mask(mask: torch.Tensor, block_q: int, block_k: int) -> torch.Tensor:
    """0 for a tile of the mask with no allowed pair, 1 if all allowed, 2 if mixed."""
    rows = [mask[i : i + block_q] for i in range(0, mask.shape[0], block_q)]
    grid = [
        [int(t.any()) + int(t.any() and not t.all()) for t in r.split(block_k, dim=1)] for r in rows
    ]
    return torch.tensor(grid, dtype=torch.int64).reshape(len(rows), -1)


@pytest.mark.parametrize("block_size", [4, (3, 5), (5, 3), 64])
@pytest.mark.parametrize(
    ("t_q", "t_k", "is_causal", "window"),
    [
        (16, 16, False, None),
        (13, 9, True, None),
        (9, 13, True, None),
        (16, 16, False, 1),
        (23, 23, True, 6),
        (9, 17, False, 5),
        (20, 6, False, 3),
    ],
)
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_tile_map_matches_the_tiles_of_the_mask(
    t_q: int,
    t_k: int,
    is_causal: bool,
    window: int | None,
    block_size: int | tuple[int, int],
    align: Alignment,
) -> None:
    if window is not None:
        mask = sliding_window(t_q, t_k, window=window, align=align)
    elif is_causal:
        mask = attnlab.rules.masks.causal(t_q, t_k, align=align)
    else:
        mask = torch.ones(t_q, t_k, dtype=torch.bool)
    block_q, block_k = block_size if isinstance(block_size, tuple) else (block_size,) * 2
    rules = {"is_causal": is_causal, "window": window, "align": align}
    got = tile_map(t_q, t_k, block_size=block_size, **rules)
    torch.testing.assert_close(got, _tiles_from_mask(mask, block_q, block_k), rtol=0, atol=0)


class _CountScoreTiles(TorchDispatchMode):
    """Counts the matrix products written into a preallocated tile (`bmm(..., out=)`)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.bmm.out:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("t_q", "t_k", "block_size", "is_causal", "window"),
    [
        (40, 40, 4, False, 8),
        (37, 29, (3, 5), False, 7),
        (29, 37, (5, 3), True, 1),
        (24, 10, 4, False, 3),
        (40, 40, 4, True, None),
        (40, 30, (4, 6), False, None),
    ],
)
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_flash_attention_computes_only_the_tiles_of_tile_map(
    t_q: int,
    t_k: int,
    block_size: int | tuple[int, int],
    is_causal: bool,
    window: int | None,
    align: Alignment,
) -> None:
    # The forward computes one score tile per visited tile, the backward two (P and dP),
    # all with bmm(out=tile): counting those calls counts the tiles actually computed.
    q, k, v = _inputs(t_q, t_k, 2, grad=True)
    rules = {"is_causal": is_causal, "window": window, "align": align}
    expected = int(tile_map(t_q, t_k, block_size=block_size, **rules).count_nonzero())
    with _CountScoreTiles() as forward:
        out = flash_attention(q, k, v, block_size=block_size, **rules)
    with _CountScoreTiles() as backward:
        out.backward(torch.randn_like(out))
    assert forward.count == expected
    assert backward.count == 2 * expected


def test_flash_attention_window_work_grows_linearly_with_length() -> None:
    # Window 8 in tiles of 4: query tile a sees key tiles a-2..a, so 3 per query tile but
    # the first two. Full causal attention computes N(N+1)/2 tiles for N tiles a side.
    counts = []
    for t in (32, 64, 128):
        q, k, v = _inputs(t, t, 1)
        with _CountScoreTiles() as mode:
            flash_attention(q, k, v, window=8, block_size=4)
        counts.append(mode.count)
    assert counts == [3 * (t // 4) - 3 for t in (32, 64, 128)] == [21, 45, 93]
    causal = [int(tile_map(t, block_size=4, is_causal=True).count_nonzero()) for t in (32, 64)]
    assert causal == [36, 136]


# Autocast, double backward, scale types ---------------------------------------------------


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.float16])
def test_flash_attention_under_autocast_matches_torch(
    autocast_dtype: torch.dtype, input_dtype: torch.dtype
) -> None:
    # PyTorch's attention is on autocast's lower-precision list: its inputs are cast to
    # the autocast dtype (float16 to bfloat16 too), and so is its output.
    q, k, v = (x.to(input_dtype).requires_grad_() for x in _inputs(10, 7, 2))
    grad_out = torch.randn(2, 10, 6)
    with torch.autocast("cpu", dtype=autocast_dtype):
        out = flash_attention(q, k, v, is_causal=True, block_size=3)
        expected = TorchSDPA(q, k, v, is_causal=True)
    assert out.dtype == expected.dtype == autocast_dtype
    torch.testing.assert_close(out, expected)
    ours, theirs = _grads(out, (q, k, v), grad_out), _grads(expected, (q, k, v), grad_out)
    for got, want in zip(ours, theirs, strict=True):
        assert got.dtype == want.dtype == input_dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_flash_attention_under_autocast_leaves_float64_alone() -> None:
    q, k, v = (x.double() for x in _inputs(10, 7, 2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = flash_attention(q, k, v, window=3, block_size=3)
        expected = TorchSDPA(q, k, v, attn_mask=sliding_window(10, 7, window=3))
    assert out.dtype == expected.dtype == torch.float64
    torch.testing.assert_close(out, expected)


def test_flash_attention_double_backward_raises_a_clear_error() -> None:
    q, k, v = _inputs(9, 7, 2, grad=True)
    out = flash_attention(q, k, v, is_causal=True, block_size=4)
    # The first derivative with create_graph=True still works and is PyTorch's.
    grads = torch.autograd.grad(out.square().sum(), (q, k, v), create_graph=True)
    expected = TorchSDPA(q, k, v, is_causal=True)
    for got, want in zip(
        grads, torch.autograd.grad(expected.square().sum(), (q, k, v)), strict=True
    ):
        torch.testing.assert_close(got, want, **TOL)
    with pytest.raises(RuntimeError, match="flash_attention does not support double backward"):
        sum(g.square().sum() for g in grads).backward()


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("make_scale", [lambda: torch.tensor(0.3), lambda: np.float64(0.3)])
def test_flash_attention_accepts_tensor_and_numpy_scales(validate: bool, make_scale: Any) -> None:
    q, k, v = _inputs(10, 12, 2, grad=True)
    with attnlab.validation(validate):
        out = flash_attention(q, k, v, is_causal=True, scale=make_scale(), block_size=(4, 5))
    expected = TorchSDPA(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(out, expected, **TOL)
    (dq,) = torch.autograd.grad(out.sum(), q)
    torch.testing.assert_close(dq, torch.autograd.grad(expected.sum(), q)[0], **TOL)


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
        ({"window": 0}, ValueError, "window must be a positive int, got 0"),
        ({"window": 2.0}, TypeError, r"window must be a positive int, got 2.0 \(float\)"),
        ({"align": "lower-right"}, ValueError, "align must be one of 'top-left', 'bottom-r"),
        ({"softcap": 0.0}, ValueError, "softcap must be a positive finite float"),
        (
            {"sink_logits": torch.zeros(3)},
            ValueError,
            r"sink_logits must hold one logit .*shape \(2,\)",
        ),
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


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"t_q": -1}, ValueError, "t_q must be a non-negative int, got -1"),
        ({"t_k": 2.0}, TypeError, "t_k must be a non-negative int"),
        ({"block_size": (4, 0)}, ValueError, r"block_size\[1\] must be a positive int"),
        ({"window": 0}, ValueError, "window must be a positive int, got 0"),
        ({"is_causal": None}, TypeError, "is_causal must be a bool"),
        ({"align": "top_left"}, ValueError, "align must be one of 'top-left', 'bottom-right'"),
    ],
)
def test_tile_map_rejects_bad_input_naming_it(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    args: dict[str, Any] = {"t_q": 8, "t_k": 6}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        tile_map(**args)


# -- the kernel with the queries at the end of the keys (bottom-right, after a cache) -------


@pytest.mark.parametrize("window", [None, 1, 3])
@pytest.mark.parametrize("block", [(3, 5), (5, 3), 128])
@pytest.mark.parametrize(("t_q", "t_k"), LENGTHS)
def test_flash_attention_bottom_right_matches_torch_forward_and_backward(
    t_q: int, t_k: int, block: int | tuple[int, int], window: int | None
) -> None:
    q, k, v = _inputs(t_q, t_k, 2, 3, grad=True)
    mask = (
        attnlab.rules.masks.causal(t_q, t_k, align="bottom-right")
        if window is None
        else sliding_window(t_q, t_k, window=window, align="bottom-right")
    )
    out = flash_attention(
        q, k, v, is_causal=True, window=window, align="bottom-right", block_size=block
    )
    expected = TorchSDPA(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected, **TOL)
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    want = torch.autograd.grad(expected, (q, k, v), grad_out)
    for a, b in zip(got, want, strict=True):
        # A query that sees one key only has a gradient dS = P (dP - D) that is 0 exactly
        # in exact arithmetic: both sides round it, to a few 1e-6.
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # Queries with no key in their past (t_q > t_k) get zeros, as in PyTorch.
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(("t_q", "t_k"), [(3, 11), (9, 13), (16, 16), (1, 5)])
def test_flash_attention_bottom_right_equals_causal_lower_right(t_q: int, t_k: int) -> None:
    # Chunked prefill: t_q new tokens after t_k - t_q cached ones. PyTorch's own name for
    # that mask is causal_lower_right; attnlab's functional path takes it as attn_mask.
    # (The gradients: the test above, against the same mask built by attnlab.rules.masks.)
    from torch.nn.attention.bias import causal_lower_right

    from attnlab.functional.sdpa import scaled_dot_product_attention

    q, k, v = _inputs(t_q, t_k, 2, 3)
    out = flash_attention(q, k, v, is_causal=True, align="bottom-right", block_size=(4, 3))
    expected = TorchSDPA(q, k, v, attn_mask=causal_lower_right(t_q, t_k))
    torch.testing.assert_close(out, expected, **TOL)
    scratch = scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(t_q, t_k))
    torch.testing.assert_close(out, scratch, **TOL)
    if t_q < t_k:  # the two alignments differ: top-left would be wrong after a cache
        top_left = flash_attention(q, k, v, is_causal=True, block_size=(4, 3))
        assert (top_left - expected).abs().max() > 1e-2


def test_flash_attention_align_needs_a_causal_rule() -> None:
    q, k, v = _inputs(3, 7, 2)
    full = flash_attention(q, k, v, align="bottom-right")
    torch.testing.assert_close(full, TorchSDPA(q, k, v), **TOL)


@pytest.mark.parametrize("rules", [{}, {"is_causal": True}, {"window": 3}, {"window": 1}])
def test_tile_kind_is_what_the_dense_mask_shows_in_the_tile(rules: dict[str, Any]) -> None:
    """Every tile of a 12 x 12 frame, queries and keys anywhere in it: "none" when the
    mask hides every pair, "full" when it hides none, else "masked" (ring attention
    classifies its blocks with this)."""
    t = 12
    window = rules.get("window")
    if window is None and not rules.get("is_causal"):
        allowed = torch.ones(t, t, dtype=torch.bool)
    else:
        allowed = sliding_window(t, window=window) if window else torch.ones(t, t).tril() > 0
    kinds = set()
    for i0 in range(t):
        for i1 in range(i0 + 1, t + 1):
            for j0 in range(t):
                for j1 in range(j0 + 1, t + 1):
                    seen = allowed[i0:i1, j0:j1]
                    expected = "full" if seen.all() else "masked" if seen.any() else "none"
                    assert tile_kind(i0, i1, j0, j1, **rules) == expected, (i0, i1, j0, j1)
                    kinds.add(expected)
    assert kinds == ({"full"} if not rules else {"full", "masked", "none"})
    assert tile_kind(3, 3, 0, 5, **rules) == "none"  # no queries
