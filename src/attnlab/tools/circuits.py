r"""Reading the circuit of an attention-only
[`TinyTransformer`][attnlab.models.tiny.TinyTransformer].

An attention-only model writes everything it knows into one residual stream: the
embedding, then each head's output, added up. That sum can be taken apart, and each
part tested on its own, as Elhage et al. (2021, "A Mathematical Framework for
Transformer Circuits", https://transformer-circuits.pub/2021/framework/) do for the
two-layer models in which Olsson et al. (2022) study induction heads. This module
holds the tools the chapter "Watching heads learn" uses on the trained model:

- [`residual_components`][attnlab.tools.circuits.residual_components]: the final residual
  stream as the embedding plus one term per head plus the output biases;
- [`ablated`][attnlab.tools.circuits.ablated]: a context manager that removes heads from the
  forward pass (their output set to zero, or to its mean over a reference batch,
  [`mean_context`][attnlab.tools.circuits.mean_context]);
- [`direct_logit_attribution`][attnlab.tools.circuits.direct_logit_attribution]: how much each
  component raises the logit of the token that comes next, through the final LayerNorm
  frozen at its actual scale;
- [`ov_circuit`][attnlab.tools.circuits.ov_circuit] and
  [`copying_scores`][attnlab.tools.circuits.copying_scores]: what a head writes about the token
  it attends to, `vocab x vocab`, and Elhage et al.'s eigenvalue summary of it;
- [`composition_scores`][attnlab.tools.circuits.composition_scores] (with
  [`rotated_composition_baseline`][attnlab.tools.circuits.rotated_composition_baseline], the
  model's own heads turned to random directions, and
  [`composition_baseline`][attnlab.tools.circuits.composition_baseline], Gaussian weights):
  how much a layer-2 head reads, through its queries, keys or values, what a layer-1
  head writes;
- [`phase_change_step`][attnlab.tools.circuits.phase_change_step]: where a recorded loss curve
  falls fastest.

**LayerNorm, folded.** A pre-norm layer reads $\mathrm{LN}(x) = \gamma \odot (x -
\bar{x}) / \sigma + \beta$. In the weight-based quantities (OV circuits, composition) the
centring and $\gamma$ are folded into the matrices that read the stream, $W \to W
\operatorname{diag}(\gamma) C$ with $C = I - \tfrac{1}{d} \mathbf{1}\mathbf{1}^\top$;
the scale $1/\sigma$ (a positive number per token) and the biases $\beta$, $b_V$ are left
out. Every score here is a ratio that a positive scale does not change.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.layers.heads import split_heads
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.models.tiny import Block, TinyTransformer
from attnlab.rules._validation import check_choice, check_positive_int, entry

__all__ = [
    "LogitAttribution",
    "ResidualComponents",
    "ablated",
    "composition_baseline",
    "composition_score",
    "composition_scores",
    "copying_score",
    "copying_scores",
    "direct_logit_attribution",
    "folded_ov",
    "folded_qk",
    "mean_context",
    "ov_circuit",
    "phase_change_step",
    "residual_components",
    "rotated_composition_baseline",
]


# -- checks at the boundary ----------------------------------------------------------------


def _check_model(model: object) -> TinyTransformer:
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a TinyTransformer, got {type(model).__name__}")
    if model.config.mlp:
        raise ValueError(
            "model has MLPs (model.config.mlp=True); the circuit tools read attention-only "
            "models, whose residual stream is the embedding plus the heads' outputs"
        )
    for i, block in enumerate(model.blocks):
        if not isinstance(block, Block) or not isinstance(block.attn, MultiHeadAttention):
            raise TypeError(
                f"model.blocks[{i}] must hold a MultiHeadAttention (block.attn), got "
                f"{type(getattr(block, 'attn', block)).__name__}"
            )
    return model


def _check_head(model: TinyTransformer, layer: object, head: object) -> tuple[int, int]:
    config = model.config
    for name, value, size, what in (
        ("layer", layer, config.num_layers, "num_layers"),
        ("head", head, config.num_heads, "num_heads"),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        if not 0 <= value < size:
            raise ValueError(
                f"{name} must lie in [0, {size}) (the model's {what}={size}), got {value}"
            )
    assert isinstance(layer, int)
    assert isinstance(head, int)
    return layer, head


def _attn(model: TinyTransformer, layer: int) -> tuple[Block, MultiHeadAttention]:
    block = model.blocks[layer]
    assert isinstance(block, Block)
    assert isinstance(block.attn, MultiHeadAttention)
    return block, block.attn


def _head_slice(attn: MultiHeadAttention, head: int) -> slice:
    return slice(head * attn.head_dim, (head + 1) * attn.head_dim)


# -- the residual stream, taken apart ------------------------------------------------------


@dataclass(frozen=True)
class ResidualComponents:
    """The final residual stream of an attention-only model as a sum of parts.

    `embed + heads.sum((0, 1)) + biases.sum(0)` is the input of the final LayerNorm.

    Attributes:
        embed: `(b, t, d_model)`: token plus position embedding.
        heads: `(num_layers, num_heads, b, t, d_model)`: what each head adds, its value
            bias included, `W_O^h z^h`.
        biases: `(num_layers, d_model)`: each layer's output-projection bias.
    """

    embed: Tensor
    heads: Tensor
    biases: Tensor

    def total(self) -> Tensor:
        """The residual stream they add up to, `(b, t, d_model)`."""
        return self.embed + self.heads.sum(dim=(0, 1)) + self.biases.sum(dim=0)


@entry  # the tokens are checked once, by the model's embed; its layers trust them
@torch.no_grad()
def residual_components(model: TinyTransformer, tokens: Tensor) -> ResidualComponents:
    """Split the final residual stream of `model` on `tokens` into embedding and heads.

    Args:
        model: An attention-only `TinyTransformer` (`config.mlp=False`).
        tokens: `(b, t)` integer ids, checked as the model's forward checks them.

    Returns:
        The parts; see [`ResidualComponents`][attnlab.tools.circuits.ResidualComponents].

    Raises:
        TypeError: If `model` is not an attention-only `TinyTransformer` of
            `MultiHeadAttention` blocks, or `tokens` not a 2-d integer tensor.
        ValueError: If the model has MLPs, or `tokens` does not fit it.
    """
    model = _check_model(model)
    x = model.embed(tokens)  # (b, t, d_model), tokens checked here
    embed = x
    heads: list[Tensor] = []
    biases: list[Tensor] = []
    d = x.shape[-1]
    for layer in range(model.config.num_layers):
        block, attn = _attn(model, layer)
        normed = block.norm_attn(x)
        weights = attn.attention_weights(normed, is_causal=True)  # (b, h, t, t)
        v = split_heads(attn.W_value(normed), attn.num_heads)  # (b, h, t, head_dim)
        z = weights @ v  # (b, h, t, head_dim)
        w_o = attn.out_proj.weight.view(d, attn.num_heads, attn.head_dim)  # (d, h, head_dim)
        out = torch.einsum("bhtk,dhk->hbtd", z, w_o)  # (h, b, t, d_model)
        bias = attn.out_proj.bias if attn.out_proj.bias is not None else x.new_zeros(d)
        heads.append(out)
        biases.append(bias)
        x = x + out.sum(dim=0) + bias
    return ResidualComponents(embed, torch.stack(heads), torch.stack(biases))


# -- ablation ------------------------------------------------------------------------------


def _parse_heads(model: TinyTransformer, heads: object) -> list[tuple[int, int]]:
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
        raise TypeError(f"heads must be an iterable of (layer, head) pairs, got {heads!r}")
    parsed = []
    for pair in heads:  # tuples, or lists as a JSON record stores them: [0, 2]
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise TypeError(f"heads must hold (layer, head) pairs, got {pair!r}")
        parsed.append(_check_head(model, *pair))
    return parsed


@contextlib.contextmanager
def ablated(
    model: TinyTransformer,
    heads: Iterable[Sequence[int]],
    *,
    method: str = "zero",
    reference: Tensor | None = None,
) -> Iterator[TinyTransformer]:
    r"""Run `model` with some heads removed, inside a `with` block.

    A head is removed at the input of its layer's output projection: its slice of the
    concatenated head outputs (its context vectors $z^h$) is set to zero (`"zero"`),
    or to the mean of $z^h$ over every sequence and position of `reference`
    (`"mean"`), so that the layer adds $W_O^h \bar{z}^h$, the head's average output,
    whatever the input. Zero ablation equals zeroing the head's columns of $W_O$; mean
    ablation equals that plus adding $W_O^h \bar{z}^h$ to the output bias.

    Args:
        model: An attention-only `TinyTransformer`; it is changed only inside the block
            (by forward hooks, removed on exit).
        heads: `(layer, head)` pairs, 0-based: tuples or any length-2 sequences of
            ints (lists, as a record read from JSON holds them).
        method: `"zero"` or `"mean"`.
        reference: For `"mean"` (refused for `"zero"`): integer tokens `(b, t)` to
            average each head over, or those averages,
            `(num_layers, num_heads, head_dim)`, as
            [`mean_context`][attnlab.tools.circuits.mean_context] returns them (to reuse
            them across calls).

    Yields:
        `model`, with the heads removed.

    Raises:
        TypeError: If `heads` does not hold `(layer, head)` int pairs, or `reference`
            is not a tensor.
        ValueError: If a layer or head is out of range, `method` is unknown,
            `reference` is missing for `"mean"` (or given for `"zero"`), or averages
            of the wrong shape.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> from attnlab.models.tiny import ModelConfig
        >>> model = TinyTransformer(ModelConfig(vocab_size=10, max_len=8, d_model=16))
        >>> tokens = torch.randint(0, 10, (2, 8))
        >>> with ablated(model, [(0, 1)]):
        ...     changed = model(tokens)
        >>> bool((changed != model(tokens)).any())
        True
    """
    model = _check_model(model)
    pairs = _parse_heads(model, heads)
    check_choice("method", method, ("zero", "mean"))
    if method == "mean" and reference is None:
        raise ValueError("method='mean' needs reference tokens to average each head over")
    if method == "zero" and reference is not None:
        raise ValueError("reference is only read by method='mean', not method='zero'")
    means: Tensor | None = None
    if reference is not None:
        if not isinstance(reference, Tensor):
            raise TypeError(
                "reference must be a tensor: (b, t) integer tokens or (num_layers, "
                f"num_heads, head_dim) averages, got {type(reference).__name__}"
            )
        means = reference if reference.is_floating_point() else mean_context(model, reference)
        config, head_dim = model.config, model.config.d_model // model.config.num_heads
        expected = (config.num_layers, config.num_heads, head_dim)
        if tuple(means.shape) != expected:
            raise ValueError(
                f"reference holds averages of shape {tuple(means.shape)} but the model's "
                f"heads need (num_layers, num_heads, head_dim)={expected}"
            )
    handles = []
    try:
        for layer in sorted({layer for layer, _ in pairs}):
            _, attn = _attn(model, layer)
            chosen = {
                h: None if means is None else means[layer, h] for at, h in pairs if at == layer
            }
            handles.append(attn.out_proj.register_forward_pre_hook(_replace(attn, chosen)))
        yield model
    finally:
        for handle in handles:
            handle.remove()


def _replace(attn: MultiHeadAttention, chosen: dict[int, Tensor | None]):  # type: ignore[no-untyped-def]
    def hook(_: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        concat = args[0].clone()  # (b, t, h * head_dim)
        for head, mean in chosen.items():
            concat[..., _head_slice(attn, head)] = 0.0 if mean is None else mean
        return (concat, *args[1:])

    return hook


@torch.no_grad()
def mean_context(model: TinyTransformer, reference: Tensor) -> Tensor:
    """Each head's context vector $z^h$ averaged over every sequence and position.

    What a mean [`ablated`][attnlab.tools.circuits.ablated] head outputs instead of its own.

    Args:
        model: An attention-only `TinyTransformer`, intact.
        reference: `(b, t)` integer tokens.

    Returns:
        `(num_layers, num_heads, head_dim)`.
    """
    model = _check_model(model)
    captured: dict[int, Tensor] = {}
    handles = []
    for layer in range(model.config.num_layers):
        _, attn = _attn(model, layer)

        def capture(_: nn.Module, args: tuple[Tensor, ...], layer: int = layer) -> None:
            captured[layer] = args[0].mean(dim=(0, 1))  # (h * head_dim,)

        handles.append(attn.out_proj.register_forward_pre_hook(capture))
    try:
        model(reference)
    finally:
        for handle in handles:
            handle.remove()
    config = model.config
    means = torch.stack([captured[layer] for layer in range(config.num_layers)])
    return means.view(config.num_layers, config.num_heads, -1)  # (layers, h, head_dim)


# -- direct logit attribution --------------------------------------------------------------


@dataclass(frozen=True)
class LogitAttribution:
    """What each part of the residual stream adds to the logit of the next token.

    Entries are for the prediction at each position `i` of the token at `i + 1`, the
    logit measured against the mean logit over the vocabulary (softmax ignores a shift
    of all logits). `embed + heads.sum((0, 1)) + biases.sum(0) + norm_bias` equals that
    logit.

    Attributes:
        embed: `(b, t - 1)`: the token and position embedding's share.
        heads: `(num_layers, num_heads, b, t - 1)`: each head's.
        biases: `(num_layers, b, t - 1)`: each layer's output bias.
        norm_bias: `(b, t - 1)`: the final LayerNorm's bias.
    """

    embed: Tensor
    heads: Tensor
    biases: Tensor
    norm_bias: Tensor

    def total(self) -> Tensor:
        """The centred logit of the next token, `(b, t - 1)`."""
        return self.embed + self.heads.sum(dim=(0, 1)) + self.biases.sum(dim=0) + self.norm_bias


@torch.no_grad()
def direct_logit_attribution(model: TinyTransformer, tokens: Tensor) -> LogitAttribution:
    r"""Each component's direct contribution to the logit of the token that comes next.

    The final LayerNorm is frozen at the scale $\sigma$ it has on the actual residual
    stream at each position, so that it is linear in the parts: part $c$ contributes
    $u_{y} \cdot (\gamma \odot (c - \bar{c}) / \sigma)$ to the logit of the next token
    $y$, with $u_y$ its unembedding row minus the mean row. "Direct" means through the
    residual stream straight to the unembedding: what a layer-1 head does to layer 2's
    attention is not counted here.

    Args:
        model: An attention-only `TinyTransformer`.
        tokens: `(b, t)` ids, `t >= 2`: the model reads `tokens[:, :-1]` and is scored
            on `tokens[:, 1:]`, as in [`per_position_loss`][attnlab.models.tiny.per_position_loss].

    Returns:
        The attributions; see [`LogitAttribution`][attnlab.tools.circuits.LogitAttribution].

    Raises:
        TypeError: As [`residual_components`][attnlab.tools.circuits.residual_components].
        ValueError: As `residual_components`, or if `tokens` has fewer than 2 positions.
    """
    model = _check_model(model)
    tokens = model.check_tokens(tokens)  # a 2-d integer tensor within the model's sizes
    if tokens.shape[1] < 2:
        raise ValueError(
            f"tokens must be (b, t) with t >= 2 (a token to predict), got "
            f"tokens.shape={tuple(tokens.shape)}"
        )
    parts = residual_components(model, tokens[:, :-1])
    norm = model.norm
    sigma = (parts.total().var(dim=-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    unembed = model.unembed.weight - model.unembed.weight.mean(dim=0)  # (vocab, d)
    target = unembed[tokens[:, 1:]]  # (b, t-1, d): the row of each next token

    def attribute(part: Tensor) -> Tensor:  # (..., b, t-1, d) -> (..., b, t-1)
        centred = part - part.mean(dim=-1, keepdim=True)
        return (norm.weight * centred / sigma * target).sum(dim=-1)

    b, t = target.shape[:2]
    bias = norm.bias if norm.bias is not None else target.new_zeros(target.shape[-1])
    return LogitAttribution(
        embed=attribute(parts.embed),
        heads=attribute(parts.heads),
        biases=attribute(parts.biases[:, None, None, :].expand(-1, b, t, -1)),
        norm_bias=(target * bias).sum(dim=-1),
    )


# -- weights: OV circuits and composition --------------------------------------------------


def _fold_norm(norm: nn.LayerNorm) -> Tensor:
    """`diag(gamma) C`, `(d, d)`: the LayerNorm's centring and gain as one matrix."""
    gain = norm.weight  # the model's LayerNorms have a gain
    d = gain.shape[0]
    centring = torch.eye(d, dtype=gain.dtype, device=gain.device) - 1.0 / d
    return gain[:, None] * centring


