"""rmsnorm: RMSNorm over the last dimension, in either rounding the models use."""

from __future__ import annotations

from typing import Optional

import torch

from ._alloc import new_output
from ._autograd import refuse_autograd
from ._device import check_device, device_refusal
from ._ops import add_op_namespace_prefix, ops

ROUNDINGS = ("torch", "diffusers")
ROUNDING_ALIASES = {"torch": "torch", "B": "torch", "diffusers": "diffusers", "A": "diffusers"}


@torch.library.register_fake(add_op_namespace_prefix("rmsnorm"))
def _rmsnorm_fake(out: torch.Tensor, input: torch.Tensor, weight: Optional[torch.Tensor], eps: float,
                  diffusers_rounding: bool) -> None:
    return None


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
    refuse_autograd("rmsnorm", "input weight out", input, weight, out)
    mode = ROUNDING_ALIASES.get(rounding)
    if mode is None:
        raise ValueError(f"ltx_kernels.rmsnorm: `rounding` must be one of {ROUNDINGS}, got {rounding!r}")
    _check_rmsnorm_args(input, weight, eps, out)
    if out is None:
        dtype = input.dtype
        if (mode == "diffusers" and weight is not None and weight.dtype == torch.float32
                and input.dtype in (torch.float16, torch.bfloat16)):
            dtype = torch.float32
        out = new_output(input, dtype)
    check_device("rmsnorm", input)
    ops.rmsnorm(out, input, weight, float(eps), mode == "diffusers")
    return out
