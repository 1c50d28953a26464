"""Errors that say what to do next."""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """The model is not one optimize_ltx was written for; nothing was changed."""


class HooksPresentError(RuntimeError):
    """Offload, cache or parallelism hooks wrap the forwards optimize_ltx (or
    restore) would replace; nothing was changed."""


class CompiledModelError(RuntimeError):
    """The model was compiled before optimize_ltx; nothing was changed."""
