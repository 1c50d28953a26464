"""The references themselves behave as model-ops.md describes (CPU)."""

import torch

from ltx_dev.reference.numerics import ulp_distance
from ltx_dev.reference.rmsnorm import diffusers_rms_norm, rms_norm_backward_f64, rms_norm_f64, torch_rms_norm


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


def test_float64_backward_matches_autograd_of_the_float64_formula():
    x = torch.randn(3, 5, 24, dtype=torch.float64, requires_grad=True)
    w = torch.randn(24, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(3, 5, 24, dtype=torch.float64)
    rms_norm_f64(x, w, 1e-6).backward(dy)
    dx, dw = rms_norm_backward_f64(dy, x.detach(), w.detach(), 1e-6)
    torch.testing.assert_close(dx, x.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dw, w.grad, rtol=1e-12, atol=1e-12)
    assert rms_norm_backward_f64(dy, x.detach(), None, 1e-6)[1] is None


def test_float64_backward_weight_grad_uses_the_rounded_normalised_value_in_diffusers_rounding():
    x = (torch.randn(64, 32) * 3).to(torch.bfloat16)
    w, dy = torch.randn(32).to(torch.bfloat16), torch.randn(64, 32).to(torch.bfloat16)
    dx_t, dw_t = rms_norm_backward_f64(dy, x, w, 1e-6, "torch")
    dx_d, dw_d = rms_norm_backward_f64(dy, x, w, 1e-6, "diffusers")
    assert torch.equal(dx_t, dx_d)  # roundings are the identity for dx
    assert not torch.equal(dw_t, dw_d)
    # bf16 rounding of n moves each term by <= 2^-9 relative
    assert ((dw_t - dw_d).abs() <= (dy.double().abs() * rms_norm_f64(x, None, 1e-6).abs()).sum(0) * 2**-9).all()
