"""Loading the ltx-kernels Hub kernel."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

KERNEL_REPO_ID = "ltx-kernels/ltx-kernels"
KERNEL_VERSION = 1


def load_kernel():
    """``kernels.get_kernel("ltx-kernels/ltx-kernels", version=1)``.

    ``LOCAL_KERNELS="ltx-kernels/ltx-kernels=<checkout>"`` makes it load a local
    build (``python3 -m ltx_build build``) with no network access. The publisher
    is not on the Hub's trusted list, so the kernel's code is trusted explicitly
    here: this package loads that one repository and nothing else.
    """
    import kernels

    return kernels.get_kernel(KERNEL_REPO_ID, version=KERNEL_VERSION, trust_remote_code=True)


def local_override(repo_id: str = KERNEL_REPO_ID) -> Optional[Path]:
    """The local checkout LOCAL_KERNELS maps ``repo_id`` to, if any (same
    ``repo=path:repo=path`` syntax as ``kernels``)."""
    for entry in os.environ.get("LOCAL_KERNELS", "").split(":"):
        name, sep, path = entry.partition("=")
        if sep and name == repo_id:
            return Path(path)
    return None
