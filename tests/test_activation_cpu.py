"""Activations without a GPU: schemas, fake shapes (meta tensors, as
torch.compile traces them) and errors naming the argument."""

from __future__ import annotations

import re

import pytest
import torch


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_fake_implementations_give_output_shapes(kernel):
    x = _meta(2, 7, 64)
    assert kernel.gelu_tanh(x).shape == (2, 7, 64)
    assert kernel.geglu(x).shape == (2, 7, 32)
    assert kernel.swiglu(x, silu_half="second").shape == (2, 7, 32)
    assert kernel.geglu(x).dtype == torch.bfloat16


@pytest.mark.parametrize("call, exc, message", [
    (lambda k, x: k.gelu_tanh(x), RuntimeError, "`x` must be a CUDA tensor"),
    (lambda k, x: k.geglu(x[..., :15]), RuntimeError, "must be even"),
    (lambda k, x: k.swiglu(x, silu_half="last"), ValueError, "'first' or 'second'"),
    (lambda k, x: k.geglu(x, approximate=False, fast=True), ValueError, "only available for the tanh GELU"),
    (lambda k, x: k.gelu_tanh(x.double()), TypeError, "`x` has dtype Double"),
    (lambda k, x: k.linear_gelu(x, torch.ones(8, 16), torch.ones(8)), RuntimeError, "must be a CUDA tensor"),
    (lambda k, x: k.ops.geglu(torch.empty_like(x[..., :8]), x, False, True, True), RuntimeError,
     "ltx_kernels.geglu: fast=True is only available for the tanh GELU"),
])
def test_bad_input_gets_an_error_naming_the_argument(kernel, call, exc, message):
    x = torch.randn(2, 3, 16, dtype=torch.bfloat16)
    with pytest.raises(exc, match=re.escape(message)):
        call(kernel, x)
