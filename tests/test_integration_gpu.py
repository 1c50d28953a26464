"""optimize_ltx and the kernelize mapping on the GPU (skipped without CUDA):
the LTX-Video 2B transformer with random weights (no download), inputs for
49 frames at 512x768 (latent 7x16x24, seq 2688, text 128, batch 2), matches
the stock transformer within relative L2 1e-2 in bf16 and 1e-5 in fp32; a
few denoising steps match; model CPU offload after optimize_ltx works and
before it is refused; torch.compile (fullgraph) and kernelize give the same
output."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from . import conftest
from .conftest import ROOT, cuda

pytestmark = cuda
pytest.importorskip("diffusers")

from ltx_kernels_diffusers import HooksPresentError, optimize_ltx, restore  # noqa: E402

from .integration_support import LTX_2B_VIDEO, ROPE_SCALE, ltx_inputs, marked, rel_l2  # noqa: E402, F401

TOLERANCE = {torch.bfloat16: 1e-2, torch.float32: 1e-5}
SMALL_VIDEO = dict(batch=2, frames=4, height=8, width=12, text=128)  # 25 frames at 256x384


@pytest.fixture(autouse=True)
def full_fp32_matmuls():
    """fp32 means fp32 (no TF32) in both the stock and the optimised model."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    torch.cuda.empty_cache()


def ltx_model(dtype, seed=0, device="cuda", **config):
    """LTXVideoTransformer3DModel() (the 2B config unless overridden), random
    weights initialised on the device."""
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(seed)
    with torch.device(device):
        model = LTXVideoTransformer3DModel(**config)
    return model.to(dtype).eval()


