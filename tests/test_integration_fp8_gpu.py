"""optimize(..., fp8=True) on LTX-Video 0.9, LTX-2 and Wan (issue 37), on the GPU (skipped without
CUDA): LTX-Video's 2B config at a reduced depth, inputs of 49 frames at 512x768; LTX-2.3's dims and
Wan 2.1 1.3B and 14B image-to-video at 2-3 blocks (the shapes of test_integration_ltx2_gpu.py and
test_integration_wan_gpu.py). Random weights.

The block linears become Fp8Linear, fed e4m3 rows by the norms, GELU and (LTX-2) one quantisation
shared by the projections of one input; the output's relative L2 to an fp32 run is within 3x stock
bf16's; restore gives the stock model back bit for bit; torch.compile (fullgraph) gives the eager
FP8 output with no graph break."""

from __future__ import annotations

import copy

import pytest
import torch

from .conftest import cuda

pytestmark = cuda
pytest.importorskip("diffusers")

from ltx_kernels_diffusers import UnsupportedModelError, optimize, restore  # noqa: E402
from ltx_kernels_diffusers.models import flux, ltx2, mochi, wan  # noqa: E402
from ltx_kernels_diffusers.models.ltx_video import FP8_LINEARS  # noqa: E402

from .hook_support import (assert_compiles_like_eager, check_quality_target, first_arguments,  # noqa: E402
                           first_block_kwargs, run)
from .integration_support import LTX_2B_VIDEO, ltx_inputs, rel_l2  # noqa: E402
from .test_integration_flux_gpu import IMAGE as FLUX_IMAGE, bf16_model as flux_bf16  # noqa: E402
from .test_integration_gpu import ltx_model  # noqa: E402
from .test_integration_ltx2_gpu import CONFIGS as LTX2_CONFIGS, bf16_model as ltx2_bf16  # noqa: E402
from .test_integration_ltx2_gpu import forward as ltx2_forward, inputs_for as ltx2_inputs_for  # noqa: E402
from .test_integration_wan_gpu import CONFIGS as WAN_CONFIGS, bf16_model as wan_bf16  # noqa: E402
from .test_integration_wan_gpu import inputs_for as wan_inputs_for  # noqa: E402

LAYERS = 4


@pytest.mark.parametrize("fast_accum", [False, True])
def test_fp8_is_within_3x_stock_bf16_error_of_fp32(kernel, fast_accum):
    fp32 = ltx_model(torch.float32, num_layers=LAYERS)
    model = copy.deepcopy(fp32).to(torch.bfloat16)
    inputs = ltx_inputs(model, **LTX_2B_VIDEO)
    ours, stock = check_quality_target(kernel, fp32, model, inputs, True, bar=3.0, fp8=True,
                                       fp8_fast_accum=fast_accum)
    print(f"relative L2 to fp32: fp8 {ours:.4g}, stock bf16 {stock:.4g} ({ours / stock:.2f}x)")


def test_fp8_converts_the_block_linears_and_feeds_them_e4m3_rows(kernel):
    model = ltx_model(torch.bfloat16, num_layers=2)
    inputs = ltx_inputs(model, **LTX_2B_VIDEO)
    optimize(model, kernel=kernel, fp8=True)
    for block in model.transformer_blocks:
        for path in FP8_LINEARS:
            assert isinstance(block.get_submodule(path), kernel.Fp8Linear), path
        assert type(block.attn2.to_k) is torch.nn.Linear  # the text side stays bf16
    seen = []
    block = model.transformer_blocks[1]
    handles = [linear.register_forward_pre_hook(lambda module, args: seen.append(type(args[0]).__name__))
               for linear in (block.attn1.to_q, block.attn2.to_q, block.ff.net[2])]
    run(model, inputs)
    for handle in handles:
        handle.remove()
    # chained: block 0's seam wrote block 1's norm1 output in e4m3; the residual after self-attention and
    # the GELU wrote theirs
    assert seen == ["Fp8Rows"] * 3


