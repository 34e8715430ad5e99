"""The command line of the single benchmarks (llm, serving, flex, linear), in one place.

Each takes `--json`, some of its settings (a frozen dataclass whose defaults are the
options' defaults), `--threads` and `--seed`, and where it draws figures `--out-dir` and
`--replot`; each writes its results, and redraws and writes its figures, the same way.
Their settings are [`Sizes`][attnlab.rules.sizes.Sizes], checked when they are made.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.rules._provenance import command_line

Plots = Callable[[dict[str, Any], Path], Iterable[Path]]
"""`(data, folder) -> paths`: draws a benchmark's figures from its results."""

Measure = Callable[[Any, argparse.Namespace, str], dict[str, Any]]
"""`(settings, args, command) -> data`: runs the benchmark."""


@dataclasses.dataclass(frozen=True)
class Bench:
    """What one benchmark's command line needs to know."""

    name: str  # the module under `attnlab.tools.bench`
    doc: str | None  # the module's docstring: its first line describes the command
    settings: type[Any]  # a `Sizes`; its defaults are the options' defaults
    options: tuple[str, ...]  # the settings the command line sets, in this order
    measure: Measure
    plots: Plots | None = None  # None: no figures, so no --out-dir and no --replot
    helps: Mapping[str, str] = dataclasses.field(default_factory=dict)  # per setting
    extra: Callable[[argparse.ArgumentParser], None] = lambda parser: None  # own options


def parser(bench: Bench) -> argparse.ArgumentParser:
    """The parser of `python -m attnlab.tools.bench.<name>`.

    An int setting becomes `--name N`, a tuple of ints `--name N [N ...]`, a bool that
    defaults to True `--no-name`.
    """
    made = argparse.ArgumentParser(
        prog=f"python -m attnlab.tools.bench.{bench.name}",
        description=(bench.doc or "").split("\n")[0],
    )
    made.add_argument("--json", help="write the results to this file (else print them)")
    if bench.plots is not None:
        made.add_argument(
            "--out-dir",
            type=Path,
            help="folder for the SVG figures (default: the folder of --json; none without it)",
        )
        made.add_argument(
            "--replot", type=Path, help="redraw the figures of this results file, without measuring"
        )
    defaults = bench.settings()
    for name in bench.options:
        value, flag, text = getattr(defaults, name), name.replace("_", "-"), bench.helps.get(name)
        if isinstance(value, bool):
            made.add_argument(f"--no-{flag}", dest=name, action="store_false", help=text)
        elif isinstance(value, tuple):
            made.add_argument(f"--{flag}", type=int, nargs="+", default=list(value), help=text)
        else:
            made.add_argument(f"--{flag}", type=type(value), default=value, help=text)
    bench.extra(made)
    made.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: a shared CPU)"
    )
    made.add_argument("--seed", type=int, default=0)
    return made


def run(bench: Bench, argv: Sequence[str]) -> int:
    """Parse `argv` (what `main` read: only a `main` reads `sys.argv`); redraw, or measure.

    With `--json`, the results go to that file, and the paths of every file written
    are printed; without it, the results are printed, and only they (the figures of
    `--out-dir` are drawn silently), so that the output can be piped.
    """
    args = parser(bench).parse_args(argv)
    plots = bench.plots
    out_dir: Path | None = None
    if plots is not None:
        out_dir = args.out_dir or (Path(args.json).parent if args.json else None)
        if args.replot is not None:
            data = json.loads(args.replot.read_text(encoding="utf-8"))
            for path in plots(data, out_dir or args.replot.parent):
                print(path)
            return 0
    torch.set_num_threads(args.threads)
    command = command_line(f"attnlab.tools.bench.{bench.name}", list(argv))
    options = {name: getattr(args, name) for name in bench.options}
    settings = bench.settings(
        **{name: tuple(v) if isinstance(v, list) else v for name, v in options.items()}
    )
    data = bench.measure(settings, args, command)
    text = json.dumps(data, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
        print(args.json)
    else:
        print(text)
    paths = [] if plots is None or out_dir is None else list(plots(data, out_dir))
    if args.json:
        for path in paths:
            print(path)
    return 0
