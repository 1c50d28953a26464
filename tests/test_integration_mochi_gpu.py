"""optimize on diffusers' Mochi transformer on the GPU (skipped without CUDA),
with the built kernel: the default (10B) config at a depth of 2-4 blocks with
random weights (nothing downloaded), 4 latent frames at 30x40 (1200 video
tokens) and 256 text tokens with padding, batch 2.

- Quality: stock bf16 and optimised bf16 each against an fp32 stock run of the
  same weights and inputs; the optimised relative L2 is at most 1.1x stock's.
- Exact mode, seam by seam, bitwise the stock modules (inputs on a grid where
  the mean square is exact in any order; docs/formulas.md).
- restore gives the stock output bit for bit; model CPU offload after optimize
  works, before it is refused; a block compiles with fullgraph=True (no graph
  break), and so does compile_repeated_blocks, with a padded text mask and with
  every text token valid (no mask)."""

from __future__ import annotations

import copy

import pytest
import torch

from .conftest import cuda

pytestmark = cuda
pytest.importorskip("diffusers")

from ltx_kernels_diffusers import optimize, restore  # noqa: E402
from ltx_kernels_diffusers.models.mochi import (head_norm, mochi_qk, mochi_rotary, tanh_gated_residual,  # noqa: E402
                                                tanh_gated_residual_then_norm)

from .hook_support import check_model_cpu_offload, check_quality_target  # noqa: E402
from .hook_support import run as forward  # noqa: E402
from .integration_support import RecordingKernel, mochi_inputs, mochi_model, rel_l2  # noqa: E402
from .test_activation_gpu import same_as_eager  # noqa: E402
from .test_fused_norm_gpu import grid, mostly_bitwise, rand  # noqa: E402
from .test_integration_gpu import full_fp32_matmuls  # noqa: E402, F401

VIDEO = dict(batch=2, frames=4, height=30, width=40, text=256)  # latents: 4 x 15 x 20 = 1200 tokens after patching
VIDEO_TOKENS = 4 * 15 * 20
HIDDEN, TEXT_HIDDEN = 3072, 1536  # the default config's inner dim and pooled_projection_dim



def bf16_model(num_layers=2, **config):
    return mochi_model(torch.bfloat16, device="cuda", num_layers=num_layers, **config)


# --- quality against fp32 ------------------------------------------------------------------------

@pytest.mark.parametrize("exact_mode", [True, False])
def test_optimised_bf16_is_as_close_to_fp32_as_stock_bf16(kernel, exact_mode):
    fp32 = mochi_model(torch.float32, device="cuda", num_layers=4)
    model = copy.deepcopy(fp32).to(torch.bfloat16)
    inputs = mochi_inputs(model, **VIDEO)
    check_quality_target(kernel, fp32, model, inputs, exact_mode)


def test_with_the_stock_attention_the_model_stays_within_bf16_rounding_of_stock(kernel):
    model = bf16_model(num_layers=4)
    inputs = mochi_inputs(model, **VIDEO)
    expected = forward(model, inputs)
    optimize(model, kernel=kernel, fuse_attention=False)
    assert rel_l2(forward(model, inputs), expected) < 1e-2


# --- exact mode, seam by seam ----------------------------------------------------------------------------

def test_norm1_and_the_context_norms_are_bitwise_the_stock_modules(kernel):
    model = bf16_model()
    first, last = model.transformer_blocks
    x, text = grid((2, VIDEO_TOKENS, HIDDEN), torch.bfloat16, 1, 1 / 8, 4), grid((2, 256, TEXT_HIDDEN),
                                                                                   torch.bfloat16, 2, 1 / 8, 4)
    temb = rand((2, HIDDEN), torch.bfloat16, 3)
    calls = [(first.norm1, x), (first.norm1_context, text), (last.norm1_context, text)]  # the last: LayerNormContinuous
    with torch.no_grad():
        expected = [norm(t, temb) for norm, t in calls]
        optimize(model, kernel=kernel)
        got = [norm(t, temb) for norm, t in calls]
    for ours, stock in zip(got, expected):
        for a, b in zip(ours if isinstance(ours, tuple) else (ours,), stock if isinstance(stock, tuple) else (stock,)):
            assert torch.equal(a, b)


