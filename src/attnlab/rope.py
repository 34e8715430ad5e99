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

- `"half"`: feature $i$ pairs with feature $i + d/2$ (GPT-NeoX, Llama and every
  Hugging Face `rotate_half` model);
- `"interleaved"`: feature $2i$ pairs with feature $2i + 1$ (the paper, GPT-J, Meta's
  original Llama code, DeepSeek's decoupled key).

Both are the same rotations in a permuted basis; the chapter
"Rotary position embeddings" shows it with numbers.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from attnlab._validation import (
    check_choice,
    check_device,
    check_positive_int,
    check_tensor,
    is_validation_enabled,
)

__all__ = ["Layout", "RopeCache", "apply_rope", "rope_angles", "rope_frequencies"]

Layout = Literal["half", "interleaved"]
"""Which features of a head are rotated together: see the module docstring."""

_LAYOUTS: tuple[Layout, ...] = ("half", "interleaved")


def _check_base(base: object) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise TypeError(f"base must be a positive float, got {base!r} ({type(base).__name__})")
    if not base > 1.0 or base == float("inf"):
        raise ValueError(f"base must be a finite float greater than 1, got {base}")
    return float(base)


def _check_head_dim(head_dim: object) -> int:
    d = check_positive_int("head_dim", head_dim)
    if d % 2:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs of features), got {d}")
    return d


def _check_positions(positions: object) -> Tensor:
    if not isinstance(positions, Tensor):
        raise TypeError(f"positions must be a torch.Tensor of ints, got {type(positions).__name__}")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(
            f"positions must have an integer dtype, got {positions.dtype} "
            f"(positions.shape={tuple(positions.shape)})"
        )
    if positions.ndim not in (1, 2):
        raise ValueError(
            f"positions must have 1 dimension (t,) or 2 dimensions (b, t), got {positions.ndim} "
            f"(positions.shape={tuple(positions.shape)})"
        )
    return positions


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
    if is_validation_enabled():
        head_dim, base = _check_head_dim(head_dim), _check_base(base)
        check_device("device", device)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (base**exponents)  # (head_dim/2,)


def rope_angles(positions: Tensor, head_dim: int, *, base: float = 10000.0) -> Tensor:
    r"""The angles $m\,\theta_i$ by which pair $i$ of the vector at position $m$ turns.

    Args:
        positions: Integer positions, `(t,)` or `(b, t)`.
        head_dim: Features per head; even.
        base: See [`rope_frequencies`][attnlab.rope.rope_frequencies].

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
    if is_validation_enabled():
        _check_positions(positions)
    inv_freq = rope_frequencies(head_dim, base=base, device=positions.device)
    return positions[..., None].float() * inv_freq  # (..., t, head_dim/2)


def _broadcast_angles(table: Tensor, x: Tensor) -> Tensor:
    """Shape per-position tables `(t, d/2)` or `(b, t, d/2)` to broadcast against x."""
    if table.ndim == 3 and x.ndim > 3:  # (b, t, d/2) against (b, h, ..., t, d): every head
        return table.view(table.shape[0], *([1] * (x.ndim - 3)), *table.shape[1:])
    return table


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """Rotate the feature pairs of x (..., t, d) by angles whose cos/sin are (..., t, d/2)."""
    if layout == "half":
        x1, x2 = x.chunk(2, dim=-1)  # (..., t, d/2) each: pair i is (x1[i], x2[i])
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    pairs = x.reshape(*x.shape[:-1], -1, 2)  # (..., t, d/2, 2): pair i is (x[2i], x[2i+1])
    x1, x2 = pairs[..., 0], pairs[..., 1]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def _check_x(x: object, positions: Tensor | None) -> Tensor:
    x = check_tensor("x", x)
    if x.ndim < 2:
        raise ValueError(
            f"x must have at least 2 dimensions (..., t, head_dim), got {x.ndim} "
            f"(x.shape={tuple(x.shape)})"
        )
    _check_head_dim(x.shape[-1])
    if positions is not None:
        if positions.shape[-1] != x.shape[-2]:
            raise ValueError(
                f"positions has {positions.shape[-1]} positions but x has {x.shape[-2]} tokens "
                f"(positions.shape={tuple(positions.shape)}, x.shape={tuple(x.shape)})"
            )
        if positions.ndim == 2 and (x.ndim < 3 or positions.shape[0] not in (1, x.shape[0])):
            raise ValueError(
                f"positions of shape (b, t)={tuple(positions.shape)} need x batched with the "
                f"same b first, got x.shape={tuple(x.shape)}"
            )
        if positions.device != x.device:
            raise ValueError(
                f"positions is on {positions.device} but x is on {x.device}; "
                "they must be on the same device"
            )
    return x


def apply_rope(
    x: Tensor,
    positions: Tensor | None = None,
    *,
    base: float = 10000.0,
    layout: Layout = "half",
) -> Tensor:
    r"""Rotate the queries or keys `x` by their positions (rotary position embedding).

    The angles are computed in float32; a float16 or bfloat16 `x` is rotated in float32
    and rounded back once.

    Args:
        x: Queries or keys, `(..., t, head_dim)`: e.g. `(t, d)`, `(b, t, d)` or
            `(b, h, t, d)`.
        positions: Integer position of each token, `(t,)` or `(b, t)` (one row per
            sequence, applied to every head); default `0, 1, ..., t - 1`.
        base: See [`rope_frequencies`][attnlab.rope.rope_frequencies].
        layout: `"half"` (Llama / Hugging Face `rotate_half`) or `"interleaved"` (pairs of
            neighbours, as in the paper).

    Returns:
        The rotated tensor, same shape and dtype as `x`.

    Raises:
        TypeError: If `x` is not a floating-point tensor or `positions` not an integer one.
        ValueError: If `head_dim` is odd, `positions` does not fit `x`'s tokens or batch,
            or `layout` is unknown.

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
    if is_validation_enabled():
        if positions is not None:
            _check_positions(positions)
        x = _check_x(x, positions)
        check_choice("layout", layout, _LAYOUTS)
    if positions is None:
        positions = torch.arange(x.shape[-2], device=x.device)
    angles = _broadcast_angles(rope_angles(positions, x.shape[-1], base=base), x)
    return _rotate(x.float(), angles.cos(), angles.sin(), layout).to(x.dtype)


