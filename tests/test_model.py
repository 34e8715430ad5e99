"""attnlab.models.tiny and attnlab.tools.train: the tiny transformer, its task, and its trained
heads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from attnlab.layers.gqa import GroupedQueryAttention
from attnlab.layers.linear import LinearSelfAttention
from attnlab.models.tiny import (
    ModelConfig,
    TinyTransformer,
    head_scores,
    per_position_loss,
    repeated_tokens,
)
from attnlab.tools.circuits import phase_change_step
from attnlab.tools.train import (
    TrainConfig,
    build_model,
    evaluate,
    load_run,
    main,
    probe_scores,
    train,
    training_batch,
)

RUN = Path(__file__).resolve().parents[1] / "docs" / "assets" / "model"
LINEAR_RUN = RUN / "linear"  # the same run with linear attention in every block
GATED_RUN = RUN / "gated"  # the same run with an output gate on every block's heads
SMALL = ModelConfig(vocab_size=11, max_len=10, d_model=12, num_heads=3, num_layers=2)


def test_repeated_tokens_copy_the_first_half() -> None:
    tokens = repeated_tokens(5, 7, 13, generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (5, 14)
    assert torch.equal(tokens[:, :7], tokens[:, 7:])
    assert int(tokens.min()) >= 0
    assert int(tokens.max()) < 13


def test_training_batch_repeats_a_segment_of_varying_length() -> None:
    config = TrainConfig(model=ModelConfig(max_len=40), half=20, batch_size=200, min_half=3)
    tokens = training_batch(config, torch.Generator().manual_seed(0))
    assert tokens.shape == (200, 40)
    periods = []
    for row in tokens:
        # The smallest p such that every token repeats the one p positions earlier.
        p = min(p for p in range(1, 21) if torch.equal(row[p:], row[:-p]))
        periods.append(p)
    assert min(periods) >= 3
    assert max(periods) <= 20
    assert len(set(periods)) > 10  # the distance between copies varies


def test_head_scores_on_hand_made_maps() -> None:
    half, t = 3, 6
    previous = torch.zeros(t, t)
    previous[0, 0] = 1.0
    previous[torch.arange(1, t), torch.arange(0, t - 1)] = 1.0
    induction = torch.full((t, t), 0.0)
    induction[:, 0] = 1.0  # first half: on the first token
    rows = torch.arange(half, t)
    induction[rows] = 0.0
    induction[rows, rows - half + 1] = 0.75
    induction[rows, 0] = 0.25
    maps = [torch.stack([previous, induction])[None]]  # one layer, two heads
    scores = head_scores(maps, half)
    # Head 2 puts query 1's weight on key 0, its predecessor: 1 of 5 queries scores.
    assert_close(scores.previous_token, torch.tensor([[1.0, 0.2]]))
    # Queries 3, 4, 5 of head 2 put 0.75 on keys 1, 2, 3; head 1 looks one back instead.
    assert_close(scores.induction, torch.tensor([[0.0, 0.75]]))
    # Key 0: head 1 only from query 1; head 2 from queries 1, 2 (1.0) and 3, 4, 5 (0.25).
    assert_close(scores.first_token, torch.tensor([[0.2, (2 * 1.0 + 3 * 0.25) / 5]]))
    with pytest.raises(ValueError, match="maps have 6 positions but half=4 needs 8"):
        head_scores(maps, 4)


def test_attention_maps_are_the_weights_of_the_forward() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(SMALL).eval()
    tokens = torch.randint(0, 11, (4, 9))
    maps = model.attention_maps(tokens)
    x = model.token_embedding(tokens) + model.position_embedding(torch.arange(9))
    for block, weights in zip(model.blocks, maps, strict=True):
        attn = block.attn
        h, hd = attn.num_heads, attn.head_dim
        values = attn.W_value(block.norm_attn(x)).view(4, 9, h, hd).transpose(1, 2)
        mixed = (weights @ values).transpose(1, 2).reshape(4, 9, h * hd)
        assert_close(x + attn.out_proj(mixed), block(x), atol=1e-5, rtol=1e-5)
        assert torch.equal(weights.triu(1), torch.zeros_like(weights))  # causal
        assert_close(weights.sum(-1), torch.ones(4, h, 9))
        x = block(x)


def test_future_tokens_do_not_change_earlier_logits() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(SMALL.__class__(**{**SMALL.to_dict(), "mlp": True})).eval()
    a = torch.randint(0, 11, (2, 10))
    b = a.clone()
    b[:, 6:] = (b[:, 6:] + 1) % 11
    assert_close(model(a)[:, :6], model(b)[:, :6])
    assert not torch.allclose(model(a)[:, 6:], model(b)[:, 6:])


def test_forward_validates_once_at_the_models_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model checks its tokens; its MultiHeadAttention layers do not check again."""
    from attnlab import validation
    from attnlab.layers.multihead import MultiHeadAttention

    torch.manual_seed(0)
    model = TinyTransformer(SMALL).eval()
    tokens = torch.randint(0, 11, (2, 10))
    with validation(False):
        expected = model(tokens)
    calls: list[int] = []
    monkeypatch.setattr(
        MultiHeadAttention, "_check_inputs", lambda *a, **k: calls.append(1), raising=True
    )
    assert_close(model(tokens), expected, rtol=0, atol=0)
    assert calls == []
    with pytest.raises(ValueError, match="tokens must lie in"):
        model(tokens + 100)


