"""Mochi 1 (``MochiTransformer3DModel``, diffusers' ``transformer_mochi.py``) in
the model registry.

Each seam and the op that replaces it (roundings: docs/formulas.md; ``T`` is the
model dtype). Every replacement reproduces diffusers' eager chain bit for bit
in exact mode (up to the order of the mean-square sum), except the attention
of a padded prompt, which runs as one masked call instead of a loop over the
samples; with every text token valid it is one call without a mask.

============================================  ===============================================  ==============
seam (diffusers 0.42.1)                       fused op                                         installed as
============================================  ===============================================  ==============
``norm1``, ``norm1_context``                  ``modulated_rmsnorm(x, scale_msa)``:             module hook
(``MochiRMSNormZero``)                        ``T(RMSNorm(x.float()) * (1 + scale.float()))``
``norm1_context`` of the last block           ``modulated_rmsnorm(x, linear_1(silu(c)))``      module hook
(``MochiLayerNormContinuous``)
``h + norm2(attn, tanh(gate_msa))``           ``residual_tanh_gated_rmsnorm(h, attn, gate)``   block hook
``norm3(h, 1 + scale_mlp)``                   ``modulated_rmsnorm(h, scale_mlp)``              block hook
``h + norm4(ff, tanh(gate_mlp))``             ``residual_tanh_gated_rmsnorm``                  block hook
(and the ``*_context`` twins)
``ff.net[0]`` (``SwiGLU``)                    projection, then ``swiglu(silu_half="second")``  module hook
q/k ``MochiRMSNorm`` per head + RoPE          ``qk_rmsnorm_rope(head_dim=Dh, "interleaved",    processor
                                              rounding="torch")``, eager inference writing
                                              into the joint [video | text] q/k (no cat)
text q/k ``MochiRMSNorm``                     ``rmsnorm(rounding="torch")``                    processor
attention (a loop over the samples,           every text token valid: one call over            processor
``torch.nonzero``: graph breaks)              [video | text] without a mask; otherwise one
                                              over [video | text, valid tokens first] with a
                                              key mask; ``dispatch_attention_fn``
whether every text token is valid             one host read of the mask per forward, before    module hook
                                              the blocks (``TextMaskHook`` on ``time_embed``)  (time_embed)
RoPE tables as ``qk_rmsnorm_rope`` reads      made once per forward (``RotaryTableHook``),     module hooks
them (one column per channel)                 not per block; released after the blocks         (rope,
                                              (``ReleaseTablesHook``)                          norm_out)
============================================  ===============================================  ==============

With ``fp8=True`` the video stream's block linears (``FP8_LINEARS``) become
``Fp8Linear``: ``norm1`` and ``norm3`` write their e4m3 rows and row scales
(``adaln_rmsnorm_fp8``, computed in float32 and quantised once); the attention
output and SwiGLU's output are quantised by their own ``Fp8Linear``. The text
stream stays bf16. With ``fp8_attention`` too, the unmasked joint attention
runs on cuDNN's FP8 SDPA and its e4m3 video rows go to ``to_out`` as they are.

The residual seams live in the block's forward (the add is there, not in the
norm module), so the block gets a hook of its own; every other seam is one
module's whole forward, so it is that module's hook, which also runs when
something else calls the module. Hooks are diffusers ``ModelHook``\\ s
(``hooks.py``): registered before offloading, caches or casting, they are the
innermost and those wrap them. The output head (``AdaLayerNormContinuous``, a
LayerNorm) stays stock: it runs once per forward.

The text mask. A masked call is slower: cuDNN takes the key mask (torch 2.11;
flash does not), but on an H100 one call over [2, 24, 23,850 + 256, 128] took
35 ms with the mask and 24 ms without. Whether a mask is all valid is a
host read, which inside a compiled block would be a graph break, so it happens
once per transformer forward in a pre-forward hook on ``time_embed`` (the
first module the forward calls with the mask; the transformer itself stays
unhooked, so ``restore`` still works under ``enable_model_cpu_offload``). The
hook records that mask tensor (:class:`FullTextMask`); each processor drops its
mask when it *is* that tensor. Under torch.compile the identity is an aliasing
guard: a compiled block gets a mask-free graph for the recorded mask and the
masked graph for any other, without graph breaks. Not read when the whole model is traced by
torch.compile (the masked path then runs; regional compilation,
``compile_repeated_blocks``, keeps the read eager). A mask changed in place
after the forward read it is not read again until the next forward.

A padded prompt keeps the masked call. Mochi pads at the end (T5 tokenizer,
``padding="max_length"``), so each sample's valid tokens are a prefix and
stock's per-sample calls could run unmasked on ``text[:n_i]`` with the lengths
read once per forward as Python ints: bitwise stock and flash-eligible, but
under torch.compile each distinct length tuple is a recompilation of the block
graphs (a new prompt, a new compile; past dynamo's recompile limit the blocks
run eagerly). Not measured yet, so not done; it matters for classifier-free
guidance, whose empty negative prompt is padded.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
from diffusers.models.activations import SwiGLU
from diffusers.models.attention import FeedForward
from diffusers.hooks import ModelHook
from diffusers.models.attention_processor import MochiAttention, MochiAttnProcessor2_0
from diffusers.models.embeddings import MochiCombinedTimestepCaptionEmbedding
from diffusers.models.normalization import MochiRMSNorm
from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm
from diffusers.models.transformers.transformer_mochi import (MochiLayerNormContinuous, MochiModulatedRMSNorm,
                                                             MochiRMSNormZero, MochiRoPE, MochiTransformer3DModel,
                                                             MochiTransformerBlock)
from torch import nn

from ..attention import DispatchedAttention
from ..autograd import records_autograd
from ..discovery import refuse_problems
from ..fp8_attention import dequantize, fp8_self_attention, option_problems, projection_input
from ..hooks import call, feed_forward, install, install_hook, invalidate_registry_caches, weights_managed_by_hooks
from .base import (HookedState, check_kernel_functions, fp8_problems, fused_projection_problems, install_processor,
                   plain, restore_hooked, swap_fp8, transformer_problems)

NAME = "Mochi 1"
CLASSES = (MochiTransformer3DModel,)
KERNEL_FUNCTIONS = ("modulated_rmsnorm", "residual_tanh_gated_rmsnorm", "swiglu", "rmsnorm", "qk_rmsnorm_rope")
BLOCK_CLASS_NAME = "MochiTransformerBlock"
FP8_KERNEL_FUNCTIONS = ("adaln_rmsnorm_fp8", "linear_fp8", "Fp8Linear")
# The block linears fp8=True runs in float8_e4m3: the video stream's (23,850 tokens at 85 frames 848x480); the
# text stream's (256 tokens) are too few rows for FP8 to gain. `to_out.0` and `ff.net.2` quantise their inputs
# themselves (attention and SwiGLU write bf16); the others take the e4m3 rows of norm1 and norm3.
FP8_LINEARS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "ff.net.0.proj", "ff.net.2")

Tensor = torch.Tensor


@dataclass(frozen=True)
class Options:
    """``exact_mode``; ``fuse_attention``: replace each ``MochiAttnProcessor2_0``
    (q/k norm + RoPE fused, one masked attention call, no graph breaks); False
    keeps diffusers' processor (bitwise stock attention, a graph break per
    sample under torch.compile); ``prefer_cudnn_attention``: with diffusers'
    native attention backend, try cuDNN first; ``fp8``: the video stream's block
    linears (``FP8_LINEARS``) as float8_e4m3 GEMMs, ``norm1`` and ``norm3``
    writing their inputs in e4m3 (inference only; needs ``fuse_attention``);
    ``fp8_fast_accum``: those GEMMs with cuBLASLt's fast accumulation;
    ``fp8_keep_bf16``: keep the bf16 linears for ``restore`` (False frees them,
    and restore then refuses); ``fp8_attention``: with ``fp8``, the joint
    attention on cuDNN's FP8 SDPA (``fp8_attention.py``; needs
    nvidia-cudnn-frontend; bf16 attention where a text token is padding, or a
    backend set with ``set_attention_backend`` or context parallelism is in play)."""

    exact_mode: bool = True
    fuse_attention: bool = True
    prefer_cudnn_attention: bool = True
    fp8: bool = False
    fp8_fast_accum: bool = True
    fp8_keep_bf16: bool = True
    fp8_attention: bool = False


# --- the fused forwards --------------------------------------------------------------------------------


def modulated_norm(kernel, x: Tensor, scale: Tensor, eps: float, exact_mode: bool, fp8: bool = False):
    """``T(RMSNorm(x.float()) * (1 + scale.float()))`` in one pass; with ``fp8`` the float32 result as
    e4m3 rows (``adaln_rmsnorm_fp8``, no weight, no shift) for the FP8 projections."""
    if fp8:
        return kernel.adaln_rmsnorm_fp8(x, None, scale, None, eps)
    return kernel.modulated_rmsnorm(x, scale, eps, exact_mode=exact_mode)


def rmsnorm_zero_forward(norm: MochiRMSNormZero, hidden_states: Tensor, emb: Tensor, *, kernel, exact_mode: bool,
                         fp8: bool = False):
    """``MochiRMSNormZero.forward``: the modulation, then ``modulated_rmsnorm`` (e4m3 rows with ``fp8``)."""
    emb = norm.linear(norm.silu(emb))
    scale_msa, gate_msa, scale_mlp, gate_mlp = emb.chunk(4, dim=1)
    hidden_states = modulated_norm(kernel, hidden_states, scale_msa, norm.norm.eps, exact_mode, fp8)
    return hidden_states, gate_msa, scale_mlp, gate_mlp


def layer_norm_continuous_forward(norm: MochiLayerNormContinuous, x: Tensor, conditioning_embedding: Tensor, *,
                                  kernel, exact_mode: bool) -> Tensor:
    """``MochiLayerNormContinuous.forward`` (despite its name an RMSNorm with ``1 + scale``)."""
    scale = norm.linear_1(norm.silu(conditioning_embedding).to(x.dtype))
    return kernel.modulated_rmsnorm(x, scale, norm.norm.norm.eps, exact_mode=exact_mode)


def swiglu_forward(act: SwiGLU, hidden_states: Tensor, *, kernel) -> Tensor:
    """diffusers' ``SwiGLU``: the projection, then ``a * silu(gate)`` with the gate the second half."""
    return kernel.swiglu(act.proj(hidden_states), silu_half="second")


