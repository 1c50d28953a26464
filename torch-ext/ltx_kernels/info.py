"""``kernel_info()``: what this build holds and whether it runs on this machine.

Read from the variant directory it was loaded from (``build/<variant>/``, the
Hub, or ltx_build's compile-on-first-use cache: all the same layout).
``python3 -m ltx_build info`` prints it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch

from . import _ops
from ._device import arch_runs_on, archs_run_on  # noqa: F401 (arch_runs_on stays part of info)

# Dispatch keys worth naming: where an op has a kernel.
_DISPATCH_KEYS = ("CUDA", "CPU", "Meta", "CompositeExplicitAutograd", "CompositeImplicitAutograd")
_PLUMBING = ("add_op_namespace_prefix", "ops")


@dataclass(frozen=True)
class OpStatus:
    name: str
    runs: bool
    reason: str  # why it will not run on this machine's GPU; "" when it will
    kernels: list[str]  # dispatch keys with a kernel, e.g. ["CUDA", "Meta"]


@dataclass(frozen=True)
class KernelInfo:
    package: str
    variant: str
    library: str
    ops_namespace: str
    archs: list[str]
    torch: str
    torch_cuda: Optional[str]
    device: Optional[str]
    capability: Optional[tuple[int, int]]
    ops: list[OpStatus] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def report(self) -> str:
        cap = f"{self.capability[0]}.{self.capability[1]}" if self.capability else "none"
        lines = [
            f"package     {self.package}",
            f"variant     {self.variant}",
            f"library     {self.library}",
            f"archs       {', '.join(self.archs) or 'not declared'}",
            f"torch       {self.torch} (CUDA {self.torch_cuda or 'none'})",
            f"GPU         {self.device or 'none visible'} (capability {cap})",
            f"ops         {sum(o.runs for o in self.ops)} of {len(self.ops)} run on this GPU",
        ]
        shared = {o.reason for o in self.ops}
        if len(shared) == 1 and self.ops and not self.ops[0].runs:
            lines[-1] += f": {self.ops[0].reason}"
        width = max((len(o.name) for o in self.ops), default=0)
        for o in self.ops:
            verdict = "runs" if o.runs else ("does not run" if len(shared) == 1 else f"does not run: {o.reason}")
            lines.append(f"  {o.name:<{width}}  {verdict:<12}  kernels for {', '.join(o.kernels) or 'nothing'}")
        lines.append(f"functions   {', '.join(self.functions)}")
        return "\n".join(lines)


def _namespace() -> str:
    return _ops.add_op_namespace_prefix("x").split("::")[0]


def _variant_and_library(package_dir: Path, namespace: str) -> tuple[str, str, list[str]]:
    """(variant, library path, archs), from the variant directory and its metadata.json."""
    libraries = sorted(package_dir.glob(f"{namespace}*.so"))
    archs: list[str] = []
    metadata = package_dir / "metadata.json"
    if metadata.is_file():
        archs = list(json.loads(metadata.read_text()).get("backend", {}).get("archs") or [])
    return package_dir.name, str(libraries[0]) if libraries else "", archs


def _op_status(qualified: str, archs: list[str], device_problem: Optional[str],
               capability: Optional[tuple[int, int]]) -> OpStatus:
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    kernels = [k for k in _DISPATCH_KEYS if has(qualified, k)]
    name = qualified.split("::", 1)[1]
    composite = any(k.startswith("Composite") for k in kernels)
    if device_problem:
        return OpStatus(name, False, device_problem, kernels)
    if "CUDA" not in kernels and not composite:
        return OpStatus(name, False, "the library registers no CUDA kernel for it", kernels)
    if "CUDA" in kernels and archs and capability and not archs_run_on(archs, capability):
        return OpStatus(name, False, f"built for {', '.join(archs)}, which does not run on capability "
                        f"{capability[0]}.{capability[1]}", kernels)
    return OpStatus(name, True, "", kernels)


def kernel_info() -> KernelInfo:
    """The ops this build registers, its variant and archs, the GPU, and for
    each op whether it runs on that GPU (with the reason when not)."""
    package = __name__.rsplit(".", 1)[0]
    namespace = _namespace()
    variant, library, archs = _variant_and_library(Path(__file__).parent, namespace)

    device = capability = device_problem = None
    if torch.version.cuda is None:
        device_problem = f"torch {torch.__version__} is built without CUDA"
    elif not torch.cuda.is_available():
        device_problem = "no CUDA device is visible (torch.cuda.is_available() is False)"
    else:
        device = torch.cuda.get_device_name()
        capability = tuple(torch.cuda.get_device_capability())

    qualified = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith(namespace + "::"))
    ops = [_op_status(q, archs, device_problem, capability) for q in qualified]
    module = sys.modules.get(package)
    functions = sorted(n for n in getattr(module, "__all__", []) if n not in _PLUMBING
                       and callable(getattr(module, n, None))
                       and not isinstance(getattr(module, n), (type(sys), type)))  # not modules, not classes
    return KernelInfo(package=package, variant=variant, library=library, ops_namespace=namespace, archs=archs,
                      torch=torch.__version__, torch_cuda=torch.version.cuda, device=device,
                      capability=capability, ops=ops, functions=functions)
