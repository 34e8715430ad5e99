"""Train the tiny transformer on repeated random tokens until induction heads appear.

Run it with ``python -m attnlab.train`` (about half a minute on two CPU cores); with
``--out DIR`` it writes the trained weights (``induction.pt``) and a provenance record
(``induction.json``: the command, versions and machine, with the keys every recorder of
the package writes, then the configuration, loss curve and head scores), which the
chapter "Watching heads learn" reads.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab._provenance import Start, begin, command_line, provenance
from attnlab.model import (
    ModelConfig,
    TinyTransformer,
    head_scores,
    per_position_loss,
    repeated_tokens,
)

__all__ = [
    "TrainConfig",
    "TrainResult",
    "evaluate",
    "load_run",
    "main",
    "train",
    "training_batch",
]


@dataclass(frozen=True)
class TrainConfig:
    """How to train: the model's sizes, the task and the optimizer.

    Attributes:
        model: Sizes of the model; `max_len` must be at least `2 * half`.
        half: Length of the repeated segment of the evaluation sequences, which are
            twice as long.
        min_half: Shortest repeated segment of a training sequence; see
            [`training_batch`][attnlab.train.training_batch].
        steps: Optimizer steps.
        batch_size: Sequences per step.
        lr: AdamW learning rate (no weight decay, constant after a short warm-up).
        warmup: Steps of linear warm-up.
        seed: Seeds the initial weights and the stream of training batches.
        eval_every: Record the first- and second-half loss every this many steps.
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
    """What [`train`][attnlab.train.train] returns: the model and its loss curve."""

    model: TinyTransformer
    steps: list[int]
    first_half_loss: list[float]
    second_half_loss: list[float]
    seconds: float


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
) -> TrainResult:
    """Train a [`TinyTransformer`][attnlab.model.TinyTransformer] on repeated tokens.

    Deterministic for a given config, machine and number of threads: the initial weights
    come from `torch.manual_seed(config.seed)`, the batches from a generator seeded
    with `config.seed + 1`.

    Args:
        config: What to train; see [`TrainConfig`][attnlab.train.TrainConfig].
        progress: Show a tqdm progress bar (if tqdm is installed).
        model: Train this model (in place) instead of a fresh one built from
            `config.model`, e.g. one whose attention layers were swapped for another
            kind; its `config` must equal `config.model`. The global seed is still set
            to `config.seed`, so anything random the model draws later repeats too.

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


def _record(
    config: TrainConfig, result: TrainResult, argv: Sequence[str], begun: Start
) -> dict[str, Any]:
    model = result.model
    generator = torch.Generator().manual_seed(1234)
    tokens = repeated_tokens(64, config.half, config.model.vocab_size, generator=generator)
    scores = head_scores(model.attention_maps(tokens), config.half)
    return {
        # The record is the provenance of the weights: its keys at the top level.
        **provenance(command_line("attnlab.train", argv), begun),
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
        "head_scores": {
            "previous_token": [
                [round(x, 3) for x in row] for row in scores.previous_token.tolist()
            ],
            "induction": [[round(x, 3) for x in row] for row in scores.induction.tolist()],
        },
    }


def load_run(directory: str | Path) -> tuple[TinyTransformer, dict[str, Any]]:
    """Load a run saved by `python -m attnlab.train --out DIRECTORY`.

    Args:
        directory: The folder holding `induction.pt` and `induction.json`.

    Returns:
        The trained model, in eval mode, and the run's record (command, versions,
        config, loss curve, head scores; older records name some keys differently,
        `threads` for `torch_threads`: `attnlab.bench.read_provenance` reads either).

    Raises:
        FileNotFoundError: If either file is missing.
    """
    directory = Path(directory)
    record: dict[str, Any] = json.loads((directory / "induction.json").read_text())
    model = TinyTransformer(ModelConfig(**record["config"]["model"]))
    model.load_state_dict(torch.load(directory / "induction.pt", weights_only=True))
    return model.eval(), record


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attnlab.train", description=__doc__.split("\n\n")[0]
    )
    defaults = TrainConfig()
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--out", type=Path, help="write induction.pt and induction.json here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: train, print the head scores, optionally save."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    begun = begin()
    config = TrainConfig(steps=args.steps, seed=args.seed, batch_size=args.batch_size, lr=args.lr)
    result = train(config, progress=not args.no_progress)
    record = _record(config, result, argv, begun)
    print(
        f"trained {record['parameters']:,} parameters for {config.steps} steps in "
        f"{result.seconds:.1f} s: loss first half {result.first_half_loss[-1]:.3f}, "
        f"second half {result.second_half_loss[-1]:.3f} (chance {record['chance_loss']})"
    )
    for name in ("previous_token", "induction"):
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
