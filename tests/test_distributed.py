"""attnlab.distributed: ring attention across processes equals single-process attention.

The reference is `torch.nn.functional.scaled_dot_product_attention` on the whole
sequence, in the parent process: outputs and the gradients of query, key and value,
which each rank returns for its own shard and the parent puts back together. Ranks are
real processes (gloo over TCP on 127.0.0.1). Starting a process costs seconds (it
imports torch), so one spawn of 4 ranks runs every case, each on a subgroup of 1, 2, 3
or 4 ranks, and then lists the sockets the world listens on; the lengths (13 and 11)
are divisible neither by the group sizes nor by the zigzag's 2P chunks, and batch 2,
heads 3, E 8, Ev 5 all differ. Sliding windows run in the same world, with windows
narrower than a shard (so that the ring stops early and the gradients take the shortcut
home) and wider than one (a window edge inside a zigzag pair of chunks). What one process
can check (a group of one rank, made in this process by `_process_group.one_rank_group`,
the helper the shared registry of entry points uses too) is checked without spawning.
"""

from __future__ import annotations

import importlib
import ipaddress
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist

from attnlab.distributed import (
    RingStats,
    ring_attention,
    shard_ranges,
    shard_sequence,
    spawn,
    unshard_sequence,
)
from attnlab.functional.flash import merge_partials
from attnlab.rules.masks import sliding_window

sys.path.insert(0, str(Path(__file__).parent))  # the shared helper, tests/_process_group.py
from _process_group import one_rank_group

TorchSDPA = torch.nn.functional.scaled_dot_product_attention
TOL = {"rtol": 1e-5, "atol": 1e-5}
WORLD = 4
GROUPS = [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [1, 3]]
LAYOUTS = ["contiguous", "zigzag"]


def _inputs(t: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(2, 3, t, 8), (2, 3, t, 8), (2, 3, t, 5), (2, 3, t, 5)]
    return [torch.randn(s, generator=g) for s in shapes]


def _ring_cases() -> list[dict[str, Any]]:
    cases = []
    for ranks in GROUPS:
        for is_causal in (False, True):
            for layout in LAYOUTS:
                t = 11 if len(ranks) == 4 and layout == "zigzag" else 13
                cases.append(
                    {
                        "ranks": ranks,
                        "inputs": _inputs(t, len(cases)),
                        "kwargs": {"is_causal": is_causal, "layout": layout, "block_size": 4},
                    }
                )
    return cases


