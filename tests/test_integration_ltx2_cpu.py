"""optimize on diffusers' LTX-2 transformer without a GPU, on tiny random configs:
LTX-2.0 and LTX-2.3's options (gated attention, the text query's modulation),
each alone, both RoPE layouts, per-token timesteps, modality isolation and
spatio-temporal guidance (perturbed attention). Dispatch by class, the seams
each fused op replaces, refusals before any change, restore, diffusers hooks,
offloading and torch.compile.

Numerics run the integration against the pure-PyTorch reference of the op API
(tests/integration_support.py, ``head_gate`` included), which rounds as
diffusers' eager code: the optimised model's video and audio outputs must
equal the stock ones bit for bit. What every hook-based model does alike
(unknown model, foreign option, second call, restore, deep copy, hooks before
optimising, compiled model, autograd, regional compile) is in
tests/test_integration_models_cpu.py."""

from __future__ import annotations

import re
import types
from collections import Counter

import pytest
import torch
from torch import nn

pytest.importorskip("diffusers")

from diffusers.models.transformers.transformer_ltx2 import (LTX2AudioVideoAttnProcessor,  # noqa: E402
                                                             LTX2PerturbedAttnProcessor)

from ltx_kernels_diffusers import (FusedLTX2AttnProcessor, FusedLTX2PerturbedAttnProcessor,  # noqa: E402
                                   HooksPresentError, UnsupportedModelError, fp8_linear_names, is_optimized, optimize,
                                   restore)
from ltx_kernels_diffusers.models import ltx2  # noqa: E402

from .hook_support import GraphRecorder, add_hook, changed_modules, first_block_kwargs, processors  # noqa: E402
from .integration_support import (LTX2_3_OPTIONS, TINY_LTX2_CONFIG, TINY_LTX2_VIDEO, RecordingKernel,  # noqa: E402
                                  ReferenceKernel, ltx2_inputs, rel_l2, tiny_ltx2)

N_BLOCKS = TINY_LTX2_CONFIG["num_layers"]
HIDDEN = TINY_LTX2_CONFIG["num_attention_heads"] * TINY_LTX2_CONFIG["attention_head_dim"]
STG = dict(spatio_temporal_guidance_blocks=[1], perturbation_mask=torch.tensor([1.0, 0.0]))
# name -> (config overrides, input overrides)
VARIANTS = {
    "2.0": ({}, {}),
    "2.3 per-token": (LTX2_3_OPTIONS, dict(per_token=True)),
    "2.0 split": (dict(rope_type="split"), {}),
    "2.3 split": ({**LTX2_3_OPTIONS, "rope_type": "split"}, {}),
    "gated video, modulated audio": (dict(gated_attn=True, audio_cross_attn_mod=True), {}),
    "2.3 isolated modalities": (LTX2_3_OPTIONS, dict(isolate_modalities=True)),
    "2.3 stg": ({**LTX2_3_OPTIONS, "perturbed_attn": True}, STG),  # block 1 perturbs sample 1
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.fixture
def reference():
    return ReferenceKernel()


def run(model, inputs):
    """Both outputs: the video's and the audio's."""
    with torch.no_grad():
        return model(**inputs)


def inputs_for(model, **overrides):
    """The tiny inputs with ``overrides`` (a perturbation mask in the model's dtype, as the pipeline's)."""
    build = {k: v for k, v in overrides.items() if k == "per_token"}
    return {**ltx2_inputs(model, **TINY_LTX2_VIDEO, **build),
            **{k: v.to(model.dtype) if isinstance(v, torch.Tensor) else v for k, v in overrides.items()
               if k != "per_token"}}


def stock_and_inputs(variant="2.0", dtype="fp32", **overrides):
    config, inputs = VARIANTS[variant]
    model = tiny_ltx2(DTYPES[dtype], **{**config, **overrides})
    inputs = inputs_for(model, **inputs)
    return model, inputs, run(model, inputs)


def same(got, expected) -> bool:
    return all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


# --- same output -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_optimised_model_equals_stock_bitwise_in_both_streams(reference, variant, dtype):
    model, inputs, expected = stock_and_inputs(variant, dtype)
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    fused = (FusedLTX2PerturbedAttnProcessor if "stg" in variant else FusedLTX2AttnProcessor)
    assert is_optimized(model) and all(type(p) is fused for p in processors(model))
    assert same(run(model, inputs), expected)
    assert recorder.calls["adaln_rmsnorm"] >= 2 * N_BLOCKS  # the fused forwards ran


def test_fast_mode_stays_close_to_stock_and_takes_the_gelu_epilogue(reference):
    model, inputs, expected = stock_and_inputs("2.3 per-token", "bf16")
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder, exact_mode=False)
    got = run(model, inputs)
    assert not same(got, expected) and max(rel_l2(a, b) for a, b in zip(got, expected)) < 2e-2
    assert recorder.calls["linear_gelu"] == 2 * N_BLOCKS and recorder.calls["gelu_tanh"] == 0


