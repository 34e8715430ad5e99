"""GroupedQueryAttention equals Hugging Face's Llama, Mistral, Qwen2, Qwen3, OLMo 2,
Gemma 2, Gemma 3 and gpt-oss attention layers.

The reference layers are built by `transformers` from small random configs (nothing is
downloaded), driven the way their models drive them: position embeddings from the
model's rotary module, the 4-d mask from `transformers.masking_utils`
(`create_causal_mask` for Llama, `create_sliding_window_causal_mask` for Mistral and
Qwen2 and Gemma 3's sliding layers), and for decoding the library's own `DynamicCache` /
`StaticCache`. With a sliding
window those caches keep only the last `window - 1` tokens (a rolling buffer) while
attnlab's keep everything and mask; the outputs must agree anyway.

Dimensions all differ: d_model 42 (transformers wants a multiple of the heads), 6 query
heads, 2 (or 1, or 6) key/value heads, head_dim 12 (so num_heads * head_dim = 72 is not
d_model), batch 3, 9 tokens, window 4. Qwen3 and Gemma 3 normalise each query and key
head (Gemma by `1 + weight`), OLMo 2 the whole projections; Gemma 3 scales the scores by
`query_pre_attn_scalar ** -0.5` (10 here, not head_dim) and has one RoPE per layer type
(its full layer here with linear scaling), so its sliding and full layers are two cases.
Gemma 2 caps its scores (softcap 2 here, so the cap bites on these scores) and runs only
eagerly in transformers, as does gpt-oss (learned sinks, biases, YaRN, sliding and full
layers); they are ported onto the three backends: scratch (softcap), torch (sinks
emulated as an extra key) and flash (sinks in the tiles).

What the references lack, and is therefore tested elsewhere (tests/test_gqa.py against
attnlab's own full forward): the interleaved RoPE layout (every Hugging Face layer here
uses rotate_half), attention without RoPE (all three always rotate), and a sliding window
on a Llama layer (LlamaAttention has none; Mistral and Qwen2 stand in).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    DynamicCache,
    Gemma2Config,
    Gemma3TextConfig,
    GptOssConfig,
    LlamaConfig,
    MistralConfig,
    Olmo2Config,
    Qwen2Config,
    Qwen3Config,
    StaticCache,
)
from transformers.masking_utils import (  # noqa: E402
    create_causal_mask,
    create_sliding_window_causal_mask,
)
from transformers.models.gemma2.modeling_gemma2 import (  # noqa: E402
    Gemma2Attention,
    Gemma2RotaryEmbedding,
)
from transformers.models.gemma3.modeling_gemma3 import (  # noqa: E402
    Gemma3Attention,
    Gemma3RotaryEmbedding,
)
from transformers.models.gpt_oss.modeling_gpt_oss import (  # noqa: E402
    GptOssAttention,
    GptOssRotaryEmbedding,
)
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaAttention,
    LlamaRotaryEmbedding,
)
from transformers.models.mistral.modeling_mistral import (  # noqa: E402
    MistralAttention,
    MistralRotaryEmbedding,
)
from transformers.models.olmo2.modeling_olmo2 import (  # noqa: E402
    Olmo2Attention,
    Olmo2RotaryEmbedding,
)
from transformers.models.qwen2.modeling_qwen2 import (  # noqa: E402
    Qwen2Attention,
    Qwen2RotaryEmbedding,
)
from transformers.models.qwen3.modeling_qwen3 import (  # noqa: E402
    Qwen3Attention,
    Qwen3RotaryEmbedding,
)

from attnlab.caches.kv import DynamicKVCache, StaticKVCache  # noqa: E402
from attnlab.layers.gqa import GroupedQueryAttention  # noqa: E402

D_MODEL, NUM_HEADS, HEAD_DIM, B, T, WINDOW = 42, 6, 12, 3, 9, 4
TOL = {"atol": 1e-5, "rtol": 1e-5}
KINDS = [
    "llama",
    "llama-bias",
    "mistral",
    "qwen2",
    "qwen3",
    "olmo2",
    "gemma3-local",
    "gemma3-global",
]
EAGER_KINDS = ["gemma2-local", "gptoss-local", "gptoss-global"]  # no sdpa in transformers
WINDOWED = ("mistral", "qwen2", "gemma3-local", "gemma2-local", "gptoss-local")
BACKEND = {"gemma2-local": "scratch", "gptoss-local": "torch", "gptoss-global": "flash"}
QK_NORM = {"qwen3": "head", "olmo2": "projection", "gemma3-local": "head", "gemma3-global": "head"}
IMPLS = ["eager", "sdpa"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread: None) -> None:
    """Every test here runs tiny layers (see conftest's `one_thread`)."""


class Reference:
    """One Hugging Face attention layer with the pieces its model would hand it."""

    def __init__(self, kind: str, impl: str, num_kv_heads: int = 2) -> None:
        common: dict[str, Any] = {
            "hidden_size": D_MODEL,
            "num_attention_heads": NUM_HEADS,
            "num_key_value_heads": num_kv_heads,
            "head_dim": HEAD_DIM,
            "num_hidden_layers": 1,
            "intermediate_size": 8,
            "vocab_size": 16,
            "max_position_embeddings": 64,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
        }
        config: Any
        layer_idx, self.rotary_args = 0, ()
        if kind.startswith("gptoss"):
            yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
            config = GptOssConfig(
                **common
                | {"num_hidden_layers": 2, "rope_parameters": {**yarn, "rope_theta": 500.0}},
                layer_types=["sliding_attention", "full_attention"],
                sliding_window=WINDOW,
                num_local_experts=2,
                num_experts_per_tok=1,
            )
            layer, rotary = GptOssAttention, GptOssRotaryEmbedding
            layer_idx = 0 if kind == "gptoss-local" else 1
        elif kind == "gemma2-local":
            config = Gemma2Config(
                **common,
                sliding_window=WINDOW,
                query_pre_attn_scalar=10,
                attn_logit_softcapping=2.0,
            )
            layer, rotary = Gemma2Attention, Gemma2RotaryEmbedding
        elif kind.startswith("gemma3"):
            rope = {"rope_type": "default", "rope_theta": 500.0}
            config = Gemma3TextConfig(
                **common
                | {
                    "num_hidden_layers": 2,
                    "rope_parameters": {
                        "sliding_attention": rope,
                        "full_attention": {**rope, "rope_type": "linear", "factor": 2.0},
                    },
                },
                layer_types=["sliding_attention", "full_attention"],
                sliding_window=WINDOW,
                query_pre_attn_scalar=10,
            )
            layer, rotary = Gemma3Attention, Gemma3RotaryEmbedding
            layer_idx = 0 if kind == "gemma3-local" else 1
            self.rotary_args = (config.layer_types[layer_idx],)
        elif kind == "qwen3":
            config = Qwen3Config(**common)
            layer, rotary = Qwen3Attention, Qwen3RotaryEmbedding
        elif kind == "olmo2":
            config = Olmo2Config(**common)
            layer, rotary = Olmo2Attention, Olmo2RotaryEmbedding
        elif kind.startswith("llama"):
            config = LlamaConfig(**common, attention_bias=kind == "llama-bias")
            layer, rotary = LlamaAttention, LlamaRotaryEmbedding
        elif kind == "mistral":
            config = MistralConfig(**common, sliding_window=WINDOW)
            layer, rotary = MistralAttention, MistralRotaryEmbedding
        else:
            # max_window_layers=0: layer 0 is a "sliding_attention" layer.
            config = Qwen2Config(
                **common, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0
            )
            layer, rotary = Qwen2Attention, Qwen2RotaryEmbedding
        config._attn_implementation = impl
        self.config = config
        self.layer_idx = layer_idx  # Gemma 3's full layer is layer 1 of its cache
        self.attn: nn.Module = layer(config, layer_idx=layer_idx).eval()
        with torch.no_grad():  # biases start at 0 in some versions: make them matter
            for p in self.attn.parameters():
                p.normal_(0.0, 0.2)
        self.rotary = rotary(config)
        self.windowed = kind in WINDOWED

    def __call__(self, x: Tensor, cache: Any = None, offset: int = 0) -> Tensor:
        """The layer on `x`; RoPE positions shifted by `offset` (the mask keeps token order)."""
        past = 0 if cache is None else cache.get_seq_length(self.layer_idx)
        positions = torch.arange(past, past + x.shape[1])[None]  # (1, t)
        make_mask = create_sliding_window_causal_mask if self.windowed else create_causal_mask
        mask = make_mask(
            config=self.config,
            inputs_embeds=x,
            attention_mask=None,
            cache=cache,
            position_ids=positions,
        )
        embeddings = self.rotary(x, positions + offset, *self.rotary_args)
        out: Tensor = self.attn(
            x, position_embeddings=embeddings, attention_mask=mask, cache=cache
        )[0]
        return out


def _ours(name: str) -> str:
    """attnlab's name of a transformers attention parameter: PyTorch's `out_proj` for
    `o_proj`, `sink_logits` for gpt-oss's `sinks`; the others are the same."""
    head, dot, rest = name.partition(".")
    return {"o_proj": "out_proj", "sinks": "sink_logits"}.get(head, head) + dot + rest


def _port(ref: Reference, kind: str) -> GroupedQueryAttention:
    return GroupedQueryAttention.from_hf(ref.attn, backend=BACKEND.get(kind, "torch"))  # type: ignore[arg-type]


OUTPUT_CASES = [(k, i) for k in KINDS for i in IMPLS] + [(k, "eager") for k in EAGER_KINDS]


@pytest.mark.parametrize(("kind", "impl"), OUTPUT_CASES, ids=[f"{k}-{i}" for k, i in OUTPUT_CASES])
def test_from_hf_outputs_and_gradients_equal(kind: str, impl: str) -> None:
    ref = Reference(kind, impl)
    ours = _port(ref, kind)
    assert ours.window == (WINDOW if ref.windowed else None)
    assert ours.rope is not None
    assert ours.rope.base == 500.0
    x = torch.randn(B, T, D_MODEL, requires_grad=True)
    x_ours = x.detach().clone().requires_grad_(True)
    expected, got = ref(x), ours(x_ours)
    torch.testing.assert_close(got, expected, **TOL)

    grad = torch.randn_like(expected)
    expected.backward(grad)
    got.backward(grad)
    assert x.grad is not None
    assert x_ours.grad is not None
    torch.testing.assert_close(x_ours.grad, x.grad, **TOL)
    theirs = {_ours(n): p for n, p in ref.attn.named_parameters()}
    mine = dict(ours.named_parameters())
    assert set(mine) == set(theirs)  # same names: q_proj.weight, ..., q_proj.bias (Qwen2)
    for name, p in theirs.items():
        ours_grad = mine[name].grad
        assert p.grad is not None, name
        assert ours_grad is not None, name
        torch.testing.assert_close(ours_grad, p.grad, **TOL, msg=name)


@pytest.mark.parametrize("kind", ["llama", "gemma2-local", "gptoss-local"])
def test_from_hf_picks_a_backend_that_runs_the_layer(kind: str) -> None:
    # Without a backend, a softcapped Gemma 2 layer runs on scratch (PyTorch's SDPA has
    # no softcap); the others stay on PyTorch's fused kernel. The repr says which.
    ref = Reference(kind, "eager")
    ours = GroupedQueryAttention.from_hf(ref.attn)
    picked = "scratch" if kind == "gemma2-local" else "torch"
    assert ours.backend == picked
    assert f"backend={picked!r}" in repr(ours)
    x = torch.randn(B, T, D_MODEL)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), **TOL)
    if kind == "gemma2-local":  # asked for by name, a backend that cannot run it is refused
        with pytest.raises(ValueError, match=r"backend='torch' has no softcap .* softcap=2.0"):
            GroupedQueryAttention.from_hf(ref.attn, backend="torch")