def block_forward(block: MochiTransformerBlock, hidden_states: Tensor, encoder_hidden_states: Tensor, temb: Tensor,
                  encoder_attention_mask: Tensor, image_rotary_emb=None, *, kernel, exact_mode: bool,
                  fp8: bool = False):
    """``MochiTransformerBlock.forward`` with each residual fused with the norm of
    its branch and ``norm3`` one pass. ``norm1``, attention and feed-forward go
    through the submodules, so their own hooks and processors apply. With ``fp8``
    the video stream's ``norm3`` writes e4m3 rows for the FP8 feed-forward."""
    norm_hidden_states, gate_msa, scale_mlp, gate_mlp = call(block.norm1, hidden_states, temb)
    if not block.context_pre_only:
        norm_encoder_hidden_states, enc_gate_msa, enc_scale_mlp, enc_gate_mlp = call(
            block.norm1_context, encoder_hidden_states, temb)
    else:
        norm_encoder_hidden_states = call(block.norm1_context, encoder_hidden_states, temb)
    attn_hidden_states, context_attn_hidden_states = block.attn1(
        hidden_states=norm_hidden_states, encoder_hidden_states=norm_encoder_hidden_states,
        image_rotary_emb=image_rotary_emb, attention_mask=encoder_attention_mask)
    hidden_states, norm_hidden_states = tanh_gated_residual_then_norm(
        kernel, hidden_states, attn_hidden_states, gate_msa, block.norm2, block.norm3, scale_mlp, exact_mode, fp8)
    ff_output = feed_forward(block.ff, norm_hidden_states)
    hidden_states = tanh_gated_residual(kernel, hidden_states, ff_output, gate_mlp, block.norm4, exact_mode)
    if not block.context_pre_only:
        encoder_hidden_states, norm_encoder_hidden_states = tanh_gated_residual_then_norm(
            kernel, encoder_hidden_states, context_attn_hidden_states, enc_gate_msa, block.norm2_context,
            block.norm3_context, enc_scale_mlp, exact_mode)
        context_ff_output = feed_forward(block.ff_context, norm_encoder_hidden_states)
        encoder_hidden_states = tanh_gated_residual(kernel, encoder_hidden_states, context_ff_output, enc_gate_mlp,
                                                    block.norm4_context, exact_mode)
    return hidden_states, encoder_hidden_states


