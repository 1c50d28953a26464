"""LTX-Video RoPE tables against the real diffusers module (a test-only
dependency): bitwise equal for the LTX widths, with and without
interpolation scale, on the CPU (CI) and on the GPU when there is one."""

from __future__ import annotations

import pytest
import torch

try:
    from diffusers.models.transformers import transformer_ltx
except Exception as e:  # noqa: BLE001 - diffusers, or one of its own dependencies, is missing
    pytest.skip(f"diffusers is not importable here: {e!r}", allow_module_level=True)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SCALES = {"pipeline (8/25, 32, 32)": (8 / 25, 32, 32), "None (integer positions)": None,
          "tensor frame scale": (torch.tensor(0.32), 32.0, 32.0)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [2048, 4096, 96, 130])  # pad 2, pad 4, none, pad 4 with 21 frequencies
@pytest.mark.parametrize("scale", sorted(SCALES))
def test_tables_are_bitwise_diffusers(kernel, device, dim, scale):
    frames, height, width = 7, 16, 24
    module = transformer_ltx.LTXVideoRotaryPosEmbed(dim)
    hidden = torch.zeros(2, frames * height * width, dim, device=device)
    cos_ref, sin_ref = module(hidden, frames, height, width, SCALES[scale])
    cos, sin = kernel.ltx_rope_cos_sin(frames, height, width, SCALES[scale], dim, batch_size=2, device=device)
    assert cos.dtype == sin.dtype == torch.float32 and cos.device.type == device
    assert cos.shape == cos_ref.shape and torch.equal(cos, cos_ref) and torch.equal(sin, sin_ref)


def test_identity_channels_come_first_and_pairs_share_an_angle(kernel):
    cos, sin = kernel.ltx_rope_cos_sin(2, 3, 4, None, 2048)
    assert torch.equal(cos[..., :2], torch.ones_like(cos[..., :2]))
    assert torch.equal(sin[..., :2], torch.zeros_like(sin[..., :2]))
    assert torch.equal(cos[..., 2::2], cos[..., 3::2]) and torch.equal(sin[..., 2::2], sin[..., 3::2])


def test_batch_dim_is_a_view(kernel):
    cos, _ = kernel.ltx_rope_cos_sin(2, 3, 4, (0.32, 32, 32), 96, batch_size=3)
    assert cos.shape == (3, 24, 96) and cos.stride(0) == 0

