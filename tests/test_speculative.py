"""Prompt-lookup speculative decoding (attnlab.models.speculative): drafts as transformers
drafts them, and greedy tokens identical to decoding one token at a time."""

from __future__ import annotations

import random

import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from attnlab.caches.kv import DynamicKVCache, RollingKVCache, StaticKVCache
from attnlab.models.config import DecoderConfig, LinearAttentionConfig
from attnlab.models.decoder import Decoder
from attnlab.models.speculative import prompt_lookup, speculative_generate

pytestmark = pytest.mark.usefixtures("one_thread")


def test_drafts_equal_transformers_prompt_lookup() -> None:
    rng = random.Random(0)
    cases = 0
    for _ in range(300):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(2, 30))]
        num_draft, ngram = rng.randrange(1, 7), rng.randrange(1, 4)
        theirs = (
            PromptLookupCandidateGenerator(
                num_output_tokens=num_draft, max_matching_ngram_size=ngram, max_length=1000
            )
            .get_candidates(torch.tensor([tokens]))[0][0, len(tokens) :]
            .tolist()
        )
        ours = prompt_lookup(tokens, num_draft, ngram)
        assert ours == theirs, (tokens, num_draft, ngram)
        cases += bool(ours)
    assert cases > 200  # most sequences over 4 symbols repeat themselves


def _model(**extra: object) -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=40, d_model=32, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=8, hidden_dim=48, **extra)  # type: ignore[arg-type]  # fmt: skip
    return Decoder(config).double().eval()  # float64: no near ties between the two ways


def test_speculative_tokens_equal_greedy_tokens() -> None:
    model = _model(windows=(None, 5))  # a sliding layer too: its cache must not roll
    torch.manual_seed(1)
    phrase = torch.randint(0, 40, (9,))
    prompts = {
        "repeats itself": torch.cat([phrase, torch.randint(0, 40, (4,)), phrase[:5]]),
        "random": torch.randint(0, 40, (14,)),
        "four symbols": torch.randint(0, 4, (20,)),  # drafts everywhere, most wrong
    }
    rejected = 0
    for name, prompt in prompts.items():
        plain = model.generate(prompt, 24)
        fast, stats = speculative_generate(model, prompt, 24, num_draft=4, max_ngram=3)
        assert torch.equal(fast, plain), name
        assert stats.new_tokens == 24
        assert stats.passes + 1 + stats.accepted == 24  # each pass: its kept drafts + one
        rejected += stats.drafted - stats.accepted
    assert rejected > 10  # the caches took back the keys of rejected drafts
    looping = model.generate(prompts["repeats itself"], 40)  # a small random model loops
    fast, stats = speculative_generate(model, prompts["repeats itself"], 40, num_draft=4)
    assert torch.equal(fast, looping)
    assert stats.accepted > 10
    assert stats.tokens_per_pass > 1.5
    plain = model.generate(prompts["random"], 24)
    ended, _ = speculative_generate(model, prompts["random"], 24, eos_token_id=int(plain[20]))
    assert torch.equal(ended, plain[: ended.shape[0]])  # stops at the first end token
    assert int(ended[-1]) == int(plain[20])


def test_caches_take_back_tokens() -> None:
    k, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    for cache in (DynamicKVCache(), StaticKVCache(1, 8, 2, 4)):
        cache.update(k, v)
        cache.crop(4)
        keys, _ = cache.update(k[:, :, 4:], v[:, :, 4:])
        assert torch.equal(keys, k)
        with pytest.raises(ValueError, match=r"length must be an int in \[0, 6\]"):
            cache.crop(7)
    rolling = RollingKVCache(3)
    rolling.update(k, v)
    with pytest.raises(ValueError, match="RollingKVCache cannot take tokens back"):
        rolling.crop(2)


def test_speculation_refuses_what_it_cannot_do() -> None:
    model = _model()
    with pytest.raises(ValueError, match=r"ids must hold one sequence, \(t,\) or \(1, t\)"):
        speculative_generate(model, torch.zeros(2, 3, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="num_draft must be a positive int"):
        speculative_generate(model, torch.zeros(3, dtype=torch.long), 4, num_draft=0)
    with pytest.raises(ValueError, match="past the model's max_positions=2048"):
        speculative_generate(model, torch.zeros(3, dtype=torch.long), 2046)
    linear = LinearAttentionConfig(num_k_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8)
    hybrid = _model(layer_kinds=("linear", "full"), linear=linear)
    with pytest.raises(ValueError, match="caches that cannot take back rejected drafts"):
        speculative_generate(hybrid, torch.zeros(3, dtype=torch.long), 4)


def test_the_committed_speculation_benchmark() -> None:
    """docs/assets/bench/speculative.json, as the page reads it: speculation kept the
    greedy tokens on every prompt, and on quoting prompts attnlab's is at least 1.5 times
    its plain decoding and at least transformers' own prompt-lookup speed-up."""
    import json
    from pathlib import Path

    record = json.loads(Path("docs/assets/bench/speculative.json").read_text(encoding="utf-8"))
    assert len(record["prompts"]) == 5
    for prompt in record["prompts"]:
        assert prompt["identical"]["attnlab speculative = plain"]
    grounded = record["geometric_mean_speedup"]["grounded"]
    assert grounded["attnlab"] >= 1.5
    assert grounded["attnlab"] >= grounded["transformers"]
