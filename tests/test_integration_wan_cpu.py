"""optimize on diffusers' Wan transformer without a GPU, on tiny random configs:
text-to-video (Wan 2.1), image-to-video (added k/v for the image context),
per-token modulation (Wan 2.2 TI2V) and cross_attn_norm=False. Dispatch by
class, the seams each fused op replaces, refusals before any change, restore,
diffusers hooks, offloading, autograd and torch.compile.

Numerics run the integration against the pure-PyTorch reference of the op API
(tests/integration_support.py), which rounds as diffusers' eager code: the
optimised model must equal the stock one bit for bit, attention included (the
fused processor makes the stock attention calls).
What every hook-based model does alike (unknown model, foreign option, second
call, restore, deep copy, hooks before optimising, compiled model, autograd,
regional compile) is
in tests/test_integration_models_cpu.py."""

from __future__ import annotations

import re
import types
from collections import Counter

import pytest
import torch
from torch import nn

pytest.importorskip("diffusers")

from diffusers.models.attention_dispatch import _AttentionBackendRegistry  # noqa: E402
from diffusers.models.transformers.transformer_wan import WanAttnProcessor  # noqa: E402

from ltx_kernels_diffusers import (FusedWanAttnProcessor, HooksPresentError,  # noqa: E402
                                   KernelUnavailableWarning, UnsupportedModelError, fp8_linear_names, is_optimized,
                                   optimize, restore)
from ltx_kernels_diffusers.models import wan  # noqa: E402

from .conftest import A100  # noqa: E402
from .hook_support import (GraphRecorder, add_hook, changed_modules, fp8_wiring_run,  # noqa: E402
                           processors, run)
from .integration_support import (TINY_WAN_CONFIG, TINY_WAN_I2V, TINY_WAN_VIDEO, WAN_TEXT_CONTEXT,  # noqa: E402
                                  RecordingKernel, ReferenceKernel, rel_l2, tiny_wan, wan_inputs)

N_BLOCKS = TINY_WAN_CONFIG["num_layers"]
HEADS, HEAD_DIM = TINY_WAN_CONFIG["num_attention_heads"], TINY_WAN_CONFIG["attention_head_dim"]
HIDDEN = HEADS * HEAD_DIM
VIDEO_TOKENS = TINY_WAN_VIDEO["frames"] * (TINY_WAN_VIDEO["height"] // 2) * (TINY_WAN_VIDEO["width"] // 2)
# name -> (config overrides, input overrides)
VARIANTS = {
    "t2v": ({}, {}),
    "i2v": (TINY_WAN_I2V, dict(text=WAN_TEXT_CONTEXT, image=5)),
    "ti2v per-token": ({}, dict(per_token=True)),
    "no cross_attn_norm": (dict(cross_attn_norm=False), {}),
}
# name -> (dtype, as_loaded)
DTYPES = {"fp32": (torch.float32, True), "bf16 as loaded": (torch.bfloat16, True),
          "bf16 cast whole": (torch.bfloat16, False)}


@pytest.fixture
def reference():
    return ReferenceKernel()


def stock_and_inputs(variant="t2v", dtype="fp32", **overrides):
    config, video = VARIANTS[variant]
    model = tiny_wan(DTYPES[dtype][0], as_loaded=DTYPES[dtype][1], **{**config, **overrides})
    inputs = wan_inputs(model, **{**TINY_WAN_VIDEO, **video})
    return model, inputs, run(model, inputs)


# --- same output -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_optimised_model_equals_stock_bitwise(reference, variant, dtype):
    model, inputs, expected = stock_and_inputs(variant, dtype)
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    assert is_optimized(model) and all(type(p) is FusedWanAttnProcessor for p in processors(model))
    assert torch.equal(run(model, inputs), expected)
    assert recorder.calls["adaln_layernorm"] == N_BLOCKS  # the fused forwards ran


def test_fast_mode_stays_close_to_stock_and_takes_the_gelu_epilogue(reference):
    model, inputs, expected = stock_and_inputs(dtype="bf16 as loaded")
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder, exact_mode=False)
    got = run(model, inputs)
    assert not torch.equal(got, expected) and rel_l2(got, expected) < 2e-2
    assert recorder.calls["linear_gelu"] == N_BLOCKS and recorder.calls["gelu_tanh"] == 0


