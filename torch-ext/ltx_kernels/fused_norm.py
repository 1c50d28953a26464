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

Differentiable (issue 36) in every tensor argument: while autograd records,
each op runs its functional op ``<op>_fwd`` (the same forward kernels), whose
backward, registered with ``torch.library.register_autograd``, is the one op
``fused_norm_bwd`` (CUDA kernels; formulas in kernel_src/fused_norm/fused_norm.h).
Grads of tensors shared by several rows (weight; per-batch or broadcast
modulation) are summed deterministically. Otherwise the out-variant ops run,
as before.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._alloc import new_output
from ._autograd import records_autograd
from ._device import check_device, device_refusal
from ._ops import add_op_namespace_prefix, ops
from .rmsnorm import ROUNDING_ALIASES, ROUNDINGS

Tensor = torch.Tensor


def _fake_unary(out, *args) -> None:
    return None


for _name in ("adaln_rmsnorm", "rmsnorm_residual", "gated_residual_rmsnorm", "gated_residual",
              "residual_tanh_gated_rmsnorm", "modulated_rmsnorm"):
    torch.library.register_fake(add_op_namespace_prefix(_name))(_fake_unary)


# --- the differentiable path -------------------------------------------------------------------------
# Functional forwards (contiguous outputs, as the binding allocates them) and the one backward.

def _rows_like(x: Tensor) -> Tensor:
    return x.new_empty(x.shape)


@torch.library.register_fake(add_op_namespace_prefix("rmsnorm_residual_fwd"))
def _rmsnorm_residual_fwd_fake(input, residual, weight, eps, diffusers_rounding):
    return _rows_like(input), _rows_like(input)


@torch.library.register_fake(add_op_namespace_prefix("adaln_rmsnorm_fwd"))
def _adaln_rmsnorm_fwd_fake(input, weight, scale, shift, eps, exact_mode):
    return _rows_like(input)


@torch.library.register_fake(add_op_namespace_prefix("gated_residual_fwd"))
def _gated_residual_fwd_fake(x, y, gate, exact_mode):
    return _rows_like(x)


@torch.library.register_fake(add_op_namespace_prefix("gated_residual_rmsnorm_fwd"))
def _gated_residual_rmsnorm_fwd_fake(x, y, gate, weight, scale, shift, eps, exact_mode):
    return _rows_like(x), _rows_like(x)


@torch.library.register_fake(add_op_namespace_prefix("residual_tanh_gated_rmsnorm_fwd"))
def _residual_tanh_gated_rmsnorm_fwd_fake(x, x_res, gate, eps, exact_mode):
    return _rows_like(x)


@torch.library.register_fake(add_op_namespace_prefix("modulated_rmsnorm_fwd"))
def _modulated_rmsnorm_fwd_fake(x, scale, eps, scale_offset):
    return _rows_like(x)


# What each op's backward reads: (normalises, sums)
_BWD_KINDS = {"adaln_rmsnorm": (True, False), "rmsnorm_residual": (True, True),
              "gated_residual_rmsnorm": (True, True), "gated_residual": (False, True),
              "residual_tanh_gated_rmsnorm": (True, False), "modulated_rmsnorm": (True, False)}


@torch.library.register_fake(add_op_namespace_prefix("fused_norm_bwd"))
def _fused_norm_bwd_fake(op, grad_out, grad_sum, h, y, gate, weight, scale, shift, eps, scale_offset, exact_mode,
                         y_grad, gate_grad, weight_grad, scale_grad, shift_grad):
    normalises, sums = _BWD_KINDS[op]
    grad_h = _rows_like(h) if normalises else None
    grad_y = _rows_like(h) if y_grad and sums and gate is not None else None
    like = lambda t, wanted: t.new_empty(t.shape) if wanted else None  # noqa: E731 (contiguous, t's dtype)
    return (grad_h, grad_y, like(gate, gate_grad), like(weight, weight_grad), like(scale, scale_grad),
            like(shift, shift_grad))


def _bwd(op, grad_out, grad_sum, h, *, y=None, gate=None, weight=None, scale=None, shift=None,
         needs=(False, False, False, False, False), eps=0.0, scale_offset=1.0, exact=True):
    """ops.fused_norm_bwd; `needs` = grads of (y, gate, weight, scale, shift) asked for. An upstream grad
    autograd left undefined is zeros."""
    if grad_out is None and _BWD_KINDS[op][0]:
        grad_out = torch.zeros_like(h)
    if grad_sum is None and _BWD_KINDS[op][1]:
        grad_sum = torch.zeros_like(h)
    return ops.fused_norm_bwd(op, grad_out, grad_sum, h, y, gate, weight, scale, shift, float(eps),
                              float(scale_offset), bool(exact), *needs)


