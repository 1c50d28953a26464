"""Feed-forward activations: GELU-tanh (LTX's "gelu-approximate"), GEGLU,
SwiGLU, Linear + bias + GELU-tanh through cuBLASLt's GELU epilogue, and
LTX-2's per-head sigmoid gate on the attention output (``head_gate``).

Each is computed in float32 with PyTorch's own formulas and rounded like the
eager code it replaces: ``F.gelu(x, approximate="tanh")`` rounds once; the
gated forms round the activation before the product, as ``F.gelu(a) * b`` does.

``fast=True`` (GELU-tanh and SiLU) computes the same function as
``x / (1 + exp(-v))`` with the GPU's approximate exp and division
(``v = 2·sqrt(2/pi)·(x + 0.044715·x³)`` for GELU-tanh, ``v = x`` for SiLU),
fewer instructions per element. Its float32 relative error is below 5e-5
(from rounding exp's argument); bf16/fp16 results are within one ulp of the
correctly rounded value, so where ``|y| > 1e-3`` they equal eager PyTorch's but
for rounding ties. In GELU-tanh's negative tail eager's ``1 + tanh(u)``
cancels (it returns 0, or a coarse multiple of ~3e-8·x, for x below about -5)
and the fast form returns the small true value instead (down to ~1e-30; below
that, 0).
"""

from __future__ import annotations

import torch

from ._alloc import new_output
from ._autograd import refuse_autograd
from ._device import check_device, device_refusal
from ._ops import add_op_namespace_prefix, ops

Tensor = torch.Tensor
_HALVES = ("first", "second")


def _fake(out, *args) -> None:
    return None


for _name in ("gelu_tanh", "geglu", "swiglu", "head_gate"):
    torch.library.register_fake(add_op_namespace_prefix(_name))(_fake)


def gelu_tanh(x: Tensor, *, fast: bool = False) -> Tensor:
    """``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))`` in float32,
    one rounding: ``F.gelu(x, approximate="tanh")`` (bitwise). ``fast=True``: the
    same function through approximate exp/division (see the module docstring)."""
    refuse_autograd("gelu_tanh", "x", x)
    out = new_output(x)
    check_device("gelu_tanh", x)
    try:
        ops.gelu_tanh(out, x, bool(fast))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out