def test_fp8_joined_qkv_gemm_gives_the_three_gemms_output(kernel):
    model = ltx_model(torch.bfloat16, num_layers=2)
    inputs = ltx_inputs(model, **LTX_2B_VIDEO)
    three = copy.deepcopy(model)
    optimize(model, kernel=kernel, fp8=True)
    optimize(three, kernel=kernel, fp8=True, fp8_fuse_qkv=False)
    assert not hasattr(three.transformer_blocks[0].attn1, "to_qkv_fp8")
    outputs = []
    seen = first_arguments(model.transformer_blocks[1].attn1, ["to_qkv_fp8"],
                           lambda: outputs.append(run(model, inputs)))
    assert isinstance(seen["to_qkv_fp8"], kernel.Fp8Rows)  # block 0's seam wrote block 1's rows
    assert rel_l2(outputs[0], run(three, inputs)) < 1e-2  # the GEMMs accumulate in another order


def test_restore_after_fp8_gives_the_stock_model_back(kernel):
    model = ltx_model(torch.bfloat16, num_layers=2)
    inputs = ltx_inputs(model, **LTX_2B_VIDEO)
    expected = run(model, inputs)
    optimize(model, kernel=kernel, fp8=True)
    fp8 = run(model, inputs)
    assert 0 < rel_l2(fp8, expected) < 0.1
    restore(model)
    assert type(model.transformer_blocks[0].ff.net[2]) is torch.nn.Linear
    assert torch.equal(run(model, inputs), expected)


def test_fp8_under_regional_compile_gives_the_eager_output(kernel):
    model = ltx_model(torch.bfloat16, num_layers=3)
    inputs = ltx_inputs(model, **LTX_2B_VIDEO)
    optimize(model, kernel=kernel, fp8=True)
    eager = run(model, inputs)
    torch._dynamo.reset()
    model.compile_repeated_blocks(fullgraph=True)
    compiled = run(model, inputs)
    assert rel_l2(compiled, eager) < 2e-2


def test_fp8_refuses_a_lora_wrapped_linear_before_changing_anything(kernel):
    model = ltx_model(torch.bfloat16, num_layers=2)
    block = model.transformer_blocks[0]
    original = block.attn1.to_q

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    block.attn1.to_q = Wrapped(original)
    with pytest.raises(UnsupportedModelError, match="attn1.to_q is a Wrapped"):
        optimize(model, kernel=kernel, fp8=True)
    assert type(block.attn1.to_k) is torch.nn.Linear and "forward" not in block.__dict__


# --- LTX-2 ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fp8_attention", [False, True], ids=["bf16 attention", "fp8 attention"])
@pytest.mark.parametrize("config", ["2.0", "2.3"])
def test_ltx2_fp8_is_within_3x_stock_bf16_error_of_fp32(kernel, config, fp8_attention):
    from .integration_support import ltx2_model

    if fp8_attention:
        needs_cudnn_fp8_attention()
    fp32 = ltx2_model(torch.float32, device="cuda", num_layers=2, **LTX2_CONFIGS[config])
    model = copy.deepcopy(fp32).to(torch.bfloat16)
    ours, stock = check_quality_target(kernel, fp32, model, ltx2_inputs_for(model, per_token=True), True, bar=3.0,
                                       fp8=True, fp8_attention=fp8_attention)
    print(f"LTX-2 {config} relative L2 to fp32: fp8 {ours:.4g} (fp8 attention {fp8_attention}), stock bf16 "
          f"{stock:.4g} ({ours / stock:.2f}x)")