@torch.no_grad()
def folded_ov(model: TinyTransformer, layer: int, head: int) -> Tensor:
    r"""The head's OV matrix $W_O^h W_V^h \operatorname{diag}(\gamma) C$, `(d_model, d_model)`.

    What the head writes into the residual stream for each unit of residual stream at
    the position it attends to, with its LayerNorm folded in (scale and biases left
    out; see the module's docstring).

    Raises:
        TypeError, ValueError: If `model` is not attention-only or `layer`/`head` out of
            range.
    """
    model = _check_model(model)
    layer, head = _check_head(model, layer, head)
    block, attn = _attn(model, layer)
    rows = _head_slice(attn, head)
    w_v = attn.W_value.weight[rows]  # (head_dim, d)
    w_o = attn.out_proj.weight[:, rows]  # (d, head_dim)
    return w_o @ w_v @ _fold_norm(block.norm_attn)


@torch.no_grad()
def folded_qk(model: TinyTransformer, layer: int, head: int) -> Tensor:
    r"""The head's bilinear form $W_{QK}$, `(d_model, d_model)`: score $= x_q^\top W_{QK} x_k$.

    $W_{QK} = (W_Q^h F)^\top (W_K^h F)$ with $F = \operatorname{diag}(\gamma) C$ the
    folded LayerNorm; the $1/\sqrt{d_h}$ of the scores, the scale and the biases are left
    out (see the module's docstring).

    Raises:
        TypeError, ValueError: As [`folded_ov`][attnlab.tools.circuits.folded_ov].
    """
    model = _check_model(model)
    layer, head = _check_head(model, layer, head)
    block, attn = _attn(model, layer)
    rows, fold = _head_slice(attn, head), _fold_norm(block.norm_attn)
    w_q = attn.W_query.weight[rows] @ fold  # (head_dim, d)
    w_k = attn.W_key.weight[rows] @ fold  # (head_dim, d)
    return w_q.T @ w_k


