"""Every public entry point rejects bad input at attnlab's boundary, in the caller's terms.

Each case asserts the exception type and the content of the message: the argument's name,
what was expected and what came (shapes, dtypes, devices). Tensors on the `meta` device
stand in for "another device": they exist without memory on every machine.

The second half checks the switch: `set_validation(False)` skips the checks, results are
unchanged, and the context manager restores the setting.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.attention.bias import causal_upper_left

import attnlab
from attnlab import (
    CausalSelfAttention,
    CrossAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttention,
)
from attnlab import functional as AF
from attnlab.article import toy
from attnlab.rules import masks
from attnlab.rules.sizes import Sizes, size

sys.path.insert(0, str(Path(__file__).parent))  # the shared registry, tests/entry_points.py
from entry_points import ENTRIES, make_inputs, make_module, run

# All sizes differ, so a check that compares the wrong two numbers cannot pass by luck.
B, T, S, D_IN, D_CTX, D_KQ, D_V, D_OUT, HEADS = 2, 5, 7, 3, 4, 6, 8, 10, 2

META = "meta"
LONG = torch.long
F64 = torch.float64

Case = tuple[Callable[[], object], type[Exception], str]


def _cases(**cases: Case) -> list[Any]:
    return [
        pytest.param(call, error, pattern, id=name)
        for name, (call, error, pattern) in cases.items()
    ]


def _x(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    if dtype == LONG:
        return torch.ones(*shape, dtype=dtype, device=device)
    return torch.randn(*shape, device=device).to(dtype)


def _context_like(x: object) -> torch.Tensor:
    """A valid context for CrossAttention, batched like `x` when `x` is a 2-d tensor."""
    return _x(S, D_IN) if isinstance(x, torch.Tensor) and x.ndim == 2 else _x(B, S, D_IN)


def _mha(backend: str = "torch", **kwargs: Any) -> MultiHeadAttention:
    return MultiHeadAttention(D_IN, D_OUT, HEADS, backend=backend, **kwargs)  # type: ignore[arg-type]


def _cross_mha(backend: str = "torch") -> MultiHeadAttention:
    return _mha(backend, d_context=D_CTX)


# -- constructors ------------------------------------------------------------------------

CONSTRUCTOR_CASES = _cases(
    sa_d_in_zero=(
        lambda: SelfAttention(0, D_KQ, D_V),
        ValueError,
        "d_in must be a positive int, got 0",
    ),
    sa_d_out_kq_negative=(
        lambda: SelfAttention(D_IN, -2, D_V),
        ValueError,
        "d_out_kq must be a positive int, got -2",
    ),
    sa_d_out_v_float=(
        lambda: SelfAttention(D_IN, D_KQ, 4.0),  # type: ignore[arg-type]
        TypeError,
        r"d_out_v must be a positive int, got 4.0 \(float\)",
    ),
    causal_d_in_bool=(
        lambda: CausalSelfAttention(True, D_KQ, D_V),  # type: ignore[arg-type]
        TypeError,
        r"d_in must be a positive int, got True \(bool\)",
    ),
    cross_d_out_v_zero=(
        lambda: CrossAttention(D_IN, D_KQ, 0),
        ValueError,
        "d_out_v must be a positive int, got 0",
    ),
    wrapper_num_heads_zero=(
        lambda: MultiHeadAttentionWrapper(D_IN, D_KQ, D_V, 0),
        ValueError,
        "num_heads must be a positive int, got 0",
    ),
    wrapper_d_in_zero=(
        lambda: MultiHeadAttentionWrapper(0, D_KQ, D_V, HEADS),
        ValueError,
        "d_in must be a positive int, got 0",
    ),
    mha_d_out_not_multiple=(
        lambda: MultiHeadAttention(D_IN, 9, 2),
        ValueError,
        "d_out must be a multiple of num_heads, got d_out=9 and num_heads=2",
    ),
    mha_num_heads_negative=(
        lambda: MultiHeadAttention(D_IN, D_OUT, -1),
        ValueError,
        "num_heads must be a positive int, got -1",
    ),
    mha_d_context_zero=(
        lambda: MultiHeadAttention(D_IN, D_OUT, HEADS, d_context=0),
        ValueError,
        "d_context must be a positive int, got 0",
    ),
    mha_dropout_one=(
        lambda: MultiHeadAttention(D_IN, D_OUT, HEADS, dropout=1.0),
        ValueError,
        r"dropout must be in \[0, 1\), got 1.0; 1 would drop every attention weight",
    ),
    mha_dropout_negative=(
        lambda: MultiHeadAttention(D_IN, D_OUT, HEADS, dropout=-0.1),
        ValueError,
        r"dropout must be in \[0, 1\), got -0.1",
    ),
    mha_dropout_str=(
        lambda: MultiHeadAttention(D_IN, D_OUT, HEADS, dropout="0.1"),  # type: ignore[arg-type]
        TypeError,
        r"dropout must be a float in \[0, 1\), got '0.1' \(str\)",
    ),
    mha_bias_int=(
        lambda: MultiHeadAttention(D_IN, D_OUT, HEADS, bias=1),  # type: ignore[arg-type]
        TypeError,
        r"bias must be a bool, got 1 \(int\)",
    ),
    mha_backend_unknown=(
        lambda: MultiHeadAttention(D_IN, D_OUT, HEADS, backend="cuda"),  # type: ignore[arg-type]
        ValueError,
        "backend must be one of 'torch', 'scratch', 'flash', 'triton', got 'cuda'",
    ),
    mha_from_torch_dropout_one=(
        lambda: MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, dropout=1.0)),
        ValueError,
        r"dropout must be in \[0, 1\)",
    ),
)


@pytest.mark.parametrize(("call", "error", "pattern"), CONSTRUCTOR_CASES)
def test_constructor_rejects_bad_configuration(
    call: Callable[[], object], error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=pattern):
        call()


# -- the teaching modules' forward -------------------------------------------------------

# Each teaching module, called on its input `x` (CrossAttention also gets a valid context).
TEACHING: dict[str, Callable[[torch.Tensor], object]] = {
    "SelfAttention": lambda x: SelfAttention(D_IN, D_KQ, D_V)(x),
    "SelfAttention.attention_weights": lambda x: SelfAttention(D_IN, D_KQ, D_V).attention_weights(
        x
    ),
    "CausalSelfAttention": lambda x: CausalSelfAttention(D_IN, D_KQ, D_V)(x),
    "CausalSelfAttention.attention_weights": lambda x: CausalSelfAttention(
        D_IN, D_KQ, D_V
    ).attention_weights(x),
    "CrossAttention": lambda x: CrossAttention(D_IN, D_KQ, D_V)(x, _context_like(x)),
    "CrossAttention.attention_weights": lambda x: CrossAttention(D_IN, D_KQ, D_V).attention_weights(
        x, _context_like(x)
    ),
    "MultiHeadAttentionWrapper": lambda x: MultiHeadAttentionWrapper(D_IN, D_KQ, D_V, HEADS)(x),
}

OWNER = {name: name.split(".")[0] for name in TEACHING}


@pytest.mark.parametrize("entry", TEACHING)
@pytest.mark.parametrize(
    ("make_x", "error", "pattern"),
    [
        pytest.param(
            lambda: _x(T, 5),
            ValueError,
            r"x has 5 features but {owner} expects d_in=3 \(x.shape=\(5, 5\)\)",
            id="features",
        ),
        pytest.param(
            lambda: _x(T),
            ValueError,
            r"x must have 2 or 3 dimensions \(t, d_in\) or \(b, t, d_in\), got 1 "
            r"\(x.shape=\(5,\)\)",
            id="rank1",
        ),
        pytest.param(
            lambda: _x(1, B, T, D_IN),
            ValueError,
            r"x must have 2 or 3 dimensions .* got 4 \(x.shape=\(1, 2, 5, 3\)\)",
            id="rank4",
        ),
        pytest.param(
            lambda: _x(B, T, D_IN, dtype=LONG),
            TypeError,
            r"x must have a floating-point dtype, got torch.int64 \(x.shape=\(2, 5, 3\)\)",
            id="integer_dtype",
        ),
        pytest.param(
            lambda: [[1.0, 2.0, 3.0]],
            TypeError,
            "x must be a torch.Tensor, got list",
            id="not_a_tensor",
        ),
        pytest.param(
            lambda: _x(B, T, D_IN, dtype=F64),
            ValueError,
            r"x has dtype torch.float64 but {owner}'s parameters are torch.float32",
            id="dtype_vs_parameters",
        ),
        pytest.param(
            lambda: _x(B, T, D_IN, device=META),
            ValueError,
            r"x is on meta but {owner}'s parameters are on cpu",
            id="device_vs_parameters",
        ),
    ],
)
def test_teaching_module_rejects_bad_x(
    entry: str, make_x: Callable[[], Any], error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=pattern.format(owner=OWNER[entry])):
        TEACHING[entry](make_x())


CROSS_CASES = _cases(
    context_features=(
        lambda: CrossAttention(D_IN, D_KQ, D_V)(_x(B, T, D_IN), _x(B, S, 5)),
        ValueError,
        r"context has 5 features but CrossAttention expects d_in=3 \(context.shape=\(2, 7, 5\)\)",
    ),
    context_rank=(
        lambda: CrossAttention(D_IN, D_KQ, D_V)(_x(B, T, D_IN), _x(D_IN)),
        ValueError,
        r"context must have 2 or 3 dimensions .* got 1 \(context.shape=\(3,\)\)",
    ),
    context_integer=(
        lambda: CrossAttention(D_IN, D_KQ, D_V)(_x(B, T, D_IN), _x(B, S, D_IN, dtype=LONG)),
        TypeError,
        "context must have a floating-point dtype, got torch.int64",
    ),
    context_dtype=(
        lambda: CrossAttention(D_IN, D_KQ, D_V)(_x(B, T, D_IN), _x(B, S, D_IN, dtype=F64)),
        ValueError,
        "context has dtype torch.float64 but CrossAttention's parameters are torch.float32",
    ),
    context_device=(
        lambda: CrossAttention(D_IN, D_KQ, D_V)(_x(B, T, D_IN), _x(B, S, D_IN, device=META)),
        ValueError,
        "context is on meta but CrossAttention's parameters are on cpu",
    ),
    context_batch=(
        lambda: CrossAttention(D_IN, D_KQ, D_V)(_x(B, T, D_IN), _x(3, S, D_IN)),
        ValueError,
        r"same batch size, got x.shape=\(2, 5, 3\) and context.shape=\(3, 7, 3\)",
    ),
    context_batched_x_unbatched=(
        lambda: CrossAttention(D_IN, D_KQ, D_V).attention_weights(_x(T, D_IN), _x(B, S, D_IN)),
        ValueError,
        r"both be unbatched .* x.shape=\(5, 3\) and context.shape=\(2, 7, 3\)",
    ),
)


@pytest.mark.parametrize(("call", "error", "pattern"), CROSS_CASES)
def test_cross_attention_rejects_bad_context(
    call: Callable[[], object], error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=pattern):
        call()


# -- MultiHeadAttention's forward and attention_weights ----------------------------------

MHA_CASES = _cases(
    x_features=(
        lambda m: m(_x(B, T, 5), _x(B, S, D_CTX)),
        ValueError,
        r"x has 5 features but MultiHeadAttention expects d_in=3 \(x.shape=\(2, 5, 5\)\)",
    ),
    context_features=(
        lambda m: m(_x(B, T, D_IN), _x(B, S, 6)),
        ValueError,
        r"context has 6 features but MultiHeadAttention expects d_context=4 "
        r"\(context.shape=\(2, 7, 6\)\)",
    ),
    context_required=(
        lambda m: m(_x(B, T, D_IN)),
        ValueError,
        "context is required: this module's keys and values have d_context=4 features but x "
        "has d_in=3",
    ),
    x_rank=(
        lambda m: m(_x(1, B, T, D_IN), _x(B, S, D_CTX)),
        ValueError,
        r"x must have 2 or 3 dimensions \(t, d_in\) or \(b, t, d_in\), got 4",
    ),
    context_rank=(
        lambda m: m(_x(B, T, D_IN), _x(D_CTX)),
        ValueError,
        r"context must have 2 or 3 dimensions \(t, d_context\) or \(b, t, d_context\), got 1",
    ),
    x_integer=(
        lambda m: m(_x(B, T, D_IN, dtype=LONG), _x(B, S, D_CTX)),
        TypeError,
        r"x must have a floating-point dtype, got torch.int64 \(x.shape=\(2, 5, 3\)\)",
    ),
    context_integer=(
        lambda m: m(_x(B, T, D_IN), _x(B, S, D_CTX, dtype=torch.int32)),
        TypeError,
        "context must have a floating-point dtype, got torch.int32",
    ),
    x_dtype=(
        lambda m: m(_x(B, T, D_IN, dtype=F64), _x(B, S, D_CTX, dtype=F64)),
        ValueError,
        r"x has dtype torch.float64 but MultiHeadAttention's parameters are torch.float32; "
        r"convert one of them \(e.g. module.to\(torch.float64\)\)",
    ),
    context_dtype_differs_from_x=(
        lambda m: m(_x(B, T, D_IN), _x(B, S, D_CTX, dtype=torch.bfloat16)),
        ValueError,
        "context has dtype torch.bfloat16 but MultiHeadAttention's parameters are torch.float32",
    ),
    x_device=(
        lambda m: m(_x(B, T, D_IN, device=META), _x(B, S, D_CTX)),
        ValueError,
        "x is on meta but MultiHeadAttention's parameters are on cpu",
    ),
    context_device=(
        lambda m: m(_x(B, T, D_IN), _x(B, S, D_CTX, device=META)),
        ValueError,
        "context is on meta but MultiHeadAttention's parameters are on cpu",
    ),
    context_batch=(
        lambda m: m(_x(B, T, D_IN), _x(3, S, D_CTX)),
        ValueError,
        r"same batch size, got x.shape=\(2, 5, 3\) and context.shape=\(3, 7, 4\)",
    ),
    mask_shape=(
        lambda m: m(_x(B, T, D_IN), _x(B, S, D_CTX), attn_mask=torch.ones(T, T, dtype=torch.bool)),
        ValueError,
        r"attn_mask of shape \(5, 5\) does not broadcast to the attention weights' shape "
        r"\(2, 2, 5, 7\)",
    ),
    mask_padding_layout=(
        lambda m: m(_x(B, T, D_IN), _x(B, S, D_CTX), attn_mask=torch.ones(B, S, dtype=torch.bool)),
        ValueError,
        r"\(2, 7\) does not broadcast.*mask\[:, None, None, :\]",
    ),
    mask_dtype=(
        lambda m: m(_x(B, T, D_IN), _x(B, S, D_CTX), attn_mask=torch.ones(T, S, dtype=LONG)),
        TypeError,
        r"attn_mask must be a bool tensor \(True = attend\) or a float tensor of x's dtype "
        r"torch.float32 .* got torch.int64 \(attn_mask.shape=\(5, 7\)\)",
    ),
    mask_not_tensor=(
        lambda m: m(_x(B, T, D_IN), _x(B, S, D_CTX), attn_mask=[[True]]),
        TypeError,
        "attn_mask must be a torch.Tensor or None, got list",
    ),
    mask_device=(
        lambda m: m(
            _x(B, T, D_IN),
            _x(B, S, D_CTX),
            attn_mask=torch.ones(T, S, dtype=torch.bool, device=META),
        ),
        ValueError,
        "attn_mask is on meta but x is on cpu",
    ),
    mask_and_is_causal=(
        lambda m: m(
            _x(B, T, D_IN),
            _x(B, S, D_CTX),
            attn_mask=torch.ones(T, S, dtype=torch.bool),
            is_causal=True,
        ),
        ValueError,
        r"pass either attn_mask or is_causal=True, not both",
    ),
    is_causal_not_bool=(
        lambda m: m(_x(B, T, D_IN), _x(B, S, D_CTX), is_causal=1),
        TypeError,
        r"is_causal must be a bool, got 1 \(int\)",
    ),
)


# No backend axis: the checks run before the backend is chosen.
@pytest.mark.parametrize("method", ["forward", "attention_weights"])
@pytest.mark.parametrize(("call", "error", "pattern"), MHA_CASES)
def test_multihead_rejects_bad_input(
    call: Callable[[Any], object], error: type[Exception], pattern: str, method: str
) -> None:
    module = _cross_mha()
    target = module if method == "forward" else module.attention_weights
    with pytest.raises(error, match=pattern):
        call(target)


def test_multihead_backend_assignment_rejected() -> None:
    module = _mha()
    pattern = "backend must be one of 'torch', 'scratch', 'flash', 'triton', got 'cuda'"
    with pytest.raises(ValueError, match=pattern):
        module.backend = "cuda"  # type: ignore[assignment]
    assert module.backend == "torch"


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"attn_mask": torch.ones(T, S, dtype=torch.bool)}, "backend='flash' takes no attn_mask"),
        ({"key_padding_mask": torch.zeros(B, S, dtype=torch.bool)}, "or key_padding_mask"),
    ],
)
def test_multihead_flash_refuses_a_mask(kwargs: dict[str, Any], pattern: str) -> None:
    module = _cross_mha("flash")
    with pytest.raises(ValueError, match=pattern):
        module(_x(B, T, D_IN), _x(B, S, D_CTX), **kwargs)
    # The weights do not run on a backend: they take the mask.
    out, weights = module(_x(B, T, D_IN), _x(B, S, D_CTX), need_weights=True, **kwargs)
    assert weights.shape == (B, T, S)
    assert torch.isfinite(out).all()


def test_multihead_flash_refuses_dropout_in_training_only() -> None:
    module = _mha("flash", dropout=0.1)
    x = _x(B, T, D_IN)
    with pytest.raises(ValueError, match=r"backend='flash' has no dropout, but dropout_p=0\.1"):
        module(x)
    with attnlab.validation(False), pytest.raises(ValueError, match="has no dropout"):
        module(x)  # not a check of the input: a request flash cannot serve
    module.eval()
    torch.testing.assert_close(module(x), _mha_like(module, "torch")(x))


def _mha_like(module: MultiHeadAttention, backend: str) -> MultiHeadAttention:
    twin = _mha(backend, dropout=module.dropout)
    twin.load_state_dict(module.state_dict())
    return twin.train(module.training)


def test_multihead_window_checks() -> None:
    module = _mha()
    with pytest.raises(ValueError, match="window must be a positive int, got 0"):
        module(_x(B, T, D_IN), window=0)
    with pytest.raises(ValueError, match="pass either attn_mask or window, not both"):
        module(_x(B, T, D_IN), window=2, attn_mask=torch.ones(T, T, dtype=torch.bool))


# -- every entry point of the shared registry -----------------------------------------------

# Inputs the registry's call reads a dtype from to build something else (a mask, a cache):
# an integer one fails there, in the test's helper, not at attnlab's boundary.
_BUILT_FROM = {("scaled_dot_product_attention additive mask", "q"), ("StaticKVCache.update", "k")}
# The delta rule's entries make unit keys and gates in (0, 1) from their inputs first.
_BUILT_FROM |= {(f"delta_rule {m}", k) for m in ("chunk", "recurrent") for k in ("k", "beta", "g")}


def _one_per_backend() -> list[str]:
    """The registry's entries, one of each group that differs only in `[backend]`.

    The checks run before a module dispatches to its backend, so testing bad input once
    per backend would test the same code three times.
    """
    seen: set[str] = set()
    names = []
    for name in ENTRIES:
        key = re.sub(r"\[\w+\]", "", name)
        if key not in seen:
            seen.add(key)
            names.append(name)
    return names


PRE_DISPATCH = _one_per_backend()


def test_bad_input_suites_test_each_module_once_whatever_its_backend() -> None:
    assert "MultiHeadAttention[torch] causal" in PRE_DISPATCH
    assert "MultiHeadAttention[scratch] causal" not in PRE_DISPATCH
    assert "MultiHeadAttention[flash] causal" not in PRE_DISPATCH
    assert "MultiHeadAttention[scratch] need_weights" in PRE_DISPATCH  # no other backend


@pytest.mark.parametrize(
    ("name", "key"),
    [(n, k) for n in PRE_DISPATCH for k in ENTRIES[n].shapes if (n, k) not in _BUILT_FROM],
)
def test_every_entry_point_rejects_an_integer_input_by_name(name: str, key: str) -> None:
    entry = ENTRIES[name]
    inputs = make_inputs(entry)
    inputs[key] = inputs[key].long()
    argument = entry.names.get(key, key)
    with pytest.raises(TypeError, match=rf"^{re.escape(argument)} .*torch\.int64"):
        run(entry, inputs, make_module(entry))


@pytest.mark.parametrize(
    ("name", "key"),
    [
        (n, k)
        for n in PRE_DISPATCH
        for k in ENTRIES[n].shapes
        # something else to be on another device:
        if len(ENTRIES[n].shapes) > 1 or ENTRIES[n].build is not None
    ],
)
def test_every_entry_point_rejects_an_input_on_another_device(name: str, key: str) -> None:
    entry = ENTRIES[name]
    inputs = make_inputs(entry)
    inputs[key] = inputs[key].to(META)
    argument = re.escape(entry.names.get(key, key))
    with pytest.raises(ValueError, match=rf"\b{argument}\b.* on meta|on meta.*\b{argument}\b"):
        run(entry, inputs, make_module(entry))


@pytest.mark.parametrize("name", list(ENTRIES))
def test_every_entry_point_gives_the_same_result_without_validation(name: str) -> None:
    entry = ENTRIES[name]
    module, inputs = make_module(entry), make_inputs(entry)
    checked = run(entry, inputs, module)
    with attnlab.validation(False):
        unchecked = run(entry, inputs, module)
    torch.testing.assert_close(unchecked, checked, rtol=0, atol=0)


# -- attnlab.functional -------------------------------------------------------------------

FUNCTIONAL_CASES = _cases(
    scores_not_tensor=(
        lambda: AF.attention_scores([[1.0]], _x(S, D_KQ)),  # type: ignore[arg-type]
        TypeError,
        "queries must be a torch.Tensor, got list",
    ),
    scores_integer=(
        lambda: AF.attention_scores(_x(T, D_KQ), _x(S, D_KQ, dtype=LONG)),
        TypeError,
        r"keys must have a floating-point dtype, got torch.int64 \(keys.shape=\(7, 6\)\)",
    ),
    scores_keys_rank=(
        lambda: AF.attention_scores(_x(T, D_KQ), _x(D_KQ)),
        ValueError,
        r"keys must have at least 2 dimensions \(..., t_k, d_k\), got 1 \(keys.shape=\(6,\)\)",
    ),
    scores_features=(
        lambda: AF.attention_scores(_x(T, D_KQ), _x(S, 4)),
        ValueError,
        r"same feature size d_k, got queries.shape=\(5, 6\) and keys.shape=\(7, 4\)",
    ),
    scores_dtype=(
        lambda: AF.attention_scores(_x(T, D_KQ), _x(S, D_KQ, dtype=F64)),
        ValueError,
        "keys has dtype torch.float64 but queries has dtype torch.float32; they must match",
    ),
    scores_device=(
        lambda: AF.attention_scores(_x(T, D_KQ), _x(S, D_KQ, device=META)),
        ValueError,
        "keys is on meta but queries is on cpu",
    ),
    scores_batch=(
        lambda: AF.attention_scores(_x(2, T, D_KQ), _x(3, S, D_KQ)),
        ValueError,
        r"the batch dimensions of queries and keys do not broadcast: queries \(2,\), keys \(3,\)",
    ),
    softmax_integer=(
        lambda: AF.scaled_softmax(_x(T, S, dtype=LONG), d_k=D_KQ),
        TypeError,
        r"scores must have a floating-point dtype, got torch.int64 \(scores.shape=\(5, 7\)\)",
    ),
    softmax_0d=(
        lambda: AF.scaled_softmax(torch.tensor(1.0), d_k=D_KQ),
        ValueError,
        r"scores must have at least 1 dimension \(..., t_q, t_k\), got 0",
    ),
    softmax_d_k_zero=(
        lambda: AF.scaled_softmax(_x(T, S), d_k=0),
        ValueError,
        "d_k must be a positive int, got 0",
    ),
    softmax_d_k_float=(
        lambda: AF.scaled_softmax(_x(T, S), d_k=6.0),  # type: ignore[arg-type]
        TypeError,
        r"d_k must be a positive int, got 6.0 \(float\)",
    ),
    softmax_mask_dtype=(
        lambda: AF.scaled_softmax(_x(T, S), d_k=D_KQ, mask=torch.ones(T, S)),
        TypeError,
        r"mask must be a bool tensor \(True = attend\), got torch.float32",
    ),
    softmax_mask_shape=(
        lambda: AF.scaled_softmax(_x(T, S), d_k=D_KQ, mask=torch.ones(S, T, dtype=torch.bool)),
        ValueError,
        r"mask of shape \(7, 5\) does not broadcast to the scores' shape \(5, 7\)",
    ),
    softmax_mask_grows_scores=(
        lambda: AF.scaled_softmax(_x(T, S), d_k=D_KQ, mask=torch.ones(B, T, S, dtype=torch.bool)),
        ValueError,
        r"mask of shape \(2, 5, 7\) does not broadcast to the scores' shape \(5, 7\)",
    ),
    softmax_mask_device=(
        lambda: AF.scaled_softmax(
            _x(T, S), d_k=D_KQ, mask=torch.ones(T, S, dtype=torch.bool, device=META)
        ),
        ValueError,
        "mask is on meta but scores is on cpu",
    ),
    context_integer=(
        lambda: AF.context_vectors(_x(T, S, dtype=LONG), _x(S, D_V)),
        TypeError,
        "weights must have a floating-point dtype, got torch.int64",
    ),
    context_values_rank=(
        lambda: AF.context_vectors(_x(T, S), _x(S)),
        ValueError,
        r"values must have at least 2 dimensions \(..., t_k, d_v\), got 1 \(values.shape=\(7,\)\)",
    ),
    context_positions=(
        lambda: AF.context_vectors(_x(T, S), _x(6, D_V)),
        ValueError,
        r"weights has 7 keys per query but values has 6 positions; they must match "
        r"\(weights.shape=\(5, 7\), values.shape=\(6, 8\)\)",
    ),
    context_dtype=(
        lambda: AF.context_vectors(_x(T, S), _x(S, D_V, dtype=torch.bfloat16)),
        ValueError,
        "values has dtype torch.bfloat16 but weights has dtype torch.float32",
    ),
    context_device=(
        lambda: AF.context_vectors(_x(T, S), _x(S, D_V, device=META)),
        ValueError,
        "values is on meta but weights is on cpu",
    ),
    context_batch=(
        lambda: AF.context_vectors(_x(2, T, S), _x(3, S, D_V)),
        ValueError,
        r"batch dimensions of weights and values do not broadcast: weights \(2,\), values \(3,\)",
    ),
    masks_causal_negative=(
        lambda: masks.causal(-1),
        ValueError,
        "t_q must be a non-negative int, got -1",
    ),
    masks_causal_float=(
        lambda: masks.causal(3, 2.0),  # type: ignore[arg-type]
        TypeError,
        r"t_k must be a non-negative int, got 2.0 \(float\)",
    ),
    masks_causal_device_name=(
        lambda: masks.causal(3, device="gpu0"),
        ValueError,
        "device must name a device such as 'cpu' or 'cuda:0', got 'gpu0'",
    ),
    masks_causal_device_type=(
        lambda: masks.causal(3, device=1.5),  # type: ignore[arg-type]
        TypeError,
        r"device must be a torch.device, a string such as 'cpu' or 'cuda:0', or None, got 1.5",
    ),
)


@pytest.mark.parametrize(("call", "error", "pattern"), FUNCTIONAL_CASES)
def test_functional_rejects_bad_input(
    call: Callable[[], object], error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=pattern):
        call()


def _sdpa_args() -> dict[str, Any]:
    # (b, heads, t, features), with L=5 queries, S=7 keys, E=6, Ev=8.
    return {"query": _x(B, 3, T, D_KQ), "key": _x(B, 3, S, D_KQ), "value": _x(B, 3, S, D_V)}


# Cases shared by scaled_dot_product_attention and attention_weights (which takes no value).
ATTENTION_CASES = _cases(
    query_not_tensor=({"query": [[1.0]]}, TypeError, "query must be a torch.Tensor, got list"),
    query_integer=(
        {"query": _x(B, 3, T, D_KQ, dtype=LONG)},
        TypeError,
        r"query must have a floating-point dtype, got torch.int64 \(query.shape=\(2, 3, 5, 6\)\)",
    ),
    query_rank=(
        {"query": _x(D_KQ)},
        ValueError,
        r"query must have at least 2 dimensions \(..., L, E\), got 1 \(query.shape=\(6,\)\)",
    ),
    key_features=(
        {"key": _x(B, 3, S, 4)},
        ValueError,
        r"key has 4 features but query expects E=6 \(key.shape=\(2, 3, 7, 4\)\)",
    ),
    key_dtype=(
        {"key": _x(B, 3, S, D_KQ, dtype=F64)},
        ValueError,
        "key has dtype torch.float64 but query has dtype torch.float32; they must match",
    ),
    key_device=(
        {"key": _x(B, 3, S, D_KQ, device=META)},
        ValueError,
        "key is on meta but query is on cpu; they must be on the same device",
    ),
    batch_not_broadcast=(
        {"key": _x(B, 2, S, D_KQ)},
        ValueError,
        r"do not broadcast: query.shape=\(2, 3, 5, 6\), key.shape=\(2, 2, 7, 6\).*enable_gqa=True",
    ),
    gqa_heads_do_not_divide=(
        {"key": _x(B, 2, S, D_KQ), "enable_gqa": True},
        ValueError,
        r"with enable_gqa=True the 2 heads of key must divide the 3 heads of query",
    ),
    gqa_rank=(
        {"query": _x(T, D_KQ), "key": _x(S, D_KQ), "enable_gqa": True},
        ValueError,
        r"query must have at least 3 dimensions \(..., Hq, L, E\) with enable_gqa=True, got 2",
    ),
    mask_shape=(
        {"attn_mask": torch.ones(T, T, dtype=torch.bool)},
        ValueError,
        r"attn_mask of shape \(5, 5\) does not broadcast to the attention weights' shape "
        r"\(2, 3, 5, 7\) \(batch..., L queries, S keys\)",
    ),
    mask_dtype=(
        {"attn_mask": torch.ones(T, S, dtype=torch.int8)},
        TypeError,
        r"attn_mask must be a bool tensor \(True = attend\) or a float tensor of query's dtype "
        r"torch.float32 to add to the scores, got torch.int8",
    ),
    mask_float64_for_float32=(
        {"attn_mask": torch.zeros(T, S, dtype=F64)},
        TypeError,
        "attn_mask must be a bool tensor .* got torch.float64",
    ),
    mask_device=(
        {"attn_mask": torch.ones(T, S, dtype=torch.bool, device=META)},
        ValueError,
        "attn_mask is on meta but query is on cpu",
    ),
    mask_and_is_causal=(
        {"attn_mask": torch.ones(T, S, dtype=torch.bool), "is_causal": True},
        ValueError,
        r"pass either attn_mask or is_causal=True, not both; to combine them, build the causal "
        r"mask \(attnlab.rules.masks.causal\)",
    ),
    dropout_one=(
        {"dropout_p": 1.0},
        ValueError,
        r"dropout_p must be in \[0, 1\), got 1.0; 1 would drop every attention weight",
    ),
    dropout_negative=({"dropout_p": -0.5}, ValueError, r"dropout_p must be in \[0, 1\), got -0.5"),
    dropout_type=(
        {"dropout_p": None},
        TypeError,
        r"dropout_p must be a float in \[0, 1\), got None \(NoneType\)",
    ),
    is_causal_type=(
        {"is_causal": "yes"},
        TypeError,
        r"is_causal must be a bool, got 'yes' \(str\)",
    ),
    enable_gqa_type=({"enable_gqa": 0}, TypeError, r"enable_gqa must be a bool, got 0 \(int\)"),
    scale_inf=({"scale": float("inf")}, ValueError, "scale must be finite, got inf"),
    scale_type=({"scale": "1/8"}, TypeError, r"scale must be a float or None, got '1/8' \(str\)"),
    scale_bool=({"scale": True}, TypeError, r"scale must be a float or None, got True \(bool\)"),
    scale_tensor_of_one_element=(
        {"scale": torch.tensor([0.5])},
        TypeError,
        r"scale must be a float, a 0-d real tensor or None, got a tensor of dtype "
        r"torch.float32 and shape \(1,\)",
    ),
    scale_bool_tensor=(
        {"scale": torch.tensor(True)},
        TypeError,
        r"scale must be a float, a 0-d real tensor or None, got a tensor of dtype torch.bool",
    ),
    scale_nan_tensor=({"scale": torch.tensor(float("nan"))}, ValueError, "scale must be finite"),
    causal_bias_sizes=(
        {"attn_mask": causal_upper_left(T, T)},
        ValueError,
        r"attn_mask is a CausalBias for L=5 queries and S=5 keys, but the attention weights "
        r"have shape \(2, 3, 5, 7\) \(batch..., L queries, S keys\)",
    ),
    causal_bias_and_is_causal=(
        {"attn_mask": causal_upper_left(T, S), "is_causal": True},
        ValueError,
        "pass either attn_mask or is_causal=True, not both",
    ),
)

VALUE_CASES = _cases(
    value_integer=(
        {"value": _x(B, 3, S, D_V, dtype=LONG)},
        TypeError,
        "value must have a floating-point dtype, got torch.int64",
    ),
    value_positions=(
        {"value": _x(B, 3, 6, D_V)},
        ValueError,
        r"key and value must have the same number of positions S, got key.shape=\(2, 3, 7, 6\) "
        r"and value.shape=\(2, 3, 6, 8\)",
    ),
    value_dtype=(
        {"value": _x(B, 3, S, D_V, dtype=torch.bfloat16)},
        ValueError,
        "value has dtype torch.bfloat16 but query has dtype torch.float32",
    ),
    value_device=(
        {"value": _x(B, 3, S, D_V, device=META)},
        ValueError,
        "value is on meta but query is on cpu",
    ),
    value_rank=({"value": _x(D_V)}, ValueError, r"value must have at least 2 dimensions"),
    value_gqa_heads=(
        {"key": _x(B, 1, S, D_KQ), "value": _x(B, 2, S, D_V), "enable_gqa": True},
        ValueError,
        "with enable_gqa=True the 2 heads of value must divide the 3 heads of query",
    ),
)


@pytest.mark.parametrize(("change", "error", "pattern"), ATTENTION_CASES + VALUE_CASES)
def test_scaled_dot_product_attention_rejects_bad_input(
    change: dict[str, Any], error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=pattern):
        AF.scaled_dot_product_attention(**{**_sdpa_args(), **change})


@pytest.mark.parametrize(("change", "error", "pattern"), ATTENTION_CASES)
def test_attention_weights_rejects_bad_input(
    change: dict[str, Any], error: type[Exception], pattern: str
) -> None:
    args = {k: v for k, v in _sdpa_args().items() if k != "value"}
    with pytest.raises(error, match=pattern):
        AF.attention_weights(**{**args, **change})


# flash_attention's own cases live in tests/test_flash.py; these add the devices and the
# kinds of input the issue lists that are not there.
FLASH_CASES = _cases(
    not_tensor=({"value": [[1.0]]}, TypeError, "value must be a torch.Tensor, got list"),
    key_device=(
        {"key": _x(B, S, D_KQ, device=META)},
        ValueError,
        "key is on meta but query is on cpu",
    ),
    key_dtype=(
        {"key": _x(B, S, D_KQ, dtype=torch.bfloat16)},
        ValueError,
        "key has dtype torch.bfloat16 but query has dtype torch.float32",
    ),
    fewer_key_heads=(
        {"key": _x(B, 1, S, D_KQ), "value": _x(B, 1, S, D_V), "query": _x(B, 2, T, D_KQ)},
        ValueError,
        r"same batch \(and head\) dimensions .* query.shape=\(2, 2, 5, 6\), "
        r"key.shape=\(2, 1, 7, 6\)",
    ),
    value_integer=(
        {"value": _x(B, S, D_V, dtype=LONG)},
        TypeError,
        "value must have a floating-point dtype, got torch.int64",
    ),
    scale_type=({"scale": "0.1"}, TypeError, "scale must be a float or None, got '0.1'"),
)


@pytest.mark.parametrize(("change", "error", "pattern"), FLASH_CASES)
def test_flash_attention_rejects_bad_input(
    change: dict[str, Any], error: type[Exception], pattern: str
) -> None:
    args = {"query": _x(B, T, D_KQ), "key": _x(B, S, D_KQ), "value": _x(B, S, D_V), **change}
    with pytest.raises(error, match=pattern):
        AF.flash_attention(**args)


# -- masks, toy, plotting ---------------------------------------------------------------

BUILDER_CASES = _cases(
    causal_device=(
        lambda: masks.causal(3, device="tpu"),
        ValueError,
        "device must name a device such as 'cpu' or 'cuda:0', got 'tpu'",
    ),
    sliding_window_device=(
        lambda: masks.sliding_window(3, window=2, device=object()),  # type: ignore[arg-type]
        TypeError,
        "device must be a torch.device, a string such as 'cpu' or 'cuda:0', or None, got <object",
    ),
    sliding_window_float=(
        lambda: masks.sliding_window(3, window=1.5),  # type: ignore[arg-type]
        TypeError,
        r"window must be a positive int, got 1.5 \(float\)",
    ),
    padding_device=(
        lambda: masks.padding([2, 3], device="nowhere"),
        ValueError,
        "device must name a device such as 'cpu' or 'cuda:0', got 'nowhere'",
    ),
    key_padding_too_long=(
        lambda: masks.key_padding([2, 5], max_len=4),
        ValueError,
        r"lengths must be at most max_len=4, got \[2, 5\]",
    ),
    key_padding_float_lengths=(
        lambda: masks.key_padding([2, 1.5]),  # type: ignore[list-item]
        TypeError,
        r"lengths\[1\] must be a non-negative int, got 1.5 \(float\)",
    ),
    blocked_to_allowed_float=(
        lambda: masks.blocked_to_allowed(torch.zeros(3)),
        TypeError,
        "mask must be a bool tensor, got a torch.float32 tensor",
    ),
    allowed_to_blocked_list=(
        lambda: masks.allowed_to_blocked([True]),  # type: ignore[arg-type]
        TypeError,
        "mask must be a bool tensor, got list",
    ),
    toy_build_vocab_not_str=(
        lambda: toy.build_vocab(["Life", "is"]),  # type: ignore[arg-type]
        TypeError,
        "sentence must be a str, got list",
    ),
    toy_encode_not_str=(lambda: toy.encode(42), TypeError, "sentence must be a str, got int"),  # type: ignore[arg-type]
    toy_encode_vocab_not_dict=(
        lambda: toy.encode("a b", vocab=["a", "b"]),  # type: ignore[arg-type]
        TypeError,
        "vocab must be a dict of word -> index, got list",
    ),
    toy_embed_vocab_too_small=(
        lambda: toy.embed_sentence(vocab_size=4),
        ValueError,
        "vocab_size must be at least the number of distinct words in sentence, 6, got vocab_size=4",
    ),
    toy_embed_d_zero=(
        lambda: toy.embed_sentence(d=0),
        ValueError,
        "d must be a positive int, got 0",
    ),
    toy_embed_seed_float=(
        lambda: toy.embed_sentence(seed=1.5),  # type: ignore[arg-type]
        TypeError,
        r"seed must be an int, got 1.5 \(float\)",
    ),
)


@pytest.mark.parametrize(("call", "error", "pattern"), BUILDER_CASES)
def test_masks_and_toy_reject_bad_input(
    call: Callable[[], object], error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=pattern):
        call()


def _heatmap(weights: Any, rows: Any = ("a", "b"), cols: Any = ("x", "y", "z"), **kw: Any) -> Any:
    from attnlab.tools.plotting import heatmap

    return heatmap(weights, rows, cols, **kw)


def _figure_to_svg(fig: Any) -> str:
    from attnlab.tools.plotting import figure_to_svg

    return figure_to_svg(fig)


PLOTTING_CASES = _cases(
    heatmap_rank=(
        lambda: _heatmap(torch.rand(2, 3, 1)),
        ValueError,
        r"weights must have 2 dimensions \(rows, cols\), got 3 \(weights.shape=\(2, 3, 1\)\)",
    ),
    heatmap_empty=(
        lambda: _heatmap(torch.rand(0, 3), rows=[]),
        ValueError,
        r"weights is empty \(weights.shape=\(0, 3\)\): there is no weight to draw",
    ),
    heatmap_nan=(
        lambda: _heatmap(torch.tensor([[0.5, float("nan"), 0.5], [1.0, 0.0, 0.0]])),
        ValueError,
        "weights must be finite to be drawn, got NaN or inf",
    ),
    heatmap_strings=(
        lambda: _heatmap([["a", "b", "c"], ["d", "e", "f"]]),
        TypeError,
        "weights must be a 2-d tensor, array or nested list of numbers, got list",
    ),
    heatmap_bool=(
        lambda: _heatmap(torch.ones(2, 3, dtype=torch.bool)),
        TypeError,
        "weights must hold real numbers, got a torch.bool tensor",
    ),
    heatmap_label_string=(
        lambda: _heatmap(torch.rand(2, 3), rows="ab"),
        TypeError,
        "row_labels must be a sequence of labels, one per row, got str",
    ),
    heatmap_label_count=(
        lambda: _heatmap(torch.rand(2, 3), cols=["x", "y"]),
        ValueError,
        "col_labels has 2 labels but weights has 3 columns",
    ),
    heatmap_vmax_below_vmin=(
        lambda: _heatmap(torch.rand(2, 3), vmin=0.5, vmax=0.1),
        ValueError,
        "vmax must not be below vmin, got vmin=0.5 and vmax=0.1",
    ),
    figure_to_svg_not_figure=(
        lambda: _figure_to_svg("fig"),
        TypeError,
        "fig must be a matplotlib Figure, got str",
    ),
)


@pytest.mark.parametrize(("call", "error", "pattern"), PLOTTING_CASES)
def test_plotting_rejects_bad_input(
    call: Callable[[], object], error: type[Exception], pattern: str
) -> None:
    pytest.importorskip("matplotlib")
    with pytest.raises(error, match=pattern):
        call()


# -- the switch ---------------------------------------------------------------------------


@pytest.fixture
def _restore_validation() -> Any:
    yield
    attnlab.set_validation(True)


def _enter(manager: Any) -> None:
    with manager:
        pass


@pytest.mark.parametrize(
    "call",
    [
        lambda: attnlab.set_validation(1),  # type: ignore[arg-type]
        lambda: attnlab.set_validation("off"),  # type: ignore[arg-type]
        lambda: _enter(attnlab.validation(None)),  # type: ignore[arg-type]
    ],
    ids=["int", "str", "context_manager_none"],
)
@pytest.mark.usefixtures("_restore_validation")
def test_set_validation_rejects_non_bool(call: Callable[[], object]) -> None:
    with pytest.raises(TypeError, match="enabled must be a bool, got"):
        call()
    assert attnlab.is_validation_enabled()


def test_validation_is_on_by_default() -> None:
    assert attnlab.is_validation_enabled() is True


@pytest.mark.usefixtures("_restore_validation")
def test_set_validation_off_skips_the_checks() -> None:
    module = SelfAttention(D_IN, D_KQ, D_V)
    attnlab.set_validation(False)
    assert attnlab.is_validation_enabled() is False
    # The same mistake now reaches PyTorch, which names neither the argument nor the module.
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        module(_x(T, 5))
    attnlab.set_validation(True)
    with pytest.raises(ValueError, match="x has 5 features but SelfAttention expects d_in=3"):
        module(_x(T, 5))


def test_validation_context_manager_restores_the_setting_even_on_error() -> None:
    with attnlab.validation(False):
        assert not attnlab.is_validation_enabled()
        with attnlab.validation(True):
            assert attnlab.is_validation_enabled()
        assert not attnlab.is_validation_enabled()
    assert attnlab.is_validation_enabled()
    with pytest.raises(RuntimeError), attnlab.validation(False):
        MultiHeadAttention(D_IN, D_OUT, HEADS)(_x(B, T, 5))
    assert attnlab.is_validation_enabled()


def test_validation_works_as_a_decorator() -> None:
    @attnlab.validation(False)
    def unchecked() -> bool:
        return attnlab.is_validation_enabled()

    assert unchecked() is False
    assert attnlab.is_validation_enabled()


def test_constructors_check_even_with_validation_off() -> None:
    with attnlab.validation(False), pytest.raises(ValueError, match="d_out must be a multiple"):
        MultiHeadAttention(D_IN, 9, 2)


def _switch_calls() -> dict[str, Callable[[], torch.Tensor]]:
    x, context = _x(B, T, D_IN), _x(B, S, D_IN)
    q, k, v = _x(B, 3, T, D_KQ), _x(B, 3, S, D_KQ), _x(B, 3, S, D_V)
    mask, self_mask = torch.rand(T, S) > 0.3, torch.rand(T, T) > 0.3
    sa, csa, ca = (
        SelfAttention(D_IN, D_KQ, D_V),
        CausalSelfAttention(D_IN, D_KQ, D_V),
        CrossAttention(D_IN, D_KQ, D_V),
    )
    wrapper = MultiHeadAttentionWrapper(D_IN, D_KQ, D_V, HEADS)
    mha_t, mha_s = _mha("torch").eval(), _mha("scratch").eval()
    return {
        "SelfAttention": lambda: sa(x),
        "CausalSelfAttention": lambda: csa(x),
        "CrossAttention": lambda: ca(x, context),
        "MultiHeadAttentionWrapper": lambda: wrapper(x),
        "MultiHeadAttention[torch]": lambda: mha_t(x, attn_mask=self_mask),
        "MultiHeadAttention[scratch]": lambda: mha_s(x, is_causal=True),
        "MultiHeadAttention.attention_weights": lambda: mha_s.attention_weights(x, context),
        "attention_scores": lambda: AF.attention_scores(q, k),
        "scaled_softmax": lambda: AF.scaled_softmax(AF.attention_scores(q, k), D_KQ, mask),
        "context_vectors": lambda: AF.context_vectors(torch.softmax(q @ k.mT, -1), v),
        "scaled_dot_product_attention": lambda: AF.scaled_dot_product_attention(q, k, v, mask),
        "attention_weights": lambda: AF.attention_weights(q, k, is_causal=True),
        "flash_attention": lambda: AF.flash_attention(q, k, v, is_causal=True, block_size=3),
    }


@pytest.mark.parametrize("name", list(_switch_calls()))
def test_results_do_not_depend_on_the_switch(name: str) -> None:
    call = _switch_calls()[name]
    checked = call()
    with attnlab.validation(False):
        unchecked = call()
    torch.testing.assert_close(unchecked, checked, rtol=0, atol=0)


def test_overhead_command_prints_medians_and_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from attnlab.tools.bench import overhead

    assert (
        overhead.main(
            ["--batch", "1", "--seq", "6", "--dim", "8", "--heads", "2", "--repeats", "3"]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    on, off = result["forward_ms"]["validation_on"], result["forward_ms"]["validation_off"]
    assert on > 0
    assert off > 0
    assert result["ratio"] == pytest.approx(on / off)
    assert (
        result["paired_ratio"]["p25"]
        <= result["paired_ratio"]["median"]
        <= result["paired_ratio"]["p75"]
    )
    assert result["checks_us"] > 0
    assert result["config"]["heads"] == 2
    assert attnlab.is_validation_enabled()


@pytest.mark.parametrize("backend", ["torch", "scratch"])
def test_multihead_checks_its_arguments_once_per_call(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 14: the scratch path ran check_tensor 8 times and check_attn_mask twice, as
    # internal code called the public, validating functions. Now the module checks at its
    # boundary, and the functions it calls skip their checks.
    import attnlab.functional.flash
    import attnlab.layers.multihead
    import attnlab.rules._validation as V

    calls: dict[str, int] = {}
    for name in ("check_tensor", "check_attn_mask"):
        original = getattr(V, name)

        def counted(*args: Any, _f: Any = original, _n: str = name, **kwargs: Any) -> Any:
            calls[_n] = calls.get(_n, 0) + 1
            return _f(*args, **kwargs)

        for module in (V, AF, attnlab.functional.flash, attnlab.layers.multihead):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, counted)
    mha = _cross_mha(backend)
    padding = torch.zeros(B, S, dtype=torch.bool)
    padding[1, 4:] = True
    mha(_x(B, T, D_IN), _x(B, S, D_CTX), is_causal=True, key_padding_mask=padding)
    assert calls == {"check_tensor": 2, "check_attn_mask": 1}  # x and context; the mask


def test_every_real_number_check_takes_numpy_scalars_and_refuses_bools() -> None:
    """One rule (_validation.is_real) for dropout, scale, softcap, positive floats and
    RoPE's base: NumPy scalars are numbers (dropout and the base used to refuse them)."""
    import numpy as np

    from attnlab.models.generate import check_nonnegative_float, check_share
    from attnlab.rules._validation import (
        check_positive_float,
        check_probability,
        check_scale,
        check_softcap,
    )
    from attnlab.rules.rope import check_base

    checks = {
        check_probability: np.float32(0.25),
        check_scale: np.float32(0.25),
        check_softcap: np.float32(0.25),
        check_positive_float: np.float32(0.25),
        check_nonnegative_float: np.float32(0.25),
        check_share: np.float32(0.25),
        lambda name, value: check_base(value, name): np.float64(2.5),
    }
    for check, number in checks.items():
        assert check("x", number) == float(number)
        with pytest.raises(TypeError, match=r"x must be .*got True \(bool\)"):
            check("x", True)
    q = torch.randn(1, 2, 4, 8)
    by_numpy = AF.scaled_dot_product_attention(q, q, q, dropout_p=np.float64(0.0))
    torch.testing.assert_close(by_numpy, AF.scaled_dot_product_attention(q, q, q))


