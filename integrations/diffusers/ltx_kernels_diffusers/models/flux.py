"""Flux.1 (``FluxTransformer2DModel``, diffusers' ``transformer_flux.py``) in the
model registry.

Each seam and the op that replaces it (roundings: docs/formulas.md; ``T`` is the
model dtype, bf16 in practice; ``[B, D]`` modulation of ``T``, as Flux's
``AdaLayerNorm*`` return it). In exact mode every replacement reproduces
diffusers' eager chain rounding for rounding; the LayerNorm's own normalised
value is within an ulp of ``nn.LayerNorm``'s (its statistics are summed in
another order: bitwise on all but a small fraction of elements), and RMSNorm's
mean square likewise (docs/formulas.md#layernorm, #rmsnorm).

==============================================  ==============================================  ==============
seam (diffusers 0.42.1)                         fused op                                        installed as
==============================================  ==============================================  ==============
``norm1``, ``norm1_context``                    ``linear(silu(temb))``, then                    module hook
(``AdaLayerNormZero``), the single blocks'      ``adaln_layernorm(x, scale_msa, shift_msa)``:
``norm`` (``AdaLayerNormZeroSingle``)           ``T(T(T(LN(x)) * T(1 + scale)) + shift)``
``norm_out`` (``AdaLayerNormContinuous``)       ``adaln_layernorm(x, scale, shift)``            module hook
``h + gate_msa * attn``, then                   ``gated_residual_layernorm(h, attn,``           block hook
``norm2(h) * (1 + scale_mlp) + shift_mlp``      ``gate_msa, scale=scale_mlp,``
(and context)                                   ``shift=shift_mlp)``
``h + gate_mlp * ff`` (and context)             ``gated_residual(h, ff, gate_mlp)``:            block hook
                                                ``T(h + T(ff * gate))``
single block: ``residual + gate * proj_out``    ``gated_residual``                              block hook
``ff.net[0]`` (``GELU(approximate="tanh")``)    ``linear_gelu`` (``gelu_epilogue``: one         module hook
                                                rounding) or the projection, ``gelu_tanh``
single block: ``act_mlp(proj_mlp(x))``          ``linear_gelu`` (``gelu_epilogue``) or the      block hook
(``nn.GELU(approximate="tanh")``)               projection, then ``gelu_tanh``
q/k ``norm_q``/``norm_k`` (``nn.RMSNorm``       ``qk_rmsnorm_rope(head_dim=Dh,``                processor
per head) + ``apply_rotary_emb`` (image rows    ``rotation="interleaved", rounding="torch")``
of the table; the single blocks: all rows)      on the image tokens with the table's rows
                                                after the text
text q/k ``norm_added_q``/``norm_added_k`` +    ``qk_rmsnorm_rope`` on the text tokens with     processor
RoPE (the table's first rows)                   the table's first rows; then ``[text, image]``
attention                                       stock: ``dispatch_attention_fn``, the same      processor
                                                arguments (no mask where stock has none)
==============================================  ==============================================  ==============

Stock, with no kernel that fits: the embeddings, the RoPE tables
(``FluxPosEmbed``), the projections, the single block's concatenations
(``[text | image]`` before, ``[attn | mlp]`` before ``proj_out``) and split
after, the fp16 clip, and the seam across two blocks (a block's last residual
and the next block's ``norm1``: fusing those needs the model's block loop,
which no hook offers).

``torch.nn.RMSNorm`` (Flux's q/k norms in diffusers 0.42) rounds once,
``T(x_f32 * r * w)``: behaviour "B", ``rounding="torch"``, not diffusers'
``RMSNorm`` ("A"). The rotation is diffusers' ``x.float() * cos +
x_rotated.float() * sin`` with ``x_rotated[2i] = -x[2i+1]``: the op's
interleaved rotation, products and sum in float32 without contraction. Flux
normalises text and image q/k with their own norms, concatenates ``[text |
image]`` and rotates the concatenation with one table; the rotation is per token,
so each stream is rotated with its rows of the table before the concatenation.

The residual seams live in the blocks' forwards (the adds are there, not in a
module), so each block gets a hook; every other seam is one module's whole
forward, so it is that module's hook, which also runs when something else
calls the module. Hooks are diffusers ``ModelHook``\\ s (``hooks.py``),
registered before offloading, caches or casting, which then wrap them. A seam
whose operands are not what Flux passes (modulation of another dtype, a norm
whose weights offload hooks manage) runs the stock lines.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
from diffusers.models.activations import GELU
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.normalization import AdaLayerNormContinuous, AdaLayerNormZero, AdaLayerNormZeroSingle
from diffusers.models.transformers.transformer_flux import (FluxAttention, FluxAttnProcessor,
                                                            FluxSingleTransformerBlock, FluxTransformer2DModel,
                                                            FluxTransformerBlock, _get_qkv_projections)
from torch import nn

from ..attention import DispatchedAttention
from ..discovery import refuse_problems
from ..fp8_attention import dequantize, fp8_self_attention, option_problems, output_projection
from ..hooks import call, feed_forward, install, invalidate_registry_caches, weights_managed_by_hooks
from .base import (HookedState, check_kernel_functions, fp8_problems, fused_projection_problems, gelu_forward,
                   install_processor, linear_gelu_tanh, plain, restore_hooked, swap_fp8, tanh_gelu_of)

NAME = "Flux.1"
CLASSES = (FluxTransformer2DModel,)
KERNEL_FUNCTIONS = ("adaln_layernorm", "gated_residual_layernorm", "gated_residual", "gelu_tanh", "linear_gelu",
                    "qk_rmsnorm_rope")
FP8_KERNEL_FUNCTIONS = ("adaln_layernorm_fp8", "gated_residual_layernorm_fp8", "gelu_tanh_fp8", "linear_fp8",
                        "Fp8Linear")
# The block linears fp8=True runs in float8_e4m3: those of the image stream (4096 tokens at 1024x1024) and
# the single blocks' joint stream; the text stream's (512 tokens) are too few rows for FP8 to gain.
FP8_LINEARS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
FP8_SINGLE_LINEARS = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp", "proj_out")

Tensor = torch.Tensor


@dataclass(frozen=True)
class Options:
    """``exact_mode``; ``fuse_attention``: replace each ``FluxAttnProcessor``
    (q/k norm + RoPE in one pass per stream); False keeps diffusers' processor;
    ``gelu_epilogue``: each feed-forward up-projection and its GELU-tanh as one
    GEMM with the GELU epilogue (one rounding where eager rounds twice);
    ``prefer_cudnn_attention``: with diffusers' native attention backend, try
    cuDNN first; ``fp8``: the image and joint streams' block linears
    (``FP8_LINEARS``, ``FP8_SINGLE_LINEARS``) as float8_e4m3 GEMMs, their
    inputs written in e4m3 by the modulated norms, the seam and the GELU
    (inference only; needs ``fuse_attention``); ``fp8_fast_accum``: those GEMMs
    with cuBLASLt's fast accumulation; ``fp8_keep_bf16``: keep the bf16 linears
    for ``restore`` (False frees them, and restore then refuses);
    ``fp8_attention``: with ``fp8``, the joint attention on cuDNN's FP8 SDPA
    (``fp8_attention.py``; needs nvidia-cudnn-frontend; bf16 attention with a
    mask, a backend set with ``set_attention_backend`` or context parallelism)."""

    exact_mode: bool = True
    fuse_attention: bool = True
    gelu_epilogue: bool = True
    prefer_cudnn_attention: bool = True
    fp8: bool = False
    fp8_fast_accum: bool = True
    fp8_keep_bf16: bool = True
    fp8_attention: bool = False


# --- the fused forwards --------------------------------------------------------------------------------


def _flux_operands(x: Tensor, *tensors: Optional[Tensor]) -> bool:
    """Operands as Flux passes them, which the fused ops round as Flux does:
    ``x`` ``[B, S, D]``; each other one either ``[B, S, D]`` or ``[B, D]``
    modulation, all of x's dtype (another dtype promotes in the stock code)."""
    return x.dim() == 3 and all(
        t.dtype == x.dtype and (t.shape == x.shape or (t.dim() == 2 and t.shape == (x.shape[0], x.shape[2])))
        for t in tensors if t is not None)