# Sliding windows: (ranks, layout, window, T). 13 positions over 4 contiguous ranks are
# shards of 4, 3, 3, 3: a window of 3 needs only the previous rank's block (2 of 4 steps),
# a window of 5 over 3 ranks (5, 4, 4) too; zigzag's second chunk always needs the next
# rank's block, the last of the ring, so zigzag keeps every step.
WINDOWS = [
    ([0, 1, 2, 3], "contiguous", 3, 13),
    ([0, 1, 2], "contiguous", 5, 13),
    ([0, 1, 2, 3], "zigzag", 3, 11),
    ([1, 3], "zigzag", 6, 13),
]
RING = [
    *_ring_cases(),
    # the default group (group=None) of all 4 ranks
    {
        "ranks": [0, 1, 2, 3],
        "default_group": True,
        "inputs": _inputs(13, 50),
        "kwargs": {"is_causal": True, "layout": "zigzag", "block_size": 4},
    },
    *(
        {
            "ranks": ranks,
            "inputs": _inputs(t, 60 + i),
            # a window implies is_causal: the first case leaves it at its default, False
            "kwargs": {"is_causal": i > 0, "window": w, "layout": layout, "block_size": 2},
        }
        for i, (ranks, layout, w, t) in enumerate(WINDOWS)
    ),
]
# Work per rank: causal, T = 32 over 4 ranks, so that every zigzag chunk has 4 positions.
BALANCE = [
    {
        "ranks": [0, 1, 2, 3],
        "inputs": _inputs(32, 100 + i),
        "kwargs": {"is_causal": True, "layout": layout},
    }
    for i, layout in enumerate(LAYOUTS)
]
LOW = [
    # bfloat16 inputs, and float32 inputs under torch.autocast(bfloat16)
    {
        "ranks": [0, 1, 2],
        "inputs": [x.bfloat16() for x in _inputs(13, 200)],
        "kwargs": {"is_causal": True, "layout": "zigzag"},
    },
    {
        "ranks": [0, 1, 2],
        "inputs": _inputs(13, 201),
        "kwargs": {"is_causal": True, "layout": "zigzag"},
        "autocast": True,
    },
]
_q, _k, _v, _g = _inputs(13, 300)
BAD = [
    # rank 1 has 6 features where the others have 8
    {
        "ranks": [0, 1, 2],
        "inputs": [_q, _k, _v, _g],
        "bad": {1: (torch.randn(2, 3, 5, 6), torch.randn(2, 3, 5, 6), torch.randn(2, 3, 5, 5))},
    },
    # 3 positions over 4 ranks
    {"ranks": [0, 1, 2, 3], "inputs": [x[:, :, :3] for x in (_q, _k, _v, _g)]},
    # rank 0 passes integer keys
    {
        "ranks": [0, 1],
        "inputs": [_q, _k, _v, _g],
        "bad": {0: (_q[:, :, :7], _k[:, :, :7].long(), _v[:, :, :7])},
    },
    # 13 positions split 8 + 5 instead of 7 + 6
    {
        "ranks": [0, 1],
        "inputs": [_q, _k, _v, _g],
        "bad": {
            0: (_q[:, :, :8], _k[:, :, :8], _v[:, :, :8]),
            1: (_q[:, :, 8:], _k[:, :, 8:], _v[:, :, 8:]),
        },
    },
    # contiguous shards (16 = 8 + 8) passed as zigzag (4 + 4 each): the lengths agree
    {
        "ranks": [0, 1],
        "inputs": _inputs(16, 301),
        "shard_layout": "contiguous",
        "kwargs": {"is_causal": True, "layout": "zigzag"},
    },
    # rank 1's inputs do not need gradients, rank 0's do: the backward would hang
    {"ranks": [0, 1], "inputs": [_q, _k, _v, _g], "no_grad": [1]},
    # rank 3 never calls: rank 2 must fail after the group's timeout, not hang
    {"ranks": [2, 3], "inputs": [_q, _k, _v, _g], "skip": [3], "timeout": 3},
]
for _case in BAD:
    _case.setdefault("kwargs", {})
CASES = RING + BALANCE + LOW + BAD


@pytest.fixture(scope="module")
def workers() -> Iterator[ModuleType]:
    """The module of the functions spawned ranks run, importable by name meanwhile.

    A spawned process imports its function's module by name with the parent's
    `sys.path`, so this folder is on it while the tests of this module run.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).parent))
        yield importlib.import_module("distributed_workers")


@pytest.fixture(scope="module")
def world(workers: ModuleType) -> list[dict[str, Any]]:
    """What every rank of the one spawned world returned: its cases, then its sockets."""
    return spawn(workers.run_world, WORLD, CASES, timeout=60, join_timeout=600)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def results(world: list[dict[str, Any]]) -> list[list[Any]]:
    """Results per case, then per rank of the case's group."""
    return [
        [world[rank]["cases"][i] for rank in case["ranks"] if rank not in case.get("skip", ())]
        for i, case in enumerate(CASES)
    ]


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net")
def test_spawned_world_listens_on_loopback_only(world: list[dict[str, Any]]) -> None:
    parent = world[0]["parent"]
    store_port = world[0]["store_port"]
    listening = {entry for rank in world for entry in map(tuple, rank["listening"])}
    # The store, served by the parent, and every rank's gloo listener were found...
    assert any(pid == parent and port == store_port for pid, _, port in listening)
    for rank in world:
        assert any(pid == rank["pid"] for pid, _, _ in listening), rank["pid"]
    # ... and none of them listens beyond this machine.
    assert [e for e in listening if not _is_loopback(e[1])] == []


