r"""A tiny decoder-only transformer, and the task that makes its heads learn to copy.

The model is built from the package's own
[`MultiHeadAttention`][attnlab.MultiHeadAttention]: token and learned position
embeddings, pre-norm residual blocks of causal self-attention (and, optionally, an MLP),
a final LayerNorm and an unembedding. Two attention-only layers are enough for the
circuit this module is about: **induction heads** (Olsson et al., 2022,
https://arxiv.org/abs/2209.11895). On a sequence of random tokens repeated once, the
second copy can be predicted only by finding the earlier occurrence of the current token
and copying the token that followed it. A *previous-token head* in layer 1 writes into
each position which token came before it; an *induction head* in layer 2 uses that to
attend from the current token to the position right after its earlier occurrence.

[`head_scores`][attnlab.models.tiny.head_scores] measures both behaviours per head from the
attention weights; the chapter "Watching heads learn" trains the model
(`python -m attnlab.tools.train`) and shows them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import cast

import torch
from torch import Tensor, nn

from attnlab.layers.gqa import GroupedQueryAttention
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.rules._validation import (
    check_positive_int,
    check_token_ids,
    checking,
    entry,
)
from attnlab.rules.sizes import Sizes, size

__all__ = [
    "Block",
    "HeadScores",
    "ModelConfig",
    "TinyTransformer",
    "head_scores",
    "per_position_loss",
    "repeated_tokens",
]


@dataclass(frozen=True)
class ModelConfig(Sizes):
    """Sizes of a [`TinyTransformer`][attnlab.models.tiny.TinyTransformer].

    Attributes:
        vocab_size: Number of distinct tokens.
        max_len: Longest sequence the position embedding covers.
        d_model: Features per token in the residual stream.
        num_heads: Attention heads per layer.
        num_layers: Number of blocks.
        mlp: Whether each block has an MLP after its attention (attention-only if False).
    """

    vocab_size: int = 64
    max_len: int = 48
    d_model: int = size(64, multiple_of="num_heads")
    num_heads: int = 4
    num_layers: int = 2
    mlp: bool = False

    def to_dict(self) -> dict[str, int | bool]:
        """The sizes as a plain dict, e.g. for a JSON record."""
        return asdict(self)


class Block(nn.Module):
    """One layer of [`TinyTransformer`][attnlab.models.tiny.TinyTransformer], pre-norm.

    `x + attn(norm_attn(x))`, then `x + mlp(norm_mlp(x))` when the config has an MLP.
    `attn` is a causal [`MultiHeadAttention`][attnlab.MultiHeadAttention]; its input
    is not checked again (the model checks its tokens once, at its boundary).

    Args:
        config: The model's sizes.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.norm_attn = nn.LayerNorm(d)
        self.attn = MultiHeadAttention(d, d, config.num_heads)
        self.mlp: nn.Module | None = None
        if config.mlp:
            self.norm_mlp = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: Tensor) -> Tensor:
        attended = self.attn(self.norm_attn(x), is_causal=True)
        assert isinstance(attended, Tensor)  # need_weights=False: the output alone
        x = x + attended  # (b, t, d_model)
        if self.mlp is not None:
            x = x + self.mlp(self.norm_mlp(x))
        return x


