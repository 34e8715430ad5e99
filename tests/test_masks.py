"""attnlab.rules.masks: builders against brute-force definitions and PyTorch, conversions both
ways."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

import attnlab.functional as AF
from attnlab import MultiHeadAttention
from attnlab.rules import masks
from attnlab.rules.scores import ScoreRule

TorchSDPA = torch.nn.functional.scaled_dot_product_attention
LENGTH_PAIRS = [(5, 5), (3, 7), (7, 3), (1, 4), (0, 3)]


def _brute_force(
    t_q: int, t_k: int, align: str, window: int | None = None, sinks: int = 0
) -> torch.Tensor:
    """Mask from the definition: key j is visible to query i if it is not in i's future
    (and, with a window, within it or one of the first `sinks` keys)."""
    offset = 0 if align == "top-left" else t_k - t_q  # position of query i is i + offset
    out = torch.zeros(t_q, t_k, dtype=torch.bool)
    for i in range(t_q):
        for j in range(t_k):
            pos = i + offset
            out[i, j] = j <= pos and (window is None or pos - j < window or j < sinks)
    return out


@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
@pytest.mark.parametrize(("t_q", "t_k"), LENGTH_PAIRS)
def test_causal_matches_definition(t_q: int, t_k: int, align: masks.Alignment) -> None:
    assert torch.equal(masks.causal(t_q, t_k, align=align), _brute_force(t_q, t_k, align))


@pytest.mark.parametrize(("bad", "error"), [(-1, ValueError), (2.5, TypeError), (True, TypeError)])
def test_causal_rejects_bad_length(bad: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="t_q"):
        masks.causal(bad)  # type: ignore[arg-type]


def test_causal_top_left_is_is_causal_of_functional_sdpa() -> None:
    # Top-left is what is_causal=True means in attnlab's (and PyTorch's) SDPA.
    q, k = torch.randn(3, 4), torch.randn(6, 4)
    v = torch.randn(6, 5)
    torch.testing.assert_close(
        AF.scaled_dot_product_attention(q, k, v, is_causal=True),
        AF.scaled_dot_product_attention(q, k, v, attn_mask=masks.causal(3, 6)),
    )


@pytest.mark.parametrize(("t_q", "t_k"), [(5, 5), (3, 7), (7, 3)])
def test_causal_top_left_equals_torch_causal_upper_left(t_q: int, t_k: int) -> None:
    q, k, v = torch.randn(2, t_q, 4), torch.randn(2, t_k, 4), torch.randn(2, t_k, 6)
    torch.testing.assert_close(
        AF.scaled_dot_product_attention(q, k, v, attn_mask=masks.causal(t_q, t_k)),
        TorchSDPA(q, k, v, attn_mask=causal_upper_left(t_q, t_k)),
    )


@pytest.mark.parametrize(("t_q", "t_k"), [(5, 5), (3, 7), (1, 6)])
def test_causal_bottom_right_equals_torch_causal_lower_right(t_q: int, t_k: int) -> None:
    q, k, v = torch.randn(2, t_q, 4), torch.randn(2, t_k, 4), torch.randn(2, t_k, 6)
    mask = masks.causal(t_q, t_k, align="bottom-right")
    torch.testing.assert_close(
        AF.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        TorchSDPA(q, k, v, attn_mask=causal_lower_right(t_q, t_k)),
    )


def test_causal_bottom_right_with_more_queries_has_empty_rows() -> None:
    mask = masks.causal(6, 4, align="bottom-right")
    assert mask[:2].any(dim=-1).tolist() == [False, False]
    assert bool(mask[2:].any(dim=-1).all())
    # PyTorch warns that its lower-right bias gives NaN here; both actually give zeros.
    q, k, v = torch.randn(6, 3), torch.randn(4, 3), torch.randn(4, 5)
    with pytest.warns(UserWarning, match="NaN"):
        bias = causal_lower_right(6, 4)
    expected = TorchSDPA(q, k, v, attn_mask=bias)
    got = AF.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got[:2], torch.zeros(2, 5))


def test_causal_alignments_agree_on_square() -> None:
    assert torch.equal(masks.causal(4, align="bottom-right"), masks.causal(4))


@pytest.mark.parametrize("window", [None, 1, 3, 9])
@pytest.mark.parametrize("offset", [-3, 0, 2])
def test_band_at_is_visible_over_every_pair(offset: int, window: int | None) -> None:
    # The dense mask (two triangles) and the predicate state the same relation.
    rows = torch.arange(5)[:, None] + offset  # the queries' positions among the keys
    want = masks.visible(rows, torch.arange(7), window)  # (5, 7)
    assert torch.equal(masks.band_at(5, 7, offset, window, "cpu"), want)
    i, j = 4 + offset, 2
    assert masks.visible(i, j, window) == bool(want[4, 2])  # on ints too


@pytest.mark.parametrize("window", [1, 2, 3, 9])
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
@pytest.mark.parametrize(("t_q", "t_k"), LENGTH_PAIRS)
def test_sliding_window_matches_definition(
    t_q: int, t_k: int, align: masks.Alignment, window: int
) -> None:
    got = masks.sliding_window(t_q, t_k, window=window, align=align)
    assert torch.equal(got, _brute_force(t_q, t_k, align, window))


def test_sliding_window_wide_is_causal() -> None:
    assert torch.equal(masks.sliding_window(4, 6, window=6), masks.causal(4, 6))


def test_sliding_window_rows_see_at_most_window_keys() -> None:
    counts = masks.sliding_window(9, window=3).sum(dim=-1)
    assert counts.tolist() == [1, 2, 3, 3, 3, 3, 3, 3, 3]


@pytest.mark.parametrize("sinks", [0, 1, 2, 4])
@pytest.mark.parametrize("window", [1, 2, 3, 9])
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
@pytest.mark.parametrize(("t_q", "t_k"), LENGTH_PAIRS)
def test_sink_window_matches_definition(
    t_q: int, t_k: int, align: masks.Alignment, window: int, sinks: int
) -> None:
    got = masks.sink_window(t_q, t_k, window=window, num_sink_tokens=sinks, align=align)
    assert torch.equal(got, _brute_force(t_q, t_k, align, window, sinks))


def test_sink_window_by_hand() -> None:
    # Window 2 and 2 sinks over 6 tokens: the first two keys stay, the middle ones go.
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 0, 1, 1, 0],
            [1, 1, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(masks.sink_window(6, window=2, num_sink_tokens=2), expected)
    assert torch.equal(
        masks.sink_window(6, window=2, num_sink_tokens=0), masks.sliding_window(6, window=2)
    )
    # Every row sees at most window + sinks keys: the size of StreamingLLM's cache.
    counts = masks.sink_window(40, window=5, num_sink_tokens=4).sum(dim=-1)
    assert int(counts.max()) == 9
    assert counts[8:].eq(9).all()


@pytest.mark.parametrize("lengths", [[4, 1, 3], torch.tensor([4, 1, 3])])
def test_padding_marks_real_tokens(lengths: list[int] | torch.Tensor) -> None:
    expected = torch.tensor(
        [
            [True, True, True, True, False],
            [True, False, False, False, False],
            [True, True, True, False, False],
        ]
    )
    assert torch.equal(masks.padding(lengths, max_len=5), expected)
    assert masks.padding(lengths).shape == (3, 4)


def test_key_padding_broadcasts_over_heads_and_queries() -> None:
    mask = masks.key_padding([2, 3], max_len=4)
    assert mask.shape == (2, 1, 1, 4)
    assert torch.equal(mask[:, 0, 0], masks.padding([2, 3], max_len=4))
    combined = mask & masks.causal(4)
    assert combined.shape == (2, 1, 4, 4)
    assert torch.equal(combined[0, 0], masks.causal(4) & torch.tensor([True, True, False, False]))
    assert torch.equal(combined[1, 0], masks.causal(4) & torch.tensor([True, True, True, False]))


def test_key_padding_equals_torch_mha_key_padding_mask() -> None:
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    lengths = [5, 3]
    pad = masks.padding(lengths)
    expected, _ = mha(x, x, x, key_padding_mask=masks.allowed_to_blocked(pad), need_weights=False)
    ours = MultiHeadAttention.from_torch(mha, backend="scratch")
    torch.testing.assert_close(ours(x, attn_mask=masks.key_padding(lengths)), expected)


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda: masks.causal(-1), ValueError, "t_q must be a non-negative int"),
        (lambda: masks.causal(3, 2.0), TypeError, "t_k must be a non-negative int"),
        (lambda: masks.causal(3, align="bottom"), ValueError, "align must be one of"),
        (lambda: masks.sliding_window(3, window=0), ValueError, "window must be a positive"),
        (
            lambda: masks.sink_window(3, window=0, num_sink_tokens=1),
            ValueError,
            "window must be a posi",
        ),
        (
            lambda: masks.sink_window(3, window=2, num_sink_tokens=-1),
            ValueError,
            "num_sink_tokens must be a non-ne",
        ),
        (
            lambda: masks.sink_window(3, window=2, num_sink_tokens=1.0),
            TypeError,
            "num_sink_tokens must be a non-ne",
        ),
        (lambda: masks.padding([2, -1]), ValueError, r"lengths\[1\] must be a non-negative"),
        (lambda: masks.padding(torch.tensor([2, -1])), ValueError, "non-negative"),
        (lambda: masks.padding([2, 5], max_len=4), ValueError, "at most max_len=4"),
        (lambda: masks.padding(torch.ones(2, 3, dtype=torch.long)), TypeError, "1-d integer"),
        (lambda: masks.padding(torch.tensor([1.0, 2.0])), TypeError, "1-d integer"),
        (lambda: masks.padding("abc"), TypeError, "sequence of ints"),
        (lambda: masks.padding(torch.tensor([True, False])), TypeError, "1-d integer tensor"),
        (lambda: masks.padding([2, True]), TypeError, r"lengths\[1\] must be a non-negative int"),
        (lambda: masks.allowed_to_blocked(torch.zeros(2)), TypeError, "bool tensor"),
        (lambda: masks.allowed_to_additive(torch.ones(2), torch.float32), TypeError, "bool"),
        (
            lambda: masks.allowed_to_additive(torch.ones(2, dtype=torch.bool), torch.long),
            TypeError,
            "floating-point",
        ),
        (lambda: masks.additive_to_allowed(torch.ones(2, dtype=torch.bool)), TypeError, "float"),
        (lambda: masks.additive_to_allowed(torch.tensor([0.0, -2.5])), ValueError, "bias"),
        (lambda: masks.decode_mask(-1, 3), ValueError, "t_q must be a non-negative int"),
        (lambda: masks.check_causal_window(False, 4), ValueError, "is_causal=False with window=4"),
        (lambda: masks.check_causal_window(1, None), TypeError, "is_causal must be a bool"),
        (lambda: masks.decode_mask(2, 3, window=0), ValueError, "window must be a positive"),
        (lambda: masks.needs_mask(1, 3, window=0), ValueError, "window must be a positive"),
        (
            lambda: masks.padding_attention_mask(torch.ones(1, 2), 1),
            TypeError,
            "padding_mask must be a bool or integer",
        ),
        (
            lambda: masks.padding_attention_mask(torch.ones(1, 2, dtype=torch.long), 3),
            ValueError,
            r"shape \(b, T\) with T >= t=3, got \(1, 2\)",
        ),
        (
            lambda: masks.padding_attention_mask(torch.tensor([[1, 0]]), 1),
            ValueError,
            "pad on the left",
        ),
        (lambda: masks.needs_mask(1, 2.0), TypeError, "t_k must be a non-negative int"),
        (lambda: masks.combine(None, [True]), TypeError, r"masks\[1\] must be None or a bool"),
        (lambda: masks.combine(torch.ones(2, dtype=torch.long)), TypeError, "masks\\[0\\]"),
        (
            lambda: masks.combine(masks.causal(3), masks.causal(2)),
            ValueError,
            r"broadcast together, got shapes \(3, 3\), \(2, 2\)",
        ),
    ],
)
def test_masks_reject_bad_input(call: object, error: type[Exception], pattern: str) -> None:
    assert callable(call)
    with pytest.raises(error, match=pattern):
        call()


def test_conversions_round_trip() -> None:
    allowed = torch.rand(3, 4, 5) > 0.5
    assert torch.equal(masks.blocked_to_allowed(masks.allowed_to_blocked(allowed)), allowed)
    for dtype in (torch.float16, torch.float32, torch.float64):
        additive = masks.allowed_to_additive(allowed, dtype)
        assert additive.dtype == dtype
        assert torch.equal(additive == 0, allowed)
        assert bool(torch.isneginf(additive[~allowed]).all())
        assert torch.equal(masks.additive_to_allowed(additive), allowed)


def test_additive_to_allowed_accepts_finfo_min() -> None:
    hf_style = torch.tensor([[0.0, torch.finfo(torch.float32).min]])
    assert masks.additive_to_allowed(hf_style).tolist() == [[True, False]]


def test_three_conventions_give_the_same_attention() -> None:
    mha = torch.nn.MultiheadAttention(6, 3, batch_first=True).eval()
    x = torch.randn(2, 5, 6)
    allowed = masks.sliding_window(5, window=2)
    blocked = masks.allowed_to_blocked(allowed)
    additive = masks.allowed_to_additive(allowed)
    with_blocked, _ = mha(x, x, x, attn_mask=blocked, need_weights=False)
    with_additive, _ = mha(x, x, x, attn_mask=additive, need_weights=False)
    torch.testing.assert_close(with_additive, with_blocked)
    ours = MultiHeadAttention.from_torch(mha)
    torch.testing.assert_close(ours(x, attn_mask=allowed), with_blocked)
    torch.testing.assert_close(ours(x, attn_mask=additive), with_blocked)


@pytest.mark.parametrize("window", [None, 1, 2, 5, 9])
@pytest.mark.parametrize(("t_q", "t_k"), [(1, 1), (1, 6), (3, 7), (5, 5), (0, 3)])
def test_decode_mask_is_bottom_right_band_or_none(t_q: int, t_k: int, window: int | None) -> None:
    expected = _brute_force(t_q, t_k, "bottom-right", window)
    got = masks.decode_mask(t_q, t_k, window=window)
    if got is None:  # None only when no query hides any key
        assert bool(expected.all())
        assert t_q <= 1
    else:
        assert torch.equal(got, expected)


@pytest.mark.parametrize("window", [None, 1, 2, 5, 6, 9, 64])
@pytest.mark.parametrize(("t_q", "t_k"), [(1, 1), (1, 6), (3, 7), (5, 5), (2, 2)])
def test_needs_mask_is_whether_any_key_is_hidden(t_q: int, t_k: int, window: int | None) -> None:
    hides = not bool(_brute_force(t_q, t_k, "bottom-right", window).all())
    assert masks.needs_mask(t_q, t_k, window=window) is hides
    assert (masks.decode_mask(t_q, t_k, window=window) is not None) is hides


@pytest.mark.parametrize("t", [1, 3, 5])
def test_padding_attention_mask_hides_padding_keys_but_not_a_query_itself(t: int) -> None:
    pad = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])  # (3, 5)
    got = masks.padding_attention_mask(pad, t)
    expected = torch.zeros(3, t, 5, dtype=torch.bool)
    for b in range(3):
        for i in range(t):
            for j in range(5):
                expected[b, i, j] = bool(pad[b, j]) or j == 5 - t + i
    assert torch.equal(got, expected)
    assert torch.equal(masks.padding_attention_mask(pad.bool(), t), expected)


def test_decode_mask_none_for_one_token_without_window() -> None:
    assert masks.decode_mask(1, 16384) is None
    assert masks.decode_mask(1, 4, window=4) is None
    row = masks.decode_mask(1, 5, window=4)
    assert row is not None
    assert row.tolist() == [[False, True, True, True, True]]


def test_combine_bool_is_logical_and() -> None:
    causal = masks.causal(4)
    pad = masks.key_padding([3, 4], max_len=4)  # (2, 1, 1, 4)
    got = masks.combine(causal, None, pad)
    assert got is not None
    assert got.dtype == torch.bool
    assert torch.equal(got, causal & pad)
    assert got[0, 0, 3].tolist() == [True, True, True, False]


def test_combine_none_and_single() -> None:
    causal = masks.causal(3)
    assert masks.combine() is None
    assert masks.combine(None, None) is None
    assert masks.combine(None, causal) is causal  # one mask: returned as it is


def test_combine_mixed_is_additive_and_keeps_bias() -> None:
    bias = torch.tensor([[0.5, 1.0, -2.0]], dtype=torch.float64)  # (1, 3), e.g. ALiBi
    got = masks.combine(masks.causal(3), bias)
    assert got is not None
    assert got.dtype == torch.float64
    expected = torch.tensor(
        [[0.5, -torch.inf, -torch.inf], [0.5, 1.0, -torch.inf], [0.5, 1.0, -2.0]],
        dtype=torch.float64,
    )
    assert torch.equal(got, expected)
    # Two float masks add, in their promoted dtype.
    half = torch.full((3, 3), 0.25, dtype=torch.float16)
    total = masks.combine(bias, half)
    assert total is not None
    assert total.dtype == torch.float64
    assert torch.equal(total, (bias + 0.25).expand(3, 3))


def test_combine_gives_the_attention_of_each_mask_applied() -> None:
    q, k, v = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 6, 5), torch.randn(2, 3, 6, 7)
    causal = masks.causal(4, 6, align="bottom-right")
    pad = masks.key_padding([5, 6], max_len=6)
    bias = torch.randn(4, 6)
    both_bool = masks.combine(causal, pad)
    mixed = masks.combine(causal, bias, pad)
    expected_bool = TorchSDPA(q, k, v, attn_mask=causal & pad)
    expected_mixed = TorchSDPA(q, k, v, attn_mask=bias.masked_fill(~(causal & pad), float("-inf")))
    torch.testing.assert_close(TorchSDPA(q, k, v, attn_mask=both_bool), expected_bool)
    torch.testing.assert_close(TorchSDPA(q, k, v, attn_mask=mixed), expected_mixed)


def test_modules_build_masks_without_checking_them_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Modules check once at their boundary; the mask builders they call skip their checks."""
    from attnlab.caches.kv import DynamicKVCache
    from attnlab.layers.gqa import GroupedQueryAttention

    def checked(*args: object, **kwargs: object) -> None:
        raise AssertionError("a module called a validating mask builder")

    torch.manual_seed(0)
    gqa = GroupedQueryAttention(12, 3, 1, scores=ScoreRule(window=3)).eval()
    mha = MultiHeadAttention(12, 12, 3, backend="scratch").eval()
    x, padding = torch.randn(2, 5, 12), torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    expected = (gqa(x), mha(x, key_padding_mask=padding, is_causal=True))
    checking = masks.checking

    def not_checking() -> bool:
        if checking():
            raise AssertionError("a module's mask builder checked its arguments again")
        return False

    monkeypatch.setattr(masks, "_check_sizes", checked)
    monkeypatch.setattr(masks, "checking", not_checking)
    cache = DynamicKVCache()
    steps = torch.cat([gqa(x[:, :3], cache=cache), gqa(x[:, 3:4], cache=cache)], dim=1)
    steps = torch.cat([steps, gqa(x[:, 4:], cache=cache)], dim=1)
    torch.testing.assert_close(steps, expected[0])
    got = mha(x, key_padding_mask=padding, is_causal=True)
    torch.testing.assert_close(got, expected[1])


