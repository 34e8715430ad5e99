"""The Triton FlashAttention kernels, run in Triton's interpreter on the CPU.

References: PyTorch's `scaled_dot_product_attention` (through the registry's `"torch"`
entry, which adds sinks, windows and ALiBi as a mask; `"scratch"` where a softcap rules
PyTorch's kernel out) and attnlab's own `flash_attention`, for outputs, the log-sum-exp
and the gradients of query, key, value and sink logits. Shapes are tiny and lengths are
not multiples of the interpreter's 16 x 16 tiles: interpreted programs run one by one.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

triton = pytest.importorskip("triton", reason="needs Triton: pip install 'attnlab[triton]'")

from attnlab.functional import triton_flash, triton_kernels  # noqa: E402
from attnlab.functional.backends import attend, attend_with_lse  # noqa: E402
from attnlab.functional.flash import flash_attention, tile_map  # noqa: E402
from attnlab.functional.triton_flash import tiles_visited, triton_flash_attention  # noqa: E402
from attnlab.layers.gqa import GroupedQueryAttention  # noqa: E402
from attnlab.layers.mla import MultiHeadLatentAttention  # noqa: E402
from attnlab.rules.scores import ScoreRule  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

BR = "bottom-right"
# name: (Hq, H, L, S, E, Ev, rule keywords): each case a property, lengths not multiples of 16
CASES: dict[str, tuple[int, int, int, int, int, int, dict[str, Any]]] = {
    "no mask, ragged tiles": (2, 2, 21, 19, 8, 8, {}),
    "causal top-left, L < S": (2, 2, 13, 35, 8, 8, {"is_causal": True}),
    "causal bottom-right, L < S": (2, 2, 13, 35, 8, 8, {"is_causal": True, "align": BR}),
    "causal bottom-right, offset 1": (1, 1, 20, 21, 8, 8, {"is_causal": True, "align": BR}),
    "window of 2, narrower than a tile": (1, 1, 20, 20, 8, 8, {"window": 2}),
    "window, L > S (rows that see no key)": (2, 2, 40, 18, 8, 8, {"window": 3}),
    "GQA, 3 query heads per key head": (6, 2, 17, 17, 8, 8, {"is_causal": True}),
    "softcap": (2, 2, 20, 20, 8, 8, {"softcap": 2.0, "is_causal": True}),
    "sink logits": (2, 2, 20, 20, 8, 8, {"sink_logits": torch.tensor([0.5, -1.0])}),
    "ALiBi": (2, 2, 20, 20, 8, 8, {"alibi_slopes": torch.tensor([0.5, 0.25]), "is_causal": True}),
    "MLA head sizes, E != Ev": (2, 2, 18, 18, 24, 40, {"is_causal": True}),
    "head size 200, padded to 256": (1, 1, 17, 17, 200, 136, {"is_causal": True}),
}


def _inputs(hq: int, h: int, t_q: int, t_k: int, e: int, e_v: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(hq * 1000 + t_q * 10 + e)
    shapes = [(1, hq, t_q, e), (1, h, t_k, e), (1, h, t_k, e_v), (1, hq, t_q, e_v)]
    q, k, v, grad = (torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes)
    return [t.to(dtype) for t in (q, k, v)], grad.to(dtype)


def _run(fn, tensors, grad, rule: dict[str, Any]) -> list[torch.Tensor]:
    """Output and the gradients of query, key, value (and sink logits, if any)."""
    leaves = [t.clone().requires_grad_() for t in tensors]
    extra = dict(rule)
    if "sink_logits" in rule:
        extra["sink_logits"] = rule["sink_logits"].to(tensors[0].dtype).requires_grad_()
        leaves.append(extra["sink_logits"])
    out = fn(*leaves[:3], **extra)
    return [out, *torch.autograd.grad(out, leaves, grad)]


def _attend(backend: str, gqa: bool):
    def run(q, k, v, **rule):
        scale = rule.pop("scale", None)
        return attend(backend, q, k, v, ScoreRule(scale=scale, **rule), enable_gqa=gqa)

    return run


def _flash(q, k, v, **rule):
    group = q.shape[1] // k.shape[1]  # flash_attention needs a key head per query head
    return flash_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), **rule)


@pytest.mark.parametrize("case", CASES)
def test_triton_flash_equal_to_sdpa_and_flash(case: str) -> None:
    hq, h, t_q, t_k, e, e_v, rule = CASES[case]
    tensors, grad = _inputs(hq, h, t_q, t_k, e, e_v, torch.float32)
    ours = _run(
        lambda *x, **r: triton_flash_attention(*x, enable_gqa=hq != h, **r), tensors, grad, rule
    )
    reference = "scratch" if "softcap" in rule else "torch"  # PyTorch's SDPA has no tanh
    for expected in (_run(_attend(reference, hq != h), tensors, grad, rule),
                     _run(_flash, tensors, grad, rule)):  # fmt: skip
        for got, want in zip(ours, expected, strict=True):
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "rule",
    [
        {"window": 4, "align": "bottom-right", "sink_logits": torch.tensor([0.3, 2.0])},
        {"window": 2},  # 20 queries, 5 keys: rows 6 on see no key, their lse is -inf
    ],
)
def test_triton_flash_log_sum_exp_is_flashs(rule: dict[str, Any]) -> None:
    tensors, _ = _inputs(2, 2, 20, 5 if rule["window"] == 2 else 23, 8, 8, torch.float32)
    _, lse = triton_flash_attention(*tensors, return_lse=True, **rule)
    _, expected = flash_attention(*tensors, return_lse=True, **rule)
    torch.testing.assert_close(lse, expected)  # -inf where flash has -inf


def test_triton_flash_batch_of_two_grouped_heads_with_sinks_and_alibi() -> None:
    """Sink logits and slopes are per query head whatever the batch: the kernels index
    them by `bh % heads`, and the sinks' gradient sums over the batch."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(s, generator=gen) for s in ((2, 4, 9, 8), (2, 2, 9, 8), (2, 2, 9, 8)))
    grad = torch.randn(2, 4, 9, 8, generator=gen)
    rule = {
        "is_causal": True,
        "sink_logits": torch.tensor([0.5, -1.0, 0.2, 1.5]),
        "alibi_slopes": torch.tensor([0.5, 0.25, 0.125, 0.0625]),
    }
    ours = _run(
        lambda *x, **r: triton_flash_attention(*x, enable_gqa=True, **r), (q, k, v), grad, rule
    )
    for got, want in zip(ours, _run(_flash, (q, k, v), grad, rule), strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("rule", [{"is_causal": True}, {"window": 5, "softcap": 3.0}])
def test_triton_flash_float16_error_at_most_twice_flashs(rule: dict[str, Any]) -> None:
    """flash-attention's rule: the low-precision error against float64 at most 2x that
    of a reference (attnlab's flash on float16 inputs, which computes in float32 and so
    rounds less than the kernel, whose probabilities are float16 too: stricter)."""
    tensors, grad = _inputs(2, 2, 37, 37, 24, 16, torch.float64)
    exact = _run(flash_attention, tensors, grad, rule)
    half = [t.half() for t in tensors]
    ours = _run(triton_flash_attention, half, grad.half(), rule)
    reference = _run(flash_attention, half, grad.half(), rule)
    for name, got, ref, want in zip(("out", "dq", "dk", "dv"), ours, reference, exact, strict=True):
        assert got.dtype == torch.float16
        error = (got.double() - want).abs().max().item()
        ref_error = (ref.double() - want).abs().max().item()
        assert error <= 2 * ref_error, (name, error, ref_error)


@pytest.mark.parametrize(
    ("t_q", "t_k", "rule"),
    [
        (64, 64, {"window": 16}),
        (50, 90, {"is_causal": True, "align": "bottom-right"}),
        (80, 30, {"window": 7}),  # the last programs see no key at all: no tile
        (64, 20, {"window": 2}),  # a window ends mid-tile past the keys: still no tile
        (32, 32, {"window": 1}),  # the first tile of a window starts at the query's
        (32, 32, {"window": 2}),  # and the window's first key may sit in the tile before
        (16, 48, {"window": 4, "align": "bottom-right"}),  # the queries' offset moves it
    ],
)
def test_triton_flash_skips_the_tiles_the_mask_hides(t_q: int, t_k: int, rule: dict) -> None:
    q, k = torch.randn(1, 1, t_q, 8), torch.randn(1, 1, t_k, 8)
    counted = tiles_visited(q, k, k, **rule)[0, 0]  # per program, counted by the kernel
    block = triton_flash.tile_sizes(8)
    expected = tile_map(t_q, t_k, block_size=block, **rule).count_nonzero(dim=1)
    assert counted.tolist() == expected.tolist()
    assert int(counted.sum()) < math.ceil(t_q / block[0]) * math.ceil(t_k / block[1])


def _no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a kernel was launched")

    for name in ("forward", "backward_preprocess", "backward_dkdv", "backward_dq"):
        monkeypatch.setattr(triton_kernels, name, type("K", (), {"__getitem__": refuse})())


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"dtype": torch.bfloat16}, ValueError, r"bfloat16 on a GPU only"),
        ({"device": "meta"}, ValueError, r"need cpu tensors, got query.device=meta"),
        ({"e": 320}, ValueError, r"head sizes up to 256, got query.shape=\(1, 4, 5, 320\)"),
        ({"kv_heads": 3}, ValueError, r"H dividing Hq \(enable_gqa=True\)"),
        ({"value_e": 320}, ValueError, r"head sizes up to 256, got value.shape=\(1, 2, 5, 320\)"),
        ({"value_heads": 1}, ValueError, r"same batch dimensions and H dividing Hq"),
        ({"key_batch": 2}, ValueError, r"same batch dimensions"),
        ({"enable_gqa": False}, ValueError, r"H == Hq, got query.shape=\(1, 4, 5, 8\)"),
        ({"window": 0}, ValueError, r"window"),
        ({"sink_logits": torch.zeros(3)}, ValueError, r"sink_logits"),
        ({"return_lse": 1}, TypeError, r"return_lse"),
        ({"value_e": None}, TypeError, r"value must be a torch.Tensor, got NoneType"),
    ],
)
def test_triton_flash_refuses_bad_input_before_launch(
    monkeypatch: pytest.MonkeyPatch, change: dict, error: type, message: str
) -> None:
    _no_launch(monkeypatch)
    opts = {"dtype": torch.float32, "device": "cpu", "e": 8, "kv_heads": 2}
    opts |= {"value_e": 8, "value_heads": 2, "key_batch": 1}
    opts.update({k: change.pop(k) for k in list(change) if k in opts})
    like = {"dtype": opts["dtype"], "device": opts["device"]}
    q = torch.zeros(1, 4, 5, opts["e"], **like)
    k = torch.zeros(opts["key_batch"], opts["kv_heads"], 5, opts["e"], **like)
    v = None
    if opts["value_e"] is not None:
        v = torch.zeros(opts["key_batch"], opts["value_heads"], 5, opts["value_e"], **like)
    with pytest.raises(error, match=message):
        triton_flash_attention(q, k, v, **{"enable_gqa": True, **change})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"attn_mask": torch.ones(5, 5, dtype=torch.bool)}, r"backend='triton' takes no attn_mask"),
        ({"dropout_p": 0.1}, r"backend='triton' has no dropout, but dropout_p=0.1"),
    ],
)
def test_triton_backend_refuses_mask_and_dropout(
    monkeypatch: pytest.MonkeyPatch, options: dict, message: str
) -> None:
    _no_launch(monkeypatch)
    q = torch.zeros(1, 2, 5, 8)
    with pytest.raises(ValueError, match=message):
        attend("triton", q, q, q, **options)


