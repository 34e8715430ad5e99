r"""A Llama-family decoder built from attnlab's attention: the model file of a real LLM.

Llama (Touvron et al., 2023, https://arxiv.org/abs/2302.13971), Mistral, Qwen2,
SmolLM2 and SmolLM3 share one architecture (SmolLM3 leaves RoPE out of every fourth
layer: `rope_layers`). Each of `num_layers` pre-norm residual blocks runs

$$
h = x + \operatorname{GQA}(\operatorname{RMSNorm}(x)), \qquad
y = h + W_{\text{down}}\big(\operatorname{silu}(W_{\text{gate}} \bar h) \odot
W_{\text{up}} \bar h\big), \quad \bar h = \operatorname{RMSNorm}(h),
$$

between a token embedding and a final RMSNorm followed by the unembedding (often tied to
the embedding). The attention is [`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention]
with RoPE; the norms are `torch.nn.RMSNorm` and the projections plain `nn.Linear`, named
as in Hugging Face's `LlamaForCausalLM`, so
[`Decoder.from_hf`][attnlab.models.decoder.Decoder.from_hf]
copies its state dict key for key.

As in `transformers`, the RoPE tables and the mask are built once per forward and passed
to every layer, and the input is checked once, at the model's boundary: called from the
model, the layers trust it (see [`entry`][attnlab.rules._validation.entry]).
[`Decoder.generate`][attnlab.models.decoder.Decoder.generate] decodes greedily or by sampling from a
static or dynamic [`KVCache`][attnlab.caches.kv.KVCache] per layer, for one prompt or a
left-padded batch; [`Decoder.stream`][attnlab.models.decoder.Decoder.stream] yields the tokens as
they come. Real weights: [`attnlab.models.pretrained`][attnlab.models.pretrained].

The same file runs Gemma 3's text decoder (Gemma Team, 2025,
https://arxiv.org/abs/2503.19786) with `family="gemma"`: its RMSNorms scale by
$1 + w$, the embedding is multiplied by $\sqrt{d_\text{model}}$, the MLP's gate is a tanh
GELU, and each block normalises the outputs of its attention and its MLP too, four norms
in all:

$$
h = x + \operatorname{RMSNorm}(\operatorname{GQA}(\operatorname{RMSNorm}(x))), \qquad
y = h + \operatorname{RMSNorm}(\operatorname{MLP}(\operatorname{RMSNorm}(h))).
$$

Its attention normalises each query and key head (QK-norm) and scales the scores by
`query_pre_attn_scalar`$^{-1/2}$; five sliding-window layers with RoPE base $10^4$
alternate with one global layer with base $10^6$, and each sliding layer decodes from a
[`RollingKVCache`][attnlab.caches.kv.RollingKVCache] that keeps only its window. Gemma 2
(https://arxiv.org/abs/2408.00118) has the same block without QK-norm, local and global
layers one to one, and caps its scores and logits by $c \tanh(x / c)$.

A hybrid stack picks each block's token mixer (`layer_kinds`): full attention, a
sliding window, or linear attention, a [`GatedDeltaNet`][attnlab.layers.linear.GatedDeltaNet]
that decodes from a fixed-size [`GatedDeltaNetState`][attnlab.layers.linear.GatedDeltaNetState]
instead of a KV cache. Qwen3-Next (Qwen Team, 2025) interleaves three Gated DeltaNet
blocks with one full-attention block whose heads are gated by a sigmoid
([`HeadGates`][attnlab.layers.gqa.HeadGates]), rotates a quarter of each head, and
replaces the MLP by a mixture of experts with a shared expert
([`SparseMoE`][attnlab.layers.mlp.SparseMoE]); `Decoder.from_hf` ports its
`Qwen3NextForCausalLM`.

Gemma 4 (`family="gemma4"`) scales its norms by $w$, normalises values by a weightless
RMSNorm and each block's output by a learned scalar (`layer_scalar`); its global layers
have their own head size and key/value heads (`global_attention`), may use their keys as
values, and its last layers may read the keys and values of earlier ones (`kv_sources`,
through a [`SharedKVCache`][attnlab.caches.shared.SharedKVCache]), so they hold no cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from functools import partial
from typing import Any, Unpack, cast

import torch
from torch import Tensor, nn

from attnlab.caches.base import LayerCache
from attnlab.caches.kv import (
    AttentionCache,
    DynamicKVCache,
    RollingKVCache,
    StaticKVCache,
)
from attnlab.caches.quantized import QuantizedKVCache
from attnlab.caches.shared import SharedKVCache, SharedKVReader
from attnlab.functional.backends import backend_for
from attnlab.layers.gqa import GroupedQueryAttention, HeadGates
from attnlab.layers.linear import GatedDeltaNet, GatedDeltaNetState
from attnlab.layers.mla import MultiHeadLatentAttention
from attnlab.layers.mlp import SparseMoE, SwiGLU
from attnlab.layers.norms import QKNormSpec, RMSNorm
from attnlab.models.config import CACHE_KINDS, CacheKind, DecoderConfig
from attnlab.models.generate import Sampler, StreamOptions, decode, pad_token
from attnlab.rules._validation import (
    check_attn_mask,
    check_bool,
    check_index_tensor,
    check_int_sequence,
    check_positive_int,
    check_token_id_set,
    check_token_ids,
    checking,
    entry,
)
from attnlab.rules.masks import check_padding_mask, chunked, combine, padding_attention_mask
from attnlab.rules.rope import Rope, check_positions, default_positions, rope_cos_sin
from attnlab.rules.scores import ScoreRule

__all__ = ["Decoder", "DecoderBlock"]

Tables = tuple[Tensor, Tensor] | None
"""A layer's RoPE tables `(cos, sin)`, or None for a NoPE layer."""


