"""optimize on diffusers' Flux transformer on the GPU (skipped without CUDA),
with the built kernel: FLUX.1-dev's config (3072 wide, 24 heads of 128,
guidance embedded) at a depth of 1-2 double-stream and 1-4 single-stream
blocks with random weights (nothing downloaded), a 256x384 image (32x48
packed latents: 1536 tokens) and 256 text tokens, batch 2.

- Quality: stock bf16 and optimised bf16 (defaults, and fast mode) each against
  an fp32 stock run of the same weights and inputs; the optimised relative L2
  is at most 1.1x stock's.
- Exact mode, seam by seam, against the stock modules: bit for bit where the
  normalisation's reduction order cannot matter (LayerNorm rows whose
  statistics are exact in any order, with our `layernorm` inside the stock
  module as test_layernorm_gpu.py does; RMSNorm on a grid), and on random rows
  within an ulp on a small fraction of the elements.
- restore gives the stock output bit for bit; model CPU offload and group
  offloading after optimize work, before it is refused; each block compiles
  with fullgraph=True (no graph break), and so does compile_repeated_blocks."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .conftest import cuda

pytestmark = cuda
pytest.importorskip("diffusers")

from diffusers.models.embeddings import apply_rotary_emb  # noqa: E402
from diffusers.models.normalization import (AdaLayerNormContinuous, AdaLayerNormZero,  # noqa: E402
                                            AdaLayerNormZeroSingle)

from ltx_kernels_diffusers import optimize, restore  # noqa: E402
from ltx_kernels_diffusers.models.flux import joint_qk, norm_rope  # noqa: E402

from .hook_support import check_model_cpu_offload, check_quality_target  # noqa: E402
from .hook_support import run as forward  # noqa: E402
from .integration_support import RecordingKernel, flux_inputs, flux_model, rel_l2  # noqa: E402
from .test_activation_gpu import same_as_eager  # noqa: E402
from .test_fused_norm_gpu import grid  # noqa: E402
from .test_integration_gpu import full_fp32_matmuls  # noqa: E402, F401
from .test_layernorm_gpu import (OurLayerNorm, Stub, ln_magnitude, modulated_magnitude, mostly_bitwise,  # noqa: E402
                                 paired_grid, power_of_two_gate, rand)

IMAGE = dict(batch=2, height=32, width=48, text=256)
TOKENS, TEXT = 32 * 48, 256
HIDDEN, HEADS, HEAD_DIM = 3072, 24, 128
BF16, F32 = torch.bfloat16, torch.float32
ADA_NORMS = (AdaLayerNormZero, AdaLayerNormZeroSingle, AdaLayerNormContinuous)



def bf16_model(num_layers=1, num_single_layers=1):
    return flux_model(BF16, device="cuda", num_layers=num_layers, num_single_layers=num_single_layers,
                      guidance_embeds=True)


def tables(model):
    """The RoPE tables the model computes for IMAGE's [text | image] ids: float32 [TEXT + TOKENS, 128]."""
    inputs = flux_inputs(model, **IMAGE)
    return model.pos_embed(torch.cat([inputs["txt_ids"], inputs["img_ids"]]))


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


# --- quality against fp32 ------------------------------------------------------------------------

@pytest.mark.parametrize("exact_mode", [True, False])
def test_optimised_bf16_is_as_close_to_fp32_as_stock_bf16(kernel, exact_mode):
    fp32 = flux_model(F32, device="cuda", num_layers=2, num_single_layers=4, guidance_embeds=True)
    model = copy.deepcopy(fp32).to(BF16)
    inputs = flux_inputs(model, **IMAGE)
    check_quality_target(kernel, fp32, model, inputs, exact_mode)


def test_in_exact_mode_without_the_epilogue_the_model_stays_within_bf16_rounding_of_stock(kernel):
    model = bf16_model(num_layers=2, num_single_layers=4)
    inputs = flux_inputs(model, **IMAGE)
    expected = forward(model, inputs)
    optimize(model, kernel=kernel, gelu_epilogue=False, prefer_cudnn_attention=False)
    assert rel_l2(forward(model, inputs), expected) < 1e-2


# --- exact mode, seam by seam ----------------------------------------------------------------------------

