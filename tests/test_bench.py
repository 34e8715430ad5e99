"""attnlab.tools.bench: the harness runs end to end on tiny sizes, and its measurements are right.

The smoke test runs the command in-process with `--quick` (tiny sizes, a few seconds) and
checks every field of `bench.json` that the Benchmarks page reads. The measuring helpers
are checked against numbers known in advance: bytes of tensors we allocate, FLOPs counted
by hand, and PyTorch's attention for the naive implementation.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from attnlab.rules._provenance import KEYS
from attnlab.tools import bench

ASSETS = Path(__file__).resolve().parents[1] / "docs" / "assets"

KERNELS = {"naive", "flash_attention", "torch_sdpa"}
MODULES = {
    "SelfAttention",
    "MultiHeadAttentionWrapper",
    "MultiHeadAttention[torch]",
    "MultiHeadAttention[scratch]",
    "nn.MultiheadAttention[need_weights=False]",
    "nn.MultiheadAttention[default]",
}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench")
    status = bench.main(["--quick", "--threads", "1", "--no-progress", "--out-dir", str(out)])
    assert status == 0
    return out, json.loads((out / "bench.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def modern_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The modern suites (window, decode, kv_memory) on tiny sizes, through the CLI."""
    pytest.importorskip("attnlab.layers.gqa")
    pytest.importorskip("attnlab.layers.mla")
    out = tmp_path_factory.mktemp("bench-modern")
    argv = ["--quick", "--suite", "window", "decode", "kv_memory", "--rounds", "2"]
    argv += ["--threads", "1", "--no-progress", "--out-dir", str(out), "--json", "modern.json"]
    assert bench.main(argv) == 0
    return out, json.loads((out / "modern.json").read_text(encoding="utf-8"))


