"""Post-build checks: the ABI of the shared object, and loading the variant
through `kernels` the two ways users do (get_local_kernel, and get_kernel
with LOCAL_KERNELS and no network)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from . import BuildError

MANYLINUX = "manylinux_2_28"
PYTHON_ABI = "3.9"

# Symbols the ABI check may report that are accepted, with the reason (keep
# README's "ABI exceptions" table in sync). Empty: no exception is needed.
ALLOWED_ABI_VIOLATIONS: dict[str, str] = {}


def abi_violations(so: Path) -> tuple[list[str], list[str]]:
    """(manylinux_2_28 violations, abi3 (Python >= 3.9) violations) of `so`."""
    try:
        from kernel_abi_check import ObjectFile
    except ImportError:
        raise BuildError("kernel-abi-check is not installed: `pip install kernel-abi-check`") from None
    obj = ObjectFile(str(so))
    manylinux = [f"manylinux: {v!r}" for v in obj.check_manylinux(MANYLINUX)]
    abi3 = [f"abi3: {v!r}" for v in obj.check_python_abi(PYTHON_ABI)]
    keep = lambda vs: [v for v in vs if not any(name in v for name in ALLOWED_ABI_VIOLATIONS)]  # noqa: E731
    return keep(manylinux), keep(abi3)


def digest_mismatch(variant_dir: Path) -> list[str]:
    """How the files of `variant_dir` differ from its metadata.json's digest,
    checked by the kernels package as ``kernels verify`` does once the
    signature is checked (kernels/verify.py); [] when they match or there is
    no digest. Raises ValueError when kernels cannot read metadata.json."""
    from kernels._rust import Digest, DigestValidationError, Metadata

    meta = Metadata.read_from_file(variant_dir / "metadata.json")
    if meta.digest is None:
        return []
    try:
        meta.digest.validate(Digest.hash_variant(meta.digest.algorithm, variant_dir))
    except DigestValidationError as e:
        return [str(v) for v in e.violations]
    return []


LOAD_LOCAL = """
import sys
from pathlib import Path
import kernels
m = kernels.get_local_kernel(Path(sys.argv[1]))
assert callable(m.rmsnorm), "rmsnorm missing"
print(m.__name__)
"""

LOAD_HUB = """
import sys
import kernels
m = kernels.get_kernel(sys.argv[1], version=int(sys.argv[2]), trust_remote_code=True)
assert callable(m.rmsnorm), "rmsnorm missing"
print(m.__name__)
"""


def _python(code: str, *args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise BuildError(f"loading the build failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout.strip().splitlines()[-1]


def load_local(root: Path) -> str:
    """Module name `kernels.get_local_kernel(root)` gives."""
    return _python(LOAD_LOCAL, str(root))


def load_hub(root: Path, repo_id: str, version: int) -> str:
    """Module name `get_kernel(repo_id, version=...)` gives through LOCAL_KERNELS, offline."""
    return _python(LOAD_HUB, repo_id, str(version),
                   env={"LOCAL_KERNELS": f"{repo_id}={root}", "HF_HUB_OFFLINE": "1"})
