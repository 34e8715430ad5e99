"""QK-norm: `attnlab.layers.norms.RMSNorm` and `GroupedQueryAttention(qk_norm=...)`.

Equality with transformers' layers that normalise queries and keys (Qwen3 and Gemma 3
per head, OLMo 2 over the whole projections: outputs, gradients, cached decoding) is in
tests/test_hf_equivalence.py. Here: the norm against `torch.nn.RMSNorm` and Gemma's
formula written out, the property QK-norm exists for (the attention no longer depends on
the size of the query and key projections, so their growth cannot sharpen the softmax),
and bad input.

Dimensions all differ: d_model 20, 6 query heads, 3 key/value heads, head_dim 4, batch 2,
7 tokens.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.layers.gqa import GroupedQueryAttention
from attnlab.layers.norms import QKNormSpec, RMSNorm
from attnlab.rules.scores import ScoreRule

D_MODEL, H, KV, HD, B, T = 20, 6, 3, 4, 2, 7


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread: None) -> None:
    """Every test here runs tiny layers (see conftest's `one_thread`)."""


def test_rms_norm_equals_torch_and_gemma_formula() -> None:
    x = torch.randn(B, T, 7) * 3.0
    plain, gemma, theirs = (
        RMSNorm(7, eps=1e-5),
        RMSNorm(7, 1e-5, unit_offset=True),
        nn.RMSNorm(7, 1e-5),
    )
    with torch.no_grad():
        for norm in (plain, gemma, theirs):
            norm.weight.copy_(torch.linspace(-0.5, 0.7, 7))
    torch.testing.assert_close(plain(x), theirs(x))
    rms = (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    torch.testing.assert_close(gemma(x), x / rms * (1.0 + gemma.weight))
    # Half precision is normalised in float32 and cast back once, as transformers does.
    half = x.bfloat16()
    assert torch.equal(gemma(half), gemma(half.float()).bfloat16())


@pytest.mark.parametrize("qk_norm", ["head", "projection"])
def test_qk_norm_makes_attention_blind_to_the_size_of_q_and_k(qk_norm: str) -> None:
    normed = GroupedQueryAttention(D_MODEL, H, KV, head_dim=HD, qk_norm=QKNormSpec(qk_norm)).eval()  # type: ignore[arg-type]
    plain = GroupedQueryAttention(D_MODEL, H, KV, head_dim=HD).eval()
    plain.load_state_dict(normed.state_dict(), strict=False)  # same projections
    x = torch.randn(B, T, D_MODEL)
    before = [m(x, need_weights=True) for m in (normed, plain)]
    with torch.no_grad():
        for m in (normed, plain):
            m.q_proj.weight.mul_(32.0)  # what a high learning rate does to them over time
            m.k_proj.weight.mul_(32.0)
    after = [m(x, need_weights=True) for m in (normed, plain)]
    # With QK-norm, outputs and weights stay as they were; without, the scores grew 1024-fold
    # and the softmax turned almost one-hot.
    # (Not to 1e-5: the epsilon in the root weighs 1024 times less after the growth.)
    torch.testing.assert_close(after[0][0], before[0][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(after[0][1], before[0][1], atol=1e-4, rtol=1e-4)
    assert after[1][1].amax(-1).mean() > 0.9 > before[1][1].amax(-1).mean()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"qk_norm": QKNormSpec("layer")},  # type: ignore[arg-type]
            ValueError,
            r"qk_norm\.over must be one of 'head', 'projection', 'rotated', got 'layer'",
        ),
        ({"qk_norm": "head"}, TypeError, "qk_norm must be a QKNormSpec or None, got str"),
        (
            {"qk_norm": QKNormSpec(eps=0.0)},
            ValueError,
            r"qk_norm\.eps must be a positive finite float, got 0.0",
        ),
        (
            {"qk_norm": QKNormSpec(eps="tiny")},  # type: ignore[arg-type]
            TypeError,
            r"qk_norm\.eps must be a positive float, got 'tiny'",
        ),
        (
            {"qk_norm": QKNormSpec(unit_offset=1)},  # type: ignore[arg-type]
            TypeError,
            r"qk_norm\.unit_offset must be a bool, got 1",
        ),
        ({"scores": ScoreRule(scale=float("nan"))}, ValueError, r"scores\.scale must be finite"),
    ],
)
def test_constructor_rejects_bad_qk_norm_and_scale(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        GroupedQueryAttention(D_MODEL, H, KV, head_dim=HD, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dim must be a positive int, got 0"):
        RMSNorm(0)