def test_triton_backend_passes_the_whole_rule() -> None:
    """The registry's entry hands every field of the ScoreRule, and a CausalBias mask as
    its causality, to the kernels."""
    from torch.nn.attention.bias import causal_lower_right

    q, k = torch.randn(1, 2, 7, 8), torch.randn(1, 2, 11, 8)
    sinks, slopes = torch.tensor([0.5, -1.0]), torch.tensor([0.5, 0.25])
    rule = ScoreRule(window=3, align=BR, scale=0.3, sink_logits=sinks, alibi_slopes=slopes)
    torch.testing.assert_close(attend("triton", q, k, k, rule), attend("flash", q, k, k, rule))
    mask = causal_lower_right(7, 11)
    got = attend("triton", q, k, k, attn_mask=mask)
    torch.testing.assert_close(got, attend("flash", q, k, k, attn_mask=mask))


def test_triton_backend_in_layers_equal_to_flash() -> None:
    """Every module selects the kernel by name: GQA (weights from the lse) and MLA."""
    torch.manual_seed(0)
    x = torch.randn(2, 19, 32)
    gqa = GroupedQueryAttention(32, 4, 2, scores=ScoreRule(softcap=20.0), backend="flash")
    want, want_w = gqa(x, is_causal=True, need_weights=True)
    gqa.backend = "triton"
    got, got_w = gqa(x, is_causal=True, need_weights=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_w, want_w)
    mla = MultiHeadLatentAttention(
        32, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6
    )
    want = mla(x)
    mla.backend = "triton"
    torch.testing.assert_close(mla(x), want)
    q = torch.randn(1, 4, 9, 8)
    _, lse = attend_with_lse("triton", q, q[:, :2], q[:, :2], enable_gqa=True)
    torch.testing.assert_close(lse, _flash(q, q[:, :2], q[:, :2], return_lse=True)[1])


