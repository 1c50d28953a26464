"""Drop-in diffusers integration of ltx-kernels for LTX-Video.

    from ltx_kernels_diffusers import optimize_ltx, restore
    pipe = LTXPipeline.from_pretrained("Lightricks/LTX-Video", torch_dtype=torch.bfloat16).to("cuda")
    optimize_ltx(pipe)                 # before enable_model_cpu_offload() and torch.compile
    video = pipe(prompt, ...).frames
    restore(pipe)                      # stock forwards again

or, through ``kernels.kernelize`` (each module on its own):

    from kernels import Mode, kernelize, use_kernel_mapping
    from ltx_kernels_diffusers import kernel_mapping, mark_ltx_layers
    mark_ltx_layers()
    with use_kernel_mapping(kernel_mapping()):
        kernelize(pipe.transformer, mode=Mode.INFERENCE | Mode.TORCH_COMPILE)

This package is not part of the Hub kernel (which imports only the standard
library, torch and itself); it needs diffusers and kernels. See docs/integration.md.
"""

from .discovery import LTXParts, check_ltx_transformer, find_transformer
from .errors import CompiledModelError, HooksPresentError, KernelUnavailableWarning, UnsupportedModelError
from .hub import (KERNEL_CUDA_CAPABILITIES, KERNEL_REPO_ID, KERNEL_VERSION, available_variants, kernel_device,
                  load_kernel, load_kernel_if_supported)
from .kernelize import kernel_mapping, mark_ltx_layers
from .optimize import FusedLTXVideoAttnProcessor, is_optimized, optimize_ltx, restore

__all__ = ["optimize_ltx", "restore", "is_optimized", "kernel_mapping", "mark_ltx_layers", "load_kernel",
           "load_kernel_if_supported", "available_variants", "kernel_device", "check_ltx_transformer",
           "find_transformer", "LTXParts", "FusedLTXVideoAttnProcessor", "UnsupportedModelError", "HooksPresentError",
           "CompiledModelError", "KernelUnavailableWarning", "KERNEL_REPO_ID", "KERNEL_VERSION",
           "KERNEL_CUDA_CAPABILITIES"]
