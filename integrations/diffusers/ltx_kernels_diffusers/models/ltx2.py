"""LTX-2 (``LTX2VideoTransformer3DModel``, diffusers' ``transformer_ltx2.py``) in
the model registry: the audio-video transformer of LTX-2.0 and LTX-2.3 (gated
attention, ``gated_attn``/``audio_gated_attn``; the text cross-attention's query
modulation, ``cross_attn_mod``/``audio_cross_attn_mod``), either RoPE layout
(``rope_type`` "interleaved" or "split") and spatio-temporal guidance
(``perturbed_attn``: its blocks and processors are fused too, the perturbation
itself runs as stock).

Each seam and the op that replaces it, in both streams (video; audio the same
with the ``audio_`` modules). ``T`` is the model dtype; the block norms are
diffusers' ``RMSNorm`` without weight (``n = T(x * rsqrt(mean(x**2) + eps))``),
the modulation tensors are ``T`` (``table + temb``, per sample or per token). In
exact mode every replacement is the eager chain bit for bit, up to the
summation order of the norms' statistics and, with ``prefer_cudnn_attention``,
the attention backend PyTorch picks.

=============================================  ===============================================  ============
seam (diffusers 0.42.1)                        fused op                                         installed as
=============================================  ===============================================  ============
``norm1(h) * (1 + scale_msa) + shift_msa``     ``adaln_rmsnorm(h, None, scale_msa, shift_msa)``  block hook
``h + attn1 * gate_msa``, then ``norm2(h)``    ``gated_residual_rmsnorm(h, attn1, gate_msa,      block hook
(``* (1 + scale_text_q) + shift_text_q``       scale_text_q, shift_text_q)``; without
with ``cross_attn_mod``)                       ``cross_attn_mod`` a zero scale and no shift
                                               (``n * T(1 + 0)`` is ``n``)
``h + attn2 [* gate_text_q]``, then            ``gated_residual_rmsnorm`` with the first         block hook
``audio_to_video_norm(h)`` and its a2v and     modulation, ``adaln_rmsnorm`` of the new ``h``
v2a modulations (``norm3`` + MLP modulation    for the second (one norm per modulation, each
instead where a2v is off)                      bitwise the stock ``n`` then modulated)
``h + a2v_gate * a2v``, then ``norm3(h) *      ``gated_residual_rmsnorm(h, a2v, a2v_gate,        block hook
(1 + scale_mlp) + shift_mlp``                  scale_mlp, shift_mlp)``
``h + ff * gate_mlp``                          ``gated_residual``                               block hook
``ff.net[0]`` (``GELU``, tanh)                 projection, then ``gelu_tanh`` (bitwise);        module hook
                                               ``gelu_epilogue``: ``linear_gelu``
self-attention ``norm_q``/``norm_k``           ``qk_rmsnorm_rope(head_dim=None, "interleaved",   processor
(``torch.nn.RMSNorm`` over all heads) +        rounding="torch")`` on ``[B, S, D]`` with the
interleaved RoPE (tables ``[B, S, D]``)        model's float32 tables
a2v / v2a q/k norm + interleaved RoPE          ``rmsnorm(rounding="torch")`` each, then          processor
(q and k: other tokens, other tables)          ``apply_rotary_emb`` each (the fused op takes
                                               one table for q and k of one shape)
q/k norm + **split** RoPE (tables              ``rmsnorm(rounding="torch")`` each, then the      processor
``[B, H, S, Dh/2]``, per head)                 stock ``apply_split_rotary_emb``: the op reads a
                                               table per channel or one shared by the heads,
                                               and building one per call would cost more than
                                               it saves
text cross-attention ``norm_q``/``norm_k``     ``rmsnorm(rounding="torch")``                    processor
gated attention: ``out * (2 *                  ``head_gate(out, logits, scale=2.0)``            processor
sigmoid(to_gate_logits(x)))`` per head
=============================================  ===============================================  ============

Stays stock: the patch embeddings, the timestep and prompt modulation
embedders, the RoPE modules (their tables are built once per forward already),
the text states' modulation (``cross_attn_mod``: ``enc * (1 + scale_text_kv) +
shift_text_kv``, no norm to fuse with), the projections, the attention calls
(the stock ``dispatch_attention_fn`` calls, masks as stock), the perturbation
(``torch.lerp`` with the values, or the values alone where all are perturbed)
and the output heads. The feed-forward's residual is not fused with the next
block's ``norm1``: that needs the model's block loop, which no hook offers.

The block's residual seams live in its forward, so the block gets a hook; the
GELU is one module's whole forward. Hooks are diffusers ``ModelHook``\\ s
(``hooks.py``): registered before offloading, caches or casting, they are the
innermost and those wrap them. ``head_gate`` is needed only where a model has
gated attention: ``apply`` asks for it (TypeError, nothing changed) then.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
import torch.distributed._functional_collectives as funcol
from diffusers.models.activations import GELU
from diffusers.models.normalization import RMSNorm
from diffusers.models.transformers.transformer_ltx2 import (LTX2Attention, LTX2AudioVideoAttnProcessor,
                                                             LTX2PerturbedAttnProcessor, LTX2VideoTransformer3DModel,
                                                             LTX2VideoTransformerBlock, apply_interleaved_rotary_emb,
                                                             apply_split_rotary_emb)
from torch import nn

from ..attention import DispatchedAttention
from ..discovery import refuse_problems
from ..fp8_attention import dequantize, fp8_self_attention, option_problems, output_projection
from ..hooks import feed_forward, install, invalidate_registry_caches, weights_managed_by_hooks
from .base import (HookedState, check_kernel_functions, computed_once, fp8_problems, gelu_forward,
                   install_processor, plain, restore_hooked, rows_shape, swap_fp8, tanh_gelu_of,
                   transformer_problems)

NAME = "LTX-2 (2.0, 2.3)"
CLASSES = (LTX2VideoTransformer3DModel,)
KERNEL_FUNCTIONS = ("rmsnorm", "adaln_rmsnorm", "gated_residual", "gated_residual_rmsnorm", "gelu_tanh",
                    "linear_gelu", "qk_rmsnorm_rope", "apply_rotary_emb")
GATED_KERNEL_FUNCTIONS = ("head_gate",)  # only for models with gated attention
FP8_KERNEL_FUNCTIONS = ("quantize_fp8", "gelu_tanh_fp8", "adaln_rmsnorm_fp8", "gated_residual_rmsnorm_fp8",
                        "linear_fp8", "Fp8Linear")
# The block linears fp8=True runs in float8_e4m3: those with a video-token input (6144 tokens a sample
# at the shape). The audio stream (126 tokens) and the text keys/values are too few rows for
# FP8 to gain, and the gate logits (LTX-2.3) are 32 outputs wide. The a2v output projection stays bf16:
# alone in FP8 it costs 3.6x stock bf16's error to fp32, all the others together 1.7x (docs/fp8.md).
FP8_LINEARS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_out.0",
               "audio_to_video_attn.to_q", "video_to_audio_attn.to_k", "video_to_audio_attn.to_v",
               "ff.net.0.proj", "ff.net.2")
GATE_SCALE = 2.0  # the stock processor's `2.0 * sigmoid(logits)`: zero logits gate by 1
ROPE_TYPES = ("interleaved", "split")
STOCK_PROCESSORS = (LTX2AudioVideoAttnProcessor, LTX2PerturbedAttnProcessor)

Tensor = torch.Tensor


@dataclass(frozen=True)
class Options:
    """``exact_mode``; ``fuse_attention``: replace each attention processor (q/k
    norm + RoPE on the kernel, the per-head gate on ``head_gate``; the attention
    calls unchanged); ``gelu_epilogue``: the feed-forward up-projection and its
    GELU-tanh as one GEMM with the GELU epilogue (one rounding, not bitwise);
    None (default) follows the mode: off in exact mode, on with
    ``exact_mode=False``; ``prefer_cudnn_attention``: with diffusers' native
    attention backend, try cuDNN first; ``fp8``: the video stream's block linears
    (``FP8_LINEARS``) as float8_e4m3 GEMMs with rowwise scales, the GELU writing
    the down-projection's e4m3 input (inference only); ``fp8_fast_accum``: those
    GEMMs with cuBLASLt's fast accumulation; ``fp8_keep_bf16``: keep the bf16
    linears for ``restore`` (False frees them, and restore then refuses);
    ``fp8_attention``: with ``fp8``, the video self-attention (``attn1``) on
    cuDNN's FP8 SDPA (``fp8_attention.py``; needs nvidia-cudnn-frontend; bf16
    attention with a mask, under STG's perturbation, a backend set with
    ``set_attention_backend`` or context parallelism)."""

    exact_mode: bool = True
    fuse_attention: bool = True
    gelu_epilogue: Optional[bool] = None
    prefer_cudnn_attention: bool = True
    fp8: bool = False
    fp8_fast_accum: bool = True
    fp8_keep_bf16: bool = True
    fp8_attention: bool = False


# --- the block -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """One stream's modules of a block, by the names the block gives them (video: none; audio: ``audio_``)."""

    norm1: nn.Module
    attn1: nn.Module
    norm2: nn.Module
    attn2: nn.Module
    ca_norm: nn.Module      # audio_to_video_norm (video), video_to_audio_norm (audio)
    norm3: nn.Module
    ff: nn.Module
    table: Tensor           # scale_shift_table: 6 rows, 9 with the query modulation of the text cross-attention
    prompt_table: Optional[Tensor]
    ca_table: Tensor        # the a2v/v2a cross-attention table: 4 scale/shift rows, 1 gate row
    text_q_mod: bool        # cross_attn_mod for this stream


