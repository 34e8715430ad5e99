"""attnlab.tools.circuits: the residual stream taken apart, ablations, copying and composition."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from attnlab.models.tiny import ModelConfig, TinyTransformer, repeated_tokens
from attnlab.tools import circuits
from attnlab.tools.circuits import (
    ablated,
    composition_baseline,
    composition_score,
    composition_scores,
    copying_score,
    copying_scores,
    direct_logit_attribution,
    folded_ov,
    folded_qk,
    ov_circuit,
    phase_change_step,
    residual_components,
    rotated_composition_baseline,
)
from attnlab.tools.train import ablation_groups, ablation_losses, load_run, probe_scores

RUN = Path(__file__).resolve().parents[1] / "docs" / "assets" / "model"
# All sizes different, so that no transposed weight goes unnoticed.
SMALL = ModelConfig(vocab_size=11, max_len=10, d_model=12, num_heads=3, num_layers=2)


@pytest.fixture
def model() -> TinyTransformer:
    torch.manual_seed(0)
    model = TinyTransformer(SMALL).eval()
    with torch.no_grad():  # LayerNorm gains and biases away from their 1 and 0 at init
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(1))


def test_residual_components_add_up_to_the_forward(
    model: TinyTransformer, tokens: torch.Tensor
) -> None:
    parts = residual_components(model, tokens)
    assert parts.heads.shape == (2, 3, 4, 9, 12)
    assert_close(model.unembed(model.norm(parts.total())), model(tokens), atol=1e-5, rtol=1e-5)
    # Layer 1's heads, from the attention weights and the weight slices by hand.
    w = model.attention_maps(tokens)[0]  # (b, h, t, t)
    attn = model.blocks[0].attn
    x = model.token_embedding(tokens) + model.position_embedding(torch.arange(9))
    v = attn.W_value(model.blocks[0].norm_attn(x))  # (b, t, h * 4)
    for h in range(3):
        cols = slice(4 * h, 4 * h + 4)
        expected = (w[:, h] @ v[..., cols]) @ attn.out_proj.weight[:, cols].T
        assert_close(parts.heads[0, h], expected, atol=1e-6, rtol=1e-5)
    assert torch.equal(parts.biases[1], model.blocks[1].attn.out_proj.bias)


def _without_columns(model: TinyTransformer, heads: list[tuple[int, int]]) -> TinyTransformer:
    edited = copy.deepcopy(model)
    with torch.no_grad():
        for layer, head in heads:
            edited.blocks[layer].attn.out_proj.weight[:, 4 * head : 4 * head + 4] = 0.0
    return edited


def test_zero_ablation_equals_zeroing_the_heads_columns_of_w_o(
    model: TinyTransformer, tokens: torch.Tensor
) -> None:
    heads = [(0, 1), (1, 0), (1, 2)]
    with ablated(model, heads) as inside:
        assert inside is model
        got = model(tokens)
    assert_close(got, _without_columns(model, heads)(tokens), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(model(tokens), got)  # the hooks are gone after the block


def test_mean_ablation_equals_the_mean_output_folded_into_the_bias(
    model: TinyTransformer, tokens: torch.Tensor
) -> None:
    reference = torch.randint(0, 11, (6, 7), generator=torch.Generator().manual_seed(2))
    # The head's mean context vector, by hand: weights times values over the reference.
    attn = model.blocks[0].attn
    x = model.token_embedding(reference) + model.position_embedding(torch.arange(7))
    w = model.attention_maps(reference)[0][:, 2]  # (b, t, t)
    z = w @ attn.W_value(model.blocks[0].norm_attn(x))[..., 8:12]  # (b, t, 4)
    edited = _without_columns(model, [(0, 2)])
    with torch.no_grad():
        edited.blocks[0].attn.out_proj.bias += attn.out_proj.weight[:, 8:12] @ z.mean(dim=(0, 1))
    with ablated(model, [(0, 2)], method="mean", reference=reference):
        got = model(tokens)
    assert_close(got, edited(tokens), atol=1e-5, rtol=1e-5)
    # The averages computed once and passed in do the same.
    means = circuits.mean_context(model, reference)
    assert_close(means[0, 2], z.mean(dim=(0, 1)), atol=1e-6, rtol=1e-5)
    with ablated(model, [(0, 2)], method="mean", reference=means):
        assert torch.equal(model(tokens), got)
    with (
        pytest.raises(ValueError, match=r"averages of shape \(2, 3\) but .*=\(2, 3, 4\)"),
        ablated(model, [(0, 2)], method="mean", reference=means[:, :, 0]),
    ):
        pass


def test_ablation_arguments_are_named(model: TinyTransformer, tokens: torch.Tensor) -> None:
    with (
        pytest.raises(ValueError, match=r"head must lie in \[0, 3\) .*num_heads=3\), got 3"),
        ablated(model, [(0, 3)]),
    ):
        pass
    with pytest.raises(ValueError, match=r"layer must lie in \[0, 2\)"), ablated(model, [(2, 0)]):
        pass
    with (
        pytest.raises(TypeError, match=r"heads must hold \(layer, head\) pairs, got 0"),
        ablated(model, [0, 1]),  # type: ignore[list-item]
    ):
        pass
    with (
        pytest.raises(ValueError, match="method must be one of 'zero', 'mean', got 'half'"),
        ablated(model, [(0, 0)], method="half"),
    ):
        pass
    with (
        pytest.raises(ValueError, match="method='mean' needs reference tokens"),
        ablated(model, [(0, 0)], method="mean"),
    ):
        pass
    with pytest.raises(ValueError, match="model has MLPs"):
        residual_components(TinyTransformer(ModelConfig(mlp=True)), tokens)
    with pytest.raises(TypeError, match="model must be a TinyTransformer, got Linear"):
        copying_scores(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"tokens must be \(b, t\) with t >= 2"):
        direct_logit_attribution(model, tokens[:, :1])
    with pytest.raises(TypeError, match="tokens must be a 2-d integer tensor"):
        direct_logit_attribution(model, [[1, 2]])  # type: ignore[arg-type]
    with (
        pytest.raises(TypeError, match=r"reference must be a tensor: .* got list"),
        ablated(model, [(0, 0)], method="mean", reference=[[1, 2]]),  # type: ignore[arg-type]
    ):
        pass
    with (
        pytest.raises(TypeError, match=r"heads must hold \(layer, head\) pairs, got \[0, 1, 2\]"),
        ablated(model, [[0, 1, 2]]),
    ):
        pass
    with (
        pytest.raises(TypeError, match=r"layer must be an int, got 0\.0"),
        ablated(model, [(0.0, 1)]),  # type: ignore[list-item]
    ):
        pass


def test_ablation_takes_pairs_as_a_json_record_stores_them(
    model: TinyTransformer, tokens: torch.Tensor
) -> None:
    with ablated(model, [(0, 1), (1, 2)]):
        expected = model(tokens)
    with ablated(model, [[0, 1], [1, 2]]):
        assert torch.equal(model(tokens), expected)


def test_direct_logit_attribution_sums_to_the_centred_logit(
    model: TinyTransformer, tokens: torch.Tensor
) -> None:
    dla = direct_logit_attribution(model, tokens)
    logits = model(tokens[:, :-1])  # (b, t-1, vocab)
    centred = logits - logits.mean(dim=-1, keepdim=True)
    expected = centred.gather(-1, tokens[:, 1:, None])[..., 0]
    assert_close(dla.total(), expected, atol=1e-5, rtol=1e-5)
    # One head's share by hand: its output through the frozen LayerNorm and unembedding.
    parts = residual_components(model, tokens[:, :-1])
    x = parts.total()
    sigma = (x.var(-1, unbiased=False, keepdim=True) + model.norm.eps).sqrt()
    out = parts.heads[1, 2]
    normed = model.norm.weight * (out - out.mean(-1, keepdim=True)) / sigma
    share = (normed @ model.unembed.weight.T) - (normed @ model.unembed.weight.T).mean(
        -1, keepdim=True
    )
    assert_close(dla.heads[1, 2], share.gather(-1, tokens[:, 1:, None])[..., 0], atol=1e-6, rtol=0)


def _zero_biases(model: TinyTransformer) -> TinyTransformer:
    edited = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in edited.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    return edited


def test_folded_ov_is_what_the_head_writes(model: TinyTransformer) -> None:
    # Without biases, a sequence holding one residual vector x everywhere makes every
    # head of layer 1 write W_OV x / sigma(x), whatever its weights.
    plain = _zero_biases(model)
    x = torch.randn(12, generator=torch.Generator().manual_seed(3))
    sigma = (x.var(unbiased=False) + 1e-5).sqrt()
    attn = plain.blocks[0].attn
    normed = plain.blocks[0].norm_attn(x.expand(1, 5, 12))
    weights = attn.attention_weights(normed, is_causal=True)
    v = attn.W_value(normed)
    for h in range(3):
        cols = slice(4 * h, 4 * h + 4)
        written = (weights[:, h] @ v[..., cols]) @ attn.out_proj.weight[:, cols].T
        assert_close(written[0, -1], folded_ov(plain, 0, h) @ x / sigma, atol=1e-5, rtol=1e-5)


def test_folded_qk_gives_the_attention_scores(model: TinyTransformer) -> None:
    plain = _zero_biases(model)
    block, attn = plain.blocks[1], plain.blocks[1].attn
    g = torch.Generator().manual_seed(4)
    xq, xk = torch.randn(12, generator=g), torch.randn(12, generator=g)
    sq, sk = ((v.var(unbiased=False) + 1e-5).sqrt() for v in (xq, xk))
    q, k = attn.W_query(block.norm_attn(xq)), attn.W_key(block.norm_attn(xk))
    for h in range(3):
        cols = slice(4 * h, 4 * h + 4)
        expected = q[cols] @ k[cols]
        assert_close(xq @ folded_qk(plain, 1, h) @ xk / (sq * sk), expected, atol=1e-5, rtol=1e-5)


def test_copying_score_by_hand_and_from_the_full_circuit(model: TinyTransformer) -> None:
    assert copying_score(torch.eye(4)) == pytest.approx(1.0)
    assert copying_score(-torch.eye(4)) == pytest.approx(-1.0)
    # A rotation by 90 degrees: eigenvalues +-i, which sum to 0.
    assert copying_score(torch.tensor([[0.0, -1.0], [1.0, 0.0]])) == pytest.approx(0.0, abs=1e-7)
    # eigenvalues 2, -1 and the complex pair 1 +- i: sum 3 over |.| sum 3 + 2 sqrt 2
    m = torch.zeros(4, 4)
    m[0, 0], m[1, 1] = 2.0, -1.0
    m[2:, 2:] = torch.tensor([[1.0, -1.0], [1.0, 1.0]])
    assert copying_score(m) == pytest.approx(3 / (3 + 2 * math.sqrt(2)))
    # The low-rank route of copying_scores against the eigenvalues of the full matrix.
    scores = copying_scores(model)
    for layer in range(2):
        for head in range(3):
            full = copying_score(ov_circuit(model, layer, head))
            assert scores[layer, head].item() == pytest.approx(full, abs=1e-5)
    with pytest.raises(ValueError, match=r"circuit must be a square matrix, got shape \(2, 3\)"):
        copying_score(torch.ones(2, 3))


def test_ov_circuit_is_the_direct_path_of_one_token(model: TinyTransformer) -> None:
    # Column j, up to a positive factor per column: embed token j, fold LN, OV, fold LN, U.
    circuit = ov_circuit(model, 1, 0)
    e = model.token_embedding.weight[5]
    centre = torch.eye(12) - 1 / 12
    written = folded_ov(model, 1, 0) @ e
    logits = model.unembed.weight @ (model.norm.weight * (centre @ written))
    assert_close(circuit[:, 5], logits, atol=1e-5, rtol=1e-5)


def test_composition_score_by_hand() -> None:
    a = torch.zeros(3, 3)
    a[0, 0] = 1.0
    b = torch.zeros(3, 3)
    b[0, 0], b[1, 1] = 3.0, 4.0  # writes along 0 (3) and 1 (4): a reads 3 of the 5
    assert composition_score(a, b) == pytest.approx(3 / 5)
    with pytest.raises(ValueError, match=r"left has 3 columns but right has 2 rows"):
        composition_score(a, torch.ones(2, 2))
    # Aligned maps of higher rank score less: two equal rank-r projections 1 / sqrt(r).
    p = torch.diag(torch.tensor([1.0, 1.0, 1.0, 0.0]))
    assert composition_score(p, p) == pytest.approx(1 / math.sqrt(3))
    nan = b.clone()
    nan[2, 2] = math.nan
    with pytest.raises(ValueError, match="right has NaN or infinite entries"):
        composition_score(a, nan)
    with pytest.raises(ValueError, match="left has NaN or infinite entries"):
        composition_score(nan, a)
    with pytest.raises(ValueError, match="circuit has NaN or infinite entries"):
        copying_score(nan)


def test_composition_scores_match_their_definition(model: TinyTransformer) -> None:
    k = composition_scores(model, "k")
    q = composition_scores(model, "q")
    v = composition_scores(model, "v")
    fro = torch.linalg.matrix_norm
    for i in range(3):
        ov = folded_ov(model, 0, i)
        for j in range(3):
            qk, ov2 = folded_qk(model, 1, j), folded_ov(model, 1, j)
            assert k[i, j] == pytest.approx(float(fro(qk @ ov) / (fro(qk) * fro(ov))), rel=1e-5)
            assert q[i, j] == pytest.approx(float(fro(qk.T @ ov) / (fro(qk) * fro(ov))), rel=1e-5)
            assert v[i, j] == pytest.approx(float(fro(ov2 @ ov) / (fro(ov2) * fro(ov))), rel=1e-5)
    with pytest.raises(ValueError, match="kind must be one of 'q', 'k', 'v', got 'x'"):
        composition_scores(model, "x")
    with pytest.raises(ValueError, match="earlier must be before later"):
        composition_scores(model, earlier=1, later=0)


def test_composition_baseline_is_the_random_level() -> None:
    # An untrained model's heads are random matrices of these shapes: their
    # K-composition scores fall inside the range of the Gaussian baseline.
    base = composition_baseline(64, 16, generator=torch.Generator().manual_seed(0))
    assert base.shape == (1000,)
    torch.manual_seed(0)
    untrained = composition_scores(TinyTransformer(ModelConfig()), "k")
    assert base.min() < untrained.min()
    assert untrained.max() < base.max()
    # For random maps E[score^2] = 1/d_model (d_model=64): the mean is near 1/8.
    assert (base**2).mean() == pytest.approx(1 / 64, rel=0.05)
    with pytest.raises(ValueError, match="samples must be a positive int, got 0"):
        composition_baseline(64, 16, samples=0)


def test_rotated_composition_baseline(model: TinyTransformer) -> None:
    null = rotated_composition_baseline(
        model, "v", samples=400, generator=torch.Generator().manual_seed(0)
    )
    assert null.shape == (400, 3, 3)
    # A Haar rotation R spreads what a head writes evenly over the d_model=12
    # directions, E[R B B^T R^T] = |B|_F^2 / d I, so E[score^2] = 1/12 for every pair,
    # whatever the matrices' spectra.
    assert_close((null**2).mean(dim=0), torch.full((3, 3), 1 / 12), atol=0.012, rtol=0)
    # The same generator gives the same rotations; the scores are those of the
    # turned matrix against the intact later head.
    again = rotated_composition_baseline(
        model, "v", samples=400, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(null, again)
    with pytest.raises(ValueError, match="samples must be a positive int, got 0"):
        rotated_composition_baseline(model, samples=0)
    with pytest.raises(ValueError, match="earlier must be before later"):
        rotated_composition_baseline(model, earlier=1, later=1)


def test_phase_change_step() -> None:
    assert phase_change_step([0, 25, 50, 75], [4.0, 3.0, 2.9, 2.8]) == 25
    # Per step elapsed: a drop of 1 over 50 steps is slower than 0.6 over 10.
    assert phase_change_step([0, 50, 60], [3.0, 2.0, 1.4]) == 60
    with pytest.raises(ValueError, match="steps must increase"):
        phase_change_step([0, 0], [1.0, 0.5])
    with pytest.raises(ValueError, match="same length"):
        phase_change_step([0, 1], [1.0])
    with pytest.raises(ValueError, match=r"values must be finite numbers, got \[4.0, nan"):
        phase_change_step([0, 25, 50], [4.0, math.nan, 1.0])


# -- the committed run ---------------------------------------------------------------------


def test_committed_circuit_reproduces_its_record() -> None:
    """The phase change, ablations, copying and composition scores in the record."""
    model, record = load_run(RUN)
    recorded, half = record["circuit"], record["config"]["half"]
    groups = recorded["ablation"]["groups"]
    # The groups the chapter's reading rests on (all of them would take several seconds).
    checked = ["L1 H0", "L1 previous-token heads", "L1 other heads", "L2 all heads"]
    assert ablation_groups(probe_scores(model, half)) == {
        name: [tuple(pair) for pair in heads] for name, heads in groups.items()
    }
    for method, names in (("zero", checked), ("mean", checked[1:4:2])):
        chosen = {name: [tuple(pair) for pair in groups[name]] for name in names}
        got = ablation_losses(model, half, chosen, method=method)
        for name in names:
            assert got[name] == pytest.approx(recorded["ablation"][method][name], abs=2e-3)
    batch = repeated_tokens(256, half, 64, generator=torch.Generator().manual_seed(1234))
    dla = direct_logit_attribution(model, batch).heads[:, :, :, half:].mean(dim=(2, 3))
    for key, value in (
        ("direct_logit_attribution", dla),
        ("copying_score", copying_scores(model).float()),
        ("k_composition", composition_scores(model, "k")),
    ):
        assert_close(value, torch.tensor(recorded[key]), atol=2e-4, rtol=0, msg=key)
    curve = record["loss_curve"]
    assert recorded["phase_change_step"]["second_half_loss"] == phase_change_step(
        curve["step"], curve["second_half"]
    )
    best = [-max(s[-1]) for s in record["head_score_curve"]["induction"]]
    assert recorded["phase_change_step"]["induction_score"] == phase_change_step(
        record["head_score_curve"]["step"], best
    )
    # What the chapter reads from them: the circuit forms at step 200, removing layer 1's
    # previous-token heads (or all of layer 2) undoes it, and the layer-2 heads copy.
    assert recorded["phase_change_step"] == {"second_half_loss": 200, "induction_score": 200}
    chance, base = record["chance_loss"], curve["second_half"][-1]
    assert recorded["ablation"]["zero"]["L1 previous-token heads"] > chance
    assert recorded["ablation"]["mean"]["L2 all heads"] > 0.95 * chance
    assert recorded["ablation"]["zero"]["L1 other heads"] < 1.5 * base
    assert min(recorded["copying_score"][1]) > 0.99
    assert min(recorded["k_composition"][0]) > 1.5 * composition_baseline(
        64, 16, generator=torch.Generator().manual_seed(0)
    ).quantile(0.95)


def test_committed_head_score_curve_ends_at_the_weights_scores() -> None:
    model, record = load_run(RUN)
    curve = record["head_score_curve"]
    assert curve["step"] == record["loss_curve"]["step"]
    final = probe_scores(model, record["config"]["half"])  # from the committed weights
    for key in ("previous_token", "induction", "first_token"):
        assert_close(torch.tensor(curve[key][-1]), getattr(final, key), atol=6e-4, rtol=0, msg=key)


def test_committed_composition_against_its_rotated_baseline() -> None:
    """What the chapter reads from the K-composition scores of the committed model."""
    model, _ = load_run(RUN)
    k = composition_scores(model, "k")
    null = rotated_composition_baseline(
        model, samples=300, generator=torch.Generator().manual_seed(0)
    )
    # Layer 2's keys read both previous-token heads (L1 H0, L1 H2) above the random
    # range; L1 H1 stays inside it (at its upper edge for L2 H2).
    assert (k[[0, 2]] > null.max(dim=0).values[[0, 2]]).all()
    assert (k[1] < null.quantile(0.99, dim=0)[1]).all()
