"""Loading the built kernel the way users do: `kernels.get_kernel(<repo-id>)` with
LOCAL_KERNELS pointing at the checkout's release build (build/<variant>/) or
its development build (_build/dev/build/<variant>/, which has the tuning ops)."""

from __future__ import annotations

import os
from pathlib import Path

from .paths import DEV_BUILD, ROOT


def build_root(dev: bool = False) -> Path:
    """The directory whose build/<variant>/ holds the release (build/) or development build."""
    return DEV_BUILD if dev else ROOT


def load(dev: bool = False):
    """The built variant for the installed torch, through kernels.get_kernel + LOCAL_KERNELS."""
    from ltx_build import config

    where = build_root(dev)
    if not any((where / "build").glob("*/metadata.json")):
        raise SystemExit(f"{where / 'build'} holds no built variant: run `python3 -m ltx_build build"
                         f"{' --dev' if dev else ''}` first")
    cfg = config.load(ROOT)
    os.environ["LOCAL_KERNELS"] = f"{cfg.repo_id}={where}"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import kernels

    return kernels.get_kernel(cfg.repo_id, version=cfg.version, trust_remote_code=True)
