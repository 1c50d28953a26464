"""Wan 2.1 / 2.2 (``WanTransformer3DModel``, diffusers' ``transformer_wan.py``)
in the model registry: the 1.3B and 14B configs, text-to-video and
image-to-video (the image context's added k/v), and Wan 2.2's per-token
modulation (TI2V: ``temb`` of ``[B, S, 6, D]``).

Each seam and the op that replaces it (roundings: docs/formulas.md; ``T`` is the
model dtype; the modulation is float32 however the model is loaded, since the
block adds ``temb.float()``). In exact mode every replacement is the eager
chain bit for bit, up to the summation order of the norms' statistics
(LayerNorm: within an ulp on a small fraction of elements) and, with
``prefer_cudnn_attention``, the attention backend PyTorch picks.

==========================================  ================================================  ===========
seam (diffusers 0.42.1)                     fused op                                          installed as
==========================================  ================================================  ===========
``norm1`` + modulation:                     ``adaln_layernorm(h, scale_msa, shift_msa)``      block hook
``(norm1(h.float()) * (1 + scale_msa)
+ shift_msa).type_as(h)``
``(h.float() + attn1 * gate_msa)            ``gated_residual_layernorm(h, attn1, gate_msa,    block hook
.type_as(h)``, then ``norm2`` (affine       weight=norm2.weight, bias=norm2.bias)``
``FP32LayerNorm``, ``cross_attn_norm``)     (``gated_residual`` when ``norm2`` is Identity)
``h + attn2``, then ``norm3`` + modulation  ``gated_residual_layernorm(h, attn2, None,        block hook
                                            scale=c_scale_msa, shift=c_shift_msa)``
``(h.float() + ffn * c_gate_msa)            ``gated_residual``                                block hook
.type_as(h)``
``ffn.net[0]`` (``GELU``, tanh)             projection, then ``gelu_tanh`` (bitwise);         module hook
                                            ``gelu_epilogue``: ``linear_gelu``
self-attention ``norm_q``/``norm_k``        ``qk_rmsnorm_rope(head_dim=None, "interleaved",   processor
(``torch.nn.RMSNorm`` over all heads)       rounding="torch")`` on ``[B, S, D]``
+ the processor's ``apply_rotary_emb``
cross-attention ``norm_q``/``norm_k``,      ``rmsnorm(rounding="torch")``                     processor
``norm_added_k`` (image context)
``WanRotaryPosEmbed`` tables                stock ``[1, S, 1, Dh]``, read by                  –
                                            ``qk_rmsnorm_rope`` as one head's columns
                                            repeating along the row (no copy)
==========================================  ================================================  ===========

Stays stock: the patch embedding, the condition embedder (time, text, and
``WanImageEmbedding`` for image-to-video: once per forward), the projections,
the attention itself (the stock ``dispatch_attention_fn`` calls, no mask added)
and the output head (``norm_out``: its modulation comes from a bf16 ``temb``
whose rounding ``adaln_layernorm`` does not take when the table is bf16; once
per forward). ``rope_3d``/``rope_1d`` are not used: they compute the angles in
the kernel (within a few float32 ulps, with FMA), not bitwise Wan's float64
tables. The feed-forward's residual is not fused with the next block's
``norm1``: that needs the model's block loop, which no hook offers.

The block's residual seams live in its forward (the adds are there, not in a
module), so the block gets a hook; the GELU is one module's whole forward.
Hooks are diffusers ``ModelHook``\\ s (``hooks.py``): registered before
offloading, caches or casting, they are the innermost and those wrap them.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
from diffusers.models.activations import GELU
from diffusers.models.normalization import FP32LayerNorm
from diffusers.models.transformers.transformer_wan import (WanAttention, WanAttnProcessor,
                                                            WanTransformer3DModel, WanTransformerBlock,
                                                            _get_added_kv_projections, _get_qkv_projections)
from torch import nn

from ..attention import DispatchedAttention
from ..discovery import refuse_problems
from ..fp8_attention import fp8_self_attention, option_problems, output_projection
from ..hooks import feed_forward, install, invalidate_registry_caches, weights_managed_by_hooks
from .base import (HookedState, check_kernel_functions, computed_once, fp8_problems, fused_projection_problems,
                   gelu_forward, install_processor, plain, restore_hooked, rows_shape, swap_fp8, tanh_gelu_of,
                   transformer_problems)

NAME = "Wan 2.1 / 2.2"
CLASSES = (WanTransformer3DModel,)
KERNEL_FUNCTIONS = ("adaln_layernorm", "gated_residual_layernorm", "gated_residual", "gelu_tanh", "linear_gelu",
                    "qk_rmsnorm_rope", "rmsnorm")
TEXT_CONTEXT = 512  # the processor's hardcoded text length: the image context is what precedes it
BLOCKS_ATTR = "blocks"
FP8_KERNEL_FUNCTIONS = ("adaln_layernorm_fp8", "gated_residual_layernorm_fp8", "gated_residual_fp8", "gelu_tanh_fp8",
                        "linear_fp8", "Fp8Linear")
# The block linears fp8=True runs in float8_e4m3, their inputs written in e4m3 by the norms and the GELU.
# The cross-attention's keys and values (512 text tokens, 257 image tokens) stay bf16.
FP8_LINEARS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_out.0",
               "ffn.net.0.proj", "ffn.net.2")

Tensor = torch.Tensor


@dataclass(frozen=True)
class Options:
    """``exact_mode``; ``fuse_attention``: replace each ``WanAttnProcessor`` (q/k
    norm + RoPE in one pass, the q/k norms on the kernel; the attention calls
    and the RoPE tables unchanged); ``gelu_epilogue``: the
    feed-forward up-projection and its GELU-tanh as one GEMM with the GELU
    epilogue (one rounding, not bitwise); None (default) follows the mode: off
    in exact mode, on with ``exact_mode=False``; ``prefer_cudnn_attention``:
    with diffusers' native attention backend, try cuDNN first; ``fp8``: the block
    linears (``FP8_LINEARS``) as float8_e4m3 GEMMs, their inputs written in e4m3
    by ``norm1``/``norm2``/``norm3`` and the GELU (inference only);
    ``fp8_fast_accum``: those GEMMs with cuBLASLt's fast accumulation;
    ``fp8_keep_bf16``: keep the bf16 linears for ``restore`` (False frees them,
    and restore then refuses); ``fp8_attention``: with ``fp8``, the self-attention
    on cuDNN's FP8 SDPA (``fp8_attention.py``; needs nvidia-cudnn-frontend; the
    bf16 attention where a mask, a backend set with ``set_attention_backend`` or
    context parallelism is in play)."""

    exact_mode: bool = True
    fuse_attention: bool = True
    gelu_epilogue: Optional[bool] = None
    prefer_cudnn_attention: bool = True
    fp8: bool = False
    fp8_fast_accum: bool = True
    fp8_keep_bf16: bool = True
    fp8_attention: bool = False


# --- the block -------------------------------------------------------------------------------------------


def modulation(block: WanTransformerBlock, temb: Tensor) -> Tuple[Tensor, ...]:
    """The block's six float32 modulation tensors, as its forward splits them:
    ``[B, 1, D]`` views from ``temb [B, 6, D]`` (Wan 2.1, 2.2 14B) or ``[B, S, D]``
    views from ``temb [B, S, 6, D]`` (Wan 2.2 TI2V)."""
    if temb.ndim == 4:
        return computed_once(block.scale_shift_table.unsqueeze(0) + temb.float()).unbind(dim=2)
    return computed_once(block.scale_shift_table + temb.float()).chunk(6, dim=1)


def attention_residual_then_norm2(kernel, block: WanTransformerBlock, x: Tensor, attn_output: Tensor, gate: Tensor,
                                  exact_mode: bool, fp8: bool = False) -> Tuple[Tensor, Tensor]:
    """``x = (x.float() + attn_output * gate).type_as(x)``, then
    ``norm2(x.float()).type_as(x)``: returns ``(x, normed)``, ``normed`` as e4m3
    rows with ``fp8`` (for the FP8 ``attn2.to_q``)."""
    norm2 = block.norm2
    if isinstance(norm2, nn.Identity):  # cross_attn_norm=False
        if fp8:
            rows, x = kernel.gated_residual_fp8(x, attn_output, gate)
            return x, rows
        x = kernel.gated_residual(x, attn_output, gate, exact_mode=exact_mode)
        return x, x
    if weights_managed_by_hooks(norm2):  # its weight is in place only while it runs
        x = kernel.gated_residual(x, attn_output, gate, exact_mode=exact_mode)
        return x, norm2(x.float()).type_as(x)
    if fp8:
        normed, x = kernel.gated_residual_layernorm_fp8(x, attn_output, gate, norm2.eps, weight=norm2.weight,
                                                        bias=norm2.bias)
        return x, normed
    normed, x = kernel.gated_residual_layernorm(x, attn_output, gate, norm2.eps, weight=norm2.weight,
                                                bias=norm2.bias, exact_mode=exact_mode)
    return x, normed


def block_forward(block: WanTransformerBlock, hidden_states: Tensor, encoder_hidden_states: Tensor, temb: Tensor,
                  rotary_emb, *, kernel, exact_mode: bool, fp8: bool = False) -> Tensor:
    """``WanTransformerBlock.forward`` with ``norm1`` + modulation one pass and
    each residual fused with the norm that reads it. Attention and the
    feed-forward go through the submodules, so their processors and hooks apply.
    ``norm1``/``norm3`` have no parameters (``check`` makes sure). With ``fp8``
    the three norms and the GELU write e4m3 rows for the FP8 linears that read
    them (``*_layernorm_fp8``, ``layers.feed_forward_fp8``)."""
    shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = modulation(block, temb)
    if fp8:
        norm_hidden_states = kernel.adaln_layernorm_fp8(hidden_states, scale_msa, shift_msa, block.norm1.eps)
    else:
        norm_hidden_states = kernel.adaln_layernorm(hidden_states, scale_msa, shift_msa, block.norm1.eps,
                                                    exact_mode=exact_mode)
    attn_output = block.attn1(norm_hidden_states, None, None, rotary_emb)
    hidden_states, norm_hidden_states = attention_residual_then_norm2(kernel, block, hidden_states, attn_output,
                                                                      gate_msa, exact_mode, fp8)
    attn_output = block.attn2(norm_hidden_states, encoder_hidden_states, None, None)
    if fp8:
        norm_hidden_states, hidden_states = kernel.gated_residual_layernorm_fp8(
            hidden_states, attn_output, None, block.norm3.eps, scale=c_scale_msa, shift=c_shift_msa)
        ff_output = kernel.layers.feed_forward_fp8(kernel, block.ffn, norm_hidden_states)
    else:
        norm_hidden_states, hidden_states = kernel.gated_residual_layernorm(
            hidden_states, attn_output, None, block.norm3.eps, scale=c_scale_msa, shift=c_shift_msa,
            exact_mode=exact_mode)
        ff_output = feed_forward(block.ffn, norm_hidden_states)
    return kernel.gated_residual(hidden_states, ff_output, c_gate_msa, exact_mode=exact_mode)


# --- attention -------------------------------------------------------------------------------------------


def _fusable_rmsnorm(norm: Optional[nn.Module], width: int) -> bool:
    """``torch.nn.RMSNorm`` over the whole inner dim with an explicit eps: the
    "torch" rounding of the ops (docs/formulas.md, behaviour B)."""
    return (type(norm) is nn.RMSNorm and tuple(norm.normalized_shape) == (width,) and norm.eps is not None
            and not weights_managed_by_hooks(norm))


def row_table(table: Tensor) -> Tensor:
    """A ``[b, S, 1 or H, Dh]`` RoPE table as ``qk_rmsnorm_rope`` reads it under the norm over all heads:
    ``[b, S, Dh]``, one head's columns repeating along the row (Wan's own), or ``[b, S, H*Dh]``."""
    return table.flatten(2)


def _fusable_tables(rotary_emb, attn: WanAttention, seq: int) -> bool:
    if rotary_emb is None:
        return True
    cos, sin = rotary_emb
    head_dim = attn.inner_dim // attn.heads
    return (cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape and cos.dim() == 4
            and cos.shape[1] == seq and cos.shape[2] in (1, attn.heads) and cos.shape[3] == head_dim)


def fusable(attn: WanAttention, shape: torch.Size, rotary_emb) -> bool:
    """Whether every q/k norm fits the ops (and, with RoPE, both norms share an
    eps and the tables are float32 of the expected shape); if not, the stock
    processor runs."""
    if not (_fusable_rmsnorm(attn.norm_q, attn.inner_dim) and _fusable_rmsnorm(attn.norm_k, attn.kv_inner_dim)):
        return False
    if attn.add_k_proj is not None and not _fusable_rmsnorm(getattr(attn, "norm_added_k", None), attn.inner_dim):
        return False
    if rotary_emb is not None and (attn.norm_q.eps != attn.norm_k.eps or attn.inner_dim != attn.kv_inner_dim):
        return False
    return _fusable_tables(rotary_emb, attn, shape[1])


def _rmsnorm(kernel, norm: nn.RMSNorm, x: Tensor) -> Tensor:
    return kernel.rmsnorm(x, norm.weight, norm.eps, rounding="torch")


def wan_qk(attn: WanAttention, query: Tensor, key: Tensor, rotary_emb, *, kernel, exact_mode: bool):
    """``norm_q``/``norm_k`` over the whole inner dim, then (self-attention) the
    processor's interleaved RoPE, on ``[B, S, D]`` q/k; returns ``[B, S, H, Dh]``.
    With RoPE, one ``qk_rmsnorm_rope`` pass: Wan's ``x1 * cos - x2 * sin``,
    ``x1 * sin + x2 * cos`` (float32, one cast) is the op's interleaved rotation
    bit for bit, and its tables repeat each angle for both channels of a pair."""
    if rotary_emb is None:
        query, key = _rmsnorm(kernel, attn.norm_q, query), _rmsnorm(kernel, attn.norm_k, key)
    else:
        cos, sin = (row_table(t) for t in rotary_emb)
        query, key = kernel.qk_rmsnorm_rope(query, key, attn.norm_q.weight, attn.norm_k.weight, cos, sin,
                                            attn.norm_q.eps, head_dim=None, rotation="interleaved",
                                            rounding="torch", exact_mode=exact_mode)
    return query.unflatten(2, (attn.heads, -1)), key.unflatten(2, (attn.heads, -1))


def wan_attention_forward(attn: WanAttention, hidden_states: Tensor, encoder_hidden_states: Optional[Tensor],
                          attention_mask: Optional[Tensor], rotary_emb, *, kernel, exact_mode: bool,
                          attention, parallel_config=None, fp8_attention: bool = False) -> Tensor:
    """``WanAttnProcessor.__call__`` with the q/k norms (and RoPE) on the fused
    ops; the projections, the attention calls (their masks and parallel
    configs) and the output projection as stock. ``fp8_attention``: the
    self-attention on cuDNN's FP8 SDPA, its e4m3 output straight into the FP8
    ``to_out``."""
    encoder_hidden_states_img = None
    if attn.add_k_proj is not None:
        image_context_length = encoder_hidden_states.shape[1] - TEXT_CONTEXT
        encoder_hidden_states_img = encoder_hidden_states[:, :image_context_length]
        encoder_hidden_states = encoder_hidden_states[:, image_context_length:]
    query, key, value = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
    query, key = wan_qk(attn, query, key, rotary_emb, kernel=kernel, exact_mode=exact_mode)
    value = value.unflatten(2, (attn.heads, -1))

    hidden_states_img = None
    if encoder_hidden_states_img is not None:
        key_img, value_img = _get_added_kv_projections(attn, encoder_hidden_states_img)
        key_img = _rmsnorm(kernel, attn.norm_added_k, key_img).unflatten(2, (attn.heads, -1))
        value_img = value_img.unflatten(2, (attn.heads, -1))
        hidden_states_img = attention(query, key_img, value_img, None, parallel_config=None)
        hidden_states_img = hidden_states_img.flatten(2, 3).type_as(query)

    if fp8_attention and encoder_hidden_states is None and attention_mask is None:
        out, descale = fp8_self_attention(query, key, value)
        return output_projection(kernel, attn, out.flatten(2, 3), descale, query.dtype)
    # context parallelism for self-attention only, as the stock processor (diffusers PR 12909)
    hidden_states = attention(query, key, value, attention_mask,
                              parallel_config=parallel_config if encoder_hidden_states is None else None)
    hidden_states = hidden_states.flatten(2, 3).type_as(query)
    if hidden_states_img is not None:
        hidden_states = hidden_states + hidden_states_img
    return attn.to_out[1](attn.to_out[0](hidden_states))


class FusedWanAttnProcessor(DispatchedAttention, WanAttnProcessor):
    """``WanAttnProcessor`` on the fused ops (:func:`wan_attention_forward`); the
    stock processor's code where a norm or the tables do not fit
    (:func:`fusable`). ``set_attention_backend`` reaches it,
    as it does the stock one."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        if not fusable(attn, rows_shape(hidden_states), rotary_emb):
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        return wan_attention_forward(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb,
                                     kernel=self.kernel, exact_mode=self.exact_mode, attention=self.attention,
                                     parallel_config=self._parallel_config, fp8_attention=self.runs_fp8_attention)

    def __deepcopy__(self, memo):
        return copy.copy(self)  # shares the kernel