def tanh_gated_residual(kernel, x: Tensor, branch: Tensor, gate: Tensor, norm: MochiModulatedRMSNorm,
                         exact_mode: bool) -> Tensor:
    """``x + norm(branch, tanh(gate).unsqueeze(1))`` in one pass."""
    return kernel.residual_tanh_gated_rmsnorm(x, branch, gate, norm.norm.eps, exact_mode=exact_mode)


def tanh_gated_residual_then_norm(kernel, x: Tensor, branch: Tensor, gate: Tensor, norm: MochiModulatedRMSNorm,
                                  next_norm: MochiModulatedRMSNorm, scale: Tensor,
                                  exact_mode: bool, fp8: bool = False) -> Tuple[Tensor, object]:
    """The attention residual, then ``next_norm(x, 1 + scale)`` on its result (e4m3 rows with ``fp8``)."""
    x = tanh_gated_residual(kernel, x, branch, gate, norm, exact_mode)
    return x, modulated_norm(kernel, x, scale, next_norm.norm.eps, exact_mode, fp8)


# --- attention -------------------------------------------------------------------------------------------


def _fusable_norm(norm: Optional[nn.Module], x: Tensor) -> bool:
    """A ``MochiRMSNorm`` over one head with a weight: the "torch" rounding of the ops."""
    return (type(norm) is MochiRMSNorm and norm.weight is not None and tuple(norm.weight.shape) == (x.shape[-1],)
            and not weights_managed_by_hooks(norm))


