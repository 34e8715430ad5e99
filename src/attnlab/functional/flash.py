r"""FlashAttention from scratch: exact attention computed in tiles, in memory linear in length.

FlashAttention (Dao et al., 2022, https://arxiv.org/abs/2205.14135) computes
$\operatorname{softmax}(s\,QK^\top)V$ without ever holding the $L \times S$ matrix of
scores: it walks over blocks of keys, keeps for every query a running maximum $m$, a
running sum $\ell$ and an unnormalized output $a$, and rescales them whenever the maximum
grows (the *online softmax*, Milakov and Gimelshein, 2018, https://arxiv.org/abs/1805.02867).
The backward pass follows FlashAttention-2 (Dao, 2023, https://arxiv.org/abs/2307.08691):
the forward saves only the output $O$ and the log-sum-exp of each row, and the backward
recomputes the probabilities of one block at a time from them.

With a sliding window (local attention as in Longformer, Beltagy et al., 2020,
https://arxiv.org/abs/2004.05150, and Mistral 7B, Jiang et al., 2023,
https://arxiv.org/abs/2310.06825), the tiles outside the window are skipped, so the
work grows linearly with the length at a fixed window.

This is plain PyTorch: each block is a batched matmul over all batch and head dimensions
at once, so the Python loop runs over blocks only. The chapter
"FlashAttention from scratch" derives every line.

Kernel API, for code in attnlab that runs the passes itself (ring attention):
`flash_forward(q, k, v, out, lse, options)` fills `out (n, L, Ev)` and the log-sum-exp
`lse (n, L)` for `q (n, L, E)`, `k (n, S, E)`, `v (n, S, Ev)`; `flash_backward(q, k, v,
out, lse, grad_out, dq, dk, dv, options)` adds the gradients into `dq`, `dk`, `dv`.
`options` is a `FlashOptions(is_causal, scale, block_q, block_k, window=None, offset=0,
softcap=None, alibi_slopes=None)`; `offset` places query `i` at key position `i + offset`
for the causal and window rules (0: top-left; `S - L`: bottom-right, after a KV cache);
`alibi_slopes` holds one ALiBi slope per row, `(n,)`. Inputs must be float32 or float64
and contiguous in their last dimension.
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple, Unpack, get_args, overload

import torch
from torch import Tensor

from attnlab.rules._precision import (
    autocast_inputs,
    autocast_off,
    compute_dtype,
    softmax_scale,
)
from attnlab.rules._validation import (
    check_block_size,
    check_bool,
    check_choice,
    check_nonnegative_int,
    check_positive_int,
    check_qkv,
    check_scale,
    check_score_changes,
    check_tensor,
    checking,
    entry,
)
from attnlab.rules.masks import (
    Alignment,
    alignment_offset,
    allowed_to_additive,
    band_at,
    check_window,
    is_causal_window,
    visible,
)
from attnlab.rules.scores import RuleKeywords, alibi_bias, check_alibi_slopes

__all__ = ["FlashKeywords", "TileKind", "flash_attention", "key_range", "tile_kind", "tile_map"]
_LOG2_E = math.log2(math.e)
_LN_2 = math.log(2.0)
_TILE_FLOATS = 2**20  # 4 MiB of float32 scores per tile, all heads of a group together


class FlashKeywords(RuleKeywords, total=False):
    """The keywords of [`flash_attention`][attnlab.functional.flash.flash_attention] besides
    `return_lse` (for its typed overloads): a score rule's, and the tiles' size."""

    block_size: int | tuple[int, int]


@overload
def flash_attention(
    query: Tensor, key: Tensor, value: Tensor, *, return_lse: Literal[False] = False,
    **options: Unpack[FlashKeywords],
) -> Tensor: ...  # fmt: skip


@overload
def flash_attention(
    query: Tensor, key: Tensor, value: Tensor, *, return_lse: Literal[True],
    **options: Unpack[FlashKeywords],
) -> tuple[Tensor, Tensor]: ...  # fmt: skip


@entry
def flash_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    is_causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    block_size: int | tuple[int, int] = 256,
    align: Alignment = "top-left",
    softcap: float | None = None,
    sink_logits: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Scaled dot-product attention in tiles (FlashAttention), with its own backward pass.

    $$
    O = \operatorname{softmax}\left(s\, Q K^\top\right) V,
    \qquad s = \frac{1}{\sqrt{E}} \text{ by default}
    $$

    Computes the same result as `torch.nn.functional.scaled_dot_product_attention(query,
    key, value, is_causal=is_causal, scale=scale)`, block by block: it never stores the
    `(..., L, S)` scores, only one `block_q x block_k` tile per batch and head at a time.
    Beyond its inputs and output it keeps one log-sum-exp per query, for the backward
    pass, which recomputes each tile of probabilities from it. With `is_causal=True`, query
    $i$ sees keys $j \le i$ (top-left aligned when `L != S`, as in PyTorch, unless
    `align="bottom-right"`), and tiles that lie entirely above the diagonal are never
    computed.

    With `window=w` (sliding-window attention, as in Mistral), query $i$ sees only keys
    $i - w < j \le i$, the mask of
    [`masks.sliding_window`][attnlab.rules.masks.sliding_window]. A window is causal by
    definition, so it implies `is_causal=True` (passing `is_causal=False` with a window
    does not turn it off). Tiles entirely outside the band are skipped in the forward and
    the backward pass, so at a fixed window the work grows linearly with the length; see
    [`tile_map`][attnlab.functional.flash.tile_map]. A query that sees no key at all (only possible
    when `L > S`, for queries $i \ge S - 1 + w$) gets zeros, as in PyTorch.

    Two score changes of 2024-2025 models ride along in the tiles. `softcap=c`
    (Gemma 2, Gemma Team, 2024, https://arxiv.org/abs/2408.00118) turns each tile's
    scores into $c \tanh(x / c)$, and the backward pass recomputes the $\tanh$ for its
    derivative $1 - \tanh^2$. `sink_logits` (gpt-oss, OpenAI, 2025,
    https://arxiv.org/abs/2508.10925), one learned logit per head, is merged into each
    row's output and log-sum-exp after the tiles
    ([`merge_sinks`][attnlab.functional.flash.merge_sinks]), so the saved log-sum-exp
    includes it and the backward of $Q$, $K$, $V$ needs nothing more; the sink logits'
    own gradient is $-\sum_i p_{i,\text{sink}}\, (dO_i \cdot O_i)$. `alibi_slopes` (ALiBi,
    Press et al., 2022, https://arxiv.org/abs/2108.12409), one slope $m_h$ per head, adds
    $m_h (j - i - o)$ to each tile's scores after the softcap, computed from the tile's
    positions ($o$: the queries' offset of `align`), so the `(L, S)` bias is never held;
    the backward pass adds it again when it recomputes a tile (a constant of $Q$ and $K$,
    it changes no derivative).

    float16 and bfloat16 inputs are computed in float32 and the result cast back. Under
    `torch.autocast`, the inputs are first cast to the autocast dtype (float64 excepted),
    as PyTorch does for its attention, so the result has that dtype. There is no
    `attn_mask` and no dropout, and the backward pass cannot itself be differentiated
    (no `create_graph=True` second derivatives). The checks of the arguments follow
    [`set_validation`][attnlab.set_validation].

    Args:
        query: Queries, shape `(..., L, E)`.
        key: Keys, shape `(..., S, E)`, with the same leading dimensions as `query`.
        value: Values, shape `(..., S, Ev)`, with the same leading dimensions as `query`.
        is_causal: Hide key $j$ from query $i$ when $j > i$.
        window: If given, also hide key $j$ from query $i$ when $j \le i - w$; each query
            sees at most `window` keys, itself included. Implies `is_causal`.
        scale: Factor $s$ applied to the scores; default $1 / \sqrt{E}$.
        align: Where the causal diagonal (and the window) sits when `L != S`, in the
            words of [`masks.causal`][attnlab.rules.masks.causal]: `"top-left"` (PyTorch's
            `is_causal`: the queries are the first `L` positions) or `"bottom-right"`
            (the flash-attention library's rule: the queries are the last `L` of the
            `S` positions, as in chunked prefill after a KV cache, so query $i$ sees
            keys $j \le i + S - L$). No effect without `is_causal` or `window`.
        softcap: Logit softcapping (Gemma 2): the scaled scores $x$ become
            $c \tanh(x / c)$ with $c$ = `softcap` before masking; a positive float.
        sink_logits: Learned attention sinks (gpt-oss), one logit per head `(H,)` for inputs
            `(..., H, L, E)`: each row's softmax gets one more entry with this logit and
            no value. Differentiable; its gradient is computed in the backward pass.
        alibi_slopes: ALiBi's slopes, one per head `(H,)` for inputs `(..., H, L, E)`
            (e.g. [`alibi_slopes`][attnlab.functional.flex.alibi_slopes]`(H)`); not
            differentiated.
        block_size: Rows of a tile, `block_q` for the queries and `block_k` for the keys;
            one int sets both. Any positive sizes give the same result; they trade the
            memory of a tile (`n * block_q * block_k` floats for `n` batch and head
            entries) against the number of Python steps. The default, 256, was the
            fastest of 128, 256 and 512 (and their pairs) for 4 x 8 heads of 64 features
            at 2048 and 4096 tokens on the 2-core CPU of the Benchmarks page.
        return_lse: Also return each row's log-sum-exp $\ell_i = \ln \sum_j e^{s_{ij}}$
            (natural log, the sink logit included), from which
            [`weights_from_lse`][attnlab.functional.lse_weights.weights_from_lse]
            recovers the attention weights; not differentiable.

    Returns:
        The context vectors, shape `(..., L, Ev)`; with `return_lse`, the pair `(out,
        lse)`, `lse` of shape `(..., L)` in the compute dtype (float32, float64 for
        float64 inputs), $-\infty$ for a row that sees no key (and no sink).

    Raises:
        TypeError: If an input is not a floating-point tensor, or a flag or size has the
            wrong type.
        ValueError: If the shapes, dtypes or devices of `query`, `key` and `value` do not
            fit together, a block size, the window or `softcap` is not positive, `align`
            is not one of the two, or `sink_logits` (`alibi_slopes`) is not one logit
            (slope) per head on the query's device.
        RuntimeError: If a second derivative is asked of the backward pass (the error
            comes from the second backward, not from this call).

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> q, k = torch.randn(2, 3, 10, 8), torch.randn(2, 3, 7, 8)
        >>> v = torch.randn(2, 3, 7, 5)
        >>> out = flash_attention(q, k, v, is_causal=True, block_size=4)
        >>> out.shape
        torch.Size([2, 3, 10, 5])
        >>> sdpa = torch.nn.functional.scaled_dot_product_attention
        >>> torch.allclose(out, sdpa(q, k, v, is_causal=True), atol=1e-6)
        True
        >>> from attnlab.rules.masks import sliding_window
        >>> out = flash_attention(q, k, v, window=3, block_size=4)
        >>> mask = sliding_window(10, 7, window=3)
        >>> torch.allclose(out, sdpa(q, k, v, attn_mask=mask))
        True
    """
    if checking():
        # Checked as autocast casts them; the kernel then finds them cast.
        query, key, value = autocast_inputs(query, key, value)
        _check_inputs(query, key, value)
        heads = query.shape[-3] if query.ndim > 2 else None  # one sink logit for each
        check_rule(
            query, heads, is_causal, window, scale, align, softcap, sink_logits, alibi_slopes
        )
        block_q, block_k = check_block_size(block_size)
        check_bool("return_lse", return_lse)
    else:
        block_q, block_k = block_size if isinstance(block_size, tuple) else (block_size,) * 2
    # ALiBi's slopes: one per head; _flash spreads them over the rows.
    rule = (is_causal, window, scale, align, softcap, alibi_slopes)
    options = rule_options(query, key.shape[-2], *rule, block_q=block_q, block_k=block_k)
    out, lse = _flash(query, key, value, sink_logits, options)
    return (out, lse) if return_lse else out


