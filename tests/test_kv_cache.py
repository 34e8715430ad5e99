"""KV caches: what update returns equals the concatenation of everything fed in, nbytes
equals kv_cache_bytes_per_token's arithmetic, and bad input raises with a clear message.

Dimensions all differ: batch 3, 2 key/value heads, head_dim 5, v_head_dim 7, 11 tokens.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import Tensor

from attnlab import validation
from attnlab.caches.kv import (
    CacheLayout,
    DynamicKVCache,
    KVCache,
    StaticKVCache,
    kv_cache_bytes_per_token,
)

B, H_KV, HD, HD_V, MAX = 3, 2, 5, 7, 11
CHUNKS = [4, 1, 2, 1, 3]  # prefill 4 tokens, then decode steps; 11 in all


def _make(kind: str, dtype: torch.dtype = torch.float32) -> KVCache:
    if kind == "dynamic":
        return DynamicKVCache()
    return StaticKVCache(B, MAX, H_KV, HD, v_head_dim=HD_V, dtype=dtype)


def _chunks(dtype: torch.dtype = torch.float32) -> list[tuple[Tensor, Tensor]]:
    return [
        (torch.randn(B, H_KV, n, HD, dtype=dtype), torch.randn(B, H_KV, n, HD_V, dtype=dtype))
        for n in CHUNKS
    ]


# -- bytes per token ---------------------------------------------------------------------


def test_bytes_per_token_llama3_8b_shape() -> None:
    # 32 layers x 8 KV heads x (128 + 128) features x 2 bytes = 131072 bytes = 128 KiB.
    got = kv_cache_bytes_per_token(
        num_layers=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16
    )
    assert got == 131072
    mha = kv_cache_bytes_per_token(
        num_layers=32, num_kv_heads=32, head_dim=128, dtype=torch.float32
    )
    assert mha == 32 * 32 * 256 * 4


def test_bytes_per_token_separate_value_size() -> None:
    got = kv_cache_bytes_per_token(
        num_layers=3, num_kv_heads=2, head_dim=5, v_head_dim=7, dtype=torch.float16
    )
    assert got == 3 * 2 * (5 + 7) * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_bytes_per_token_equals_nbytes_of_real_caches(dtype: torch.dtype) -> None:
    per_layer = kv_cache_bytes_per_token(
        num_layers=1, num_kv_heads=H_KV, head_dim=HD, v_head_dim=HD_V, dtype=dtype
    )
    static = StaticKVCache(B, MAX, H_KV, HD, v_head_dim=HD_V, dtype=dtype)
    assert static.nbytes == per_layer * B * MAX  # allocated in full, before any update
    dynamic = DynamicKVCache()
    for k, v in _chunks(dtype):
        dynamic.update(k, v)
        static.update(k, v)
    assert dynamic.nbytes == per_layer * B * dynamic.length
    assert static.nbytes == per_layer * B * MAX


def test_bytes_per_token_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_kv_heads must be a positive int, got 0"):
        kv_cache_bytes_per_token(num_layers=2, num_kv_heads=0, head_dim=4, dtype=torch.float32)
    with pytest.raises(TypeError, match=re.escape("dtype must be a torch.dtype, got 'bf16'")):
        kv_cache_bytes_per_token(num_layers=2, num_kv_heads=1, head_dim=4, dtype="bf16")  # type: ignore[arg-type]


# -- contents ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_update_returns_everything_fed_in(kind: str) -> None:
    cache = _make(kind)
    chunks = _chunks()
    for i, (k, v) in enumerate(chunks):
        keys, values = cache.update(k, v)
        expected_k = torch.cat([c[0] for c in chunks[: i + 1]], dim=2)
        expected_v = torch.cat([c[1] for c in chunks[: i + 1]], dim=2)
        assert torch.equal(keys, expected_k)
        assert torch.equal(values, expected_v)
        assert cache.length == len(cache) == expected_k.shape[2]


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_reset_forgets_tokens(kind: str) -> None:
    cache = _make(kind)
    for k, v in _chunks():
        cache.update(k, v)
    nbytes = cache.nbytes
    cache.reset()
    assert cache.length == 0
    if kind == "static":
        assert cache.nbytes == nbytes  # the buffers stay
    else:
        assert cache.nbytes == 0
    k, v = torch.randn(B, H_KV, 2, HD), torch.randn(B, H_KV, 2, HD_V)
    keys, values = cache.update(k, v)
    assert torch.equal(keys, k)
    assert torch.equal(values, v)


def test_dynamic_cache_accepts_a_new_layout_after_reset() -> None:
    cache = DynamicKVCache()
    cache.update(torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4))
    cache.reset()
    k, v = torch.randn(5, 2, 1, 6), torch.randn(5, 2, 1, 7)
    keys, values = cache.update(k, v)
    assert torch.equal(keys, k)
    assert torch.equal(values, v)
    assert cache.layout == CacheLayout(5, 2, 6, 7, torch.float32, torch.device("cpu"))


def test_static_cache_writes_in_place() -> None:
    cache = StaticKVCache(B, MAX, H_KV, HD, v_head_dim=HD_V)
    k1, k2 = torch.randn(B, H_KV, 2, HD), torch.randn(B, H_KV, 1, HD)
    first, _ = cache.update(k1, torch.randn(B, H_KV, 2, HD_V))
    second, _ = cache.update(k2, torch.randn(B, H_KV, 1, HD_V))
    assert first.data_ptr() == second.data_ptr()  # views of one preallocated buffer
    assert torch.equal(second, torch.cat([k1, k2], dim=2))


def test_gradients_flow_through_the_dynamic_cache() -> None:
    cache = DynamicKVCache()
    k1 = torch.randn(B, H_KV, 2, HD, requires_grad=True)
    k2 = torch.randn(B, H_KV, 1, HD, requires_grad=True)
    cache.update(k1, torch.randn(B, H_KV, 2, HD))
    keys, _ = cache.update(k2, torch.randn(B, H_KV, 1, HD))
    weights = torch.arange(keys.numel(), dtype=torch.float32).view_as(keys)
    (keys * weights).sum().backward()
    assert k1.grad is not None
    assert k2.grad is not None
    assert torch.equal(k1.grad, weights[:, :, :2])
    assert torch.equal(k2.grad, weights[:, :, 2:])


def test_repr_names_the_layout() -> None:
    assert repr(DynamicKVCache()) == "DynamicKVCache(empty)"
    static = StaticKVCache(1, 8, 2, 4)
    assert repr(static) == (
        "StaticKVCache(length=0, max_length=8, batch_size=1, num_kv_heads=2, head_dim=4, "
        "v_head_dim=4, dtype=torch.float32)"
    )
    dynamic = DynamicKVCache()
    dynamic.update(torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 6))
    assert repr(dynamic) == (
        "DynamicKVCache(length=5, batch_size=2, num_kv_heads=3, head_dim=4, v_head_dim=6, "
        "dtype=torch.float32)"
    )


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_layout_is_a_named_tuple_of_what_the_cache_holds(kind: str) -> None:
    cache = _make(kind, torch.float64)
    if kind == "dynamic":
        assert cache.layout is None  # anything goes until the first update
    k, v = _chunks(torch.float64)[0]
    cache.update(k, v)
    expected = CacheLayout(B, H_KV, HD, HD_V, torch.float64, torch.device("cpu"))
    assert cache.layout == expected
    assert cache.layout is not None
    assert cache.layout.v_head_dim == HD_V
    assert tuple(cache.layout) == (B, H_KV, HD, HD_V, torch.float64, torch.device("cpu"))


# -- bad input ---------------------------------------------------------------------------


def _filled(kind: str) -> KVCache:
    cache = _make(kind)
    k, v = _chunks()[0]
    cache.update(k, v)
    return cache


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize(
    ("key_shape", "value_shape", "message"),
    [
        ((2, H_KV, 1, HD), (2, H_KV, 1, HD_V), "key has batch size 2 but the cache holds 3"),
        (
            (B, 4, 1, HD),
            (B, 4, 1, HD_V),
            r"key has num_kv_heads=4 but the cache holds num_kv_heads=2",
        ),
        ((B, H_KV, 1, 6), (B, H_KV, 1, HD_V), "key has head_dim=6 but the cache holds head_dim=5"),
        (
            (B, H_KV, 1, HD),
            (B, H_KV, 1, 3),
            "value has v_head_dim=3 but the cache holds v_head_dim=7",
        ),
        (
            (B, H_KV, 1, HD),
            (B, H_KV, 2, HD_V),
            r"key and value must agree in \(b, num_kv_heads, t_new\)",
        ),
        (
            (B, 1, HD),
            (B, 1, HD_V),
            r"key must have 4 dimensions \(b, num_kv_heads, t_new, head_dim\), got 3",
        ),
    ],
)
def test_update_rejects_mismatched_shapes(
    kind: str, key_shape: tuple[int, ...], value_shape: tuple[int, ...], message: str
) -> None:
    cache = _filled(kind)
    with pytest.raises(ValueError, match=message):
        cache.update(torch.randn(key_shape), torch.randn(value_shape))
    assert cache.length == CHUNKS[0]  # nothing was written


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_update_rejects_dtype_and_device_mismatch(kind: str) -> None:
    cache = _filled(kind)
    k, v = torch.randn(B, H_KV, 1, HD), torch.randn(B, H_KV, 1, HD_V)
    with pytest.raises(
        ValueError, match=re.escape("key has dtype torch.float64 but the cache holds torch.float32")
    ):
        cache.update(k.double(), v.double())
    with pytest.raises(ValueError, match="key is on meta but the cache is on cpu"):
        cache.update(k.to("meta"), v.to("meta"))
    with pytest.raises(
        ValueError, match=r"value has dtype torch\.float64 but key has dtype torch\.float32"
    ):
        cache.update(k, v.double())


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_update_rejects_non_float_tensors(kind: str) -> None:
    cache = _make(kind)
    with pytest.raises(TypeError, match=re.escape("key must be a torch.Tensor, got list")):
        cache.update([1.0], torch.randn(B, H_KV, 1, HD_V))  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=re.escape("value must have a floating-point dtype, got torch.int64")
    ):
        cache.update(torch.randn(B, H_KV, 1, HD), torch.ones(B, H_KV, 1, HD_V, dtype=torch.long))


def test_static_cache_overflow_names_the_room_left() -> None:
    cache = StaticKVCache(B, 5, H_KV, HD)
    cache.update(torch.randn(B, H_KV, 4, HD), torch.randn(B, H_KV, 4, HD))
    message = (
        r"key has t_new=2 tokens but the static cache has room for max_length - length = "
        r"5 - 4 = 1; build it with a larger max_length"
    )
    with pytest.raises(ValueError, match=message):
        cache.update(torch.randn(B, H_KV, 2, HD), torch.randn(B, H_KV, 2, HD))
    with validation(False), pytest.raises(ValueError, match=message):  # checked even then
        cache.update(torch.randn(B, H_KV, 2, HD), torch.randn(B, H_KV, 2, HD))
    assert cache.length == 4


def test_validation_off_skips_the_checks_but_gives_the_same_values() -> None:
    chunks = _chunks()
    on, off = DynamicKVCache(), DynamicKVCache()
    for k, v in chunks:
        expected = on.update(k, v)
        with validation(False):
            got = off.update(k, v)
        assert torch.equal(got[0], expected[0])
        assert torch.equal(got[1], expected[1])
    # With validation off, a mismatch is no longer caught by attnlab, but by torch.cat.
    with validation(False), pytest.raises(RuntimeError):
        off.update(torch.randn(2, H_KV, 1, HD), torch.randn(2, H_KV, 1, HD_V))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"batch_size": 0}, ValueError, "batch_size must be a positive int, got 0"),
        ({"max_length": 2.5}, TypeError, r"max_length must be a positive int, got 2.5 \(float\)"),
        ({"v_head_dim": -1}, ValueError, "v_head_dim must be a positive int, got -1"),
        (
            {"dtype": torch.int32},
            TypeError,
            "dtype must be a floating-point torch.dtype, got torch.int32",
        ),
        ({"device": "nowhere"}, ValueError, "device must name a device such as 'cpu'"),
    ],
)
def test_static_cache_rejects_bad_configuration(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    args: dict[str, object] = {
        "batch_size": B,
        "max_length": MAX,
        "num_kv_heads": H_KV,
        "head_dim": HD,
    }
    args.update(kwargs)
    with pytest.raises(error, match=message):
        StaticKVCache(**args)  # type: ignore[arg-type]
