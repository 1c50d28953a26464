"""optimize(..., cuda_graph=True) without a GPU, on a tiny LTX-Video config: the graph hook comes and
goes with the option (restore, a second call, other options), and every call a graph cannot serve
runs the forward as it is, bit for bit, saying why once. Capture and replay are in
tests/test_integration_cuda_graph_gpu.py."""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("diffusers")

from ltx_kernels_diffusers import (CudaGraphWarning, is_optimized, optimize, optimize_ltx,  # noqa: E402
                                   reset_cuda_graphs, restore)
from ltx_kernels_diffusers.cuda_graph import cuda_graph_hook  # noqa: E402

from .hook_support import run  # noqa: E402
from .integration_support import TINY_VIDEO, ltx_inputs, tiny_model  # noqa: E402
from .test_integration_cpu import reference  # noqa: E402, F401


@pytest.mark.parametrize("entry", [optimize, optimize_ltx])
def test_the_graph_hook_comes_and_goes_with_the_option(reference, entry):
    model = tiny_model()
    entry(model, kernel=reference, cuda_graph=True)
    hook = cuda_graph_hook(model)
    assert hook is not None and is_optimized(model)
    entry(model, kernel=reference, cuda_graph=True)
    assert cuda_graph_hook(model) is hook  # the same call again changes nothing
    entry(model, kernel=reference)
    assert cuda_graph_hook(model) is None and is_optimized(model)
    entry(model, kernel=reference, cuda_graph=True)
    restore(model)
    assert cuda_graph_hook(model) is None and not is_optimized(model)
    assert "_diffusers_hook" not in model.__dict__ and "forward" not in model.__dict__


def test_inputs_off_the_gpu_run_the_forward_as_it_is_saying_why_once(reference):
    model = tiny_model()
    inputs = ltx_inputs(model, **TINY_VIDEO)
    optimize(model, kernel=reference)
    expected = run(model, inputs)
    optimize(model, kernel=reference, cuda_graph=True)
    with pytest.warns(CudaGraphWarning, match="input tensor is on cpu"):
        got = run(model, inputs)
    assert torch.equal(got, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(run(model, inputs), expected)  # said once
    assert not cuda_graph_hook(model).graphs


def test_grad_mode_runs_the_forward_as_it_is_without_a_warning(reference):
    model = tiny_model()
    inputs = ltx_inputs(model, **TINY_VIDEO)
    optimize(model, kernel=reference)
    with torch.no_grad():
        expected = model(**inputs)[0]
    optimize(model, kernel=reference, cuda_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = model(**inputs)[0]
    assert torch.equal(got, expected) and got.requires_grad


def test_unhashable_inputs_run_the_forward_as_it_is(reference):
    model = tiny_model()
    inputs = {"attention_kwargs": {"unused": {1}}, **ltx_inputs(model, **TINY_VIDEO)}  # a set: a leaf
    optimize(model, kernel=reference, cuda_graph=True)
    with pytest.warns(CudaGraphWarning, match="set.*not hashable"):
        run(model, inputs)


def test_reset_cuda_graphs_takes_a_pipeline_or_a_model_and_is_a_no_op_without_graphs(reference):
    model = tiny_model()
    reset_cuda_graphs(model)  # not optimised: nothing to drop
    optimize(model, kernel=reference, cuda_graph=True)
    hook = cuda_graph_hook(model)
    hook.refused["a signature"] = "a reason"
    reset_cuda_graphs(type("Pipe", (), {"transformer": model})())
    assert not hook.refused and not hook.graphs
