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

Differentiable (issue 36): ``gelu_tanh``, ``geglu``, ``swiglu`` and ``head_gate``,
called while autograd records, run functional ops (``<op>_fwd``) whose backward
(``<op>_bwd``, CUDA kernels that recompute from the saved input alone) is
registered with ``torch.library.register_autograd``; ``linear_gelu`` then runs
``F.linear`` and the differentiable ``gelu_tanh``. Otherwise the out-variant ops
run as before. The backward formulas and roundings are eager autograd's
(``kernel_src/activation/activation.h``, docs/api.md#autograd).
"""

from __future__ import annotations

import torch

from ._alloc import new_output
from ._autograd import records_autograd
from ._device import check_device, device_refusal
from ._ops import add_op_namespace_prefix, ops

Tensor = torch.Tensor
_HALVES = ("first", "second")


def _fake(out, *args) -> None:
    return None


for _name in ("gelu_tanh", "geglu", "swiglu", "head_gate"):
    torch.library.register_fake(add_op_namespace_prefix(_name))(_fake)


# --- the functional ops autograd records, and their backwards ------------------------------------

def _halved(input: Tensor) -> Tensor:
    return input.new_empty((*input.shape[:-1], input.shape[-1] // 2))


@torch.library.register_fake(add_op_namespace_prefix("gelu_tanh_fwd"))
def _gelu_tanh_fwd_fake(x: Tensor, fast: bool) -> Tensor:
    return x.new_empty(x.shape)


@torch.library.register_fake(add_op_namespace_prefix("geglu_fwd"))
def _geglu_fwd_fake(input: Tensor, approximate: bool, gelu_first: bool, fast: bool) -> Tensor:
    return _halved(input)


@torch.library.register_fake(add_op_namespace_prefix("swiglu_fwd"))
def _swiglu_fwd_fake(input: Tensor, silu_first: bool, fast: bool) -> Tensor:
    return _halved(input)


@torch.library.register_fake(add_op_namespace_prefix("head_gate_fwd"))
def _head_gate_fwd_fake(x: Tensor, logits: Tensor, scale: float, exact: bool) -> Tensor:
    return x.new_empty(x.shape)


@torch.library.register_fake(add_op_namespace_prefix("gelu_tanh_bwd"))
def _gelu_tanh_bwd_fake(grad_out: Tensor, x: Tensor) -> Tensor:
    return x.new_empty(x.shape)


@torch.library.register_fake(add_op_namespace_prefix("geglu_bwd"))
def _geglu_bwd_fake(grad_out: Tensor, input: Tensor, approximate: bool, gelu_first: bool, fast: bool) -> Tensor:
    return input.new_empty(input.shape)


@torch.library.register_fake(add_op_namespace_prefix("swiglu_bwd"))
def _swiglu_bwd_fake(grad_out: Tensor, input: Tensor, silu_first: bool, fast: bool) -> Tensor:
    return input.new_empty(input.shape)


@torch.library.register_fake(add_op_namespace_prefix("head_gate_bwd"))
def _head_gate_bwd_fake(grad_out: Tensor, x: Tensor, logits: Tensor, scale: float, exact: bool,
                        logits_requires_grad: bool):
    return x.new_empty(x.shape), (logits.new_empty(logits.shape) if logits_requires_grad else None)


def _save_input(ctx, inputs, output) -> None:
    """Every activation's backward recomputes from its tensor input (the first) and its flags."""
    ctx.save_for_backward(inputs[0])
    ctx.flags = inputs[1:]


def _gelu_tanh_backward(ctx, grad: Tensor):
    (x,) = ctx.saved_tensors
    return ops.gelu_tanh_bwd(grad, x), None


def _geglu_backward(ctx, grad: Tensor):
    (input,) = ctx.saved_tensors
    return (ops.geglu_bwd(grad, input, *ctx.flags), None, None, None)


def _swiglu_backward(ctx, grad: Tensor):
    (input,) = ctx.saved_tensors
    return (ops.swiglu_bwd(grad, input, *ctx.flags), None, None)


def _head_gate_setup_context(ctx, inputs, output) -> None:
    x, logits, scale, exact = inputs
    ctx.save_for_backward(x, logits)
    ctx.scale, ctx.exact = scale, exact


def _head_gate_backward(ctx, grad: Tensor):
    x, logits = ctx.saved_tensors
    grad_x, grad_logits = ops.head_gate_bwd(grad, x, logits, ctx.scale, ctx.exact, ctx.needs_input_grad[1])
    return (grad_x if ctx.needs_input_grad[0] else None), grad_logits, None, None


for _name, _backward, _setup in (("gelu_tanh_fwd", _gelu_tanh_backward, _save_input),
                                 ("geglu_fwd", _geglu_backward, _save_input),
                                 ("swiglu_fwd", _swiglu_backward, _save_input),
                                 ("head_gate_fwd", _head_gate_backward, _head_gate_setup_context)):
    torch.library.register_autograd(add_op_namespace_prefix(_name), _backward, setup_context=_setup)


def _recorded(name: str, op, *args) -> Tensor:
    """The functional op autograd records, with the out-variant's device refusal."""
    check_device(name, args[0])
    try:
        return op(*args)
    except RuntimeError as error:
        raise device_refusal(error) from None


def gelu_tanh(x: Tensor, *, fast: bool = False) -> Tensor:
    """``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))`` in float32,
    one rounding: ``F.gelu(x, approximate="tanh")`` (bitwise). ``fast=True``: the
    same function through approximate exp/division (see the module docstring).

    Differentiable: ``dx = T(dy * gelu'(x))``, PyTorch's GeluBackward formula in float32
    (with ``fast=True`` too: the derivative of the function the fast form approximates)."""
    if records_autograd(x):
        return _recorded("gelu_tanh", ops.gelu_tanh_fwd, x, bool(fast))
    out = new_output(x)
    check_device("gelu_tanh", x)
    try:
        ops.gelu_tanh(out, x, bool(fast))
    except RuntimeError as error:
        raise device_refusal(error) from None
    return out


def _check_gated(name: str, input: Tensor, half: str) -> None:
    """``half`` names a half and ``input`` ``[..., 2H]`` has one."""
    if half not in _HALVES:
        raise ValueError(f"ltx_kernels.{name}: the activated half must be 'first' or 'second', got {half!r}")
    if input.dim() < 1 or input.shape[-1] % 2:
        raise RuntimeError(f"ltx_kernels.{name}: the last dim of `input` must be even ([..., 2H]), "
                           f"got shape {list(input.shape)}")


def _gated_output(name: str, input: Tensor, half: str) -> Tensor:
    """The ``[..., H]`` output of a gated activation of ``input`` ``[..., 2H]``."""
    _check_gated(name, input, half)
    return torch.empty((*input.shape[:-1], input.shape[-1] // 2), dtype=input.dtype, device=input.device)


def geglu(input: Tensor, approximate: bool = True, *, gelu_half: str = "first", fast: bool = False) -> Tensor:
    """GEGLU: ``[..., 2H] -> [..., H]``, ``T(T(GELU(a)) * b)``.

    ``a`` is the ``gelu_half`` ("first" by default) and ``b`` the other half;
    diffusers' ``GEGLU`` activates the second half (``gelu_half="second"``).
    ``approximate=True`` is GELU-tanh, ``False`` the erf GELU. ``fast=True``
    (GELU-tanh only) computes GELU(a) through approximate exp/division (module
    docstring); the rounding before the product stays.

    Differentiable, with eager autograd's roundings: ``db = T(dy * T(GELU(a)))`` and
    ``da = T(T(dy * b) * GELU'(a))`` (``GELU'`` PyTorch's backward formula in float32;
    with ``fast=True`` ``db`` multiplies by the fast ``GELU(a)``, the value the forward used).
    """
    recording = records_autograd(input)
    if fast and not approximate:
        raise ValueError("ltx_kernels.geglu: fast=True is only available for the tanh GELU (approximate=True)")
    if recording:
        _check_gated("geglu", input, gelu_half)
        return _recorded("geglu", ops.geglu_fwd, input, bool(approximate), gelu_half == "first", bool(fast))
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

    Differentiable, with eager autograd's roundings: ``db = T(dy * T(SiLU(a)))`` and
    ``da = T(T(dy * b) * s * (1 + a * (1 - s)))``, ``s = sigmoid(a)`` (PyTorch's SiLU backward
    in float32; with ``fast=True`` ``db`` multiplies by the fast ``SiLU(a)``).
    """
    if records_autograd(input):
        _check_gated("swiglu", input, silu_half)
        return _recorded("swiglu", ops.swiglu_fwd, input, silu_half == "first", bool(fast))
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

    Differentiable in ``x`` and ``logits``: ``dx`` is the gate applied to ``dy`` (the forward's
    formula with ``dy`` for ``x``); each logit's grad sums its head's ``D`` products ``dy * x``
    inside one warp, in a fixed order (deterministic, no reduction across rows). Exact mode takes
    eager autograd's roundings, ``T(T(scale * T(sum T(dy * x))) * (1 - s) * s)`` with
    ``s = T(sigmoid(l))`` (so where ``T(s)`` is 1, as eager, the grad is 0); fast mode
    ``T(scale * sigmoid'(l) * sum dy * x)`` in float32, ``sigmoid'(l) = 1 / (2 + e + 1 / e)``,
    ``e = exp(-l)`` (accurate where ``sigmoid(l)`` rounds to 1).
    """
    if records_autograd(x, logits):
        return _recorded("head_gate", ops.head_gate_fwd, x, logits, float(scale), bool(exact_mode))
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

    Differentiable: while autograd records (grad mode on and an argument that requires grad)
    it runs ``F.linear`` and then :func:`gelu_tanh`, the separate pair, bitwise
    ``F.gelu(F.linear(x, weight, bias), approximate="tanh")``: the backward needs the linear
    output, which the epilogue does not keep. The grads are torch's GEMM backward and
    ``gelu_tanh``'s backward kernel; the result rounds the linear output first, as the pair does.
    """
    if x.device.type != "cuda":
        raise device_refusal(f"ltx_kernels.linear_gelu: `x` must be a CUDA tensor, got a tensor on {x.device}")
    if weight.dim() != 2 or bias.dim() != 1 or weight.shape[1] != x.shape[-1] or bias.shape[0] != weight.shape[0]:
        raise RuntimeError(f"ltx_kernels.linear_gelu: shapes x {list(x.shape)}, weight {list(weight.shape)}, "
                           f"bias {list(bias.shape)} do not make x @ weight.T + bias")
    if records_autograd(x, weight, bias):
        return gelu_tanh(torch.nn.functional.linear(x, weight, bias))
    x2 = x.reshape(-1, x.shape[-1])
    y = torch._addmm_activation(bias, x2, weight.t(), use_gelu=True)
    return y.reshape(*x.shape[:-1], weight.shape[0])


__all__ = ["gelu_tanh", "geglu", "swiglu", "head_gate", "linear_gelu"]
