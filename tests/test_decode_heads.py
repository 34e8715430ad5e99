"""The decode benchmark of MHA, GQA, MQA and MLA: what it times is real decoding."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from attnlab.caches.kv import StaticKVCache, kv_cache_bytes_per_token
from attnlab.layers.gqa import GroupedQueryAttention
from attnlab.layers.mla import MultiHeadLatentAttention
from attnlab.tools.bench import decode_heads
from attnlab.tools.bench.decode_heads import (
    IMPLS,
    DecodeShape,
    absorbed_kernel,
    decode_steps,
    measure_decode_heads,
)

TINY = DecodeShape(
    d_model=40,
    num_heads=4,
    head_dim=6,
    gqa_kv_heads=2,
    kv_lora_rank=10,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=6,
    batch_size=2,
    contexts=(5, 9),
    steps=3,
    prompt=7,
)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.mark.parametrize("name", IMPLS)
def test_decode_steps_equal_a_full_forward_after_a_real_prefill(name: str) -> None:
    # The benchmark fills its caches with random numbers; here the same layers and
    # decode loop run after a real prefill, and must reproduce the uncached forward.
    layer = decode_heads._layers(TINY)[name]
    x = torch.randn(TINY.batch_size, 8 + TINY.steps, TINY.d_model)
    with torch.no_grad():
        if isinstance(layer, MultiHeadLatentAttention):
            cache = layer.new_cache(TINY.batch_size, x.shape[1])
        else:
            assert isinstance(layer, GroupedQueryAttention)
            cache = StaticKVCache(TINY.batch_size, x.shape[1], layer.num_kv_heads, TINY.head_dim)
        if isinstance(layer, MultiHeadLatentAttention):
            layer(x[:, :8], cache=cache, is_causal=True)
            full = layer(x, is_causal=True)
        else:
            layer(x[:, :8], cache=cache)
            full = layer(x)
        steps = decode_steps(name, layer, cache, x[:, 8:])
    torch.testing.assert_close(steps, full[:, 8:], rtol=0, atol=1e-5)


def test_absorbed_kernel_folded_heads_equal_enable_gqa() -> None:
    q = torch.randn(2, 5, 1, 7)  # (b, h, 1, d): one decoded token, 5 heads
    k = torch.randn(2, 1, 11, 7)  # (b, 1, s, d): one shared head
    v = torch.randn(2, 1, 11, 3)
    folded = absorbed_kernel(q, k, v, fold_heads=True)
    reference = torch.nn.functional.scaled_dot_product_attention(
        q, k.expand(2, 5, 11, 7), v.expand(2, 5, 11, 3)
    )
    torch.testing.assert_close(folded, reference)
    torch.testing.assert_close(absorbed_kernel(q, k, v, fold_heads=False), reference)


def test_measure_reports_every_layer_with_real_cache_sizes(tmp_path: Path) -> None:
    data = measure_decode_heads(TINY, rounds=1)
    f32 = torch.float32
    gqa = {"MHA": TINY.num_heads, "GQA": TINY.gqa_kv_heads, "MQA": 1}
    for name, kv_heads in gqa.items():
        expected = kv_cache_bytes_per_token(
            num_layers=1, num_kv_heads=kv_heads, head_dim=TINY.head_dim, dtype=f32
        )
        assert data["cache_bytes_per_token"][name] == expected
    latent = (TINY.kv_lora_rank + TINY.qk_rope_head_dim) * 4
    assert data["cache_bytes_per_token"]["MLA naive"] == latent
    assert data["cache_bytes_per_token"]["MLA absorbed"] == latent
    assert list(data["decode"]) == [str(c) for c in TINY.contexts]
    for row in data["decode"].values():
        assert list(row) == list(IMPLS)
        assert row["MHA"]["ratio"] == 1.0
        for stats in row.values():
            assert 0 < stats["min"] <= stats["median"] <= stats["max"]
    assert data["prompt"]["MLA naive"]["ratio"] == 1.0
    assert data["absorbed_kernel"]["context"] == max(TINY.contexts)
    assert data["provenance"]["rounds"] == 1
    json.dumps(data)  # JSON-ready


def test_measure_refuses_zero_rounds() -> None:
    with pytest.raises(ValueError, match="rounds must be at least 1, got 0"):
        measure_decode_heads(TINY, rounds=0)


def test_committed_result_matches_the_module() -> None:
    # The page reads this file: it must have every layer and the default shape.
    path = Path(__file__).parents[1] / "docs/assets/bench/decode_heads.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    shape = DecodeShape()
    assert data["shape"]["num_heads"] == shape.num_heads
    for row in data["decode"].values():
        assert list(row) == list(IMPLS)
    f32 = torch.float32
    gqa = {"MHA": shape.num_heads, "GQA": shape.gqa_kv_heads, "MQA": 1}
    for name, kv_heads in gqa.items():  # the bytes the pages print beside the times
        expected = kv_cache_bytes_per_token(
            num_layers=1, num_kv_heads=kv_heads, head_dim=shape.head_dim, dtype=f32
        )
        assert data["cache_bytes_per_token"][name] == expected
    latent = (shape.kv_lora_rank + shape.qk_rope_head_dim) * 4
    assert data["cache_bytes_per_token"]["MLA absorbed"] == latent


def test_main_records_the_command_line_it_parsed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Called without argv, main() parses sys.argv and records those arguments too (it
    used to record none)."""

    def measured(*, rounds: int, seed: int, command: str) -> dict[str, object]:
        return {"rounds": rounds, "seed": seed, "command": command}

    monkeypatch.setattr(decode_heads, "measure_decode_heads", measured)
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)  # the session's
    monkeypatch.setattr(sys, "argv", ["decode_heads", "--rounds", "2", "--seed", "5"])
    assert decode_heads.main() == 0
    assert json.loads(capsys.readouterr().out) == {
        "rounds": 2,
        "seed": 5,
        "command": "python -m attnlab.tools.bench.decode_heads --rounds 2 --seed 5",
    }
