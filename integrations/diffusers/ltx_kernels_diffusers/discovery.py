"""Finding a pipeline's transformer, other hooks and compiled modules (for every
model), and checking, before anything changes, that every module of an
LTX-Video transformer the integration rewires is the module it was written for.

Modules are recognised by class, not by name: diffusers' ``RMSNorm`` and
``torch.nn.RMSNorm`` are both called "RMSNorm" but round differently, and an
LTX block's norms have no weight while its q/k norms have one.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import List, Optional

import torch
from diffusers.models.activations import GELU
from diffusers.models.attention import FeedForward
from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm
from diffusers.models.transformers.transformer_ltx import (LTXAttention, LTXVideoAttnProcessor,
                                                           LTXVideoRotaryPosEmbed, LTXVideoTransformer3DModel,
                                                           LTXVideoTransformerBlock)
from torch import nn

from .errors import CompiledModelError, HooksPresentError, UnsupportedModelError
from .hooks import HOOK_PREFIX

# The stock forward the integration's model forward stands in for (diffusers 0.42).
MODEL_FORWARD_PARAMETERS = ("self", "hidden_states", "encoder_hidden_states", "timestep", "encoder_attention_mask",
                            "num_frames", "height", "width", "rope_interpolation_scale", "video_coords",
                            "attention_kwargs", "return_dict")

HOOKS_ADVICE = (
    "For a pipeline: pipe.remove_all_hooks(), then {entry}(pipe), then pipe.enable_model_cpu_offload() "
    "(or enable_sequential_cpu_offload()) again. For diffusers hooks (group offloading, layerwise casting, "
    "caches, context parallelism): load the model again, call {entry} first, then enable them.")
EXPECTED_TARGET = "a diffusers pipeline (an object with a `.transformer`) or its transformer"


@dataclass
class LTXParts:
    """The modules of one LTX-Video transformer the integration rewires."""

    transformer: LTXVideoTransformer3DModel
    rope: LTXVideoRotaryPosEmbed
    blocks: List[LTXVideoTransformerBlock] = field(default_factory=list)
    attentions: List[LTXAttention] = field(default_factory=list)
    gelus: List[GELU] = field(default_factory=list)


def find_transformer(target, entry: str = "optimize", expected: str = EXPECTED_TARGET) -> nn.Module:
    """The transformer of a pipeline (its ``.transformer``), or ``target`` itself
    when it is a module. A compiled model is refused: the compiled code would
    keep running the forwards it traced. ``entry`` (the function called) and
    ``expected`` (what it takes) word the errors."""
    model = target if isinstance(target, nn.Module) else getattr(target, "transformer", None)
    if not isinstance(model, nn.Module):
        raise TypeError(f"ltx_kernels_diffusers: expected {expected}, got {type(target).__name__}")
    compiled = [name or "the model" for name, m in model.named_modules()
                if isinstance(m, torch._dynamo.eval_frame.OptimizedModule)
                or getattr(m, "_compiled_call_impl", None) is not None]
    if compiled:
        raise CompiledModelError(
            f"ltx_kernels_diffusers: {', '.join(compiled[:3])} {'is' if len(compiled) == 1 else 'are'} already "
            f"compiled; nothing was changed. Call {entry} (or restore) before torch.compile, then compile the "
            "optimised transformer: torch.compile(pipe.transformer, fullgraph=True) or "
            "pipe.transformer.compile_repeated_blocks(fullgraph=True).")
    return model


def foreign_hook_names(module: nn.Module) -> List[str]:
    """The names of the diffusers hooks on ``module`` that are not ours."""
    registry = getattr(module, "_diffusers_hook", None)
    hooks = getattr(registry, "hooks", None) or {}
    return [name for name in hooks if not name.startswith(HOOK_PREFIX)]


def hooked_modules(model: nn.Module) -> List[str]:
    """Modules carrying accelerate (``_hf_hook``) or diffusers (``_diffusers_hook``)
    hooks other than ours; both wrap the module's forward on the instance."""
    names = []
    for name, module in model.named_modules():
        if hasattr(module, "_hf_hook") or foreign_hook_names(module):
            names.append(name or type(module).__name__)
    return names


def refuse_hooks(model: nn.Module, entry: str) -> None:
    if getattr(model, "_parallel_config", None) is not None:
        raise HooksPresentError(
            f"ltx_kernels_diffusers: enable_parallelism was called on this {type(model).__name__} before {entry}; "
            f"its context-parallel hooks wrap the forwards {entry} replaces, so nothing was changed. Load the model "
            f"again, call {entry} first, then enable_parallelism.")
    hooked = hooked_modules(model)
    if hooked:
        shown = ", ".join(hooked[:4]) + (f" and {len(hooked) - 4} more" if len(hooked) > 4 else "")
        raise HooksPresentError(
            f"ltx_kernels_diffusers: {entry} found offload/cache hooks on {shown}; they wrap the forward methods "
            f"it replaces, so nothing was changed. {HOOKS_ADVICE.format(entry=entry)}")


def _overrides(module: nn.Module, base: type, method: str = "forward") -> bool:
    return getattr(type(module), method) is not getattr(base, method)


