"""Non-Nix builder for ltx-kernels.

Writes the same ``build/<variant>/`` layout as kernel-builder's
``nix run .#build-and-copy`` for the torch installed in the running Python,
so ``kernels.get_local_kernel`` and ``get_kernel`` (through ``LOCAL_KERNELS``)
load it. Run ``ltx-build --help`` (or ``python3 -m ltx_build --help``);
docs/building.md describes it.
"""

class BuildError(RuntimeError):
    """A build step failed; the message says what to do about it."""
