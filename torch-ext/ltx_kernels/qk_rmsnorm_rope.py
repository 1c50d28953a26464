"""Fused q/k RMSNorm + rotary embedding: one read and one write of q and k.

LTX-Video normalises q and k over the whole inner dim (``torch.nn.RMSNorm(D,
eps=1e-5)``, all heads together) and then rotates them with its interleaved
RoPE; Flux, Mochi and HunyuanVideo normalise each head and rotate per head.

Differentiable in q, k and both weights (issue 36): while autograd records,
the call goes through the functional op ``qk_rmsnorm_rope_fwd`` (the same
forward kernels), whose backward ``qk_rmsnorm_rope_bwd`` (CUDA kernel,
deterministic weight grads) is registered with ``torch.library.register_autograd``.
The cos/sin tables are constants.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._alloc import new_output
from ._autograd import records_autograd, refuse_constant_grads, refuse_out
from ._device import check_device, device_refusal
from ._ops import add_op_namespace_prefix, ops

Tensor = torch.Tensor
_ROTATIONS = ("interleaved", "half")
_ROUNDINGS = {"torch": False, "B": False, "diffusers": True, "A": True}


@torch.library.register_fake(add_op_namespace_prefix("qk_rmsnorm_rope"))
def _qk_rmsnorm_rope_fake(q_out, k_out, q, k, q_weight, k_weight, cos, sin, head_dim, eps, rotation,
                          diffusers_rounding, exact_mode) -> None:
    return None


@torch.library.register_fake(add_op_namespace_prefix("qk_rmsnorm_rope_fwd"))
def _qk_fwd_fake(q, k, q_weight, k_weight, cos, sin, head_dim, eps, rotation, diffusers_rounding, exact_mode):
    return q.new_empty(q.shape), k.new_empty(k.shape)  # contiguous, as the binding allocates them


@torch.library.register_fake(add_op_namespace_prefix("qk_rmsnorm_rope_bwd"))
def _qk_bwd_fake(grad_q, grad_k, q, k, q_weight, k_weight, cos, sin, head_dim, eps, rotation, diffusers_rounding,
                 q_weight_requires_grad, k_weight_requires_grad):
    dwq = q_weight.new_empty(q_weight.shape) if q_weight is not None and q_weight_requires_grad else None
    dwk = k_weight.new_empty(k_weight.shape) if k_weight is not None and k_weight_requires_grad else None
    return q.new_empty(q.shape), k.new_empty(k.shape), dwq, dwk


def _qk_setup_context(ctx, inputs, output) -> None:
    q, k, q_weight, k_weight, cos, sin, head_dim, eps, rotation, diffusers_rounding, _exact = inputs
    ctx.save_for_backward(q, k, q_weight, k_weight, cos, sin)
    ctx.options = (head_dim, eps, rotation, diffusers_rounding)


def _qk_backward(ctx, grad_q: Tensor, grad_k: Tensor):
    q, k, q_weight, k_weight, cos, sin = ctx.saved_tensors
    need = ctx.needs_input_grad
    dq, dk, dwq, dwk = ops.qk_rmsnorm_rope_bwd(
        grad_q.to(q.dtype), grad_k.to(k.dtype), q, k, q_weight, k_weight, cos, sin, *ctx.options,
        q_weight is not None and need[2], k_weight is not None and need[3])
    return (dq if need[0] else None, dk if need[1] else None, dwq, dwk) + (None,) * 7


torch.library.register_autograd(add_op_namespace_prefix("qk_rmsnorm_rope_fwd"), _qk_backward,
                                setup_context=_qk_setup_context)


def _as_rows(name: str, t: Tensor, head_dim: Optional[int], inplace: bool) -> Tuple[Tensor, int]:
    """``[B, S, D]`` (head_dim given or D) or ``[B, S, H, Dh]`` (head_dim = Dh) as ``[B, S, D]``
    (a view when writing in place, so the results land in `t`)."""
    if t.dim() == 4:
        if head_dim is not None and head_dim != t.shape[-1]:
            raise RuntimeError(f"ltx_kernels.qk_rmsnorm_rope: `{name}` is [B, S, H, Dh] with Dh={t.shape[-1]} "
                               f"but head_dim={head_dim}")
        shape = (t.shape[0], t.shape[1], t.shape[2] * t.shape[3])  # not -1: zero-size input must reshape too
        rows = t.view(shape) if inplace else t.reshape(shape)
        return rows, t.shape[-1]
    if t.dim() != 3:
        raise RuntimeError(f"ltx_kernels.qk_rmsnorm_rope: `{name}` must be [B, S, D] or [B, S, H, Dh], "
                           f"got shape {list(t.shape)}")
    return t, head_dim if head_dim is not None else t.shape[-1]


def qk_rmsnorm_rope(
    q: Tensor,
    k: Tensor,
    q_weight: Optional[Tensor],
    k_weight: Optional[Tensor],
    cos: Tensor,
    sin: Tensor,
    eps: float = 1e-5,
    *,
    head_dim: Optional[int] = None,
    rotation: str = "interleaved",
    rounding: str = "torch",
    exact_mode: bool = True,
    inplace: bool = False,
    out: Optional[Tuple[Tensor, Tensor]] = None,
) -> Tuple[Tensor, Tensor]:
    """RMSNorm of q and k, then RoPE, in one pass: ``(rope(norm_q(q)), rope(norm_k(k)))``.

    Per norm group (the whole last dim when ``head_dim`` is None, as LTX-Video;
    each head of ``head_dim`` channels otherwise), in float32:
    ``r = rsqrt(mean(x ** 2) + eps)``, ``n = x * r * w`` (``rounding="torch"``,
    ``torch.nn.RMSNorm``) or ``n = T(x * r) * w`` (``rounding="diffusers"``,
    diffusers' ``RMSNorm``). Then, for each pair ``(a, b)`` of channels,
    ``out_a = T(n_a * cos_a - n_b * sin_a)`` and ``out_b = T(n_b * cos_b + n_a * sin_b)``,
    with pairs ``(2i, 2i+1)`` (``rotation="interleaved"``, diffusers'
    ``apply_rotary_emb`` of LTX, Flux, Hunyuan) or ``(i, i + head_dim/2)`` within
    each head (``rotation="half"``, rotate-half).

    ``exact_mode=True`` rounds ``n`` to the input dtype before the rotation, as
    the eager chain does (the norm's output is a tensor of that dtype): the result
    is bitwise ``apply_rotary_emb(norm_q(q), (cos, sin))``. ``exact_mode=False``
    keeps ``n`` in float32 (one rounding, closer to the exact value).

    Args:
        q, k: ``[B, S, D]`` or ``[B, S, H, Dh]``, same shape and dtype (bf16, fp16,
            fp32), on CUDA.
        q_weight, k_weight: ``[head_dim]`` (``[D]`` when normalising over D) of the
            input dtype or float32, or None.
        cos, sin: float32 ``[S, C]`` or ``[B or 1, S, C]`` with ``C = D`` (one column
            per channel, e.g. :func:`ltx_rope_cos_sin`) or ``C = head_dim`` (shared by
            all heads); with ``head_dim=None`` also any even divisor of D, channel c
            reading column ``c % C`` (Wan: one head's ``D / H`` columns, shared by the
            heads of a whole-row norm). A batch stride of 0 reads them once per token.
        eps: added to the mean square (LTX: 1e-5).
        head_dim: the norm group; None normalises over the whole last dim (and
            ``rotation="half"`` then pairs ``(i, i + D/2)`` across it).
        inplace: write the results into q and k.
        out: ``(q_out, k_out)`` to write the results into, of q's shape and dtype with the
            channels of a token contiguous; views of a larger tensor serve (Mochi writes
            the video tokens into its joint ``[video | text]`` q and k).

    Returns:
        ``(q_out, k_out)``, of the inputs' shapes (``out`` where given).

    Autograd: differentiable in ``q``, ``k``, ``q_weight`` and ``k_weight``. With
    ``m = x * r``, ``dn = R^T(dy)`` (the transposed rotation: per pair ``(a, b)``,
    ``dn_a = dy_a * cos_a + dy_b * sin_b``, ``dn_b = dy_b * cos_b - dy_a * sin_a``) and
    ``g = dn * w``: ``dx = r * (g - m * mean(g * m))`` per norm group and
    ``dw = sum(dn * m)`` over rows and heads (``m`` rounded to the input dtype first
    under ``rounding="diffusers"``), float32 inside, the roundings of the forward
    taken as identities, ``r`` recomputed from ``x``. The weight grads are
    deterministic (fixed-order sums). ``cos``/``sin`` are constants: one that
    requires grad while autograd records raises :class:`NoBackwardError`, and so
    do ``inplace=True`` and ``out``.
    """
    outs = _check_out(q, out, inplace)
    recording = records_autograd(q, k, q_weight, k_weight, cos, sin, *outs)
    if recording:
        refuse_constant_grads("qk_rmsnorm_rope", "cos sin", "q k q_weight k_weight", cos, sin)
        if inplace or out is not None:
            refuse_out("qk_rmsnorm_rope", "q k q_weight k_weight out[0] out[1]", "inplace" if inplace else "out",
                       q, k, q_weight, k_weight, *outs)
    if rotation not in _ROTATIONS:
        raise ValueError(f"ltx_kernels.qk_rmsnorm_rope: `rotation` must be one of {list(_ROTATIONS)}, "
                         f"got {rotation!r}")
    if rounding not in _ROUNDINGS:
        raise ValueError(f"ltx_kernels.qk_rmsnorm_rope: `rounding` must be 'torch' or 'diffusers', got {rounding!r}")
    q3, hd = _as_rows("q", q, head_dim, inplace)
    k3, hd_k = _as_rows("k", k, head_dim, inplace)
    if hd != hd_k:
        raise RuntimeError(f"ltx_kernels.qk_rmsnorm_rope: `q` and `k` have head dims {hd} and {hd_k}")
    cos = cos.unsqueeze(0) if cos.dim() == 2 else cos
    sin = sin.unsqueeze(0) if sin.dim() == 2 else sin
    if recording:
        check_device("qk_rmsnorm_rope", q3)
        try:
            q_out, k_out = ops.qk_rmsnorm_rope_fwd(q3, k3, q_weight, k_weight, cos, sin, hd, float(eps), rotation,
                                                   _ROUNDINGS[rounding], bool(exact_mode))
        except RuntimeError as error:
            raise device_refusal(error) from None
        return q_out.view(q.shape), k_out.view(k.shape)
    if out is not None:
        q_out, k_out = (_as_rows(f"out[{i}]", t, head_dim, inplace=True)[0] for i, t in enumerate(out))
    else:
        q_out = q3 if inplace else new_output(q3)
        k_out = k3 if inplace else new_output(k3)
    check_device("qk_rmsnorm_rope", q3)
    try:
        ops.qk_rmsnorm_rope(q_out, k_out, q3, k3, q_weight, k_weight, cos, sin, hd, float(eps), rotation,
                            _ROUNDINGS[rounding], bool(exact_mode))
    except RuntimeError as error:
        raise device_refusal(error) from None
    if inplace:
        return q, k
    if out is not None:
        return out
    return q_out.view(q.shape), k_out.view(k.shape)


def _check_out(q: Tensor, out, inplace: bool) -> Tuple[Tensor, ...]:
    """``out`` as a tuple (empty for None) once it is two tensors of q's shape that view as rows."""
    if out is None:
        return ()
    if inplace:
        raise ValueError("ltx_kernels.qk_rmsnorm_rope: give `out` or `inplace=True`, not both")
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, Tensor) for t in out)):
        raise TypeError("ltx_kernels.qk_rmsnorm_rope: `out` must be a pair of tensors (q_out, k_out)")
    for i, t in enumerate(out):
        if t.shape != q.shape:
            raise RuntimeError(f"ltx_kernels.qk_rmsnorm_rope: `out[{i}]` has shape {list(t.shape)} but `q` has "
                               f"shape {list(q.shape)}")
        if t.dtype != q.dtype or t.device != q.device:  # the binding writes q's dtype into whatever it is given
            raise TypeError(f"ltx_kernels.qk_rmsnorm_rope: `out[{i}]` is {t.dtype} on {t.device} but `q` is "
                            f"{q.dtype} on {q.device}")
        if t.dim() == 4 and t.shape[2] > 1 and t.stride(2) != t.shape[3] * t.stride(3):
            raise RuntimeError(f"ltx_kernels.qk_rmsnorm_rope: `out[{i}]` must hold each token's channels "
                               f"contiguously (strides {list(t.stride())})")
    return tuple(out)


__all__ = ["qk_rmsnorm_rope"]
