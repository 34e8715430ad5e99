"""attnlab.functional.paged_fast: the fast path equals the teaching kernel.

`paged_attention_fast` is what the serving engine and the benchmarks run; each of its
CPU kernels (a decode step's sampled product, fused tiles) and its fallbacks must give
what `paged_attention` gives, on GQA, MHA and MQA, equal and different value widths,
decode steps and prompt chunks of ragged lengths, one block or many per tile, whole and
strided pools, in float32, float64 and half precision, and inside autocast.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from attnlab.functional.paged import paged_attention
from attnlab.functional.paged_fast import paged_attention_fast

BS = 4
LENGTHS = [1, 6, 13, 16, 29]  # partial, exact and multi-block sequences


def _case(
    heads: tuple[int, int], features: tuple[int, int], t_q: int, dtype: torch.dtype, whole: bool
) -> dict[str, Tensor]:
    """Shuffled disjoint tables over one pool; every row of a prompt chunk ragged."""
    h, kv = heads
    hd, hd_v = features
    max_blocks = -(-max(LENGTHS) // BS)
    num_blocks = len(LENGTHS) * max_blocks + 3
    pad = 0 if whole else 2  # a view of wider pools: strided, not contiguous
    k_pool = torch.randn(kv, num_blocks, BS, hd + pad, dtype=dtype)[..., :hd]
    v_pool = torch.randn(kv, num_blocks, BS, hd_v + pad, dtype=dtype)[..., :hd_v]
    tables = torch.randperm(num_blocks)[: len(LENGTHS) * max_blocks]
    lengths = torch.tensor(LENGTHS)
    query_lengths = torch.tensor([min(t_q, n, 1 + i % t_q) for i, n in enumerate(LENGTHS)])
    return {
        "query": torch.randn(len(LENGTHS), h, t_q, hd, dtype=dtype),
        "key_pool": k_pool,
        "value_pool": v_pool,
        "block_tables": tables.reshape(len(LENGTHS), max_blocks),  # (b, max_blocks)
        "lengths": lengths,
        "query_lengths": query_lengths,
    }


def _tol(dtype: torch.dtype) -> dict[str, float]:
    if dtype == torch.float64:
        return {"atol": 1e-12, "rtol": 0.0}
    if dtype == torch.float32:
        return {"atol": 1e-6, "rtol": 1e-5}
    return {"atol": 1e-2, "rtol": 1e-2}  # both round a float32 result to 8 or 11 bits


@pytest.mark.parametrize("heads", [(6, 2), (3, 3), (4, 1)], ids=["gqa", "mha", "mqa"])
@pytest.mark.parametrize("features", [(8, 8), (5, 3)], ids=["same-width", "narrow-values"])
@pytest.mark.parametrize("t_q", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("whole", [True, False], ids=["contiguous", "strided"])
def test_fast_path_equals_teaching_kernel(
    heads: tuple[int, int],
    features: tuple[int, int],
    t_q: int,
    dtype: torch.dtype,
    whole: bool,
) -> None:
    args = _case(heads, features, t_q, dtype, whole)
    with torch.inference_mode():
        for blocks_per_tile in (1, 3, 32):
            want = paged_attention(**args, blocks_per_tile=blocks_per_tile)  # type: ignore[arg-type]
            got = paged_attention_fast(**args, blocks_per_tile=blocks_per_tile)  # type: ignore[arg-type]
            assert got.dtype == want.dtype == dtype
            torch.testing.assert_close(got, want, **_tol(dtype))
        # Without query_lengths every row is a query (each sequence holds t_q tokens).
        del args["query_lengths"]
        args["lengths"] = args["lengths"].clamp_min(t_q)
        torch.testing.assert_close(
            paged_attention_fast(**args, scale=0.3),  # type: ignore[arg-type]
            paged_attention(**args, scale=0.3),  # type: ignore[arg-type]
            **_tol(dtype),
        )


@pytest.mark.parametrize(
    "option",
    [{"method": "gather"}, {"backend": "scratch"}, {"method": "gather", "backend": "scratch"}],
)
def test_fast_path_runs_the_teaching_kernel_when_asked_for_another(
    option: dict[str, str],
) -> None:
    args = _case((6, 2), (8, 8), 1, torch.float32, True)
    with torch.inference_mode():
        got = paged_attention_fast(**args, **option)  # type: ignore[arg-type]
        torch.testing.assert_close(got, paged_attention(**args, **option), atol=0, rtol=0)  # type: ignore[arg-type]


def test_fast_path_with_gradient_runs_the_teaching_kernel() -> None:
    # Its CPU kernels are inference only; with a gradient wanted, the teaching kernel
    # runs, and the gradient reaches the query.
    args = _case((6, 2), (8, 8), 1, torch.float64, True)
    query = args.pop("query").requires_grad_()
    got = paged_attention_fast(query, **args)  # type: ignore[arg-type]
    torch.testing.assert_close(got, paged_attention(query, **args), atol=0, rtol=0)  # type: ignore[arg-type]
    got.sum().backward()
    assert query.grad is not None
    assert torch.isfinite(query.grad).all()


@pytest.mark.parametrize("t_q", [1, 3])
def test_fast_path_follows_autocast_like_the_teaching_kernel(t_q: int) -> None:
    args = _case((6, 2), (8, 8), t_q, torch.float32, True)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = paged_attention_fast(**args)  # type: ignore[arg-type]
        want = paged_attention(**args)  # type: ignore[arg-type]
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, **_tol(torch.bfloat16))


def test_fast_path_of_no_sequences_is_empty() -> None:
    args = _case((6, 2), (8, 3), 1, torch.float32, True)
    empty = {name: x[:0] for name, x in args.items() if name not in ("key_pool", "value_pool")}
    out = paged_attention_fast(**empty, key_pool=args["key_pool"], value_pool=args["value_pool"])  # type: ignore[arg-type]
    assert out.shape == (0, 6, 1, 3)
