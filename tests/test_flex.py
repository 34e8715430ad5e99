"""attnlab.functional.flex: every mask and score change as a FlexAttention mod, equal to the dense
ones.

Three references, each independent of the mods: the dense builders of `attnlab.rules.masks`
(or a mask built here by hand where attnlab has none: prefix-LM, documents), PyTorch's
`scaled_dot_product_attention` given that dense mask or bias, and attnlab's tiled
`flash_attention` for what it has (window, softcap, sinks, both alignments).

FlexAttention runs eagerly: compiling costs seconds per shape and mask on this CPU (12 s
and more for the first), and `tests/test_paged.py` already checks the compiled kernel
once. Plain eager FlexAttention still traces each new mod with dynamo (about 1 s for the
first call of a process, then 0.1-0.4 s per new mod here); FlexAttention's own switch
`_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG` calls the same unfused reference without that
tracing, three times cheaper for this file. Most tests use the switch;
`test_plain_eager_flex` takes the plain eager path, the one readers run, with its one
warning (that it is not the fused kernel) silenced there and nowhere else. Block masks
use tiles of 4, so that tiny shapes have empty, full and partial tiles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import AuxRequest, flex_attention

from attnlab.functional import flex
from attnlab.functional.flash import flash_attention, tile_map
from attnlab.functional.sdpa import scaled_dot_product_attention
from attnlab.rules import masks

B, H, L, S, E, EV = 2, 3, 10, 13, 8, 5
BLOCK = 4
TOL: dict[str, Any] = {"atol": 2e-6, "rtol": 1e-5}


@pytest.fixture(autouse=True)
def _untraced_eager(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager FlexAttention without dynamo's tracing, unless the test asks for `plain_eager`."""
    if "plain_eager" not in request.fixturenames:
        monkeypatch.setattr(torch_flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)


@pytest.fixture
def plain_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlexAttention as `flex_attention(...)` runs it outside `torch.compile`."""
    monkeypatch.setattr(torch_flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", False)


@pytest.fixture
def qkv() -> tuple[Tensor, Tensor, Tensor]:
    torch.manual_seed(0)
    q = torch.randn(B, H, L, E)  # (b, h, L, E)
    k = torch.randn(B, H, S, E)  # (b, h, S, E)
    v = torch.randn(B, H, S, EV)  # (b, h, S, Ev)
    return q, k, v


def _flex(q: Tensor, k: Tensor, v: Tensor, mod: flex.MaskMod, **kwargs: Any) -> Tensor:
    b = kwargs.pop("b", None)
    bm = flex.block_mask(mod, q.shape[-2], k.shape[-2], b=b, block_size=BLOCK)
    return flex.attention(q, k, v, block_mask=bm, **kwargs)


# -- the masks of attnlab.rules.masks, stated again on indices --------------------------------

SIZES = [(6, 6), (5, 9), (9, 5)]


@pytest.mark.parametrize(("t_q", "t_k"), SIZES)
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_band_mods_equal_dense_masks(t_q: int, t_k: int, align: Any) -> None:
    def dense(mod: flex.MaskMod) -> Tensor:
        return flex.to_dense(mod, t_q, t_k)[0, 0]

    assert torch.equal(
        dense(flex.causal_mod(t_q, t_k, align=align)), masks.causal(t_q, t_k, align=align)
    )
    for window in (1, 2, 3, 20):
        got = dense(flex.sliding_window_mod(t_q, t_k, window=window, align=align))
        assert torch.equal(got, masks.sliding_window(t_q, t_k, window=window, align=align))
        mod = flex.sink_window_mod(t_q, t_k, window=window, num_sink_tokens=2, align=align)
        want = masks.sink_window(t_q, t_k, window=window, num_sink_tokens=2, align=align)
        assert torch.equal(dense(mod), want)
        mod = flex.chunked_mod(t_q, t_k, chunk_size=window, align=align)
        assert torch.equal(dense(mod), masks.chunked(t_q, t_k, chunk_size=window, align=align))


def test_to_dense_equals_torch_create_mask() -> None:
    """to_dense broadcasts index tensors; torch's create_mask vmaps over them: the same."""
    from torch.nn.attention.flex_attention import create_mask

    mods: list[tuple[flex.MaskMod, int]] = [
        (flex.causal_mod(5, 9, align="bottom-right"), 1),
        (flex.sink_window_mod(window=2, num_sink_tokens=1), 1),
        (flex.padding_mod([3, 9]), 2),
        (flex.prefix_lm_mod([2, 4]), 2),
        (flex.document_mod(torch.tensor([[0, 0, 1, 1, 1, 2, 2, 2, 2]] * 2)), 2),
    ]
    for mod, b in mods:
        assert torch.equal(flex.to_dense(mod, 5, 9, b=b), create_mask(mod, b, 1, 5, 9, "cpu"))


