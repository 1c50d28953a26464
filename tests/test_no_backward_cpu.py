"""No silent detach (issue 36, item 1): an op without a backward, called while
autograd records (grad mode on and a tensor argument that requires grad),
raises `ltx_kernels.NoBackwardError` at the call instead of returning a result
cut from the graph; an op in `ltx_kernels.DIFFERENTIABLE` is not refused (on
CPU tensors it goes on to the device refusal). Under torch.no_grad() or
torch.inference_mode() nothing changes.

Over the registry of every exported op (ltx_dev/registry.py), so a new op is
covered as soon as it has an OpSpec; on CPU tensors, because the check comes
before the device check (the calls that pass it end in the device refusal)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from ltx_dev.registry import BF16, OPS, Source

DEVICE_REFUSAL = "must be a CUDA tensor"
REMEDIES = ("has no backward yet", "torch.no_grad()", "torch.inference_mode()", ".detach()",
            "ltx_kernels_diffusers.optimize")
NO_GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


def small_cpu_args(spec):
    args, _ = spec.build(spec.canonical("small", "vector"), BF16, Source(0, "cpu"))
    return args


def differentiable(args):
    """The names of the call's tensor arguments that can require grad."""
    return [name for name, v in args.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]


def needing_grad(args, name):
    # A detached alias (same storage and strides) that requires grad: the call sees the same layout.
    return {**args, name: args[name].detach().requires_grad_()}


ARGUMENTS = [(spec, name) for spec in OPS for name in differentiable(small_cpu_args(spec))]
# What ltx_kernels.DIFFERENTIABLE must say (checked below).
DIFFERENTIABLE_OPS = {"rmsnorm", "rmsnorm_residual", "adaln_rmsnorm", "gated_residual",
                      "gated_residual_rmsnorm", "residual_tanh_gated_rmsnorm", "modulated_rmsnorm",
                      "layernorm", "adaln_layernorm", "gated_residual_layernorm", "gelu_tanh", "geglu",
                      "swiglu", "head_gate", "linear_gelu", "apply_rotary_emb", "rope_3d", "rope_1d",
                      "qk_rmsnorm_rope"}


def gets_grad(spec, name):
    """A differentiable op's argument its backward gives a grad (OpSpec.grad_args; None: all of them).
    The others (RoPE tables) are constants, refused while autograd records like an op without backward."""
    return spec.api in DIFFERENTIABLE_OPS and (spec.grad_args is None or name in spec.grad_args)


REFUSED = [(spec, name) for spec, name in ARGUMENTS if not gets_grad(spec, name)]
RECORDED = [(spec, name) for spec, name in ARGUMENTS if gets_grad(spec, name)]


def assert_refused_for_autograd(error, op):
    message = str(error)
    assert isinstance(error, RuntimeError)  # callers catching RuntimeError still catch it
    assert message.startswith(f"ltx_kernels.{op}: "), message
    assert re.search(r"`\w+` requires? grad", message), message
    for remedy in REMEDIES:
        assert remedy in message, (remedy, message)


def test_every_op_has_a_tensor_argument_to_check():
    assert {spec.name for spec, _ in ARGUMENTS} == {spec.name for spec in OPS}


def test_the_differentiable_set_is_exported_and_names_public_ops(kernel):
    assert "DIFFERENTIABLE" in kernel.__all__
    assert kernel.DIFFERENTIABLE == DIFFERENTIABLE_OPS
    assert all(callable(getattr(kernel, name)) for name in kernel.DIFFERENTIABLE)
    assert {spec.api for spec, _ in RECORDED} == DIFFERENTIABLE_OPS  # the registry still covers each


@pytest.mark.parametrize("spec, name", REFUSED, ids=[f"{s.name}-{n}" for s, n in REFUSED])
def test_an_argument_requiring_grad_alone_is_refused_at_the_call(kernel, spec, name):
    args = needing_grad(small_cpu_args(spec), name)
    with pytest.raises(kernel.NoBackwardError) as refused:
        spec.call(kernel, args)
    assert_refused_for_autograd(refused.value, spec.api)


@pytest.mark.parametrize("spec, name", RECORDED, ids=[f"{s.name}-{n}" for s, n in RECORDED])
def test_a_differentiable_op_is_not_refused_for_autograd(kernel, spec, name):
    """It takes the differentiable path, whose checks refuse the CPU tensor as the fast path's do."""
    args = needing_grad(small_cpu_args(spec), name)
    with pytest.raises(RuntimeError, match=re.escape(DEVICE_REFUSAL)) as refused:
        spec.call(kernel, args)
    assert not isinstance(refused.value, kernel.NoBackwardError)


@pytest.mark.parametrize("needs", ["input", "weight", "out"])
def test_rmsnorm_with_out_is_refused_while_autograd_records(kernel, needs):
    """A result written into `out` has no backward (as with torch's out= arguments)."""
    args = {"input": torch.randn(4, 16, dtype=BF16), "weight": torch.ones(16, dtype=BF16),
            "out": torch.empty(4, 16, dtype=BF16)}
    args[needs].requires_grad_()
    with pytest.raises(kernel.NoBackwardError, match=rf"ltx_kernels.rmsnorm: `{needs}` requires grad.*`out`"):
        kernel.rmsnorm(args["input"], args["weight"], 1e-6, out=args["out"])
    with torch.no_grad(), pytest.raises(RuntimeError, match=re.escape(DEVICE_REFUSAL)):
        kernel.rmsnorm(args["input"], args["weight"], 1e-6, out=args["out"])