def head_norm(kernel, norm: Optional[nn.Module], x: Tensor) -> Tensor:
    if norm is None:
        return x
    if _fusable_norm(norm, x):
        return kernel.rmsnorm(x, norm.weight, norm.eps, rounding="torch")
    return norm(x)


def mochi_rotary(x: Tensor, freqs_cos: Tensor, freqs_sin: Tensor) -> Tensor:
    """The RoPE of ``MochiAttnProcessor2_0`` on ``[B, S, H, Dh]`` (pairs ``(2i, 2i+1)``;
    tables ``[S, H, Dh/2]`` float32), for the q/k that cannot take the fused op."""
    x_even, x_odd = x[..., 0::2].float(), x[..., 1::2].float()
    cos = (x_even * freqs_cos - x_odd * freqs_sin).to(x.dtype)
    sin = (x_even * freqs_sin + x_odd * freqs_cos).to(x.dtype)
    return torch.stack([cos, sin], dim=-1).flatten(-2)


def per_channel_table(table: Tensor) -> Tensor:
    """Mochi's ``[S, H, Dh/2]`` table (one angle per head and pair) as ``[S, H*Dh]``,
    one column per channel (both channels of a pair), as ``qk_rmsnorm_rope`` reads it."""
    return torch.stack((table, table), dim=-1).flatten(1)


class RotaryTables:
    """The per-channel tables (:func:`per_channel_table`) of the running forward's RoPE tables,
    made once per forward by :class:`RotaryTableHook` instead of once per block (at Mochi's 23,850
    tokens each is 293 MB of float32, and the eager ``torch.stack`` took 0.84 ms a table on an H100).
    Processors look them up by the identity of the tables they get, as :class:`FullTextMask`
    does the mask; :class:`ReleaseTablesHook` drops them when the blocks are done."""

    source: Optional[Tuple[Tensor, Tensor]] = None
    per_channel: Optional[Tuple[Tensor, Tensor]] = None

    def of(self, cos: Tensor, sin: Tensor) -> Tuple[Tensor, Tensor]:
        if self.source is not None and cos is self.source[0] and sin is self.source[1]:
            return self.per_channel
        return per_channel_table(cos), per_channel_table(sin)

    def release(self) -> None:
        self.source = self.per_channel = None


class RotaryTableHook(ModelHook):
    """On ``rope`` (called once per transformer forward, before the blocks): records the per-channel
    tables of its output in ``record``. Not when the whole model is traced: Inductor then makes the
    tables once per graph from the blocks' own calls."""

    def __init__(self, record: RotaryTables):
        super().__init__()
        self.record = record

    def post_forward(self, module, output):
        self.record.release()
        cos, sin = output
        if not torch.compiler.is_compiling() and cos.dtype == torch.float32:
            self.record.source = (cos, sin)
            self.record.per_channel = (per_channel_table(cos), per_channel_table(sin))
        return output


class ReleaseTablesHook(ModelHook):
    """On ``norm_out`` (called once per transformer forward, after the blocks): releases ``record``."""

    def __init__(self, record: RotaryTables):
        super().__init__()
        self.record = record

    def post_forward(self, module, output):
        if not torch.compiler.is_compiling():
            self.record.release()
        return output


def mochi_qk(attn: MochiAttention, query: Tensor, key: Tensor, image_rotary_emb, *, kernel, exact_mode: bool,
             out: Optional[Tuple[Tensor, Tensor]] = None, tables: Optional[RotaryTables] = None):
    """``norm_q``/``norm_k`` per head, then Mochi's RoPE, on video q/k ``[B, S, H, Dh]``:
    one ``qk_rmsnorm_rope`` pass when both norms fit; otherwise as the stock processor.
    ``out``: where to write them (the fused pass writes there directly); ``tables``: the
    per-channel tables of this forward, if recorded."""
    norm_q, norm_k = attn.norm_q, attn.norm_k
    if (image_rotary_emb is not None and _fusable_norm(norm_q, query) and _fusable_norm(norm_k, key)
            and norm_q.eps == norm_k.eps and image_rotary_emb[0].dtype == torch.float32):
        cos, sin = (tables or RotaryTables()).of(*image_rotary_emb)
        return kernel.qk_rmsnorm_rope(query, key, norm_q.weight, norm_k.weight, cos, sin, norm_q.eps,
                                      head_dim=query.shape[-1], rotation="interleaved", rounding="torch",
                                      exact_mode=exact_mode, **({} if out is None else {"out": out}))
    query, key = head_norm(kernel, norm_q, query), head_norm(kernel, norm_k, key)
    if image_rotary_emb is not None:
        query, key = mochi_rotary(query, *image_rotary_emb), mochi_rotary(key, *image_rotary_emb)
    if out is not None:
        out[0].copy_(query)
        out[1].copy_(key)
        return out
    return query, key


