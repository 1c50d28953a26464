"""ltx-kernels: fused CUDA kernels for video diffusion transformers on Hopper.

Load a built variant with ``kernels.get_local_kernel(<repo root>)`` (or, once
published, ``kernels.get_kernel("<org>/ltx-kernels", version=1)``). Ops run on the input's device and
its current CUDA stream; each is a torch.library op with a fake
implementation, so ``torch.compile(fullgraph=True)`` traces it.
The ops in :data:`DIFFERENTIABLE` (``rmsnorm``, the fused norms, the layernorm family, the activations, the rotary ops) have a backward; every other op,
called while autograd records (grad mode on and an input that requires grad),
raises :class:`NoBackwardError` (see ``_autograd.py``).
"""

from . import layers, vae
from ._autograd import DIFFERENTIABLE, NoBackwardError
from ._device import UnsupportedDeviceError
from ._ops import add_op_namespace_prefix, ops
from .activation import geglu, gelu_tanh, head_gate, linear_gelu, swiglu
from .fused_norm import (adaln_rmsnorm, gated_residual, gated_residual_rmsnorm, modulated_rmsnorm,
                         residual_tanh_gated_rmsnorm, rmsnorm_residual)
from .fp8 import (Fp8Linear, Fp8Rows, adaln_layernorm_fp8, adaln_rmsnorm_fp8, gated_residual_fp8,
                  gated_residual_layernorm_fp8, gated_residual_rmsnorm_fp8, gelu_tanh_fp8, linear_fp8, quantize_fp8)
from .info import kernel_info
from .layernorm import adaln_layernorm, gated_residual_layernorm, layernorm
from .qk_rmsnorm_rope import qk_rmsnorm_rope
from .rmsnorm import rmsnorm
from .rope import apply_rotary_emb, ltx_rope_cos_sin
from .rope_axes import rope_1d, rope_3d, rope_3d_split
from .vae import inplace_add, pixel_norm

__all__ = ["rmsnorm", "rmsnorm_residual", "adaln_rmsnorm", "gated_residual", "gated_residual_rmsnorm",
           "residual_tanh_gated_rmsnorm", "modulated_rmsnorm", "layernorm", "adaln_layernorm",
           "gated_residual_layernorm", "pixel_norm", "inplace_add", "gelu_tanh",
           "geglu", "swiglu", "head_gate", "linear_gelu", "ltx_rope_cos_sin", "apply_rotary_emb", "qk_rmsnorm_rope", "rope_3d",
           "rope_1d", "rope_3d_split",
           "quantize_fp8", "gelu_tanh_fp8", "adaln_rmsnorm_fp8", "gated_residual_rmsnorm_fp8", "gated_residual_fp8",
           "adaln_layernorm_fp8", "gated_residual_layernorm_fp8", "linear_fp8", "Fp8Rows", "Fp8Linear",
           "kernel_info", "UnsupportedDeviceError", "NoBackwardError", "DIFFERENTIABLE", "layers", "vae", "ops", "add_op_namespace_prefix"]
