"""LTX-Video 0.9 (``LTXVideoTransformer3DModel``, 2B and 13B) in the model
registry: rewire the transformer onto the fused ltx-kernels ops, and undo it.
``optimize`` and ``optimize_ltx`` call this module's check / apply / restore.

What changes (instance attributes only; classes and weights are untouched):

- each ``LTXVideoTransformerBlock.forward``: norm + AdaLN modulation in one
  pass, the cross-attention residual fused with ``norm2``, and, when the model
  forward chains the blocks, each feed-forward gated residual fused with the
  next block's ``norm1`` (``ltx_kernels.layers.ltx_block_forward``);
- each ``LTXAttention`` processor: q/k RMSNorm + RoPE in one pass, attention
  through diffusers' ``dispatch_attention_fn`` (attention backends still apply);
- each feed-forward ``GELU(approximate="tanh")``: the up-projection with the
  GELU epilogue (or the GELU-tanh kernel after it);
- ``rope.forward``: the RoPE tables built on the device with the batch dim
  expanded (read once per token);
- the model's forward: the stock forward with the blocks chained as above.

Under autograd every piece runs fused, each op with its backward or as stock
code (``autograd.AutogradKernel``); with gradient checkpointing on, the stock
model forward runs (checkpointing each fused block, unchained).

These are instance ``forward`` replacements, not diffusers hooks: the model
forward must chain the blocks (each block hands the next its normalised input),
which no hook seam offers, and the replaced forwards are what the existing
behaviour (restore refusing later hooks, regional compilation's three block
graphs) and tests are built on. docs/integration.md, "Seams", says why.
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import torch
from diffusers.models.modeling_outputs import Transformer2DModelOutput
from diffusers.models.transformers.transformer_ltx import LTXVideoAttnProcessor, LTXVideoTransformer3DModel
from torch import nn

from ..attention import DispatchedAttention
from ..discovery import LTXParts, check_ltx_transformer
from ..errors import HooksPresentError, UnsupportedModelError
from .base import (SwappedLinear, check_fp8_restorable, check_kernel_functions, fp8_problems, fp8_replaced, swap_fp8,
                   unswap_fp8)

NAME = "LTX-Video 0.9 (2B, 13B)"
CLASSES = (LTXVideoTransformer3DModel,)
KERNEL_FUNCTIONS = ("rmsnorm", "adaln_rmsnorm", "gated_residual", "gated_residual_rmsnorm", "gelu_tanh",
                    "linear_gelu", "apply_rotary_emb", "ltx_rope_cos_sin")
KERNEL_LAYER_FUNCTIONS = ("ltx_block_forward", "ltx_attention_forward", "gelu_forward")
FP8_KERNEL_FUNCTIONS = ("adaln_rmsnorm_fp8", "gated_residual_rmsnorm_fp8", "gated_residual_fp8", "gelu_tanh_fp8",
                        "linear_fp8", "Fp8Linear")
# The block linears fp8=True runs in float8_e4m3, by path from the block. Cross-attention's to_k/to_v stay
# in bf16: their input is the text (256 rows at LTX-Video's shape), too few rows for FP8 to gain.
FP8_LINEARS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_out.0",
               "ff.net.0.proj", "ff.net.2")


@dataclass(frozen=True)
class Options:
    """``exact_mode``; ``gelu_epilogue``: the feed-forward up-projection and its
    GELU-tanh as one GEMM with the GELU epilogue; ``prefer_cudnn_attention``:
    with diffusers' native attention backend, try cuDNN first; ``fp8``: the block
    linears (``FP8_LINEARS``) as float8_e4m3 GEMMs, their inputs quantised per row
    by the norms, residuals and GELU that produce them (inference only); ``fp8_fast_accum``
    (default): those GEMMs with cuBLASLt's fast accumulation, whose error measured the
    same as without it (docs/fp8.md); ``fp8_keep_bf16`` (default): keep the bf16 linears
    for ``restore`` (False frees them, and restore then refuses); ``fp8_fuse_qkv`` (default):
    each self-attention's q/k/v as one FP8 GEMM (``Fp8Linear.concat``; fewer launches, the
    same rows); ``fp8_join_text_kv`` (default): every block's cross-attention ``to_k`` and
    ``to_v`` (bf16) as one GEMM per forward (:class:`JoinedTextKV`), 55 fewer launches a step."""

    exact_mode: bool = True
    gelu_epilogue: bool = True
    prefer_cudnn_attention: bool = True
    fp8: bool = False
    fp8_fast_accum: bool = True
    fp8_keep_bf16: bool = True
    fp8_fuse_qkv: bool = True
    fp8_join_text_kv: bool = True


@dataclass
class PatchState:
    """What optimize_ltx changed on one transformer, for restore."""

    kernel: object
    options: Options
    forwards: List[Tuple[nn.Module, Callable]] = field(default_factory=list)  # (module, the bound forward set)
    processors: List[Tuple[nn.Module, object, object]] = field(default_factory=list)  # (attn, original, ours)
    linears: List[SwappedLinear] = field(default_factory=list)  # fp8=True
    joined_qkv: List[nn.Module] = field(default_factory=list)  # the attentions given to_qkv_fp8
    text_kv_owner: Optional[nn.Module] = None  # the transformer given text_kv_joined

    def __deepcopy__(self, memo):
        # A deep copy of the model gets its own modules and one shared kernel (a module cannot be copied).
        return PatchState(self.kernel, self.options, copy.deepcopy(self.forwards, memo),
                          copy.deepcopy(self.processors, memo), copy.deepcopy(self.linears, memo),
                          copy.deepcopy(self.joined_qkv, memo), copy.deepcopy(self.text_kv_owner, memo))


class FusedLTXVideoAttnProcessor(DispatchedAttention, LTXVideoAttnProcessor):
    """``LTXVideoAttnProcessor`` with q/k RMSNorm + RoPE in one pass
    (``ltx_kernels.layers.ltx_attention_forward``); attention itself goes through
    ``dispatch_attention_fn`` with this processor's backend, as the stock one does."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None,
                 key_value=None):
        extra = {} if key_value is None else {"key_value": key_value}  # older kernels lack the argument
        return self.kernel.layers.ltx_attention_forward(
            attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb, kernel=self.kernel,
            exact_mode=self.exact_mode, attention=self.attention, **extra)

    def __deepcopy__(self, memo):
        return copy.copy(self)  # shares the kernel