def check_rule(
    query: Tensor,
    heads: int | None,
    is_causal: object,
    window: object,
    scale: object,
    align: object,
    softcap: object,
    sink_logits: object,
    alibi_slopes: object,
) -> None:
    """The checks of flash's score keywords, for `flash_attention` and `weights_from_lse`
    (`heads`: the query heads that sink logits and ALiBi slopes are one per, or None)."""
    check_bool("is_causal", is_causal)
    check_window(window, None)  # no attn_mask here: the window is the mask
    check_scale("scale", scale)
    check_choice("align", align, get_args(Alignment))
    check_score_changes(softcap, sink_logits, query, heads)
    check_alibi_slopes("alibi_slopes", alibi_slopes, heads, like=query)


def rule_options(
    query: Tensor,
    t_k: int,
    is_causal: bool,
    window: int | None,
    scale: float | None,
    align: Alignment,
    softcap: float | None,
    alibi_slopes: Tensor | None,
    *,
    block_q: int,
    block_k: int,
) -> FlashOptions:
    """The `FlashOptions` of checked score keywords, for queries `query` and `t_k` keys."""
    return FlashOptions(
        is_causal=is_causal_window(is_causal, window),
        scale=softmax_scale(query.shape[-1], scale),  # E = 0 too; a 0-d tensor welcome
        block_q=block_q,
        block_k=block_k,
        window=window,
        # Query i sits at key position i + offset for the causal and window rules.
        offset=alignment_offset(query.shape[-2], t_k, align),
        softcap=softcap,
        alibi_slopes=alibi_slopes,
    )


