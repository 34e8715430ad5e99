"""DeepSeek Sparse Attention: equal to Hugging Face's DeepseekV32Attention after from_hf.

The reference layer is built from a small random `DeepseekV32Config` (nothing
downloaded) with eager attention, called as `DeepseekV32Model` calls it: cos/sin from
`DeepseekV32RotaryEmbedding` and a 4-d additive causal mask. It runs on the CPU: its
indexer is plain PyTorch (DeepSeek's FP8 scoring kernel and Hadamard rotation are left
out, as they change no dot product beyond rounding). Its norms and biases are perturbed
so that a weight copied to the wrong place changes the output.

The indexer's scores are also checked against a float64 reference written here from
the V3.2 report's formula, I[t, s] = sum_j w[t, j] ReLU(q[t, j] . k[s]).

All sizes differ: b=2, heads=3, indexer heads=4, v_head_dim=5, qk_nope_head_dim=6,
t=7 (topk=3 of them), qk_rope_head_dim=8, index_head_dim=10, kv_lora_rank=11,
q_lora_rank=13, d_model=24.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from transformers import DeepseekV32Config, DynamicCache
from transformers.models.deepseek_v32.modeling_deepseek_v32 import (
    DeepseekV32Attention,
    DeepseekV32RotaryEmbedding,
)

import attnlab
import attnlab.layers.gqa as gqa_module
import attnlab.layers.sparse as sparse_module
from attnlab.functional.sparse import indexer_loss, selection_mask, topk_indices
from attnlab.layers.mla import MultiHeadLatentAttention
from attnlab.layers.sparse import DeepSeekSparseAttention, LightningIndexer
from attnlab.rules import masks

B, T, TOPK = 2, 7, 3
D_MODEL, HEADS, INDEX_HEADS = 24, 3, 4
Q_LORA, KV_LORA, NOPE, ROPE, V, INDEX_DIM = 13, 11, 6, 8, 5, 10
ATOL = 1e-5

HF_NAMES = {
    "q_down": "q_a_proj",
    "q_norm": "q_a_layernorm",
    "q_up": "q_b_proj",
    "kv_down": "kv_a_proj_with_mqa",
    "kv_norm": "kv_a_layernorm",
    "kv_up": "kv_b_proj",
    "out_proj": "o_proj",
}


@pytest.fixture(scope="module")
def hf() -> DeepseekV32Attention:
    torch.manual_seed(0)
    config = DeepseekV32Config(
        vocab_size=17, hidden_size=D_MODEL, num_hidden_layers=1, num_attention_heads=HEADS,
        num_key_value_heads=HEADS, q_lora_rank=Q_LORA, kv_lora_rank=KV_LORA,
        qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V, index_topk=TOPK,
        index_head_dim=INDEX_DIM, index_n_heads=INDEX_HEADS, max_position_embeddings=64,
    )  # fmt: skip
    config._attn_implementation = "eager"
    layer = DeepseekV32Attention(config, layer_idx=0)
    with torch.no_grad():  # norms start at 1 and biases at 0: make them matter
        for name, p in layer.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return layer.eval()


def _hf_inputs(hf: DeepseekV32Attention, x: Tensor) -> tuple[tuple[Tensor, Tensor], Tensor]:
    cos_sin = DeepseekV32RotaryEmbedding(hf.config)(x, torch.arange(T)[None])
    future = torch.arange(T)[None, :] > torch.arange(T)[:, None]
    mask = torch.zeros(T, T).masked_fill(future, torch.finfo(torch.float32).min)
    return cos_sin, mask[None, None].to(x.dtype)


def _reference_scores(hf: DeepseekV32Attention, x: Tensor) -> Tensor:
    """The V3.2 report's indexer score in float64, from the HF layer's weights."""
    idx = hf.indexer
    x = x.double()
    # RMSNorm by its formula: HF's computes in float32 whatever the input.
    q_latent = x @ hf.q_a_proj.weight.double().T
    q_resid = (
        hf.q_a_layernorm.weight.double()
        * q_latent
        * torch.rsqrt(q_latent.pow(2).mean(-1, keepdim=True) + hf.q_a_layernorm.variance_epsilon)
    )
    q = (q_resid @ idx.wq_b.weight.double().T).view(B, T, INDEX_HEADS, INDEX_DIM)
    k = torch.nn.functional.layer_norm(
        x @ idx.wk.weight.double().T, (INDEX_DIM,),
        idx.k_norm.weight.double(), idx.k_norm.bias.double(), idx.k_norm.eps,
    )  # fmt: skip
    # RoPE on the first ROPE features, pairs (i, i + ROPE/2) turned by pos * 1e4^(-2i/ROPE);
    # the cos/sin tables in float32, as transformers and attnlab build them.
    frequencies = 1.0 / 1e4 ** (torch.arange(0, ROPE, 2).float() / ROPE)
    angle = torch.arange(T).float()[:, None] * frequencies  # (T, ROPE/2)
    cos, sin = angle.cos().double(), angle.sin().double()

    def rope(u: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        a, b, rest = u[..., : ROPE // 2], u[..., ROPE // 2 : ROPE], u[..., ROPE:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], dim=-1)

    q, k = rope(q, cos[:, None], sin[:, None]), rope(k, cos, sin)
    w = (x @ idx.weights_proj.weight.double().T) / math.sqrt(INDEX_HEADS)  # (B, T, H)
    relu = torch.relu(torch.einsum("bthd,bsd->bths", q, k) / math.sqrt(INDEX_DIM))
    scores = torch.einsum("bth,bths->bts", w, relu)
    future = torch.arange(T)[None, :] > torch.arange(T)[:, None]
    return scores.masked_fill(future, float("-inf"))


# -- equal to Hugging Face -------------------------------------------------------------


@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
def test_dsa_equals_hf_outputs_and_gradients(hf: DeepseekV32Attention, absorb: bool) -> None:
    ours = DeepSeekSparseAttention.from_hf(hf)
    assert ours.topk == TOPK
    x = torch.randn(B, T, D_MODEL)
    x_hf, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    cos_sin, mask = _hf_inputs(hf, x_hf)
    expected, expected_weights = hf(x_hf, cos_sin, mask)
    got = ours(x_ours, absorb=absorb)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    if absorb:  # one comparison of the weights is enough
        weights = ours.attention_weights(x)
        torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=0)
    # The selection matters: dense causal MLA gives other outputs.
    dense = ours.mla(x, is_causal=True)
    assert (dense - expected).abs().max() > 1e-2

    grad_out = torch.randn_like(expected)
    expected.backward(grad_out)
    got.backward(grad_out)
    assert x_ours.grad is not None
    assert x_hf.grad is not None
    torch.testing.assert_close(x_ours.grad, x_hf.grad, atol=ATOL, rtol=0)
    hf_params = dict(hf.named_parameters())
    for name, p in ours.mla.named_parameters():
        module, kind = name.split(".")
        ref = hf_params[f"{HF_NAMES[module]}.{kind}"]
        assert p.grad is not None, name
        assert ref.grad is not None, name
        torch.testing.assert_close(p.grad, ref.grad, atol=ATOL, rtol=0, msg=name)
        ref.grad = None
    # A discrete selection passes no gradient to the indexer, in either implementation.
    assert all(p.grad is None for p in ours.indexer.parameters())
    assert all(p.grad is None for p in hf.indexer.parameters())


def test_indexer_scores_equal_float64_reference_and_selection_equals_hf(
    hf: DeepseekV32Attention,
) -> None:
    ours = DeepSeekSparseAttention.from_hf(hf)
    x = torch.randn(B, T, D_MODEL)
    reference = _reference_scores(hf, x)
    got = ours.double().scores(x.double())
    torch.testing.assert_close(got, reference, atol=1e-12, rtol=0)
    # Every row's k-th and (k+1)-th scores are apart, so the top-k set is well defined.
    top = reference.sort(dim=-1, descending=True).values[:, TOPK - 1 :, TOPK - 1 : TOPK + 1]
    assert (top[..., 0] - top[..., 1]).min() > 1e-4

    cos_sin, mask = _hf_inputs(hf, x)
    q_resid = hf.q_a_layernorm(hf.q_a_proj(x))
    expected = hf.indexer(x, q_resid, cos_sin, mask[:, 0], None).long()  # (B, T, TOPK)
    picked = topk_indices(got, TOPK)
    # Rows with TOPK or more past keys: the same keys. The first rows have fewer: HF fills
    # them with future keys that its causal mask then hides; attnlab leaves them empty.
    full = slice(TOPK - 1, None)
    assert torch.equal(picked[:, full].sort(-1).values, expected[:, full].sort(-1).values)
    for row in range(TOPK - 1):
        assert torch.equal(
            picked[:, row, : row + 1].sort(-1).values, torch.arange(row + 1).expand(B, -1)
        )
        assert bool((picked[:, row, row + 1 :] == -1).all())


def test_dsa_cached_decode_equals_hf_cache_and_full_forward(hf: DeepseekV32Attention) -> None:
    """Prefill 4 tokens, decode 3 one by one: HF with its DynamicCache (whose layers keep
    the indexer keys too), attnlab with its SparseAttentionCache, and one full forward."""
    ours = DeepSeekSparseAttention.from_hf(hf)
    x = torch.randn(B, T, D_MODEL)
    rotary = DeepseekV32RotaryEmbedding(hf.config)
    hf_cache = DynamicCache(config=hf.config)
    cache = ours.new_cache(B, T)
    expected, got = [], []
    with torch.no_grad():
        for start, stop in [(0, 4), (4, 5), (5, 6), (6, 7)]:
            future = torch.arange(stop)[None, :] > torch.arange(start, stop)[:, None]
            mask = torch.zeros(stop - start, stop).masked_fill(
                future, torch.finfo(torch.float32).min
            )
            cos_sin = rotary(x, torch.arange(start, stop)[None])
            expected.append(hf(x[:, start:stop], cos_sin, mask[None, None], cache=hf_cache)[0])
            got.append(ours(x[:, start:stop], cache=cache, absorb=stop - start == 1))
        full = ours(x)
    torch.testing.assert_close(torch.cat(got, 1), torch.cat(expected, 1), atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.cat(got, 1), full, atol=ATOL, rtol=0)
    assert cache.length == T
    assert cache.index_keys is not None
    assert tuple(cache.index_keys.shape) == (B, T, INDEX_DIM)
    # Per token: the latent and RoPE key (11 + 8) and the indexer key (10), float32.
    assert cache.nbytes == B * T * (KV_LORA + ROPE + INDEX_DIM) * 4


# -- properties ------------------------------------------------------------------------


def test_topk_indices_are_the_best_past_keys_bottom_right() -> None:
    """Three queries, the last three of six tokens: query i sees keys 0 .. i + 3."""
    scores = torch.tensor([[[5.0, 1.0, 8.0, 2.0, 9.0, 7.0],
                            [5.0, 1.0, 8.0, 2.0, 9.0, 7.0],
                            [5.0, 1.0, 8.0, 2.0, 9.0, 7.0]]])  # fmt: skip
    expected = torch.tensor([[[2, 0, 3, 1], [4, 2, 0, 3], [4, 2, 5, 0]]])
    assert torch.equal(topk_indices(scores, 4), expected)
    # More keys asked for than the row has: all of them, then empty slots.
    assert topk_indices(scores[:, :, :3], 5)[0].tolist() == [[0, -1, -1], [0, 1, -1], [2, 0, 1]]
    mask = selection_mask(expected, 6)
    assert mask.sum(-1).tolist() == [[4, 4, 4]]
    assert mask[0].tolist()[0] == [True, True, True, True, False, False]


def test_dsa_with_topk_at_least_t_equals_causal_mla() -> None:
    torch.manual_seed(1)
    mla = MultiHeadLatentAttention(
        D_MODEL, HEADS, kv_lora_rank=KV_LORA, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE,
        v_head_dim=V, q_lora_rank=Q_LORA,
    )  # fmt: skip
    indexer = LightningIndexer(D_MODEL, INDEX_HEADS, INDEX_DIM, d_query=Q_LORA, rope_dim=ROPE)
    x = torch.randn(B, T, D_MODEL)
    expected = mla(x, is_causal=True)
    for topk in (T, T + 5):
        dsa = DeepSeekSparseAttention(mla, indexer, topk=topk)
        torch.testing.assert_close(dsa(x), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(dsa(x[0]), expected[0], atol=1e-6, rtol=0)  # unbatched
    # The indexer's loss trains the indexer only (its inputs are detached).
    x.requires_grad_()
    indexer_loss(dsa.scores(x), dsa.attention_weights(x, sparse=False)).backward()
    assert x.grad is None
    assert all(p.grad is None for p in mla.parameters())
    assert all(p.grad is not None for p in indexer.parameters())


def test_indexer_loss_is_the_kl_from_the_summed_heads() -> None:
    """Dense and sparse forms against torch's kl_div on hand-made distributions."""
    torch.manual_seed(2)
    scores = torch.randn(2, 4, 5).masked_fill(
        torch.ones(4, 5, dtype=torch.bool).triu(2), -torch.inf
    )
    logits = torch.randn(2, 3, 4, 5).masked_fill(
        torch.ones(4, 5, dtype=torch.bool).triu(2), -torch.inf
    )
    weights = logits.softmax(-1)
    target = weights.sum(1) / 3  # three heads, each row sums to 1
    log_q = scores.log_softmax(-1)
    dense = torch.nn.functional.kl_div(log_q[target > 0], target[target > 0], reduction="sum")
    torch.testing.assert_close(indexer_loss(scores, weights), dense / 8)
    indices = topk_indices(scores[:, :, 1:], 2)  # bottom-right: every query has >= 2 keys
    indices = indices + 1  # keys 1 .. 4 of the 5
    keep = selection_mask(indices, 5)
    p = target * keep / (target * keep).sum(-1, keepdim=True)
    log_q = scores.masked_fill(~keep, -torch.inf).log_softmax(-1)
    sparse = torch.nn.functional.kl_div(log_q[keep], p[keep], reduction="sum")
    torch.testing.assert_close(indexer_loss(scores, weights, indices), sparse / 8)
    # The loss trains the indexer, never the main attention.
    weights.requires_grad_()
    scores.requires_grad_()
    indexer_loss(scores, weights).backward()
    assert weights.grad is None
    assert scores.grad is not None
    assert bool(scores.grad.isfinite().all())