def joint_qk(attn: MochiAttention, query: Tensor, key: Tensor, encoder_query: Tensor, encoder_key: Tensor,
             image_rotary_emb, *, kernel, exact_mode: bool,
             tables: Optional[RotaryTables] = None) -> Tuple[Tensor, Tensor]:
    """``[video | text]`` q and k (``[B, S + L, H, Dh]``), the video part through :func:`mochi_qk`.
    Eager inference writes it straight into the joint tensors: a ``torch.cat`` copied each video q and
    k once more per block. A traced or recorded call joins them with ``torch.cat``: Inductor writes the
    joint q/k in the layout SDPA takes in one kernel either way, and ``out`` has no backward."""
    weights = tuple(getattr(norm, "weight", None) for norm in (attn.norm_q, attn.norm_k))
    if torch.compiler.is_compiling() or records_autograd((query, key, encoder_query, encoder_key, *weights), {}):
        query, key = mochi_qk(attn, query, key, image_rotary_emb, kernel=kernel, exact_mode=exact_mode,
                              tables=tables)
        return torch.cat([query, encoder_query], dim=1), torch.cat([key, encoder_key], dim=1)
    batch, video_length = query.shape[:2]
    shape = (batch, video_length + encoder_query.shape[1], *query.shape[2:])
    joint_query, joint_key = query.new_empty(shape), key.new_empty(shape)
    mochi_qk(attn, query, key, image_rotary_emb, kernel=kernel, exact_mode=exact_mode, tables=tables,
             out=(joint_query[:, :video_length], joint_key[:, :video_length]))
    joint_query[:, video_length:] = encoder_query
    joint_key[:, video_length:] = encoder_key
    return joint_query, joint_key


def valid_first(attention_mask: Optional[Tensor], *text: Tensor):
    """The text tokens reordered valid-first (a stable sort of the mask), and the reordered mask; the
    tensors as they are and None without a mask."""
    if attention_mask is None:
        return text, None
    valid = attention_mask != 0
    order = torch.argsort((~valid).to(torch.uint8), dim=1, stable=True)
    index = order[:, :, None, None].expand_as(text[0])
    return tuple(t.gather(1, index) for t in text), valid.gather(1, order)


def joint_attention(query, key, value, video_length: int, valid: Optional[Tensor], attention):
    """Attention over ``[video | text]`` tokens (``[B, S + L, H, Dh]`` each) as
    ``MochiAttnProcessor2_0`` computes it, with static shapes: the stock code
    keeps, per sample, the text tokens its mask marks (``torch.nonzero``),
    attends over video + those, and pads the text outputs with zeros at the
    end. Here the text tokens come valid-first (:func:`valid_first`; ``valid``
    their mask), all samples attend at once with the invalid ones masked out as
    keys, and the invalid outputs are zeroed: the same layout and values, up to
    the attention kernel's rounding. Returns ``([B, S, H*Dh], [B, L, H*Dh])``."""
    key_mask = None
    if valid is not None:
        key_mask = torch.cat([valid.new_ones(valid.shape[0], video_length), valid], dim=1)[:, None, None, :]
    out = attention(query, key, value, key_mask)
    hidden_states, encoder_hidden_states = out.flatten(2, 3).split_with_sizes(
        (video_length, query.shape[1] - video_length), dim=1)
    if valid is not None:
        encoder_hidden_states = encoder_hidden_states.masked_fill(~valid[..., None], 0)
    return hidden_states, encoder_hidden_states


def fp8_joint_attention(kernel, attn, query, key, value, video_length: int):
    """Unmasked :func:`joint_attention` on cuDNN's FP8 SDPA: the video output as e4m3 rows for the FP8
    ``to_out`` (no quantisation pass), the text output in bf16 for ``to_add_out``."""
    out, descale = fp8_self_attention(query, key, value)
    video, text = out.flatten(2, 3).split_with_sizes((video_length, query.shape[1] - video_length), dim=1)
    return (projection_input(kernel, attn.to_out[0], video, descale, query.dtype),
            dequantize(text, descale, query.dtype))


