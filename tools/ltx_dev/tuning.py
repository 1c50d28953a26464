"""Launch-choice overrides of development builds (`python3 -m ltx_build build --dev`).

A dev build registers two extra ops: `set_tuning(str knob, int value)` (-1 clears
the override) and `tuning_knobs() -> str[]`; a release build has neither, and
every launch choice comes from its family's table. Knob names carry a dot
(`fused_norm.prefetch`), so they are passed as a dict:

    with tuning.override(kernel, {"fused_norm.prefetch": 0, "dependent_launch": 0}):
        ...

Overrides are process-wide. `override` restores what an enclosing `override`
of this module set for the same knob, and clears the rest.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Mapping

UNSET = -1
_active: dict[tuple[int, str], int] = {}  # (id of the ops namespace, knob) -> the value override() set


class DevBuildRequired(RuntimeError):
    """The kernel is a release build: it has no tuning ops (tests may skip on this)."""


def tuning_ops(kernel):
    """The kernel's op namespace, checked to have the dev-only tuning ops."""
    ops = getattr(kernel, "ops", None)
    if ops is None or not hasattr(ops, "set_tuning") or not hasattr(ops, "tuning_knobs"):
        raise DevBuildRequired(
            f"{getattr(kernel, '__name__', kernel)!s} is not a development build (no ops.set_tuning): build one with "
            "`python3 -m ltx_build build --dev` and load it from _build/dev (benchmarks: --dev-build; "
            "pytest: --dev-build)")
    return ops


def knobs(kernel) -> list[str]:
    """The knob names the dev build accepts."""
    return list(tuning_ops(kernel).tuning_knobs())


def parse_setting(text: str) -> tuple[str, list[int]]:
    """'KNOB=V1,V2' -> (knob, [V1, V2]) (the benchmarks' --sweep-tuning, the profiler's --tuning)."""
    knob, sep, values = text.partition("=")
    try:
        parsed = [int(v) for v in values.split(",")] if sep and values else []
    except ValueError:
        parsed = []
    if not knob or not parsed:
        raise ValueError(f"{text!r}: expected KNOB=V1[,V2...] with integer values, e.g. fused_norm.prefetch=0,1")
    return knob, parsed


def _checked(kernel, settings: Mapping[str, int]):
    """The kernel's ops, once every knob of `settings` is known to it and every value >= 0."""
    ops = tuning_ops(kernel)
    known = set(ops.tuning_knobs())
    for knob, value in settings.items():
        if knob not in known:
            raise ValueError(f"unknown tuning knob {knob!r}; this build has: {', '.join(sorted(known))}")
        if int(value) < 0:
            raise ValueError(f"{knob}={value}: values are >= 0 ({UNSET} is the build's default, i.e. no override)")
    return ops


@contextlib.contextmanager
def override(kernel, settings: Mapping[str, int] | None = None, /, **more: int) -> Iterator[None]:
    """Set the given knobs (a dict, and/or keyword arguments for names without a dot) while the
    block runs, then restore them. Raises DevBuildRequired for a release build, ValueError for
    a knob the build does not know or a negative value (use no override to get the default)."""
    wanted = {**(settings or {}), **more}
    ops = _checked(kernel, wanted)
    before = {knob: _active.get((id(ops), knob)) for knob in wanted}
    try:
        for knob, value in wanted.items():
            ops.set_tuning(knob, int(value))
            _active[(id(ops), knob)] = int(value)
        yield
    finally:
        for knob, previous in before.items():
            key = (id(ops), knob)
            if previous is None:
                _active.pop(key, None)
                ops.set_tuning(knob, UNSET)
            else:
                _active[key] = previous
                ops.set_tuning(knob, previous)


def with_tuning(kernel, knob: str, value: int, fn: Callable) -> Callable:
    """`fn` with the knob set to `value` around each call (set before, cleared after), so one
    process can time several settings. The knob is checked once, here; each call then costs two
    `set_tuning` calls of host time (hidden behind the GPU in the benchmarks' timings)."""
    ops = _checked(kernel, {knob: value})
    value = int(value)

    def run(*args):
        ops.set_tuning(knob, value)
        try:
            return fn(*args)
        finally:
            ops.set_tuning(knob, UNSET)
    return run
