"""attnlab.rules.rope against Hugging Face's Llama rotary embedding and against the math."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama as llama

from attnlab import validation
from attnlab.rules import rope
from attnlab.rules.rope import Rope, apply_rope, rope_angles, rope_frequencies


def _hf_rotate(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """What a Llama layer does to its queries: HF's rotary module, then apply_rotary_pos_emb."""
    head_dim = x.shape[-1]
    config = LlamaConfig(
        hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim, rope_theta=base
    )
    cos, sin = llama.LlamaRotaryEmbedding(config)(x, positions)
    rotated, _ = llama.apply_rotary_pos_emb(x, x, cos, sin)
    return rotated


@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize("head_dim", [2, 6, 16])
def test_apply_rope_equals_hf_llama(base: float, head_dim: int) -> None:
    x = torch.randn(3, 5, 7, head_dim)  # (b, h, t, d), every size different
    positions = torch.stack([torch.arange(7), torch.arange(7) + 11, torch.arange(7) * 3])
    assert_close(apply_rope(x, positions, base=base), _hf_rotate(x, positions, base), **_EXACT)
    cos, sin = rope.rope_cos_sin(positions, head_dim, base=base)  # the tables layers use
    assert_close(rope.rotate(x, cos, sin), _hf_rotate(x, positions, base), **_EXACT)


_EXACT = {"atol": 0.0, "rtol": 0.0}


def test_apply_rope_one_pair_is_a_plane_rotation() -> None:
    # head_dim 2: one pair, turned by position * 1 radian (theta_0 = 1).
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    out = apply_rope(x, torch.tensor([0, 1, 3]))
    expected = torch.tensor(
        [[1.0, 0.0], [math.cos(1), math.sin(1)], [-2 * math.sin(3), 2 * math.cos(3)]]
    )
    assert_close(out, expected)


def test_frequencies_are_the_geometric_sequence() -> None:
    theta = rope_frequencies(8, base=100.0)
    assert_close(theta, torch.tensor([1.0, 100 ** (-2 / 8), 100 ** (-4 / 8), 100 ** (-6 / 8)]))
    assert_close(rope_angles(torch.tensor([5]), 8, base=100.0), 5 * theta[None])


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_scores_depend_only_on_the_offset(layout: rope.RopeLayout) -> None:
    q, k = torch.randn(4, 12), torch.randn(4, 12)

    def score(m: int, n: int) -> torch.Tensor:
        qm = apply_rope(q, torch.full((4,), m), layout=layout)
        kn = apply_rope(k, torch.full((4,), n), layout=layout)
        return (qm * kn).sum(-1)

    assert_close(score(7, 2), score(105, 100), atol=1e-4, rtol=1e-4)
    assert_close(score(0, 0), (q * k).sum(-1), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(score(7, 2), score(2, 7), atol=1e-3)  # direction matters


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotation_keeps_norms(layout: rope.RopeLayout) -> None:
    x = torch.randn(2, 9, 10)
    out = apply_rope(x, torch.arange(9) * 17, layout=layout)
    assert_close(out.norm(dim=-1), x.norm(dim=-1))


def test_layouts_are_one_rotation_in_a_permuted_basis() -> None:
    d = 10
    x = torch.randn(2, 3, 6, d)
    to_half = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])  # evens, then odds
    interleaved = apply_rope(x, torch.arange(6) + 4, layout="interleaved")
    half = apply_rope(x[..., to_half], torch.arange(6) + 4, layout="half")
    assert_close(interleaved[..., to_half], half, **_EXACT)
    assert not torch.allclose(interleaved, apply_rope(x, torch.arange(6) + 4))


def test_default_positions_and_unbatched_input() -> None:
    x = torch.randn(5, 4)
    assert_close(apply_rope(x), apply_rope(x, torch.arange(5)))
    assert_close(apply_rope(x)[0], x[0])  # position 0 is not rotated


def test_float64_is_rotated_in_float64_as_hf() -> None:
    # HF's float64 layer: float32 angles, cos/sin cast to float64, rotation in float64.
    x = torch.randn(2, 3, 7, 16, dtype=torch.float64)
    positions = torch.arange(7)[None] + 5000  # (1, t): broadcast over the batch
    expected = _hf_rotate(x, positions, 10000.0)
    got = apply_rope(x, positions)
    assert got.dtype == torch.float64
    assert_close(got, expected, **_EXACT)
    assert_close(rope.rotate(x, *rope.rope_cos_sin(positions, 16)), expected, **_EXACT)
    # Rotating in float32 (the old rule) is off by float32 rounding, far above float64's.
    rounded = apply_rope(x.float(), positions).double()
    assert (rounded - expected).abs().max() > 1e-9