def mochi_attention_forward(attn: MochiAttention, hidden_states: Tensor, encoder_hidden_states: Tensor,
                            attention_mask: Optional[Tensor], image_rotary_emb=None, *, kernel, exact_mode: bool,
                            attention, fp8_attention: bool = False, tables: Optional[RotaryTables] = None):
    """``MochiAttnProcessor2_0`` with q/k norm + RoPE fused (:func:`mochi_qk`, into the joint q/k of
    :func:`joint_qk`; the per-channel tables from ``tables`` when recorded), the text q/k norms on
    ``rmsnorm`` and the attention of :func:`joint_attention` (``fp8_attention`` and no mask:
    :func:`fp8_joint_attention`)."""
    query, key, value = (proj(hidden_states).unflatten(2, (attn.heads, -1)) for proj in (attn.to_q, attn.to_k,
                                                                                          attn.to_v))
    encoder_query, encoder_key, encoder_value = (
        proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
        for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
    encoder_query = head_norm(kernel, attn.norm_added_q, encoder_query)
    encoder_key = head_norm(kernel, attn.norm_added_k, encoder_key)
    (encoder_query, encoder_key, encoder_value), valid = valid_first(attention_mask, encoder_query, encoder_key,
                                                                     encoder_value)
    video_length = query.shape[1]
    query, key = joint_qk(attn, query, key, encoder_query, encoder_key, image_rotary_emb, kernel=kernel,
                          exact_mode=exact_mode, tables=tables)
    value = torch.cat([value, encoder_value], dim=1)
    if fp8_attention and attention_mask is None:
        hidden_states, encoder_hidden_states = fp8_joint_attention(kernel, attn, query, key, value, video_length)
    else:
        hidden_states, encoder_hidden_states = joint_attention(query, key, value, video_length, valid, attention)
    hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
    if hasattr(attn, "to_add_out"):
        encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
    return hidden_states, encoder_hidden_states


class FullTextMask:
    """The text mask of the running forward when every token of every sample
    is valid, else None. :class:`TextMaskHook` sets it once per forward (a host
    read, outside the blocks); the processors compare their mask with it by
    identity, which torch.compile resolves at trace time (an aliasing guard, no
    graph break), so a block called with any other mask still masks it."""

    mask: Optional[Tensor] = None


class TextMaskHook(ModelHook):
    """On ``time_embed`` (called once per transformer forward, before the blocks,
    with the text mask): records in ``record`` whether every text token is valid."""

    def __init__(self, record: FullTextMask):
        super().__init__()
        self.record = record

    def pre_forward(self, module, *args, **kwargs):
        mask = kwargs["encoder_attention_mask"] if "encoder_attention_mask" in kwargs else (
            args[2] if len(args) > 2 else None)
        # A traced forward (whole-model compile) cannot read the host without a graph break: it leaves
        # the record alone (it matches only the mask it was set for).
        if not torch.compiler.is_compiling() and isinstance(mask, Tensor):
            self.record.mask = mask if bool((mask != 0).all()) else None
        return args, kwargs


class FusedMochiAttnProcessor(DispatchedAttention, MochiAttnProcessor2_0):
    """``MochiAttnProcessor2_0`` on the fused ops (:func:`mochi_attention_forward`).
    Attention goes through diffusers' ``dispatch_attention_fn`` with this
    processor's backend: ``set_attention_backend`` reaches it (the stock Mochi
    processor has no backend and calls ``F.scaled_dot_product_attention``).
    A mask that ``full_text`` records as all valid is dropped (no mask: cuDNN
    and flash can run); a padded one needs a backend that takes masks (native,
    cuDNN, memory-efficient, flex; not flash). RoPE reads the per-channel
    tables that ``tables`` holds for this forward, or makes its own."""

    def __init__(self, kernel, exact_mode: bool = True, prefer_cudnn_attention: bool = True,
                 full_text: Optional[FullTextMask] = None, fp8_attention: bool = False,
                 tables: Optional[RotaryTables] = None):
        super().__init__(kernel, exact_mode, prefer_cudnn_attention, fp8_attention)
        self.full_text = full_text if full_text is not None else FullTextMask()
        self.tables = tables if tables is not None else RotaryTables()

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb=None):
        if attention_mask is not None and attention_mask is self.full_text.mask:
            attention_mask = None  # every text token valid: the unmasked call is the stock one
        return mochi_attention_forward(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb,
                                       kernel=self.kernel, exact_mode=self.exact_mode, attention=self.attention,
                                       fp8_attention=self.runs_fp8_attention, tables=self.tables)

    def __deepcopy__(self, memo):
        return copy.copy(self)  # shares the kernel and the records


# --- check, apply, restore ---------------------------------------------------------------------------------


