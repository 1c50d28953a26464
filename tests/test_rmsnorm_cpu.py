"""RMSNorm without a GPU: argument errors that name the argument (the op is
registered for CPU so validation runs there), shapes and dtypes under fake
and meta tensors (what torch.compile traces), the layers pass kernels' layer
validation, and the public API and op schema. Loads the built variant
through kernels.get_kernel (LOCAL_KERNELS)."""

from __future__ import annotations

import re

import pytest
import torch

from .conftest import ROOT
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def x_cpu(dtype=BF16, shape=(4, 64)):
    return torch.randn(shape).to(dtype)


# --- argument errors ---------------------------------------------------------

def test_cpu_input_is_refused_naming_input(kernel):
    with pytest.raises(RuntimeError, match=re.escape("ltx_kernels.rmsnorm: `input` must be a CUDA tensor")):
        kernel.rmsnorm(x_cpu())


def test_binding_refuses_cpu_input_naming_input(kernel):
    x = x_cpu()
    with pytest.raises(RuntimeError, match=re.escape("ltx_kernels.rmsnorm: `input` must be a CUDA tensor")):
        kernel.ops.rmsnorm(torch.empty_like(x), x, None, 1e-6, False)


def test_cpu_input_with_diffusers_rounding_names_the_public_function(kernel):
    with pytest.raises(RuntimeError, match=re.escape("ltx_kernels.rmsnorm: `input` must be a CUDA tensor")):
        x = x_cpu()
        kernel.ops.rmsnorm(torch.empty_like(x), x, torch.ones(64, dtype=BF16), 1e-6, True)


def test_weight_of_another_half_dtype_is_refused_naming_weight(kernel):
    with pytest.raises(TypeError, match=r"`weight` has dtype torch.float16 but `input` has dtype torch.bfloat16"):
        kernel.rmsnorm(x_cpu(BF16), torch.ones(64, dtype=F16))
    x = x_cpu(BF16)
    with pytest.raises(TypeError, match=r"`weight` has dtype Half but `input` has dtype BFloat16"):
        kernel.ops.rmsnorm(torch.empty_like(x), x, torch.ones(64, dtype=F16), 1e-6, False)


def test_weight_of_wrong_length_is_refused_naming_weight(kernel):
    with pytest.raises(RuntimeError, match=re.escape("`weight` has shape [63] but must be [64]")):
        kernel.rmsnorm(x_cpu(), torch.ones(63, dtype=BF16))


def test_2d_weight_is_refused_naming_weight(kernel):
    with pytest.raises(RuntimeError, match=re.escape("`weight` has shape [1, 64]")):
        kernel.rmsnorm(x_cpu(), torch.ones(1, 64, dtype=BF16))


def test_out_of_wrong_shape_is_refused_naming_out(kernel):
    with pytest.raises(RuntimeError, match=re.escape("`out` has shape [4, 63] but `input` has shape [4, 64]")):
        kernel.rmsnorm(x_cpu(), out=torch.empty(4, 63, dtype=BF16))


def test_out_of_another_half_dtype_is_refused_naming_out(kernel):
    with pytest.raises(TypeError, match=r"`out` has dtype torch.float16 but `input` has dtype torch.bfloat16"):
        kernel.rmsnorm(x_cpu(BF16), out=torch.empty(4, 64, dtype=F16))
    x = x_cpu(BF16)
    with pytest.raises(TypeError, match=r"`out` has dtype Half but `input` has dtype BFloat16"):
        kernel.ops.rmsnorm(torch.empty(4, 64, dtype=F16), x, None, 1e-6, False)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64])
def test_unsupported_input_dtype_lists_the_supported_ones(kernel, dtype):
    with pytest.raises(TypeError, match=r"`input` has dtype .*; supported dtypes are torch\.bfloat16, "
                                        r"torch\.float16 and torch\.float32"):
        kernel.rmsnorm(torch.ones(4, 64, dtype=dtype))


def test_0d_input_is_refused(kernel):
    with pytest.raises(RuntimeError, match=re.escape("`input` must have at least one dimension")):
        kernel.rmsnorm(torch.tensor(1.0, dtype=BF16))


def test_unknown_rounding_lists_the_choices(kernel):
    with pytest.raises(ValueError, match=r"`rounding` must be one of \('torch', 'diffusers'\), got 'bogus'"):
        kernel.rmsnorm(x_cpu(), rounding="bogus")