def test_bench_quick_run_records_provenance(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, data = quick_run
    assert data["schema"] == bench.SCHEMA_VERSION
    prov = data["provenance"]
    assert list(prov)[: len(KEYS)] == list(KEYS)  # the keys every recorder writes
    assert prov["command"].startswith("python -m attnlab.tools.bench --quick")
    assert prov["torch"] == torch.__version__
    assert prov["torch_threads"] == 1
    for key in ("date", "cpu_model", "logical_cpus", "python", "load_average_before", "note"):
        assert prov[key] is not None, key
    assert data["matmul_peak"]["gflops"] > 0
    assert "profiler" in data["memory_method"]


def test_bench_quick_run_measures_every_implementation(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    _, data = quick_run
    expected = {"kernels": KERNELS, "modules": MODULES}
    for suite, impls in expected.items():
        content = data["suites"][suite]
        results = content["results"]
        config = bench.QUICK[suite]
        for mode in bench.MODES:
            for t in config.seq_lens[mode]:
                found = {r["impl"] for r in results if r["mode"] == mode and r["seq_len"] == t}
                assert found == {i for i in impls if config.runs(i, mode, t)}, (suite, mode, t)
        if suite == "kernels":  # the quick plan caps naive's forward+backward at 16 tokens
            assert not config.runs("naive", "forward+backward", 24)
        for r in results:
            time_s = r["time_s"]
            assert 0 < time_s["min"] <= time_s["median"] <= time_s["max"]
            assert time_s["repeats"] == 2
            assert r["peak_extra_bytes"] > 0
            assert r["flops"] > 0
            # The record keeps 4 significant digits (round_floats): each rounded number is
            # off by up to 5e-4 of itself, and these ratios combine two or three of them.
            assert r["gflops"] == pytest.approx(r["flops"] / time_s["median"] / 1e9, rel=2e-3)
            assert r["share_of_peak"] == pytest.approx(
                r["gflops"] / data["matmul_peak"]["gflops"], rel=2e-3
            )
            if r["impl"] == content["baseline"]:
                assert r["ratio_to_baseline"] == {"median": 1.0, "min": 1.0, "max": 1.0}
            else:
                assert r["ratio_to_baseline"]["median"] > 0


def test_bench_quick_run_writes_svg_plots(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    out, _ = quick_run
    for suite in ("kernels", "modules"):
        for what in ("time", "memory"):
            svg = (out / f"{suite}_{what}.svg").read_text(encoding="utf-8")
            assert svg.lstrip().startswith("<?xml")
            assert "<svg" in svg
            # Text as text, in the colours of the plots' card (tests/test_bench_plots.py
            # checks their sizes and contrast on the committed plots).
            assert "<text" in svg
            assert bench.plots.CARD in svg
            assert bench.plots.TEXT in svg
            assert "sequence length T" in svg


def test_bench_markdown_tables_list_every_result(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, data = quick_run
    assert bench.results_markdown(data, "kernels", "forward+backward").count(">naive<") == 4
    tables = bench.results_markdown(data, "kernels", "forward")
    assert tables.count(">flash_attention</code>") == 4  # one row in each of the four tables
    assert '=== "Time / torch_sdpa"' in tables
    for t in bench.QUICK["kernels"].seq_lens["forward"]:
        assert f" {t} |" in tables
    assert "configurations" in bench.goals_markdown(data)  # tiny sizes decide no goal
    provenance = bench.provenance_markdown(data)
    assert "`python -m attnlab.tools.bench --quick" in provenance
    assert torch.__version__ in provenance


def test_goals_are_decided_from_the_goal_configurations() -> None:
    def result(impl: str, mode: str, t: int, ratio: float, memory: int) -> dict[str, Any]:
        return {
            "impl": impl,
            "mode": mode,
            "seq_len": t,
            "ratio_to_baseline": {"median": ratio},
            "peak_extra_bytes": memory,
        }

    data = {
        "suites": {
            "kernels": {
                "config": {"batch": 4, "heads": 8},
                "results": [
                    result("flash_attention", "forward", 4096, 1.2, 2**30 // 10),
                    result("flash_attention", "forward+backward", 2048, 3.5, 100),
                    result("naive", "forward+backward", 2048, 9.0, 1000),
                ],
            },
            "modules": {
                "results": [
                    result("MultiHeadAttention[torch]", "forward", 1024, 1.0, 1),
                    result("MultiHeadAttention[torch]", "forward", 128, 1.25, 1),
                    result("MultiHeadAttention[torch]", "forward", 16, 9.0, 1),  # --quick
                    result("SelfAttention", "forward", 128, 0.5, 1),
                ]
            },
        }
    }
    goals = {g["goal"]: (g["value"], g["met"]) for g in bench.evaluate_goals(data)}
    assert len(goals) == 6
    values = list(goals.values())
    assert values[0] == (1.2, True)  # time ratio at T=4096: the flash goal stays
    assert values[1] == (pytest.approx(0.05), True)  # 0.1 GiB of a 2 GiB score tensor
    assert values[2] == (3.5, False)  # forward+backward over 3x
    assert values[3] == (0.1, True)  # 100 bytes of naive's 1000
    # MultiHeadAttention's speed is a goal at every length, shortest first.
    assert values[4] == (0.8, False)  # 1 / 1.25 at t=128
    assert values[5] == (1.0, True)  # as fast as nn.MultiheadAttention at t=1024
    assert "t=128" in list(goals)[4]


def test_window_goal_is_the_growth_of_time_per_token_per_doubling() -> None:
    def result(t: int, seconds: float) -> dict[str, Any]:
        return {
            "impl": "flash_attention[window=512]",
            "mode": "forward",
            "seq_len": t,
            "time_s": {"median": seconds},
        }

    data = {
        "suites": {
            "window": {
                "config": {"window": 512},
                # linear (2x per doubling), then 2.6x: the second doubling misses 1.2.
                "results": [
                    result(1024, 0.5),
                    result(2048, 1.0),
                    result(4096, 2.0),
                    result(8192, 5.2),
                ],
            }
        }
    }
    goals = bench.evaluate_goals(data)
    assert [g["goal"].split(", ")[1] for g in goals] == [
        "T=2048 to 4096: growth of the time per token",
        "T=4096 to 8192: growth of the time per token",
    ]  # from 2048 on: the window is 512, shorter lengths are not yet in the linear regime
    assert [(g["value"], g["met"]) for g in goals] == [(1.0, True), (pytest.approx(1.3), False)]


def test_peak_extra_bytes_sees_freed_temporaries() -> None:
    def work() -> torch.Tensor:
        temporary = torch.empty(2**20)  # 4 MiB, freed before returning
        kept = torch.empty(2**18)  # 1 MiB
        del temporary
        return kept

    assert bench.peak_extra_bytes(work) == 5 * 2**20


def test_peak_extra_bytes_ignores_tensors_that_already_exist() -> None:
    existing = torch.empty(2**20)
    assert bench.peak_extra_bytes(existing.zero_) == 0


def test_count_flops_kernels_counts_visible_pairs() -> None:
    config = bench.SuiteConfig(batch=2, heads=3, width=4, seq_lens={})
    pairs = 5 * 6 // 2  # causal, T = 5: 1 + 2 + 3 + 4 + 5
    forward = 2 * 3 * pairs * 2 * 2 * 4  # heads x pairs x (QK^T and PV) x 2 flops x d
    assert bench.count_flops("kernels", config, 5, "flash_attention", "forward") == forward
    assert bench.count_flops("kernels", config, 5, "naive", "forward+backward") == 3 * forward


def test_count_flops_modules_counts_projections() -> None:
    config = bench.SuiteConfig(batch=1, heads=2, width=4, seq_lens={})
    attention = 2 * 2 * 3 * 3 * 4  # (QK^T and PV) x 2 flops x t x t x d
    article = bench.count_flops("modules", config, 3, "SelfAttention", "forward")
    assert article == 3 * 2 * 3 * 4 * 4 + attention  # q, k, v projections
    mha = bench.count_flops("modules", config, 3, "MultiHeadAttention[torch]", "forward")
    assert mha == 4 * 2 * 3 * 4 * 4 + attention  # and the output projection


@pytest.mark.parametrize("is_causal", [False, True])
def test_naive_attention_matches_torch(is_causal: bool) -> None:
    q, k, v = torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 5)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(bench.naive_attention(q, k, v, is_causal=is_causal), expected)


def test_measure_matmul_peak_reports_best_size() -> None:
    peak = bench.measure_matmul_peak(sizes=(32, 64), repeats=2)
    assert peak["gflops"] == max(peak["per_size"].values())
    assert math.isfinite(peak["gflops"])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"suites": ["gpu"]}, "unknown suite 'gpu'"),
        ({"modes": ["backward"]}, "unknown mode 'backward'"),
        ({"repeats": 0}, "repeats must be at least 1"),
    ],
)
def test_run_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bench.run(progress=False, **kwargs)


