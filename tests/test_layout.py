"""attnlab.models.layout: the CPU decode layout changes strides, never results.

A decoder with all-different sizes, tied and untied, gives the same logits and the same
greedy tokens after `cpu_decode_layout`; its weights keep their shapes and ties; and its
state dict loads into a model of either layout, both ways.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.models.config import DecoderConfig
from attnlab.models.decoder import Decoder
from attnlab.models.layout import cpu_decode_layout


def _decoder(tie: bool, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    # vocab 37, d_model 24, 2 layers, 4 heads over 2 kv heads of 6, MLP 44: all different
    config = DecoderConfig(37, 24, 2, 4, 2, 6, 44, tie_embeddings=tie)
    return Decoder(config).eval()


def _weights(model: nn.Module) -> list[nn.Parameter]:
    return [m.weight for m in model.modules() if isinstance(m, nn.Linear | nn.Embedding)]


@pytest.mark.parametrize("tie", [True, False])
def test_layout_leaves_logits_and_generation_equal(tie: bool) -> None:
    model = _decoder(tie)
    ids = torch.tensor([[3, 14, 15, 9, 2, 6], [5, 3, 5, 8, 9, 7]])
    with torch.inference_mode():
        logits, tokens = model(ids), model.generate(ids, 5)
    shapes = [w.shape for w in _weights(model)]
    assert cpu_decode_layout(model) is model
    weights = _weights(model)
    assert [w.shape for w in weights] == shapes
    assert all(w.stride() == (1, w.shape[0]) for w in weights)  # column-major
    assert (model.lm_head.weight is model.embed_tokens.weight) == tie
    with torch.inference_mode():
        torch.testing.assert_close(model(ids), logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model.generate(ids, 5), tokens, atol=0, rtol=0)


@pytest.mark.parametrize("tie", [True, False])
def test_layout_state_dict_loads_into_either_layout(tie: bool) -> None:
    ids = torch.tensor([[1, 4, 1, 5, 9]])
    laid_out = cpu_decode_layout(_decoder(tie, seed=1))
    plain = _decoder(tie, seed=2)
    plain.load_state_dict(laid_out.state_dict())  # column-major into row-major
    with torch.inference_mode():
        torch.testing.assert_close(plain(ids), laid_out(ids), atol=1e-5, rtol=1e-5)
    other = cpu_decode_layout(_decoder(tie, seed=3))
    other.load_state_dict(_decoder(tie, seed=4).state_dict())  # row-major into column-major
    assert all(w.stride() == (1, w.shape[0]) for w in _weights(other))  # kept
    with torch.inference_mode():
        torch.testing.assert_close(other(ids), _decoder(tie, seed=4)(ids), atol=1e-5, rtol=1e-5)


def test_layout_refuses_what_is_not_a_module() -> None:
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module, got Tensor"):
        cpu_decode_layout(torch.zeros(2, 2))  # type: ignore[type-var]