def _save(ctx, *tensors, **attrs):
    ctx.save_for_backward(*tensors)
    for key, value in attrs.items():
        setattr(ctx, key, value)


# rmsnorm_residual_fwd(input, residual, weight, eps, diffusers_rounding) -> (out, residual_out)
def _rmsnorm_residual_setup(ctx, inputs, output):
    _, _, weight, eps, diffusers_rounding = inputs
    _save(ctx, output[1], weight, eps=eps, exact=diffusers_rounding)


def _rmsnorm_residual_backward(ctx, grad_out, grad_residual_out):
    h, weight = ctx.saved_tensors
    needs_w = weight is not None and ctx.needs_input_grad[2]
    dh, _, _, dw, _, _ = _bwd("rmsnorm_residual", grad_out, grad_residual_out, h, weight=weight,
                              needs=(False, False, needs_w, False, False), eps=ctx.eps, exact=ctx.exact)
    return dh, dh, dw, None, None  # h = input + residual: both get dh (as torch's add)


# adaln_rmsnorm_fwd(input, weight, scale, shift, eps, exact_mode) -> out
def _adaln_setup(ctx, inputs, output):
    input, weight, scale, shift, eps, exact_mode = inputs
    _save(ctx, input, weight, scale, shift, eps=eps, exact=exact_mode)


def _adaln_backward(ctx, grad_out):
    input, weight, scale, shift = ctx.saved_tensors
    n = ctx.needs_input_grad
    dh, _, _, dw, dscale, dshift = _bwd(
        "adaln_rmsnorm", grad_out, None, input, weight=weight, scale=scale, shift=shift,
        needs=(False, False, weight is not None and n[1], n[2], shift is not None and n[3]), eps=ctx.eps,
        exact=ctx.exact)
    return dh, dw, dscale, dshift, None, None


# gated_residual_fwd(x, y, gate, exact_mode) -> out
def _gated_setup(ctx, inputs, output):
    _, y, gate, exact_mode = inputs
    _save(ctx, y, gate, exact=exact_mode)


def _gated_backward(ctx, grad_out):
    y, gate = ctx.saved_tensors
    if gate is None:
        return grad_out, grad_out, None, None  # x + y
    n = ctx.needs_input_grad
    if not (n[1] or n[2]):
        return grad_out, None, None, None
    # h is only the row shape here (no norm): the upstream grad stands in for it.
    _, dy, dgate, _, _, _ = _bwd("gated_residual", None, grad_out, grad_out, y=y if n[2] else None, gate=gate,
                                 needs=(n[1], n[2], False, False, False), exact=ctx.exact)
    return grad_out, dy, dgate, None


# gated_residual_rmsnorm_fwd(x, y, gate, weight, scale, shift, eps, exact_mode) -> (out, x_out)
def _seam_setup(ctx, inputs, output):
    _, y, gate, weight, scale, shift, eps, exact_mode = inputs
    _save(ctx, output[1], y, gate, weight, scale, shift, eps=eps, exact=exact_mode)


def _seam_backward(ctx, grad_out, grad_x_out):
    h, y, gate, weight, scale, shift = ctx.saved_tensors
    n = ctx.needs_input_grad
    needs = (gate is not None and n[1], gate is not None and n[2], weight is not None and n[3], n[4],
             shift is not None and n[5])
    dh, dy, dgate, dw, dscale, dshift = _bwd(
        "gated_residual_rmsnorm", grad_out, grad_x_out, h, y=y if needs[1] else None, gate=gate, weight=weight,
        scale=scale, shift=shift, needs=needs, eps=ctx.eps, exact=ctx.exact)
    return dh, (dh if gate is None else dy), dgate, dw, dscale, dshift, None, None


# residual_tanh_gated_rmsnorm_fwd(x, x_res, gate, eps, exact_mode) -> out
def _tanh_setup(ctx, inputs, output):
    _, x_res, gate, eps, exact_mode = inputs
    _save(ctx, x_res, gate, eps=eps, exact=exact_mode)


