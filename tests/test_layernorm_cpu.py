"""The layernorm family without a GPU: the ops exist with their schemas (named
flags, outputs marked as written), their fake implementations give the output
shapes (meta tensors, as torch.compile traces them), CPU tensors and malformed
calls get errors naming the function and the argument, and the references the
GPU tests hold the kernels to are the models' own code (diffusers' modules, run
here on CPU)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from ltx_dev.reference import fused_norm as fref
from ltx_dev.reference import layernorm as lref

BF16, F32 = torch.bfloat16, torch.float32
OPS = ["layernorm", "adaln_layernorm", "gated_residual_layernorm"]


# --- schemas and fake implementations -----------------------------------------------------

@pytest.mark.parametrize("name", OPS)
def test_op_is_registered_as_mutating_its_outputs_with_named_flags(kernel, name):
    schema = getattr(kernel.ops, name).default._schema
    args = {a.name: a for a in schema.arguments}
    assert schema.arguments[0].name == "out" and schema.arguments[0].alias_info.is_write
    assert not schema.returns
    assert str(args["eps"].type) == "float"
    if name != "layernorm":
        assert str(args["exact_mode"].type) == "bool"  # a named flag, no integer enum
    if name == "gated_residual_layernorm":
        assert args["x_out"].alias_info.is_write


def _meta(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_fake_implementations_give_output_shapes_and_dtypes(kernel):
    x, s = _meta(2, 7, 64), _meta(2, 64, dtype=F32)
    for shape in [(64,), (7, 64), (2, 7, 64), (2, 3, 7, 64)]:
        out = kernel.layernorm(_meta(*shape), _meta(64, dtype=F32), _meta(64))
        assert out.shape == shape and out.dtype == BF16 and out.device.type == "meta"
    assert kernel.adaln_layernorm(x, s, s).shape == (2, 7, 64)
    out, x_new = kernel.gated_residual_layernorm(x, x, s, 1e-6, scale=s, shift=None)
    assert out.shape == x_new.shape == (2, 7, 64) and x_new.dtype == BF16


@pytest.mark.parametrize("call, exc, message", [
    (lambda k, x: k.layernorm(x), RuntimeError, "ltx_kernels.layernorm: `x` must be a CUDA tensor"),
    (lambda k, x: k.layernorm(x[0, 0, 0]), RuntimeError, "ltx_kernels.layernorm: `x` must have at least one"),
    (lambda k, x: k.layernorm(x.double()), TypeError, "`x` has dtype Double; supported dtypes are"),
    (lambda k, x: k.adaln_layernorm(x, x[:, 0], None), RuntimeError,
     "ltx_kernels.adaln_layernorm: `x` must be a CUDA tensor"),
    (lambda k, x: k.adaln_layernorm(x[None], x[:, 0], None), RuntimeError, "[batch, seq, hidden], got 4 dims"),
    (lambda k, x: k.gated_residual_layernorm(x, x, None, shift=x[:, 0]), RuntimeError,
     "ltx_kernels.gated_residual_layernorm: `shift` was given without `scale`"),
    (lambda k, x: k.ops.gated_residual_layernorm(x, x, x, x, None, None, None, None, None, 1e-6, True),
     RuntimeError, "ltx_kernels.gated_residual_layernorm: `x` must be a CUDA tensor"),
])
def test_cpu_and_malformed_inputs_get_errors_naming_the_function_and_argument(kernel, call, exc, message):
    x = torch.randn(2, 4, 16).to(BF16)
    with pytest.raises(exc, match=re.escape(message)):
        call(kernel, x)


# --- the references are the models' code ----------------------------------------------------

def test_float64_layer_norm_is_torchs_layer_norm_in_float64():
    x = torch.randn(3, 5, 96, dtype=torch.float64) * 3 + 1
    w, b = torch.randn(96, dtype=torch.float64), torch.randn(96, dtype=torch.float64)
    for weight, bias in ((None, None), (w, None), (w, b)):
        torch.testing.assert_close(lref.layer_norm_f64(x, weight, bias, 1e-5),
                                   F.layer_norm(x, (96,), weight, bias, 1e-5), rtol=1e-12, atol=1e-12)
    scale, shift = torch.randn(3, 96), torch.randn(3, 1, 96)
    expected = F.layer_norm(x, (96,), None, None, 1e-6) * (1 + scale.double()[:, None]) + shift.double()
    torch.testing.assert_close(lref.adaln_layer_norm_f64(x, scale, shift, 1e-6), expected, rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def normalization():
    return pytest.importorskip("diffusers.models.normalization")


@torch.no_grad()
def test_flux_reference_is_ada_layer_norm_zero_and_continuous_bitwise(normalization):
    """flux_modulated_norm(nn.LayerNorm) is AdaLayerNormZero's and AdaLayerNormContinuous's forward
    (Flux, HunyuanVideo, Mochi's norm_out) bit for bit, in bf16."""
    torch.manual_seed(0)
    D = 64
    x, emb = torch.randn(2, 9, D).to(BF16), torch.randn(2, D).to(BF16)
    zero = normalization.AdaLayerNormZero(D).to(BF16)
    got, gate_msa, *_ = zero(x, emb=emb)
    shift_msa, scale_msa, *_ = zero.linear(zero.silu(emb)).chunk(6, dim=1)
    assert torch.equal(lref.flux_modulated_norm(zero.norm, x, scale_msa, shift_msa), got)
    cont = normalization.AdaLayerNormContinuous(D, D, elementwise_affine=False, eps=1e-6).to(BF16)
    scale, shift = cont.linear(cont.silu(emb).to(BF16)).chunk(2, dim=1)
    assert torch.equal(lref.flux_modulated_norm(lref.torch_layer_norm(1e-6), x, scale, shift), cont(x, emb))
    y = torch.randn(2, 9, D).to(BF16)
    assert torch.equal(lref.flux_gated_residual(x, y, gate_msa), x + gate_msa.unsqueeze(1) * y)


@torch.no_grad()
def test_wan_references_are_fp32_layer_norm_and_the_blocks_lines(normalization):
    """fp32_layer_norm is FP32LayerNorm.forward (float32 or bf16 parameters), and the Wan chains
    use it as WanTransformerBlock does: on x.float(), back to x's dtype once."""
    torch.manual_seed(1)
    D = 64
    x = torch.randn(2, 9, D).to(BF16)
    norm2 = normalization.FP32LayerNorm(D, 1e-6, elementwise_affine=True)
    torch.nn.init.normal_(norm2.weight)
    torch.nn.init.normal_(norm2.bias)
    for params in (F32, BF16):
        norm2 = norm2.to(params)
        assert torch.equal(lref.fp32_layer_norm(1e-6, norm2.weight, norm2.bias)(x), norm2(x))
        assert torch.equal(lref.wan_norm2(norm2, x), norm2(x.float()).type_as(x))
    norm1 = normalization.FP32LayerNorm(D, 1e-6, elementwise_affine=False)
    scale, shift = torch.randn(2, 1, D), torch.randn(2, 1, D)
    assert torch.equal(lref.wan_modulated_norm(norm1, x, scale, shift),
                       (norm1(x.float()) * (1 + scale) + shift).type_as(x))
    assert torch.equal(lref.wan_modulated_norm(lref.torch_layer_norm(1e-6), x, scale, shift),
                       lref.wan_modulated_norm(norm1, x, scale, shift))
    gate = torch.randn(2, 9, D)  # Wan 2.2 TI2V: per token
    assert torch.equal(fref.wan_gated_residual(x, x, gate), (x.float() + x * gate).type_as(x))