class JoinedTextKV(nn.Module):
    """Every block's cross-attention ``to_k`` and ``to_v`` as one ``nn.Linear`` GEMM: they all read the
    caption's rows, so the model forward runs it once and hands each block its column views (28 blocks:
    one launch for 56). The parts' weights and biases become views of the joined ones (no extra memory,
    and again after ``.to()``: set on the transformer after its blocks, it moves last); :meth:`release`
    gives each part its own copy back. The joined tensors are not persistent: ``state_dict`` keeps the
    parts' own."""

    def __init__(self, linears):
        super().__init__()
        self.parts = tuple(linears)  # a tuple: not registered as submodules
        self.register_buffer("weight", torch.cat([m.weight.detach() for m in self.parts]), persistent=False)
        bias = None if self.parts[0].bias is None else torch.cat([m.bias.detach() for m in self.parts])
        self.register_buffer("bias", bias, persistent=False)
        self._share_with_parts()

    @staticmethod
    def joinable(linears) -> bool:
        """Plain ``nn.Linear`` of one input width, dtype and device, all with a bias or all without."""
        keys = {(type(m), m.in_features, m.weight.dtype, m.weight.device, m.bias is None) for m in linears}
        return len(keys) == 1 and next(iter(keys))[0] is nn.Linear

    def _share_with_parts(self) -> None:
        start = 0
        for m in self.parts:
            rows = slice(start, start + m.out_features)
            m.weight.data = self.weight[rows]
            if m.bias is not None:
                m.bias.data = self.bias[rows]
            start = rows.stop

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)  # the parts moved before (each its own copy): views of ours again
        self._share_with_parts()
        return self

    def release(self) -> None:
        for m in self.parts:
            m.weight.data = m.weight.data.clone()
            if m.bias is not None:
                m.bias.data = m.bias.data.clone()

    def forward(self, x):
        return nn.functional.linear(x, self.weight, self.bias)