def _tanh_backward(ctx, grad_out):
    x_res, gate = ctx.saved_tensors
    n = ctx.needs_input_grad
    if not (n[1] or n[2]):
        return grad_out, None, None, None, None
    dh, _, dgate, _, _, _ = _bwd("residual_tanh_gated_rmsnorm", grad_out, None, x_res, gate=gate,
                                 needs=(False, n[2], False, False, False), eps=ctx.eps, exact=ctx.exact)
    return grad_out, dh, dgate, None, None  # out = x + branch: x gets the upstream grad itself


# modulated_rmsnorm_fwd(x, scale, eps, scale_offset) -> out
def _modulated_setup(ctx, inputs, output):
    x, scale, eps, scale_offset = inputs
    _save(ctx, x, scale, eps=eps, scale_offset=scale_offset)


def _modulated_backward(ctx, grad_out):
    x, scale = ctx.saved_tensors
    dh, _, _, _, dscale, _ = _bwd("modulated_rmsnorm", grad_out, None, x, scale=scale,
                                  needs=(False, False, False, ctx.needs_input_grad[1], False), eps=ctx.eps,
                                  scale_offset=ctx.scale_offset)
    return dh, dscale, None, None


for _name, _backward, _setup in (
        ("rmsnorm_residual_fwd", _rmsnorm_residual_backward, _rmsnorm_residual_setup),
        ("adaln_rmsnorm_fwd", _adaln_backward, _adaln_setup),
        ("gated_residual_fwd", _gated_backward, _gated_setup),
        ("gated_residual_rmsnorm_fwd", _seam_backward, _seam_setup),
        ("residual_tanh_gated_rmsnorm_fwd", _tanh_backward, _tanh_setup),
        ("modulated_rmsnorm_fwd", _modulated_backward, _modulated_setup)):
    torch.library.register_autograd(add_op_namespace_prefix(_name), _backward, setup_context=_setup)


def _run(op: str, device_of: Tensor, fn):
    """check_device, then `fn()`, turning the binding's device errors into the package's refusal."""
    check_device(op, device_of)
    try:
        return fn()
    except RuntimeError as error:
        raise device_refusal(error) from None


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
    mode = ROUNDING_ALIASES.get(rounding)
    if mode is None:
        raise ValueError(f"ltx_kernels.rmsnorm_residual: `rounding` must be one of {ROUNDINGS}, got {rounding!r}")
    if records_autograd(input, residual, weight):
        return _run("rmsnorm_residual", input, lambda: tuple(ops.rmsnorm_residual_fwd(
            input, residual, weight, float(eps), mode == "diffusers")))
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
    if records_autograd(input, weight, scale, shift):
        return _run("adaln_rmsnorm", input, lambda: ops.adaln_rmsnorm_fwd(
            input, weight, scale, shift, float(eps), bool(exact_mode)))
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
    ``inplace=True`` writes the result into ``x`` and returns it (while autograd
    records, as ``x.copy_`` of the result: autograd's rules for in-place ops apply).
    """
    if records_autograd(x, y, gate):
        result = _run("gated_residual", x, lambda: ops.gated_residual_fwd(x, y, gate, bool(exact_mode)))
        return x.copy_(result) if inplace else result
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
    if records_autograd(x, y, gate, scale, shift, weight):
        return _run("gated_residual_rmsnorm", x, lambda: tuple(ops.gated_residual_rmsnorm_fwd(
            x, y, gate, weight, scale, shift, float(eps), bool(exact_mode))))
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
    if records_autograd(x, x_res, gate):
        return _run("residual_tanh_gated_rmsnorm", x_res, lambda: ops.residual_tanh_gated_rmsnorm_fwd(
            x, x_res, gate, float(eps), bool(exact_mode)))
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
    del exact_mode  # one rounding in the reference too
    if records_autograd(x, scale):
        return _run("modulated_rmsnorm", x, lambda: ops.modulated_rmsnorm_fwd(x, scale, float(eps), 1.0))
    out = new_output(x)
    check_device("modulated_rmsnorm", x)
    try:
        ops.modulated_rmsnorm(out, x, scale, float(eps), 1.0)
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out


__all__ = ["rmsnorm_residual", "adaln_rmsnorm", "gated_residual", "gated_residual_rmsnorm", "residual_tanh_gated_rmsnorm",
           "modulated_rmsnorm"]
