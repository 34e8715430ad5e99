r"""The one home of attnlab's numeric rules: low precision, `torch.autocast`, the scale.

Every attention kernel of the package (the from-scratch
[`scaled_dot_product_attention`][attnlab.functional.sdpa.scaled_dot_product_attention],
[`flash_attention`][attnlab.functional.flash.flash_attention], ring attention, paged attention)
follows the same three rules, and takes them from here:

1. **Compute in at least float32.** float16 and bfloat16 inputs are attended in float32
   and the result rounded once at the end, as PyTorch's SDPA does on the CPU: a score
   `q . k` of float16 inputs overflows float16's range (65504) long before the inputs do
   (300 * 300 > 65504), and bfloat16 keeps about 3 significant digits of each score, too
   few for a softmax over many keys. [`compute_dtype`][attnlab.rules._precision.compute_dtype]
   says which dtype (float16 and bfloat16 are promoted).
2. **Obey autocast as PyTorch's attention does.** Inside `torch.autocast`, PyTorch casts
   SDPA's floating-point inputs (float64 excepted) to the autocast dtype, it being on the
   lower-precision list of both the CPU and the CUDA autocast, and returns that dtype. So
   do attnlab's kernels: [`autocast_inputs`][attnlab.rules._precision.autocast_inputs] casts,
   then the kernel runs under [`autocast_off`][attnlab.rules._precision.autocast_off], since
   otherwise every matmul inside would be cast again and the softmax not, and its result
   is rounded to the (cast) query's dtype. A kernel follows rules 1 and 2 by being
   decorated with [`autocast_kernel`][attnlab.rules._precision.autocast_kernel] and
   widening its tensors to [`compute_dtype`][attnlab.rules._precision.compute_dtype] where
   it reads them (a paged kernel widens one tile at a time, not the whole cache).
3. **Scale the scores by $1 / \sqrt{E}$ unless told otherwise**, as PyTorch does, with
   `E = 0` features taken as 1 (every score is 0 then, and the values are averaged):
   [`softmax_scale`][attnlab.rules._precision.softmax_scale].

API (internal; other modules of the package import these names):

- `compute_dtype(dtype) -> torch.dtype`: `torch.promote_types(dtype, torch.float32)`.
- `autocast_dtype` (from `_validation`, whose dtype checks need it too): the autocast
  dtype on a device's type, None where autocast is off (or does not exist, as on "meta").
- `autocast_inputs(*xs, device=None) -> tuple`: `xs` cast as autocast casts attention's
  inputs (None, bool masks, integer tensors, float64 and PyTorch's `CausalBias` pass
  unchanged), by the autocast of `device` (default: the first tensor's); a no-op when
  autocast is off. Objects that are
  not tensors pass unchanged too, so the checks that follow can name them.
- `autocast_off(device_type) -> context manager`: autocast disabled on that device type
  (a null context where the type has no autocast).
- `@autocast_kernel(inputs)`: a kernel decorated so that its first `inputs` positional
  arguments are cast by `autocast_inputs`, its body runs under `autocast_off`, and its
  result is returned in the dtype of the first of them (the query), as rule 2 says.
- `softmax_scale(head_dim, scale) -> float`: `scale` as a float, or $1/\sqrt{E}$.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch
from torch import Tensor
from torch.nn.attention.bias import CausalBias

from attnlab.rules._validation import autocast_dtype

__all__ = [
    "autocast_inputs",
    "autocast_kernel",
    "autocast_off",
    "compute_dtype",
    "softmax_scale",
]

_T = TypeVar("_T")
_Kernel = TypeVar("_Kernel", bound=Callable[..., Tensor])


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype attention computes in for inputs of `dtype`: at least float32.

    Examples:
        >>> compute_dtype(torch.bfloat16), compute_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.promote_types(dtype, torch.float32)


def _cast(x: _T, dtype: torch.dtype) -> _T:
    # Autocast casts floating-point tensors other than float64; bool masks and the
    # CausalBias object (a tensor subclass without storage) pass unchanged.
    if (
        isinstance(x, Tensor)
        and not isinstance(x, CausalBias)
        and x.is_floating_point()
        and x.dtype != torch.float64
    ):
        return x.to(dtype)  # type: ignore[return-value]
    return x


def autocast_inputs(*xs: _T, device: torch.device | None = None) -> tuple[_T, ...]:
    """`xs` cast as autocast casts the arguments of PyTorch's attention, if it is on.

    The device whose autocast counts is `device`, by default that of the first tensor
    among `xs`.

    Examples:
        >>> x = torch.ones(2)
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     [t.dtype for t in autocast_inputs(x, x.double(), x > 0)]
        [torch.bfloat16, torch.float64, torch.bool]
    """
    if device is None:
        first = next((x for x in xs if isinstance(x, Tensor)), None)
        device = None if first is None else first.device
    dtype = None if device is None else autocast_dtype(device)
    if dtype is None:
        return xs
    return tuple(_cast(x, dtype) for x in xs)


def autocast_off(device_type: str) -> contextlib.AbstractContextManager[object]:
    """A context in which autocast is off on `device_type`: kernels run as written."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def autocast_kernel(inputs: int) -> Callable[[_Kernel], _Kernel]:
    """Decorate a kernel to run as PyTorch runs attention inside `torch.autocast`.

    The kernel's first `inputs` positional arguments (its tensors: queries first) are
    cast by [`autocast_inputs`][attnlab.rules._precision.autocast_inputs], its body runs
    under [`autocast_off`][attnlab.rules._precision.autocast_off], and its result is
    returned in the dtype of the first of them: the autocast dtype inside
    `torch.autocast`, the query's own dtype outside it. The kernel itself widens what
    it reads to [`compute_dtype`][attnlab.rules._precision.compute_dtype] and may return
    the wide result. Arguments after the first `inputs` (a scale given as a 0-d tensor,
    learned sink logits) are not cast, as PyTorch does not cast them.

    Examples:
        >>> @autocast_kernel(inputs=2)
        ... def product(a: Tensor, b: Tensor) -> Tensor:
        ...     wide = compute_dtype(a.dtype)
        ...     return a.to(wide) @ b.to(wide)
        >>> x = torch.ones(2, 2)
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     product(x, x).dtype
        torch.bfloat16
    """

    def decorate(kernel: _Kernel) -> _Kernel:
        @functools.wraps(kernel)
        def run(*args: Any, **kwargs: Any) -> Tensor:
            cast_args = autocast_inputs(*args[:inputs])
            query = cast_args[0]
            with autocast_off(query.device.type):
                out: Tensor = kernel(*cast_args, *args[inputs:], **kwargs)
            return out if out.dtype == query.dtype else out.to(query.dtype)

        return cast(_Kernel, run)

    return decorate


def softmax_scale(head_dim: int, scale: float | Tensor | None = None) -> float:
    """The factor of the scores: `scale` as a float, or $1 / \\sqrt{E}$ when it is None.

    `E = 0` features count as 1: every score is 0 then whatever the factor, and
    `1 / sqrt(0)` would raise. `scale` was checked at the caller's boundary (a number or
    a 0-d tensor).

    Examples:
        >>> softmax_scale(64), softmax_scale(0), softmax_scale(64, 0.5)
        (0.125, 1.0, 0.5)
    """
    return 1.0 / math.sqrt(max(head_dim, 1)) if scale is None else float(scale)
