"""Heads: the one place a layer cuts its projections into heads and joins them again.

Every attention layer projects `(b, t, d)` activations and hands the kernels
`(b, heads, t, head_dim)` tensors, then concatenates the heads' outputs for its output
projection. The two reshapes are the same in every layer, so they live here once.

>>> import torch
>>> x = torch.arange(24.0).view(1, 2, 12)  # (b, t, 3 heads * 4 features)
>>> heads = split_heads(x, 3)
>>> tuple(heads.shape), torch.equal(merge_heads(heads), x)
((1, 3, 2, 4), True)
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["merge_heads", "split_heads"]


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """`(b, t, num_heads * head_dim)` to `(b, num_heads, t, head_dim)`, head `i` from
    features `i * head_dim` to `(i + 1) * head_dim`, as every fused projection lays them out.
    """
    b, t, features = x.shape
    # head_dim spelled out: a `-1` cannot be inferred from no tokens (t = 0).
    heads = x.view(b, t, num_heads, features // num_heads)  # (b, t, num_heads, head_dim)
    return heads.transpose(1, 2)  # (b, num_heads, t, head_dim)


def merge_heads(heads: Tensor) -> Tensor:
    """`(b, num_heads, t, head_dim)` to `(b, t, num_heads * head_dim)`: the inverse of
    [`split_heads`][attnlab.layers.heads.split_heads], ready for the output projection.
    """
    b, h, t, d = heads.shape
    return heads.transpose(1, 2).reshape(b, t, h * d)  # (b, t, num_heads * head_dim)