class TinyTransformer(nn.Module):
    """A small GPT-style language model made of attnlab's attention.

    Args:
        config: The sizes; see [`ModelConfig`][attnlab.models.tiny.ModelConfig].

    Shapes:
        tokens: `(b, t)` integer ids with `t <= max_len`. Output logits: `(b, t, vocab_size)`.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> model = TinyTransformer(ModelConfig(vocab_size=10, max_len=8, d_model=16))
        >>> model(torch.randint(0, 10, (3, 8))).shape
        torch.Size([3, 8, 10])
        >>> [w.shape for w in model.attention_maps(torch.randint(0, 10, (3, 8)))]
        [torch.Size([3, 4, 8, 8]), torch.Size([3, 4, 8, 8])]
    """

    def __init__(self, config: ModelConfig | None = None) -> None:
        super().__init__()
        self.config = config = ModelConfig() if config is None else config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.max_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.unembed = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def check_tokens(self, tokens: object) -> Tensor:
        """`tokens`, checked: a 2-d integer tensor `(b, t)` that the model can embed.

        Raises:
            TypeError: If `tokens` is not a 2-d integer tensor.
            ValueError: If it has more positions than `max_len`, or an id outside
                `[0, vocab_size)`. That range check reads the ids, a **host sync**,
                and is skipped while `torch.compile` traces or `torch.export` exports.
        """
        vocab = self.config.vocab_size
        # Type and rank first, so that an ill-typed tensor is named before its length.
        tokens = check_token_ids("tokens", tokens, vocab, ranks=(2,), layout="(b, t)")
        t, max_len = tokens.shape[1], self.config.max_len
        if t > max_len:
            raise ValueError(
                f"tokens has {t} positions but the model's position embedding has "
                f"max_len={max_len} (tokens.shape={tuple(tokens.shape)})"
            )
        return tokens

    def embed(self, tokens: Tensor) -> Tensor:
        """The residual stream the first block reads: token plus position embeddings.

        Args:
            tokens: Integer ids `(b, t)`, checked as
                [`check_tokens`][attnlab.models.tiny.TinyTransformer.check_tokens] does (when
                validation is on).

        Returns:
            `(b, t, d_model)`.
        """
        if checking():
            tokens = self.check_tokens(tokens)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x: Tensor = self.token_embedding(tokens) + self.position_embedding(positions)
        return x  # (b, t, d_model)

    @entry
    def forward(self, tokens: Tensor) -> Tensor:
        """Next-token logits `(b, t, vocab_size)` for integer `tokens` `(b, t)`.

        Raises:
            TypeError: As [`check_tokens`][attnlab.models.tiny.TinyTransformer.check_tokens].
            ValueError: As `check_tokens` (its range check reads the ids, a host sync).
        """
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        logits: Tensor = self.unembed(self.norm(x))
        return logits

    @entry
    @torch.no_grad()
    def attention_maps(self, tokens: Tensor) -> list[Tensor]:
        """The causal attention weights of every layer, `(b, num_heads, t, t)` each.

        They are the weights the forward pass uses (the model has no dropout), read
        with [`MultiHeadAttention.attention_weights`][attnlab.MultiHeadAttention].
        """
        x = self.embed(tokens)
        maps = []
        for block in self.blocks:
            assert isinstance(block, Block)
            maps.append(_attention_weights(block.attn, block.norm_attn(x)))
            x = block(x)
        return maps


def _attention_weights(attn: nn.Module, x: Tensor) -> Tensor:
    """A block's causal attention weights `(b, num_heads, t, t)`: its
    `MultiHeadAttention`'s, or those a `GroupedQueryAttention` returns with its output
    (the gated blocks of `attnlab.tools.train`)."""
    if isinstance(attn, GroupedQueryAttention):
        _, weights = attn(x, need_weights=True)
        return cast(Tensor, weights)
    assert isinstance(attn, MultiHeadAttention)
    return attn.attention_weights(x, is_causal=True)


