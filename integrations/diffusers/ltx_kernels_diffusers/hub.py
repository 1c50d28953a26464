"""Loading the ltx-kernels Hub kernel, or stepping aside where it cannot run.

The kernel holds code for compute capability 9.0 (Hopper) only, one variant per
torch and CUDA. :func:`load_kernel_if_supported` is the one place that decides,
for every model integration, whether it runs here: on a machine without a CUDA
GPU, on a GPU of another capability, or where no variant matches the installed
torch and CUDA, it returns None after one :class:`KernelUnavailableWarning`
that names the GPU's capability (or "no CUDA GPU"), torch and its CUDA, and the
variants the kernel repository (or local build) offers; the caller then leaves
the model as it is.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import List, Optional, Union

from .errors import KernelUnavailableWarning

KERNEL_REPO_ID = "ltx-kernels/ltx-kernels"
KERNEL_VERSION = 1
KERNEL_CUDA_CAPABILITIES = ("9.0",)  # build.toml's cuda-capabilities: what every variant is built for
# The start of the refusal of kernels' arch check (kernels/archs.py, 0.17.2) when a build's
# declared archs do not cover the current device.
_KERNELS_ARCH_REFUSAL = "does not support the current device"

PathLike = Union[str, Path]


def _capability_number(arch: str) -> int:
    major, _, minor = arch.partition(".")
    return int(major) * 10 + int(minor)


def kernel_device():
    """``kernels.Device`` of the CUDA capabilities the kernel is built for
    (``CUDAProperties(min_capability=90, max_capability=90)``): in a kernel
    mapping it makes kernelize keep the stock forwards on any other GPU
    (``KernelizeFallback.NO_COMPATIBLE_PROPERTIES``)."""
    from kernels import CUDAProperties, Device

    numbers = [_capability_number(a) for a in KERNEL_CUDA_CAPABILITIES]
    return Device(type="cuda", properties=CUDAProperties(min_capability=min(numbers), max_capability=max(numbers)))


def load_kernel(repo_id: str = KERNEL_REPO_ID, version: int = KERNEL_VERSION, *,
                local_path: Optional[PathLike] = None) -> ModuleType:
    """``kernels.get_kernel("ltx-kernels/ltx-kernels", version=1)``, or
    ``kernels.get_local_kernel(local_path)`` for a local build.

    ``LOCAL_KERNELS="ltx-kernels/ltx-kernels=<checkout>"`` makes ``get_kernel``
    load a local build (``python3 -m ltx_build build``) with no network access.
    The publisher is not on the Hub's trusted list, so the kernel's code is
    trusted explicitly here: this package loads that one repository and nothing
    else. Raises what kernels raises (no variant for this torch: FileNotFoundError;
    a GPU the build's archs do not cover: RuntimeError).
    """
    import kernels

    if local_path is not None:
        return kernels.get_local_kernel(Path(local_path))
    return kernels.get_kernel(repo_id, version=version, trust_remote_code=True)


def local_override(repo_id: str = KERNEL_REPO_ID) -> Optional[Path]:
    """The local checkout LOCAL_KERNELS maps ``repo_id`` to, if any (same
    ``repo=path:repo=path`` syntax as ``kernels``)."""
    for entry in os.environ.get("LOCAL_KERNELS", "").split(":"):
        name, sep, path = entry.partition("=")
        if sep and name == repo_id:
            return Path(path)
    return None


def this_machine() -> str:
    """The current CUDA device and its capability (or "no CUDA GPU"), torch and its CUDA."""
    import torch

    if torch.version.cuda is None or not torch.cuda.is_available():
        gpu = "no CUDA GPU"
    else:
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        gpu = f"cuda:{index} ({torch.cuda.get_device_name(index)}), compute capability {major}.{minor}"
    return f"{gpu}, torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})"


def gpu_problem() -> Optional[str]:
    """Why this machine's current GPU cannot run the kernel, or None when it can
    (checked before anything is loaded)."""
    import torch

    wanted = ", ".join(KERNEL_CUDA_CAPABILITIES)
    if torch.version.cuda is None or not torch.cuda.is_available():
        return f"the kernels need a CUDA GPU of compute capability {wanted}"
    major, minor = torch.cuda.get_device_capability(torch.cuda.current_device())
    if major * 10 + minor not in {_capability_number(a) for a in KERNEL_CUDA_CAPABILITIES}:
        return f"the kernels are built for compute capability {wanted}, not {major}.{minor}"
    return None


def _decision_text(decision, archs: Optional[List[str]] = None) -> str:
    from kernels import VariantAccepted

    name = decision.variant.variant_str + (f" [{', '.join(archs)}]" if archs else "")
    return f"{name}: {'compatible' if isinstance(decision, VariantAccepted) else decision.reason}"


def _local_variants(path: Path) -> str:
    """The variants of a local build, each with its archs and kernels' verdict for this machine."""
    from kernels import Metadata
    from kernels.variants import get_variants_local, resolve_variants

    for base in (path, path / "build"):  # where kernels' resolve_local_kernel looks
        # only directories with a metadata.json: kernels parses a checkout's torch-ext/ as a variant too
        variants = [v for v in get_variants_local(base) if (base / v.variant_str / "metadata.json").is_file()]
        if variants:
            _, trace = resolve_variants(variants)
            lines = []
            for decision in trace:
                try:
                    archs = list(Metadata.read_from_file(base / decision.variant.variant_str / "metadata.json")
                                 .backend.archs)
                except Exception:  # unreadable metadata.json: the name and the verdict still say enough
                    archs = None
                lines.append(_decision_text(decision, archs))
            return f"{base}: " + "; ".join(lines)
    return f"{path}: no build variants (build it: python3 -m ltx_build build)"


def _hub_variants(repo_id: str, version: int) -> str:
    """The variants of the Hub repository at ``version``, with kernels' verdict for this machine."""
    import kernels

    try:
        trace = kernels.get_kernel_variants(repo_id, version=version)
    except Exception as error:  # offline, not published, no access: say so instead of hiding the first problem
        return f"{repo_id} (version {version}): not listed ({type(error).__name__}: {_first_line(error)})"
    listed = "; ".join(_decision_text(d) for d in trace) or "none"
    return f"{repo_id} (version {version}): {listed}"


def available_variants(repo_id: str = KERNEL_REPO_ID, version: int = KERNEL_VERSION, *,
                       local_path: Optional[PathLike] = None) -> str:
    """What the kernel repository (or the local build ``local_path``, or the one
    LOCAL_KERNELS maps ``repo_id`` to) offers: each variant with kernels'
    verdict for this machine (and, for a local build, its archs)."""
    local = Path(local_path) if local_path is not None else local_override(repo_id)
    return _local_variants(local) if local is not None else _hub_variants(repo_id, version)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def load_kernel_if_supported(repo_id: str = KERNEL_REPO_ID, version: int = KERNEL_VERSION, *,
                             local_path: Optional[PathLike] = None, stacklevel: int = 2) -> Optional[ModuleType]:
    """:func:`load_kernel`, or None where the kernel cannot run, after exactly one
    :class:`KernelUnavailableWarning` (pointing ``stacklevel`` frames up, as
    ``warnings.warn``) that names the GPU and its capability (or "no CUDA GPU"),
    torch and its CUDA, and the variants on offer (:func:`available_variants`).

    Covers a machine without a CUDA GPU and a GPU of another capability (both
    found before anything is loaded), no variant for this torch and CUDA
    (kernels' FileNotFoundError) and kernels' own arch check. Any other failure
    (network, a broken build) is raised as it is.
    """
    problem = gpu_problem()
    if problem is None:
        try:
            return load_kernel(repo_id, version, local_path=local_path)
        except FileNotFoundError as error:  # kernels: no variant for this torch, CUDA and platform
            problem = f"kernels found no variant for this machine ({_first_line(error).rstrip(':')})"
        except RuntimeError as error:
            if _KERNELS_ARCH_REFUSAL not in str(error):
                raise
            problem = f"kernels refused the build ({_first_line(error).split('. ')[0]})"
    warnings.warn(KernelUnavailableWarning(
        f"ltx_kernels_diffusers: the ltx-kernels kernel does not run here, so the model keeps its stock "
        f"forwards: {problem}. This machine: {this_machine()}. Variants of "
        f"{available_variants(repo_id, version, local_path=local_path)}."), stacklevel=stacklevel)
    return None