def test_the_residual_seams_are_bitwise_the_stock_chain(kernel):
    block = bf16_model().transformer_blocks[0]
    x = rand((2, VIDEO_TOKENS, HIDDEN), torch.bfloat16, 4, 2)
    branch = grid((2, VIDEO_TOKENS, HIDDEN), torch.bfloat16, 5, 1 / 8, 4)
    gate, scale = rand((2, HIDDEN), torch.bfloat16, 6), rand((2, HIDDEN), torch.bfloat16, 7, 0.5)
    with torch.no_grad():
        stock = x + block.norm2(branch, torch.tanh(gate).unsqueeze(1))
        assert torch.equal(tanh_gated_residual(kernel, x, branch, gate, block.norm4, True), stock)
        x_new, normed = tanh_gated_residual_then_norm(kernel, x, branch, gate, block.norm2, block.norm3, scale,
                                                      True)
        assert torch.equal(x_new, stock)
        # x_new is not on the grid: the mean square's order may move r by an ulp on a few rows
        mostly_bitwise(normed, block.norm3(stock, 1 + scale.unsqueeze(1).to(torch.float32)))
        on_grid = grid((2, VIDEO_TOKENS, HIDDEN), torch.bfloat16, 8, 1 / 8, 4)
        assert torch.equal(kernel.modulated_rmsnorm(on_grid, scale, block.norm3.norm.eps),
                           block.norm3(on_grid, 1 + scale.unsqueeze(1).to(torch.float32)))


def test_the_feed_forward_swiglu_is_the_stock_one(kernel):
    model = bf16_model()
    ff = model.transformer_blocks[0].ff
    x = rand((2, VIDEO_TOKENS, HIDDEN), torch.bfloat16, 9)
    with torch.no_grad():
        expected = ff.net[0](x)
        optimize(model, kernel=kernel)
        got = ff.net[0](x)
    same_as_eager(got, expected)  # bitwise but for FMA contraction in the SiLU (activations' own tests)


def test_q_k_norm_and_rope_are_bitwise_the_stock_chain(kernel):
    model = bf16_model()
    attn = model.transformer_blocks[0].attn1
    rope = model.rope(model.pos_frequencies, 4, 15, 20, device="cuda", dtype=torch.float32)
    q, k = (grid((2, VIDEO_TOKENS, 24, 128), torch.bfloat16, seed, 1 / 8, 4) for seed in (10, 11))
    text = grid((2, 256, 24, 128), torch.bfloat16, 12, 1 / 8, 4)
    with torch.no_grad():
        got = mochi_qk(attn, q, k, rope, kernel=kernel, exact_mode=True)
        expected = mochi_rotary(attn.norm_q(q), *rope), mochi_rotary(attn.norm_k(k), *rope)
        assert torch.equal(head_norm(kernel, attn.norm_added_q, text), attn.norm_added_q(text))
    for ours, stock in zip(got, expected):
        assert torch.equal(ours, stock)


# --- restore, offload, compile ------------------------------------------------------------------------------

def test_restore_gives_the_stock_output_bit_for_bit(kernel):
    model = bf16_model()
    inputs = mochi_inputs(model, **VIDEO)
    expected = forward(model, inputs)
    recorder = RecordingKernel(kernel)
    optimize(model, kernel=recorder)
    forward(model, inputs)
    assert recorder.calls["qk_rmsnorm_rope"] == 2 and recorder.calls["residual_tanh_gated_rmsnorm"] == 6
    restore(model)
    assert torch.equal(forward(model, inputs), expected)


def test_model_cpu_offload_after_optimize_works_and_before_is_refused(kernel):
    check_model_cpu_offload(kernel, bf16_model(), lambda transformer: mochi_inputs(transformer, **VIDEO))


def test_a_block_compiles_with_fullgraph_and_no_graph_break(kernel):
    torch._dynamo.reset()
    model = bf16_model()
    optimize(model, kernel=kernel)
    block = model.transformer_blocks[0]
    g = torch.Generator(device="cuda").manual_seed(13)
    inputs = dict(hidden_states=torch.randn(2, VIDEO_TOKENS, HIDDEN, generator=g, device="cuda").bfloat16(),
                  encoder_hidden_states=torch.randn(2, 256, TEXT_HIDDEN, generator=g, device="cuda").bfloat16(),
                  temb=torch.randn(2, HIDDEN, generator=g, device="cuda").bfloat16(),
                  encoder_attention_mask=mochi_inputs(model, **VIDEO)["encoder_attention_mask"],
                  image_rotary_emb=model.rope(model.pos_frequencies, 4, 15, 20, device="cuda", dtype=torch.float32))
    with torch.no_grad():
        explained = torch._dynamo.explain(block)(**inputs)
        assert explained.graph_break_count == 0, explained.break_reasons
        eager = block(**inputs)
        compiled = torch.compile(block, fullgraph=True)(**inputs)
    for a, b in zip(compiled, eager):
        assert rel_l2(a, b) < 1e-2


@pytest.mark.parametrize("full_text", [False, True])
def test_compile_repeated_blocks_matches_eager(kernel, full_text):
    """full_text: every text token valid, so the blocks attend without a mask (cuDNN/flash eligible)."""
    torch._dynamo.reset()
    model = bf16_model(num_layers=3)
    inputs = mochi_inputs(model, **VIDEO)
    if full_text:
        inputs["encoder_attention_mask"] = torch.ones_like(inputs["encoder_attention_mask"])
    optimize(model, kernel=kernel)
    expected = forward(model, inputs)
    model.compile_repeated_blocks(fullgraph=True)
    assert rel_l2(forward(model, inputs), expected) < 1e-2
