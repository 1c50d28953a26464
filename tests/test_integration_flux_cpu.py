"""optimize on diffusers' Flux transformer without a GPU, on a tiny random config
(2 double-stream and 3 single-stream blocks): dispatch by class, the seams each
fused op replaces, refusals before any change, restore, diffusers hooks (ours
are ModelHooks; hooks added later wrap them), autograd and torch.compile.
Numerics run the integration against the pure-PyTorch reference of the op API
(tests/integration_support.py), which rounds as diffusers' eager code: with the
projection and its GELU apart (``gelu_epilogue=False``) the optimised model,
fused attention processor included, must equal the stock one bit for bit.
What every hook-based model does alike (unknown model, foreign option, second
call, restore, deep copy, hooks before optimising, compiled model, autograd,
regional compile) is
in tests/test_integration_models_cpu.py."""

from __future__ import annotations

import re
import types

import pytest
import torch
from torch import nn

pytest.importorskip("diffusers")

from diffusers.models.attention import FeedForward  # noqa: E402
from diffusers.models.attention_dispatch import _AttentionBackendRegistry  # noqa: E402
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor  # noqa: E402

from ltx_kernels_diffusers import (FusedFluxAttnProcessor, HooksPresentError,  # noqa: E402
                                   UnsupportedModelError, is_optimized, optimize, restore)
from ltx_kernels_diffusers.models import flux  # noqa: E402
from ltx_kernels_diffusers.models.flux import joint_qk  # noqa: E402

from .hook_support import GraphRecorder, add_hook, changed_modules, first_arguments, processors, run  # noqa: E402
from .integration_support import (TINY_FLUX_CONFIG, TINY_FLUX_IMAGE, RecordingKernel, ReferenceKernel,  # noqa: E402
                                  flux_inputs, rel_l2, tiny_flux)

N_DOUBLE, N_SINGLE = TINY_FLUX_CONFIG["num_layers"], TINY_FLUX_CONFIG["num_single_layers"]
IMAGE_TOKENS = TINY_FLUX_IMAGE["height"] * TINY_FLUX_IMAGE["width"]
HIDDEN = TINY_FLUX_CONFIG["num_attention_heads"] * TINY_FLUX_CONFIG["attention_head_dim"]


@pytest.fixture
def reference():
    return ReferenceKernel()


def stock_and_inputs(dtype=torch.float32, **overrides):
    model = tiny_flux(dtype, **overrides)
    inputs = flux_inputs(model, **TINY_FLUX_IMAGE)
    return model, inputs, run(model, inputs)


# --- same output -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_optimised_model_with_the_fused_processor_equals_stock_bitwise(reference, dtype):
    model, inputs, expected = stock_and_inputs(dtype)
    optimize(model, kernel=reference, gelu_epilogue=False)
    assert is_optimized(model) and all(type(p) is FusedFluxAttnProcessor for p in processors(model))
    assert torch.equal(run(model, inputs), expected)


def test_the_gelu_epilogue_rounds_once_and_stays_close(reference):
    model, inputs, expected = stock_and_inputs(torch.bfloat16)
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)  # gelu_epilogue=True by default
    got = run(model, inputs)
    assert not torch.equal(got, expected) and rel_l2(got, expected) < 2e-2
    assert recorder.calls["linear_gelu"] == 2 * N_DOUBLE + N_SINGLE and recorder.calls["gelu_tanh"] == 0


def test_fast_mode_stays_close_to_stock(reference):
    model, inputs, expected = stock_and_inputs(torch.bfloat16)
    optimize(model, kernel=reference, exact_mode=False, gelu_epilogue=False)
    got = run(model, inputs)
    assert not torch.equal(got, expected) and rel_l2(got, expected) < 2e-2