def test_untrained_loss_is_chance() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(ModelConfig(vocab_size=64, max_len=48))
    first, second = evaluate(model, 24, batch_size=64)
    # Near ln 64 (random logits cost a little more than uniform ones), and the repeat
    # does not help a model that has not learned to copy.
    assert math.log(64) - 0.05 < first < math.log(64) + 0.4
    assert abs(first - second) < 0.1


def test_per_position_loss_is_cross_entropy() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(SMALL)
    tokens = torch.randint(0, 11, (3, 8))
    logits = model(tokens[:, :-1])
    expected = torch.stack(
        [torch.nn.functional.cross_entropy(logits[:, i], tokens[:, i + 1]) for i in range(7)]
    )
    assert_close(per_position_loss(model, tokens), expected)


@pytest.mark.parametrize(
    ("tokens", "error", "message"),
    [
        (
            torch.zeros(2, 11, dtype=torch.long),
            ValueError,
            "tokens has 11 positions but .* max_len=10",
        ),
        (
            torch.full((2, 4), 11),
            ValueError,
            r"tokens must lie in \[0, 11\).*got values from 11 to 11",
        ),
        (torch.zeros(2, 4), TypeError, "tokens must be a 2-d integer tensor"),
        (torch.zeros(4, dtype=torch.long), TypeError, r"got torch.int64 tensor of shape \(4,\)"),
    ],
)
def test_bad_tokens_are_named(tokens: torch.Tensor, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        TinyTransformer(SMALL)(tokens)


def test_bad_config_is_named() -> None:
    with pytest.raises(ValueError, match="d_model must be a multiple of num_heads"):
        ModelConfig(d_model=10, num_heads=4)
    with pytest.raises(ValueError, match=r"2 \* half = 60 tokens do not fit .* max_len=48"):
        TrainConfig(half=30)


# -- the committed run ---------------------------------------------------------------------


def _committed() -> tuple[TinyTransformer, dict]:  # type: ignore[type-arg]
    return load_run(RUN)


def test_committed_weights_reproduce_their_record() -> None:
    model, record = _committed()
    half = record["config"]["half"]
    tokens = repeated_tokens(
        64, half, model.config.vocab_size, generator=torch.Generator().manual_seed(1234)
    )
    scores = head_scores(model.attention_maps(tokens), half)
    assert_close(
        scores.previous_token,
        torch.tensor(record["head_scores"]["previous_token"]),
        atol=6e-4,
        rtol=0,
    )
    assert_close(
        scores.induction, torch.tensor(record["head_scores"]["induction"]), atol=6e-4, rtol=0
    )
    assert_close(
        scores.first_token, torch.tensor(record["head_scores"]["first_token"]), atol=6e-4, rtol=0
    )
    first, second = evaluate(model, half)
    assert first == pytest.approx(record["loss_curve"]["first_half"][-1], abs=1e-3)
    assert second == pytest.approx(record["loss_curve"]["second_half"][-1], abs=1e-3)


def test_committed_model_has_a_previous_token_and_an_induction_head() -> None:
    model, record = _committed()
    scores = head_scores(
        model.attention_maps(
            repeated_tokens(64, 24, 64, generator=torch.Generator().manual_seed(7))
        ),
        24,
    )
    # Layer 1 holds a head that mostly looks one token back; layer 2 one that mostly
    # looks right after the earlier occurrence of the current token.
    assert scores.previous_token[0].max() > 0.4
    assert scores.induction[1].max() > 0.5
    # A head spreading its weight evenly over the keys it sees scores 0.074
    # previous-token and 0.028 induction on these sequences.
    assert scores.previous_token[1].max() < scores.previous_token[0].max()
    assert record["loss_curve"]["second_half"][-1] < 0.2 * record["chance_loss"]
    assert record["loss_curve"]["first_half"][-1] > 0.9 * record["chance_loss"]


def test_head_scores_of_a_head_that_spreads_its_weight_evenly() -> None:
    # Query i of a causal head sees i + 1 keys, 1 / (i + 1) on each: the mean over the
    # queries 1..47 (previous-token, first-token) and 24..47 (induction) are
    # differences of harmonic numbers. The chapter compares every head with these.
    t, half = 48, 24
    even = torch.ones(t, t).tril()
    even = even / even.sum(dim=-1, keepdim=True)
    scores = head_scores([even.expand(2, 3, t, t)], half)
    harmonic = [sum(1 / k for k in range(1, n + 1)) for n in range(t + 1)]
    prev, ind = (harmonic[48] - 1) / 47, (harmonic[48] - harmonic[24]) / 24
    assert_close(scores.previous_token, torch.full((1, 3), prev), atol=1e-6, rtol=0)
    assert_close(scores.first_token, torch.full((1, 3), prev), atol=1e-6, rtol=0)
    assert_close(scores.induction, torch.full((1, 3), ind), atol=1e-6, rtol=0)
    assert round(prev, 3) == 0.074  # the levels the chapter and ablation_groups quote
    assert round(ind, 3) == 0.028


def test_a_short_run_repeats_the_committed_phase_change() -> None:
    # The committed run's first 250 steps, evaluated every 25 steps as it was: the
    # losses follow the record, the second-half loss falls fastest in the same 25 steps
    # (give or take one evaluation), and a layer-2 head already looks where an
    # induction head looks. A change to the model, the task or the training that moves
    # the phase change fails here.
    _, record = _committed()
    config = TrainConfig(steps=250, eval_every=25, seed=0)
    result = train(config, score_heads=False)  # the probe below scores the end only
    assert result.steps == list(range(0, 251, 25))
    curve = record["loss_curve"]
    assert curve["step"][: len(result.steps)] == result.steps
    n = len(result.steps)
    for got, recorded in (
        (result.first_half_loss, curve["first_half"][:n]),
        (result.second_half_loss, curve["second_half"][:n]),
    ):
        assert got == pytest.approx(recorded, abs=0.05)
    assert phase_change_step(result.steps, result.second_half_loss) in {175, 200, 225}
    probe = repeated_tokens(64, config.half, 64, generator=torch.Generator().manual_seed(7))
    trained = head_scores(result.model.attention_maps(probe), config.half)
    torch.manual_seed(0)
    untrained = head_scores(TinyTransformer(config.model).attention_maps(probe), config.half)
    assert trained.induction[1].max() > 0.3
    assert trained.induction[1].max() > 5 * untrained.induction[1].max()
    assert result.second_half_loss[-1] < 0.7 * result.second_half_loss[0]


def test_cli_writes_weights_and_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--steps", "2", "--out", str(tmp_path), "--no-progress"]) == 0
    record = json.loads((tmp_path / "induction.json").read_text())
    assert (
        record["command"]
        == f"python -m attnlab.tools.train --steps 2 --out {tmp_path} --no-progress"
    )
    assert record["config"]["steps"] == 2
    assert len(record["head_scores"]["induction"]) == 2
    # Scores at both evaluations (steps 0 and 2), each layer x head.
    assert record["head_score_curve"]["step"] == [0, 2]
    assert len(record["head_score_curve"]["first_token"]) == 2
    assert set(record["circuit"]) == {
        "phase_change_step",
        "ablation",
        "direct_logit_attribution",
        "copying_score",
        "k_composition",
    }
    state = torch.load(tmp_path / "induction.pt", weights_only=True)
    model = TinyTransformer(ModelConfig(**record["config"]["model"]))
    model.load_state_dict(state)
    assert "trained 44,928 parameters for 2 steps" in capsys.readouterr().out


def test_train_trains_the_model_it_is_given() -> None:
    config = TrainConfig(model=SMALL, half=5, steps=3, eval_every=3, batch_size=4)
    torch.manual_seed(5)
    given = TinyTransformer(SMALL)
    before = {k: v.clone() for k, v in given.state_dict().items()}
    result = train(config, model=given)
    assert result.model is given
    assert not torch.equal(given.unembed.weight, before["unembed.weight"])
    # The same start from a fresh model of that seed gives the same weights.
    torch.manual_seed(5)
    again = train(config, model=TinyTransformer(SMALL))
    for key, value in again.model.state_dict().items():
        assert torch.equal(value, given.state_dict()[key])
    with pytest.raises(ValueError, match=r"model.config \(.*\) differs from config.model"):
        train(config, model=TinyTransformer(ModelConfig(vocab_size=11, max_len=10)))
    with pytest.raises(TypeError, match="model must be a TinyTransformer, got Linear"):
        train(config, model=torch.nn.Linear(2, 2))  # type: ignore[arg-type]


def test_scoring_heads_during_training_leaves_the_weights_bit_for_bit() -> None:
    """The evaluations draw from their own generators, never the training stream."""
    config = TrainConfig(model=SMALL, half=5, steps=6, eval_every=2, batch_size=4)
    scored = train(config)
    plain = train(config, score_heads=False)
    assert len(scored.head_scores) == len(scored.steps) == 4
    assert plain.head_scores == []
    for key, value in scored.model.state_dict().items():
        assert torch.equal(value, plain.model.state_dict()[key]), key
    # The scores recorded at the last evaluation are those of the trained model.
    final = probe_scores(scored.model, 5)
    assert torch.equal(scored.head_scores[-1].induction, final.induction)


# -- the committed linear-attention run ----------------------------------------------------


def test_committed_linear_weights_reproduce_their_record() -> None:
    model, record = load_run(LINEAR_RUN)
    _, softmax = _committed()
    assert record["attention"] == "linear"
    assert all(isinstance(block.attn, LinearSelfAttention) for block in model.blocks)
    # The softmax run's schedule, and a model of as many parameters.
    assert record["config"] == softmax["config"]
    assert record["parameters"] == softmax["parameters"] == 44_928
    assert "head_scores" not in record
    assert "circuit" not in record
    first, second = evaluate(model, record["config"]["half"])
    assert first == pytest.approx(record["loss_curve"]["first_half"][-1], abs=1e-3)
    assert second == pytest.approx(record["loss_curve"]["second_half"][-1], abs=1e-3)


def test_a_short_linear_run_repeats_the_committed_record() -> None:
    # The committed linear run's first 150 steps, rebuilt as the CLI builds it. Before
    # the softmax model's phase change the two curves are close, so the test first checks
    # that at step 150 they are far enough apart for the tolerance to tell them apart.
    _, record = load_run(LINEAR_RUN)
    _, softmax = _committed()
    curve, tol = record["loss_curve"], 0.02
    assert abs(curve["second_half"][6] - softmax["loss_curve"]["second_half"][6]) > 5 * tol
    config = TrainConfig(steps=150)  # eval_every 25 as recorded
    torch.manual_seed(config.seed)
    result = train(config, model=build_model(config.model, "linear"), score_heads=False)
    n = len(result.steps)
    assert curve["step"][:n] == result.steps == list(range(0, 151, 25))
    assert result.first_half_loss == pytest.approx(curve["first_half"][:n], abs=tol)
    assert result.second_half_loss == pytest.approx(curve["second_half"][:n], abs=tol)


def test_cli_writes_a_linear_run_that_load_run_rebuilds(tmp_path: Path) -> None:
    assert (
        main(["--steps", "2", "--attention", "linear", "--out", str(tmp_path), "--no-progress"])
        == 0
    )
    model, record = load_run(tmp_path)
    assert record["attention"] == "linear"
    assert record["loss_curve"]["step"] == [0, 2]
    assert isinstance(model.blocks[1].attn, LinearSelfAttention)
    first, second = evaluate(model, record["config"]["half"])
    assert [first, second] == pytest.approx(
        [record["loss_curve"]["first_half"][-1], record["loss_curve"]["second_half"][-1]],
        abs=1e-3,
    )
    with pytest.raises(ValueError, match="attention must be one of 'softmax', 'linear'"):
        build_model(SMALL, "flash")


# -- the committed gated run (Qiu et al.'s output gate on the same model) -------------------


def test_committed_gated_weights_reproduce_their_record() -> None:
    model, record = load_run(GATED_RUN)
    _, softmax = _committed()
    assert record["attention"] == "gated"
    assert record["config"] == softmax["config"]  # the same seed, steps and schedule
    for block in model.blocks:
        assert isinstance(block.attn, GroupedQueryAttention)
        assert block.attn.gate_proj is not None
    # One gate projection (weight and bias) per layer more than the softmax model.
    d = record["config"]["model"]["d_model"]
    assert record["parameters"] == softmax["parameters"] + 2 * (d * d + d) == 53_248
    assert "circuit" not in record  # the circuit's readings take MultiHeadAttention
    half = record["config"]["half"]
    first, second = evaluate(model, half)
    assert first == pytest.approx(record["loss_curve"]["first_half"][-1], abs=1e-3)
    assert second == pytest.approx(record["loss_curve"]["second_half"][-1], abs=1e-3)
    scores = probe_scores(model, half)
    for key in ("previous_token", "induction", "first_token"):
        expected = torch.tensor(record["head_scores"][key])
        assert_close(getattr(scores, key), expected, atol=2e-3, rtol=0, msg=key)


def test_cli_writes_a_gated_run_with_head_scores(tmp_path: Path) -> None:
    argv = ["--steps", "2", "--attention", "gated", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    model, record = load_run(tmp_path)
    assert record["attention"] == "gated"
    assert record["head_score_curve"]["step"] == [0, 2]
    assert isinstance(model.blocks[0].attn, GroupedQueryAttention)
    induction = probe_scores(model, record["config"]["half"]).induction
    assert_close(induction, torch.tensor(record["head_scores"]["induction"]), atol=2e-3, rtol=0)
