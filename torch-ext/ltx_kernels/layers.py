"""Stateless layers for ``kernels.kernelize``: each replaces the forward of a
module class and reads its state (weight, eps, submodules) from the module it
replaces.

The LTX-Video layers (``LTXVideoTransformerBlock``, ``LTXAttention``, ``GELU``
and their fast variants) call the module-level functions ``ltx_block_forward``,
``ltx_attention_forward`` and ``gelu_forward``. Those are written once against
the op API of this package and take it as ``kernel=``: the layers pass this
package's ops, the diffusers integration (``ltx_kernels_diffusers``) passes the
kernel it loaded, and tests may pass a pure-PyTorch reference of the same API.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ._alloc import new_output
from ._autograd import records_autograd
from ._device import check_device, device_refusal
from ._ops import ops
from .activation import gelu_tanh, linear_gelu
from .fp8 import Fp8Linear, adaln_rmsnorm_fp8, gated_residual_fp8, gated_residual_rmsnorm_fp8, gelu_tanh_fp8
from .fused_norm import adaln_rmsnorm, gated_residual, gated_residual_rmsnorm
from .rmsnorm import rmsnorm
from .qk_rmsnorm_rope import qk_rmsnorm_rope
from .rope import apply_rotary_emb, ltx_rope_cos_sin
from .vae import PixelNorm

Tensor = torch.Tensor


class RMSNorm(nn.Module):
    """Forward of ``diffusers.models.normalization.RMSNorm`` (rounding "A").

    Handles ``elementwise_affine=False`` (``weight`` is None, as in LTX-Video's
    block norms) and an optional ``bias``.
    """

    weight: Optional[torch.Tensor]
    eps: float
    can_torch_compile: bool = True
    has_backward: bool = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = getattr(self, "weight", None)
        out = rmsnorm(hidden_states, weight, self.eps, rounding="diffusers")
        bias = getattr(self, "bias", None)
        if bias is not None:
            out = out + bias
        return out


class TorchRMSNorm(nn.Module):
    """Forward of ``torch.nn.RMSNorm`` over one trailing dim (rounding "B").

    ``eps=None`` means ``torch.finfo(x.dtype).eps``, as in torch. Modules that
    normalise over several trailing dims fall back to ``F.rms_norm``.
    """

    weight: Optional[torch.Tensor]
    eps: Optional[float]
    normalized_shape: tuple
    can_torch_compile: bool = True
    has_backward: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        weight = getattr(self, "weight", None)
        if len(self.normalized_shape) != 1:
            return torch.nn.functional.rms_norm(x, self.normalized_shape, weight, eps)
        return rmsnorm(x, weight, eps, rounding="torch")


class MochiModulatedRMSNorm(nn.Module):
    """Forward of diffusers' ``MochiModulatedRMSNorm``:
    ``T(x_f32 * rsqrt(mean(x_f32 ** 2) + eps) * scale)``, float32 math, one
    rounding; ``scale`` is the whole multiplier (``1 + scale_mlp`` or
    ``tanh(gate)``), broadcast from ``[batch, 1, hidden]`` or ``[batch, hidden]``.
    """

    eps: float
    can_torch_compile: bool = True
    has_backward: bool = False

    def forward(self, hidden_states: torch.Tensor, scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        if scale is None:
            return rmsnorm(hidden_states, None, self.eps)
        if records_autograd(hidden_states, scale):  # the differentiable path (fused_norm.py)
            check_device("modulated_rmsnorm", hidden_states)
            try:
                return ops.modulated_rmsnorm_fwd(hidden_states, scale, float(self.eps), 0.0)
            except RuntimeError as error:
                raise device_refusal(error) from None
        out = new_output(hidden_states)
        check_device("modulated_rmsnorm", hidden_states)
        try:
            ops.modulated_rmsnorm(out, hidden_states, scale, float(self.eps), 0.0)
        except RuntimeError as error:
            raise device_refusal(error) from None
        return out


# --- LTX-Video (diffusers' transformer_ltx.py) on the fused ops ---------------------------------


class PackageOps:
    """This package's ops under the names the fused forwards below call (a
    class of static methods, so torch.compile resolves them at trace time)."""

    rmsnorm = staticmethod(rmsnorm)
    adaln_rmsnorm = staticmethod(adaln_rmsnorm)
    gated_residual = staticmethod(gated_residual)
    gated_residual_rmsnorm = staticmethod(gated_residual_rmsnorm)
    gelu_tanh = staticmethod(gelu_tanh)
    linear_gelu = staticmethod(linear_gelu)
    apply_rotary_emb = staticmethod(apply_rotary_emb)
    qk_rmsnorm_rope = staticmethod(qk_rmsnorm_rope)
    ltx_rope_cos_sin = staticmethod(ltx_rope_cos_sin)
    adaln_rmsnorm_fp8 = staticmethod(adaln_rmsnorm_fp8)
    gated_residual_rmsnorm_fp8 = staticmethod(gated_residual_rmsnorm_fp8)
    gated_residual_fp8 = staticmethod(gated_residual_fp8)
    gelu_tanh_fp8 = staticmethod(gelu_tanh_fp8)
    Fp8Linear = Fp8Linear


def fp8_input(kernel, module: nn.Module) -> bool:
    """Whether ``module`` (a linear) is the kernel's ``Fp8Linear``, which takes :class:`Fp8Rows` from
    its producer."""
    return isinstance(module, kernel.Fp8Linear)


def rows_shape(x) -> torch.Size:
    """The logical shape of a tensor or of :class:`Fp8Rows` (a named tuple)."""
    return x[0].shape if isinstance(x, tuple) else x.shape


def norm_rounding(norm: nn.Module) -> str:
    """The rounding of an RMSNorm module: ``torch.nn.RMSNorm`` computes in float32
    and rounds once ("torch"); diffusers' ``RMSNorm`` rounds the normalised value
    before the weight ("diffusers")."""
    return "torch" if isinstance(norm, nn.RMSNorm) else "diffusers"


def norm_eps(norm: nn.Module, x: Tensor) -> float:
    """The module's eps; ``torch.nn.RMSNorm(eps=None)`` means the dtype's eps."""
    eps = norm.eps
    return torch.finfo(x.dtype).eps if eps is None else eps


def has_weight_hooks(module: nn.Module) -> bool:
    """Whether offload or casting hooks manage ``module``'s parameters
    (accelerate's ``_hf_hook``: sequential CPU offload; diffusers'
    ``_diffusers_hook``: leaf-level group offloading, layerwise casting). Such a
    module's weights are only in place while it runs, so the fused forwards call
    it rather than read its weights."""
    registry = getattr(module, "_diffusers_hook", None)
    return hasattr(module, "_hf_hook") or (registry is not None and bool(registry.hooks))


def ltx_modulation(block: nn.Module, temb: Tensor, batch_size: int):
    """The six modulation tensors of an LTX block, ``[B, 1 or S, D]`` views in
    the order shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp
    (``scale_shift_table + temb``, as the block computes them)."""
    table = block.scale_shift_table
    ada = table[None, None].to(temb.device) + temb.reshape(batch_size, temb.size(1), table.shape[0], -1)
    # Views of an as_strided alias: torch.compile then computes `ada` once. Of `ada` itself, inductor
    # recomputes it for each of our (opaque) ops that reads a piece, one launch each.
    return ada.as_strided(ada.shape, ada.stride()).unbind(dim=2)


def modulated_norm(kernel, norm: nn.Module, x: Tensor, scale: Tensor, shift: Tensor, exact_mode: bool,
                   fp8: bool = False):
    """``norm(x) * (1 + scale) + shift`` in one pass (``adaln_rmsnorm``); with ``fp8`` as
    :class:`Fp8Rows` (``adaln_rmsnorm_fp8``) for consumers that take them."""
    if has_weight_hooks(norm):
        return norm(x) * (1 + scale) + shift
    if fp8:
        return kernel.adaln_rmsnorm_fp8(x, getattr(norm, "weight", None), scale, shift, norm_eps(norm, x))
    return kernel.adaln_rmsnorm(x, getattr(norm, "weight", None), scale, shift, norm_eps(norm, x),
                                exact_mode=exact_mode)


def residual_modulated_norm(kernel, x: Tensor, y: Tensor, gate: Optional[Tensor], norm: nn.Module, scale: Tensor,
                            shift: Tensor, exact_mode: bool, fp8: bool = False):
    """``x_new = x + y * gate`` (``x + y`` without gate) and
    ``norm(x_new) * (1 + scale) + shift`` in one pass (``gated_residual_rmsnorm``);
    returns ``(normalised, x_new)``, the normalised value as :class:`Fp8Rows` with ``fp8``."""
    if has_weight_hooks(norm):
        x = kernel.gated_residual(x, y, gate, exact_mode=exact_mode)
        return norm(x) * (1 + scale) + shift, x
    if fp8:
        return kernel.gated_residual_rmsnorm_fp8(x, y, gate, scale, shift, norm_eps(norm, x),
                                                 weight=getattr(norm, "weight", None))
    return kernel.gated_residual_rmsnorm(x, y, gate, scale, shift, norm_eps(norm, x),
                                         weight=getattr(norm, "weight", None), exact_mode=exact_mode)


def ltx_block_forward(block: nn.Module, hidden_states: Tensor, encoder_hidden_states: Tensor, temb: Tensor,
                      image_rotary_emb=None, encoder_attention_mask: Optional[Tensor] = None, *,
                      kernel=PackageOps, exact_mode: bool = True, norm_hidden_states: Optional[Tensor] = None,
                      next_block: Optional[nn.Module] = None, text_key_value: Optional[Tuple[Tensor, Tensor]] = None):
    """``LTXVideoTransformerBlock.forward`` with its elementwise seams fused:

    - ``norm1`` + AdaLN modulation in one pass (``adaln_rmsnorm``), unless the
      previous block already produced it (``norm_hidden_states``);
    - the self-attention gated residual (``gated_residual``; cross-attention,
      which reads the residual stream unnormalised, comes next);
    - the cross-attention residual + ``norm2`` + modulation (``gated_residual_rmsnorm``);
    - the feed-forward gated residual: alone (``gated_residual``) for the last
      block, fused with the next block's ``norm1`` + modulation when
      ``next_block`` is given, in which case it returns
      ``(hidden_states, next_norm_hidden_states)`` to pass on.

    ``text_key_value``: cross-attention's key and value, computed by the caller;
    passed to ``attn2``'s processor as ``key_value`` (which it must take).

    Attention and feed-forward go through the block's submodules, so their own
    (kernelized or patched) forwards apply. ``exact_mode`` as in the ops.
    """
    batch_size = hidden_states.size(0)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = ltx_modulation(block, temb, batch_size)
    # FP8 (optimize(..., fp8=True)): the norms feeding Fp8Linear projections write e4m3 rows directly.
    attn_fp8, ff_fp8 = fp8_input(kernel, block.attn1.to_q), fp8_input(kernel, block.ff.net[0].proj)
    if norm_hidden_states is None:
        norm_hidden_states = modulated_norm(kernel, block.norm1, hidden_states, scale_msa, shift_msa, exact_mode,
                                            attn_fp8)
    attn_output = block.attn1(hidden_states=norm_hidden_states, encoder_hidden_states=None,
                              image_rotary_emb=image_rotary_emb)
    if fp8_input(kernel, block.attn2.to_q):  # the cross-attention query reads the new residual stream: in e4m3 too
        query_rows, hidden_states = kernel.gated_residual_fp8(hidden_states, attn_output, gate_msa)
    else:
        hidden_states = query_rows = kernel.gated_residual(hidden_states, attn_output, gate_msa, exact_mode=exact_mode)
    extra = {} if text_key_value is None else {"key_value": text_key_value}
    attn_output = block.attn2(query_rows, encoder_hidden_states=encoder_hidden_states, image_rotary_emb=None,
                              attention_mask=encoder_attention_mask, **extra)
    norm_hidden_states, hidden_states = residual_modulated_norm(kernel, hidden_states, attn_output, None, block.norm2,
                                                                scale_mlp, shift_mlp, exact_mode, ff_fp8)
    ff_output = feed_forward_fp8(kernel, block.ff, norm_hidden_states) if ff_fp8 else block.ff(norm_hidden_states)
    if next_block is None:
        return kernel.gated_residual(hidden_states, ff_output, gate_mlp, exact_mode=exact_mode)
    next_shift_msa, next_scale_msa = ltx_modulation(next_block, temb, batch_size)[:2]
    next_norm_hidden_states, hidden_states = residual_modulated_norm(
        kernel, hidden_states, ff_output, gate_mlp, next_block.norm1, next_scale_msa, next_shift_msa, exact_mode,
        fp8_input(kernel, next_block.attn1.to_q))
    return hidden_states, next_norm_hidden_states


def feed_forward_fp8(kernel, ff: nn.Module, x) -> Tensor:
    """diffusers' ``FeedForward`` (GELU-tanh, dropout, down-projection) with Fp8Linear projections in
    eval mode: the up-projection, GELU-tanh writing e4m3 rows (``gelu_tanh_fp8``), the down-projection."""
    up, down = ff.net[0].proj, ff.net[2]
    return down(kernel.gelu_tanh_fp8(up(x)))


def ltx_qk_rmsnorm_rope(attn: nn.Module, query: Tensor, key: Tensor, image_rotary_emb=None, *, kernel=PackageOps,
                     exact_mode: bool = True):
    """``norm_q``/``norm_k`` (RMSNorm over the whole inner dim) and, with
    ``image_rotary_emb = (cos, sin)``, LTX's interleaved RoPE: one fused pass
    over q and k (``qk_rmsnorm_rope``) when both norms round alike and share
    eps; otherwise one ``rmsnorm`` (and ``apply_rotary_emb``) each, as for
    cross-attention, whose keys are text tokens."""
    norm_q, norm_k = attn.norm_q, attn.norm_k
    if has_weight_hooks(norm_q) or has_weight_hooks(norm_k):
        query, key = norm_q(query), norm_k(key)
    else:
        q_weight, k_weight = getattr(norm_q, "weight", None), getattr(norm_k, "weight", None)
        rounding, eps = norm_rounding(norm_q), norm_eps(norm_q, query)
        k_rounding, k_eps = norm_rounding(norm_k), norm_eps(norm_k, key)
        fused = getattr(kernel, "qk_rmsnorm_rope", None)
        if (image_rotary_emb is not None and fused is not None and rounding == k_rounding and eps == k_eps
                and query.shape == key.shape):
            cos, sin = image_rotary_emb
            return fused(query, key, q_weight, k_weight, cos, sin, eps, rounding=rounding, exact_mode=exact_mode)
        query = kernel.rmsnorm(query, q_weight, eps, rounding=rounding)
        key = kernel.rmsnorm(key, k_weight, k_eps, rounding=k_rounding)
    if image_rotary_emb is not None:
        cos, sin = image_rotary_emb
        query, key = kernel.apply_rotary_emb(query, cos, sin), kernel.apply_rotary_emb(key, cos, sin)
    return query, key


def sdpa_bshd(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor]) -> Tensor:
    """Attention on ``[B, S, H, Dh]`` q/k/v as diffusers' native backend runs it
    (``F.scaled_dot_product_attention`` on permuted views)."""
    query, key, value = (t.permute(0, 2, 1, 3) for t in (query, key, value))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=0.0, is_causal=False)
    return out.permute(0, 2, 1, 3)


def joined_qkv(attn: nn.Module) -> Optional[nn.Module]:
    """``attn.to_qkv_fp8`` (``Fp8Linear.concat`` of ``to_q``, ``to_k``, ``to_v``, set by the integration's
    ``fp8_fuse_qkv``) while those three are still its parts and carry no forward hooks; else None, and the
    three run on their own (a projection replaced or hooked since, by LoRA say, is then not skipped)."""
    qkv = getattr(attn, "to_qkv_fp8", None)
    if qkv is None:
        return None
    parts = (attn.to_q, attn.to_k, attn.to_v)
    if any(m is not p or m._forward_pre_hooks or m._forward_hooks for m, p in zip(parts, qkv.parts)):
        return None
    return qkv


def ltx_attention_forward(attn: nn.Module, hidden_states: Tensor, encoder_hidden_states: Optional[Tensor] = None,
                          attention_mask: Optional[Tensor] = None, image_rotary_emb=None, *, kernel=PackageOps,
                          exact_mode: bool = True, attention=None,
                          key_value: Optional[Tuple[Tensor, Tensor]] = None) -> Tensor:
    """``LTXVideoAttnProcessor`` with q/k norm + RoPE fused (:func:`ltx_qk_rmsnorm_rope`).

    ``attention(q, k, v, mask)`` on ``[B, S, H, Dh]`` tensors runs the attention
    itself; the default is :func:`sdpa_bshd` (the integration passes diffusers'
    ``dispatch_attention_fn`` so attention backends still apply). ``key_value``:
    cross-attention's ``to_k`` and ``to_v`` outputs, computed by the caller
    (the integration runs every block's as one GEMM).
    """
    batch_size, sequence_length, _ = rows_shape(hidden_states if encoder_hidden_states is None
                                                else encoder_hidden_states)
    if attention_mask is not None:
        attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
        attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
    qkv = joined_qkv(attn) if encoder_hidden_states is None else None
    if qkv is not None:  # one GEMM; q, k and v are column views of its output (the kernels take strided rows)
        query, key, value = qkv(hidden_states).split([m.out_features for m in qkv.parts], dim=-1)
    elif key_value is not None:
        query = attn.to_q(hidden_states)
        key, value = key_value
    else:
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        query = attn.to_q(hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
    query, key = ltx_qk_rmsnorm_rope(attn, query, key, image_rotary_emb, kernel=kernel, exact_mode=exact_mode)
    query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
    if attention is None:  # an `is None` test: dynamo cannot take the truth value of a bound method
        attention = sdpa_bshd
    hidden_states = attention(query, key, value, attention_mask)
    hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
    hidden_states = attn.to_out[0](hidden_states)
    return attn.to_out[1](hidden_states)


def gelu_forward(module: nn.Module, hidden_states: Tensor, *, kernel=PackageOps, epilogue: bool = False) -> Tensor:
    """diffusers' ``GELU`` (``proj`` then GELU): with ``approximate="tanh"`` the
    GELU-tanh kernel after the projection (bitwise ``F.gelu``), or with
    ``epilogue=True`` one cuBLASLt GEMM with the GELU epilogue (``linear_gelu``,
    one rounding) when ``proj`` is a plain ``nn.Linear`` with a bias and no
    offload/casting hooks (a LoRA- or quantisation-wrapped or hooked projection
    keeps its own forward)."""
    proj = module.proj
    if module.approximate != "tanh":
        return F.gelu(proj(hidden_states), approximate=module.approximate)
    if epilogue and type(proj) is nn.Linear and proj.bias is not None and not has_weight_hooks(proj):
        return kernel.linear_gelu(hidden_states, proj.weight, proj.bias)
    return kernel.gelu_tanh(proj(hidden_states))


class LTXVideoTransformerBlock(nn.Module):
    """Forward of diffusers' ``LTXVideoTransformerBlock`` on the fused ops with
    the model's eager roundings (``exact_mode=True``); see :func:`ltx_block_forward`.
    Expects ``norm1``/``norm2`` to be diffusers' ``RMSNorm`` (with or without
    weight, no bias); ``ltx_kernels_diffusers.mark_ltx_layers`` checks that."""

    can_torch_compile: bool = True
    has_backward: bool = False

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                encoder_attention_mask=None):
        return ltx_block_forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                 encoder_attention_mask, exact_mode=True)


class LTXVideoTransformerBlockFast(LTXVideoTransformerBlock):
    """:class:`LTXVideoTransformerBlock` with each fused op rounding once (``exact_mode=False``)."""

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                encoder_attention_mask=None):
        return ltx_block_forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                 encoder_attention_mask, exact_mode=False)


class LTXAttention(nn.Module):
    """Forward of diffusers' ``LTXAttention`` (its ``LTXVideoAttnProcessor``) with
    q/k RMSNorm + RoPE in one pass, eager roundings; attention is
    ``F.scaled_dot_product_attention`` (diffusers' native backend; a backend set
    with ``set_attention_backend`` is not consulted). Extra keyword arguments
    are ignored, as the processor ignores them."""

    can_torch_compile: bool = True
    has_backward: bool = False

    def forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None,
                **kwargs):
        return ltx_attention_forward(self, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb,
                                     exact_mode=True)


class LTXAttentionFast(LTXAttention):
    """:class:`LTXAttention` keeping the normalised q/k in float32 through the rotation (``exact_mode=False``)."""

    def forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None,
                **kwargs):
        return ltx_attention_forward(self, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb,
                                     exact_mode=False)


class GELU(nn.Module):
    """Forward of diffusers' ``GELU`` activation module (``proj``, then GELU):
    the GELU-tanh kernel after the projection, bitwise ``F.gelu(approximate="tanh")``."""

    can_torch_compile: bool = True
    has_backward: bool = False

    def forward(self, hidden_states):
        return gelu_forward(self, hidden_states, epilogue=False)


class LinearGELU(GELU):
    """:class:`GELU` with the projection and GELU-tanh in one cuBLASLt GEMM (GELU
    epilogue, one rounding: close to, not bitwise, the separate pair)."""

    def forward(self, hidden_states):
        return gelu_forward(self, hidden_states, epilogue=True)


__all__ = ["RMSNorm", "TorchRMSNorm", "MochiModulatedRMSNorm", "PixelNorm", "LTXVideoTransformerBlock",
           "LTXVideoTransformerBlockFast", "LTXAttention", "LTXAttentionFast", "GELU", "LinearGELU"]