class DecoderBlock(nn.Module):
    """One pre-norm block: attention, then the MLP, each added to the residual stream.

    In the Gemma family the outputs of the attention and of the MLP are normalised too
    before they are added (`post_attention_layernorm`, `post_feedforward_layernorm`;
    `pre_feedforward_layernorm` is the MLP's input norm), as in `Gemma3DecoderLayer`.

    A `"linear"` block (`config.kind(layer)`) mixes its tokens with a
    [`GatedDeltaNet`][attnlab.layers.linear.GatedDeltaNet], `linear_attn`, instead of the
    attention `self_attn` (None there), and carries a
    [`GatedDeltaNetState`][attnlab.layers.linear.GatedDeltaNetState] instead of a KV cache, as
    `Qwen3NextDecoderLayer`; with `config.attn_output_gate` the attention gates its heads
    ([`HeadGates`][attnlab.layers.gqa.HeadGates]), and a mixture-of-experts layer's MLP
    a [`SparseMoE`][attnlab.layers.mlp.SparseMoE].

    `forward` does not check its input: it runs inside a
    [`Decoder`][attnlab.models.decoder.Decoder], which checked the tokens at its boundary.
    """

    def __init__(self, config: DecoderConfig, layer: int = 0) -> None:
        super().__init__()
        traits = config.traits
        self.kind = config.kind(layer)
        self.input_layernorm = _norm(config)
        self.self_attn: GroupedQueryAttention | MultiHeadLatentAttention | None = None
        self.linear_attn: GatedDeltaNet | None = None
        if self.kind == "linear":
            assert config.linear is not None  # checked by the config
            # The config's fields are the layer's arguments, by name.
            self.linear_attn = GatedDeltaNet(
                config.d_model, **_fields(config.linear), norm_eps=float(config.norm_eps)
            )
        elif config.latent is not None:  # without RoPE (checked by the config)
            self.self_attn = MultiHeadLatentAttention(
                config.d_model,
                config.num_heads,
                **_fields(config.latent),
                rope=None,
                bias=config.qkv_bias,
                window=config.window(layer),
            )
        else:
            spec = config.rope(layer)  # None: a NoPE layer
            num_kv_heads, head_dim = config.heads(layer)  # Gemma 4: wider global layers
            self.self_attn = GroupedQueryAttention(
                config.d_model,
                config.num_heads,
                num_kv_heads,
                head_dim=head_dim,
                bias="qkv" if config.qkv_bias and not config.out_bias else config.qkv_bias,
                rope=None
                if spec is None
                else Rope(spec[0], config.rope_layout, config.rope_dims, spec[1]),
                scores=ScoreRule(
                    scale=config.scale,
                    window=config.window(layer),
                    softcap=config.attn_softcap,
                    temperature=config.temperature if spec is None else None,  # Llama 4
                ),
                qk_norm=None
                if config.qk_norm is None
                else QKNormSpec(
                    config.qk_norm,
                    float(config.norm_eps),
                    traits.norm_unit_offset,
                    traits.value_norm,
                ),
                gates=HeadGates(output_gate=config.attn_output_gate),
                backend=backend_for(config.attn_softcap),
                kv=config.kv(layer),  # Gemma 4: keys as values, or another layer's
            )
        self.chunk = config.chunk(layer)  # Llama 4's chunked attention, or None
        self.kv_source = config.kv_source(layer)  # Gemma 4: the layer whose keys it reads
        self.post_attention_layernorm = _norm(config)
        self.pre_feedforward_layernorm = _norm(config) if traits.sandwich_norms else None
        self.post_feedforward_layernorm = _norm(config) if traits.sandwich_norms else None
        self.mlp: SwiGLU | SparseMoE
        if config.is_moe(layer):
            assert config.moe is not None
            self.mlp = SparseMoE(config.d_model, config.moe)
        else:
            self.mlp = SwiGLU(
                config.d_model,
                config.hidden_dim,
                bias=config.mlp_bias,
                activation=traits.mlp_activation,
            )
        # Gemma 4: the block's output is scaled by a learned number (a buffer, as there).
        self.register_buffer("layer_scalar", torch.ones(1) if traits.layer_scale else None)
        self.layer_scalar: Tensor | None

    def _residual(self, x: Tensor, attn: Tensor) -> Tensor:
        """Add the attention's output, then the MLP's, to the residual stream."""
        pre, post = self.pre_feedforward_layernorm, self.post_feedforward_layernorm
        if pre is None or post is None:
            h = x + attn  # (b, t, d_model)
            mlp = self.mlp(self.post_attention_layernorm(h))
        else:  # Gemma: the outputs are normalised before they are added
            h = x + self.post_attention_layernorm(attn)  # (b, t, d_model)
            mlp = post(self.mlp(pre(h)))
        out: Tensor = h + mlp
        return out if self.layer_scalar is None else out * self.layer_scalar

    def forward(
        self,
        x: Tensor,
        position_embeddings: tuple[Tensor, Tensor] | None,
        cache: LayerCache | None = None,
        attn_mask: Tensor | None = None,
        padding: Tensor | None = None,
    ) -> Tensor:
        """The block on `x` `(b, t, d_model)`; `attn_mask` is the attention layers' mask,
        `padding` `(b, t)` (or None) the new tokens' padding mask for a linear layer."""
        if self.linear_attn is not None:
            state = cast("GatedDeltaNetState | None", cache)  # as check_cache checked
            mixed = self.linear_attn(self.input_layernorm(x), state, padding_mask=padding)
            return self._residual(x, mixed)
        assert self.self_attn is not None
        if self.chunk is not None:  # (a paged view has no one `seen`: never chunked)
            attn_mask = self._within_chunks(x, attn_mask, 0 if cache is None else cache.seen)
        # The model's mask covers every token seen; GQA keeps the columns of the keys it
        # attends to (the last ones, when a rolling cache forgot the oldest).
        attn = self.self_attn(
            self.input_layernorm(x),
            position_embeddings=position_embeddings,
            cache=cast("AttentionCache | None", cache),  # as check_cache checked
            attn_mask=attn_mask,
        )
        return self._residual(x, attn)

    def check_cache(self, cache: object, batch: int, *, name: str, owner: str) -> None:
        """Raise unless `cache` is this block's kind of cache, for `batch` sequences: a
        state for a linear block, an attention cache that fits the window otherwise."""
        if self.linear_attn is not None:
            self.linear_attn.check_state(cache, batch, name=name)
            return
        assert self.self_attn is not None
        self.self_attn.check_cache(cache, name=name, owner=owner, optional=False)

    def _within_chunks(self, x: Tensor, attn_mask: Tensor | None, past: int) -> Tensor | None:
        """The model's mask, within each chunk only (Llama 4's chunked layers)."""
        if self.chunk is None:
            return attn_mask
        t = x.shape[1]
        own = chunked(t, past + t, chunk_size=self.chunk, align="bottom-right", device=x.device)
        return own if attn_mask is None else combine(attn_mask, own)

    def forward_with_weights(
        self, x: Tensor, tables: Tables, attn_mask: Tensor | None, lending: AttentionCache | None
    ) -> tuple[Tensor, Tensor]:
        """`forward` (with no cache but the `lending` of KV sharing, if any) and the
        attention weights `(b, heads, t, t)`."""
        if self.self_attn is None:
            raise ValueError("a linear-attention block has no attention weights")
        attn, weights = self.self_attn(
            self.input_layernorm(x),
            position_embeddings=tables,
            cache=lending,
            attn_mask=self._within_chunks(x, attn_mask, 0),
            need_weights=True,
        )
        return self._residual(x, attn), weights


