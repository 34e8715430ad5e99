"""Settings made of sizes and switches, checked when they are made, with their rules as data.

A model's sizes ([`ModelConfig`][attnlab.models.tiny.ModelConfig]) and a benchmark's
settings (`attnlab.tools.bench`) are frozen dataclasses of positive ints, tuples of them
and bools. [`Sizes`][attnlab.rules.sizes.Sizes] checks every field by the kind of its
default, and a field declared with [`size`][attnlab.rules.sizes.size] adds its one further
rule (a least value, or a multiple of a number or of another field) where it is declared,
instead of in a `__post_init__` of each class.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from attnlab.rules._validation import check_bool, check_multiple, check_positive_int

__all__ = ["Sizes", "size"]

S = TypeVar("S", int, tuple[int, ...])


def size(
    default: S, *, at_least: int = 1, multiple_of: int | str | None = None, why: str = ""
) -> S:
    """A field of a [`Sizes`][attnlab.rules.sizes.Sizes] with a rule beyond "positive".

    Args:
        default: The default: an int, or a tuple of ints (each element obeys the rule).
        at_least: The least value allowed.
        multiple_of: A number the value must be a multiple of, or the name of another
            field of the class whose value it must be a multiple of.
        why: Words that follow the rule in the message, e.g. `" (the 3 : 1 hybrid)"`.

    Examples:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Heads(Sizes):
        ...     num_kv_heads: int = 2
        ...     num_heads: int = size(4, multiple_of="num_kv_heads")
        >>> Heads(num_heads=3)
        Traceback (most recent call last):
        ...
        ValueError: num_heads must be a multiple of num_kv_heads, got num_heads=3 and num_kv_heads=2
    """
    rule = {"at_least": at_least, "multiple_of": multiple_of, "why": why}
    return dataclasses.field(default=default, metadata=rule)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The base of a frozen dataclass of sizes and switches, checked on creation.

    A field is told by its default: an int must be a positive int (not a bool), a tuple a
    non-empty tuple of positive ints, a bool a bool. A field made with
    [`size`][attnlab.rules.sizes.size] also obeys its least value and its multiple.

    Raises:
        TypeError: If a field has the wrong type.
        ValueError: If a size is not positive or breaks its field's rule.
    """

    def __post_init__(self) -> None:
        fields = dataclasses.fields(self)
        for field in fields:  # every field first: a multiple may name a later field
            _check_field(field.name, getattr(self, field.name), field)
        for field in fields:
            _check_multiple(self, field)


def _check_field(name: str, value: object, field: dataclasses.Field[Any]) -> None:
    if isinstance(field.default, bool):
        check_bool(name, value)
        return
    low = field.metadata.get("at_least", 1)
    if not isinstance(field.default, tuple):
        if check_positive_int(name, value) < low:
            raise ValueError(f"{name} must be at least {low}, got {value}")
        return
    if not isinstance(value, tuple) or not value or any(type(v) is not int for v in value):
        raise TypeError(f"{name} must be a non-empty tuple of ints, got {value!r}")
    if min(value) < low:
        least = "positive ints" if low == 1 else f"ints of at least {low}"
        raise ValueError(f"{name} must be {least}, got {value!r}")


def _check_multiple(sizes: Sizes, field: dataclasses.Field[Any]) -> None:
    name, value = field.name, getattr(sizes, field.name)
    of, why = field.metadata.get("multiple_of"), field.metadata.get("why", "")
    if of is None:
        return
    n = getattr(sizes, of) if isinstance(of, str) else of
    if isinstance(value, tuple):
        if any(v % n for v in value):
            of_n = f"{of}={n}" if isinstance(of, str) else n
            raise ValueError(f"{name} must be multiples of {of_n}{why}, got {value!r}")
    elif isinstance(of, str):
        check_multiple(name, value, of, n, why=why)
    elif value % n:
        raise ValueError(f"{name} must be a multiple of {n}{why}, got {value}")
