"""ltx-kernels: fused CUDA kernels for video diffusion transformers on Hopper.

Load it with ``kernels.get_kernel("<org>/ltx-kernels", version=1)`` or
``kernels.get_local_kernel(<repo root>)``. Ops run on the input's device and
its current CUDA stream; each is a torch.library op with a fake
implementation, so ``torch.compile(fullgraph=True)`` traces it.
"""

from . import layers
from ._ops import add_op_namespace_prefix, ops
from .norm import rmsnorm

__all__ = ["rmsnorm", "layers", "ops", "add_op_namespace_prefix"]