class Decoder(nn.Module):
    r"""A decoder-only language model of the Llama family, on attnlab's attention.

    Parameters are named as in `LlamaForCausalLM` without its `model.` prefix:
    `embed_tokens`, `layers.{i}.input_layernorm`, `layers.{i}.self_attn.{q,k,v,o}_proj`,
    `layers.{i}.post_attention_layernorm`, `layers.{i}.mlp.{gate,up,down}_proj`, `norm`
    and `lm_head` (the embedding's own weight when `tie_embeddings`). The Gemma family
    adds `layers.{i}.pre_feedforward_layernorm` and `post_feedforward_layernorm`, and
    QK-norm `layers.{i}.self_attn.{q,k}_norm`, as in `Gemma3ForCausalLM`.

    Args:
        config: The sizes and settings.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> config = DecoderConfig(vocab_size=50, d_model=24, num_layers=2, num_heads=4,
        ...                        num_kv_heads=2, head_dim=6, hidden_dim=40)
        >>> model = Decoder(config).eval()
        >>> ids = torch.tensor([[3, 14, 15, 9]])
        >>> model(ids).shape  # a score for every next token, after every token
        torch.Size([1, 4, 50])
        >>> out = model.generate(ids, 5)  # greedy, with a static KV cache
        >>> out.shape, torch.equal(out, model.generate(ids, 5, cache="dynamic"))
        (torch.Size([1, 9]), True)
    """

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        if not isinstance(config, DecoderConfig):
            raise TypeError(f"config must be a DecoderConfig, got {type(config).__name__}")
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(DecoderBlock(config, i) for i in range(config.num_layers))
        self.norm = _norm(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"layers={c.num_layers}, d_model={c.d_model}, heads={c.num_heads}, "
            f"kv_heads={c.num_kv_heads}, vocab={c.vocab_size}"
        )

    def make_cache(
        self,
        batch_size: int = 1,
        max_length: int | None = None,
        *,
        kind: CacheKind = "static",
        rolling: bool = True,
    ) -> list[Any]:
        """One empty cache per layer, on the model's device and in its dtype.

        A sliding-window layer gets a [`RollingKVCache`][attnlab.caches.kv.RollingKVCache]
        (it keeps only the last `window - 1` tokens, whatever `kind`), unless `rolling`
        is False; a linear-attention layer its fixed-size
        [`GatedDeltaNetState`][attnlab.layers.linear.GatedDeltaNetState] (for `batch_size`
        sequences, whatever `kind`); every other layer gets a cache of `kind`. With KV
        sharing (`config.kv_sources`), a layer read by later ones has its cache wrapped in
        a [`SharedKVCache`][attnlab.caches.shared.SharedKVCache], and each layer that reads
        it gets a [`SharedKVReader`][attnlab.caches.shared.SharedKVReader] of it (reset a
        source with its readers).

        Args:
            batch_size: Sequences decoded together (a static cache's batch size).
            max_length: Tokens a static cache holds; default `config.max_positions`.
            kind: `"static"` (preallocated, written in place), `"dynamic"` (grows), or
                `"int8"` or `"int4"` (grows, in 8 or 4 bits: a
                [`QuantizedKVCache`][attnlab.caches.quantized.QuantizedKVCache]; sliding
                layers keep their rolling cache).
            rolling: Whether sliding-window layers get a rolling cache (False: the same
                kind as the others, holding every token).

        Returns:
            A list of `num_layers` caches, to pass as `cache=` to `forward` and `generate`
            (typed `list[Any]` so that code written for attention-only models keeps its
            `KVCache` methods).
        """
        weight = self.embed_tokens.weight
        return _make_caches(self.config, self.layers, batch_size, max_length, kind, rolling, weight)

    # -- the forward pass ----------------------------------------------------------------

    @entry
    def forward(
        self,
        ids: Tensor,
        *,
        cache: Sequence[LayerCache] | None = None,
        positions: Tensor | None = None,
        padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        last_only: bool = False,
        logits_at: Tensor | None = None,
    ) -> Tensor:
        """The logits of the next token after each token of `ids`.

        Args:
            ids: Token ids, `(b, t)` or `(t,)`, integers in `[0, vocab_size)`.
            cache: From [`make_cache`][attnlab.models.decoder.Decoder.make_cache]: the earlier
                tokens' keys and values (or state), one
                [`LayerCache`][attnlab.caches.base.LayerCache] per layer, each of its
                layer's kind; the new ones are appended. Or one view per layer of a paged
                cache of sequences of different lengths (`ragged`), with `positions`.
            positions: Positions of the tokens, `(t,)` or `(b, t)`; default: after the
                cached tokens, counting only real tokens where there is padding.
            padding_mask: `(b, cached + t)`, 1 (True) at real tokens and 0 at padding,
                padding on the left (Hugging Face's `attention_mask`).
            attn_mask: An extra mask for every layer, bool (True = attend) or float,
                broadcastable to `(b, num_heads, t, cached + t)`; combined with the
                causal mask and the padding.
            last_only: Return only the last token's logits, `(b, 1, vocab_size)` (what
                decoding needs: the unembedding is a large matrix).
            logits_at: `(b,)` integer tensor: return only the logits after token
                `logits_at[i]` of row `i`, `(b, 1, vocab_size)` (rows of different real
                lengths, right-padded, as a serving engine batches them); `(b, k)`:
                after tokens `logits_at[i, j]`, `(b, k, vocab_size)` (a row's drafts).

        Returns:
            Logits `(b, t, vocab_size)` (or `(t, vocab_size)` for unbatched `ids`).

        Raises:
            TypeError: If `ids` is not an integer tensor, `cache` not a list of one
                cache per layer of that layer's kind, or `padding_mask` is not a bool or
                integer tensor.
            ValueError: If `ids` is empty, has a token id outside the vocabulary or more
                positions than the model has; the caches do not fit; `padding_mask` has
                the wrong shape, pads on the right or has a row without tokens.
        """
        if checking():
            ids = _check_call(ids, last_only, logits_at, self.config, self.embed_tokens.weight)
        unbatched = ids.ndim == 1
        ids2 = ids[None] if unbatched else ids  # (b, t)
        x = self._embed(ids2)  # (b, t, d_model)
        if checking():
            _check_context(x, cache, positions, padding_mask, attn_mask, self.config, self.layers)
        # A paged cache (ragged) places the tokens by `positions` itself.
        past = 0 if not cache or cache[0].ragged else cache[0].seen
        pad = None if padding_mask is None else padding_mask.bool()  # (b, past + t)
        if positions is None:
            positions = _positions(pad, past, ids2)
        tables, mask = _rope_tables(self.config, positions), _mask(pad, attn_mask, ids2.shape[1])
        # The linear layers' padding (b, t); one new token is never padding: it ends every row.
        padding = None if pad is None or ids2.shape[1] == 1 else pad[:, past:]
        caches = _lending(self.config) if cache is None else cache  # KV sharing needs one
        for layer, layer_cache, table in zip(self.layers, caches, tables, strict=True):
            x = layer(x, table, layer_cache, mask, padding)  # (b, t, d_model)
        logits = self._head(x, last_only, logits_at)
        return logits[0] if unbatched else logits

    def _embed(self, ids: Tensor) -> Tensor:
        x: Tensor = self.embed_tokens(ids)  # (b, t, d_model)
        if self.config.traits.embed_scale:
            # Scaled by sqrt(d_model) rounded to the weights' dtype, as Gemma does.
            x = x * x.new_tensor(self.config.d_model**0.5)
        return x

    def _head(self, x: Tensor, last_only: bool, logits_at: Tensor | None) -> Tensor:
        if logits_at is not None:  # (b,) or (b, k) indices
            rows = torch.arange(x.shape[0], device=x.device)  # (b,)
            x = x[rows[:, None], logits_at] if logits_at.ndim == 2 else x[rows, logits_at][:, None]
        elif last_only:
            x = x[:, -1:]  # (b, 1, d_model)
        logits: Tensor = self.lm_head(self.norm(x))  # (b, t or 1, vocab_size)
        cap = self.config.final_softcap
        if cap is not None:  # Gemma 2: the logits squashed into (-cap, cap)
            logits = torch.tanh(logits / cap) * cap
        return logits

    @entry
    def attention_maps(
        self, ids: Tensor, *, padding_mask: Tensor | None = None, attn_mask: Tensor | None = None
    ) -> list[Tensor]:
        """The attention weights of every layer on `ids`, `(b, num_heads, t, t)` each.

        Computed beside the normal forward, without a cache, under `torch.no_grad()`;
        dropout is not applied. Layers on the `"flash"` backend rebuild them from the
        kernel's log-sum-exp; the others compute them from scratch (fused kernels do not
        return them).

        Args:
            ids: Token ids, `(b, t)` or `(t,)` (then each map is `(num_heads, t, t)`).
            padding_mask: As in `forward`.
            attn_mask: As in `forward`.

        Returns:
            One tensor per layer; row `i` of head `h` is how token `i` spreads its
            attention over the tokens up to it (each row sums to 1).
        """
        c = self.config
        if checking():
            ids = _check_ids(ids, c, self.embed_tokens.weight)
        if c.latent is not None or "linear" in map(c.kind, range(c.num_layers)):
            raise ValueError("a model with linear-attention or MLA layers has no attention maps")
        unbatched = ids.ndim == 1
        ids2 = ids[None] if unbatched else ids  # (b, t)
        maps = []
        with torch.no_grad():
            x = self._embed(ids2)  # (b, t, d_model)
            if checking():
                _check_context(x, None, None, padding_mask, attn_mask, c, self.layers)
            pad = None if padding_mask is None else padding_mask.bool()  # (b, t)
            mask = _mask(pad, attn_mask, ids2.shape[1])
            tables = _rope_tables(c, _positions(pad, 0, ids2))
            for layer, table, lending in zip(self.layers, tables, _lending(c), strict=True):
                assert isinstance(layer, DecoderBlock)
                x, weights = layer.forward_with_weights(x, table, mask, lending)
                maps.append(weights[0] if unbatched else weights)
        return maps

    # -- generation ----------------------------------------------------------------------

    def stream(
        self,
        ids: Tensor,
        max_new_tokens: int,
        *,
        padding_mask: Tensor | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        cache: CacheKind | Sequence[LayerCache] = "static",
        generator: torch.Generator | None = None,
    ) -> Iterator[Tensor]:
        """Generate tokens one at a time: yield each step's new token ids, `(b,)`.

        Same arguments as [`generate`][attnlab.models.decoder.Decoder.generate] (less `on_token`);
        the checks run when the iteration starts. Stops after `max_new_tokens` steps, or
        once every sequence has produced an end token.
        """
        like = self.embed_tokens.weight
        if checking():
            ids = _check_ids(ids, self.config, like)
        ids2 = ids[None] if ids.ndim == 1 else ids  # (b, t)
        b, t = ids2.shape
        steps = check_positive_int("max_new_tokens", max_new_tokens)
        sample = Sampler(temperature, top_k, top_p, generator)
        eos = check_token_id_set("eos_token_id", eos_token_id, self.config.vocab_size)
        pad = pad_token(pad_token_id, eos, self.config.vocab_size)
        caches = _generation_cache(self, cache, b, t, steps)
        past = caches[0].seen
        mask = None
        if padding_mask is not None:
            mask = (
                _check_padding(padding_mask, b, past + t, like)
                if checking()
                else padding_mask.bool()
            )
        _check_room(past, t, steps, self.config.max_positions)
        yield from decode(partial(self._step, caches), ids2, mask, steps, sample, eos, pad)

    @entry
    def _step(
        self, cache: Sequence[LayerCache], ids: Tensor, padding_mask: Tensor | None
    ) -> Tensor:
        """One step of `stream`: an entry with no checks of its own, so that the forward
        trusts what `stream` checked once (the id range and the padding mask are host
        syncs)."""
        return cast(Tensor, self(ids, cache=cache, padding_mask=padding_mask, last_only=True))

    def generate(
        self,
        ids: Tensor,
        max_new_tokens: int,
        *,
        on_token: Callable[[Tensor], object] | None = None,
        **options: Unpack[StreamOptions],
    ) -> Tensor:
        """Continue `ids` by up to `max_new_tokens` tokens, decoding from a KV cache.

        Greedy by default (`temperature=0`: the most likely token, as `transformers`'
        `generate(do_sample=False)`); with `temperature > 0`, sampled from the softmax of
        the logits divided by `temperature`, restricted to the `top_k` most likely tokens
        and then to the smallest set whose probability reaches `top_p` (the order of
        `transformers`' logits warpers). A batch of prompts of different lengths is
        padded on the left, with `padding_mask`; once a sequence produces an end token,
        it gets `pad_token_id` until all are done (then decoding stops).

        Each step runs under `torch.inference_mode()`. A cache passed in therefore holds
        inference tensors afterwards: fine for more decoding or a forward under
        `torch.no_grad()`, not for a forward that autograd records.

        Args:
            ids: Prompt token ids, `(b, t)` or `(t,)`.
            max_new_tokens: Most tokens to add.
            on_token: Called with each step's new tokens `(b,)` as they are produced.
            **options: The keyword arguments of
                [`stream`][attnlab.models.decoder.Decoder.stream], each optional:
                `padding_mask` (`(b, t)`, plus cached tokens, 1 at tokens, 0 at left
                padding); `temperature` (0, the default, for greedy decoding, else the
                softmax temperature); `top_k` (sample only among the `top_k` most likely
                tokens); `top_p` (only among the most likely tokens whose probabilities
                sum to at least `top_p`, in `(0, 1]`: nucleus sampling); `eos_token_id`
                (the token id or ids that end a sequence); `pad_token_id` (what a finished
                sequence gets; default the first end token); `cache` (`"static"`, the
                default, preallocated for prompt plus new tokens, `"dynamic"`, which
                grows, `"int8"` or `"int4"`, which grow in 8 or 4 bits, or a list from
                [`make_cache`][attnlab.models.decoder.Decoder.make_cache], which may hold
                earlier tokens that `ids` continue); `generator` (for sampling).

        Returns:
            `ids` followed by the new tokens, `(b, t + n)` (or `(t + n,)`), `n` at most
            `max_new_tokens`.

        Raises:
            TypeError: As `forward`, or if a sampling setting has the wrong type.
            ValueError: As `forward`; if `max_new_tokens` is not positive, the prompt
                plus `max_new_tokens` is longer than the model's positions or than a
                given static cache, or a sampling setting is out of range.
        """
        tokens = []
        for token in self.stream(ids, max_new_tokens, **options):
            if on_token is not None:
                on_token(token)
            tokens.append(token)
        new = torch.stack(tokens, dim=-1)  # (b, n)
        return torch.cat([ids, new[0] if ids.ndim == 1 else new], dim=-1)

    @classmethod
    def from_hf(cls, model: nn.Module) -> Decoder:
        """A `Decoder` with the weights and settings of a Hugging Face causal LM.

        Accepts `transformers`' `LlamaForCausalLM`, `MistralForCausalLM`,
        `Qwen2ForCausalLM`, `SmolLM3ForCausalLM`, `Gemma2ForCausalLM`,
        `Gemma3ForCausalLM` and `Gemma4ForCausalLM` (text only; Gemma 4 without per-layer
        input embeddings or experts), `Qwen3NextForCausalLM`, `Llama4ForCausalLM` and
        `KimiLinearForCausalLM` with dense MLPs (and subclasses):
        the state dict maps key for key, less the `model.` prefix, as
        [`interop.decoder_from_hf`][attnlab.models.interop.decoder_from_hf] describes.

        Args:
            model: The Hugging Face model.

        Returns:
            A new `Decoder` on the same device and dtype, in the same training mode.

        Raises:
            TypeError: If `model` is not one of the supported classes.
            ValueError: As [`DecoderConfig.from_hf`][attnlab.models.config.DecoderConfig.from_hf].
        """
        from attnlab.models import interop  # it imports every layer, needed only here

        return interop.decoder_from_hf(cls, model)


