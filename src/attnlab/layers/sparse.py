r"""DeepSeek Sparse Attention (DSA): a lightning indexer picks each query's top-k keys.

DeepSeek-V3.2 (DeepSeek-AI, "DeepSeek-V3.2: Pushing the Frontier of Open Large Language
Models", 2025, https://arxiv.org/abs/2512.02556) keeps the multi-head latent attention of
DeepSeek-V3 but lets each query attend to only `topk` past tokens (2048 in the
released model). Which ones is decided by a *lightning indexer*: a second, much smaller
attention with a few heads $j$ of its own queries $q_{t,j}$, one key $k_s$ per token shared
by all heads, a ReLU instead of a softmax, and a weight $w_{t,j}$ per query and head:

$$
I_{t,s} = \sum_{j} w_{t,j} \, \operatorname{ReLU}\left(q_{t,j} \cdot k_s\right)
$$

The main attention then runs over the `topk` keys $s \le t$ of highest $I_{t,s}$
only. The indexer is still quadratic, but its heads are few, narrow and (in DeepSeek's
kernels) FP8, so the expensive attention costs $O(t \cdot k)$ instead of $O(t^2)$.

Here: [`LightningIndexer`][attnlab.layers.sparse.LightningIndexer] computes $I$ (causal),
the kernels of [`attnlab.functional.sparse`][attnlab.functional.sparse] pick the keys, and
[`DeepSeekSparseAttention`][attnlab.layers.sparse.DeepSeekSparseAttention] runs attnlab's
[`MultiHeadLatentAttention`][attnlab.layers.mla.MultiHeadLatentAttention] under that mask,
equal to `transformers`' `DeepseekV32Attention` after
[`from_hf`][attnlab.layers.sparse.DeepSeekSparseAttention.from_hf], in a full forward and in
decoding, where a [`SparseAttentionCache`][attnlab.layers.sparse.SparseAttentionCache] keeps
MLA's latents and the indexer's keys.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from attnlab.caches.base import LayerCache
from attnlab.caches.kv import KVCache
from attnlab.functional.backends import attention_weights as _attention_weights
from attnlab.functional.sparse import hide_future, selection_mask, topk_indices
from attnlab.layers.heads import split_heads
from attnlab.layers.mla import MultiHeadLatentAttention, _check_latent_inputs
from attnlab.rules._precision import compute_dtype
from attnlab.rules._validation import (
    check_bool,
    check_features,
    check_positive_float,
    check_positive_int,
    check_rank,
    check_tensor,
    check_tokens,
    checking,
    entry,
)
from attnlab.rules.masks import check_padding_of, padding_attention_mask
from attnlab.rules.rope import check_rope_dims, default_positions, rotate
from attnlab.rules.scores import ScoreRule

__all__ = [
    "DeepSeekSparseAttention",
    "LightningIndexer",
    "SparseAttentionCache",
]


class LightningIndexer(nn.Module):
    r"""DeepSeek-V3.2's lightning indexer: causal scores $I_{t,s}$ of every past key.

    Per query token $t$ and indexer head $j$ a query $q_{t,j}$ (from `q_input`, in
    DeepSeek-V3.2 the normed low-rank query latent of the main attention); per key token
    one key $k_s$ shared by all heads (LayerNorm of a projection of $x_s$); per query
    token and head a weight $w_{t,j}$ (a projection of $x_t$). The first `rope_dim`
    features of queries and keys are rotated (RoPE, half-split layout, as in
    `transformers`). Then

    $$
    I_{t,s} = \sum_j w_{t,j} \, h^{-1/2} \operatorname{ReLU}\left(
        \frac{q_{t,j} \cdot k_s}{\sqrt{d}}\right)
    $$

    ($h$ heads of $d$ = `head_dim` features; both constant factors are DeepSeek's and
    change no ranking), with -inf at future keys.

    | attnlab | shape of `weight` | Hugging Face `DeepseekV32Indexer` |
    | --- | --- | --- |
    | `q_proj` | `(num_heads * head_dim, d_query)` | `wq_b` |
    | `k_proj` | `(head_dim, d_model)` | `wk` |
    | `k_norm` (LayerNorm) | `(head_dim,)`, and a bias | `k_norm` |
    | `weights_proj` | `(num_heads, d_model)` | `weights_proj` |

    Args:
        d_model: Features per token of `x`.
        num_heads: Indexer heads (`index_n_heads`, 64 in DeepSeek-V3.2).
        head_dim: Features per indexer head (`index_head_dim`, 128).
        d_query: Features of `q_input`; default `d_model`.
        rope_dim: Leading features of each head that RoPE rotates; even, at most
            `head_dim` (0: none).
        norm_eps: Epsilon of the keys' LayerNorm.

    Shapes:
        x: `(b, t, d_model)`; q_input: `(b, t, d_query)`. Output: `(b, t, t)`.

    Raises:
        TypeError: If a size is not an int, or `norm_eps` not a number.
        ValueError: If a size or `norm_eps` is not positive, or `rope_dim` is odd or
            above `head_dim`.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> indexer = LightningIndexer(d_model=16, num_heads=2, head_dim=8)
        >>> scores = indexer(torch.randn(1, 4, 16))
        >>> scores.shape, bool(scores[0, 0, 1] == float("-inf"))
        (torch.Size([1, 4, 4]), True)
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int,
        *,
        d_query: int | None = None,
        rope_dim: int = 0,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.d_query = d_model if d_query is None else check_positive_int("d_query", d_query)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        if rope_dim != 0:  # 0: no RoPE
            check_rope_dims(rope_dim, head_dim, "rope_dim")
        self.rope_dim = rope_dim
        self.softmax_scale = float(head_dim) ** -0.5
        self.q_proj = nn.Linear(self.d_query, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=check_positive_float("norm_eps", norm_eps))
        self.weights_proj = nn.Linear(d_model, num_heads, bias=False)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"d_query={self.d_query}, rope_dim={self.rope_dim}"
        )

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        rot, rest = torch.split(x, [self.rope_dim, self.head_dim - self.rope_dim], -1)
        return torch.cat([rotate(rot, cos, sin, layout="half"), rest], dim=-1)

    @entry
    def forward(
        self,
        x: Tensor,
        *,
        position_embeddings: tuple[Tensor, Tensor] | None = None,
        q_input: Tensor | None = None,
        keys: Tensor | None = None,
    ) -> Tensor:
        """Causal indexer scores of the tokens of `x` against themselves (or `keys`).

        Args:
            x: Tokens `(b, t, d_model)`: the keys and the head weights come from them.
            position_embeddings: RoPE's `(cos, sin)` for the `t` positions, e.g. from
                [`rope_cos_sin`][attnlab.rules.rope.rope_cos_sin] with `rope_dim` features;
                required when `rope_dim > 0`.
            q_input: What the queries are projected from, `(b, t, d_query)`; default `x`.
            keys: All keys `(b, s, head_dim)` from
                [`keys`][attnlab.layers.sparse.LightningIndexer.keys],
                those of earlier tokens (a cache) followed by those of `x`; default the
                keys of `x`. The `t` queries are the last `t` of the `s` tokens.

        Returns:
            Scores `(b, t, s)`, float32 (or float64 for float64 input), -inf at future
            keys.

        Raises:
            TypeError: If `x` or `q_input` is not a floating-point tensor.
            ValueError: If `x` or `q_input` has the wrong rank, features or length, or
                `position_embeddings` is missing while `rope_dim > 0`.
        """
        if checking():
            self._check_inputs(x, q_input, position_embeddings, keys)
        q_input = x if q_input is None else q_input
        q = split_heads(self.q_proj(q_input), self.num_heads)  # (b, h, t, head_dim)
        if self.rope_dim:
            assert position_embeddings is not None
            q = self._rope(q, *position_embeddings)  # (b, h, t, head_dim)
        if keys is None:
            keys = self.keys(x, position_embeddings=position_embeddings)
        compute = compute_dtype(x.dtype)  # as DeepSeek: no bf16 sums
        k = keys.to(compute).unsqueeze(1)  # (b, 1, s, head_dim): one key for all heads
        dots = q.to(compute) @ k.transpose(-1, -2)  # (b, h, t, s)
        per_head = torch.relu(dots * self.softmax_scale)
        w = self.weights_proj(x).to(compute) * self.num_heads**-0.5  # (b, t, h)
        scores = torch.einsum("bth,bhts->bts", w, per_head)  # (b, t, s)
        return hide_future(scores)

    @entry
    def keys(
        self, x: Tensor, *, position_embeddings: tuple[Tensor, Tensor] | None = None
    ) -> Tensor:
        """The indexer keys of the tokens of `x`, `(b, t, head_dim)`: what a cache keeps.

        Args:
            x: Tokens `(b, t, d_model)`.
            position_embeddings: RoPE's `(cos, sin)` for their positions, as in `forward`.

        Returns:
            The LayerNormed, rotated keys, in the dtype of `x`.
        """
        if checking():
            self._check_inputs(x, None, position_embeddings, None)
        k: Tensor = self.k_norm(self.k_proj(x))  # (b, t, head_dim)
        if self.rope_dim:
            assert position_embeddings is not None
            k = self._rope(k, *position_embeddings)
        return k

    def _check_inputs(
        self, x: object, q_input: object, position_embeddings: object, keys: object
    ) -> None:
        owner = type(self).__name__
        x = check_tokens(
            "x", x, features=self.d_model, param="d_model", owner=owner, like=self.k_proj.weight
        )
        check_rank("x", x, (3,), "(b, t, d_model)")
        if q_input is not None:
            q = check_tensor("q_input", q_input)
            check_rank("q_input", q, (3,), "(b, t, d_query)")
            check_features("q_input", q, self.d_query, owner, "d_query")
            if q.shape[:2] != x.shape[:2]:
                raise ValueError(
                    f"q_input must have the batch size and length of x, got "
                    f"q_input.shape={tuple(q.shape)} and x.shape={tuple(x.shape)}"
                )
        if keys is not None:
            k = check_tensor("keys", keys)
            check_rank("keys", k, (3,), "(b, s, head_dim)")
            if k.shape[0] != x.shape[0] or k.shape[2] != self.head_dim or k.shape[1] < x.shape[1]:
                raise ValueError(
                    f"keys must have shape (b, s, head_dim) with b={x.shape[0]}, "
                    f"s >= t={x.shape[1]}, head_dim={self.head_dim}, "
                    f"got keys.shape={tuple(k.shape)}"
                )
        if self.rope_dim and position_embeddings is None:
            raise ValueError(
                f"position_embeddings are required: {owner} rotates rope_dim={self.rope_dim} "
                f"features of each head"
            )