def test_padding_mod_equals_key_padding() -> None:
    lengths = [4, 0, 7]
    got = flex.to_dense(flex.padding_mod(lengths), 5, 7, b=3)  # (3, 1, 5, 7)
    assert torch.equal(got, masks.key_padding(lengths, 7).expand(3, 1, 5, 7))


def test_prefix_lm_mod_by_hand() -> None:
    assert torch.equal(flex.to_dense(flex.prefix_lm_mod(3), 6)[0, 0], _prefix_lm(6, 3))
    per_batch = flex.to_dense(flex.prefix_lm_mod(torch.tensor([3, 0])), 6, b=2)
    assert torch.equal(per_batch[0, 0], _prefix_lm(6, 3))
    assert torch.equal(per_batch[1, 0], masks.causal(6))  # no prefix: causal


def test_lengths_are_not_read_while_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    # A tensor's values would be a host sync and a data-dependent guard under export:
    # the bounds are skipped then (the dtype and rank are still checked).
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    mod = flex.padding_mod(torch.tensor([-1, 2]))
    assert flex.to_dense(mod, 1, 3, b=2)[:, 0, 0].tolist() == [[False] * 3, [True, True, False]]
    with pytest.raises(TypeError, match="lengths must be a 1-d integer tensor"):
        flex.padding_mod(torch.tensor([1.0]))


def test_document_mod_is_block_diagonal() -> None:
    lengths = [3, 1, 4]
    ids = flex.document_ids(lengths)
    assert ids.tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    causal = torch.block_diag(*(masks.causal(n).long() for n in lengths)).bool()
    full = torch.block_diag(*(torch.ones(n, n) for n in lengths)).bool()
    assert torch.equal(flex.to_dense(flex.document_mod(ids), 8)[0, 0], causal)
    assert torch.equal(flex.to_dense(flex.document_mod(ids, is_causal=False), 8)[0, 0], full)
    two = torch.stack([ids, flex.document_ids([8])])  # (b, t): a packing per entry
    got = flex.to_dense(flex.document_mod(two), 8, b=2)[:, 0]
    assert torch.equal(got, torch.stack([causal, masks.causal(8)]))


# -- attention through the block masks, against SDPA and flash_attention ----------------


@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_causal_and_window_equal_sdpa_and_flash(qkv: Any, align: Any) -> None:
    q, k, v = qkv
    mod = flex.causal_mod(L, S, align=align)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=masks.causal(L, S, align=align))
    torch.testing.assert_close(_flex(q, k, v, mod), want, **TOL)
    tiled = flash_attention(q, k, v, is_causal=True, align=align, block_size=BLOCK)
    torch.testing.assert_close(_flex(q, k, v, mod), tiled, **TOL)
    for window in (3, 6):
        mod = flex.sliding_window_mod(L, S, window=window, align=align)
        dense = masks.sliding_window(L, S, window=window, align=align)
        want = scaled_dot_product_attention(q, k, v, attn_mask=dense)  # zero rows: zeros
        got = _flex(q, k, v, mod)
        torch.testing.assert_close(got, want, **TOL)
        tiled = flash_attention(q, k, v, window=window, align=align, block_size=BLOCK)
        torch.testing.assert_close(got, tiled, **TOL)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
def test_plain_eager_flex(qkv: Any, plain_eager: None) -> None:
    """The path a reader runs: flex_attention outside torch.compile, traced by dynamo."""
    q, k, v = qkv
    got = _flex(q, k, v, flex.causal_mod())
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    got = _flex(q, k, v, flex.sliding_window_mod(window=3), sink_logits=torch.zeros(H))
    dense = masks.sliding_window(L, S, window=3)
    want = scaled_dot_product_attention(q, k, v, attn_mask=dense, sink_logits=torch.zeros(H))
    torch.testing.assert_close(got, want, **TOL)