def test_ltx2_fp8_converts_the_video_linears_and_quantises_each_input_once(kernel):
    model = ltx2_bf16("2.3")
    inputs = ltx2_inputs_for(model)
    optimize(model, kernel=kernel, fp8=True)
    block = model.transformer_blocks[1]
    for path in ltx2.FP8_LINEARS:
        assert isinstance(block.get_submodule(path), kernel.Fp8Linear), path
    for path in ("audio_attn1.to_q", "audio_ff.net.2", "attn2.to_k", "attn1.to_gate_logits"):
        assert type(block.get_submodule(path)) is torch.nn.Linear, path  # audio, text and gates stay bf16
    paths = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "video_to_audio_attn.to_k", "video_to_audio_attn.to_v",
             "ff.net.2", "attn1.to_out.0")
    seen = first_arguments(block, paths, lambda: ltx2_forward(model, inputs))
    # q, k and v of the self-attention read one set of e4m3 rows, as do v2a's k and v; the GELU writes the
    # down-projection's; the attention output (cuDNN's, bf16) is quantised by its projection
    assert seen["attn1.to_q"] is seen["attn1.to_k"] is seen["attn1.to_v"]
    assert seen["video_to_audio_attn.to_k"] is seen["video_to_audio_attn.to_v"]
    assert [type(seen[p]).__name__ for p in paths] == ["Fp8Rows"] * 6 + ["Tensor"]


def test_ltx2_0_fp8_norms_write_the_rows_of_every_video_input(kernel):
    model = ltx2_bf16("2.0")  # no per-head gates: each video input feeds only FP8 projections
    inputs = ltx2_inputs_for(model)
    optimize(model, kernel=kernel, fp8=True)
    paths = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn2.to_q", "audio_to_video_attn.to_q",
             "video_to_audio_attn.to_k", "video_to_audio_attn.to_v", "ff.net.0.proj")
    seen = first_arguments(model.transformer_blocks[1], paths, lambda: ltx2_forward(model, inputs))
    assert seen["attn1.to_q"] is seen["attn1.to_k"] is seen["attn1.to_v"]
    assert seen["video_to_audio_attn.to_k"] is seen["video_to_audio_attn.to_v"]
    assert [type(seen[p]).__name__ for p in paths] == ["Fp8Rows"] * 8


def test_ltx2_restore_after_fp8_gives_the_stock_model_back(kernel):
    model = ltx2_bf16("2.3")
    inputs = ltx2_inputs_for(model)
    expected = ltx2_forward(model, inputs)
    optimize(model, kernel=kernel, fp8=True)
    fp8 = ltx2_forward(model, inputs)
    assert all(0 < rel_l2(got, e) < 0.1 for got, e in zip(fp8, expected))
    restore(model)
    assert type(model.transformer_blocks[0].ff.net[2]) is torch.nn.Linear
    assert all(torch.equal(got, e) for got, e in zip(ltx2_forward(model, inputs), expected))


@pytest.mark.parametrize("config", ["2.0", "2.3"])
def test_ltx2_fp8_block_compiles_with_fullgraph_and_no_graph_break(kernel, config):
    torch._dynamo.reset()
    model = ltx2_bf16(config)
    kwargs = first_block_kwargs(model, ltx2_inputs_for(model, per_token=True))
    optimize(model, kernel=kernel, fp8=True)
    assert_compiles_like_eager(model.transformer_blocks[0], kwargs=kwargs, tolerance=2e-2)


# --- Wan --------------------------------------------------------------------------------------------------

def needs_cudnn_fp8_attention():
    from ltx_kernels_diffusers.fp8_attention import unavailable

    if unavailable():
        pytest.skip(unavailable())


def fp8_attention_arguments(kernel, model, inputs, block, paths):
    """{path: the first argument} of ``block``'s submodules at ``paths`` in a run with fp8=True and
    fp8_attention=True, after checking that its output is within 0.1 relative L2 of fp8=True's with
    bf16 attention (and not equal to it)."""
    needs_cudnn_fp8_attention()
    optimize(model, kernel=kernel, fp8=True)
    bf16_attention = run(model, inputs)
    optimize(model, kernel=kernel, fp8=True, fp8_attention=True)
    outputs = []
    seen = first_arguments(block, paths, lambda: outputs.append(run(model, inputs)))
    assert 0 < rel_l2(outputs[0], bf16_attention) < 0.1
    return seen


