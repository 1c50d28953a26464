"""optimize_ltx / restore without a GPU, on a tiny LTX-Video config: module
discovery, refusal before any change, idempotence, restore, hooks, autograd
and torch.compile. Numerics run the fused forwards against a pure-PyTorch
reference of the op API (tests/integration_support.py) that rounds as
diffusers' eager code does, so the optimised model must equal the stock one
bit for bit; torch.compile runs the real ops on meta tensors."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from torch import nn

pytest.importorskip("diffusers")

from diffusers.hooks import HookRegistry, ModelHook  # noqa: E402
from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm  # noqa: E402
from diffusers.models.transformers.transformer_ltx import LTXVideoAttnProcessor  # noqa: E402

from ltx_kernels_diffusers import (CompiledModelError, HooksPresentError, UnsupportedModelError,  # noqa: E402
                                   is_optimized, optimize_ltx, restore)

from .hook_support import GraphRecorder, assert_grads_match, count_stock_ops, grads  # noqa: E402
from .integration_support import (OP_NAMES, TINY_CONFIG, TINY_VIDEO, RecordingKernel, ReferenceKernel,  # noqa: E402
                                  TrainingKernel, ltx_inputs, rel_l2, tiny_model)

N_BLOCKS = TINY_CONFIG["num_layers"]


@pytest.fixture
def reference(kernel):
    return ReferenceKernel(kernel)


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


def stock_and_inputs(dtype=torch.float32, **overrides):
    model = tiny_model(dtype, **overrides)
    inputs = ltx_inputs(model, **TINY_VIDEO)
    return model, inputs, run(model, inputs)


def patched_modules(model):
    """Names of modules whose forward is replaced on the instance."""
    return [name for name, m in model.named_modules() if "forward" in m.__dict__]


def processors(model):
    return [m.processor for m in model.modules() if hasattr(m, "processor")]


def add_probe_hook(module, name="probe"):
    """A diffusers hook that only wraps the forward, as offloading hooks do."""
    HookRegistry.check_if_exists_or_initialize(module).register_hook(ModelHook(), name)


# --- same output -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_optimised_model_equals_stock_bitwise_with_eager_roundings(reference, dtype):
    model, inputs, expected = stock_and_inputs(dtype)
    optimize_ltx(model, kernel=reference, gelu_epilogue=False)
    assert torch.equal(run(model, inputs), expected)


def test_fast_mode_with_gelu_epilogue_stays_close_to_stock(reference):
    model, inputs, expected = stock_and_inputs(torch.bfloat16)
    optimize_ltx(model, kernel=reference, exact_mode=False, gelu_epilogue=True)
    assert rel_l2(run(model, inputs), expected) < 1e-2


def test_per_token_timesteps_match_stock(reference):
    model = tiny_model(torch.bfloat16)
    inputs = ltx_inputs(model, **TINY_VIDEO, per_token=True)
    expected = run(model, inputs)
    optimize_ltx(model, kernel=reference, gelu_epilogue=False)
    assert torch.equal(run(model, inputs), expected)


def test_explicit_video_coords_take_the_stock_rope(reference):
    model, inputs, _ = stock_and_inputs()
    f, h, w = inputs["num_frames"], inputs["height"], inputs["width"]
    grid = torch.stack(torch.meshgrid(torch.arange(f), torch.arange(h), torch.arange(w), indexing="ij"))
    inputs["video_coords"] = grid.flatten(1).float()[None].expand(TINY_VIDEO["batch"], -1, -1) * 3
    expected = run(model, inputs)
    recorder = RecordingKernel(reference)
    optimize_ltx(model, kernel=recorder, gelu_epilogue=False)
    assert torch.equal(run(model, inputs), expected)
    assert recorder.calls["ltx_rope_cos_sin"] == 0


# --- which fused ops run ----------------------------------------------------------------------------

def test_each_seam_runs_one_fused_op(reference):
    model, inputs, _ = stock_and_inputs()
    recorder = RecordingKernel(reference)
    optimize_ltx(model, kernel=recorder, gelu_epilogue=False)
    run(model, inputs)
    assert dict(recorder.calls) == {
        "ltx_rope_cos_sin": 1,                          # RoPE tables once per forward
        "adaln_rmsnorm": 1,                             # norm1 + modulation of the first block only
        "qk_rmsnorm_rope": N_BLOCKS,                    # self-attention q/k norm + RoPE
        "rmsnorm": 2 * N_BLOCKS,                        # cross-attention q and k norms (text keys)
        "gated_residual": N_BLOCKS + 1,                 # self-attention residual; the last feed-forward residual
        "gated_residual_rmsnorm": 2 * N_BLOCKS - 1,     # cross-attn residual + norm2; ff residual + next norm1
        "gelu_tanh": N_BLOCKS,
    }


def test_gelu_epilogue_replaces_the_separate_gelu(reference):
    model, inputs, expected = stock_and_inputs()
    recorder = RecordingKernel(reference)
    optimize_ltx(model, kernel=recorder)
    assert rel_l2(run(model, inputs), expected) < 1e-5
    assert recorder.calls["linear_gelu"] == N_BLOCKS and recorder.calls["gelu_tanh"] == 0


def test_hooks_on_a_block_after_optimising_unchain_the_blocks_but_keep_them_fused(reference):
    model, inputs, expected = stock_and_inputs()
    recorder = RecordingKernel(reference)
    optimize_ltx(model, kernel=recorder, gelu_epilogue=False)
    add_probe_hook(model.transformer_blocks[1])  # as group offloading or a cache would
    assert torch.equal(run(model, inputs), expected)
    assert recorder.calls["adaln_rmsnorm"] == N_BLOCKS
    assert recorder.calls["gated_residual_rmsnorm"] == N_BLOCKS


def test_attention_kwargs_run_the_stock_model_forward(reference):
    model, inputs, expected = stock_and_inputs()
    recorder = RecordingKernel(reference)
    optimize_ltx(model, kernel=recorder, gelu_epilogue=False)
    with torch.no_grad():
        got = model(**inputs, attention_kwargs={"scale": 1.0})[0]
    assert torch.equal(got, expected)
    assert recorder.calls["adaln_rmsnorm"] == N_BLOCKS  # no chaining, each block still fused


@pytest.mark.parametrize("checkpointing", [False, True], ids=["chained", "checkpointed"])
@pytest.mark.parametrize("differentiable", [(), ("rmsnorm",), OP_NAMES], ids=["none", "rmsnorm", "all"])
def test_autograd_runs_each_op_with_its_backward_or_as_stock_code(kernel, differentiable, checkpointing,
                                                                  monkeypatch):
    """The fused forwards run under autograd (chained, or each block checkpointed
    through the stock model forward), each recorded op on the kernel when it has
    a backward and as stock code when not (the kernel would raise); every
    gradient is stock's."""
    model, inputs, expected = stock_and_inputs()
    if checkpointing:
        model.enable_gradient_checkpointing()
    stock_grads = grads(model, inputs)
    stock_ops = count_stock_ops(monkeypatch)
    training = TrainingKernel(differentiable, ReferenceKernel(kernel))
    optimize_ltx(model, kernel=training, gelu_epilogue=False)
    got = grads(model, inputs)
    assert_grads_match(got, stock_grads)
    used = {"adaln_rmsnorm", "gated_residual", "gated_residual_rmsnorm", "gelu_tanh", "qk_rmsnorm_rope", "rmsnorm"}
    assert set(training.recorded) | set(stock_ops) == used
    assert set(training.recorded) == used & set(differentiable)
    assert torch.equal(run(model, inputs), expected)