@pytest.mark.parametrize("kind", KINDS + EAGER_KINDS)
def test_from_hf_copies_layout_and_biases(kind: str) -> None:
    ref = Reference(kind, "eager")
    ours = _port(ref, kind)
    assert (ours.d_model, ours.num_heads, ours.num_kv_heads, ours.head_dim) == (
        D_MODEL,
        NUM_HEADS,
        2,
        HEAD_DIM,
    )
    assert (ours.qk_norm and ours.qk_norm.over) == QK_NORM.get(kind)
    gemma, gpt_oss = kind.startswith("gemma"), kind.startswith("gptoss")
    assert ours.scale == (10**-0.5 if gemma else None)  # query_pre_attn_scalar = 10
    assert (ours.q_norm is not None and ours.q_norm.unit_offset) == kind.startswith("gemma3")
    assert ours.softcap == (2.0 if kind == "gemma2-local" else None)
    assert (ours.sink_logits is not None) == gpt_oss
    scaled = ours.rope is not None and ours.rope.scaling is not None
    assert scaled == (kind == "gemma3-global" or gpt_oss)  # Gemma 3: one RoPE per layer type
    assert ours.bias == (kind in ("llama-bias", "qwen2") or gpt_oss)
    assert ours.out_bias == (kind == "llama-bias" or gpt_oss)  # Qwen2: on q, k, v only
    for name, p in ref.attn.named_parameters():
        assert torch.equal(ours.get_parameter(_ours(name)), p), name
        assert ours.get_parameter(_ours(name)).data_ptr() != p.data_ptr()


