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


# --- the differentiable path (issue 36) ------------------------------------------------------

GRAD_NAMES = ("x", "y", "gate", "scale", "shift", "weight", "bias")  # layernorm_bwd's grads, in order


def test_functional_op_schemas_mutate_nothing_and_return_the_row_statistics(kernel):
    returns = {"layernorm_fwd": ["out", "mean", "rstd"], "adaln_layernorm_fwd": ["out", "mean", "rstd"],
               "gated_residual_layernorm_fwd": ["out", "x_out", "mean", "rstd"],
               "layernorm_bwd": [f"grad_{n}" for n in GRAD_NAMES]}
    for name, outs in returns.items():
        schema = getattr(kernel.ops, name).default._schema
        assert all(a.alias_info is None for a in schema.arguments), name
        assert [r.name for r in schema.returns] == outs, name
    bwd = {a.name: a for a in kernel.ops.layernorm_bwd.default._schema.arguments}
    assert "bool" in str(bwd["output_mask"].type) and str(bwd["exact_mode"].type) == "bool"


@pytest.mark.parametrize("dtype", [BF16, F32])
def test_functional_forward_fakes_give_outputs_and_float32_statistics_per_row(kernel, dtype):
    x, s = _meta(2, 7, 64, dtype=dtype), _meta(2, 64, dtype=F32)
    results = [kernel.ops.layernorm_fwd(x, None, None, 1e-6),
               kernel.ops.adaln_layernorm_fwd(x, s, s, None, None, 1e-6, True),
               kernel.ops.gated_residual_layernorm_fwd(x, x, s, s, None, None, None, 1e-6, True)]
    for outs in results:
        *values, mean, rstd = outs
        assert all((v.shape, v.dtype, v.is_contiguous()) == ((2, 7, 64), dtype, True) for v in values)
        assert (mean.shape, mean.dtype, rstd.shape, rstd.dtype) == ((2, 7), F32, (2, 7), F32)


def test_backward_fake_gives_the_grads_asked_for_in_each_inputs_shape_and_dtype(kernel):
    h, stats = _meta(2, 7, 64), _meta(2, 7, dtype=F32)
    inputs = {"y": _meta(2, 7, 64), "gate": _meta(2, 1, 64, dtype=F32), "scale": _meta(2, 64, dtype=F32),
              "shift": _meta(64, dtype=F32), "weight": _meta(64, dtype=F32), "bias": _meta(64)}
    mask = [True, False, True, True, False, True, True]
    grads = kernel.ops.layernorm_bwd(h, h, h, stats, stats, *inputs.values(), True, mask)
    for name, want, g in zip(GRAD_NAMES, mask, grads):
        like = h if name == "x" else inputs[name]
        assert (g is None) == (not want), name
        assert g is None or (g.shape, g.dtype) == (like.shape, like.dtype), name


def _leaves(needs, shapes):
    return {name: _meta(*shape, dtype=dtype).requires_grad_(name in needs) for name, (shape, dtype) in shapes.items()}


SEAM_ARGS = {"x": ((2, 7, 64), BF16), "y": ((2, 7, 64), BF16), "gate": ((2, 64), F32), "scale": ((2, 1, 64), F32),
             "shift": ((2, 7, 64), F32), "weight": ((64,), F32), "bias": ((64,), BF16)}