def test_each_stream_is_rotated_with_its_own_rows_of_the_table(reference):
    """The double blocks' [text | image] q/k: normalised per stream and rotated
    per stream equals the stock order (norms, concatenation, one rotation),
    and the text rows do turn the text (ids not zero, as in flux_inputs)."""
    model = tiny_flux()
    attn = model.transformer_blocks[0].attn
    inputs = flux_inputs(model, **TINY_FLUX_IMAGE)
    tables = model.pos_embed(torch.cat([inputs["txt_ids"], inputs["img_ids"]]))
    g = torch.Generator().manual_seed(3)
    text, image = TINY_FLUX_IMAGE["text"], IMAGE_TOKENS
    q, k = (torch.randn(2, image, 2, 8, generator=g) for _ in range(2))
    eq, ek = (torch.randn(2, text, 2, 8, generator=g) for _ in range(2))
    from diffusers.models.embeddings import apply_rotary_emb

    with torch.no_grad():
        got = joint_qk(reference, attn, q, k, eq, ek, tables, exact_mode=True)
        stock_q = apply_rotary_emb(torch.cat([attn.norm_added_q(eq), attn.norm_q(q)], 1), tables, sequence_dim=1)
        unrotated_text = attn.norm_added_q(eq)
    assert torch.equal(got[0], stock_q)
    assert not torch.equal(got[0][:, :text], unrotated_text)


# --- which fused ops run ----------------------------------------------------------------------------

def test_each_seam_runs_one_fused_op(reference):
    model, inputs, _ = stock_and_inputs()
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder, gelu_epilogue=False)
    run(model, inputs)
    assert dict(recorder.calls) == {
        "adaln_layernorm": 2 * N_DOUBLE + N_SINGLE + 1,  # norm1, norm1_context; the single blocks' norm; norm_out
        "gated_residual_layernorm": 2 * N_DOUBLE,         # attention residual + norm2 (+ context)
        "gated_residual": 2 * N_DOUBLE + N_SINGLE,        # feed-forward residuals; the single blocks' residual
        "gelu_tanh": 2 * N_DOUBLE + N_SINGLE,             # ff, ff_context; act_mlp
        "qk_rmsnorm_rope": 2 * N_DOUBLE + N_SINGLE,       # text and image q/k; the single blocks' joint q/k
    }


# --- dispatch and refusals ----------------------------------------------------------------------------

def test_every_problem_is_listed_and_nothing_changes(reference):
    class MyProcessor(FluxAttnProcessor):
        pass

    model = tiny_flux()
    model.transformer_blocks[1].norm2 = nn.RMSNorm(HIDDEN)
    model.single_transformer_blocks[2].norm.norm = nn.GroupNorm(1, HIDDEN)
    custom = MyProcessor()
    model.single_transformer_blocks[0].attn.set_processor(custom)
    before = processors(model)
    with pytest.raises(UnsupportedModelError) as err:
        optimize(model, kernel=reference)
    message = str(err.value)
    assert "transformer_blocks.1.norm2 is RMSNorm, not torch.nn.LayerNorm over the last dim" in message
    assert "single_transformer_blocks.2.norm.norm is GroupNorm, not torch.nn.LayerNorm" in message
    assert re.search(r"single_transformer_blocks\.0\.attn uses the attention processor \S*MyProcessor, not "
                     r"diffusers' FluxAttnProcessor", message)
    assert "pass fuse_attention=False to keep it" in message
    assert changed_modules(model) == [] and all(a is b for a, b in zip(processors(model), before))
    fresh = tiny_flux()
    model.transformer_blocks[1].norm2 = fresh.transformer_blocks[1].norm2
    model.single_transformer_blocks[2].norm.norm = fresh.single_transformer_blocks[2].norm.norm
    optimize(model, kernel=reference, fuse_attention=False)  # a custom processor is kept, not dropped
    assert model.single_transformer_blocks[0].attn.processor is custom


def test_a_feed_forward_other_than_gelu_tanh_is_left_as_it_is(reference):
    model, inputs, _ = stock_and_inputs()
    model.transformer_blocks[0].ff = FeedForward(HIDDEN, dim_out=HIDDEN, activation_fn="gelu")  # erf GELU
    expected = run(model, inputs)
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder, gelu_epilogue=False)
    assert torch.equal(run(model, inputs), expected)
    assert recorder.calls["gelu_tanh"] == 2 * N_DOUBLE + N_SINGLE - 1


