"""Attention weights recovered from the log-sum-exp equal the materialised softmax.

The reference is written here, independently of the kernels: explicit float64 scores
`q k^T * scale`, the softcap `c tanh(x / c)`, ALiBi's `m (j - i - o)`, the dense masks of
`attnlab.rules.masks`, then `torch.softmax` (with the sink as one more column, dropped
after). The log-sum-exp comes from attnlab's `flash_attention` and from FlexAttention
(eager, with the switch of tests/test_flex.py that skips dynamo's tracing). All
dimensions differ; `BLOCK` does not divide `S`, so the last key tile is short.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex
from torch import Tensor

from attnlab.caches.kv import DynamicKVCache
from attnlab.functional import flex
from attnlab.functional.backends import attend, attend_with_lse
from attnlab.functional.flash import flash_attention
from attnlab.functional.lse_weights import weights_from_lse
from attnlab.layers.gqa import GroupedQueryAttention, HeadGates
from attnlab.rules import masks
from attnlab.rules.scores import ScoreRule
from attnlab.tools.bench.measure import peak_extra_bytes

B, H, HKV, L, S, E, EV = 2, 6, 3, 11, 13, 8, 5
BLOCK = 4  # 13 keys: tiles of 4, 4, 4 and 1
TOL: dict[str, Any] = {"atol": 1e-6, "rtol": 0.0}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def untraced_flex(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager FlexAttention without dynamo's tracing (its unfused reference, no warning)."""
    monkeypatch.setattr(torch_flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)


def _qkv(t_q: int = L, t_k: int = S, kv_heads: int = H) -> tuple[Tensor, Tensor, Tensor]:
    q = torch.randn(B, H, t_q, E)  # (b, h, L, E)
    k = torch.randn(B, kv_heads, t_k, E)  # (b, h_kv, S, E)
    v = torch.randn(B, kv_heads, t_k, EV)  # (b, h_kv, S, Ev)
    return q, k, v


