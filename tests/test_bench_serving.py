"""The serving benchmark's harness: what it counts and compares is right, on tiny configs.

The memory accounting against bytes computed by hand, the decode step's three paths
against SDPA on keys read token by token through the tables, and the static-batching
baseline against the engine and against one request at a time. No timing is asserted.
"""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnlab.models.config import DecoderConfig
from attnlab.models.decoder import Decoder
from attnlab.tools.bench.serving import (
    ServingSettings,
    WorkloadRequest,
    continuous_generate,
    decode_case,
    measure_decode,
    measure_memory,
    measure_throughput,
    mixed_workload,
    static_generate,
)
from attnlab.tools.bench.serving_plots import FIGURES, write_serving_plots

TINY = ServingSettings(
    contexts=(8, 24),
    batch=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=5,
    num_layers=2,
    block_size=4,
    decode_rounds=1,
    throughput_rounds=1,
    static_batch=2,
    flex=False,
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread: None) -> None:
    """Tiny models only (see conftest's `one_thread`)."""


@pytest.fixture(scope="module")
def decoder() -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(
        vocab_size=61,
        d_model=24,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=6,
        hidden_dim=40,
    )
    return Decoder(config).eval()


def test_mixed_workload_shares_a_prefix_and_keeps_the_shapes() -> None:
    shapes = [(9, 3), (7, 2), (4, 5)]
    w = mixed_workload(50, shapes=shapes, shared=5, seed=1)
    assert [(len(r.prompt), r.new_tokens) for r in w] == shapes
    assert w[0].prompt[:5] == w[1].prompt[:5]
    assert w[0].prompt[5] != w[1].prompt[5]
    assert [r.held for r in w] == [11, 8, 8]
    assert all(0 < t < 50 for r in w for t in r.prompt)
    with pytest.raises(ValueError, match="longer than shared=7"):
        mixed_workload(50, shapes=shapes, shared=7)


def test_memory_accounting_equals_bytes_by_hand() -> None:
    # 3 layers, 2 kv heads, head_dim 4, float32: 3 * 2 * (4 + 4) * 4 = 192 bytes a token.
    prefix = (1, 2, 3, 4, 5, 6, 7, 8)  # two full blocks of 4
    w = [
        WorkloadRequest((*prefix, 9), 3),  # holds 11 tokens: 3 blocks
        WorkloadRequest((*prefix, 10, 11), 2),  # 11 tokens, the first 8 shared: 1 block more
        WorkloadRequest((20,), 1),  # 1 token: 1 block
    ]
    m = measure_memory(w, num_layers=3, num_kv_heads=2, head_dim=4, block_size=4)
    per_token, block = 192, 4 * 192
    assert m["bytes_per_token"] == per_token
    assert m["blocks_used"] == 3 + 1 + 1
    assert m["paged_bytes"] == 5 * block
    # Distinct tokens: 11, then 3 after the shared 8, then 1.
    assert m["distinct_tokens"] == 11 + 3 + 1
    assert m["token_bytes"] == 15 * per_token
    # Contiguous: 3 sequences preallocated to the longest, 11 tokens.
    assert m["contiguous_bytes"] == 3 * 11 * per_token
    assert m["paged_ratio"] == pytest.approx(20 / 15)
    assert m["contiguous_ratio"] == pytest.approx(33 / 15)


def test_decode_paths_equal_sdpa_through_the_tables() -> None:
    for context in TINY.contexts:
        case = decode_case(TINY, context, seed=3)
        query, key_pool, value_pool, tables, lengths = case.arguments
        assert lengths.tolist() == [context] * TINY.batch
        # The tables are shuffled: not one run of consecutive blocks each.
        assert tables.reshape(-1).tolist() != sorted(tables.reshape(-1).tolist())
        expected = []
        for b in range(TINY.batch):
            table = tables[b].tolist()
            bs = TINY.block_size
            k = torch.stack([key_pool[:, table[p // bs], p % bs] for p in range(context)], 1)
            v = torch.stack([value_pool[:, table[p // bs], p % bs] for p in range(context)], 1)
            expected.append(F.scaled_dot_product_attention(query[b], k, v, enable_gqa=True))
        reference = torch.stack(expected)  # (b, h, 1, hd)
        for path in (case.paged, case.teaching, case.contiguous):
            torch.testing.assert_close(path(), reference)


def test_measure_decode_records_each_context() -> None:
    points = measure_decode(TINY, random.Random(0))
    assert [p["context"] for p in points] == list(TINY.contexts)
    for p in points:
        assert p["max_abs_diff"] < 1e-5
        assert min(p["ratio"], p["paged_ms"], p["contiguous_ms"]) > 0
        assert p["ratio_min"] <= p["ratio"] <= p["ratio_max"]


def test_static_baseline_makes_the_engines_tokens(decoder: Decoder) -> None:
    w = mixed_workload(61, shapes=[(9, 4), (7, 2), (3, 6), (5, 1), (4, 3)], shared=5)
    static = static_generate(decoder, w, batch=2)
    continuous = continuous_generate(decoder, w, num_blocks=24, block_size=4)
    alone = [
        decoder.generate(torch.tensor(r.prompt), r.new_tokens)[len(r.prompt) :].tolist() for r in w
    ]
    assert static == alone
    assert continuous == alone
    assert [len(t) for t in static] == [4, 2, 6, 1, 3]


def test_measure_throughput_counts_requested_tokens(decoder: Decoder) -> None:
    w = mixed_workload(61, shapes=[(9, 3), (7, 2), (3, 4)], shared=5)
    out = measure_throughput(decoder, w, TINY, random.Random(0))
    assert (out["requests"], out["new_tokens"]) == (3, 9)
    assert out["tokens_equal"]
    assert out["mismatched_requests"] == []
    # The engine gets the bytes of the static baseline's largest batch: 2 x (9 + 3 - 1).
    assert out["num_blocks"] == -(-2 * 11 // TINY.block_size)
    assert min(out["continuous_tok_s"], out["static_tok_s"]) > 0


def test_plots_are_svg(tmp_path: Path) -> None:
    decode = [
        {
            "context": c,
            "paged_ms": 1.0 * c,
            "contiguous_ms": 0.8 * c,
            "teaching_ms": 2.0 * c,
            "ratio": 1.25,
        }
        for c in (512, 2048)
    ]
    record = {
        "settings": {"batch": 4},
        "decode": decode,
        "memory": {"paged_ratio": 1.01, "contiguous_ratio": 2.0},
        "throughput": {"ratio": 2.5},
        "flex": {"points": [{"context": 512, "flex_ms": 400.0}, {"context": 2048, "flex_ms": 1e3}]},
        "goals": {"decode": {"met": True}, "memory": {"met": True}, "throughput": {"met": True}},
    }
    paths = write_serving_plots(record, tmp_path)
    assert [p.name for p in paths] == list(FIGURES)
    for p in paths:
        assert ET.parse(p).getroot().tag.endswith("svg")


def test_settings_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="batch must be a positive int"):
        ServingSettings(batch=0)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ServingSettings(num_heads=9, num_kv_heads=2)
    with pytest.raises(ValueError, match="multiples of block_size=16"):
        ServingSettings(contexts=(100,))