def test_modulation_of_another_dtype_runs_the_stock_lines(reference):
    """Operands Flux does not pass (a float32 temb with bf16 activations, which
    the stock code promotes): the stock lines run, not an op rounding otherwise."""
    model = tiny_flux(torch.bfloat16)
    block = model.transformer_blocks[0]
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, IMAGE_TOKENS, HIDDEN, generator=g).bfloat16()
    emb = torch.randn(2, HIDDEN, generator=g)
    block.norm1.float()
    with torch.no_grad():
        expected = block.norm1(x, emb=emb)
        recorder = RecordingKernel(reference)
        optimize(model, kernel=recorder)
        got = block.norm1(x, emb=emb)
    assert got[0].dtype == torch.float32 and all(torch.equal(a, b) for a, b in zip(got, expected))
    assert recorder.calls["adaln_layernorm"] == 0


def test_fused_qkv_projections_take_the_fused_processor_too(reference):
    model, inputs, _ = stock_and_inputs(torch.bfloat16)
    model.fuse_qkv_projections()  # to_qkv: q, k, v are strided chunks of one projection
    expected = run(model, inputs)
    optimised = tiny_flux(torch.bfloat16)
    recorder = RecordingKernel(reference)
    optimize(optimised, kernel=recorder, gelu_epilogue=False)
    optimised.fuse_qkv_projections()
    assert torch.equal(run(optimised, inputs), expected)
    assert recorder.calls["qk_rmsnorm_rope"] == 2 * N_DOUBLE + N_SINGLE


def test_a_kernel_without_the_ops_is_refused_naming_them(reference):
    model = tiny_flux()
    incomplete = types.SimpleNamespace(gelu_tanh=reference.gelu_tanh, gated_residual=reference.gated_residual)
    with pytest.raises(TypeError, match="lacks adaln_layernorm, gated_residual_layernorm, linear_gelu, "
                                        "qk_rmsnorm_rope"):
        optimize(model, kernel=incomplete)
    assert changed_modules(model) == []


# --- idempotence and restore ------------------------------------------------------------------------

# --- FP8 (optimize(..., fp8=True)) ----------------------------------------------------------------------

def test_fp8_feeds_each_fp8_linear_the_e4m3_rows_of_its_producer(reference):
    """The FP8 wiring on the CPU with the fp8 references (ltx_dev.reference.fp8). check refuses CPU
    linears, so the plan is applied directly, as optimize does once its checks pass."""
    model, inputs, expected = stock_and_inputs(torch.bfloat16)
    recorder = RecordingKernel(reference)
    state = flux.apply(flux.check(model, flux.Options()), recorder, flux.Options(fp8=True))
    outputs, seen = [], {}
    double = first_arguments(model.transformer_blocks[1], flux.FP8_LINEARS,
                             lambda: seen.update(first_arguments(model.single_transformer_blocks[1],
                                                                 flux.FP8_SINGLE_LINEARS,
                                                                 lambda: outputs.append(run(model, inputs)))))
    assert 0 < rel_l2(outputs[0], expected) < 0.1  # e4m3's step: 2^-4
    # norm1, the norm2 seam and the GELU write e4m3 rows; the attention output and [attention | GELU] are bf16
    assert {path: type(x).__name__ for path, x in double.items()} == {
        path: "Tensor" if path.endswith("to_out.0") else "Fp8Rows" for path in flux.FP8_LINEARS}
    assert {path: type(x).__name__ for path, x in seen.items()} == {
        path: "Tensor" if path == "proj_out" else "Fp8Rows" for path in flux.FP8_SINGLE_LINEARS}
    assert seen["attn.to_q"] is seen["proj_mlp"]  # the single block's norm quantised once for all four
    assert recorder.calls["adaln_layernorm_fp8"] == N_DOUBLE + N_SINGLE  # not norm1_context: text stays bf16
    assert recorder.calls["gated_residual_layernorm_fp8"] == recorder.calls["gelu_tanh_fp8"] == N_DOUBLE
    assert type(model.transformer_blocks[0].attn.add_q_proj) is nn.Linear
    flux.restore(model, state)
    assert changed_modules(model) == [] and torch.equal(run(model, inputs), expected)