@pytest.mark.parametrize("exact_mode, gelu_epilogue, op", [(True, True, "linear_gelu"), (False, False, "gelu_tanh")])
def test_gelu_epilogue_overrides_the_modes_choice(reference, exact_mode, gelu_epilogue, op):
    model, inputs, _ = stock_and_inputs()
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder, exact_mode=exact_mode, gelu_epilogue=gelu_epilogue)
    run(model, inputs)
    assert recorder.calls[op] == N_BLOCKS and recorder.calls["linear_gelu" if op == "gelu_tanh" else "gelu_tanh"] == 0


# --- which fused ops run ----------------------------------------------------------------------------

@pytest.mark.parametrize("variant, dtype, fused_qk, rmsnorms, residuals, residual_norms", [
    ("t2v", "bf16 as loaded", 1, 2, 1, 2),           # cross-attention q and k on rmsnorm
    ("i2v", "bf16 as loaded", 1, 3, 1, 2),           # and the image keys (norm_added_k)
    ("no cross_attn_norm", "fp32", 1, 2, 2, 1),      # the attention residual without norm2: gated_residual
    ("t2v", "bf16 cast whole", 0, 2, 1, 2),          # bf16 RoPE tables: the stock self-attention
])
def test_each_seam_runs_one_fused_op(reference, variant, dtype, fused_qk, rmsnorms, residuals, residual_norms):
    model, inputs, _ = stock_and_inputs(variant, dtype)
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    run(model, inputs)
    assert recorder.calls == Counter({  # a Counter: an op with no calls counts as 0
        "adaln_layernorm": N_BLOCKS,                          # norm1 + modulation
        "gated_residual_layernorm": residual_norms * N_BLOCKS,  # attn1 residual + norm2, attn2 residual + norm3
        "gated_residual": residuals * N_BLOCKS,               # the feed-forward residual
        "gelu_tanh": N_BLOCKS,                                # ffn.net[0] after its projection
        "qk_rmsnorm_rope": fused_qk * N_BLOCKS,               # self-attention q/k norm + RoPE
        "rmsnorm": rmsnorms * N_BLOCKS,
    })


def test_the_rope_module_stays_stock_and_its_tables_repeat_along_the_fused_row(reference):
    """The [1, S, 1, Dh] tables go to qk_rmsnorm_rope as one head's columns (no per-head copy)."""
    model = tiny_wan()
    latents = wan_inputs(model, **TINY_WAN_VIDEO)["hidden_states"]
    seen = []
    with torch.no_grad():
        cos, _ = model.rope(latents)
        recorder = RecordingKernel(reference)
        real = recorder.qk_rmsnorm_rope
        recorder.qk_rmsnorm_rope = lambda q, k, qw, kw, c, s, *a, **k_: seen.append(c) or real(q, k, qw, kw, c, s, *a,
                                                                                                **k_)
        optimize(model, kernel=recorder)
        assert "rope" not in changed_modules(model) and torch.equal(model.rope(latents)[0], cos)
        run(model, wan_inputs(model, **TINY_WAN_VIDEO))
    assert len(seen) == N_BLOCKS and all(torch.equal(c, cos.flatten(2)) for c in seen)  # [1, S, Dh]