def test_the_ada_layer_norms_are_the_stock_chain_bit_for_bit(kernel):
    """norm1 / norm1_context (AdaLayerNormZero), the single block's norm
    (AdaLayerNormZeroSingle) and norm_out (AdaLayerNormContinuous), hooked,
    against the stock modules with our layernorm as their `norm`, on rows whose
    statistics are exact in any order: the modulation chain, bit for bit."""
    model = bf16_model()
    stock = copy.deepcopy(model)
    for norm in [m for m in stock.modules() if isinstance(m, ADA_NORMS)]:
        norm.norm = OurLayerNorm(kernel, eps=norm.norm.eps)
    optimize(model, kernel=kernel)
    x, temb = paired_grid((2, TOKENS, HIDDEN), BF16, 1), rand((2, HIDDEN), BF16, 2)
    with torch.no_grad():
        for name in ("transformer_blocks.0.norm1", "transformer_blocks.0.norm1_context",
                     "single_transformer_blocks.0.norm", "norm_out"):
            call = (lambda m: m(x, temb)) if name == "norm_out" else (lambda m: m(x, emb=temb))  # noqa: E731
            got, expected = call(model.get_submodule(name)), call(stock.get_submodule(name))
            assert all(torch.equal(a, b) for a, b in zip(as_tuple(got), as_tuple(expected))), name


def test_on_random_rows_norm1_is_the_stock_module_up_to_the_summation_order(kernel):
    model = bf16_model()
    norm = model.transformer_blocks[0].norm1
    stock = copy.deepcopy(norm)
    optimize(model, kernel=kernel)
    x, temb = rand((2, TOKENS, HIDDEN), BF16, 3, 2, 0.3), rand((2, HIDDEN), BF16, 4)
    with torch.no_grad():
        got, expected = norm(x, emb=temb), stock(x, emb=temb)
        shift, scale = stock.linear(stock.silu(temb)).chunk(6, dim=1)[:2]
    assert all(torch.equal(a, b) for a, b in zip(got[1:], expected[1:]))  # the gates and the MLP's modulation
    # the normalised value moves by an ulp on a few elements; the chain's roundings then by up to two
    mostly_bitwise(got[0], expected[0], modulated_magnitude(x, ln_magnitude(x), scale, shift), 2e-2, ulps=2)


def set_modulation(norm, seed):
    """norm1's projection as a constant (zero weight): shift, scale, gate (a power of two, which keeps
    the residual a paired grid), then the MLP's shift, scale, gate."""
    modulation = rand((6, HIDDEN), F32, seed, 0.5)
    modulation[2] = power_of_two_gate((HIDDEN,), F32, seed + 1)
    with torch.no_grad():
        norm.linear.weight.zero_()
        norm.linear.bias.copy_(modulation.reshape(-1).to(BF16))


def test_the_double_blocks_residual_seams_are_the_stock_chain_bit_for_bit(kernel):
    """The hooked FluxTransformerBlock against the stock one with our layernorm as
    its four norms, attention and feed-forwards stubbed (the same outputs for
    both): the attention residual + norm2 + modulation of each stream (what the
    feed-forwards get) and the feed-forward residuals (the block's outputs)."""
    model = bf16_model()
    block = model.transformer_blocks[0]
    set_modulation(block.norm1, 1)
    set_modulation(block.norm1_context, 3)
    stock = copy.deepcopy(block)
    stock.norm1.norm, stock.norm1_context.norm = OurLayerNorm(kernel), OurLayerNorm(kernel)
    stock.norm2, stock.norm2_context = OurLayerNorm(kernel), OurLayerNorm(kernel)
    optimize(model, kernel=kernel)
    h, text = paired_grid((2, TOKENS, HIDDEN), BF16, 5), paired_grid((2, TEXT, HIDDEN), BF16, 6)
    y, y_text = paired_grid((2, TOKENS, HIDDEN), BF16, 7, step=1 / 8), paired_grid((2, TEXT, HIDDEN), BF16, 8,
                                                                                  step=1 / 8)
    ff, ff_text, temb = rand((2, TOKENS, HIDDEN), BF16, 9), rand((2, TEXT, HIDDEN), BF16, 10), rand((2, HIDDEN),
                                                                                                   BF16, 11)
    for b in (block, stock):
        b.attn, b.ff, b.ff_context = Stub((y, y_text)), Stub(ff), Stub(ff_text)
    with torch.no_grad():
        got, expected = block(h, text, temb), stock(h, text, temb)
    for name in ("attn", "ff", "ff_context"):
        assert torch.equal(getattr(block, name).seen[0], getattr(stock, name).seen[0]), name
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_the_single_blocks_seams_are_the_stock_chain_bit_for_bit(kernel):
    """The hooked FluxSingleTransformerBlock against the stock one with our
    layernorm in its norm, attention stubbed and the GELU an identity: the
    norm's output (what attention gets) and the gated residual (the outputs)."""
    model = bf16_model()
    block = model.single_transformer_blocks[0]
    stock = copy.deepcopy(block)
    stock.norm.norm = OurLayerNorm(kernel)
    optimize(model, kernel=kernel, gelu_epilogue=False)
    text, h = paired_grid((2, TEXT, HIDDEN), BF16, 1), paired_grid((2, TOKENS, HIDDEN), BF16, 2)
    y, temb = rand((2, TEXT + TOKENS, HIDDEN), BF16, 3), rand((2, HIDDEN), BF16, 4)
    for b in (block, stock):
        b.attn, b.act_mlp = Stub(y), nn.Identity()
    with torch.no_grad():
        got, expected = block(h, text, temb), stock(h, text, temb)
    assert torch.equal(block.attn.seen[0], stock.attn.seen[0])
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_the_gelus_are_eager_gelu_tanh_and_the_epilogue_is_closer_to_exact(kernel):
    model = bf16_model()
    stock = copy.deepcopy(model)
    x = rand((2, TOKENS, HIDDEN), BF16, 1)
    gelu, stock_gelu = model.transformer_blocks[0].ff.net[0], stock.transformer_blocks[0].ff.net[0]
    with torch.no_grad():
        optimize(model, kernel=kernel, gelu_epilogue=False)
        same_as_eager(gelu(x), stock_gelu(x))  # bitwise but for FMA contraction (activations' own tests)
        up = model.single_transformer_blocks[0].proj_mlp(x)
        same_as_eager(model.single_transformer_blocks[0].act_mlp(up), F.gelu(up, approximate="tanh"))
        optimize(model, kernel=kernel)  # gelu_epilogue=True: one rounding
        w, b = stock_gelu.proj.weight.double(), stock_gelu.proj.bias.double()
        exact = F.gelu(F.linear(x.double(), w, b), approximate="tanh")
        assert rel_l2(gelu(x), exact) <= rel_l2(stock_gelu(x), exact)