def test_fp8_lists_what_it_cannot_convert_and_changes_nothing(reference):
    model = tiny_flux(torch.bfloat16)
    model.single_transformer_blocks[0].attn.fuse_projections()
    with pytest.raises(UnsupportedModelError) as err:
        optimize(model, kernel=reference, fp8=True, fuse_attention=False)
    message = str(err.value)
    assert "fp8=True needs fuse_attention=True" in message
    assert "single_transformer_blocks.0.attn has fused projections (fuse_projections)" in message
    assert "transformer_blocks.0.attn.to_q is on cpu; move the model to the GPU first" in message
    assert not is_optimized(model) and changed_modules(model) == []


@pytest.fixture
def active_attention_backend():
    """model.set_attention_backend also sets diffusers' global backend: put it back."""
    saved = _AttentionBackendRegistry._active_backend
    yield
    _AttentionBackendRegistry.set_active_backend(saved)


def test_an_attention_backend_reaches_the_fused_processors_and_outlives_restore(reference, active_attention_backend):
    model, inputs, expected = stock_and_inputs()
    model.set_attention_backend("_native_math")
    optimize(model, kernel=reference, gelu_epilogue=False)
    names = lambda: {str(p._attention_backend) for p in processors(model)}  # noqa: E731
    assert names() == {"AttentionBackendName._NATIVE_MATH"}  # carried over from the stock processors
    model.set_attention_backend("native")
    assert names() == {"AttentionBackendName.NATIVE"}
    assert rel_l2(run(model, inputs), expected) < 1e-6
    restore(model)
    assert all(type(p) is FluxAttnProcessor for p in processors(model))
    assert names() == {"AttentionBackendName.NATIVE"}  # chosen while optimised: kept


# --- hooks ------------------------------------------------------------------------------------------

def test_hooks_added_after_wrap_the_fused_forwards_and_stay_after_restore(reference):
    model, inputs, expected = stock_and_inputs()
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder, gelu_epilogue=False)
    double_hook, single_hook = add_hook(model.transformer_blocks[1]), add_hook(model.single_transformer_blocks[0])
    assert torch.equal(run(model, inputs), expected)
    assert (double_hook.calls, single_hook.calls) == (1, 1)
    assert recorder.calls["gated_residual_layernorm"] == 2 * N_DOUBLE  # the hooked blocks still fused
    restore(model)
    assert list(model.transformer_blocks[1]._diffusers_hook.hooks) == ["probe"]
    assert torch.equal(run(model, inputs), expected)
    # one optimised forward: adaln, gated_residual_layernorm, gated_residual, gelu_tanh, qk_rmsnorm_rope
    per_forward = (2 * N_DOUBLE + N_SINGLE + 1) + 2 * N_DOUBLE + 3 * (2 * N_DOUBLE + N_SINGLE)
    assert double_hook.calls == 2 and sum(recorder.calls.values()) == per_forward


def test_layerwise_casting_and_first_block_cache_compose(reference):
    from diffusers import FirstBlockCacheConfig

    stock = tiny_flux()
    model = tiny_flux()
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder, gelu_epilogue=False)
    for m in (stock, model):
        m.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
        m.enable_cache(FirstBlockCacheConfig(threshold=0.2))
    inputs = flux_inputs(model, **TINY_FLUX_IMAGE)
    for _ in range(2):  # the second step reuses the cached blocks after the first
        with model.cache_context("cond"), stock.cache_context("cond"):
            assert torch.equal(run(model, inputs), run(stock, inputs))
    # the first step runs every block, the second only the first one (the cache hit), and norm_out both times
    assert recorder.calls["adaln_layernorm"] == (2 * N_DOUBLE + N_SINGLE + 1) + 2 + 1