def streams(block: LTX2VideoTransformerBlock) -> Tuple[Stream, Stream]:
    video = Stream(block.norm1, block.attn1, block.norm2, block.attn2, block.audio_to_video_norm, block.norm3,
                   block.ff, block.scale_shift_table, getattr(block, "prompt_scale_shift_table", None),
                   block.video_a2v_cross_attn_scale_shift_table, block.video_cross_attn_adaln)
    audio = Stream(block.audio_norm1, block.audio_attn1, block.audio_norm2, block.audio_attn2,
                   block.video_to_audio_norm, block.audio_norm3, block.audio_ff, block.audio_scale_shift_table,
                   getattr(block, "audio_prompt_scale_shift_table", None),
                   block.audio_a2v_cross_attn_scale_shift_table, block.audio_cross_attn_adaln)
    return video, audio


def residual_then_norms(kernel, x: Tensor, y: Tensor, gate: Optional[Tensor], mods, exact_mode: bool,
                        fp8: Tuple[bool, ...] = ()):
    """``x = x + y * gate`` (``x + y`` without gate), then ``norm(x) * (1 + scale) + shift``
    for each ``(norm, scale, shift)`` of ``mods`` (shift may be None): the first
    fused with the residual, the others one ``adaln_rmsnorm`` each. Returns
    ``(x, [normed, ...])``, a normed value as e4m3 rows where ``fp8`` (one flag per mod, or
    empty: none) says so."""
    if not mods:
        return kernel.gated_residual(x, y, gate, exact_mode=exact_mode), []
    rows = fp8 or (False,) * len(mods)
    (norm, scale, shift), rest = mods[0], mods[1:]
    if rows[0]:
        first, x = kernel.gated_residual_rmsnorm_fp8(x, y, gate, scale, shift, norm.eps)
    else:
        first, x = kernel.gated_residual_rmsnorm(x, y, gate, scale, shift, norm.eps, exact_mode=exact_mode)
    return x, [first, *(kernel.adaln_rmsnorm_fp8(x, None, s, sh, n.eps) if fp8_rows
                        else kernel.adaln_rmsnorm(x, None, s, sh, n.eps, exact_mode=exact_mode)
                        for (n, s, sh), fp8_rows in zip(rest, rows[1:]))]


