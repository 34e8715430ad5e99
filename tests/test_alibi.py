"""ALiBi as a score rule: equal to BLOOM's in transformers on every backend, forward and backward.

The reference is `transformers.models.bloom.modeling_bloom`: `build_alibi_tensor` (the
bias $m_h \\cdot$ key position, from the padding mask, as `BloomModel` builds it) applied the
way `BloomAttention` applies it, `alibi.baddbmm(q, k^T, beta=1, alpha=1/sqrt(d))`, then
BLOOM's additive mask (`finfo.min` where a key is in the future or padding). BLOOM
measures the bias from the first real token, attnlab from each query's own position: the
two differ by a constant per row, which the softmax ignores, so the outputs are equal;
query rows that are padding (every key hidden: BLOOM then averages, attnlab gives zeros)
are left out of the comparison, as BLOOM's outputs there mean nothing. Then `BloomAttention`
itself, with its weights copied into `GroupedQueryAttention` and `MultiHeadAttention`.

Where a per-row constant does matter (a softcap, learned sinks), the composition order of
`ScoreRule` is checked against attention written out by hand; cached decoding against one
pass; FlexAttention's `alibi_mod` against BLOOM too. The paths that cannot add the bias
refuse it by name. Small sizes: the file runs in about a second.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex
from torch import Tensor

transformers = pytest.importorskip("transformers")

from transformers import BloomConfig  # noqa: E402
from transformers.models.bloom.modeling_bloom import (  # noqa: E402
    BloomAttention,
    build_alibi_tensor,
)

from attnlab.caches.kv import StaticKVCache  # noqa: E402
from attnlab.distributed.ring import ring_attention  # noqa: E402
from attnlab.functional import flex  # noqa: E402
from attnlab.functional.backends import BACKEND_NAMES, attend, attention_weights  # noqa: E402
from attnlab.functional.flash import flash_attention  # noqa: E402
from attnlab.functional.paged import paged_attention  # noqa: E402
from attnlab.layers.gqa import GroupedQueryAttention, HeadGates  # noqa: E402
from attnlab.layers.mla import MultiHeadLatentAttention  # noqa: E402
from attnlab.layers.multihead import MultiHeadAttention  # noqa: E402
from attnlab.layers.sparse import DeepSeekSparseAttention  # noqa: E402
from attnlab.models.config import DecoderConfig  # noqa: E402
from attnlab.models.decoder import Decoder  # noqa: E402
from attnlab.rules.scores import ScoreRule  # noqa: E402
from attnlab.serving.engine import Engine  # noqa: E402

B, H, T, D = 2, 6, 7, 5  # 6 heads: the slopes' rule for a head count that is no power of 2
PAD = 2  # left padding of the second sequence, as BLOOM pads for generation
EXACT: dict[str, Any] = {"atol": 1e-12, "rtol": 1e-12}
FLOAT32: dict[str, Any] = {"atol": 2e-6, "rtol": 2e-5}


def _keep(padded: bool) -> Tensor:
    """BLOOM's `attention_mask`: 1 for a token, 0 for padding, `(B, T)`."""
    keep = torch.ones(B, T, dtype=torch.long)
    if padded:
        keep[1, :PAD] = 0
    return keep


def _bloom_mask(keep: Tensor, dtype: torch.dtype) -> Tensor:
    """BLOOM's additive 4-d mask: 0 where a query sees a key, `finfo.min` elsewhere."""
    seen = torch.ones(T, T, dtype=torch.bool).tril() & keep.bool()[:, None, None, :]
    zeros = torch.zeros(B, 1, T, T, dtype=dtype)
    return zeros.masked_fill(~seen, torch.finfo(dtype).min)  # (B, 1, T, T)


def _bloom(q: Tensor, k: Tensor, v: Tensor, keep: Tensor) -> Tensor:
    """BloomAttention's scores, mask, softmax and values, for `(B, H, T, D)` inputs."""
    alibi = build_alibi_tensor(keep, H, q.dtype)  # (B * H, 1, T)
    scores = alibi.baddbmm(  # as BloomAttention: beta=1, alpha=inv_norm_factor
        batch1=q.reshape(B * H, T, D),
        batch2=k.reshape(B * H, T, D).transpose(-1, -2),
        beta=1.0,
        alpha=D**-0.5,
    )
    weights = torch.softmax(scores.view(B, H, T, T) + _bloom_mask(keep, q.dtype), dim=-1)
    return (weights.view(B * H, T, T) @ v.reshape(B * H, T, D)).view(B, H, T, D)


