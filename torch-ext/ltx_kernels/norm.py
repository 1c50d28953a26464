"""Normalisation ops."""

from __future__ import annotations

from typing import Optional

import torch

from ._ops import add_op_namespace_prefix, ops

ROUNDINGS = ("torch", "diffusers")
_ALIASES = {"torch": "torch", "B": "torch", "diffusers": "diffusers", "A": "diffusers"}


def _rms_norm_fake(out: torch.Tensor, input: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> None:
    return None


for _name in ("rms_norm", "rms_norm_diffusers"):
    torch.library.register_fake(add_op_namespace_prefix(_name))(_rms_norm_fake)


def rmsnorm(
    input: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    out: Optional[torch.Tensor] = None,
    *,
    rounding: str = "torch",
) -> torch.Tensor:
    """RMSNorm over the last dimension, accumulated in float32.

    ``r = rsqrt(mean(x_f32 ** 2, dim=-1) + eps)``, then

    - ``rounding="torch"`` (behaviour "B", ``torch.nn.RMSNorm`` / ``F.rms_norm``):
      ``y = T(x_f32 * r * w_f32)``, one rounding at the end;
    - ``rounding="diffusers"`` (behaviour "A", ``diffusers.models.normalization.RMSNorm``):
      ``y = T(T(x_f32 * r) * w)`` when ``weight`` has the input's half dtype (the
      normalised value is rounded before the weight multiply); with a float32
      weight diffusers does not round and returns float32, and so does this.

    Without ``weight`` both give ``y = T(x_f32 * r)``.

    Args:
        input: ``[..., hidden]`` CUDA tensor, bf16, fp16 or fp32. The last dim must
            be contiguous for the fast path; other layouts are copied once.
        weight: ``[hidden]`` of the input's dtype or float32, or None.
        eps: added to the mean square.
        out: optional output of the input's shape (input dtype or float32,
            contiguous last dim). May be ``input`` itself.
        rounding: ``"torch"`` (default) or ``"diffusers"`` (``"B"``/``"A"`` also accepted).

    Returns:
        ``out`` (allocated when not given).
    """
    mode = _ALIASES.get(rounding)
    if mode is None:
        raise ValueError(f"ltx_kernels.rmsnorm: `rounding` must be one of {ROUNDINGS}, got {rounding!r}")
    if out is None:
        dtype = input.dtype
        if (mode == "diffusers" and weight is not None and weight.dtype == torch.float32
                and input.dtype in (torch.float16, torch.bfloat16)):
            dtype = torch.float32
        out = torch.empty(input.shape, dtype=dtype, device=input.device)
    op = ops.rms_norm_diffusers if mode == "diffusers" else ops.rms_norm
    op(out, input, weight, float(eps))
    return out