def test_an_entry_called_from_an_entry_skips_its_checks() -> None:
    """`checking()` is True in the outermost entry of a call only, and with validation on."""
    import threading

    from attnlab.rules._validation import checking, entry

    seen: list[tuple[str, bool]] = []

    @entry
    def inner() -> None:
        seen.append(("inner", checking()))

    @entry
    def outer() -> None:
        seen.append(("outer", checking()))
        inner()
        other = threading.Thread(target=inner)  # another thread is its own boundary
        other.start()
        other.join()

    outer()
    inner()
    assert seen == [("outer", True), ("inner", False), ("inner", True), ("inner", True)]
    seen.clear()
    with attnlab.validation(False):
        outer()
    assert [flag for _, flag in seen] == [False, False, False]


def test_a_failed_check_leaves_the_next_call_checked() -> None:
    """The entry's count is restored when a check raises: the next call checks again,
    and its inner calls still trust it."""
    mha = MultiHeadAttention(4, 6, 2)
    for _ in range(2):
        with pytest.raises(ValueError, match="x has 3 features"):
            mha(torch.randn(2, 5, 3))
    assert attnlab.rules._validation.checking()


# -- Sizes: settings whose rules are data --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Run(Sizes):
    lengths: tuple[int, ...] = size((32, 64), at_least=16, multiple_of="block")
    layers: int = size(4, multiple_of=4, why=" (whole groups)")
    heads: int = size(6, multiple_of="kv_heads")
    kv_heads: int = 2
    block: int = 16
    plot: bool = True


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"lengths": (8, 64)}, ValueError, "lengths must be ints of at least 16, got (8, 64)"),
        ({"lengths": (32, 40)}, ValueError, "lengths must be multiples of block=16, got (32, 40)"),
        ({"lengths": ()}, TypeError, "lengths must be a non-empty tuple of ints, got ()"),
        ({"lengths": (32, True)}, TypeError, "lengths must be a non-empty tuple of ints"),
        ({"layers": 6}, ValueError, "layers must be a multiple of 4 (whole groups), got 6"),
        ({"heads": 5}, ValueError, "heads must be a multiple of kv_heads, got heads=5"),
        # a multiple names a field checked after it: that field's own error, no ZeroDivision
        ({"kv_heads": 0}, ValueError, "kv_heads must be a positive int, got 0"),
        ({"block": 2.0}, TypeError, "block must be a positive int, got 2.0"),
        ({"plot": 1}, TypeError, "plot must be a bool, got 1"),
    ],
)
def test_sizes_check_every_field_by_its_rule(
    change: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        _Run(**change)


def test_sizes_pass_good_settings_unchanged() -> None:
    run = _Run(lengths=(16, 48), layers=8, heads=4, kv_heads=4, block=8, plot=False)
    assert dataclasses.astuple(run) == ((16, 48), 8, 4, 4, 8, False)
