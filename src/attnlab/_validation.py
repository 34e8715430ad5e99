"""Input checks shared by every public entry point.

Each helper raises at the package boundary with a message in the user's terms: the
argument's name, what was expected and what came. They are cheap (attribute reads only),
so the fast path keeps them.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "broadcast_shape",
    "check_attn_mask",
    "check_bool",
    "check_choice",
    "check_features",
    "check_min_rank",
    "check_nonnegative_int",
    "check_positive_int",
    "check_probability",
    "check_rank",
    "check_same_dtype_device",
    "check_scale",
    "check_tensor",
]


def _shape(x: Tensor) -> tuple[int, ...]:
    return tuple(x.shape)


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is a positive ``int``; raise otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return value


def check_tensor(name: str, x: object) -> Tensor:
    """Return ``x`` if it is a floating-point tensor; raise ``TypeError`` otherwise."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must have a floating-point dtype, got {x.dtype} "
            f"({name}.shape={_shape(x)}); convert it first, e.g. {name}.float()"
        )
    return x


def check_rank(name: str, x: Tensor, ranks: tuple[int, ...], layout: str) -> None:
    """Raise ``ValueError`` unless ``x.ndim`` is one of ``ranks``."""
    if x.ndim not in ranks:
        allowed = " or ".join(str(r) for r in ranks)
        raise ValueError(
            f"{name} must have {allowed} dimensions {layout}, got {x.ndim} "
            f"({name}.shape={_shape(x)})"
        )


def check_features(name: str, x: Tensor, expected: int, owner: str, param: str) -> None:
    """Raise ``ValueError`` unless the last dimension of ``x`` equals ``expected``."""
    if x.shape[-1] != expected:
        raise ValueError(
            f"{name} has {x.shape[-1]} features but {owner} expects {param}={expected} "
            f"({name}.shape={_shape(x)})"
        )


def check_same_dtype_device(reference: str, ref: Tensor, **others: Tensor | None) -> None:
    """Raise ``ValueError`` if any tensor in ``others`` differs from ``ref`` in dtype or device."""
    for name, other in others.items():
        if other is None:
            continue
        if other.dtype != ref.dtype:
            raise ValueError(
                f"{name} has dtype {other.dtype} but {reference} has dtype {ref.dtype}; "
                "they must match"
            )
        if other.device != ref.device:
            raise ValueError(
                f"{name} is on {other.device} but {reference} is on {ref.device}; "
                "they must be on the same device"
            )


def check_nonnegative_int(name: str, value: object) -> int:
    """Return ``value`` if it is an ``int`` >= 0; raise otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be a non-negative int, got {value!r} ({type(value).__name__})"
        )
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool``; raise ``TypeError`` otherwise."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return value


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of the strings ``choices``; raise ``ValueError`` otherwise."""
    if not isinstance(value, str) or value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def check_probability(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a real number in [0, 1]; raise otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1], got {value!r} ({type(value).__name__})")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return float(value)


def check_scale(name: str, value: object) -> float | None:
    """Return ``value`` as a float if it is None or a finite real number; raise otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float or None, got {value!r} ({type(value).__name__})")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape that ``shapes`` broadcast to, or None if they do not broadcast."""
    try:
        return tuple(torch.broadcast_shapes(*shapes))  # type: ignore[no-untyped-call]
    except RuntimeError:
        return None


def check_min_rank(name: str, x: Tensor, min_rank: int, layout: str) -> None:
    """Raise ``ValueError`` unless ``x`` has at least ``min_rank`` dimensions."""
    if x.ndim < min_rank:
        raise ValueError(
            f"{name} must have at least {min_rank} dimensions {layout}, got {x.ndim} "
            f"({name}.shape={_shape(x)})"
        )


def check_attn_mask(
    name: str, mask: object, target: tuple[int, ...], query: Tensor
) -> Tensor | None:
    """Check an attention mask in the convention of ``scaled_dot_product_attention``.

    The mask must be None, a bool tensor (True = attend) or a float tensor to add to the
    scores (of dtype ``query.dtype`` or float32, as PyTorch accepts), on ``query``'s device,
    and it must broadcast to the shape of the attention weights, ``target``, without
    growing it.
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and mask.dtype not in (query.dtype, torch.float32):
        raise TypeError(
            f"{name} must be a bool tensor (True = attend) or a float tensor of the query's "
            f"dtype {query.dtype} to add to the scores, got {mask.dtype} "
            f"({name}.shape={_shape(mask)})"
        )
    if mask.device != query.device:
        raise ValueError(f"{name} is on {mask.device} but query is on {query.device}")
    if broadcast_shape(tuple(mask.shape), target) != target:
        hint = (
            "; a (b, S) padding mask needs mask[:, None, None, :] to reach (b, 1, 1, S)"
            if mask.ndim == 2 and len(target) == 4
            else ""
        )
        raise ValueError(
            f"{name} of shape {_shape(mask)} does not broadcast to the attention weights' "
            f"shape {target} (batch..., L queries, S keys){hint}"
        )
    return mask
