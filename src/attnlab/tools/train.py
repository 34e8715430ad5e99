"""Train the tiny transformer on repeated random tokens until induction heads appear.

Run it with ``python -m attnlab.tools.train`` (the record says how long it took); with
``--out DIR`` it writes the trained weights (``induction.pt``) and a provenance record
(``induction.json``: the command, versions and machine, with the keys every recorder of
the package writes, then the configuration, the loss curve, the head scores at every
evaluation, and a summary of the trained circuit from
[`attnlab.tools.circuits`][attnlab.tools.circuits]:
phase-change step, ablations, direct logit attribution, copying and K-composition
scores), which the chapter "Watching heads learn" reads and the tests re-check.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.layers.gqa import GroupedQueryAttention, HeadGates
from attnlab.layers.linear import LinearSelfAttention
from attnlab.models.tiny import (
    HeadScores,
    ModelConfig,
    TinyTransformer,
    head_scores,
    per_position_loss,
    repeated_tokens,
)
from attnlab.rules._provenance import Start, begin, command_line, provenance
from attnlab.rules._validation import check_choice
from attnlab.tools import circuits

__all__ = [
    "ATTENTION_KINDS",
    "TrainConfig",
    "TrainResult",
    "ablation_groups",
    "ablation_losses",
    "build_model",
    "circuit_summary",
    "evaluate",
    "load_run",
    "main",
    "probe_scores",
    "train",
    "training_batch",
]


ATTENTION_KINDS = ("softmax", "linear", "gated")
"""The attention a run's blocks use: `--attention` of `python -m attnlab.tools.train`."""


def build_model(config: ModelConfig, attention: str = "softmax") -> TinyTransformer:
    """A fresh [`TinyTransformer`][attnlab.models.tiny.TinyTransformer] with that attention.

    `"softmax"` is the model as it comes; `"linear"` swaps every block's attention for
    a [`LinearSelfAttention`][attnlab.layers.linear.LinearSelfAttention] of the same sizes,
    and `"gated"` for the same softmax attention with an output gate (a
    [`GroupedQueryAttention`][attnlab.layers.gqa.GroupedQueryAttention] with one key/value
    head per query head, biases as `MultiHeadAttention` has them, no RoPE, and
    `HeadGates(output_gate=True)`: Qiu et al.'s G1, as in Qwen3-Next). The new attention
    is built after the whole model, so the other weights are those of the same seed.
    [`load_run`][attnlab.tools.train.load_run] rebuilds a record's model
    with it.

    Raises:
        ValueError: If `attention` is not one of `ATTENTION_KINDS`.
    """
    check_choice("attention", attention, ATTENTION_KINDS)
    model = TinyTransformer(config)
    d, heads = config.d_model, config.num_heads
    swaps: dict[str, Callable[[], nn.Module]] = {
        "linear": lambda: LinearSelfAttention(d, heads),
        "gated": lambda: GroupedQueryAttention(
            d, heads, heads, bias=True, rope=None, gates=HeadGates(output_gate=True)
        ),
    }
    if attention in swaps:
        for block in model.blocks:
            block.attn = swaps[attention]()
    return model


