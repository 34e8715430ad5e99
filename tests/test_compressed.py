"""DeepSeek-V4's attention (attnlab.layers.compressed) against transformers'
DeepseekV4Attention from a small random config, for its three kinds (window only, CSA,
HCA): outputs, gradients, cached decode, the indexer's chosen entries; and the kernels'
own rules (no future entry, a gathered top-k)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close
from transformers import DeepseekV4Config, DynamicCache
from transformers.integrations import hub_kernels
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4

from attnlab.functional.compressed import pool_windows, visible_entries, window_keys
from attnlab.layers.compressed import CompressedAttention, CompressedConfig, CompressedKVCache

pytestmark = pytest.mark.usefixtures("one_thread")
WINDOW, CSA, HCA, D = 4, 2, 4, 32
KINDS = {"window": 0, "csa": 1, "hca": 2}
CONFIG = DeepseekV4Config(
    hidden_size=D, num_attention_heads=4, head_dim=16, q_lora_rank=12, sliding_window=WINDOW,
    compress_rates={"compressed_sparse_attention": CSA, "heavily_compressed_attention": HCA},
    index_n_heads=2, index_head_dim=8, index_topk=2, o_groups=2, o_lora_rank=6,
    num_hidden_layers=3, vocab_size=50, max_position_embeddings=64,
    layer_types=[
        "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
    ],
    rope_parameters={
        "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "compress": {"rope_type": "default", "rope_theta": 160000.0, "partial_rotary_factor": 0.25},
    },
)  # fmt: skip
CONFIG._attn_implementation = "eager"
ROTARY = v4.DeepseekV4RotaryEmbedding(CONFIG)


def _pair(kind: str, config: Any = CONFIG) -> tuple[Any, CompressedAttention]:
    torch.manual_seed(KINDS[kind])
    hf = v4.DeepseekV4Attention(config, KINDS[kind]).eval()
    with torch.no_grad():  # sinks and biases start empty, norms at 1: make them matter
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif "sinks" in name or "position_bias" in name:
                p.uniform_(-1.0, 1.0)
    return hf, CompressedAttention.from_hf(hf)


def _hf(hf: Any, x: Tensor, start: int, cache: Any = None) -> Tensor:
    """transformers' layer on `x`, the tokens from position `start`, with the sliding
    causal mask the model would build over the keys it holds."""
    t = x.shape[1]
    positions = torch.arange(start, start + t)
    s = t + (0 if cache is None else min(start, WINDOW - 1))
    i, j = positions[:, None], torch.arange(start + t - s, start + t)[None]
    allowed = (j <= i) & (i - j < WINDOW)
    mask = torch.zeros(t, s).masked_fill(~allowed, float("-inf")).expand(x.shape[0], 1, t, s)
    tables = {k: ROTARY(x, positions[None], layer_type=k) for k in ("main", "compress")}
    out: Tensor = hf(x, tables, positions[None], mask, cache=cache)[0]
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_outputs_gradients_and_cached_decode_equal_deepseek_v4(kind: str) -> None:
    hf, ours = _pair(kind)
    assert ours.config.kind == kind
    x = torch.randn(2, 11, D)
    x_hf, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected, got = _hf(hf, x_hf, 0), ours(x_ours)
    assert_close(got, expected, atol=1e-6, rtol=0)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    got.backward(grad)
    assert x_ours.grad is not None
    assert x_hf.grad is not None
    assert_close(x_ours.grad, x_hf.grad, atol=1e-6, rtol=0)
    params = dict(hf.named_parameters())
    for name, theirs in (("out_up.weight", "o_b_proj.weight"), ("sink_logits", "sinks")):
        assert_close(ours.get_parameter(name).grad, params[theirs].grad, atol=1e-6, rtol=0)
    if kind != "window":
        theirs = params["compressor.position_bias"].grad
        assert_close(ours.get_parameter("compressor.position_bias").grad, theirs, atol=1e-6, rtol=0)
    # Prefill 6 tokens, then decode 5 one at a time: a window of 3 held tokens, entries
    # made as windows complete, the pending tokens and CSA's overlap carried over.
    cache, state = DynamicCache(config=CONFIG), ours.new_cache()
    theirs_steps, ours_steps, start = [], [], 0
    with torch.no_grad():
        for step in (6, 1, 1, 1, 1, 1):
            chunk = x[:, start : start + step]
            theirs_steps.append(_hf(hf, chunk, start, cache))
            ours_steps.append(ours(chunk, cache=state))
            start += step
    assert_close(torch.cat(ours_steps, 1), torch.cat(theirs_steps, 1), atol=1e-6, rtol=0)
    if kind != "csa":  # CSA's ReLU scores tie at 0, and topk breaks ties by length
        assert_close(torch.cat(ours_steps, 1), expected.detach(), atol=1e-5, rtol=0)
    assert (state.seen, state.length) == (11, WINDOW - 1)
    ratio = {"window": 0, "csa": CSA, "hca": HCA}[kind]
    assert state.series["entries"].count == (11 // ratio if ratio else 0)


@pytest.mark.parametrize("kind", ["csa", "hca"])
def test_yarn_on_the_compressed_layers_equals_deepseek_v4(kind: str) -> None:
    """The released V4 stretches its compressed layers' RoPE by YaRN (factor 16, no
    factor on cos and sin): queries, keys, entries and the indexer all rotate by it."""
    yarn = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4,
            "beta_fast": 32, "beta_slow": 1}  # fmt: skip
    config = DeepseekV4Config(**(CONFIG.to_dict() | {"rope_parameters": None}))
    config.rope_parameters = {
        "main": CONFIG.rope_parameters["main"],
        "compress": {**CONFIG.rope_parameters["compress"], **yarn, "attention_factor": 1.0},
    }
    config._attn_implementation = "eager"
    hf, ours = _pair(kind, config)  # every parameter set (some start as torch.empty)
    assert ours.config.compress_rope_scaling is not None
    assert ours.config.compress_rope_scaling.rope_type == "yarn"
    rotary = v4.DeepseekV4RotaryEmbedding(config)
    x, positions = torch.randn(2, 13, D), torch.arange(13)
    i, j = positions[:, None], positions[None]
    mask = torch.zeros(13, 13).masked_fill(~((j <= i) & (i - j < WINDOW)), float("-inf"))
    tables = {k: rotary(x, positions[None], layer_type=k) for k in ("main", "compress")}
    with torch.no_grad():
        expected = hf(x, tables, positions[None], mask.expand(2, 1, 13, 13))[0]
        assert_close(ours(x), expected, atol=1e-6, rtol=0)
        plain = CompressedAttention(D, replace(ours.config, compress_rope_scaling=None))
        plain.load_state_dict(ours.state_dict())
        assert (plain(x) - expected).abs().max() > 1e-3  # the stretch matters here


def test_the_indexer_chooses_what_transformers_chooses_and_never_the_future() -> None:
    hf, ours = _pair("csa")
    x = torch.randn(4, 17, D)
    positions = torch.arange(17)
    with torch.no_grad():
        theirs = hf.compressor.indexer(x, hf.q_a_norm(hf.q_a_proj(x)), positions[None], None, 1)
        q_latent = ours.q_norm(ours.q_down(x))
        entries = ours.compressor(x).shape[1]
        chosen = ours.choose(x, q_latent, positions, entries, None)
        scores = ours.index_scores(x, q_latent, positions)  # (b, t, n)
    assert chosen.shape == theirs.shape == (4, 17, 2)
    # Equal as sets wherever the 2nd and 3rd best scores differ: ReLU makes ties at 0,
    # and either choice is right there.
    ranked = scores.sort(-1, descending=True).values
    untied = ranked[..., 1] != ranked[..., 2]
    same = (chosen.sort(-1).values == theirs.sort(-1).values).all(-1)
    assert int(untied.sum()) > 30
    assert bool(same[untied].all())
    # Never an entry that is not complete at the query; none before the first window.
    visible = visible_entries(positions, entries, CSA).expand(4, -1, -1)
    assert bool(visible.gather(-1, chosen.clamp(min=0))[chosen >= 0].all())
    assert bool((chosen[:, :1] == -1).all())


def test_kernels_pool_gather_and_window_by_their_rules() -> None:
    kv, gate = torch.randn(1, 6, 4), torch.randn(1, 6, 4)
    pooled, last = pool_windows(kv, gate, torch.zeros(2, 4), 2)
    weights = gate.view(1, 3, 2, 4).softmax(2)
    assert_close(pooled, (kv.view(1, 3, 2, 4) * weights).sum(2))
    assert last is None
    # Overlapping: entry w mixes series a of window w - 1 with series b of window w.
    both = torch.randn(1, 4, 6)
    gates = torch.randn(1, 4, 6)
    pooled, last = pool_windows(both, gates, torch.zeros(2, 6), 2, overlap=True)
    slots = torch.cat([both[:, 0:2, :3], both[:, 2:4, 3:]], 1)  # entry 1's four tokens
    mix = torch.cat([gates[:, 0:2, :3], gates[:, 2:4, 3:]], 1).softmax(1)
    assert_close(pooled[:, 1], (slots * mix).sum(1))
    assert last is not None
    assert torch.equal(last[0], both[:, 2:4, :3])
    assert visible_entries(torch.tensor([0, 3, 4, 7]), 3, 4).tolist() == [
        [False, False, False], [True, False, False], [True, False, False], [True, True, False],
    ]  # fmt: skip
    windows, valid = window_keys(torch.arange(5.0).view(1, 5, 1), 2, 3)
    assert windows[0, :, :, 0].tolist() == [[1.0, 2.0, 3.0], [2.0, 3.0, 4.0]]
    assert bool(valid.all())
    assert window_keys(torch.ones(1, 2, 1), 2, 3)[1].tolist() == [
        [False, False, True], [False, True, True],
    ]  # fmt: skip


def test_bad_sizes_and_inputs_are_refused_by_name() -> None:
    good: dict[str, Any] = dict(
        kind="csa", num_heads=4, head_dim=16, q_lora_rank=8, window=4, rope_dims=4, out_groups=2
    )
    for change, error, message in (
        ({"ratio": 0}, ValueError, "ratio must be a positive int"),
        ({"top_k": 0}, ValueError, "top_k must be a positive int"),
        ({"rope_dims": 3}, ValueError, "rope_dims"),
        ({"out_groups": 3}, ValueError, "num_heads \\* head_dim must be a multiple of out_groups"),
        ({"kind": "dsa"}, ValueError, "kind must be one of"),
        ({"index_head_dim": 2}, ValueError, "rope_dims"),
    ):
        with pytest.raises(error, match=message):
            CompressedConfig(**(good | change))
    layer = CompressedAttention(D, CompressedConfig(**good))
    with pytest.raises(ValueError, match="x must be batched"):
        layer(torch.randn(5, D))
    with pytest.raises(TypeError, match="cache must be this layer's CompressedKVCache"):
        layer(torch.randn(1, 5, D), cache=DynamicCache(config=CONFIG))  # type: ignore[arg-type]
    state = layer.new_cache()
    layer(torch.randn(2, 3, D), cache=state)
    with pytest.raises(ValueError, match="cache holds 2 sequences but x has b=1"):
        layer(torch.randn(1, 1, D), cache=state)
    with pytest.raises(ValueError, match="at least one token"):
        layer(torch.randn(1, 0, D))
    hca = CompressedAttention(D, CompressedConfig(**(good | {"kind": "hca"})))
    with pytest.raises(TypeError, match=r"this layer's CompressedKVCache .* \('csa', 4, 16\)"):
        layer(torch.randn(2, 1, D), cache=hca.new_cache())
    with pytest.raises(TypeError, match="layer must be a transformers DeepseekV4Attention"):
        CompressedAttention.from_hf(torch.nn.Linear(2, 2))
    assert isinstance(layer.new_cache(), CompressedKVCache)


def test_no_hub_kernel_is_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests (and the pages) run transformers' own PyTorch code: hub kernels are off,
    and a layer run here never asks the Hub for one."""
    assert os.environ["USE_HUB_KERNELS"] == "NO"
    enabled = hub_kernels._kernels_enabled  # a function from 5.25, a flag before
    assert not (enabled() if callable(enabled) else enabled)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a hub kernel was fetched: {args}")

    monkeypatch.setattr(hub_kernels, "get_kernel", refuse)  # the fetch, in 5.24 and 5.25
    assert hub_kernels.lazy_load_kernel("deep-gemm", mapping={}) is None  # a hub kernel: off
    hf, _ = _pair("csa")
    with torch.no_grad():
        _hf(hf, torch.randn(1, 5, D), 0)
