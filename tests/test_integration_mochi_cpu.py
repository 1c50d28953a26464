"""optimize on diffusers' Mochi transformer without a GPU, on a tiny random
config (3 blocks, the last one context_pre_only): dispatch by class, the seams
each fused op replaces, refusals before any change, restore, diffusers hooks
(ours are ModelHooks; hooks added later wrap them), autograd and torch.compile.
Numerics run the integration against the pure-PyTorch reference of the op API
(tests/integration_support.py), which rounds as diffusers' eager code: with the
stock attention processor the optimised model must equal the stock one bit for
bit; the fused processor's q/k/v must equal the stock ones bit for bit, and
with every text token valid (no mask reaches the attention) so must its output.
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

from diffusers.models.attention_dispatch import _AttentionBackendRegistry  # noqa: E402
from diffusers.models.attention_processor import MochiAttnProcessor2_0  # noqa: E402

from ltx_kernels_diffusers import (FusedMochiAttnProcessor, HooksPresentError,  # noqa: E402
                                   UnsupportedModelError, is_optimized, optimize, optimize_ltx, restore)

from ltx_kernels_diffusers.models import mochi  # noqa: E402

from .hook_support import (GraphRecorder, add_hook, changed_modules, fp8_wiring_run, processors,  # noqa: E402
                           run)
from .integration_support import (TINY_CONFIG, TINY_MOCHI_CONFIG, TINY_MOCHI_VIDEO, TINY_VIDEO,  # noqa: E402
                                  RecordingKernel, ReferenceKernel, TrainingKernel, ltx_inputs, mochi_inputs, rel_l2,
                                  tiny_mochi, tiny_model)

N_BLOCKS = TINY_MOCHI_CONFIG["num_layers"]
VIDEO_TOKENS = TINY_MOCHI_VIDEO["frames"] * (TINY_MOCHI_VIDEO["height"] // 2) * (TINY_MOCHI_VIDEO["width"] // 2)


@pytest.fixture
def reference():
    return ReferenceKernel()


def stock_and_inputs(dtype=torch.float32, full_text=False, **overrides):
    """``full_text``: every text token valid (the mask all ones), as a prompt of
    the full 256 tokens gives; otherwise padded, with a hole in one sample."""
    model = tiny_mochi(dtype, **overrides)
    inputs = mochi_inputs(model, **TINY_MOCHI_VIDEO)
    if full_text:
        inputs["encoder_attention_mask"] = torch.ones_like(inputs["encoder_attention_mask"])
    return model, inputs, run(model, inputs)


# --- same output -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_with_the_stock_attention_the_optimised_model_equals_stock_bitwise(reference, dtype):
    model, inputs, expected = stock_and_inputs(dtype)
    optimize(model, kernel=reference, fuse_attention=False)
    assert is_optimized(model)
    assert torch.equal(run(model, inputs), expected)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_the_fused_attention_matches_stock_up_to_the_attention_rounding(reference, dtype, tolerance):
    model, inputs, expected = stock_and_inputs(dtype)
    optimize(model, kernel=reference)
    assert all(type(p) is FusedMochiAttnProcessor for p in processors(model))
    assert rel_l2(run(model, inputs), expected) < tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_with_every_text_token_valid_the_fused_attention_equals_stock_bitwise(reference, dtype):
    """No mask, so the batched call is each sample's stock call (CPU SDPA computes the samples alike)."""
    model, inputs, expected = stock_and_inputs(dtype, full_text=True)
    optimize(model, kernel=reference)
    assert torch.equal(run(model, inputs), expected)