def _prefix_lm(t: int, prefix: int) -> Tensor:
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    mask[:, :prefix] = True  # the prefix sees itself both ways, and every query sees it
    return mask


def test_masks_without_a_flash_path_equal_sdpa(qkv: Any) -> None:
    q, k, v = qkv
    k, v = k[..., :L, :], v[..., :L, :]  # square: prefixes and documents share positions
    prefixes = torch.stack([_prefix_lm(L, 3), _prefix_lm(L, 7)])[:, None]  # (b, 1, L, L)
    documents = torch.block_diag(*(masks.causal(n).long() for n in (4, 1, 5))).bool()
    cases: list[tuple[flex.MaskMod, Tensor, int | None]] = [
        (flex.prefix_lm_mod(torch.tensor([3, 7])), prefixes, 2),
        (flex.document_mod(flex.document_ids([4, 1, 5])), documents, None),
        (flex.padding_mod([7, 2]), masks.key_padding([7, 2], L), 2),
        (
            flex.sink_window_mod(window=3, num_sink_tokens=2),
            masks.sink_window(L, window=3, num_sink_tokens=2),
            None,
        ),
    ]
    for mod, dense, b in cases:
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
        torch.testing.assert_close(_flex(q, k, v, mod, b=b), want, **TOL)


def test_gqa_through_flex(qkv: Any) -> None:
    q, k, v = qkv
    q = torch.cat([q, q.flip(1)], dim=1)  # 6 query heads on 3 key heads
    got = _flex(q, k, v, flex.causal_mod(), enable_gqa=True)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, want, **TOL)


# -- score changes --------------------------------------------------------------------


def test_alibi_slopes_by_hand() -> None:
    """The paper's slopes: 2^(-8 h / n) for n a power of 2; otherwise (its code, BLOOM's)
    those of the power of 2 below n, then every other slope of twice that power."""
    assert flex.alibi_slopes(8).tolist() == [2.0**-i for i in range(1, 9)]
    assert flex.alibi_slopes(1).tolist() == [2.0**-8]
    assert flex.alibi_slopes(6).tolist() == [2.0**-i for i in (2, 4, 6, 8, 1, 3)]
    twelve = [2.0**-i for i in range(1, 9)] + [2.0**-i for i in (0.5, 1.5, 2.5, 3.5)]
    torch.testing.assert_close(flex.alibi_slopes(12), torch.tensor(twelve))


def test_alibi_equals_sdpa_with_its_bias(qkv: Any) -> None:
    q, k, v = qkv
    distance = torch.arange(S)[None, :] - torch.arange(L)[:, None]  # (L, S): j - i
    bias = flex.alibi_slopes(H)[:, None, None] * distance  # (H, L, S)
    bias = bias.masked_fill(~masks.causal(L, S), float("-inf"))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    got = _flex(q, k, v, flex.causal_mod(), score_mod=flex.alibi_mod(H))
    torch.testing.assert_close(got, want, **TOL)
    dense = flex.to_dense(flex.alibi_mod(H), L, S, h=H)[0]  # the bias alone
    torch.testing.assert_close(dense, flex.alibi_slopes(H)[:, None, None] * distance.float())


def test_softcap_equals_the_kernels(qkv: Any) -> None:
    q, k, v = qkv
    q = q * 4  # large scores, so that the cap bends them
    got = _flex(q, k, v, flex.causal_mod(), score_mod=flex.softcap_mod(2.0))
    want = scaled_dot_product_attention(q, k, v, is_causal=True, softcap=2.0)
    torch.testing.assert_close(got, want, **TOL)
    tiled = flash_attention(q, k, v, is_causal=True, softcap=2.0, block_size=BLOCK)
    torch.testing.assert_close(got, tiled, **TOL)