@pytest.mark.parametrize("fp8_attention", [False, True], ids=["bf16 attention", "fp8 attention"])
@pytest.mark.parametrize("config", ["1.3b t2v", "14b i2v"])
def test_wan_fp8_is_within_3x_stock_bf16_error_of_fp32(kernel, config, fp8_attention):
    from benchmarks.generate_video import keep_fp32_as_loaded

    from .integration_support import wan_model

    if fp8_attention:
        needs_cudnn_fp8_attention()
    fp32 = wan_model(torch.float32, device="cuda", num_layers=3, **WAN_CONFIGS[config][0])
    model = keep_fp32_as_loaded(copy.deepcopy(fp32))
    ours, stock = check_quality_target(kernel, fp32, model, wan_inputs_for(model, config), True, bar=3.0, fp8=True,
                                       fp8_attention=fp8_attention)
    print(f"Wan {config} relative L2 to fp32: fp8 {ours:.4g} (fp8 attention {fp8_attention}), stock bf16 "
          f"{stock:.4g} ({ours / stock:.2f}x)")


def test_wan_fp8_attention_feeds_its_e4m3_output_to_the_fp8_output_projection(kernel):
    model = wan_bf16("14b i2v")
    seen = fp8_attention_arguments(kernel, model, wan_inputs_for(model, "14b i2v"), model.blocks[1],
                                   ("attn1.to_out.0", "attn2.to_out.0"))
    assert type(seen["attn1.to_out.0"]).__name__ == "Fp8Rows"  # no quantisation pass between
    assert type(seen["attn2.to_out.0"]).__name__ == "Tensor"  # the cross-attention stays bf16


def test_wan_fp8_attention_block_compiles_with_fullgraph_and_no_graph_break(kernel):
    needs_cudnn_fp8_attention()
    torch._dynamo.reset()
    model = wan_bf16()
    seen = {}
    handle = model.blocks[0].register_forward_pre_hook(lambda module, args: seen.update(args=args))
    run(model, wan_inputs_for(model))
    handle.remove()
    optimize(model, kernel=kernel, fp8=True, fp8_attention=True)
    assert_compiles_like_eager(model.blocks[0], seen["args"], tolerance=5e-2)


def test_wan_fp8_feeds_each_linear_the_rows_of_its_producer_and_restore_gives_stock_back(kernel):
    model = wan_bf16("14b i2v")
    inputs = wan_inputs_for(model, "14b i2v")
    expected = run(model, inputs)
    optimize(model, kernel=kernel, fp8=True)
    block, outputs = model.blocks[1], []
    seen = first_arguments(block, wan.FP8_LINEARS, lambda: outputs.append(run(model, inputs)))
    assert 0 < rel_l2(outputs[0], expected) < 0.1
    assert {path: type(x).__name__ for path, x in seen.items()} == {
        path: "Tensor" if path.endswith("to_out.0") else "Fp8Rows" for path in wan.FP8_LINEARS}
    assert type(block.attn2.add_k_proj) is torch.nn.Linear  # the image context stays bf16
    restore(model)
    assert torch.equal(run(model, inputs), expected)


def test_wan_fp8_block_compiles_with_fullgraph_and_no_graph_break(kernel):
    torch._dynamo.reset()
    model = wan_bf16()
    seen = {}  # Wan's model forward calls its blocks with positional arguments
    handle = model.blocks[0].register_forward_pre_hook(lambda module, args: seen.update(args=args))
    run(model, wan_inputs_for(model))
    handle.remove()
    optimize(model, kernel=kernel, fp8=True)
    assert_compiles_like_eager(model.blocks[0], seen["args"], tolerance=2e-2)


def assert_fp8_block_compiles_like_eager(kernel, model, block, inputs, overrides=None, tolerance=2e-2, **options):
    """``block``, given the arguments a stock run of ``model`` on ``inputs`` passes it (keyword arguments
    ``overrides`` replaced), then optimised with fp8=True (and ``options``): no graph break, and
    torch.compile(fullgraph=True) gives its eager output."""
    torch._dynamo.reset()
    seen = {}
    handle = block.register_forward_pre_hook(lambda module, args, kw: seen.update(args=args, kwargs=kw),
                                             with_kwargs=True)
    run(model, inputs)
    handle.remove()
    optimize(model, kernel=kernel, fp8=True, **options)
    assert_compiles_like_eager(block, seen["args"], kwargs={**seen["kwargs"], **(overrides or {})},
                               tolerance=tolerance)