def takes_rows(kernel, attn: nn.Module, *projections: str, gated: bool = True) -> bool:
    """Whether an input of ``attn`` can come as e4m3 rows from the norm that writes it: our processor
    runs it, the ``projections`` that read it are FP8, and (``gated``: the query side) no per-head
    gate logits read it too."""
    return (isinstance(attn.processor, (FusedLTX2AttnProcessor, FusedLTX2PerturbedAttnProcessor)) and fusable(attn)
            and not (gated and getattr(attn, "to_gate_logits", None) is not None)
            and all(_fp8(kernel, getattr(attn, p)) for p in projections))


def mod_params(table: Tensor, temb: Tensor, batch_size: int) -> Tuple[Tensor, ...]:
    """``LTX2VideoTransformerBlock.get_mod_params``: ``table + temb`` split into
    ``[B, 1 or S, D]`` views, computed once under torch.compile (``computed_once``)."""
    ada = table[None, None].to(temb.device) + temb.reshape(batch_size, temb.shape[1], table.shape[0], -1)
    return computed_once(ada).unbind(dim=2)


def _text_kv(block, s: Stream, temb_prompt, states: Tensor, batch_size: int) -> Tensor:
    """The text states' modulation of ``cross_attn_adaln`` blocks, as stock (no norm to fuse with)."""
    if temb_prompt is not None:
        shift_kv, scale_kv = block.get_mod_params(s.prompt_table, temb_prompt, batch_size)
    else:
        shift_kv, scale_kv = s.prompt_table[None, None].to(device=states.device, dtype=states.dtype).unbind(dim=2)
    return states * (1 + scale_kv) + shift_kv


