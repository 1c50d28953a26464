"""Which GPUs this build runs on, and the refusal that says so.

The kernels are compiled for the compute capabilities in the variant's
``metadata.json`` (``backend.archs``; 9.0 where there is none, as in the
source tree). On any other GPU a launch would fail with CUDA's "no kernel
image is available for execution on the device". Instead, the first call of
an op on each CUDA device compares the device's capability with those archs
and, when they do not cover it, raises :class:`UnsupportedDeviceError` naming
the device and its capability, the build's archs, torch and its CUDA, and where
the variants are listed. The verdict is cached per device index, so a call on
a device that runs the build costs one set lookup.

On a machine where no CUDA device runs the build (none at all, or the current
one is of another capability), the refusal of a CPU tensor ("must be a CUDA
tensor") carries the same facts.

Standard library and torch only: importable without the compiled library.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Optional, Tuple, Union

import torch

DEFAULT_ARCHS = ("9.0",)  # build.toml's cuda-capabilities, for a package without metadata.json beside it
HUB_REPO_ID = "ltx-kernels/ltx-kernels"  # build.toml's [general.hub] repo-id
DEFAULT_VERSION = 1
_PACKAGE_DIR = Path(__file__).resolve().parent
_CPU_REFUSAL = "must be a CUDA tensor"

# Device indices whose tensors need no capability check: -1 is CPU and meta
# tensors (the ops' argument checks refuse or pass them), the others are CUDA
# devices found to run the build.
_CHECKED = {-1}


class UnsupportedDeviceError(RuntimeError):
    """No kernel of this build runs on the device (or there is no CUDA device):
    the message names the device's capability, the build's, torch and CUDA, and
    where the variants are listed. Nothing was launched."""


def arch_runs_on(arch: str, capability: Tuple[int, int]) -> Optional[bool]:
    """Whether code built for ``arch`` ("9.0", "9.0a", "10.0f", "9.0+PTX") runs
    on a GPU of ``capability``; None for an arch string of unknown form.

    The rules `kernels` applies before loading: cubins run on the same major
    at an equal or newer minor, ``a`` builds only on their exact capability,
    PTX is compiled by the driver for any newer one."""
    ptx = arch.endswith("+PTX")
    base = arch.removesuffix("+PTX")
    suffix = base[-1] if base[-1:] in ("a", "f") else ""
    major, dot, minor = base.removesuffix(suffix).partition(".")
    if not (dot and major.isdigit() and minor.isdigit()):
        return None
    built = (int(major), int(minor))
    if suffix == "a":
        return capability == built
    if ptx and not suffix:
        return capability >= built
    return capability[0] == built[0] and capability[1] >= built[1]


def archs_run_on(archs, capability: Tuple[int, int]) -> bool:
    verdicts = [arch_runs_on(a, capability) for a in archs]
    return any(verdicts) or all(v is None for v in verdicts)


@functools.lru_cache(maxsize=None)
def _metadata() -> dict:
    path = _PACKAGE_DIR / "metadata.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def build_archs() -> Tuple[str, ...]:
    """The compute capabilities this build holds kernels for."""
    return tuple(_metadata().get("backend", {}).get("archs") or DEFAULT_ARCHS)


def _variants_note() -> str:
    version = _metadata().get("version", DEFAULT_VERSION)
    note = f'kernels.get_kernel_variants("{HUB_REPO_ID}", version={version}) lists the Hub repository\'s variants'
    if _metadata():  # a variant directory: its siblings are the variants built or downloaded here
        here = sorted(p.name for p in _PACKAGE_DIR.parent.iterdir() if (p / "metadata.json").is_file())
        note += f"; {_PACKAGE_DIR.parent} holds {', '.join(here)}"
    return note


def facts() -> str:
    """The build's archs and variant, torch and its CUDA, and where the variants are listed."""
    variant = f" ({_PACKAGE_DIR.name})" if _metadata() else ""
    return (f"this build{variant} runs on compute capability {', '.join(build_archs())}; "
            f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}); {_variants_note()}")


def _device_text(index: int, capability: Tuple[int, int]) -> str:
    return (f"cuda:{index} ({torch.cuda.get_device_name(index)}) has compute capability "
            f"{capability[0]}.{capability[1]}")


def machine_problem() -> Optional[str]:
    """Why this machine's current CUDA device does not run the build ("this
    machine has no CUDA GPU", or its capability), or None when it does."""
    if torch.version.cuda is None or not torch.cuda.is_available():
        return "this machine has no CUDA GPU"
    index = torch.cuda.current_device()
    capability = tuple(torch.cuda.get_device_capability(index))
    if archs_run_on(build_archs(), capability):
        return None
    return _device_text(index, capability)


def check_device(op: str, t: torch.Tensor) -> None:
    """Refuse (UnsupportedDeviceError) when ``t`` is on a CUDA device this build
    has no kernels for. One set lookup once the device has passed."""
    try:
        if t.get_device() in _CHECKED:
            return
    except AttributeError:
        return  # not a tensor: the op's own checks name the argument
    _first_call_on(op, t.get_device())


def _first_call_on(op: str, index: int) -> None:
    if torch.compiler.is_compiling() or not torch.cuda.is_available():
        # Tracing, or fake CUDA tensors on a machine without one: nothing is launched here.
        return
    capability = tuple(torch.cuda.get_device_capability(index))
    if archs_run_on(build_archs(), capability):
        _CHECKED.add(index)
        return
    raise UnsupportedDeviceError(f"ltx_kernels.{op}: {_device_text(index, capability)}, and {facts()}. "
                                 "Nothing was launched.")


def device_refusal(error: Union[RuntimeError, str]) -> RuntimeError:
    """The error to raise for ``error`` (an op's refusal, or its message): a
    refusal of a CPU tensor on a machine whose CUDA device (if any) does not run
    the build becomes an UnsupportedDeviceError with :func:`facts` appended;
    anything else is returned as it is (a message as a RuntimeError)."""
    message = str(error)
    if _CPU_REFUSAL in message:
        problem = machine_problem()
        if problem is not None:
            return UnsupportedDeviceError(f"{message}; {problem}, and {facts()}")
    return error if isinstance(error, RuntimeError) else RuntimeError(message)