# --- check, apply, restore ---------------------------------------------------------------------------------


@dataclass
class WanPlan:
    """The modules of one Wan transformer that apply rewires."""

    transformer: WanTransformer3DModel
    blocks: List[WanTransformerBlock] = field(default_factory=list)
    gelus: List[GELU] = field(default_factory=list)
    attentions: List[WanAttention] = field(default_factory=list)


def _layer_norm_problems(block: nn.Module, name: str, where: str, *, affine: bool) -> List[str]:
    """norm1/norm3 (``affine=False``): FP32LayerNorm without parameters, as Wan builds
    them; norm2: FP32LayerNorm with or without them, or nn.Identity (``cross_attn_norm=False``)."""
    norm = getattr(block, name, None)
    if affine and type(norm) is nn.Identity:
        return []
    if not plain(norm, FP32LayerNorm):
        return [f"{where}.{name} is {type(norm).__qualname__}, not diffusers' FP32LayerNorm"
                + (" (or nn.Identity)" if affine else "")]
    if not affine and (norm.weight is not None or norm.bias is not None):
        return [f"{where}.{name} is an FP32LayerNorm with parameters; Wan's has none"]
    return []


def attention_problems(attn: nn.Module, where: str, fuse_attention: bool) -> List[str]:
    if not plain(attn, WanAttention):
        return [f"{where} is {type(attn).__qualname__}, not diffusers' WanAttention (or a subclass with its own "
                "forward)"]
    if fuse_attention and type(attn.processor) is not WanAttnProcessor:
        return [f"{where} uses the attention processor {type(attn.processor).__qualname__}, not diffusers' "
                "WanAttnProcessor, and optimize would replace it; set WanAttnProcessor() back (attn.set_processor), "
                "or pass fuse_attention=False to keep it"]
    return []


