"""Training through an optimised model: each op the fused forwards call runs on
the kernel where the kernel has its backward, and as the model's own eager code
where it has none, decided per op and per call.

:class:`AutogradKernel` wraps the loaded kernel and is what the fused forwards
and processors call. For each op of :data:`STOCK_OPS`:

- named in the kernel's ``DIFFERENTIABLE`` (``ltx_kernels.DIFFERENTIABLE``; a
  kernel without it has none): the kernel's op itself, which autograd records
  through its registered backward;
- otherwise: the kernel's op when autograd would not record the call (grad
  mode off, or no tensor argument requires grad: inference, a frozen model),
  and the stock formula below when it would;
- under ``torch.compile``, a recorded call runs the stock formula whether the
  kernel has the backward or not. Inductor fuses that code into its neighbours
  as well as our kernels do, and reuses dead buffers our opaque ops cannot
  (LoRA steps on an H200: GPU kernel time level or lower, fewer launches,
  gradients as stock compile's). Inference, eager training and frozen inputs
  still run the kernels (docs/performance.md#training-step).

The choice reads ``torch.is_grad_enabled()`` and each tensor argument's
``requires_grad``: plain Python on tensor attributes, which ``torch.compile``
traces as constants under its grad-mode and requires_grad guards (no graph
break). Ops the kernel gains a backward for are picked up by name, with no
change here. The formulas are diffusers' eager code as of 0.42.1 (the
``exact_mode=True`` roundings: docs/formulas.md), so an op without a backward
gives the gradient stock training would; ``exact_mode`` and the speed options
(``fast``, ``inplace``, ``out``) do not change them.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def _per_batch(t: Optional[Tensor], x: Tensor) -> Optional[Tensor]:
    """A ``[B, D]`` modulation tensor broadcast per sample over a 3-D ``x`` (Mochi, Flux)."""
    return t.unsqueeze(1) if t is not None and t.dim() == 2 and x.dim() == 3 else t


def _modulate(n: Tensor, scale: Tensor, shift: Optional[Tensor]) -> Tensor:
    n = n * (1 + scale)
    return n + shift if shift is not None else n


def _diffusers_rms_norm(x: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
    """diffusers' ``RMSNorm.forward``: the normalised value rounded before the weight."""
    h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    if weight is None:
        return h.to(x.dtype)
    if weight.dtype in (torch.float16, torch.bfloat16):
        h = h.to(weight.dtype)
    return h * weight


def rmsnorm(x, weight=None, eps=1e-6, out=None, *, rounding="torch"):
    if rounding == "torch":
        return F.rms_norm(x, (x.shape[-1],), weight, eps)  # torch.nn.RMSNorm
    return _diffusers_rms_norm(x, weight, eps)


def adaln_rmsnorm(x, weight, scale, shift, eps=1e-6, *, exact_mode=True):
    """LTX: ``norm1(h) * (1 + scale) + shift``."""
    return _modulate(_diffusers_rms_norm(x, weight, eps), _per_batch(scale, x), _per_batch(shift, x))


def gated_residual(x, y, gate=None, *, inplace=False, exact_mode=True):
    """``x + y * gate``; with a float32 gate on a lower-precision stream, Wan's
    ``(x.float() + y * gate).type_as(x)``."""
    gate = _per_batch(gate, x)
    if gate is None:
        return x + y
    if gate.dtype == torch.float32 and x.dtype != torch.float32:
        return (x.float() + y * gate).type_as(x)
    return x + y * gate


def gated_residual_rmsnorm(x, y, gate, scale, shift, eps=1e-6, *, weight=None, exact_mode=True):
    x = gated_residual(x, y, gate)
    return adaln_rmsnorm(x, weight, scale, shift, eps), x


def _fp32_layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float) -> Tensor:
    """diffusers' ``FP32LayerNorm``: float32 math, back to the input dtype."""
    return F.layer_norm(x.float(), (x.shape[-1],), None if weight is None else weight.float(),
                        None if bias is None else bias.float(), eps).to(x.dtype)