class FlashOptions(NamedTuple):
    """What the passes take besides the tensors: the score rule of a tile, and its size.

    Query `i` sits at key position `i + offset` for the causal and window rules (0:
    top-left; `S - L`: bottom-right, after a KV cache); `is_causal` is already True
    when there is a `window`; `scale` is a float; `alibi_slopes` holds one ALiBi slope
    per row of the passes' inputs, `(n,)`.
    """

    is_causal: bool
    scale: float
    block_q: int
    block_k: int
    window: int | None = None
    offset: int = 0
    softcap: float | None = None
    alibi_slopes: Tensor | None = None

    def rows(self, h: slice) -> FlashOptions:
        """The options of the rows `h` of the inputs: their own ALiBi slopes."""
        slopes = self.alibi_slopes
        return self if slopes is None else self._replace(alibi_slopes=slopes[h])


def _flash(
    query: Tensor, key: Tensor, value: Tensor, sink_logits: Tensor | None, options: FlashOptions
) -> tuple[Tensor, Tensor]:
    """`flash_attention` after its checks: the inputs flattened to `(n, L, E)`, widened.

    Run as `autocast_kernel` runs a kernel (which returns one tensor): the output in the
    (autocast) query's dtype, and the log-sum-exp in the compute dtype.
    """
    query, key, value = autocast_inputs(query, key, value)
    *batch, t_q, e = query.shape
    t_k, e_v = key.shape[-2], value.shape[-1]
    n = math.prod(batch)
    wide = compute_dtype(query.dtype)  # float16/bfloat16 are computed in float32
    q, k, v = query.to(wide), key.to(wide), value.to(wide)
    sink_logits = _per_row(sink_logits, batch, wide)  # (n,)
    options = options._replace(alibi_slopes=_per_row(options.alibi_slopes, batch, wide))
    with autocast_off(query.device.type):
        out, lse = _FlashAttention.apply(  # type: ignore[no-untyped-call]
            q.reshape(n, t_q, e),  # (n, L, E), n = prod(batch)
            k.reshape(n, t_k, e),  # (n, S, E)
            v.reshape(n, t_k, e_v),  # (n, S, Ev)
            sink_logits,
            options,
        )
    # (..., L, Ev) and (..., L)
    return out.reshape(*batch, t_q, e_v).to(query.dtype), lse.reshape(*batch, t_q)