@pytest.fixture
def attention_masks(monkeypatch):
    """The ``attn_mask`` of every ``dispatch_attention_fn`` call of the fused processors."""
    from ltx_kernels_diffusers import attention

    masks = []
    dispatch = attention.dispatch_attention_fn

    def recorded(*args, attn_mask=None, **kwargs):
        masks.append(attn_mask)
        return dispatch(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(attention, "dispatch_attention_fn", recorded)
    return masks


def test_an_all_valid_text_mask_is_read_once_per_forward_and_dropped(reference, attention_masks):
    model, inputs, _ = stock_and_inputs(full_text=True)
    optimize(model, kernel=reference)
    hook = model.time_embed._diffusers_hook.get_hook("ltx_kernels_diffusers.mochi.text_mask")
    reads, pre_forward = [], hook.fn_ref.pre_forward

    def counted(*args, **kwargs):
        reads.append(1)
        return pre_forward(*args, **kwargs)

    hook.fn_ref.pre_forward = counted
    run(model, inputs)
    assert len(reads) == 1 and attention_masks == [None] * N_BLOCKS
    attention_masks.clear()
    padded = mochi_inputs(model, **TINY_MOCHI_VIDEO)
    run(model, padded)
    assert len(reads) == 2 and len(attention_masks) == N_BLOCKS
    assert all(mask.shape == (2, 1, 1, VIDEO_TOKENS + TINY_MOCHI_VIDEO["text"]) for mask in attention_masks)


def test_a_block_called_with_another_mask_after_an_all_valid_forward_still_masks(reference, attention_masks):
    """The record names the one mask the forward found all valid, not "the last forward's text was full"."""
    model, inputs, _ = stock_and_inputs(full_text=True)
    optimize(model, kernel=reference)
    run(model, inputs)
    block = model.transformer_blocks[0]
    padded = block_inputs(model)
    attention_masks.clear()
    with torch.no_grad():
        block(**padded)
        block(**{**padded, "encoder_attention_mask": inputs["encoder_attention_mask"]})
    assert attention_masks[0] is not None and attention_masks[1] is None


def test_fast_mode_stays_close_to_stock(reference):
    model, inputs, expected = stock_and_inputs(torch.bfloat16)
    optimize(model, kernel=reference, exact_mode=False, fuse_attention=False)
    got = run(model, inputs)
    assert not torch.equal(got, expected) and rel_l2(got, expected) < 2e-2


@pytest.fixture
def sdpa_calls(monkeypatch):
    """The q, k, v of every F.scaled_dot_product_attention call (the stock
    processor's, and diffusers' native backend's)."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recorded(query, key, value, *args, **kwargs):
        calls.append((query, key, value))
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_processor_attends_over_the_stock_q_k_v_bitwise(reference, sdpa_calls, dtype):
    """Video q/k normalised and rotated in one pass, text q/k normalised, the
    valid text tokens first and in order (a hole in the mask included): each
    stock per-sample call's q, k, v is the head of the fused call's sample."""
    model = tiny_mochi(dtype)
    inputs = mochi_inputs(model, **TINY_MOCHI_VIDEO)
    attn = model.transformer_blocks[0].attn1
    rope = model.rope(model.pos_frequencies, TINY_MOCHI_VIDEO["frames"], 2, 3, dtype=torch.float32)
    hidden = torch.randn(2, VIDEO_TOKENS, attn.inner_dim).to(dtype)
    text = torch.randn(2, TINY_MOCHI_VIDEO["text"], 16).to(dtype)
    mask = inputs["encoder_attention_mask"]
    with torch.no_grad():
        expected = attn(hidden, text, mask, image_rotary_emb=rope)
        attn.processor = FusedMochiAttnProcessor(reference)
        got = attn(hidden, text, mask, image_rotary_emb=rope)
    assert len(sdpa_calls) == 3
    stock, fused = sdpa_calls[:2], sdpa_calls[2]
    for sample, call in enumerate(stock):
        kept = call[0].shape[2]
        assert kept == VIDEO_TOKENS + int(mask[sample].sum())
        for stock_t, fused_t in zip(call, fused):
            assert torch.equal(fused_t[sample, :, :kept], stock_t[0])
    for stock_out, fused_out in zip(expected, got):  # video and text outputs, padding rows included
        assert rel_l2(fused_out, stock_out) < (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("grad", [False, True])
def test_eager_inference_writes_the_video_q_k_into_the_joint_ones_the_attention_reads(reference, sdpa_calls,
                                                                                      monkeypatch, grad):
    """No torch.cat of the video q/k (a copy of each per block): the fused pass writes them into the
    [video | text] tensors. A call autograd records joins them with torch.cat (``out`` has no backward)."""
    outs = []
    fused = reference.qk_rmsnorm_rope

    def spy(*args, **kwargs):
        outs.append(kwargs.get("out"))
        return fused(*args, **kwargs)

    monkeypatch.setattr(reference, "qk_rmsnorm_rope", spy)
    model, inputs, expected = stock_and_inputs(full_text=True)
    optimize(model, kernel=TrainingKernel({"qk_rmsnorm_rope"}, reference))  # recorded calls reach it too
    sdpa_calls.clear()
    with torch.set_grad_enabled(grad):
        inputs["hidden_states"].requires_grad_(grad)
        got = model(**inputs)[0]
    joint_calls = [call for call in sdpa_calls if call[0].shape[2] == VIDEO_TOKENS + TINY_MOCHI_VIDEO["text"]]
    assert torch.equal(got, expected) and len(outs) == len(joint_calls) == N_BLOCKS  # (the caption pool's too)
    for out, (query, key, _) in zip(outs, joint_calls):
        if grad:
            assert out is None
            continue
        for written, joint in zip(out, (query, key)):  # SDPA reads [B, H, S + L, Dh]
            assert written.data_ptr() == joint.data_ptr() and written.shape[1] == VIDEO_TOKENS


@pytest.mark.parametrize("grad", [False, True])
def test_the_per_channel_rope_tables_are_made_once_per_forward_and_released_after_the_blocks(
        reference, monkeypatch, grad):
    """Every block's fused q/k pass reads the per-channel tables that the hook on ``rope`` made once
    (not a ``torch.stack`` of each table per block), and ``norm_out`` releases them."""
    stacked, read = [], []
    make, fused = mochi.per_channel_table, reference.qk_rmsnorm_rope
    monkeypatch.setattr(mochi, "per_channel_table", lambda table: stacked.append(table) or make(table))
    monkeypatch.setattr(reference, "qk_rmsnorm_rope", lambda *a, **k: read.append(a[4:6]) or fused(*a, **k))
    model, inputs, expected = stock_and_inputs(full_text=True)
    optimize(model, kernel=TrainingKernel({"qk_rmsnorm_rope"}, reference))
    with torch.set_grad_enabled(grad):
        inputs["hidden_states"].requires_grad_(grad)
        got = model(**inputs)[0]
    assert torch.equal(got, expected) and len(stacked) == 2 and len(read) == N_BLOCKS
    assert all(cos is read[0][0] and sin is read[0][1] for cos, sin in read)
    records = {id(p.tables) for p in processors(model)}
    assert len(records) == 1 and processors(model)[0].tables.per_channel is None
    restore(model)
    assert torch.equal(run(model, inputs), expected) and len(stacked) == 2


# --- which fused ops run ----------------------------------------------------------------------------

def test_each_seam_runs_one_fused_op(reference):
    model, inputs, _ = stock_and_inputs()
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    run(model, inputs)
    full = N_BLOCKS - 1  # blocks with a text stream of their own; the last one is context_pre_only
    assert dict(recorder.calls) == {
        "modulated_rmsnorm": 4 * full + 3,            # norm1, norm1_context, norm3 (+ norm3_context)
        "residual_tanh_gated_rmsnorm": 4 * full + 2,  # the attention and feed-forward residuals of each stream
        "swiglu": 2 * full + 1,                       # ff (+ ff_context)
        "qk_rmsnorm_rope": N_BLOCKS,                  # video q/k
        "rmsnorm": 2 * N_BLOCKS,                      # text q and k
    }


# --- dispatch and refusals ----------------------------------------------------------------------------

def test_every_problem_is_listed_and_nothing_changes(reference):
    class MyProcessor(MochiAttnProcessor2_0):
        pass

    model = tiny_mochi()
    model.transformer_blocks[1].norm2 = nn.LayerNorm(16)
    custom = MyProcessor()
    model.transformer_blocks[0].attn1.processor = custom
    before = processors(model)
    with pytest.raises(UnsupportedModelError) as err:
        optimize(model, kernel=reference)
    message = str(err.value)
    assert "transformer_blocks.1.norm2 is LayerNorm, not diffusers' MochiModulatedRMSNorm" in message
    assert re.search(r"transformer_blocks\.0\.attn1 uses the attention processor \S*MyProcessor, not", message)
    assert "pass fuse_attention=False to keep it" in message
    assert changed_modules(model) == [] and all(a is b for a, b in zip(processors(model), before))
    model.transformer_blocks[1].norm2 = tiny_mochi().transformer_blocks[1].norm2
    optimize(model, kernel=reference, fuse_attention=False)  # a custom processor is kept, not dropped
    assert model.transformer_blocks[0].attn1.processor is custom


def test_a_feed_forward_other_than_swiglu_is_left_as_it_is(reference):
    model, inputs, expected = stock_and_inputs(activation_fn="gelu-approximate")
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder, fuse_attention=False)
    assert torch.equal(run(model, inputs), expected)
    assert recorder.calls["swiglu"] == 0 and recorder.calls["residual_tanh_gated_rmsnorm"] > 0


def test_a_kernel_without_the_ops_is_refused_naming_them(reference):
    model = tiny_mochi()
    incomplete = types.SimpleNamespace(rmsnorm=reference.rmsnorm, swiglu=reference.swiglu)
    with pytest.raises(TypeError, match="lacks modulated_rmsnorm, residual_tanh_gated_rmsnorm, qk_rmsnorm_rope"):
        optimize(model, kernel=incomplete)
    assert changed_modules(model) == []


def test_a_pipeline_is_optimised_through_its_transformer(reference):
    model, inputs, expected = stock_and_inputs()
    pipe = types.SimpleNamespace(transformer=model, vae=None)
    assert optimize(pipe, kernel=reference, fuse_attention=False) is pipe
    assert is_optimized(pipe) and torch.equal(run(model, inputs), expected)
    with pytest.raises(TypeError, match="expected a diffusers pipeline .* or its transformer, got str"):
        optimize("mochi", kernel=reference)


def test_ltx_video_through_optimize_is_optimize_ltx(kernel):
    """The registry hands LTX-Video to the same rewiring (tests/test_integration_cpu.py covers it in depth)."""
    reference = ReferenceKernel(kernel)
    model = tiny_model()
    inputs = ltx_inputs(model, **TINY_VIDEO)
    expected = run(model, inputs)
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder, gelu_epilogue=False)
    assert torch.equal(run(model, inputs), expected)
    assert recorder.calls["gated_residual_rmsnorm"] == 2 * TINY_CONFIG["num_layers"] - 1
    optimize_ltx(model, gelu_epilogue=False)  # the same options: already done
    restore(model)
    assert not is_optimized(model) and [n for n, m in model.named_modules() if "forward" in m.__dict__] == []


# --- idempotence and restore ------------------------------------------------------------------------

def test_optimize_names_the_repeated_blocks_and_restore_takes_them_back(reference):
    model = tiny_mochi()
    optimize(model, kernel=reference)
    assert model._repeated_blocks == ["MochiTransformerBlock"]
    restore(model)
    assert "_repeated_blocks" not in model.__dict__
    with pytest.raises(ValueError, match="_repeated_blocks"):  # the stock class names no repeated blocks
        model.compile_repeated_blocks()


@pytest.fixture
def active_attention_backend():
    """model.set_attention_backend also sets diffusers' global backend: put it back."""
    saved = _AttentionBackendRegistry._active_backend
    yield
    _AttentionBackendRegistry.set_active_backend(saved)


def test_set_attention_backend_reaches_the_fused_processors(reference, active_attention_backend):
    model, inputs, expected = stock_and_inputs()
    optimize(model, kernel=reference)
    model.set_attention_backend("_native_math")  # the stock Mochi processor has no backend to set
    assert {str(p._attention_backend) for p in processors(model)} == {"AttentionBackendName._NATIVE_MATH"}
    assert rel_l2(run(model, inputs), expected) < 1e-6
    restore(model)
    assert all(type(p) is MochiAttnProcessor2_0 for p in processors(model))


# --- hooks ------------------------------------------------------------------------------------------

def test_hooks_added_after_wrap_the_fused_forwards_and_stay_after_restore(reference):
    model, inputs, expected = stock_and_inputs()
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder, fuse_attention=False)
    block_hook, model_hook = add_hook(model.transformer_blocks[1]), add_hook(model)
    assert torch.equal(run(model, inputs), expected)
    assert (block_hook.calls, model_hook.calls) == (1, 1)
    assert recorder.calls["residual_tanh_gated_rmsnorm"] == 4 * (N_BLOCKS - 1) + 2  # the hooked block still fused
    optimize(model, fuse_attention=False)  # the same options: nothing to do, not an error
    restore(model)
    assert list(model.transformer_blocks[1]._diffusers_hook.hooks) == ["probe"]
    assert torch.equal(run(model, inputs), expected)
    assert block_hook.calls == 2 and sum(recorder.calls.values()) == 26  # one optimised forward: 11 + 10 + 5