# --- finding the model, refusing what it does not recognise --------------------------------------

def test_pipeline_is_optimised_through_its_transformer(reference):
    model, inputs, expected = stock_and_inputs()
    pipe = types.SimpleNamespace(transformer=model, vae=None)
    assert optimize_ltx(pipe, kernel=reference, gelu_epilogue=False) is pipe
    assert is_optimized(pipe) and is_optimized(model)
    assert torch.equal(run(model, inputs), expected)


def test_something_that_is_neither_a_pipeline_nor_a_model_is_a_type_error(reference):
    with pytest.raises(TypeError, match="expected an LTX-Video pipeline .* got str"):
        optimize_ltx("LTX-Video", kernel=reference)


def test_another_model_is_refused_naming_what_it_is(reference):
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(UnsupportedModelError, match="the model is Sequential, not diffusers' "
                                                    "LTXVideoTransformer3DModel"):
        optimize_ltx(model, kernel=reference)
    assert patched_modules(model) == []


def test_an_unsupported_block_norm_is_refused_before_anything_changes(reference):
    model = tiny_model()
    model.transformer_blocks[2].norm1 = nn.LayerNorm(16)
    before = processors(model)
    with pytest.raises(UnsupportedModelError, match=r"transformer_blocks\.2\.norm1 is LayerNorm, not an RMSNorm"):
        optimize_ltx(model, kernel=reference)
    assert patched_modules(model) == [] and not is_optimized(model)
    assert all(a is b for a, b in zip(processors(model), before))


