"""rmsnorm: RMSNorm over the last dimension, in either rounding the models use.

Differentiable (issue 36): while autograd records, the call goes through the
functional op ``rmsnorm_fwd`` (output and per-row float32 rstd), whose backward
``rmsnorm_bwd`` (CUDA kernels, deterministic weight grad) is registered with
``torch.library.register_autograd``. Otherwise the out-variant op runs, as before.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._alloc import new_output
from ._autograd import NoBackwardError, records_autograd, saves_statistics
from ._device import check_device, device_refusal
from ._ops import add_op_namespace_prefix, ops

ROUNDINGS = ("torch", "diffusers")
ROUNDING_ALIASES = {"torch": "torch", "B": "torch", "diffusers": "diffusers", "A": "diffusers"}


@torch.library.register_fake(add_op_namespace_prefix("rmsnorm"))
def _rmsnorm_fake(out: torch.Tensor, input: torch.Tensor, weight: Optional[torch.Tensor], eps: float,
                  diffusers_rounding: bool) -> None:
    return None


def _out_dtype(input: torch.Tensor, weight: Optional[torch.Tensor], diffusers_rounding: bool) -> torch.dtype:
    """The input's dtype, or float32 for diffusers rounding with a float32 weight on a
    half input (diffusers does not round then and returns float32)."""
    if (diffusers_rounding and weight is not None and weight.dtype == torch.float32
            and input.dtype in (torch.float16, torch.bfloat16)):
        return torch.float32
    return input.dtype


@torch.library.register_fake(add_op_namespace_prefix("rmsnorm_fwd"))
def _rmsnorm_fwd_fake(input: torch.Tensor, weight: Optional[torch.Tensor], eps: float,
                      diffusers_rounding: bool):
    # Contiguous, as the binding allocates them.
    out = input.new_empty(input.shape, dtype=_out_dtype(input, weight, diffusers_rounding))
    return out, input.new_empty(input.shape[:-1], dtype=torch.float32)


@torch.library.register_fake(add_op_namespace_prefix("rmsnorm_bwd"))
def _rmsnorm_bwd_fake(grad_out: torch.Tensor, input: torch.Tensor, weight: Optional[torch.Tensor],
                      rstd: torch.Tensor, diffusers_rounding: bool, weight_requires_grad: bool):
    grad_weight = weight.new_empty(weight.shape) if weight is not None and weight_requires_grad else None
    return input.new_empty(input.shape), grad_weight


def _rmsnorm_setup_context(ctx, inputs, output) -> None:
    input, weight, _eps, diffusers_rounding = inputs
    _, rstd = output
    ctx.save_for_backward(input, weight, rstd)
    ctx.diffusers_rounding = diffusers_rounding
    saves_statistics(ctx, rstd)


def _rmsnorm_backward(ctx, grad_out: Optional[torch.Tensor], _grad_rstd):
    if grad_out is None:  # the output is outside the loss (grads are not materialized): no grads
        return None, None, None, None
    input, weight, rstd = ctx.saved_tensors
    weight_requires_grad = weight is not None and ctx.needs_input_grad[1]
    grad_input, grad_weight = ops.rmsnorm_bwd(grad_out, input, weight, rstd, ctx.diffusers_rounding,
                                              weight_requires_grad)
    return (grad_input if ctx.needs_input_grad[0] else None), grad_weight, None, None


torch.library.register_autograd(add_op_namespace_prefix("rmsnorm_fwd"), _rmsnorm_backward,
                                setup_context=_rmsnorm_setup_context)


_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_rmsnorm_args(input, weight, eps, out) -> None:
    """The binding's checks, raised from Python before the op is called: the
    traceback then points at the caller's line, and fake/meta calls under
    torch.compile get the same errors as real ones."""
    where = "ltx_kernels.rmsnorm: "
    if input.dim() < 1:
        raise RuntimeError(where + "`input` must have at least one dimension, got a 0-d tensor")
    if input.dtype not in _DTYPES:
        raise TypeError(where + f"`input` has dtype {input.dtype}; supported dtypes are torch.bfloat16, "
                        "torch.float16 and torch.float32")
    for name, t in (("weight", weight), ("out", out)):
        if t is None:
            continue
        if t.dtype not in (input.dtype, torch.float32):
            raise TypeError(where + f"`{name}` has dtype {t.dtype} but `input` has dtype {input.dtype}; "
                            f"`{name}` must have the input's dtype or torch.float32")
        if name == "weight" and (t.dim() != 1 or t.shape[0] != input.shape[-1]):
            raise RuntimeError(where + f"`weight` has shape {list(t.shape)} but must be [{input.shape[-1]}] "
                               "(the last dim of `input`)")
        if name == "out" and t.shape != input.shape:
            raise RuntimeError(where + f"`out` has shape {list(t.shape)} but `input` has shape "
                               f"{list(input.shape)}")
    if eps < 0:
        raise RuntimeError(where + f"`eps` must be >= 0, got {eps}")
    if input.device.type not in ("cuda", "meta"):
        raise device_refusal(where + f"`input` must be a CUDA tensor, got a tensor on {input.device}")
    for name, t in (("weight", weight), ("out", out)):
        if t is not None and t.device != input.device:
            raise RuntimeError(where + f"`{name}` is on {t.device} but `input` is on {input.device}")


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

    Differentiable in ``input`` and ``weight`` (CUDA backward kernels; the
    weight grad is deterministic). A call autograd records may not pass ``out``
    (:class:`NoBackwardError`), as with torch's ``out=`` arguments.

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
    recording = records_autograd(input, weight, out)
    if recording and out is not None:
        _refuse_out(input, weight, out)
    mode = ROUNDING_ALIASES.get(rounding)
    if mode is None:
        raise ValueError(f"ltx_kernels.rmsnorm: `rounding` must be one of {ROUNDINGS}, got {rounding!r}")
    _check_rmsnorm_args(input, weight, eps, out)
    if recording:
        check_device("rmsnorm", input)
        y, _ = ops.rmsnorm_fwd(input, weight, float(eps), mode == "diffusers")
        return y
    if out is None:
        out = new_output(input, _out_dtype(input, weight, mode == "diffusers"))
    check_device("rmsnorm", input)
    ops.rmsnorm(out, input, weight, float(eps), mode == "diffusers")
    return out


def _refuse_out(input, weight, out) -> None:
    needing = [f"`{name}`" for name, t in (("input", input), ("weight", weight), ("out", out))
               if t is not None and t.requires_grad]
    raise NoBackwardError(
        f"ltx_kernels.rmsnorm: {', '.join(needing)} {'requires' if len(needing) == 1 else 'require'} grad and "
        "grad mode is on, but a call with `out` has no backward (as with torch's out= arguments): call it "
        "without `out` to get a differentiable result, or under torch.no_grad() / torch.inference_mode() "
        "for inference.")