CALLS = {
    "layernorm": (lambda k, t: (k.layernorm(t["x"], t["weight"], t["bias"]),), ("x", "weight", "bias")),
    "adaln_layernorm": (lambda k, t: (k.adaln_layernorm(t["x"], t["scale"], t["shift"], weight=t["weight"],
                                                        bias=t["bias"]),),
                        ("x", "scale", "shift", "weight", "bias")),
    "gated_residual_layernorm": (lambda k, t: k.gated_residual_layernorm(
        t["x"], t["y"], t["gate"], weight=t["weight"], bias=t["bias"], scale=t["scale"], shift=t["shift"]),
        GRAD_NAMES),
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("needs", [("x",), ("weight", "bias"), ("y", "gate"), ("scale", "shift"), GRAD_NAMES])
def test_autograd_records_each_op_and_backward_gives_each_grad_asked_for(kernel, op, needs):
    """The registered backward runs (on meta tensors, through the ops' fakes): grads of each input's
    shape and dtype, for the inputs that require grad and no others."""
    call, takes = CALLS[op]
    needs = [n for n in needs if n in takes]
    if not needs:
        pytest.skip(f"{op} takes none of these")
    t = _leaves(needs, SEAM_ARGS)
    outs = call(kernel, t)
    assert all(o.requires_grad and o.grad_fn is not None for o in outs)
    sum(o.float().sum() for o in outs).backward()
    for name in takes:
        g = t[name].grad
        assert (g is None) == (name not in needs), name
        assert g is None or (g.shape, g.dtype) == (t[name].shape, t[name].dtype), name


def test_layernorm_of_any_leading_dims_records_through_a_view(kernel):
    x = _meta(2, 3, 5, 64).requires_grad_()
    y = kernel.layernorm(x)
    assert y.shape == x.shape and y.grad_fn is not None
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_without_grad_mode_the_result_is_not_recorded(kernel):
    x = _meta(2, 7, 64).requires_grad_()
    with torch.no_grad():
        assert kernel.layernorm(x).grad_fn is None
        assert kernel.adaln_layernorm(x, _meta(2, 64), None).grad_fn is None


def test_the_differentiable_path_checks_arguments_like_the_fast_path(kernel):
    x = torch.randn(2, 4, 16).to(BF16).requires_grad_()
    with pytest.raises(RuntimeError, match=re.escape("ltx_kernels.layernorm: `x` must be a CUDA tensor")):
        kernel.layernorm(x)
    with pytest.raises(RuntimeError, match=re.escape("ltx_kernels.layernorm: `x` must be a CUDA tensor")):
        kernel.ops.layernorm_fwd(x.detach(), None, None, 1e-6)
    with pytest.raises(RuntimeError, match=re.escape("`shift` was given without `scale`")):
        kernel.ops.gated_residual_layernorm_fwd(x.detach(), x.detach(), None, None, x[:, 0].detach(), None, None,
                                                1e-6, True)


def _bwd_args(**change):
    h = torch.randn(2, 4, 16).to(BF16)
    args = {"grad_out": torch.ones_like(h), "grad_x_out": None, "h": h, "mean": torch.zeros(2, 4),
            "rstd": torch.ones(2, 4), "y": None, "gate": None, "scale": None, "shift": None, "weight": None,
            "bias": None, "exact_mode": True, "output_mask": [True] * 7}
    return list({**args, **change}.values())


@pytest.mark.parametrize("change, error, message", [
    ({}, RuntimeError, "ltx_kernels.layernorm_bwd: `h` must be a CUDA tensor"),
    ({"rstd": torch.ones(2, 4, dtype=BF16)}, TypeError, "`rstd` has dtype BFloat16 but must be torch.float32"),
    ({"mean": torch.zeros(2, 5)}, RuntimeError, "`mean` has shape [2, 5] but must be [2, 4]"),
    ({"gate": torch.ones(16)}, RuntimeError, "`gate` was given without `y`"),
    ({"shift": torch.ones(16)}, RuntimeError, "`shift` was given without `scale`"),
])
def test_backward_binding_names_the_bad_argument(kernel, change, error, message):
    with pytest.raises(error, match=re.escape(message)):
        kernel.ops.layernorm_bwd(*_bwd_args(**change))


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


# --- the registry's references are differentiable in float64 ---------------------------------

@pytest.mark.parametrize("name", OPS)
def test_registry_reference_is_differentiable_in_float64(name):
    """tests/test_backward_gpu.py compares every grad with autograd through the OpSpec's reference on
    float64 copies of the arguments: each floating argument gets a grad, which gradcheck confirms."""
    from ltx_dev.registry import OPS as SPECS, Source

    spec = next(s for s in SPECS if s.name == name)
    problem = {**spec.canonical("small", "vector"), "shape": (2, 3, 8)}
    for arg in ("scale", "shift", "gate"):
        if problem.get(arg) is not None:
            problem[arg] = (2, 8)
    args, _ = spec.build(problem, BF16, Source(0, "cpu"))
    floating = [k for k, v in args.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    assert {"x", "weight", "bias"} <= set(floating)

    def outputs(*tensors):
        a = {**args, **dict(zip(floating, tensors))}
        return tuple(e.value for e in spec.reference(a))

    leaves = tuple(args[k].detach().double().requires_grad_() for k in floating)
    assert torch.autograd.gradcheck(outputs, leaves)
