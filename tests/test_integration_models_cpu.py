"""What optimize does the same way on every hook-based model (LTX-2, Mochi, Wan, Flux),
without a GPU, on tiny random configs: refusals before any change, a second
call, restore, deep copy, hooks present before optimising, a compiled model and
autograd, regional compile. One table row per model; model-specific behaviour stays in
tests/test_integration_<model>_cpu.py."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch
from torch import nn

pytest.importorskip("diffusers")

from diffusers.models.attention_processor import MochiAttnProcessor2_0  # noqa: E402
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor  # noqa: E402
from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoAttnProcessor  # noqa: E402
from diffusers.models.transformers.transformer_wan import WanAttnProcessor  # noqa: E402

from ltx_kernels_diffusers import (CompiledModelError, HooksPresentError, UnsupportedModelError,  # noqa: E402
                                   is_optimized, optimize, optimize_ltx, restore)

from .hook_support import (GraphRecorder, add_hook, assert_grads_match, changed_modules,  # noqa: E402
                           count_stock_ops, grads, processors, run)
from .integration_support import (LTX2_3_OPTIONS, OP_NAMES, TINY_FLUX_IMAGE, TINY_LTX2_VIDEO,  # noqa: E402
                                  TINY_MOCHI_VIDEO, TINY_WAN_I2V, TINY_WAN_VIDEO, WAN_TEXT_CONTEXT,
                                  ReferenceKernel, TrainingKernel, flux_inputs, ltx2_inputs, mochi_inputs, rel_l2,
                                  tiny_flux, tiny_ltx2, tiny_mochi, tiny_wan, wan_inputs)


@dataclass(frozen=True)
class Model:
    name: str                      # as optimize's messages name it
    build: Callable                # build(dtype) -> the tiny stock transformer
    inputs: Callable               # inputs(model) -> its forward's arguments
    stock_processor: type          # what fuse_attention=False leaves on the attention modules
    foreign_option: str            # an optimize option this model does not take
    options: str                   # the options it does take, as the refusal lists them
    block_graphs: int              # graphs compile_repeated_blocks traces, one per block shape
    exact: dict = field(default_factory=dict)  # options under which the optimised model equals stock bitwise


MODELS = {m.name: m for m in [
    # LTX-2.3's options (gated attention, the text query's modulation), per-token timesteps
    Model("LTX-2 (2.0, 2.3)", lambda dtype: tiny_ltx2(dtype, **LTX2_3_OPTIONS),
          lambda model: ltx2_inputs(model, **TINY_LTX2_VIDEO, per_token=True), LTX2AudioVideoAttnProcessor,
          "fuse_rope", "exact_mode, fuse_attention, gelu_epilogue, prefer_cudnn_attention, fp8, fp8_fast_accum, "
          "fp8_keep_bf16, fp8_attention", 1),
    # 2 block graphs: blocks with a text stream; the context_pre_only one
    Model("Mochi 1", tiny_mochi, lambda model: mochi_inputs(model, **TINY_MOCHI_VIDEO), MochiAttnProcessor2_0,
          "gelu_epilogue", "exact_mode, fuse_attention, prefer_cudnn_attention, fp8, fp8_fast_accum, fp8_keep_bf16, "
          "fp8_attention", 2),
    # the image-to-video config: the added k/v of the image context are hooked too
    Model("Wan 2.1 / 2.2", lambda dtype: tiny_wan(dtype, **TINY_WAN_I2V),
          lambda model: wan_inputs(model, **{**TINY_WAN_VIDEO, "text": WAN_TEXT_CONTEXT, "image": 5}),
          WanAttnProcessor, "fuse_swiglu",
          "exact_mode, fuse_attention, gelu_epilogue, prefer_cudnn_attention, fp8, fp8_fast_accum, fp8_keep_bf16, "
          "fp8_attention", 1),
    # the GELU epilogue rounds once where stock rounds twice: off for the bitwise checks
    Model("Flux.1", tiny_flux, lambda model: flux_inputs(model, **TINY_FLUX_IMAGE), FluxAttnProcessor,
          "fuse_rope", "exact_mode, fuse_attention, gelu_epilogue, prefer_cudnn_attention, fp8, fp8_fast_accum, "
          "fp8_keep_bf16, fp8_attention", 3,
          dict(gelu_epilogue=False)),
]}

each_model = pytest.mark.parametrize("m", list(MODELS.values()), ids=list(MODELS))


@pytest.fixture
def reference():
    return ReferenceKernel()


def stock_and_inputs(m, dtype=torch.float32):
    model = m.build(dtype)
    inputs = m.inputs(model)
    return model, inputs, run(model, inputs)


def hook_names(model):
    return {name: dict(mod._diffusers_hook.hooks) for name, mod in model.named_modules()
            if hasattr(mod, "_diffusers_hook")}


# --- refusals before any change ---------------------------------------------------------------------

@each_model
def test_an_unknown_model_is_refused_naming_its_class_and_the_supported_ones(reference, m):
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(UnsupportedModelError) as err:
        optimize(model, kernel=reference)
    message = str(err.value)
    assert "does not support torch.nn.modules.container.Sequential, so nothing was changed" in message
    assert f"{m.name}: {type(m.build(torch.float32)).__name__}" in message
    assert "LTX-Video 0.9 (2B, 13B): LTXVideoTransformer3DModel" in message  # the first one listed
    assert changed_modules(model) == []


@each_model
def test_optimize_ltx_refuses_the_model_naming_what_it_is(reference, m):
    model = m.build(torch.float32)
    with pytest.raises(UnsupportedModelError, match=f"the model is {type(model).__name__}, not diffusers' "
                                                    "LTXVideoTransformer3DModel"):
        optimize_ltx(model, kernel=reference)
    assert changed_modules(model) == [] and not is_optimized(model)


@each_model
def test_an_option_the_model_does_not_take_is_refused_before_anything_changes(reference, m):
    model = m.build(torch.float32)
    with pytest.raises(TypeError, match=f"optimize got '{m.foreign_option}', which {re.escape(m.name)} does not take; "
                                        f"its options: {m.options}\\. Nothing was changed"):
        optimize(model, kernel=reference, **{m.foreign_option: False})
    assert changed_modules(model) == [] and not is_optimized(model)


@each_model
def test_fp8_attention_without_fp8_or_where_cudnn_fp8_cannot_run_is_refused_saying_why(reference, m):
    model = m.build(torch.bfloat16)
    with pytest.raises(UnsupportedModelError, match="fp8_attention: it needs fp8=True and fuse_attention=True"):
        optimize(model, kernel=reference, fp8_attention=True)
    with pytest.raises(UnsupportedModelError, match="fp8_attention: (cudnn-frontend is not installed|cuDNN's FP8 "
                                                    "SDPA needs a CUDA GPU)"):
        optimize(model, kernel=reference, fp8=True, fp8_attention=True)
    assert changed_modules(model) == [] and not is_optimized(model)


@each_model
def test_hooks_before_optimising_are_refused_with_what_to_do(reference, m):
    model = m.build(torch.float32)
    add_hook(model)  # as enable_model_cpu_offload() or a cache wraps the transformer
    with pytest.raises(HooksPresentError, match=r"pipe\.remove_all_hooks\(\), then optimize\(pipe\), then "
                                                r"pipe\.enable_model_cpu_offload\(\)"):
        optimize(model, kernel=reference)
    assert not is_optimized(model) and list(model._diffusers_hook.hooks) == ["probe"]


@each_model
def test_a_compiled_model_is_refused(reference, m):
    model = m.build(torch.float32)
    with pytest.raises(CompiledModelError, match=r"Call optimize \(or restore\) before torch.compile"):
        optimize(torch.compile(model), kernel=reference)
    assert changed_modules(model) == []


# --- optimising again, restore, copies --------------------------------------------------------------

@each_model
def test_a_second_call_changes_nothing_and_other_options_reapply(reference, m):
    model, inputs, expected = stock_and_inputs(m)
    optimize(model, kernel=reference)
    hooks, procs = hook_names(model), processors(model)
    optimize(model)  # kernel=None: the one in use
    assert hook_names(model) == hooks and all(a is b for a, b in zip(processors(model), procs))
    optimize(model, kernel=reference, fuse_attention=False, **m.exact)
    assert all(type(p) is m.stock_processor for p in processors(model))
    assert "rope" not in changed_modules(model)  # the fused processor's rotary tables go with it
    assert torch.equal(run(model, inputs), expected)


@each_model
def test_restore_gives_back_the_stock_model(reference, m):
    model, inputs, expected = stock_and_inputs(m, torch.bfloat16)
    stock_processors = processors(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    optimize(model, kernel=reference)
    assert restore(model) is model and not is_optimized(model)
    assert changed_modules(model) == [] and "_repeated_blocks" not in model.__dict__
    assert all(a is b for a, b in zip(processors(model), stock_processors))
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(run(model, inputs), expected)
    restore(model)  # again, and on a model never optimised: nothing to do
    restore(m.build(torch.float32))


@each_model
def test_a_deep_copy_is_refused_with_what_to_do(reference, m):
    model = m.build(torch.float32)
    optimize(model, kernel=reference)
    with pytest.raises(TypeError, match="cannot be deep-copied .* restore it, copy it, then optimize each"):
        copy.deepcopy(model)


# --- autograd --------------------------------------------------------------------------------------

@each_model
@pytest.mark.parametrize("differentiable", [(), ("rmsnorm",), OP_NAMES], ids=["none", "rmsnorm", "all"])
def test_autograd_runs_each_op_with_its_backward_or_as_stock_code(m, differentiable, monkeypatch):
    """Whatever the kernel can differentiate, the optimised model's output and
    every gradient are stock's; the fused forwards run, each recorded op on the
    kernel when it has a backward and as stock code when not (the kernel would
    raise); inference is unchanged."""
    model, inputs, expected = stock_and_inputs(m)
    stock_grads = grads(model, inputs)
    stock_ops = count_stock_ops(monkeypatch)
    kernel = TrainingKernel(differentiable)
    optimize(model, kernel=kernel, **m.exact)
    got = grads(model, inputs)
    assert_grads_match(got, stock_grads)
    assert sum(kernel.recorded.values()) + sum(stock_ops.values()) > 0  # the fused forwards ran
    assert set(kernel.recorded) | set(stock_ops) <= set(OP_NAMES)
    assert not set(stock_ops) & set(differentiable)
    if differentiable == OP_NAMES:
        assert kernel.recorded and not stock_ops
    assert rel_l2(run(model, inputs), expected) < 1e-6  # Mochi's masked attention: not bitwise


@pytest.mark.parametrize("m", [MODELS["Wan 2.1 / 2.2"], MODELS["Flux.1"]], ids=["Wan", "Flux"])
def test_in_bf16_the_stock_formulas_give_stock_gradients_bit_for_bit(m):
    """Each op without a backward runs diffusers' own bf16 code, rounding for rounding, so the
    gradients are stock's exactly. (LTX-2 and Mochi: their fused processors call attention on
    other layouts, whose bf16 backward rounds differently; the fp32 test above covers them.)"""
    model, inputs, _ = stock_and_inputs(m, torch.bfloat16)
    stock_grads = grads(model, inputs)
    optimize(model, kernel=TrainingKernel(), **m.exact)
    got = grads(model, inputs)
    assert got.keys() == stock_grads.keys()
    assert all(torch.equal(got[name], grad) for name, grad in stock_grads.items())


# --- torch.compile ---------------------------------------------------------------------------------

@each_model
@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_the_compiled_optimised_model_gives_the_eager_output_in_full_graphs(reference, m, scope):
    """Regional compilation traces one graph per block shape (Flux: the double-stream block, and the
    single-stream block twice as stock: the first gets a contiguous [text | image], the others the
    strided halves the one before splits off, a stride guard); the whole model, one graph."""
    model, inputs, _ = stock_and_inputs(m)
    optimize(model, kernel=reference)
    expected = run(model, inputs)
    backend = GraphRecorder()
    torch._dynamo.reset()
    if scope == "blocks":
        model.compile_repeated_blocks(fullgraph=True, backend=backend)
    else:
        model.compile(fullgraph=True, backend=backend)
    assert torch.equal(run(model, inputs), expected)
    assert len(backend.graphs) == (m.block_graphs if scope == "blocks" else 1)


@each_model
def test_the_whole_optimised_model_compiles_without_breaks_for_a_checkpointed_training_step(m):
    """The whole model under torch.compile(fullgraph=True), gradient checkpointing on, a backward:
    the recorded ops trace with their backward formulas, the hooks' hand-overs trace too, and the
    gradients are stock's."""
    model, inputs, _ = stock_and_inputs(m)
    stock_grads = grads(model, inputs)
    optimize(model, kernel=TrainingKernel(), **m.exact)
    model.enable_gradient_checkpointing()
    backend = GraphRecorder()
    torch._dynamo.reset()
    model.compile(fullgraph=True, backend=backend)
    got = grads(model, inputs)
    assert len(backend.graphs) == 1
    assert_grads_match(got, stock_grads)


