"""The integration's per-op choice under autograd (ltx_kernels_diffusers.autograd),
without a GPU: eager, a kernel op with a backward is called as it is, one without
runs as stock code only when autograd records the call; under torch.compile every
recorded call runs as stock code, traced without a graph break. The model-level
checks (every gradient equals stock's) are in tests/test_integration_models_cpu.py
and test_integration_cpu.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")

from ltx_kernels_diffusers.autograd import AutogradKernel, autograd_kernel, unwrap  # noqa: E402

from .hook_support import GraphRecorder  # noqa: E402
from .integration_support import NoBackward, TrainingKernel  # noqa: E402


def gated_residual_args(requires_grad):
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(2, 5, 8, generator=g) for _ in range(2))
    gate = torch.randn(2, 1, 8, generator=g).requires_grad_(requires_grad)
    return x, y, gate


def test_eager_an_op_with_a_backward_is_the_kernels_own():
    kernel = TrainingKernel({"gated_residual"})
    wrapped = AutogradKernel(kernel)
    x, y, gate = gated_residual_args(requires_grad=True)
    wrapped.gated_residual(x, y, gate)
    assert kernel.recorded == {"gated_residual": 1}
    assert wrapped.adaln_rmsnorm is not kernel.adaln_rmsnorm
    # a name new in DIFFERENTIABLE needs no change here
    assert "adaln_rmsnorm" in wrapped.stock_ops and "gated_residual" not in wrapped.stock_ops


def test_an_op_without_one_runs_as_stock_code_only_when_recorded():
    kernel = TrainingKernel()
    wrapped = AutogradKernel(kernel)
    x, y, gate = gated_residual_args(requires_grad=True)
    out = wrapped.gated_residual(x, y, gate)  # the kernel would raise NoBackward
    out.sum().backward()
    torch.testing.assert_close(gate.grad, y.sum(1, keepdim=True))
    assert kernel.calls["gated_residual"] == 0
    with torch.no_grad():
        wrapped.gated_residual(x, y, gate)
    wrapped.gated_residual(*gated_residual_args(requires_grad=False))
    assert kernel.calls["gated_residual"] == 2  # inference and a frozen input reach the kernel
    with pytest.raises(NoBackward):
        kernel.gated_residual(x, y, gate)  # what the wrapper kept away


def test_recorded_linear_gelu_is_the_projection_then_gelu_tanh():
    kernel = TrainingKernel({"gelu_tanh"})
    wrapped = AutogradKernel(kernel)
    x = torch.randn(3, 8, requires_grad=True)
    weight, bias = torch.randn(4, 8), torch.randn(4)
    out = wrapped.linear_gelu(x, weight, bias)
    torch.testing.assert_close(out, torch.nn.functional.gelu(x @ weight.T + bias, approximate="tanh"))
    assert kernel.recorded == {"gelu_tanh": 1} and kernel.calls["linear_gelu"] == 0


def test_wrapping_twice_and_unwrapping_give_the_kernel():
    kernel = TrainingKernel()
    wrapped = autograd_kernel(kernel)
    assert autograd_kernel(wrapped) is wrapped and unwrap(wrapped) is kernel and unwrap(kernel) is kernel


def test_torch_compile_traces_the_choice_without_a_graph_break():
    wrapped = AutogradKernel(TrainingKernel())
    backend = GraphRecorder()
    torch._dynamo.reset()
    step = torch.compile(lambda x, y, gate: wrapped.gated_residual(x, y, gate) * 2, fullgraph=True,
                         backend=backend)
    x, y, gate = gated_residual_args(requires_grad=True)
    step(x, y, gate).sum().backward()  # recorded: the stock formula, in the graph
    assert gate.grad is not None
    with torch.no_grad():
        step(x, y, gate)  # the kernel's op: another graph under the grad-mode guard, no break
    assert len(backend.graphs) == 2


def test_under_torch_compile_every_recorded_op_runs_as_stock_code():
    """Inductor fuses the stock code and reuses dead grads' buffers; eager keeps the kernel's ops."""
    ops = {"gelu_tanh", "swiglu", "linear_gelu", "rmsnorm", "gated_residual"}
    kernel = TrainingKernel(ops)
    wrapped = AutogradKernel(kernel)
    x = torch.randn(3, 8, requires_grad=True)
    weight, bias, y, gate = torch.randn(4, 8), torch.randn(4), torch.randn(3, 8), torch.randn(1, 8)

    def step(x):
        return (wrapped.gelu_tanh(x).sum() + wrapped.swiglu(x).sum() + wrapped.linear_gelu(x, weight, bias).sum()
                + wrapped.rmsnorm(x, None, 1e-6).sum() + wrapped.gated_residual(x, y, gate).sum())

    expected = step(x)
    assert kernel.recorded == dict.fromkeys(ops, 1)
    torch._dynamo.reset()
    backend = GraphRecorder()
    got = torch.compile(step, fullgraph=True, backend=backend)(x)
    got.backward()
    torch.testing.assert_close(got, expected)
    assert kernel.recorded == dict.fromkeys(ops, 1)  # no kernel op in the graph
    assert len(backend.graphs) == 1 and x.grad is not None
    with torch.no_grad():
        torch.compile(step, fullgraph=True, backend=backend)(x)
    assert kernel.calls["gelu_tanh"] >= 2  # inference under compile: the kernel's op


@pytest.mark.parametrize("rotation", ["interleaved", "half"])
def test_stock_qk_rmsnorm_rope_reads_tables_repeating_along_the_row_as_the_tiled_ones(rotation):
    """Wan's [1, S, Dh] tables under the norm over all heads (the stock code autograd runs where the
    kernel has no backward): the values and gradients of the same tables tiled to [1, S, D]."""
    from ltx_kernels_diffusers import autograd

    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 5, 12, generator=g).requires_grad_() for _ in range(2))
    angle = torch.rand(1, 5, 4, generator=g) * 6.3
    cos, sin = angle.cos(), angle.sin()
    results = []
    for tables in ((cos, sin), (cos.repeat(1, 1, 3), sin.repeat(1, 1, 3))):
        qo, ko = autograd.qk_rmsnorm_rope(q, k, None, None, *tables, rotation=rotation)
        results.append((qo, ko, *torch.autograd.grad((qo * ko).sum(), (q, k))))
    for got, expected in zip(*results):
        assert torch.allclose(got, expected, rtol=0, atol=1e-6)
