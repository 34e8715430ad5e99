r"""DeepSeek-V4's compressed attention, as kernels: pool windows of tokens into entries,
then attend to a sliding window of tokens and to chosen entries.

DeepSeek-V4 (2026) keeps two kinds of key per layer: the last `window` tokens, and
*compressed entries*, each a learned, softmax-gated average of `m` consecutive tokens.
Heavily compressed attention (HCA, $m' = 128$) attends to every entry; compressed sparse
attention (CSA, $m = 4$) lets a lightning indexer choose `k` of them per query, as
DeepSeek-V3.2's DSA chooses tokens.

- [`pool_windows`][attnlab.functional.compressed.pool_windows]: entry $w$ of a series is
  $\sum_j \operatorname{softmax}_j(Z_j + B_j) \odot C_j$ over the tokens $j$ of window $w$;
  CSA's windows overlap: entry $w$ mixes the second series of window $w$ with the first
  series of window $w - 1$, $2m$ tokens wide at a stride of $m$.
- [`visible_entries`][attnlab.functional.compressed.visible_entries]: entry $s$ is complete,
  and so visible, for the query at position $p$ when $s < \lfloor (p + 1) / m \rfloor$.
- [`window_and_entries_attention`][attnlab.functional.compressed.window_and_entries_attention]:
  each query attends to its own window and to the entries it was given (by index,
  gathered, never a mask over all of them), with a learned sink logit per head: the
  cost per query is $O(\text{window} + k)$, not $O(S / m)$.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["pool_windows", "visible_entries", "window_and_entries_attention", "window_keys"]


def pool_windows(
    kv: Tensor,
    gate: Tensor,
    bias: Tensor,
    ratio: int,
    *,
    overlap: bool = False,
    prior: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
    r"""The compressed entries of whole windows of `ratio` tokens (before their norm).

    Args:
        kv: Each token's contribution `(b, n * ratio, F)`; with `overlap`,
            `(b, n * ratio, 2F)`: the first `F` features go to the next window's entry
            (series $a$), the last `F` to the token's own window's (series $b$).
        gate: Their gate logits, the shape of `kv`.
        bias: The learned bias by position in the window, `(ratio, F)` or `(ratio, 2F)`.
        ratio: Tokens per window, $m$.
        overlap: Whether each entry also mixes series $a$ of the window before (CSA).
        prior: With `overlap`, series $a$ of the window before the first, `(kv, gate)`
            each `(b, ratio, F)`, its gate biased (a cache's), or None where there is
            none (its slots then weigh nothing).

    Returns:
        The entries `(b, n, F)`: per window, the softmax (in float32) over its slots of
        `gate + bias` weighting `kv`, summed; and, with `overlap`, series $a$ of the last
        window, `(kv, gate)`, for the next call (`prior` again where `n` is 0).
    """
    b, total, width = kv.shape
    n = total // ratio
    if n == 0:
        return kv.new_zeros(b, 0, width // 2 if overlap else width), prior
    kv = kv.view(b, n, ratio, width)
    gate = gate.view(b, n, ratio, width) + bias  # (b, n, m, F or 2F)
    last = None
    if overlap:
        f = width // 2
        last = (kv[:, -1, :, :f], gate[:, -1, :, :f])
        first_kv = kv.new_zeros(b, 1, ratio, f) if prior is None else prior[0][:, None]
        first_gate = gate.new_full((b, 1, ratio, f), float("-inf"))
        if prior is not None:
            first_gate = prior[1][:, None]
        before_kv = torch.cat([first_kv, kv[:, :-1, :, :f]], dim=1)  # series a, shifted
        before_gate = torch.cat([first_gate, gate[:, :-1, :, :f]], dim=1)
        kv = torch.cat([before_kv, kv[..., f:]], dim=2)  # (b, n, 2m, F)
        gate = torch.cat([before_gate, gate[..., f:]], dim=2)
    weights = gate.softmax(dim=2, dtype=torch.float32).to(kv.dtype)
    return (kv * weights).sum(dim=2), last  # (b, n, F)


def visible_entries(positions: Tensor, num_entries: int, ratio: int) -> Tensor:
    """Which entries each query may see: `(..., t, num_entries)`, True where the entry's
    window is complete at the query's position, `s < (p + 1) // ratio`."""
    threshold = (positions + 1) // ratio  # (..., t)
    entries = torch.arange(num_entries, device=positions.device)
    return entries < threshold[..., None]


def window_keys(keys: Tensor, t: int, window: int) -> tuple[Tensor, Tensor]:
    """Each of the last `t` queries' sliding window over `keys` `(b, s, D)` (the queries
    are the last `t` of the `s` tokens): `(b, t, window, D)` and a mask `(t, window)`,
    True where the slot holds a token (the first queries' windows start before 0)."""
    b, s, d = keys.shape
    padded = torch.cat([keys.new_zeros(b, window - 1, d), keys], dim=1)  # (b, s + w - 1, D)
    windows = padded.unfold(1, window, 1).transpose(-1, -2)  # (b, s, w, D)
    slots = torch.arange(s - t, s, device=keys.device)[:, None] - window + 1
    valid = slots + torch.arange(window, device=keys.device) >= 0  # (t, w)
    return windows[:, s - t :], valid


def window_and_entries_attention(
    query: Tensor,
    windows: Tensor,
    window_valid: Tensor,
    entries: Tensor,
    chosen: Tensor,
    sink_logits: Tensor,
    scale: float,
) -> Tensor:
    r"""Attention of each query to its window of tokens and to its chosen entries.

    Keys are values (DeepSeek-V4's shared-KV multi-query attention): one head of keys
    serves every query head.

    Args:
        query: `(b, h, t, D)`.
        windows: Each query's window of keys `(b, t, w, D)` (from
            [`window_keys`][attnlab.functional.compressed.window_keys]).
        window_valid: `(t, w)`, True where a window slot holds a token.
        entries: The compressed entries `(b, n, D)`.
        chosen: Per query, the indices of the entries it attends to, `(b, t, k)`, -1 for
            none (CSA: gathered, so a query reads `k` entries); or a bool mask `(t, n)`
            of the entries every query of a row may see (HCA: all of them, read in
            place, never copied per query).
        sink_logits: A logit per head `(h,)` in every softmax's denominator (gpt-oss).
        scale: The factor on the scores.

    Returns:
        `(b, h, t, D)`.
    """
    b, _, t, _ = query.shape
    on_window = torch.einsum("bhtd,btwd->bhtw", query, windows) * scale  # (b, h, t, w)
    on_window = on_window.masked_fill(~window_valid, float("-inf"))
    if chosen.dtype == torch.bool:  # every visible entry, read in place
        on_entries = torch.einsum("bhtd,bnd->bhtn", query, entries) * scale  # (b, h, t, n)
        on_entries = on_entries.masked_fill(~chosen, float("-inf"))
        read = entries[:, None]  # (b, 1, n, D): the same entries for every query
    else:
        if entries.shape[1]:
            rows = torch.arange(b, device=query.device)[:, None, None]
            read = entries[rows, chosen.clamp(min=0)]  # (b, t, k, D); -1 masked below
        else:
            read = query.new_zeros(b, t, chosen.shape[-1], query.shape[-1])
        on_entries = torch.einsum("bhtd,btkd->bhtk", query, read) * scale  # (b, h, t, k)
        on_entries = on_entries.masked_fill((chosen < 0)[:, None], float("-inf"))
    sinks = sink_logits.to(query.dtype)[None, :, None, None].expand(b, -1, t, 1)
    logits = torch.cat([on_window, on_entries, sinks], dim=-1)  # (b, h, t, w + k + 1)
    weights = torch.softmax(logits, dim=-1)
    w = windows.shape[2]
    out = torch.einsum("bhtw,btwd->bhtd", weights[..., :w], windows)
    if chosen.dtype == torch.bool:
        return out + torch.einsum("bhtn,bnd->bhtd", weights[..., w:-1], entries)
    return out + torch.einsum("bhtk,btkd->bhtd", weights[..., w:-1], read)
