"""The ``python -m bench`` command: run benchmark cases, print their records, optionally write
them as JSON and a plot. Run from a checkout's root with statecore installed."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from bench import plots, runner
from bench.harness import CASES, Size
from statecore.backends.tiered import parse_bytes
from statecore.checkpoint.format import CODECS, check_block_target_bytes
from statecore.errors import InvalidInputError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m bench``."""
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Run benchmark cases in one process (ratios between implementations are "
                    "meaningful; absolute times on a shared machine are not).")
    p.add_argument("--quick", action="store_true", help="reduced sizes (a few minutes in all)")
    p.add_argument("--case", action="append", default=[], metavar="NAME",
                   help="run only this case (repeatable; default: all; see --list)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help='write the records [{"case","impl","metric","value","unit"}, ...] to FILE')
    p.add_argument("--plot", default=None, metavar="FILE",
                   help="write a PNG bar chart (needs matplotlib)")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--scale", type=float, default=1.0, metavar="F",
                   help="multiply the cases' entries by F (e.g. 10: the tiered cases at 100M keys)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="the tiered mode's memory budget in tiered_running_count and "
                        "tiered_collections, e.g. 512MiB (default: 1/8 of the state's key and "
                        "value bytes)")
    p.add_argument("--block-bytes", default=None, metavar="SIZE",
                   help="the block size of the checkpoints the tiered cases write, e.g. 16KiB "
                        "(CheckpointStore block_target_bytes; default the tiered mode's, 4 KiB)")
    p.add_argument("--compression", default=None, choices=sorted(CODECS),
                   help="the block codec of the checkpoints the tiered cases write "
                        "(CheckpointStore compression; default lz4.block)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 bad usage: an unknown case or a bad
    ``--memory-budget`` or ``--block-bytes``)."""
    args = build_parser().parse_args(argv)
    if args.list:
        runner.load_cases()
        for name, (_, desc) in CASES.items():
            print(f"{name:20s} {desc}")
        return 0
    try:
        budget = None if args.memory_budget is None else parse_bytes(args.memory_budget)
        block = None if args.block_bytes is None else check_block_target_bytes(
            parse_bytes(args.block_bytes, "--block-bytes"))
    except InvalidInputError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    try:
        records = runner.run(args.case, Size(quick=args.quick, scale=args.scale,
                                             memory_budget=budget, block_target_bytes=block,
                                             compression=args.compression))
    except KeyError as exc:
        print(f"bench: error: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.json:
        runner.write_json(records, args.json)
    if args.plot:
        plots.plot(records, args.plot)
    return 0
