"""FP8 producers and the FP8 linear (issue 37): float8_e4m3fn GEMM inputs with one float32
scale per row, written by the kernel that computes the values, and ``torch._scaled_mm`` on them.

An :class:`Fp8Rows` holds ``data`` (``x``'s shape, ``torch.float8_e4m3fn``) and ``scale``
(``x``'s shape without the last dim, float32); the value it stands for is
``data.float() * scale[..., None]``. Every producer computes its row in float32, takes the row's
``amax = max |v|``, and writes ``scale = amax / 448`` (1 for a row of zeros) and
``data = e4m3(v / scale)``, round to nearest, saturated at ±448: one read of the inputs, no
separate quantisation pass. The error of each element is at most half an e4m3 step:
``|deq - v| <= 2^-4 |v|`` for ``|v| >= 2^-6 scale``, and ``2^-10 scale`` below (e4m3 subnormals).

- :func:`quantize_fp8`: ``v = x``. Per output channel for a weight ``[N, K]``; per token for
  an activation.
- :func:`gelu_tanh_fp8`: ``v = GELU_tanh(x)`` through the fast formula (``gelu_tanh(fast=True)``,
  relative error below 5e-5, far under e4m3's step).
- :func:`adaln_rmsnorm_fp8`: ``v = x * r [* weight] * (1 + scale) [+ shift]``, ``r`` the row's
  ``rsqrt(mean(x^2) + eps)``, in float32 (``adaln_rmsnorm``'s fast mode without its final rounding).
- :func:`gated_residual_rmsnorm_fp8`: ``x_new = x + y * gate`` rounded to x's dtype exactly as
  ``gated_residual``'s exact mode (the residual stream keeps the eager model's bits), then
  ``adaln_rmsnorm_fp8`` of ``x_new``. Returns ``(Fp8Rows, x_new)``.
- :func:`gated_residual_fp8`: ``x_new = x + y * gate`` as ``gated_residual``'s exact mode, and
  ``x_new`` itself as e4m3 rows (the cross-attention query's input). Returns ``(Fp8Rows, x_new)``.
- :class:`Fp8Linear`: an ``nn.Linear`` as ``linear_fp8`` (weight quantised once, per output channel);
  ``Fp8Linear.concat`` joins linears that read one input (q/k/v) into one GEMM.
- :func:`linear_fp8`: ``x @ W.T + bias`` with ``torch._scaled_mm`` (rowwise scales), ``x`` an
  :class:`Fp8Rows` or a tensor it quantises, ``W`` an :class:`Fp8Rows` from ``quantize_fp8``.

Rows are a multiple of 16 elements (``_scaled_mm``'s K) and at most 16384 (bf16/fp16; 8192 for a
float32 ``quantize_fp8``). The norms and GELU take bf16 or fp16. Inference only: called while
autograd records, each raises :class:`NoBackwardError`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ._autograd import refuse_autograd
from ._device import check_device, device_refusal
from ._ops import add_op_namespace_prefix, ops

Tensor = torch.Tensor
E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


class Fp8Rows(NamedTuple):
    """float8_e4m3fn ``data`` and one float32 ``scale`` per row: ``data.float() * scale[..., None]``."""

    data: Tensor
    scale: Tensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The values these rows stand for, in ``dtype``."""
        return (self.data.float() * self.scale.unsqueeze(-1)).to(dtype)


def _fake_rows(x: Tensor) -> Tuple[Tensor, Tensor]:
    return (torch.empty_like(x, dtype=E4M3, memory_format=torch.contiguous_format),
            x.new_empty(x.shape[:-1], dtype=torch.float32))


@torch.library.register_fake(add_op_namespace_prefix("quantize_fp8"))
def _quantize_fp8_fake(x: Tensor):
    return _fake_rows(x)


@torch.library.register_fake(add_op_namespace_prefix("gelu_tanh_fp8"))
def _gelu_tanh_fp8_fake(x: Tensor):
    return _fake_rows(x)


@torch.library.register_fake(add_op_namespace_prefix("adaln_rmsnorm_fp8"))
def _adaln_rmsnorm_fp8_fake(input: Tensor, weight, scale, shift, eps):
    return _fake_rows(input)


@torch.library.register_fake(add_op_namespace_prefix("gated_residual_rmsnorm_fp8"))
def _gated_residual_rmsnorm_fp8_fake(x: Tensor, y, gate, weight, scale, shift, eps):
    return (*_fake_rows(x), torch.empty_like(x, memory_format=torch.contiguous_format))