def _scale_rows_eager(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * scale


# an op inductor cannot see into, as ours are (registered by a call: kernel-builder's hook refuses
# a top-level torch.library decorator without the build's namespace prefix)
_scale_rows = torch.library.custom_op("ltx_test::scale_rows", _scale_rows_eager, mutates_args=())
_scale_rows.register_fake(lambda x, scale: torch.empty_like(x))


@pytest.mark.parametrize("once", [False, True])
def test_modulation_pieces_read_by_opaque_ops_are_computed_once_under_inductor(once):
    """``table + temb`` split into pieces for ops inductor cannot see into: plain
    views are recomputed once per op that reads one (a launch each); pieces of
    ``computed_once`` come from one buffer, and the values do not change."""
    from torch._inductor.utils import run_and_get_code

    from ltx_kernels_diffusers.models.base import computed_once

    table = torch.randn(4, 32)

    def block(x, temb):
        ada = table[None, None] + temb.reshape(x.shape[0], 1, 4, 32)
        pieces = (computed_once(ada) if once else ada).unbind(dim=2)
        for piece in pieces:
            x = _scale_rows(x, piece)
        return x

    x, temb = torch.randn(2, 8, 32), torch.randn(2, 1, 128)
    torch._dynamo.reset()
    got, code = run_and_get_code(torch.compile(block, fullgraph=True), x, temb)
    assert torch.equal(got, block(x, temb))
    kernels = set(re.findall(r"\bcpp_fused_\w+", code[0]))
    assert len(kernels) == (1 if once else 4), sorted(kernels)
