"""The fused norm family without a GPU: the ops exist with their schemas,
their fake implementations give the output shapes (meta tensors, as
torch.compile traces them), and CPU tensors get errors naming the argument."""

from __future__ import annotations

import pytest
import torch

EPS = 1e-6
OPS = ["adaln_rmsnorm", "rmsnorm_residual", "gated_residual_rmsnorm", "gated_residual",
       "residual_tanh_gated_rmsnorm", "modulated_rmsnorm"]


@pytest.mark.parametrize("name", OPS)
def test_op_is_registered_as_mutating_its_outputs(kernel, name):
    schema = getattr(kernel.ops, name).default._schema
    assert schema.arguments[0].name == "out" and schema.arguments[0].alias_info.is_write
    assert not schema.returns


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_fake_implementations_give_output_shapes_and_dtypes(kernel):
    x, s = _meta(2, 7, 64), _meta(2, 1, 64)
    assert kernel.adaln_rmsnorm(x, None, s, s).shape == (2, 7, 64)
    out, res = kernel.rmsnorm_residual(x, x)
    assert out.shape == res.shape == (2, 7, 64) and out.dtype == torch.bfloat16
    out, x_new = kernel.gated_residual_rmsnorm(x, x, s, s, s)
    assert out.shape == x_new.shape == (2, 7, 64)
    assert kernel.gated_residual(x, x, s).device.type == "meta"
    assert kernel.residual_tanh_gated_rmsnorm(x, x, _meta(2, 64)).shape == (2, 7, 64)
    assert kernel.modulated_rmsnorm(x, _meta(2, 64)).shape == (2, 7, 64)


def test_gated_residual_in_place_returns_x(kernel):
    x = _meta(2, 3, 32)
    assert kernel.gated_residual(x, x, None, inplace=True) is x


@pytest.mark.parametrize("call, exc, message", [
    (lambda k, x: k.adaln_rmsnorm(x, None, x[:, :1], None), RuntimeError, "`input` must be a CUDA tensor"),
    (lambda k, x: k.adaln_rmsnorm(x[None], None, x, None), RuntimeError, "[batch, seq, hidden], got 4 dims"),
    (lambda k, x: k.gated_residual(x.double(), x.double()), TypeError, "`x` has dtype Double"),
    (lambda k, x: k.residual_tanh_gated_rmsnorm(x, x, x[:, 0]), RuntimeError, "`x_res` must be a CUDA tensor"),
    (lambda k, x: k.rmsnorm_residual(x, x, rounding="C"), ValueError, "`rounding` must be one of"),
])
def test_cpu_and_malformed_inputs_get_errors_naming_the_argument(kernel, call, exc, message):
    x = torch.randn(2, 4, 16, dtype=torch.bfloat16)
    with pytest.raises(exc, match=__import__("re").escape(message)):
        call(kernel, x)