def _generation_cache(
    model: Decoder, cache: object, batch: int, t: int, steps: int
) -> Sequence[LayerCache]:
    """The caches `stream` decodes with: `cache` checked, or new ones of its kind."""
    if not isinstance(cache, str):
        _check_cache(cache, model.layers, batch)
        return _check_static_room(cast("Sequence[LayerCache]", cache), t, steps)
    if cache not in CACHE_KINDS:
        raise ValueError(
            f"cache must be one of {CACHE_KINDS} or a list from make_cache, got {cache!r}"
        )
    # The last new token is never fed back: t + steps - 1 tokens are cached.
    length = min(t + steps - 1, model.config.max_positions)
    return model.make_cache(batch, max(length, 1), kind=cache)


def _lending(config: DecoderConfig) -> list[AttentionCache | None]:
    """The caches of a forward without one: None for each layer, except that a layer
    whose keys and values later layers read (KV sharing) lends them for the call."""
    lenders = {j: SharedKVCache() for j in set(config.kv_sources or ()) if j is not None}
    return [
        lenders[j].reader() if (j := config.kv_source(i)) is not None else lenders.get(i)
        for i in range(config.num_layers)
    ]


def _fields(sizes: Any) -> dict[str, Any]:
    """A config dataclass's fields by name (not `asdict`, which would turn nested
    dataclasses such as `DeltaGates` into dicts): a layer's keyword arguments."""
    return {f.name: getattr(sizes, f.name) for f in fields(sizes)}