def test_every_problem_is_listed(reference):
    model = tiny_model()
    model.transformer_blocks[0].norm2 = DiffusersRMSNorm(16, eps=1e-6, elementwise_affine=True, bias=True)
    model.transformer_blocks[1].attn2.norm_k = nn.LayerNorm(16)
    with pytest.raises(UnsupportedModelError) as err:
        optimize_ltx(model, kernel=reference)
    assert "transformer_blocks.0.norm2 is diffusers' RMSNorm with a bias" in str(err.value)
    assert "transformer_blocks.1.attn2.norm_k is LayerNorm" in str(err.value)


def test_a_custom_attention_processor_is_refused_not_dropped(reference):
    class MyProcessor(LTXVideoAttnProcessor):
        pass

    model = tiny_model()
    custom = MyProcessor()
    model.transformer_blocks[1].attn1.set_processor(custom)
    with pytest.raises(UnsupportedModelError, match=r"transformer_blocks\.1\.attn1 uses the attention processor "
                                                    r".*MyProcessor"):
        optimize_ltx(model, kernel=reference)
    assert model.transformer_blocks[1].attn1.processor is custom


def test_a_forward_replaced_by_kernelize_or_a_patch_is_refused(kernel, reference):
    model = tiny_model()
    block = model.transformer_blocks[0]
    block.forward = types.MethodType(kernel.layers.LTXVideoTransformerBlock.forward, block)  # what kernelize does
    with pytest.raises(UnsupportedModelError, match=r"transformer_blocks\.0 is already replaced"):
        optimize_ltx(model, kernel=reference)
    assert patched_modules(model) == ["transformer_blocks.0"]


def test_the_class_forward_left_on_the_instance_by_a_removed_hook_is_not_a_patch(reference):
    model, inputs, expected = stock_and_inputs()
    model.forward = types.MethodType(type(model).forward, model)  # what removing an accelerate hook leaves
    optimize_ltx(model, kernel=reference, gelu_epilogue=False)
    assert torch.equal(run(model, inputs), expected)
    restore(model)
    assert patched_modules(model) == []


def test_a_kernel_without_the_integration_functions_is_refused(kernel):
    model = tiny_model()
    incomplete = types.SimpleNamespace(**{n: getattr(kernel, n) for n in ("rmsnorm", "gelu_tanh")})
    with pytest.raises(TypeError, match="lacks adaln_rmsnorm, .*layers.ltx_block_forward"):
        optimize_ltx(model, kernel=incomplete)
    assert patched_modules(model) == []


# --- idempotence and restore ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_feeds_each_fp8_linear_the_rows_of_its_producer_and_restore_gives_stock_back(reference, dtype):
    """The FP8 wiring on the CPU: the built kernel's block forward with the fp8 references
    (ltx_dev.reference.fp8). check refuses CPU linears, so the parts are applied directly."""
    from ltx_kernels_diffusers.models import ltx_video

    from .hook_support import first_arguments

    model, inputs, expected = stock_and_inputs(dtype)
    recorder = RecordingKernel(reference)
    options = ltx_video.Options(fp8=True)
    state = ltx_video.apply(ltx_video.check(model, None), recorder, options)
    outputs = []
    seen = first_arguments(model.transformer_blocks[1], ltx_video.FP8_LINEARS,
                           lambda: outputs.append(run(model, inputs)))
    assert 0 < rel_l2(outputs[0], expected) < 0.1  # e4m3's step: 2^-4
    # chained: block 0's seam wrote block 1's norm1 rows; the attention outputs come in bf16
    assert {path: type(x).__name__ for path, x in seen.items()} == {
        path: "Tensor" if path.endswith("to_out.0") else "Fp8Rows" for path in ltx_video.FP8_LINEARS}
    assert recorder.calls["gelu_tanh_fp8"] == len(model.transformer_blocks)
    ltx_video.restore(model, state)
    assert patched_modules(model) == [] and torch.equal(run(model, inputs), expected)


