"""layernorm's references: the float64 formulas, and the models' eager chains
around their LayerNorms, written as the models write them (diffusers 0.42):

- Wan (transformer_wan.py, WanTransformerBlock.forward and the model's
  norm_out): ``(norm(h.float()) * (1 + scale) + shift).type_as(h)`` with a
  float32 ``scale``/``shift`` (``[B, 1, D]``, or ``[B, S, D]`` for Wan 2.2 TI2V),
  ``(h.float() + y * gate).type_as(h)``, ``norm2(h.float()).type_as(h)`` and the
  plain ``h + y``;
- Flux / HunyuanVideo (AdaLayerNormZero, AdaLayerNormContinuous, the blocks'
  ``norm2``): ``norm(h) * (1 + scale[:, None]) + shift[:, None]`` in the
  activations' dtype, after ``h = h + gate.unsqueeze(1) * y``.

`norm` is any callable normalising the last dim (diffusers' FP32LayerNorm or
torch.nn.LayerNorm in the tests, `torch_layer_norm` here), so a test can run the
models' own modules in them."""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .fused_norm import per_batch

Tensor = torch.Tensor
Norm = Callable[[Tensor], Tensor]


def layer_norm_f64(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                   eps: float = 1e-6) -> Tensor:
    """The formula in float64: (x - mean) / sqrt(var + eps) * w + b, biased variance."""
    x64 = x.double()
    mean = x64.mean(-1, keepdim=True)
    var = (x64 - mean).pow(2).mean(-1, keepdim=True)
    y = (x64 - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.double()
    return y + bias.double() if bias is not None else y


def adaln_layer_norm_f64(x: Tensor, scale: Tensor, shift: Optional[Tensor], eps: float = 1e-6,
                         weight: Optional[Tensor] = None, bias: Optional[Tensor] = None) -> Tensor:
    """LN(x) * (1 + scale) + shift in float64, [B, D] modulation per batch."""
    scale, shift = per_batch(scale, x), per_batch(shift, x)
    y = layer_norm_f64(x, weight, bias, eps) * (1 + scale.double())
    return y + shift.double() if shift is not None else y


def torch_layer_norm(eps: float = 1e-6, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None) -> Norm:
    """torch's F.layer_norm over the last dim (what nn.LayerNorm and FP32LayerNorm call)."""
    return lambda h: F.layer_norm(h, (h.shape[-1],), weight, bias, eps)


def fp32_layer_norm(eps: float = 1e-6, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None) -> Norm:
    """diffusers' FP32LayerNorm.forward: float32 math (parameters upcast), back to the input dtype."""
    return lambda h: F.layer_norm(h.float(), (h.shape[-1],), weight.float() if weight is not None else None,
                                  bias.float() if bias is not None else None, eps).to(h.dtype)


def wan_modulated_norm(norm: Norm, h: Tensor, scale: Tensor, shift: Optional[Tensor]) -> Tensor:
    """WanTransformerBlock's norm1 / norm3 line (and the model's norm_out):
    `(self.norm1(hidden_states.float()) * (1 + scale_msa) + shift_msa).type_as(hidden_states)`."""
    scale, shift = per_batch(scale, h), per_batch(shift, h)
    n = norm(h.float()) * (1 + scale)
    return (n + shift if shift is not None else n).type_as(h)


def wan_norm2(norm: Norm, h: Tensor) -> Tensor:
    """WanTransformerBlock: `norm_hidden_states = self.norm2(hidden_states.float()).type_as(hidden_states)`."""
    return norm(h.float()).type_as(h)


def flux_modulated_norm(norm: Norm, h: Tensor, scale: Tensor, shift: Optional[Tensor]) -> Tensor:
    """AdaLayerNormZero / the Flux block's norm2: `norm(x) * (1 + scale[:, None]) + shift[:, None]`
    ([B, D] scale and shift; other forms broadcast as they are)."""
    scale, shift = per_batch(scale, h), per_batch(shift, h)
    n = norm(h) * (1 + scale)
    return n + shift if shift is not None else n


def flux_gated_residual(h: Tensor, y: Tensor, gate: Optional[Tensor]) -> Tensor:
    """FluxTransformerBlock: `hidden_states = hidden_states + gate_msa.unsqueeze(1) * attn_output`."""
    return h + per_batch(gate, h) * y if gate is not None else h + y