@pytest.fixture
def attention_calls(monkeypatch):
    """The q, k, v of every F.scaled_dot_product_attention call (diffusers' native backend)."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recorded(query, key, value, *args, **kwargs):
        calls.append((query, key, value, kwargs.get("attn_mask")))
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded)
    return calls


def test_the_fused_processor_makes_the_stock_attention_calls(reference, attention_calls):
    """Image-to-video cross-attention: the image keys and the text keys attended separately, no mask."""
    attn = tiny_wan(torch.bfloat16, **TINY_WAN_I2V).blocks[0].attn2
    hidden = torch.randn(2, VIDEO_TOKENS, HIDDEN).bfloat16()
    context = torch.randn(2, 5 + WAN_TEXT_CONTEXT, HIDDEN).bfloat16()
    with torch.no_grad():
        expected = attn(hidden, context)
        attn.set_processor(FusedWanAttnProcessor(reference))
        got = attn(hidden, context)
    assert torch.equal(got, expected)
    stock, fused = attention_calls[:2], attention_calls[2:]
    assert [call[1].shape[2] for call in fused] == [5, WAN_TEXT_CONTEXT]  # image keys, then text keys
    for a, b in zip(stock, fused):
        assert all(torch.equal(x, y) for x, y in zip(a[:3], b[:3])) and a[3] is None and b[3] is None


# --- dispatch and refusals ----------------------------------------------------------------------------

def test_every_problem_is_listed_and_nothing_changes(reference):
    class MyProcessor(WanAttnProcessor):
        pass

    model = tiny_wan()
    model.blocks[1].norm1 = nn.LayerNorm(HIDDEN, elementwise_affine=False)
    model.blocks[0].norm3 = type(model.blocks[0].norm3)(HIDDEN, elementwise_affine=True)
    custom = MyProcessor()
    model.blocks[0].attn2.set_processor(custom)
    before = processors(model)
    with pytest.raises(UnsupportedModelError) as err:
        optimize(model, kernel=reference)
    message = str(err.value)
    assert "blocks.1.norm1 is LayerNorm, not diffusers' FP32LayerNorm" in message
    assert "blocks.0.norm3 is an FP32LayerNorm with parameters; Wan's has none" in message
    assert re.search(r"blocks\.0\.attn2 uses the attention processor \S*MyProcessor, not diffusers' WanAttnProcessor",
                     message)
    assert "pass fuse_attention=False to keep it" in message
    assert changed_modules(model) == [] and all(a is b for a, b in zip(processors(model), before))
    fresh = tiny_wan()
    model.blocks[1].norm1, model.blocks[0].norm3 = fresh.blocks[1].norm1, fresh.blocks[0].norm3
    optimize(model, kernel=reference, fuse_attention=False)  # a custom processor is kept, not dropped
    assert model.blocks[0].attn2.processor is custom and "rope" not in changed_modules(model)


@pytest.mark.parametrize("variant", VARIANTS)
def test_fp8_feeds_each_fp8_linear_the_e4m3_rows_of_its_producer(reference, variant):
    model, inputs, expected = stock_and_inputs(variant, "bf16 as loaded")
    state, recorder, seen, output = fp8_wiring_run(wan, model, inputs, model.blocks[1], reference)
    assert 0 < rel_l2(output, expected) < 0.1  # e4m3's step: 2^-4
    # norm1, norm2 (or the residual), norm3 and the GELU write e4m3 rows; the attention outputs are bf16
    assert {path: type(x).__name__ for path, x in seen.items()} == {
        path: "Tensor" if path.endswith("to_out.0") else "Fp8Rows" for path in wan.FP8_LINEARS}
    seams = ("gated_residual_layernorm_fp8" if "no cross" not in variant else "gated_residual_fp8",
             "gated_residual_layernorm_fp8")
    assert recorder.calls["adaln_layernorm_fp8"] == recorder.calls["gelu_tanh_fp8"] == N_BLOCKS
    assert sum(recorder.calls[op] for op in set(seams)) == 2 * N_BLOCKS and recorder.calls["quantize_fp8"] == 0
    wan.restore(model, state)
    assert changed_modules(model) == [] and torch.equal(run(model, inputs), expected)


def test_fp8_without_the_bf16_linears_gives_the_same_output_and_restore_refuses(reference):
    model, inputs, _ = stock_and_inputs("t2v", "bf16 as loaded")
    kept = wan.apply(wan.check(model, wan.Options()), reference, wan.Options(fp8=True))
    expected = run(model, inputs)
    wan.restore(model, kept)
    state = wan.apply(wan.check(model, wan.Options()), reference, wan.Options(fp8=True, fp8_keep_bf16=False))
    assert all(original is None for _, _, original, _ in state.linears)  # nothing holds the bf16 weights
    assert torch.equal(run(model, inputs), expected)
    with pytest.raises(RuntimeError, match="freed the bf16 weights of the FP8 linears, so restore cannot give the "
                                           "stock model back; nothing was changed"):
        wan.restore(model, state)
    assert isinstance(model.blocks[0].ffn.net[2], reference.Fp8Linear) and changed_modules(model) != []


def test_fp8_lists_what_it_cannot_convert_and_changes_nothing(reference):
    model = tiny_wan(torch.bfloat16)
    model.blocks[0].attn1.fuse_projections()
    names = fp8_linear_names(model)
    assert len(names) == N_BLOCKS * len(wan.FP8_LINEARS) and names[-1] == f"blocks.{N_BLOCKS - 1}.ffn.net.2"
    with pytest.raises(UnsupportedModelError) as err:
        optimize(model, kernel=reference, fp8=True)
    message = str(err.value)
    assert "blocks.0.attn1 has fused projections (fuse_projections); unfuse them for fp8=True" in message
    assert "blocks.0.attn1.to_q is on cpu; move the model to the GPU first" in message
    assert not is_optimized(model)


def test_a_kernel_without_the_ops_is_refused_naming_them(reference):
    model = tiny_wan()
    incomplete = types.SimpleNamespace(rmsnorm=reference.rmsnorm, gelu_tanh=reference.gelu_tanh)
    with pytest.raises(TypeError, match="lacks adaln_layernorm, gated_residual_layernorm, gated_residual, "
                                        "linear_gelu, qk_rmsnorm_rope"):
        optimize(model, kernel=incomplete)
    assert changed_modules(model) == []


@pytest.mark.parametrize("case", ["no gpu", "a100"])
def test_off_hopper_optimize_steps_aside_leaving_wan_stock(fake_gpu, case):
    fake_gpu(None if case == "no gpu" else A100)
    model, inputs, expected = stock_and_inputs()
    stock_processors = processors(model)
    with pytest.warns(KernelUnavailableWarning):
        assert optimize(model) is model
    assert not is_optimized(model) and changed_modules(model) == []
    assert all(a is b for a, b in zip(processors(model), stock_processors))
    assert torch.equal(run(model, inputs), expected)


# --- idempotence and restore ------------------------------------------------------------------------

@pytest.fixture
def active_attention_backend():
    """model.set_attention_backend also sets diffusers' global backend: put it back."""
    saved = _AttentionBackendRegistry._active_backend
    yield
    _AttentionBackendRegistry.set_active_backend(saved)