def test_q_k_norm_and_rope_of_each_stream_are_the_stock_chain_bit_for_bit(kernel):
    """The double blocks: text and image q/k, each stream normalised and rotated
    with its rows of the table, concatenated; stock: norms, concatenation, one
    rotation. The single blocks: the joint q/k. On a grid (RMSNorm's sum exact)."""
    model = bf16_model()
    rope = tables(model)
    q, k = (grid((2, TOKENS, HEADS, HEAD_DIM), BF16, seed, 1 / 8, 4) for seed in (1, 2))
    eq, ek = (grid((2, TEXT, HEADS, HEAD_DIM), BF16, seed, 1 / 8, 4) for seed in (3, 4))
    attn, single = model.transformer_blocks[0].attn, model.single_transformer_blocks[0].attn
    joint_q, joint_k = torch.cat([eq, q], dim=1), torch.cat([ek, k], dim=1)
    with torch.no_grad():
        got = joint_qk(kernel, attn, q, k, eq, ek, rope, exact_mode=True)
        expected = [apply_rotary_emb(torch.cat([added(e), norm(t)], dim=1), rope, sequence_dim=1)
                    for added, norm, e, t in ((attn.norm_added_q, attn.norm_q, eq, q),
                                              (attn.norm_added_k, attn.norm_k, ek, k))]
        got_single = norm_rope(kernel, single.norm_q, single.norm_k, joint_q, joint_k, rope, True)
        expected_single = [apply_rotary_emb(norm(t), rope, sequence_dim=1)
                           for norm, t in ((single.norm_q, joint_q), (single.norm_k, joint_k))]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert all(torch.equal(a, b) for a, b in zip(got_single, expected_single))


def test_the_fused_processors_match_the_stock_ones(kernel):
    """The whole processor on random inputs, the same SDPA backend as stock:
    only RMSNorm's summation order differs."""
    model = bf16_model()
    stock = copy.deepcopy(model)
    optimize(model, kernel=kernel, prefer_cudnn_attention=False)
    rope = tables(model)
    hidden, text = rand((2, TOKENS, HIDDEN), BF16, 1), rand((2, TEXT, HIDDEN), BF16, 2)
    joint = torch.cat([text, hidden], dim=1)
    with torch.no_grad():
        for name, args in (("transformer_blocks.0.attn", (hidden, text)), ("single_transformer_blocks.0.attn",
                                                                           (joint,))):
            got = as_tuple(model.get_submodule(name)(*args, image_rotary_emb=rope))
            expected = as_tuple(stock.get_submodule(name)(*args, image_rotary_emb=rope))
            assert all(rel_l2(a, b) < 1e-3 for a, b in zip(got, expected)), name