class SparseAttentionCache(LayerCache):
    """What DeepSeek Sparse Attention keeps per token: MLA's latents and the indexer's keys.

    `latents` is MLA's cache (see
    [`MultiHeadLatentAttention.new_cache`][attnlab.layers.mla.MultiHeadLatentAttention.new_cache]),
    which takes its new latents by its own `update`; `index_keys` holds the indexer key
    of every token seen, `(b, length, head_dim)` (None before the first call), taken by
    [`update`][attnlab.layers.sparse.SparseAttentionCache.update]. Make one with
    [`DeepSeekSparseAttention.new_cache`][attnlab.layers.sparse.DeepSeekSparseAttention.new_cache].

    Args:
        latents: An empty attnlab [`KVCache`][attnlab.caches.kv.KVCache] for the MLA part.

    Raises:
        TypeError: If `latents` is not a `KVCache`.
        ValueError: If it is not empty.
    """

    def __init__(self, latents: KVCache) -> None:
        checked = KVCache.check(latents, needs="an attnlab KVCache", name="latents", optional=False)
        assert checked is not None
        if checked.length:
            raise ValueError(f"latents must be empty, got one holding {checked.length} tokens")
        self.latents = checked
        self.index_keys: Tensor | None = None

    def __repr__(self) -> str:
        return f"SparseAttentionCache(length={self.length}, latents={self.latents!r})"

    @property
    def seen(self) -> int:
        """Tokens seen so far (all of them held)."""
        return self.latents.seen

    @property
    def nbytes(self) -> int:
        """Bytes held: MLA's cache and the indexer's keys."""
        keys = self.index_keys
        extra = 0 if keys is None else keys.numel() * keys.element_size()
        return self.latents.nbytes + extra

    @property
    def batch_size(self) -> int | None:
        """Sequences held, as MLA's cache says."""
        return self.latents.batch_size

    @property
    def max_length(self) -> int | None:
        """Most tokens MLA's cache can hold."""
        return self.latents.max_length

    def update(self, index_keys: Tensor) -> None:
        """Take the indexer keys of every token seen, `(b, seen, head_dim)`, detached
        (after MLA's cache took the new latents, so that both parts stay in step)."""
        self.index_keys = index_keys.detach()

    def reset(self) -> None:
        """Forget every token: MLA's cache and the indexer's keys."""
        self.latents.reset()
        self.index_keys = None


