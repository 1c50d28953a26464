"""optimize on diffusers' Wan transformer on the GPU (skipped without CUDA), with
the built kernel: the Wan 2.1 1.3B (text-to-video) and 14B image-to-video
configs and Wan 2.2 TI2V 5B (per-token modulation) at a depth of 2-3 blocks
with random weights (nothing downloaded), 3 latent frames at 30x40 (900 video
tokens), 512 text tokens (and 257 CLIP image tokens), batch 2; bf16 models
keep the class's float32 modules, as from_pretrained(torch_dtype=bf16) does.

- Quality: stock bf16 and optimised bf16 each against an fp32 stock run of the
  same weights and inputs; the optimised relative L2 is at most 1.1x stock's.
- Exact mode, seam by seam, bitwise the model's own code: the block's
  residual and LayerNorm seams (WanTransformerBlock.forward with our layernorm
  as its norms, on rows whose statistics are exact in any order; with its own
  FP32LayerNorms the residual stream stays bitwise and the norms' outputs move
  by an ulp on a few elements), the attention processors (self-attention q/k
  norm + RoPE, cross-attention and the image context's keys), the GELU.
- restore gives the stock output bit for bit; model CPU offload after optimize
  works, before it is refused; a block compiles with fullgraph=True (no graph
  break), and compile_repeated_blocks matches eager."""

from __future__ import annotations

import copy

import pytest
import torch

from .conftest import cuda

pytestmark = cuda
pytest.importorskip("diffusers")

from diffusers.models.transformers.transformer_wan import WanTransformerBlock  # noqa: E402

from ltx_dev.bench import end_to_end as e2e  # noqa: E402
from ltx_kernels_diffusers import FusedWanAttnProcessor, optimize, restore  # noqa: E402
from ltx_kernels_diffusers.models import wan  # noqa: E402

from .hook_support import check_model_cpu_offload, check_quality_target  # noqa: E402
from .hook_support import run as forward  # noqa: E402
from .integration_support import RecordingKernel, rel_l2, wan_inputs, wan_model  # noqa: E402
from .test_activation_gpu import same_as_eager  # noqa: E402
from .test_fused_norm_gpu import grid, rand  # noqa: E402
from .test_integration_gpu import full_fp32_matmuls  # noqa: E402, F401
from .test_layernorm_gpu import OurLayerNorm, Stub, paired_grid, power_of_two_gate  # noqa: E402

VIDEO = dict(batch=2, frames=3, height=30, width=40, text=512)  # latents: 3 x 15 x 20 = 900 tokens after patching
VIDEO_TOKENS = 3 * 15 * 20
IMAGE_TOKENS = 257  # CLIP ViT-H/14 at 224: 256 patches + the class token
# config name -> (WanTransformer3DModel kwargs, input overrides). The Wan 2.1 configs are the benchmark's
# (tools/ltx_dev/bench/end_to_end.py); TI2V 5B is Wan-AI/Wan2.2-TI2V-5B-Diffusers' transformer config.
CONFIGS = {
    "1.3b t2v": (e2e.MODELS["wan"].variant("1.3b").kwargs, {}),
    "14b i2v": (e2e.MODELS["wan"].variant("14b-i2v").kwargs, dict(image=IMAGE_TOKENS)),
    "5b ti2v": (dict(num_attention_heads=24, ffn_dim=14336, in_channels=48, out_channels=48), dict(per_token=True)),
}
HIDDEN, HEADS = 1536, 12  # 1.3B



def bf16_model(config="1.3b t2v", num_layers=2):
    return wan_model(torch.bfloat16, device="cuda", num_layers=num_layers, **CONFIGS[config][0])


def inputs_for(model, config="1.3b t2v"):
    return wan_inputs(model, **VIDEO, **CONFIGS[config][1])


# --- quality against fp32 ------------------------------------------------------------------------

@pytest.mark.parametrize("exact_mode", [True, False])
@pytest.mark.parametrize("config", CONFIGS)
def test_optimised_bf16_is_as_close_to_fp32_as_stock_bf16(kernel, config, exact_mode):
    from benchmarks.generate_video import keep_fp32_as_loaded

    fp32 = wan_model(torch.float32, device="cuda", num_layers=3, **CONFIGS[config][0])
    model = keep_fp32_as_loaded(copy.deepcopy(fp32))
    inputs = inputs_for(model, config)
    check_quality_target(kernel, fp32, model, inputs, exact_mode)


# --- exact mode, seam by seam ----------------------------------------------------------------------------

