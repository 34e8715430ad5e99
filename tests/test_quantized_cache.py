"""KIVI's quantized KV cache (attnlab.caches.quantized) against a float64 transcription of
its rule, its memory per token, and a decoder that decodes through it."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from attnlab.caches.kv import DynamicKVCache
from attnlab.caches.quantized import QuantizedKVCache, dequantize, quantize
from attnlab.models.config import DecoderConfig
from attnlab.models.decoder import Decoder


def _kivi(x: Tensor, bits: int, group: int, per_channel: bool) -> Tensor:
    """KIVI's fake quantization of `x` `(b, h, n, d)` in float64, group by group: keys per
    channel (`group` tokens of one channel share a range), values per token (`group`
    channels of one token); each range's minimum rounded down to float16 and its step
    up (so the range covers the group), codes rounded half to even."""
    out = torch.empty_like(x, dtype=torch.float64)
    levels = 2**bits - 1
    n, d = x.shape[2], x.shape[3]
    blocks = (
        [(slice(t, t + group), slice(c, c + 1)) for t in range(0, n, group) for c in range(d)]
        if per_channel
        else [(slice(t, t + 1), slice(c, c + group)) for t in range(n) for c in range(0, d, group)]
    )
    for rows, cols in blocks:
        part = x[:, :, rows, cols].double()
        low = part.amin(dim=(2, 3), keepdim=True)
        high = part.amax(dim=(2, 3), keepdim=True)
        m = low.half()
        m = torch.where(m.double() > low, torch.nextafter(m, torch.tensor(-1e9).half()), m)
        s = ((high - m.double()) / levels).half()
        s = torch.where(s.double() * levels < high - m.double(),
                        torch.nextafter(s, torch.tensor(1e9).half()), s)  # fmt: skip
        m, s = m.double(), s.double()
        step = torch.where(s == 0, torch.ones_like(s), s)
        q = torch.clamp(torch.round((part - m) / step), 0, levels)
        out[:, :, rows, cols] = q * s + m
    return out


@pytest.mark.parametrize("bits", [8, 4])
def test_every_step_reads_what_kivi_keeps(bits: int) -> None:
    """Prefill, decode steps and a chunk: each update returns the tokens quantized so
    far as KIVI reads them back, then the full-precision window, new tokens included."""
    torch.manual_seed(bits)
    group, residual = 4, 8
    cache = QuantizedKVCache(bits, group=group, residual=residual)  # type: ignore[arg-type]
    seen_k, seen_v = torch.empty(2, 3, 0, 8).double(), torch.empty(2, 3, 0, 8).double()
    keys_q = values_q = 0  # the transcription's own counts, from KIVI's two windows
    for t in (11, 1, 1, 1, 9, 1, 2):
        k = torch.randn(2, 3, t, 8).double() * torch.linspace(0.5, 8, 8).double()  # channels
        k = k + torch.linspace(-40, 40, 8).double()  # and offsets far from their spread
        v = torch.randn(2, 3, t, 8).double()
        keys, values = cache.update(k, v)
        seen_k, seen_v = torch.cat([seen_k, k], 2), torch.cat([seen_v, v], 2)
        expected_k = torch.cat([_kivi(seen_k[:, :, :keys_q], bits, group, True),
                                seen_k[:, :, keys_q:]], 2)  # fmt: skip
        expected_v = torch.cat([_kivi(seen_v[:, :, :values_q], bits, group, False),
                                seen_v[:, :, values_q:]], 2)  # fmt: skip
        torch.testing.assert_close(keys, expected_k, atol=1e-12, rtol=0)
        torch.testing.assert_close(values, expected_v, atol=1e-12, rtol=0)
        while seen_k.shape[2] - keys_q >= residual:  # keys: whole groups of tokens
            keys_q += group
        values_q = max(seen_v.shape[2] - residual, 0)  # values: all but the last R
        assert cache.quantized == (keys_q, values_q)
        assert len(cache) == seen_k.shape[2]
    held = cache.held
    assert held is not None
    assert held[0].shape[2] - cache.quantized[0] < residual
    # What a later step reads of a quantized key: within a step of its group's range.
    spread = (seen_k.amax(2) - seen_k.amin(2)).amax() / (2**bits - 1)
    assert float((held[0] - seen_k).abs().max()) <= float(spread)


def test_the_error_is_half_a_step_per_group_and_codes_pack_two_to_a_byte() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 2, 64, 64) * torch.logspace(-1, 1, 64)  # channels of many sizes
    for bits in (8, 4):
        q = quantize(x, bits, 64, dim=2)  # type: ignore[arg-type]
        assert q.codes.shape[-1] == (64 if bits == 8 else 32)
        back = dequantize(q, bits, 64, 2, torch.float32)  # type: ignore[arg-type]
        step = q.scale.float()  # (1, 2, 1, 64): one step per channel
        # Half a step, and a little more: the float16 range is rounded before coding.
        assert bool(((back - x).abs() <= 0.6 * step + 1e-6).all())
        assert float(((back - x).abs() / step).amax()) > 0.45
    # A group far from zero next to its spread: the float16 minimum rounds down and the
    # step up, so the range still covers the group (nearest rounding clamps the top).
    offset = torch.linspace(20.003, 20.04, 64).view(1, 1, 64, 1)
    back = dequantize(quantize(offset, 8, 64, dim=2), 8, 64, 2, torch.float32)
    assert float((back - offset).abs().max()) < 0.6 * (0.037 / 255) + 2e-6
    constant = quantize(torch.full((1, 1, 4, 2), 3.0), 8, 4, dim=2)
    assert constant.codes.eq(0).all()
    back = dequantize(constant, 8, 4, 2, torch.float32)
    assert torch.equal(back, torch.full((1, 1, 4, 2), 3.0))


def test_bytes_per_token_at_2048_tokens() -> None:
    """KIVI at d = G = 64, R = 64, float32: every byte held (codes, float16 ranges, the
    64 values still in full precision) at 2,048 tokens, 0.277 and 0.154 of the float
    cache's; at 2,047 the keys' window is full too."""
    k, v = torch.randn(1, 3, 2048, 64), torch.randn(1, 3, 2048, 64)
    for bits, goal in ((8, 0.30), (4, 0.20)):
        cache, plain = QuantizedKVCache(bits), DynamicKVCache()  # type: ignore[arg-type]
        for start in range(0, 2048, 64):  # chunks of 64, as the perplexity sweep reads
            cache.update(k[:, :, start : start + 64], v[:, :, start : start + 64])
            plain.update(k[:, :, start : start + 64], v[:, :, start : start + 64])
        assert cache.quantized == (2048, 1984)
        codes, ranges, full = 64 * bits // 8, 4, 64 * 4  # per token and head, bytes
        assert cache.nbytes == 3 * (2048 * (codes + ranges) + 1984 * (codes + ranges)
                                    + 64 * full)  # fmt: skip
        assert cache.nbytes / plain.nbytes <= goal
        shorter = QuantizedKVCache(bits)  # type: ignore[arg-type]
        shorter.update(k[:, :, :2047], v[:, :, :2047])
        assert shorter.quantized == (1984, 1983)
        assert shorter.nbytes == 3 * (1984 * (codes + ranges) + 63 * full
                                      + 1983 * (codes + ranges) + 64 * full)  # fmt: skip
        assert shorter.nbytes / (plain.nbytes * 2047 / 2048) <= goal


def test_a_decoder_decodes_through_quantized_caches() -> None:
    torch.manual_seed(1)
    config = DecoderConfig(vocab_size=50, d_model=32, num_layers=2, num_heads=2,
                           num_kv_heads=1, head_dim=64, hidden_dim=48)  # fmt: skip
    model = Decoder(config).eval()
    ids = torch.randint(0, 50, (1, 90))
    caches, plain = model.make_cache(kind="int8"), model.make_cache(kind="dynamic")
    assert [type(c).__name__ for c in caches] == ["QuantizedKVCache"] * 2
    with torch.no_grad():
        for cache in (caches, plain):
            model(ids[:, :64], cache=cache)  # the first 64 keys are then quantized
        got, expected = model(ids[:, 64:], cache=caches), model(ids[:, 64:], cache=plain)
    assert caches[0].quantized == (64, 26)
    difference = float((got - expected).abs().max())
    assert 1e-4 < difference < 0.05  # read from 8 bits: close, not equal
    out = model.generate(ids[:, :70], 4, cache="int4")
    assert torch.equal(out[0, :70], ids[0, :70])
    with pytest.raises(ValueError, match="QuantizedKVCache cannot take tokens back"):
        caches[0].crop(10)


def test_bad_settings_are_refused_by_name() -> None:
    x = torch.randn(1, 1, 8, 8)
    for args, message in [
        ((x, 16, 4, 2), "bits must be 4 or 8, got 16"),
        ((x, 8, 3, 2), r"group=3 must divide x.shape\[2\]=8"),
        ((x, 8, 4, -1), r"dim must be an int in \[0, 4\) for x, got -1"),
        ((x * 1e5, 8, 4, 2), "x has values beyond float16's range"),
    ]:
        with pytest.raises(ValueError, match=message):
            quantize(*args)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"group=3 must divide the codes.shape\[2\]=8"):
        dequantize(quantize(x, 8, 4, 2), 8, 3, 2, torch.float32)
    for bits in (3, 16, True, 8.0):
        with pytest.raises(ValueError, match=f"bits must be 4 or 8, got {bits!r}"):
            QuantizedKVCache(bits)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="residual=48 must be a multiple of group=32"):
        QuantizedKVCache(8, group=32, residual=48)
    with pytest.raises(ValueError, match="group=64 must divide the value head size v_head_dim=48"):
        QuantizedKVCache(8).update(torch.randn(1, 1, 2, 48), torch.randn(1, 1, 2, 48))
    with pytest.raises(ValueError, match="head sizes must be even, got head_dim=3"):
        QuantizedKVCache(4, group=1, residual=1).update(
            torch.randn(1, 1, 2, 3), torch.randn(1, 1, 2, 4)
        )
    with pytest.raises(ValueError, match="kind must be one of"):
        Decoder(DecoderConfig(vocab_size=8, d_model=8, num_layers=1, num_heads=2,
                              num_kv_heads=1, head_dim=4, hidden_dim=8)).make_cache(kind="int2")  # type: ignore[arg-type]  # fmt: skip


def test_the_sweep_counts_every_prediction_once() -> None:
    """`perplexities` on a small random model: at a checkpoint inside the text and at
    its end, the perplexity of one pass over the tokens so far."""
    from attnlab.tools.bench.kv_quant import perplexities

    torch.manual_seed(2)
    config = DecoderConfig(vocab_size=30, d_model=16, num_layers=1, num_heads=1,
                           num_kv_heads=1, head_dim=64, hidden_dim=16)  # fmt: skip
    model = Decoder(config).double().eval()
    ids = torch.randint(0, 30, (1, 200))
    got = perplexities(model, ids, kinds=("dynamic",), chunk=64, checkpoints=(128, 200))
    with torch.no_grad():
        logp = model(ids)[0, :-1].log_softmax(-1)  # (199, vocab): predictions of 1 .. 199
        nll = -logp.gather(-1, ids[0, 1:, None])[:, 0]
    for record, n in zip(got["dynamic"], (128, 200), strict=True):
        assert record["tokens"] == n
        assert abs(record["perplexity"] - float(nll[: n - 1].mean().exp())) < 1e-9
    with pytest.raises(ValueError, match=r"multiples of chunk=64 \(or 200\), got \(100,\)"):
        perplexities(model, ids, kinds=("dynamic",), chunk=64, checkpoints=(100,))