# --- restore, offload, compile ------------------------------------------------------------------------------

def test_restore_gives_the_stock_output_bit_for_bit(kernel):
    model = bf16_model()
    inputs = flux_inputs(model, **IMAGE)
    expected = forward(model, inputs)
    recorder = RecordingKernel(kernel)
    optimize(model, kernel=recorder)
    forward(model, inputs)
    assert recorder.calls["qk_rmsnorm_rope"] == 3 and recorder.calls["gated_residual_layernorm"] == 2
    assert recorder.calls["linear_gelu"] == 3 and recorder.calls["adaln_layernorm"] == 4
    restore(model)
    assert torch.equal(forward(model, inputs), expected)


def test_model_cpu_offload_after_optimize_works_and_before_is_refused(kernel):
    check_model_cpu_offload(kernel, bf16_model(), lambda transformer: flux_inputs(transformer, **IMAGE))


def test_block_level_group_offloading_wraps_the_fused_blocks(kernel):
    """Group offloading's block hooks (added after optimize) onload each block and
    call our fused forward: the optimised output; after restore, stock's (up to the GEMMs'
    choice of algorithm for weights at other addresses)."""
    model = bf16_model(num_layers=2, num_single_layers=2)
    inputs = flux_inputs(model, **IMAGE)
    expected = forward(model, inputs)
    optimize(model, kernel=kernel)
    optimised = forward(model, inputs)
    model.to("cpu")
    model.enable_group_offload(onload_device=torch.device("cuda"), offload_type="block_level",
                               num_blocks_per_group=1)
    assert rel_l2(forward(model, inputs), optimised) < 1e-3
    restore(model)
    assert rel_l2(forward(model, inputs), expected) < 1e-3


def test_leaf_level_group_offloading_calls_the_modules_whose_weights_it_manages(kernel):
    """Leaf-level hooks manage the projections' and the q/k norms' weights: those
    modules are called (no GELU epilogue, the q/k norms and RoPE as stock); the
    weightless LayerNorms and the residuals stay fused."""
    model = bf16_model()
    inputs = flux_inputs(model, **IMAGE)
    recorder = RecordingKernel(kernel)
    optimize(model, kernel=recorder, gelu_epilogue=False)
    optimised = forward(model, inputs)
    model.to("cpu")
    model.enable_group_offload(onload_device=torch.device("cuda"), offload_type="leaf_level")
    recorder.calls.clear()
    assert rel_l2(forward(model, inputs), optimised) < 1e-2
    assert recorder.calls["qk_rmsnorm_rope"] == recorder.calls["linear_gelu"] == 0
    assert recorder.calls["adaln_layernorm"] == 4 and recorder.calls["gated_residual_layernorm"] == 2


def block_inputs(model):
    g = torch.Generator(device="cuda").manual_seed(13)
    return dict(hidden_states=torch.randn(2, TOKENS, HIDDEN, generator=g, device="cuda").to(BF16),
                encoder_hidden_states=torch.randn(2, TEXT, HIDDEN, generator=g, device="cuda").to(BF16),
                temb=torch.randn(2, HIDDEN, generator=g, device="cuda").to(BF16),
                image_rotary_emb=tables(model))


@pytest.mark.parametrize("blocks", ["transformer_blocks", "single_transformer_blocks"])
def test_a_block_compiles_with_fullgraph_and_no_graph_break(kernel, blocks):
    torch._dynamo.reset()
    model = bf16_model()
    optimize(model, kernel=kernel)
    block = getattr(model, blocks)[0]
    inputs = block_inputs(model)
    with torch.no_grad():
        explained = torch._dynamo.explain(block)(**inputs)
        assert explained.graph_break_count == 0, explained.break_reasons
        eager = block(**inputs)
        compiled = torch.compile(block, fullgraph=True)(**inputs)
    for a, b in zip(compiled, eager):
        assert rel_l2(a, b) < 1e-2


def test_compile_repeated_blocks_matches_eager(kernel):
    torch._dynamo.reset()
    model = bf16_model(num_layers=2, num_single_layers=3)
    inputs = flux_inputs(model, **IMAGE)
    optimize(model, kernel=kernel)
    expected = forward(model, inputs)
    model.compile_repeated_blocks(fullgraph=True)
    assert rel_l2(forward(model, inputs), expected) < 1e-2
