"""Rotary position embedding by token position, computed in the kernel (no
cos/sin tables): 3-D for video tokens (Wan's split of the head dim into time,
height and width parts) and 1-D for text, applied to query and key in place.

Differentiable in query and key (issue 36): while autograd records, the
rotation runs out of place through the functional op ``rope_axes_fwd`` (query
and key are left as they are and the rotated tensors are returned: an in-place
op on a leaf that requires grad is an error in torch), whose backward, the
rotation by -angle of the grads (the same kernel), is registered with
``torch.library.register_autograd``.
"""

from __future__ import annotations

from typing import Tuple

import torch

from ._autograd import records_autograd
from ._device import check_device, device_refusal
from ._ops import add_op_namespace_prefix, ops

Tensor = torch.Tensor


@torch.library.register_fake(add_op_namespace_prefix("rope_3d"))
def _rope_3d_fake(query, key, num_frames, height, width, theta_base) -> None:
    return None


@torch.library.register_fake(add_op_namespace_prefix("rope_1d"))
def _rope_1d_fake(query, key, theta_base) -> None:
    return None


@torch.library.register_fake(add_op_namespace_prefix("rope_axes_fwd"))
def _rope_axes_fwd_fake(query, key, num_frames, height, width, theta_base, three_d, inverse):
    return query.new_empty(query.shape), key.new_empty(key.shape)  # contiguous, as the binding allocates them


def _rope_axes_setup_context(ctx, inputs, output) -> None:
    _query, _key, *ctx.rest, inverse = inputs  # the grid, theta_base and three_d: the backward's too
    ctx.inverse = inverse


def _rope_axes_backward(ctx, grad_query: Tensor, grad_key: Tensor):
    # The transpose of a rotation is the rotation by -angle: the same op, inverse flipped (and so
    # differentiable again). Grads arrive in the outputs' dtype, the inputs'.
    dq, dk = ops.rope_axes_fwd(grad_query, grad_key, *ctx.rest, not ctx.inverse)
    return dq, dk, None, None, None, None, None, None


torch.library.register_autograd(add_op_namespace_prefix("rope_axes_fwd"), _rope_axes_backward,
                                setup_context=_rope_axes_setup_context)


def _recorded(op: str, query: Tensor, key: Tensor, grid: Tuple[int, int, int], theta_base: float,
              three_d: bool) -> Tuple[Tensor, Tensor]:
    check_device(op, query)
    try:
        return ops.rope_axes_fwd(query, key, *grid, float(theta_base), three_d, False)
    except RuntimeError as error:
        raise device_refusal(error) from None


