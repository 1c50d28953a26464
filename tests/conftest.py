"""Shared fixtures. Tests load the kernel the way users do: through
`kernels.get_kernel(<repo-id>, version=1)` with LOCAL_KERNELS pointing at
this checkout's build/ (so `python3 -m ltx_build build` must have run)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

from ltx_build import config as build_config  # noqa: E402

CFG = build_config.load(ROOT)

cuda = pytest.mark.skipif(
    not (__import__("torch").cuda.is_available()), reason="needs a CUDA GPU (run on the GPU machine)"
)


@pytest.fixture(scope="session")
def kernel():
    """The built variant for the installed torch, loaded through kernels."""
    import kernels
    from ltx_build import variant

    var = variant.current_variant()
    if not (ROOT / "build" / var / "metadata.json").is_file():
        pytest.fail(f"build/{var} is missing: run `python3 -m ltx_build build` first")
    os.environ["LOCAL_KERNELS"] = f"{CFG.repo_id}={ROOT}"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return kernels.get_kernel(CFG.repo_id, version=CFG.version, trust_remote_code=True)