def adaln_layernorm(x, scale, shift, eps=1e-6, *, weight=None, bias=None, exact_mode=True):
    """Flux/Hunyuan (modulation of the model dtype): ``norm(x) * (1 + scale) + shift``,
    each op rounded; Wan (float32 modulation): ``(norm(x.float()) * (1 + scale) + shift).type_as(x)``."""
    scale, shift = _per_batch(scale, x), _per_batch(shift, x)
    if scale.dtype != torch.float32:
        return _modulate(F.layer_norm(x, (x.shape[-1],), weight, bias, eps), scale, shift)
    return _modulate(_fp32_layer_norm(x.float(), weight, bias, eps), scale, shift).type_as(x)


def gated_residual_layernorm(x, y, gate, eps=1e-6, *, weight=None, bias=None, scale=None, shift=None,
                             exact_mode=True):
    x = gated_residual(x, y, gate)
    if scale is None:  # Wan's norm2(h.float()).type_as(h)
        return _fp32_layer_norm(x, weight, bias, eps), x
    return adaln_layernorm(x, scale, shift, eps, weight=weight, bias=bias), x


def gelu_tanh(x, *, fast=False):
    return F.gelu(x, approximate="tanh")


def swiglu(input, *, silu_half="first", fast=False):
    first, second = input.chunk(2, dim=-1)
    return F.silu(first) * second if silu_half == "first" else first * F.silu(second)