def modulated_layer_norm(kernel, norm: nn.LayerNorm, x: Tensor, scale: Tensor, shift: Tensor,
                         exact_mode: bool, fp8: bool = False):
    """``norm(x) * (1 + scale[:, None]) + shift[:, None]`` in one pass; with ``fp8`` as e4m3 rows
    (``adaln_layernorm_fp8``, float32 throughout) for the FP8 projections."""
    if _flux_operands(x, scale, shift) and scale.dim() == 2 and not weights_managed_by_hooks(norm):
        if fp8:
            return kernel.adaln_layernorm_fp8(x, scale, shift, norm.eps, weight=norm.weight, bias=norm.bias)
        return kernel.adaln_layernorm(x, scale, shift, norm.eps, weight=norm.weight, bias=norm.bias,
                                      exact_mode=exact_mode)
    return norm(x) * (1 + scale[:, None]) + shift[:, None]


def ada_layer_norm_zero_forward(norm: AdaLayerNormZero, x: Tensor, timestep=None, class_labels=None,
                                hidden_dtype=None, emb: Optional[Tensor] = None, *, kernel, exact_mode: bool,
                                fp8: bool = False):
    """``AdaLayerNormZero.forward`` (the double blocks' ``norm1``, ``norm1_context``); with ``fp8``
    (``norm1``) the normalised rows in e4m3."""
    if norm.emb is not None:
        emb = norm.emb(timestep, class_labels, hidden_dtype=hidden_dtype)
    emb = norm.linear(norm.silu(emb))
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
    x = modulated_layer_norm(kernel, norm.norm, x, scale_msa, shift_msa, exact_mode, fp8)
    return x, gate_msa, shift_mlp, scale_mlp, gate_mlp