def repeated_tokens(
    batch_size: int, half: int, vocab_size: int, *, generator: torch.Generator | None = None
) -> Tensor:
    """Random token sequences repeated once: `r_1 ... r_half r_1 ... r_half`.

    The first half is unpredictable (uniform random tokens); every token of the second
    half is predictable by copying, if the model finds the first occurrence.

    Args:
        batch_size: Number of sequences.
        half: Length of the random part; the sequences have `2 * half` tokens.
        vocab_size: Tokens are drawn from `0 ... vocab_size - 1`.
        generator: Random generator, for reproducible batches.

    Returns:
        int64 tensor `(batch_size, 2 * half)`.

    Examples:
        >>> x = repeated_tokens(2, 3, 10, generator=torch.Generator().manual_seed(0))
        >>> bool((x[:, :3] == x[:, 3:]).all())
        True
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("half", half)
    check_positive_int("vocab_size", vocab_size)
    first = torch.randint(0, vocab_size, (batch_size, half), generator=generator)
    return torch.cat([first, first], dim=1)  # (b, 2 * half)


def per_position_loss(model: nn.Module, tokens: Tensor) -> Tensor:
    """Cross-entropy of predicting token `i + 1` from tokens `0..i`, averaged over the batch.

    `model` maps token ids `(b, t)` to logits `(b, t, vocab)`: a
    [`TinyTransformer`][attnlab.models.tiny.TinyTransformer] or a real model's
    [`Decoder`][attnlab.models.decoder.Decoder].

    Returns:
        `(t - 1,)`: entry `i` is the loss of the prediction made at position `i`.
    """
    logits: Tensor = model(tokens[:, :-1])  # (b, t-1, vocab)
    loss = nn.functional.cross_entropy(
        logits.transpose(1, 2), tokens[:, 1:], reduction="none"
    )  # (b, t-1)
    return loss.mean(dim=0)


@dataclass(frozen=True)
class HeadScores:
    """How much each head behaves as a previous-token, an induction and a first-token head.

    Attributes:
        previous_token: `(num_layers, num_heads)`: mean weight that a query puts on the
            token right before it (positions 1 onwards).
        induction: `(num_layers, num_heads)`: mean weight that a query of the second half
            puts on the token right *after* the earlier occurrence of its own token.
        first_token: `(num_layers, num_heads)`: mean weight that a query puts on the
            first token of the sequence (positions 1 onwards; position 0 has no other
            choice). Trained LLMs park much of their attention there, an *attention
            sink* (Xiao et al., 2023, https://arxiv.org/abs/2309.17453).
    """

    previous_token: Tensor
    induction: Tensor
    first_token: Tensor


def head_scores(maps: list[Tensor], half: int) -> HeadScores:
    r"""Score every head on sequences made by
    [`repeated_tokens`][attnlab.models.tiny.repeated_tokens].

    For a query at position $i$ the previous-token score reads its weight on key $i-1$;
    for $i \ge$ `half` the induction score reads its weight on key $i - \text{half} + 1$,
    the position after the same token's first occurrence; the first-token score reads
    its weight on key 0. Each is averaged over the queries and the batch; 1 means the
    head looks nowhere else.

    Args:
        maps: Attention weights per layer, `(b, num_heads, 2 * half, 2 * half)` each, as
            returned by [`TinyTransformer.attention_maps`][attnlab.models.tiny.TinyTransformer].
        half: Length of the repeated part.

    Returns:
        The three score tables.

    Examples:
        >>> t = 6
        >>> prev = torch.eye(t).roll(-1, dims=1).tril()  # each query on its predecessor
        >>> prev[0, 0] = 1.0
        >>> scores = head_scores([prev.expand(1, 1, t, t)], half=3)
        >>> scores.previous_token, scores.first_token  # query 1's predecessor is key 0
        (tensor([[1.]]), tensor([[0.2000]]))
    """
    previous, induction, first = [], [], []
    for weights in maps:
        t = weights.shape[-1]
        if t != 2 * half:
            raise ValueError(f"maps have {t} positions but half={half} needs {2 * half}")
        w = weights.mean(dim=0)  # (h, t, t): averaged over the batch
        queries = torch.arange(1, t)
        previous.append(w[:, queries, queries - 1].mean(dim=-1))  # (h,)
        second = torch.arange(half, t)
        induction.append(w[:, second, second - half + 1].mean(dim=-1))  # (h,)
        first.append(w[:, queries, 0].mean(dim=-1))  # (h,)
    return HeadScores(torch.stack(previous), torch.stack(induction), torch.stack(first))