@torch.no_grad()
def ov_circuit(model: TinyTransformer, layer: int, head: int) -> Tensor:
    r"""The head's full OV circuit, token to logit: `(vocab, vocab)`.

    Entry `[i, j]` is how much attending to a position that holds token `j` raises the
    logit of token `i`, along the direct path: embedding, the head's values and output,
    the final LayerNorm (folded), the unembedding, $W_U F_{\mathrm{final}} W_{OV}^h
    W_E$. A head that copies has a large diagonal.

    Raises:
        TypeError, ValueError: As [`folded_ov`][attnlab.tools.circuits.folded_ov].
    """
    ov = folded_ov(model, layer, head)
    unembed = model.unembed.weight @ _fold_norm(model.norm)  # (vocab, d)
    return unembed @ ov @ model.token_embedding.weight.T


def copying_score(circuit: Tensor) -> float:
    r"""Elhage et al.'s copying summary of a square matrix: $\sum_i \lambda_i / \sum_i |\lambda_i|$.

    The eigenvalues $\lambda_i$ of an OV circuit say how it maps a token's direction
    onto itself: a positive eigenvalue raises the logit of the token attended to. The
    score is 1 when every eigenvalue is positive (pure copying), −1 when every one is
    negative, and near 0 for a matrix unrelated to copying.

    Args:
        circuit: `(n, n)` real matrix, e.g. [`ov_circuit`][attnlab.tools.circuits.ov_circuit].

    Raises:
        TypeError: If `circuit` is not a floating-point tensor.
        ValueError: If it is not square, holds NaN or infinite entries, or all its
            eigenvalues are 0.

    Examples:
        >>> copying_score(torch.diag(torch.tensor([3.0, 1.0, -1.0])))
        0.6
    """
    if not isinstance(circuit, Tensor) or not circuit.is_floating_point():
        raise TypeError(f"circuit must be a floating-point tensor, got {circuit!r:.60}")
    if circuit.ndim != 2 or circuit.shape[0] != circuit.shape[1]:
        raise ValueError(f"circuit must be a square matrix, got shape {tuple(circuit.shape)}")
    if not bool(torch.isfinite(circuit).all()):
        raise ValueError("circuit has NaN or infinite entries: no copying score is defined")
    eigenvalues = torch.linalg.eigvals(circuit.double())
    magnitude = float(eigenvalues.abs().sum())
    if magnitude == 0.0:
        raise ValueError("circuit has only zero eigenvalues: no copying score is defined")
    return float(eigenvalues.sum().real) / magnitude