def test_fp8_self_attention_runs_q_k_v_as_one_gemm_with_the_three_gemms_output(reference):
    """fp8_fuse_qkv (default): attn1's q/k/v as one joined Fp8Linear fed the norm's rows; the same output
    as three GEMMs; a hook on to_q (or a replaced to_q) brings the three back; restore drops the join."""
    from ltx_kernels_diffusers.models import ltx_video

    from .hook_support import first_arguments

    model, inputs, expected = stock_and_inputs()
    state = ltx_video.apply(ltx_video.check(model, None), reference, ltx_video.Options(fp8=True))
    attn = model.transformer_blocks[1].attn1
    assert attn.to_qkv_fp8.parts == (attn.to_q, attn.to_k, attn.to_v)
    outputs = []
    seen = first_arguments(attn, ["to_qkv_fp8"], lambda: outputs.append(run(model, inputs)))
    assert type(seen["to_qkv_fp8"]).__name__ == "Fp8Rows"
    unjoined = first_arguments(attn, ["to_q", "to_k"], lambda: outputs.append(run(model, inputs)))
    assert set(unjoined) == {"to_q", "to_k"}  # hooked: the three run on their own
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)
    ltx_video.restore(model, state)
    assert not hasattr(attn, "to_qkv_fp8") and torch.equal(run(model, inputs), expected)


def test_fp8_cross_attention_keys_and_values_of_every_block_run_as_one_gemm(reference):
    """fp8_join_text_kv (default): every attn2's to_k / to_v as one GEMM per forward on the caption
    rows, the parts' weights views of the joined ones (again after a move); the same output as the
    unjoined model; a hook on one projection brings the per-block GEMMs back; restore gives the parts
    their own memory and the stock output."""
    from ltx_kernels_diffusers.models import ltx_video

    from .hook_support import first_arguments

    model, inputs, expected = stock_and_inputs()
    blocks = model.transformer_blocks
    state = ltx_video.apply(ltx_video.check(model, None), reference, ltx_video.Options(fp8=True))
    joined = model.text_kv_joined
    assert joined.parts == tuple(m for b in blocks for m in (b.attn2.to_k, b.attn2.to_v))
    assert "text_kv_joined.weight" not in model.state_dict()

    def shared():
        start = joined.weight.data_ptr()
        end = start + joined.weight.numel() * joined.weight.element_size()
        return all(start <= m.weight.data_ptr() < end for m in joined.parts)

    assert shared()
    outputs = []
    seen = first_arguments(model, ["text_kv_joined"], lambda: outputs.append(run(model, inputs)))
    assert set(seen) == {"text_kv_joined"}
    unjoined = first_arguments(blocks[0], ["attn2.to_k"], lambda: outputs.append(run(model, inputs)))
    assert set(unjoined) == {"attn2.to_k"}  # hooked: each block's own GEMMs
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)
    model._apply(lambda t: t.clone())  # a move: each part copied on its own, then the joined tensors
    assert shared()
    ltx_video.restore(model, state)
    assert not hasattr(model, "text_kv_joined") and not any(
        joined.weight.data_ptr() <= m.weight.data_ptr() < joined.weight.data_ptr() + joined.weight.nbytes
        for m in joined.parts)
    assert torch.equal(run(model, inputs), expected)


