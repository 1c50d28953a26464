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
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from diffusers.models.activations import GELU
from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm
from diffusers.models.transformers.transformer_ltx import LTXAttention, LTXVideoTransformerBlock

from .discovery import attention_problems, block_problems
from .hub import KERNEL_REPO_ID, KERNEL_VERSION, local_override


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
                   device: str = "cuda") -> dict:
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
    """
    from kernels import LayerRepository, LocalLayerRepository

    local_path = local_path if local_path is not None else local_override(repo_id)

    def repository(layer_name: str):
        if local_path is not None:
            return LocalLayerRepository(Path(local_path), layer_name=layer_name)
        return LayerRepository(repo_id, layer_name=layer_name, version=version, trust_remote_code=True)

    fast = "" if exact_mode else "Fast"
    layers = {"LTXVideoTransformerBlock": "LTXVideoTransformerBlock" + fast, "LTXAttention": "LTXAttention" + fast,
              "GELU": "LinearGELU" if gelu_epilogue else "GELU", "RMSNorm": "RMSNorm"}
    return {name: {device: repository(layer)} for name, layer in layers.items()}