def head_gate(x, logits, *, scale=2.0, exact_mode=True):
    """LTX-2's gated attention: each head of ``x`` times ``scale * sigmoid(logit)``."""
    heads = x.unflatten(-1, (logits.shape[-1], -1))
    return (heads * (scale * torch.sigmoid(logits)).unsqueeze(-1)).flatten(-2)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, rotation: str = "interleaved") -> Tensor:
    """diffusers' interleaved ``apply_rotary_emb`` (LTX, Flux, Wan's pairs), or
    rotate-half; float32 math, one rounding."""
    if rotation == "interleaved":
        real, imag = x.unflatten(-1, (-1, 2)).unbind(-1)
        rotated = torch.stack([-imag, real], dim=-1).flatten(-2)
    else:
        first, second = x.chunk(2, dim=-1)
        rotated = torch.cat([-second, first], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def apply_rotary_emb(x, cos, sin, *, out=None):
    return _rotate(x, cos, sin)


def qk_rmsnorm_rope(q, k, q_weight, k_weight, cos, sin, eps=1e-5, *, head_dim=None, rotation="interleaved",
                    rounding="torch", exact_mode=True, inplace=False):
    """``norm_q(q)``, ``norm_k(k)`` (over ``head_dim`` channels, or the whole last
    dim), each then rotated with the tables: one column per channel, per channel
    of a head (shared by the heads), or, over the whole row, columns repeating
    along it (Wan's one head of columns; broadcast, as Wan's processor does, so
    autograd saves the one shared table)."""
    cos = cos.unsqueeze(0) if cos.dim() == 2 else cos
    sin = sin.unsqueeze(0) if sin.dim() == 2 else sin

    def one(x, weight):
        rows = x.reshape(*x.shape[:2], -1)
        group = head_dim or rows.shape[-1]
        n = rmsnorm(rows.unflatten(-1, (-1, group)), weight, eps, rounding=rounding)
        if cos.shape[-1] == group:
            return _rotate(n, cos.unsqueeze(-2), sin.unsqueeze(-2), rotation).reshape(x.shape)
        if cos.shape[-1] < group:  # whole-row norm, repeating tables
            if rotation == "interleaved":  # pairs stay inside each repeat
                chunks = n.flatten(-2).unflatten(-1, (-1, cos.shape[-1]))
                return _rotate(chunks, cos.unsqueeze(-2), sin.unsqueeze(-2)).reshape(x.shape)
            tile = (1,) * (cos.dim() - 1) + (group // cos.shape[-1],)
            return _rotate(n.flatten(-2), cos.repeat(tile), sin.repeat(tile), rotation).reshape(x.shape)
        if rotation == "interleaved":
            return _rotate(n.flatten(-2), cos, sin).reshape(x.shape)
        return _rotate(n, cos.unflatten(-1, (-1, group)), sin.unflatten(-1, (-1, group)), rotation).reshape(x.shape)

    return one(q, q_weight), one(k, k_weight)


def modulated_rmsnorm(x, scale, eps=1e-6, *, exact_mode=True):
    """Mochi's modulated RMSNorm: float32 ``norm(x) * (1 + scale)``, one rounding."""
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (n * (1 + _per_batch(scale, x).float())).to(x.dtype)


def residual_tanh_gated_rmsnorm(x, x_res, gate, eps=1e-6, *, exact_mode=True):
    """Mochi: ``x + T(norm(x_res.float()) * tanh(gate))``."""
    xf = x_res.float()
    branch = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * torch.tanh(gate).unsqueeze(1)
    return x + branch.type_as(x)


# The ops the fused forwards call that take tensors autograd may track, and their stock code.
STOCK_OPS = {f.__name__: f for f in (
    rmsnorm, adaln_rmsnorm, gated_residual, gated_residual_rmsnorm, adaln_layernorm, gated_residual_layernorm,
    gelu_tanh, swiglu, head_gate, apply_rotary_emb, qk_rmsnorm_rope, modulated_rmsnorm, residual_tanh_gated_rmsnorm)}

def records_autograd(args, kwargs) -> bool:
    """Whether autograd would record a call with these arguments: grad mode on and a tensor that requires grad."""
    if not torch.is_grad_enabled():
        return False
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and value.requires_grad:
            return True
    return False


def compiled_and_recorded(args, kwargs) -> bool:
    """A recorded call that torch.compile traces (``is_compiling`` is a constant to Dynamo: no graph break)."""
    return torch.compiler.is_compiling() and records_autograd(args, kwargs)


def _stock_when(op, stock, when=records_autograd):
    """``op``, or ``stock`` for the calls where ``when(args, kwargs)``."""
    def call(*args, **kwargs):
        if when(args, kwargs):
            return stock(*args, **kwargs)
        return op(*args, **kwargs)

    call.__name__ = call.__qualname__ = getattr(op, "__name__", "op")
    return call


class AutogradKernel:
    """The kernel's public attributes, its ops as described in the module doc.
    ``inner`` is the kernel it wraps. ``linear_gelu`` (one GEMM with the GELU
    epilogue) runs, where a recorded call has no kernel backward or is traced by
    torch.compile, as the projection and then this wrapper's ``gelu_tanh``, as
    the stock ``GELU`` module does."""

    def __init__(self, kernel):
        self.inner = kernel
        for name in dir(kernel):
            if not name.startswith("_"):
                setattr(self, name, getattr(kernel, name))
        self.__name__ = getattr(kernel, "__name__", type(kernel).__name__)
        differentiable = frozenset(getattr(kernel, "DIFFERENTIABLE", ()))
        present = frozenset(name for name in STOCK_OPS if hasattr(kernel, name))
        self.stock_ops = present - differentiable
        for name in self.stock_ops:
            setattr(self, name, _stock_when(getattr(kernel, name), STOCK_OPS[name]))
        for name in present & differentiable:
            setattr(self, name, _stock_when(getattr(kernel, name), STOCK_OPS[name], compiled_and_recorded))
        if hasattr(kernel, "linear_gelu"):
            gelu = self.gelu_tanh if hasattr(kernel, "gelu_tanh") else gelu_tanh
            when = compiled_and_recorded if "linear_gelu" in differentiable else records_autograd
            self.linear_gelu = _stock_when(kernel.linear_gelu, lambda x, weight, bias: gelu(F.linear(x, weight, bias)),
                                           when)


def autograd_kernel(kernel) -> AutogradKernel:
    """``kernel`` wrapped (an :class:`AutogradKernel` is returned as it is)."""
    return kernel if isinstance(kernel, AutogradKernel) else AutogradKernel(kernel)


def unwrap(kernel):
    """The kernel an :class:`AutogradKernel` wraps; any other object as it is."""
    return kernel.inner if isinstance(kernel, AutogradKernel) else kernel


__all__ = ["AutogradKernel", "STOCK_OPS", "autograd_kernel", "compiled_and_recorded",
           "records_autograd", "unwrap"]
