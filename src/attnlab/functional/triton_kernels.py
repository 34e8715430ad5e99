r"""FlashAttention-2 as Triton kernels: the forward pass and the three kernels of the backward.

The algorithm of [`flash_attention`][attnlab.functional.flash.flash_attention] (Dao, 2023,
https://arxiv.org/abs/2307.08691), written as GPUs run it: one *program* per tile of
queries (forward, $dQ$) or of keys ($dK$, $dV$), its tiles loaded into registers, the
products on `tl.dot`, the running maximum and sum of the online softmax held in
registers across the loop over the other side's tiles. Triton (Tillet et al., 2019,
https://doi.org/10.1145/3315508.3329973) compiles these functions for a GPU; its
interpreter runs the same functions on the CPU, each program in turn, with NumPy.

Which of the two runs is decided once, when this module is imported: the interpreter
when PyTorch sees no CUDA GPU or the user set `TRITON_INTERPRET=1`, the compiler
otherwise. The kernels are wrapped by this module's own `jit`, so the choice changes
neither Triton's settings nor how a user's own `@triton.jit` kernels run.

Importing this module needs `triton`; [`triton_flash`][attnlab.functional.triton_flash]
imports it on first use and is the public entry (checks, autograd, launch).

Every kernel reads contiguous tensors: queries `(B * Hq, L, E)`, keys `(B * Hkv, S, E)`,
values `(B * Hkv, S, Ev)`; query head `bh` reads key/value head `bh // group` with
`group = Hq / Hkv` (grouped-query attention without copying a key). Scores are in base 2
(`exp2`, as GPU kernels compute): `q_factor` folds $\log_2 e$ into the scale, or is the
scale over the softcap, whose $\tanh$ is then multiplied by `cap2` $= c \log_2 e$; ALiBi's
slopes and the sink logits arrive multiplied by $\log_2 e$, and the log-sum-exp is stored
in base 2. Query $i$ sits at key position $i + o$ (`offset`) for the causal and window
rules, as in `flash`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = [
    "INTERPRET",
    "accumulator",
    "backward_dkdv",
    "backward_dq",
    "backward_preprocess",
    "dot",
    "forward",
    "jit",
    "load_tile",
    "row_max",
    "row_sum",
    "store_tile",
]

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1" or not torch.cuda.is_available()
"""Whether attnlab's kernels run in Triton's interpreter (on CPU tensors) rather than
compiled (on CUDA tensors); fixed when this module is imported."""


def jit(fn: Callable[..., Any]) -> Any:
    """`triton.jit`, or the interpreter's function when `INTERPRET`: this module's choice,
    made without touching `TRITON_INTERPRET` (read by `triton.jit` at decoration)."""
    if INTERPRET:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(fn)
    return triton.jit(fn)


def accumulator(dtype: torch.dtype) -> Any:
    """The dtype the kernels accumulate in for inputs of `dtype`: float64 for float64,
    float32 for the rest (the `ACC` switch of every kernel)."""
    return tl.float64 if dtype == torch.float64 else tl.float32


# --8<-- [start:helpers]
@jit
def load_tile(P, first, rows, n_rows, cols, n_cols):
    """Rows `rows` and columns `cols` of the `(n_rows, n_cols)` row-major matrix that
    starts at row `first` of `P`; zeros where a tile runs past the matrix's edge."""
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    at = (first + rows[:, None]).to(tl.int64) * n_cols + cols[None, :]  # int64: no overflow
    return tl.load(P + at, mask=mask, other=0.0)


@jit
def store_tile(P, x, first, rows, n_rows, cols, n_cols):
    """Write `x` where `load_tile` with the same arguments reads (inside the edges)."""
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    at = (first + rows[:, None]).to(tl.int64) * n_cols + cols[None, :]
    tl.store(P + at, x, mask=mask)


@jit
def dot(a, b, PRECISION: tl.constexpr, ACC: tl.constexpr):
    """`a @ b` accumulated in `ACC` (float32, or float64): on a GPU's tensor cores for
    float16, bfloat16 and TF32, on its ordinary units for float32 with "ieee"."""
    return tl.dot(a, b, input_precision=PRECISION, out_dtype=ACC)


