"""The kernel mapping for ``kernels.kernelize``.

diffusers does not mark its classes with ``use_kernel_forward_from_hub``, so
:func:`mark_ltx_layers` does it (``replace_kernel_forward_from_hub``), with a
condition that skips modules the layers were not written for; then
``kernelize(model, mode=Mode.INFERENCE)`` (or ``Mode.INFERENCE |
Mode.TORCH_COMPILE``) under ``use_kernel_mapping(kernel_mapping())`` replaces
their forwards with the stateless layers of ``ltx_kernels.layers``:

=============================  ===========================  ==========================================
diffusers class                layer name (mapping key)     ltx_kernels.layers class (exact / fast)
=============================  ===========================  ==========================================
``LTXVideoTransformerBlock``   ``LTXVideoTransformerBlock``  ``LTXVideoTransformerBlock`` / ``...Fast``
``LTXAttention``               ``LTXAttention``              ``LTXAttention`` / ``LTXAttentionFast``
``activations.GELU`` (tanh)    ``GELU``                      ``LinearGELU`` (epilogue) / ``GELU``
``normalization.RMSNorm``      ``RMSNorm``                   ``RMSNorm``
=============================  ===========================  ==========================================

Unlike :func:`optimize_ltx`, kernelize replaces each module on its own: the
feed-forward residual is not fused with the next block's norm (that needs the
model's block loop), attention runs ``F.scaled_dot_product_attention`` directly
(no diffusers attention backends), and the RoPE tables are the stock ones.

Off Hopper (no CUDA GPU, another compute capability, no variant for this torch
and CUDA) :func:`kernel_mapping` warns once and maps no device, so kernelize
keeps every stock forward; see its docstring.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from diffusers.models.activations import GELU
from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm
from diffusers.models.transformers.transformer_ltx import LTXAttention, LTXVideoTransformerBlock

from .discovery import attention_problems, block_problems
from .hub import KERNEL_REPO_ID, KERNEL_VERSION, kernel_device, load_kernel_if_supported, local_override


def _kernelizable_block(block) -> bool:
    return not block_problems(block, "block")


def _kernelizable_attention(attn) -> bool:
    return not attention_problems(attn, "attention")


def _kernelizable_rmsnorm(norm) -> bool:
    return len(norm.dim) == 1


def _kernelizable_gelu(gelu) -> bool:
    return gelu.approximate == "tanh"


LAYER_CLASSES = (  # (diffusers class, mapping key, kernelize condition)
    (LTXVideoTransformerBlock, "LTXVideoTransformerBlock", _kernelizable_block),
    (LTXAttention, "LTXAttention", _kernelizable_attention),
    (GELU, "GELU", _kernelizable_gelu),
    (DiffusersRMSNorm, "RMSNorm", _kernelizable_rmsnorm),
)


def mark_ltx_layers() -> None:
    """Make diffusers' LTX-Video classes visible to ``kernels.kernelize`` (sets
    ``kernel_layer_name`` and a ``kernel_condition`` on the classes; nothing
    changes until kernelize runs)."""
    from kernels import replace_kernel_forward_from_hub

    for cls, name, condition in LAYER_CLASSES:
        replace_kernel_forward_from_hub(cls, name, condition=condition)


def kernel_mapping(*, exact_mode: bool = True, gelu_epilogue: bool = True, repo_id: str = KERNEL_REPO_ID,
                   version: int = KERNEL_VERSION, local_path: Optional[Union[str, Path]] = None,
                   check: bool = True) -> dict:
    """The mapping for ``kernels.use_kernel_mapping`` / ``register_kernel_mapping``.

    ``exact_mode`` and ``gelu_epilogue`` choose the layers as in
    :func:`optimize_ltx`. Layers come from ``repo_id`` at ``version``, or from a
    local checkout: ``local_path``, else the one ``LOCAL_KERNELS`` maps
    ``repo_id`` to (kernels' ``LayerRepository`` resolves ``version`` against
    the Hub even when LOCAL_KERNELS is set, so a local build goes through
    ``LocalLayerRepository``). One repository per layer is registered for every
    mode, so ``Mode.INFERENCE`` and ``Mode.INFERENCE | Mode.TORCH_COMPILE`` both
    pick the layers (``can_torch_compile = True``); ``Mode.TRAINING`` keeps the
    stock forwards (``has_backward = False``).

    The repositories are registered for ``kernel_device()``, CUDA of compute
    capability 9.0 only, so on any other GPU kernelize itself keeps the stock
    forwards (``KernelizeFallback.NO_COMPATIBLE_PROPERTIES``). With ``check``
    (default) the kernel is loaded here (``load_kernel_if_supported``): where it
    cannot run (no CUDA GPU, another capability, no variant for this torch and
    CUDA) this warns once (``KernelUnavailableWarning``) and returns every layer
    name with no device, so kernelize keeps every stock forward
    (``KernelizeFallback.NO_DEVICE``, in its default ``use_fallback``).
    ``check=False`` loads nothing until kernelize does: a kernel that fails to
    load then raises there, unless ``use_fallback`` holds
    ``KernelizeFallback.CANNOT_LOAD``.
    """
    from kernels import LayerRepository, LocalLayerRepository

    local_path = local_path if local_path is not None else local_override(repo_id)
    fast = "" if exact_mode else "Fast"
    layers = {"LTXVideoTransformerBlock": "LTXVideoTransformerBlock" + fast, "LTXAttention": "LTXAttention" + fast,
              "GELU": "LinearGELU" if gelu_epilogue else "GELU", "RMSNorm": "RMSNorm"}
    if check and load_kernel_if_supported(repo_id, version, local_path=local_path, stacklevel=3) is None:
        return {name: {} for name in layers}

    def repository(layer_name: str):
        if local_path is not None:
            return LocalLayerRepository(Path(local_path), layer_name=layer_name)
        return LayerRepository(repo_id, layer_name=layer_name, version=version, trust_remote_code=True)

    device = kernel_device()
    return {name: {device: repository(layer)} for name, layer in layers.items()}