# --- which fused ops run ----------------------------------------------------------------------------

# per block, both streams: norm1 + modulation (2) and the second a2v/v2a modulation of each stream (2);
# the residuals of attn1 (+ norm2), attn2 (+ the a2v/v2a norm) and a2v/v2a (+ norm3); the feed-forward residual
PER_BLOCK = dict(adaln_rmsnorm=4, gated_residual_rmsnorm=6, gated_residual=2, gelu_tanh=2)


@pytest.mark.parametrize("variant, fused_qk, rmsnorms, ropes, gates", [
    ("2.0", 2, 8, 4, 0),            # self-attention: qk_rmsnorm_rope; text q/k, a2v/v2a q/k: rmsnorm + RoPE
    ("2.3 per-token", 2, 8, 4, 6),  # and a gate after each of the six attentions
    ("2.0 split", 0, 12, 0, 0),     # split tables: rmsnorm, then the stock rotation
    ("gated video, modulated audio", 2, 8, 4, 3),  # video's attn1, attn2 and a2v are gated
])
def test_each_seam_runs_one_fused_op(reference, variant, fused_qk, rmsnorms, ropes, gates):
    model, inputs, _ = stock_and_inputs(variant)
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    run(model, inputs)
    assert recorder.calls == Counter({name: count * N_BLOCKS for name, count in {  # a missing op counts 0
        **PER_BLOCK, "qk_rmsnorm_rope": fused_qk, "rmsnorm": rmsnorms, "apply_rotary_emb": ropes,
        "head_gate": gates}.items()})


def test_without_cross_modal_attention_each_text_residual_feeds_norm3(reference):
    model, inputs, expected = stock_and_inputs("2.3 isolated modalities")
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    assert same(run(model, inputs), expected)
    # norm1 each; attn1 + norm2, attn2 + norm3 each; no a2v/v2a modulations, attentions or gates
    assert recorder.calls["adaln_rmsnorm"] == 2 * N_BLOCKS
    assert recorder.calls["gated_residual_rmsnorm"] == 4 * N_BLOCKS
    assert recorder.calls["apply_rotary_emb"] == 0 and recorder.calls["head_gate"] == 4 * N_BLOCKS


def test_a_fully_perturbed_block_skips_the_attention_as_stock(reference):
    model, inputs, _ = stock_and_inputs("2.3 stg")
    inputs = {**inputs, "perturbation_mask": None}  # STG blocks without a mask: every sample perturbed
    expected = run(model, inputs)
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    assert same(run(model, inputs), expected)
    # block 1's self-attentions use the values alone: no q/k norm
    assert recorder.calls["qk_rmsnorm_rope"] == 2 * N_BLOCKS - 2


# --- dispatch and refusals ----------------------------------------------------------------------------

def test_every_problem_is_listed_and_nothing_changes(reference):
    class MyProcessor(LTX2AudioVideoAttnProcessor):
        pass

    model = tiny_ltx2()
    model.transformer_blocks[1].norm1 = nn.RMSNorm(HIDDEN)
    model.transformer_blocks[0].norm3 = type(model.transformer_blocks[0].norm3)(HIDDEN, eps=1e-6)
    custom = MyProcessor()
    model.transformer_blocks[0].audio_attn2.set_processor(custom)
    before = processors(model)
    with pytest.raises(UnsupportedModelError) as err:
        optimize(model, kernel=reference)
    message = str(err.value)
    assert "transformer_blocks.1.norm1 is RMSNorm, not diffusers' RMSNorm" in message
    assert ("transformer_blocks.0.norm3 is an RMSNorm with parameters; LTX-2's block norms have none "
            "(norm_elementwise_affine=False)") in message
    assert re.search(r"transformer_blocks\.0\.audio_attn2 uses the attention processor \S*MyProcessor, not "
                     "diffusers' LTX2AudioVideoAttnProcessor or LTX2PerturbedAttnProcessor", message)
    assert changed_modules(model) == [] and all(a is b for a, b in zip(processors(model), before))
    fresh = tiny_ltx2()
    model.transformer_blocks[1].norm1 = fresh.transformer_blocks[1].norm1
    model.transformer_blocks[0].norm3 = fresh.transformer_blocks[0].norm3
    optimize(model, kernel=reference, fuse_attention=False)  # a custom processor is kept, not dropped
    assert model.transformer_blocks[0].audio_attn2.processor is custom
    assert not any(type(p) is FusedLTX2AttnProcessor for p in processors(model))