@dataclass(frozen=True)
class TrainConfig:
    """How to train: the model's sizes, the task and the optimizer.

    Attributes:
        model: Sizes of the model; `max_len` must be at least `2 * half`.
        half: Length of the repeated segment of the evaluation sequences, which are
            twice as long.
        min_half: Shortest repeated segment of a training sequence; see
            [`training_batch`][attnlab.tools.train.training_batch].
        steps: Optimizer steps.
        batch_size: Sequences per step.
        lr: AdamW learning rate (no weight decay, constant after a short warm-up).
        warmup: Steps of linear warm-up.
        seed: Seeds the initial weights and the stream of training batches.
        eval_every: Record the first- and second-half loss (and the head scores) every
            this many steps.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    half: int = 24
    min_half: int = 4
    steps: int = 800
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 20
    seed: int = 0
    eval_every: int = 25

    def __post_init__(self) -> None:
        if 2 * self.half > self.model.max_len:
            raise ValueError(
                f"sequences of 2 * half = {2 * self.half} tokens do not fit the model's "
                f"max_len={self.model.max_len}"
            )


@dataclass
class TrainResult:
    """What [`train`][attnlab.tools.train.train] returns: the model and its curves.

    Attributes:
        model: The trained model, in eval mode.
        steps: The steps at which it was evaluated.
        first_half_loss: Loss on the unpredictable half at each of `steps`.
        second_half_loss: Loss on the copyable half at each of `steps`.
        seconds: Time spent training, evaluations included.
        head_scores: [`probe_scores`][attnlab.tools.train.probe_scores] at each of `steps`
            (empty if `train` was told not to score heads).
    """

    model: TinyTransformer
    steps: list[int]
    first_half_loss: list[float]
    second_half_loss: list[float]
    seconds: float
    head_scores: list[HeadScores] = field(default_factory=list)


def evaluate(
    model: TinyTransformer, half: int, *, batch_size: int = 256, seed: int = 1234
) -> tuple[float, float]:
    """Mean loss on the first half and on the second half of fresh repeated sequences.

    The first half's predictions (positions `0 .. half - 2`) can do no better than
    `ln(vocab_size)`; the second half's (positions `half .. 2 half - 2`) can reach 0 by
    copying.
    """
    generator = torch.Generator().manual_seed(seed)
    tokens = repeated_tokens(batch_size, half, model.config.vocab_size, generator=generator)
    with torch.no_grad():
        loss = per_position_loss(model, tokens)  # (2 half - 1,)
    return loss[: half - 1].mean().item(), loss[half:].mean().item()


def probe_scores(model: TinyTransformer, half: int, *, seed: int = 1234) -> HeadScores:
    """[`head_scores`][attnlab.models.tiny.head_scores] on the run's probe: 64 fresh sequences.

    The probe is drawn from its own generator (`seed`), so scoring the heads during
    training leaves the training batches, and so the trained weights, unchanged.
    """
    generator = torch.Generator().manual_seed(seed)
    tokens = repeated_tokens(64, half, model.config.vocab_size, generator=generator)
    return head_scores(model.attention_maps(tokens), half)


def ablation_losses(
    model: TinyTransformer,
    half: int,
    groups: dict[str, list[tuple[int, int]]],
    *,
    method: str = "zero",
    reference_seed: int = 99,
) -> dict[str, float]:
    """The second-half loss of [`evaluate`][attnlab.tools.train.evaluate] with heads removed.

    Args:
        model: The trained model.
        half: Length of the repeated segment.
        groups: A name for each set of `(layer, head)` pairs to remove together.
        method: `"zero"` or `"mean"`; see [`ablated`][attnlab.tools.circuits.ablated].
        reference_seed: Seeds the 256 repeated sequences that a mean ablation
            averages each head over (not the evaluation's own sequences).

    Returns:
        The second-half loss for each name of `groups`.
    """
    reference = None
    if method == "mean":  # one pass over the reference for every group
        generator = torch.Generator().manual_seed(reference_seed)
        tokens = repeated_tokens(256, half, model.config.vocab_size, generator=generator)
        reference = circuits.mean_context(model, tokens)
    losses = {}
    for name, heads in groups.items():
        with circuits.ablated(model, heads, method=method, reference=reference):
            losses[name] = evaluate(model, half)[1]
    return losses


def ablation_groups(
    scores: HeadScores, *, threshold: float = 0.2
) -> dict[str, list[tuple[int, int]]]:
    """The heads the record ablates: each head alone, and layer 1's two kinds together.

    A layer-1 head counts as a previous-token head if its previous-token score exceeds
    `threshold`. A head spreading its weight evenly over the keys it sees (query `i`
    sees `i + 1` of them) scores 0.074 on the probe's 48-token sequences, so the
    default 0.2 is nearly three times that level.
    """
    num_layers, num_heads = scores.previous_token.shape
    groups = {
        f"L{layer + 1} H{head}": [(layer, head)]
        for layer in range(num_layers)
        for head in range(num_heads)
    }
    previous = [(0, h) for h in range(num_heads) if scores.previous_token[0, h] > threshold]
    groups["L1 previous-token heads"] = previous
    groups["L1 other heads"] = [(0, h) for h in range(num_heads) if (0, h) not in previous]
    groups["L2 all heads"] = [(1, h) for h in range(num_heads)]
    return groups


def training_batch(config: TrainConfig, generator: torch.Generator) -> Tensor:
    """Sequences of `max_len` tokens that repeat a random segment of random length.

    Each sequence draws its own period between `config.min_half` and `max_len // 2`,
    then repeats a segment of that many random tokens until it is `max_len` long. Only
    the first period is unpredictable. Because the distance between repeats varies, no
    head can copy by position alone (attend `period - 1` tokens back): the model has to
    find the earlier occurrence of the current token by its content, which is what an
    induction head does.
    """
    b, t = config.batch_size, config.model.max_len
    tokens = torch.randint(0, config.model.vocab_size, (b, t), generator=generator)
    period = torch.randint(config.min_half, t // 2 + 1, (b, 1), generator=generator)  # (b, 1)
    source = torch.arange(t).expand(b, t) % period  # (b, t): position i copies i mod period
    return tokens.gather(1, source)  # (b, t)


def train(
    config: TrainConfig | None = None,
    *,
    progress: bool = False,
    model: TinyTransformer | None = None,
    score_heads: bool = True,
) -> TrainResult:
    """Train a [`TinyTransformer`][attnlab.models.tiny.TinyTransformer] on repeated tokens.

    Deterministic for a given config, machine and number of threads: the initial weights
    come from `torch.manual_seed(config.seed)`, the batches from a generator seeded
    with `config.seed + 1`.

    Args:
        config: What to train; see [`TrainConfig`][attnlab.tools.train.TrainConfig].
        progress: Show a tqdm progress bar (if tqdm is installed).
        model: Train this model (in place) instead of a fresh one built from
            `config.model`, e.g. one whose attention layers were swapped for another
            kind; its `config` must equal `config.model`. The global seed is still set
            to `config.seed`, so anything random the model draws later repeats too.
        score_heads: Score the heads at every evaluation
            ([`probe_scores`][attnlab.tools.train.probe_scores]); turn off for a model whose
            attention layers cannot return their weights.

    Returns:
        The trained model (in eval mode) and its loss curve.

    Raises:
        TypeError: If `model` is not a `TinyTransformer`.
        ValueError: If `model.config` differs from `config.model`.
    """
    config = TrainConfig() if config is None else config
    torch.manual_seed(config.seed)
    if model is None:
        model = TinyTransformer(config.model)
    elif not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a TinyTransformer, got {type(model).__name__}")
    elif model.config != config.model:
        raise ValueError(
            f"model.config ({model.config}) differs from config.model ({config.model}): "
            "the batches are drawn for config.model's sizes"
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / config.warmup)
    )
    generator = torch.Generator().manual_seed(config.seed + 1)
    steps_iter: Any = range(config.steps + 1)
    if progress:
        try:
            from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

            steps_iter = tqdm(steps_iter, desc="training", unit="step")
        except ImportError:  # pragma: no cover - tqdm is optional
            pass
    result = TrainResult(model, [], [], [], 0.0)
    start = time.perf_counter()
    for step in steps_iter:
        if step % config.eval_every == 0 or step == config.steps:
            model.eval()
            first, second = evaluate(model, config.half)
            if score_heads:
                result.head_scores.append(probe_scores(model, config.half))
            model.train()
            result.steps.append(step)
            result.first_half_loss.append(first)
            result.second_half_loss.append(second)
            if progress and hasattr(steps_iter, "set_postfix"):
                steps_iter.set_postfix(first=f"{first:.2f}", second=f"{second:.2f}")
        if step == config.steps:
            break
        tokens = training_batch(config, generator)
        loss = per_position_loss(model, tokens).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        schedule.step()
    result.seconds = time.perf_counter() - start
    model.eval()
    return result


def _table(x: Tensor, digits: int) -> list[list[float]]:
    return [[round(v, digits) for v in row] for row in x.tolist()]


def _scores(scores: HeadScores) -> dict[str, list[list[float]]]:
    return {
        "previous_token": _table(scores.previous_token, 3),
        "induction": _table(scores.induction, 3),
        "first_token": _table(scores.first_token, 3),
    }


def circuit_summary(
    model: TinyTransformer, config: TrainConfig, result: TrainResult | None = None
) -> dict[str, Any]:
    """The numbers of the trained circuit that the record keeps and the tests re-check.

    The phase change (if `result` is given: where the second-half loss falls fastest
    and where the best layer-2 induction score rises fastest, by
    [`phase_change_step`][attnlab.tools.circuits.phase_change_step]), the second-half loss with
    heads removed ([`ablation_losses`][attnlab.tools.train.ablation_losses], zero and mean),
    each head's mean [direct logit
    attribution][attnlab.tools.circuits.direct_logit_attribution] to the next token on the
    second half of `evaluate`'s sequences, its OV [copying
    score][attnlab.tools.circuits.copying_scores], and the K-composition scores from layer 1
    to layer 2 ([`composition_scores`][attnlab.tools.circuits.composition_scores]).
    """
    half, vocab = config.half, config.model.vocab_size
    summary: dict[str, Any] = {}
    if result is not None and len(result.steps) >= 2:
        best = [-float(s.induction[-1].max()) for s in result.head_scores]
        summary["phase_change_step"] = {
            "second_half_loss": circuits.phase_change_step(result.steps, result.second_half_loss),
            "induction_score": (circuits.phase_change_step(result.steps, best) if best else None),
        }
    groups = ablation_groups(probe_scores(model, half))
    summary["ablation"] = {
        "groups": {name: [list(pair) for pair in heads] for name, heads in groups.items()},
        "zero": {k: round(v, 4) for k, v in ablation_losses(model, half, groups).items()},
        "mean": {
            k: round(v, 4) for k, v in ablation_losses(model, half, groups, method="mean").items()
        },
    }
    tokens = repeated_tokens(256, half, vocab, generator=torch.Generator().manual_seed(1234))
    dla = circuits.direct_logit_attribution(model, tokens).heads[:, :, :, half:]
    summary["direct_logit_attribution"] = _table(dla.mean(dim=(2, 3)), 4)
    summary["copying_score"] = _table(circuits.copying_scores(model), 4)
    if config.model.num_layers >= 2:
        summary["k_composition"] = _table(circuits.composition_scores(model, "k"), 4)
    return summary


def _record(
    config: TrainConfig,
    result: TrainResult,
    argv: Sequence[str],
    begun: Start,
    attention: str = "softmax",
) -> dict[str, Any]:
    model = result.model
    # A linear-attention model has no attention weights: no head scores, no circuit; the
    # circuit's readings (copying scores, composition) take MultiHeadAttention's weights.
    softmax, scored = attention == "softmax", attention != "linear"
    summary = circuit_summary(model, config, result) if softmax else None  # before the clock
    record = {
        # The record is the provenance of the weights: its keys at the top level.
        **provenance(command_line("attnlab.tools.train", argv), begun),
        "attention": attention,
        "config": {
            **{k: v for k, v in vars(config).items() if k != "model"},
            "model": config.model.to_dict(),
        },
        "parameters": sum(p.numel() for p in model.parameters()),
        "seconds": round(result.seconds, 1),
        "loss_curve": {
            "step": result.steps,
            "first_half": [round(x, 4) for x in result.first_half_loss],
            "second_half": [round(x, 4) for x in result.second_half_loss],
        },
        "chance_loss": round(math.log(config.model.vocab_size), 4),
    }
    if not scored:
        return record
    tables = [_scores(s) for s in result.head_scores]  # once per evaluation
    record |= {
        "head_scores": _scores(probe_scores(model, config.half)),
        "head_score_curve": {
            "step": result.steps[: len(result.head_scores)],
            **{
                key: [table[key] for table in tables]
                for key in ("previous_token", "induction", "first_token")
            },
        },
    }
    return record if summary is None else record | {"circuit": summary}


def load_run(directory: str | Path) -> tuple[TinyTransformer, dict[str, Any]]:
    """Load a run saved by `python -m attnlab.tools.train --out DIRECTORY`.

    Args:
        directory: The folder holding `induction.pt` and `induction.json`.

    Returns:
        The trained model, in eval mode, built by [`build_model`][attnlab.tools.train.build_model]
        for the record's `attention` (`"softmax"` in records older than that key), and
        the run's record (command, versions, config, loss curve, and for softmax runs the
        head scores and circuit; older records name some keys differently, `threads` for
        `torch_threads`: `attnlab.tools.bench.read_provenance` reads either).

    Raises:
        FileNotFoundError: If either file is missing.
        ValueError: If the record names an attention not in `ATTENTION_KINDS`.
    """
    directory = Path(directory)
    record: dict[str, Any] = json.loads((directory / "induction.json").read_text())
    attention = record.get("attention", "softmax")
    model = build_model(ModelConfig(**record["config"]["model"]), attention)
    model.load_state_dict(torch.load(directory / "induction.pt", weights_only=True))
    return model.eval(), record


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attnlab.tools.train", description=__doc__.split("\n\n")[0]
    )
    defaults = TrainConfig()
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument(
        "--attention",
        choices=ATTENTION_KINDS,
        default="softmax",
        help="the blocks' attention (linear: no head scores or circuit in the record; "
        "gated: an output gate, head scores but no circuit)",
    )
    parser.add_argument("--out", type=Path, help="write induction.pt and induction.json here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: train, print the head scores, optionally save."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    begun = begin()
    config = TrainConfig(steps=args.steps, seed=args.seed, batch_size=args.batch_size, lr=args.lr)
    if args.attention == "softmax":
        result = train(config, progress=not args.no_progress)
    else:  # built after the global seed, as train builds its own model
        torch.manual_seed(config.seed)
        model = build_model(config.model, args.attention)
        scored = args.attention != "linear"
        result = train(config, progress=not args.no_progress, model=model, score_heads=scored)
    record = _record(config, result, argv, begun, args.attention)
    print(
        f"trained {record['parameters']:,} parameters for {config.steps} steps in "
        f"{result.seconds:.1f} s: loss first half {result.first_half_loss[-1]:.3f}, "
        f"second half {result.second_half_loss[-1]:.3f} (chance {record['chance_loss']})"
    )
    for name in ("previous_token", "induction") if "head_scores" in record else ():
        print(f"{name} scores (layer x head): {record['head_scores'][name]}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        state = {k: v.clone() for k, v in result.model.state_dict().items()}
        torch.save(state, args.out / "induction.pt")
        (args.out / "induction.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out / 'induction.pt'} and {args.out / 'induction.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
