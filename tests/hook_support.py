"""Shared by the CPU tests of the hook-based models (LTX-2, Mochi, Wan, Flux): running a
model, what optimize may leave behind, and a diffusers hook that counts calls.
Imports diffusers: import it after ``pytest.importorskip("diffusers")``."""

from __future__ import annotations

import collections

import torch
from diffusers.hooks import HookRegistry, ModelHook


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


def first_arguments(module, paths, call):
    """{path: the first argument each submodule of ``module`` at ``paths`` gets} while ``call()`` runs."""
    seen = {}
    handles = [module.get_submodule(path).register_forward_pre_hook(
        lambda sub, args, path=path: seen.update({path: args[0]})) for path in paths]
    try:
        call()
    finally:
        for handle in handles:
            handle.remove()
    return seen


def fp8_wiring_run(model_module, model, inputs, block, reference):
    """The FP8 wiring on the CPU, with the fp8 references: ``model_module``'s plan (``models/<model>.py``)
    applied with fp8=True (check refuses CPU linears, so the plan is applied directly, as optimize does
    once its checks pass), then one run of ``model``. Returns (the state, the recording kernel,
    {path: first argument} of ``block``'s ``FP8_LINEARS``, the output)."""
    from .integration_support import RecordingKernel

    recorder = RecordingKernel(reference)
    options = model_module.Options()
    state = model_module.apply(model_module.check(model, options), recorder, model_module.Options(fp8=True))
    outputs = []
    seen = first_arguments(block, model_module.FP8_LINEARS, lambda: outputs.append(run(model, inputs)))
    return state, recorder, seen, outputs[0]


def assert_compiles_like_eager(block, args=(), kwargs=None, tolerance=1e-2):
    """``block`` traces with no graph break, and ``torch.compile(fullgraph=True)`` gives its eager
    output(s) within ``tolerance`` relative L2."""
    from .integration_support import rel_l2

    kwargs = kwargs or {}
    with torch.no_grad():
        explained = torch._dynamo.explain(block)(*args, **kwargs)
        assert explained.graph_break_count == 0, explained.break_reasons
        eager = block(*args, **kwargs)
        compiled = torch.compile(block, fullgraph=True)(*args, **kwargs)
    pairs = zip(compiled, eager) if isinstance(eager, tuple) else [(compiled, eager)]
    assert all(rel_l2(c, e) < tolerance for c, e in pairs)


def first_block_kwargs(model, inputs, blocks="transformer_blocks"):
    """Block 0's keyword arguments, as the model forward passes them (recorded from a run)."""
    seen = {}
    handle = getattr(model, blocks)[0].register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    with torch.no_grad():
        model(**inputs)
    handle.remove()
    return seen


def changed_modules(model):
    """Modules with an instance forward or a hook registry: what optimize may leave behind."""
    return [name for name, m in model.named_modules() if "forward" in m.__dict__ or hasattr(m, "_diffusers_hook")]


def processors(model):
    return [m.processor for m in model.modules() if hasattr(m, "processor")]


class CountingHook(ModelHook):
    """A diffusers hook that only counts the calls it wraps, as offloading and cache hooks wrap them."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def pre_forward(self, module, *args, **kwargs):
        self.calls += 1
        return args, kwargs


def add_hook(module, name="probe"):
    hook = CountingHook()
    HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, name)
    return hook


def check_quality_target(kernel, fp32, model, inputs, exact_mode, bar=1.1, **options):
    """Issue 35's quality target on one random-weight model: the optimised bf16
    ``model``'s relative L2 to the ``fp32`` run of the same weights on the same
    (bf16-rounded) inputs is at most ``bar`` (1.1) times stock bf16's. ``fp32`` is only run.
    ``options`` go to optimize (issue 37: ``fp8=True`` with ``bar=3``). Returns (ours, stock)."""
    from ltx_kernels_diffusers import optimize

    from .integration_support import rel_l2

    reference = run(fp32, {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                           for k, v in inputs.items()})
    stock = rel_l2(run(model, inputs), reference)
    optimize(model, kernel=kernel, exact_mode=exact_mode, **options)
    ours = rel_l2(run(model, inputs), reference)
    assert ours <= bar * stock, f"relative L2 to fp32: ours {ours:.5g}, stock bf16 {stock:.5g}"
    return ours, stock


def check_model_cpu_offload(kernel, transformer, make_inputs):
    """optimize, then ``enable_model_cpu_offload``: the offloaded model gives the
    optimised output; restore under the offload hook gives the stock one; optimize
    after the hook is refused. ``make_inputs(transformer)``: its forward's arguments."""
    import pytest

    from ltx_kernels_diffusers import HooksPresentError, optimize, restore

    from .integration_support import rel_l2
    from .test_integration_gpu import transformer_only_pipeline

    pytest.importorskip("accelerate")
    pipe = transformer_only_pipeline(transformer)
    inputs = make_inputs(pipe.transformer)
    expected = run(pipe.transformer, inputs)
    optimize(pipe, kernel=kernel)
    optimised = run(pipe.transformer, inputs)
    pipe.transformer.to("cpu")
    pipe.enable_model_cpu_offload()
    assert rel_l2(run(pipe.transformer, inputs), optimised) < 1e-3  # the hook moves it to the GPU and back
    restore(pipe)  # the offload hook wraps the model, none of the modules optimize hooked
    assert rel_l2(run(pipe.transformer, inputs), expected) < 1e-3
    with pytest.raises(HooksPresentError, match=r"then optimize\(pipe\), then pipe.enable_model_cpu_offload"):
        optimize(pipe, kernel=kernel)


class GraphRecorder:
    """A torch.compile backend that keeps each graph dynamo hands it and runs it uncompiled."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def count_stock_ops(monkeypatch):
    """Counts the calls of each stock formula the integration's AutogradKernel falls back to
    (patched before ``optimize``: the wrapper takes them when it is built)."""
    from ltx_kernels_diffusers.autograd import STOCK_OPS

    counts = collections.Counter()
    for name, fn in list(STOCK_OPS.items()):
        monkeypatch.setitem(STOCK_OPS, name, counted(counts, name, fn))
    return counts


def counted(counts, name, fn):
    def call(*args, **kwargs):
        counts[name] += 1
        return fn(*args, **kwargs)
    return call


def grads(model, inputs):
    """Every parameter's gradient of a fixed weighted sum of the output."""
    model.zero_grad(set_to_none=True)
    out = model(**inputs)[0]
    (out.float() * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_grads_match(got, expected):
    """Same parameters, and each gradient within float32 rounding of the expected one: summed in
    another order (the fused ops' stock fallbacks reduce over tokens differently), an element can
    differ by ~1e-6 of the tensor's largest, which a per-element rtol reads as a mismatch where
    the element is small (Mochi's pos_frequencies on an AMD EPYC: 2e-5 at 0.63, largest 71)."""
    assert got.keys() == expected.keys()
    for name, grad in got.items():
        scale = float(expected[name].abs().max())
        torch.testing.assert_close(grad, expected[name], rtol=1e-5, atol=1e-6 * max(scale, 1.0), msg=name)