def test_fp8_lists_what_it_cannot_convert_and_changes_nothing(reference):
    """fp8=True needs CUDA linears and the feed-forward's GELU-tanh (its FP8 GELU is gelu_tanh_fp8);
    the GPU tests (test_integration_fp8_gpu.py) run it."""
    model = tiny_ltx2()
    model.transformer_blocks[1].ff.net[0].approximate = "none"
    names = fp8_linear_names(model)
    assert len(names) == N_BLOCKS * len(ltx2.FP8_LINEARS) and names[0] == "transformer_blocks.0.attn1.to_q"
    assert all(type(model.get_submodule(name)) is nn.Linear for name in names)
    with pytest.raises(UnsupportedModelError) as err:
        optimize(model, kernel=reference, fp8=True)
    message = str(err.value)
    assert "transformer_blocks.1.ff is not diffusers' FeedForward with GELU-tanh" in message
    assert "transformer_blocks.0.attn1.to_q is on cpu; move the model to the GPU first" in message
    assert changed_modules(model) == [] and not is_optimized(model)


# FP8 calls per block by variant. LTX-2.0: the norms write every video input's e4m3 rows, norm1 and
# the v2a keys' norm (adaln_rmsnorm_fp8), and after a residual the text query's, the a2v query's and
# the feed-forward's (gated_residual_rmsnorm_fp8). LTX-2.3: a query side with per-head gates reads its
# bf16 input too, so the self-attention's input is quantised once for q/k/v (quantize_fp8), and only
# the v2a keys' and the feed-forward's norms write rows.
FP8_CALLS = {"2.0": {"quantize_fp8": 0, "adaln_rmsnorm_fp8": 2, "gated_residual_rmsnorm_fp8": 3},
             "2.3 per-token": {"quantize_fp8": 1, "adaln_rmsnorm_fp8": 1, "gated_residual_rmsnorm_fp8": 1},
             "2.3 stg": {"quantize_fp8": 1, "adaln_rmsnorm_fp8": 1, "gated_residual_rmsnorm_fp8": 1}}


@pytest.mark.parametrize("variant", FP8_CALLS)
def test_fp8_quantises_each_video_input_once_and_restore_gives_stock_back(reference, variant):
    """The FP8 wiring on the CPU with the fp8 references (ltx_dev.reference.fp8). check refuses CPU
    linears, so the plan is applied directly, as optimize does once its checks pass."""
    model, inputs, expected = stock_and_inputs(variant, "bf16")
    recorder = RecordingKernel(reference)
    state = ltx2.apply(ltx2.check(model, ltx2.Options()), recorder, ltx2.Options(fp8=True))
    for block in model.transformer_blocks:
        assert all(isinstance(block.get_submodule(path), reference.Fp8Linear) for path in ltx2.FP8_LINEARS)
        assert type(block.audio_ff.net[2]) is nn.Linear and type(block.attn2.to_k) is nn.Linear
    got = run(model, inputs)
    assert all(0 < rel_l2(g, e) < 0.1 for g, e in zip(got, expected, strict=True))  # e4m3's step: 2^-4
    assert {name: recorder.calls[name] / N_BLOCKS for name in FP8_CALLS[variant]} == FP8_CALLS[variant]
    assert recorder.calls["gelu_tanh_fp8"] == N_BLOCKS  # the down-projection's input
    ltx2.restore(model, state)
    assert changed_modules(model) == [] and same(run(model, inputs), expected)


def test_a_kernel_without_the_ops_is_refused_naming_them(reference):
    model = tiny_ltx2()
    incomplete = types.SimpleNamespace(rmsnorm=reference.rmsnorm, gelu_tanh=reference.gelu_tanh)
    with pytest.raises(TypeError, match="lacks adaln_rmsnorm, gated_residual, gated_residual_rmsnorm, "
                                        "linear_gelu, qk_rmsnorm_rope, apply_rotary_emb"):
        optimize(model, kernel=incomplete)
    assert changed_modules(model) == []


def test_head_gate_is_needed_only_by_a_model_with_gated_attention(reference):
    """A kernel built before head_gate still serves LTX-2.0; LTX-2.3 asks for it, changing nothing."""
    without = types.SimpleNamespace(**{name: getattr(reference, name) for name in dir(reference)
                                       if not name.startswith("_") and name != "head_gate"})
    gated = tiny_ltx2(**LTX2_3_OPTIONS)
    with pytest.raises(TypeError, match="lacks head_gate"):
        optimize(gated, kernel=without)
    assert changed_modules(gated) == [] and not is_optimized(gated)
    model, inputs, expected = stock_and_inputs("2.0")
    optimize(model, kernel=without)
    assert is_optimized(model) and same(run(model, inputs), expected)


# --- restore, hooks, offloading ----------------------------------------------------------------------

@pytest.mark.parametrize("variant, stock", [("2.3 per-token", LTX2AudioVideoAttnProcessor),
                                            ("2.3 stg", LTX2PerturbedAttnProcessor)])