def test_rotate_takes_hf_position_embeddings() -> None:
    """`rotate` with HF's (cos, sin) `(b, t, head_dim)` equals apply_rope: tables shared."""
    head_dim = 8
    config = LlamaConfig(hidden_size=16, num_attention_heads=2, head_dim=head_dim)
    x = torch.randn(2, 3, 5, head_dim)
    positions = torch.stack([torch.arange(5), torch.arange(5) + 9])
    hf_cos, hf_sin = llama.LlamaRotaryEmbedding(config)(x, positions)  # (b, t, head_dim)
    rope.check_cos_sin((hf_cos, hf_sin), x, head_dim)
    expected = apply_rope(x, positions)
    assert_close(rope.rotate(x, hf_cos, hf_sin), expected, **_EXACT)
    cos, sin = rope.rope_cos_sin(positions, head_dim)  # (b, t, head_dim / 2)
    assert cos.shape == (2, 5, 4)
    assert_close(cos, hf_cos[..., :4], **_EXACT)
    assert_close(rope.rotate(x, cos, sin), expected, **_EXACT)


def test_cos_sin_tables_feed_a_layer() -> None:
    """A model's tables, built once per forward, as a layer's position_embeddings."""
    from attnlab import GroupedQueryAttention

    layer = GroupedQueryAttention(16, 4, 2, head_dim=6).eval()
    x, positions = torch.randn(2, 5, 16), torch.arange(5)[None] + 20
    expected = layer(x, positions=positions)
    tables = rope.rope_cos_sin(positions, 6)  # (1, t, 3) each
    assert_close(layer(x, position_embeddings=tables), expected, **_EXACT)
    with pytest.raises(ValueError, match=r"cos has 4 positions but x has 5 tokens"):
        layer(x, position_embeddings=rope.rope_cos_sin(positions[:, :4], 6))


def test_low_precision_is_rotated_in_float32() -> None:
    x = torch.randn(2, 7, 8)
    positions = torch.arange(7) + 1000
    out = apply_rope(x.bfloat16(), positions)
    assert out.dtype == torch.bfloat16
    assert_close(out, apply_rope(x.bfloat16().float(), positions).bfloat16(), **_EXACT)


def test_gradient_is_the_inverse_rotation() -> None:
    x = torch.randn(3, 8, requires_grad=True)
    positions = torch.tensor([2, 5, 9])
    g = torch.randn(3, 8)
    apply_rope(x, positions).backward(g)
    assert x.grad is not None
    assert_close(x.grad, apply_rope(g, -positions))  # rotations are orthogonal


def test_positions_past_the_bound_are_refused() -> None:
    """A model's `max_positions` (the decoder's `high`): past it is an error, not a wrap."""
    with pytest.raises(
        ValueError, match=r"positions must lie in \[0, 16\).*got positions from 14 to 17"
    ):
        rope.check_positions(torch.arange(14, 18), torch.randn(4, 8), low=0, high=16)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: apply_rope(torch.randn(4, 5)), ValueError, "head_dim must be even.*got 5"),
        (lambda: apply_rope(torch.arange(8).view(2, 4)), TypeError, "x must have a floating-point"),
        (
            lambda: apply_rope(torch.randn(4, 6), torch.arange(3)),
            ValueError,
            r"positions has 3 positions but x has 4 tokens",
        ),
        (
            lambda: apply_rope(torch.randn(4, 6), torch.arange(4.0)),
            TypeError,
            r"positions must be an integer tensor \(t,\) or \(b, t\), got torch.float32",
        ),
        (
            lambda: apply_rope(torch.randn(2, 3, 4, 6), torch.zeros(5, 4, dtype=torch.long)),
            ValueError,
            r"positions of shape \(b, t\)=\(5, 4\) need x batched with the same b",
        ),
        (
            lambda: apply_rope(torch.randn(4, 6), layout="rotate"),  # type: ignore[arg-type]
            ValueError,
            "layout must be one of 'half', 'interleaved', got 'rotate'",
        ),
        (
            lambda: rope_frequencies(8, base=1.0),
            ValueError,
            "base must be a finite float greater than 1",
        ),
        (lambda: rope_frequencies(7), ValueError, "head_dim must be even"),
        (lambda: rope_angles(torch.arange(3), 8, base=0.5), ValueError, "base must be a finite"),
        (lambda: rope.check_base(True, "rope_base"), TypeError, "rope_base must be a float"),
        (
            lambda: rope.check_positions(torch.arange(3), torch.randn(4, 8), low=0),
            ValueError,
            r"positions has 3 positions but x has 4 tokens",
        ),
        (
            lambda: rope.check_positions(torch.tensor([2, -1]), torch.randn(2, 8), low=0),
            ValueError,
            "positions must be non-negative .*, got positions from -1 to 2",
        ),
        (
            lambda: rope.check_cos_sin((torch.ones(3, 4), torch.ones(3, 2)), torch.ones(3, 8), 8),
            ValueError,
            "cos and sin must have one shape",
        ),
        (
            lambda: rope.check_cos_sin((torch.ones(3, 3),) * 2, torch.ones(3, 8), 8),
            ValueError,
            r"d = head_dim // 2 = 4 \(attnlab\) or head_dim = 8 \(Hugging Face\)",
        ),
        (
            lambda: rope.check_cos_sin((torch.ones(2, 3, 4),) * 2, torch.ones(3, 3, 8), 8),
            ValueError,
            r"cos of shape \(b, t\)=\(2, 3\) need x batched",
        ),
        (lambda: rope.check_cos_sin(torch.ones(3, 4), torch.ones(3, 8), 8), TypeError, "a pair"),
        (
            lambda: rope.check_rope_inputs(
                torch.arange(3), rope.rope_cos_sin(torch.arange(3), 8), torch.ones(3, 8), 8
            ),
            ValueError,
            "pass either positions or position_embeddings, not both",
        ),
    ],
)
def test_bad_input_is_named(call, error: type[Exception], message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=message):
        call()


