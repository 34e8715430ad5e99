"""The one cache protocol: every per-layer state is a LayerCache, answers the same
questions (seen, length, mask_sizes, nbytes, reset), and a layer handed the wrong kind
says, in one message, which cache it needs.

Dimensions all differ: batch 2, d_model 12, 4 query heads, 2 key/value heads, head_dim 6,
7 tokens.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from attnlab.caches.base import LayerCache
from attnlab.caches.kv import DynamicKVCache, RollingKVCache, StaticKVCache
from attnlab.layers.gqa import GroupedQueryAttention
from attnlab.layers.linear import GatedDeltaNet
from attnlab.layers.mla import MultiHeadLatentAttention
from attnlab.layers.sparse import DeepSeekSparseAttention, LightningIndexer
from attnlab.rules.scores import ScoreRule

B, D, H, H_KV, T = 2, 12, 4, 2, 7
SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"


def _gqa(window: int | None = None) -> GroupedQueryAttention:
    return GroupedQueryAttention(D, H, H_KV, head_dim=6, scores=ScoreRule(window=window)).eval()


def _mla() -> MultiHeadLatentAttention:
    return MultiHeadLatentAttention(
        D, H, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=3
    ).eval()


def _dsa() -> DeepSeekSparseAttention:
    return DeepSeekSparseAttention(_mla(), LightningIndexer(D, 2, 4, rope_dim=2), topk=3).eval()


def _gdn() -> GatedDeltaNet:
    return GatedDeltaNet(D, num_k_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=3).eval()


# Each layer with its kind of cache, and how it runs over tokens with it.
Run = Callable[[nn.Module, Tensor, LayerCache], Tensor]
LAYERS: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], LayerCache], Run]] = {
    "dynamic": (_gqa, lambda m: DynamicKVCache(), lambda m, x, c: m(x, cache=c)),
    "static": (
        _gqa,
        lambda m: StaticKVCache(B, 16, H_KV, 6),
        lambda m, x, c: m(x, cache=c),
    ),
    "rolling": (
        lambda: _gqa(window=3),
        lambda m: RollingKVCache(3),
        lambda m, x, c: m(x, cache=c),
    ),
    "latent": (
        _mla,
        lambda m: m.new_cache(B, 16),  # type: ignore[operator]
        lambda m, x, c: m(x, cache=c, is_causal=True),
    ),
    "sparse": (
        _dsa,
        lambda m: m.new_cache(B, 16),  # type: ignore[operator]
        lambda m, x, c: m(x, cache=c),
    ),
    "linear": (_gdn, lambda m: m.new_state(B), lambda m, x, c: m(x, c)),  # type: ignore[operator]
}


@pytest.mark.parametrize("kind", list(LAYERS))
def test_every_per_layer_state_answers_the_protocol(kind: str) -> None:
    torch.manual_seed(0)
    make_layer, make_cache, run = LAYERS[kind]
    layer = make_layer()
    cache = make_cache(layer)
    assert isinstance(cache, LayerCache)
    assert (cache.seen, len(cache), cache.mask_sizes(3)[1]) == (0, 0, 0)
    x = torch.randn(B, T, D)
    with torch.no_grad():
        first = torch.cat([run(layer, x[:, :5], cache), run(layer, x[:, 5:], cache)], dim=1)
        assert cache.seen == T
        assert len(cache) == (2 if kind == "rolling" else T)  # held: the window's w - 1
        assert cache.batch_size == B
        assert cache.nbytes > 0
        cache.reset()  # forgets every token: the same outputs again
        assert cache.seen == 0
        again = torch.cat([run(layer, x[:, :5], cache), run(layer, x[:, 5:], cache)], dim=1)
    torch.testing.assert_close(again, first, atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["dynamic", "static", "rolling"])
@pytest.mark.parametrize("window", [None, 3, 6])
def test_mask_sizes_name_the_keys_the_kernel_is_given(kind: str, window: int | None) -> None:
    """The cache owns the window: the kernel gets the last `mask_sizes(t, window)[0]`
    keys, the ones the new queries see, and no older ones."""
    if kind == "rolling" and window is None:
        return  # refused: a global layer on a rolling cache (tested below)
    cache = {
        "dynamic": DynamicKVCache(),
        "static": StaticKVCache(1, 16, 1, 2),
        "rolling": RollingKVCache(6),
    }[kind]
    fed: list[Tensor] = []
    for t in (5, 1, 3, 1):
        k = torch.randn(1, 1, t, 2)
        fed.append(k)
        kv_length, kv_offset = cache.mask_sizes(t, window)
        seen: list[Tensor] = []

        def kernel(q: Tensor, keys: Tensor, values: Tensor, seen: list[Tensor] = seen) -> Tensor:
            seen.append(keys)
            return q

        cache.attend(torch.randn(1, 1, t, 2), k, k, kernel, window=window)
        every = torch.cat(fed, dim=2)  # (1, 1, seen + t, 2)
        assert kv_offset + kv_length == every.shape[2]
        expected = every.shape[2] if window is None else min(every.shape[2], t + window - 1)
        assert kv_length == expected
        torch.testing.assert_close(seen[0], every[:, :, kv_offset:], atol=0, rtol=0)


def test_a_rolling_cache_refuses_a_layer_that_sees_more() -> None:
    x = torch.randn(B, 2, D)
    _gqa(window=3)(x, cache=RollingKVCache(4))  # a narrower window fits
    for window, sees in ((None, "every token"), (5, "5 tokens")):
        with pytest.raises(
            ValueError,
            match=re.escape(
                f"cache is a RollingKVCache(window=4) but GroupedQueryAttention sees {sees}: "
                "it would lose keys the layer attends to"
            ),
        ):
            _gqa(window)(x, cache=RollingKVCache(4))


WRONG: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], object], Run, str]] = {
    "gqa given a linear state": (
        _gqa,
        lambda m: _gdn().new_state(B),
        lambda m, x, c: m(x, cache=c),
        r"cache must be an attnlab KVCache for GroupedQueryAttention's keys and values "
        r"\(DynamicKVCache, StaticKVCache or RollingKVCache\) or None, "
        r"got GatedDeltaNetState\(batch_size=2, seen=0\)",
    ),
    "mla given a gqa cache": (
        _mla,
        lambda m: StaticKVCache(B, 16, H_KV, 4, v_head_dim=2),
        lambda m, x, c: m(x, cache=c),
        r"cache must be MultiHeadLatentAttention's latent cache from new_cache \(one head of "
        r"kv_lora_rank=4 latent and qk_rope_head_dim=2 RoPE features per token\) or None, "
        r"got StaticKVCache\(length=0, max_length=16, batch_size=2, num_kv_heads=2",
    ),
    "mla given a filled gqa cache": (
        _mla,
        lambda m: _filled_gqa_cache(),
        lambda m, x, c: m(x, cache=c),
        r"cache must be MultiHeadLatentAttention's latent cache .* got DynamicKVCache\(length=3",
    ),
    "dsa given mla's cache": (
        _dsa,
        lambda m: m.mla.new_cache(B, 16),  # type: ignore[operator, union-attr]
        lambda m, x, c: m(x, cache=c),
        r"cache must be a SparseAttentionCache \(see new_cache\) for DeepSeekSparseAttention "
        r"or None, got StaticKVCache",
    ),
    "gated deltanet given a kv cache": (
        _gdn,
        lambda m: DynamicKVCache(),
        lambda m, x, c: m(x, c),
        r"state must be a GatedDeltaNetState \(GatedDeltaNet is linear attention: it carries "
        r"a state, not keys and values; make one with new_state or Decoder.make_cache\), "
        r"got DynamicKVCache\(empty\)",
    ),
}


def _filled_gqa_cache() -> DynamicKVCache:
    cache = DynamicKVCache()
    cache.update(torch.randn(B, H_KV, 3, 6), torch.randn(B, H_KV, 3, 6))
    return cache


@pytest.mark.parametrize("case", list(WRONG))
def test_a_wrong_cache_gets_one_message_naming_the_layers_kind(case: str) -> None:
    make_layer, make_cache, run, message = WRONG[case]
    layer = make_layer()
    cache = make_cache(layer)
    with pytest.raises(TypeError, match=message):
        run(layer, torch.randn(B, 3, D), cache)  # type: ignore[arg-type]
    if isinstance(cache, LayerCache):
        assert cache.seen == (3 if case == "mla given a filled gqa cache" else 0)


def test_models_layers_and_serving_switch_on_no_cache_type() -> None:
    """Only the protocol's own check (`LayerCache.check`, in `caches/`) tests a cache's
    class; the decoder, the layers and the engine ask the protocol."""
    names = r"\w*Cache\w*|GatedDeltaNetState|_PagedLayer"
    pattern = re.compile(rf"isinstance\([^)]*\b({names})\b")
    found = [
        f"{path.relative_to(SRC)}:{n}: {line.strip()}"
        for folder in ("models", "layers", "serving")
        for path in sorted((SRC / folder).glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
