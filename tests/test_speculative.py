"""Prompt-lookup speculative decoding (attnlab.models.speculative): drafts as transformers
drafts them, and greedy tokens identical to decoding one token at a time."""

from __future__ import annotations

import random

import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from attnlab.caches.kv import DynamicKVCache, RollingKVCache, StaticKVCache
from attnlab.functional.flex import to_dense
from attnlab.models.config import DecoderConfig, LinearAttentionConfig
from attnlab.models.decoder import Decoder
from attnlab.models.speculative import (
    DraftTree,
    prompt_lookup,
    prompt_lookup_tree,
    speculative_generate,
    tree_mask,
    tree_mask_mod,
    verify_tree,
)

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


def _model(std: float | None = None, **extra: object) -> Decoder:
    """A small float64 model (no near ties between the two ways); with `std`, its matrices
    drawn with that spread: peaked logits and varied text instead of one repeated token."""
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=40, d_model=32, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=8, hidden_dim=48, **extra)  # type: ignore[arg-type]  # fmt: skip
    model = Decoder(config).double().eval()
    if std is not None:
        with torch.no_grad():
            for weight in model.parameters():
                if weight.ndim == 2:
                    weight.normal_(0, std)
    return model


def test_speculative_tokens_equal_greedy_tokens() -> None:
    model = _model(windows=(None, 5))  # a sliding layer too: its cache must not roll
    # Trees: global layers only (a node's slot is not its position); peaked, varied text.
    full = _model(std=0.3)
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
        tree, _ = speculative_generate(full, prompt, 24, num_draft=4, branches=3)
        assert torch.equal(tree, full.generate(prompt, 24)), name
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
        cache.retain([0, 2, 3, 5])  # a tree's accepted path: 1 and 4 go, 5 moves up
        assert torch.equal(cache.held[0], k[:, :, [0, 2, 3, 5]])
        with pytest.raises(ValueError, match=r"strictly increasing ints in \[0, 4\)"):
            cache.retain([0, 2, 2])
    rolling = RollingKVCache(3)
    rolling.update(k, v)
    with pytest.raises(ValueError, match="RollingKVCache cannot take tokens back"):
        rolling.crop(2)


def test_tree_drafts_and_their_mask() -> None:
    """A tree merges the continuations of every occurrence (the first is prompt lookup's
    chain); its mask lets each node see its ancestors only, the FlexAttention form equal
    to the dense one; parents that loop or come later are refused."""
    rng = random.Random(1)
    for _ in range(200):
        tokens = [rng.randrange(3) for _ in range(rng.randrange(2, 20))]
        tree = prompt_lookup_tree(tokens, 3, 2, branches=3)
        chain = prompt_lookup(tokens, 3, 2)
        assert list(tree.tokens[: len(chain)]) == chain  # the first branch
        assert len(set(zip(tree.parents, tree.tokens, strict=True))) == len(tree)  # merged
    mask = tree_mask([-1, 0, -1, 2])  # two branches of two: root, a, a', b, b'
    ancestors = {1: {0, 1}, 2: {0, 1, 2}, 3: {0, 3}, 4: {0, 3, 4}}
    for row, seen in ancestors.items():
        assert mask[row].nonzero().flatten().tolist() == sorted(seen)
    dense = to_dense(tree_mask_mod([-1, 0, -1, 2], past=3), 5, 8)[0, 0]
    assert torch.equal(dense, torch.cat([torch.ones(5, 3, dtype=torch.bool), mask], 1))
    with pytest.raises(ValueError, match=r"parents form a cycle \(1 -> 2 -> 1\)"):
        DraftTree((5, 6, 7), (-1, 2, 1))
    with pytest.raises(ValueError, match=r"parents\[1\]=2: a node's parent must be -1"):
        DraftTree((5, 6, 7), (-1, 2, -1))
    with pytest.raises(ValueError, match="tokens has 2 nodes but parents has 1"):
        DraftTree((5, 6), (-1,))


def test_a_tree_verified_in_one_pass_keeps_the_greedy_path() -> None:
    """The model's path is the second branch: one pass keeps it, and the caches then hold
    exactly the keys that decoding the path token by token leaves; a tree that does not
    fit and a pass that raises leave the caches as they were."""
    model = _model(std=0.3)
    torch.manual_seed(2)
    prompt = torch.randint(0, 40, (7,))
    greedy = model.generate(prompt, 4)[7:].tolist()  # the token after the prompt, then 3
    wrong = (greedy[1] + 1) % 40
    tree = DraftTree((wrong, greedy[1], greedy[2], wrong), (-1, -1, 1, 1))
    with torch.inference_mode():
        caches = model.make_cache(1, 16, rolling=False)
        model(prompt[None], cache=caches)
        assert verify_tree(model, caches, greedy[0], tree) == greedy[1:4]
        plain = model.make_cache(1, 16, rolling=False)
        model(torch.tensor([[*prompt.tolist(), *greedy[:3]]]), cache=plain)
        for ours, theirs in zip(caches, plain, strict=True):
            torch.testing.assert_close(ours.held, theirs.held)  # type: ignore[attr-defined]
        held = [cache.held[0].clone() for cache in caches]  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="have room for 6 more"):
            verify_tree(model, caches, greedy[3], DraftTree.chain([1] * 6))
        layer = model.layers[1]
        original = layer.forward
        layer.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="boom"):
            verify_tree(model, caches, greedy[3], tree)
        layer.forward = original  # type: ignore[method-assign]
        for cache, before in zip(caches, held, strict=True):
            assert torch.equal(cache.held[0], before)  # type: ignore[attr-defined]
    windowed = _model(windows=(None, 5))
    with pytest.raises(ValueError, match="but the model has windows: they count keys by slot"):
        verify_tree(windowed, windowed.make_cache(1, 16, rolling=False), 1, tree)
    tuned = _model(temperature=(8.0, 0.1), rope_layers=(True, False))
    with pytest.raises(ValueError, match="but the model has temperature"):  # before prefill
        speculative_generate(tuned, torch.tensor([1, 2, 3, 1, 2]), 4, branches=2)


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
    """docs/assets/bench/speculative.json, as the page reads it: speculation (chain or
    tree) kept the greedy tokens on every prompt, and they are transformers' tokens too;
    the tree took no more passes than the chain; and on quoting prompts attnlab's is at
    least 1.5 times its plain decoding and at least transformers' own prompt-lookup
    speed-up."""
    import json
    from pathlib import Path

    record = json.loads(Path("docs/assets/bench/speculative.json").read_text(encoding="utf-8"))
    assert len(record["prompts"]) == 5
    for prompt in record["prompts"]:  # the same greedy tokens, whichever way
        assert all(prompt["identical"].values()), prompt["prompt"]
        assert prompt["tree"]["passes"] <= prompt["passes"]
    grounded = record["geometric_mean_speedup"]["grounded"]
    assert grounded["attnlab"] >= 1.5
    assert grounded["attnlab"] >= grounded["transformers"]
