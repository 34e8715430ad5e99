"""attnlab.bench: the harness runs end to end on tiny sizes, and its measurements are right.

The smoke test runs the command in-process with `--quick` (tiny sizes, a few seconds) and
checks every field of `bench.json` that the Benchmarks page reads. The measuring helpers
are checked against numbers known in advance: bytes of tensors we allocate, FLOPs counted
by hand, and PyTorch's attention for the naive implementation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import bench

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


def test_bench_quick_run_records_provenance(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, data = quick_run
    assert data["schema"] == bench.SCHEMA_VERSION
    prov = data["provenance"]
    assert prov["command"].startswith("python -m attnlab.bench --quick")
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
            assert r["gflops"] == pytest.approx(r["flops"] / time_s["median"] / 1e9, rel=1e-3)
            assert r["share_of_peak"] == pytest.approx(
                r["gflops"] / data["matmul_peak"]["gflops"], rel=1e-3
            )
            if r["impl"] == content["baseline"]:
                assert r["ratio_to_baseline"] == {"median": 1.0, "min": 1.0, "max": 1.0}
            else:
                assert r["ratio_to_baseline"]["median"] > 0


def test_bench_quick_run_writes_png_plots(quick_run: tuple[Path, dict[str, Any]]) -> None:
    out, _ = quick_run
    for suite in ("kernels", "modules"):
        for what in ("time", "memory"):
            png = out / f"{suite}_{what}.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png


def test_bench_markdown_tables_list_every_result(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, data = quick_run
    assert bench.results_markdown(data, "kernels", "forward+backward").count(">naive<") == 4
    tables = bench.results_markdown(data, "kernels", "forward")
    assert tables.count(">flash_attention</code>") == 4  # one row in each of the four tables
    assert '=== "Time / baseline"' in tables
    for t in bench.QUICK["kernels"].seq_lens["forward"]:
        assert f" {t} |" in tables
    assert "configurations" in bench.goals_markdown(data)  # tiny sizes decide no goal
    provenance = bench.provenance_markdown(data)
    assert "`python -m attnlab.bench --quick" in provenance
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
            "modules": {"results": [result("MultiHeadAttention[torch]", "forward", 1024, 1.0, 1)]},
        }
    }
    goals = {g["goal"]: (g["value"], g["met"]) for g in bench.evaluate_goals(data)}
    assert len(goals) == 5
    values = list(goals.values())
    assert values[0] == (1.2, True)  # time ratio at T=4096
    assert values[1] == (pytest.approx(0.05), True)  # 0.1 GiB of a 2 GiB score tensor
    assert values[2] == (3.5, False)  # forward+backward over 3x
    assert values[3] == (0.1, True)  # 100 bytes of naive's 1000
    assert values[4] == (1.0, True)  # MultiHeadAttention as fast as nn.MultiheadAttention


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