def test_set_attention_backend_reaches_the_fused_processors_and_survives_restore(reference, active_attention_backend):
    model, inputs, expected = stock_and_inputs()
    optimize(model, kernel=reference)
    model.set_attention_backend("_native_math")
    assert {str(p._attention_backend) for p in processors(model)} == {"AttentionBackendName._NATIVE_MATH"}
    assert rel_l2(run(model, inputs), expected) < 1e-6
    restore(model)
    assert all(type(p) is WanAttnProcessor for p in processors(model))
    assert {str(p._attention_backend) for p in processors(model)} == {"AttentionBackendName._NATIVE_MATH"}


# --- hooks ------------------------------------------------------------------------------------------

def test_hooks_added_after_wrap_the_fused_forwards_and_stay_after_restore(reference):
    model, inputs, expected = stock_and_inputs()
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    block_hook, rope_hook = add_hook(model.blocks[1]), add_hook(model.rope)
    assert torch.equal(run(model, inputs), expected)
    assert (block_hook.calls, rope_hook.calls) == (1, 1)
    assert recorder.calls["adaln_layernorm"] == N_BLOCKS  # the hooked block still fused
    restore(model)
    assert list(model.blocks[1]._diffusers_hook.hooks) == ["probe"]
    assert list(model.rope._diffusers_hook.hooks) == ["probe"]
    assert torch.equal(run(model, inputs), expected)
    assert block_hook.calls == 2 and recorder.calls["adaln_layernorm"] == N_BLOCKS


@pytest.mark.parametrize("level, fused_qk, residual_norms", [("block_level", 1, 2), ("leaf_level", 0, 1)])
def test_group_offloading_and_first_block_cache_compose(reference, level, fused_qk, residual_norms):
    """Leaf-level offloading hooks the norms with weights (q/k norms, norm2): they are called, not read."""
    from diffusers import FirstBlockCacheConfig

    stock = tiny_wan()
    model = tiny_wan()
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    for m in (stock, model):
        m.enable_group_offload(onload_device=torch.device("cpu"), offload_device=torch.device("cpu"),
                               offload_type=level, **({"num_blocks_per_group": 1} if level == "block_level" else {}))
        m.enable_cache(FirstBlockCacheConfig(threshold=0.2))
    inputs = wan_inputs(model, **TINY_WAN_VIDEO)
    for _ in range(2):  # the second step reuses the cached blocks after the first
        with model.cache_context("cond"), stock.cache_context("cond"):
            assert torch.equal(run(model, inputs), run(stock, inputs))
    runs = N_BLOCKS + 1  # all blocks, then the first one only
    assert recorder.calls["adaln_layernorm"] == runs and recorder.calls["qk_rmsnorm_rope"] == fused_qk * runs
    assert recorder.calls["gated_residual_layernorm"] == residual_norms * runs