@jit
def row_sum(x):
    """`tl.sum(x, 1)` in either mode: `tl.sum` and `tl.max` are themselves `@triton.jit`
    functions, made for one mode when Triton was imported; `tl.reduce` is built in and
    runs in both. Its combining functions are Triton's own (private names), which the
    interpreter knows and runs as NumPy's sum and max (any other runs element by
    element in Python)."""
    return tl.reduce(x, 1, tl.standard._sum_combine)


@jit
def row_max(x):
    """`tl.max(x, 1)` in either mode (see `row_sum`)."""
    return tl.reduce(x, 1, tl.standard._elementwise_max)


@jit
def _tanh(x):
    # tanh(x) = 1 - 2 / (e^(2x) + 1), from the core's exp2 (2x log2 e = 2.885 x)
    return 1.0 - 2.0 / (tl.exp2(2.8853900817779268 * x) + 1.0)


# --8<-- [end:helpers]


# --8<-- [start:scores]
@jit
def _scores(
    q, k, rows, cols, S, offset, window, q_factor, cap2, slope2,
    CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr,
):
    """A tile's scores in base 2 (-inf where masked), and tanh(x / c) for the backward."""
    s = dot(q, tl.trans(k), PRECISION, ACC) * q_factor  # (BLOCK_M, BLOCK_N)
    t = s  # unused without a softcap
    if SOFTCAP:  # s = x / c: now c tanh(x / c), in base 2
        t = _tanh(s)
        s = t * cap2
    pos = rows[:, None] + offset  # each query's position among the keys
    if ALIBI:  # m (j - i - o): this tile's part of the bias, never the whole (L, S)
        s += slope2 * (cols[None, :] - pos).to(ACC)
    seen = cols[None, :] < S  # the last tile may run past the keys
    if CAUSAL:
        seen = seen & (cols[None, :] <= pos)
    if WINDOWED:
        seen = seen & (cols[None, :] > pos - window)
    return tl.where(seen, s, float("-inf")), t


