"""Where things are in the checkout ltx_dev runs from (an editable install or the
repository root itself)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
BENCHMARKS = ROOT / "benchmarks"
DEV_BUILD = ROOT / "_build" / "dev"  # `python3 -m ltx_build build --dev` writes _build/dev/build/<variant>/