def _real_rows(keep: Tensor) -> Tensor:
    """`(B, 1, T, 1)`: True at the query rows of real tokens."""
    return keep.bool()[:, None, :, None]


def _outputs_and_grads(fn: Any, inputs: list[Tensor], keep: Tensor) -> list[Tensor]:
    """`fn(*inputs)` on the real rows, then the gradients of a fixed projection of it."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*leaves) * _real_rows(keep)
    (out * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)).sum().backward()
    return [out.detach(), *(x.grad for x in leaves if x.grad is not None)]


def _qkv(dtype: torch.dtype) -> list[Tensor]:
    torch.manual_seed(0)
    return [torch.randn(B, H, T, D, dtype=dtype) for _ in range(3)]  # (b, h, t, d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("backend", "padded"), [("torch", True), ("scratch", True), ("flash", False)]
)
def test_every_backend_equals_bloom(dtype: torch.dtype, backend: Any, padded: bool) -> None:
    keep = _keep(padded)  # flash takes no padding mask: full sequences there
    rule = ScoreRule(is_causal=True, alibi_slopes=flex.alibi_slopes(H))
    mask = keep.bool()[:, None, None, :] if padded else None  # (b, 1, 1, t)

    def ours(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return attend(backend, q, k, v, rule, attn_mask=mask)

    def bloom(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return _bloom(q, k, v, keep)

    tol = EXACT if dtype == torch.float64 else FLOAT32
    got, want = (_outputs_and_grads(f, _qkv(dtype), keep) for f in (ours, bloom))
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(g, w, **tol, msg=lambda m, name=name: f"{name}: {m}")


def test_flex_alibi_mod_equals_bloom(monkeypatch: pytest.MonkeyPatch) -> None:
    # Forward only: FlexAttention has no backward pass on a CPU (PyTorch 2.13 raises).
    # Its unfused eager reference, without dynamo's tracing (as in tests/test_flex.py).
    monkeypatch.setattr(torch_flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)
    keep = _keep(padded=True)

    def seen(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx <= q_idx) & keep.bool()[b, kv_idx]

    block_mask = flex.block_mask(seen, T, T, b=B, block_size=4)
    q, k, v = _qkv(torch.float64)
    got = flex.attention(q, k, v, block_mask=block_mask, score_mod=flex.alibi_mod(H))
    want = _bloom(q, k, v, keep)
    torch.testing.assert_close(got * _real_rows(keep), want * _real_rows(keep), **EXACT)


# -- BloomAttention itself, its weights in attnlab's layers ------------------------------------


def _bloom_layer() -> BloomAttention:
    torch.manual_seed(1)
    config = BloomConfig(hidden_size=H * D, n_head=H, attention_dropout=0.0, hidden_dropout=0.0)
    layer = BloomAttention(config, layer_idx=0).eval()
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return layer


def _copy(layer: BloomAttention, q: Any, k: Any, v: Any, out: Any) -> None:
    """BLOOM's fused projection holds q, k, v per head, `(H, 3, D, d_model)`: split it."""
    w = layer.query_key_value.weight.detach().view(H, 3, D, H * D)
    b = layer.query_key_value.bias.detach().view(H, 3, D)
    with torch.no_grad():
        for i, proj in enumerate((q, k, v)):
            proj.weight.copy_(w[:, i].reshape(H * D, H * D))
            proj.bias.copy_(b[:, i].reshape(H * D))
        out.weight.copy_(layer.dense.weight)
        out.bias.copy_(layer.dense.bias)