def _unshard(case: dict[str, Any], got: list[Any], index: int) -> torch.Tensor:
    assert all(r[0] == "ok" for r in got), got
    layout = case["kwargs"].get("layout", "contiguous")
    return unshard_sequence([r[index] for r in got], layout=layout)


def _reference(case: dict[str, Any]) -> list[torch.Tensor]:
    q, k, v, grad_out = (x.float() for x in case["inputs"])
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    window = case["kwargs"].get("window")
    if window is None:
        out = TorchSDPA(q, k, v, is_causal=case["kwargs"].get("is_causal", False))
    else:
        out = TorchSDPA(q, k, v, attn_mask=sliding_window(q.shape[-2], window=window))
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), grad_out)]


def _name(case: dict[str, Any]) -> str:
    kw = case["kwargs"]
    causal = "causal" if kw["is_causal"] else "full"
    if kw.get("window") is not None:
        causal = f"window{kw['window']}"
    world = "-world" if case.get("default_group") else ""
    return f"ranks{''.join(map(str, case['ranks']))}{world}-{causal}-{kw['layout']}"


@pytest.mark.parametrize("index", range(len(RING)), ids=[_name(c) for c in RING])
def test_ring_attention_forward_matches_torch(results: list[list[Any]], index: int) -> None:
    case = RING[index]
    torch.testing.assert_close(_unshard(case, results[index], 1), _reference(case)[0], **TOL)


@pytest.mark.parametrize("index", range(len(RING)), ids=[_name(c) for c in RING])
def test_ring_attention_backward_matches_torch(results: list[list[Any]], index: int) -> None:
    case = RING[index]
    expected = _reference(case)[1:]
    for name, i, want in zip("qkv", (2, 3, 4), expected, strict=True):
        got = _unshard(case, results[index], i)
        torch.testing.assert_close(got, want, **TOL, msg=lambda m, n=name: f"d{n}: {m}")


def _kv_bytes_sent(case: dict[str, Any], element_size: int) -> list[int]:
    """Bytes each rank sends in the forward pass: every block but the last it holds."""
    q, _, v, _ = case["inputs"]
    n, e, e_v = q.shape[0] * q.shape[1], q.shape[-1], v.shape[-1]
    size = len(case["ranks"])
    ranges = shard_ranges(q.shape[-2], size, case["kwargs"].get("layout", "contiguous"))
    length = [sum(b - a for a, b in r) for r in ranges]
    return [
        sum(n * length[(rank - step) % size] * (e + e_v) * element_size for step in range(size - 1))
        for rank in range(size)
    ]


def test_a_narrow_window_stops_the_ring_early(results: list[list[Any]]) -> None:
    # The two contiguous window cases need 2 steps of the ring: every rank sends its own
    # block once and receives its neighbour's, instead of P - 1 blocks.
    start = len(RING) - len(WINDOWS)
    for i, (ranks, _, _, _) in enumerate(WINDOWS[:2]):
        case, got = RING[start + i], results[start + i]
        q, _, v, _ = case["inputs"]
        n, e, e_v = q.shape[0] * q.shape[1], q.shape[-1], v.shape[-1]
        lengths = [b - a for [(a, b)] in shard_ranges(q.shape[-2], len(ranks))]
        assert [r[5]["bytes_sent"] for r in got] == [n * t * (e + e_v) * 4 for t in lengths]
    # zigzag goes all the way round: P - 1 blocks, as without a window
    zigzag = RING[start + 2]
    assert [r[5]["bytes_sent"] for r in results[start + 2]] == _kv_bytes_sent(zigzag, 4)


