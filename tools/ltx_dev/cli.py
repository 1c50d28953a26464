"""The command line of ltx-kernels' development tools: `python3 -m ltx_dev <command>`
(console script `ltx-dev`). `ltx-dev <command> --help` explains each command."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import ab, flake_pin, host_cost, profile, sanitize, session, wheels
from .paths import RESULTS, ROOT


def render(args) -> int:
    from .bench import render as rendering

    for message in rendering.render(args.results, args.readme, args.performance):
        print(message)
    return 0


def targets(args) -> int:
    from .bench import targets as checking

    print("\n".join(checking.report(args.results)))
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ltx-dev", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    session.add_parser(sub)
    wheels.add_parser(sub)
    ab.add_parser(sub)
    sanitize.add_parsers(sub)
    profile.add_parser(sub)
    host_cost.add_parser(sub)
    flake_pin.add_parser(sub)
    r = sub.add_parser("render", help="benchmark JSON into README.md and docs/performance.md",
                       description="Rewrite the headline and end-to-end blocks of README.md and the per-family "
                                   "blocks of docs/performance.md from the benchmark JSON (see "
                                   "ltx_dev/bench/render.py).")
    r.add_argument("--results", type=Path, default=RESULTS, metavar="DIR",
                   help="the <family>-<device>.json files (default benchmarks/results)")
    r.add_argument("--readme", type=Path, default=ROOT / "README.md", metavar="FILE")
    r.add_argument("--performance", type=Path, default=ROOT / "docs" / "performance.md", metavar="FILE")
    r.set_defaults(run=render)
    t = sub.add_parser("targets", help="list the benchmark rows that miss the issues' targets",
                       description="Per file: how many rows miss a target (>= 85% of the copy rate, ahead of "
                                   "every baseline, the issues' speedups over eager), then a line for each. A "
                                   "report: exits 0 either way.")
    t.add_argument("results", nargs="*", type=Path, metavar="JSON",
                   help="result files (default every benchmarks/results/*.json)")
    t.set_defaults(run=targets)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.run(args) or 0