def stubbed_block(kernel, per_token, cross_attn_norm, our_norms):
    """A 1.3B WanTransformerBlock (float32 parameters, as loaded) whose attentions and feed-forward are
    stubs returning fixed bf16 outputs that keep each residual a paired grid (test_layernorm_gpu), and
    whose norms are our layernorm (``our_norms``) or its own FP32LayerNorms; with its inputs."""
    B, S, D = 2, 300, HIDDEN
    block = WanTransformerBlock(D, 2 * D, HEADS, cross_attn_norm=cross_attn_norm, eps=1e-6).to("cuda")
    with torch.no_grad():
        block.scale_shift_table.zero_()  # the gate comes from temb alone: powers of two
        if cross_attn_norm:
            block.norm2.weight.copy_(rand((D,), torch.float32, 5, 0.2, 1.0))
            block.norm2.bias.copy_(rand((D,), torch.float32, 6, 0.3))
    lead = (B, S) if per_token else (B,)
    temb = rand((*lead, 6, D), torch.float32, 7, 0.5).bfloat16()  # the model's timestep_proj is bf16
    temb[..., 2, :] = power_of_two_gate((*lead, D), torch.bfloat16, 8)
    if our_norms:
        block.norm1, block.norm3 = OurLayerNorm(kernel), OurLayerNorm(kernel)
        if cross_attn_norm:
            block.norm2 = OurLayerNorm(kernel, block.norm2.weight, block.norm2.bias)
    h0 = paired_grid((B, S, D), torch.bfloat16, 9)
    block.attn1 = Stub(paired_grid((B, S, D), torch.bfloat16, 10, step=1 / 8))
    block.attn2 = Stub(paired_grid((B, S, D), torch.bfloat16, 11, step=1 / 32, limit=0.5))
    block.ffn = Stub(rand((B, S, D), torch.bfloat16, 12))
    return block, (h0, rand((B, 7, D), torch.bfloat16, 13), temb, None)


@torch.no_grad()
@pytest.mark.parametrize("cross_attn_norm", [True, False])
@pytest.mark.parametrize("per_token", [False, True], ids=["wan2.1", "wan2.2_ti2v"])
def test_the_block_seams_are_bitwise_the_blocks_own_chain(kernel, per_token, cross_attn_norm):
    """norm1 + modulation, the attention residual + norm2, the cross-attention residual + norm3 +
    modulation and the feed-forward residual: what each sub-layer receives and the block's output."""
    block, args = stubbed_block(kernel, per_token, cross_attn_norm, our_norms=True)
    stock = WanTransformerBlock.forward(block, *args)
    ours = wan.block_forward(block, *args, kernel=kernel, exact_mode=True)
    assert torch.equal(ours, stock)
    for stub in (block.attn1, block.attn2, block.ffn):
        stock_in, ours_in = stub.seen
        assert torch.equal(ours_in, stock_in)


@torch.no_grad()
def test_with_its_own_layer_norms_the_residual_stream_is_bitwise_and_the_norms_within_an_ulp(kernel):
    block, args = stubbed_block(kernel, False, True, our_norms=False)
    h0 = rand(args[0].shape, torch.bfloat16, 14, 2, 0.3)  # random rows: the statistics' order matters
    args = (h0, *args[1:])
    stock = WanTransformerBlock.forward(block, *args)
    assert torch.equal(wan.block_forward(block, *args, kernel=kernel, exact_mode=True), stock)
    for stub in (block.attn1, block.attn2, block.ffn):
        stock_in, ours_in = stub.seen
        assert (ours_in != stock_in).float().mean().item() <= 2e-2 and rel_l2(ours_in, stock_in) < 1e-3


def identity(linear, scale=1.0):
    """A projection that passes its input through exactly (times a power of two)."""
    with torch.no_grad():
        linear.weight.copy_(torch.eye(*linear.weight.shape, device="cuda") * scale)
        linear.bias.zero_()


@torch.no_grad()
def test_self_attention_is_bitwise_the_stock_processor(kernel):
    """q/k RMSNorm over all heads (random weights) + RoPE in one pass, with the RoPE module's own
    tables ([1, S, 1, Dh], repeating along the row) and repeated per head: the processor's output bit for bit
    (the attention itself the same dispatch_attention_fn call). q and k are the input (identity
    projections) on a grid where the mean square is exact in any order."""
    model = bf16_model()
    attn = model.blocks[0].attn1
    identity(attn.to_q), identity(attn.to_k, 2.0)
    latents = inputs_for(model)["hidden_states"]
    tables = model.rope(latents)
    per_head = tuple(t.expand(-1, -1, HEADS, -1).contiguous() for t in tables)  # [1, S, H, Dh]: a view each
    hidden = grid((2, VIDEO_TOKENS, HIDDEN), torch.bfloat16, 20, 1 / 8, 4)
    expected = attn(hidden, None, None, tables)
    recorder = RecordingKernel(kernel)
    attn.set_processor(FusedWanAttnProcessor(recorder, prefer_cudnn_attention=False))
    for rotary_emb in (tables, per_head):
        assert torch.equal(attn(hidden, None, None, rotary_emb), expected)
    assert recorder.calls["qk_rmsnorm_rope"] == 2