@jit
def _key_tiles(
    start_m, L, S, offset, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
):
    """The key tiles `[lo, hi)` that some query of the query tile `start_m` sees."""
    a0 = start_m * BLOCK_M + offset  # the tile's first query, among the keys
    a1 = tl.minimum(start_m * BLOCK_M + BLOCK_M, L) + offset  # one past its last
    hi = S
    if CAUSAL:  # keys after the last query: all in the future
        hi = tl.minimum(S, a1)
    lo = 0
    if WINDOWED:  # keys before the first query's window: too old
        lo = tl.maximum(0, a0 - window + 1)
    some = lo < hi  # else no key is left (queries past the keys' end): no tile at all
    return tl.where(some, (lo // BLOCK_N) * BLOCK_N, 0), tl.where(some, hi, 0)


# --8<-- [end:scores]


# --8<-- [start:forward]
@jit
def forward(
    Q, K, V, Out, Lse2, Sink2, Slope2, Tiles,
    L, S, heads, group, offset, window, q_factor, cap2,
    E: tl.constexpr, EV: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr,
    ALIBI: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr,
):
    """The output and the log-sum-exp (base 2) of one tile of queries of one head, and
    the number of key tiles it computed."""
    start_m = tl.program_id(0)  # this program's tile of queries
    bh = tl.program_id(1)  # batch * Hq + query head
    kv = bh // group  # its key/value head
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    e, ev = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_EV)  # head sizes padded to 2^k
    q = load_tile(Q, bh * L, rows, L, e, E)  # (BLOCK_M, BLOCK_E), kept for the loop
    slope2 = 0.0
    if ALIBI:
        slope2 = tl.load(Slope2 + bh % heads)
    # The online softmax's state, in registers for the whole loop
    m = tl.full([BLOCK_M], -3.0e38, ACC)  # running max (finite: see below)
    ell = tl.full([BLOCK_M], 0.0, ACC)  # running sum
    acc = tl.full([BLOCK_M, BLOCK_EV], 0.0, ACC)  # running output
    lo, hi = _key_tiles(
        start_m, L, S, offset, window, BLOCK_M, BLOCK_N, CAUSAL, WINDOWED
    )
    visited = 0
    for start_n in range(lo, hi, BLOCK_N):  # only the tiles the mask leaves
        cols = start_n + tl.arange(0, BLOCK_N)
        k = load_tile(K, kv * S, cols, S, e, E)  # (BLOCK_N, BLOCK_E)
        s, _ = _scores(
            q, k, rows, cols, S, offset, window, q_factor, cap2, slope2,
            CAUSAL, WINDOWED, SOFTCAP, ALIBI, PRECISION, ACC,
        )
        # A row with no key in this tile keeps m finite, so s - m is -inf, not NaN.
        m_new = tl.maximum(m, row_max(s))
        p = tl.exp2(s - m_new[:, None])  # unnormalized probabilities
        alpha = tl.exp2(m - m_new)  # all summed so far was relative to the old max
        ell = ell * alpha + row_sum(p)
        v = load_tile(V, kv * S, cols, S, ev, EV)  # (BLOCK_N, BLOCK_EV)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, PRECISION, ACC)
        m = m_new
        visited += 1
    if SINKS:  # one more logit in the row's softmax, with no value
        sink2 = tl.load(Sink2 + bh % heads)
        m_new = tl.maximum(m, sink2)
        alpha = tl.exp2(m - m_new)
        ell = ell * alpha + tl.exp2(sink2 - m_new)
        acc = acc * alpha[:, None]
        m = m_new
    has_key = ell > 0.0  # a row that saw no key: output 0, log-sum-exp -inf
    ell = tl.where(has_key, ell, 1.0)
    store_tile(Out, acc / ell[:, None], bh * L, rows, L, ev, EV)  # normalized once
    lse2 = tl.where(has_key, m + tl.log2(ell), float("-inf"))
    tl.store(Lse2 + bh * L + rows, lse2, mask=rows < L)
    tl.store(Tiles + bh * tl.num_programs(0) + start_m, visited)


# --8<-- [end:forward]


# --8<-- [start:preprocess]
@jit
def backward_preprocess(
    Out, dOut, Delta, N, EV: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_EV: tl.constexpr, ACC: tl.constexpr,
):
    """D_i = dO_i . O_i, one number per query, before the two gradient kernels."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # of all N = B Hq L
    ev = tl.arange(0, BLOCK_EV)
    o = load_tile(Out, 0, rows, N, ev, EV).to(ACC)
    do = load_tile(dOut, 0, rows, N, ev, EV).to(ACC)
    tl.store(Delta + rows, row_sum(o * do), mask=rows < N)


# --8<-- [end:preprocess]


# --8<-- [start:dkdv]
@jit
def _row_stats(Lse2, Delta, first, rows, L):
    """The saved log-sum-exp (base 2) and D of some rows; a row that saw no key gets a
    log-sum-exp of +inf, so its recomputed probabilities 2^(s - lse) are 0, not NaN."""
    lse2 = tl.load(Lse2 + first + rows, mask=rows < L, other=float("inf"))
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
    return lse2, tl.load(Delta + first + rows, mask=rows < L, other=0.0)


@jit
def backward_dkdv(
    Q, K, V, dOut, Lse2, Delta, dK, dV, Slope2,
    L, S, heads, group, offset, window, q_factor, cap2, scale,
    E: tl.constexpr, EV: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    PRECISION: tl.constexpr, ACC: tl.constexpr,
):
    """dK and dV of one tile of keys: a loop over the query tiles that see it, in every
    query head of its group, so no two programs write the same rows."""
    start_n = tl.program_id(0)
    kv = tl.program_id(1)  # batch * Hkv + key/value head
    cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    e, ev = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_EV)
    k = load_tile(K, kv * S, cols, S, e, E)  # (BLOCK_N, BLOCK_E), kept for the loop
    v = load_tile(V, kv * S, cols, S, ev, EV)  # (BLOCK_N, BLOCK_EV)
    dk = tl.full([BLOCK_N, BLOCK_E], 0.0, ACC)
    dv = tl.full([BLOCK_N, BLOCK_EV], 0.0, ACC)
    # The query tiles in which some query sees one of these keys (the queries' frame)
    j0 = start_n * BLOCK_N - offset
    j1 = tl.minimum(start_n * BLOCK_N + BLOCK_N, S) - offset
    lo, hi = 0, L
    if CAUSAL:  # queries before the first key see none of them
        lo = tl.where(j0 < L, (tl.maximum(j0, 0) // BLOCK_M) * BLOCK_M, L)
    if WINDOWED:  # queries from hi on: these keys are older than their windows
        hi = tl.minimum(L, j1 - 1 + window)
    for g in range(0, group):  # the query heads that share this key/value head
        bh = kv * group + g
        slope2 = 0.0
        if ALIBI:
            slope2 = tl.load(Slope2 + bh % heads)
        for start_m in range(lo, hi, BLOCK_M):
            rows = start_m + tl.arange(0, BLOCK_M)
            q = load_tile(Q, bh * L, rows, L, e, E)
            do = load_tile(dOut, bh * L, rows, L, ev, EV)
            lse2, delta = _row_stats(Lse2, Delta, bh * L, rows, L)
            s, t = _scores(
                q, k, rows, cols, S, offset, window, q_factor, cap2, slope2,
                CAUSAL, WINDOWED, SOFTCAP, ALIBI, PRECISION, ACC,
            )
            p = tl.exp2(s - lse2[:, None])  # P_ij = exp(s_ij - lse_i), recomputed
            dv += dot(tl.trans(p).to(do.dtype), do, PRECISION, ACC)  # P^T dO
            dp = dot(do, tl.trans(v), PRECISION, ACC)  # dO V^T
            ds = p * (dp - delta[:, None])  # the softmax's backward
            if SOFTCAP:  # through c tanh(x / c): d/dx = 1 - tanh^2
                ds = ds * (1.0 - t * t)
            dk += dot(tl.trans(ds).to(q.dtype), q, PRECISION, ACC)  # dS^T Q
    store_tile(dK, dk * scale, kv * S, cols, S, e, E)
    store_tile(dV, dv, kv * S, cols, S, ev, EV)


# --8<-- [end:dkdv]


# --8<-- [start:dq]
@jit
def backward_dq(
    Q, K, V, dOut, Lse2, Delta, dQ, Slope2,
    L, S, heads, group, offset, window, q_factor, cap2, scale,
    E: tl.constexpr, EV: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    PRECISION: tl.constexpr, ACC: tl.constexpr,
):
    """dQ of one tile of queries: the forward's loop over key tiles, again."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    kv = bh // group
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    e, ev = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_EV)
    q = load_tile(Q, bh * L, rows, L, e, E)
    do = load_tile(dOut, bh * L, rows, L, ev, EV)
    lse2, delta = _row_stats(Lse2, Delta, bh * L, rows, L)
    slope2 = 0.0
    if ALIBI:
        slope2 = tl.load(Slope2 + bh % heads)
    dq = tl.full([BLOCK_M, BLOCK_E], 0.0, ACC)
    lo, hi = _key_tiles(
        start_m, L, S, offset, window, BLOCK_M, BLOCK_N, CAUSAL, WINDOWED
    )
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = load_tile(K, kv * S, cols, S, e, E)
        v = load_tile(V, kv * S, cols, S, ev, EV)
        s, t = _scores(
            q, k, rows, cols, S, offset, window, q_factor, cap2, slope2,
            CAUSAL, WINDOWED, SOFTCAP, ALIBI, PRECISION, ACC,
        )
        p = tl.exp2(s - lse2[:, None])
        ds = p * (dot(do, tl.trans(v), PRECISION, ACC) - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq += dot(ds.to(k.dtype), k, PRECISION, ACC)  # dS K
    store_tile(dQ, dq * scale, bh * L, rows, L, e, E)


# --8<-- [end:dq]
