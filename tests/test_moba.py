"""MoBA (Lu et al., 2025) against a float64 transcription of its authors' reference.

The reference below follows the steps of `moba_attn_varlen_naive` in the authors'
`moba/moba_naive.py` (MoonshotAI/MoBA), written again here for one sequence in float64:
mean key per block, gate = query . mean key, -inf for blocks that do not lie wholly
before the query's own, +inf for its own block, top-k over the blocks, then causal
attention over the chosen blocks. It differs from theirs in layout only: one sequence
`(t, H, E)` instead of packed sequences with `cu_seqlens`, and no cast to float32 (it is
float64 throughout). attnlab's kernels take `(b, H, t, E)` batches, grouped key heads
and queries that are the last positions of a cache, which the tests below check by
expanding the heads and by comparing decode rows with the rows of a prefill.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.functional.sparse import moba_attention, moba_blocks
from attnlab.rules import masks


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block: int,
    topk: int,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence `(t, H, E)` each: the output `(t, H, E)` and the chosen blocks `(H, t, n)`."""
    t, d = q.shape[0], q.shape[-1]
    n = math.ceil(t / block)
    means = torch.stack([k[j * block : (j + 1) * block].mean(0) for j in range(n)])  # (n, H, E)
    gate = torch.einsum("thd,nhd->htn", q, means)
    for j in range(n):
        gate[:, : (j + 1) * block, j] = -math.inf  # not wholly before the query
        gate[:, j * block : (j + 1) * block, j] = math.inf  # the query's own block
    _, picks = gate.topk(min(topk, n), dim=-1)
    chosen = torch.zeros_like(gate, dtype=torch.bool).scatter(-1, picks, True)
    # A block picked at -inf (fewer blocks behind than topk) lies after the query: the
    # causal mask below hides all of it, so it is not a choice.
    chosen &= gate > -math.inf
    keys = chosen.repeat_interleave(block, dim=-1)[..., :t]
    keys &= torch.ones(t, t, dtype=torch.bool).tril()
    scores = torch.einsum("xhd,yhd->hxy", q, k) * (d**-0.5 if scale is None else scale)
    p = scores.masked_fill(~keys, -math.inf).softmax(-1)
    return torch.einsum("hxy,yhd->xhd", p, v), chosen


def _qkv(b: int, h: int, h_kv: int, t: int, d: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    shapes = ((b, h, t, d), (b, h_kv, t, d), (b, h_kv, t, d))
    return [torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) for shape in shapes]


# (t, block, topk): a partial last block, top-k past the blocks there are, and one block
CASES = [(23, 4, 3), (16, 4, 2), (10, 3, 9), (9, 9, 2), (12, 4, 1)]


@pytest.mark.parametrize(("t", "block", "topk"), CASES)
def test_equals_the_authors_reference(t: int, block: int, topk: int) -> None:
    q, k, v = _qkv(2, 4, 2, t, 8, torch.float64)  # two query heads per key head
    ours = moba_attention(q, k, v, block_size=block, top_k=topk)
    chosen = moba_blocks(q, k, block, topk)
    for i in range(2):
        expand = [x[i].repeat_interleave(2, dim=0).transpose(0, 1) for x in (k, v)]
        out, picked = reference(q[i].transpose(0, 1), *expand, block, topk)
        torch.testing.assert_close(ours[i], out.transpose(0, 1), atol=1e-12, rtol=0)
        assert torch.equal(chosen[i], picked)
    q32, k32, v32 = (x.float() for x in (q, k, v))
    ours32 = moba_attention(q32, k32, v32, block_size=block, top_k=topk)
    torch.testing.assert_close(ours32, ours.float(), atol=2e-6, rtol=0)
    # A scale of the caller's, in place of 1 / sqrt(E):
    scaled = moba_attention(q, k, v, block_size=block, top_k=topk, scale=0.9)
    expand = [x[0].repeat_interleave(2, dim=0).transpose(0, 1) for x in (k, v)]
    out = reference(q[0].transpose(0, 1), *expand, block, topk, scale=0.9)[0]
    torch.testing.assert_close(scaled[0], out.transpose(0, 1), atol=1e-12, rtol=0)


def test_half_precision_chooses_as_float32() -> None:
    # Block means are summed in float32: 64 keys of about 2,000 sum past float16's
    # largest number (65,504), which would make a block's score inf and win every choice.
    g = torch.Generator().manual_seed(3)
    k = torch.randn(1, 1, 256, 2, generator=g) + torch.tensor([2000.0, 0.0])
    k[:, :, 64:128] = torch.randn(64, 2, generator=g) + torch.tensor([0.0, 1500.0])
    q = torch.randn(1, 1, 256, 2, generator=g).abs()
    half = moba_blocks(q.half(), k.half(), 64, 2)
    assert torch.equal(half, moba_blocks(q, k, 64, 2))
    assert half[0, 0, 192:, 1].any()  # the block of smaller sums is chosen somewhere