def _norm(config: DecoderConfig) -> nn.Module:
    """The RMSNorm of the family: `weight` (Llama) or `1 + weight` (Gemma, Qwen3-Next)."""
    if config.traits.norm_unit_offset:
        return RMSNorm(config.d_model, float(config.norm_eps), unit_offset=True)
    return nn.RMSNorm(config.d_model, eps=config.norm_eps)


def _make_caches(
    config: DecoderConfig,
    blocks: nn.ModuleList,
    batch_size: int,
    max_length: int | None,
    kind: CacheKind,
    rolling: bool,
    like: Tensor,
) -> list[Any]:
    """The body of `Decoder.make_cache`: the caches on the device and dtype of `like`."""
    check_bool("rolling", rolling)
    if kind not in CACHE_KINDS:
        raise ValueError(f"kind must be one of {CACHE_KINDS}, got {kind!r}")
    length = config.max_positions if max_length is None else max_length
    if kind == "static":  # a dynamic or rolling cache sizes itself
        check_positive_int("max_length", length)
    if kind == "static" and length > config.max_positions:
        raise ValueError(
            f"max_length={length} is past the model's max_positions={config.max_positions}"
        )

    def one(layer: int, block: DecoderBlock) -> LayerCache:
        if block.linear_attn is not None:
            return block.linear_attn.new_state(batch_size)
        window = config.window(layer)
        if rolling and window is not None:
            return RollingKVCache(window)
        if kind in ("int8", "int4"):
            if isinstance(block.self_attn, MultiHeadLatentAttention):
                raise ValueError(f"kind={kind!r}: MLA caches latents, not keys and values")
            if config.heads(layer)[1] % 64:
                raise ValueError(
                    f"kind={kind!r} quantizes values in groups of 64 channels: layer "
                    f"{layer}'s head_dim={config.heads(layer)[1]} is not a multiple of 64"
                )
            return QuantizedKVCache(8 if kind == "int8" else 4)
        if kind == "dynamic":
            return DynamicKVCache()
        if isinstance(block.self_attn, MultiHeadLatentAttention):  # a cache of latents
            return block.self_attn.new_cache(batch_size, length, dtype=like.dtype)
        num_kv_heads, head_dim = config.heads(layer)
        return StaticKVCache(
            batch_size, length, num_kv_heads, head_dim, dtype=like.dtype, device=like.device
        )

    sources = set(config.kv_sources or ())  # KV sharing: the layers read by later ones
    caches: list[Any] = []
    for i, block in enumerate(blocks):
        if (j := config.kv_source(i)) is not None:  # a reader of an earlier layer's cache
            caches.append(caches[j].reader())
        else:
            own = one(i, cast(DecoderBlock, block))
            caches.append(SharedKVCache(cast(AttentionCache, own)) if i in sources else own)
    return caches