def test_negative_eps_is_refused_naming_eps(kernel):
    with pytest.raises(RuntimeError, match=re.escape("`eps` must be >= 0, got -0.1")):
        kernel.rmsnorm(x_cpu(), eps=-0.1)


def test_validation_runs_before_the_device_check(kernel):
    """A CPU call with a bad weight reports the weight, not the device: the
    checks that make these tests possible on CPU come first."""
    with pytest.raises(TypeError, match="`weight`"):
        kernel.rmsnorm(x_cpu(), torch.ones(64, dtype=F16), rounding="diffusers")


# --- shapes and dtypes without running the kernel ------------------------------

@pytest.mark.parametrize("rounding, x_dtype, w_dtype, out_dtype", [
    ("torch", BF16, None, BF16),
    ("torch", BF16, BF16, BF16),
    ("torch", BF16, F32, BF16),
    ("torch", F16, F32, F16),
    ("torch", F32, F32, F32),
    ("diffusers", BF16, None, BF16),
    ("diffusers", BF16, BF16, BF16),
    ("diffusers", BF16, F32, F32),
    ("diffusers", F16, F32, F32),
    ("diffusers", F32, F32, F32),
])
def test_fake_cuda_tensors_give_the_right_shape_and_dtype(kernel, rounding, x_dtype, w_dtype, out_dtype):
    with FakeTensorMode():
        x = torch.empty(2, 3, 128, dtype=x_dtype, device="cuda")
        w = None if w_dtype is None else torch.empty(128, dtype=w_dtype, device="cuda")
        y = kernel.rmsnorm(x, w, 1e-6, rounding=rounding)
    assert y.shape == (2, 3, 128)
    assert y.dtype == out_dtype
    assert y.device.type == "cuda"


def test_fake_cuda_call_returns_the_given_out(kernel):
    with FakeTensorMode():
        x = torch.empty(5, 64, dtype=BF16, device="cuda")
        out = torch.empty(5, 64, dtype=F32, device="cuda")
        y = kernel.rmsnorm(x, None, out=out)
    assert y is out


@pytest.mark.parametrize("rounding, w_dtype, out_dtype", [("torch", F32, BF16), ("diffusers", F32, F32),
                                                          ("diffusers", BF16, BF16)])
def test_meta_tensors_give_the_right_shape_and_dtype(kernel, rounding, w_dtype, out_dtype):
    x = torch.empty(7, 256, dtype=BF16, device="meta")
    y = kernel.rmsnorm(x, torch.empty(256, dtype=w_dtype, device="meta"), rounding=rounding)
    assert (y.shape, y.dtype, y.device.type) == ((7, 256), out_dtype, "meta")


# --- the differentiable path (issue 36) ------------------------------------------

@pytest.mark.parametrize("diffusers_rounding, x_dtype, w_dtype, out_dtype", [
    (False, BF16, None, BF16), (False, BF16, F32, BF16), (True, BF16, BF16, BF16), (True, F16, F32, F32),
    (True, F32, F32, F32)])
def test_functional_forward_fake_gives_output_and_float32_rstd_per_row(kernel, diffusers_rounding, x_dtype,
                                                                       w_dtype, out_dtype):
    x = torch.empty(2, 3, 128, dtype=x_dtype, device="meta")
    w = None if w_dtype is None else torch.empty(128, dtype=w_dtype, device="meta")
    y, rstd = kernel.ops.rmsnorm_fwd(x, w, 1e-6, diffusers_rounding)
    assert (y.shape, y.dtype, y.is_contiguous()) == ((2, 3, 128), out_dtype, True)
    assert (rstd.shape, rstd.dtype) == ((2, 3), F32)


@pytest.mark.parametrize("weight_requires_grad", [False, True])
def test_functional_backward_fake_gives_grads_of_the_inputs_dtypes(kernel, weight_requires_grad):
    x = torch.empty(4, 64, dtype=BF16, device="meta")
    w = torch.empty(64, dtype=F32, device="meta")
    rstd = torch.empty(4, dtype=F32, device="meta")
    dx, dw = kernel.ops.rmsnorm_bwd(torch.empty(4, 64, dtype=BF16, device="meta"), x, w, rstd, False,
                                    weight_requires_grad)
    assert (dx.shape, dx.dtype) == ((4, 64), BF16)
    assert (dw is None) if not weight_requires_grad else (dw.shape, dw.dtype) == ((64,), F32)