def test_triton_mode_leaves_users_kernels_alone() -> None:
    """attnlab's kernels run in the interpreter here (no GPU) without setting
    TRITON_INTERPRET, so a user's own @triton.jit stays a compiled-mode kernel."""
    import os

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    assert triton_kernels.INTERPRET is not torch.cuda.is_available()
    assert isinstance(triton_kernels.forward, InterpretedFunction)
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        assert isinstance(triton.jit(_users_kernel), JITFunction)


def _users_kernel(x):  # type: ignore[no-untyped-def]
    return x


def test_attnlab_imports_without_triton() -> None:
    """With Triton missing, attnlab imports, and naming the backend says how to get it."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import attnlab, attnlab.functional.backends as b, attnlab.functional.triton_flash\n"
        "try:\n    b.check_backend('triton')\nexcept ImportError as e:\n    print(e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert 'pip install "attnlab[triton]"' in result.stdout, result.stdout + result.stderr


def test_page_excerpts_are_sections_of_the_kernels() -> None:
    """The chapter's excerpts are included from the tested source by named sections; each
    one it names exists, once, and holds a kernel's code."""
    page = (ROOT / "docs/beyond/flash-attention.md").read_text()
    source = (ROOT / "src/attnlab/functional/triton_kernels.py").read_text()
    names = re.findall(r'--8<-- "src/attnlab/functional/triton_kernels.py:(\w+)"', page)
    assert len(names) >= 4
    for name in names:
        starts = source.count(f"# --8<-- [start:{name}]")
        assert starts == 1 == source.count(f"# --8<-- [end:{name}]"), name
        body = source.split(f"# --8<-- [start:{name}]")[1].split(f"# --8<-- [end:{name}]")[0]
        assert "@jit" in body, name
        assert "tl." in body, name


