r"""DeepSeek-V4's attention layer: a sliding window of tokens plus compressed entries.

[`CompressedAttention`][attnlab.layers.compressed.CompressedAttention] is
`transformers`' `DeepseekV4Attention`, built from the kernels of
[`attnlab.functional.compressed`][attnlab.functional.compressed]: one shared key/value head
(keys are values), RoPE on the last `rope_dims` features of each head (undone on the
output, so that what an entry adds depends only on its distance), a learned sink logit
per head and a grouped low-rank output projection. Its `kind` says what it attends to
besides its window: nothing (`"window"`), every compressed entry of `ratio` tokens
(`"hca"`, heavily compressed attention), or the `top_k` entries a lightning indexer
chooses per query from overlapping windows of `ratio` tokens (`"csa"`, compressed sparse
attention). The chosen entries are gathered, never masked out of all of them: a query
costs $O(\text{window} + k)$.

Its state between calls, [`CompressedKVCache`][attnlab.layers.compressed.CompressedKVCache],
holds the window's last tokens and, per series of entries, the entries, the tokens of a
window not yet complete and (CSA) the first series of the last complete window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from attnlab.caches.base import LayerCache
from attnlab.functional.compressed import (
    pool_windows,
    visible_entries,
    window_and_entries_attention,
    window_keys,
)
from attnlab.layers.heads import merge_heads, split_heads
from attnlab.layers.norms import RMSNorm, rms_normalize
from attnlab.rules._validation import (
    check_choice,
    check_multiple,
    check_positive_float,
    check_positive_int,
    check_tokens,
    checking,
    entry,
)
from attnlab.rules.rope import check_rope_dims, rope_cos_sin, rotate
from attnlab.rules.rope_scaling import RopeScaling

__all__ = ["CompressedAttention", "CompressedConfig", "CompressedKVCache", "Compressor"]

Kind = Literal["window", "csa", "hca"]
KINDS: tuple[Kind, ...] = ("window", "csa", "hca")


@dataclass(frozen=True)
class CompressedConfig:
    """Sizes and settings of a
    [`CompressedAttention`][attnlab.layers.compressed.CompressedAttention] (the names of
    `DeepseekV4Config` in brackets).

    Attributes:
        kind: `"window"` (`sliding_attention`), `"csa"` (`compressed_sparse_attention`) or
            `"hca"` (`heavily_compressed_attention`).
        num_heads: Query heads; one key/value head serves them all.
        head_dim: Features per head, of queries, keys and values alike.
        q_lora_rank: Width of the query latent.
        window: Tokens each query sees in its window, itself included (`sliding_window`).
        rope_dims: The last features of each head that RoPE rotates, even.
        ratio: Tokens per compressed entry (`compress_rates`); unused by `"window"`.
        out_groups: Groups of heads of the output projection (`o_groups`).
        out_rank: Features each group is projected to first (`o_lora_rank`).
        rope_base: RoPE's base of `"window"` layers (`rope_theta`).
        compress_rope_base: RoPE's base of `"csa"` and `"hca"` layers and of their
            entries (`compress_rope_theta`).
        compress_rope_scaling: Their RoPE's context extension (the released V4: YaRN,
            factor 16, with no factor on cos and sin); None for plain RoPE.
        index_heads: The indexer's heads (`index_n_heads`), CSA only.
        index_head_dim: Their features (`index_head_dim`).
        top_k: Entries the indexer chooses per query (`index_topk`).
        eps: The epsilon of every RMSNorm (`rms_norm_eps`).
    """

    kind: Kind
    num_heads: int
    head_dim: int
    q_lora_rank: int
    window: int
    rope_dims: int
    ratio: int = 4
    out_groups: int = 1
    out_rank: int = 64
    rope_base: float = 10000.0
    compress_rope_base: float = 160000.0
    index_heads: int = 4
    index_head_dim: int = 32
    top_k: int = 16
    eps: float = 1e-6
    compress_rope_scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, KINDS)
        for name in ("num_heads", "head_dim", "q_lora_rank", "window", "ratio"):
            check_positive_int(name, getattr(self, name))
        for name in ("out_groups", "out_rank", "index_heads", "index_head_dim", "top_k"):
            check_positive_int(name, getattr(self, name))
        check_rope_dims(self.rope_dims, self.head_dim)
        if self.kind == "csa":
            check_rope_dims(self.rope_dims, self.index_head_dim)
        for name in ("rope_base", "compress_rope_base", "eps"):
            check_positive_float(name, getattr(self, name))
        scaling = self.compress_rope_scaling
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise TypeError(
                f"compress_rope_scaling must be a RopeScaling or None, got {type(scaling).__name__}"
            )
        check_multiple(
            "num_heads * head_dim", self.num_heads * self.head_dim, "out_groups", self.out_groups
        )


@dataclass
class _Series:
    """One series of compressed entries in a cache: what a `Compressor` carries."""

    entries: Tensor | None = None  # (b, n, F): every entry so far
    pending: tuple[Tensor, Tensor] | None = None  # (kv, gate) of a window not yet complete
    prior: tuple[Tensor, Tensor] | None = None  # CSA: series a of the last complete window

    @property
    def count(self) -> int:
        return 0 if self.entries is None else self.entries.shape[1]


@dataclass
class CompressedKVCache(LayerCache):
    """The state of a [`CompressedAttention`][attnlab.layers.compressed.CompressedAttention]
    between calls (`transformers`' `DeepseekV4CSACache` and `DeepseekV4HCACache`).

    It holds the last `window - 1` keys of the sliding window (keys are values), and per
    series of entries (`"entries"`, and the indexer's `"index"` for CSA) the entries
    made so far, the tokens of the window that is not complete yet, and for CSA series
    $a$ of the last complete window. Entries never go away: every window of `ratio`
    tokens adds one.

    Args:
        window: The layer's window.
        layer: What the layer that made it is (its config's `kind`, `ratio`, `head_dim`):
            a layer refuses another layer's cache.
    """

    window: int
    layer: tuple[str, int, int] = ("window", 1, 0)
    keys: Tensor | None = None  # (b, <= window - 1, D)
    series: dict[str, _Series] = field(
        default_factory=lambda: {"entries": _Series(), "index": _Series()}
    )
    _seen: int = 0

    @property
    def seen(self) -> int:
        return self._seen

    @property
    def length(self) -> int:
        """Tokens of the window held (the entries summarise the older ones)."""
        return 0 if self.keys is None else self.keys.shape[1]

    @property
    def nbytes(self) -> int:
        tensors = [self.keys]
        for s in self.series.values():
            tensors += [s.entries, *(s.pending or ()), *(s.prior or ())]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def update(self, keys: Tensor) -> Tensor:
        """Append the new tokens' keys `(b, t, D)`; return the held ones and them."""
        held = keys if self.keys is None else torch.cat([self.keys, keys], dim=1)
        self.keys = held[:, held.shape[1] - min(held.shape[1], self.window - 1) :]
        self._seen += keys.shape[1]
        return held

    def reset(self) -> None:
        self.keys, self._seen = None, 0
        self.series = {"entries": _Series(), "index": _Series()}


def _rotate_tail(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE, interleaved pairs, on the last `2 * cos.shape[-1]` features of `x`."""
    if x.numel() == 0:  # no entries yet: nothing to turn (and no shape to infer)
        return x
    d = 2 * cos.shape[-1]
    head, tail = x[..., : x.shape[-1] - d], x[..., x.shape[-1] - d :]
    return torch.cat([head, rotate(tail, cos, sin, layout="interleaved").to(x.dtype)], dim=-1)


class Compressor(nn.Module):
    """Pools every `ratio` tokens into one entry of `dim` features (`DeepseekV4HCACompressor`,
    and with `overlap` the windows of `DeepseekV4CSACompressor` and of its indexer).

    Args:
        d_model: Features per token.
        dim: Features per entry.
        ratio: Tokens per window.
        overlap: Each entry also mixes the first series of the window before (CSA).
        rope_dims: The last features of each entry that RoPE rotates, at the position of
            its window's first token.
        rope_base: Their RoPE base.
        eps: The epsilon of the entries' RMSNorm.
        rope_scaling: Their RoPE's context extension, or None.
    """

    def __init__(
        self,
        d_model: int,
        dim: int,
        ratio: int,
        *,
        overlap: bool,
        rope_dims: int,
        rope_base: float,
        eps: float,
        rope_scaling: RopeScaling | None = None,
    ) -> None:
        super().__init__()
        width = 2 * dim if overlap else dim
        self.ratio, self.overlap, self.rope_dims, self.rope_base = (
            ratio,
            overlap,
            rope_dims,
            rope_base,
        )
        self.rope_scaling = rope_scaling
        self.kv_proj = nn.Linear(d_model, width, bias=False)
        self.gate_proj = nn.Linear(d_model, width, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(ratio, width))
        self.kv_norm = RMSNorm(dim, eps)

    def forward(self, x: Tensor, series: _Series | None = None) -> Tensor:
        """Every entry of `x` `(b, t, d_model)` after those of `series` (which it updates):
        `(b, n, dim)`."""
        kv, gate = self.kv_proj(x), self.gate_proj(x)  # (b, t, F or 2F)
        first = 0 if series is None else series.count * self.ratio
        if series is not None and series.pending is not None:
            kv = torch.cat([series.pending[0], kv], dim=1)
            gate = torch.cat([series.pending[1], gate], dim=1)
        whole = kv.shape[1] // self.ratio * self.ratio
        prior = None if series is None else series.prior
        pooled, last = pool_windows(
            kv[:, :whole], gate[:, :whole], self.position_bias, self.ratio,
            overlap=self.overlap, prior=prior,
        )  # fmt: skip
        n = pooled.shape[1]
        positions = torch.arange(n, device=x.device) * self.ratio + first
        cos, sin = rope_cos_sin(
            positions, self.rope_dims, base=self.rope_base, scaling=self.rope_scaling
        )
        entries = _rotate_tail(self.kv_norm(pooled), cos, sin)  # (b, n, dim)
        if series is None:
            return entries
        series.pending, series.prior = (kv[:, whole:], gate[:, whole:]), last
        series.entries = (
            entries if series.entries is None else torch.cat([series.entries, entries], 1)
        )
        return series.entries


class CompressedAttention(nn.Module):
    r"""DeepSeek-V4's attention: a window of tokens, and compressed entries (HCA) or the
    entries an indexer chooses (CSA); equal to `transformers`' `DeepseekV4Attention`.

    Args:
        d_model: Features per token, of the input and of the output.
        config: The sizes and the kind
            ([`CompressedConfig`][attnlab.layers.compressed.CompressedConfig]).

    Shapes:
        x: `(b, t, d_model)`. Output: the same shape.
    """

    def __init__(self, d_model: int, config: CompressedConfig) -> None:
        super().__init__()
        if not isinstance(config, CompressedConfig):
            raise TypeError(f"config must be a CompressedConfig, got {type(config).__name__}")
        self.d_model, self.config = check_positive_int("d_model", d_model), config
        c, hd = config, config.num_heads * config.head_dim
        self.q_down = nn.Linear(d_model, c.q_lora_rank, bias=False)
        self.q_norm = RMSNorm(c.q_lora_rank, c.eps)
        self.q_up = nn.Linear(c.q_lora_rank, hd, bias=False)
        self.kv_proj = nn.Linear(d_model, c.head_dim, bias=False)
        self.kv_norm = RMSNorm(c.head_dim, c.eps)
        self.out_down = nn.Parameter(torch.empty(c.out_groups, c.out_rank, hd // c.out_groups))
        nn.init.kaiming_uniform_(self.out_down, a=math.sqrt(5))
        self.out_up = nn.Linear(c.out_groups * c.out_rank, d_model, bias=False)
        self.sink_logits = nn.Parameter(torch.zeros(c.num_heads))
        self.compressor: Compressor | None = None
        self.index_compressor: Compressor | None = None
        if c.kind != "window":
            self.compressor = Compressor(
                d_model, c.head_dim, c.ratio, overlap=c.kind == "csa", rope_dims=c.rope_dims,
                rope_base=c.compress_rope_base, eps=c.eps, rope_scaling=c.compress_rope_scaling,
            )  # fmt: skip
        if c.kind == "csa":
            self.index_compressor = Compressor(
                d_model, c.index_head_dim, c.ratio, overlap=True, rope_dims=c.rope_dims,
                rope_base=c.compress_rope_base, eps=c.eps, rope_scaling=c.compress_rope_scaling,
            )  # fmt: skip
            self.index_q_up = nn.Linear(c.q_lora_rank, c.index_heads * c.index_head_dim, bias=False)
            self.index_weights = nn.Linear(d_model, c.index_heads, bias=False)

    def new_cache(self) -> CompressedKVCache:
        """An empty [`CompressedKVCache`][attnlab.layers.compressed.CompressedKVCache]."""
        c = self.config
        return CompressedKVCache(c.window, (c.kind, c.ratio, c.head_dim))

    def index_scores(
        self, x: Tensor, q_latent: Tensor, positions: Tensor, series: _Series | None = None
    ) -> Tensor:
        r"""The lightning indexer's score of every entry for every query of `x`,
        $\sum_h w_{t,h} \operatorname{ReLU}(q_{t,h} \cdot k_s)$, `(b, t, n)` in float32,
        $-\infty$ where the entry is not complete at the query (CSA only)."""
        c, keys = self.config, self.index_compressor
        assert keys is not None
        index_keys = keys(x, series)  # (b, n, index_head_dim)
        b, t, _ = x.shape
        q = self.index_q_up(q_latent).view(b, t, c.index_heads, c.index_head_dim)
        cos, sin = rope_cos_sin(
            positions, c.rope_dims, base=c.compress_rope_base, scaling=c.compress_rope_scaling
        )
        q = _rotate_tail(q.transpose(1, 2), cos, sin)  # (b, H, t, I)
        scores = torch.relu(torch.einsum("bhti,bni->bhtn", q.float(), index_keys.float()))
        weights = self.index_weights(x).float() * c.index_heads**-0.5  # (b, t, H)
        scores = torch.einsum("bhtn,bth->btn", scores * c.index_head_dim**-0.5, weights)
        visible = visible_entries(positions, index_keys.shape[1], c.ratio)  # (t, n)
        return scores.masked_fill(~visible, float("-inf"))

    def choose(
        self, x: Tensor, q_latent: Tensor, positions: Tensor, entries: int, series: _Series | None
    ) -> Tensor:
        """The entries each query of `x` attends to, `(b, t, k)`, -1 for none: every
        complete one (HCA), or the `top_k` best by
        [`index_scores`][attnlab.layers.compressed.CompressedAttention.index_scores]
        among them (CSA), gathered by index."""
        if self.index_compressor is None:  # HCA: all of them, as a mask (read in place)
            return visible_entries(positions, entries, self.config.ratio)  # (t, n)
        scores = self.index_scores(x, q_latent, positions, series)  # (b, t, n)
        top = scores.topk(min(self.config.top_k, entries), dim=-1)
        return torch.where(top.values > float("-inf"), top.indices, -1)  # (b, t, k)

    @entry
    def forward(self, x: Tensor, *, cache: CompressedKVCache | None = None) -> Tensor:
        """Attend from the tokens of `x` `(b, t, d_model)` to their windows and entries,
        after the tokens in `cache` (updated in place)."""
        c = self.config
        if checking():
            x = check_tokens(
                "x", x, features=self.d_model, param="d_model", owner="CompressedAttention",
                like=self.q_down.weight,
            )  # fmt: skip
            if x.ndim != 3:
                raise ValueError(f"x must be batched (b, t, d_model), got x.shape={tuple(x.shape)}")
            c_ = self.config
            made = (c_.kind, c_.ratio, c_.head_dim)
            needs = (
                f"this layer's CompressedKVCache from new_cache (kind, ratio, head_dim) = {made}"
            )
            fits = lambda held: held.window == c_.window and held.layer == made  # noqa: E731
            CompressedKVCache.check(cache, needs=needs, fits=fits)
            if x.shape[1] == 0:
                raise ValueError("x must hold at least one token (x.shape[1] == 0)")
            if cache is not None and cache.keys is not None and cache.keys.shape[0] != x.shape[0]:
                raise ValueError(
                    f"cache holds {cache.keys.shape[0]} sequences but x has b={x.shape[0]} "
                    f"(x.shape={tuple(x.shape)})"
                )
        b, t, _ = x.shape
        past = 0 if cache is None else cache.seen
        positions = torch.arange(past, past + t, device=x.device)
        base, scaling = (
            (c.rope_base, None)
            if c.kind == "window"
            else (c.compress_rope_base, c.compress_rope_scaling)
        )
        cos, sin = rope_cos_sin(positions, c.rope_dims, base=base, scaling=scaling)
        q_latent = self.q_norm(self.q_down(x))  # (b, t, q_lora_rank)
        q = split_heads(self.q_up(q_latent), c.num_heads)  # (b, h, t, D)
        q = _rotate_tail(rms_normalize(q, c.eps).to(q.dtype), cos, sin)
        kv = _rotate_tail(self.kv_norm(self.kv_proj(x)), cos, sin)  # (b, t, D)
        keys = kv if cache is None else cache.update(kv)  # (b, s, D)
        windows, valid = window_keys(keys, t, c.window)
        entries, chosen = kv.new_zeros(b, 0, c.head_dim), positions.new_zeros(b, t, 0)
        if self.compressor is not None:
            series = None if cache is None else cache.series
            entries = self.compressor(x, None if series is None else series["entries"])
            index = None if series is None else series["index"]
            chosen = self.choose(x, q_latent, positions, entries.shape[1], index)
        scale = c.head_dim**-0.5
        out = window_and_entries_attention(
            q, windows, valid, entries, chosen, self.sink_logits, scale
        )
        out = merge_heads(_rotate_tail(out, cos, -sin))  # (b, t, h * D)
        grouped = out.view(b, t, c.out_groups, -1)  # (b, t, g, h * D / g)
        down = torch.einsum("btgi,gri->btgr", grouped, self.out_down)  # (b, t, g, rank)
        result: Tensor = self.out_up(down.flatten(2))
        return result

    @classmethod
    def from_hf(cls, layer: nn.Module) -> CompressedAttention:
        """A `CompressedAttention` with the weights and sizes of `transformers`'
        `DeepseekV4Attention` (any of its three kinds), on its device and dtype.

        Raises:
            TypeError: If `layer` is not a `DeepseekV4Attention`.
            ValueError: If its config scales the window layers' RoPE (`rope_parameters`
                `"main"` of a `rope_type` other than `"default"`) or the compressed
                layers' by a rule [`RopeScaling`][attnlab.rules.rope_scaling.RopeScaling]
                does not implement (their YaRN is ported).
        """
        from attnlab.models import interop  # a folder above this one: imported when called

        return interop.compressed_from_hf(cls, layer)