def test_layerwise_casting_and_first_block_cache_compose(reference):
    from diffusers import FirstBlockCacheConfig

    stock = tiny_mochi()
    stock.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    stock.enable_cache(FirstBlockCacheConfig(threshold=0.2))
    model = tiny_mochi()
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder, fuse_attention=False)
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    model.enable_cache(FirstBlockCacheConfig(threshold=0.2))
    inputs = mochi_inputs(model, **TINY_MOCHI_VIDEO)
    for _ in range(2):  # the second step reuses the cached blocks after the first
        with model.cache_context("cond"), stock.cache_context("cond"):
            assert torch.equal(run(model, inputs), run(stock, inputs))
    assert recorder.calls["modulated_rmsnorm"] == 4 * (N_BLOCKS - 1) + 3 + 4


@pytest.mark.parametrize("level", ["block_level", "leaf_level"])
def test_group_offloading_keeps_the_all_valid_text_unmasked(reference, attention_masks, level):
    """The text-mask hook is on time_embed, inside the offloading hooks that wrap it."""
    model, inputs, expected = stock_and_inputs(full_text=True)
    optimize(model, kernel=reference)
    model.enable_group_offload(onload_device=torch.device("cpu"), offload_device=torch.device("cpu"),
                               offload_type=level, **({"num_blocks_per_group": 1} if level == "block_level" else {}))
    assert torch.equal(run(model, inputs), expected)
    assert attention_masks == [None] * N_BLOCKS


