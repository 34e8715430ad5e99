r"""FlashAttention as Triton kernels: the public entry, its checks, autograd and launches.

[`triton_flash_attention`][attnlab.functional.triton_flash.triton_flash_attention] computes
what [`flash_attention`][attnlab.functional.flash.flash_attention] computes (the same
rule of scores: causal with either alignment, a sliding window, softcap, sink logits,
ALiBi), with the kernels of [`triton_kernels`][attnlab.functional.triton_kernels]: a
forward pass that saves each row's log-sum-exp, and FlashAttention-2's backward (Dao,
2023, https://arxiv.org/abs/2307.08691): $D_i = dO_i \cdot O_i$ first, then $dK$ and $dV$
by tiles of keys and $dQ$ by tiles of queries, each from probabilities recomputed from the
log-sum-exp. Grouped-query attention reads each key/value head from every query head of
its group; no key is copied.

Triton is an optional dependency (`pip install "attnlab[triton]"`, a wheel of about
290 MB that installs to about 1 GB); this module imports it on first use, so
`import attnlab` works without it. Without a CUDA GPU the kernels run in Triton's
interpreter, on CPU tensors, one program after another (slow: keep shapes small); with
one, they are compiled, on CUDA tensors. The mode is fixed when the kernels' module is
first imported ([`INTERPRET`][attnlab.functional.triton_kernels.INTERPRET]); tensors on
the other kind of device are refused by name. bfloat16 runs on a GPU only (the
interpreter's bfloat16 products are wrong in Triton 3.9).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import math
import re
from types import ModuleType
from typing import Any, Literal, NamedTuple, Unpack, overload

import torch
from torch import Tensor

from attnlab.functional.flash import check_rule
from attnlab.rules._precision import autocast_inputs, compute_dtype, softmax_scale
from attnlab.rules._validation import check_bool, check_qkv, check_tensor, checking, entry
from attnlab.rules.masks import Alignment, alignment_offset, is_causal_window
from attnlab.rules.scores import RuleKeywords

__all__ = ["TritonKeywords", "kernels", "tile_sizes", "tiles_visited", "triton_flash_attention"]

_LOG2_E = math.log2(math.e)
_LN_2 = math.log(2.0)
MAX_HEAD_DIM = 256
"""The largest query/key or value head size the kernels take (padded to a power of two)."""

_INSTALL = (
    'pip install "attnlab[triton]" (triton>=3.6, Linux only: a wheel of about 290 MB, '
    "about 1 GB installed)"
)


@functools.cache  # once: every launch asks, and the version check reads metadata
def kernels() -> ModuleType:
    """The kernels' module, [`triton_kernels`][attnlab.functional.triton_kernels], imported
    on first use (which fixes its mode).

    Raises:
        ImportError: If Triton is not installed, saying how to install it.
    """
    try:
        module = importlib.import_module("attnlab.functional.triton_kernels")
    except ModuleNotFoundError as error:
        if error.name != "triton":
            raise
        raise ImportError(f"attnlab's Triton kernels need Triton: {_INSTALL}") from error
    if module.INTERPRET and _version("triton") < (3, 7) and _version("numpy") >= (2, 4):
        raise ImportError(
            f"Triton {_release('triton')}'s interpreter cannot loop to a bound known at run "
            f"time with NumPy {_release('numpy')} (it converts a 1-element array with "
            "int(), which NumPy 2.4 refuses); pip install 'triton>=3.7' or 'numpy<2.4' "
            "(compiled kernels on a GPU take Triton 3.6)"
        )
    return module


def _release(package: str) -> str:
    return importlib.metadata.version(package)


def _version(package: str) -> tuple[int, ...]:
    """The first two numbers of an installed package's version, e.g. (3, 9)."""
    return tuple(int(part) for part in re.findall(r"\d+", _release(package))[:2])


def tile_sizes(head_dim: int, value_dim: int | None = None) -> tuple[int, int]:
    """`(BLOCK_M, BLOCK_N)`, the queries and keys of a tile, for these head sizes.

    One fixed configuration in the interpreter (16 x 16: small tiles keep the tests'
    tensors small and still take several tiles); on a GPU 64 x 64, or 64 x 32 when a
    padded head size is above 128, so a tile's registers stay within an SM's.

    Examples:
        >>> tile_sizes(64)
        (16, 16)
    """
    if kernels().INTERPRET:
        return 16, 16
    widest = max(_padded(head_dim), _padded(value_dim or head_dim))
    return 64, 64 if widest <= 128 else 32