def block_problems(block: nn.Module, where: str, fuse_attention: bool) -> List[str]:
    if not plain(block, WanTransformerBlock):
        return [f"{where} is {type(block).__qualname__}, not diffusers' WanTransformerBlock (or a subclass with its "
                "own forward)"]
    problems = []
    table = getattr(block, "scale_shift_table", None)
    if not isinstance(table, torch.Tensor) or table.dim() != 3 or tuple(table.shape[:2]) != (1, 6):
        problems.append(f"{where}.scale_shift_table is not the [1, 6, hidden] modulation table")
    for name in ("norm1", "norm2", "norm3"):
        problems += _layer_norm_problems(block, name, where, affine=name == "norm2")
    for name in ("attn1", "attn2"):
        problems += attention_problems(getattr(block, name, None), f"{where}.{name}", fuse_attention)
    return problems


def model_problems(model: nn.Module, fuse_attention: bool) -> List[str]:
    # the RoPE module is not rewired: the processor checks each call's tables (``fusable``)
    return transformer_problems(model, WanTransformer3DModel, "blocks",
                                functools.partial(block_problems, fuse_attention=fuse_attention))


def fp8_model_problems(transformer: WanTransformer3DModel) -> List[str]:
    """What fp8=True cannot run: fused q/k/v projections (``fuse_projections``: the processor calls
    ``to_qkv``), and what ``base.fp8_problems`` refuses."""
    problems = fused_projection_problems(transformer, [attn for block in transformer.blocks
                                                       for attn in (block.attn1, block.attn2)])
    return problems + fp8_problems(transformer, transformer.blocks, FP8_LINEARS, ff="ffn")


