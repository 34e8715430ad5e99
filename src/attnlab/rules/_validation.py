"""Input checks shared by every public entry point, and the switch that turns them off.

Each helper raises at the package boundary with a message in the user's terms: the
argument's name, what was expected and what came. They are cheap: they read attributes
(types, shapes, dtypes, devices), never the values inside a tensor, with one marked
exception, [`check_scale`][attnlab.rules._validation.check_scale] given a 0-d tensor. A check
that must read values (a token id's range, a position's) syncs the host with the device
on every call and cannot be traced by `torch.compile` or `torch.export`; it runs only
where [`value_checks_enabled`][attnlab.rules._validation.value_checks_enabled] is True, says
so in its docstring ("reads values"), and is skipped while compiling or exporting.

The checks of what a call receives (tensors, masks, per-call flags) run only while
[`is_validation_enabled`][attnlab.is_validation_enabled] is True, the default;
[`set_validation`][attnlab.set_validation] and the context manager
[`validation`][attnlab.validation] switch them, like PyTorch's
`torch.distributions.Distribution.set_default_validate_args`. Checks of configuration
(constructor arguments, mask builders, the toy data, plotting) always run: they do not
sit in a training step.

**Checked once, where a call enters the package.** A public function or `forward` has
one signature and one body, marked with [`entry`][attnlab.rules._validation.entry], and
its checks sit under `if checking():`. The decorator counts how deep this thread is in
entries; [`checking`][attnlab.rules._validation.checking] is True in the outermost one
only. So `flash_attention` checks what a user hands it and trusts what a layer hands
it: a decoder checks its tokens, and its layers and kernels skip their checks. The
count is a `threading.local` (another thread is its own boundary) that Dynamo traces
without a graph break and `torch.export` runs as Python: models with validation on still
compile in one graph and export. A generator cannot be an entry: its body runs later.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import ParamSpec, TypeGuard, TypeVar

import torch
from torch import Tensor
from torch.nn.attention.bias import CausalBias

__all__ = [
    "broadcast_shape",
    "check_attn_mask",
    "check_block_size",
    "check_bool",
    "check_broadcast",
    "check_choice",
    "check_device",
    "check_features",
    "check_float_dtype",
    "check_index_tensor",
    "check_int_sequence",
    "check_min_rank",
    "check_multiple",
    "check_nonnegative_int",
    "check_positive_float",
    "check_positive_int",
    "check_probability",
    "check_qkv",
    "check_rank",
    "check_same_batch",
    "check_same_dtype_device",
    "check_scale",
    "check_score_changes",
    "check_sinks",
    "check_softcap",
    "check_tensor",
    "check_token_id_set",
    "check_token_ids",
    "check_tokens",
    "checking",
    "entry",
    "is_integer_dtype",
    "is_real",
    "is_validation_enabled",
    "mask_float_dtypes",
    "set_validation",
    "tracing",
    "validation",
    "value_checks_enabled",
]

_enabled = True
_calls = threading.local()  # .depth: how many entries the running thread is inside

P = ParamSpec("P")
R = TypeVar("R")


def set_validation(enabled: bool) -> None:
    r"""Turn attnlab's checks of call arguments on or off, for the whole process.

    With validation on (the default), every public function and `forward` checks what it
    receives (types, ranks, feature sizes, dtypes, devices, masks, flags) and raises a
    `TypeError` or `ValueError` that names the argument, what was expected and what came.
    With it off, those checks are skipped: correct input gives the same results, and a
    mistake surfaces as whatever PyTorch raises deep inside (or not at all). Constructors,
    the mask builders, [`attnlab.article.toy`][attnlab.article.toy] and
    [`attnlab.tools.plotting`][attnlab.tools.plotting] check their arguments either way.

    Turn it off only for a hot loop whose shapes you have already seen work; the checks
    cost microseconds per call, under 1% of a forward pass of moderate size (the page
    "Errors and edge cases" measures it). The setting is global, not per thread, like
    PyTorch's `torch.distributions.Distribution.set_default_validate_args`; for a scoped
    change use [`validation`][attnlab.validation].

    Args:
        enabled: True to check arguments, False to skip the checks.

    Raises:
        TypeError: If `enabled` is not a bool.

    Examples:
        >>> import attnlab
        >>> attnlab.set_validation(False)
        >>> attnlab.is_validation_enabled()
        False
        >>> attnlab.set_validation(True)
    """
    global _enabled
    _enabled = check_bool("enabled", enabled)


def is_validation_enabled() -> bool:
    """Whether attnlab checks call arguments (see [`set_validation`][attnlab.set_validation]).

    Returns:
        True (the default) if arguments are checked.

    Examples:
        >>> import attnlab
        >>> attnlab.is_validation_enabled()
        True
    """
    return _enabled


def entry(fn: Callable[P, R]) -> Callable[P, R]:
    """Mark `fn` as a place where calls enter the package: its checks run only there.

    Inside `fn`, [`checking`][attnlab.rules._validation.checking] is True unless another
    entry of this thread called it; then `fn` trusts its caller's checks.

    Examples:
        >>> inner = entry(checking)
        >>> inner(), entry(inner)()  # alone it checks; called from an entry, not
        (True, False)
    """

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        depth = getattr(_calls, "depth", 0)
        _calls.depth = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _calls.depth = depth  # also after a check raised: the next call checks again

    return call


def checking() -> bool:
    """Whether the running call checks its arguments: validation is on, and no
    [`entry`][attnlab.rules._validation.entry] of this thread runs above the current one."""
    return _enabled and getattr(_calls, "depth", 0) <= 1


def value_checks_enabled() -> bool:
    """Whether checks that read tensor values may run now.

    They need validation on, and nothing compiling or exporting: a value read is a host
    sync, and `torch.compile` / `torch.export` (hence `torch.onnx.export(...,
    dynamo=True)`) cannot trace it (`GuardOnDataDependentSymNode`). The checks of shapes,
    dtypes and devices still run while tracing.
    """
    return _enabled and not tracing()


def tracing() -> bool:
    """Whether `torch.compile` or `torch.export` is tracing this call: no value reads then.

    The one test of that, for every check that reads values (and for conversions such as
    a 0-d tensor scale's `.item()`, which would break the graph).
    """
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


@contextlib.contextmanager
def validation(enabled: bool) -> Iterator[None]:
    """Context manager (or decorator) that sets validation on or off, then restores it.

    The previous setting comes back on exit, also when the block raises.

    Args:
        enabled: True to check arguments inside the block, False to skip the checks.

    Yields:
        Nothing; the setting holds for the body of the `with` block.

    Raises:
        TypeError: If `enabled` is not a bool.

    Examples:
        >>> import attnlab
        >>> with attnlab.validation(False):
        ...     attnlab.is_validation_enabled()
        False
        >>> attnlab.is_validation_enabled()
        True
    """
    previous = _enabled
    set_validation(enabled)
    try:
        yield
    finally:
        set_validation(previous)


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


def is_real(value: object) -> TypeGuard[numbers.Real]:
    """Whether `value` is a real number as the checks take one: a Python or NumPy int or
    float (any `numbers.Real`), but not a bool.

    Examples:
        >>> is_real(2), is_real(0.5), is_real(True), is_real("2")
        (True, True, False, False)
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_probability(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a real number in [0, 1); raise otherwise.

    1 is excluded: dropping every attention weight leaves nothing to rescale by
    ``1 / (1 - p)``, and the output would be all zeros.
    """
    if not is_real(value):
        raise TypeError(f"{name} must be a float in [0, 1), got {value!r} ({type(value).__name__})")
    p = float(value)
    if not 0.0 <= p < 1.0:
        hint = "; 1 would drop every attention weight" if p == 1 else ""
        raise ValueError(f"{name} must be in [0, 1), got {value}{hint}")
    return p


def check_scale(name: str, value: object) -> float | None:
    """Return ``value`` as a Python float if it is None or a finite real number; raise otherwise.

    Accepted, as PyTorch's ``scaled_dot_product_attention`` accepts them: Python and NumPy
    ints and floats, and 0-d real tensors. Refused, where PyTorch would compute garbage
    or raise something cryptic: bools, strings, tensors of more than one element or of a
    bool or complex dtype, NaN and infinities.

    Reads values for a 0-d tensor (``.item()``, a host sync); while compiling or
    exporting that read and the finiteness check are skipped and the tensor is returned
    as it is (see ``value_checks_enabled``).
    """
    if value is None:
        return None
    if isinstance(value, Tensor):
        if value.ndim != 0 or value.dtype == torch.bool or value.is_complex():
            raise TypeError(
                f"{name} must be a float, a 0-d real tensor or None, got a tensor of dtype "
                f"{value.dtype} and shape {_shape(value)}"
            )
        if tracing():
            return value  # type: ignore[return-value]
        value = value.item()
    elif not is_real(value):
        raise TypeError(f"{name} must be a float or None, got {value!r} ({type(value).__name__})")
    scale = float(value)
    if not math.isfinite(scale):
        raise ValueError(f"{name} must be finite, got {scale}")
    return scale


def check_softcap(name: str, value: object) -> float | None:
    """Return ``value`` as a float if it is None or a positive finite number; raise otherwise.

    The cap ``c`` of logit softcapping, ``c * tanh(score / c)`` (Gemma 2 caps its
    attention scores at 50): Python and NumPy ints and floats; not bools, strings or
    tensors. Zero or a negative cap would divide by zero or flip the scores' order.
    """
    if value is None:
        return None
    if not is_real(value):
        raise TypeError(
            f"{name} must be a positive float or None, got {value!r} ({type(value).__name__})"
        )
    cap = float(value)
    if not (math.isfinite(cap) and cap > 0.0):
        raise ValueError(
            f"{name} must be a positive finite float (the cap c of c * tanh(score / c), "
            f"e.g. 50.0 in Gemma 2), got {cap}"
        )
    return cap


def check_sinks(
    name: str, logits: object, query: Tensor, num_heads: int | None, query_name: str = "query"
) -> Tensor | None:
    """Check learned attention-sink logits: None, or a float tensor of shape `(num_heads,)`.

    One logit per head (gpt-oss), on ``query``'s device; any floating dtype (the kernels
    compute in their own). ``num_heads`` is the size of the attention weights' head
    dimension, None if they have none (queries of fewer than 3 dimensions).
    """
    if logits is None:
        return None
    s = check_tensor(name, logits)
    if s.device != query.device:
        raise ValueError(
            f"{name} is on {s.device} but {query_name} is on {query.device}; move it with "
            f"{name}.to({query_name}.device)"
        )
    if num_heads is None:
        raise ValueError(
            f"{name} holds one logit per head, but {query_name} has no head dimension: it "
            f"must be (..., H, L, E) with {name} of shape (H,), got "
            f"{query_name}.shape={_shape(query)}"
        )
    if _shape(s) != (num_heads,):
        raise ValueError(
            f"{name} must hold one logit per head, shape ({num_heads},) for the {num_heads} "
            f"heads of {query_name} (..., H, L, E), got {name}.shape={_shape(s)} "
            f"({query_name}.shape={_shape(query)})"
        )
    return s


def check_score_changes(
    softcap: object, sink_logits: object, query: Tensor, num_heads: int | None
) -> None:
    """Check the score changes of 2024-2025 models that the kernels take from users.

    Gemma 2's ``softcap`` (``check_softcap``) and gpt-oss's ``sink_logits``
    (``check_sinks``: one per entry of the weights' head dimension, ``num_heads``).
    """
    check_softcap("softcap", softcap)
    check_sinks("sink_logits", sink_logits, query, num_heads)


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape that ``shapes`` broadcast to, or None if they do not broadcast."""
    try:
        return tuple(torch.broadcast_shapes(*shapes))  # type: ignore[no-untyped-call]
    except RuntimeError:
        return None


def check_broadcast(what: str, **shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Return the broadcast of ``shapes``; raise ``ValueError`` naming them if there is none.

    ``what`` says which dimensions these are, e.g. ``"batch dimensions"``; each keyword is
    an argument name and the shape of its dimensions in question.
    """
    shape = broadcast_shape(*shapes.values())
    if shape is None:
        listed = ", ".join(f"{name} {s}" for name, s in shapes.items())
        raise ValueError(f"the {what} of {' and '.join(shapes)} do not broadcast: {listed}")
    return shape


def check_device(name: str, device: object) -> None:
    """Raise unless ``device`` is None, a ``torch.device``, a device string or an index."""
    if device is None or isinstance(device, torch.device):
        return
    if isinstance(device, bool) or not isinstance(device, (str, int)):
        raise TypeError(
            f"{name} must be a torch.device, a string such as 'cpu' or 'cuda:0', or None, "
            f"got {device!r} ({type(device).__name__})"
        )
    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(
            f"{name} must name a device such as 'cpu' or 'cuda:0', got {device!r}"
        ) from None


def check_tokens(
    name: str, x: object, *, features: int, param: str, owner: str, like: Tensor
) -> Tensor:
    """Check a module's token input: a float ``(t, features)`` or ``(b, t, features)`` tensor
    of the dtype (or, inside ``torch.autocast``, of the autocast dtype, which the
    projections meet anyway) and on the device of the module's parameter ``like``; return it.
    """
    x = check_tensor(name, x)
    check_rank(name, x, (2, 3), f"(t, {param}) or (b, t, {param})")
    check_features(name, x, features, owner, param)
    if x.dtype != like.dtype and x.dtype != autocast_dtype(x.device):
        raise ValueError(
            f"{name} has dtype {x.dtype} but {owner}'s parameters are {like.dtype}; "
            f"convert one of them (e.g. module.to({x.dtype}))"
        )
    if x.device != like.device:
        raise ValueError(
            f"{name} is on {x.device} but {owner}'s parameters are on {like.device}; "
            f"move one of them (e.g. module.to({name}.device))"
        )
    return x


def check_same_batch(name: str, x: Tensor, other: Tensor) -> None:
    """Raise unless `x` and `other` are both unbatched `(t, d)` or share their batch size."""
    if x.ndim != other.ndim or (x.ndim == 3 and x.shape[0] != other.shape[0]):
        raise ValueError(
            f"x and {name} must both be unbatched or have the same batch size, got "
            f"x.shape={_shape(x)} and {name}.shape={_shape(other)}"
        )


def check_qkv(
    query: object, key: object, value: object | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Check attention's `query (..., L, E)`, `key (..., S, E)` and `value (..., S, Ev)`.

    Floating-point tensors of at least 2 dimensions, one dtype and device, the same `E`
    in query and key, the same `S` in key and value; `value` None means there are no
    values to check (the weights alone). Returns the three, typed. The batch dimensions
    are the caller's: some kernels broadcast them, others do not.
    """
    q = check_tensor("query", query)
    k = check_tensor("key", key)
    v = None if value is None else check_tensor("value", value)
    check_min_rank("query", q, 2, "(..., L, E)")
    check_min_rank("key", k, 2, "(..., S, E)")
    if v is not None:
        check_min_rank("value", v, 2, "(..., S, Ev)")
    check_same_dtype_device("query", q, key=k, value=v)
    check_features("key", k, q.shape[-1], "query", "E")
    if v is not None and v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"key and value must have the same number of positions S, got "
            f"key.shape={tuple(k.shape)} and value.shape={tuple(v.shape)}"
        )
    return q, k, v


def is_integer_dtype(dtype: torch.dtype) -> bool:
    """Whether `dtype` holds integers: not floating point, not complex, and not bool.

    The one rule of what counts as token ids, positions, lengths and indices.

    Examples:
        >>> is_integer_dtype(torch.int32), is_integer_dtype(torch.bool)
        (True, False)
    """
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def check_index_tensor(name: str, x: object, ranks: tuple[int, ...], layout: str) -> Tensor:
    """Check an index tensor (ids, positions, lengths, block tables): integers, one of `ranks`.

    The one rule behind every argument that holds indices. `layout` names the accepted
    shapes in the messages. It reads no values: ranges are each caller's own rule.

    Raises:
        TypeError: If `x` is not a tensor of an integer dtype (bool does not count).
        ValueError: If `x.ndim` is not one of `ranks`.

    Examples:
        >>> check_index_tensor("lengths", torch.tensor([3.0]), (1,), "(b,)")
        Traceback (most recent call last):
        ...
        TypeError: lengths must be an integer tensor (b,), got torch.float32 (lengths.shape=(1,))
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be an integer tensor {layout}, got {type(x).__name__}")
    if not is_integer_dtype(x.dtype):
        raise TypeError(
            f"{name} must be an integer tensor {layout}, got {x.dtype} ({name}.shape={_shape(x)})"
        )
    check_rank(name, x, ranks, layout)
    return x


def check_float_dtype(name: str, dtype: object) -> torch.dtype:
    """Return `dtype` if it is a floating-point `torch.dtype` (what a cache stores).

    Raises:
        TypeError: If it is not a `torch.dtype`, or not a floating-point one.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


def check_block_size(block_size: object) -> tuple[int, int]:
    """Return `(block_q, block_k)` from a tile size: one positive int, or a pair of them.

    The rule of every tiled kernel (FlashAttention's tiles, FlexAttention's block mask).

    Raises:
        TypeError: If a size is not an int.
        ValueError: If a size is not positive, or the tuple is not a pair.

    Examples:
        >>> check_block_size(64), check_block_size((32, 16))
        ((64, 64), (32, 16))
    """
    if isinstance(block_size, tuple):
        if len(block_size) != 2:
            raise ValueError(
                f"block_size must be an int or a pair (block_q, block_k), got {block_size!r}"
            )
        return (
            check_positive_int("block_size[0]", block_size[0]),
            check_positive_int("block_size[1]", block_size[1]),
        )
    size = check_positive_int("block_size", block_size)
    return size, size


def check_multiple(
    name: str, value: int, of_name: str, of: int, *, why: str = "", hint: str = ""
) -> int:
    """Return `value // of` if `value` is a multiple of `of`; raise otherwise.

    The rule of every size that is split evenly: a model width into heads, query heads
    into groups. `why` follows the rule in the message, `hint` ends it.

    Raises:
        ValueError: If `value % of != 0`.

    Examples:
        >>> check_multiple("d_model", 64, "num_heads", 4)
        16
    """
    if value % of:
        raise ValueError(
            f"{name} must be a multiple of {of_name}{why}, got {name}={value} and "
            f"{of_name}={of}{hint}"
        )
    return value // of


def check_min_rank(name: str, x: Tensor, min_rank: int, layout: str) -> None:
    """Raise ``ValueError`` unless ``x`` has at least ``min_rank`` dimensions."""
    if x.ndim < min_rank:
        raise ValueError(
            f"{name} must have at least {min_rank} dimension{'s' * (min_rank != 1)} {layout}, "
            f"got {x.ndim} "
            f"({name}.shape={_shape(x)})"
        )


def mask_float_dtypes(query: Tensor) -> tuple[torch.dtype, ...]:
    """The dtypes a float mask (a bias added to the scores) may have next to `query`.

    The query's own, float32 (the scores' dtype when they are computed wide) and the
    autocast dtype of `query`'s device, if autocast is on. `attn_mask` and
    `key_padding_mask` follow this one rule.
    """
    floats = (query.dtype, torch.float32, autocast_dtype(query.device))
    return tuple(dtype for dtype in floats if dtype is not None)


def check_attn_mask(
    name: str, mask: object, target: tuple[int, ...], query: Tensor, query_name: str = "query"
) -> Tensor | None:
    """Check an attention mask in the convention of ``scaled_dot_product_attention``.

    The mask must be None, a bool tensor (True = attend) or a float tensor to add to the
    scores (of dtype ``query.dtype`` or float32, as PyTorch accepts), on ``query``'s device,
    and it must broadcast to the shape of the attention weights, ``target``, without
    growing it. ``query_name`` is what the caller calls the queries' tensor. PyTorch's
    ``CausalBias`` (``causal_upper_left(L, S)``, ``causal_lower_right(L, S)``) is accepted
    when its ``L`` and ``S`` are those of ``target``.
    """
    if mask is None:
        return None
    if isinstance(mask, CausalBias):
        sizes = (mask.seq_len_q, mask.seq_len_kv)
        if sizes != target[-2:]:
            raise ValueError(
                f"{name} is a CausalBias for L={sizes[0]} queries and S={sizes[1]} keys, but "
                f"the attention weights have shape {target} (batch..., L queries, S keys)"
            )
        return mask
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and mask.dtype not in mask_float_dtypes(query):
        raise TypeError(
            f"{name} must be a bool tensor (True = attend) or a float tensor of "
            f"{query_name}'s dtype {query.dtype} to add to the scores, got {mask.dtype} "
            f"({name}.shape={_shape(mask)})"
        )
    if mask.device != query.device:
        raise ValueError(
            f"{name} is on {mask.device} but {query_name} is on {query.device}; move it with "
            f"{name}.to({query_name}.device)"
        )
    if broadcast_shape(tuple(mask.shape), target) != target:
        hint = (
            "; a (b, S) padding mask needs mask[:, None, None, :] to reach (b, 1, 1, S)"
            if mask.ndim == 2 and len(target) == 4 and tuple(mask.shape) == (target[0], target[-1])
            else ""
        )
        raise ValueError(
            f"{name} of shape {_shape(mask)} does not broadcast to the attention weights' "
            f"shape {target} (batch..., L queries, S keys){hint}"
        )
    return mask


def check_int_sequence(
    name: str, value: object, *, low: int | None = 0, high: int | None = None, within: str = ""
) -> Tensor | list[int]:
    """Check a 1-d integer tensor or a sequence of ints, each in `[low, high)`; return it.

    The one check of token ids, prompts and lengths. A tensor comes back as it came (its
    device and dtype), a sequence as a list of ints. bool is not an int here: a bool
    tensor and a `True` element are refused, as are floats, complex numbers, strings and
    tensors of another rank. `low=None` or `high=None` leaves the range open on that side;
    `within` names the range in the message (e.g. `"the vocabulary "`).

    The bounds of a tensor's elements read its values (a host sync on an accelerator),
    so they are skipped while compiling or exporting
    ([`tracing`][attnlab.rules._validation.tracing]); they run with validation off, since the
    callers check configuration (mask builders, a prompt, a cache's token ids), not the
    tensors of a training step. A sequence's elements are Python ints: always checked.

    Raises:
        TypeError: If `value` is neither, or an element is not an int.
        ValueError: If an element is outside `[low, high)`, named by its index.
    """

    kind = {None: "an int", 0: "a non-negative int"}.get(low, f"an int >= {low}")
    if isinstance(value, Tensor):
        dtype = value.dtype
        if value.ndim != 1 or not is_integer_dtype(dtype):
            raise TypeError(
                f"{name} must be a 1-d integer tensor or a sequence of ints, got a "
                f"{dtype} tensor of shape {_shape(value)}"
            )
        if tracing() or (low is None and high is None):  # the bounds read values
            return value
        bad = torch.zeros_like(value, dtype=torch.bool)
        if low is not None:
            bad |= value < low
        if high is not None:
            bad |= value >= high
        found = bad.nonzero()
        if not len(found):
            return value
        i = int(found[0, 0])
        t = int(value[i])
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        items = list(value)
        for i, t in enumerate(items):
            if isinstance(t, bool) or not isinstance(t, int):
                kind_here = kind if high is None else "an int"
                raise TypeError(f"{name}[{i}] must be {kind_here}, got {t!r} ({type(t).__name__})")
        outside = [
            i
            for i, t in enumerate(items)
            if (low is not None and t < low) or (high is not None and t >= high)
        ]
        if not outside:
            return items
        i = outside[0]
        t = items[i]
    else:
        raise TypeError(
            f"{name} must be a 1-d integer tensor or a sequence of ints, got {type(value).__name__}"
        )
    if high is None:
        raise ValueError(f"{name}[{i}] must be {kind}, got {t}")
    bounds = f"[{low}, {high})" if low is not None else f"(-inf, {high})"
    raise ValueError(f"{name}[{i}]={t} is outside {within}{bounds}")


def check_positive_float(name: str, value: object) -> float:
    """Return `value` as a float if it is a positive finite real number; raise otherwise.

    The one rule of every epsilon and positive scalar of a configuration (a norm's
    `eps`, Gemma's `query_pre_attn_scalar`, YaRN's `attention_factor`): Python and NumPy ints
    and floats; not bools, strings or tensors.

    Raises:
        TypeError: If `value` is a bool or not a real number.
        ValueError: If it is not finite or not greater than 0.
    """
    if not is_real(value):
        raise TypeError(f"{name} must be a positive float, got {value!r} ({type(value).__name__})")
    number = float(value)
    if not (math.isfinite(number) and number > 0.0):
        raise ValueError(f"{name} must be a positive finite float, got {number}")
    return number


def check_token_ids(
    name: str,
    tokens: object,
    vocab_size: int,
    *,
    ranks: tuple[int, ...] = (1, 2),
    layout: str = "(t,) or (b, t)",
) -> Tensor:
    """Check token ids: an integer tensor (not bool) of one of `ranks`, in `[0, vocab_size)`.

    `layout` names the accepted shapes in the message. The range check reads the ids
    (a host sync), so it runs only where
    [`value_checks_enabled`][attnlab.rules._validation.value_checks_enabled]: it is skipped
    while compiling or exporting, and for an empty tensor.

    Raises:
        TypeError: If `tokens` is not a tensor of an integer dtype and one of `ranks`.
        ValueError: If an id lies outside `[0, vocab_size)`.
    """
    if (
        not isinstance(tokens, Tensor)
        or not is_integer_dtype(tokens.dtype)
        or tokens.ndim not in ranks
    ):
        got = (
            f"{tokens.dtype} tensor of shape {_shape(tokens)}"
            if isinstance(tokens, Tensor)
            else type(tokens).__name__
        )
        dims = " or ".join(f"{r}-d" for r in ranks)
        raise TypeError(f"{name} must be a {dims} integer tensor {layout} of token ids, got {got}")
    if value_checks_enabled() and tokens.numel():  # reads the ids: a host sync
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{name} must lie in [0, {vocab_size}) (vocab_size={vocab_size}), got values "
                f"from {low} to {high}"
            )
    return tokens


def check_token_id_set(name: str, value: object, vocab_size: int) -> tuple[int, ...]:
    """Check the token ids that end (or pad) a generation; return them in order.

    The one rule of every `eos_token_id` and `pad_token_id`: `None` (no such token,
    returned as `()`), one id or a sequence of ids, each an int (not a bool) in
    `[0, vocab_size)`. The ids are checked by
    [`check_int_sequence`][attnlab.rules._validation.check_int_sequence].

    Raises:
        TypeError: If `value` is neither, or an id is not an int.
        ValueError: If an id lies outside the vocabulary.
    """

    if value is None:
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    elif not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be an int, a sequence of ints or None, got {value!r}")
    ids = check_int_sequence(name, value, low=0, high=vocab_size, within="the vocabulary ")
    return tuple(int(i) for i in ids)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype of `torch.autocast` on `device`'s type, or None where it is off."""
    kind = device.type  # "meta" has no autocast: is_autocast_enabled would raise
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return None