# -- the forward pass's tables and mask ---------------------------------------------------


def _positions(pad: Tensor | None, past: int, ids: Tensor) -> Tensor:
    """The tokens' positions after the `past` cached ones, counting only real tokens
    where there is padding, as transformers does."""
    if pad is None:
        return default_positions(past, ids.shape[1], ids.device)  # (t,)
    return (pad.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # (b, t)


def _mask(pad: Tensor | None, attn_mask: Tensor | None, t: int) -> Tensor | None:
    """The attention layers' mask `(b, 1, t, past + t)` of the last `t` tokens under
    the padding `pad` and `attn_mask`; None: causal only."""
    mask = None
    if pad is not None and (t > 1 or not bool(pad.all())):
        # Keys at padding are hidden; a padded query sees itself, so that no row
        # is all masked (softmax of nothing is NaN, which would reach the values).
        mask = padding_attention_mask(pad, t)[:, None]  # (b, 1, t, past + t)
    if attn_mask is not None:
        mask = combine(mask, attn_mask)
    return mask


def _rope_tables(config: DecoderConfig, positions: Tensor) -> list[tuple[Tensor, Tensor] | None]:
    """RoPE's (cos, sin) for every layer, None for a NoPE layer: one table per distinct
    base, scaling and rotated features."""
    kinds = [
        None
        if (rope := config.rope(i)) is None
        else (*rope, config.rope_dims or config.heads(i)[1])
        for i in range(config.num_layers)
    ]  # (base, scaling, dims) or None
    tables = {k: rope_cos_sin(positions, k[2], base=k[0], scaling=k[1]) for k in set(kinds) if k}
    return [None if kind is None else tables[kind] for kind in kinds]  # (..., t, dims // 2)


# -- the checks at the model's boundary ---------------------------------------------------


def _check_ids(ids: object, config: DecoderConfig, like: Tensor) -> Tensor:
    ids = check_token_ids("ids", ids, config.vocab_size)  # the range reads values
    if ids.shape[-1] == 0:
        raise ValueError(f"ids is empty (ids.shape={tuple(ids.shape)}): give at least one token")
    if ids.device != like.device:
        raise ValueError(f"ids is on {ids.device} but the model is on {like.device}")
    return ids


def _check_call(
    ids: object, last_only: object, logits_at: object, config: DecoderConfig, like: Tensor
) -> Tensor:
    """The checks of `forward`'s `ids`, `last_only` and `logits_at`; returns `ids`."""
    ids = _check_ids(ids, config, like)
    check_bool("last_only", last_only)
    if logits_at is None:
        return ids
    b, t = (1, ids.shape[0]) if ids.ndim == 1 else ids.shape
    check_index_tensor("logits_at", logits_at, (1, 2), "(b,) or (b, k)")
    assert isinstance(logits_at, Tensor)
    if logits_at.shape[0] != b:
        raise ValueError(
            f"logits_at must have shape (b,) or (b, k) with b={b}, indices per row, got "
            f"{tuple(logits_at.shape)}"
        )
    check_int_sequence("logits_at", logits_at.flatten(), low=0, high=t, within=f"the t={t} tokens ")
    return ids


def _check_cache(cache: object, blocks: nn.ModuleList, batch: int) -> None:
    """Check a per-layer cache list: one cache per layer, each of its layer's kind,
    for `batch` sequences, all at one position (or all paged views)."""
    if cache is None:
        return
    n = len(blocks)
    if not isinstance(cache, Sequence) or len(cache) != n:
        got = len(cache) if isinstance(cache, Sequence) else type(cache).__name__
        raise TypeError(
            f"cache must be a list of {n} KVCache objects (one per layer, from "
            f"make_cache), got {got}"
        )
    for i, (block, c) in enumerate(zip(blocks, cache, strict=True)):
        cast(DecoderBlock, block).check_cache(c, batch, name=f"cache[{i}]", owner=f"layer {i}")
        j = cast(DecoderBlock, block).kv_source
        if j is not None and cast(SharedKVReader, c).source is not cache[j]:
            raise ValueError(
                f"cache[{i}] must be a reader of cache[{j}] (cache[{j}].reader()): layer {i} "
                f"reads layer {j}'s keys and values"
            )
    layers = cast("Sequence[LayerCache]", cache)
    ragged = {c.ragged for c in layers}
    if ragged == {True}:  # the caller places the tokens of the paged view's sequences
        return
    if len(ragged) != 1:
        raise TypeError("cache must be paged views for every layer or for none")
    for c in layers:
        if c.batch_size is not None and c.batch_size != batch:
            raise ValueError(f"cache holds {c.batch_size} sequences but ids has {batch}")
    seen = {c.seen for c in layers}
    if len(seen) != 1:
        raise ValueError(f"the layers' caches have seen different numbers of tokens {sorted(seen)}")


def _check_padding(mask: object, batch: int, total: int, like: Tensor) -> Tensor:
    return check_padding_mask(mask, batch, total, like=like, what="(b, cached + t)")


def _check_context(
    x: Tensor,
    cache: Sequence[LayerCache] | None,
    positions: Tensor | None,
    padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    config: DecoderConfig,
    blocks: nn.ModuleList,
) -> None:
    """The checks of what comes with the embedded tokens `x` `(b, t, d_model)`: the
    caches, the positions and the masks."""
    b, t, _ = x.shape
    _check_cache(cache, blocks, b)
    if cache and cache[0].ragged:
        if positions is None:
            raise ValueError("positions must be given with a paged cache")
        if padding_mask is not None or attn_mask is not None:
            raise ValueError(
                "a paged cache decides what each query sees: pass no padding_mask or attn_mask"
            )
        check_positions(positions, x, low=0, high=config.max_positions, x_name="ids")
        return
    past = cache[0].seen if cache else 0
    if past + t > config.max_positions:
        raise ValueError(
            f"ids has t={t} tokens after {past} cached: {past + t} positions, past "
            f"the model's max_positions={config.max_positions}"
        )
    if padding_mask is not None:
        _check_padding(padding_mask, b, past + t, x)
    if attn_mask is not None:
        target = (b, config.num_heads, t, past + t)
        check_attn_mask("attn_mask", attn_mask, target, x, query_name="ids")
    if positions is not None:
        check_positions(positions, x, low=0, high=config.max_positions, x_name="ids")


def _check_room(past: int, t: int, steps: int, max_positions: int) -> None:
    """Raise unless the prompt after `past` cached tokens and `steps` new ones fit."""
    if past + t + steps > max_positions:
        raise ValueError(
            f"ids has {t} tokens (after {past} cached) and max_new_tokens={steps}: "
            f"{past + t + steps} positions, past the model's max_positions={max_positions}"
        )


def _check_static_room(caches: Sequence[LayerCache], t: int, steps: int) -> Sequence[LayerCache]:
    """Return `caches` if each holds what `generate` will cache; raise otherwise."""
    past = caches[0].seen
    for c in caches:
        if c.max_length is not None and past + t + steps - 1 > c.max_length:
            raise ValueError(
                f"the static cache holds max_length={c.max_length} tokens but "
                f"{past} cached + {t} in ids + max_new_tokens={steps} - 1 must fit; "
                "make it with a larger max_length"
            )
    return caches