def ada_layer_norm_zero_single_forward(norm: AdaLayerNormZeroSingle, x: Tensor, emb: Optional[Tensor] = None, *,
                                       kernel, exact_mode: bool, fp8: bool = False):
    """``AdaLayerNormZeroSingle.forward`` (the single blocks' ``norm``); with ``fp8`` in e4m3."""
    emb = norm.linear(norm.silu(emb))
    shift_msa, scale_msa, gate_msa = emb.chunk(3, dim=1)
    return modulated_layer_norm(kernel, norm.norm, x, scale_msa, shift_msa, exact_mode, fp8), gate_msa


def ada_layer_norm_continuous_forward(norm: AdaLayerNormContinuous, x: Tensor, conditioning_embedding: Tensor, *,
                                      kernel, exact_mode: bool) -> Tensor:
    """``AdaLayerNormContinuous.forward`` (``norm_out``); ``(1 + scale)[:, None]`` is ``1 + scale[:, None]``."""
    emb = norm.linear(norm.silu(conditioning_embedding).to(x.dtype))
    scale, shift = torch.chunk(emb, 2, dim=1)
    return modulated_layer_norm(kernel, norm.norm, x, scale, shift, exact_mode)


def gated_residual(kernel, h: Tensor, y: Tensor, gate: Tensor, exact_mode: bool) -> Tensor:
    """``h + gate.unsqueeze(1) * y`` in one pass."""
    if _flux_operands(h, y, gate) and y.shape == h.shape and gate.dim() == 2:
        return kernel.gated_residual(h, y, gate, exact_mode=exact_mode)
    return h + gate.unsqueeze(1) * y


def gated_residual_then_norm(kernel, h: Tensor, y: Tensor, gate: Tensor, norm: nn.LayerNorm, scale: Tensor,
                             shift: Tensor, exact_mode: bool, fp8: bool = False) -> Tuple[Tensor, Tensor]:
    """``h = h + gate.unsqueeze(1) * y``, then ``norm(h) * (1 + scale[:, None]) + shift[:, None]``
    in one pass; returns ``(normed, h)``, ``normed`` as e4m3 rows with ``fp8``."""
    if (_flux_operands(h, y, gate, scale, shift) and y.shape == h.shape
            and gate.dim() == scale.dim() == shift.dim() == 2 and not weights_managed_by_hooks(norm)):
        if fp8:
            return kernel.gated_residual_layernorm_fp8(h, y, gate, norm.eps, weight=norm.weight, bias=norm.bias,
                                                       scale=scale, shift=shift)
        return kernel.gated_residual_layernorm(h, y, gate, norm.eps, weight=norm.weight, bias=norm.bias,
                                               scale=scale, shift=shift, exact_mode=exact_mode)
    h = h + gate.unsqueeze(1) * y
    return norm(h) * (1 + scale[:, None]) + shift[:, None], h