def test_window_pairs_counts_the_visible_pairs() -> None:
    for t, w in [(1, 1), (5, 2), (7, 7), (9, 4), (6, 10)]:
        visible = sum(1 for i in range(t) for j in range(t) if i - w < j <= i)
        assert bench.window_pairs(t, w) == visible, (t, w)


def test_count_flops_window_and_decode() -> None:
    config = bench.SuiteConfig(batch=2, heads=3, width=4, seq_lens={}, window=2)
    windowed = bench.count_flops("window", config, 5, "flash_attention[window=2]", "forward")
    assert windowed == 2 * 3 * (1 + 2 + 2 + 2 + 2) * 2 * 2 * 4
    full = bench.count_flops("window", config, 5, "flash_attention", "forward")
    assert full == bench.count_flops("kernels", config, 5, "flash_attention", "forward")
    # decode: d_model 8, 2 query heads of 4 features, 1 key/value head, 3 steps after 5
    dec = bench.SuiteConfig(batch=1, heads=2, width=8, seq_lens={}, kv_heads=1, steps=3)
    per_token = 2 * 8 * (4 * 2 + 4 * 1 + 4 * 1 + 4 * 2)  # q, k, v, o projections
    keys = 6 + 7 + 8  # the three new tokens see 6, 7 and 8 keys
    assert bench.count_flops("decode", dec, 5, "kv_cache", "decode") == (
        3 * per_token + 2 * 2 * 2 * 4 * keys
    )
    pairs = 6 * 7 // 2  # recomputing: causal attention over 6 tokens
    assert bench.count_flops("decode", dec, 5, "recompute", "decode") == (
        6 * per_token + 2 * 2 * 2 * 4 * pairs
    )