def block_forward(block: LTX2VideoTransformerBlock, hidden_states: Tensor, audio_hidden_states: Tensor,
                  encoder_hidden_states: Tensor, audio_encoder_hidden_states: Tensor, temb: Tensor,
                  temb_audio: Tensor, temb_ca_scale_shift: Tensor, temb_ca_audio_scale_shift: Tensor,
                  temb_ca_gate: Tensor, temb_ca_audio_gate: Tensor, temb_prompt: Optional[Tensor] = None,
                  temb_prompt_audio: Optional[Tensor] = None, video_rotary_emb=None, audio_rotary_emb=None,
                  ca_video_rotary_emb=None, ca_audio_rotary_emb=None, encoder_attention_mask=None,
                  audio_encoder_attention_mask=None, self_attention_mask=None, audio_self_attention_mask=None,
                  a2v_cross_attention_mask=None, v2a_cross_attention_mask=None, use_a2v_cross_attention: bool = True,
                  use_v2a_cross_attention: bool = True, perturbation_mask=None, all_perturbed=None, *, kernel,
                  exact_mode: bool, fp8: bool = False) -> Tuple[Tensor, Tensor]:
    """``LTX2VideoTransformerBlock.forward`` with each norm + modulation one pass
    and each residual fused with the norm that reads it. Attention and the
    feed-forwards go through the submodules, in the stock order, so their
    processors and hooks apply. The norms have no weight (``check`` makes sure).
    With ``fp8`` the video feed-forward's GELU writes e4m3 rows for its FP8
    down-projection (``layers.feed_forward_fp8``)."""
    batch_size = hidden_states.size(0)
    video, audio = streams(block)
    x = {"v": hidden_states, "a": audio_hidden_states}
    text = {"v": encoder_hidden_states, "a": audio_encoder_hidden_states}
    mods = {"v": mod_params(video.table, temb, batch_size),
            "a": mod_params(audio.table, temb_audio, batch_size)}
    rope = {"v": video_rotary_emb, "a": audio_rotary_emb}
    self_mask = {"v": self_attention_mask, "a": audio_self_attention_mask}
    text_mask = {"v": encoder_attention_mask, "a": audio_encoder_attention_mask}
    prompt = {"v": temb_prompt, "a": temb_prompt_audio}
    use_ca = use_a2v_cross_attention or use_v2a_cross_attention
    ff_rows = fp8 and _fp8(kernel, video.ff.net[0].proj)  # the video feed-forward's norm writes e4m3 rows

    # 1. self-attention; its residual fused with norm2 (+ the text query's modulation)
    normed = {}
    for key, s in (("v", video), ("a", audio)):
        shift_msa, scale_msa, gate_msa = mods[key][:3]
        if fp8 and takes_rows(kernel, s.attn1, "to_q", "to_k", "to_v"):
            norm_x = kernel.adaln_rmsnorm_fp8(x[key], None, scale_msa, shift_msa, s.norm1.eps)  # q, k, v's e4m3 rows
        else:
            norm_x = kernel.adaln_rmsnorm(x[key], None, scale_msa, shift_msa, s.norm1.eps, exact_mode=exact_mode)
        args = dict(hidden_states=norm_x, encoder_hidden_states=None, query_rotary_emb=rope[key],
                    attention_mask=self_mask[key])
        if block.perturbed_attn:
            args.update(perturbation_mask=perturbation_mask, all_perturbed=all_perturbed)
        attn_out = s.attn1(**args)
        if s.text_q_mod:
            shift_q, scale_q = mods[key][6:8]
        else:  # norm2 alone: a zero scale leaves the norm's output as it is
            shift_q, scale_q = None, torch.zeros(x[key].shape[-1], dtype=x[key].dtype, device=x[key].device)
        x[key], (normed[key],) = residual_then_norms(kernel, x[key], attn_out, gate_msa,
                                                     [(s.norm2, scale_q, shift_q)], exact_mode,
                                                     (fp8 and takes_rows(kernel, s.attn2, "to_q"),))

    # 2. text cross-attention; its residual fused with the next norm(s) of the stream
    if use_ca:
        ca = {"v": mod_params(video.ca_table[:4, :], temb_ca_scale_shift, batch_size),
              "a": mod_params(audio.ca_table[:4, :], temb_ca_audio_scale_shift, batch_size)}
        ca_gate = {"v": mod_params(video.ca_table[4:, :], temb_ca_gate, batch_size)[0].squeeze(2),
                   "a": mod_params(audio.ca_table[4:, :], temb_ca_audio_gate, batch_size)[0].squeeze(2)}
    ca_normed = {}
    for key, s in (("v", video), ("a", audio)):
        states = text[key]
        if block.cross_attn_adaln:
            states = _text_kv(block, s, prompt[key], states, batch_size)
        attn_out = s.attn2(normed[key], encoder_hidden_states=states, query_rotary_emb=None,
                           attention_mask=text_mask[key])
        gate = mods[key][8] if s.text_q_mod else None
        shift_mlp, scale_mlp = mods[key][3:5]
        # this stream's next residual: a2v for the video, v2a for the audio
        residual_next = use_a2v_cross_attention if key == "v" else use_v2a_cross_attention
        wanted, rows = [], []  # the norms this residual feeds, and which of them write e4m3 rows (fp8)
        fp8_video = fp8 and key == "v"
        if use_ca:
            a2v_scale, a2v_shift, v2a_scale, v2a_shift = ca[key]
            if use_a2v_cross_attention:  # the a2v query (video) or keys and values (audio)
                wanted.append((s.ca_norm, a2v_scale.squeeze(2), a2v_shift.squeeze(2)))
                rows.append(fp8_video and takes_rows(kernel, block.audio_to_video_attn, "to_q"))
            if use_v2a_cross_attention:  # the v2a keys and values (video) or query (audio)
                wanted.append((s.ca_norm, v2a_scale.squeeze(2), v2a_shift.squeeze(2)))
                rows.append(fp8_video and takes_rows(kernel, block.video_to_audio_attn, "to_k", "to_v", gated=False))
        if not residual_next:  # no more residual before the feed-forward: its norm reads this x
            wanted.append((s.norm3, scale_mlp, shift_mlp))
            rows.append(key == "v" and ff_rows)
        x[key], outs = residual_then_norms(kernel, x[key], attn_out, gate, wanted, exact_mode, tuple(rows))
        ca_normed[key] = outs[:len(wanted) - (not residual_next)]
        if not residual_next:
            normed[key] = outs[-1]

    # 3. a2v (q video, k/v audio) and v2a (q audio, k/v video); each residual fused with norm3
    def ca_input(key, which):
        """The stream's modulated norm for a2v (0) or v2a (1)."""
        return ca_normed[key][0 if which == 0 or not use_a2v_cross_attention else 1]

    for key, s, attn, which, q_rope, k_rope, mask in (
            ("v", video, block.audio_to_video_attn, 0, ca_video_rotary_emb, ca_audio_rotary_emb,
             a2v_cross_attention_mask),
            ("a", audio, block.video_to_audio_attn, 1, ca_audio_rotary_emb, ca_video_rotary_emb,
             v2a_cross_attention_mask)):
        if not (use_a2v_cross_attention if which == 0 else use_v2a_cross_attention):
            continue
        other = "a" if key == "v" else "v"
        attn_out = attn(ca_input(key, which), encoder_hidden_states=ca_input(other, which), query_rotary_emb=q_rope,
                        key_rotary_emb=k_rope, attention_mask=mask)
        shift_mlp, scale_mlp = mods[key][3:5]
        x[key], (normed[key],) = residual_then_norms(kernel, x[key], attn_out, ca_gate[key],
                                                     [(s.norm3, scale_mlp, shift_mlp)], exact_mode,
                                                     (key == "v" and ff_rows,))

    # 4. feed-forward
    for key, s in (("v", video), ("a", audio)):
        ff_out = (kernel.layers.feed_forward_fp8(kernel, s.ff, normed[key]) if fp8 and key == "v"
                  else feed_forward(s.ff, normed[key]))
        x[key] = kernel.gated_residual(x[key], ff_out, mods[key][5], exact_mode=exact_mode)
    return x["v"], x["a"]


