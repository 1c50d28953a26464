"""Variant names and op namespaces, computed the way kernel-builder does."""

from __future__ import annotations

import base64
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import BuildError


def variant_name(torch_version: str, cuda_version: str, cxx11_abi: bool, machine: str, system: str = "linux") -> str:
    """``torch<MAJ><MIN>-cxx11-cu<MAJ><MIN>-<arch>-linux``, as ``kernels`` parses it.

    >>> variant_name("2.14.1+cu130", "13.0", True, "x86_64")
    'torch214-cxx11-cu130-x86_64-linux'
    """
    major, minor = torch_version.split("+")[0].split(".")[:2]
    cmaj, cmin = cuda_version.split(".")[:2]
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine)
    if system != "linux":
        return f"torch{major}{minor}-cu{cmaj}{cmin}-{machine}-{system}"
    abi = "cxx11" if cxx11_abi else "cxx98"
    return f"torch{major}{minor}-{abi}-cu{cmaj}{cmin}-{machine}-{system}"


@dataclass(frozen=True)
class Torch:
    """What a build takes from the installed torch: the variant name, headers
    and libraries, and the version lines of the rebuild key."""

    version: str  # "2.14.1+cu130"
    cuda: str  # "13.0"
    cxx11_abi: bool
    dir: Path  # the package directory: include/, lib/
    git_version: str = ""

    @classmethod
    def installed(cls) -> "Torch":
        try:
            import torch
        except ImportError:
            raise BuildError("torch is not installed in this Python: `pip install torch` (a CUDA build) "
                             "first") from None
        if torch.version.cuda is None:
            raise BuildError(
                f"torch {torch.__version__} has no CUDA support (torch.version.cuda is None); "
                "install a CUDA build of torch, e.g. `pip install torch==2.14.1` (cu130 wheels)"
            )
        return cls(torch.__version__, torch.version.cuda, torch.compiled_with_cxx11_abi(), Path(torch.__file__).parent,
                   getattr(torch.version, "git_version", ""))

    @property
    def variant(self) -> str:
        return variant_name(self.version, self.cuda, self.cxx11_abi, platform.machine(),
                            sys.platform if sys.platform != "linux" else "linux")

    @property
    def fingerprint(self) -> str:
        return f"torch {self.version} (git {self.git_version}, CUDA {self.cuda}, cxx11 abi {self.cxx11_abi})"


def current_variant() -> str:
    """The variant name for the torch this Python imports."""
    return Torch.installed().variant


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


@dataclass(frozen=True)
class GitState:
    """The checkout a build starts from, as kernel-builder's ``git_status``
    reads it: HEAD's commit and tree, and whether tracked files differ from
    HEAD (untracked files do not count)."""

    commit: str  # 40 hex digits
    tree: str
    dirty: bool


def git_state(root: Path) -> GitState | None:
    """None outside a git checkout."""
    try:
        commit, tree = _git(root, "rev-parse", "HEAD", "HEAD^{tree}").split()
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no").strip() != ""
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None
    return GitState(commit, tree, dirty)


def unique_id(root: Path, state: GitState | None = None) -> str:
    """First 7 hex digits of HEAD's tree id, plus ``_dirty`` when tracked files
    differ from HEAD; a random base32 id outside a git checkout. `state`:
    an already read ``git_state(root)``."""
    state = state or git_state(root)
    if state is None:
        return base64.b32encode(os.urandom(5)).decode().lower()[:7]
    return state.tree[:7] + ("_dirty" if state.dirty else "")


def ops_namespace(python_name: str, backend: str, uid: str) -> str:
    """``_<python name>_<backend>_<unique id>``, e.g. ``_ltx_kernels_cuda_3f2a9c1``."""
    return f"_{python_name}_{backend}_{uid}"