def text_key_values(transformer: nn.Module, blocks, encoder_hidden_states):
    """Each block's cross-attention (key, value) from one GEMM (``transformer.text_kv_joined``), or None
    where the join no longer holds: a projection replaced (LoRA) or hooked, or a processor that is not
    ours (it would not take the key and value)."""
    joined = transformer._modules.get("text_kv_joined")
    if joined is None:
        return None
    parts = joined.parts
    for i, block in enumerate(blocks):
        attn = block.attn2
        if (parts[2 * i] is not attn.to_k or parts[2 * i + 1] is not attn.to_v
                or not isinstance(attn.processor, FusedLTXVideoAttnProcessor)):
            return None
    if any(m._forward_hooks or m._forward_pre_hooks for m in parts):
        return None
    outputs = joined(encoder_hidden_states).split([m.out_features for m in parts], dim=-1)
    return [outputs[2 * i: 2 * i + 2] for i in range(len(blocks))]


def make_block_forward(kernel, exact_mode: bool):
    """The fused ``LTXVideoTransformerBlock.forward``. It takes two more keyword
    arguments than the stock one, with which the model forward chains blocks:
    ``norm_hidden_states`` (this block's norm1 output, computed by the previous
    block) and ``next_block`` (then it returns ``(hidden_states, next_norm)``);
    and ``text_key_value``, its cross-attention key and value (:func:`text_key_values`)."""
    fused_block_forward = kernel.layers.ltx_block_forward

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                encoder_attention_mask=None, norm_hidden_states=None, next_block=None, text_key_value=None):
        extra = {} if text_key_value is None else {"text_key_value": text_key_value}
        return fused_block_forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                   encoder_attention_mask, kernel=kernel, exact_mode=exact_mode,
                                   norm_hidden_states=norm_hidden_states, next_block=next_block, **extra)

    return forward


def make_gelu_forward(kernel, epilogue: bool):
    fused_gelu_forward = kernel.layers.gelu_forward

    def forward(self, hidden_states):
        return fused_gelu_forward(self, hidden_states, kernel=kernel, epilogue=epilogue)

    return forward


def make_rope_forward(kernel, stock: Callable):
    """``LTXVideoRotaryPosEmbed.forward`` through ``ltx_rope_cos_sin``: the same
    values, built on the device, with the batch dim an expanded view.
    Explicit ``video_coords`` take the stock path, ``stock`` (the class's forward,
    taken here: dynamo on newer torch will not call ``type(self).forward``)."""

    def forward(self, hidden_states, num_frames=None, height=None, width=None, rope_interpolation_scale=None,
                video_coords=None):
        if video_coords is not None:
            return stock(self, hidden_states, num_frames, height, width, rope_interpolation_scale, video_coords)
        return kernel.ltx_rope_cos_sin(
            num_frames, height, width, rope_interpolation_scale, self.dim, self.theta,
            batch_size=hidden_states.size(0), base_num_frames=self.base_num_frames, base_height=self.base_height,
            base_width=self.base_width, patch_size=self.patch_size, patch_size_t=self.patch_size_t,
            device=hidden_states.device)

    return forward


def _chainable(block: nn.Module, block_forward: Callable) -> bool:
    """Whether ``block`` still runs the fused forward with nothing around it:
    offload/cache hooks added after optimize_ltx wrap ``forward`` (or, for
    torch's own hooks, see its output), and they expect the stock call."""
    return (getattr(block.forward, "__func__", None) is block_forward and not block._forward_hooks
            and not block._forward_pre_hooks)


