"""VAE ops: pixel norm over the channel dim, and an in-place add."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ._alloc import new_output
from ._autograd import refuse_autograd
from ._device import check_device, device_refusal
from ._ops import add_op_namespace_prefix, ops

ROUNDINGS = ("diffusers", "original")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_MAX_DIMS = 8  # inplace_add: dims of x (kernel_src/vae/inplace_add.h)


def _pixel_norm_fake(out: torch.Tensor, x: torch.Tensor, dim: int, eps: float, original_rounding: bool) -> None:
    return None


def _inplace_add_fake(x: torch.Tensor, y: torch.Tensor) -> None:
    return None


torch.library.register_fake(add_op_namespace_prefix("pixel_norm"))(_pixel_norm_fake)
torch.library.register_fake(add_op_namespace_prefix("inplace_add"))(_inplace_add_fake)


def _check_dtype(where: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in _DTYPES:
        raise TypeError(where + f"`{name}` has dtype {t.dtype}; supported dtypes are torch.bfloat16, "
                        "torch.float16 and torch.float32")


def _check_device(where: str, x: torch.Tensor, other_name: str | None = None, other: torch.Tensor | None = None):
    if x.device.type not in ("cuda", "meta"):
        raise device_refusal(where + f"`x` must be a CUDA tensor, got a tensor on {x.device}")
    if other is not None and other.device != x.device:
        raise RuntimeError(where + f"`{other_name}` is on {other.device} but `x` is on {x.device}")


def _check_pixel_norm_args(x, dim, eps, out) -> None:
    """The binding's checks, raised from Python first: the traceback then points at the
    caller's line, and fake/meta calls under torch.compile get the same errors."""
    where = "ltx_kernels.pixel_norm: "
    if not isinstance(x, torch.Tensor):
        raise TypeError(where + f"`x` must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise RuntimeError(where + f"`x` must have at least 2 dims ([B, C, ...]), got {x.dim()}")
    _check_dtype(where, "x", x)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(where + f"`dim` must be an int, got {type(dim).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise IndexError(where + f"`dim` is out of range for a {x.dim()}-d `x` (expected {-x.dim()}.."
                         f"{x.dim() - 1}), got {dim}")
    if not eps >= 0:  # also refuses NaN
        raise RuntimeError(where + f"`eps` must be >= 0, got {eps}")
    if out is not None:
        if out.dtype != x.dtype:
            raise TypeError(where + f"`out` has dtype {out.dtype} but `x` has dtype {x.dtype}; they must match")
        if out.shape != x.shape:
            raise RuntimeError(where + f"`out` has shape {list(out.shape)} but `x` has shape {list(x.shape)}")
        if not out.is_contiguous():
            raise RuntimeError(where + f"`out` must be contiguous (strides {list(out.stride())})")
    _check_device(where, x, "out", out)


def pixel_norm(
    x: torch.Tensor,
    dim: int = 1,
    eps: float = 1e-8,
    *,
    rounding: str = "diffusers",
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """RMS normalisation over the channel dim ``dim`` of ``x`` (``[B, C, T, H, W]``,
    ``[B, C, H, W]``, any rank >= 2), without weight; the LTX VAE's pixel norm.

    With ``T`` the input dtype and the sums accumulated in float32:

    - ``rounding="diffusers"`` (diffusers ``RMSNorm(C, eps, elementwise_affine=False)``
      applied through ``movedim(1, -1)``, the LTX VAE in diffusers):
      ``y = T(x_f32 * rsqrt(mean_C(x_f32 ** 2) + eps))``, one rounding;
    - ``rounding="original"`` (LTX-Video's ``PixelNorm``, LTX-2's ``PerChannelRMSNorm``:
      ``x / torch.sqrt(torch.mean(x ** 2, dim, keepdim=True) + eps)`` in the input
      dtype): the eager roundings, ``sq = T(x * x)``, ``m = T(sum_C(sq) / C)``,
      ``d = T(sqrt(T(m + eps)))``, ``y = T(x / d)`` (IEEE division). For float32
      input every ``T`` is the identity.

    The reduction order differs from torch's, so a tiny fraction of outputs can
    be 1 ulp away from the eager result.

    Args:
        x: CUDA tensor, bf16, fp16 or fp32. A non-contiguous ``x`` (a strided
            view, channels-last) is copied once to a contiguous one.
        dim: the channel dim (negative counts from the end).
        eps: added to the mean square, >= 0.
        rounding: ``"diffusers"`` (default) or ``"original"``.
        out: optional contiguous output of ``x``'s shape and dtype; may be ``x``
            itself (in place).

    Returns:
        ``out`` (a new contiguous tensor when not given).
    """
    refuse_autograd("pixel_norm", "x out", x, out)
    if rounding not in ROUNDINGS:
        raise ValueError(f"ltx_kernels.pixel_norm: `rounding` must be one of {ROUNDINGS}, got {rounding!r}")
    _check_pixel_norm_args(x, dim, eps, out)
    if out is None:
        out = new_output(x)
    if x.numel() == 0:
        return out
    check_device("pixel_norm", x)
    ops.pixel_norm(out, x, dim, float(eps), rounding == "original")
    return out


def _check_inplace_add_args(x, y) -> None:
    where = "ltx_kernels.inplace_add: "
    for name, t in (("x", x), ("y", y)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(where + f"`{name}` must be a torch.Tensor, got {type(t).__name__}")
    _check_dtype(where, "x", x)
    if y.dtype not in (x.dtype, torch.float32):
        raise TypeError(where + f"`y` has dtype {y.dtype} but `x` has dtype {x.dtype}; `y` must have x's dtype "
                        "or torch.float32")
    if x.dim() > _MAX_DIMS:
        raise RuntimeError(where + f"`x` has {x.dim()} dims; at most {_MAX_DIMS} are supported")
    xs, ys = tuple(x.shape), tuple(y.shape)
    if len(ys) > len(xs) or any(b not in (1, a) for a, b in zip(xs[len(xs) - len(ys):], ys)):
        raise RuntimeError(where + f"`y` of shape {list(ys)} cannot be broadcast to the shape of `x` {list(xs)} "
                           "(`x` itself is never broadcast)")
    for d, (size, stride) in enumerate(zip(xs, x.stride())):
        if size > 1 and stride == 0:
            raise RuntimeError(where + f"`x` has internal overlap (dim {d} of size {size} has stride 0, e.g. from "
                               "expand): more than one element would be written through the same memory location")
    _check_device(where, x, "y", y)


def inplace_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x += y`` in place, like ``x.add_(y)``: ``x = T(float(x) + float(y))`` with
    ``T`` x's dtype, one rounding (bitwise what ``torch.Tensor.add_`` computes).

    ``y`` is broadcast to ``x``'s shape with torch's rules (``[C, 1, 1, 1]``,
    ``[D]``, ``[1]``, ...); ``x`` itself is never broadcast. ``y`` may overlap
    ``x`` in memory (it is then read from a copy, unless it is ``x`` itself).
    Same-shape contiguous tensors take 16-byte vector accesses, as does a
    contiguous ``x`` with a broadcast ``y`` whose innermost run is a multiple of
    16 bytes; anything else (strided views, misaligned storage) a scalar path.

    Args:
        x: CUDA tensor, bf16, fp16 or fp32, at most 8 dims, no internal overlap
            (no stride-0 dim of size > 1); modified in place.
        y: x's dtype or float32, on x's device, broadcastable to ``x.shape``.

    Returns:
        ``x``.
    """
    refuse_autograd("inplace_add", "x y", x, y)
    _check_inplace_add_args(x, y)
    if x.numel() == 0:
        return x
    if y.dim() == 0 and y.dtype != x.dtype:
        # A 0-dim tensor does not take part in type promotion: torch computes
        # in x's dtype, so the value is rounded to it first.
        y = y.to(x.dtype)
    check_device("inplace_add", x)
    ops.inplace_add(x, y)
    return x


class PixelNorm(nn.Module):
    """Forward of LTX-Video's ``PixelNorm`` (``ltx_video/models/autoencoders/pixel_norm.py``):
    ``x / sqrt(mean(x ** 2, dim=self.dim, keepdim=True) + self.eps)`` with its
    eager roundings (``pixel_norm(..., rounding="original")``)."""

    dim: int
    eps: float
    can_torch_compile: bool = True
    has_backward: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return pixel_norm(x, self.dim, self.eps, rounding="original")


__all__ = ["pixel_norm", "inplace_add", "PixelNorm", "ROUNDINGS"]