@pytest.mark.parametrize("module", ["gqa", "mha"])
@pytest.mark.parametrize(
    ("backend", "padded"), [("torch", True), ("scratch", True), ("flash", False)]
)
def test_layers_equal_bloom_attention(module: str, backend: Any, padded: bool) -> None:
    bloom = _bloom_layer()
    keep = _keep(padded)
    slopes = flex.alibi_slopes(H)
    if module == "gqa":
        scores = ScoreRule(alibi_slopes=slopes)
        gqa = GroupedQueryAttention(
            H * D, H, bias=True, rope=None, scores=scores, backend=backend
        ).eval()
        _copy(bloom, gqa.q_proj, gqa.k_proj, gqa.v_proj, gqa.out_proj)
        mask = keep.bool()[:, None, None, :] if padded else None

        def ours(x: Tensor) -> Tensor:
            return gqa(x, attn_mask=mask)
    else:
        mha = MultiHeadAttention(H * D, H * D, H, alibi_slopes=slopes, backend=backend).eval()
        _copy(bloom, mha.W_query, mha.W_key, mha.W_value, mha.out_proj)
        padding = ~keep.bool() if padded else None

        def ours(x: Tensor) -> Tensor:
            return mha(x, is_causal=True, key_padding_mask=padding)

    def theirs(x: Tensor) -> Tensor:
        alibi = build_alibi_tensor(keep, H, x.dtype)
        mask = _bloom_mask(keep, x.dtype)
        out: Tensor = bloom(x, torch.zeros_like(x), alibi, mask)[0]  # residual 0
        return out

    torch.manual_seed(2)
    x = torch.randn(B, T, H * D)
    real = keep.bool()[:, :, None]  # (b, t, 1)
    results = []
    for fn in (ours, theirs):
        leaf = x.clone().requires_grad_()
        out = fn(leaf) * real
        out.square().sum().backward()
        results.append((out.detach(), leaf.grad))
    (got, d_got), (want, d_want) = results
    torch.testing.assert_close(got, want, **FLOAT32)
    size = float(d_want.abs().max())  # ~200: float32's round-off grows with it
    torch.testing.assert_close(d_got, d_want, atol=2e-6 * size, rtol=2e-5)


# -- where the per-row constant matters: the composition order ----------------------------------