def test_restore_gives_back_the_stock_processors_and_output(reference, variant, stock):
    model, inputs, expected = stock_and_inputs(variant, "bf16")
    optimize(model, kernel=reference)
    restore(model)
    assert not is_optimized(model) and changed_modules(model) == []
    assert all(type(p) is stock for p in processors(model))
    assert same(run(model, inputs), expected)


def test_hooks_added_after_wrap_the_fused_forwards_and_stay_after_restore(reference):
    model, inputs, expected = stock_and_inputs("2.3 per-token")
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    block_hook = add_hook(model.transformer_blocks[1])
    assert same(run(model, inputs), expected)
    assert block_hook.calls == 1 and recorder.calls["adaln_rmsnorm"] == 4 * N_BLOCKS  # the hooked block fused
    restore(model)
    assert list(model.transformer_blocks[1]._diffusers_hook.hooks) == ["probe"]
    assert same(run(model, inputs), expected) and block_hook.calls == 2


@pytest.mark.parametrize("level, fused_qk", [("block_level", 2), ("leaf_level", 0)])
def test_group_offloading_composes(reference, level, fused_qk):
    """Leaf-level offloading hooks the q/k norms (they have weights): the stock processor runs, the block's
    norms (no weights) stay fused."""
    stock, _, _ = stock_and_inputs("2.3 per-token")
    model, inputs, _ = stock_and_inputs("2.3 per-token")
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    for m in (stock, model):
        m.enable_group_offload(onload_device=torch.device("cpu"), offload_device=torch.device("cpu"),
                               offload_type=level, **({"num_blocks_per_group": 1} if level == "block_level" else {}))
    assert same(run(model, inputs), run(stock, inputs))
    assert recorder.calls["qk_rmsnorm_rope"] == fused_qk * N_BLOCKS
    assert recorder.calls["gated_residual_rmsnorm"] == 6 * N_BLOCKS


def test_sequential_offload_calls_the_hooked_norms_and_restore_waits_for_its_removal(reference):
    accelerate = pytest.importorskip("accelerate")
    model, inputs, expected = stock_and_inputs("2.3 per-token")
    recorder = RecordingKernel(reference)
    optimize(model, kernel=recorder)
    accelerate.cpu_offload(model, execution_device="cpu")  # weights loaded by each module's hook
    assert same(run(model, inputs), expected)
    assert recorder.calls["qk_rmsnorm_rope"] == recorder.calls["rmsnorm"] == 0  # the q/k norms are hooked
    assert recorder.calls["gated_residual_rmsnorm"] == 6 * N_BLOCKS
    with pytest.raises(HooksPresentError, match="restore found transformer_blocks.0, transformer_blocks.1"):
        restore(model)
    accelerate.hooks.remove_hook_from_module(model, recurse=True)
    restore(model)
    assert not any(hasattr(m, "_diffusers_hook") for m in model.modules())
    assert same(run(model, inputs), expected)


# --- compile ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["2.0", "2.3 per-token", "2.3 split"])
def test_the_optimised_block_traces_as_one_graph(reference, variant):
    model, inputs, _ = stock_and_inputs(variant)
    kwargs = first_block_kwargs(model, inputs)
    optimize(model, kernel=reference)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model.transformer_blocks[0])(**kwargs)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_the_real_ops_compile_into_one_block_graph(kernel):
    """The fused forwards with the built kernel's ops (fake implementations on
    meta tensors) trace with fullgraph=True, and the graph calls every op
    (LTX-2.0: no gated attention, so a kernel without head_gate will do)."""
    model, inputs, _ = stock_and_inputs("2.0", "bf16")
    kwargs = first_block_kwargs(model, inputs)
    kwargs = {k: (v.to("meta") if isinstance(v, torch.Tensor)
                  else tuple(t.to("meta") for t in v) if isinstance(v, tuple) else v) for k, v in kwargs.items()}
    model = model.to("meta")
    optimize(model, kernel=kernel)
    backend = GraphRecorder()
    with torch.no_grad():
        video, audio = torch.compile(model.transformer_blocks[0], fullgraph=True, backend=backend)(**kwargs)
    assert video.shape == kwargs["hidden_states"].shape and audio.shape == kwargs["audio_hidden_states"].shape
    assert len(backend.graphs) == 1
    namespace = kernel.ops.__name__.rsplit(".", 1)[-1]
    called = {str(node.target) for node in backend.graphs[0].graph.nodes if node.op == "call_function"}
    assert {f"{namespace}.{op}" for op in ("adaln_rmsnorm", "gated_residual_rmsnorm", "gated_residual",
                                           "gelu_tanh", "qk_rmsnorm_rope", "rmsnorm", "apply_rotary_emb")} <= called