def _per_row(per_head: Tensor | None, batch: list[int], dtype: torch.dtype) -> Tensor | None:
    """One value per head `(H,)` (the last batch dimension) as one per flattened row `(n,)`."""
    if per_head is None:
        return None
    return per_head.to(dtype).expand(*batch[:-1], batch[-1]).reshape(-1)  # (n,)


def _check_inputs(query: object, key: object, value: object) -> tuple[Tensor, Tensor, Tensor]:
    q, k, checked = check_qkv(query, key, value)
    v = check_tensor("value", checked)  # flash needs values: None is refused here
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(
            f"flash_attention needs the same batch (and head) dimensions in query, key and "
            f"value, got query.shape={tuple(q.shape)}, key.shape={tuple(k.shape)}, "
            f"value.shape={tuple(v.shape)}; expand them first (it does not broadcast)"
        )
    return q, k, v


# --8<-- [start:function]
class _FlashAttention(torch.autograd.Function):
    """Saves Q, K, V, O and the log-sum-exp; backward recomputes the tiles.

    Returns O and the log-sum-exp; the latter is not differentiable.
    """

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, sink_logits: Tensor | None, options: FlashOptions
    ) -> tuple[Tensor, Tensor]:
        n, t_q, t_k = q.shape[0], q.shape[1], k.shape[1]
        out = q.new_empty(n, t_q, v.shape[2])
        lse = q.new_empty(n, t_q)
        for h in _head_groups(n, min(options.block_q, t_q) * min(options.block_k, t_k)):
            flash_forward(q[h], k[h], v[h], out[h], lse[h], options.rows(h))
        if sink_logits is not None:  # after every row's last tile: see merge_sinks
            out, lse = merge_sinks(out, lse, sink_logits)
        ctx.save_for_backward(q, k, v, out, lse, *([] if sink_logits is None else [sink_logits]))
        ctx.options = options
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor, _grad_lse: Tensor | None) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse, *saved_logits = ctx.saved_tensors
        options: FlashOptions = ctx.options
        with torch.no_grad(), autocast_off(q.device.type):
            grad_out = grad_out.contiguous()
            dq, dk = torch.zeros_like(q), torch.zeros_like(k)
            dv = torch.zeros_like(v)
            n, t_q, t_k = q.shape[0], q.shape[1], k.shape[1]
            for h in _head_groups(n, min(options.block_q, t_q) * min(options.block_k, t_k)):
                inputs = (q[h], k[h], v[h], out[h], lse[h], grad_out[h])
                flash_backward(*inputs, dq[h], dk[h], dv[h], options.rows(h))
            # The sink has no value, so its dP is 0 and the softmax's backward leaves
            # dsink = sum_i P_i,sink (0 - D_i), with D_i = dO_i . O_i and
            # P_i,sink = exp(sink - lse_i): the saved lse includes the sink.
            dsinks = None
            for sink_logits in saved_logits if ctx.needs_input_grad[3] else []:  # none or one
                delta = (grad_out * out).sum(dim=-1)  # (n, L)
                dsinks = -((sink_logits[:, None] - lse).exp() * delta).sum(dim=-1)  # (n,)
        if torch.is_grad_enabled():  # create_graph=True: refuse the second derivative
            dq, dk, dv = _no_second_derivative(dq, dk, dv, q, k, v, grad_out)
        return dq, dk, dv, dsinks, None