@torch.library.register_fake(add_op_namespace_prefix("adaln_layernorm_fp8"))
def _adaln_layernorm_fp8_fake(x: Tensor, scale, shift, eps, weight, bias):
    return _fake_rows(x)


@torch.library.register_fake(add_op_namespace_prefix("gated_residual_layernorm_fp8"))
def _gated_residual_layernorm_fp8_fake(x: Tensor, y, gate, eps, weight, bias, scale, shift):
    return (*_fake_rows(x), torch.empty_like(x, memory_format=torch.contiguous_format))


@torch.library.register_fake(add_op_namespace_prefix("gated_residual_fp8"))
def _gated_residual_fp8_fake(x: Tensor, y, gate):
    return (*_fake_rows(x), torch.empty_like(x, memory_format=torch.contiguous_format))


def _call(name: str, main: Tensor, op, *args):
    check_device(name, main)
    try:
        return op(*args)
    except RuntimeError as error:
        raise device_refusal(error) from None


def quantize_fp8(x: Tensor) -> Fp8Rows:
    """``x`` ``[..., K]`` (bf16, fp16 or fp32) as e4m3 rows with one scale per row."""
    refuse_autograd("quantize_fp8", "x", x)
    return Fp8Rows(*_call("quantize_fp8", x, ops.quantize_fp8, x))


def gelu_tanh_fp8(x: Tensor) -> Fp8Rows:
    """``GELU_tanh(x)`` (bf16/fp16 ``x`` ``[..., K]``) as e4m3 rows: the feed-forward's down-projection input."""
    refuse_autograd("gelu_tanh_fp8", "x", x)
    return Fp8Rows(*_call("gelu_tanh_fp8", x, ops.gelu_tanh_fp8, x))


def adaln_rmsnorm_fp8(input: Tensor, weight: Optional[Tensor], scale: Tensor, shift: Optional[Tensor],
                      eps: float = 1e-6) -> Fp8Rows:
    """``RMSNorm(input) [* weight] * (1 + scale) [+ shift]`` as e4m3 rows; arguments as
    :func:`adaln_rmsnorm` (``input`` ``[R, D]`` or ``[B, S, D]``, modulation broadcast to its rows)."""
    refuse_autograd("adaln_rmsnorm_fp8", "input weight scale shift", input, weight, scale, shift)
    return Fp8Rows(*_call("adaln_rmsnorm_fp8", input, ops.adaln_rmsnorm_fp8, input, weight, scale, shift,
                          float(eps)))


def gated_residual_rmsnorm_fp8(x: Tensor, y: Tensor, gate: Optional[Tensor], scale: Tensor,
                               shift: Optional[Tensor], eps: float = 1e-6, *,
                               weight: Optional[Tensor] = None) -> Tuple[Fp8Rows, Tensor]:
    """The block seam with an FP8 output: ``x_new = x + y * gate`` (x's dtype, exact), and
    ``RMSNorm(x_new) [* weight] * (1 + scale) [+ shift]`` as e4m3 rows. Returns ``(rows, x_new)``."""
    refuse_autograd("gated_residual_rmsnorm_fp8", "x y gate scale shift weight", x, y, gate, scale, shift, weight)
    data, row_scale, x_new = _call("gated_residual_rmsnorm_fp8", x, ops.gated_residual_rmsnorm_fp8, x, y, gate,
                                   weight, scale, shift, float(eps))
    return Fp8Rows(data, row_scale), x_new


def gated_residual_fp8(x: Tensor, y: Tensor, gate: Optional[Tensor] = None) -> Tuple[Fp8Rows, Tensor]:
    """``x_new = x + y * gate`` (x's dtype, exact: bitwise ``gated_residual(x, y, gate)``) and ``x_new`` as
    e4m3 rows. Returns ``(rows, x_new)``."""
    refuse_autograd("gated_residual_fp8", "x y gate", x, y, gate)
    data, row_scale, x_new = _call("gated_residual_fp8", x, ops.gated_residual_fp8, x, y, gate)
    return Fp8Rows(data, row_scale), x_new


def adaln_layernorm_fp8(x: Tensor, scale: Tensor, shift: Optional[Tensor], eps: float = 1e-6, *,
                        weight: Optional[Tensor] = None, bias: Optional[Tensor] = None) -> Fp8Rows:
    """``LayerNorm(x) [* weight] [+ bias]) * (1 + scale) [+ shift]`` as e4m3 rows, float32 throughout
    (Wan's ``norm1``/``norm3`` chain); arguments as :func:`adaln_layernorm` (weight, bias x's dtype or
    float32)."""
    refuse_autograd("adaln_layernorm_fp8", "x scale shift weight bias", x, scale, shift, weight, bias)
    return Fp8Rows(*_call("adaln_layernorm_fp8", x, ops.adaln_layernorm_fp8, x, scale, shift, float(eps), weight,
                          bias))