@dataclass
class MochiPlan:
    """The modules of one Mochi transformer that apply rewires."""

    transformer: MochiTransformer3DModel
    blocks: List[MochiTransformerBlock] = field(default_factory=list)
    zero_norms: List[MochiRMSNormZero] = field(default_factory=list)  # the video stream's norm1
    context_zero_norms: List[MochiRMSNormZero] = field(default_factory=list)
    continuous_norms: List[MochiLayerNormContinuous] = field(default_factory=list)
    swiglus: List[SwiGLU] = field(default_factory=list)
    attentions: List[MochiAttention] = field(default_factory=list)
    time_embed: Optional[MochiCombinedTimestepCaptionEmbedding] = None  # where the text mask is read
    rope: Optional[MochiRoPE] = None  # where the per-channel RoPE tables are made, with norm_out releasing them
    norm_out: Optional[nn.Module] = None


def _weightless_rmsnorm(norm: nn.Module) -> bool:
    return type(norm) is DiffusersRMSNorm and norm.weight is None and norm.bias is None


def _norm_problems(block: nn.Module, name: str, where: str) -> List[str]:
    norm = getattr(block, name, None)
    if not plain(norm, MochiModulatedRMSNorm) or not _weightless_rmsnorm(norm.norm):
        return [f"{where}.{name} is {type(norm).__qualname__}, not diffusers' MochiModulatedRMSNorm (an RMSNorm "
                "without weight)"]
    return []


def _zero_norm_problems(norm: nn.Module, where: str) -> List[str]:
    if not plain(norm, MochiRMSNormZero) or not _weightless_rmsnorm(norm.norm):
        return [f"{where} is {type(norm).__qualname__}, not diffusers' MochiRMSNormZero (an RMSNorm without weight)"]
    return []


def block_problems(block: nn.Module, where: str, fuse_attention: bool) -> List[str]:
    if not plain(block, MochiTransformerBlock):
        return [f"{where} is {type(block).__qualname__}, not diffusers' MochiTransformerBlock (or a subclass with "
                "its own forward)"]
    problems = _zero_norm_problems(block.norm1, f"{where}.norm1")
    if block.context_pre_only:
        context = block.norm1_context
        if not plain(context, MochiLayerNormContinuous) or not plain(context.norm, MochiModulatedRMSNorm) \
                or not _weightless_rmsnorm(context.norm.norm):
            problems.append(f"{where}.norm1_context is {type(context).__qualname__}, not diffusers' "
                            "MochiLayerNormContinuous")
    else:
        problems += _zero_norm_problems(block.norm1_context, f"{where}.norm1_context")
        for name in ("norm2_context", "norm3_context", "norm4_context"):
            problems += _norm_problems(block, name, where)
    for name in ("norm2", "norm3", "norm4"):
        problems += _norm_problems(block, name, where)
    attn = block.attn1
    if not plain(attn, MochiAttention):
        problems.append(f"{where}.attn1 is {type(attn).__qualname__}, not diffusers' MochiAttention")
    elif fuse_attention and type(attn.processor) is not MochiAttnProcessor2_0:
        problems.append(f"{where}.attn1 uses the attention processor {type(attn.processor).__qualname__}, not "
                        "diffusers' MochiAttnProcessor2_0, and optimize would replace it; set MochiAttnProcessor2_0() "
                        "back, or pass fuse_attention=False to keep it")
    return problems


def model_problems(model: nn.Module, fuse_attention: bool) -> List[str]:
    problems = transformer_problems(model, MochiTransformer3DModel, "transformer_blocks",
                                    functools.partial(block_problems, fuse_attention=fuse_attention))
    return problems


def fp8_model_problems(transformer: MochiTransformer3DModel, fuse_attention: bool) -> List[str]:
    """What fp8=True cannot run: diffusers' own processor (ours takes e4m3 rows), a video feed-forward
    other than diffusers' FeedForward with SwiGLU, fused projections, and what ``base.fp8_problems``
    refuses in the linears."""
    problems = [] if fuse_attention else ["fp8=True needs fuse_attention=True: the fused processor takes the "
                                          "e4m3 rows of norm1"]
    blocks = transformer.transformer_blocks
    problems += [f"transformer_blocks.{i}.ff is not diffusers' FeedForward with SwiGLU, which fp8=True runs as its "
                 "FP8 projections around swiglu" for i, block in enumerate(blocks) if _swiglu_of(block.ff) is None]
    return (problems + fused_projection_problems(transformer, [block.attn1 for block in blocks])
            + fp8_problems(transformer, blocks, FP8_LINEARS, ff=None))


def _swiglu_of(ff: Optional[nn.Module]) -> Optional[SwiGLU]:
    """The feed-forward's ``SwiGLU`` (``ff.net[0]``) with a plain SiLU; other activations stay as they are."""
    if not plain(ff, FeedForward):
        return None
    act = ff.net[0]
    if type(act) is SwiGLU and type(act.activation) is nn.SiLU:
        return act
    return None


