"""Reference implementations the kernels are checked against: a float64
formula, and the exact eager PyTorch code of the models (their roundings)."""

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


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in units in the last place for same-dtype floats."""
    assert a.dtype == b.dtype
    int_t = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[a.dtype]

    def ordered(t):
        i = t.contiguous().view(int_t).long()
        sign_bit = 1 << (torch.finfo(t.dtype).bits - 1)
        return torch.where(i < 0, -(i + sign_bit), i)

    return (ordered(a) - ordered(b)).abs()