def rmsnorm_problem(norm: nn.Module, where: str, dim: int, *, block_norm: bool) -> Optional[str]:
    """Why ``norm`` cannot be fused, or None. Block norms (``norm1``/``norm2``)
    feed the fused AdaLN ops, which round like diffusers' RMSNorm; q/k norms may
    be either RMSNorm."""
    if isinstance(norm, DiffusersRMSNorm):
        if getattr(norm, "bias", None) is not None:
            return f"{where} is diffusers' RMSNorm with a bias, which the fused norms do not add"
        if tuple(norm.dim) != (dim,):
            return f"{where} normalises over {tuple(norm.dim)}, not the hidden size ({dim},)"
        return None
    if isinstance(norm, nn.RMSNorm):
        if tuple(norm.normalized_shape) != (dim,):
            return f"{where} normalises over {tuple(norm.normalized_shape)}, not ({dim},)"
        if block_norm and norm.weight is not None:
            return (f"{where} is torch.nn.RMSNorm with a weight; the fused AdaLN ops round like diffusers' "
                    "RMSNorm when there is a weight")
        return None
    return f"{where} is {type(norm).__qualname__}, not an RMSNorm (diffusers' RMSNorm or torch.nn.RMSNorm)"


def attention_problems(attn: nn.Module, where: str) -> List[str]:
    if not isinstance(attn, LTXAttention):
        return [f"{where} is {type(attn).__qualname__}, not diffusers' LTXAttention"]
    problems = []
    if _overrides(attn, LTXAttention):
        problems.append(f"{where} is a subclass of LTXAttention with its own forward")
    if type(attn.processor) is not LTXVideoAttnProcessor:
        problems.append(
            f"{where} uses the attention processor {type(attn.processor).__qualname__}, not diffusers' "
            "LTXVideoAttnProcessor, and optimize_ltx would replace it; set "
            "LTXVideoAttnProcessor() back (attn.set_processor) or leave this model unoptimised")
    for norm_name, dim in (("norm_q", attn.inner_dim), ("norm_k", attn.inner_kv_dim)):
        problem = rmsnorm_problem(getattr(attn, norm_name, None), f"{where}.{norm_name}", dim, block_norm=False)
        if problem:
            problems.append(problem)
    return problems


def block_problems(block: nn.Module, where: str) -> List[str]:
    """Why ``block`` cannot run the fused block forward (empty when it can)."""
    if not isinstance(block, LTXVideoTransformerBlock):
        return [f"{where} is {type(block).__qualname__}, not diffusers' LTXVideoTransformerBlock"]
    problems = []
    if _overrides(block, LTXVideoTransformerBlock):
        problems.append(f"{where} is a subclass of LTXVideoTransformerBlock with its own forward")
    table = getattr(block, "scale_shift_table", None)
    if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[0] != 6:
        problems.append(f"{where}.scale_shift_table is not the [6, hidden] AdaLN table")
        return problems
    for norm_name in ("norm1", "norm2"):
        problem = rmsnorm_problem(getattr(block, norm_name, None), f"{where}.{norm_name}", table.shape[1],
                                  block_norm=True)
        if problem:
            problems.append(problem)
    for attn_name in ("attn1", "attn2"):
        problems += attention_problems(getattr(block, attn_name, None), f"{where}.{attn_name}")
    return problems


def tanh_gelu_of(block: nn.Module) -> Optional[GELU]:
    """The feed-forward's up-projection + GELU-tanh module (``ff.net[0]``), if it
    is diffusers' ``GELU(approximate="tanh")``; other activations stay as they are."""
    ff = getattr(block, "ff", None)
    if not isinstance(ff, FeedForward) or _overrides(ff, FeedForward):
        return None
    act = ff.net[0]
    if type(act) is GELU and act.approximate == "tanh":
        return act
    return None


def model_problems(model: nn.Module) -> List[str]:
    if not isinstance(model, LTXVideoTransformer3DModel):
        return [f"the model is {type(model).__qualname__}, not diffusers' LTXVideoTransformer3DModel "
                "(LTX-Video 0.9.x, 2B and 13B); LTX-2 and other models are not supported"]
    problems = []
    if _overrides(model, LTXVideoTransformer3DModel):
        problems.append("the model is a subclass of LTXVideoTransformer3DModel with its own forward")
    parameters = tuple(inspect.signature(LTXVideoTransformer3DModel.forward).parameters)
    if parameters != MODEL_FORWARD_PARAMETERS:
        problems.append(f"this diffusers' LTXVideoTransformer3DModel.forward takes {parameters}, not the "
                        f"{MODEL_FORWARD_PARAMETERS} ltx_kernels_diffusers was written for (diffusers 0.42)")
    rope = getattr(model, "rope", None)
    if not isinstance(rope, LTXVideoRotaryPosEmbed) or _overrides(rope, LTXVideoRotaryPosEmbed):
        problems.append(f"model.rope is {type(rope).__qualname__}, not diffusers' LTXVideoRotaryPosEmbed")
    blocks = getattr(model, "transformer_blocks", None)
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
        problems.append("model.transformer_blocks is not a non-empty ModuleList")
    else:
        for index, block in enumerate(blocks):
            problems += block_problems(block, f"transformer_blocks.{index}")
    return problems


def refuse_problems(problems: List[str]) -> None:
    """UnsupportedModelError listing ``problems`` (the first 12), if there are any."""
    if problems:
        shown = "\n  - ".join(problems[:12]) + (f"\n  - ... and {len(problems) - 12} more" if len(problems) > 12
                                                 else "")
        raise UnsupportedModelError(
            "ltx_kernels_diffusers does not recognise this model, so nothing was changed:\n  - " + shown)


def check_ltx_transformer(model: nn.Module) -> LTXParts:
    """The modules to rewire, or UnsupportedModelError listing every problem."""
    refuse_problems(model_problems(model))
    parts = LTXParts(transformer=model, rope=model.rope)
    for block in model.transformer_blocks:
        parts.blocks.append(block)
        parts.attentions += [block.attn1, block.attn2]
        gelu = tanh_gelu_of(block)
        if gelu is not None:
            parts.gelus.append(gelu)
    return parts
