"""Caches: what a layer keeps of the tokens it has seen, between decoding steps.

[`kv`][attnlab.caches.kv] holds the dynamic, static and rolling key/value caches and
their sizes in bytes.
"""