def test_validation_off_computes_the_same() -> None:
    x, positions = torch.randn(2, 3, 5, 8), torch.arange(5)
    expected = apply_rope(x, positions, layout="interleaved")
    with validation(False):
        assert_close(apply_rope(x, positions, layout="interleaved"), expected, **_EXACT)


def test_value_checks_are_skipped_while_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading position values is a host sync: it is skipped under torch.compile/export."""
    x, positions = torch.randn(2, 8), torch.tensor([2, -1])
    with pytest.raises(ValueError, match="non-negative"):
        rope.check_positions(positions, x, low=0)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert rope.check_positions(positions, x, low=0) is positions


def test_default_positions_continue_after_the_cache() -> None:
    assert rope.default_positions(0, 3, "cpu").tolist() == [0, 1, 2]
    got = rope.default_positions(5, 2, "cpu")
    assert got.tolist() == [5, 6]
    assert got.dtype == torch.int64
    assert rope.default_positions(4, 0, None).shape == (0,)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (8, None, ""),
        (2, None, ""),
        (10, ValueError, r"^rope_dims must be at most head_dim=8, got rope_dims=10$"),
        (3, ValueError, r"^rope_dims must be even \(RoPE rotates pairs"),
        (0, ValueError, r"^rope_dims must be a positive int, got 0"),
        (4.0, TypeError, r"^rope_dims must be a positive int, got 4.0"),
    ],
)
def test_rope_dims_rule_is_one_for_every_layer(
    value: object, error: type[Exception] | None, match: str
) -> None:
    # The rule of partial RoPE, written once in rope and used by GQA, DecoderConfig and
    # DeepSeek's indexer (which calls the argument rope_dim and allows 0: no RoPE).
    from attnlab.layers.gqa import GroupedQueryAttention
    from attnlab.layers.sparse import LightningIndexer
    from attnlab.models.config import DecoderConfig

    sizes = {"vocab_size": 10, "d_model": 16, "num_layers": 1, "num_heads": 2,
             "num_kv_heads": 1, "head_dim": 8, "hidden_dim": 12}  # fmt: skip
    makers = [
        (lambda v: rope.check_rope_dims(v, 8), "rope_dims"),
        (lambda v: GroupedQueryAttention(16, 2, head_dim=8, rope=Rope(dims=v)), "rope.dims"),
        (lambda v: DecoderConfig(**sizes, rope_dims=v), "rope_dims"),
        (lambda v: LightningIndexer(16, 2, 8, rope_dim=v), "rope_dim"),
    ]
    for make, name in makers:
        if error is None:
            make(value)
        elif not (value == 0 and name == "rope_dim"):
            with pytest.raises(error, match=match.replace("rope_dims", name)):
                make(value)
    assert LightningIndexer(16, 2, 8, rope_dim=0).rope_dim == 0