def test_accelerate_offload_hooks_compose_before_optimising_refused_after_fine(reference):
    accelerate = pytest.importorskip("accelerate")
    model, inputs, expected = stock_and_inputs()
    hook = accelerate.cpu_offload_with_hook(model, execution_device="cpu")[1]  # as enable_model_cpu_offload()
    with pytest.raises(HooksPresentError, match="found offload/cache hooks on MochiTransformer3DModel"):
        optimize(model, kernel=reference)
    hook.remove()
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    accelerate.cpu_offload(model, execution_device="cpu")  # sequential: weights loaded by each module's hook
    assert rel_l2(run(model, inputs), expected) < 1e-6
    assert recorder.calls["qk_rmsnorm_rope"] == 0 and recorder.calls["modulated_rmsnorm"] > 0  # hooked q/k norms
    restore(model)  # accelerate hooks the modules with weights directly, none of ours
    assert not any(hasattr(m, "_diffusers_hook") for m in model.modules())
    assert all(hasattr(m, "_hf_hook") for m in model.modules() if "forward" in m.__dict__)
    assert rel_l2(run(model, inputs), expected) < 1e-6


# --- autograd, compile --------------------------------------------------------------------------------

def block_inputs(model):
    """One block's keyword arguments, as the model forward passes them."""
    g = torch.Generator().manual_seed(5)
    return dict(hidden_states=torch.randn(2, VIDEO_TOKENS, 16, generator=g),
                encoder_hidden_states=torch.randn(2, TINY_MOCHI_VIDEO["text"], 16, generator=g),
                temb=torch.randn(2, 16, generator=g),
                encoder_attention_mask=mochi_inputs(model, **TINY_MOCHI_VIDEO)["encoder_attention_mask"],
                image_rotary_emb=model.rope(model.pos_frequencies, 2, 2, 3, dtype=torch.float32))


