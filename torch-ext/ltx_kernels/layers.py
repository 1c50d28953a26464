"""Stateless layers for ``kernels.kernelize``: each replaces the forward of a
module class and reads its state (weight, eps) from the module it replaces."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ._ops import ops
from .norm import rmsnorm
from .vae import PixelNorm


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
        out = torch.empty(hidden_states.shape, dtype=hidden_states.dtype, device=hidden_states.device)
        ops.modulated_rms_norm(out, hidden_states, scale, float(self.eps), 0.0)
        return out


__all__ = ["RMSNorm", "TorchRMSNorm", "MochiModulatedRMSNorm", "PixelNorm"]