def block_forward(block: FluxTransformerBlock, hidden_states: Tensor, encoder_hidden_states: Tensor, temb: Tensor,
                  image_rotary_emb=None, joint_attention_kwargs=None, *, kernel, exact_mode: bool, fp8: bool = False):
    """``FluxTransformerBlock.forward`` with each attention residual fused with
    ``norm2`` + modulation and each feed-forward residual one pass. ``norm1``,
    attention and feed-forwards go through the submodules, so their own hooks
    and processors apply. With ``fp8`` the image stream's ``norm2`` seam writes
    e4m3 rows and its feed-forward runs as ``layers.feed_forward_fp8``."""
    norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = call(block.norm1, hidden_states, emb=temb)
    norm_encoder_hidden_states, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = call(
        block.norm1_context, encoder_hidden_states, emb=temb)
    attention_outputs = block.attn(hidden_states=norm_hidden_states, encoder_hidden_states=norm_encoder_hidden_states,
                                   image_rotary_emb=image_rotary_emb, **(joint_attention_kwargs or {}))
    attn_output, context_attn_output = attention_outputs[:2]

    norm_hidden_states, hidden_states = gated_residual_then_norm(
        kernel, hidden_states, attn_output, gate_msa, block.norm2, scale_mlp, shift_mlp, exact_mode, fp8)
    ff_output = (kernel.layers.feed_forward_fp8(kernel, block.ff, norm_hidden_states) if fp8
                 else feed_forward(block.ff, norm_hidden_states))
    hidden_states = gated_residual(kernel, hidden_states, ff_output, gate_mlp, exact_mode)
    if len(attention_outputs) == 3:  # IP-Adapter
        hidden_states = hidden_states + attention_outputs[2]

    norm_encoder_hidden_states, encoder_hidden_states = gated_residual_then_norm(
        kernel, encoder_hidden_states, context_attn_output, c_gate_msa, block.norm2_context, c_scale_mlp,
        c_shift_mlp, exact_mode)
    context_ff_output = feed_forward(block.ff_context, norm_encoder_hidden_states)
    encoder_hidden_states = gated_residual(kernel, encoder_hidden_states, context_ff_output, c_gate_mlp, exact_mode)
    if encoder_hidden_states.dtype == torch.float16:
        encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
    return encoder_hidden_states, hidden_states


def _tanh_gelu(act: nn.Module) -> bool:
    return type(act) is nn.GELU and act.approximate == "tanh"


def single_block_forward(block: FluxSingleTransformerBlock, hidden_states: Tensor, encoder_hidden_states: Tensor,
                         temb: Tensor, image_rotary_emb=None, joint_attention_kwargs=None, *, kernel,
                         exact_mode: bool, epilogue: bool, fp8: bool = False):
    """``FluxSingleTransformerBlock.forward`` with the MLP's up-projection and
    GELU-tanh as one GEMM (``epilogue``) or the projection, then ``gelu_tanh``
    (another ``act_mlp`` is called as it is), and the gated residual one pass.
    With ``fp8`` the norm's e4m3 rows feed the FP8 MLP and q/k/v projections;
    ``proj_out`` (FP8) quantises ``[attention | GELU]`` itself."""
    text_seq_len = encoder_hidden_states.shape[1]
    hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
    residual = hidden_states
    norm_hidden_states, gate = call(block.norm, hidden_states, emb=temb)
    if fp8:
        mlp_hidden_states = block.proj_mlp(norm_hidden_states)
        mlp_hidden_states = (kernel.gelu_tanh(mlp_hidden_states) if _tanh_gelu(block.act_mlp)
                             else block.act_mlp(mlp_hidden_states))
    elif _tanh_gelu(block.act_mlp):
        mlp_hidden_states = linear_gelu_tanh(kernel, block.proj_mlp, norm_hidden_states, epilogue)
    else:
        mlp_hidden_states = block.act_mlp(block.proj_mlp(norm_hidden_states))
    attn_output = block.attn(hidden_states=norm_hidden_states, image_rotary_emb=image_rotary_emb,
                             **(joint_attention_kwargs or {}))
    hidden_states = torch.cat([attn_output, mlp_hidden_states], dim=2)
    hidden_states = gated_residual(kernel, residual, block.proj_out(hidden_states), gate, exact_mode)
    if hidden_states.dtype == torch.float16:
        hidden_states = hidden_states.clip(-65504, 65504)
    return hidden_states[:, :text_seq_len], hidden_states[:, text_seq_len:]


