"""How benchmark rows name their implementation: ours start with "ltx_kernels";
rows timed with tuning knobs forced (a dev build's sweeps) end in
" [knob=value, ...]" and are experiments, kept in the JSON but out of the
tables and the targets; the same-bytes copy is a ceiling, not a baseline."""

from __future__ import annotations

import re
from typing import Mapping

COPY_IMPL = "x.clone() (a copy of the same bytes)"
_TUNED = re.compile(r" \[[a-z_][a-z0-9_.]*=-?\d+(, [a-z_][a-z0-9_.]*=-?\d+)*\]$")


def is_ours(impl: str) -> bool:
    return impl.startswith("ltx_kernels")


def tuned_name(impl: str, settings: Mapping[str, int]) -> str:
    """The row name of `impl` timed with the knobs `settings` forced: '<impl> [knob=value, ...]'."""
    return f"{impl} [" + ", ".join(f"{knob}={int(value)}" for knob, value in settings.items()) + "]"


def is_sweep(impl: str) -> bool:
    """Whether the row was timed with tuning knobs forced (see tuned_name)."""
    return bool(_TUNED.search(impl))
