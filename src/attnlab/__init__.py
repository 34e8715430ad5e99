"""attnlab: attention in large language models, from teaching code to production modules.

The package follows the site's path, one folder a stage: `article` (the article's
teaching classes), `rules` (masks, RoPE, checks, precision), `functional` (the kernels),
`caches`, `layers`, `models`, `serving`, `tools` and `distributed`. The classes a chapter
builds on are importable from here too.
"""

from attnlab import functional
from attnlab.article.causal import CausalSelfAttention
from attnlab.article.cross_attention import CrossAttention
from attnlab.article.self_attention import MultiHeadAttentionWrapper, SelfAttention
from attnlab.caches.kv import (
    DynamicKVCache,
    KVCache,
    RollingKVCache,
    StaticKVCache,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
)
from attnlab.layers.gqa import GroupedQueryAttention
from attnlab.layers.mla import MultiHeadLatentAttention
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.models.config import DecoderConfig
from attnlab.models.decoder import Decoder
from attnlab.rules._validation import is_validation_enabled, set_validation, validation

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
    "set_validation",
    "validation",
]

__version__ = "0.1.0"