@torch.no_grad()
def copying_scores(model: TinyTransformer) -> Tensor:
    """[`copying_score`][attnlab.tools.circuits.copying_score] of every head's OV circuit.

    The `vocab x vocab` circuit has rank at most `head_dim`; its nonzero eigenvalues
    are those of the `head_dim x head_dim` product of its two factors taken in the other
    order, which is what is computed.

    Returns:
        `(num_layers, num_heads)` float64 scores in [−1, 1].
    """
    model = _check_model(model)
    config = model.config
    unembed = model.unembed.weight @ _fold_norm(model.norm)  # (vocab, d)
    scores = torch.empty(config.num_layers, config.num_heads, dtype=torch.float64)
    for layer in range(config.num_layers):
        block, attn = _attn(model, layer)
        embed = model.token_embedding.weight @ _fold_norm(block.norm_attn).T  # (vocab, d)
        for head in range(config.num_heads):
            rows = _head_slice(attn, head)
            left = unembed @ attn.out_proj.weight[:, rows]  # (vocab, head_dim)
            right = attn.W_value.weight[rows] @ embed.T  # (head_dim, vocab)
            scores[layer, head] = copying_score(right @ left)
    return scores


def composition_score(left: Tensor, right: Tensor) -> float:
    r"""$\|A B\|_F / (\|A\|_F \|B\|_F)$: how much of what `right` writes `left` reads.

    $\|M\|_F = (\sum_{ij} M_{ij}^2)^{1/2}$ is the Frobenius norm. The score is 0 when
    `left` reads only directions that `right` never writes (Elhage et al., 2021), and at
    most 1, which it reaches only when `left` has rank one and `right` writes along
    the one direction it reads. Matrices of higher rank score less even when perfectly
    aligned: two equal projections onto $r$ dimensions score $1/\sqrt{r}$ (0.25 for
    the 16-dimensional heads of the chapter's model).

    Args:
        left: `(n, d)`: the reading matrix ($A$).
        right: `(d, m)`: the writing matrix ($B$).

    Raises:
        TypeError: If either is not a 2-d floating-point tensor.
        ValueError: If their inner sizes differ, either holds NaN or infinite entries,
            or either is all zeros.

    Examples:
        >>> a = torch.tensor([[1.0, 0.0], [0.0, 0.0]])  # reads, and writes, coordinate 0
        >>> b = torch.tensor([[0.0, 0.0], [0.0, 1.0]])  # writes coordinate 1
        >>> composition_score(a, a), composition_score(a, b)
        (1.0, 0.0)
        >>> round(composition_score(torch.eye(4), torch.eye(4)), 3)  # rank 4: 1 / sqrt(4)
        0.5
    """
    for name, m in (("left", left), ("right", right)):
        if not isinstance(m, Tensor) or not m.is_floating_point() or m.ndim != 2:
            raise TypeError(f"{name} must be a 2-d floating-point tensor, got {m!r:.60}")
    if left.shape[1] != right.shape[0]:
        raise ValueError(
            f"left has {left.shape[1]} columns but right has {right.shape[0]} rows "
            f"(left.shape={tuple(left.shape)}, right.shape={tuple(right.shape)})"
        )
    for name, m in (("left", left), ("right", right)):
        if not bool(torch.isfinite(m).all()):
            raise ValueError(f"{name} has NaN or infinite entries: no composition score is defined")
    denominator = float(torch.linalg.matrix_norm(left) * torch.linalg.matrix_norm(right))
    if denominator == 0.0:
        raise ValueError("left or right is all zeros: no composition score is defined")
    return float(torch.linalg.matrix_norm(left @ right)) / denominator