# --- Flux -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fp8_attention", [False, True], ids=["bf16 attention", "fp8 attention"])
def test_flux_fp8_is_within_3x_stock_bf16_error_of_fp32(kernel, fp8_attention):
    from .integration_support import flux_inputs, flux_model

    if fp8_attention:
        needs_cudnn_fp8_attention()
    fp32 = flux_model(torch.float32, device="cuda", num_layers=2, num_single_layers=4, guidance_embeds=True)
    model = copy.deepcopy(fp32).to(torch.bfloat16)
    ours, stock = check_quality_target(kernel, fp32, model, flux_inputs(model, **FLUX_IMAGE), True, bar=3.0,
                                       fp8=True, fp8_attention=fp8_attention)
    print(f"Flux relative L2 to fp32: fp8 {ours:.4g} (fp8 attention {fp8_attention}), stock bf16 {stock:.4g} "
          f"({ours / stock:.2f}x)")


def test_flux_fp8_feeds_each_linear_the_rows_of_its_producer_and_restore_gives_stock_back(kernel):
    from .integration_support import flux_inputs

    model = flux_bf16(num_layers=2, num_single_layers=2)
    inputs = flux_inputs(model, **FLUX_IMAGE)
    expected = run(model, inputs)
    optimize(model, kernel=kernel, fp8=True)
    outputs, single = [], {}
    double = first_arguments(model.transformer_blocks[1], flux.FP8_LINEARS, lambda: single.update(first_arguments(
        model.single_transformer_blocks[1], flux.FP8_SINGLE_LINEARS, lambda: outputs.append(run(model, inputs)))))
    assert 0 < rel_l2(outputs[0], expected) < 0.1
    assert {path: type(x).__name__ for path, x in double.items()} == {
        path: "Tensor" if path.endswith("to_out.0") else "Fp8Rows" for path in flux.FP8_LINEARS}
    assert {path: type(x).__name__ for path, x in single.items()} == {
        path: "Tensor" if path == "proj_out" else "Fp8Rows" for path in flux.FP8_SINGLE_LINEARS}
    restore(model)
    assert torch.equal(run(model, inputs), expected)


@pytest.mark.parametrize("kind", ["double", "single"])
def test_flux_fp8_block_compiles_with_fullgraph_and_no_graph_break(kernel, kind):
    from .integration_support import flux_inputs

    model = flux_bf16()
    block = model.transformer_blocks[0] if kind == "double" else model.single_transformer_blocks[0]
    assert_fp8_block_compiles_like_eager(kernel, model, block, flux_inputs(model, **FLUX_IMAGE))


# --- Mochi ------------------------------------------------------------------------------------------------

def mochi_full_text_inputs(model):
    """Mochi's test inputs with every text token valid (the FP8 attention's case)."""
    from .integration_support import mochi_inputs
    from .test_integration_mochi_gpu import VIDEO as MOCHI_VIDEO

    inputs = mochi_inputs(model, **MOCHI_VIDEO)
    inputs["encoder_attention_mask"] = torch.ones_like(inputs["encoder_attention_mask"])
    return inputs


@pytest.mark.parametrize("fp8_attention", [False, True], ids=["bf16 attention", "fp8 attention"])
def test_mochi_fp8_is_within_3x_stock_bf16_error_of_fp32(kernel, fp8_attention):
    from .integration_support import mochi_inputs, mochi_model
    from .test_integration_mochi_gpu import VIDEO as MOCHI_VIDEO

    if fp8_attention:
        needs_cudnn_fp8_attention()
    fp32 = mochi_model(torch.float32, device="cuda", num_layers=4)
    model = copy.deepcopy(fp32).to(torch.bfloat16)
    inputs = mochi_full_text_inputs(model) if fp8_attention else mochi_inputs(model, **MOCHI_VIDEO)
    ours, stock = check_quality_target(kernel, fp32, model, inputs, True, bar=3.0, fp8=True,
                                       fp8_attention=fp8_attention)
    print(f"Mochi relative L2 to fp32: fp8 {ours:.4g} (fp8 attention {fp8_attention}), stock bf16 {stock:.4g} "
          f"({ours / stock:.2f}x)")