# --- attention -------------------------------------------------------------------------------------------


def _fusable_rmsnorm(norm: Optional[nn.Module], width: int) -> bool:
    """``torch.nn.RMSNorm`` over the whole inner dim with an explicit eps: the
    "torch" rounding of the ops (docs/formulas.md, behaviour B)."""
    return (type(norm) is nn.RMSNorm and tuple(norm.normalized_shape) == (width,) and norm.eps is not None
            and not weights_managed_by_hooks(norm))


def _per_channel_table(rotary_emb, x: Tensor) -> bool:
    """Interleaved tables the ops read: float32 ``[B or 1, S, D]`` for ``x`` of ``[B, S, D]``."""
    cos, sin = rotary_emb
    return (cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape and cos.dim() == 3
            and cos.shape[0] in (1, x.shape[0]) and cos.shape[1:] == x.shape[1:])


def fusable(attn: LTX2Attention) -> bool:
    """Whether the q/k norms fit the ops; if not, the stock processor runs."""
    return (_fusable_rmsnorm(attn.norm_q, attn.inner_dim) and _fusable_rmsnorm(attn.norm_k, attn.inner_kv_dim)
            and attn.rope_type in ROPE_TYPES)


def _rope(kernel, x: Tensor, rotary_emb, rope_type: str) -> Tensor:
    if rope_type == "interleaved" and _per_channel_table(rotary_emb, x):
        return kernel.apply_rotary_emb(x, *rotary_emb)
    if rope_type == "interleaved":  # tables of another dtype or layout: the stock rotation
        return apply_interleaved_rotary_emb(x, rotary_emb)
    return apply_split_rotary_emb(x, rotary_emb)


def ltx2_qk(attn: LTX2Attention, query: Tensor, key: Tensor, query_rotary_emb, key_rotary_emb, *, kernel,
            exact_mode: bool) -> Tuple[Tensor, Tensor]:
    """``norm_q``/``norm_k`` over the whole inner dim and, with tables, the
    attention's RoPE, on ``[B, S, D]`` q/k; returns ``[B, S, H, Dh]``.
    Self-attention with interleaved tables is one ``qk_rmsnorm_rope`` pass (the
    stock ``x * cos + rotated * sin`` in float32, one cast, is the op's
    interleaved rotation bit for bit); otherwise ``rmsnorm`` each, then the RoPE
    of each with its own table."""
    norm_q, norm_k = attn.norm_q, attn.norm_k
    if (query_rotary_emb is not None and key_rotary_emb is None and attn.rope_type == "interleaved"
            and query.shape == key.shape and norm_q.eps == norm_k.eps and _per_channel_table(query_rotary_emb, query)):
        cos, sin = query_rotary_emb
        query, key = kernel.qk_rmsnorm_rope(query, key, norm_q.weight, norm_k.weight, cos, sin, norm_q.eps,
                                            head_dim=None, rotation="interleaved", rounding="torch",
                                            exact_mode=exact_mode)
    else:
        query = kernel.rmsnorm(query, norm_q.weight, norm_q.eps, rounding="torch")
        key = kernel.rmsnorm(key, norm_k.weight, norm_k.eps, rounding="torch")
        if query_rotary_emb is not None:
            query = _rope(kernel, query, query_rotary_emb, attn.rope_type)
            key = _rope(kernel, key, key_rotary_emb if key_rotary_emb is not None else query_rotary_emb,
                        attn.rope_type)
    return query.unflatten(2, (attn.heads, -1)), key.unflatten(2, (attn.heads, -1))


