"""The fp8 family's references in PyTorch, on any device: e4m3 rows with one float32 scale per row
(amax / 448, as the kernels compute it), and the FP8 linear as the dequantised product in float32.
Modulation ``[B, D]`` is per sample, as the kernels read it.
The integration tests give them to the fused forwards (``ReferenceKernel``) to check the FP8 wiring on
the CPU; the GPU tests compare the kernels with the float64 formulas (``registry``)."""

from __future__ import annotations

import types
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .fused_norm import per_batch

Tensor = torch.Tensor
E4M3_MAX = 448.0


class Fp8Rows(NamedTuple):
    """e4m3 ``data`` [..., K] and its float32 ``scale`` [...]: value = data * scale."""

    data: Tensor
    scale: Tensor

    def dequantize(self) -> Tensor:  # float32
        return self.data.float() * self.scale.unsqueeze(-1)


def quantize_fp8(x: Tensor) -> Fp8Rows:
    """Each row of ``x`` as e4m3 with scale amax / 448 (scale 1 for a row of zeros)."""
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return Fp8Rows((xf / scale).to(torch.float8_e4m3fn), scale.squeeze(-1))


def gelu_tanh_fp8(x: Tensor) -> Fp8Rows:
    return quantize_fp8(F.gelu(x.float(), approximate="tanh"))


def gated_residual_fp8(x: Tensor, y: Tensor, gate: Optional[Tensor] = None):
    """``(rows of x_new, x_new)``, ``x_new = x + y * gate`` in float32, rounded once to x's dtype."""
    x_new = (x.float() + y.float() * (1.0 if gate is None else per_batch(gate, x).float())).to(x.dtype)
    return quantize_fp8(x_new), x_new


def adaln_rmsnorm_fp8(input: Tensor, weight: Optional[Tensor], scale: Tensor, shift: Optional[Tensor],
                      eps: float = 1e-6) -> Fp8Rows:
    """``RMSNorm(input) [* weight] * (1 + scale) [+ shift]`` in float32, as e4m3 rows."""
    x = input.float()
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    n = (n if weight is None else n * weight.float()) * (1 + per_batch(scale, input).float())
    return quantize_fp8(n if shift is None else n + per_batch(shift, input).float())


def gated_residual_rmsnorm_fp8(x: Tensor, y: Tensor, gate: Optional[Tensor], scale: Tensor, shift: Optional[Tensor],
                               eps: float = 1e-6, *, weight: Optional[Tensor] = None):
    """``(rows, x_new)``: the seam's residual, then its modulated RMSNorm as e4m3 rows."""
    _, x_new = gated_residual_fp8(x, y, gate)
    return adaln_rmsnorm_fp8(x_new, weight, scale, shift, eps), x_new


def adaln_layernorm_fp8(x: Tensor, scale: Optional[Tensor], shift: Optional[Tensor], eps: float = 1e-6, *,
                        weight: Optional[Tensor] = None, bias: Optional[Tensor] = None) -> Fp8Rows:
    """``(LayerNorm(x) [* weight] [+ bias]) * (1 + scale) [+ shift]`` in float32, as e4m3 rows."""
    n = F.layer_norm(x.float(), (x.shape[-1],), None if weight is None else weight.float(),
                     None if bias is None else bias.float(), eps)
    if scale is not None:
        n = n * (1 + per_batch(scale, x).float())
    return quantize_fp8(n if shift is None else n + per_batch(shift, x).float())


def gated_residual_layernorm_fp8(x: Tensor, y: Tensor, gate: Optional[Tensor], eps: float = 1e-6, *,
                                 weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                                 scale: Optional[Tensor] = None, shift: Optional[Tensor] = None):
    """``(rows, x_new)``: the seam's residual, then its (modulated) LayerNorm as e4m3 rows."""
    _, x_new = gated_residual_fp8(x, y, gate)
    return adaln_layernorm_fp8(x_new, scale, shift, eps, weight=weight, bias=bias), x_new


def linear_fp8(x, weight: Fp8Rows, bias: Optional[Tensor] = None, *, out_dtype: Optional[torch.dtype] = None,
               fast_accum: bool = False) -> Tensor:
    """``x @ W.T + bias`` from the dequantised operands in float32, one rounding to ``out_dtype``."""
    if isinstance(x, Tensor):
        out_dtype = out_dtype or x.dtype
        x = quantize_fp8(x)
    y = F.linear(x.dequantize(), weight.dequantize(), None if bias is None else bias.float())
    return y.to(out_dtype or torch.bfloat16)


class Fp8Linear(nn.Module):
    """``nn.Linear`` with its weight as e4m3 rows (per output channel); takes :class:`Fp8Rows` or a tensor."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.rows = quantize_fp8(linear.weight.detach())
        self.bias = linear.bias
        self.out_dtype = linear.weight.dtype
        self.out_features = linear.out_features

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, fast_accum: bool = False) -> "Fp8Linear":
        return cls(linear)  # one accumulation here: float32

    @classmethod
    def concat(cls, linears) -> "Fp8Linear":
        """One linear whose output is those of ``linears`` joined on the last dim (``parts``: them)."""
        joined = cls.__new__(cls)
        nn.Module.__init__(joined)
        joined.parts = tuple(linears)
        joined.rows = Fp8Rows(*(torch.cat(t) for t in zip(*(m.rows for m in joined.parts))))
        joined.bias = None if linears[0].bias is None else torch.cat([m.bias.detach() for m in joined.parts])
        joined.out_dtype, joined.out_features = linears[0].out_dtype, sum(m.out_features for m in joined.parts)
        return joined

    def forward(self, x):
        return linear_fp8(x, self.rows, self.bias, out_dtype=self.out_dtype)


def feed_forward_fp8(kernel, ff: nn.Module, x) -> Tensor:
    """diffusers' ``FeedForward`` with FP8 projections, as ``ltx_kernels.layers.feed_forward_fp8``."""
    return ff.net[2](kernel.gelu_tanh_fp8(ff.net[0].proj(x)))


# what a kernel's ``layers`` offers the integration's FP8 paths
layers = types.SimpleNamespace(feed_forward_fp8=feed_forward_fp8)
