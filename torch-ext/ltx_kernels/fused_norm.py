"""fused_norm: the residual / RMSNorm / AdaLN-modulation ops of a DiT block
(LTX-Video, Flux, Wan, Mochi), each one pass over its rows.

Shapes: ``x`` is ``[rows, hidden]`` or ``[batch, seq, hidden]``. Modulation
tensors (``scale``, ``shift``, ``gate``) broadcast from ``[hidden]``,
``[batch, hidden]`` (per batch, as Mochi and Flux pass them),
``[batch, 1, hidden]`` (LTX) or ``[batch, seq, hidden]`` (per token, LTX-2);
they share one dtype, x's or float32. Everything is accumulated in float32.

Rounding (``exact_mode``):

- ``True`` (default) reproduces the model's eager PyTorch chain bit for bit
  (up to the order of the mean-square reduction, which can move a result by
  one ulp on a small fraction of elements): each half-precision op of the
  chain rounds its result, e.g. LTX's ``n * (1 + scale) + shift`` is
  ``T(T(n * T(1 + scale)) + shift)`` with ``n = T(RMSNorm(x))``.
- ``False`` computes the whole formula in float32 and rounds once.

With float32 modulation tensors and a half-precision ``x`` both modes compute
in float32 and round once to x's dtype, which is what models that keep their
modulation in float32 (Wan: ``(x.float() + y * gate).type_as(x)``) do.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._alloc import new_output
from ._autograd import refuse_autograd
from ._device import check_device, device_refusal
from ._ops import add_op_namespace_prefix, ops
from .rmsnorm import ROUNDING_ALIASES, ROUNDINGS

Tensor = torch.Tensor


def _fake_unary(out, *args) -> None:
    return None


for _name in ("adaln_rmsnorm", "rmsnorm_residual", "gated_residual_rmsnorm", "gated_residual",
              "residual_tanh_gated_rmsnorm", "modulated_rmsnorm"):
    torch.library.register_fake(add_op_namespace_prefix(_name))(_fake_unary)


def rmsnorm_residual(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    *,
    rounding: str = "torch",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm, one pass: returns ``(out, residual_out)``.

    ``residual_out = T(input + residual)``; ``out = RMSNorm(residual_out)`` with
    the rounding of :func:`rmsnorm` (``"torch"``: ``T(h * r * w)``;
    ``"diffusers"``: ``T(T(h * r) * w)``), ``r = rsqrt(mean(h ** 2) + eps)``.
    ``input``/``residual`` are ``[rows, hidden]`` or ``[batch, seq, hidden]`` of
    one dtype; ``weight`` is ``[hidden]`` of that dtype, or None.
    """
    refuse_autograd("rmsnorm_residual", "input residual weight", input, residual, weight)
    mode = ROUNDING_ALIASES.get(rounding)
    if mode is None:
        raise ValueError(f"ltx_kernels.rmsnorm_residual: `rounding` must be one of {ROUNDINGS}, got {rounding!r}")
    out = new_output(input)
    residual_out = new_output(input)
    check_device("rmsnorm_residual", input)
    try:
        ops.rmsnorm_residual(out, residual_out, input, residual, weight, float(eps), mode == "diffusers")
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out, residual_out


def adaln_rmsnorm(input: Tensor, weight: Optional[Tensor], scale: Tensor, shift: Optional[Tensor],
                  eps: float = 1e-6, *, exact_mode: bool = True) -> Tensor:
    """AdaLN with RMSNorm: ``out = RMSNorm(x) * w * (1 + scale) + shift``.

    ``RMSNorm(x) = x * rsqrt(mean(x ** 2, -1) + eps)`` (float32). ``weight``
    may be None (LTX's block norms have none) and so may ``shift``.
    ``exact_mode=True`` rounds like diffusers' ``RMSNorm`` followed by LTX's eager
    ``norm_hidden_states * (1 + scale) + shift``:
    ``n = T(T(x * r) * w)``, ``out = T(T(n * T(1 + scale)) + shift)``;
    ``exact_mode=False``: ``out = T(x * r * w * (1 + scale) + shift)``.
    """
    refuse_autograd("adaln_rmsnorm", "input weight scale shift", input, weight, scale, shift)
    out = new_output(input)
    check_device("adaln_rmsnorm", input)
    try:
        ops.adaln_rmsnorm(out, input, weight, scale, shift, float(eps), bool(exact_mode))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out


