"""Input checks shared by every public entry point.

Each helper raises at the package boundary with a message in the user's terms: the
argument's name, what was expected and what came. They are cheap (attribute reads only),
so the fast path keeps them.
"""

from __future__ import annotations

from torch import Tensor

__all__ = [
    "check_features",
    "check_positive_int",
    "check_rank",
    "check_same_dtype_device",
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
