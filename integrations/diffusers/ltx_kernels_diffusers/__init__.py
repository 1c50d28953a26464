"""Drop-in diffusers integration of ltx-kernels.

    from ltx_kernels_diffusers import optimize, restore
    pipe = MochiPipeline.from_pretrained("genmo/mochi-1-preview", torch_dtype=torch.bfloat16).to("cuda")
    optimize(pipe)                     # before enable_model_cpu_offload() and torch.compile
    video = pipe(prompt, ...).frames
    restore(pipe)                      # the stock model again

``optimize`` picks the model by the transformer's diffusers class (``models``:
LTX-Video 0.9, LTX-2, Mochi 1, Wan 2.1 / 2.2, Flux.1) and refuses any other, saying why, before changing
anything. ``optimize_ltx`` is the LTX-Video-only form it grew from. LTX-Video
also goes through ``kernels.kernelize`` (each module on its own):

    from kernels import Mode, kernelize, use_kernel_mapping
    from ltx_kernels_diffusers import kernel_mapping, mark_ltx_layers
    mark_ltx_layers()
    with use_kernel_mapping(kernel_mapping()):
        kernelize(pipe.transformer, mode=Mode.INFERENCE | Mode.TORCH_COMPILE)

This package is not part of the Hub kernel (which imports only the standard
library, torch and itself); it needs diffusers and kernels. See docs/integration.md.
"""

from .api import is_optimized, optimize, optimize_ltx, restore
from .cuda_graph import CudaGraphWarning, reset_cuda_graphs
from .discovery import LTXParts, check_ltx_transformer, find_transformer
from .errors import CompiledModelError, HooksPresentError, KernelUnavailableWarning, UnsupportedModelError
from .hub import (KERNEL_CUDA_CAPABILITIES, KERNEL_REPO_ID, KERNEL_VERSION, available_variants, kernel_device,
                  load_kernel, load_kernel_if_supported)
from .kernelize import kernel_mapping, mark_ltx_layers
from .models import MODELS, fp8_linear_names, supported
from .models.flux import FusedFluxAttnProcessor
from .models.ltx2 import FusedLTX2AttnProcessor, FusedLTX2PerturbedAttnProcessor
from .models.ltx_video import FusedLTXVideoAttnProcessor
from .models.mochi import FusedMochiAttnProcessor
from .models.wan import FusedWanAttnProcessor
from .parallel import context_parallel_plan

__all__ = ["optimize", "restore", "is_optimized", "optimize_ltx", "supported", "MODELS", "kernel_mapping",
           "mark_ltx_layers", "load_kernel", "load_kernel_if_supported", "available_variants", "kernel_device",
           "check_ltx_transformer", "find_transformer", "LTXParts", "FusedLTXVideoAttnProcessor",
           "FusedLTX2AttnProcessor", "FusedLTX2PerturbedAttnProcessor", "FusedMochiAttnProcessor",
           "FusedWanAttnProcessor", "FusedFluxAttnProcessor", "UnsupportedModelError", "HooksPresentError",
           "CompiledModelError", "KernelUnavailableWarning", "KERNEL_REPO_ID", "KERNEL_VERSION",
           "KERNEL_CUDA_CAPABILITIES", "context_parallel_plan", "fp8_linear_names", "CudaGraphWarning",
           "reset_cuda_graphs"]