@torch.no_grad()
def test_image_to_video_cross_attention_is_bitwise_the_stock_processor(kernel):
    """norm_q, norm_k on the text keys and norm_added_k on the image keys, on rmsnorm; the image and
    the text attention calls as stock."""
    model = wan_model(torch.bfloat16, device="cuda", num_layers=1, **e2e.MODELS["wan"].variant("1.3b-i2v").kwargs)
    attn = model.blocks[0].attn2
    identity(attn.to_q), identity(attn.to_k), identity(attn.add_k_proj, 0.5)
    hidden = grid((2, VIDEO_TOKENS, HIDDEN), torch.bfloat16, 21, 1 / 8, 4)
    context = grid((2, IMAGE_TOKENS + 512, HIDDEN), torch.bfloat16, 22, 1 / 8, 4)
    expected = attn(hidden, context)
    recorder = RecordingKernel(kernel)
    attn.set_processor(FusedWanAttnProcessor(recorder, prefer_cudnn_attention=False))
    assert torch.equal(attn(hidden, context), expected)
    assert recorder.calls["rmsnorm"] == 3


@torch.no_grad()
def test_the_feed_forward_gelu_is_the_stock_one_and_the_epilogue_close(kernel):
    act = bf16_model().blocks[0].ffn.net[0]
    x = rand((2, VIDEO_TOKENS, HIDDEN), torch.bfloat16, 23)
    expected = act(x)
    same_as_eager(wan.gelu_forward(act, x, kernel=kernel, epilogue=False), expected)  # FMA contraction aside
    assert rel_l2(wan.gelu_forward(act, x, kernel=kernel, epilogue=True), expected) < 1e-2


# --- restore, offload, compile ------------------------------------------------------------------------------

def test_restore_gives_the_stock_output_bit_for_bit(kernel):
    model = bf16_model("14b i2v")
    inputs = inputs_for(model, "14b i2v")
    expected = forward(model, inputs)
    recorder = RecordingKernel(kernel)
    optimize(model, kernel=recorder)
    forward(model, inputs)
    assert recorder.calls["qk_rmsnorm_rope"] == 2 and recorder.calls["gated_residual_layernorm"] == 4
    assert recorder.calls["rmsnorm"] == 6  # cross-attention q, text k and image k per block
    restore(model)
    assert torch.equal(forward(model, inputs), expected)


def test_model_cpu_offload_after_optimize_works_and_before_is_refused(kernel):
    check_model_cpu_offload(kernel, bf16_model(), inputs_for)


@pytest.mark.parametrize("per_token", [False, True], ids=["wan2.1", "wan2.2_ti2v"])
def test_a_block_compiles_with_fullgraph_and_no_graph_break(kernel, per_token):
    torch._dynamo.reset()
    model = bf16_model()
    optimize(model, kernel=kernel)
    block = model.blocks[0]
    g = torch.Generator(device="cuda").manual_seed(24)
    lead = (2, VIDEO_TOKENS) if per_token else (2,)
    with torch.no_grad():
        inputs = dict(hidden_states=torch.randn(2, VIDEO_TOKENS, HIDDEN, generator=g, device="cuda").bfloat16(),
                      encoder_hidden_states=torch.randn(2, 512, HIDDEN, generator=g, device="cuda").bfloat16(),
                      temb=torch.randn(*lead, 6, HIDDEN, generator=g, device="cuda").bfloat16(),
                      rotary_emb=model.rope(inputs_for(model)["hidden_states"]))
        explained = torch._dynamo.explain(block)(**inputs)
        assert explained.graph_break_count == 0, explained.break_reasons
        eager = block(**inputs)
        compiled = torch.compile(block, fullgraph=True)(**inputs)
    assert rel_l2(compiled, eager) < 1e-2


def test_compile_repeated_blocks_matches_eager(kernel):
    torch._dynamo.reset()
    model = bf16_model(num_layers=3)
    inputs = inputs_for(model)
    optimize(model, kernel=kernel)
    expected = forward(model, inputs)
    model.compile_repeated_blocks(fullgraph=True)
    assert rel_l2(forward(model, inputs), expected) < 1e-2