def test_ring_attention_window_counts_the_pairs_it_shows(results: list[list[Any]]) -> None:
    # Forward score entries per batch and head entry, summed over the ranks: exactly the
    # (query, key) pairs the sliding-window mask allows.
    start = len(RING) - len(WINDOWS)
    for i, (_, _, w, t) in enumerate(WINDOWS):
        work = sum(r[5]["score_entries"] for r in results[start + i])
        assert work == int(sliding_window(t, window=w).sum()), WINDOWS[i]


def test_ring_attention_bfloat16_matches_float32_reference(results: list[list[Any]]) -> None:
    index = len(RING) + len(BALANCE)
    case = CASES[index]
    out = _unshard(case, results[index], 1)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), _reference(case)[0], rtol=0, atol=2e-2)
    for name, i in zip("qkv", (2, 3, 4), strict=True):
        assert _unshard(case, results[index], i).dtype == torch.bfloat16, name
    # The blocks travel as bfloat16: 2 bytes per number, not float32's 4.
    assert [r[5]["bytes_sent"] for r in results[index]] == _kv_bytes_sent(case, 2)


def test_ring_attention_under_autocast_returns_what_sdpa_returns(
    results: list[list[Any]],
) -> None:
    index = len(RING) + len(BALANCE) + 1
    case = CASES[index]
    q, k, v, _ = case["inputs"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = TorchSDPA(q, k, v, is_causal=True)
    out = _unshard(case, results[index], 1)
    assert out.dtype == expected.dtype == torch.bfloat16
    # Our bfloat16 error at most twice SDPA's own, both against float64.
    exact = TorchSDPA(q.double(), k.double(), v.double(), is_causal=True)
    ours, theirs = ((x.double() - exact).abs().max().item() for x in (out, expected))
    assert ours <= 2 * theirs, (ours, theirs)
    for name, i in zip("qkv", (2, 3, 4), strict=True):  # gradients: the inputs' dtype
        assert _unshard(case, results[index], i).dtype == torch.float32, name
    assert [r[5]["bytes_sent"] for r in results[index]] == _kv_bytes_sent(case, 2)


def test_zigzag_balances_causal_work(results: list[list[Any]]) -> None:
    start = len(RING)
    contiguous, zigzag = ([r[5]["score_entries"] for r in results[start + i]] for i in (0, 1))
    # T = 32, 4 ranks: rank r of the contiguous split has 8 queries that see 8r keys in
    # full and its own 8 under the causal mask (36 pairs); per batch and head entry.
    assert contiguous == [36 + 64 * r for r in range(4)]
    # zigzag: chunks r and 7 - r of 4 positions; the same count on every rank.
    assert zigzag == [sum(contiguous) / 4] * 4
    for got in results[start : start + 2]:
        # forward: 3 messages of K and V for 8 positions of 2 x 3 batch and head entries,
        # (E + Ev) = 8 + 5 floats of 4 bytes each
        assert [r[5]["bytes_sent"] for r in got] == [3 * 8 * 2 * 3 * (8 + 5) * 4] * 4


def _errors(results: list[list[Any]], i: int) -> list[tuple[str, str]]:
    got = results[len(CASES) - len(BAD) + i]
    assert all(r[0] == "error" for r in got), got
    return [(r[1], r[2]) for r in got]


@pytest.mark.parametrize(
    ("i", "kind", "message"),
    [
        (0, "ValueError", "query.shape is (2, 3, 5, 6) on rank 1 but (2, 3, 5, 8) on rank 0"),
        (1, "ValueError", "the group has 4 ranks but the sequence only 3 positions"),
        (2, "TypeError", "key must have a floating-point dtype"),
        (3, "ValueError", "the shards have lengths [8, 5] but layout 'contiguous'"),
        (4, "ValueError", "query on rank 0 holds positions [(0, 8)] of 16 (as shard_sequence"),
        (5, "ValueError", "the inputs of ranks [0] need gradients but those of ranks [1] do not"),
    ],
)
def test_ring_attention_bad_input_raises_on_every_rank(
    results: list[list[Any]], i: int, kind: str, message: str
) -> None:
    errors = _errors(results, i)
    assert len(errors) == len(BAD[i]["ranks"])
    for got_kind, got_message in errors:
        assert got_kind == kind
        assert message in got_message
    if i == 2:  # a local check of one rank: its message, then which rank it was
        assert all(m.endswith("(on rank 0 of ring_attention's group)") for _, m in errors)


def test_ring_attention_missing_rank_fails_instead_of_hanging(results: list[list[Any]]) -> None:
    # Rank 2 waits for rank 3, which never calls. It fails after the group's 3 s
    # timeout, or sooner if gloo notices that rank 3 has left the group.
    [(kind, message)] = _errors(results, len(BAD) - 1)
    assert kind in ("RuntimeError", "DistBackendError")
    assert re.search("timed out|timeout|closed by peer", message, re.IGNORECASE), message


def test_ring_attention_needs_initialised_process_group() -> None:
    q = torch.randn(2, 5, 4)
    with pytest.raises(RuntimeError, match=r"needs torch\.distributed to be initialised"):
        ring_attention(q, q, q)


def test_spawn_reports_every_failing_rank(workers: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="2 of 2 ranks failed") as info:
        spawn(workers.fail_on_last_rank, 2, timeout=3, join_timeout=300)
    assert "rank 1: ValueError: rank failed on purpose" in str(info.value)
    assert "rank 0: " in str(info.value)


def test_spawn_kills_processes_after_join_timeout(workers: ModuleType) -> None:
    start = time.monotonic()
    # The process is alive from its start on, so a short deadline is enough.
    with pytest.raises(TimeoutError, match=r"ranks \[0\] of 1 were still running after 1 s"):
        spawn(workers.sleep, 1, 3600.0, join_timeout=1)
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_shard_ranges_cover_the_sequence_once(world_size: int, layout: str) -> None:
    for t in (world_size, 13, 29):
        ranges = shard_ranges(t, world_size, layout)  # type: ignore[arg-type]
        covered = sorted(p for rank in ranges for a, b in rank for p in range(a, b))
        assert covered == list(range(t))
        lengths = [sum(b - a for a, b in rank) for rank in ranges]
        assert max(lengths) - min(lengths) <= (1 if layout == "contiguous" else 2)


def test_shard_ranges_zigzag_pairs_chunks_from_both_ends() -> None:
    assert shard_ranges(16, 4, "zigzag") == [
        [(0, 2), (14, 16)],
        [(2, 4), (12, 14)],
        [(4, 6), (10, 12)],
        [(6, 8), (8, 10)],
    ]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_unshard_sequence_inverts_shard_sequence(layout: str) -> None:
    x = torch.randn(2, 13, 3)
    parts = [shard_sequence(x, 3, r, layout=layout) for r in range(3)]  # type: ignore[arg-type]
    assert torch.equal(unshard_sequence(parts, layout=layout), x)  # type: ignore[arg-type]
    assert torch.equal(unshard_sequence(parts[:1], layout=layout), parts[0])  # type: ignore[arg-type]


def test_unshard_sequence_rejects_wrong_lengths() -> None:
    with pytest.raises(ValueError, match=r"lengths \[2, 5\] along dim -2, but layout"):
        unshard_sequence([torch.zeros(2, 1), torch.zeros(5, 1)])


def test_shard_ranges_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="layout must be one of"):
        shard_ranges(4, 2, "striped")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="world_size must be a positive int, got 0"):
        shard_ranges(4, 0)
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\), got 2"):
        shard_sequence(torch.zeros(4, 1), 2, 2)


