"""What the command lines of the single benchmarks (llm, serving, flex) share.

Each takes `--json` and `--out-dir`, its own settings, then `--threads`, `--seed` and
`--replot`; each redraws a results file the same way, and writes or prints its results
the same way.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.rules._provenance import command_line

Plots = Callable[[dict[str, Any], Path], Iterable[Path]]
"""`(data, folder) -> paths`: draws a benchmark's figures from its results."""


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of `python -m attnlab.tools.bench.<name>`, with `--json` and `--out-dir`."""
    made = argparse.ArgumentParser(
        prog=f"python -m attnlab.tools.bench.{name}", description=(doc or "").split("\n")[0]
    )
    made.add_argument("--json", help="write the results to this file (else print them)")
    made.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="folder for the SVG figures (default: the folder of --json; none without it)",
    )
    return made


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """`--threads`, `--seed` and `--replot`, after a benchmark's own settings."""
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: a shared CPU)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--replot",
        type=Path,
        default=None,
        help="redraw the figures of this results file, without measuring",
    )


def out_dir(args: argparse.Namespace) -> Path | None:
    """`--out-dir`, else the folder of `--json`, else None (no figures)."""
    folder: Path | None = args.out_dir or (Path(args.json).parent if args.json else None)
    return folder


def replot(args: argparse.Namespace, plots: Plots) -> bool:
    """With `--replot`, redraw that file's figures, print their paths and say True."""
    if args.replot is None:
        return False
    data = json.loads(args.replot.read_text(encoding="utf-8"))
    for path in plots(data, out_dir(args) or args.replot.parent):
        print(path)
    return True


def start(name: str, args: argparse.Namespace, argv: Sequence[str]) -> str:
    """Set the torch threads; return the command line the provenance stores.

    `argv` is what `main` parsed: only a `main` reads `sys.argv`.
    """
    torch.set_num_threads(args.threads)
    return command_line(f"attnlab.tools.bench.{name}", list(argv))


def write_results(args: argparse.Namespace, data: dict[str, Any]) -> None:
    """Write the results to `--json`, or print them."""
    text = json.dumps(data, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
