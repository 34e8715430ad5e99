"""A step of the fast path: weights laid out for decoding on the CPU.

A model's definition stores each `nn.Linear` weight as PyTorch does, `(out, in)` row by
row. Decoding multiplies one token's row by every matrix, and on the CPU the product
with a matrix stored the other way round, column by column, is the faster kernel: on
SmolLM2-135M, 1.3x for the projections and the unembedding, with the same results.
[`cpu_decode_layout`][attnlab.models.layout.cpu_decode_layout] is that step, taken where
speed matters ([`smollm2_decoder`][attnlab.models.pretrained.smollm2_decoder], the
benchmarks) and nowhere else, so that the model itself stays the plain definition.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

__all__ = ["cpu_decode_layout"]

M = TypeVar("M", bound=nn.Module)


def cpu_decode_layout(model: M) -> M:
    """Store every `nn.Linear` and `nn.Embedding` weight of `model` column-major, in place.

    Each weight keeps its shape `(out, in)` and its values; only its strides change, to
    `(1, out)`. Weights shared between modules (tied embeddings) stay shared.
    `load_state_dict`, `to_empty` and `.to(dtype)` keep the strides, so weights loaded
    afterwards keep the layout; `state_dict()` holds the same values, and loads into a
    model of either layout. Take this step before an optimizer holds the parameters: it
    replaces them.

    Args:
        model: Any module, e.g. a [`Decoder`][attnlab.models.decoder.Decoder].

    Returns:
        `model`, for chaining.

    Raises:
        TypeError: If `model` is not an `nn.Module`.

    Examples:
        >>> model = cpu_decode_layout(nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)))
        >>> model[0].weight.shape, model[0].weight.stride()
        (torch.Size([3, 4]), (1, 3))
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    done: dict[int, nn.Parameter] = {}  # id of a weight -> its new parameter
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Embedding):
            weight = module.weight
            if id(weight) not in done:
                done[id(weight)] = _column_major(weight)
            module.weight = done[id(weight)]
    return model


def _column_major(weight: torch.Tensor) -> nn.Parameter:
    """The same matrix, stored transposed: `(out, in)` with strides `(1, out)`."""
    data = weight.detach().t().contiguous().t()  # (out, in), column-major
    return nn.Parameter(data, requires_grad=weight.requires_grad)