def test_merge_partials_equals_softmax_over_all_keys() -> None:
    q, k, v = torch.randn(2, 7, 4), torch.randn(2, 9, 4), torch.randn(2, 9, 3)
    scores = q @ k.transpose(1, 2)  # (2, 7, 9)
    parts = [
        (scores[..., sl].softmax(-1) @ v[:, sl], scores[..., sl].logsumexp(-1))
        for sl in (slice(0, 4), slice(4, 9))
    ]
    out, lse = merge_partials(*parts[0], *parts[1])
    torch.testing.assert_close(out, scores.softmax(-1) @ v)
    torch.testing.assert_close(lse, scores.logsumexp(-1))


def test_merge_partials_ignores_a_part_without_keys() -> None:
    out_a, lse_a = torch.randn(3, 2), torch.randn(3)
    empty = (torch.zeros(3, 2), torch.full((3,), float("-inf")))
    out, lse = merge_partials(out_a, lse_a, *empty)
    assert torch.equal(out, out_a)
    assert torch.equal(lse, lse_a)


def test_ring_stats_start_at_zero() -> None:
    assert RingStats() == RingStats(0, 0, 0, 0.0, 0.0)


def test_bench_table_reports_memory_ratio_and_balance() -> None:
    from attnlab.tools.bench.ring import format_results

    def rank(tensors: int, resident: int, work: int, busy: float) -> dict[str, float]:
        return {
            "tensor_peak_bytes": tensors,
            "peak_extra_bytes": resident,
            "input_bytes": 2**20,
            "forward_seconds": 1.0,
            "backward_seconds": 2.0,
            "bytes_sent": 2**20,
            "forward_score_entries": work,
            "forward_compute_seconds": busy,
        }

    mib = 2**20
    runs = [
        {"world_size": 1, "layout": "contiguous", "ranks": [rank(7 * mib, 9 * mib, 10, 1.0)]},
        {
            "world_size": 2,
            "layout": "zigzag",
            # the largest rank counts: 3 + 1 MiB of tensors, 4 + 1 MiB resident
            "ranks": [rank(3 * mib, 2 * mib, 30, 1.0), rank(1 * mib, 4 * mib, 10, 0.5)],
        },
    ]
    lines = format_results({"runs": runs}).splitlines()
    assert lines[0].split()[:4] == ["ranks", "layout", "tensors", "MiB"]
    assert lines[1].split() == [
        "1", "contiguous", "8.0", "1.00", "10.0", "1.00", "3.00", "1.0", "1.00", "1.00"
    ]  # fmt: skip
    assert lines[2].split() == [
        "2", "zigzag", "4.0", "0.50", "5.0", "0.50", "3.00", "1.0", "3.00", "2.00"
    ]  # fmt: skip


