"""Shared by the integration tests: LTX-Video configs and inputs, a relative
error, and a pure-PyTorch stand-in for the kernel's op API that computes each
op the way diffusers' eager code does (so on the CPU an optimised model must
equal the stock one bit for bit: any wiring mistake shows)."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F

from ltx_dev.reference.rmsnorm import diffusers_rms_norm

# Small enough for CPU CI; hidden 16 is not a multiple of 6, so the RoPE tables
# have identity channels, as LTX's 2048 does.
TINY_CONFIG = dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8,
                   cross_attention_dim=16, num_layers=3, caption_channels=12)
TINY_VIDEO = dict(batch=2, frames=2, height=3, width=4, text=5)
# LTX-Video 2B (the default config), 49 frames at 512x768: latent 7x16x24, seq 2688, text 128, batch 2 (CFG).
LTX_2B_VIDEO = dict(batch=2, frames=7, height=16, width=24, text=128)
ROPE_SCALE = (8 / 25, 32, 32)  # (VAE temporal ratio / frame rate, spatial ratio, spatial ratio), as the pipeline


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


def rel_l2(got: torch.Tensor, expected: torch.Tensor) -> float:
    """||got - expected|| / ||expected||, in float64."""
    got, expected = got.double(), expected.double()
    return ((got - expected).norm() / expected.norm()).item()


def _rotate(x, cos, sin):
    """diffusers' LTX apply_rotary_emb (transformer_ltx.py)."""
    x_real, x_imag = x.unflatten(2, (-1, 2)).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(2)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


class ReferenceKernel:
    """The functions of ltx_kernels the fused forwards call, computed as the
    eager model code computes them (``exact_mode=True``), or in float32 with
    one rounding (``False``). ``layers`` (the fused forwards under test) and
    ``ltx_rope_cos_sin`` (pure PyTorch) are the built kernel's own."""

    def __init__(self, kernel):
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
        if exact_mode:
            return x + y * gate if gate is not None else x + y
        return (x.float() + (y.float() * gate.float() if gate is not None else y.float())).to(x.dtype)

    @classmethod
    def gated_residual_rmsnorm(cls, x, y, gate, scale, shift, eps=1e-6, *, weight=None, exact_mode=True):
        x_new = cls.gated_residual(x, y, gate, exact_mode=exact_mode)
        return cls.adaln_rmsnorm(x_new, weight, scale, shift, eps, exact_mode=exact_mode), x_new

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
                        rotation="interleaved", rounding="torch", exact_mode=True):
        assert head_dim is None and rotation == "interleaved"
        if exact_mode:
            return (_rotate(cls.rmsnorm(q, q_weight, eps, rounding=rounding), cos, sin),
                    _rotate(cls.rmsnorm(k, k_weight, eps, rounding=rounding), cos, sin))

        def norm_f32(x, w):
            return cls.rmsnorm(x.float(), None if w is None else w.float(), eps, rounding="torch")

        return (_rotate(norm_f32(q, q_weight), cos, sin).to(q.dtype),
                _rotate(norm_f32(k, k_weight), cos, sin).to(k.dtype))


OP_NAMES = ("rmsnorm", "adaln_rmsnorm", "gated_residual", "gated_residual_rmsnorm", "gelu_tanh", "linear_gelu",
            "apply_rotary_emb", "qk_rmsnorm_rope", "ltx_rope_cos_sin")


class RecordingKernel:
    """Counts the calls of each op of ``inner`` (another kernel API)."""

    def __init__(self, inner):
        self.layers = inner.layers
        self.calls = collections.Counter()
        for name in OP_NAMES:
            setattr(self, name, self._recorded(name, getattr(inner, name)))

    def _recorded(self, name, fn):
        def call(*args, **kwargs):
            self.calls[name] += 1
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
