"""rmsnorm's references: the float64 formula, and the two roundings of the
models' eager code (diffusers' RMSNorm, behaviour "A"; torch.nn.RMSNorm,
behaviour "B")."""

from __future__ import annotations

import torch


def rms_norm_f64(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The formula in float64: x * rsqrt(mean(x^2) + eps) * w."""
    x64 = x.double()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight.double() if weight is not None else y


def diffusers_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """diffusers.models.normalization.RMSNorm.forward (0.42), behaviour "A"."""
    input_dtype = x.dtype
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(variance + eps)
    if weight is not None:
        if weight.dtype in (torch.float16, torch.bfloat16):
            h = h.to(weight.dtype)
        h = h * weight
    else:
        h = h.to(input_dtype)
    return h


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """torch.nn.RMSNorm's decomposition, behaviour "B": fp32 throughout, one cast."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)
