"""The rules every other part of attnlab shares: masks, RoPE, input checks, precision.

[`masks`][attnlab.rules.masks] builds every attention mask and converts between their
conventions; [`rope`][attnlab.rules.rope] rotates queries and keys by position;
[`scores`][attnlab.rules.scores] holds the score rule every layer hands its kernel;
`_validation` and `_precision` hold the input checks and the low-precision casts that
every kernel and layer calls (private modules: their names may be used anywhere inside
attnlab, and nowhere else).
"""
