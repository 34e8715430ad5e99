"""The article's teaching code, in the order of its chapters.

[`toy`][attnlab.article.toy] (the example sentence),
[`self_attention`][attnlab.article.self_attention]
(`SelfAttention` and the multi-head wrapper), [`causal`][attnlab.article.causal]
(`CausalSelfAttention`) and [`cross_attention`][attnlab.article.cross_attention]
(`CrossAttention`). This folder imports only the rules and the kernels.
"""