def test_accelerate_offload_hooks_compose_before_optimising_refused_after_fine(reference):
    accelerate = pytest.importorskip("accelerate")
    model, inputs, expected = stock_and_inputs()
    hook = accelerate.cpu_offload_with_hook(model, execution_device="cpu")[1]  # as enable_model_cpu_offload()
    with pytest.raises(HooksPresentError, match="found offload/cache hooks on FluxTransformer2DModel"):
        optimize(model, kernel=reference)
    hook.remove()
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    accelerate.cpu_offload(model, execution_device="cpu")  # sequential: weights loaded by each module's hook
    assert torch.equal(run(model, inputs), expected)
    # hooked q/k norms and projections are called as modules; the weightless LayerNorms still fuse
    assert recorder.calls["qk_rmsnorm_rope"] == recorder.calls["linear_gelu"] == 0
    assert recorder.calls["gelu_tanh"] == 2 * N_DOUBLE + N_SINGLE and recorder.calls["adaln_layernorm"] > 0
    restore(model)  # accelerate hooks the modules with weights directly, none of ours
    assert not any(hasattr(m, "_diffusers_hook") for m in model.modules())
    assert torch.equal(run(model, inputs), expected)


# --- autograd, compile --------------------------------------------------------------------------------

def block_inputs(model):
    """One block's keyword arguments, as the model forward passes them."""
    g = torch.Generator().manual_seed(5)
    inputs = flux_inputs(model, **TINY_FLUX_IMAGE)
    return dict(hidden_states=torch.randn(2, IMAGE_TOKENS, HIDDEN, generator=g),
                encoder_hidden_states=torch.randn(2, TINY_FLUX_IMAGE["text"], HIDDEN, generator=g),
                temb=torch.randn(2, HIDDEN, generator=g),
                image_rotary_emb=model.pos_embed(torch.cat([inputs["txt_ids"], inputs["img_ids"]])))


@pytest.mark.parametrize("blocks", ["transformer_blocks", "single_transformer_blocks"])
def test_an_optimised_block_traces_as_one_graph(reference, blocks):
    model = tiny_flux()
    optimize(model, kernel=reference)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(getattr(model, blocks)[0])(**block_inputs(model))
    assert explained.graph_break_count == 0 and explained.graph_count == 1


@pytest.mark.parametrize("blocks, ops", [
    ("transformer_blocks", ("adaln_layernorm", "gated_residual_layernorm", "gated_residual", "qk_rmsnorm_rope")),
    ("single_transformer_blocks", ("adaln_layernorm", "gated_residual", "qk_rmsnorm_rope")),
])
def test_the_real_ops_compile_into_one_block_graph(kernel, blocks, ops):
    """The fused forwards with the built kernel's ops (fake implementations on
    meta tensors) trace with fullgraph=True, and the graph calls every op."""
    model = tiny_flux(torch.bfloat16)
    inputs = block_inputs(model)
    inputs = {**{k: v.to("meta", torch.bfloat16) for k, v in inputs.items() if k != "image_rotary_emb"},
              "image_rotary_emb": tuple(t.to("meta") for t in inputs["image_rotary_emb"])}  # float32 tables
    model = model.to("meta")
    optimize(model, kernel=kernel, gelu_epilogue=False)
    backend = GraphRecorder()

    torch._dynamo.reset()
    with torch.no_grad():
        encoder_out, out = torch.compile(getattr(model, blocks)[0], fullgraph=True, backend=backend)(**inputs)
    assert out.shape == (2, IMAGE_TOKENS, HIDDEN) and len(backend.graphs) == 1
    namespace = kernel.ops.__name__.rsplit(".", 1)[-1]
    called = {str(node.target) for node in backend.graphs[0].graph.nodes if node.op == "call_function"}
    assert {f"{namespace}.{op}" for op in ops + ("gelu_tanh",)} <= called
