"""Where things are in the checkout ltx_dev works on: the nearest ltx-kernels
checkout from the current directory upward, else the one this package is
installed from (the same rule as `ltx-build`). `ltx-dev ab` relies on it: its B
side runs the benchmarks inside a copy of the tree, and they must load that
copy's build, not the installed checkout's."""

from __future__ import annotations

from ltx_build.config import find_root

ROOT = find_root()
RESULTS = ROOT / "benchmarks" / "results"
BENCHMARKS = ROOT / "benchmarks"
DEV_BUILD = ROOT / "_build" / "dev"  # `python3 -m ltx_build build --dev` writes _build/dev/build/<variant>/
