"""Serving many requests: a paged KV cache and a continuous-batching engine.

[`cache`][attnlab.serving.cache] (block allocator, prefix hashes, `PagedKVCache`) and
[`engine`][attnlab.serving.engine] (the scheduler and its `Engine`).
"""
