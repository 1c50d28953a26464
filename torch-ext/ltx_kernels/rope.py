"""Rotary position embedding of LTX-Video: the tables and their application.

The tables are built with torch ops on the requested device (the GPU for a
CUDA device), in the same float32 operation order as diffusers'
``LTXVideoRotaryPosEmbed``, so they are bitwise equal to what that module
returns; the package does not import diffusers.

``apply_rotary_emb`` is differentiable in ``x`` (issue 36): while autograd
records, it runs the functional op ``apply_rotary_emb_fwd``, whose backward
``apply_rotary_emb_bwd`` (the transposed rotation, one CUDA kernel) is
registered with ``torch.library.register_autograd``. The tables are constants.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch

from ._alloc import new_output
from ._autograd import records_autograd, refuse_constant_grads, refuse_out
from ._device import check_device, device_refusal
from ._ops import add_op_namespace_prefix, ops

Tensor = torch.Tensor


@torch.library.register_fake(add_op_namespace_prefix("apply_rotary_emb"))
def _rotary_fake(out, x, cos, sin) -> None:
    return None


@torch.library.register_fake(add_op_namespace_prefix("apply_rotary_emb_fwd"))
def _rotary_fwd_fake(x, cos, sin) -> Tensor:
    return x.new_empty(x.shape)  # contiguous, as the binding allocates it


@torch.library.register_fake(add_op_namespace_prefix("apply_rotary_emb_bwd"))
def _rotary_bwd_fake(grad_out, cos, sin) -> Tensor:
    return grad_out.new_empty(grad_out.shape)


def _rotary_setup_context(ctx, inputs, output) -> None:
    x, cos, sin = inputs
    ctx.save_for_backward(cos, sin)
    ctx.x_dtype = x.dtype


def _rotary_backward(ctx, grad_out: Tensor):
    cos, sin = ctx.saved_tensors
    # The kernel takes grad_out in x's dtype (autograd gives the output's, which is x's).
    grad_x = ops.apply_rotary_emb_bwd(grad_out.to(ctx.x_dtype), cos, sin)
    return grad_x, None, None


torch.library.register_autograd(add_op_namespace_prefix("apply_rotary_emb_fwd"), _rotary_backward,
                                setup_context=_rotary_setup_context)


def apply_rotary_emb(x: Tensor, cos: Tensor, sin: Tensor, *, out: Optional[Tensor] = None) -> Tensor:
    """LTX-Video's RoPE on interleaved pairs, as diffusers' ``apply_rotary_emb(x, (cos, sin))``:

    ``out[2i] = T(x[2i] * cos[2i] - x[2i+1] * sin[2i])``,
    ``out[2i+1] = T(x[2i+1] * cos[2i+1] + x[2i] * sin[2i+1])``, float32 products and
    sum, one cast (bitwise the eager code). ``x`` is ``[B, S, D]`` (D even) before
    the head split; ``cos``/``sin`` float32 ``[B or 1, S, D]`` (e.g. from
    :func:`ltx_rope_cos_sin`; a batch stride of 0 reads them once per token).
    ``out`` may be ``x`` (in place).

    Differentiable in ``x``: the backward is the transposed rotation of the output
    grad, ``dx[2i] = T(dy[2i] * cos[2i] + dy[2i+1] * sin[2i+1])``,
    ``dx[2i+1] = T(dy[2i+1] * cos[2i+1] - dy[2i] * sin[2i])`` (the rotation by
    -theta), one CUDA kernel. ``cos``/``sin`` are constants: one that requires grad
    while autograd records raises :class:`NoBackwardError`, and so does ``out``.
    """
    if records_autograd(x, cos, sin, out):
        refuse_constant_grads("apply_rotary_emb", "cos sin", "x", cos, sin)
        if out is not None:
            refuse_out("apply_rotary_emb", "x cos sin out", "out", x, cos, sin, out)
        check_device("apply_rotary_emb", x)
        try:
            return ops.apply_rotary_emb_fwd(x, cos, sin)
        except RuntimeError as error:
            raise device_refusal(error) from None
    if out is None:
        out = new_output(x)
    check_device("apply_rotary_emb", x)
    try:
        ops.apply_rotary_emb(out, x, cos, sin)
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out


def ltx_rope_cos_sin(
    num_frames: int,
    height: int,
    width: int,
    rope_interpolation_scale: Optional[Sequence[Union[float, Tensor]]],
    dim: int,
    theta: float = 10000.0,
    *,
    batch_size: int = 1,
    base_num_frames: int = 20,
    base_height: int = 2048,
    base_width: int = 2048,
    patch_size: int = 1,
    patch_size_t: int = 1,
    device: Union[str, torch.device, None] = None,
) -> Tuple[Tensor, Tensor]:
    """LTX-Video's RoPE tables ``(cos, sin)``, float32 ``[batch_size, F*H*W, dim]``.

    Tokens are ordered frame-major, then height, then width. The coordinates of
    token ``(f, h, w)`` are ``g = (f * s0 * patch_size_t / base_num_frames,
    h * s1 * patch_size / base_height, w * s2 * patch_size / base_width)`` with
    ``(s0, s1, s2) = rope_interpolation_scale``, or the raw integer indices when
    it is None (diffusers' behaviour; the pipeline passes ``(8 / frame_rate, 32, 32)``).
    With ``freqs_k = theta ** linspace(0, 1, dim // 6) * pi / 2`` the angle of
    axis ``a`` and frequency ``k`` is ``freqs_k * (2 * g_a - 1)``; along the last
    dim the angles are ordered k-major with (f, h, w) fastest, each repeated for
    the pair (2i, 2i+1), after ``dim % 6`` identity channels (cos 1, sin 0).

    The batch dim is an expanded view (stride 0): every sample has the same
    table, and kernels that read it with that stride read it once.
    """
    if min(num_frames, height, width, dim, batch_size) < 0:
        raise ValueError("ltx_kernels.ltx_rope_cos_sin: sizes must be >= 0")
    device = torch.device(device) if device is not None else torch.device("cpu")
    axes = [torch.arange(n, dtype=torch.float32, device=device) for n in (num_frames, height, width)]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=0)  # [3, F, H, W]
    if rope_interpolation_scale is not None:
        s0, s1, s2 = rope_interpolation_scale
        grid = torch.stack([grid[0] * s0 * patch_size_t / base_num_frames,
                            grid[1] * s1 * patch_size / base_height,
                            grid[2] * s2 * patch_size / base_width])
    coords = grid.flatten(1).transpose(0, 1)  # [S, 3]
    exponents = torch.linspace(math.log(1.0, theta), math.log(theta, theta), dim // 6, device=device,
                               dtype=torch.float32)
    freqs = theta ** exponents * math.pi / 2.0
    angles = (freqs * (coords.unsqueeze(-1) * 2 - 1)).transpose(-1, -2).flatten(1)  # [S, 3 * (dim // 6)]
    cos = angles.cos().repeat_interleave(2, dim=-1)
    sin = angles.sin().repeat_interleave(2, dim=-1)
    pad = dim % 6
    if pad:
        cos = torch.cat([torch.ones_like(cos[:, :pad]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(sin[:, :pad]), sin], dim=-1)
    return cos.unsqueeze(0).expand(batch_size, -1, -1), sin.unsqueeze(0).expand(batch_size, -1, -1)


__all__ = ["ltx_rope_cos_sin", "apply_rotary_emb"]
