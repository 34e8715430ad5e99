"""Caches: what a layer keeps of the tokens it has seen, between decoding steps.

[`base`][attnlab.caches.base] is the one protocol every per-layer state implements,
[`LayerCache`][attnlab.caches.base.LayerCache]; [`kv`][attnlab.caches.kv] holds the
dynamic, static and rolling key/value caches and their sizes in bytes.
"""