def test_the_stock_block_breaks_the_graph_and_the_optimised_one_does_not(reference):
    model = tiny_mochi()
    block = model.transformer_blocks[0]
    inputs = block_inputs(model)
    with torch.no_grad():
        assert torch._dynamo.explain(block)(**inputs).graph_break_count > 0  # torch.nonzero per sample
        optimize(model, kernel=reference)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(block)(**inputs)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def sdpa_masks(graph):
    """The ``attn_mask`` of each scaled-dot-product attention in a traced graph (None: no mask)."""
    return [node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
            for node in graph.graph.nodes if node.op == "call_function" and "scaled_dot_product" in str(node.target)]


def test_a_compiled_block_takes_the_all_valid_mask_as_a_guard_not_a_graph_break(reference):
    """fullgraph=True both ways: a graph without a mask for the mask the forward found all valid, one with
    the key mask for a padded one; each equals the eager block bitwise."""
    model, inputs, _ = stock_and_inputs(full_text=True)
    optimize(model, kernel=reference)
    run(model, inputs)  # the forward records the all-valid mask
    block = model.transformer_blocks[0]
    full = {**block_inputs(model), "encoder_attention_mask": inputs["encoder_attention_mask"]}
    padded = block_inputs(model)
    torch._dynamo.reset()
    backend = GraphRecorder()
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    with torch.no_grad():
        for block_args in (full, padded):
            for got, expected in zip(compiled(**block_args), block(**block_args)):
                assert torch.equal(got, expected)
    assert len(backend.graphs) == 2
    assert sdpa_masks(backend.graphs[0]) == [None] and sdpa_masks(backend.graphs[1])[0] is not None