def test_fp8_on_a_model_off_the_gpu_is_refused_naming_it_before_anything_changes(reference):
    from ltx_kernels_diffusers import optimize

    model, inputs, expected = stock_and_inputs()
    with pytest.raises(UnsupportedModelError, match=r"fp8=True cannot convert .*attn1.to_q is on cpu; move the model"):
        optimize(model, kernel=reference, fp8=True)
    assert patched_modules(model) == [] and not is_optimized(model)
    assert torch.equal(run(model, inputs), expected)


def test_a_second_call_changes_nothing(reference):
    model, inputs, expected = stock_and_inputs()
    optimize_ltx(model, kernel=reference, gelu_epilogue=False)
    forwards = {name: m.__dict__["forward"] for name, m in model.named_modules() if "forward" in m.__dict__}
    procs = processors(model)
    optimize_ltx(model, gelu_epilogue=False)  # kernel=None: keep the one in use
    assert {name: m.__dict__["forward"] for name, m in model.named_modules() if "forward" in m.__dict__} == forwards
    assert all(a is b for a, b in zip(processors(model), procs))
    assert torch.equal(run(model, inputs), expected)


def test_a_call_with_other_options_applies_them(reference):
    model, inputs, _ = stock_and_inputs()
    optimize_ltx(model, kernel=reference, gelu_epilogue=False)
    recorder = RecordingKernel(reference)
    optimize_ltx(model, kernel=recorder, gelu_epilogue=True)
    run(model, inputs)
    assert recorder.calls["linear_gelu"] == N_BLOCKS


