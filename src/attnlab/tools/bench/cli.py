"""The command line: `python -m attnlab.tools.bench` and the `attnlab-bench` script."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from attnlab.rules._provenance import command_line
from attnlab.tools.bench.config import FULL, MODES, QUICK, SUITES
from attnlab.tools.bench.kv_memory import KV_FULL, KV_QUICK
from attnlab.tools.bench.plots import write_plots
from attnlab.tools.bench.runner import run

# ---------------------------------------------------------------------------------------
# Command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attnlab.tools.bench",
        description="Time and measure the memory of attnlab's attention implementations "
        "against PyTorch's, and write bench.json (or --json NAME) and SVG plots.",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("bench-results"),
        help="folder for bench.json and the plots (default: %(default)s)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, 2 repeats: checks that everything runs (seconds)",
    )
    parser.add_argument(
        "--suites",
        "--suite",
        nargs="+",
        choices=SUITES,
        default=["kernels", "modules"],
        help="suites to run (default: %(default)s)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(MODES),
        help="modes of the kernels, modules and window suites (decode has its own)",
    )
    parser.add_argument(
        "--json",
        default="bench.json",
        help="name of the results file in --out-dir (default: %(default)s)",
    )
    parser.add_argument(
        "--seq-lens",
        nargs="+",
        type=int,
        default=None,
        help="override every suite's sequence lengths (decode: its context lengths)",
    )
    parser.add_argument(
        "--repeats",
        "--rounds",
        type=int,
        default=None,
        help="timed rounds per size (default: 7, or 2 with --quick)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads before running (default: PyTorch's)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--note", default="", help="free text stored in the provenance, e.g. what else ran"
    )
    parser.add_argument("--no-plots", action="store_true", help="write bench.json only")
    parser.add_argument(
        "--replot",
        type=Path,
        default=None,
        metavar="JSON",
        help="measure nothing: draw the plots of a results file into --out-dir",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m attnlab.tools.bench` and `attnlab-bench`.

    Args:
        argv: Command-line arguments (default: `sys.argv[1:]`).

    Returns:
        The exit status, 0 on success.
    """
    args = _parser().parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        return _main(args, argv)
    finally:
        torch.set_num_threads(threads)


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    if args.replot is not None:
        data = json.loads(args.replot.read_text(encoding="utf-8"))
        args.out_dir.mkdir(parents=True, exist_ok=True)
        for p in write_plots(data, args.out_dir):
            print(p)
        return 0
    base = QUICK if args.quick else FULL
    plan = base
    if args.seq_lens is not None:
        plan = {
            s: dataclasses.replace(c, seq_lens={m: tuple(args.seq_lens) for m in c.seq_lens})
            for s, c in base.items()
        }
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 7)
    data = run(
        suites=args.suites,
        modes=args.modes,
        plan=plan,
        kv_shape=KV_QUICK if args.quick else KV_FULL,
        repeats=repeats,
        seed=args.seed,
        progress=not args.no_progress,
        matmul_sizes=(128,) if args.quick else (1024, 2048),
        command=command_line("attnlab.tools.bench", argv),
    )
    data["provenance"]["note"] = args.note
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / args.json
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    written = [path] if args.no_plots else [path, *write_plots(data, out_dir)]
    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