def make_model_forward(block_forward: Callable, stock: Callable):
    """``LTXVideoTransformer3DModel.forward`` with the blocks chained: block i
    fuses its feed-forward residual with block i+1's norm1 + modulation and
    hands the result on. Everything else is the stock forward's code; the
    stock forward itself (``stock``, as for the rope) runs with gradient
    checkpointing on (under autograd), with ``attention_kwargs`` (LoRA scale) or
    when hooks were added to the blocks after optimize_ltx."""

    def forward(self, hidden_states, encoder_hidden_states, timestep, encoder_attention_mask, num_frames=None,
                height=None, width=None, rope_interpolation_scale=None, video_coords=None, attention_kwargs=None,
                return_dict=True):
        blocks = self.transformer_blocks
        if ((self.gradient_checkpointing and torch.is_grad_enabled()) or attention_kwargs
                or not all(_chainable(block, block_forward) for block in blocks)):
            return stock(
                self, hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states, timestep=timestep,
                encoder_attention_mask=encoder_attention_mask, num_frames=num_frames, height=height, width=width,
                rope_interpolation_scale=rope_interpolation_scale, video_coords=video_coords,
                attention_kwargs=attention_kwargs, return_dict=return_dict)

        # From here to the output head: the stock forward (diffusers 0.42) but for the block loop.
        image_rotary_emb = self.rope(hidden_states, num_frames, height, width, rope_interpolation_scale, video_coords)
        if encoder_attention_mask is not None and encoder_attention_mask.ndim == 2:
            encoder_attention_mask = (1 - encoder_attention_mask.to(hidden_states.dtype)) * -10000.0
            encoder_attention_mask = encoder_attention_mask.unsqueeze(1)
        batch_size = hidden_states.size(0)
        hidden_states = self.proj_in(hidden_states)
        temb, embedded_timestep = self.time_embed(timestep.flatten(), batch_size=batch_size,
                                                  hidden_dtype=hidden_states.dtype)
        temb = temb.view(batch_size, -1, temb.size(-1))
        embedded_timestep = embedded_timestep.view(batch_size, -1, embedded_timestep.size(-1))
        encoder_hidden_states = self.caption_projection(encoder_hidden_states)
        encoder_hidden_states = encoder_hidden_states.view(batch_size, -1, hidden_states.size(-1))

        key_values = text_key_values(self, blocks, encoder_hidden_states)
        norm_hidden_states = None
        for index, block in enumerate(blocks):
            next_block = blocks[index + 1] if index + 1 < len(blocks) else None
            extra = {} if key_values is None else {"text_key_value": key_values[index]}
            out = block(hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states, temb=temb,
                        image_rotary_emb=image_rotary_emb, encoder_attention_mask=encoder_attention_mask,
                        norm_hidden_states=norm_hidden_states, next_block=next_block, **extra)
            hidden_states, norm_hidden_states = out if next_block is not None else (out, None)

        scale_shift_values = self.scale_shift_table[None, None] + embedded_timestep[:, :, None]
        shift, scale = scale_shift_values[:, :, 0], scale_shift_values[:, :, 1]
        hidden_states = self.norm_out(hidden_states)
        hidden_states = hidden_states * (1 + scale) + shift
        output = self.proj_out(hidden_states)
        if not return_dict:
            return (output,)
        return Transformer2DModelOutput(sample=output)

    return forward


def check_kernel(kernel) -> None:
    check_kernel_functions(kernel, KERNEL_FUNCTIONS, {"layers": KERNEL_LAYER_FUNCTIONS})


def _replaced_forward(module: nn.Module) -> bool:
    """Whether ``module``'s forward is replaced on the instance by something
    other than its class's own forward (which removing an accelerate hook, or
    kernelize falling back, leaves behind)."""
    forward = module.__dict__.get("forward")
    if forward is None:
        return False
    return not (getattr(forward, "__func__", None) is type(module).forward and forward.__self__ is module)


def _replaced_forwards(parts: LTXParts) -> List[str]:
    """Modules whose forward is already replaced on the instance (kernelize,
    another patch): optimize_ltx would silently drop that."""
    named = {id(m): name for name, m in parts.transformer.named_modules()}
    modules = [parts.transformer, parts.rope, *parts.blocks, *parts.attentions, *parts.gelus]
    return [named.get(id(m)) or "the model" for m in modules if _replaced_forward(m)]


def _set_forward(state: PatchState, module: nn.Module, function: Callable) -> None:
    bound = types.MethodType(function, module)
    module.forward = bound
    state.forwards.append((module, bound))


def check(transformer: nn.Module, options: Options) -> LTXParts:
    """The modules to rewire, or UnsupportedModelError listing every problem
    (``discovery.check_ltx_transformer``, and with ``fp8`` the block linears it cannot
    convert), or naming forwards already replaced on the instance (kernelize, another
    patch), which apply would drop."""
    parts = check_ltx_transformer(transformer)
    if options is not None and options.fp8:
        problems = fp8_problems(parts.transformer, parts.blocks, FP8_LINEARS, ff="ff")
        if problems:
            raise UnsupportedModelError("ltx_kernels_diffusers: fp8=True cannot convert this model, so nothing was "
                                        "changed: " + "; ".join(problems[:6]))
    replaced = _replaced_forwards(parts)
    if replaced:
        raise UnsupportedModelError(
            f"ltx_kernels_diffusers: the forward of {', '.join(replaced[:4])} is already replaced on the instance "
            "(kernels.kernelize or another patch), so nothing was changed; use either kernelize or optimize "
            "(optimize_ltx) on a freshly loaded model")
    return parts