def _gated_output(name: str, input: Tensor, half: str) -> Tensor:
    """The ``[..., H]`` output of a gated activation of ``input`` ``[..., 2H]``."""
    if half not in _HALVES:
        raise ValueError(f"ltx_kernels.{name}: the activated half must be 'first' or 'second', got {half!r}")
    if input.dim() < 1 or input.shape[-1] % 2:
        raise RuntimeError(f"ltx_kernels.{name}: the last dim of `input` must be even ([..., 2H]), "
                           f"got shape {list(input.shape)}")
    return torch.empty((*input.shape[:-1], input.shape[-1] // 2), dtype=input.dtype, device=input.device)


def geglu(input: Tensor, approximate: bool = True, *, gelu_half: str = "first", fast: bool = False) -> Tensor:
    """GEGLU: ``[..., 2H] -> [..., H]``, ``T(T(GELU(a)) * b)``.

    ``a`` is the ``gelu_half`` ("first" by default) and ``b`` the other half;
    diffusers' ``GEGLU`` activates the second half (``gelu_half="second"``).
    ``approximate=True`` is GELU-tanh, ``False`` the erf GELU. ``fast=True``
    (GELU-tanh only) computes GELU(a) through approximate exp/division (module
    docstring); the rounding before the product stays.
    """
    refuse_autograd("geglu", "input", input)
    if fast and not approximate:
        raise ValueError("ltx_kernels.geglu: fast=True is only available for the tanh GELU (approximate=True)")
    out = _gated_output("geglu", input, gelu_half)
    check_device("geglu", input)
    try:
        ops.geglu(out, input, bool(approximate), gelu_half == "first", bool(fast))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out


def swiglu(input: Tensor, *, silu_half: str = "first", fast: bool = False) -> Tensor:
    """SwiGLU: ``[..., 2H] -> [..., H]``, ``T(T(SiLU(a)) * b)``, ``SiLU(a) = a / (1 + exp(-a))``.

    ``silu_half="first"`` is genmo's Mochi (``silu(a) * g``); diffusers'
    ``SwiGLU`` activates the second half (``silu_half="second"``). ``fast=True``
    computes SiLU(a) through approximate exp/division (module docstring).
    """
    refuse_autograd("swiglu", "input", input)
    out = _gated_output("swiglu", input, silu_half)
    check_device("swiglu", input)
    try:
        ops.swiglu(out, input, silu_half == "first", bool(fast))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out


def head_gate(x: Tensor, logits: Tensor, *, scale: float = 2.0, exact_mode: bool = True) -> Tensor:
    """LTX-2's per-head attention gate: ``x`` ``[..., H * D]`` times ``scale * sigmoid(logits)``,
    ``logits`` ``[..., H]`` (one gate per head, shared by the head's ``D`` channels). A new tensor of
    ``x``'s shape and dtype.

    ``exact_mode=True`` is diffusers' ``LTX2AudioVideoAttnProcessor`` bit for bit on the GPU::

        g   = T(sigmoid(logits))       # torch.sigmoid: 1 / (1 + exp(-l)) in float32, rounded once
        g2  = T(scale * g)             # 2.0 * torch.sigmoid(gate_logits)
        out = T(x * g2)                # hidden_states.unflatten(2, (H, -1)) * gates.unsqueeze(-1)

    ``exact_mode=False`` computes ``T(x * scale * sigmoid(logits))`` in float32 with one rounding:
    ``|out - ref| <= (u + 6e-7) * |ref| + s / 2`` with ``ref`` the real-number value, ``u`` the
    dtype's unit roundoff (2^-8 bfloat16, 2^-11 float16, 0 float32) and ``s`` its smallest
    subnormal. The 6e-7 is the float32 part (expf's 2 ulp, the add, the division, ``scale`` rounded
    to float32 and two products: 5.4e-7), for logits above -87; below, the float32 sigmoid is
    subnormal and only an absolute error of ``2^-150 * scale * |x|`` holds there. In float32 both
    modes are the same computation.

    ``x`` and ``logits`` share one dtype (bfloat16, float16 or float32) and their leading dims; ``H``
    must divide ``x.shape[-1]``. Non-contiguous inputs are copied once. Head dims of whole 16-byte
    words (8 half or 4 float32 elements) take the vectorised kernel; any other head dim, or a
    misaligned ``x``, the scalar one.
    """
    refuse_autograd("head_gate", "x logits", x, logits)
    out = new_output(x)
    check_device("head_gate", x)
    try:
        ops.head_gate(out, x, logits, float(scale), bool(exact_mode))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out


def linear_gelu(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``GELU_tanh(x @ weight.T + bias)`` in one cuBLASLt GEMM with the GELU
    epilogue (``torch._addmm_activation``), for the feed-forward up-projection.

    The epilogue applies GELU-tanh to the float32 accumulator and rounds once,
    so the result is close to, not bitwise, ``F.gelu(F.linear(x, w, b),
    approximate="tanh")`` (which rounds the linear output first). CUDA only: on
    the CPU ``_addmm_activation`` would apply the erf GELU.
    """
    refuse_autograd("linear_gelu", "x weight bias", x, weight, bias)
    if x.device.type != "cuda":
        raise device_refusal(f"ltx_kernels.linear_gelu: `x` must be a CUDA tensor, got a tensor on {x.device}")
    if weight.dim() != 2 or bias.dim() != 1 or weight.shape[1] != x.shape[-1] or bias.shape[0] != weight.shape[0]:
        raise RuntimeError(f"ltx_kernels.linear_gelu: shapes x {list(x.shape)}, weight {list(weight.shape)}, "
                           f"bias {list(bias.shape)} do not make x @ weight.T + bias")
    x2 = x.reshape(-1, x.shape[-1])
    y = torch._addmm_activation(bias, x2, weight.t(), use_gelu=True)
    return y.reshape(*x.shape[:-1], weight.shape[0])


__all__ = ["gelu_tanh", "geglu", "swiglu", "head_gate", "linear_gelu"]