def _reference(
    q: Tensor,
    k: Tensor,
    allowed: Tensor | None = None,
    *,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    slopes: Tensor | None = None,
    offset: int = 0,
) -> Tensor:
    """The softmax of explicit float64 scores: `(b, h, L, S)`, zeros for an empty row."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # one key head per query head
    s = q.double() @ k.double().mT / math.sqrt(q.shape[-1])  # (b, h, L, S)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:
        i = torch.arange(q.shape[2])[:, None] + offset  # the queries' key positions
        j = torch.arange(k.shape[2])[None, :]
        s = s + slopes.double()[:, None, None] * (j - i)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:  # one more column, the sink's logit, dropped after the softmax
        column = sinks.double()[:, None, None].expand(*s.shape[:-1], 1)
        return torch.cat([s, column], dim=-1).softmax(-1)[..., :-1].nan_to_num()
    return s.softmax(-1).nan_to_num()  # a row that sees nothing: NaN -> 0, as the kernels


def _close(weights: Tensor, reference: Tensor) -> None:
    assert weights.dtype == torch.float32
    torch.testing.assert_close(weights.double(), reference, **TOL)


# -- attnlab's flash_attention ----------------------------------------------------------


@pytest.mark.parametrize(("t_q", "t_k"), [(L, S), (S, L)])
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_causal_weights_equal_the_softmax(t_q: int, t_k: int, align: Any) -> None:
    q, k, v = _qkv(t_q, t_k)
    opts = {"is_causal": True, "align": align}
    _, lse = flash_attention(q, k, v, **opts, block_size=BLOCK, return_lse=True)
    weights = weights_from_lse(q, k, lse, **opts, block_size=BLOCK)
    _close(weights, _reference(q, k, masks.causal(t_q, t_k, align=align)))


@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_window_weights_equal_the_softmax_and_skip_tiles(align: Any) -> None:
    q, k, v = _qkv()
    opts = {"window": 3, "align": align}
    _, lse = flash_attention(q, k, v, **opts, block_size=BLOCK, return_lse=True)
    weights = weights_from_lse(q, k, lse, **opts, block_size=BLOCK)
    allowed = masks.sliding_window(L, S, window=3, align=align)
    _close(weights, _reference(q, k, allowed))
    assert (weights[..., ~allowed] == 0).all()  # exact zeros outside the band


def test_sink_weights_sum_to_one_minus_the_sinks_share() -> None:
    q, k, v = _qkv()
    sinks = torch.randn(H)
    _, lse = flash_attention(q, k, v, is_causal=True, sink_logits=sinks, return_lse=True)
    weights = weights_from_lse(q, k, lse, is_causal=True, sink_logits=sinks, block_size=BLOCK)
    _close(weights, _reference(q, k, masks.causal(L, S), sinks=sinks))
    share = torch.exp(sinks[:, None] - lse)  # (b, h, L): the sink's part of each row
    torch.testing.assert_close(weights.sum(-1), 1 - share, atol=1e-6, rtol=0)


def test_softcap_and_alibi_weights_equal_the_softmax() -> None:
    q, k, v = (x * 3 for x in _qkv())  # large scores, where the cap bends them
    slopes = flex.alibi_slopes(H)
    opts: dict[str, Any] = {"softcap": 2.0, "alibi_slopes": slopes, "is_causal": True}
    opts["align"] = "bottom-right"
    _, lse = flash_attention(q, k, v, **opts, block_size=BLOCK, return_lse=True)
    weights = weights_from_lse(q, k, lse, **opts, block_size=BLOCK)
    allowed = masks.causal(L, S, align="bottom-right")
    _close(weights, _reference(q, k, allowed, softcap=2.0, slopes=slopes, offset=S - L))


def test_gqa_weights_read_the_shared_key_heads() -> None:
    q, k, v = _qkv(kv_heads=HKV)
    rule = ScoreRule(is_causal=True, alibi_slopes=flex.alibi_slopes(H))
    _, lse = attend_with_lse("flash", q, k, v, rule, enable_gqa=True)
    weights = weights_from_lse(
        q, k, lse, is_causal=True, alibi_slopes=rule.alibi_slopes, enable_gqa=True, block_size=5
    )
    _close(weights, _reference(q, k, masks.causal(L, S), slopes=rule.alibi_slopes))


@pytest.mark.parametrize("block_size", [1, 5, 64])
def test_any_block_size_gives_the_same_weights(block_size: int) -> None:
    q, k, v = _qkv()
    _, lse = flash_attention(q, k, v, window=4, return_lse=True)
    weights = weights_from_lse(q, k, lse, window=4, block_size=block_size)
    _close(weights, _reference(q, k, masks.sliding_window(L, S, window=4)))


def test_rows_come_in_the_order_asked() -> None:
    q, k, v = _qkv()
    _, lse = flash_attention(q, k, v, is_causal=True, align="bottom-right", return_lse=True)
    opts: dict[str, Any] = {"is_causal": True, "align": "bottom-right", "block_size": BLOCK}
    full = weights_from_lse(q, k, lse, **opts)
    picked = [7, 0, 7, 10]  # out of order, one twice
    by_tensor = weights_from_lse(q, k, lse, rows=torch.tensor(picked), **opts)
    torch.testing.assert_close(by_tensor, full[:, :, picked], **TOL)  # fewer rows per matmul
    assert not torch.allclose(by_tensor[:, :, 0], full[:, :, 0])  # row 7 is not row 0
    assert weights_from_lse(q, k, lse, rows=picked, **opts).equal(by_tensor)
    by_slice = weights_from_lse(q, k, lse, rows=slice(1, None, 3), **opts)
    torch.testing.assert_close(by_slice, full[:, :, 1::3], **TOL)
    assert weights_from_lse(q, k, lse, rows=[], **opts).shape == (B, H, 0, S)


def test_return_lse_leaves_the_output_and_gradients_alone() -> None:
    q, k, v = (x.requires_grad_() for x in _qkv())
    sinks = torch.randn(H, requires_grad=True)
    opts = {"is_causal": True, "sink_logits": sinks, "block_size": BLOCK}
    out, lse = flash_attention(q, k, v, **opts, return_lse=True)
    plain = flash_attention(q, k, v, **opts)
    assert out.equal(plain)
    assert not lse.requires_grad
    assert lse.shape == (B, H, L)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v, sinks))
    expected = torch.autograd.grad(plain.square().sum(), (q, k, v, sinks))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    half = flash_attention(*(x.detach().bfloat16() for x in (q, k, v)), return_lse=True)
    wide = flash_attention(*(x.detach().double() for x in (q, k, v)), return_lse=True)
    assert (half[0].dtype, half[1].dtype, wide[1].dtype) == (
        torch.bfloat16,
        torch.float32,
        torch.float64,
    )


def test_extra_memory_is_the_rows_not_the_matrix() -> None:
    t, rows, block = 2048, 4, 128
    q, k = torch.randn(1, 1, t, 16), torch.randn(1, 1, t, 16)
    _, lse = flash_attention(q, k, k, is_causal=True, return_lse=True)
    picked = torch.arange(t - rows, t)
    peak = peak_extra_bytes(
        lambda: weights_from_lse(q, k, lse, rows=picked, is_causal=True, block_size=block)
    )
    result, tile = rows * t * 4, rows * block * 4
    assert result <= peak <= result + 8 * tile + 4096  # the result, a few tiles: no (t, t)


# -- FlexAttention ------------------------------------------------------------------------


@pytest.mark.usefixtures("untraced_flex")
@pytest.mark.parametrize("window", [None, 3])
def test_flex_lse_with_sinks_gives_the_weights(window: int | None) -> None:
    q, k, v = _qkv(S, S)
    sinks = torch.randn(H)
    if window is None:
        mod, allowed = flex.causal_mod(), masks.causal(S)
    else:
        mod, allowed = flex.sliding_window_mod(window=window), masks.sliding_window(S, window=3)
    mask = flex.block_mask(mod, S, S, block_size=BLOCK)
    out, lse = flex.attention(q, k, v, block_mask=mask, sink_logits=sinks, return_lse=True)
    torch.testing.assert_close(out, flex.attention(q, k, v, block_mask=mask, sink_logits=sinks))
    weights = weights_from_lse(q, k, lse, window=window, is_causal=True, block_size=BLOCK)
    _close(weights, _reference(q, k, allowed, sinks=sinks))


def test_flex_compiled_lse_is_refused_on_the_cpu() -> None:
    q, k, v = _qkv(S, S)
    with pytest.raises(NotImplementedError, match="return_lse with compiled=True"):
        flex.attention(q, k, v, compiled=True, return_lse=True)  # before compiling


# -- the backends and the checks ------------------------------------------------------------


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_backends_without_an_lse_refuse_by_name(backend: Any) -> None:
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=f"backend='{backend}' returns no log-sum-exp"):
        attend_with_lse(backend, q, k, v)
    out, _ = attend_with_lse("flash", q, k, v, ScoreRule(window=2))
    torch.testing.assert_close(out, attend(backend, q, k, v, ScoreRule(window=2)))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lse": torch.zeros(B, H, L + 1)}, r"lse must hold one log-sum-exp per query, shape "),
        ({"rows": [0, L]}, rf"rows\[1\]={L} is outside the {L} queries \[0, {L}\)"),
        ({"rows": torch.tensor([-1])}, r"rows\[0\]=-1 is outside"),
        ({"rows": slice(None, None, 0)}, "rows is a slice that cannot index"),
        ({"key": torch.zeros(B, 4, S, E), "enable_gqa": True}, r"query.shape\[-3\] must be"),
        ({"key": torch.zeros(B, HKV, S, E)}, "pass enable_gqa=True"),
    ],
)
def test_bad_arguments_are_refused_by_name(change: dict[str, Any], message: str) -> None:
    q, k, _ = _qkv()
    args: dict[str, Any] = {"query": q, "key": k, "lse": torch.zeros(B, H, L), **change}
    with pytest.raises(ValueError, match=message):
        weights_from_lse(**args)


# -- a layer on backend "flash" -------------------------------------------------------------


@pytest.mark.parametrize("with_cache", [False, True])
def test_gqa_layer_weights_on_flash_equal_scratch(
    with_cache: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import attnlab.layers.gqa as gqa

    recovered: list[str] = []  # the backends whose weights came from a log-sum-exp
    real = gqa.weights_from_rule

    def spy(*args: Any, **kwargs: Any) -> Tensor:
        recovered.append(layer.backend)
        return real(*args, **kwargs)

    monkeypatch.setattr(gqa, "weights_from_rule", spy)
    layer = GroupedQueryAttention(
        40,
        num_heads=H,
        num_kv_heads=HKV,
        head_dim=E,
        scores=ScoreRule(softcap=3.0, temperature=(4.0, 0.5)),
        gates=HeadGates(learned_sinks=True),
        backend="flash",
    ).eval()
    with torch.no_grad():
        layer.sink_logits.copy_(torch.randn(H))  # type: ignore[operator]
        x = torch.randn(B, 9, 40)
        results = {}
        for backend in ("flash", "scratch"):
            layer.backend = backend
            cache = DynamicKVCache() if with_cache else None
            if cache is not None:
                layer(x[:, :5], cache=cache)  # a prompt, then 4 tokens after it
            results[backend] = layer(x[:, 5:] if cache else x, cache=cache, need_weights=True)
        layer.backend = "flash"
        plain = layer(x) if not with_cache else results["flash"][0]
    assert recovered == ["flash"]  # scratch materialises them
    (out, weights), (out_s, weights_s) = results["flash"], results["scratch"]
    torch.testing.assert_close(weights, weights_s, **TOL)
    torch.testing.assert_close(out, out_s, atol=1e-5, rtol=1e-5)
    assert weights.shape == (B, H, 4 if with_cache else 9, 9)
    if not with_cache:
        assert out.equal(plain)  # asking for the weights leaves the output alone


# -- the benchmark --------------------------------------------------------------------------


def test_benchmark_command_writes_its_record(tmp_path: Path) -> None:
    from attnlab.tools.bench import lse_weights as bench

    path = tmp_path / "lse.json"
    argv = ["--json", str(path), "--tokens", "256", "--rows", "8", "--small-tokens", "128"]
    assert bench.main([*argv, "--heads", "2", "--head-dim", "8", "--rounds", "1"]) == 0
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["provenance"]["command"].startswith("python -m attnlab.tools.bench.lse_weights")
    big, small = data["results"]["tokens"], data["results"]["small_tokens"]
    assert big["weights_bytes"] == 2 * 8 * 256 * 4  # heads x rows x T floats
    assert big["matrix_bytes"] == 2 * 256 * 256 * 4
    assert big["weights_bytes"] <= big["recover_peak_bytes"] < big["matrix_bytes"]
    assert small["materialised_peak_bytes"] >= small["matrix_bytes"]  # measured, not computed
    assert max(big["max_abs_error"], small["max_abs_error"]) < 1e-6
    assert min(big["flash_forward_s"]["median"], big["recover_s"]["median"]) > 0


def test_committed_benchmark_record_has_the_page_keys() -> None:
    path = Path(__file__).resolve().parents[1] / "docs/assets/bench/lse_weights.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    big = data["results"]["tokens"]
    assert (big["tokens"], big["rows"]) == (32768, 64)
    assert big["matrix_bytes"] == data["settings"]["heads"] * 32768**2 * 4  # 4 GiB a head
    assert big["recover_peak_bytes"] < big["matrix_bytes"] / 100