# -- bad input -------------------------------------------------------------------------


def _small() -> DeepSeekSparseAttention:
    mla = MultiHeadLatentAttention(
        8, 2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=3,
    )  # fmt: skip
    return DeepSeekSparseAttention(mla, LightningIndexer(8, 2, 4, rope_dim=2), topk=2)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: topk_indices(torch.zeros(1, 2, 2), 0), ValueError, "k must be a positive"),
        (lambda: topk_indices(torch.zeros(1, 2, 2), 1.5), TypeError, "k must be a positive"),
        (lambda: topk_indices(torch.zeros(1, 2, 2), True), TypeError, "k must be a positive"),
        (lambda: topk_indices(torch.zeros(2), 1), ValueError, r"scores must have 2 or 3"),
        (lambda: topk_indices(torch.zeros(1, 3, 2), 1), ValueError, "t=3 > s=2"),
        (lambda: selection_mask(torch.tensor([[[3]]]), 3), ValueError, "indices must lie"),
        (lambda: selection_mask(torch.zeros(1, 1, 1), 3), TypeError, "indices must be an int"),
        (  # bool is not an index: True would read as key 1
            lambda: selection_mask(torch.tensor([[[True, False]]]), 3),
            TypeError,
            "indices must be an int",
        ),
        (
            lambda: selection_mask(torch.zeros(1, 1, 1, dtype=torch.complex64), 3),
            TypeError,
            "indices must be an int",
        ),
        (
            lambda: DeepSeekSparseAttention(_small().mla, _small().indexer, topk=0),
            ValueError,
            "topk must be a positive",
        ),
        (
            lambda: DeepSeekSparseAttention(_small().mla, LightningIndexer(8, 2, 4), topk=True),
            TypeError,
            "topk must be a positive",
        ),
        (
            lambda: DeepSeekSparseAttention(_small().mla, LightningIndexer(9, 2, 4), topk=2),
            ValueError,
            "indexer has d_model=9 but mla needs d_model=8",
        ),
        (
            lambda: DeepSeekSparseAttention(
                _small().mla, LightningIndexer(8, 2, 6, rope_dim=4), topk=2
            ),
            ValueError,
            "rope_dim=4",
        ),
        (lambda: LightningIndexer(8, 2, 4, rope_dim=6), ValueError, "rope_dim must be at most"),
        (
            lambda: indexer_loss(
                torch.zeros(1, 2, 2),
                torch.zeros(1, 3, 2, 2),
                torch.zeros(1, 3, 1, dtype=torch.long),
            ),
            ValueError,
            "indices must have the batch and query axes of scores",
        ),
        (
            lambda: indexer_loss(torch.zeros(1, 2, 2), torch.zeros(1, 3, 2, 3)),
            ValueError,
            r"weights must have shape \(b, num_heads, t, s\)",
        ),
        (lambda: _small()(torch.zeros(1, 3, 7)), ValueError, r"x has 7 features.*d_model=8"),
        (
            lambda: _small().indexer(torch.zeros(1, 3, 8), q_input=torch.zeros(1, 2, 8)),
            ValueError,
            r"q_input must have the batch size and length of x",
        ),
        (
            lambda: _small().indexer(torch.zeros(1, 3, 8)),
            ValueError,
            "position_embeddings are required",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_sparse_bad_input_raises(call: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()  # type: ignore[operator]


def test_dsa_bad_cache_raises() -> None:
    dsa = _small()
    with pytest.raises(TypeError, match="cache must be a SparseAttentionCache"):
        dsa(torch.zeros(1, 3, 8), cache=dsa.mla.new_cache(1, 4))  # type: ignore[arg-type]
    cache = dsa.new_cache(2, 8)
    dsa(torch.zeros(2, 3, 8), cache=cache)
    with pytest.raises(ValueError, match=r"cache holds indexer keys of shape \(2, 3, 4\)"):
        dsa(torch.zeros(1, 1, 8), cache=cache)
    with pytest.raises(TypeError, match="positions"):
        dsa(torch.zeros(1, 3, 8), positions=torch.zeros(3))


def test_dsa_checks_its_input_once_and_refuses_what_mla_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The indexer and MLA trust what DSA checked: the tokens are checked at the boundary
    # only (they were checked three times), and MLA's own rules still hold there.
    calls: list[str] = []

    def counting(module: object) -> object:
        check = module.check_tokens  # type: ignore[attr-defined]

        def spy(name: str, *args: object, **kwargs: object) -> object:
            calls.append(name)
            return check(name, *args, **kwargs)

        return spy

    for module in (sparse_module, gqa_module):  # gqa: the checks of every attention call
        monkeypatch.setattr(module, "check_tokens", counting(module))
    dsa = _small()
    x = torch.randn(2, 4, 8)
    cache = dsa.new_cache(2, 8)
    for step in (x[:, :3], x[:, 3:]):
        calls.clear()
        dsa(step, cache=cache, absorb=True)
        assert calls == ["x"]
    with pytest.raises(TypeError, match="absorb must be a bool"):
        dsa(x, absorb=1)  # type: ignore[arg-type]
    dsa.mla.window = 2
    with pytest.raises(ValueError, match="is_causal=False with window=2"):
        dsa(x)


def test_dsa_from_hf_refuses_layers_without_an_indexer() -> None:
    with pytest.raises(TypeError, match="DeepseekV32Attention, but Linear has no indexer"):
        DeepSeekSparseAttention.from_hf(torch.nn.Linear(2, 2))


def test_dsa_validation_off_gives_the_same_outputs() -> None:
    torch.manual_seed(3)
    dsa = _small()
    x = torch.randn(2, 5, 8)
    expected, picked = dsa(x), dsa.select(x)
    with attnlab.validation(False):
        torch.testing.assert_close(dsa(x), expected, atol=0, rtol=0)
        assert torch.equal(dsa.select(x), picked)


def test_dsa_left_padded_batch_equals_hf_and_unpadded_rows(hf: DeepseekV32Attention) -> None:
    # Row 1 has 3 padding tokens (fewer real keys than topk for its first queries); HF's
    # layer gets the padding in its 4-d mask, as DeepseekV32Model builds it, and the
    # positions that count only real tokens.
    ours = DeepSeekSparseAttention.from_hf(hf)
    x = torch.randn(B, T, D_MODEL)
    pad = torch.ones(B, T, dtype=torch.long)
    pad[1, :3] = 0
    positions = (pad.cumsum(-1) - 1).clamp(min=0)
    cos_sin = DeepseekV32RotaryEmbedding(hf.config)(x, positions)
    future = torch.arange(T)[None, :] > torch.arange(T)[:, None]
    hidden = future[None] | (pad[:, None, :] == 0)  # (B, T, T)
    mask = torch.zeros(B, 1, T, T).masked_fill(hidden[:, None], torch.finfo(torch.float32).min)
    with torch.no_grad():
        expected, _ = hf(x, cos_sin, mask)
        real = pad.bool()
        for absorb in (False, True):
            got = ours(x, positions=positions, padding_mask=pad, absorb=absorb)
            assert not got.isnan().any()
            torch.testing.assert_close(got[real], expected[real], atol=ATOL, rtol=0)
        alone = ours(x[1:, 3:])  # the padded row without its padding
    torch.testing.assert_close(got[1, 3:], alone[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("mask", "error", "match"),
    [
        (torch.ones(B, T), TypeError, "padding_mask must be a bool or integer tensor"),
        (torch.ones(B, T - 1, dtype=torch.long), ValueError, r"\(b, cached \+ t\) = \(2, 7\)"),
        (torch.tensor([[1] * T, [1] * (T - 1) + [0]]), ValueError, "pad on the left"),
        (torch.full((B, T), 3), ValueError, "only 0 and 1"),
    ],
)
def test_dsa_names_a_bad_padding_mask(
    hf: DeepseekV32Attention, mask: Tensor, error: type, match: str
) -> None:
    ours = DeepSeekSparseAttention.from_hf(hf)
    with pytest.raises(error, match=match):
        ours(torch.randn(B, T, D_MODEL), padding_mask=mask)


def test_topk_hides_the_future_as_the_bottom_right_causal_mask() -> None:
    # The queries are the last t of s tokens: what topk may pick is masks.causal's
    # bottom-right mask, for t < s (after a cache) and t == s.
    for t, s in ((3, 7), (4, 4), (1, 5)):
        scores = torch.randn(2, t, s)
        picked = topk_indices(scores, s)  # every visible key, -1 for the hidden ones
        seen = torch.zeros(2, t, s + 1, dtype=torch.bool)
        seen.scatter_(-1, picked % (s + 1), True)  # -1 lands in the extra column
        expected = masks.causal(t, s, align="bottom-right").expand(2, t, s)
        assert torch.equal(seen[..., :s], expected)


def test_dsa_padding_mask_needs_batched_x() -> None:
    dsa = _small()
    with pytest.raises(ValueError, match=r"padding_mask needs batched x \(b, t, d_model\)"):
        dsa(torch.zeros(3, 8), padding_mask=torch.ones(1, 3, dtype=torch.bool))
    pad = torch.tensor([[0, 1, 1]])
    x = torch.randn(1, 3, 8)
    # The real tokens attend as the unpadded sequence does; the padded one sees itself.
    torch.testing.assert_close(
        dsa(x, padding_mask=pad)[:, 1:],
        dsa(x[:, 1:], positions=torch.arange(2)),
        atol=1e-6,
        rtol=0,
    )
