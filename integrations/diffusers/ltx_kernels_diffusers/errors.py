"""Errors that say what to do next."""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """The model is not one optimize_ltx was written for; nothing was changed."""


class HooksPresentError(RuntimeError):
    """Offload, cache or parallelism hooks wrap the forwards optimize_ltx (or
    restore) would replace; nothing was changed."""


class CompiledModelError(RuntimeError):
    """The model was compiled before optimize_ltx; nothing was changed."""


class KernelUnavailableWarning(UserWarning):
    """The ltx-kernels kernel cannot run on this machine (no CUDA GPU, a GPU of
    another compute capability, or no variant for this torch and CUDA), so the
    model keeps its stock forwards. The message names the GPU's capability,
    torch and its CUDA, and the variants on offer."""
