"""optimize_ltx: ``optimize`` for LTX-Video only, as before the model registry
(same options, behaviour and errors; a model that is not LTX-Video 0.9 is
refused naming what it is). The LTX-Video code is in ``models/ltx_video.py``."""

from __future__ import annotations

from .api import is_optimized, optimize_with, restore
from .models import ltx_video
from .models.ltx_video import FusedLTXVideoAttnProcessor

LTX_TARGET = "an LTX-Video pipeline (an object with a `.transformer`) or its LTXVideoTransformer3DModel"


def optimize_ltx(target, *, kernel=None, exact_mode: bool = True, gelu_epilogue: bool = True,
                 prefer_cudnn_attention: bool = True):
    """Rewire an LTX-Video pipeline's transformer (or the transformer itself)
    onto the fused ltx-kernels ops, in place; returns ``target``.

    - ``kernel``: the loaded ltx-kernels module (default: ``load_kernel_if_supported()``,
      i.e. ``kernels.get_kernel("ltx-kernels/ltx-kernels", version=1)`` where it can run).
    - ``exact_mode=True`` (default): every fused op reproduces diffusers' eager
      roundings (see the ops' docs); ``False`` rounds once per fused op.
    - ``gelu_epilogue=True`` (default): the feed-forward up-projection and its
      GELU-tanh run as one GEMM with the GELU epilogue, which rounds once where
      eager rounds the projection and then the GELU (the only fusion here with
      no bitwise form); ``False`` runs the projection, then the GELU-tanh kernel
      (bitwise ``F.gelu``).
    - ``prefer_cudnn_attention=True`` (default): with diffusers' native attention
      backend, ``F.scaled_dot_product_attention`` tries cuDNN first, then flash,
      memory-efficient and math (fastest at LTX's shapes on Hopper;
      docs/performance.md, "Attention backends"). A backend set with ``set_attention_backend`` wins.

    Idempotent (a second call with the same options changes nothing; with other
    options it re-applies). Call it before ``enable_model_cpu_offload()`` and
    before ``torch.compile``; afterwards it raises HooksPresentError /
    CompiledModelError saying what to do. A model it does not recognise raises
    UnsupportedModelError listing why, before anything is changed. Inference
    only: under autograd the stock code runs.

    Off Hopper it steps aside: without a CUDA GPU, on a GPU of another compute
    capability, or where no variant matches the installed torch and CUDA, it
    returns ``target`` untouched (``is_optimized`` False) after exactly one
    ``KernelUnavailableWarning`` naming the GPU's capability (or "no CUDA GPU"),
    torch and its CUDA, and the variants on offer (``hub.load_kernel_if_supported``).
    """
    return optimize_with(target, ltx_video, kernel, exact_mode,
                         dict(gelu_epilogue=gelu_epilogue, prefer_cudnn_attention=prefer_cudnn_attention),
                         entry="optimize_ltx", expected=LTX_TARGET, stacklevel=4)


__all__ = ["optimize_ltx", "restore", "is_optimized", "FusedLTXVideoAttnProcessor"]