def test_the_choice_is_causal_and_keeps_the_own_block() -> None:
    q, k, _ = _qkv(1, 2, 2, 40, 8, torch.float32)
    chosen = moba_blocks(q, k, 5, 3)  # (1, 2, 40, 8)
    own = torch.arange(40) // 5
    blocks = torch.arange(8)
    assert not (chosen & (blocks > own[:, None])).any()  # no block after the query's own
    assert chosen[..., torch.arange(40), own].all()
    counts = chosen.sum(-1)  # own block + min(2, blocks behind it)
    assert torch.equal(counts, (1 + own.clamp(max=2)).expand_as(counts))


def test_all_blocks_is_causal_attention_and_one_block_is_chunked() -> None:
    q, k, v = _qkv(1, 2, 1, 18, 8, torch.float32)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    full = moba_attention(q, k, v, block_size=4, top_k=5)
    torch.testing.assert_close(full, causal, atol=1e-6, rtol=0)
    own_only = moba_attention(q, k, v, block_size=4, top_k=1)
    chunked = masks.chunked(18, chunk_size=4)  # Llama 4's chunked attention
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=chunked, enable_gqa=True)
    torch.testing.assert_close(own_only, dense, atol=1e-6, rtol=0)


def test_a_decode_step_chooses_as_the_last_rows_of_a_prefill() -> None:
    q, k, v = _qkv(1, 2, 2, 21, 8, torch.float32)
    prefill = moba_attention(q, k, v, block_size=4, top_k=3)
    for t in (1, 3):  # the last t queries against every key, as after a KV cache
        step = moba_attention(q[:, :, -t:], k, v, block_size=4, top_k=3)
        torch.testing.assert_close(step, prefill[:, :, -t:], atol=1e-6, rtol=0)
        assert torch.equal(moba_blocks(q[:, :, -t:], k, 4, 3), moba_blocks(q, k, 4, 3)[:, :, -t:])


def test_gradients_equal_the_reference() -> None:
    q, k, v = (x.requires_grad_() for x in _qkv(1, 2, 2, 14, 4, torch.float64))
    moba_attention(q, k, v, block_size=3, top_k=2).square().sum().backward()
    ours = [x.grad for x in (q, k, v)]
    q2, k2, v2 = (x.detach()[0].transpose(0, 1).requires_grad_() for x in (q, k, v))
    reference(q2, k2, v2, 3, 2)[0].square().sum().backward()
    for mine, theirs in zip(ours, (q2.grad, k2.grad, v2.grad), strict=True):
        assert mine is not None
        assert theirs is not None
        torch.testing.assert_close(mine[0], theirs.transpose(0, 1), atol=1e-12, rtol=0)


BAD = [
    ("block_size", {"block_size": 0}, ValueError, "block_size must be a positive int"),
    ("top_k", {"top_k": 2.0}, TypeError, r"top_k must be a positive int, got 2.0 \(float\)"),
    (
        "heads",
        {"k": (1, 3, 8, 4), "v": (1, 3, 8, 4)},
        ValueError,
        r"query.shape\[1\] must be a multiple of key.shape\[1\], got query.shape\[1\]=2",
    ),
    ("more-queries", {"q": (1, 2, 9, 4)}, ValueError, "t=9 > s=8"),
    (
        "no-keys",
        {"k": (1, 2, 0, 4), "v": (1, 2, 0, 4), "q": (1, 2, 0, 4)},
        ValueError,
        "key must have at least one position",
    ),
    ("rank", {"q": (2, 8, 4)}, ValueError, r"query must have 4 dimensions \(b, Hq, t, E\), got 3"),
    ("value", {"v": (1, 1, 8, 4)}, ValueError, "value must have the batch and heads of key"),
    ("batch", {"q": (2, 2, 8, 4)}, ValueError, r"query must have the batch of key, got key"),
]


@pytest.mark.parametrize(("name", "change", "error", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_argument(
    name: str, change: dict[str, object], error: type[Exception], match: str
) -> None:
    shapes = {"q": (1, 2, 8, 4), "k": (1, 2, 8, 4), "v": (1, 2, 8, 4)}
    shapes |= {key: val for key, val in change.items() if key in shapes}  # type: ignore[misc]
    q, k, v = (torch.randn(*shape) for shape in shapes.values())  # type: ignore[misc]
    sizes = {"block_size": 4, "top_k": 2} | {
        key: val for key, val in change.items() if key not in shapes
    }
    with pytest.raises(error, match=match):
        moba_attention(q, k, v, **sizes)  # type: ignore[arg-type]