@pytest.mark.parametrize(("t_q", "t_k", "chunk"), [(11, 11, 4), (1, 11, 4), (3, 9, 3), (6, 6, 8)])
def test_chunked_equals_transformers_chunked_causal_mask(t_q: int, t_k: int, chunk: int) -> None:
    # transformers' mask function for Llama 4's chunked layers, at absolute positions:
    # the queries are the last t_q of the t_k (a decode step when t_q = 1).
    from transformers.masking_utils import chunked_causal_mask_function

    rule = chunked_causal_mask_function(chunk, torch.zeros(1, dtype=torch.long))
    q_idx = torch.arange(t_k - t_q, t_k)[:, None]
    expected = rule(0, 0, q_idx, torch.arange(t_k)[None, :])
    got = masks.chunked(t_q, t_k, chunk_size=chunk, align="bottom-right")
    assert torch.equal(got, expected)
    if t_q == t_k:  # the same queries counted from the top-left
        assert torch.equal(masks.chunked(t_q, chunk_size=chunk), expected)
    if chunk >= t_k:
        assert torch.equal(got, masks.causal(t_q, t_k, align="bottom-right"))


def test_chunked_names_a_bad_chunk_size() -> None:
    with pytest.raises(ValueError, match="chunk_size must be a positive int, got 0"):
        masks.chunked(4, chunk_size=0)
    with pytest.raises(TypeError, match=r"chunk_size must be a positive int, got 2\.0"):
        masks.chunked(4, chunk_size=2.0)  # type: ignore[arg-type]