def forward(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


@pytest.mark.parametrize("dtype, exact_mode, gelu_epilogue", [
    (torch.bfloat16, True, True), (torch.bfloat16, True, False), (torch.bfloat16, False, True),
    (torch.float32, True, True), (torch.float32, True, False), (torch.float32, False, True),
])
def test_2b_transformer_matches_stock(kernel, dtype, exact_mode, gelu_epilogue):
    model = ltx_model(dtype)
    inputs = ltx_inputs(model, **LTX_2B_VIDEO)
    expected = forward(model, inputs)
    optimize_ltx(model, kernel=kernel, exact_mode=exact_mode, gelu_epilogue=gelu_epilogue)
    got = forward(model, inputs)
    err = rel_l2(got, expected)
    assert err < TOLERANCE[dtype], f"relative L2 error {err:.3g}"
    restore(model)
    assert torch.equal(forward(model, inputs), expected)


def test_per_token_timesteps_match_stock(kernel):
    model = ltx_model(torch.bfloat16, num_layers=4)
    inputs = ltx_inputs(model, **LTX_2B_VIDEO, per_token=True)
    expected = forward(model, inputs)
    optimize_ltx(model, kernel=kernel)
    assert rel_l2(forward(model, inputs), expected) < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_qk_norm_rope_attention_matches_stock(kernel, dtype):
    if not hasattr(kernel, "qk_rmsnorm_rope"):
        pytest.skip("this build has no qk_rmsnorm_rope")
    from ltx_kernels_diffusers import FusedLTXVideoAttnProcessor

    model = ltx_model(dtype, num_layers=1)
    attn = model.transformer_blocks[0].attn1
    b, f, h, w = (LTX_2B_VIDEO[k] for k in ("batch", "frames", "height", "width"))
    x = torch.randn(b, f * h * w, 2048, device="cuda", dtype=dtype)
    rope = kernel.ltx_rope_cos_sin(f, h, w, ROPE_SCALE, 2048, batch_size=b, device="cuda")
    with torch.no_grad():
        expected = attn(x, image_rotary_emb=rope)
        attn.set_processor(FusedLTXVideoAttnProcessor(kernel))
        got = attn(x, image_rotary_emb=rope)
    assert rel_l2(got, expected) < TOLERANCE[dtype]


# --- denoising ------------------------------------------------------------------------------------------

def ltx_scheduler():
    """FlowMatchEulerDiscreteScheduler with LTX-Video's settings."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
                                           base_image_seq_len=1024, max_image_seq_len=4096, shift_terminal=0.1)


def denoise(model, inputs, steps=3, guidance_scale=3.0):
    """LTXPipeline's denoising loop (classifier-free guidance over the batch
    halves, Euler flow-matching steps) on packed latents."""
    scheduler = ltx_scheduler()
    seq = inputs["hidden_states"].shape[1]
    cfg = scheduler.config
    slope = (cfg.max_shift - cfg.base_shift) / (cfg.max_image_seq_len - cfg.base_image_seq_len)
    mu = cfg.base_shift + slope * (seq - cfg.base_image_seq_len)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu, device=inputs["hidden_states"].device)
    latents = inputs["hidden_states"][: inputs["hidden_states"].shape[0] // 2].float()
    with torch.no_grad():
        for t in scheduler.timesteps:
            x = torch.cat([latents] * 2).to(inputs["hidden_states"].dtype)
            noise = model(**{**inputs, "hidden_states": x, "timestep": t.expand(x.shape[0])})[0].float()
            uncond, text = noise.chunk(2)
            latents = scheduler.step(uncond + guidance_scale * (text - uncond), t, latents, return_dict=False)[0]
    return latents


def test_a_few_denoising_steps_match_stock(kernel):
    model = ltx_model(torch.bfloat16)
    inputs = ltx_inputs(model, **SMALL_VIDEO)
    expected = denoise(model, inputs)
    optimize_ltx(model, kernel=kernel)
    assert rel_l2(denoise(model, inputs), expected) < 1e-2


def ltx_pipeline(transformer):
    """LTXPipeline around ``transformer`` with no text encoder, tokenizer or VAE:
    prompts come as embeddings and the output as latents."""
    from diffusers import LTXPipeline

    pipe = LTXPipeline(scheduler=ltx_scheduler(), vae=None, text_encoder=None, tokenizer=None,
                       transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generate(pipe, device="cuda", steps=3):
    g = torch.Generator().manual_seed(3)
    embeds = [torch.randn(1, 128, 4096, generator=g).to(device, torch.bfloat16) for _ in range(2)]
    mask = torch.ones(1, 128, device=device)
    mask[:, 40:] = 0
    with torch.no_grad():
        return pipe(prompt_embeds=embeds[0], prompt_attention_mask=mask, negative_prompt_embeds=embeds[1],
                    negative_prompt_attention_mask=mask, num_frames=25, height=256, width=384,
                    num_inference_steps=steps, output_type="latent",
                    generator=torch.Generator(device).manual_seed(4)).frames


def test_ltx_pipeline_steps_match_stock(kernel):
    pytest.importorskip("transformers")  # LTXPipeline imports it
    pipe = ltx_pipeline(ltx_model(torch.bfloat16))
    expected = generate(pipe)
    assert optimize_ltx(pipe, kernel=kernel) is pipe
    assert rel_l2(generate(pipe), expected) < 1e-2


def transformer_only_pipeline(transformer):
    """A DiffusionPipeline holding just the transformer: enough for
    enable_model_cpu_offload() without a text encoder (and transformers)."""
    from diffusers import DiffusionPipeline

    class TransformerOnlyPipeline(DiffusionPipeline):
        model_cpu_offload_seq = "transformer"

        def __init__(self, transformer):
            super().__init__()
            self.register_modules(transformer=transformer)

    return TransformerOnlyPipeline(transformer)


def test_model_cpu_offload_after_optimize_works_and_before_is_refused(kernel):
    pytest.importorskip("accelerate")
    pipe = transformer_only_pipeline(ltx_model(torch.bfloat16, num_layers=4))
    inputs = ltx_inputs(pipe.transformer, **LTX_2B_VIDEO)
    expected = forward(pipe.transformer, inputs)
    pipe.transformer.to("cpu")
    assert optimize_ltx(pipe, kernel=kernel) is pipe
    pipe.enable_model_cpu_offload()
    assert rel_l2(forward(pipe.transformer, inputs), expected) < 1e-2  # the hook moves it to the GPU and back
    with pytest.raises(HooksPresentError, match="pipe.remove_all_hooks"):
        restore(pipe)
    pipe.remove_all_hooks()
    restore(pipe)
    pipe.enable_model_cpu_offload()
    with pytest.raises(HooksPresentError, match=r"then optimize_ltx\(pipe\), then pipe.enable_model_cpu_offload"):
        optimize_ltx(pipe, kernel=kernel)


# --- torch.compile and kernelize ---------------------------------------------------------------------------

@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_compiled_optimised_model_matches_stock(kernel, scope):
    torch._dynamo.reset()
    model = ltx_model(torch.bfloat16, num_layers=2)
    inputs = ltx_inputs(model, **LTX_2B_VIDEO)
    expected = forward(model, inputs)
    optimize_ltx(model, kernel=kernel)
    if scope == "blocks":
        model.compile_repeated_blocks(fullgraph=True)
        compiled = model
    else:
        compiled = torch.compile(model, fullgraph=True)
    assert rel_l2(forward(compiled, inputs), expected) < 1e-2


@pytest.mark.parametrize("compile_mode", [False, True])
def test_kernelize_with_the_documented_mapping_matches_stock(kernel, marked, compile_mode):
    from kernels import Mode, kernelize, use_kernel_mapping

    from ltx_kernels_diffusers import kernel_mapping

    torch._dynamo.reset()
    model = ltx_model(torch.bfloat16, num_layers=2 if compile_mode else 28)
    inputs = ltx_inputs(model, **LTX_2B_VIDEO)
    expected = forward(model, inputs)
    mode = Mode.INFERENCE | Mode.TORCH_COMPILE if compile_mode else Mode.INFERENCE
    with use_kernel_mapping(kernel_mapping(local_path=conftest.KERNEL_ROOT), inherit_mapping=False):
        kernelize(model, mode=mode)
    assert model.transformer_blocks[0].forward.__func__ is kernel.layers.LTXVideoTransformerBlock.forward
    run = torch.compile(model, fullgraph=True) if compile_mode else model
    assert rel_l2(forward(run, inputs), expected) < 1e-2
