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
    channels of one token); ranges rounded to float16, codes rounded half to even."""
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
        m, s = low.half().double(), ((high - low) / levels).half().double()
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
    quantized = 0  # the transcription's own count: quantize whole groups while >= residual
    for t in (11, 1, 1, 1, 9, 1, 2):
        k = torch.randn(2, 3, t, 8).double() * torch.linspace(0.5, 8, 8).double()  # channels
        v = torch.randn(2, 3, t, 8).double()
        keys, values = cache.update(k, v)
        seen_k, seen_v = torch.cat([seen_k, k], 2), torch.cat([seen_v, v], 2)
        expected_k = torch.cat([_kivi(seen_k[:, :, :quantized], bits, group, True),
                                seen_k[:, :, quantized:]], 2)  # fmt: skip
        expected_v = torch.cat([_kivi(seen_v[:, :, :quantized], bits, group, False),
                                seen_v[:, :, quantized:]], 2)  # fmt: skip
        torch.testing.assert_close(keys, expected_k, atol=1e-12, rtol=0)
        torch.testing.assert_close(values, expected_v, atol=1e-12, rtol=0)
        while seen_k.shape[2] - quantized >= residual:
            quantized += group
        assert cache.quantized == quantized
        assert len(cache) == seen_k.shape[2]
    held = cache.held
    assert held is not None
    assert held[0].shape[2] - cache.quantized < residual
    # What a later step reads of the quantized keys: within half a step of the truth.
    scale = (seen_k.amax() - seen_k.amin()) / (2**bits - 1)
    assert float((held[0] - seen_k).abs().max()) <= float(scale) / 2 + 1e-3


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
    constant = quantize(torch.full((1, 1, 4, 2), 3.0), 8, 4, dim=2)
    assert constant.codes.eq(0).all()
    back = dequantize(constant, 8, 4, 2, torch.float32)
    assert torch.equal(back, torch.full((1, 1, 4, 2), 3.0))


def test_bytes_per_token_at_2048_tokens() -> None:
    """KIVI at d = G = 64, window 64, float32: 136 and 72 bytes per token and head
    against 512 (0.266 and 0.141 of the float cache)."""
    k, v = torch.randn(1, 3, 2048, 64), torch.randn(1, 3, 2048, 64)
    ratios = {}
    for bits in (8, 4):
        cache, plain = QuantizedKVCache(bits), DynamicKVCache()  # type: ignore[arg-type]
        for start in range(0, 2048, 64):  # chunks of 64, as the perplexity sweep reads
            cache.update(k[:, :, start : start + 64], v[:, :, start : start + 64])
            plain.update(k[:, :, start : start + 64], v[:, :, start : start + 64])
        assert cache.quantized == 2048
        ratios[bits] = cache.nbytes / plain.nbytes
        assert cache.nbytes == 3 * 2048 * (2 * 64 * bits // 8 + 8)
    assert ratios[8] <= 0.30
    assert ratios[4] <= 0.20


def test_a_decoder_decodes_through_quantized_caches() -> None:
    torch.manual_seed(1)
    config = DecoderConfig(vocab_size=50, d_model=32, num_layers=2, num_heads=2,
                           num_kv_heads=1, head_dim=64, hidden_dim=48)  # fmt: skip
    model = Decoder(config).eval()
    ids = torch.randint(0, 50, (1, 90))
    caches = model.make_cache(kind="int8")
    assert [type(c).__name__ for c in caches] == ["QuantizedKVCache"] * 2
    with torch.no_grad():
        full = model(ids)  # no cache: every key in float32
        chunked = torch.cat([model(ids[:, i : i + 30], cache=caches) for i in (0, 30, 60)], 1)
    assert caches[0].quantized == 64
    difference = float((chunked - full).abs().max())
    assert 0 < difference < 0.05  # read from 8 bits: close, not equal
    out = model.generate(ids[:, :70], 4, cache="int4")
    assert out.shape == (1, 74)


def test_bad_settings_are_refused_by_name() -> None:
    for bits in (3, 16, True):
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