def apply(parts: LTXParts, kernel, options: Options) -> PatchState:
    """Rewire the checked modules; the state restore needs."""
    state = PatchState(kernel=kernel, options=options)
    if options.fp8:
        check_kernel_functions(kernel, FP8_KERNEL_FUNCTIONS)  # before any change
        state.linears = swap_fp8(parts.blocks, FP8_LINEARS, kernel, options.fp8_fast_accum, options.fp8_keep_bf16)
        if options.fp8_fuse_qkv and hasattr(kernel.Fp8Linear, "concat"):  # older kernel versions lack it
            for block in parts.blocks:
                block.attn1.to_qkv_fp8 = kernel.Fp8Linear.concat((block.attn1.to_q, block.attn1.to_k,
                                                                  block.attn1.to_v))
                state.joined_qkv.append(block.attn1)
        text_kv = [m for block in parts.blocks for m in (block.attn2.to_k, block.attn2.to_v)]
        if options.fp8_join_text_kv and JoinedTextKV.joinable(text_kv):
            parts.transformer.text_kv_joined = JoinedTextKV(text_kv)  # after the blocks: moves last
            state.text_kv_owner = parts.transformer
    block_forward = make_block_forward(kernel, options.exact_mode)
    for block in parts.blocks:
        _set_forward(state, block, block_forward)
    gelu_forward = make_gelu_forward(kernel, options.gelu_epilogue)
    for gelu in parts.gelus:
        _set_forward(state, gelu, gelu_forward)
    for attn in parts.attentions:
        original = attn.processor
        fused = FusedLTXVideoAttnProcessor(kernel, options.exact_mode, options.prefer_cudnn_attention)
        fused._attention_backend = original._attention_backend
        fused._parallel_config = original._parallel_config
        attn.set_processor(fused)
        state.processors.append((attn, original, fused))
    _set_forward(state, parts.rope, make_rope_forward(kernel, type(parts.rope).forward))
    _set_forward(state, parts.transformer, make_model_forward(block_forward, type(parts.transformer).forward))
    return state


def _undo(state: PatchState) -> None:
    for attn in state.joined_qkv:
        del attn.to_qkv_fp8
    if state.text_kv_owner is not None:
        state.text_kv_owner.text_kv_joined.release()
        del state.text_kv_owner.text_kv_joined
    unswap_fp8(state.linears)
    for module, _ in reversed(state.forwards):
        del module.forward
    for attn, original, fused in state.processors:
        # Keep an attention backend chosen while optimised (set_attention_backend sets it on the processor).
        for name in ("_attention_backend", "_parallel_config"):
            if getattr(original, name) is not getattr(fused, name):
                setattr(original, name, getattr(fused, name))
        attn.set_processor(original)


def restore(transformer: nn.Module, state: PatchState) -> None:
    """The stock forwards and processors again; HooksPresentError (nothing
    changed) when any of them was replaced or wrapped since apply."""
    wrapped = [module for module, bound in state.forwards if module.__dict__.get("forward") is not bound]
    check_fp8_restorable(state.linears)
    wrapped += fp8_replaced(state.linears)
    wrapped += [attn for attn, _, fused in state.processors if attn.processor is not fused]
    if wrapped:
        names = {id(m): name for name, m in transformer.named_modules()}
        shown = ", ".join(names.get(id(m)) or "the model" for m in wrapped[:4])
        if getattr(transformer, "_parallel_config", None) is not None:  # diffusers offers no way back
            raise HooksPresentError(
                f"ltx_kernels_diffusers: restore found the forward of {shown} wrapped by enable_parallelism's "
                "context-parallel hooks, which cannot be removed; nothing was changed. Load the model again for "
                "the stock one.")
        raise HooksPresentError(
            f"ltx_kernels_diffusers: restore found the forward or processor of {shown} replaced after optimize "
            "(offload/cache hooks, set_attn_processor or another patch); nothing was changed. Remove those first "
            "(for a pipeline: pipe.remove_all_hooks()), call restore, then add them again.")
    _undo(state)


__all__ = ["NAME", "CLASSES", "Options", "check", "check_kernel", "apply", "restore", "FusedLTXVideoAttnProcessor"]