@pytest.mark.parametrize("needs", [("input",), ("weight",), ("input", "weight")])
def test_autograd_records_rmsnorm_and_backward_gives_each_grad_asked_for(kernel, needs):
    """The registered backward runs (on meta tensors, through the ops' fakes): grads of the right
    shapes and dtypes, for the tensors that require grad and no others."""
    x = torch.empty(3, 5, 64, dtype=BF16, device="meta").requires_grad_("input" in needs)
    w = torch.empty(64, dtype=F32, device="meta").requires_grad_("weight" in needs)
    y = kernel.rmsnorm(x, w, 1e-6, rounding="diffusers")
    assert y.requires_grad and y.grad_fn is not None and y.dtype == F32
    y.sum().backward()
    assert (x.grad is None) == ("input" not in needs) and (w.grad is None) == ("weight" not in needs)
    if x.grad is not None:
        assert (x.grad.shape, x.grad.dtype) == (x.shape, BF16)
    if w.grad is not None:
        assert (w.grad.shape, w.grad.dtype) == (w.shape, F32)


def test_without_grad_mode_the_result_is_not_recorded(kernel):
    x = torch.empty(4, 64, dtype=BF16, device="meta", requires_grad=True)
    with torch.no_grad():
        assert kernel.rmsnorm(x).grad_fn is None


def test_the_differentiable_path_checks_arguments_like_the_fast_path(kernel):
    x = x_cpu().requires_grad_()
    with pytest.raises(RuntimeError, match=re.escape("`weight` has shape [63] but must be [64]")):
        kernel.rmsnorm(x, torch.ones(63, dtype=BF16))
    with pytest.raises(RuntimeError, match=re.escape("ltx_kernels.rmsnorm: `input` must be a CUDA tensor")):
        kernel.rmsnorm(x)
    with pytest.raises(RuntimeError, match=re.escape("ltx_kernels.rmsnorm: `input` must be a CUDA tensor")):
        kernel.ops.rmsnorm_fwd(x.detach(), None, 1e-6, False)


def bwd_args(**change):
    x = x_cpu()
    args = {"grad_out": torch.ones_like(x), "input": x, "weight": torch.ones(64, dtype=BF16),
            "rstd": torch.ones(4, dtype=F32), "diffusers_rounding": False, "weight_requires_grad": True}
    return list({**args, **change}.values())


@pytest.mark.parametrize("change, error, message", [
    ({}, RuntimeError, "ltx_kernels.rmsnorm_bwd: `input` must be a CUDA tensor"),
    ({"rstd": torch.ones(4, dtype=BF16)}, TypeError, "`rstd` has dtype BFloat16 but must be torch.float32"),
    ({"rstd": torch.ones(5, dtype=F32)}, RuntimeError, "`rstd` has shape [5] but must be [4]"),
    ({"grad_out": torch.ones(4, 63, dtype=BF16)}, RuntimeError, "`grad_out` has shape [4, 63]"),
    ({"grad_out": torch.ones(4, 64, dtype=F16)}, TypeError, "`grad_out` has dtype Half"),
    ({"weight": torch.ones(64, dtype=F16)}, TypeError, "`weight` has dtype Half"),
    ({"weight": None}, RuntimeError, "`weight_requires_grad` is true but there is no `weight`"),
])
def test_backward_binding_names_the_bad_argument(kernel, change, error, message):
    with pytest.raises(error, match=re.escape(message)):
        kernel.ops.rmsnorm_bwd(*bwd_args(**change))


# --- layers --------------------------------------------------------------------

