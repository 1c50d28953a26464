"""fused_norm's references: the models' eager chains (LTX's AdaLN and gated
residual, Wan's gated residual, Mochi's genmo and diffusers forms; model-ops.md
§1.3, §3) and their float64 formulas."""

from __future__ import annotations

import torch

from .rmsnorm import diffusers_rms_norm, rms_norm_f64


def per_batch(t: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """A [B, D] modulation tensor as [B, 1, D] for a 3-D x (how the models
    unsqueeze it); other shapes broadcast as they are."""
    return t.unsqueeze(1) if t is not None and t.dim() == 2 and x.dim() == 3 else t


def ltx_adaln_eager(x, weight, scale, shift, eps):
    """LTX's eager chain: diffusers RMSNorm, then `n * (1 + scale) + shift`."""
    scale, shift = per_batch(scale, x), per_batch(shift, x)
    n = diffusers_rms_norm(x, weight, eps)
    n = n * (1 + scale)
    return n + shift if shift is not None else n


def adaln_f64(x, weight, scale, shift, eps):
    scale, shift = per_batch(scale, x), per_batch(shift, x)
    n = rms_norm_f64(x, weight, eps) * (1 + scale.double())
    return n + shift.double() if shift is not None else n


def gated_residual_eager(x, y, gate):
    """`hidden_states + attn_output * gate_msa` (LTX), eager."""
    gate = per_batch(gate, x)
    return x + y * gate if gate is not None else x + y


def wan_gated_residual(x, y, gate):
    """Wan's `(x.float() + y * gate).type_as(x)` with a float32 gate."""
    return (x.float() + y * per_batch(gate, x)).type_as(x)


def genmo_residual_tanh_gated_rmsnorm(x, x_res, gate, eps=1e-6):
    """genmoai/mochi residual_tanh_gated_rmsnorm.py (model-ops.md §3.1)."""
    x_res = x_res.float()
    scale = torch.rsqrt(x_res.pow(2).mean(-1, keepdim=True) + eps)
    tanh_gate = torch.tanh(gate).unsqueeze(1)
    x_normed = x_res * scale * tanh_gate
    return x + x_normed.type_as(x)


def genmo_modulated_rmsnorm(x, scale, eps=1e-6):
    """genmoai/mochi mod_rmsnorm.py (model-ops.md §3.1)."""
    dtype = x.dtype
    x = x.float()
    x_normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return (x_normed * (1 + scale.unsqueeze(1).float())).to(dtype)


def diffusers_mochi_modulated_rmsnorm(x, scale, eps=1e-6):
    """diffusers MochiModulatedRMSNorm.forward: `scale` is the whole multiplier."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if scale is not None:
        h = h * scale
    return h.to(dtype)