def _padded(size: int) -> int:
    """A head size as the kernels hold it: the next power of two (a tile's sides are), at
    least 16 (on a GPU, `tl.dot`'s inner size must be 16 or more for 16-bit inputs)."""
    return max(16, 1 << max(0, size - 1).bit_length())


class TritonKeywords(RuleKeywords, total=False):
    """The keywords of
    [`triton_flash_attention`][attnlab.functional.triton_flash.triton_flash_attention]
    besides `return_lse` (for its typed overloads): a score rule's, and `enable_gqa`."""

    enable_gqa: bool


@overload
def triton_flash_attention(
    query: Tensor, key: Tensor, value: Tensor, *, return_lse: Literal[False] = False,
    **options: Unpack[TritonKeywords],
) -> Tensor: ...  # fmt: skip


@overload
def triton_flash_attention(
    query: Tensor, key: Tensor, value: Tensor, *, return_lse: Literal[True],
    **options: Unpack[TritonKeywords],
) -> tuple[Tensor, Tensor]: ...  # fmt: skip


@entry
def triton_flash_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    is_causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    align: Alignment = "top-left",
    softcap: float | None = None,
    sink_logits: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""FlashAttention's forward and backward as Triton kernels (interpreted on a CPU).

    The same arguments and result as
    [`flash_attention`][attnlab.functional.flash.flash_attention] (see there for
    `is_causal`, `window`, `scale`, `align`, `softcap`, `sink_logits`, `alibi_slopes`
    and `return_lse`), without `block_size` (the kernels' tiles are
    [`tile_sizes`][attnlab.functional.triton_flash.tile_sizes]) and with `enable_gqa`:
    `key` and `value` may have fewer heads than `query`, a divisor of them, each serving
    a group of query heads, as in PyTorch's `scaled_dot_product_attention`. Sink logits
    and ALiBi slopes are one per query head. Differentiable in `query`, `key`, `value`
    and `sink_logits`.

    Args:
        query: `(..., Hq, L, E)` (or `(L, E)`): float32, float16 or float64 (bfloat16
            on a GPU only); float16 is accumulated in float32, float64 in float64.
        key: `(..., H, S, E)`; `H == Hq`, or a divisor of it with `enable_gqa`.
        value: `(..., H, S, Ev)`; `E` and `Ev` at most 256 and may differ (MLA).
        enable_gqa: Let `key` and `value` have fewer heads than `query`.
        is_causal: As for `flash_attention`.
        window: As for `flash_attention`.
        scale: As for `flash_attention`.
        align: As for `flash_attention`.
        softcap: As for `flash_attention`.
        sink_logits: As for `flash_attention`.
        alibi_slopes: As for `flash_attention`.
        return_lse: As for `flash_attention` (the log-sum-exp in float32, or float64).

    Returns:
        The output `(..., Hq, L, Ev)` in the inputs' dtype; with `return_lse`, also the
        log-sum-exp `(..., Hq, L)`.

    Raises:
        ImportError: If Triton is not installed (saying how to install it).
        TypeError: As `flash_attention` does.
        ValueError: As `flash_attention` does, and before any launch: for a dtype the
            kernels do not take, a head size above 256, key/value heads that do not
            divide the query's, or tensors on the wrong device for the mode (CPU for the
            interpreter, CUDA for compiled kernels).

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(1, 4, 20, 8), torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8)
        >>> out = triton_flash_attention(q, k, v, is_causal=True, enable_gqa=True)
        >>> sdpa = torch.nn.functional.scaled_dot_product_attention
        >>> ref = sdpa(q, k, v, is_causal=True, enable_gqa=True)
        >>> torch.allclose(out, ref, atol=1e-6)
        True
    """
    rule: TritonKeywords = {  # a literal: torch.compile cannot trace a TypedDict's call
        "is_causal": is_causal, "window": window, "scale": scale, "align": align,
        "softcap": softcap, "sink_logits": sink_logits, "alibi_slopes": alibi_slopes,
        "enable_gqa": enable_gqa,
    }  # fmt: skip
    query, key, value, launch = _prepared(query, key, value, rule)
    if checking():
        check_bool("return_lse", return_lse)
    out, lse2 = _TritonFlash.apply(query, key, value, sink_logits, launch)  # type: ignore[no-untyped-call]
    return (out, lse2 * _LN_2) if return_lse else out


@entry
def tiles_visited(
    query: Tensor, key: Tensor, value: Tensor, **options: Unpack[TritonKeywords]
) -> Tensor:
    """How many key tiles each program of the forward kernel computed, `(..., Hq, M)` for
    `M = ceil(L / BLOCK_M)` programs per head: what the kernel itself counted.

    The same keywords as
    [`triton_flash_attention`][attnlab.functional.triton_flash.triton_flash_attention]
    (not `return_lse`). Equal to the number of nonzero entries in each row of
    [`tile_map`][attnlab.functional.flash.tile_map] at the kernels'
    [`tile_sizes`][attnlab.functional.triton_flash.tile_sizes]: the kernel skips the
    tiles the PyTorch version skips.

    Examples:
        >>> q = torch.randn(1, 1, 64, 8)
        >>> tiles_visited(q, q, q, window=16)  # 16 x 16 tiles in the interpreter
        tensor([[[1, 2, 2, 2]]], dtype=torch.int32)
    """
    query, key, value, launch = _prepared(query, key, value, options)
    with torch.no_grad():
        return _forward(query, key, value, options.get("sink_logits"), launch)[2]


def _prepared(
    query: Tensor, key: Tensor, value: Tensor, options: TritonKeywords
) -> tuple[Tensor, Tensor, Tensor, _Launch]:
    """The inputs (cast as autocast casts them) and the launch, after the checks."""
    is_causal, window = options.get("is_causal", False), options.get("window")
    scale, align = options.get("scale"), options.get("align", "top-left")
    softcap, sinks = options.get("softcap"), options.get("sink_logits")
    slopes = options.get("alibi_slopes")
    if checking():
        query, key, value = autocast_inputs(query, key, value)
        heads = _check_inputs(query, key, value, options.get("enable_gqa", False))
        check_rule(query, heads, is_causal, window, scale, align, softcap, sinks, slopes)
    launch = _Launch.of(query, key, value, is_causal, window, scale, align, softcap, slopes)
    return query, key, value, launch


def _check_inputs(query: object, key: object, value: object, enable_gqa: object) -> int | None:
    """The kernels' checks before any launch; returns the number of query heads (None for
    inputs without a head dimension, which take no sink logits or slopes)."""
    q, k, checked = check_qkv(query, key, value)
    v = check_tensor("value", checked)  # the kernels need values: None is refused here
    check_bool("enable_gqa", enable_gqa)
    interpret = kernels().INTERPRET
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.float64)
    dtypes += () if interpret else (torch.bfloat16,)
    if q.dtype not in dtypes:
        where = "in Triton's interpreter (bfloat16 on a GPU only)" if interpret else "here"
        raise ValueError(
            f"triton_flash_attention takes {', '.join(map(str, dtypes))} {where}, got "
            f"query.dtype={q.dtype}"
        )
    device = "cpu" if interpret else "cuda"
    if q.device.type != device:
        mode = "run in Triton's interpreter (no CUDA GPU)" if interpret else "are compiled"
        raise ValueError(
            f"attnlab's Triton kernels {mode} here and need {device} tensors, got "
            f"query.device={q.device}"
        )
    for name, size in (("query", q.shape[-1]), ("value", v.shape[-1])):
        if size > MAX_HEAD_DIM:
            raise ValueError(
                f"triton_flash_attention takes head sizes up to {MAX_HEAD_DIM}, got "
                f"{name}.shape={tuple(q.shape if name == 'query' else v.shape)}"
            )
    qb, kb, vb = q.shape[:-3], k.shape[:-3], v.shape[:-3]
    hq, hk, hv = (t.shape[-3] if t.ndim > 2 else 1 for t in (q, k, v))
    if not (qb == kb == vb and hk == hv and (hq == hk or (enable_gqa and hq % hk == 0))):
        need = "H dividing Hq (enable_gqa=True)" if enable_gqa else "H == Hq"
        raise ValueError(
            f"triton_flash_attention needs query (..., Hq, L, E), key (..., H, S, E) and "
            f"value (..., H, S, Ev) with the same batch dimensions and {need}, got "
            f"query.shape={tuple(q.shape)}, key.shape={tuple(k.shape)}, "
            f"value.shape={tuple(v.shape)}"
        )
    return hq if q.ndim > 2 else None


class _Launch(NamedTuple):
    """What a launch takes besides the tensors: sizes, the rule, its switches, the tiles."""

    batch: tuple[int, ...]  # (..., Hq): the query's dimensions before (L, E)
    heads: int  # Hq
    group: int  # query heads per key/value head
    offset: int  # query i sits at key position i + offset
    window: int  # 0: no window
    causal: bool
    scale: float
    q_factor: float  # scale log2(e), or scale / softcap
    cap2: float  # softcap log2(e), or 0
    slopes2: Tensor | None  # ALiBi's slopes times log2(e), (Hq,)
    block_m: int
    block_n: int

    @classmethod
    def of(
        cls,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        is_causal: bool,
        window: int | None,
        scale: float | None,
        align: Alignment,
        softcap: float | None,
        alibi_slopes: Tensor | None,
    ) -> _Launch:
        scale = softmax_scale(query.shape[-1], scale)
        heads = query.shape[-3] if query.ndim > 2 else 1
        kv_heads = key.shape[-3] if key.ndim > 2 else 1
        slopes2 = None
        if alibi_slopes is not None:
            slopes2 = alibi_slopes.to(compute_dtype(query.dtype)).contiguous() * _LOG2_E
        block_m, block_n = tile_sizes(query.shape[-1], value.shape[-1])
        return cls(
            batch=tuple(query.shape[:-2]),
            heads=heads,
            group=heads // kv_heads,
            offset=alignment_offset(query.shape[-2], key.shape[-2], align),
            window=window or 0,
            causal=is_causal_window(is_causal, window),
            scale=scale,
            q_factor=scale * _LOG2_E if softcap is None else scale / softcap,
            cap2=0.0 if softcap is None else softcap * _LOG2_E,
            slopes2=slopes2,
            block_m=block_m,
            block_n=block_n,
        )

    def switches(self, e: int, e_v: int, dtype: torch.dtype) -> dict[str, Any]:
        """The compile-time arguments every kernel of the pass shares."""
        precision = None  # float16/bfloat16/float64: the products' own precision
        if dtype == torch.float32:  # PyTorch's rule for float32 matmuls on a GPU
            tf32 = torch.backends.cuda.matmul.fp32_precision == "tf32"  # or allow_tf32
            precision = "tf32" if tf32 else "ieee"
        return dict(
            ACC=kernels().accumulator(dtype),
            E=e, EV=e_v, BLOCK_E=_padded(e), BLOCK_EV=_padded(e_v), BLOCK_M=self.block_m,
            BLOCK_N=self.block_n, CAUSAL=self.causal, WINDOWED=self.window > 0,
            SOFTCAP=self.cap2 != 0.0, ALIBI=self.slopes2 is not None, PRECISION=precision,
        )  # fmt: skip

    def rule_args(self, t_q: int, t_k: int) -> tuple[Any, ...]:
        """The run-time arguments after the tensors, in the kernels' order."""
        return (
            t_q,
            t_k,
            self.heads,
            self.group,
            self.offset,
            self.window,
            self.q_factor,
            self.cap2,
        )