def _by_hand(
    q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, sinks: Tensor, softcap: float | None
) -> Tensor:
    """Scale, softcap, ALiBi from each query's position, a window of 3, bottom-right, sinks."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    i = torch.arange(t_q)[:, None] + (t_k - t_q)  # the queries' positions among the keys
    j = torch.arange(t_k)[None, :]
    x = q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).mT * q.shape[-1] ** -0.5
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    x = x + slopes[:, None, None] * (j - i)
    x = x.masked_fill(~((j <= i) & (j > i - 3)), float("-inf"))
    x = torch.cat([x, sinks[:, None, None].expand(*x.shape[:-1], 1)], dim=-1)
    weights = torch.softmax(x, dim=-1)[..., :-1]
    return weights @ v.repeat_interleave(q.shape[1] // v.shape[1], 1)


# PyTorch's kernel has no softcap (the registry refuses it): no ("torch", 0.7).
@pytest.mark.parametrize(
    ("backend", "softcap"),
    [*((b, None) for b in BACKEND_NAMES), ("scratch", 0.7), ("flash", 0.7)],
)
def test_order_with_softcap_sinks_window_and_alignment(backend: Any, softcap: Any) -> None:
    torch.manual_seed(3)
    q = torch.randn(1, H, 4, D, dtype=torch.float64)  # the last 4 of 9 positions
    k, v = (torch.randn(1, 2, 9, D, dtype=torch.float64) for _ in range(2))
    sinks = torch.randn(H, dtype=torch.float64)
    slopes = flex.alibi_slopes(H).double() * 4  # steep: the offset would show
    rule = ScoreRule(
        is_causal=True,
        align="bottom-right",
        window=3,
        softcap=softcap,
        sink_logits=sinks,
        alibi_slopes=slopes,
    )
    got = attend(backend, q, k, v, rule, enable_gqa=True)
    torch.testing.assert_close(got, _by_hand(q, k, v, slopes, sinks, softcap), **EXACT)
    weights = attention_weights(q, k, rule, enable_gqa=True)  # what need_weights returns
    torch.testing.assert_close(weights @ v.repeat_interleave(3, 1), got, **EXACT)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_cached_decoding_equals_one_pass(backend: Any) -> None:
    torch.manual_seed(4)
    scores = ScoreRule(alibi_slopes=flex.alibi_slopes(H))
    gqa = GroupedQueryAttention(
        24,
        H,
        2,
        head_dim=4,
        rope=None,
        scores=scores,
        gates=HeadGates(learned_sinks=True),
        backend=backend,
    ).eval()
    with torch.no_grad():
        gqa.sink_logits.normal_()  # sinks: the bias's offset per row matters
    x = torch.randn(2, 8, 24)
    cache = StaticKVCache(2, max_length=8, num_kv_heads=2, head_dim=4)
    steps = [gqa(x[:, :5], cache=cache)] + [gqa(x[:, i : i + 1], cache=cache) for i in (5, 6, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), gqa(x), atol=1e-6, rtol=1e-5)


# -- the layer option's checks, and the paths that refuse it -----------------------------------


def test_layer_option_checks_and_keeps_slopes_as_a_buffer() -> None:
    with pytest.raises(ValueError, match=r"scores.alibi_slopes must hold one ALiBi slope per"):
        GroupedQueryAttention(24, 4, scores=ScoreRule(alibi_slopes=torch.ones(3)))
    with pytest.raises(ValueError, match=r"alibi_slopes must hold one ALiBi slope per query head"):
        MultiHeadAttention(8, 8, 2, alibi_slopes=torch.ones(4))
    with pytest.raises(TypeError, match=r"alibi_slopes must be a torch.Tensor"):
        MultiHeadAttention(8, 8, 2, alibi_slopes=[0.5, 0.25])
    with pytest.raises(ValueError, match=r"alibi_slopes holds one ALiBi slope per head"):
        flash_attention(*(torch.randn(3, 4) for _ in range(3)), alibi_slopes=torch.ones(1))
    mha = MultiHeadAttention(8, 8, 2, alibi_slopes=flex.alibi_slopes(2)).double()
    assert mha.alibi_slopes is not None
    assert mha.alibi_slopes.dtype == torch.float64  # a buffer: it follows .double()
    assert "alibi_slopes" not in mha.state_dict()  # weights load as without ALiBi
    assert "alibi=True" in repr(mha)
    with pytest.raises(ValueError, match=r"nn.MultiheadAttention has no ALiBi"):
        mha.to_torch()


def test_paged_serving_refuses_alibi_by_name() -> None:
    config = DecoderConfig(
        vocab_size=61, d_model=24, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=6,
        hidden_dim=40,
    )  # fmt: skip
    decoder = Decoder(config).eval()
    attention = decoder.layers[0].self_attn
    assert isinstance(attention, GroupedQueryAttention)
    attention.alibi_slopes = flex.alibi_slopes(4)
    with pytest.raises(ValueError, match=r"layers.0.self_attn has ALiBi \(scores.alibi_slopes\)"):
        Engine(decoder, num_blocks=8, block_size=4)
    attention.alibi_slopes = None
    engine = Engine(decoder, num_blocks=8, block_size=4)
    attention.alibi_slopes = flex.alibi_slopes(4)  # after the engine's check: the layer's
    engine.submit([1, 2, 3], 2)
    with pytest.raises(
        ValueError, match=r"_PagedLayer attends .* sink_logits, alibi_slopes or temperature"
    ):
        engine.run()


@pytest.mark.parametrize(
    "call",
    [
        lambda s: MultiHeadLatentAttention(
            24, 4, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4,
            alibi_slopes=s,
        ),
        lambda s: DeepSeekSparseAttention(None, None, topk=2, alibi_slopes=s),
        lambda s: paged_attention(*(torch.zeros(1) for _ in range(5)), alibi_slopes=s),
        lambda s: ring_attention(*(torch.zeros(1) for _ in range(3)), alibi_slopes=s),
    ],
    ids=["mla", "dsa", "paged", "ring"],
)  # fmt: skip
def test_paths_without_alibi_take_no_slopes(call: Any) -> None:
    # MLA's absorbed latents, DSA's selection, the paged kernels and the ring add no bias:
    # their signatures have no such option, so a call that asks for one fails by name.
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'alibi_slopes'"):
        call(flex.alibi_slopes(4))