def test_restore_gives_back_the_stock_model(reference):
    model, inputs, expected = stock_and_inputs(torch.bfloat16)
    stock_processors = processors(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    optimize_ltx(model, kernel=reference, exact_mode=False)
    assert model.state_dict().keys() == state.keys()
    assert restore(model) is model
    assert patched_modules(model) == [] and not is_optimized(model)
    assert all(a is b for a, b in zip(processors(model), stock_processors))
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(run(model, inputs), expected)
    restore(model)  # a second restore, and restore of a model never optimised, change nothing
    restore(tiny_model())


@pytest.mark.parametrize("real_kernel", [False, True])
def test_a_deep_copy_is_optimised_on_its_own(kernel, reference, real_kernel):
    model, inputs, expected = stock_and_inputs()
    optimize_ltx(model, kernel=kernel if real_kernel else reference, gelu_epilogue=False)
    clone = copy.deepcopy(model)  # the kernel is shared, not copied (a module cannot be)
    assert is_optimized(clone)
    assert all(m.forward.__self__ is m for _, m in clone.named_modules() if "forward" in m.__dict__)
    if not real_kernel:  # the built ops need a GPU
        assert torch.equal(run(clone, inputs), expected)
    restore(clone)
    assert patched_modules(clone) == [] and is_optimized(model)


def test_an_attention_backend_chosen_while_optimised_survives_restore(reference):
    model = tiny_model()
    optimize_ltx(model, kernel=reference)
    for attn in (m for m in model.modules() if hasattr(m, "processor")):
        attn.set_attention_backend("_native_math")  # per module (model.set_attention_backend also sets a global)
    restore(model)
    assert {str(p._attention_backend) for p in processors(model)} == {"AttentionBackendName._NATIVE_MATH"}


# --- hooks (offloading), compile ---------------------------------------------------------------------

def test_hooks_before_optimising_are_refused_with_what_to_do(reference):
    model = tiny_model()
    add_probe_hook(model)  # enable_model_cpu_offload() wraps the transformer's forward like this
    with pytest.raises(HooksPresentError, match=r"pipe\.remove_all_hooks\(\), then optimize_ltx\(pipe\), then "
                                                r"pipe\.enable_model_cpu_offload\(\)"):
        optimize_ltx(model, kernel=reference)
    assert not is_optimized(model)


def test_accelerate_model_offload_hook_is_refused_before_and_fine_after(reference):
    accelerate = pytest.importorskip("accelerate")
    model, inputs, expected = stock_and_inputs()
    hook = accelerate.cpu_offload_with_hook(model, execution_device="cpu")[1]  # as enable_model_cpu_offload()
    with pytest.raises(HooksPresentError, match="found offload/cache hooks on LTXVideoTransformer3DModel"):
        optimize_ltx(model, kernel=reference)
    hook.remove()
    optimize_ltx(model, kernel=reference, gelu_epilogue=False)
    accelerate.cpu_offload_with_hook(model, execution_device="cpu")
    assert torch.equal(run(model, inputs), expected)


def test_sequential_offload_added_after_optimising_runs_hooked_modules_through_their_hooks(reference):
    accelerate = pytest.importorskip("accelerate")
    model, inputs, expected = stock_and_inputs()
    recorder = RecordingKernel(reference)
    optimize_ltx(model, kernel=recorder)
    accelerate.cpu_offload(model, execution_device="cpu")  # weights on meta, loaded by each module's hook
    assert torch.equal(run(model, inputs), expected)
    assert recorder.calls["qk_rmsnorm_rope"] == 0 and recorder.calls["linear_gelu"] == 0  # hooked weights
    assert recorder.calls["adaln_rmsnorm"] == N_BLOCKS  # hooked blocks: no chaining, each block still fused


def test_layerwise_casting_added_after_optimising_casts_the_feed_forward_weights(reference):
    stock = tiny_model()
    stock.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    inputs = ltx_inputs(stock, **TINY_VIDEO)
    expected = run(stock, inputs)
    model = tiny_model()
    recorder = RecordingKernel(reference)
    optimize_ltx(model, kernel=recorder)
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    assert torch.equal(run(model, inputs), expected)
    assert recorder.calls["linear_gelu"] == 0 and recorder.calls["gelu_tanh"] == N_BLOCKS


def test_offload_hooks_added_after_optimising_run_the_fused_model_and_guard_restore(reference):
    model, inputs, expected = stock_and_inputs()
    recorder = RecordingKernel(reference)
    optimize_ltx(model, kernel=recorder, gelu_epilogue=False)
    add_probe_hook(model)
    assert torch.equal(run(model, inputs), expected)
    assert recorder.calls["adaln_rmsnorm"] == 1  # still the chained, fused forward
    optimize_ltx(model, gelu_epilogue=False)     # same options: nothing to do, not an error
    with pytest.raises(HooksPresentError, match="restore found the forward or processor of the model replaced"):
        restore(model)
    assert is_optimized(model)
    model._diffusers_hook.remove_hook("probe")
    restore(model)
    assert patched_modules(model) == []


def test_a_compiled_model_is_refused(reference):
    model = tiny_model()
    with pytest.raises(CompiledModelError, match="before torch.compile"):
        optimize_ltx(torch.compile(model), kernel=reference)
    model.compile_repeated_blocks()
    with pytest.raises(CompiledModelError, match="transformer_blocks.0, transformer_blocks.1"):
        optimize_ltx(model, kernel=reference)
    assert patched_modules(model) == []


def test_the_real_ops_compile_into_one_graph_without_breaks(kernel):
    """The fused forwards with the built kernel's ops (fake implementations on
    meta tensors) trace with fullgraph=True, and the graph calls them."""
    model = tiny_model(torch.bfloat16).to("meta")
    inputs = ltx_inputs(model, **TINY_VIDEO, device="meta")
    optimize_ltx(model, kernel=kernel, gelu_epilogue=False)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        out = torch.compile(model, fullgraph=True, backend=backend)(**inputs)[0]
    assert out.shape == (TINY_VIDEO["batch"], 24, TINY_CONFIG["out_channels"])
    assert len(graphs) == 1
    namespace = kernel.ops.__name__.rsplit(".", 1)[-1]  # the build's op namespace
    called = {str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"}
    assert {f"{namespace}.{op}" for op in ("adaln_rmsnorm", "gated_residual", "gated_residual_rmsnorm",
                                           "qk_rmsnorm_rope", "rmsnorm", "gelu_tanh")} <= called


def test_the_whole_model_compiles_without_breaks_under_autograd_with_checkpointing(kernel):
    """Training with the whole model compiled: under grad mode with checkpointing the optimised forward
    hands over to the stock one, and that hand-over traces with fullgraph=True (the stock forward taken
    when optimize ran, not looked up on type(self), which dynamo refuses to call on newer torch)."""
    model = tiny_model(torch.bfloat16).to("meta")
    inputs = ltx_inputs(model, **TINY_VIDEO, device="meta")
    optimize_ltx(model, kernel=kernel, gelu_epilogue=False)
    model.enable_gradient_checkpointing()
    for name, p in model.named_parameters():
        p.requires_grad_("attn1.to_q" in name)
    backend = GraphRecorder()
    out = torch.compile(model, fullgraph=True, backend=backend)(**inputs)[0]
    assert out.requires_grad and len(backend.graphs) == 1


def test_regional_compile_traces_three_block_graphs_whatever_the_depth(reference):
    model, inputs, expected = stock_and_inputs(num_layers=5)
    optimize_ltx(model, kernel=reference, gelu_epilogue=False)
    compiled = []

    def backend(gm, example_inputs):
        compiled.append(gm)
        return gm.forward

    model.compile_repeated_blocks(fullgraph=True, backend=backend)
    assert torch.equal(run(model, inputs), expected)
    assert len(compiled) == 3  # first block (computes its norm1), middle blocks, last block (no next)


def test_regional_compile_takes_the_joined_cross_attention_keys_and_values_without_breaks(reference):
    """With fp8=True each block gets its cross-attention key and value from the model forward's one GEMM:
    the blocks still compile with fullgraph=True, three graphs, and give the eager output."""
    from ltx_kernels_diffusers.models import ltx_video

    model, inputs, _ = stock_and_inputs(num_layers=5)
    ltx_video.apply(ltx_video.check(model, None), reference, ltx_video.Options(fp8=True, gelu_epilogue=False))
    assert hasattr(model, "text_kv_joined")
    eager = run(model, inputs)
    compiled = []

    def backend(gm, example_inputs):
        compiled.append(gm)
        return gm.forward

    model.compile_repeated_blocks(fullgraph=True, backend=backend)
    torch.testing.assert_close(run(model, inputs), eager, rtol=1e-5, atol=1e-5)
    assert len(compiled) == 3


def _linear_with_our_hook():
    from ltx_kernels_diffusers.hooks import install

    layer = torch.nn.Linear(4, 4)
    install(layer, "test.linear", lambda module, x: torch.full_like(x, 7.0))
    return layer


def test_a_fused_block_runs_a_submodule_hooked_only_by_us_without_its_instance_forward():
    """``hooks.call`` skips the module's per-instance hooked ``forward`` (torch 2.11's dynamo
    guards on its identity: a recompile per block) when only our hook wraps it."""
    from ltx_kernels_diffusers.hooks import call

    layer = _linear_with_our_hook()
    layer.forward = lambda x: pytest.fail("the instance forward ran")
    with torch.no_grad():
        assert torch.equal(call(layer, torch.zeros(2, 4)), torch.full((2, 4), 7.0))


def test_a_submodule_with_other_hooks_is_called_through_them():
    from ltx_kernels_diffusers.hooks import call

    layer = _linear_with_our_hook()
    seen = []
    layer.register_forward_pre_hook(lambda module, args: seen.append(module))
    with torch.no_grad():
        assert torch.equal(call(layer, torch.zeros(2, 4)), torch.full((2, 4), 7.0))
    assert seen == [layer]


def test_the_cudnn_backend_runs_through_the_native_one_without_its_layout_copies(monkeypatch):
    """diffusers' cuDNN backend copies q, k and v to [B, H, S, Dh]; the fused processors ask the
    native backend for the same cuDNN kernel instead (and keep the backend under context parallelism)."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    from ltx_kernels_diffusers import attention

    seen = []
    monkeypatch.setattr(attention, "dispatch_attention_fn",
                        lambda *args, backend, parallel_config, **kwargs: seen.append((backend, parallel_config)))
    processor = attention.DispatchedAttention(kernel=None)
    processor._attention_backend = AttentionBackendName._NATIVE_CUDNN
    q = torch.zeros(1, 2, 1, 4)
    processor.attention(q, q, q, None)
    processor.attention(q, q, q, None, parallel_config="cp")
    assert seen == [(AttentionBackendName.NATIVE, None), (AttentionBackendName._NATIVE_CUDNN, "cp")]