def test_decode_slopes_fit_a_line() -> None:
    rows = [
        {"impl": impl, "seq_len": n, "time_s": {"median": base + n * per}}
        for impl, base, per in [("kv_cache", 1e-3, 2e-9), ("recompute", 0.0, 1e-6)]
        for n in (512, 2048, 8192)
    ]
    slopes = bench.decode_slopes(rows)
    assert slopes["kv_cache"]["slope_us_per_1k_context"] == pytest.approx(2.0)
    assert slopes["recompute"]["slope_us_per_1k_context"] == pytest.approx(1000.0)
    assert slopes["recompute"]["growth"] == pytest.approx(16.0)
    assert slopes["kv_cache"]["context_growth"] == 16.0
    assert "2" in bench.decode_slopes_markdown({"suites": {"decode": {"slopes": slopes}}})


def test_bench_modern_suites_run_and_report(modern_run: tuple[Path, dict[str, Any]]) -> None:
    out, data = modern_run
    assert data["schema"] == bench.SCHEMA_VERSION == 2
    assert set(data["suites"]) == {"window", "decode"}
    assert data["provenance"]["command"].startswith("python -m attnlab.tools.bench --quick --suite")
    window = data["suites"]["window"]
    assert window["config"]["window"] == bench.QUICK["window"].window
    impls = {r["impl"] for r in window["results"]}
    assert impls == {"flash_attention", f"flash_attention[window={window['config']['window']}]"}
    assert {(r["mode"], r["seq_len"]) for r in window["results"]} == {
        ("forward", 16),
        ("forward", 32),
        ("forward+backward", 16),
    }
    decode = data["suites"]["decode"]
    assert decode["baseline"] == "recompute"
    for r in decode["results"]:
        assert r["mode"] == "decode"
        assert r["tokens_per_call"] == (
            bench.QUICK["decode"].steps if r["impl"] == "kv_cache" else 1
        )
        assert r["time_s"]["repeats"] == 2
        config = bench.QUICK["decode"]
        per_call = bench.count_flops("decode", config, r["seq_len"], r["impl"], "decode")
        assert r["flops"] == pytest.approx(per_call / r["tokens_per_call"], rel=1e-3)
    assert set(decode["slopes"]) == {"kv_cache", "recompute"}
    tables = bench.results_markdown(data, "decode", "decode")
    assert '=== "Tokens/s"' in tables
    assert '=== "Time / recompute"' in tables
    assert "| context = | 8 | 16 |" in tables
    for suite in ("window", "decode"):  # time plots only: their memory is not shown
        assert (out / f"{suite}_time.svg").exists()
        assert not (out / f"{suite}_memory.svg").exists()


def test_bench_kv_memory_is_measured_on_real_caches(
    modern_run: tuple[Path, dict[str, Any]],
) -> None:
    _, data = modern_run
    shape = data["kv_memory"]["shape"]
    assert shape == dataclasses.asdict(bench.KV_QUICK)
    by_variant = {r["variant"]: r for r in data["kv_memory"]["results"]}
    assert list(by_variant) == ["MHA", "GQA", "MQA", "MLA"]
    size = torch.tensor([], dtype=getattr(torch, shape["dtype"])).element_size()
    hd = shape["head_dim"]
    expected_per_layer = {  # numbers per token and layer, computed by hand
        "MHA": shape["num_heads"] * 2 * hd,
        "GQA": shape["gqa_kv_heads"] * 2 * hd,
        "MQA": 2 * hd,
        "MLA": shape["kv_lora_rank"] + shape["qk_rope_head_dim"],
    }
    for name, numbers in expected_per_layer.items():
        r = by_variant[name]
        assert r["features_per_token_per_layer"] == numbers
        assert r["bytes_per_token_per_layer"] == numbers * size
        assert r["bytes_per_token"] == numbers * size * shape["num_layers"]
        assert r["formula_bytes_per_token"] == r["bytes_per_token"]
        assert r["ratio_to_mha"] == pytest.approx(numbers / expected_per_layer["MHA"])
    table = bench.kv_memory_markdown(data)
    assert table.count("| equal |") == 4
    assert f"bytes per token, {shape['num_layers']} layers" in table


