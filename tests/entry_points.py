"""The registry of attnlab's public entry points, shared by the cross-cutting test suites.

`ENTRIES` lists every public way to run attention (modules and their methods, functions,
RoPE, the KV caches), each with the float inputs it takes and how to call it;
`tests/test_numerics.py` runs every numerical property over all of it and
`tests/test_validation.py` every check of bad input that applies to all, so a new entry
point gets every check by being added here. Tensors on the `meta` device (shapes and
dtypes without data) stand in for a second device.

Ring attention is listed with both shard layouts, on a process group of one rank in this
process (`_process_group.one_rank_group`, made for the call and gone after it: a group of
one rank sends no message, so the custom backward runs fine later); its runs across
ranks are in `test_distributed.py`. Where a property cannot apply to an entry, a field
says so: `query=None` where the queries cannot be empty on their own (ring attention's
queries, keys and values are one shard of one sequence, of one length).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from _process_group import one_rank_group
from attnlab import (
    CausalSelfAttention,
    CrossAttention,
    DynamicKVCache,
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    MultiHeadLatentAttention,
    SelfAttention,
    StaticKVCache,
)
from attnlab import functional as AF
from attnlab.distributed import ShardLayout, ring_attention
from attnlab.functional.linear import delta_rule, linear_attention
from attnlab.functional.sparse import topk_indices
from attnlab.layers.gqa import HeadGates
from attnlab.layers.linear import GatedDeltaNet
from attnlab.layers.norms import QKNormSpec
from attnlab.layers.sparse import DeepSeekSparseAttention, LightningIndexer
from attnlab.rules import masks, rope
from attnlab.rules.scores import ScoreRule

# All sizes differ (a swapped pair of axes cannot pass by luck), and they are small: the
# finite differences of gradcheck cost two forward passes per input element and parameter.
B, T, S, D_IN, D_CTX, D_KQ, D_V, D_OUT, HEADS = 2, 3, 4, 5, 7, 6, 9, 8, 2
sdpa_torch = nn.functional.scaled_dot_product_attention


@dataclass
class Entry:
    """A public entry point: what to build, which float inputs it takes, how to call it.

    `names` maps an input's key to the argument name the entry's messages use for it
    (default: the key itself); `query` is the input whose length is the number of queries
    (None where an empty query input makes no sense for the entry).
    """

    shapes: dict[str, tuple[int, ...]]
    call: Callable[[nn.Module | None, dict[str, Tensor]], Tensor]
    build: Callable[[], nn.Module] | None = None
    weights: bool = False  # the output is attention weights (rows sum to 1)
    kwargs: dict[str, Any] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    query: str | None = "x"
    custom_backward: bool = False  # its gradient is hand-written (gradcheck it)
    differentiable: bool = True  # False: its output carries no gradient, by design
    # False: weights rebuilt from a float32 log-sum-exp, e^(s - lse), which subtracts two
    # numbers of the scores' size: at scores of 1e8 float32 keeps no digit of their
    # difference (fused kernels' backward passes share the limit).
    huge_scores: bool = True


def _key_padding(inputs: dict[str, Tensor], name: str = "context") -> Tensor:
    # The second sequence has 3 real tokens out of S, the first has all of them. Built on the
    # CPU and moved: the mask depends on the values of the lengths, which `meta` lacks.
    return masks.key_padding([S, 3], max_len=S).to(inputs[name].device)


def _bottom_right(inputs: dict[str, Tensor]) -> Tensor:
    # More queries than keys: the first queries have no key in their past at all.
    t_q, t_k = inputs["q"].shape[-2], inputs["k"].shape[-2]
    return masks.causal(t_q, t_k, align="bottom-right", device=inputs["q"].device)


def _blocked_keys(inputs: dict[str, Tensor]) -> Tensor:
    # nn.MultiheadAttention's key_padding_mask for the same lengths: (b, s), True = padding.
    return ~masks.padding([S, 3], max_len=S).to(inputs["context"].device)


def _mha_kv(backend: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        mha = MultiHeadAttention(D_IN, D_OUT, HEADS, d_context=D_CTX, d_value=D_V, backend=backend)  # type: ignore[arg-type]
        return mha.eval()

    return build


def build_mha(backend: str, cross: bool) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        d_context = D_CTX if cross else None
        return MultiHeadAttention(D_IN, D_OUT, HEADS, d_context=d_context, backend=backend).eval()  # type: ignore[arg-type]

    return build


def _flash_lse(q: Tensor, k: Tensor) -> Tensor:
    # The log-sum-exp of flash over these keys (zero values: only the lse is kept).
    values = k.new_zeros(*k.shape[:-1], 1)
    return AF.flash_attention(q, k, values, is_causal=True, return_lse=True)[1]


def _m(module: nn.Module | None) -> Any:
    assert module is not None
    return module


QKV_NAMES: dict[str, Any] = {"names": {"q": "query", "k": "key", "v": "value"}, "query": "q"}
KV_NAMES: dict[str, Any] = {"names": {"k": "key", "v": "value"}, "query": None}

# GQA and MLA: d_model, heads of an even size (RoPE rotates pairs), 2 key/value heads.
D_MODEL, GQA_HEADS, KV_HEADS = 12, 4, 2


def _gqa(
    backend: str, window: int | None = None, softcap: float | None = None, **options: Any
) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        return GroupedQueryAttention(
            D_MODEL,
            GQA_HEADS,
            KV_HEADS,
            head_dim=4,
            scores=ScoreRule(window=window, softcap=softcap),
            backend=backend,  # type: ignore[arg-type]
            **options,
        ).eval()

    return build


def _mla() -> nn.Module:
    return MultiHeadLatentAttention(
        D_MODEL, HEADS, kv_lora_rank=5, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=3
    ).eval()


def _decode(module: Any, x: Tensor, **kwargs: Any) -> Tensor:
    """Prefill all tokens of `x` but the last into a cache, then decode the last one."""
    cache = DynamicKVCache()
    module(x[:, :-1], cache=cache, **({"is_causal": True} if "absorb" in kwargs else {}))
    out: Tensor = module(x[:, -1:], cache=cache, **kwargs)
    return out  # (b, 1, d_model)


def _static(inputs: dict[str, Tensor]) -> StaticKVCache:
    k, v = inputs["k"], inputs["v"]
    b, h, t, e = k.shape
    return StaticKVCache(b, 2 * t, h, e, v_head_dim=v.shape[-1], dtype=k.dtype, device=k.device)


def _two_updates(cache: Any, inputs: dict[str, Tensor]) -> Tensor:
    """Append the inputs, then their doubles; keys and values side by side."""
    cache.update(inputs["k"], inputs["v"])
    keys, values = cache.update(2 * inputs["k"], 2 * inputs["v"])
    return torch.cat([keys, values], dim=-1)  # (b, h, 2t, e + ev)


def _ring(
    layout: ShardLayout, **kwargs: Any
) -> Callable[[nn.Module | None, dict[str, Tensor]], Tensor]:
    def call(module: nn.Module | None, inputs: dict[str, Tensor]) -> Tensor:
        with one_rank_group():
            q, k, v = inputs["q"], inputs["k"], inputs["v"]
            return ring_attention(q, k, v, layout=layout, block_size=3, **kwargs)

    return call


def _gated_delta_net() -> nn.Module:
    return GatedDeltaNet(
        D_MODEL, num_k_heads=1, num_v_heads=2, head_k_dim=3, head_v_dim=4, chunk_size=2
    ).eval()


def _state_decode(module: Any, x: Tensor) -> Tensor:
    """Prefill all tokens of `x` but the last into a state, then decode the last one."""
    state = module.new_state(x.shape[0])
    module(x[:, :-1], state)
    out: Tensor = module(x[:, -1:], state)
    return out  # (b, 1, d_model)


def _delta(mode: str) -> Callable[[nn.Module | None, dict[str, Tensor]], Tensor]:
    # Unit keys, beta in (0, 1) and a decay <= 0, as Gated DeltaNet feeds it: raw random
    # keys of size 1e4 would make any delta rule blow up.
    def call(module: nn.Module | None, i: dict[str, Tensor]) -> Tensor:
        k = nn.functional.normalize(i["k"], dim=-1)
        beta, g = i["beta"].sigmoid(), -nn.functional.softplus(i["g"])
        return delta_rule(i["q"], k, i["v"], beta, g, mode=mode, chunk_size=2)[0]

    return call


def _dsa() -> nn.Module:
    mla = MultiHeadLatentAttention(
        D_MODEL, HEADS, kv_lora_rank=5, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=3,
        q_lora_rank=7,
    )  # fmt: skip
    indexer = LightningIndexer(D_MODEL, 2, 4, d_query=7, rope_dim=2)
    return DeepSeekSparseAttention(mla, indexer, topk=2).eval()


def _dsa_decode(module: Any, x: Tensor) -> Tensor:
    cache = module.new_cache(x.shape[0], x.shape[1])
    module(x[:, :-1], cache=cache)
    out: Tensor = module(x[:, -1:], cache=cache, absorb=True)
    return out  # (b, 1, d_model)


def _indexer() -> nn.Module:
    return LightningIndexer(D_MODEL, 2, 4, d_query=D_MODEL).eval()


def _scores(scores: Tensor, x: Tensor) -> Tensor:
    return scores.masked_fill(scores == float("-inf"), 0.0).to(x.dtype)


def _top_scores(i: dict[str, Tensor]) -> Tensor:
    # topk_indices returns indices: gather the scores they pick, a float output.
    scores = i["scores"]
    picked = topk_indices(scores, 2).clamp(min=0)  # (b, t, 2)
    return scores.gather(-1, picked)


X = {"x": (B, T, D_IN)}
X_GQA = {"x": (B, T, D_MODEL)}
KV = {"k": (B, KV_HEADS, T, D_KQ), "v": (B, KV_HEADS, T, D_V)}
XC = {"x": (B, T, D_IN), "context": (B, S, D_IN)}
XC_MHA = {"x": (B, T, D_IN), "context": (B, S, D_CTX)}
XCV_MHA = {"x": (B, T, D_IN), "context": (B, S, D_CTX), "value": (B, S, D_V)}
QKV = {"q": (B, HEADS, T, D_KQ), "k": (B, HEADS, S, D_KQ), "v": (B, HEADS, S, D_V)}
# Ring attention: one sequence, so queries and keys have one length; 10 positions make
# zigzag's two chunks on one rank (0:5 and 5:10) each span two tiles of 3.
T_RING = 10
RING_QKV = {
    "q": (B, HEADS, T_RING, D_KQ),
    "k": (B, HEADS, T_RING, D_KQ),
    "v": (B, HEADS, T_RING, D_V),
}
RING: dict[str, Any] = {"custom_backward": True, "names": QKV_NAMES["names"], "query": None}

ENTRIES: dict[str, Entry] = {
    "SelfAttention": Entry(X, lambda m, i: _m(m)(i["x"]), lambda: SelfAttention(D_IN, D_KQ, D_V)),
    "SelfAttention.attention_weights": Entry(
        X,
        lambda m, i: _m(m).attention_weights(i["x"]),
        lambda: SelfAttention(D_IN, D_KQ, D_V),
        weights=True,
    ),
    "CausalSelfAttention": Entry(
        X, lambda m, i: _m(m)(i["x"]), lambda: CausalSelfAttention(D_IN, D_KQ, D_V)
    ),
    "CausalSelfAttention.attention_weights": Entry(
        X,
        lambda m, i: _m(m).attention_weights(i["x"]),
        lambda: CausalSelfAttention(D_IN, D_KQ, D_V),
        weights=True,
    ),
    "CrossAttention": Entry(
        XC, lambda m, i: _m(m)(i["x"], i["context"]), lambda: CrossAttention(D_IN, D_KQ, D_V)
    ),
    "CrossAttention.attention_weights": Entry(
        XC,
        lambda m, i: _m(m).attention_weights(i["x"], i["context"]),
        lambda: CrossAttention(D_IN, D_KQ, D_V),
        weights=True,
    ),
    "MultiHeadAttentionWrapper": Entry(
        X, lambda m, i: _m(m)(i["x"]), lambda: MultiHeadAttentionWrapper(D_IN, D_KQ, D_V, HEADS)
    ),
    "MultiHeadAttention[torch] causal": Entry(
        X, lambda m, i: _m(m)(i["x"], is_causal=True), build_mha("torch", cross=False)
    ),
    "MultiHeadAttention[scratch] causal": Entry(
        X, lambda m, i: _m(m)(i["x"], is_causal=True), build_mha("scratch", cross=False)
    ),
    "MultiHeadAttention[torch] cross padded": Entry(
        XC_MHA,
        lambda m, i: _m(m)(i["x"], i["context"], attn_mask=_key_padding(i)),
        build_mha("torch", cross=True),
    ),
    "MultiHeadAttention[scratch] cross padded": Entry(
        XC_MHA,
        lambda m, i: _m(m)(i["x"], i["context"], attn_mask=_key_padding(i)),
        build_mha("scratch", cross=True),
    ),
    "MultiHeadAttention[torch] value, key_padding_mask": Entry(
        XCV_MHA,
        lambda m, i: _m(m)(
            i["x"], i["context"], i["value"], key_padding_mask=_blocked_keys(i), is_causal=True
        ),
        _mha_kv("torch"),
    ),
    "MultiHeadAttention[scratch] need_weights": Entry(
        XC_MHA,
        lambda m, i: _m(m)(
            i["x"],
            i["context"],
            key_padding_mask=_blocked_keys(i),
            need_weights=True,
            average_attn_weights=False,
        )[1],
        build_mha("scratch", cross=True),
        weights=True,
    ),
    "MultiHeadAttention.attention_weights": Entry(
        XC_MHA,
        lambda m, i: _m(m).attention_weights(i["x"], i["context"], attn_mask=_key_padding(i)),
        build_mha("scratch", cross=True),
        weights=True,
    ),
    "attention_scores": Entry(
        {"q": (B, T, D_KQ), "k": (B, S, D_KQ)},
        lambda m, i: AF.attention_scores(i["q"], i["k"]),
        names={"q": "queries", "k": "keys"},
        query="q",
    ),
    "scaled_softmax": Entry(
        {"scores": (B, T, T)},
        lambda m, i: AF.scaled_softmax(
            i["scores"], D_KQ, masks.causal(T, device=i["scores"].device)
        ),
        weights=True,
        query=None,  # its mask is (T, T): see test_scaled_softmax_of_no_scores
    ),
    "context_vectors": Entry(
        {"w": (B, T, S), "v": (B, S, D_V)},
        lambda m, i: AF.context_vectors(i["w"], i["v"]),
        names={"w": "weights", "v": "values"},
        query="w",
    ),
    "scaled_dot_product_attention": Entry(
        QKV, lambda m, i: AF.scaled_dot_product_attention(i["q"], i["k"], i["v"]), **QKV_NAMES
    ),
    "scaled_dot_product_attention causal": Entry(
        QKV,
        lambda m, i: AF.scaled_dot_product_attention(i["q"], i["k"], i["v"], is_causal=True),
        **QKV_NAMES,
    ),
    "scaled_dot_product_attention bottom-right (fully masked rows)": Entry(
        {"q": (B, HEADS, S, D_KQ), "k": (B, HEADS, T, D_KQ), "v": (B, HEADS, T, D_V)},
        lambda m, i: AF.scaled_dot_product_attention(i["q"], i["k"], i["v"], _bottom_right(i)),
        **QKV_NAMES,
    ),
    "scaled_dot_product_attention additive mask": Entry(
        QKV,
        lambda m, i: AF.scaled_dot_product_attention(
            i["q"],
            i["k"],
            i["v"],
            masks.allowed_to_additive(_key_padding(i, "k"), i["q"].dtype),
        ),
        **QKV_NAMES,
    ),
    "scaled_dot_product_attention gqa": Entry(
        {"q": (B, 4, T, D_KQ), "k": (B, 2, S, D_KQ), "v": (B, 2, S, D_V)},
        lambda m, i: AF.scaled_dot_product_attention(
            i["q"], i["k"], i["v"], enable_gqa=True, scale=0.3
        ),
        **QKV_NAMES,
    ),
    "scaled_dot_product_attention softcap, sinks": Entry(
        {**QKV, "sink_logits": (HEADS,)},
        lambda m, i: AF.scaled_dot_product_attention(
            i["q"], i["k"], i["v"], is_causal=True, softcap=2.0, sink_logits=i["sink_logits"]
        ),
        **QKV_NAMES,
    ),
    "attention_weights": Entry(
        {"q": (B, HEADS, T, D_KQ), "k": (B, HEADS, S, D_KQ)},
        lambda m, i: AF.attention_weights(i["q"], i["k"], attn_mask=_key_padding(i, "k")),
        weights=True,
        **QKV_NAMES,
    ),
    # The weights of a flash call recovered from its log-sum-exp (the lse is the kernel's).
    "weights_from_lse": Entry(
        {"q": (B, HEADS, T, D_KQ), "k": (B, HEADS, S, D_KQ)},
        lambda m, i: AF.weights_from_lse(
            i["q"], i["k"], _flash_lse(i["q"], i["k"]), is_causal=True, block_size=3
        ),
        weights=True,
        differentiable=False,
        huge_scores=False,
        **QKV_NAMES,
    ),
    "flash_attention": Entry(
        QKV,
        lambda m, i: AF.flash_attention(i["q"], i["k"], i["v"], block_size=(2, 3)),
        custom_backward=True,
        **QKV_NAMES,
    ),
    "flash_attention causal": Entry(
        QKV,
        lambda m, i: AF.flash_attention(i["q"], i["k"], i["v"], is_causal=True, block_size=4),
        custom_backward=True,
        **QKV_NAMES,
    ),
    "flash_attention window": Entry(
        {"q": (B, HEADS, S, D_KQ), "k": (B, HEADS, T, D_KQ), "v": (B, HEADS, T, D_V)},
        lambda m, i: AF.flash_attention(i["q"], i["k"], i["v"], window=2, block_size=(2, 2)),
        custom_backward=True,
        **QKV_NAMES,
    ),
    # More queries than keys, aligned bottom-right: the first query sees only the sink.
    "flash_attention softcap, sinks, bottom-right": Entry(
        {"q": (B, HEADS, S, D_KQ), "k": (B, HEADS, T, D_KQ), "v": (B, HEADS, T, D_V)}
        | {"sink_logits": (HEADS,)},
        lambda m, i: AF.flash_attention(
            i["q"],
            i["k"],
            i["v"],
            is_causal=True,
            align="bottom-right",
            softcap=2.0,
            sink_logits=i["sink_logits"],
            block_size=(2, 2),
        ),
        custom_backward=True,
        **QKV_NAMES,
    ),
    "flash_attention window bottom-right": Entry(
        QKV,
        lambda m, i: AF.flash_attention(
            i["q"], i["k"], i["v"], window=2, align="bottom-right", block_size=(2, 3)
        ),
        custom_backward=True,
        **QKV_NAMES,
    ),
    "MultiHeadAttention[flash] causal": Entry(
        X, lambda m, i: _m(m)(i["x"], is_causal=True), build_mha("flash", cross=False)
    ),
    "MultiHeadAttention[flash] cross window": Entry(
        XC_MHA, lambda m, i: _m(m)(i["x"], i["context"], window=2), build_mha("flash", cross=True)
    ),
    "GroupedQueryAttention": Entry(X_GQA, lambda m, i: _m(m)(i["x"]), _gqa("torch")),
    "GroupedQueryAttention[scratch] window": Entry(
        X_GQA, lambda m, i: _m(m)(i["x"]), _gqa("scratch", window=2)
    ),
    # Qwen3/Gemma 3's QK-norm, Gemma 2's softcap and gpt-oss's sinks on one layer.
    "GroupedQueryAttention[scratch] qk_norm, softcap, sinks": Entry(
        X_GQA,
        lambda m, i: _m(m)(i["x"]),
        _gqa(
            "scratch", qk_norm=QKNormSpec("head"), softcap=2.0, gates=HeadGates(learned_sinks=True)
        ),
    ),
    "GroupedQueryAttention decode after a cache": Entry(
        X_GQA, lambda m, i: _decode(_m(m), i["x"]), _gqa("torch"), query=None
    ),
    "MultiHeadLatentAttention causal": Entry(
        X_GQA, lambda m, i: _m(m)(i["x"], is_causal=True), _mla
    ),
    "MultiHeadLatentAttention decode after a cache, absorbed": Entry(
        X_GQA, lambda m, i: _decode(_m(m), i["x"], absorb=True), _mla, query=None
    ),
    "rope.apply_rope": Entry(
        {"x": (B, HEADS, T, D_KQ)}, lambda m, i: rope.apply_rope(i["x"]), query=None
    ),
    "ring_attention[contiguous]": Entry(RING_QKV, _ring("contiguous"), **RING),
    "ring_attention[zigzag] causal": Entry(RING_QKV, _ring("zigzag", is_causal=True), **RING),
    "ring_attention[contiguous] window": Entry(RING_QKV, _ring("contiguous", window=4), **RING),
    # the window's edge crosses the pair (queries 5:10, keys 0:5): a masked block
    "ring_attention[zigzag] window": Entry(RING_QKV, _ring("zigzag", window=4), **RING),
    "linear_attention": Entry(
        {"q": (B, HEADS, T, D_KQ), "k": (B, HEADS, T, D_KQ), "v": (B, HEADS, T, D_V)},
        lambda m, i: linear_attention(i["q"], i["k"], i["v"]),
        names=QKV_NAMES["names"],
        query=None,  # queries, keys and values share one length
    ),
    "linear_attention recurrent": Entry(
        {"q": (B, HEADS, T, D_KQ), "k": (B, HEADS, T, D_KQ), "v": (B, HEADS, T, D_V)},
        lambda m, i: linear_attention(i["q"], i["k"], i["v"], form="recurrent"),
        names=QKV_NAMES["names"],
        query=None,
    ),
    "delta_rule chunk": Entry(
        {"q": (B, HEADS, T, D_KQ), "k": (B, HEADS, T, D_KQ), "v": (B, HEADS, T, D_V)}
        | {"beta": (B, HEADS, T), "g": (B, HEADS, T)},
        _delta("chunk"),
        names=QKV_NAMES["names"] | {"g": "log_decay"},
        query=None,
    ),
    "delta_rule recurrent": Entry(
        {"q": (B, HEADS, T, D_KQ), "k": (B, HEADS, T, D_KQ), "v": (B, HEADS, T, D_V)}
        | {"beta": (B, HEADS, T), "g": (B, HEADS, T)},
        _delta("recurrent"),
        names=QKV_NAMES["names"] | {"g": "log_decay"},
        query=None,
    ),
    "GatedDeltaNet": Entry(X_GQA, lambda m, i: _m(m)(i["x"]), _gated_delta_net),
    "GatedDeltaNet decode after a state": Entry(
        X_GQA, lambda m, i: _state_decode(_m(m), i["x"]), _gated_delta_net, query=None
    ),
    # Its keys are its own tokens (no queries, no keys); its scores are float32 with
    # -inf at future keys: the call keeps the finite ones, in the input's dtype.
    "LightningIndexer": Entry(
        X_GQA, lambda m, i: _scores(_m(m)(i["x"]), i["x"]), _indexer, query=None
    ),
    "topk_indices": Entry({"scores": (B, T, T)}, lambda m, i: _top_scores(i), query=None),
    "DeepSeekSparseAttention": Entry(X_GQA, lambda m, i: _m(m)(i["x"]), _dsa),
    "DeepSeekSparseAttention decode, absorbed": Entry(
        X_GQA, lambda m, i: _dsa_decode(_m(m), i["x"]), _dsa, query=None
    ),
    "DynamicKVCache.update": Entry(KV, lambda m, i: _two_updates(DynamicKVCache(), i), **KV_NAMES),
    "StaticKVCache.update": Entry(KV, lambda m, i: _two_updates(_static(i), i), **KV_NAMES),
}


def make_inputs(
    entry: Entry,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    scale: float = 1.0,
    requires_grad: bool = False,
) -> dict[str, Tensor]:
    return {
        name: (torch.randn(shape, dtype=torch.float64) * scale)
        .to(device=device, dtype=dtype)
        .requires_grad_(requires_grad)
        for name, shape in entry.shapes.items()
    }


def run(entry: Entry, inputs: dict[str, Tensor], module: nn.Module | None) -> Tensor:
    return entry.call(module, inputs)


def make_module(
    entry: Entry, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> nn.Module | None:
    if entry.build is None:
        return None
    return entry.build().to(device=device, dtype=dtype)