@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_sinks_from_the_log_sum_exp(qkv: Any, align: Any) -> None:
    """Sinks on a window; bottom-right with L < S, and L > S where rows see no key."""
    q, k, v = qkv
    sinks = torch.tensor([-1.0, 0.5, 3.0])
    for keys, values in ((k, v), (k[..., :6, :], v[..., :6, :])):
        s = keys.shape[-2]
        mod = flex.sliding_window_mod(L, s, window=4, align=align)
        got = _flex(q, keys, values, mod, sink_logits=sinks, score_mod=flex.softcap_mod(3.0))
        dense = masks.sliding_window(L, s, window=4, align=align)
        want = scaled_dot_product_attention(
            q, keys, values, attn_mask=dense, sink_logits=sinks, softcap=3.0
        )
        torch.testing.assert_close(got, want, **TOL)
        tiled = flash_attention(
            q, keys, values, window=4, align=align, sink_logits=sinks, softcap=3.0, block_size=BLOCK
        )
        torch.testing.assert_close(got, tiled, **TOL)


def test_apply_sinks_is_an_extra_key(qkv: Any) -> None:
    """The log-sum-exp correction equals one more key whose score is the sink, value 0."""
    q, k, v = qkv
    sinks = torch.tensor([0.0, 2.0, -2.0])
    out, aux = flex_attention(q, k, v, return_aux=AuxRequest(lse=True))
    k1 = torch.cat([k, torch.zeros(B, H, 1, E)], dim=2)
    v1 = torch.cat([v, torch.zeros(B, H, 1, EV)], dim=2)

    def sink_key(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return torch.where(kv_idx == S, sinks[h], score)

    extra = flex_attention(q, k1, v1, score_mod=sink_key)
    torch.testing.assert_close(flex.apply_sinks(out, aux.lse, sinks), extra, **TOL)


# -- block masks ----------------------------------------------------------------------


@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_block_map_equals_flash_tiles(align: Any) -> None:
    """FlexAttention skips and masks the tiles that flash_attention skips and masks."""
    for t_q, t_k in ((16, 16), (8, 20)):
        for window in (None, 5, 8):
            if window is None:
                mod = flex.causal_mod(t_q, t_k, align=align)
            else:
                mod = flex.sliding_window_mod(t_q, t_k, window=window, align=align)
            got = flex.block_map(flex.block_mask(mod, t_q, t_k, block_size=BLOCK))[0, 0]
            want = tile_map(t_q, t_k, block_size=BLOCK, is_causal=True, window=window, align=align)
            assert torch.equal(got, want), (t_q, t_k, window)


def test_block_fraction_counts_tiles() -> None:
    assert flex.block_fraction(flex.block_mask(flex.causal_mod(), 1024)) == 36 / 64
    window = flex.block_mask(flex.sliding_window_mod(window=128), 1024)
    assert flex.block_fraction(window) == 15 / 64  # the diagonal and the one below it
    docs = flex.document_mod(flex.document_ids([256, 768]))
    assert flex.block_fraction(flex.block_mask(docs, 1024)) == (3 + 21) / 64
    padded = flex.block_map(flex.block_mask(flex.padding_mod([6, 3]), 8, b=2, block_size=4))
    assert padded[:, 0].tolist() == [[[1, 2], [1, 2]], [[2, 0], [2, 0]]]


# -- bad input ------------------------------------------------------------------------


def _two(q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return q_idx >= kv_idx


def test_mods_with_the_wrong_signature(qkv: Any) -> None:
    q, k, v = qkv
    with pytest.raises(TypeError, match=r"mask_mod must take 4 .*got _two\(q_idx"):
        flex.block_mask(_two, 4)
    with pytest.raises(TypeError, match="mask_mod must be a function"):
        flex.block_mask(masks.causal(4), 4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="score_mod must take 5"):
        flex.attention(q, k, v, score_mod=flex.causal_mod())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="mod must be a mask_mod"):
        flex.to_dense(_two, 4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="block_mask must be a BlockMask"):
        flex.attention(q, k, v, block_mask=masks.causal(L, S))  # type: ignore[arg-type]


def test_bad_arguments() -> None:
    bad: list[tuple[type[Exception], str, Callable[[], object]]] = [
        (ValueError, "window must be a positive int", lambda: flex.sliding_window_mod(window=0)),
        (TypeError, "window must be a positive int", lambda: flex.sliding_window_mod(window=2.0)),
        (
            ValueError,
            "num_sink_tokens must be a non-neg",
            lambda: flex.sink_window_mod(window=2, num_sink_tokens=-1),
        ),
        (ValueError, "align must be one of", lambda: flex.causal_mod(align="top")),
        (ValueError, "needs both lengths", lambda: flex.causal_mod(4, align="bottom-right")),
        (ValueError, "softcap must be a positive", lambda: flex.softcap_mod(0.0)),
        (ValueError, "num_heads must be a positive", lambda: flex.alibi_slopes(0)),
        (
            ValueError,
            r"lengths\[0\] must be a non-neg",
            lambda: flex.padding_mod(torch.tensor([-1])),
        ),
        (
            TypeError,
            "lengths must be a 1-d integer",
            lambda: flex.padding_mod(torch.tensor([True])),
        ),
        (TypeError, r"lengths\[1\] must be a non-neg", lambda: flex.document_ids([2, True])),
        (
            TypeError,
            "is_causal must be a bool",
            lambda: flex.document_mod(torch.ones(3).long(), is_causal=1),
        ),
        (TypeError, "prefix_lengths must be", lambda: flex.prefix_lm_mod(2.5)),
        (TypeError, "document_ids must be an integer", lambda: flex.document_mod(torch.ones(3))),
        (ValueError, "block_size must be a pos", lambda: flex.block_mask(_causal, 4, block_size=0)),
    ]
    for kind, message, call in bad:
        with pytest.raises(kind, match=message):
            call()


def _causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return q_idx >= kv_idx


def test_bad_attention_inputs(qkv: Any) -> None:
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"sink_logits must hold one logit per head, shape \(3,\)"):
        flex.attention(q, k, v, sink_logits=torch.zeros(2))
    with pytest.raises(ValueError, match=r"query must be \(b, H, L, E\) for FlexAttention"):
        flex.attention(q[0], k[0], v[0])
    with pytest.raises(NotImplementedError, match="sinks with compiled=True"):
        flex.attention(q, k, v, sink_logits=torch.zeros(H), compiled=True)  # before compiling