# --- attention -------------------------------------------------------------------------------------------


def _fusable_head_norm(norm: Optional[nn.Module], x: Tensor) -> bool:
    """``torch.nn.RMSNorm`` over one head, its weight (if any) of x's dtype: the "torch" rounding of the op."""
    return (type(norm) is nn.RMSNorm and tuple(norm.normalized_shape) == (x.shape[-1],) and norm.eps is not None
            and (norm.weight is None or norm.weight.dtype == x.dtype) and not weights_managed_by_hooks(norm))


def _fusable_tables(tables, x: Tensor) -> bool:
    """Flux's RoPE tables for x's tokens: float32 ``[S, Dh]``, one column per channel, shared by the heads."""
    return all(isinstance(t, Tensor) and t.dtype == torch.float32 and t.device == x.device
               and tuple(t.shape) == (x.shape[1], x.shape[-1]) for t in tables)


def norm_rope(kernel, norm_q: nn.Module, norm_k: nn.Module, query: Tensor, key: Tensor, tables, exact_mode: bool):
    """``norm_q(query)``, ``norm_k(key)`` on ``[B, S, H, Dh]``, then diffusers'
    ``apply_rotary_emb`` with ``tables`` (``(cos, sin)``, the rows of these
    tokens, or None): one ``qk_rmsnorm_rope`` pass when both norms and the
    tables fit; otherwise the stock code."""
    if (tables is not None and _fusable_head_norm(norm_q, query) and _fusable_head_norm(norm_k, key)
            and norm_q.eps == norm_k.eps and _fusable_tables(tables, query)):
        cos, sin = tables
        return kernel.qk_rmsnorm_rope(query, key, norm_q.weight, norm_k.weight, cos, sin, norm_q.eps,
                                      head_dim=query.shape[-1], rotation="interleaved", rounding="torch",
                                      exact_mode=exact_mode)
    query, key = norm_q(query), norm_k(key)
    if tables is not None:
        query, key = (apply_rotary_emb(t, tables, sequence_dim=1) for t in (query, key))
    return query, key


def joint_qk(kernel, attn: FluxAttention, query: Tensor, key: Tensor, encoder_query: Tensor, encoder_key: Tensor,
             image_rotary_emb, exact_mode: bool) -> Tuple[Tensor, Tensor]:
    """The double blocks' q and k: text and image normalised with their own
    norms, ``[text | image]``, rotated with one table; here each stream is
    normalised and rotated with its own rows of the table, then concatenated."""
    text = encoder_query.shape[1]
    text_tables = image_tables = None
    if image_rotary_emb is not None:
        text_tables = tuple(t[:text] for t in image_rotary_emb)
        image_tables = tuple(t[text:] for t in image_rotary_emb)
    encoder_query, encoder_key = norm_rope(kernel, attn.norm_added_q, attn.norm_added_k, encoder_query, encoder_key,
                                           text_tables, exact_mode)
    query, key = norm_rope(kernel, attn.norm_q, attn.norm_k, query, key, image_tables, exact_mode)
    return torch.cat([encoder_query, query], dim=1), torch.cat([encoder_key, key], dim=1)