def test_triton_flash_backward_passes_gradcheck() -> None:
    """Finite differences in float64 through every switch at once: GQA, bottom-right
    window, softcap, ALiBi and sink logits (whose gradient is checked too)."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(s, generator=gen, dtype=torch.float64, requires_grad=True)
               for s in ((1, 2, 3, 2), (1, 1, 4, 2), (1, 1, 4, 3)))  # fmt: skip
    sinks = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float64)

    def run(q, k, v, sinks):  # type: ignore[no-untyped-def]
        return triton_flash_attention(
            q, k, v, window=2, align="bottom-right", softcap=1.5, sink_logits=sinks,
            alibi_slopes=slopes, enable_gqa=True,
        )  # fmt: skip

    assert torch.autograd.gradcheck(run, (q, k, v, sinks))


def test_gpu_benchmark_smoke_run_in_the_interpreter(tmp_path: Path) -> None:
    """The prepared GPU script, run small on the CPU: its record says it is not a GPU's."""
    import json

    from attnlab.tools.bench import triton_flash as bench

    path = tmp_path / "triton.json"
    sizes = ["--tokens", "20", "--tokens-per-batch", "40", "--heads", "1", "--head-dim", "16"]
    rounds = ["--check-tokens", "20", "--rounds", "1", "--warmups", "1"]
    assert bench.main(["--json", str(path), *sizes, *rounds]) == 0
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["device"].startswith("cpu (Triton's interpreter")
    record = data["results"]["float16"]
    assert max(record["check"][n] for n in ("out", "dq", "dk", "dv")) < 1e-2
    assert [(r["tokens"], r["batch"], r["causal"]) for r in record["times"]] == [
        (20, 2, True),
        (20, 2, False),
    ]
    assert record["times"][0]["triton"]["forward_tflops"] > 0
    assert record["times"][0]["triton_over_sdpa"]["forward_backward"]["median"] > 0