class DiffusersRMSNormLike(nn.Module):
    """The forward signature of diffusers.models.normalization.RMSNorm."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, hidden_states):
        return hidden_states


class LayerWithInit(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2.0

    def forward(self, x):
        return x


class LayerWithExtraMember(nn.Module):
    def helper(self):
        return 1

    def forward(self, x):
        return x


def _validate(check_cls, cls):
    from kernels.layer.layer import _validate_layer

    _validate_layer(check_cls=check_cls, cls=cls, repo="x")


def test_rmsnorm_layer_passes_kernels_layer_validation(kernel):
    _validate(DiffusersRMSNormLike, kernel.layers.RMSNorm)


def test_torch_rmsnorm_layer_passes_kernels_layer_validation(kernel):
    _validate(torch.nn.RMSNorm, kernel.layers.TorchRMSNorm)


@pytest.mark.parametrize("check_cls", [DiffusersRMSNormLike, torch.nn.RMSNorm])
def test_layer_validation_rejects_a_layer_with_a_constructor(check_cls):
    with pytest.raises(TypeError, match="must not override nn.Module constructor"):
        _validate(check_cls, LayerWithInit)


def test_layer_validation_rejects_a_layer_with_extra_members():
    with pytest.raises(TypeError, match="additional members"):
        _validate(torch.nn.RMSNorm, LayerWithExtraMember)


def test_layer_validation_rejects_a_forward_of_another_arity(kernel):
    class TwoInputs(nn.Module):
        def forward(self, x, residual):
            return x

    with pytest.raises(TypeError, match="different number of arguments"):
        _validate(TwoInputs, kernel.layers.RMSNorm)


def test_layers_are_stateless_and_compile_capable(kernel):
    for cls in (kernel.layers.RMSNorm, kernel.layers.TorchRMSNorm):
        assert cls.__init__ is nn.Module.__init__, cls
        assert cls.can_torch_compile is True
        assert cls.has_backward is False


# --- public API and op schema --------------------------------------------------

def test_public_api_exports_rmsnorm_and_layers(kernel):
    assert "rmsnorm" in kernel.__all__ and "layers" in kernel.__all__
    assert callable(kernel.rmsnorm)
    assert {"RMSNorm", "TorchRMSNorm"} <= set(kernel.layers.__all__)


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="outside a git checkout the id is random base32")
def test_ops_live_in_the_namespace_of_the_build(kernel):
    ns = kernel.__name__.split(".")[-1]
    assert re.fullmatch(r"_ltx_kernels_cuda_[0-9a-f]{7}(_dirty)?(_dev)?", ns), kernel.__name__
    assert kernel.add_op_namespace_prefix("rmsnorm") == f"{ns}::rmsnorm"
    assert str(kernel.ops.rmsnorm.default._schema).startswith(f"{ns}::rmsnorm(")


def _schema_after_namespace(op) -> str:
    return str(op.default._schema).split("::", 1)[1]


def _normalize_alias_sets(schema: str) -> str:
    # torch prints an anonymous write alias (`Tensor!`) as `Tensor($0! -> )`;
    # name it `a` as in `Tensor(a!)`.
    return re.sub(r"Tensor\(\$0! -> \)", "Tensor(a!)", schema)


def test_op_schema_mutates_only_out_and_names_its_rounding_flag(kernel):
    op = kernel.ops.rmsnorm
    assert _normalize_alias_sets(_schema_after_namespace(op)) == \
        "rmsnorm(Tensor(a!) out, Tensor input, Tensor? weight, float eps, bool diffusers_rounding) -> ()"
    schema = op.default._schema
    assert [a.name for a in schema.arguments] == ["out", "input", "weight", "eps", "diffusers_rounding"]
    assert schema.arguments[0].alias_info is not None and schema.arguments[0].alias_info.is_write
    assert all(a.alias_info is None for a in schema.arguments[1:])
    assert list(schema.returns) == []


def test_functional_op_schemas_mutate_nothing(kernel):
    assert _schema_after_namespace(kernel.ops.rmsnorm_fwd) == (
        "rmsnorm_fwd(Tensor input, Tensor? weight, float eps, bool diffusers_rounding) -> (Tensor out, Tensor rstd)")
    assert _schema_after_namespace(kernel.ops.rmsnorm_bwd) == (
        "rmsnorm_bwd(Tensor grad_out, Tensor input, Tensor? weight, Tensor rstd, bool diffusers_rounding, "
        "bool weight_requires_grad) -> (Tensor grad_input, Tensor? grad_weight)")
    for op in (kernel.ops.rmsnorm_fwd, kernel.ops.rmsnorm_bwd):
        assert all(a.alias_info is None for a in op.default._schema.arguments)


def test_path_op_schema(dev_kernel):
    kernel = dev_kernel
    assert _schema_after_namespace(kernel.ops.rmsnorm_path) == \
        "rmsnorm_path(Tensor out, Tensor input, Tensor? weight) -> int"