@pytest.mark.parametrize("full_text", [True, False])
def test_regional_compile_with_a_full_or_padded_text_equals_eager(reference, monkeypatch, full_text):
    """The compiled blocks take the recorded mask and per-channel RoPE tables as guarded inputs."""
    model, inputs, _ = stock_and_inputs(full_text=full_text)
    optimize(model, kernel=reference)
    expected = run(model, inputs)
    torch._dynamo.reset()
    backend = GraphRecorder()
    model.compile_repeated_blocks(fullgraph=True, backend=backend)
    stacked = []
    make = mochi.per_channel_table
    monkeypatch.setattr(mochi, "per_channel_table", lambda table: stacked.append(table) or make(table))
    for _ in range(2):  # the second step hits the same graphs: the records alias the new mask and tables
        assert torch.equal(run(model, inputs), expected)
    assert len(backend.graphs) == 2  # blocks with a text stream; the context_pre_only one
    assert len(stacked) == 2 * 2  # cos and sin, once per forward by the hook, none in the traced blocks
    assert all((sdpa_masks(graph) == [None]) == full_text for graph in backend.graphs)


def test_the_real_ops_compile_into_one_block_graph(kernel):
    """The fused forwards with the built kernel's ops (fake implementations on
    meta tensors) trace with fullgraph=True, and the graph calls every op."""
    model = tiny_mochi(torch.bfloat16)
    inputs = block_inputs(model)
    inputs = {**{k: v.to("meta", torch.bfloat16) for k, v in inputs.items() if k != "image_rotary_emb"},
              "image_rotary_emb": tuple(t.to("meta") for t in inputs["image_rotary_emb"])}  # float32 tables
    model = model.to("meta")
    optimize(model, kernel=kernel)
    backend = GraphRecorder()

    with torch.no_grad():
        out, _ = torch.compile(model.transformer_blocks[0], fullgraph=True, backend=backend)(**inputs)
    assert out.shape == (2, VIDEO_TOKENS, 16) and len(backend.graphs) == 1
    namespace = kernel.ops.__name__.rsplit(".", 1)[-1]
    called = {str(node.target) for node in backend.graphs[0].graph.nodes if node.op == "call_function"}
    assert {f"{namespace}.{op}" for op in ("modulated_rmsnorm", "residual_tanh_gated_rmsnorm", "swiglu",
                                           "qk_rmsnorm_rope", "rmsnorm")} <= called


# --- FP8 (optimize(..., fp8=True)) ----------------------------------------------------------------------

def test_fp8_feeds_each_fp8_linear_the_e4m3_rows_of_its_producer(reference):
    model, inputs, expected = stock_and_inputs(torch.bfloat16, full_text=True)
    state, recorder, seen, output = fp8_wiring_run(mochi, model, inputs, model.transformer_blocks[1], reference)
    assert 0 < rel_l2(output, expected) < 0.1  # e4m3's step: 2^-4
    # norm1 and norm3 write e4m3 rows; the attention output and SwiGLU's are bf16
    assert {path: type(x).__name__ for path, x in seen.items()} == {
        path: "Tensor" if path in ("attn1.to_out.0", "ff.net.2") else "Fp8Rows" for path in mochi.FP8_LINEARS}
    assert seen["attn1.to_q"] is seen["attn1.to_k"] is seen["attn1.to_v"]  # norm1 quantised once for all three
    assert recorder.calls["adaln_rmsnorm_fp8"] == 2 * N_BLOCKS  # not the text stream's norms: they stay bf16
    block = model.transformer_blocks[0]
    assert type(block.attn1.add_q_proj) is nn.Linear and type(block.ff_context.net[2]) is nn.Linear
    mochi.restore(model, state)
    assert changed_modules(model) == [] and torch.equal(run(model, inputs), expected)


def test_fp8_lists_what_it_cannot_convert_and_changes_nothing(reference):
    model = tiny_mochi(torch.bfloat16)
    with pytest.raises(UnsupportedModelError) as err:
        optimize(model, kernel=reference, fp8=True, fuse_attention=False)
    message = str(err.value)
    assert "fp8=True needs fuse_attention=True" in message
    assert "transformer_blocks.0.attn1.to_q is on cpu; move the model to the GPU first" in message
    assert not is_optimized(model) and changed_modules(model) == []