_KINDS = ("q", "k", "v")


def _compose_batched(kind: str, qk: Tensor, ov_later: Tensor, ov_earlier: Tensor) -> Tensor:
    """Composition scores of stacks of matrices `(..., d, d)`, broadcast together."""
    if kind == "k":  # the keys read what the earlier head wrote: x_q^T W_QK (W_OV x)
        left = qk
    elif kind == "q":  # the queries read it: (W_OV x)^T W_QK x_k
        left = qk.transpose(-1, -2)
    else:  # the values read it
        left = ov_later
    fro = torch.linalg.matrix_norm
    scores: Tensor = fro(left @ ov_earlier) / (fro(left) * fro(ov_earlier))
    return scores


@torch.no_grad()
def composition_scores(
    model: TinyTransformer, kind: str = "k", *, earlier: int = 0, later: int = 1
) -> Tensor:
    r"""Composition scores between every head of layer `earlier` and of layer `later`.

    For a head $j$ of the later layer and a head $i$ of the earlier one (Elhage et al.,
    2021): K-composition $\|W_{QK}^{j} W_{OV}^{i}\|_F / (\|W_{QK}^{j}\|_F
    \|W_{OV}^{i}\|_F)$, Q-composition the same with $W_{QK}^{j\top}$, V-composition with
    $W_{OV}^{j}$ (each the [`composition_score`][attnlab.tools.circuits.composition_score] of
    the pair), from [`folded_qk`][attnlab.tools.circuits.folded_qk] and
    [`folded_ov`][attnlab.tools.circuits.folded_ov]. What counts as high is set by the same
    heads with their output turned to random directions,
    [`rotated_composition_baseline`][attnlab.tools.circuits.rotated_composition_baseline], or
    by random matrices of the same shapes,
    [`composition_baseline`][attnlab.tools.circuits.composition_baseline].

    Args:
        model: An attention-only `TinyTransformer`.
        kind: `"k"`, `"q"` or `"v"`.
        earlier: The writing layer (0-based).
        later: The reading layer, after `earlier`.

    Returns:
        `(num_heads, num_heads)`: row `i` a head of `earlier`, column `j` a head of
        `later`.

    Raises:
        TypeError, ValueError: If `model` is not attention-only, `kind` unknown, or the
            layers out of range or not in order.
    """
    model = _check_model(model)
    check_choice("kind", kind, _KINDS)
    _check_head(model, earlier, 0)
    _check_head(model, later, 0)
    if not earlier < later:
        raise ValueError(f"earlier must be before later, got earlier={earlier}, later={later}")
    heads = range(model.config.num_heads)
    ov_earlier = torch.stack([folded_ov(model, earlier, i) for i in heads])  # (h, d, d)
    qk = torch.stack([folded_qk(model, later, j) for j in heads])  # (h, d, d)
    ov_later = torch.stack([folded_ov(model, later, j) for j in heads])  # (h, d, d)
    # rows: the earlier head i, columns: the later head j
    return _compose_batched(kind, qk[None], ov_later[None], ov_earlier[:, None])