# Prefill lengths, then decode steps (several tokens at once, then one at a time), ending
# after 11 tokens: windows of 4 are crossed both inside the prefill and while decoding.
SCHEDULES = [[5, 1, 1, 1, 1, 1, 1], [2, 3, 1, 1, 4], [1] * 11]


def _decode(module: Any, x: Tensor, schedule: list[int], cache: Any) -> list[Tensor]:
    outs, start = [], 0
    for n in schedule:
        outs.append(module(x[:, start : start + n], cache=cache))
        start += n
    return outs


# Each layer with each attention implementation, each under a different schedule.
DECODE_CASES = [
    ("llama", "eager", SCHEDULES[0]),
    ("llama", "sdpa", SCHEDULES[1]),
    ("mistral", "eager", SCHEDULES[1]),
    ("mistral", "sdpa", SCHEDULES[2]),
    ("qwen2", "eager", SCHEDULES[2]),
    ("qwen2", "sdpa", SCHEDULES[0]),
    ("qwen3", "sdpa", SCHEDULES[1]),
    ("olmo2", "eager", SCHEDULES[0]),
    ("gemma3-local", "sdpa", SCHEDULES[2]),
    ("gemma3-global", "eager", SCHEDULES[1]),
    ("gemma2-local", "eager", SCHEDULES[0]),
    ("gptoss-local", "eager", SCHEDULES[2]),
    ("gptoss-global", "eager", SCHEDULES[1]),
]


