"""The real-LLM benchmark: what it times is each library's real greedy decoding.

Everything runs on a small random `LlamaForCausalLM` and the `Decoder` copied from it;
the real SmolLM2 is loaded only by the benchmark's command (and by tests/test_llm.py).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.caches.kv import StaticKVCache
from attnlab.models.decoder import Decoder
from attnlab.tools.bench.llm import (
    FIGURES,
    IMPLS,
    LLMSettings,
    context_caches,
    decode_after_context,
    fit_slope,
    generate,
    measure_llm,
    write_llm_plots,
)

transformers = pytest.importorskip("transformers")

TINY = LLMSettings(
    new_tokens=7,
    prefill_tokens=12,
    contexts=(5, 20, 64),
    context_steps=3,
    rounds=1,
    prefill_rounds=1,
    context_rounds=1,
)
COMMITTED = Path(__file__).parents[1] / "docs/assets/bench/llm.json"


@pytest.fixture(scope="module")
def tiny(one_thread: None) -> tuple[Any, Decoder]:
    torch.manual_seed(3)
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=40,
        intermediate_size=72,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=10,
        max_position_embeddings=64,
        initializer_range=0.5,  # large weights: no near-ties between the top logits
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    hf = transformers.LlamaForCausalLM(config).eval()
    return hf, Decoder.from_hf(hf).eval()


def test_both_sides_generate_every_token_and_the_same_ones(tiny: tuple[Any, Decoder]) -> None:
    hf, decoder = tiny
    ids = torch.randint(3, 97, (1, 6))
    with torch.no_grad():
        reference = hf.generate(ids, max_new_tokens=9, do_sample=False)[:, 6:]
        ours, theirs = (
            generate(impl, m, ids, 9) for impl, m in zip(IMPLS, (decoder, hf), strict=True)
        )
    assert torch.equal(ours, theirs)
    # Make the model's end token the one greedy decoding picks third: transformers' own
    # default stops there, the benchmark's call of both sides does not.
    end = int(reference[0, 2])
    hf.generation_config.eos_token_id = end
    try:
        with torch.no_grad():
            stopped = hf.generate(ids, max_new_tokens=9, do_sample=False)
            forced = generate("transformers", hf, ids, 9)
    finally:
        hf.generation_config.eos_token_id = 2
    assert stopped.shape[1] < 6 + 9
    assert forced.shape == (1, 9)
    assert torch.equal(forced, ours)
    with pytest.raises(ValueError, match="impl must be one of"):
        generate("vllm", decoder, ids, 2)


def test_context_caches_hold_the_same_tokens_and_refill(tiny: tuple[Any, Decoder]) -> None:
    hf, decoder = tiny
    ours, theirs = context_caches(decoder, hf, 20, 4, seed=1)
    caches, cache = ours(), theirs()
    assert all(isinstance(c, StaticKVCache) and c.length == 20 for c in caches)
    assert cache.get_seq_length() == 20
    for layer, c in enumerate(caches):
        keys, values = c.update(torch.zeros(1, 2, 0, 10), torch.zeros(1, 2, 0, 10))
        torch.testing.assert_close(cache.layers[layer].keys, keys, rtol=0, atol=0)
        torch.testing.assert_close(cache.layers[layer].values, values, rtol=0, atol=0)
    token = torch.tensor([[17]])
    with torch.no_grad():
        first = decode_after_context("attnlab", decoder, caches, token, 4)
        again = decode_after_context("attnlab", decoder, ours(), token, 4)  # refilled
        theirs_out = decode_after_context("transformers", hf, cache, token, 4)
        # The same decode by hand: transformers' forward, one token at a time.
        manual, past, step = [], theirs(), token
        for i in range(4):
            position = torch.tensor([[20 + i]])
            out = hf(step, cache=past, position_ids=position, use_cache=True)
            step = out.logits[:, -1].argmax(-1, keepdim=True)
            manual.append(step)
    assert caches[0].length == 20 + 4
    assert torch.equal(first, again)
    assert torch.equal(first, theirs_out)
    assert torch.equal(first, torch.cat(manual, dim=1))


def test_fit_slope_on_known_numbers() -> None:
    # Exactly on a line of 2 µs per token of context: 2 ms per 1,000 tokens.
    assert fit_slope([(512, 0.010 + 512 * 2e-6), (8192, 0.010 + 8192 * 2e-6)]) == pytest.approx(2.0)
    # Off the line, by hand: mean context 3584, mean time 0.11; sum(dx * dy) = 138.24,
    # sum(dx^2) = 33,030,144, slope 4.1853e-6 s per token of context.
    points = [(512, 0.10), (2048, 0.10), (8192, 0.13)]
    assert fit_slope(points) == pytest.approx(138.24 / 33_030_144 * 1e6, rel=1e-6)
    with pytest.raises(ValueError, match="at least two points"):
        fit_slope([(512, 0.1)])


def test_measure_llm_record(tiny: tuple[Any, Decoder], tmp_path: Path) -> None:
    hf, decoder = tiny
    prompt, long_prompt = torch.randint(3, 97, (1, 5)), torch.randint(3, 97, (1, 12))
    data = measure_llm(hf, decoder, prompt, long_prompt, TINY, describe=lambda ids: str(len(ids)))
    assert set(data) == {
        "provenance",
        "settings",
        "model",
        "decode",
        "prefill",
        "context",
        "memory",
        "goals",
    }
    assert list(data["settings"]["contexts"]) == [5, 20, 64]
    decode = data["decode"]
    assert decode["tokens_equal"] is True
    assert decode["continuation"] == "7"
    for impl in IMPLS:  # one round: tokens/s is new_tokens over that round's time
        t = decode[impl]["time_s"]["median"]
        assert decode[impl]["tokens_per_s"]["median"] == pytest.approx(7 / t, rel=1e-3)
    speedup = decode["transformers"]["time_s"]["median"] / decode["attnlab"]["time_s"]["median"]
    assert decode["speedup"]["median"] == pytest.approx(speedup, rel=2e-3)
    assert data["prefill"]["tokens_equal"] is True
    assert data["prefill"]["tokens"] == 12
    points = data["context"]["points"]
    # 64 positions: the longest context leaves room for the fed token and 3 steps.
    assert [p["context"] for p in points] == [5, 20, 60]
    assert all(p["tokens_equal"] for p in points)
    slopes = data["context"]["slope_ms_per_1k"]
    for impl in IMPLS:
        expected = fit_slope([(p["context"], p[impl]["median"]) for p in points])
        assert slopes[impl] == pytest.approx(expected, rel=1e-3)  # 4 digits recorded
    memory = data["memory"]
    weights = sum(p.numel() for p in decoder.parameters()) * 4
    assert memory["weights_bytes"] == {"attnlab": weights, "transformers": weights}
    for part in ("decode", "prefill"):
        assert all(memory[part][impl] > 0 for impl in IMPLS)
    goal = data["goals"]["decode_speedup"]
    assert goal["met"] == (goal["measured"] >= 1.2)
    json.dumps(data)  # JSON-ready
    written = write_llm_plots(data, tmp_path)
    assert [p.name for p in written] == list(FIGURES)
    for path in written:
        assert ET.parse(path).getroot().tag.endswith("svg")


def test_measure_llm_refuses_bad_input(tiny: tuple[Any, Decoder]) -> None:
    hf, decoder = tiny
    prompt = torch.randint(3, 97, (1, 5))
    with pytest.raises(
        ValueError, match=r"long_prompt has 5 tokens but settings\.prefill_tokens=12"
    ):
        measure_llm(hf, decoder, prompt, prompt, TINY)
    with pytest.raises(ValueError, match=r"prompt must be \(1, t\) token ids, got \(5,\)"):
        measure_llm(hf, decoder, prompt[0], prompt, TINY)
    with pytest.raises(ValueError, match="rounds must be a positive int, got 0"):
        LLMSettings(rounds=0)


def test_committed_record_has_what_the_page_reads() -> None:
    data = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert data["model"]["parameters"] == 134_515_008
    assert data["settings"]["new_tokens"] == 128
    assert data["settings"]["prefill_tokens"] == 512
    decode, prefill = data["decode"], data["prefill"]
    assert decode["new_tokens"] == 128
    assert decode["tokens_equal"] is True
    assert prefill["tokens"] == 512
    assert prefill["tokens_equal"] is True
    for impl in IMPLS:
        assert decode[impl]["tokens_per_s"]["median"] > 0
        assert prefill[impl]["time_s"]["median"] > 0
        assert data["memory"]["decode"][impl] > 0
        assert data["memory"]["prefill"][impl] > 0
    assert {"median", "min", "max"} <= set(decode["speedup"]) & set(prefill["ratio"])
    points = data["context"]["points"]
    # The page's prose names these: 16 tokens after each context, 8192 positions.
    assert data["context"]["steps"] == 16
    assert data["model"]["max_positions"] == 8192
    assert [p["requested"] for p in points] == [512, 2048, 8192]
    assert all(p["tokens_equal"] for p in points)
    assert set(data["context"]["slope_ms_per_1k"]) == set(IMPLS)
    assert set(data["goals"]) == {"decode_speedup", "prefill_ratio"}
    assert data["figures"] == list(FIGURES)
    for name in FIGURES:  # drawn from this record, and shown on the page
        assert (COMMITTED.parent / name).is_file()
    prov = data["provenance"]
    assert prov["load_average_before"]
    assert prov["other_processes_cpu_share"] is not None
    # Recorded before the package moved into folders (attnlab.tools.bench became
    # attnlab.tools.bench): the record keeps the command that really made it.
    assert re.match(r"python -m attnlab(\.tools)?\.bench\.llm ", prov["command"])
