"""layernorm: LayerNorm over the last dimension, alone, with AdaLN modulation
(Wan, Flux, HunyuanVideo, Mochi's final norm) or after the gated residual of a
DiT block, each one pass over its rows.

Statistics in float32 from the row held in registers: ``mean``, then the
biased variance as the mean of squared deviations from it;
``n = (h - mean) * rsqrt(var + eps)`` [``* weight``] [``+ bias``] (one FMA
with both, as torch's kernel). Weight and bias are ``[hidden]``, each of x's
dtype or float32.

Shapes: ``layernorm`` takes ``[..., hidden]``; the modulated ops take ``x`` of
``[rows, hidden]`` or ``[batch, seq, hidden]``, with ``scale``, ``shift``,
``gate`` broadcast from ``[hidden]``, ``[batch, hidden]`` (Flux, HunyuanVideo:
``scale_msa``), ``[batch, 1, hidden]`` (Wan 2.1) or ``[batch, seq, hidden]``
(Wan 2.2 TI2V: per token), all of one dtype: x's or float32.

Rounding (``exact_mode``), chosen by the modulation dtype as the models do:

- modulation of x's half-precision dtype, ``exact_mode=True`` (default): the
  eager chain of Flux / HunyuanVideo (``AdaLayerNormZero``,
  ``AdaLayerNormContinuous``, the block's ``norm2``): the norm rounded to T
  (``nn.LayerNorm``), then ``T(T(n * T(1 + scale)) + shift)``; the residual
  ``T(x + T(y * gate))``;
- float32 modulation (either mode): Wan's ``(norm(x.float()) * (1 + scale) +
  shift).type_as(x)`` and ``(x.float() + y * gate).type_as(x)``: each op in
  float32 as eager PyTorch runs it, one rounding to T;
- ``exact_mode=False`` with half modulation: everything in float32, one
  rounding (``T(n * (1 + scale) + shift)``).

Exactness: in exact mode (and always with float32 modulation) the modulation
and residual steps are bit for bit the eager chain given the same normalised
value. The normalised value itself is within an ulp
of torch's (its Welford reduction sums in another order): bitwise on all but
a small fraction of elements (docs/formulas.md#layernorm).

Differentiable (issue 36) in every tensor argument: while autograd records, a
call goes through the functional op ``<op>_fwd`` (the output(s), and the
per-row float32 mean and rstd the forward kernel saves), whose backward
``layernorm_bwd`` (one CUDA row kernel for the three ops; deterministic sums
for weight, bias and modulation grads) is registered with
``torch.library.register_autograd``. Otherwise the out-variant op runs, as
before. Backward formulas: kernel_src/layernorm/layernorm.h.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ._alloc import new_output
from ._autograd import records_autograd, saves_statistics
from ._device import check_device, device_refusal
from ._ops import add_op_namespace_prefix, ops

Tensor = torch.Tensor


def _fake(out, *args) -> None:
    return None


for _name in ("layernorm", "adaln_layernorm", "gated_residual_layernorm"):
    torch.library.register_fake(add_op_namespace_prefix(_name))(_fake)


def _stats(x: Tensor) -> Tensor:
    return x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.register_fake(add_op_namespace_prefix("layernorm_fwd"))
def _layernorm_fwd_fake(x, weight, bias, eps):
    # Contiguous, as the binding allocates them.
    return x.new_empty(x.shape), _stats(x), _stats(x)


@torch.library.register_fake(add_op_namespace_prefix("adaln_layernorm_fwd"))
def _adaln_layernorm_fwd_fake(x, scale, shift, weight, bias, eps, exact_mode):
    return x.new_empty(x.shape), _stats(x), _stats(x)


@torch.library.register_fake(add_op_namespace_prefix("gated_residual_layernorm_fwd"))
def _gated_residual_layernorm_fwd_fake(x, y, gate, scale, shift, weight, bias, eps, exact_mode):
    return x.new_empty(x.shape), x.new_empty(x.shape), _stats(x), _stats(x)


@torch.library.register_fake(add_op_namespace_prefix("layernorm_bwd"))
def _layernorm_bwd_fake(grad_out, grad_x_out, h, mean, rstd, y, gate, scale, shift, weight, bias, exact_mode,
                        output_mask):
    # The grads of x, y, gate, scale, shift, weight, bias (output_mask's order), each like its input.
    inputs = (h, y, gate, scale, shift, weight, bias)
    return tuple(t.new_empty(t.shape) if t is not None and want else None for t, want in zip(inputs, output_mask))


def _backward(ctx, grad_out, grad_x_out, h, y, gate, scale, shift, weight, bias, mean, rstd, needs):
    """layernorm_bwd for the grads in `needs` (x, y, gate, scale, shift, weight, bias): a grad tuple in
    that order (None where not needed)."""
    if grad_out is None:  # an output outside the loss (grads are not materialized)
        grad_out = torch.zeros_like(h)
    if grad_x_out is None and y is not None:  # the seam's x_out outside the loss
        grad_x_out = torch.zeros_like(h)
    return ops.layernorm_bwd(grad_out, grad_x_out, h, mean, rstd, y, gate, scale, shift, weight, bias,
                             ctx.exact_mode, list(needs))


def _layernorm_setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _eps = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, bias, mean, rstd)
    ctx.exact_mode = True
    saves_statistics(ctx, mean, rstd)


def _layernorm_backward(ctx, grad_out, _grad_mean, _grad_rstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    n = ctx.needs_input_grad
    g = _backward(ctx, grad_out, None, x, None, None, None, None, weight, bias, mean, rstd,
                  (n[0], False, False, False, False, n[1], n[2]))
    return g[0], g[5], g[6], None


def _adaln_setup_context(ctx, inputs, output) -> None:
    x, scale, shift, weight, bias, _eps, exact_mode = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, scale, shift, weight, bias, mean, rstd)
    ctx.exact_mode = bool(exact_mode)
    saves_statistics(ctx, mean, rstd)


def _adaln_backward(ctx, grad_out, _grad_mean, _grad_rstd):
    x, scale, shift, weight, bias, mean, rstd = ctx.saved_tensors
    n = ctx.needs_input_grad
    g = _backward(ctx, grad_out, None, x, None, None, scale, shift, weight, bias, mean, rstd,
                  (n[0], False, False, n[1], n[2], n[3], n[4]))
    return g[0], g[3], g[4], g[5], g[6], None, None


def _seam_setup_context(ctx, inputs, output) -> None:
    _x, y, gate, scale, shift, weight, bias, _eps, exact_mode = inputs
    _, x_out, mean, rstd = output
    # The backward reads the rows the forward normalised: x_out, the output itself (no copy of x).
    ctx.save_for_backward(x_out, y, gate, scale, shift, weight, bias, mean, rstd)
    ctx.exact_mode = bool(exact_mode)
    saves_statistics(ctx, mean, rstd)


def _seam_backward(ctx, grad_out, grad_x_out, _grad_mean, _grad_rstd):
    x_out, y, gate, scale, shift, weight, bias, mean, rstd = ctx.saved_tensors
    n = ctx.needs_input_grad
    g = _backward(ctx, grad_out, grad_x_out, x_out, y, gate, scale, shift, weight, bias, mean, rstd, n[:7])
    return (*g, None, None)


for _name, _bwd, _setup in (("layernorm_fwd", _layernorm_backward, _layernorm_setup_context),
                            ("adaln_layernorm_fwd", _adaln_backward, _adaln_setup_context),
                            ("gated_residual_layernorm_fwd", _seam_backward, _seam_setup_context)):
    torch.library.register_autograd(add_op_namespace_prefix(_name), _bwd, setup_context=_setup)


def _rows(x: Tensor) -> Tensor:
    """x as the [rows, hidden] or [batch, seq, hidden] the op takes (a view where one exists)."""
    if x.dim() == 0:
        raise RuntimeError("ltx_kernels.layernorm: `x` must have at least one dimension, got a 0-d tensor")
    if x.dim() in (2, 3):
        return x
    if x.dim() == 1:
        return x.unsqueeze(0)
    return x.reshape(math.prod(x.shape[:-2]), x.shape[-2], x.shape[-1])


def layernorm(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
              eps: float = 1e-6) -> Tensor:
    """LayerNorm over the last dimension: ``T((x - mean) * rsqrt(var + eps) * w + b)``,
    float32 statistics, one rounding to x's dtype T.

    What ``torch.nn.LayerNorm`` gives on x of any of the three dtypes, and
    diffusers' ``FP32LayerNorm(x)`` (Wan's ``norm2``, ``norm_out``): within an ulp,
    bitwise on all but a small fraction of elements. ``weight``, ``bias``:
    ``[hidden]`` of T or float32, or None. ``x``: ``[..., hidden]``; more than 3
    dims are reshaped (copied when they do not flatten). Differentiable in
    ``x``, ``weight`` and ``bias``.
    """
    rows = _rows(x)
    if records_autograd(x, weight, bias):
        check_device("layernorm", x)
        try:
            out, _, _ = ops.layernorm_fwd(rows, weight, bias, float(eps))
        except RuntimeError as error:
            raise device_refusal(error) from None
        return out.view(x.shape)
    out = new_output(x)
    check_device("layernorm", x)
    try:
        ops.layernorm(out.view(rows.shape), rows, weight, bias, float(eps))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out


def adaln_layernorm(x: Tensor, scale: Tensor, shift: Optional[Tensor], eps: float = 1e-6, *,
                    weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                    exact_mode: bool = True) -> Tensor:
    """AdaLN with LayerNorm: ``out = LN(x) * (1 + scale) + shift`` in one pass.

    Replaces Wan's ``(norm1(x.float()) * (1 + scale_msa) + shift_msa).type_as(x)``
    (float32 ``scale``/``shift``; also ``norm3`` and ``norm_out``) and Flux's /
    HunyuanVideo's ``norm(x) * (1 + scale[:, None]) + shift[:, None]``
    (``AdaLayerNormZero``, ``AdaLayerNormContinuous``; bf16 ``scale``/``shift``
    of ``[batch, hidden]``, which broadcast per batch as ``[:, None]`` does).
    ``shift`` may be None. Rounding: see the module docstring. Differentiable in
    every tensor argument (scale/shift grads summed per batch, or over all rows
    for ``[hidden]``; per token for ``[batch, seq, hidden]``).
    """
    if records_autograd(x, scale, shift, weight, bias):
        check_device("adaln_layernorm", x)
        try:
            out, _, _ = ops.adaln_layernorm_fwd(x, scale, shift, weight, bias, float(eps), bool(exact_mode))
        except RuntimeError as error:
            raise device_refusal(error) from None
        return out
    out = new_output(x)
    check_device("adaln_layernorm", x)
    try:
        ops.adaln_layernorm(out, x, scale, shift, weight, bias, float(eps), bool(exact_mode))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out


def gated_residual_layernorm(x: Tensor, y: Tensor, gate: Optional[Tensor], eps: float = 1e-6, *,
                             weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                             scale: Optional[Tensor] = None, shift: Optional[Tensor] = None,
                             exact_mode: bool = True) -> Tuple[Tensor, Tensor]:
    """A DiT block seam in one pass: the gated residual of one sub-layer and the
    LayerNorm that feeds the next. Returns ``(out, x_new)``, as
    ``gated_residual_rmsnorm``.

    ``x_new = x + y * gate`` (``x + y`` with ``gate=None``), rounded to x's dtype;
    ``out = LN(x_new) [* weight + bias]``, modulated by ``* (1 + scale) + shift``
    when ``scale`` is given. The seams it covers:

    - Wan after self-attention: ``gated_residual_layernorm(h, attn, gate_msa,
      weight=norm2.weight, bias=norm2.bias)`` (float32 gate; ``norm2`` affine);
    - Wan after cross-attention (``h + attn`` then ``norm3`` modulated):
      ``gated_residual_layernorm(h, attn, None, scale=c_scale_msa, shift=c_shift_msa)``;
    - Wan after the FFN into the next block's ``norm1``: gate, scale and shift;
    - Flux / HunyuanVideo: ``gated_residual_layernorm(h, attn, gate_msa,
      scale=scale_mlp, shift=shift_mlp)`` (bf16 ``[batch, hidden]``).

    ``shift`` needs ``scale``. Rounding: see the module docstring. Differentiable
    in every tensor argument, through both outputs.
    """
    if records_autograd(x, y, gate, weight, bias, scale, shift):
        check_device("gated_residual_layernorm", x)
        try:
            out, x_new, _, _ = ops.gated_residual_layernorm_fwd(x, y, gate, scale, shift, weight, bias, float(eps),
                                                                bool(exact_mode))
        except RuntimeError as error:
            raise device_refusal(error) from None
        return out, x_new
    out, x_new = new_output(x), new_output(x)
    check_device("gated_residual_layernorm", x)
    try:
        ops.gated_residual_layernorm(out, x_new, x, y, gate, scale, shift, weight, bias, float(eps),
                                     bool(exact_mode))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out, x_new


__all__ = ["layernorm", "adaln_layernorm", "gated_residual_layernorm"]