def gated_residual(x: Tensor, y: Tensor, gate: Optional[Tensor] = None, *, inplace: bool = False,
                   exact_mode: bool = True) -> Tensor:
    """Gated residual: ``x + y * gate`` (``x + y`` without gate).

    ``exact_mode=True``: ``T(x + T(y * gate))``, eager PyTorch's two roundings
    (LTX's ``hidden_states + attn_output * gate_msa``); ``False``: one rounding.
    ``inplace=True`` writes the result into ``x`` and returns it.
    """
    refuse_autograd("gated_residual", "x y gate", x, y, gate)
    out = x if inplace else new_output(x)
    check_device("gated_residual", x)
    try:
        ops.gated_residual(out, x, y, gate, bool(exact_mode))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out


def gated_residual_rmsnorm(x: Tensor, y: Tensor, gate: Optional[Tensor], scale: Tensor, shift: Optional[Tensor],
                           eps: float = 1e-6, *, weight: Optional[Tensor] = None,
                           exact_mode: bool = True) -> Tuple[Tensor, Tensor]:
    """The LTX block seam in one pass: the gated residual of one sub-layer and
    the modulated norm that feeds the next.

    ``x_new = x + y * gate`` (rounded to x's dtype, as :func:`gated_residual`),
    ``out = RMSNorm(x_new) [* weight] * (1 + scale) + shift`` (as
    :func:`adaln_rmsnorm`, on the rounded ``x_new``). Returns ``(out, x_new)``.
    """
    refuse_autograd("gated_residual_rmsnorm", "x y gate scale shift weight", x, y, gate, scale, shift, weight)
    out, x_new = new_output(x), new_output(x)
    check_device("gated_residual_rmsnorm", x)
    try:
        ops.gated_residual_rmsnorm(out, x_new, x, y, gate, weight, scale, shift, float(eps), bool(exact_mode))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out, x_new


def residual_tanh_gated_rmsnorm(x: Tensor, x_res: Tensor, gate: Tensor, eps: float = 1e-6, *,
                                exact_mode: bool = True) -> Tensor:
    """Mochi's gated residual: ``out = x + RMSNorm(x_res) * tanh(gate)``.

    ``gate`` is ``[batch, hidden]`` (per batch). ``exact_mode=True`` matches
    genmo's ``residual_tanh_gated_rmsnorm`` and diffusers' ``MochiModulatedRMSNorm``
    path bit for bit: ``tanh`` in the gate's dtype, the branch
    ``x_res_f32 * r * tanh(gate)`` cast to x's dtype, then added in x's dtype;
    ``False``: ``T(x + x_res * r * tanh(gate))`` in float32, one rounding.
    """
    refuse_autograd("residual_tanh_gated_rmsnorm", "x x_res gate", x, x_res, gate)
    out = new_output(x)
    check_device("residual_tanh_gated_rmsnorm", x_res)
    try:
        ops.residual_tanh_gated_rmsnorm(out, x, x_res, gate, float(eps), bool(exact_mode))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out


def modulated_rmsnorm(x: Tensor, scale: Tensor, eps: float = 1e-6, *, exact_mode: bool = True) -> Tensor:
    """Mochi's modulated norm: ``out = T(x_f32 * r * (1 + scale_f32))``.

    genmo's ``modulated_rmsnorm`` already rounds once at the end, so both
    values of ``exact_mode`` give that same (bitwise equal) result.
    """
    refuse_autograd("modulated_rmsnorm", "x scale", x, scale)
    del exact_mode  # one rounding in the reference too
    out = new_output(x)
    check_device("modulated_rmsnorm", x)
    try:
        ops.modulated_rmsnorm(out, x, scale, float(eps), 1.0)
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out


__all__ = ["rmsnorm_residual", "adaln_rmsnorm", "gated_residual", "gated_residual_rmsnorm", "residual_tanh_gated_rmsnorm",
           "modulated_rmsnorm"]
