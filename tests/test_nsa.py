"""NSA's kernels (attnlab.functional.nsa) against a dense float64 reference that applies
the same selections with masks over every key: outputs and gradients of the three
branches mixed by their gates, the blocks chosen, and the blocks compressed."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from attnlab.functional.nsa import compress_blocks, nsa_attention, nsa_select

B, H, HKV, S, D, DV = 2, 4, 2, 37, 8, 6
SIZES = {"block": 8, "stride": 4, "select_block": 8}


def _masked_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """Dense softmax attention `(b, h, t, s)` under `allowed`; rows with none give 0."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    return weights @ v


def _reference(
    q: Tensor, k: Tensor, v: Tensor, kc: Tensor, vc: Tensor, chosen: Tensor, gates: Tensor
) -> Tensor:
    """NSA written densely: one mask over all keys per branch, every key scored."""
    t, s, g = q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    pos = torch.arange(s - t, s)[:, None]  # (t, 1)
    j = torch.arange(s)[None]  # (1, s)
    ends = torch.arange(kc.shape[2])[None] * SIZES["stride"] + SIZES["block"] - 1
    wide = {"k": k.repeat_interleave(g, 1), "v": v.repeat_interleave(g, 1)}
    compressed = _masked_attention(
        q, kc.repeat_interleave(g, 1), vc.repeat_interleave(g, 1), ends <= pos
    )
    owner = torch.arange(s)[:, None] // SIZES["select_block"]  # (s, 1): each key's block
    picked = (owner == chosen[..., None, :]).any(-1) & (j <= pos)  # (b, hkv, t, s)
    selected = _masked_attention(q, wide["k"], wide["v"], picked.repeat_interleave(g, 1))
    local = _masked_attention(q, wide["k"], wide["v"], (j <= pos) & (j > pos - 5))
    return gates[..., 0:1] * compressed + gates[..., 1:2] * selected + gates[..., 2:3] * local


def _inputs(t: int) -> dict[str, Tensor]:
    torch.manual_seed(t)
    shapes = {"q": (B, H, t, D), "k": (B, HKV, S, D), "v": (B, HKV, S, DV)}
    made = {name: torch.randn(shape, dtype=torch.float64) for name, shape in shapes.items()}
    made["kc"] = compress_blocks(made["k"], SIZES["block"], SIZES["stride"])
    made["vc"] = compress_blocks(made["v"], SIZES["block"], SIZES["stride"])
    made["gates"] = torch.rand(B, H, t, 3, dtype=torch.float64)
    return made


@pytest.mark.parametrize("t", [S, 1], ids=["prefill", "decode"])
def test_three_branches_equal_the_dense_reference_with_the_same_choice(t: int) -> None:
    x = {name: tensor.requires_grad_() for name, tensor in _inputs(t).items()}
    chosen = nsa_select(x["q"], x["kc"], S, top_n=3, **SIZES)
    assert chosen.shape == (B, HKV, t, 3)
    args = (x["q"], x["k"], x["v"], x["kc"], x["vc"], chosen, x["gates"])
    got = nsa_attention(*args, window=5, **SIZES)
    expected = _reference(*args)
    assert_close(got, expected, atol=1e-12, rtol=0)
    grad = torch.randn_like(got)
    mine = torch.autograd.grad(got, list(x.values()), grad)
    theirs = torch.autograd.grad(expected, list(x.values()), grad)
    for name, a, b in zip(x, mine, theirs, strict=True):
        assert_close(a, b, atol=1e-12, rtol=0, msg=name)


def test_the_choice_follows_the_compressed_attention() -> None:
    x = _inputs(S)
    sel = 4  # selection blocks of 4: each compressed block of 8 overlaps two of them
    chosen = nsa_select(x["q"], x["kc"], S, top_n=5, **(SIZES | {"select_block": sel}))
    # Query at position p: the blocks it must read (0, its own and the one before), then
    # the best by compressed attention summed over its group's heads and over the
    # compressed blocks that overlap the selection block; never a block after its own.
    by_importance = 0
    for p in range(S):
        q = x["q"][0, :2, p]  # the two heads of key head 0
        visible = [i for i in range(x["kc"].shape[2]) if i * 4 + 7 <= p]
        probs = torch.softmax(q @ x["kc"][0, 0, visible].T * D**-0.5, -1).sum(0)
        own = p // sel
        # compressed block i covers tokens 4i .. 4i + 7, selection block j 4j .. 4j + 3
        overlaps = [[n for n, i in enumerate(visible) if 4 * i < sel * (j + 1) < 4 * i + 8 + sel]
                    for j in range(own + 1)]  # fmt: skip
        importance = {j: sum(float(probs[n]) for n in overlaps[j]) for j in range(own + 1)}
        forced = {0, own, max(own - 1, 0)}
        rest = sorted(set(importance) - forced, key=lambda j: -importance[j])
        got = {int(j) for j in chosen[0, 0, p] if j >= 0}
        assert got == set((sorted(forced) + rest)[:5]), p
        by_importance += len(got - forced) if len(rest) > 2 else 0
    assert by_importance >= 20  # choices that only the importance decides


def test_blocks_compress_by_mean_or_by_a_learned_map() -> None:
    k = torch.randn(1, 1, 10, 3)
    means = compress_blocks(k, 4, 2)
    assert means.shape == (1, 1, 4, 3)  # blocks start at 0, 2, 4, 6
    assert_close(means[0, 0, 3], k[0, 0, 6:10].mean(0))
    weight = torch.randn(3, 12)
    mapped = compress_blocks(k, 4, 2, weight)
    assert_close(mapped[0, 0, 1], weight @ k[0, 0, 2:6].flatten())
    assert compress_blocks(k[:, :, :3], 4, 2).shape == (1, 1, 0, 3)


def test_a_gate_of_the_wrong_shape_or_a_bad_size_is_refused() -> None:
    x = _inputs(4)
    chosen = nsa_select(x["q"], x["kc"], S, top_n=2, **SIZES)
    args = (x["q"], x["k"], x["v"], x["kc"], x["vc"], chosen)
    with pytest.raises(ValueError, match=r"gates must be \(b, h, t, 3\) = \(2, 4, 4, 3\)"):
        nsa_attention(*args, x["gates"][..., :2], window=5, **SIZES)
    with pytest.raises(ValueError, match="window must be a positive int"):
        nsa_attention(*args, x["gates"], window=0, **SIZES)
    with pytest.raises(ValueError, match="select_block must be a positive int"):
        nsa_attention(*args, x["gates"], window=5, **(SIZES | {"select_block": 0}))
    with pytest.raises(ValueError, match="num_heads must be a multiple of num_kv_heads"):
        nsa_select(x["q"][:, :3], x["kc"], S, top_n=2, **SIZES)
    with pytest.raises(ValueError, match="stride must be a positive int"):
        nsa_select(x["q"], x["kc"], S, top_n=2, **(SIZES | {"stride": 0}))
    with pytest.raises(ValueError, match="t=4 tokens but num_keys=3"):
        nsa_select(x["q"], x["kc"], 3, top_n=2, **SIZES)
    with pytest.raises(TypeError, match="chosen must be an integer tensor"):
        nsa_attention(*args[:-1], chosen.float(), x["gates"], window=5, **SIZES)
    with pytest.raises(ValueError, match=r"gates has dtype torch.float32 but query torch.float64"):
        nsa_attention(*args, x["gates"].float(), window=5, **SIZES)
    with pytest.raises(ValueError, match="query must have 4 dimensions"):
        nsa_attention(x["q"][0], *args[1:], x["gates"], window=5, **SIZES)