def gated_residual_layernorm_fp8(x: Tensor, y: Tensor, gate: Optional[Tensor], eps: float = 1e-6, *,
                                 weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                                 scale: Optional[Tensor] = None, shift: Optional[Tensor] = None
                                 ) -> Tuple[Fp8Rows, Tensor]:
    """The Wan / Flux block seam with an FP8 output: ``x_new = x + y * gate`` (x's dtype, exact), then the
    (modulated) LayerNorm of ``x_new`` as e4m3 rows. Returns ``(rows, x_new)``."""
    refuse_autograd("gated_residual_layernorm_fp8", "x y gate weight bias scale shift", x, y, gate, weight, bias,
                    scale, shift)
    data, row_scale, x_new = _call("gated_residual_layernorm_fp8", x, ops.gated_residual_layernorm_fp8, x, y, gate,
                                   float(eps), weight, bias, scale, shift)
    return Fp8Rows(data, row_scale), x_new


def linear_fp8(x: Union[Tensor, Fp8Rows], weight: Fp8Rows, bias: Optional[Tensor] = None, *,
               out_dtype: Optional[torch.dtype] = None, fast_accum: bool = False) -> Tensor:
    """``x @ W.T + bias`` as one float8_e4m3 GEMM (``torch._scaled_mm``, rowwise scales).

    ``x``: :class:`Fp8Rows` ``[..., K]`` from a producer, or a tensor quantised here (an extra pass:
    :func:`quantize_fp8`). ``weight``: ``quantize_fp8(W)`` of ``W`` ``[N, K]`` (one scale per output
    channel). ``bias``: ``[N]`` or None. Returns ``[..., N]`` in ``out_dtype`` (default: ``x``'s dtype,
    bfloat16 for :class:`Fp8Rows`). ``fast_accum``: cuBLASLt's fast FP8 accumulation (faster; its
    error is measured per model in docs/fp8.md).
    """
    if isinstance(x, Tensor):
        out_dtype = out_dtype or x.dtype
        x = quantize_fp8(x)
    out_dtype = out_dtype or torch.bfloat16
    data, w = x.data, weight.data
    if w.dim() != 2 or data.shape[-1] != w.shape[1] or weight.scale.shape != w.shape[:1]:
        raise RuntimeError(f"ltx_kernels.linear_fp8: x {list(data.shape)} and weight {list(w.shape)} (scale "
                           f"{list(weight.scale.shape)}) do not make x @ weight.T; the weight must be "
                           "quantize_fp8 of an [N, K] matrix")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != w.shape[0]):
        raise RuntimeError(f"ltx_kernels.linear_fp8: bias has shape {list(bias.shape)}, expected [{w.shape[0]}]")
    lead = data.shape[:-1]
    fused_bias = bias is not None and bias.dtype == out_dtype
    y = torch._scaled_mm(data.reshape(-1, data.shape[-1]), w.t(), scale_a=x.scale.reshape(-1, 1),
                         scale_b=weight.scale.reshape(1, -1), bias=bias if fused_bias else None,
                         out_dtype=out_dtype, use_fast_accum=fast_accum)
    if bias is not None and not fused_bias:
        y = y + bias
    return y.reshape(*lead, w.shape[0])


