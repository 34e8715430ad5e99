"""Layers: modules that own weights and call the kernels.

[`multihead`][attnlab.layers.multihead] (`MultiHeadAttention`), [`gqa`][attnlab.layers.gqa]
(`GroupedQueryAttention`), [`mla`][attnlab.layers.mla] (latent attention),
[`sparse`][attnlab.layers.sparse] (DeepSeek sparse attention),
[`linear`][attnlab.layers.linear] (linear attention and Gated DeltaNet),
[`heads`][attnlab.layers.heads] (splitting and merging heads), [`norms`][attnlab.layers.norms]
and [`mlp`][attnlab.layers.mlp].
"""