# One rank, in this process ------------------------------------------------------------


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A process group of one rank in this process (gloo, an in-memory store)."""
    with one_rank_group():
        yield


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_ring_attention_gradcheck(one_rank: None, layout: str, window: int | None) -> None:
    # The custom backward, in float64; zigzag's two chunks on one rank meet as a
    # diagonal pair and a full one (with the window, one whose edge crosses it),
    # block_size 2 cuts them into several tiles.
    g = torch.Generator().manual_seed(7)
    q, k = (torch.randn(1, 2, 7, 3, dtype=torch.float64, generator=g) for _ in range(2))
    v = torch.randn(1, 2, 7, 2, dtype=torch.float64, generator=g)
    inputs = tuple(x.requires_grad_() for x in (q, k, v))

    def ring(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ring_attention(
            q,
            k,
            v,
            is_causal=True,
            window=window,
            layout=layout,
            block_size=2,  # type: ignore[arg-type]
        )

    assert torch.autograd.gradcheck(ring, inputs, fast_mode=True)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ring_attention_window_on_one_rank_matches_torch(one_rank: None, layout: str) -> None:
    q, k, v, grad_out = _inputs(13, 500)
    for window in (1, 4, 13, 20):  # one key each; an edge inside the chunks; all keys
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        expected = TorchSDPA(*leaves, attn_mask=sliding_window(13, window=window))
        expected_grads = torch.autograd.grad(expected, leaves, grad_out)
        for is_causal in (True, False):  # a window implies is_causal, as in functional
            ours = [x.clone().requires_grad_() for x in (q, k, v)]
            out = ring_attention(
                *ours,
                is_causal=is_causal,
                window=window,
                layout=layout,
                block_size=3,  # type: ignore[arg-type]
            )
            torch.testing.assert_close(out, expected, **TOL)
            grads = torch.autograd.grad(out, ours, grad_out)
            for got, want in zip(grads, expected_grads, strict=True):
                torch.testing.assert_close(got, want, **TOL)


def test_ring_attention_rejects_a_bad_window(one_rank: None) -> None:
    q = torch.randn(2, 5, 4)
    for window, kind in ((0, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(kind, match=r"^window must be a positive int.*on rank 0 of"):
            ring_attention(q, q, q, window=window)  # type: ignore[arg-type]


def test_one_rank_backward_needs_no_live_group() -> None:
    # The registry of entry points relies on this: a group of one rank sends nothing,
    # so the custom backward runs after the group made for the call is gone.
    q, k, v, grad_out = _inputs(9, 600)
    ours = [x.clone().requires_grad_() for x in (q, k, v)]
    with one_rank_group():
        out = ring_attention(*ours, window=4, layout="zigzag", block_size=2)
    assert not dist.is_initialized()
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    expected = TorchSDPA(*leaves, attn_mask=sliding_window(9, window=4))
    for got, want in zip(
        torch.autograd.grad(out, ours, grad_out),
        torch.autograd.grad(expected, leaves, grad_out),
        strict=True,
    ):
        torch.testing.assert_close(got, want, **TOL)


def test_one_rank_group_uses_a_group_that_is_there(one_rank: None) -> None:
    with one_rank_group():  # nested: neither initialises twice nor destroys the outer
        ring_attention(torch.randn(1, 3, 2), torch.randn(1, 3, 2), torch.randn(1, 3, 2))
    assert dist.is_initialized()


def test_ring_attention_refuses_create_graph_clearly(one_rank: None) -> None:
    q, k, v = (torch.randn(2, 5, 4, requires_grad=True) for _ in range(3))
    out = ring_attention(q, k, v, is_causal=True, block_size=2)
    # A clear message, not bmm()'s "functions with out=... arguments don't support
    # automatic differentiation" from deep inside the kernel.
    with pytest.raises(RuntimeError, match="ring_attention does not support create_graph=True"):
        torch.autograd.grad(out.square().sum(), (q, k, v), create_graph=True)
    # Without it, the same graph still gives the gradients (nothing was freed).
    reference = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    expected = TorchSDPA(*reference, is_causal=True).square().sum()
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    for got, want in zip(grads, torch.autograd.grad(expected, reference), strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_ring_attention_under_autocast_on_one_rank(one_rank: None) -> None:
    q, k, v = _inputs(9, 400)[:3]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ring_attention(q, k, v, is_causal=True)
        expected = TorchSDPA(q, k, v, is_causal=True)
    assert out.dtype == expected.dtype == torch.bfloat16
    exact = TorchSDPA(q.double(), k.double(), v.double(), is_causal=True)
    assert (out.double() - exact).abs().max() <= 2 * (expected.double() - exact).abs().max()


def test_ring_attention_empty_sequence_says_so(one_rank: None) -> None:
    q = torch.zeros(1, 2, 0, 4)
    with pytest.raises(ValueError, match="every shard is empty") as info:
        ring_attention(q, q, q)
    assert "at most 0" not in str(info.value)


def test_shard_sequence_records_the_positions_ring_attention_checks(one_rank: None) -> None:
    x = torch.randn(1, 6, 4)
    # One rank: contiguous and zigzag shards hold the same positions, both are fine.
    shard = shard_sequence(x, 1, 0, layout="contiguous").requires_grad_()
    torch.testing.assert_close(
        ring_attention(shard, shard, shard, layout="zigzag"), TorchSDPA(x, x, x)
    )
    # A shard cut for two ranks does not fit a group of one, although nothing else tells.
    half = shard_sequence(torch.randn(1, 12, 4), 2, 0)
    with pytest.raises(ValueError, match=r"key on rank 0 holds positions \[\(0, 6\)\] of 12"):
        ring_attention(x, half, x)
