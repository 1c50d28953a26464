"""Activations without a GPU: schemas, fake shapes (meta tensors, as
torch.compile traces them) and errors naming the argument (head_gate checks
dtypes and shapes before the device, so they fire on CPU tensors here)."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from ltx_dev.reference.activation import head_gate64, head_gate_eager
from ltx_dev.registry import OPS, Source


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_fake_implementations_give_output_shapes(kernel):
    x = _meta(2, 7, 64)
    assert kernel.gelu_tanh(x).shape == (2, 7, 64)
    assert kernel.geglu(x).shape == (2, 7, 32)
    assert kernel.swiglu(x, silu_half="second").shape == (2, 7, 32)
    assert kernel.geglu(x).dtype == torch.bfloat16
    gated = kernel.head_gate(_meta(2, 7, 64, dtype=torch.float16), _meta(2, 7, 4, dtype=torch.float16))
    assert (gated.shape, gated.dtype) == ((2, 7, 64), torch.float16)


def test_head_gate_signature_is_the_one_the_integration_codes_against(kernel):
    params = inspect.signature(kernel.head_gate).parameters
    assert list(params) == ["x", "logits", "scale", "exact_mode"]
    assert params["scale"].kind is params["exact_mode"].kind is inspect.Parameter.KEYWORD_ONLY
    assert (params["scale"].default, params["exact_mode"].default) == (2.0, True)
    schema = str(kernel.ops.head_gate.default._schema)
    assert "Tensor(a!) out, Tensor x, Tensor logits, float scale, bool exact" in schema


@pytest.mark.parametrize("call, exc, message", [
    (lambda k, x: k.gelu_tanh(x), RuntimeError, "`x` must be a CUDA tensor"),
    (lambda k, x: k.geglu(x[..., :15]), RuntimeError, "must be even"),
    (lambda k, x: k.swiglu(x, silu_half="last"), ValueError, "'first' or 'second'"),
    (lambda k, x: k.geglu(x, approximate=False, fast=True), ValueError, "only available for the tanh GELU"),
    (lambda k, x: k.gelu_tanh(x.double()), TypeError, "`x` has dtype Double"),
    (lambda k, x: k.linear_gelu(x, torch.ones(8, 16), torch.ones(8)), RuntimeError, "must be a CUDA tensor"),
    (lambda k, x: k.ops.geglu(torch.empty_like(x[..., :8]), x, False, True, True), RuntimeError,
     "ltx_kernels.geglu: fast=True is only available for the tanh GELU"),
    (lambda k, x: k.head_gate(x, x[..., :4]), RuntimeError, "ltx_kernels.head_gate: `x` must be a CUDA tensor"),
    (lambda k, x: k.head_gate(x, x[..., :4].half()), TypeError,
     "ltx_kernels.head_gate: `logits` has dtype Half but `x` has dtype BFloat16"),
    (lambda k, x: k.head_gate(x.double(), x[..., :4].double()), TypeError, "`x` has dtype Double"),
    (lambda k, x: k.head_gate(x, x[..., :3]), RuntimeError,
     "the last dim of `x` (16) must be a multiple of the number of heads, the last dim of `logits` (3)"),
    (lambda k, x: k.head_gate(x, x[..., :0]), RuntimeError, "the last dim of `logits` (0)"),
    (lambda k, x: k.head_gate(x, x[:1, ..., :4]), RuntimeError, "ltx_kernels.head_gate: `logits` has shape [1, 3, 4]"),
    (lambda k, x: k.head_gate(x, x[0, :, :4]), RuntimeError, "`logits` has shape [3, 4]"),
    (lambda k, x: k.head_gate(x[0, 0, 0], x[0, 0, 0]), RuntimeError, "`x` must have at least one dimension"),
])
def test_bad_input_gets_an_error_naming_the_argument(kernel, call, exc, message):
    x = torch.randn(2, 3, 16, dtype=torch.bfloat16)
    with pytest.raises(exc, match=re.escape(message)):
        call(kernel, x)


def test_head_gate_references_gate_each_heads_channels_by_its_own_logit():
    """The references every GPU test compares against: head h of token t scales channels
    h*D .. h*D + D - 1 of that token by scale * sigmoid(logits[t, h]), in float64 and eagerly."""
    heads, d = 3, 4
    logits = torch.tensor([[0.0, 2.0, -1.0], [5.0, -3.0, 0.5]])
    x = torch.arange(1.0, 1.0 + 2 * heads * d).view(2, heads * d)
    expected = x.view(2, heads, d) * (3.0 * torch.sigmoid(logits)).unsqueeze(-1)
    assert torch.allclose(head_gate64(x, logits, 3.0), expected.view(2, -1).double())
    assert torch.equal(head_gate_eager(x, logits, 3.0), expected.view(2, -1))
    assert head_gate64(x.bfloat16(), logits.bfloat16()).dtype == torch.float64
    assert head_gate_eager(x.bfloat16(), logits.bfloat16()).dtype == torch.bfloat16


# --- the differentiable path (issue 36) ----------------------------------------------------------

def test_functional_op_fakes_give_output_and_grad_shapes(kernel):
    x = _meta(2, 7, 64)
    assert kernel.ops.gelu_tanh_fwd(x, False).shape == (2, 7, 64)
    assert kernel.ops.geglu_fwd(x, True, True, False).shape == (2, 7, 32)
    assert kernel.ops.swiglu_fwd(x, False, True).shape == (2, 7, 32)
    assert kernel.ops.gelu_tanh_bwd(_meta(2, 7, 64), x).shape == (2, 7, 64)
    assert kernel.ops.geglu_bwd(_meta(2, 7, 32), x, True, True, False).shape == (2, 7, 64)
    assert kernel.ops.swiglu_bwd(_meta(2, 7, 32), x, True, False).shape == (2, 7, 64)
    logits = _meta(2, 7, 4)
    assert kernel.ops.head_gate_fwd(x, logits, 2.0, True).shape == (2, 7, 64)
    dx, dl = kernel.ops.head_gate_bwd(_meta(2, 7, 64), x, logits, 2.0, True, True)
    assert (dx.shape, dl.shape, dl.dtype) == ((2, 7, 64), (2, 7, 4), torch.bfloat16)
    assert kernel.ops.head_gate_bwd(_meta(2, 7, 64), x, logits, 2.0, True, False)[1] is None


@pytest.mark.parametrize("call, grad_shapes", [
    (lambda k, x, l: k.gelu_tanh(x, fast=True), [(3, 5, 64)]),
    (lambda k, x, l: k.geglu(x, False, gelu_half="second"), [(3, 5, 64)]),
    (lambda k, x, l: k.swiglu(x), [(3, 5, 64)]),
    (lambda k, x, l: k.head_gate(x, l, exact_mode=False), [(3, 5, 64), (3, 5, 4)]),
])
def test_autograd_records_each_op_and_backward_gives_its_grads(kernel, call, grad_shapes):
    """The registered backwards run (on meta tensors, through the ops' fakes): grads of the inputs'
    shapes and dtype."""
    x = _meta(3, 5, 64).requires_grad_()
    logits = _meta(3, 5, 4).requires_grad_()
    y = call(kernel, x, logits)
    assert y.requires_grad and y.grad_fn is not None
    y.sum().backward()
    for t, shape in zip((x, logits), grad_shapes):
        assert (t.grad.shape, t.grad.dtype) == (shape, torch.bfloat16)


def test_without_grad_mode_nothing_is_recorded(kernel):
    x = _meta(4, 64).requires_grad_()
    with torch.no_grad():
        assert kernel.gelu_tanh(x).grad_fn is None and kernel.swiglu(x).grad_fn is None


@pytest.mark.parametrize("call, exc, message", [
    (lambda k, x: k.gelu_tanh(x), RuntimeError, "ltx_kernels.gelu_tanh: `x` must be a CUDA tensor"),
    (lambda k, x: k.geglu(x[..., :15]), RuntimeError, "ltx_kernels.geglu: the last dim of `input` must be even"),
    (lambda k, x: k.swiglu(x, silu_half="last"), ValueError, "'first' or 'second'"),
    (lambda k, x: k.geglu(x, approximate=False, fast=True), ValueError, "only available for the tanh GELU"),
    (lambda k, x: k.head_gate(x, x[..., :3]), RuntimeError, "must be a multiple of the number of heads"),
    (lambda k, x: k.head_gate(x, x[..., :4]), RuntimeError, "ltx_kernels.head_gate: `x` must be a CUDA tensor"),
    (lambda k, x: k.linear_gelu(x, torch.ones(8, 16), torch.ones(8)), RuntimeError, "must be a CUDA tensor"),
])
def test_the_differentiable_path_checks_arguments_like_the_fast_path(kernel, call, exc, message):
    x = torch.randn(2, 3, 16, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(exc, match=re.escape(message)):
        call(kernel, x)


def _bwd_call(op, **change):
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    args = {"gelu_tanh_bwd": {"grad_out": torch.ones(4, 16, dtype=torch.bfloat16), "x": x},
            "geglu_bwd": {"grad_out": torch.ones(4, 8, dtype=torch.bfloat16), "input": x, "approximate": True,
                          "gelu_first": True, "fast": False},
            "head_gate_bwd": {"grad_out": torch.ones(4, 16, dtype=torch.bfloat16), "x": x,
                              "logits": torch.ones(4, 2, dtype=torch.bfloat16), "scale": 2.0, "exact": True,
                              "logits_requires_grad": True}}[op]
    return list({**args, **change}.values())


@pytest.mark.parametrize("op, change, exc, message", [
    ("gelu_tanh_bwd", {}, RuntimeError, "ltx_kernels.gelu_tanh_bwd: `x` must be a CUDA tensor"),
    ("gelu_tanh_bwd", {"grad_out": torch.ones(4, 15, dtype=torch.bfloat16)}, RuntimeError,
     "`grad_out` has shape [4, 15] but must be [4, 16] (the forward's output)"),
    ("gelu_tanh_bwd", {"grad_out": torch.ones(4, 16)}, TypeError, "`grad_out` has dtype Float but `x` has dtype"),
    ("gelu_tanh_bwd", {"x": torch.ones(4, 16, dtype=torch.float64)}, TypeError, "`x` has dtype Double"),
    ("geglu_bwd", {"grad_out": torch.ones(4, 16, dtype=torch.bfloat16)}, RuntimeError,
     "`grad_out` has shape [4, 16] but must be [4, 8]"),
    ("geglu_bwd", {"input": torch.ones(4, 15, dtype=torch.bfloat16)}, RuntimeError, "must be even"),
    ("geglu_bwd", {"approximate": False, "fast": True}, RuntimeError, "only available for the tanh GELU"),
    ("geglu_bwd", {}, RuntimeError, "ltx_kernels.geglu_bwd: `input` must be a CUDA tensor"),
    ("head_gate_bwd", {}, RuntimeError, "ltx_kernels.head_gate_bwd: `x` must be a CUDA tensor"),
    ("head_gate_bwd", {"logits": torch.ones(4, 3, dtype=torch.bfloat16)}, RuntimeError,
     "must be a multiple of the number of heads"),
    ("head_gate_bwd", {"logits": torch.ones(4, 2, dtype=torch.float16)}, TypeError, "`logits` has dtype Half"),
])
def test_backward_bindings_name_the_bad_argument(kernel, op, change, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        getattr(kernel.ops, op)(*_bwd_call(op, **change))


def test_functional_op_schemas_mutate_nothing(kernel):
    for name in ("gelu_tanh", "geglu", "swiglu", "head_gate"):
        for op in (getattr(kernel.ops, f"{name}_fwd"), getattr(kernel.ops, f"{name}_bwd")):
            schema = op.default._schema
            assert all(a.alias_info is None for a in schema.arguments), str(schema)
    assert str(kernel.ops.head_gate_bwd.default._schema).endswith(
        "(Tensor grad_out, Tensor x, Tensor logits, float scale, bool exact, bool logits_requires_grad) -> "
        "(Tensor grad_x, Tensor? grad_logits)")


@pytest.mark.parametrize("name", ["gelu_tanh", "geglu", "swiglu", "head_gate", "linear_gelu"])
def test_registry_reference_is_differentiable_in_float64(name):
    """The central backward sweep differentiates each OpSpec's reference on float64 copies of the
    arguments: autograd through it must agree with finite differences."""
    spec = next(s for s in OPS if s.name == name)
    args, _ = spec.build(spec.canonical("small", "vector"), torch.float32, Source(0, "cpu"))
    names = [k for k, v in args.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    # a few elements of each: gradcheck's Jacobian is (outputs x inputs)
    small = {k: (v[..., :2, :] if isinstance(v, torch.Tensor) and v.dim() > 2 else v) for k, v in args.items()}
    leaves = [small[k].detach().double().requires_grad_() for k in names]

    def reference(*tensors):
        return spec.reference({**small, **dict(zip(names, tensors))})[0].value

    assert torch.autograd.gradcheck(reference, leaves, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)