def test_kv_memory_default_shape_is_llama3_8b_like() -> None:
    shape = bench.KV_FULL
    assert (shape.num_heads, shape.gqa_kv_heads, shape.head_dim, shape.num_layers) == (
        32,
        8,
        128,
        32,
    )
    assert shape.dtype == "bfloat16"


def test_replot_draws_the_plots_of_a_results_file(
    quick_run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    out, _ = quick_run
    assert bench.main(["--replot", str(out / "bench.json"), "--out-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "kernels_memory.svg",
        "kernels_time.svg",
        "modules_memory.svg",
        "modules_time.svg",
    ]


def test_results_markdown_states_units_once_and_splits_long_names() -> None:
    def result(impl: str, t: int, seconds: float, memory: int) -> dict[str, Any]:
        return {
            "impl": impl,
            "mode": "forward",
            "seq_len": t,
            "time_s": {"median": seconds, "min": seconds * 0.9, "max": seconds * 1.1},
            "ratio_to_baseline": {"median": 1.0},
            "peak_extra_bytes": memory,
            "gflops": 12.0,
            "share_of_peak": 0.25,
        }

    data: dict[str, Any] = {
        "suites": {
            "modules": {
                "baseline": "nn.MultiheadAttention[need_weights=False]",
                "results": [
                    result("nn.MultiheadAttention[need_weights=False]", 128, 0.004, 3 * 2**20),
                    result("nn.MultiheadAttention[need_weights=False]", 8192, 2.5, 5 * 2**30),
                ],
            }
        }
    }
    tables = bench.results_markdown(data, "modules", "forward")
    assert '=== "Time (ms)"' in tables  # the smallest time decides the unit
    # One implementation, two lengths: lengths run down, the implementation across.
    assert "| 128 | 4<br><small>3.6–4.4</small> |" in tables
    assert "| 8192 | 2500<br><small>2250–2750</small> |" in tables
    # 3 MiB and 5 GiB: over 1000x apart, so each cell carries its own unit.
    assert '=== "Peak extra memory"' in tables
    assert "| 128 | 3 MiB |" in tables
    assert "| 8192 | 5 GiB |" in tables
    assert "nn.MultiheadAttention</code><br><small>need_weights=False</small>" in tables
    assert "| 128 | 12<br><small>25%</small> |" in tables
    # Three implementations at two lengths: the implementations run down.
    results = data["suites"]["modules"]["results"]
    for impl in ("SelfAttention", "MultiHeadAttention[torch]"):
        results += [result(impl, 128, 0.002, 2**20), result(impl, 8192, 1.0, 2**30)]
    tables = bench.results_markdown(data, "modules", "forward")
    assert "| T = | 128 | 8192 |" in tables
    assert "SelfAttention</code> | 2<br><small>1.8–2.2</small> | 1000<br>" in tables
    assert '=== "Peak extra memory (MiB)"' not in tables  # 1 MiB to 5 GiB: units per cell
    data["suites"]["modules"]["results"] = results[2:]  # 1 MiB to 1 GiB, 1024x apart
    for r in results[2:]:
        if r["seq_len"] == 8192:
            r["peak_extra_bytes"] = 2**29  # now 512x apart: one unit for the table
    tables = bench.results_markdown(data, "modules", "forward")
    assert '=== "Peak extra memory (MiB)"' in tables


def _in_process_spawn(fn: Callable[..., Any], world_size: int, *args: Any, **_: Any) -> list[Any]:
    """`spawn` for one rank, in this process: a group of one, no process started."""
    assert world_size == 1
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return [fn(0, 1, *args)]
    finally:
        dist.destroy_process_group()


def _check_provenance(prov: dict[str, Any], command: str) -> None:
    assert list(prov) == list(KEYS)
    assert prov["command"] == command
    assert prov["torch"] == torch.__version__
    assert prov["logical_cpus"] >= 1
    assert prov["duration_s"] >= 0
    date = datetime.datetime.fromisoformat(prov["date"])
    assert date.utcoffset() == datetime.timedelta(0)
    assert abs(datetime.datetime.now(datetime.UTC) - date).total_seconds() < 600


def test_every_recorder_writes_the_same_provenance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """overhead, train, the ring demo and the ring benchmark: one set of keys.

    The ring commands run their ranks in this process (a group of one), so that no
    process is started; the benchmark's own record is checked by the quick run above.
    """
    from attnlab.distributed import demo
    from attnlab.tools import train
    from attnlab.tools.bench import overhead
    from attnlab.tools.bench import ring as ring_bench

    argv = ["--batch", "1", "--seq", "4", "--dim", "8", "--heads", "2", "--repeats", "2"]
    overhead.main(argv)
    _check_provenance(
        json.loads(capsys.readouterr().out)["provenance"],
        "python -m attnlab.tools.bench.overhead " + " ".join(argv),
    )
    argv = ["--steps", "1", "--out", str(tmp_path / "model"), "--no-progress"]
    train.main(argv)
    record = json.loads((tmp_path / "model" / "induction.json").read_text())
    _check_provenance(
        {k: record[k] for k in KEYS}, "python -m attnlab.tools.train " + " ".join(argv)
    )
    monkeypatch.setattr(demo, "spawn", _in_process_spawn)
    monkeypatch.setattr(ring_bench, "spawn", _in_process_spawn)
    argv = ["--world-size", "1", "--length", "6", "--json", str(tmp_path / "demo.json")]
    demo.main(argv)
    record = json.loads((tmp_path / "demo.json").read_text())
    _check_provenance(record["provenance"], "python -m attnlab.distributed.demo " + " ".join(argv))
    argv = ["--world-sizes", "1", "--length", "8", "--heads", "1", "--head-dim", "4"]
    argv += ["--out", str(tmp_path / "ring.json")]
    ring_bench.main(argv)
    record = json.loads((tmp_path / "ring.json").read_text())
    _check_provenance(record["provenance"], "python -m attnlab.tools.bench.ring " + " ".join(argv))


@pytest.mark.parametrize(
    "path",
    sorted(
        str(p.relative_to(ASSETS))
        for d in ("bench", "ring", "model")
        for p in (ASSETS / d).glob("*.json")
    ),
)
def test_read_provenance_reads_every_committed_record(path: str) -> None:
    record = json.loads((ASSETS / path).read_text(encoding="utf-8"))
    prov = bench.read_provenance(record)
    assert list(prov)[: len(KEYS)] == list(KEYS)
    assert prov["command"].startswith("python -m attnlab.")
    assert prov["torch"].startswith("2.")
    assert prov["python"].startswith("3.")
    if prov["date"] is not None:  # the training record of the site has no date
        date = datetime.datetime.fromisoformat(prov["date"])
        assert date.utcoffset() == datetime.timedelta(0)
    assert prov["logical_cpus"] is None or prov["logical_cpus"] >= 1
    assert prov["load_average_after"] is None or len(prov["load_average_after"]) == 3


def test_read_provenance_renames_the_old_keys() -> None:
    old = {  # the ring demo's record before the keys were made the same
        "rows": [],
        "provenance": {"date": "2026-12-01 05:27 UTC", "cpu_count": 2, "load_average": [1, 2, 3]},
    }
    prov = bench.read_provenance(old)
    assert prov["date"] == "2026-12-01T05:27:00+00:00"
    assert (prov["logical_cpus"], prov["load_average_after"]) == (2, [1, 2, 3])
    assert prov["load_average_before"] is None
    train = {
        "command": "python -m attnlab.tools.train",
        "threads": 2,
        "seconds": 14.7,
        "config": {},
    }
    prov = bench.read_provenance(train)
    assert (prov["command"], prov["torch_threads"], prov["duration_s"]) == (
        "python -m attnlab.tools.train",
        2,
        14.7,
    )
    assert "config" not in prov


def test_only_command_line_entry_points_read_sys_argv() -> None:
    """Library functions take the command line as an argument (run_bench used to read it)."""
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "attnlab"
    readers = []
    for path in sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        allowed: set[int] = set()  # ids of nodes inside main() or the __main__ guard
        for node in ast.walk(tree):
            is_main = isinstance(node, ast.FunctionDef) and node.name == "main"
            is_guard = isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
            if is_main or is_guard:
                allowed.update(id(inner) for inner in ast.walk(node))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "argv"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
                and id(node) not in allowed
            ):
                readers.append(f"{path.relative_to(src)}:{node.lineno}")
    assert readers == []