class DeepSeekSparseAttention(nn.Module):
    r"""DeepSeek-V3.2's attention: MLA over the top-k keys that a lightning indexer picks.

    The indexer scores every past key from the main attention's query latent
    (`q_lora_rank` set) or from `x`; each query keeps its `topk` best keys
    ([`topk_indices`][attnlab.functional.sparse.topk_indices], all past keys while it has fewer);
    [`MultiHeadLatentAttention`][attnlab.layers.mla.MultiHeadLatentAttention] then attends under
    the [`selection_mask`][attnlab.functional.sparse.selection_mask]. The selection is discrete, so
    no gradient reaches the indexer through it (DeepSeek trains the indexer with a loss
    of its own).

    Args:
        mla: The main attention (its sizes, RoPE and backend are used as they are).
        indexer: The indexer: `d_model` as `mla`'s, `d_query` = `mla.q_lora_rank` (or
            `d_model` without one), `rope_dim` 0 or `mla.qk_rope_head_dim`.
        topk: Keys per query (`index_topk`, 2048 in DeepSeek-V3.2).

    Shapes:
        x: `(b, t, d_model)` or `(t, d_model)`. Output: the same shape.

    Raises:
        TypeError: If `mla` or `indexer` has the wrong type or `topk` is not an int.
        ValueError: If `topk` is not positive or the indexer does not fit `mla`.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> mla = MultiHeadLatentAttention(
        ...     32, 4, kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4,
        ...     v_head_dim=5, q_lora_rank=10)
        >>> indexer = LightningIndexer(32, 2, 8, d_query=10, rope_dim=4)
        >>> dsa = DeepSeekSparseAttention(mla, indexer, topk=3)
        >>> x = torch.randn(2, 7, 32)
        >>> dsa(x).shape
        torch.Size([2, 7, 32])
        >>> dsa.select(x)[0, :4]  # each query's keys; -1 = fewer than 3 to pick from
        tensor([[ 0, -1, -1],
                [ 0,  1, -1],
                [ 0,  2,  1],
                [ 2,  1,  0]])
    """

    def __init__(
        self, mla: MultiHeadLatentAttention, indexer: LightningIndexer, *, topk: int
    ) -> None:
        super().__init__()
        if not isinstance(mla, MultiHeadLatentAttention):
            raise TypeError(f"mla must be a MultiHeadLatentAttention, got {type(mla).__name__}")
        if not isinstance(indexer, LightningIndexer):
            raise TypeError(f"indexer must be a LightningIndexer, got {type(indexer).__name__}")
        d_query = mla.d_model if mla.q_lora_rank is None else mla.q_lora_rank
        fits = {
            "d_model": (indexer.d_model, mla.d_model),
            "d_query": (indexer.d_query, d_query),
        }
        for name, (got, want) in fits.items():
            if got != want:
                raise ValueError(f"indexer has {name}={got} but mla needs {name}={want}")
        if indexer.rope_dim not in (0, mla.qk_rope_head_dim):
            raise ValueError(
                f"indexer has rope_dim={indexer.rope_dim}; it shares mla's RoPE tables, so it "
                f"must be 0 or mla.qk_rope_head_dim={mla.qk_rope_head_dim}"
            )
        self.mla = mla
        self.indexer = indexer
        self.topk = check_positive_int("topk", topk)

    def extra_repr(self) -> str:
        return f"topk={self.topk}"

    def _index(
        self, x: Tensor, positions: Tensor | None, past_keys: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor]:
        """The indexer's scores of `x` `(b, t, d_model)` against the past and its own keys.

        Also the RoPE tables that both attentions share and all indexer keys
        `(b, s, head_dim)`, for a cache. The indexer reads its inputs detached, as in the
        V3.2 report: its loss trains the indexer only, never the main attention or the
        layers below.
        """
        mla = self.mla
        past = 0 if past_keys is None else past_keys.shape[1]
        if positions is None:
            positions = default_positions(past, x.shape[-2], x.device)  # (t,)
        cos_sin = mla.rope_tables(positions)  # once, for the indexer and for MLA
        q_input = x
        if mla.q_down is not None:
            assert mla.q_norm is not None
            # MLA projects this latent again for its own queries: a small cost for keeping
            # MLA unchanged (the indexer reads it, as in DeepSeek's model).
            q_input = mla.q_norm(mla.q_down(x))
        keys = self.indexer.keys(x.detach(), position_embeddings=cos_sin)  # (b, t, hd)
        if past_keys is not None:
            keys = torch.cat([past_keys, keys], dim=1)  # (b, s, head_dim)
        scores = self.indexer(
            x.detach(), position_embeddings=cos_sin, q_input=q_input.detach(), keys=keys
        )  # (b, t, s)
        return scores, cos_sin, keys

    @entry
    def select(self, x: Tensor, *, positions: Tensor | None = None) -> Tensor:
        """The keys each query attends to: `(b, t, min(topk, t))`, -1 for an empty slot.

        Args:
            x: Tokens `(b, t, d_model)` or `(t, d_model)`.
            positions: Integer RoPE positions `(t,)`, `(1, t)` or `(b, t)`; default
                `arange(t)`.

        Returns:
            Indices as [`topk_indices`][attnlab.functional.sparse.topk_indices] gives them (without
            the batch axis for unbatched `x`).
        """
        if checking():
            self._check_x(x, positions)
        return topk_indices(self.scores(x, positions=positions), self.topk)

    @entry
    def scores(self, x: Tensor, *, positions: Tensor | None = None) -> Tensor:
        """The indexer's causal scores `(b, t, t)` (or `(t, t)` for unbatched `x`)."""
        if checking():
            self._check_x(x, positions)
        unbatched = x.ndim == 2
        xb = x.unsqueeze(0) if unbatched else x  # (b, t, d_model)
        scores, _, _ = self._index(xb, positions)
        return scores[0] if unbatched else scores

    @entry
    def attention_weights(
        self, x: Tensor, *, positions: Tensor | None = None, sparse: bool = True
    ) -> Tensor:
        """The main attention's weights `(b, num_heads, t, t)` (`(num_heads, t, t)` unbatched).

        Args:
            x: Tokens `(b, t, d_model)` or `(t, d_model)`.
            positions: Integer RoPE positions, as in `forward`.
            sparse: Under the indexer's selection (what `forward` mixes the values
                with); False for dense causal MLA, the target of
                [`indexer_loss`][attnlab.functional.sparse.indexer_loss]'s warm-up.

        Returns:
            Each query's weights over the keys, summing to 1 (0 at unselected keys).
        """
        if checking():
            self._check_x(x, positions)
        unbatched = x.ndim == 2
        xb = x.unsqueeze(0) if unbatched else x  # (b, t, d_model)
        mla = self.mla
        scores, (cos, sin), _ = self._index(xb, positions)
        mask = None
        if sparse:
            indices = topk_indices(scores, self.topk)
            mask = selection_mask(indices, xb.shape[1]).unsqueeze(1)  # (b, 1, t, t)
        # MLA's absorbed scores: W_UK folded into the queries, the latents as keys.
        q_nope, q_rope = mla.queries(xb, cos, sin)  # (b, h, t, d_nope), (b, h, t, d_rope)
        c_kv, k_rope = mla.latents(xb, cos, sin)  # (b, 1, t, r), (b, 1, t, d_rope)
        q, k = mla.absorbed_qk(q_nope, q_rope, c_kv, k_rope)  # (b, h|1, t, r + d_rope)
        rule = ScoreRule(scale=mla.scale, is_causal=not sparse)
        weights = _attention_weights(q, k, rule, attn_mask=mask, enable_gqa=True)  # (b, h, t, t)
        return weights[0] if unbatched else weights

    def _check_x(
        self, x: object, positions: object = None, cache: object = None, *, window: bool = False
    ) -> None:
        """MLA's checks of `x` and `positions` (and of MLA's `window`, for `forward`)."""
        owner = type(self).__name__
        mla_window = self.mla.window if window else None
        # is_causal=False: the selection is the causal mask.
        x = _check_latent_inputs(self.mla, owner, x, positions, is_causal=False, window=mla_window)
        cache = SparseAttentionCache.check(
            cache, needs=f"a SparseAttentionCache (see new_cache) for {owner}"
        )
        if cache is None:
            return
        b = x.shape[0] if x.ndim == 3 else 1
        keys = cache.index_keys
        if keys is not None and (keys.shape[0] != b or keys.shape[2] != self.indexer.head_dim):
            raise ValueError(
                f"cache holds indexer keys of shape {tuple(keys.shape)}, which do not fit "
                f"x (batch size {b}) and indexer.head_dim={self.indexer.head_dim}"
            )

    def new_cache(self, batch_size: int, max_length: int, **where: Any) -> SparseAttentionCache:
        """An empty decode cache: MLA's latent cache and the indexer's keys.

        Args:
            batch_size: Sequences decoded together.
            max_length: Most tokens it can hold, prompt included.
            where: `dtype` and `device` of the latents, as
                [`MultiHeadLatentAttention.new_cache`][attnlab.layers.mla.MultiHeadLatentAttention.new_cache]
                takes them (the module's parameters' by default); its errors too.

        Returns:
            A [`SparseAttentionCache`][attnlab.layers.sparse.SparseAttentionCache].
        """
        return SparseAttentionCache(self.mla.new_cache(batch_size, max_length, **where))

    @entry
    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        absorb: bool = False,
        cache: SparseAttentionCache | None = None,
        padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Causal sparse attention: each query over its `topk` selected keys.

        With a `cache`, the tokens of `x` follow those it holds: their queries pick among
        all `s = cache.length + t` tokens, and their latents and indexer keys are
        appended (a decode step is one new token, with `absorb=True` as DeepSeek runs
        it).

        Args:
            x: Tokens `(b, t, d_model)` or `(t, d_model)`.
            positions: Integer RoPE positions `(t,)`, `(1, t)` or `(b, t)`; default
                `cache.length + arange(t)` (`arange(t)` without a cache).
            absorb: Run MLA's absorbed (latent) form instead of the naive one.
            cache: A [`SparseAttentionCache`][attnlab.layers.sparse.SparseAttentionCache] from
                [`new_cache`][attnlab.layers.sparse.DeepSeekSparseAttention.new_cache], updated
                in place.
            padding_mask: `(b, cached + t)`, 1 (True) at real tokens and 0 at left
                padding (Hugging Face's `attention_mask`): the indexer never selects a
                padding key, so a real query attends only to real keys; a padding query
                attends to itself alone (its output is meaningless, but not NaN).
                `positions` still places the tokens (count only the real ones, as
                `transformers` does, for the outputs of the unpadded rows).

        Returns:
            `(b, t, d_model)` or `(t, d_model)`.

        Raises:
            TypeError: If `x` is not a floating-point tensor, `positions` not an integer
                tensor, `cache` not a `SparseAttentionCache`, `absorb` not a bool or
                `padding_mask` not a bool or integer tensor.
            ValueError: If `x` has the wrong rank, features, dtype or device, `mla` has
                a window,
                `positions` does not fit, the cache does not fit `x` or has no room
                (as in MLA), or `padding_mask` has the wrong shape, values other than
                0 and 1, pads on the right or has a row without tokens.
        """
        if checking():  # once: the indexer and MLA trust what is checked here
            self._check_x(x, positions, cache, window=True)
            check_bool("absorb", absorb)
        past_keys = None if cache is None else cache.index_keys
        past = 0 if past_keys is None else past_keys.shape[1]
        if checking() and padding_mask is not None:
            check_padding_of(padding_mask, x, past + x.shape[1], what="(b, cached + t)")
        unbatched = x.ndim == 2
        xb = x.unsqueeze(0) if unbatched else x  # (b, t, d_model)
        scores, cos_sin, keys = self._index(xb, positions, past_keys)  # (b, t, s)
        if padding_mask is not None:  # each query keeps itself: no empty row
            allowed = padding_attention_mask(padding_mask, xb.shape[1])  # (b, t, s)
            scores = scores.masked_fill(~allowed, float("-inf"))
        indices = topk_indices(scores, self.topk)  # (b, t, k)
        mask = selection_mask(indices, scores.shape[-1]).unsqueeze(1)  # (b, 1, t, s)
        # The selection holds no future key, so the mask alone is causal.
        out: Tensor = self.mla(
            xb,
            position_embeddings=cos_sin,
            cache=None if cache is None else cache.latents,
            attn_mask=mask,
            absorb=absorb,
        )
        if cache is not None:  # after MLA's append succeeded: both parts stay in step
            cache.update(keys)
        return out[0] if unbatched else out

    @classmethod
    def from_hf(cls, layer: nn.Module) -> DeepSeekSparseAttention:
        """A `DeepSeekSparseAttention` with the weights of `transformers`' `DeepseekV32Attention`.

        The MLA part is copied by
        [`MultiHeadLatentAttention.from_hf`][attnlab.layers.mla.MultiHeadLatentAttention.from_hf]
        (same rules and errors), the indexer's `wq_b`, `wk`, `k_norm`, `weights_proj`
        by the table of [`LightningIndexer`][attnlab.layers.sparse.LightningIndexer], and
        `index_topk` as `topk`.

        Args:
            layer: The Hugging Face attention layer, with an `indexer`.

        Returns:
            A new module on the layer's device and dtype, sharing no storage with it.

        Raises:
            TypeError: If `layer` has no indexer of that structure, or its MLA part is
                not one `MultiHeadLatentAttention.from_hf` accepts.
        """
        from attnlab.models import interop  # a folder above this one: imported when called

        return interop.dsa_from_hf(cls, layer)