def rope_3d_split(head_dim: int) -> Tuple[int, int, int]:
    """Channels of the (time, height, width) parts of a head dim, as Wan splits it:
    ``d_h = d_w = 2 * (head_dim // 6)``, ``d_t = head_dim - d_h - d_w``
    (128 -> (44, 42, 42), 64 -> (24, 20, 20))."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def rope_3d(query: Tensor, key: Tensor, num_frames: int, height: int, width: int,
            theta_base: float = 10000.0) -> Tuple[Tensor, Tensor]:
    """3-D RoPE of video tokens, in place on ``query`` and ``key``; returns ``(query, key)``.

    ``query`` is ``[batch, num_frames * height * width, heads_q, head_dim]`` and ``key``
    ``[batch, same seq, heads_k, head_dim]`` (GQA: the head counts may differ), tokens
    ordered frame-major, then row, then column: token ``s`` sits at
    ``f = s // (height * width)``, ``h = (s // width) % height``, ``w = s % width``.

    The head dim is split in three consecutive parts (time, height, width) of
    ``d_t, d_h, d_w`` channels with ``d_h = d_w = 2 * (head_dim // 6)`` and
    ``d_t = head_dim - d_h - d_w`` (128 -> 44/42/42, 64 -> 24/20/20; see
    :func:`rope_3d_split`), as Wan 2.1 does. In a part of ``d`` channels for axis
    position ``p`` (f, h or w), pair ``j`` (its channels ``2j`` and ``2j + 1``) turns by
    ``angle = p * theta_base ** (-2j / d)``::

        out[2j]   = x[2j]   * cos(angle) - x[2j+1] * sin(angle)
        out[2j+1] = x[2j+1] * cos(angle) + x[2j]   * sin(angle)

    computed in float32 and rounded once to the tensor's dtype (bf16, fp16 or fp32),
    the rotation of diffusers' ``WanAttnProcessor`` (and of Wan's float64 complex
    multiply, up to that rounding).

    Precision: the angles are computed in the kernel. The frequencies are formed in
    float64 on the host and passed as two float32 parts, ``p * freq`` is carried to
    about 2^-46 relative, and ``sincosf`` of its float32 part is corrected to second
    order for the remainder (angles above 2^17 rad, only reached with positions
    >= 2^17, take a float64 ``sincos``), so cos and sin are within a few float32 ulps
    (about 3e-7) of the exact values at every position. The rotation uses FMA. In
    bf16/fp16 the result is the correctly rounded exact value except where that lies
    within ~1e-6 (relative to ``|x[2j]| + |x[2j+1]|``) of a rounding boundary, where it
    may be one ulp off; in fp32 the error is below ~1e-6 * (``|x[2j]| + |x[2j+1]|``).

    Layout: any strides with a contiguous last dim (e.g. ``[B, H, S, D]`` transposed,
    or disjoint ``unbind`` views of a fused qkv tensor) are rotated in place; 16-byte
    words are used when head_dim, the pointers and the strides allow it, a scalar
    path otherwise. Every element is read once and written once, on the tensors'
    device and current CUDA stream. Zero-size input is a no-op.

    Errors name the argument: CPU tensors, dtypes other than bf16/fp16/fp32 or
    different for query and key, shapes that are not 4-D or differ in batch, seq or
    head_dim, ``num_frames * height * width != seq``, odd ``head_dim`` or one above 512,
    an axis size above 2^24, ``theta_base`` not finite and > 0, a non-contiguous last
    dim, a tensor that overlaps itself (e.g. expanded) or query and key that overlap.

    Autograd: differentiable in ``query`` and ``key``. While autograd records (grad
    mode on and query or key requiring grad) the rotation is out of place: ``query``
    and ``key`` are left unchanged and new rotated contiguous tensors are returned, so
    use the returned pair. The backward turns the grads by ``-angle`` with the same
    kernel and roundings (``dx[2j] = dy[2j] * cos + dy[2j+1] * sin``,
    ``dx[2j+1] = dy[2j+1] * cos - dy[2j] * sin``).
    """
    if records_autograd(query, key):
        return _recorded("rope_3d", query, key, (num_frames, height, width), theta_base, True)
    check_device("rope_3d", query)
    try:
        ops.rope_3d(query, key, num_frames, height, width, float(theta_base))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return query, key


def rope_1d(query: Tensor, key: Tensor, theta_base: float = 10000.0) -> Tuple[Tensor, Tensor]:
    """1-D RoPE of text tokens, in place on ``query`` and ``key``; returns ``(query, key)``.

    ``query`` and ``key`` are ``[batch, seq, heads, head_dim]`` (head counts may differ).
    Token ``s`` has position ``s`` and pair ``j`` (channels ``2j``, ``2j + 1``) turns by
    ``angle = s * theta_base ** (-2j / head_dim)``::

        out[2j]   = x[2j]   * cos(angle) - x[2j+1] * sin(angle)
        out[2j+1] = x[2j+1] * cos(angle) + x[2j]   * sin(angle)

    in float32 with one rounding to the tensor's dtype. ``seq`` must be at most 2^24.
    Precision, layouts, errors and the in-place contract are those of :func:`rope_3d`
    (it is the same kernel with a ``[seq, 1, 1]`` grid and a single part), and so is
    autograd: while it records, the rotation is out of place and the new pair is returned.
    """
    if records_autograd(query, key):
        return _recorded("rope_1d", query, key, (0, 1, 1), theta_base, False)
    check_device("rope_1d", query)
    try:
        ops.rope_1d(query, key, float(theta_base))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return query, key


__all__ = ["rope_3d", "rope_1d", "rope_3d_split"]