def check(transformer: nn.Module, options: Optional[Options]) -> MochiPlan:
    """The modules to rewire, or UnsupportedModelError listing every problem."""
    fuse_attention = options is None or options.fuse_attention
    problems = model_problems(transformer, fuse_attention)
    if not problems and options is not None and options.fp8:
        problems = fp8_model_problems(transformer, fuse_attention)
    if options is not None:  # an option's problem first: the list shown is cut at 12
        problems = option_problems(options) + problems
    refuse_problems(problems)
    plan = MochiPlan(transformer=transformer)
    if plain(getattr(transformer, "time_embed", None), MochiCombinedTimestepCaptionEmbedding):
        plan.time_embed = transformer.time_embed  # otherwise the mask is never dropped: slower, still right
    if plain(getattr(transformer, "rope", None), MochiRoPE) and isinstance(getattr(transformer, "norm_out", None),
                                                                           nn.Module):
        plan.rope, plan.norm_out = transformer.rope, transformer.norm_out  # otherwise made per block: slower
    for block in transformer.transformer_blocks:
        plan.blocks.append(block)
        plan.zero_norms.append(block.norm1)
        context = block.norm1_context
        (plan.continuous_norms if block.context_pre_only else plan.context_zero_norms).append(context)
        plan.swiglus += [act for act in (_swiglu_of(block.ff), _swiglu_of(block.ff_context)) if act is not None]
        plan.attentions.append(block.attn1)
    return plan


def check_kernel(kernel) -> None:
    check_kernel_functions(kernel, KERNEL_FUNCTIONS)


def apply(plan: MochiPlan, kernel, options: Options) -> HookedState:
    """Hooks on the norms, feed-forward activations and blocks; the fused
    attention processors; ``_repeated_blocks`` for ``compile_repeated_blocks``;
    with ``fp8`` the video stream's block linears as ``Fp8Linear``."""
    if options.fp8:
        check_kernel_functions(kernel, FP8_KERNEL_FUNCTIONS)
    state = HookedState(kernel=kernel, options=options)
    exact, fp8 = options.exact_mode, options.fp8
    zero_norm = functools.partial(rmsnorm_zero_forward, kernel=kernel, exact_mode=exact)
    seams = [(plan.zero_norms, "mochi.rmsnorm_zero", functools.partial(zero_norm, fp8=fp8)),
             (plan.context_zero_norms, "mochi.rmsnorm_zero", zero_norm),  # the text stream stays bf16
             (plan.continuous_norms, "mochi.layer_norm_continuous",
              functools.partial(layer_norm_continuous_forward, kernel=kernel, exact_mode=exact)),
             (plan.swiglus, "mochi.swiglu", functools.partial(swiglu_forward, kernel=kernel)),
             (plan.blocks, "mochi.block", functools.partial(block_forward, kernel=kernel, exact_mode=exact, fp8=fp8))]
    for modules, seam, fused in seams:
        state.hooks += [install(module, seam, fused) for module in modules]
    if options.fuse_attention:
        full_text = FullTextMask()
        if plan.time_embed is not None:
            state.hooks.append(install_hook(plan.time_embed, "mochi.text_mask", TextMaskHook(full_text)))
        tables = RotaryTables()
        if plan.rope is not None:
            state.hooks += [install_hook(plan.rope, "mochi.rotary_tables", RotaryTableHook(tables)),
                            install_hook(plan.norm_out, "mochi.release_tables", ReleaseTablesHook(tables))]
        for attn in plan.attentions:
            install_processor(state, attn, FusedMochiAttnProcessor(kernel, exact, options.prefer_cudnn_attention,
                                                                   full_text, options.fp8_attention, tables))
        # The blocks now trace without graph breaks: let compile_repeated_blocks find them (the stock class
        # names none, so it raises there).
        if not plan.transformer._repeated_blocks:
            plan.transformer._repeated_blocks = [BLOCK_CLASS_NAME]
            state.set_repeated_blocks = True
    if fp8:
        state.linears = swap_fp8(plan.blocks, FP8_LINEARS, kernel, options.fp8_fast_accum, options.fp8_keep_bf16)
    invalidate_registry_caches(plan.transformer)
    return state


def restore(transformer: nn.Module, state: HookedState) -> None:
    """Undo ``apply`` (``base.restore_hooked``)."""
    restore_hooked(transformer, state)


__all__ = ["NAME", "CLASSES", "Options", "check", "check_kernel", "apply", "restore", "FusedMochiAttnProcessor",
           "FullTextMask", "TextMaskHook", "RotaryTables", "RotaryTableHook", "ReleaseTablesHook", "block_forward",
           "mochi_qk", "joint_attention"]
