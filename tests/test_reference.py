"""The references themselves behave as model-ops.md describes (CPU)."""

import torch

from ltx_dev.reference.numerics import ulp_distance
from ltx_dev.reference.rmsnorm import diffusers_rms_norm, rms_norm_f64, torch_rms_norm


def test_torch_reference_equals_nn_rmsnorm_bitwise_on_cpu():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2048, generator=g).bfloat16()
    m = torch.nn.RMSNorm(2048, eps=1e-5).bfloat16()
    with torch.no_grad():
        m.weight.copy_(torch.randn(2048, generator=g))
        assert torch.equal(torch_rms_norm(x, m.weight, 1e-5), m(x))


def test_diffusers_and_torch_roundings_differ_with_a_bf16_weight():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 2048, generator=g).bfloat16()
    w = (torch.randn(2048, generator=g) * 0.5 + 1).bfloat16()
    a, b = diffusers_rms_norm(x, w, 1e-6), torch_rms_norm(x, w, 1e-6)
    frac = (a != b).float().mean().item()
    assert 0.05 < frac < 0.6, frac  # model-ops.md: about a quarter of elements
    assert ulp_distance(a, b).max() <= 2


def test_roundings_agree_without_weight_and_match_float64():
    x = torch.randn(32, 1000, generator=torch.Generator().manual_seed(2)).bfloat16()
    a, b = diffusers_rms_norm(x, None, 1e-6), torch_rms_norm(x, None, 1e-6)
    assert torch.equal(a, b)
    assert torch.allclose(a.double(), rms_norm_f64(x, None, 1e-6), rtol=8e-3, atol=0)


def test_diffusers_with_fp32_weight_returns_fp32():
    x = torch.randn(4, 64).bfloat16()
    assert diffusers_rms_norm(x, torch.ones(64), 1e-6).dtype == torch.float32


def test_ulp_distance_counts_representable_steps():
    one = torch.tensor([1.0], dtype=torch.bfloat16)
    nxt = torch.nextafter(one.float(), torch.tensor([2.0])).bfloat16()  # rounds back to 1.0
    assert ulp_distance(one, nxt).item() == 0
    step = torch.tensor([1.0078125], dtype=torch.bfloat16)  # 1 + 2^-7, next bf16 after 1
    assert ulp_distance(one, step).item() == 1
    assert ulp_distance(-one, one).item() == 2 * 0x3F80