def flux_attention_forward(attn: FluxAttention, hidden_states: Tensor, encoder_hidden_states: Optional[Tensor] = None,
                           attention_mask: Optional[Tensor] = None, image_rotary_emb=None, *, kernel,
                           exact_mode: bool, attention, fp8_attention: bool = False):
    """``FluxAttnProcessor`` with each stream's q/k norm + RoPE in one pass
    (:func:`norm_rope`, :func:`joint_qk`); the projections, the attention call
    and the output projections are the stock ones. ``fp8_attention`` (no mask):
    the attention on cuDNN's FP8 SDPA, the image rows straight into an FP8
    ``to_out``; the single blocks' output in bf16 (it joins the MLP's)."""
    query, key, value, encoder_query, encoder_key, encoder_value = _get_qkv_projections(
        attn, hidden_states, encoder_hidden_states)
    query, key, value = (t.unflatten(-1, (-1, attn.head_dim)) for t in (query, key, value))
    if attn.added_kv_proj_dim is not None:
        encoder_query, encoder_key, encoder_value = (t.unflatten(-1, (-1, attn.head_dim))
                                                     for t in (encoder_query, encoder_key, encoder_value))
        query, key = joint_qk(kernel, attn, query, key, encoder_query, encoder_key, image_rotary_emb, exact_mode)
        value = torch.cat([encoder_value, value], dim=1)
    else:
        query, key = norm_rope(kernel, attn.norm_q, attn.norm_k, query, key, image_rotary_emb, exact_mode)

    if fp8_attention and attention_mask is None:
        out, descale = fp8_self_attention(query, key, value)
        out = out.flatten(2, 3)
        if encoder_hidden_states is None:
            return dequantize(out, descale, query.dtype)
        text_length = encoder_hidden_states.shape[1]
        text, image = out.split_with_sizes([text_length, out.shape[1] - text_length], dim=1)
        return (output_projection(kernel, attn, image, descale, query.dtype),
                attn.to_add_out(dequantize(text, descale, query.dtype)))
    hidden_states = attention(query, key, value, attention_mask).flatten(2, 3).to(query.dtype)
    if encoder_hidden_states is None:
        return hidden_states
    encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
        [encoder_hidden_states.shape[1], hidden_states.shape[1] - encoder_hidden_states.shape[1]], dim=1)
    hidden_states = attn.to_out[1](attn.to_out[0](hidden_states.contiguous()))
    return hidden_states, attn.to_add_out(encoder_hidden_states.contiguous())