class Fp8Linear(nn.Module):
    """An ``nn.Linear`` as a float8_e4m3 GEMM (:func:`linear_fp8`): the weight quantised
    once per output channel, the input per row, either by its producer (an :class:`Fp8Rows`
    argument) or here. Inference only (no backward); ``fast_accum``: cuBLASLt's fast accumulation."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor], *, fast_accum: bool = False):
        super().__init__()
        self._hold(quantize_fp8(weight.detach()), bias, fast_accum, weight.dtype, persistent=True)

    def _hold(self, rows: Fp8Rows, bias: Optional[Tensor], fast_accum: bool, out_dtype: torch.dtype,
              persistent: bool) -> None:
        self.register_buffer("weight_data", rows.data, persistent=persistent)
        self.register_buffer("weight_scale", rows.scale, persistent=persistent)
        bias = None if bias is None else bias.detach()
        if persistent:
            self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        else:
            self.register_buffer("bias", bias, persistent=False)
        self.out_features, self.in_features = rows.data.shape
        self.fast_accum = fast_accum
        self.out_dtype = out_dtype  # the model's dtype, whatever the input (Fp8Rows carry none)
        self.parts = ()

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, fast_accum: bool = False) -> "Fp8Linear":
        return cls(linear.weight, linear.bias, fast_accum=fast_accum)

    @classmethod
    def from_rows(cls, rows: Fp8Rows, bias: Optional[Tensor] = None, *, out_dtype: torch.dtype = torch.bfloat16,
                  fast_accum: bool = False, persistent: bool = True) -> "Fp8Linear":
        """An Fp8Linear on weight rows already quantised (``quantize_fp8`` of an ``[N, K]`` weight);
        ``out_dtype``: its outputs' dtype. ``persistent=False`` keeps the buffers out of ``state_dict``."""
        data, scale = rows
        if (data.dim() != 2 or data.dtype != E4M3 or scale.dtype != torch.float32 or scale.shape != data.shape[:1]
                or (bias is not None and bias.shape != data.shape[:1])):
            raise ValueError(f"ltx_kernels.Fp8Linear.from_rows: expected e4m3 rows [N, K], float32 scales [N] and a "
                             f"bias [N] or None; got {data.dtype} {list(data.shape)}, {scale.dtype} "
                             f"{list(scale.shape)}, bias {None if bias is None else list(bias.shape)}")
        linear = cls.__new__(cls)
        nn.Module.__init__(linear)
        linear._hold(rows, bias, fast_accum, out_dtype, persistent)
        return linear

    @classmethod
    def concat(cls, linears: Sequence["Fp8Linear"]) -> "Fp8Linear":
        """One Fp8Linear whose output is the outputs of ``linears`` (which read one input) joined on the
        last dim: one GEMM instead of several, the same rows per output channel. Each linear's buffers
        become views of the joined ones (no extra memory, and again after ``.to()`` or ``.cuda()`` of a
        module holding both); the joined buffers are not persistent, so ``state_dict`` keeps only the
        linears' own. ``parts`` holds the linears."""
        linears = tuple(linears)
        if not linears or not all(type(m) is cls for m in linears):
            raise TypeError(f"ltx_kernels.Fp8Linear.concat: expected one or more {cls.__name__}, got "
                            f"{[type(m).__name__ for m in linears]}")
        keys = [(m.in_features, m.fast_accum, m.out_dtype, m.bias is None, m.weight_data.device) for m in linears]
        if any(key != keys[0] for key in keys):
            raise ValueError("ltx_kernels.Fp8Linear.concat: the linears differ in (in_features, fast_accum, "
                             f"out_dtype, no bias, device): {keys}")
        first = linears[0]
        rows = Fp8Rows(torch.cat([m.weight_data for m in linears]), torch.cat([m.weight_scale for m in linears]))
        bias = None if first.bias is None else torch.cat([m.bias.detach() for m in linears])
        joined = cls.from_rows(rows, bias, out_dtype=first.out_dtype, fast_accum=first.fast_accum, persistent=False)
        joined.parts = linears  # a tuple: not registered as submodules
        joined._share_with_parts()
        return joined

    def _share_with_parts(self) -> None:
        """Point each part's buffers at its rows of this linear's."""
        start = 0
        for m in self.parts:
            rows = slice(start, start + m.out_features)
            m.weight_data, m.weight_scale = self.weight_data[rows], self.weight_scale[rows]
            if m.bias is not None:
                m.bias = nn.Parameter(self.bias[rows], requires_grad=False)
            start = rows.stop

    def _apply(self, fn, recurse=True):
        # A move (.to, .cuda) copies each part's views on its own: a joined linear registered after its parts
        # (as the integration sets it) moves last, and makes them views of its own again.
        super()._apply(fn, recurse)
        if self.parts:
            self._share_with_parts()
        return self

    def forward(self, x):
        return linear_fp8(x, Fp8Rows(self.weight_data, self.weight_scale), self.bias, out_dtype=self.out_dtype,
                          fast_accum=self.fast_accum)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"fast_accum={self.fast_accum}")


__all__ = ["Fp8Linear", "Fp8Rows", "quantize_fp8", "gelu_tanh_fp8", "adaln_rmsnorm_fp8",
           "gated_residual_rmsnorm_fp8", "gated_residual_fp8", "adaln_layernorm_fp8", "gated_residual_layernorm_fp8",
           "linear_fp8"]
