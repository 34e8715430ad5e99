"""attnlab: attention in large language models, from teaching code to production modules."""

from attnlab import functional, linear, masks, rope, sparse, toy
from attnlab._validation import is_validation_enabled, set_validation, validation
from attnlab.causal import CausalSelfAttention
from attnlab.cross_attention import CrossAttention
from attnlab.gqa import GroupedQueryAttention
from attnlab.kv_cache import (
    DynamicKVCache,
    KVCache,
    RollingKVCache,
    StaticKVCache,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
)
from attnlab.llm import Decoder, DecoderConfig
from attnlab.mla import MultiHeadLatentAttention
from attnlab.multihead import MultiHeadAttention
from attnlab.self_attention import MultiHeadAttentionWrapper, SelfAttention

__all__ = [
    "CausalSelfAttention",
    "CrossAttention",
    "Decoder",
    "DecoderConfig",
    "DynamicKVCache",
    "GroupedQueryAttention",
    "KVCache",
    "MultiHeadAttention",
    "MultiHeadAttentionWrapper",
    "MultiHeadLatentAttention",
    "RollingKVCache",
    "SelfAttention",
    "StaticKVCache",
    "functional",
    "is_validation_enabled",
    "kv_cache_bytes",
    "kv_cache_bytes_per_token",
    "linear",
    "masks",
    "rope",
    "set_validation",
    "sparse",
    "toy",
    "validation",
]

__version__ = "0.1.0"