def _fp8(kernel, linear: nn.Module) -> bool:
    """Whether ``linear`` is an FP8 projection (optimize(..., fp8=True)), which takes e4m3 rows."""
    fp8_linear = getattr(kernel, "Fp8Linear", None)
    return fp8_linear is not None and isinstance(linear, fp8_linear)


def ltx2_attention_forward(attn: LTX2Attention, hidden_states: Tensor, encoder_hidden_states: Optional[Tensor],
                           attention_mask: Optional[Tensor], query_rotary_emb, key_rotary_emb, *, kernel,
                           exact_mode: bool, attention, perturbed: bool = False, perturbation_mask=None,
                           all_perturbed=None, fp8_attention: bool = False) -> Tensor:
    """``LTX2AudioVideoAttnProcessor.__call__`` (``perturbed``:
    ``LTX2PerturbedAttnProcessor.__call__``) with the q/k norms and RoPE on the
    fused ops and the per-head gate on ``head_gate``; the projections (in the
    stock order), the attention call, the perturbation and the output
    projection as stock. ``fp8_attention`` (an unmasked self-attention): the
    attention on cuDNN's FP8 SDPA, its e4m3 output straight into an FP8
    ``to_out`` where no gate comes between."""
    batch_size, sequence_length, _ = rows_shape(hidden_states if encoder_hidden_states is None
                                                else encoder_hidden_states)
    if attention_mask is not None:
        attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
        attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
    fp8_attention = fp8_attention and encoder_hidden_states is None and attention_mask is None and not perturbed
    if encoder_hidden_states is None:
        encoder_hidden_states = hidden_states
    gate_logits = attn.to_gate_logits(hidden_states) if attn.to_gate_logits is not None else None

    if perturbed:
        value = attn.to_v(encoder_hidden_states)
        if all_perturbed is None:
            all_perturbed = torch.all(perturbation_mask == 0) if perturbation_mask is not None else False
    else:
        all_perturbed = False
    if all_perturbed:  # the values stand in for the attention
        hidden_states = value
    else:
        q_in, kv_in = hidden_states, encoder_hidden_states
        if (_fp8(kernel, attn.to_k) and _fp8(kernel, attn.to_v)  # FP8 projections: k and v share one quantisation
                and isinstance(encoder_hidden_states, Tensor)):  # (unless the norm wrote e4m3 rows)
            kv_in = kernel.quantize_fp8(encoder_hidden_states)
            if encoder_hidden_states is hidden_states and _fp8(kernel, attn.to_q):  # and q, in self-attention
                q_in = kv_in
        query = attn.to_q(q_in)
        key = attn.to_k(kv_in)
        if not perturbed:
            value = attn.to_v(kv_in)
        query, key = ltx2_qk(attn, query, key, query_rotary_emb, key_rotary_emb, kernel=kernel, exact_mode=exact_mode)
        value = value.unflatten(2, (attn.heads, -1))
        if fp8_attention:
            out, descale = fp8_self_attention(query, key, value)
            if gate_logits is None:
                return output_projection(kernel, attn, out.flatten(2, 3), descale, query.dtype)
            hidden_states = dequantize(out.flatten(2, 3), descale, query.dtype)  # for the gate
        else:
            hidden_states = attention(query, key, value, attention_mask)
            hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        if perturbed and perturbation_mask is not None:
            hidden_states = torch.lerp(value.flatten(2, 3), hidden_states, perturbation_mask)

    if gate_logits is not None:
        hidden_states = kernel.head_gate(hidden_states, gate_logits, scale=GATE_SCALE, exact_mode=exact_mode)
    return attn.to_out[1](attn.to_out[0](hidden_states))


# How each of a block's attentions runs under the plan context_parallel_plan gives an optimised model
# (parallel.py), which splits the video stream alone: "sequence" as diffusers runs it (q, k and v split;
# Ulysses or ring through dispatch_attention_fn); "local": every rank holds the whole key sequence (text, or
# the audio stream), so it attends here, with no exchange; "gather": the query is whole (audio) and the keys
# split (video), so k and v are gathered first, with torch's autograd all-gather: diffusers' unshard (funcol's
# all_gather_tensor) breaks the graph on a gather along dim 1 under torch 2.11 (dynamo skips _maybe_view_chunk_cat).
# Inference only: the whole streams are computed on every rank, so their gradients would be partial per rank
# (a2v, text) or repeated on every rank (v2a); with grads flowing these modes raise.
CP_MODES = {"attn1": "sequence", "attn2": "local", "audio_attn1": "local", "audio_attn2": "local",
            "audio_to_video_attn": "local", "video_to_audio_attn": "gather"}


