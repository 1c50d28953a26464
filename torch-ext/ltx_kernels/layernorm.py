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
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ._alloc import new_output
from ._autograd import refuse_autograd
from ._device import check_device, device_refusal
from ._ops import add_op_namespace_prefix, ops

Tensor = torch.Tensor


def _fake(out, *args) -> None:
    return None


for _name in ("layernorm", "adaln_layernorm", "gated_residual_layernorm"):
    torch.library.register_fake(add_op_namespace_prefix(_name))(_fake)


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
    dims are reshaped (copied when they do not flatten).
    """
    refuse_autograd("layernorm", "x weight bias", x, weight, bias)
    rows = _rows(x)
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
    ``shift`` may be None. Rounding: see the module docstring.
    """
    refuse_autograd("adaln_layernorm", "x scale shift weight bias", x, scale, shift, weight, bias)
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

    ``shift`` needs ``scale``. Rounding: see the module docstring.
    """
    refuse_autograd("gated_residual_layernorm", "x y gate weight bias scale shift", x, y, gate, weight, bias, scale, shift)
    out, x_new = new_output(x), new_output(x)
    check_device("gated_residual_layernorm", x)
    try:
        ops.gated_residual_layernorm(out, x_new, x, y, gate, scale, shift, weight, bias, float(eps),
                                     bool(exact_mode))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out, x_new


__all__ = ["layernorm", "adaln_layernorm", "gated_residual_layernorm"]