def test_mochi_fp8_attention_feeds_its_e4m3_video_rows_to_the_fp8_output_projection(kernel):
    from .test_integration_mochi_gpu import bf16_model as mochi_bf16

    model = mochi_bf16()
    # block 0: the last block (context_pre_only) has no to_add_out
    seen = fp8_attention_arguments(kernel, model, mochi_full_text_inputs(model), model.transformer_blocks[0],
                                   ("attn1.to_out.0", "attn1.to_add_out"))
    assert type(seen["attn1.to_out.0"]).__name__ == "Fp8Rows"  # no quantisation pass between
    assert seen["attn1.to_add_out"].dtype == torch.bfloat16  # the text stream stays bf16


def test_mochi_fp8_feeds_each_linear_the_rows_of_its_producer_and_restore_gives_stock_back(kernel):
    from .integration_support import mochi_inputs
    from .test_integration_mochi_gpu import VIDEO as MOCHI_VIDEO, bf16_model as mochi_bf16

    model = mochi_bf16()
    inputs = mochi_inputs(model, **MOCHI_VIDEO)
    expected = run(model, inputs)
    optimize(model, kernel=kernel, fp8=True)
    outputs = []
    seen = first_arguments(model.transformer_blocks[1], mochi.FP8_LINEARS, lambda: outputs.append(run(model, inputs)))
    assert 0 < rel_l2(outputs[0], expected) < 0.1
    assert {path: type(x).__name__ for path, x in seen.items()} == {
        path: "Tensor" if path in ("attn1.to_out.0", "ff.net.2") else "Fp8Rows" for path in mochi.FP8_LINEARS}
    restore(model)
    assert torch.equal(run(model, inputs), expected)


def test_mochi_fp8_block_compiles_with_fullgraph_and_no_graph_break(kernel):
    from .integration_support import mochi_inputs
    from .test_integration_mochi_gpu import VIDEO as MOCHI_VIDEO, bf16_model as mochi_bf16

    model = mochi_bf16()
    assert_fp8_block_compiles_like_eager(kernel, model, model.transformer_blocks[0],
                                         mochi_inputs(model, **MOCHI_VIDEO))


def test_mochi_fp8_attention_block_compiles_with_fullgraph_and_no_graph_break(kernel):
    from .test_integration_mochi_gpu import bf16_model as mochi_bf16

    needs_cudnn_fp8_attention()
    model = mochi_bf16()
    # every text token valid: the block gets no mask, as the processors drop the one the model records
    assert_fp8_block_compiles_like_eager(kernel, model, model.transformer_blocks[0], mochi_full_text_inputs(model),
                                         overrides={"encoder_attention_mask": None}, tolerance=5e-2,
                                         fp8_attention=True)


def test_ltx2_and_flux_fp8_attention_feed_e4m3_rows_to_the_fp8_output_projection(kernel):
    from .integration_support import flux_inputs

    model = ltx2_bf16("2.0")  # no per-head gates: the rows go straight to to_out
    block = model.transformer_blocks[1]
    seen = fp8_attention_arguments(kernel, model, ltx2_inputs_for(model), block, ("attn1.to_out.0",))
    assert type(seen["attn1.to_out.0"]).__name__ == "Fp8Rows"
    # only the video self-attention: the audio stream's 126 tokens and the cross-attentions keep bf16
    assert [name for name in ltx2.ATTENTIONS if getattr(block, name).processor.fp8_attention] == ["attn1"]
    model = flux_bf16()
    seen = fp8_attention_arguments(kernel, model, flux_inputs(model, **FLUX_IMAGE), model.transformer_blocks[0],
                                   ("attn.to_out.0", "attn.to_add_out"))
    assert type(seen["attn.to_out.0"]).__name__ == "Fp8Rows" and seen["attn.to_add_out"].dtype == torch.bfloat16