@torch.no_grad()
def rotated_composition_baseline(
    model: TinyTransformer,
    kind: str = "k",
    *,
    earlier: int = 0,
    later: int = 1,
    samples: int = 1000,
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""Composition scores of the model's own heads with the earlier heads' output turned.

    Each sample multiplies every earlier head's $W_{OV}^{i}$ from the left by a random
    rotation $R$ (a Haar-distributed orthogonal matrix, drawn afresh per sample and
    head) and scores it against the later heads as
    [`composition_scores`][attnlab.tools.circuits.composition_scores] does. $R W_{OV}^{i}$
    writes with the same singular values as the head itself, only into random
    directions, so this is the level of "no composition" for these very matrices;
    [`composition_baseline`][attnlab.tools.circuits.composition_baseline], with Gaussian
    matrices, ignores how unevenly a trained head spreads its weight over its
    directions, which widens the random range. Whatever the spectra, the mean squared
    score is $1/d_{\mathrm{model}}$.

    Args:
        model: An attention-only `TinyTransformer`.
        kind: `"k"`, `"q"` or `"v"`.
        earlier: The writing layer (0-based).
        later: The reading layer, after `earlier`.
        samples: Rotations per pair of heads.
        generator: Seeds the rotations.

    Returns:
        `(samples, num_heads, num_heads)`: the samples of each pair, laid out as in
        `composition_scores` (row: earlier head, column: later head).

    Raises:
        TypeError, ValueError: As `composition_scores`, or if `samples` is not a
            positive int.
    """
    model = _check_model(model)
    check_choice("kind", kind, _KINDS)
    check_positive_int("samples", samples)
    _check_head(model, earlier, 0)
    _check_head(model, later, 0)
    if not earlier < later:
        raise ValueError(f"earlier must be before later, got earlier={earlier}, later={later}")
    heads, d = range(model.config.num_heads), model.config.d_model
    ov_earlier = torch.stack([folded_ov(model, earlier, i) for i in heads])  # (h, d, d)
    qk = torch.stack([folded_qk(model, later, j) for j in heads])  # (h, d, d)
    ov_later = torch.stack([folded_ov(model, later, j) for j in heads])  # (h, d, d)
    rows = []
    for i in heads:  # one earlier head at a time: (samples, h, d, d) products at most
        q, r = torch.linalg.qr(torch.randn(samples, d, d, generator=generator))
        # Signs of r's diagonal into q make q Haar-distributed (Mezzadri, 2007).
        rotation = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
        turned = rotation.to(ov_earlier.dtype) @ ov_earlier[i]  # (samples, d, d)
        rows.append(_compose_batched(kind, qk[None], ov_later[None], turned[:, None]))
    return torch.stack(rows, dim=1)  # (samples, h earlier, h later)


def composition_baseline(
    d_model: int,
    head_dim: int,
    kind: str = "k",
    *,
    samples: int = 1000,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Composition scores of random heads: the level that means "no composition".

    Each sample draws Gaussian $W_Q, W_K, W_V$ (`head_dim x d_model`) and $W_O$
    (`d_model x head_dim`) for two heads and scores them as
    [`composition_scores`][attnlab.tools.circuits.composition_scores] does. Random low-rank
    maps still overlap a little, so the baseline is well above 0.

    Returns:
        `(samples,)` scores.
    """
    check_positive_int("d_model", d_model)
    check_positive_int("head_dim", head_dim)
    check_positive_int("samples", samples)
    check_choice("kind", kind, _KINDS)
    w = torch.randn(samples, 4, head_dim, d_model, generator=generator)  # W_Q, W_K, 2 W_V
    o = torch.randn(samples, 2, d_model, head_dim, generator=generator)  # 2 W_O
    qk = w[:, 0].transpose(-1, -2) @ w[:, 1]  # (samples, d, d)
    ov_earlier, ov_later = o[:, 0] @ w[:, 2], o[:, 1] @ w[:, 3]  # (samples, d, d)
    return _compose_batched(kind, qk, ov_later, ov_earlier)


# -- the loss curve ------------------------------------------------------------------------


def phase_change_step(steps: list[int], values: list[float]) -> int:
    """The recorded step at which `values` fell the most since the previous record.

    Args:
        steps: Steps of the records, increasing.
        values: A value per step (e.g. the second-half loss); for a curve that rises
            (a head score), pass its negation.

    Returns:
        The later step of the steepest falling interval, per step elapsed.

    Raises:
        ValueError: If the lists differ in length, have fewer than 2 entries, the
            steps do not increase, or a value is NaN or infinite (a diverged run has no
            phase change to find).

    Examples:
        >>> phase_change_step([0, 10, 20, 30], [4.0, 3.9, 2.0, 1.8])
        20
    """
    if len(steps) != len(values) or len(steps) < 2:
        raise ValueError(
            f"steps and values must have the same length, at least 2, got {len(steps)} "
            f"and {len(values)}"
        )
    if any(b <= a for a, b in itertools.pairwise(steps)):
        raise ValueError(f"steps must increase, got {steps}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"values must be finite numbers, got {values}")
    drops = [(values[i - 1] - values[i]) / (steps[i] - steps[i - 1]) for i in range(1, len(steps))]
    return steps[1 + max(range(len(drops)), key=drops.__getitem__)]