class ContextMode:
    """Mixin of the LTX-2 processors: ``cp_mode`` (a value of :data:`CP_MODES`, set by
    ``context_parallel_plan``) and the attention call it makes under context parallelism."""

    cp_mode: str = "sequence"

    def cp_attention(self):
        if self.cp_mode == "sequence" or self._parallel_config is None:
            return self.attention

        def whole(query, key, value, attn_mask):
            if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
                raise RuntimeError(
                    f"ltx_kernels_diffusers: an optimised LTX-2 under context_parallel_plan is for inference: this "
                    f"attention ({self.cp_mode}) keeps text and audio whole on every rank, which would give wrong "
                    "gradients. Run it under torch.no_grad() (diffusers 0.42.1's Ulysses backward fails on LTX-2's "
                    "cross-attentions for the stock model too).")
            if self.cp_mode == "gather":
                group = self._parallel_config.context_parallel_config._flattened_mesh.get_group()
                key, value = (funcol.all_gather_tensor_autograd(t.contiguous(), 1, group) for t in (key, value))
            return self.attention(query, key, value, attn_mask, parallel_config=None)

        return whole


class FusedLTX2AttnProcessor(ContextMode, DispatchedAttention, LTX2AudioVideoAttnProcessor):
    """``LTX2AudioVideoAttnProcessor`` on the fused ops (:func:`ltx2_attention_forward`);
    the stock processor's code where a q/k norm does not fit (:func:`fusable`)
    ``set_attention_backend`` reaches it, as it does the stock one."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, query_rotary_emb=None,
                 key_rotary_emb=None):
        if not fusable(attn):
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
                                    key_rotary_emb)
        return ltx2_attention_forward(attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
                                      key_rotary_emb, kernel=self.kernel, exact_mode=self.exact_mode,
                                      attention=self.cp_attention(), fp8_attention=self.runs_fp8_attention)

    def __deepcopy__(self, memo):
        return copy.copy(self)  # shares the kernel


class FusedLTX2PerturbedAttnProcessor(ContextMode, DispatchedAttention, LTX2PerturbedAttnProcessor):
    """``LTX2PerturbedAttnProcessor`` (``perturbed_attn`` models: spatio-temporal
    guidance) on the fused ops, the perturbation as stock."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, query_rotary_emb=None,
                 key_rotary_emb=None, perturbation_mask=None, all_perturbed=None):
        if not fusable(attn):
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
                                    key_rotary_emb, perturbation_mask, all_perturbed)
        return ltx2_attention_forward(attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
                                      key_rotary_emb, kernel=self.kernel, exact_mode=self.exact_mode,
                                      attention=self.cp_attention(), perturbed=True,
                                      perturbation_mask=perturbation_mask, all_perturbed=all_perturbed)

    def __deepcopy__(self, memo):
        return copy.copy(self)


FUSED_PROCESSORS = {LTX2AudioVideoAttnProcessor: FusedLTX2AttnProcessor,
                    LTX2PerturbedAttnProcessor: FusedLTX2PerturbedAttnProcessor}


# --- check, apply, restore ---------------------------------------------------------------------------------


@dataclass
class LTX2Plan:
    """The modules of one LTX-2 transformer that apply rewires."""

    transformer: LTX2VideoTransformer3DModel
    blocks: List[LTX2VideoTransformerBlock] = field(default_factory=list)
    gelus: List[GELU] = field(default_factory=list)
    attentions: List[LTX2Attention] = field(default_factory=list)

    @property
    def gated(self) -> bool:
        return any(attn.to_gate_logits is not None for attn in self.attentions)


NORMS = ("norm1", "audio_norm1", "norm2", "audio_norm2", "audio_to_video_norm", "video_to_audio_norm", "norm3",
         "audio_norm3")
ATTENTIONS = ("attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")
TABLES = (("scale_shift_table", "video_cross_attn_adaln"), ("audio_scale_shift_table", "audio_cross_attn_adaln"))
CA_TABLES = ("video_a2v_cross_attn_scale_shift_table", "audio_a2v_cross_attn_scale_shift_table")


def attention_problems(attn: nn.Module, where: str, fuse_attention: bool) -> List[str]:
    if not plain(attn, LTX2Attention):
        return [f"{where} is {type(attn).__qualname__}, not diffusers' LTX2Attention (or a subclass with its own "
                "forward)"]
    problems = []
    if attn.rope_type not in ROPE_TYPES:
        problems.append(f"{where}.rope_type is {attn.rope_type!r}, not one of {', '.join(map(repr, ROPE_TYPES))}")
    if fuse_attention and type(attn.processor) not in STOCK_PROCESSORS:
        problems.append(f"{where} uses the attention processor {type(attn.processor).__qualname__}, not diffusers' "
                        "LTX2AudioVideoAttnProcessor or LTX2PerturbedAttnProcessor, and optimize would replace it; "
                        "set the stock one back (attn.set_processor), or pass fuse_attention=False to keep it")
    return problems


