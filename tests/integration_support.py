"""Shared by the integration tests: LTX-Video, LTX-2, Mochi, Wan and Flux configs and inputs, a
relative error, and a pure-PyTorch stand-in for the kernel's op API that
computes each op the way diffusers' eager code does (so on the CPU an optimised
model must equal the stock one bit for bit: any wiring mistake shows)."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F

from ltx_dev.reference import fp8 as fp8_reference
from ltx_dev.reference.fused_norm import (genmo_modulated_rmsnorm, genmo_residual_tanh_gated_rmsnorm, per_batch,
                                          wan_gated_residual)
from ltx_dev.reference.layernorm import fp32_layer_norm, flux_modulated_norm, torch_layer_norm, wan_modulated_norm
from ltx_dev.reference.rmsnorm import diffusers_rms_norm

# Small enough for CPU CI; hidden 16 is not a multiple of 6, so the RoPE tables
# have identity channels, as LTX's 2048 does.
TINY_CONFIG = dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8,
                   cross_attention_dim=16, num_layers=3, caption_channels=12)
TINY_VIDEO = dict(batch=2, frames=2, height=3, width=4, text=5)
# LTX-Video 2B (the default config), 49 frames at 512x768: latent 7x16x24, seq 2688, text 128, batch 2 (CFG).
LTX_2B_VIDEO = dict(batch=2, frames=7, height=16, width=24, text=128)
ROPE_SCALE = (8 / 25, 32, 32)  # (VAE temporal ratio / frame rate, spatial ratio, spatial ratio), as the pipeline
# Mochi: 3 blocks (the last one context_pre_only); text_embed_dim a multiple of the caption pooler's 8 heads.
TINY_MOCHI_CONFIG = dict(patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=3,
                         pooled_projection_dim=16, in_channels=4, text_embed_dim=16, time_embed_dim=8,
                         max_sequence_length=6)
TINY_MOCHI_VIDEO = dict(batch=2, frames=2, height=4, width=6, text=6)  # latents; 2 x 2 x 3 = 12 video tokens
# Wan: head dim 12, so the RoPE parts are 4 / 4 / 4 channels (time, height, width); patch (1, 2, 2).
TINY_WAN_CONFIG = dict(num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=16,
                       freq_dim=16, ffn_dim=40, num_layers=2, rope_max_seq_len=32)
# image-to-video: the CLIP image states' width and the added k/v projections (to the hidden size)
TINY_WAN_I2V = dict(image_dim=8, added_kv_proj_dim=24, in_channels=8)
TINY_WAN_VIDEO = dict(batch=2, frames=3, height=4, width=6, text=7)  # latents; 3 x 2 x 3 = 18 video tokens
WAN_TEXT_CONTEXT = 512  # image-to-video: the processor takes the last 512 context tokens as the text
# Flux: 2 double-stream and 3 single-stream blocks, 2 heads of 8 (RoPE axes 2 + 2 + 4), guidance embedded (dev).
TINY_FLUX_CONFIG = dict(patch_size=1, in_channels=8, num_layers=2, num_single_layers=3, attention_head_dim=8,
                        num_attention_heads=2, joint_attention_dim=12, pooled_projection_dim=6, guidance_embeds=True,
                        axes_dims_rope=(2, 2, 4))
TINY_FLUX_IMAGE = dict(batch=2, height=3, width=4, text=5)  # packed latents: 3 x 4 = 12 image tokens
# LTX-2: video 2 heads of 8, audio 2 heads of 4 (the a2v/v2a attentions and their RoPE are audio-sized);
# hidden 16 is not a multiple of 6, so the video RoPE tables have identity channels, as LTX-2's 4096 does.
TINY_LTX2_CONFIG = dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8,
                        cross_attention_dim=16, audio_in_channels=6, audio_out_channels=6,
                        audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8,
                        caption_channels=12, num_layers=2)
# LTX-2.3's options over LTX-2.0: the per-head attention gate and the text cross-attention's query modulation
LTX2_3_OPTIONS = dict(gated_attn=True, audio_gated_attn=True, cross_attn_mod=True, audio_cross_attn_mod=True)
TINY_LTX2_VIDEO = dict(batch=2, frames=2, height=3, width=4, audio=5, text=6)  # 24 video tokens, 5 audio


def tiny_model(dtype=torch.float32, seed=0, **overrides):
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(seed)
    return LTXVideoTransformer3DModel(**{**TINY_CONFIG, **overrides}).to(dtype).eval()


def ltx_inputs(model, *, batch, frames, height, width, text, dtype=None, device=None, seed=1, per_token=False):
    """Keyword arguments of the model's forward: packed latents, text states with
    a padded mask (the last tokens masked out), one timestep per sample (or per
    token, as LTX's condition pipeline passes them), the RoPE grid."""
    cfg = model.config
    dtype = dtype or model.dtype
    device = device or model.device
    g = torch.Generator().manual_seed(seed)
    seq = frames * height * width
    mask = torch.ones(batch, text)
    mask[:, max(1, text - text // 4):] = 0
    timestep = torch.tensor([500.0, 700.0] * batch)[:batch]
    if per_token:
        timestep = timestep[:, None] * torch.linspace(0.5, 1.0, seq)[None]
    return dict(
        hidden_states=torch.randn(batch, seq, cfg.in_channels, generator=g).to(device, dtype),
        encoder_hidden_states=torch.randn(batch, text, cfg.caption_channels, generator=g).to(device, dtype),
        timestep=timestep.to(device),
        encoder_attention_mask=mask.to(device),
        num_frames=frames, height=height, width=width, rope_interpolation_scale=ROPE_SCALE, return_dict=False)


def mochi_model(dtype=torch.float32, seed=0, device=None, **config):
    """MochiTransformer3DModel(**config) with random weights, including what the
    stock init leaves trivial: ``pos_frequencies`` (zeros, so RoPE would be the
    identity) and the q/k norm weights (ones)."""
    from diffusers import MochiTransformer3DModel
    from diffusers.models.normalization import MochiRMSNorm

    torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = MochiTransformer3DModel(**config)
        with torch.no_grad():
            model.pos_frequencies.normal_(0.0, 0.5)
            for norm in model.modules():
                if isinstance(norm, MochiRMSNorm):
                    norm.weight.normal_(1.0, 0.2)
    return model.to(dtype).eval()


def tiny_mochi(dtype=torch.float32, seed=0, **overrides):
    return mochi_model(dtype, seed, **{**TINY_MOCHI_CONFIG, **overrides})


def mochi_inputs(model, *, batch, frames, height, width, text, dtype=None, device=None, seed=1):
    """Keyword arguments of MochiTransformer3DModel's forward: latents ``[B, C, F, H, W]``,
    text states and a mask with the last quarter of the tokens padded and, in
    every other sample, one more token masked in the middle (the stock processor
    keeps the valid ones in order: the fused one must too), one timestep per sample."""
    cfg = model.config
    dtype = dtype or model.dtype
    device = device or model.device
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, text)
    mask[:, max(1, text - text // 4):] = 0
    mask[1::2, text // 3] = 0
    return dict(
        hidden_states=torch.randn(batch, cfg.in_channels, frames, height, width, generator=g).to(device, dtype),
        encoder_hidden_states=torch.randn(batch, text, cfg.text_embed_dim, generator=g).to(device, dtype),
        timestep=torch.tensor([500.0, 700.0] * batch)[:batch].to(device),
        encoder_attention_mask=mask.to(device),
        return_dict=False)


def wan_model(dtype=torch.float32, seed=0, device=None, *, as_loaded=True, **config):
    """WanTransformer3DModel(**config) with random weights, including what the
    stock init leaves trivial (the norms' weights and biases). bf16 ``as_loaded``:
    what from_pretrained(torch_dtype=bf16) gives, the class's float32 modules
    (RoPE tables, modulation tables, norms, time embedder) kept float32;
    ``as_loaded=False``: the whole model cast (``.to(bf16)``: bf16 RoPE tables)."""
    from diffusers import WanTransformer3DModel

    from benchmarks.generate_video import keep_fp32_as_loaded

    torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = WanTransformer3DModel(**config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("norm_q.weight", "norm_k.weight", "norm_added_k.weight", "norm2.weight")):
                    p.normal_(1.0, 0.2)
                elif name.endswith("norm2.bias"):
                    p.normal_(0.0, 0.2)
    if dtype == torch.bfloat16 and as_loaded:
        return keep_fp32_as_loaded(model).eval()
    return model.to(dtype).eval()


def tiny_wan(dtype=torch.float32, seed=0, *, as_loaded=True, **overrides):
    return wan_model(dtype, seed, as_loaded=as_loaded, **{**TINY_WAN_CONFIG, **overrides})


def wan_inputs(model, *, batch, frames, height, width, text, image=None, per_token=False, dtype=None, device=None,
               seed=1):
    """Keyword arguments of WanTransformer3DModel's forward: latents ``[B, C, F, H, W]``,
    text states, one timestep per sample (or per token, as Wan 2.2 TI2V passes
    them) and, for image-to-video (``image`` tokens), the CLIP image states."""
    cfg = model.config
    dtype = dtype or model.blocks[0].attn1.to_q.weight.dtype
    device = device or model.blocks[0].attn1.to_q.weight.device
    g = torch.Generator().manual_seed(seed)
    timestep = torch.tensor([500.0, 700.0] * batch)[:batch]
    if per_token:
        tokens = frames // cfg.patch_size[0] * (height // cfg.patch_size[1]) * (width // cfg.patch_size[2])
        timestep = timestep[:, None] * torch.linspace(0.5, 1.0, tokens)[None]
    inputs = dict(
        hidden_states=torch.randn(batch, cfg.in_channels, frames, height, width, generator=g).to(device, dtype),
        timestep=timestep.to(device),
        encoder_hidden_states=torch.randn(batch, text, cfg.text_dim, generator=g).to(device, dtype),
        return_dict=False)
    if image is not None:
        inputs["encoder_hidden_states_image"] = torch.randn(batch, image, cfg.image_dim, generator=g).to(device,
                                                                                                        dtype)
    return inputs


def _with_random_qk_norms(cls_name, dtype, seed, device, config):
    """diffusers' ``cls_name(**config)`` with random weights, the ``torch.nn.RMSNorm`` q/k norm
    weights (ones after the stock init) included."""
    import diffusers

    torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = getattr(diffusers, cls_name)(**config)
        with torch.no_grad():
            for norm in model.modules():
                if isinstance(norm, torch.nn.RMSNorm) and norm.weight is not None:
                    norm.weight.normal_(1.0, 0.2)
    return model.to(dtype).eval()


def flux_model(dtype=torch.float32, seed=0, device=None, **config):
    return _with_random_qk_norms("FluxTransformer2DModel", dtype, seed, device, config)


def tiny_flux(dtype=torch.float32, seed=0, **overrides):
    return flux_model(dtype, seed, **{**TINY_FLUX_CONFIG, **overrides})


def flux_inputs(model, *, batch, height, width, text, dtype=None, device=None, seed=1):
    """Keyword arguments of FluxTransformer2DModel's forward: packed latents
    ``[B, H*W, C]``, text states, pooled projections, one timestep per sample,
    the guidance scale (guidance-distilled configs), and position ids: the
    image's (0, h, w) and, unlike the pipelines' zeros, text ids that turn the
    text tokens too (so a RoPE applied with the wrong rows of the table shows)."""
    cfg = model.config
    dtype = dtype or model.dtype
    device = device or model.device
    g = torch.Generator().manual_seed(seed)
    img_ids = torch.zeros(height, width, 3)
    img_ids[..., 1] += torch.arange(height)[:, None]
    img_ids[..., 2] += torch.arange(width)[None, :]
    txt_ids = torch.stack([torch.arange(text) + 1.0, torch.zeros(text), torch.arange(text) * 2.0], dim=-1)
    return dict(
        hidden_states=torch.randn(batch, height * width, cfg.in_channels, generator=g).to(device, dtype),
        encoder_hidden_states=torch.randn(batch, text, cfg.joint_attention_dim, generator=g).to(device, dtype),
        pooled_projections=torch.randn(batch, cfg.pooled_projection_dim, generator=g).to(device, dtype),
        timestep=torch.tensor([0.5, 0.7] * batch)[:batch].to(device, dtype),
        guidance=torch.full([batch], 3.5, device=device) if cfg.guidance_embeds else None,
        img_ids=img_ids.reshape(-1, 3).to(device), txt_ids=txt_ids.to(device), return_dict=False)


def ltx2_model(dtype=torch.float32, seed=0, device=None, **config):
    return _with_random_qk_norms("LTX2VideoTransformer3DModel", dtype, seed, device, config)


def tiny_ltx2(dtype=torch.float32, seed=0, **overrides):
    return ltx2_model(dtype, seed, **{**TINY_LTX2_CONFIG, **overrides})


def ltx2_inputs(model, *, batch, frames, height, width, audio, text, dtype=None, device=None, seed=1,
                per_token=False):
    """Keyword arguments of LTX2VideoTransformer3DModel's forward: packed video
    and audio latents, text states for each with a padded mask, one timestep
    per sample (or per video token, as LTX-2's conditioning pipelines pass
    them; the audio then takes one per sample), the sigmas LTX-2.3's prompt
    modulation reads, and the grids the RoPE tables come from."""
    cfg = model.config
    dtype = dtype or model.dtype
    device = device or model.device
    g = torch.Generator().manual_seed(seed)
    seq = frames * height * width
    mask = torch.ones(batch, text)
    mask[:, max(1, text - text // 3):] = 0
    timestep = torch.tensor([500.0, 700.0] * batch)[:batch]
    video_timestep = timestep[:, None] * torch.linspace(0.5, 1.0, seq)[None] if per_token else timestep

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device, dtype)

    return dict(
        hidden_states=randn(batch, seq, cfg.in_channels),
        audio_hidden_states=randn(batch, audio, cfg.audio_in_channels),
        encoder_hidden_states=randn(batch, text, cfg.caption_channels),
        audio_encoder_hidden_states=randn(batch, text, cfg.caption_channels),
        timestep=video_timestep.to(device), audio_timestep=timestep.to(device), sigma=(timestep / 1000).to(device),
        encoder_attention_mask=mask.to(device), audio_encoder_attention_mask=mask.to(device),
        num_frames=frames, height=height, width=width, audio_num_frames=audio, return_dict=False)


def rel_l2(got: torch.Tensor, expected: torch.Tensor) -> float:
    """||got - expected|| / ||expected||, in float64."""
    got, expected = got.double(), expected.double()
    return ((got - expected).norm() / expected.norm()).item()


def _rotate(x, cos, sin):
    """diffusers' LTX apply_rotary_emb (transformer_ltx.py), and Flux's (embeddings.py, interleaved pairs)."""
    x_real, x_imag = x.unflatten(-1, (-1, 2)).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(-2)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


class ReferenceKernel:
    """The functions of ltx_kernels the fused forwards call, computed as the
    eager model code computes them (``exact_mode=True``), or in float32 with
    one rounding (``False``). With the built kernel, ``layers`` (LTX-Video's
    fused forwards under test) and ``ltx_rope_cos_sin`` (pure PyTorch) are its
    own; the Mochi and Flux forwards are the integration's and need neither."""

    # the fp8 family in PyTorch (ltx_dev.reference.fp8): the FP8 paths' wiring, checked on the CPU
    layers = fp8_reference.layers
    Fp8Linear = fp8_reference.Fp8Linear
    quantize_fp8 = staticmethod(fp8_reference.quantize_fp8)
    gelu_tanh_fp8 = staticmethod(fp8_reference.gelu_tanh_fp8)
    linear_fp8 = staticmethod(fp8_reference.linear_fp8)
    gated_residual_fp8 = staticmethod(fp8_reference.gated_residual_fp8)
    adaln_rmsnorm_fp8 = staticmethod(fp8_reference.adaln_rmsnorm_fp8)
    gated_residual_rmsnorm_fp8 = staticmethod(fp8_reference.gated_residual_rmsnorm_fp8)
    adaln_layernorm_fp8 = staticmethod(fp8_reference.adaln_layernorm_fp8)
    gated_residual_layernorm_fp8 = staticmethod(fp8_reference.gated_residual_layernorm_fp8)

    def __init__(self, kernel=None):
        if kernel is not None:
            self.layers = kernel.layers
            self.ltx_rope_cos_sin = kernel.ltx_rope_cos_sin

    @staticmethod
    def rmsnorm(x, weight=None, eps=1e-6, out=None, *, rounding="torch"):
        if rounding == "torch":
            return F.rms_norm(x, (x.shape[-1],), weight, eps)  # what torch.nn.RMSNorm runs
        return diffusers_rms_norm(x, weight, eps)

    @staticmethod
    def adaln_rmsnorm(x, weight, scale, shift, eps=1e-6, *, exact_mode=True):
        if exact_mode:
            n = diffusers_rms_norm(x, weight, eps) * (1 + scale)
            return n + shift if shift is not None else n
        xf = x.float()
        n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        n = (n * weight.float() if weight is not None else n) * (1 + scale.float())
        return (n + shift.float() if shift is not None else n).to(x.dtype)

    @staticmethod
    def gated_residual(x, y, gate=None, *, inplace=False, exact_mode=True):
        gate = per_batch(gate, x)  # [B, D] (Mochi, Flux) broadcasts per batch
        if gate is not None and gate.dtype == torch.float32 and x.dtype != torch.float32:
            return wan_gated_residual(x, y, gate)  # float32 modulation: float32 math, one rounding (both modes)
        if exact_mode:
            return x + y * gate if gate is not None else x + y
        return (x.float() + (y.float() * gate.float() if gate is not None else y.float())).to(x.dtype)

    @classmethod
    def gated_residual_rmsnorm(cls, x, y, gate, scale, shift, eps=1e-6, *, weight=None, exact_mode=True):
        x_new = cls.gated_residual(x, y, gate, exact_mode=exact_mode)
        return cls.adaln_rmsnorm(x_new, weight, scale, shift, eps, exact_mode=exact_mode), x_new

    @staticmethod
    def adaln_layernorm(x, scale, shift, eps=1e-6, *, weight=None, bias=None, exact_mode=True):
        if exact_mode and scale.dtype != torch.float32:  # Flux / HunyuanVideo: the norm and each op rounded to T
            return flux_modulated_norm(torch_layer_norm(eps, weight, bias), x, scale, shift)
        # Wan's float32 chain (either mode), and fast mode: float32 math, one rounding
        return wan_modulated_norm(fp32_layer_norm(eps, weight, bias), x, scale.float(),
                                  shift.float() if shift is not None else None)

    @classmethod
    def gated_residual_layernorm(cls, x, y, gate, eps=1e-6, *, weight=None, bias=None, scale=None, shift=None,
                                 exact_mode=True):
        x_new = cls.gated_residual(x, y, gate, exact_mode=exact_mode)
        if scale is None:  # the (affine) LayerNorm in float32, one rounding: Wan's norm2(h.float()).type_as(h)
            return fp32_layer_norm(eps, weight, bias)(x_new), x_new
        return cls.adaln_layernorm(x_new, scale, shift, eps, weight=weight, bias=bias, exact_mode=exact_mode), x_new

    @staticmethod
    def gelu_tanh(x):
        return F.gelu(x, approximate="tanh")

    @staticmethod
    def linear_gelu(x, weight, bias):
        return F.gelu(F.linear(x.float(), weight.float(), bias.float()), approximate="tanh").to(x.dtype)

    @staticmethod
    def apply_rotary_emb(x, cos, sin, *, out=None):
        return _rotate(x, cos, sin)

    @classmethod
    def qk_rmsnorm_rope(cls, q, k, q_weight, k_weight, cos, sin, eps=1e-5, *, head_dim=None,
                        rotation="interleaved", rounding="torch", exact_mode=True, out=None):
        assert rotation == "interleaved"

        def one(x, w):
            rows = x.reshape(*x.shape[:2], -1)  # [B, S, H, Dh] -> [B, S, D]
            group = head_dim or rows.shape[-1]
            groups = rows.unflatten(-1, (-1, group))
            if exact_mode:
                n = cls.rmsnorm(groups, w, eps, rounding=rounding)
            else:  # the norm stays float32 through the rotation
                n = cls.rmsnorm(groups.float(), None if w is None else w.float(), eps, rounding="torch")
            if cos.shape[-1] == group:  # one column per channel of a head, shared by the heads (Flux)
                return _rotate(n, cos.unsqueeze(-2), sin.unsqueeze(-2)).to(x.dtype).view(x.shape)
            repeats = (1,) * (cos.dim() - 1) + (rows.shape[-1] // cos.shape[-1],)  # > 1: one head's columns (Wan)
            return _rotate(n.flatten(-2), cos.repeat(repeats), sin.repeat(repeats)).to(x.dtype).view(x.shape)

        if out is None:
            return one(q, q_weight), one(k, k_weight)
        out[0].copy_(one(q, q_weight))
        out[1].copy_(one(k, k_weight))
        return out

    @staticmethod
    def modulated_rmsnorm(x, scale, eps=1e-6, *, exact_mode=True):
        return genmo_modulated_rmsnorm(x, scale, eps)  # one rounding in both modes

    @staticmethod
    def residual_tanh_gated_rmsnorm(x, x_res, gate, eps=1e-6, *, exact_mode=True):
        if exact_mode:
            return genmo_residual_tanh_gated_rmsnorm(x, x_res, gate, eps)
        xf = x_res.float()
        branch = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * torch.tanh(gate.float()).unsqueeze(1)
        return (x.float() + branch).to(x.dtype)

    @staticmethod
    def head_gate(x, logits, *, scale=2.0, exact_mode=True):
        """LTX-2's gated attention: ``x * (scale * sigmoid(logits))`` per head, as
        its processor (each op rounded to x's dtype), or in float32 with one rounding."""
        heads = x.unflatten(-1, (logits.shape[-1], -1))
        if exact_mode:
            return (heads * (scale * torch.sigmoid(logits)).unsqueeze(-1)).flatten(-2)
        return (heads.float() * (scale * torch.sigmoid(logits.float())).unsqueeze(-1)).flatten(-2).to(x.dtype)

    @staticmethod
    def swiglu(input, *, silu_half="first", fast=False):
        first, second = input.chunk(2, dim=-1)
        return F.silu(first) * second if silu_half == "first" else first * F.silu(second)


OP_NAMES = ("rmsnorm", "adaln_rmsnorm", "gated_residual", "gated_residual_rmsnorm", "gelu_tanh", "linear_gelu",
            "apply_rotary_emb", "qk_rmsnorm_rope", "ltx_rope_cos_sin", "modulated_rmsnorm",
            "residual_tanh_gated_rmsnorm", "swiglu", "adaln_layernorm", "gated_residual_layernorm", "head_gate",
            "quantize_fp8", "gelu_tanh_fp8", "linear_fp8", "gated_residual_fp8", "adaln_layernorm_fp8",
            "gated_residual_layernorm_fp8", "adaln_rmsnorm_fp8", "gated_residual_rmsnorm_fp8")


class RecordingKernel:
    """Counts the calls of each op of ``inner`` (another kernel API)."""

    def __init__(self, inner):
        if hasattr(inner, "layers"):
            self.layers = inner.layers
        if hasattr(inner, "Fp8Linear"):
            self.Fp8Linear = inner.Fp8Linear  # a class: what the FP8 paths test against
        self.calls = collections.Counter()
        for name in OP_NAMES:
            if hasattr(inner, name):
                setattr(self, name, self._recorded(name, getattr(inner, name)))

    def _recorded(self, name, fn):
        def call(*args, **kwargs):
            self.calls[name] += 1
            return fn(*args, **kwargs)
        return call


class NoBackward(RuntimeError):
    """Stands for ltx_kernels.NoBackwardError in :class:`TrainingKernel`."""


class TrainingKernel(RecordingKernel):
    """A kernel as the built one behaves under autograd: the ops named in
    ``differentiable`` (its ``DIFFERENTIABLE``) are recorded (here: the
    reference's formulas, differentiable torch code); any other op raises
    :class:`NoBackward` at a call autograd would record, as the built ops
    refuse. Counts the calls that reach it, and those that autograd records."""

    def __init__(self, differentiable=(), inner=None):
        inner = inner or ReferenceKernel()
        self.DIFFERENTIABLE = frozenset(differentiable)
        self.recorded = collections.Counter()
        super().__init__(inner)
        for name in OP_NAMES:
            if hasattr(self, name):
                setattr(self, name, self._refusing(name, getattr(self, name)))

    def _refusing(self, name, fn):
        def call(*args, **kwargs):
            tensors = [*args, *kwargs.values()]
            if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
                if name not in self.DIFFERENTIABLE:
                    raise NoBackward(f"{name} has no backward")
                self.recorded[name] += 1
            return fn(*args, **kwargs)
        return call


@pytest.fixture
def marked():
    """diffusers' LTX classes marked for kernels.kernelize during one test (the
    marks are class attributes, so they are taken off again afterwards)."""
    from ltx_kernels_diffusers.kernelize import LAYER_CLASSES, mark_ltx_layers

    mark_ltx_layers()
    yield
    for cls, _, _ in LAYER_CLASSES:
        del cls.kernel_layer_name, cls.kernel_condition