@pytest.mark.parametrize(
    ("kind", "impl", "schedule"),
    DECODE_CASES,
    ids=[f"{kind}-{impl}-{'+'.join(map(str, s))}" for kind, impl, s in DECODE_CASES],
)
def test_cached_decode_equals_hf_dynamic_cache(kind: str, impl: str, schedule: list[int]) -> None:
    ref = Reference(kind, impl)
    ours = _port(ref, kind)
    x = torch.randn(B, sum(schedule), D_MODEL)
    with torch.no_grad():
        expected = _decode(ref, x, schedule, DynamicCache(config=ref.config))
        for cache in (DynamicKVCache(), StaticKVCache(B, 16, 2, HEAD_DIM)):
            got = _decode(ours, x, schedule, cache)
            for step, (g, e) in enumerate(zip(got, expected, strict=True)):
                torch.testing.assert_close(g, e, **TOL, msg=f"step {step}")
        full = ref(x)
    torch.testing.assert_close(torch.cat(expected, dim=1), full, **TOL)


@pytest.mark.parametrize("kind", ["llama", "mistral"])
@pytest.mark.parametrize("num_kv_heads", [1, NUM_HEADS], ids=["mqa", "mha"])
def test_cached_decode_equals_hf_static_cache(kind: str, num_kv_heads: int) -> None:
    ref = Reference(kind, "sdpa", num_kv_heads=num_kv_heads)
    ours = GroupedQueryAttention.from_hf(ref.attn)
    assert ours.num_kv_heads == num_kv_heads
    schedule = SCHEDULES[0]
    x = torch.randn(B, sum(schedule), D_MODEL)
    with torch.no_grad():
        theirs = StaticCache(config=ref.config, max_cache_len=16)
        expected = _decode(ref, x, schedule, theirs)
        got = _decode(ours, x, schedule, StaticKVCache(B, 16, num_kv_heads, HEAD_DIM))
    torch.testing.assert_close(torch.cat(got, dim=1), torch.cat(expected, dim=1), **TOL)