def block_problems(block: nn.Module, where: str, fuse_attention: bool) -> List[str]:
    if not plain(block, LTX2VideoTransformerBlock):
        return [f"{where} is {type(block).__qualname__}, not diffusers' LTX2VideoTransformerBlock (or a subclass "
                "with its own forward)"]
    problems = []
    for name in NORMS:
        norm = getattr(block, name, None)
        if not plain(norm, RMSNorm):
            problems.append(f"{where}.{name} is {type(norm).__qualname__}, not diffusers' RMSNorm")
        elif norm.weight is not None or norm.bias is not None:
            problems.append(f"{where}.{name} is an RMSNorm with parameters; LTX-2's block norms have none "
                            "(norm_elementwise_affine=False)")
    for name, adaln in TABLES:
        table, rows = getattr(block, name, None), 9 if getattr(block, adaln, False) else 6
        if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[0] != rows:
            problems.append(f"{where}.{name} is not the [{rows}, hidden] modulation table")
    for name in CA_TABLES:
        table = getattr(block, name, None)
        if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[0] != 5:
            problems.append(f"{where}.{name} is not the [5, hidden] a2v/v2a modulation table")
    for name in ATTENTIONS:
        problems += attention_problems(getattr(block, name, None), f"{where}.{name}", fuse_attention)
    return problems


def model_problems(model: nn.Module, fuse_attention: bool) -> List[str]:
    problems = transformer_problems(model, LTX2VideoTransformer3DModel, "transformer_blocks",
                                    functools.partial(block_problems, fuse_attention=fuse_attention))
    return problems


def check(transformer: nn.Module, options: Optional[Options]) -> LTX2Plan:
    """The modules to rewire, or UnsupportedModelError listing every problem."""
    fuse_attention = options is None or options.fuse_attention
    problems = model_problems(transformer, fuse_attention)
    if not problems and options is not None and options.fp8:
        problems = fp8_problems(transformer, transformer.transformer_blocks, FP8_LINEARS, ff="ff")
    if options is not None:  # an option's problem first: the list shown is cut at 12
        problems = option_problems(options) + problems
    refuse_problems(problems)
    plan = LTX2Plan(transformer=transformer)
    for block in transformer.transformer_blocks:
        plan.blocks.append(block)
        plan.gelus += [gelu for gelu in (tanh_gelu_of(block.ff), tanh_gelu_of(block.audio_ff)) if gelu is not None]
        if fuse_attention:
            plan.attentions += [getattr(block, name) for name in ATTENTIONS]
    return plan


def check_kernel(kernel) -> None:
    check_kernel_functions(kernel, KERNEL_FUNCTIONS)


def apply(plan: LTX2Plan, kernel, options: Options) -> HookedState:
    """Hooks on the blocks and feed-forward GELUs; the fused attention processors.
    A model with gated attention needs ``head_gate`` (TypeError before any change)."""
    if plan.gated:
        check_kernel_functions(kernel, GATED_KERNEL_FUNCTIONS)
    if options.fp8:
        check_kernel_functions(kernel, FP8_KERNEL_FUNCTIONS, {"layers": ("feed_forward_fp8",)})
    state = HookedState(kernel=kernel, options=options)
    exact = options.exact_mode
    epilogue = (not exact) if options.gelu_epilogue is None else bool(options.gelu_epilogue)
    # with fp8 the block runs the video feed-forward itself (its GELU writes e4m3 rows)
    video_gelus = {id(block.ff.net[0]) for block in plan.blocks} if options.fp8 else set()
    gelus = [gelu for gelu in plan.gelus if id(gelu) not in video_gelus]
    seams = [(plan.blocks, "ltx2.block", functools.partial(block_forward, kernel=kernel, exact_mode=exact,
                                                            fp8=options.fp8)),
             (gelus, "ltx2.gelu", functools.partial(gelu_forward, kernel=kernel, epilogue=epilogue))]
    for modules, seam, fused in seams:
        state.hooks += [install(module, seam, fused) for module in modules]
    # FP8 attention for the video self-attention only: the audio stream's 126 tokens and the cross-attentions'
    # short key sequences would gain nothing
    video_self = {id(block.attn1) for block in plan.blocks} if options.fp8_attention else set()
    for attn in plan.attentions:
        fused = FUSED_PROCESSORS[type(attn.processor)](kernel, exact, options.prefer_cudnn_attention,
                                                       id(attn) in video_self)
        install_processor(state, attn, fused)
    if options.fp8:
        state.linears = swap_fp8(plan.blocks, FP8_LINEARS, kernel, options.fp8_fast_accum, options.fp8_keep_bf16)
    invalidate_registry_caches(plan.transformer)
    return state


def restore(transformer: nn.Module, state: HookedState) -> None:
    """Undo ``apply`` (``base.restore_hooked``)."""
    restore_hooked(transformer, state)


__all__ = ["NAME", "CLASSES", "Options", "check", "check_kernel", "apply", "restore", "FusedLTX2AttnProcessor",
           "FusedLTX2PerturbedAttnProcessor", "block_forward", "ltx2_qk", "ltx2_attention_forward",
           "residual_then_norms"]
