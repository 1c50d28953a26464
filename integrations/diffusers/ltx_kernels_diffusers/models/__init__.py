"""The model registry: one module per model family (see ``base`` for what a
module provides). ``optimize`` picks the module whose ``CLASSES`` the
transformer is an instance of; supported means implemented here. Adding a
model is adding its module and listing it in ``MODELS``."""

from __future__ import annotations

from typing import List

from torch import nn

from ..errors import UnsupportedModelError
from . import flux, ltx2, ltx_video, mochi, wan

MODELS = (ltx_video, ltx2, mochi, wan, flux)


def supported() -> str:
    """The supported models and their diffusers classes, for messages and docs."""
    return "; ".join(f"{model.NAME}: {', '.join(cls.__name__ for cls in model.CLASSES)}" for model in MODELS)


def model_for(transformer: nn.Module):
    """The registry module serving ``transformer``'s class, or UnsupportedModelError
    (naming its class and the supported ones) before anything is changed."""
    for model in MODELS:
        if isinstance(transformer, model.CLASSES):
            return model
    raise UnsupportedModelError(
        f"ltx_kernels_diffusers does not support {type(transformer).__module__}.{type(transformer).__qualname__}, "
        f"so nothing was changed. Supported transformers (diffusers classes): {supported()}.")


def fp8_linear_names(transformer: nn.Module) -> List[str]:
    """The qualified names of the linears ``optimize(transformer, fp8=True)`` runs as ``Fp8Linear``
    (the model's ``FP8_LINEARS`` in each block, and its ``FP8_SINGLE_LINEARS`` in each single block);
    TypeError for a model without ``fp8``."""
    model = model_for(transformer)
    paths = getattr(model, "FP8_LINEARS", None)
    if paths is None:
        raise TypeError(f"ltx_kernels_diffusers: {model.NAME} does not take fp8=True yet")
    lists = [(getattr(model, "BLOCKS_ATTR", "transformer_blocks"), paths)]
    if hasattr(model, "FP8_SINGLE_LINEARS"):
        lists.append(("single_transformer_blocks", model.FP8_SINGLE_LINEARS))
    return [f"{blocks}.{i}.{path}" for blocks, block_paths in lists
            for i in range(len(getattr(transformer, blocks))) for path in block_paths]


__all__ = ["MODELS", "model_for", "supported", "fp8_linear_names"]
