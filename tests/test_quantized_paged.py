"""KIVI in a paged cache (attnlab.serving.quantized): full blocks in 8 or 4 bits, each
layer's part quantized when it fills, held to a float64 transcription of KIVI through
forks, copy-on-write and sequences of different lengths."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.serving.cache import PagedKVCache
from attnlab.serving.quantized import QuantizedPagedKVCache
from test_quantized_cache import _kivi

KV, HD, BS, GROUP = 2, 8, 4, 4


def _expected(keys: Tensor, values: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    """What attention must read of one sequence's `(kv, n, d)` keys and values: every
    full block quantized KIVI's way in float64, the open one as it came."""
    full = keys.shape[1] // BS * BS
    k, v = keys.double().clone(), values.double().clone()
    for start in range(0, full, BS):
        part = slice(start, start + BS)
        k[:, part] = _kivi(keys[None, :, part], bits, BS, per_channel=True)[0]
        v[:, part] = _kivi(values[None, :, part], bits, GROUP, per_channel=False)[0]
    return k, v


@pytest.mark.parametrize("bits", [8, 4])
def test_paged_kivi_reads_what_kivi_keeps(bits: int) -> None:
    torch.manual_seed(0)
    cache = QuantizedPagedKVCache(bits=bits, group=GROUP, num_layers=2, num_blocks=16,
                                  block_size=BS, num_kv_heads=KV, head_dim=HD)  # fmt: skip
    text: dict[int, tuple[Tensor, Tensor]] = {}
    a, _ = cache.add_sequence()
    b, _ = cache.add_sequence()
    for seq, chunks in ((a, (5, 3, 1)), (b, (2, 4))):
        keys, values = torch.randn(KV, sum(chunks), HD), torch.randn(KV, sum(chunks), HD)
        keys[:, :, 3] *= 20  # an outlier channel, as real keys have
        text[seq] = (keys, values)
        start = 0
        for n in chunks:  # layer 0 runs ahead of layer 1, as a model writes
            for layer in (0, 1):
                cache.append(seq, layer, keys[:, start : start + n], values[:, start : start + n])
            start += n
    fork = cache.fork(a)  # shares a's open block (9 tokens: one in block 2)
    more = torch.randn(KV, 4, HD), torch.randn(KV, 4, HD)
    for layer in (0, 1):
        cache.append(fork, layer, *more)  # copy-on-write of the open block, then a full one
    text[fork] = (torch.cat([text[a][0], more[0]], 1), torch.cat([text[a][1], more[1]], 1))
    assert cache.quantized_blocks(1) == sorted(
        set(cache.block_table(a)[:2] + cache.block_table(b)[:1] + cache.block_table(fork)[:3])
    )
    seqs = [a, b, fork]
    query = torch.randn(3, 2 * KV, 1, HD)  # the last token of each, two query heads per kv
    for layer in (0, 1):
        out = cache.attend(layer, query, seqs)
        for row, seq in enumerate(seqs):
            k, v = _expected(*text[seq], bits)
            want = F.scaled_dot_product_attention(query[row].double(), k, v, enable_gqa=True)
            torch.testing.assert_close(out[row].double(), want, atol=1e-5, rtol=1e-5)
    # Mid-model: layer 0 fills b's open block before layer 1 writes its part of it.
    extra = torch.randn(KV, 2, HD), torch.randn(KV, 2, HD)
    cache.append(b, 0, *extra)
    grown = (torch.cat([text[b][0], extra[0]], 1), torch.cat([text[b][1], extra[1]], 1))
    for layer, held in ((0, grown), (1, text[b])):  # 8 tokens in layer 0, 6 in layer 1
        out = cache.attend(layer, query[1:2], [b])
        k, v = _expected(*held, bits)
        want = F.scaled_dot_product_attention(query[1].double(), k, v, enable_gqa=True)
        torch.testing.assert_close(out[0].double(), want, atol=1e-5, rtol=1e-5)
    free = cache.num_free_blocks
    cache.free(fork)
    assert cache.num_free_blocks == free + 2  # its copy of the open block and its own


def test_paged_kivi_bytes_per_token() -> None:
    """SmolLM2's cache geometry (3 key/value heads of 64 features), blocks of 16, 2,048
    tokens held: 8 bits take at most 0.30 of the float32 bytes, 4 bits at most 0.20,
    ranges counted."""
    sizes = {"num_layers": 1, "num_blocks": 128, "block_size": 16, "num_kv_heads": 3,
             "head_dim": 64}  # fmt: skip
    full = PagedKVCache(**sizes).nbytes  # type: ignore[arg-type]
    ratios = {}
    for bits in (8, 4):
        cache = QuantizedPagedKVCache(bits=bits, **sizes)  # type: ignore[arg-type]
        seq, _ = cache.add_sequence()
        cache.append(seq, 0, torch.randn(3, 2048, 64), torch.randn(3, 2048, 64))
        ratios[bits] = cache.nbytes / full
    assert ratios[8] <= 0.30
    assert ratios[4] <= 0.20
    assert ratios == {8: pytest.approx(148 / 512), 4: pytest.approx(84 / 512)}


def test_paged_kivi_refuses_what_it_cannot_do() -> None:
    sizes = {"num_layers": 1, "num_blocks": 4, "block_size": 4, "num_kv_heads": 1,
             "head_dim": 8}  # fmt: skip
    with pytest.raises(ValueError, match="bits must be 4 or 8, got 3"):
        QuantizedPagedKVCache(bits=3, **sizes)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group=64 must divide the value head size"):
        QuantizedPagedKVCache(bits=8, **sizes)  # type: ignore[arg-type]
    cache = QuantizedPagedKVCache(bits=8, group=4, **sizes)  # type: ignore[arg-type]
    seq, _ = cache.add_sequence()
    cache.append(seq, 0, torch.randn(1, 10, 8), torch.randn(1, 10, 8))
    with pytest.raises(ValueError, match="falls inside block 1, already quantized"):
        cache.truncate(seq, 6)
    cache.truncate(seq, 9)  # into the open block: fine
    cache.truncate(seq, 4)  # to a block boundary: block 1 and the open one go
    assert cache.block_table(seq) == [0]
    assert cache.num_free_blocks == 3