def test_sequential_offload_calls_the_hooked_norms_and_restore_waits_for_its_removal(reference):
    accelerate = pytest.importorskip("accelerate")
    model, inputs, expected = stock_and_inputs("i2v")
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    accelerate.cpu_offload(model, execution_device="cpu")  # weights loaded by each module's hook
    assert torch.equal(run(model, inputs), expected)
    # the q/k norms and norm2 have their weights only while they run: the stock processor, norm2 called
    assert recorder.calls["qk_rmsnorm_rope"] == recorder.calls["rmsnorm"] == 0
    assert recorder.calls["gated_residual_layernorm"] == N_BLOCKS and recorder.calls["gated_residual"] == 2 * N_BLOCKS
    # accelerate also wraps the blocks (they hold parameters of their own)
    with pytest.raises(HooksPresentError, match="restore found blocks.0, blocks.1 wrapped by accelerate"):
        restore(model)
    assert is_optimized(model)
    accelerate.hooks.remove_hook_from_module(model, recurse=True)
    restore(model)  # (accelerate leaves each module's forward bound on the instance: only ours are checked)
    assert not any(hasattr(m, "_diffusers_hook") for m in model.modules())
    assert torch.equal(run(model, inputs), expected)


# --- autograd, compile --------------------------------------------------------------------------------

def block_inputs(model, per_token=False):
    """One block's arguments, as the model forward passes them."""
    g = torch.Generator().manual_seed(5)
    lead = (2, VIDEO_TOKENS) if per_token else (2,)
    latents = wan_inputs(model, **TINY_WAN_VIDEO)["hidden_states"]
    return dict(hidden_states=torch.randn(2, VIDEO_TOKENS, HIDDEN, generator=g),
                encoder_hidden_states=torch.randn(2, TINY_WAN_VIDEO["text"], HIDDEN, generator=g),
                temb=torch.randn(*lead, 6, HIDDEN, generator=g), rotary_emb=model.rope(latents))


@pytest.mark.parametrize("per_token", [False, True])
def test_the_optimised_block_traces_as_one_graph(reference, per_token):
    model = tiny_wan()
    optimize(model, kernel=reference)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model.blocks[0])(**block_inputs(model, per_token))
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_the_real_ops_compile_into_one_block_graph(kernel):
    """The fused forwards with the built kernel's ops (fake implementations on
    meta tensors) trace with fullgraph=True, and the graph calls every op."""
    model = tiny_wan(torch.bfloat16)
    inputs = block_inputs(model)
    inputs = {**{k: v.to("meta", torch.bfloat16) for k, v in inputs.items() if k != "rotary_emb"},
              "rotary_emb": tuple(t.to("meta") for t in inputs["rotary_emb"])}  # float32 tables
    model = model.to("meta")
    optimize(model, kernel=kernel)
    backend = GraphRecorder()

    with torch.no_grad():
        out = torch.compile(model.blocks[0], fullgraph=True, backend=backend)(**inputs)
    assert out.shape == (2, VIDEO_TOKENS, HIDDEN) and len(backend.graphs) == 1
    namespace = kernel.ops.__name__.rsplit(".", 1)[-1]
    called = {str(node.target) for node in backend.graphs[0].graph.nodes if node.op == "call_function"}
    assert {f"{namespace}.{op}" for op in ("adaln_layernorm", "gated_residual_layernorm", "gated_residual",
                                           "gelu_tanh", "qk_rmsnorm_rope", "rmsnorm")} <= called


def test_fp8_attention_steps_aside_for_a_set_backend_or_context_parallelism(reference):
    processor = FusedWanAttnProcessor(reference)
    assert not processor.runs_fp8_attention  # off unless optimize(fp8_attention=True) turns it on
    processor.fp8_attention = True
    assert processor.runs_fp8_attention
    processor._attention_backend = "flash"  # as set_attention_backend("flash") sets it
    assert not processor.runs_fp8_attention
    processor._attention_backend, processor._parallel_config = None, object()  # as enable_parallelism does
    assert not processor.runs_fp8_attention