# -- the benchmark's pieces (the timing itself runs as python -m attnlab.tools.bench.flex) ----


def test_bench_settings_and_documents() -> None:
    from attnlab.tools.bench.flex import FlexSettings, document_lengths

    for t in (1024, 1000, 4096):
        parts = document_lengths(t)
        assert len(parts) == 5
        assert sum(parts) == t
        assert min(parts) > 0
    with pytest.raises(ValueError, match="window must be a positive int"):
        FlexSettings(window=0)
    with pytest.raises(ValueError, match="lengths must be ints of at least 16"):
        FlexSettings(lengths=(8,))


def test_bench_plot_draws_every_mask(tmp_path: Any) -> None:
    from attnlab.tools.bench.flex import IMPLS, MASKS, write_flex_plot

    def stats(x: float) -> dict[str, float]:
        return {"median": x, "min": x * 0.9, "max": x * 1.1}

    cases = [
        {
            "mask": m,
            "t": t,
            "time_s": {impl: stats(t * 1e-5 * (i + 1)) for i, impl in enumerate(IMPLS)},
        }
        for m in MASKS
        for t in (1024, 2048)
    ]
    path = write_flex_plot({"settings": {"window": 256}, "cases": cases}, tmp_path)
    svg = path.read_text("utf-8")
    for text in (
        "causal",
        "sliding window of 256",
        "five documents packed",
        "flex_attention (compiled)",
    ):
        assert text in svg


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.complex64])
def test_document_ids_must_be_integers(dtype: torch.dtype) -> None:
    """The package's one integer rule (complex ids used to pass here)."""
    ids = torch.tensor([0, 0, 1, 1]).to(dtype)
    with pytest.raises(TypeError, match="document_ids must be"):
        flex.document_mod(ids)


@pytest.mark.parametrize(
    ("block_size", "message"),
    [((4, 0), r"block_size\[1\] must be a positive int"), ((4, 4, 4), "a pair")],
)
def test_block_mask_checks_its_tiles_as_flash_attention_does(
    block_size: object, message: str
) -> None:
    """One rule for a tile size (_validation.check_block_size): the same messages as
    flash_attention's (flex named neither the bad entry nor the pair)."""
    q = torch.randn(1, 1, 8, 4)
    with pytest.raises(ValueError, match=message):
        flex.block_mask(flex.causal_mod(), 8, 8, block_size=block_size)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        flash_attention(q, q, q, block_size=block_size)  # type: ignore[arg-type]
