"""The Benchmarks page's tables: shares of a peak only where the peak holds, headers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnlab.tools.bench import goals_markdown, provenance_markdown, results_markdown
from attnlab.tools.bench.report import peak_exceeded

BENCH = Path(__file__).resolve().parents[1] / "docs/assets/bench"


def _run(shares: list[float]) -> dict[str, Any]:
    results = [
        {
            "impl": impl,
            "mode": "forward",
            "seq_len": 64,
            "time_s": {"median": 0.01, "min": 0.009, "max": 0.011},
            "ratio_to_baseline": {"median": 1.0},
            "peak_extra_bytes": 2**20,
            "gflops": 50.0 * share,
            "share_of_peak": share,
        }
        for impl, share in zip(("a", "b"), shares, strict=True)
    ]
    return {"suites": {"kernels": {"baseline": "a", "results": results}}}


def test_shares_are_shown_only_when_no_result_beats_the_peak() -> None:
    trusted, beaten = _run([0.5, 0.9]), _run([0.5, 1.13])
    assert not peak_exceeded(trusted)
    assert peak_exceeded(beaten)
    shown = results_markdown(trusted, "kernels", "forward")
    assert '=== "GFLOP/s (% of matmul peak)"' in shown
    assert "<small>90%</small>" in shown
    hidden = results_markdown(beaten, "kernels", "forward")
    assert '=== "GFLOP/s"' in hidden
    assert "%" not in hidden.split('=== "GFLOP/s"')[1]
    assert "| 56.5 |" in hidden  # the rate itself stays


def test_committed_runs_decide_their_shares() -> None:
    first = json.loads((BENCH / "bench.json").read_text("utf-8"))
    second = json.loads((BENCH / "modern.json").read_text("utf-8"))
    assert not peak_exceeded(first)  # its fastest result reached 90% of its peak
    assert peak_exceeded(second)  # recompute decode: 113% of a low start-of-run peak
    assert "% of matmul peak" not in results_markdown(second, "decode", "decode")


def test_goals_table_puts_met_first_and_provenance_has_a_header() -> None:
    goals = {
        "goals": [
            {"goal": "a long description " * 5, "value": 1.18, "target": "<= 1.3", "met": True}
        ]
    }
    lines = goals_markdown(goals).splitlines()
    assert lines[0] == "| met | goal | measured | target |"
    assert lines[2].startswith("| yes | a long description")
    first = json.loads((BENCH / "bench.json").read_text("utf-8"))
    header = provenance_markdown(first).splitlines()[0]
    assert [cell.strip() for cell in header.strip("|").split("|")] == ["recorded", "value"]