def _launch_options() -> dict[str, int]:
    """Compiled kernels' warps and pipeline stages (the interpreter takes none)."""
    return {} if kernels().INTERPRET else {"num_warps": 4, "num_stages": 2}


class _TritonFlash(torch.autograd.Function):
    """Saves Q, K, V, O and the log-sum-exp (base 2); the backward runs three kernels."""

    @staticmethod
    def forward(
        ctx: Any, query: Tensor, key: Tensor, value: Tensor, sinks: Tensor | None, launch: _Launch
    ) -> tuple[Tensor, Tensor]:
        q, k, v = query.contiguous(), key.contiguous(), value.contiguous()
        out, lse2, _ = _forward(q, k, v, sinks, launch)
        ctx.save_for_backward(q, k, v, out, lse2, *([] if sinks is None else [sinks]))
        ctx.launch = launch
        ctx.mark_non_differentiable(lse2)
        return out, lse2

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor, _grad_lse: Tensor | None) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse2, *saved_sinks = ctx.saved_tensors
        launch: _Launch = ctx.launch
        k_ = kernels()
        t_q, e = q.shape[-2:]
        t_k, e_v = k.shape[-2], v.shape[-1]
        do = grad_out.contiguous()
        n = math.prod(launch.batch)
        delta = torch.empty_like(lse2)  # D_i = dO_i . O_i
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        switches = launch.switches(e, e_v, q.dtype)
        args = (*launch.rule_args(t_q, t_k), launch.scale)
        slopes2 = _or(launch.slopes2, lse2)
        if t_q > 0 and n > 0:
            rows = n * t_q
            k_.backward_preprocess[(-(-rows // 64),)](
                out, do, delta, rows, EV=e_v, BLOCK_M=64, BLOCK_EV=_padded(e_v),
                ACC=switches["ACC"], **_launch_options(),
            )  # fmt: skip
        if t_q > 0 and t_k > 0 and n > 0:
            kv_programs = (-(-t_k // launch.block_n), n // launch.group)
            k_.backward_dkdv[kv_programs](
                q, k, v, do, lse2, delta, dk, dv, slopes2, *args, **switches,
                **_launch_options(),
            )  # fmt: skip
            q_programs = (-(-t_q // launch.block_m), n)
            k_.backward_dq[q_programs](
                q, k, v, do, lse2, delta, dq, slopes2, *args, **switches, **_launch_options()
            )
        dsinks = None
        for sinks in saved_sinks if ctx.needs_input_grad[3] else []:  # none or one
            # The sink has no value: dsink = -sum_i P_i,sink D_i, P_i,sink = 2^(s2 - lse2_i)
            p_sink = torch.exp2(sinks.to(lse2.dtype)[:, None] * _LOG2_E - lse2)  # (..., Hq, L)
            dsinks = -(p_sink * delta).reshape(-1, launch.heads, t_q).sum(dim=(0, 2))
            dsinks = dsinks.to(sinks.dtype)
        return dq, dk, dv, dsinks, None


def _forward(
    q: Tensor, k: Tensor, v: Tensor, sinks: Tensor | None, launch: _Launch
) -> tuple[Tensor, Tensor, Tensor]:
    """Launch the forward kernel: the output, the log-sum-exp (base 2) and each program's
    count of the key tiles it computed, `(..., Hq, M)`."""
    t_q, e = q.shape[-2:]
    t_k, e_v = k.shape[-2], v.shape[-1]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    n = math.prod(launch.batch)  # batch * Hq
    out = q.new_empty(*launch.batch, t_q, e_v)
    wide = compute_dtype(q.dtype)  # the log-sum-exp's: float32, or float64
    lse2 = torch.empty((*launch.batch, t_q), dtype=wide, device=q.device)
    programs = (-(-t_q // launch.block_m), n)  # a program per tile of queries, per head
    tiles = torch.zeros(n, programs[0], dtype=torch.int32, device=q.device)
    sinks2 = None if sinks is None else sinks.detach().to(wide) * _LOG2_E
    if t_q > 0 and n > 0:
        kernels().forward[programs](
            q, k, v, out, lse2, _or(sinks2, lse2), _or(launch.slopes2, lse2), tiles,
            *launch.rule_args(t_q, t_k), **launch.switches(e, e_v, q.dtype),
            SINKS=sinks2 is not None, **_launch_options(),
        )  # fmt: skip
    return out, lse2, tiles.reshape(*launch.batch, programs[0])


def _or(x: Tensor | None, placeholder: Tensor) -> Tensor:
    """`x`, or a tensor to pass for an argument the kernel's switch leaves unread."""
    return placeholder if x is None else x
