"""Activations without a GPU: schemas, fake shapes (meta tensors, as
torch.compile traces them) and errors naming the argument (head_gate checks
dtypes and shapes before the device, so they fire on CPU tensors here)."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from ltx_dev.reference.activation import head_gate64, head_gate_eager


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