class RopeCache:
    r"""Precomputed cos and sin of every angle up to `max_positions`, as models keep them.

    A model computes the table once and looks up rows per step; during decoding with a
    KV cache the position of the new token is `cache.length`, and a position past the
    table is an error, not a silent wrap-around.

    Args:
        head_dim: Features per head; even.
        max_positions: Positions `0 ... max_positions - 1` are tabulated.
        base: See [`rope_frequencies`][attnlab.rope.rope_frequencies].
        device: Where to keep the table.

    Attributes:
        cos: float32 `(max_positions, head_dim // 2)`.
        sin: float32 `(max_positions, head_dim // 2)`.

    Examples:
        >>> cache = RopeCache(head_dim=8, max_positions=16)
        >>> x = torch.randn(2, 5, 8)
        >>> pos = torch.arange(3, 8)
        >>> torch.allclose(cache.apply(x, pos), apply_rope(x, pos))
        True
    """

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        *,
        base: float = 10000.0,
        device: torch.device | str | None = None,
    ) -> None:
        self.head_dim = _check_head_dim(head_dim)
        self.max_positions = check_positive_int("max_positions", max_positions)
        self.base = _check_base(base)
        check_device("device", device)
        angles = rope_angles(torch.arange(max_positions, device=device), head_dim, base=base)
        self.cos, self.sin = angles.cos(), angles.sin()  # (max_positions, head_dim/2)

    def __repr__(self) -> str:
        return (
            f"RopeCache(head_dim={self.head_dim}, max_positions={self.max_positions}, "
            f"base={self.base})"
        )

    def apply(
        self, x: Tensor, positions: Tensor | None = None, *, layout: Layout = "half"
    ) -> Tensor:
        """Rotate `x` like [`apply_rope`][attnlab.rope.apply_rope], reading the table.

        Raises:
            ValueError: As `apply_rope`, and if a position is negative or not below
                `max_positions`, or `x`'s head size is not the table's.
        """
        if is_validation_enabled():
            if positions is not None:
                _check_positions(positions)
            x = _check_x(x, positions)
            check_choice("layout", layout, _LAYOUTS)
            if x.shape[-1] != self.head_dim:
                raise ValueError(
                    f"x has head_dim {x.shape[-1]} but the RopeCache was built for "
                    f"head_dim={self.head_dim} (x.shape={tuple(x.shape)})"
                )
        if positions is None:
            positions = torch.arange(x.shape[-2], device=x.device)
        if is_validation_enabled() and positions.numel():
            lo, hi = int(positions.min()), int(positions.max())
            if lo < 0 or hi >= self.max_positions:
                raise ValueError(
                    f"positions must lie in [0, {self.max_positions}) for this RopeCache "
                    f"(max_positions={self.max_positions}), got positions from {lo} to {hi}"
                )
        cos = _broadcast_angles(self.cos.to(x.device)[positions], x)  # (..., t, d/2)
        sin = _broadcast_angles(self.sin.to(x.device)[positions], x)
        return _rotate(x.float(), cos, sin, layout).to(x.dtype)