class FusedFluxAttnProcessor(DispatchedAttention, FluxAttnProcessor):
    """``FluxAttnProcessor`` on the fused ops (:func:`flux_attention_forward`),
    attention through ``dispatch_attention_fn`` with this processor's backend, as
    the stock one; ``set_attention_backend`` reaches it."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        return flux_attention_forward(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb,
                                      kernel=self.kernel, exact_mode=self.exact_mode, attention=self.attention,
                                      fp8_attention=self.runs_fp8_attention)

    def __deepcopy__(self, memo):
        return copy.copy(self)  # shares the kernel


# --- check, apply, restore ---------------------------------------------------------------------------------


@dataclass
class FluxPlan:
    """The modules of one Flux transformer that apply rewires."""

    transformer: FluxTransformer2DModel
    blocks: List[FluxTransformerBlock] = field(default_factory=list)
    single_blocks: List[FluxSingleTransformerBlock] = field(default_factory=list)
    zero_norms: List[AdaLayerNormZero] = field(default_factory=list)  # the image stream's (norm1)
    context_norms: List[AdaLayerNormZero] = field(default_factory=list)  # the text stream's (norm1_context)
    single_norms: List[AdaLayerNormZeroSingle] = field(default_factory=list)
    continuous_norms: List[AdaLayerNormContinuous] = field(default_factory=list)
    gelus: List[GELU] = field(default_factory=list)
    attentions: List[FluxAttention] = field(default_factory=list)


def _layer_norm_problems(norm: nn.Module, where: str) -> List[str]:
    if type(norm) is not nn.LayerNorm or len(norm.normalized_shape) != 1:
        return [f"{where} is {type(norm).__qualname__}, not torch.nn.LayerNorm over the last dim"]
    return []


def _ada_norm_problems(norm: nn.Module, cls: type, where: str) -> List[str]:
    if not plain(norm, cls):
        return [f"{where} is {type(norm).__qualname__}, not diffusers' {cls.__name__}"]
    return _layer_norm_problems(norm.norm, f"{where}.norm")


def _attention_problems(attn: nn.Module, where: str, fuse_attention: bool) -> List[str]:
    if not plain(attn, FluxAttention):
        return [f"{where} is {type(attn).__qualname__}, not diffusers' FluxAttention"]
    if fuse_attention and type(attn.processor) is not FluxAttnProcessor:
        return [f"{where} uses the attention processor {type(attn.processor).__qualname__}, not diffusers' "
                "FluxAttnProcessor, and optimize would replace it; set FluxAttnProcessor() back, or pass "
                "fuse_attention=False to keep it"]
    return []


def block_problems(block: nn.Module, where: str, fuse_attention: bool) -> List[str]:
    if not plain(block, FluxTransformerBlock):
        return [f"{where} is {type(block).__qualname__}, not diffusers' FluxTransformerBlock (or a subclass with "
                "its own forward)"]
    problems = []
    for name in ("norm1", "norm1_context"):
        problems += _ada_norm_problems(getattr(block, name), AdaLayerNormZero, f"{where}.{name}")
    for name in ("norm2", "norm2_context"):
        problems += _layer_norm_problems(getattr(block, name), f"{where}.{name}")
    return problems + _attention_problems(block.attn, f"{where}.attn", fuse_attention)


def single_block_problems(block: nn.Module, where: str, fuse_attention: bool) -> List[str]:
    if not plain(block, FluxSingleTransformerBlock):
        return [f"{where} is {type(block).__qualname__}, not diffusers' FluxSingleTransformerBlock (or a subclass "
                "with its own forward)"]
    return (_ada_norm_problems(block.norm, AdaLayerNormZeroSingle, f"{where}.norm")
            + _attention_problems(block.attn, f"{where}.attn", fuse_attention))


def model_problems(model: nn.Module, fuse_attention: bool) -> List[str]:
    if not isinstance(model, FluxTransformer2DModel):
        return [f"the model is {type(model).__qualname__}, not diffusers' FluxTransformer2DModel"]
    problems = []
    if not plain(model, FluxTransformer2DModel):
        problems.append("the model is a subclass of FluxTransformer2DModel with its own forward")
    lists = {name: getattr(model, name, None) for name in ("transformer_blocks", "single_transformer_blocks")}
    for name, blocks in lists.items():
        if not isinstance(blocks, nn.ModuleList):
            problems.append(f"model.{name} is not a ModuleList")
    if problems:
        return problems
    if not any(len(blocks) for blocks in lists.values()):
        problems.append("the model has no blocks")
    for index, block in enumerate(lists["transformer_blocks"]):
        problems += block_problems(block, f"transformer_blocks.{index}", fuse_attention)
    for index, block in enumerate(lists["single_transformer_blocks"]):
        problems += single_block_problems(block, f"single_transformer_blocks.{index}", fuse_attention)
    return problems


def fp8_model_problems(transformer: FluxTransformer2DModel, fuse_attention: bool) -> List[str]:
    """What fp8=True cannot run: diffusers' own processor (ours takes e4m3 rows), fused projections,
    and what ``base.fp8_problems`` refuses (the single blocks have no FeedForward to check)."""
    problems = [] if fuse_attention else ["fp8=True needs fuse_attention=True: the fused processors take the "
                                          "norms' e4m3 rows"]
    problems += fused_projection_problems(transformer, [block.attn for block in transformer.transformer_blocks]
                                          + [block.attn for block in transformer.single_transformer_blocks])
    return (problems + fp8_problems(transformer, transformer.transformer_blocks, FP8_LINEARS, ff="ff")
            + fp8_problems(transformer, transformer.single_transformer_blocks, FP8_SINGLE_LINEARS, ff=None))


def check(transformer: nn.Module, options: Optional[Options]) -> FluxPlan:
    """The modules to rewire, or UnsupportedModelError listing every problem."""
    fuse_attention = options is None or options.fuse_attention
    problems = model_problems(transformer, fuse_attention)
    if not problems and options is not None and options.fp8:
        problems = fp8_model_problems(transformer, fuse_attention)
    if options is not None:  # an option's problem first: the list shown is cut at 12
        problems = option_problems(options) + problems
    refuse_problems(problems)
    plan = FluxPlan(transformer=transformer)
    for block in transformer.transformer_blocks:
        plan.blocks.append(block)
        plan.zero_norms.append(block.norm1)
        plan.context_norms.append(block.norm1_context)
        plan.gelus += [act for act in (tanh_gelu_of(block.ff), tanh_gelu_of(block.ff_context)) if act is not None]
        plan.attentions.append(block.attn)
    for block in transformer.single_transformer_blocks:
        plan.single_blocks.append(block)
        plan.single_norms.append(block.norm)
        plan.attentions.append(block.attn)
    norm_out = getattr(transformer, "norm_out", None)
    if plain(norm_out, AdaLayerNormContinuous) and not _layer_norm_problems(norm_out.norm, ""):
        plan.continuous_norms.append(norm_out)  # an RMSNorm-typed one stays stock
    return plan


def check_kernel(kernel) -> None:
    check_kernel_functions(kernel, KERNEL_FUNCTIONS)


def apply(plan: FluxPlan, kernel, options: Options) -> HookedState:
    """Hooks on the norms, the GELUs and the blocks; the fused attention
    processors; with ``fp8`` the image and joint streams' block linears as
    ``Fp8Linear``. The class already names both blocks in ``_repeated_blocks``."""
    if options.fp8:
        check_kernel_functions(kernel, FP8_KERNEL_FUNCTIONS, {"layers": ("feed_forward_fp8",)})
    state = HookedState(kernel=kernel, options=options)
    exact, epilogue, fp8 = options.exact_mode, options.gelu_epilogue, options.fp8
    zero_norm = functools.partial(ada_layer_norm_zero_forward, kernel=kernel, exact_mode=exact)
    seams = [
        (plan.zero_norms, "flux.ada_layer_norm_zero", functools.partial(zero_norm, fp8=fp8)),
        (plan.context_norms, "flux.ada_layer_norm_zero", zero_norm),  # the text stream stays bf16
        (plan.single_norms, "flux.ada_layer_norm_zero_single",
         functools.partial(ada_layer_norm_zero_single_forward, kernel=kernel, exact_mode=exact, fp8=fp8)),
        (plan.continuous_norms, "flux.ada_layer_norm_continuous",
         functools.partial(ada_layer_norm_continuous_forward, kernel=kernel, exact_mode=exact)),
        (plan.gelus, "flux.gelu", functools.partial(gelu_forward, kernel=kernel, epilogue=epilogue)),
        (plan.blocks, "flux.block", functools.partial(block_forward, kernel=kernel, exact_mode=exact, fp8=fp8)),
        (plan.single_blocks, "flux.single_block",
         functools.partial(single_block_forward, kernel=kernel, exact_mode=exact, epilogue=epilogue, fp8=fp8)),
    ]
    for modules, seam, fused in seams:
        state.hooks += [install(module, seam, fused) for module in modules]
    if options.fuse_attention:
        for attn in plan.attentions:
            install_processor(state, attn, FusedFluxAttnProcessor(kernel, exact, options.prefer_cudnn_attention,
                                                                  options.fp8_attention))
    if fp8:
        state.linears = (swap_fp8(plan.blocks, FP8_LINEARS, kernel, options.fp8_fast_accum, options.fp8_keep_bf16)
                         + swap_fp8(plan.single_blocks, FP8_SINGLE_LINEARS, kernel, options.fp8_fast_accum,
                                    options.fp8_keep_bf16))
    invalidate_registry_caches(plan.transformer)
    return state


def restore(transformer: nn.Module, state: HookedState) -> None:
    """Undo ``apply`` (``base.restore_hooked``)."""
    restore_hooked(transformer, state)


__all__ = ["NAME", "CLASSES", "Options", "check", "check_kernel", "apply", "restore", "FusedFluxAttnProcessor",
           "block_forward", "single_block_forward", "norm_rope", "joint_qk", "modulated_layer_norm",
           "gated_residual", "gated_residual_then_norm"]
