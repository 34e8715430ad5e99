"""KV cache memory per token, measured on real caches: MHA, GQA, MQA and latent attention.

Each variant is one attention layer at the shape of `KVShape` (by default a
Llama-3-8B-like model: 32 query heads of 128 features, 32 layers, bfloat16); a prompt
of `tokens` tokens runs through it into a
[`DynamicKVCache`][attnlab.caches.kv.DynamicKVCache], whose `nbytes` is what the cache
really holds. Bytes per token are `nbytes / tokens` for one layer, times the layers.

- **MHA**, **GQA**, **MQA**: [`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention]
  with `num_kv_heads` equal to the heads, `gqa_kv_heads`, and 1;
- **MLA**: [`MultiHeadLatentAttention`][attnlab.layers.mla.MultiHeadLatentAttention], whose
  cache holds one latent of `kv_lora_rank` features and one shared RoPE key of
  `qk_rope_head_dim` features per token, whatever the number of heads.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class KVShape:
    """The model shape whose caches are measured (defaults: Llama 3 8B, DeepSeek's MLA)."""

    d_model: int = 4096
    num_heads: int = 32
    head_dim: int = 128
    num_layers: int = 32
    gqa_kv_heads: int = 8
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    tokens: int = 16
    dtype: str = "bfloat16"


KV_FULL = KVShape()
KV_QUICK = KVShape(
    d_model=32,
    num_heads=4,
    head_dim=8,
    num_layers=3,
    gqa_kv_heads=2,
    kv_lora_rank=12,
    qk_rope_head_dim=4,
    tokens=5,
)


def _layers(shape: KVShape) -> Iterator[tuple[str, nn.Module, dict[str, Any]]]:
    """Each variant's layer, built one at a time, and the sizes the formula needs."""
    from attnlab.layers.gqa import GroupedQueryAttention
    from attnlab.layers.mla import MultiHeadLatentAttention

    d, h, hd = shape.d_model, shape.num_heads, shape.head_dim
    for name, kv in (("MHA", h), ("GQA", shape.gqa_kv_heads), ("MQA", 1)):
        yield (
            name,
            GroupedQueryAttention(d, h, kv, head_dim=hd),
            {"num_kv_heads": kv, "head_dim": hd},
        )
    mla = MultiHeadLatentAttention(
        d,
        h,
        kv_lora_rank=shape.kv_lora_rank,
        qk_nope_head_dim=hd,
        qk_rope_head_dim=shape.qk_rope_head_dim,
        v_head_dim=hd,
    )
    sizes = {
        "num_kv_heads": 1,
        "head_dim": shape.kv_lora_rank,
        "v_head_dim": shape.qk_rope_head_dim,
    }
    yield "MLA", mla, sizes


def measure_kv_memory(shape: KVShape = KV_FULL, *, seed: int = 0) -> dict[str, Any]:
    """Bytes per token of context that each variant's KV cache holds, measured.

    Args:
        shape: The model shape.
        seed: Seed of the weights and the prompt.

    Returns:
        `{"shape": ..., "results": [...]}`; each result has the variant, its key/value
        heads and cached features per token and layer, `bytes_per_token_per_layer`
        (measured: the cache's `nbytes` over the tokens), `bytes_per_token` (all layers),
        `formula_bytes_per_token` (what
        [`kv_cache_bytes_per_token`][attnlab.caches.kv.kv_cache_bytes_per_token]
        predicts) and `ratio_to_mha`.

    Examples:
        >>> out = measure_kv_memory(KV_QUICK)
        >>> [(r["variant"], r["bytes_per_token_per_layer"]) for r in out["results"]]
        [('MHA', 128), ('GQA', 64), ('MQA', 32), ('MLA', 32)]
    """
    from attnlab.caches.kv import DynamicKVCache, kv_cache_bytes_per_token

    torch.manual_seed(seed)
    dtype = getattr(torch, shape.dtype)
    x = torch.randn(1, shape.tokens, shape.d_model, dtype=dtype)  # (1, tokens, d_model)
    results: list[dict[str, Any]] = []
    for name, layer, sizes in _layers(shape):
        layer.to(dtype).eval()
        cache = DynamicKVCache()
        with torch.no_grad():
            if name == "MLA":
                layer(x, cache=cache, is_causal=True)
            else:
                layer(x, cache=cache)
        per_layer = cache.nbytes // shape.tokens
        formula = kv_cache_bytes_per_token(num_layers=shape.num_layers, dtype=dtype, **sizes)
        results.append(
            {
                "variant": name,
                "num_kv_heads": sizes["num_kv_heads"],
                "features_per_token_per_layer": sizes["num_kv_heads"]
                * (sizes["head_dim"] + sizes.get("v_head_dim", sizes["head_dim"])),
                "bytes_per_token_per_layer": per_layer,
                "bytes_per_token": per_layer * shape.num_layers,
                "formula_bytes_per_token": formula,
            }
        )
        del layer, cache
    mha = results[0]["bytes_per_token"]
    for r in results:
        r["ratio_to_mha"] = r["bytes_per_token"] / mha
    return {"shape": asdict(shape), "results": results}