def test_positions_of_one_row_and_past_the_cache_equal_hf() -> None:
    """HF's `position_ids` `(1, t)` for a batch of 3, starting at 100 in an empty cache."""
    ref = Reference("mistral", "sdpa")
    ours = GroupedQueryAttention.from_hf(ref.attn)
    x = torch.randn(B, 11, D_MODEL)
    theirs, mine = DynamicCache(config=ref.config), DynamicKVCache()
    start = 0
    with torch.no_grad():
        for n in (5, 1, 1, 4):
            expected = ref(x[:, start : start + n], cache=theirs, offset=100)
            row = torch.arange(100 + start, 100 + start + n)[None]  # (1, t)
            got = ours(x[:, start : start + n], cache=mine, positions=row)
            torch.testing.assert_close(got, expected, **TOL, msg=f"from {start}")
            start += n


@pytest.mark.parametrize("kind", ["llama-bias", "qwen2"])
def test_float64_equals_hf_float64(kind: str) -> None:
    """RoPE rotates in float64 for float64 input; HF's SDPA layer does too."""
    ref = Reference(kind, "sdpa")
    ref.attn.double()
    ours = GroupedQueryAttention.from_hf(ref.attn)
    assert ours.q_proj.weight.dtype == torch.float64
    x = torch.randn(B, T, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        expected = ref(x, offset=4000)
        got = ours(x, positions=torch.arange(T) + 4000)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)


def test_from_hf_rejects_other_modules() -> None:
    with pytest.raises(
        TypeError, match=r"module must be a transformers LlamaAttention.*got Linear"
    ):
        GroupedQueryAttention.from_hf(nn.Linear(2, 3))


def test_from_hf_rejects_a_rope_scaling_it_does_not_implement() -> None:
    ref = Reference("llama", "eager")
    pairs = HEAD_DIM // 2
    ref.attn.config.rope_parameters = {
        "rope_type": "longrope",
        "rope_theta": 500.0,
        "factor": 2.0,
        "short_factor": [1.0] * pairs,
        "long_factor": [1.0] * pairs,
    }
    with pytest.raises(ValueError, match=r"rope_type must be one of .* got 'longrope'"):
        GroupedQueryAttention.from_hf(ref.attn)


def test_from_hf_reads_the_window_per_layer_and_keeps_dtype_and_mode() -> None:
    # Qwen2 slides only on layers listed as "sliding_attention" in config.layer_types.
    config = Qwen2Config(
        hidden_size=D_MODEL,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=2,
        head_dim=HEAD_DIM,
        num_hidden_layers=2,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=1,  # layer 0 full attention, layer 1 sliding
    )
    full = Qwen2Attention(config, layer_idx=0).double()
    sliding = Qwen2Attention(config, layer_idx=1).eval()
    ours_full = GroupedQueryAttention.from_hf(full)
    assert ours_full.window is None
    assert ours_full.q_proj.weight.dtype == torch.float64
    assert ours_full.training
    ours_sliding = GroupedQueryAttention.from_hf(sliding)
    assert ours_sliding.window == WINDOW
    assert not ours_sliding.training