def _head_groups(n: int, tile_size: int) -> list[slice]:
    """Split the n batch-and-head entries so that a tile of scores is ~4 MiB.

    The aim is that each operation on a tile works on memory that can stay in the CPU's
    caches, which one tile of many heads at once would overflow; 4 MiB is a rule of
    thumb, not tuned for each machine.
    """
    per_group = max(1, min(n, _TILE_FLOATS // max(1, tile_size)))
    return [slice(h0, min(h0 + per_group, n)) for h0 in range(0, n, per_group)]


# --8<-- [end:function]


class _NotTwiceDifferentiable(torch.autograd.Function):
    """Passes the gradients through; differentiating them raises a clear error."""

    @staticmethod
    def forward(
        ctx: Any, dq: Tensor, dk: Tensor, dv: Tensor, *sources: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        return dq, dk, dv

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor, ...]:
        raise RuntimeError(
            "flash_attention does not support double backward: its backward pass is "
            "computed in place, tile by tile, and is not itself differentiable. For "
            "second derivatives (torch.autograd.grad(..., create_graph=True) followed "
            "by another backward) use torch.nn.functional.scaled_dot_product_attention."
        )


def _no_second_derivative(dq: Tensor, dk: Tensor, dv: Tensor, *sources: Tensor) -> list[Tensor]:
    """dq, dk, dv as they are, but a backward through them raises a clear error."""
    return list(_NotTwiceDifferentiable.apply(dq, dk, dv, *sources))  # type: ignore[no-untyped-call]


# --8<-- [start:tiles]
def key_range(i0: int, i1: int, t_k: int, is_causal: bool, window: int | None) -> range:
    """The keys of `0..t_k-1` that at least one query in `i0..i1-1` may see (or none).

    One frame for both, as in [`tile_kind`][attnlab.functional.flash.tile_kind]; for one query
    (`i1 = i0 + 1`) exactly the keys it sees.

    Examples:
        >>> key_range(5, 6, 10, True, 3), key_range(0, 4, 10, False, None)
        (range(3, 6), range(0, 10))
    """
    end = min(t_k, i1) if is_causal else t_k  # keys after i1 - 1: all in the future
    lo = 0 if window is None else max(0, i0 - window + 1)  # keys before lo: too old
    return range(lo, max(lo, end))


def _key_starts(
    i0: int, i1: int, t_k: int, is_causal: bool, window: int | None, block_k: int
) -> range:
    """Starts of the key tiles that at least one query in i0..i1-1 may see."""
    keys = key_range(i0, i1, t_k, is_causal, window)
    if not keys:
        return range(0)
    return range((keys.start // block_k) * block_k, keys.stop, block_k)


def _query_starts(
    j0: int, j1: int, t_q: int, is_causal: bool, window: int | None, block_q: int
) -> range:
    """Starts of the query tiles in which a query may see one of the keys j0..j1-1.

    The keys are given in the queries' frame: key `j` minus the queries' offset.
    """
    if is_causal and j0 >= t_q:  # every query comes before these keys
        return range(0)
    first = (max(j0, 0) // block_q) * block_q if is_causal else 0
    end = t_q if window is None else min(t_q, j1 - 1 + window)
    return range(first, end, block_q)


def _needs_bias(i0: int, i1: int, j0: int, j1: int, is_causal: bool, window: int | None) -> bool:
    """Whether the tile holds a hidden (query, key) pair: the diagonal or the window's edge.

    The corners decide: the first query sees least of the future (the last key), the
    last query least of the past (the first key); if both see them, every pair is seen.
    """
    return is_causal and not (visible(i0, j1 - 1, window) and visible(i1 - 1, j0, window))


def _bias(i0: int, i1: int, j0: int, j1: int, window: int | None, like: Tensor) -> Tensor:
    """0 where query i may see key j (i - window < j <= i), else -inf; (rows, cols)."""
    seen = band_at(i1 - i0, j1 - j0, i0 - j0, window, like.device)  # (rows, cols)
    return allowed_to_additive(seen, like.dtype)  # 0 where seen, else -inf


# --8<-- [end:tiles]


TileKind = Literal["none", "full", "masked"]
"""What a tile needs: nothing (every pair hidden), all its scores, or a mask on them."""


def tile_kind(
    i0: int, i1: int, j0: int, j1: int, *, is_causal: bool = False, window: int | None = None
) -> TileKind:
    """What the queries at positions `i0..i1-1` need of the keys at `j0..j1-1`.

    The rule of [`tile_map`][attnlab.functional.flash.tile_map] for one tile, with both ranges in
    one frame (a query at position `i` sees key `j <= i` under the causal mask, and
    `j > i - window` too with a window, which implies `is_causal`). Ring attention
    classifies its shard blocks with it.

    Returns:
        `"none"` if no query sees any of the keys (all in the future, or all too old),
        `"masked"` if some pairs are hidden (the diagonal or the window's edge crosses
        the tile), else `"full"`.

    Examples:
        >>> tile_kind(4, 8, 0, 4, is_causal=True), tile_kind(4, 8, 4, 8, is_causal=True)
        ('full', 'masked')
        >>> tile_kind(0, 4, 4, 8, is_causal=True), tile_kind(8, 12, 0, 4, window=3)
        ('none', 'none')
    """
    causal = is_causal_window(is_causal, window)
    keys = key_range(i0, i1, j1, causal, window) if i1 > i0 else range(0)
    if max(keys.start, j0) >= min(keys.stop, j1):
        return "none"
    return "masked" if _needs_bias(i0, i1, j0, j1, causal, window) else "full"


def tile_map(
    t_q: int,
    t_k: int | None = None,
    *,
    block_size: int | tuple[int, int] = 256,
    is_causal: bool = False,
    window: int | None = None,
    align: Alignment = "top-left",
) -> Tensor:
    """Which tiles `flash_attention` computes: 0 skipped, 1 computed, 2 computed and masked.

    The forward and backward passes of [`flash_attention`][attnlab.functional.flash.flash_attention]
    visit exactly the tiles this marks nonzero, and add a mask (a bias of $-\\infty$) to
    those marked 2; the map is read off the same loop bounds the passes use.

    Args:
        t_q: Number of queries, `L`.
        t_k: Number of keys, `S`; defaults to `t_q`.
        block_size: As for `flash_attention`: `(block_q, block_k)`, or one int for both.
        is_causal: As for `flash_attention`.
        window: As for `flash_attention`; implies `is_causal`.
        align: As for `flash_attention`: where the diagonal sits when `L != S`.

    Returns:
        An int64 tensor of shape `(ceil(L / block_q), ceil(S / block_k))`: entry
        `[a, b]` is for the queries of block `a` against the keys of block `b`.

    Raises:
        TypeError: If a size or flag has the wrong type.
        ValueError: If a length is negative, a block size or the window is not positive,
            or `align` is not one of the two.

    Examples:
        >>> tile_map(8, block_size=2, window=3)
        tensor([[2, 0, 0, 0],
                [2, 2, 0, 0],
                [0, 2, 2, 0],
                [0, 0, 2, 2]])
        >>> int(tile_map(4096, window=512).count_nonzero()), int(tile_map(4096).numel())
        (45, 256)
    """
    t_q = check_nonnegative_int("t_q", t_q)
    t_k = t_q if t_k is None else check_nonnegative_int("t_k", t_k)
    block_q, block_k = check_block_size(block_size)
    check_bool("is_causal", is_causal)
    w = None if window is None else check_positive_int("window", window)
    check_choice("align", align, get_args(Alignment))
    causal = is_causal_window(is_causal, w)
    offset = alignment_offset(t_q, t_k, align)  # as flash_attention places them
    grid = torch.zeros(-(-t_q // block_q), -(-t_k // block_k), dtype=torch.int64)
    for i0 in range(0, t_q, block_q):
        a0, a1 = i0 + offset, min(i0 + block_q, t_q) + offset  # positions among the keys
        for j0 in _key_starts(a0, a1, t_k, causal, w, block_k):  # the others: "none"
            j1 = min(j0 + block_k, t_k)  # each tile here has a key some query sees
            grid[i0 // block_q, j0 // block_k] = 1 + _needs_bias(a0, a1, j0, j1, causal, w)
    return grid


# --8<-- [start:forward]
def flash_forward(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, options: FlashOptions
) -> None:
    """Fill out (n, L, Ev) and lse (n, L), the log-sum-exp, for q of (n, L, E).

    Query i sits at key position i + offset for the causal and window rules. With
    `softcap`, each score x becomes softcap * tanh(x / softcap); `alibi_slopes` (n,)
    then add ALiBi's m (j - i - offset).
    """
    is_causal, scale, block_q, block_k, window, offset, softcap, slopes = options
    n, t_q, _ = q.shape
    t_k = k.shape[1]
    if t_k == 0:  # no keys at all: PyTorch returns zeros
        out.zero_()
        lse.fill_(float("-inf"))
        return
    # One buffer holds every tile of scores in turn, instead of a new
    # allocation for every tile.
    tile = q.new_empty(n * min(block_q, t_q) * min(block_k, t_k))
    k_t = k.transpose(1, 2)  # (n, E, S)
    # A row may see no key at all: with a window, or queries placed before the keys.
    sparse = window is not None or (is_causal and offset < 0)
    alibi2 = None if slopes is None else slopes * _LOG2_E  # (n,), base 2 like the scores
    for i0 in range(0, t_q, block_q):
        i1 = min(i0 + block_q, t_q)
        a0, a1 = i0 + offset, i1 + offset  # the queries' positions among the keys
        starts = _key_starts(a0, a1, t_k, is_causal, window, block_k)
        if not starts:  # window and L > S: these queries see no key at all
            out[:, i0:i1] = 0.0
            lse[:, i0:i1] = float("-inf")
            continue
        # Scores in base 2: exp(x) = 2 ** (x log2 e), the form GPU kernels
        # compute; fold log2(e) into q, with the scale (softcap: see _q_factor).
        q_i = q[:, i0:i1] * _q_factor(scale, softcap)  # (n, rows, E)
        for j0 in starts:
            j1 = min(j0 + block_k, t_k)
            rows, cols = i1 - i0, j1 - j0
            s = tile[: n * rows * cols].view(n, rows, cols)
            torch.bmm(q_i, k_t[:, :, j0:j1], out=s)  # this tile's scores
            if softcap is not None:  # s = x / c: now c tanh(x / c), in base 2
                s.tanh_().mul_(softcap * _LOG2_E)
            if alibi2 is not None:  # this tile's part of the bias, never the whole (L, S)
                s.add_(alibi_bias(alibi2, range(a0, a1), range(j0, j1)))
            if _needs_bias(a0, a1, j0, j1, is_causal, window):
                s.add_(_bias(a0, a1, j0, j1, window, s))
            if j0 == starts[0]:
                # The first tile starts the statistics. Without a window it
                # holds key 0, which every query sees: every row max is finite.
                m = s.amax(dim=-1, keepdim=True)  # (n, rows, 1) running max
                if sparse:
                    # A row may have no key in this tile: -inf - (-inf) is NaN,
                    # so start it at the lowest finite float instead.
                    m.clamp_min_(torch.finfo(s.dtype).min)
                p = s.sub_(m).exp2_()  # unnormalized probabilities
                ell = p.sum(dim=-1, keepdim=True)  # (n, rows, 1) running sum
                acc = torch.bmm(p, v[:, j0:j1])  # (n, rows, Ev) running output
                continue
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = s.sub_(m_new).exp2_()
            # All that was summed so far is relative to the old maximum.
            alpha = (m - m_new).exp2_()  # (n, rows, 1), at most 1
            ell.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
            acc.mul_(alpha).baddbmm_(p, v[:, j0:j1])
            m = m_new
        if sparse:  # rows that saw no key: sum 0, output 0 as PyTorch's
            seen = ell > 0  # (n, rows, 1)
            ell.clamp_min_(1.0)
            m.masked_fill_(~seen, float("-inf"))
        out[:, i0:i1] = acc.div_(ell)  # normalize once, after the last tile
        # ln sum_j exp(s_ij), back from base 2
        lse[:, i0:i1] = ((m + ell.log2()) * _LN_2).squeeze(-1)


# --8<-- [end:forward]


# --8<-- [start:backward]
def flash_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    options: FlashOptions,
) -> None:
    """Add the gradients with respect to q, k and v into dq, dk, dv (zeros).

    Query i sits at key position i + offset, as in the forward pass; `softcap` and
    `alibi_slopes` as there.
    """
    is_causal, scale, block_q, block_k, window, offset, softcap, slopes = options
    n, t_q, _ = q.shape
    t_k = k.shape[1]
    if t_k == 0 or t_q == 0:
        return
    # D_i = sum_j P_ij dP_ij = dO_i . O_i: one number per query.
    delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (n, L, 1)
    lse2 = (lse * _LOG2_E).unsqueeze(-1)  # (n, L, 1), base 2 like the scores
    if window is not None or (is_causal and offset < 0):  # a query that saw no key:
        # make its P_ij = 2^(-inf) = 0
        lse2.masked_fill_(lse2 == float("-inf"), float("inf"))
    q2 = q * _q_factor(scale, softcap)  # (n, L, E), scaled as in the forward
    k_alpha = _LN_2 if softcap is None else softcap  # q2 * k_alpha = q * scale
    tile_p = q.new_empty(n * min(block_q, t_q) * min(block_k, t_k))
    tile_dp = torch.empty_like(tile_p)
    tile_t = None if softcap is None else torch.empty_like(tile_p)
    cap2 = 0.0 if softcap is None else softcap * _LOG2_E
    alibi2 = None if slopes is None else slopes * _LOG2_E  # (n,), base 2
    for j0 in range(0, t_k, block_k):
        j1 = min(j0 + block_k, t_k)
        k_j, v_j = k[:, j0:j1], v[:, j0:j1]  # (n, cols, E), (n, cols, Ev)
        # Only the query tiles that see one of these keys: the same tiles as
        # the forward's.
        lo, hi = j0 - offset, j1 - offset  # the keys in the queries' frame
        for i0 in _query_starts(lo, hi, t_q, is_causal, window, block_q):
            i1 = min(i0 + block_q, t_q)
            a0, a1 = i0 + offset, i1 + offset  # the queries' positions among the keys
            rows, cols = i1 - i0, j1 - j0
            q_i = q2[:, i0:i1]  # (n, rows, E)
            do_i = grad_out[:, i0:i1]  # (n, rows, Ev)
            # Recompute the tile's probabilities from the saved log-sum-exp.
            p = tile_p[: n * rows * cols].view(n, rows, cols)
            torch.bmm(q_i, k_j.transpose(1, 2), out=p)  # scores
            if tile_t is not None:  # softcap: keep t = tanh(x / c) for its derivative
                t = torch.tanh(p, out=tile_t[: n * rows * cols].view(n, rows, cols))
                torch.mul(t, cap2, out=p)
            if alibi2 is not None:  # the forward's bias, again: constant in q and k
                p.add_(alibi_bias(alibi2, range(a0, a1), range(j0, j1)))
            if _needs_bias(a0, a1, j0, j1, is_causal, window):
                p.add_(_bias(a0, a1, j0, j1, window, p))
            p.sub_(lse2[:, i0:i1]).exp2_()  # P_ij = exp(s_ij - lse_i)
            # dV_j += P^T dO_i
            dv[:, j0:j1].baddbmm_(p.transpose(1, 2), do_i)
            # dP = dO_i V_j^T, then the softmax's backward dS = P (dP - D)
            dp = tile_dp[: n * rows * cols].view(n, rows, cols)
            torch.bmm(do_i, v_j.transpose(1, 2), out=dp)
            ds = dp.sub_(delta[:, i0:i1]).mul_(p)
            if tile_t is not None:  # through c tanh(x / c): d/dx = 1 - tanh^2
                ds.mul_(t.square_().neg_().add_(1.0))
            # dQ_i += s dS K_j and dK_j += s dS^T Q_i (q_i * k_alpha = s Q_i)
            dq[:, i0:i1].baddbmm_(ds, k_j, alpha=scale)
            dk[:, j0:j1].baddbmm_(ds.transpose(1, 2), q_i, alpha=k_alpha)


# --8<-- [end:backward]


def _q_factor(scale: float, softcap: float | None) -> float:
    """What the queries are multiplied by before a tile's product.

    Without a cap, the scale and log2(e), so the product is the score in base 2; with
    one, the scale over the cap, so the product is x / c, ready for the tanh (the
    factor log2(e) is applied after it).
    """
    return scale * _LOG2_E if softcap is None else scale / softcap


# --8<-- [start:merge]
def merge_partials(
    out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Merge attention over two disjoint sets of keys into attention over their union.

    If `out_a` is the attention of some queries to key set $A$ and `lse_a` the
    log-sum-exp $\ln \sum_{j \in A} e^{s_{ij}}$ of their scores, and likewise for $B$,
    then attention to $A \cup B$ is the average of the two outputs weighted by their
    softmax denominators:

    $$
    o = \frac{e^{\ell_A} o_A + e^{\ell_B} o_B}{e^{\ell_A} + e^{\ell_B}}, \qquad
    \ell = \ln\left(e^{\ell_A} + e^{\ell_B}\right).
    $$

    This is the online-softmax update of the FlashAttention chapter (rescale what was
    accumulated when the running maximum changes), written for normalized outputs: the
    log-sum-exp $\ell$ carries both the running maximum $m$ and the running sum
    $\sum e^{s - m}$ of that chapter in one number. Dividing by $e^{\ell}$ before
    exponentiating keeps every factor in $[0, 1]$, so nothing overflows.

    Args:
        out_a: Attention outputs over key set A, shape `(..., L, Ev)`.
        lse_a: Log-sum-exp of the scores over A, shape `(..., L)`; `-inf` where a query
            sees no key of A.
        out_b: Attention outputs over key set B, shape `(..., L, Ev)`.
        lse_b: Log-sum-exp of the scores over B, shape `(..., L)`.

    Returns:
        The outputs `(..., L, Ev)` and log-sum-exp `(..., L)` over A and B together.
        A row must see at least one key of A or B.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(4, 3), torch.randn(6, 3), torch.randn(6, 2)
        >>> s = q @ k.T
        >>> o_a, o_b = s[:, :2].softmax(-1) @ v[:2], s[:, 2:].softmax(-1) @ v[2:]
        >>> o, lse = merge_partials(o_a, s[:, :2].logsumexp(-1), o_b, s[:, 2:].logsumexp(-1))
        >>> torch.allclose(o, s.softmax(-1) @ v, atol=1e-6)
        True
    """
    lse = torch.logaddexp(lse_a, lse_b)  # (..., L)
    w_a = torch.exp(lse_a - lse).unsqueeze(-1)  # (..., L, 1), A's share of the softmax
    w_b = torch.exp(lse_b - lse).unsqueeze(-1)  # (..., L, 1), B's share, 1 - w_a
    return w_a * out_a + w_b * out_b, lse


# --8<-- [end:merge]


def merge_sinks(out: Tensor, lse: Tensor, sink_logits: Tensor) -> tuple[Tensor, Tensor]:
    r"""Learned attention sinks added to attention's output and log-sum-exp after the fact.

    The one home of gpt-oss's sinks for the kernels that return a log-sum-exp (this
    module's tiles, FlexAttention): a sink is one more logit $s_h$ in each row's
    softmax with no value, so adding it is
    [`merge_partials`][attnlab.functional.flash.merge_partials] with a second "key set"
    whose log-sum-exp is $s_h$ and whose output is zero. Every weight of row $i$, and so
    its output, shrinks by $e^{\ell_i} / (e^{\ell_i} + e^{s_h}) = \sigma(\ell_i - s_h)$,
    and the log-sum-exp becomes $\ln(e^{\ell_i} + e^{s_h})$. A row that sees no key
    ($\ell_i = -\infty$) keeps its zeros and gets the sink's log-sum-exp.

    Args:
        out: Attention outputs `(..., H, L, Ev)`.
        lse: Their log-sum-exp (natural log) `(..., H, L)`.
        sink_logits: One logit per head `(H,)`.

    Returns:
        The outputs with the sinks, in `out`'s dtype, and the log-sum-exp with them, in
        `lse`'s.

    Examples:
        >>> sinks = torch.tensor([0.0, -100.0])  # per head: as large as a score of 0, or none
        >>> out, lse = merge_sinks(torch.ones(1, 2, 1, 3), torch.zeros(1, 2, 1), sinks)
        >>> out[..., 0]
        tensor([[[0.5000],
                 [1.0000]]])
        >>> round(float(lse[0, 0, 0]), 4)  # ln(e^0 + e^0)
        0.6931
    """
    total = torch.logaddexp(lse, sink_logits.to(lse.dtype)[:, None])  # (..., H, L)
    keep = torch.exp(lse - total)  # (..., H, L): the keys' share of each row's softmax
    return out * keep[..., None].to(out.dtype), total
