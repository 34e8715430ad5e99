r"""Rotary position embedding (RoPE): position enters attention as a rotation of q and k.

RoPE (Su et al., 2021, https://arxiv.org/abs/2104.09864) splits the $d$ features of a
query or key into $d/2$ pairs and rotates pair $i$ of the vector at position $m$ by the
angle $m\,\theta_i$, with frequencies $\theta_i = \text{base}^{-2i/d}$:

$$
\begin{pmatrix} x'_{a} \\ x'_{b} \end{pmatrix} =
\begin{pmatrix} \cos m\theta_i & -\sin m\theta_i \\ \sin m\theta_i & \cos m\theta_i \end{pmatrix}
\begin{pmatrix} x_{a} \\ x_{b} \end{pmatrix}
$$

A rotation keeps lengths, and the dot product of a query rotated by $m\theta$ with a key
rotated by $n\theta$ depends on $m - n$ only: attention scores see relative positions.

Which features form pair $i$ is a convention, and models differ:

- `"half"`: feature $i$ pairs with feature $i + d/2$ (GPT-NeoX and the Llama family:
  Hugging Face's `rotate_half`);
- `"interleaved"`: feature $2i$ pairs with feature $2i + 1$ (the paper, GPT-J, Meta's
  original Llama code, DeepSeek's decoupled key).

Both are the same rotations in a permuted basis; the chapter
"Rotary position embeddings" shows it with numbers.

The rules of RoPE live here and every layer calls them: the base is a finite number
above 1 ([`check_base`][attnlab.rules.rope.check_base]), positions are integers of shape `(t,)`
or `(b, t)` (with `b = 1` broadcast over the batch) and, for layers, non-negative
([`check_positions`][attnlab.rules.rope.check_positions]). A layer computes the cos/sin tables
once per forward ([`rope_cos_sin`][attnlab.rules.rope.rope_cos_sin]) and rotates its queries and
keys with them ([`rotate`][attnlab.rules.rope.rotate]), or takes tables computed once per model
forward, as Hugging Face passes `position_embeddings` to every layer: the
[`Decoder`][attnlab.models.decoder.Decoder] computes one pair per distinct base and scaling of
its layers, for the positions of the call, and hands it to each layer.

Context extension is one rule, in its own module:
[`RopeScaling`][attnlab.rules.rope_scaling.RopeScaling]
changes the frequencies (position interpolation, dynamic NTK, YaRN, Llama 3.1's rule)
and `rope_cos_sin(..., scaling=...)` applies it, for every layer that reads a scaled
Hugging Face config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

import torch
from torch import Tensor

from attnlab.rules._precision import compute_dtype
from attnlab.rules._validation import (
    check_choice,
    check_device,
    check_index_tensor,
    check_positive_int,
    check_tensor,
    checking,
    entry,
    is_real,
    tracing,
)

if TYPE_CHECKING:
    from attnlab.rules.rope_scaling import RopeScaling

_POSITIONS = "(t,) or (b, t)"  # the shapes positions may take

__all__ = [
    "Rope",
    "RopeLayout",
    "apply_rope",
    "check_base",
    "check_cos_sin",
    "check_head_dim",
    "check_layout",
    "check_positions",
    "check_rope",
    "check_rope_dims",
    "check_rope_inputs",
    "default_positions",
    "rope_angles",
    "rope_cos_sin",
    "rope_frequencies",
    "rotate",
]

RopeLayout = Literal["half", "interleaved"]
"""Which features of a head are rotated together: see the module docstring."""


@dataclass(frozen=True)
class Rope:
    """A layer's RoPE, as one object: the layers take `rope=Rope(...)`, or None for NoPE.

    Attributes:
        base: RoPE's base (`rope_theta` of a Hugging Face config); above 1.
        layout: Which features are rotated together: `"half"` (Llama / Hugging Face)
            or `"interleaved"` (see the module docstring).
        dims: How many features of each query and key head are rotated, the first
            ones (partial RoPE: `head_dim * partial_rotary_factor` in GPT-NeoX, StableLM
            or Phi); the rest pass unrotated. None rotates all `head_dim`; even.
        scaling: A context-extension rule for the frequencies
            ([`RopeScaling`][attnlab.rules.rope_scaling.RopeScaling]: Llama 3.1's
            `"llama3"`, `"linear"`, `"dynamic"`, `"yarn"`), or None for plain RoPE.

    Examples:
        >>> Rope(base=500000.0, dims=32).layout
        'half'
    """

    base: float = 10000.0
    layout: RopeLayout = "half"
    dims: int | None = None
    scaling: RopeScaling | None = None


def check_rope(rope: object, head_dim: int, name: str = "rope") -> int:
    """Check a layer's `rope` (a [`Rope`][attnlab.rules.rope.Rope] or None, NoPE) against its
    `head_dim`; return how many features of a head it rotates (0 for None).

    Raises:
        TypeError: If `rope` is not a `Rope` or None, or a field has the wrong type.
        ValueError: If `rope.base` is not above 1, `rope.layout` is unknown, or the
            rotated features (`rope.dims`, else `head_dim`) are odd or above `head_dim`.
    """
    from attnlab.rules.rope_scaling import RopeScaling  # it imports this module

    if rope is None:
        return 0
    if not isinstance(rope, Rope):
        raise TypeError(f"{name} must be a Rope or None (no RoPE), got {type(rope).__name__}")
    check_base(rope.base, f"{name}.base")
    check_layout(rope.layout, f"{name}.layout")
    if rope.scaling is not None and not isinstance(rope.scaling, RopeScaling):
        raise TypeError(
            f"{name}.scaling must be a RopeScaling or None, got {type(rope.scaling).__name__}"
        )
    if rope.dims is None:
        return check_head_dim(head_dim)
    return check_rope_dims(rope.dims, head_dim, f"{name}.dims")


# -- the rules ---------------------------------------------------------------------------


def check_base(base: object, name: str = "base") -> float:
    """Return RoPE's `base` as a float if it is a finite number greater than 1.

    A base of 1 or less gives frequencies that do not decrease (or grow), so no pair
    rotates slowly enough to carry long-range position: every module with RoPE
    (`apply_rope`, `GroupedQueryAttention`, `MultiHeadLatentAttention`, `DecoderConfig`) uses
    this one rule, at construction for the modules.

    Args:
        base: The value to check.
        name: The argument's name in messages (`"rope_base"` for the modules).

    Returns:
        `float(base)`.

    Raises:
        TypeError: If `base` is not a real number (a bool is not).
        ValueError: If it is not finite or not greater than 1.

    Examples:
        >>> check_base(500000)
        500000.0
    """
    if not is_real(base):
        raise TypeError(
            f"{name} must be a float greater than 1, got {base!r} ({type(base).__name__})"
        )
    number = float(base)
    if not 1.0 < number < float("inf"):
        raise ValueError(f"{name} must be a finite float greater than 1, got {base}")
    return number


def check_head_dim(head_dim: object, name: str = "head_dim") -> int:
    """Return `head_dim` if it is a positive even int (RoPE rotates pairs of features).

    Raises:
        TypeError: If it is not an int.
        ValueError: If it is not positive or is odd.

    Examples:
        >>> check_head_dim(64)
        64
    """
    d = check_positive_int(name, head_dim)
    if d % 2:
        raise ValueError(f"{name} must be even (RoPE rotates pairs of features), got {d}")
    return d


def check_rope_dims(rope_dims: object, head_dim: int, name: str = "rope_dims") -> int:
    """Return `rope_dims` if RoPE can rotate that many of a head's `head_dim` features.

    Partial RoPE (Phi, StableLM, GLM, DeepSeek's indexer) rotates the first `rope_dims`
    features of each head and leaves the rest: a positive even int (pairs, as
    [`check_head_dim`][attnlab.rules.rope.check_head_dim] requires), at most `head_dim`.

    Raises:
        TypeError: If it is not an int.
        ValueError: If it is not positive, is odd or exceeds `head_dim`.

    Examples:
        >>> check_rope_dims(16, head_dim=64)
        16
    """
    d = check_head_dim(rope_dims, name)
    if d > head_dim:
        raise ValueError(f"{name} must be at most head_dim={head_dim}, got {name}={d}")
    return d


def default_positions(past: int, t: int, device: torch.device | str | None) -> Tensor:
    """The positions of `t` new tokens when none are given: they continue after the cache.

    `past` tokens are cached (0 without a cache), so the new ones sit at
    `past, ..., past + t - 1`: the rule of every layer and model with RoPE, as Hugging
    Face's default `position_ids` (`cache_position`).

    Returns:
        An int64 tensor `(t,)` on `device`.

    Examples:
        >>> default_positions(5, 3, "cpu")
        tensor([5, 6, 7])
    """
    return torch.arange(past, past + t, device=device)  # (t,)


def check_layout(layout: object, name: str = "layout") -> RopeLayout:
    """Return `layout` if it is `"half"` or `"interleaved"`; raise `ValueError` otherwise.

    Examples:
        >>> check_layout("half")
        'half'
    """
    checked: RopeLayout = check_choice(name, layout, get_args(RopeLayout))  # type: ignore[assignment]
    return checked


def check_positions(
    positions: object,
    x: Tensor,
    *,
    low: int | None = None,
    high: int | None = None,
    x_name: str = "x",
) -> Tensor:
    """Check integer positions of the tokens of `x`; return them.

    `x` holds tokens on its second-to-last axis, `(..., t, features)`, with the batch
    first when it has three or more dimensions. Positions must be an integer tensor on
    `x`'s device of shape `(t,)` (every sequence alike) or `(b, t)` with `b` equal to
    `x.shape[0]` or 1 (one row broadcast over the batch, as Hugging Face's default
    `position_ids`).

    With `low` or `high`, the values must also lie in `[low, high)`: layers pass
    `low=0` (a position counts tokens), a decoder its `max_positions` as `high`. Reading values
    is a **host sync** (the device waits for the host to get the minimum and maximum),
    so it is skipped while `torch.compile` traces or `torch.export` exports
    (`_validation.tracing()`: compiling or exporting), where it would also break the graph.

    Args:
        positions: The positions to check.
        x: The tensor whose tokens they describe.
        low: Smallest allowed position, or None for no bound.
        high: One past the largest allowed position, or None for no bound.
        x_name: The name of `x` in messages.

    Returns:
        `positions`.

    Raises:
        TypeError: If `positions` is not an integer tensor.
        ValueError: If its shape does not fit `x`'s tokens and batch, it is on another
            device, or a value is out of `[low, high)`.

    Examples:
        >>> check_positions(torch.arange(3), torch.randn(2, 3, 8), low=0).tolist()
        [0, 1, 2]
    """
    positions = check_index_tensor("positions", positions, (1, 2), _POSITIONS)
    _check_token_axes("positions", tuple(positions.shape), x, x_name)
    if positions.device != x.device:
        raise ValueError(
            f"positions is on {positions.device} but {x_name} is on {x.device}; "
            "they must be on the same device"
        )
    bounded = low is not None or high is not None
    if bounded and positions.numel() and not tracing():
        _check_range(positions, low, high)
    return positions


def _check_token_axes(name: str, shape: tuple[int, ...], x: Tensor, x_name: str) -> None:
    """A per-token table `(t,)` or `(b, t)` must match x's tokens, and its batch or 1."""
    if shape[-1] != x.shape[-2]:
        raise ValueError(
            f"{name} has {shape[-1]} positions but {x_name} has {x.shape[-2]} tokens "
            f"({name}.shape={shape}, {x_name}.shape={tuple(x.shape)})"
        )
    if len(shape) == 2 and (x.ndim < 3 or shape[0] not in (1, x.shape[0])):
        raise ValueError(
            f"{name} of shape (b, t)={shape} need {x_name} batched with the same b first "
            f"(or b = 1), got {x_name}.shape={tuple(x.shape)}"
        )


def _check_range(positions: Tensor, low: int | None, high: int | None) -> None:
    """Raise if a position is outside `[low, high)`: reads two values (a host sync)."""
    lo, hi = int(positions.min()), int(positions.max())
    if (low is not None and lo < low) or (high is not None and hi >= high):
        if high is None:
            where = "must be non-negative (a position counts the tokens before it)"
        else:
            where = f"must lie in [{0 if low is None else low}, {high})"
        raise ValueError(f"positions {where}, got positions from {lo} to {hi}")


def check_cos_sin(cos_sin: object, x: Tensor, head_dim: int, *, x_name: str = "x") -> None:
    """Check precomputed RoPE tables `(cos, sin)` for the tokens of `x`.

    Two layouts of the tables are accepted: attnlab's, `(..., t, head_dim // 2)` from
    [`rope_cos_sin`][attnlab.rules.rope.rope_cos_sin], and Hugging Face's
    `position_embeddings`, `(b, t, head_dim)` with both halves equal. The leading shape
    follows the rule of [`check_positions`][attnlab.rules.rope.check_positions]: `(t, ...)` or
    `(b, t, ...)` with `b = 1` or `x`'s batch.

    Raises:
        TypeError: If it is not a pair of floating-point tensors.
        ValueError: If their shapes differ from each other or do not fit `x` and
            `head_dim`, or they are on another device.

    Examples:
        >>> cos, sin = rope_cos_sin(torch.arange(3), 8)
        >>> check_cos_sin((cos, sin), torch.randn(2, 3, 32), head_dim=8)
    """
    if not isinstance(cos_sin, (tuple, list)) or len(cos_sin) != 2:
        raise TypeError(
            f"position_embeddings must be a pair (cos, sin) of tensors, got "
            f"{type(cos_sin).__name__}"
        )
    cos = check_tensor("cos", cos_sin[0])
    sin = check_tensor("sin", cos_sin[1])
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have one shape, got cos.shape={tuple(cos.shape)} and "
            f"sin.shape={tuple(sin.shape)}"
        )
    if cos.ndim not in (2, 3) or cos.shape[-1] not in (head_dim // 2, head_dim):
        raise ValueError(
            f"cos and sin must have shape (t, d) or (b, t, d) with d = head_dim // 2 = "
            f"{head_dim // 2} (attnlab) or head_dim = {head_dim} (Hugging Face), got "
            f"cos.shape={tuple(cos.shape)}"
        )
    _check_token_axes("cos", tuple(cos.shape[:-1]), x, x_name)
    if cos.device != x.device or sin.device != x.device:
        raise ValueError(
            f"cos and sin are on {cos.device} and {sin.device} but {x_name} is on {x.device}"
        )


def check_rope_inputs(
    positions: object, position_embeddings: object, x: Tensor, head_dim: int
) -> None:
    """The RoPE arguments of a layer's `forward`: positions, or precomputed tables, or none.

    `positions` follow [`check_positions`][attnlab.rules.rope.check_positions] with `low=0` (a
    position counts tokens: a host sync, skipped while compiling); `position_embeddings`
    follow [`check_cos_sin`][attnlab.rules.rope.check_cos_sin]; giving both is ambiguous. Every
    attention layer with RoPE checks its call with this one rule.

    Raises:
        TypeError: As `check_positions` and `check_cos_sin`.
        ValueError: As those, or if both are given.

    Examples:
        >>> check_rope_inputs(torch.arange(3), None, torch.randn(2, 3, 16), head_dim=8)
    """
    if positions is not None:
        if position_embeddings is not None:
            raise ValueError("pass either positions or position_embeddings, not both")
        check_positions(positions, x, low=0)
    elif position_embeddings is not None:
        check_cos_sin(position_embeddings, x, head_dim)


# -- the computation ---------------------------------------------------------------------


def _frequencies(head_dim: int, base: float | Tensor, device: torch.device | str | None) -> Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (base**exponents)  # (head_dim/2,)


def _angles(positions: Tensor, frequencies: Tensor) -> Tensor:
    return positions[..., None].float() * frequencies.float()  # (..., t, head_dim/2)


@entry
def rope_frequencies(
    head_dim: int, *, base: float = 10000.0, device: torch.device | str | None = None
) -> Tensor:
    r"""The rotation frequencies $\theta_i = \text{base}^{-2i/d}$, one per pair of features.

    Computed in float32 exactly as Hugging Face's Llama does, so that angles agree to the
    last bit.

    Args:
        head_dim: Features per head, $d$; even.
        base: The base of the geometric sequence of wavelengths (Llama 2: 10000,
            Llama 3: 500000).
        device: Where to create the tensor.

    Returns:
        float32 tensor `(head_dim // 2,)`, from 1 down to nearly `1 / base`.

    Raises:
        TypeError: If `head_dim` is not an int or `base` not a number.
        ValueError: If `head_dim` is not positive and even, or `base` is not above 1.

    Examples:
        >>> rope_frequencies(8, base=10000.0)
        tensor([1.0000, 0.1000, 0.0100, 0.0010])
    """
    if checking():
        head_dim, base = check_head_dim(head_dim), check_base(base)
        check_device("device", device)
    return _frequencies(head_dim, base, device)


@entry
def rope_angles(positions: Tensor, head_dim: int, *, base: float = 10000.0) -> Tensor:
    r"""The angles $m\,\theta_i$ by which pair $i$ of the vector at position $m$ turns.

    Args:
        positions: Integer positions, `(t,)` or `(b, t)`.
        head_dim: Features per head; even.
        base: See [`rope_frequencies`][attnlab.rules.rope.rope_frequencies].

    Returns:
        float32 angles of shape `positions.shape + (head_dim // 2,)`.

    Raises:
        TypeError: If `positions` is not an integer tensor.
        ValueError: If `positions` has neither 1 nor 2 dimensions, or `head_dim`/`base`
            are invalid.

    Examples:
        >>> rope_angles(torch.tensor([0, 1, 2]), head_dim=4)
        tensor([[0.0000, 0.0000],
                [1.0000, 0.0100],
                [2.0000, 0.0200]])
    """
    if checking():
        check_index_tensor("positions", positions, (1, 2), _POSITIONS)
        head_dim, base = check_head_dim(head_dim), check_base(base)
    return _angles(positions, _frequencies(head_dim, base, positions.device))


def rope_cos_sin(
    positions: Tensor,
    head_dim: int,
    *,
    base: float = 10000.0,
    frequencies: Tensor | None = None,
    scaling: RopeScaling | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The cos and sin of every angle $m\,\theta_i$: the tables a layer rotates with.

    A layer computes them once per forward and rotates both its queries and its keys
    with [`rotate`][attnlab.rules.rope.rotate]; a model can compute them once for all its
    layers and pass them in (Hugging Face's `position_embeddings`). Angles are float32,
    as in Hugging Face's models, whatever the dtype of the tokens.

    This function does not check its arguments: it is the fast path of layers that
    checked them with [`check_positions`][attnlab.rules.rope.check_positions] and
    [`check_base`][attnlab.rules.rope.check_base]. Use
    [`rope_angles`][attnlab.rules.rope.rope_angles] for a checked computation.

    Args:
        positions: Integer positions, `(t,)` or `(b, t)`.
        head_dim: Features per head; even.
        base: See [`rope_frequencies`][attnlab.rules.rope.rope_frequencies].
        frequencies: The `head_dim // 2` frequencies to use instead of those of `base`
            (e.g. YaRN's scaled ones).
        scaling: A context-extension rule ([`RopeScaling`][attnlab.rules.rope_scaling.RopeScaling])
            applied to the frequencies of `base`, and its attention factor to cos and
            sin; with `"dynamic"`, the frequencies follow the largest of `positions`
            (computed on their device: no host sync).

    Returns:
        `(cos, sin)`, float32, each of shape `positions.shape + (head_dim // 2,)`.

    Examples:
        >>> cos, sin = rope_cos_sin(torch.tensor([0, 2]), 4)
        >>> torch.allclose(torch.atan2(sin, cos), rope_angles(torch.tensor([0, 2]), 4))
        True
    """
    factor = 1.0
    if frequencies is None and scaling is not None and scaling.rope_type != "default":
        seq_len = None
        if scaling.is_dynamic and positions.numel():
            seq_len = positions.max() + 1  # the length this call sees, as transformers
        frequencies = scaling._scaled(head_dim, base, seq_len, positions.device)
        factor = scaling.attention_scaling()
    if frequencies is None:
        frequencies = _frequencies(head_dim, base, positions.device)
    angles = _angles(positions, frequencies.to(positions.device))  # (..., t, head_dim/2)
    if factor != 1.0:
        return angles.cos() * factor, angles.sin() * factor
    return angles.cos(), angles.sin()


def _broadcast_table(table: Tensor, x: Tensor) -> Tensor:
    """Shape per-position tables `(t, d/2)` or `(b, t, d/2)` to broadcast against x."""
    if table.ndim == 3 and x.ndim > 3:  # (b, t, d/2) against (b, h, ..., t, d): every head
        return table.view(table.shape[0], *([1] * (x.ndim - 3)), *table.shape[1:])
    return table


def rotate(x: Tensor, cos: Tensor, sin: Tensor, *, layout: RopeLayout = "half") -> Tensor:
    r"""Rotate the feature pairs of `x` by the angles whose cos and sin are given.

    The rotation runs in `torch.promote_types(x.dtype, torch.float32)`: float16 and
    bfloat16 are rotated in float32 and rounded back once, float64 stays float64 (so
    that gradients check in float64).

    Like [`rope_cos_sin`][attnlab.rules.rope.rope_cos_sin], this does not check its
    arguments (see [`check_cos_sin`][attnlab.rules.rope.check_cos_sin]);
    [`apply_rope`][attnlab.rules.rope.apply_rope] is the checked entry point.

    Args:
        x: Queries or keys, `(..., t, head_dim)`.
        cos: `(t, head_dim // 2)` or `(b, t, head_dim // 2)` (applied to every head of
            `(b, h, t, head_dim)`), or Hugging Face's `(b, t, head_dim)` whose two halves
            are equal.
        sin: Same shape as `cos`.
        layout: `"half"` or `"interleaved"`, see the module docstring.

    Returns:
        The rotated `x`, same shape and dtype.

    Examples:
        >>> x = torch.tensor([[1.0, 0.0]])  # one pair, at angle 0
        >>> cos, sin = rope_cos_sin(torch.tensor([1]), 2)  # turned by 1 radian
        >>> rotate(x, cos, sin)
        tensor([[0.5403, 0.8415]])
    """
    half = x.shape[-1] // 2
    if cos.shape[-1] != half:  # Hugging Face's tables repeat the angles: keep one half
        cos, sin = cos[..., :half], sin[..., :half]
    compute = compute_dtype(x.dtype)
    cos = _broadcast_table(cos, x).to(compute)  # (..., t, d/2)
    sin = _broadcast_table(sin, x).to(compute)
    y = x.to(compute)
    if layout == "half":
        x1, x2 = y.chunk(2, dim=-1)  # (..., t, d/2) each: pair i is (x1[i], x2[i])
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        pairs = y.reshape(*y.shape[:-1], -1, 2)  # (..., t, d/2, 2): pair i is (y[2i], y[2i+1])
        x1, x2 = pairs[..., 0], pairs[..., 1]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return out.to(x.dtype)


def _check_x(x: object) -> Tensor:
    x = check_tensor("x", x)
    if x.ndim < 2:
        raise ValueError(
            f"x must have at least 2 dimensions (..., t, head_dim), got {x.ndim} "
            f"(x.shape={tuple(x.shape)})"
        )
    check_head_dim(x.shape[-1])
    return x


@entry
def apply_rope(
    x: Tensor,
    positions: Tensor | None = None,
    *,
    base: float = 10000.0,
    layout: RopeLayout = "half",
) -> Tensor:
    r"""Rotate the queries or keys `x` by their positions (rotary position embedding).

    The angles are computed in float32 (as Hugging Face's models do); the rotation runs
    in `torch.promote_types(x.dtype, torch.float32)`, so a float16 or bfloat16 `x` is
    rotated in float32 and rounded back once, and a float64 one stays float64.
    Positions may be any integers here (a negative one turns backwards).

    Args:
        x: Queries or keys, `(..., t, head_dim)`: e.g. `(t, d)`, `(b, t, d)` or
            `(b, h, t, d)`.
        positions: Integer position of each token, `(t,)` or `(b, t)` (one row per
            sequence, applied to every head; `b = 1` broadcasts); default
            `0, 1, ..., t - 1`.
        base: See [`rope_frequencies`][attnlab.rules.rope.rope_frequencies].
        layout: `"half"` (the Llama family, Hugging Face's `rotate_half`) or
            `"interleaved"` (pairs of neighbours, as in the paper).

    Returns:
        The rotated tensor, same shape and dtype as `x`.

    Raises:
        TypeError: If `x` is not a floating-point tensor or `positions` not an integer one.
        ValueError: If `head_dim` is odd, `positions` does not fit `x`'s tokens or batch,
            `base` is not above 1, or `layout` is unknown.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> q, k = torch.randn(4, 8), torch.randn(4, 8)
        >>> # the score of q at position 3 with k at position 1 ...
        >>> a = apply_rope(q, torch.tensor([3] * 4)) @ apply_rope(k, torch.tensor([1] * 4)).T
        >>> # ... equals the score of q at 12 with k at 10: only the offset counts
        >>> b = apply_rope(q, torch.tensor([12] * 4)) @ apply_rope(k, torch.tensor([10] * 4)).T
        >>> torch.allclose(a, b, atol=1e-5)
        True
    """
    if checking():
        x = _check_x(x)
        if positions is not None:
            check_positions(positions, x)
        check_layout(layout)
        base = check_base(base)
    if positions is None:
        positions = default_positions(0, x.shape[-2], x.device)  # (t,)
    cos, sin = rope_cos_sin(positions, x.shape[-1], base=base)
    return rotate(x, cos, sin, layout=layout)
