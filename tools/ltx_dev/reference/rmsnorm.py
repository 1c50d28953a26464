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


def rms_norm_backward_f64(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, eps: float,
                          rounding: str = "torch") -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dx, dw) of y = x * r * w in float64, r = rsqrt(mean(x^2) + eps), for the upstream grad
    `grad_out`: with n = x * r and g = dy * w, dx = r * (g - n * mean(g * n)) and dw = sum over
    rows of dy * n. With rounding "diffusers" and a half weight of x's dtype, dw multiplies by
    n rounded to x's dtype (the value the forward multiplied by w); dx treats roundings as the
    identity, as eager autograd does for casts. dw is None without weight."""
    x64, dy = x.double(), grad_out.double()
    r = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    n = x64 * r
    g = dy * weight.double() if weight is not None else dy
    dx = r * (g - n * (g * n).mean(-1, keepdim=True))
    if weight is None:
        return dx, None
    n_w = n
    if rounding == "diffusers" and weight.dtype == x.dtype and x.dtype in (torch.float16, torch.bfloat16):
        n_w = n.to(x.dtype).double()
    return dx, (dy * n_w).reshape(-1, x.shape[-1]).sum(0)
