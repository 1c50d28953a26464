"""References for the VAE ops: the float64 formula, and the models' own eager
code (their roundings), as in rmsnorm.py."""

from __future__ import annotations

import torch

from .rmsnorm import diffusers_rms_norm


def pixel_norm_f64(x: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    """The formula in float64: x * rsqrt(mean_dim(x^2) + eps)."""
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(dim, keepdim=True) + eps)


def diffusers_pixel_norm(x: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    """The LTX VAE in diffusers: RMSNorm(C, eps, elementwise_affine=False)
    applied as norm(x.movedim(dim, -1)).movedim(-1, dim)."""
    return diffusers_rms_norm(x.movedim(dim, -1), None, eps).movedim(-1, dim)


def original_pixel_norm(x: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    """LTX-Video's PixelNorm.forward (ltx_video/models/autoencoders/pixel_norm.py),
    LTX-2's PerChannelRMSNorm: eager, in the input dtype."""
    return x / torch.sqrt(torch.mean(x**2, dim=dim, keepdim=True) + eps)


def original_pixel_norm_steps(x: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    """The roundings the kernel reproduces, written out: sq = T(x*x),
    m = T(sum(sq) / C) (fp32 sum), d = T(sqrt(T(m + eps))), y = T(x / d)."""
    t = x.dtype
    sq = (x.float() * x.float()).to(t).float()
    m = (sq.sum(dim, keepdim=True) / x.shape[dim]).to(t).float()
    d = torch.sqrt((m + eps).to(t).float()).to(t).float()
    return (x.float() / d).to(t)