@pytest.mark.parametrize("mode", sorted(NO_GRAD_MODES))
@pytest.mark.parametrize("spec, name", ARGUMENTS, ids=[f"{s.name}-{n}" for s, n in ARGUMENTS])
def test_without_grad_mode_the_same_call_goes_on_to_the_device_check(kernel, spec, name, mode):
    args = needing_grad(small_cpu_args(spec), name)
    with NO_GRAD_MODES[mode](), pytest.raises(RuntimeError, match=re.escape(DEVICE_REFUSAL)) as refused:
        spec.call(kernel, args)
    assert not isinstance(refused.value, kernel.NoBackwardError)


@pytest.mark.parametrize("spec", OPS, ids=[s.name for s in OPS])
def test_with_grad_mode_on_and_no_input_requiring_grad_the_call_is_not_refused_for_autograd(kernel, spec):
    assert torch.is_grad_enabled()
    with pytest.raises(RuntimeError, match=re.escape(DEVICE_REFUSAL)) as refused:
        spec.call(kernel, small_cpu_args(spec))
    assert not isinstance(refused.value, kernel.NoBackwardError)


def test_the_error_is_exported_and_is_a_runtime_error(kernel):
    assert "NoBackwardError" in kernel.__all__ and issubclass(kernel.NoBackwardError, RuntimeError)


def test_the_check_traces_under_compile_with_grad_mode_on(kernel):
    """Plain Python on tensor attributes: dynamo traces it with no graph break while grad
    mode is on (inputs that need no grad), on meta tensors through the op's fake."""
    compiled = torch.compile(lambda x, w: kernel.rmsnorm(x, w, 1e-6), fullgraph=True, backend="eager")
    x, w = torch.empty(4, 64, dtype=BF16, device="meta"), torch.empty(64, dtype=BF16, device="meta")
    assert compiled(x, w).shape == (4, 64)


# --- the layers kernelize swaps in ------------------------------------------------------------------

def stateless(cls, **state):
    """A layer as kernelize leaves it: the class's forward on a module holding the state it reads."""
    module = cls()
    for key, value in state.items():
        setattr(module, key, value)
    return module


def weight():
    return nn.Parameter(torch.ones(16, dtype=BF16))  # requires grad, as every parameter does by default


def x16(requires_grad=False):
    return torch.randn(2, 3, 16, dtype=BF16).requires_grad_(requires_grad)


# layer -> (the op it runs, a call with module state or an input that requires grad, as in a model
# left in train mode or called without torch.no_grad())
LAYER_CALLS = {
    "LinearGELU": ("linear_gelu", lambda layers: stateless(
        layers.LinearGELU, proj=nn.Linear(16, 32).to(BF16), approximate="tanh")(x16())),
    "RMSNorm": ("rmsnorm", lambda layers: stateless(layers.RMSNorm, weight=weight(), eps=1e-6)(x16())),
    "TorchRMSNorm": ("rmsnorm", lambda layers: stateless(
        layers.TorchRMSNorm, weight=weight(), eps=1e-6, normalized_shape=(16,))(x16())),
    "MochiModulatedRMSNorm-scale": ("modulated_rmsnorm", lambda layers: stateless(
        layers.MochiModulatedRMSNorm, eps=1e-6)(x16(), torch.ones(2, 16, dtype=BF16, requires_grad=True))),
    "MochiModulatedRMSNorm-input": ("modulated_rmsnorm", lambda layers: stateless(
        layers.MochiModulatedRMSNorm, eps=1e-6)(x16(requires_grad=True), torch.ones(2, 16, dtype=BF16))),
}


@pytest.mark.parametrize("label", sorted(LAYER_CALLS))
def test_layers_refuse_autograd_and_go_on_under_no_grad(kernel, label):
    """Layers on an op without a backward refuse; those on a differentiable op go on to the device check."""
    op, call = LAYER_CALLS[label]
    if op in DIFFERENTIABLE_OPS:
        with pytest.raises(RuntimeError, match=re.escape(DEVICE_REFUSAL)) as refused:
            call(kernel.layers)
        assert not isinstance(refused.value, kernel.NoBackwardError)
    else:
        with pytest.raises(kernel.NoBackwardError) as refused:
            call(kernel.layers)
        assert_refused_for_autograd(refused.value, op)
    with torch.no_grad(), pytest.raises(RuntimeError, match=re.escape(DEVICE_REFUSAL)) as refused:
        call(kernel.layers)
    assert not isinstance(refused.value, kernel.NoBackwardError)


def test_the_layers_declare_no_backward(kernel):
    """kernels' Mode.TRAINING keeps the stock forwards of layers with has_backward=False."""
    for name in kernel.layers.__all__:
        assert getattr(kernel.layers, name).has_backward is False, name