def check(transformer: nn.Module, options: Optional[Options]) -> WanPlan:
    """The modules to rewire, or UnsupportedModelError listing every problem."""
    fuse_attention = options is None or options.fuse_attention
    problems = model_problems(transformer, fuse_attention)
    if not problems and options is not None and options.fp8:
        problems = fp8_model_problems(transformer)
    if options is not None:  # an option's problem first: the list shown is cut at 12
        problems = option_problems(options) + problems
    refuse_problems(problems)
    plan = WanPlan(transformer=transformer)
    for block in transformer.blocks:
        plan.blocks.append(block)
        gelu = tanh_gelu_of(block.ffn)
        if gelu is not None:
            plan.gelus.append(gelu)
        plan.attentions += [block.attn1, block.attn2]
    return plan


def check_kernel(kernel) -> None:
    check_kernel_functions(kernel, KERNEL_FUNCTIONS)


def apply(plan: WanPlan, kernel, options: Options) -> HookedState:
    """Hooks on the blocks and feed-forward GELUs; the fused attention processors;
    with ``fp8`` the block linears as ``Fp8Linear`` (the block runs the feed-forward)."""
    if options.fp8:
        check_kernel_functions(kernel, FP8_KERNEL_FUNCTIONS, {"layers": ("feed_forward_fp8",)})
    state = HookedState(kernel=kernel, options=options)
    exact = options.exact_mode
    epilogue = (not exact) if options.gelu_epilogue is None else bool(options.gelu_epilogue)
    seams = [(plan.blocks, "wan.block", functools.partial(block_forward, kernel=kernel, exact_mode=exact,
                                                           fp8=options.fp8))]
    if not options.fp8:
        seams.append((plan.gelus, "wan.gelu", functools.partial(gelu_forward, kernel=kernel, epilogue=epilogue)))
    for modules, seam, fused in seams:
        state.hooks += [install(module, seam, fused) for module in modules]
    if options.fuse_attention:
        for attn in plan.attentions:
            install_processor(state, attn, FusedWanAttnProcessor(kernel, exact, options.prefer_cudnn_attention,
                                                                 options.fp8_attention))
    if options.fp8:
        state.linears = swap_fp8(plan.blocks, FP8_LINEARS, kernel, options.fp8_fast_accum, options.fp8_keep_bf16)
    invalidate_registry_caches(plan.transformer)
    return state


def restore(transformer: nn.Module, state: HookedState) -> None:
    """Undo ``apply`` (``base.restore_hooked``)."""
    restore_hooked(transformer, state)


__all__ = ["NAME", "CLASSES", "Options", "check", "check_kernel", "apply", "restore", "FusedWanAttnProcessor",
           "block_forward", "gelu_forward", "wan_qk", "wan_attention_forward", "modulation"]
