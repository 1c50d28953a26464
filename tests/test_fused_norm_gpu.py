"""The fused norm family on the GPU (issue 3, items 1-4): numerics against
float64, exact mode against the models' own eager chains (bitwise where the
mean square is exact, so that no reduction order can matter), both kernel
paths, strided and broadcast operands, bad input, compile, opcheck, CUDA
graphs. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from ltx_dev import reference as ref

from .backward_support import graph_replays_training_step, launched_kernels, nan_filled_allocations, rel_l2
from .conftest import cuda
from .stream_chain import assert_chain_sees_each_output, residual_chain

pytestmark = cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
HALF = [torch.bfloat16, torch.float16]
EPS = 1e-6
# |y - ref64| / max(|ref64|, 1): one rounding of T plus float32 error.
TOL = {torch.bfloat16: 2 * 2**-8, torch.float16: 2 * 2**-11, torch.float32: 2e-5}
VECTORIZED, FALLBACK = 0, 1
# [B, S, D] shapes: LTX width, odd widths (fallback), short rows, one element.
SHAPES = [(2, 64, 2048), (3, 17, 1000), (1, 5, 4096), (2, 7, 3072), (2, 3, 8), (1, 1, 1), (2, 9, 130), (1, 4, 16384)]


def rand(shape, dtype, seed, scale=1.0, offset=0.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") * scale + offset).to(dtype)


def grid(shape, dtype, seed, step, limit):
    """Random multiples of `step` in [-limit, limit], never all zero: inputs
    whose squares and their sums are exact in float32 in any order."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = int(limit / step)
    v = torch.randint(-n, n + 1, shape, generator=g, device="cuda").float() * step
    v[..., 0] = limit  # no zero row
    return v.to(dtype)


def poisoned(like):
    return torch.full(like.shape, float("nan"), dtype=like.dtype, device=like.device)


def mod(form, B, S, D, dtype, seed, scale=0.5):
    """A modulation tensor in one of the accepted broadcast forms."""
    shape = {"[D]": (D,), "[B,D]": (B, D), "[B,1,D]": (B, 1, D), "[B,S,D]": (B, S, D)}[form]
    return rand(shape, dtype, seed, scale)


def close_to(y, expected64, dtype, terms=()):
    """|y - expected| within TOL of max(|expected|, 1, |each term|): exact mode
    rounds intermediate terms (e.g. T(y * gate) before the add), so its error
    scales with the largest term, not with the possibly cancelled result."""
    assert not torch.isnan(y).any(), "an output element was not written"
    scale = expected64.abs().clamp_min(1.0)
    for t in terms:
        scale = torch.maximum(scale, t.abs())
    err = (y.double() - expected64).abs() / scale
    # Exact mode rounds up to four times (n, 1 + scale, the product, the sum).
    assert err.max().item() <= TOL[dtype] * (2 if terms else 1), err.max().item()


def mostly_bitwise(ours, eager, max_fraction=1e-3):
    """Equal to the eager chain except where the reduction order of the mean
    square moved r by an ulp (a tiny fraction of elements)."""
    differ = (ours != eager).float().mean().item()
    assert differ <= max_fraction, differ


# --- adaln_rmsnorm -------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["[D]", "[B,D]", "[B,1,D]", "[B,S,D]"])
@pytest.mark.parametrize("mod_fp32", [False, True])
def test_adaln_fast_mode_matches_float64(kernel, dtype, form, mod_fp32):
    mdt = torch.float32 if mod_fp32 else dtype
    for i, (B, S, D) in enumerate(SHAPES):
        x = rand((B, S, D), dtype, i, 2, 0.3)
        w = rand((D,), dtype, 100 + i, 0.2, 1) if i % 2 else None
        scale, shift = mod(form, B, S, D, mdt, 200 + i), mod(form, B, S, D, mdt, 300 + i)
        out = poisoned(x)
        kernel.ops.adaln_rmsnorm(out, x, w, scale, shift, EPS, False)
        close_to(out, ref.adaln_f64(x, w, scale, shift, EPS), dtype)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("form", ["[B,D]", "[B,1,D]", "[B,S,D]"])
@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize("D", [2048, 1000, 4096])
def test_adaln_exact_mode_is_bitwise_the_ltx_eager_chain(kernel, dtype, form, with_weight, D):
    B, S = 2, 96
    x = grid((B, S, D), dtype, D, 1 / 8, 4)
    w = rand((D,), dtype, 1, 0.2, 1) if with_weight else None
    scale, shift = mod(form, B, S, D, dtype, 2), mod(form, B, S, D, dtype, 3)
    out = poisoned(x)
    kernel.ops.adaln_rmsnorm(out, x, w, scale, shift, EPS, True)
    eager = ref.ltx_adaln_eager(x, w, scale, shift, EPS)
    assert torch.equal(out, eager), (out != eager).sum().item()
    # The fast mode is not: the intermediate roundings matter (model-ops.md: 37%).
    fast = kernel.adaln_rmsnorm(x, w, scale, shift, EPS, exact_mode=False)
    assert (fast != eager).float().mean().item() > 0.05


@pytest.mark.parametrize("dtype", HALF)
def test_adaln_exact_mode_on_random_inputs_differs_from_eager_only_by_reduction_order(kernel, dtype):
    x = rand((2, 2688, 2048), dtype, 5, 2, 0.3)
    scale, shift = rand((2, 1, 2048), dtype, 6, 0.5), rand((2, 1, 2048), dtype, 7, 0.5)
    out = kernel.adaln_rmsnorm(x, None, scale, shift, EPS)
    mostly_bitwise(out, ref.ltx_adaln_eager(x, None, scale, shift, EPS))


def test_adaln_without_shift_and_float32_is_the_float32_chain(kernel):
    x = rand((2, 33, 512), torch.float32, 1)
    scale = rand((2, 1, 512), torch.float32, 2)
    out = kernel.adaln_rmsnorm(x, None, scale, None, EPS)
    torch.testing.assert_close(out, ref.ltx_adaln_eager(x, None, scale, None, EPS), rtol=2e-6, atol=2e-6)


# --- rmsnorm_residual ----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rounding", ["torch", "diffusers"])
def test_rmsnorm_residual_matches_references(kernel, dtype, rounding):
    for i, (B, S, D) in enumerate(SHAPES):
        x, r = rand((B, S, D), dtype, i, 2), rand((B, S, D), dtype, 50 + i)
        w = rand((D,), dtype, 100 + i, 0.2, 1) if i % 2 else None
        out, res = poisoned(x), poisoned(x)
        kernel.ops.rmsnorm_residual(out, res, x, r, w, EPS, rounding == "diffusers")
        assert torch.equal(res, x + r)  # one rounding of the sum, as eager
        close_to(out, ref.rms_norm_f64(res, w, EPS), dtype)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rounding", ["torch", "diffusers"])
def test_rmsnorm_residual_is_bitwise_the_module_it_replaces(kernel, dtype, rounding):
    x, r = grid((64, 2048), dtype, 1, 1 / 8, 2), grid((64, 2048), dtype, 2, 1 / 8, 2)
    w = rand((2048,), dtype, 3, 0.2, 1)
    out, res = kernel.rmsnorm_residual(x, r, w, EPS, rounding=rounding)
    norm = ref.diffusers_rms_norm if rounding == "diffusers" else ref.torch_rms_norm
    assert torch.equal(res, x + r)
    assert torch.equal(out, norm(x + r, w, EPS))


# --- gated residual and the LTX seam ----------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["[B,D]", "[B,1,D]", "[B,S,D]", None])
def test_gated_residual_exact_is_bitwise_eager(kernel, dtype, form):
    for i, (B, S, D) in enumerate(SHAPES):
        x, y = rand((B, S, D), dtype, i, 2), rand((B, S, D), dtype, 10 + i)
        gate = mod(form, B, S, D, dtype, 20 + i) if form else None
        out = poisoned(x)
        kernel.ops.gated_residual(out, x, y, gate, True)
        assert torch.equal(out, ref.gated_residual_eager(x, y, gate))


@pytest.mark.parametrize("dtype", HALF)
def test_gated_residual_fast_rounds_once_and_float32_gate_is_wan(kernel, dtype):
    B, S, D = 2, 300, 2048
    x, y, gate = rand((B, S, D), dtype, 1, 2), rand((B, S, D), dtype, 2), rand((B, 1, D), dtype, 3)
    fast = kernel.gated_residual(x, y, gate, exact_mode=False)
    once = (x.double() + y.double() * gate.double()).to(dtype)
    assert (fast != once).float().mean().item() < 1e-4  # float32 FMA vs float64: ties only
    assert (fast != ref.gated_residual_eager(x, y, gate)).float().mean().item() > 0.01
    g32 = rand((B, 1, D), torch.float32, 4)
    wan = ref.wan_gated_residual(x, y, g32)
    assert torch.equal(kernel.gated_residual(x, y, g32), wan)  # exact: Wan's chain bit for bit
    assert (kernel.gated_residual(x, y, g32, exact_mode=False) != wan).float().mean().item() < 1e-3  # FMA


@pytest.mark.parametrize("words", [0, 1, 2, 4])
@pytest.mark.parametrize("form", ["[B,1,D]", "[B,S,D]", None])
def test_gated_residual_flat_and_row_kernels_are_both_bitwise_eager(kernel, tuning, words, form):
    # Contiguous rows take the flat kernel (`fused_norm.flat_words` words per thread, 0 = the
    # row kernel); a [:, :S] slice of a longer sequence always takes the row kernel.
    tuning({"fused_norm.flat_words": words})
    for i, (B, S, D) in enumerate([(2, 300, 2048), (3, 7, 3072), (1, 5, 64), (2, 33, 1000)]):
        x, y = rand((B, S, D), torch.bfloat16, i, 2), rand((B, S, D), torch.bfloat16, 10 + i)
        gate = mod(form, B, S, D, torch.bfloat16, 20 + i) if form else None
        expected = ref.gated_residual_eager(x, y, gate)
        big_x = torch.zeros(B, S + 3, D, dtype=x.dtype, device="cuda")
        big_x[:, :S] = x
        for x_in in (x, big_x[:, :S]):
            out = poisoned(x)
            kernel.ops.gated_residual(out, x_in, y, gate, True)
            assert torch.equal(out, expected)


def test_gated_residual_in_place_writes_x(kernel):
    x, y, gate = rand((2, 100, 2048), torch.bfloat16, 1), rand((2, 100, 2048), torch.bfloat16, 2), \
        rand((2, 1, 2048), torch.bfloat16, 3)
    expected = ref.gated_residual_eager(x, y, gate)
    ptr = x.data_ptr()
    got = kernel.gated_residual(x, y, gate, inplace=True)
    assert got is x and x.data_ptr() == ptr and torch.equal(x, expected)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("D", [2048, 4096, 1000])
def test_seam_exact_is_bitwise_gated_residual_then_ltx_adaln(kernel, dtype, D):
    B, S = 2, 64
    x = grid((B, S, D), dtype, 1, 1 / 4, 2)
    y = grid((B, S, D), dtype, 2, 1 / 4, 1)
    gate = (2.0 ** -torch.randint(1, 3, (B, 1, D), device="cuda").float()).to(dtype)  # y * gate exact
    scale, shift = rand((B, 1, D), dtype, 4, 0.5), rand((B, 1, D), dtype, 5, 0.5)
    out, x_new = kernel.gated_residual_rmsnorm(x, y, gate, scale, shift, EPS)
    expected_x = ref.gated_residual_eager(x, y, gate)
    assert torch.equal(x_new, expected_x)
    assert torch.equal(out, ref.ltx_adaln_eager(expected_x, None, scale, shift, EPS))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("exact", [True, False])
def test_seam_matches_float64(kernel, dtype, exact):
    for i, (B, S, D) in enumerate(SHAPES):
        x, y = rand((B, S, D), dtype, i, 2), rand((B, S, D), dtype, 10 + i)
        gate, scale, shift = (rand((B, 1, D), dtype, 20 + i + k, 0.5) for k in range(3))
        out, x_new = poisoned(x), poisoned(x)
        kernel.ops.gated_residual_rmsnorm(out, x_new, x, y, gate, None, scale, shift, EPS, exact)
        yg = y.double() * gate.double()
        close_to(x_new, x.double() + yg, dtype, terms=(yg,) if exact else ())
        n = ref.rms_norm_f64(x_new, None, EPS) * (1 + scale.double())
        close_to(out, ref.adaln_f64(x_new, None, scale, shift, EPS), dtype, terms=(n,) if exact else ())


def test_seam_random_inputs_exact_differs_from_eager_only_by_reduction_order(kernel):
    B, S, D = 2, 2688, 2048
    x, y = rand((B, S, D), torch.bfloat16, 1, 2), rand((B, S, D), torch.bfloat16, 2)
    gate, scale, shift = (rand((B, 1, D), torch.bfloat16, 3 + k, 0.5) for k in range(3))
    out, x_new = kernel.gated_residual_rmsnorm(x, y, gate, scale, shift, EPS)
    assert torch.equal(x_new, ref.gated_residual_eager(x, y, gate))
    mostly_bitwise(out, ref.ltx_adaln_eager(x_new, None, scale, shift, EPS))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("prefetch", [None, 0, 1])
def test_kernels_compiled_for_ltx_operands_equal_the_general_kernels(dev_kernel, tuning, dtype, exact, prefetch):
    """LTX's operand set (gate, scale, shift, no weight) takes kernels with those operands compiled
    in; the `fused_norm.general_operands` override forces the general kernels, `fused_norm.prefetch`
    picks the kernel with or without next-row loads. Every pair must agree bit for bit, over widths
    that take 1-2 words per thread at every row width and rows spread over many passes."""
    from ltx_dev.tuning import override

    kernel = dev_kernel
    if prefetch is not None:
        tuning({"fused_norm.prefetch": prefetch})
    for i, (B, S, D) in enumerate([(3, 4097, 2048), (2, 300, 4096), (2, 77, 3072), (3, 50, 1536), (2, 9, 256)]):
        x, y = rand((B, S, D), dtype, i, 2), rand((B, S, D), dtype, 10 + i)
        gate, scale, shift = (rand((B, 1, D), dtype, 20 + i + k, 0.5) for k in range(3))
        calls = {
            "adaln": lambda: kernel.adaln_rmsnorm(x, None, scale, shift, EPS, exact_mode=exact),
            "seam": lambda: kernel.gated_residual_rmsnorm(x, y, gate, scale, shift, EPS, exact_mode=exact),
        }
        for name, call in calls.items():
            ltx = call()
            with override(kernel, {"fused_norm.general_operands": 1}):
                general = call()
            for got, want in zip(ltx if isinstance(ltx, tuple) else (ltx,),
                                 general if isinstance(general, tuple) else (general,)):
                assert not torch.isnan(got).any()
                assert torch.equal(got, want), (name, (B, S, D))


# --- Mochi ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("D", [3072, 1536, 1000])
def test_mochi_exact_mode_is_bitwise_genmo(kernel, dtype, D):
    B, S = 2, 128
    x = rand((B, S, D), dtype, 1, 2)
    x_res = grid((B, S, D), dtype, 2, 1 / 8, 4)
    gate, scale = rand((B, D), dtype, 3), rand((B, D), dtype, 4, 0.5)
    out = kernel.residual_tanh_gated_rmsnorm(x, x_res, gate, EPS)
    assert torch.equal(out, ref.genmo_residual_tanh_gated_rmsnorm(x, x_res, gate, EPS))
    mod = kernel.modulated_rmsnorm(x_res, scale, EPS)
    assert torch.equal(mod, ref.genmo_modulated_rmsnorm(x_res, scale, EPS))
    assert torch.equal(kernel.modulated_rmsnorm(x_res, scale, EPS, exact_mode=False), mod)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("exact", [True, False])
def test_mochi_ops_match_float64(kernel, dtype, exact):
    for i, (B, S, D) in enumerate(SHAPES):
        x, x_res = rand((B, S, D), dtype, i, 2), rand((B, S, D), dtype, 10 + i, 2)
        gate, scale = rand((B, D), dtype, 20 + i), rand((B, D), dtype, 30 + i, 0.5)
        out = poisoned(x)
        kernel.ops.residual_tanh_gated_rmsnorm(out, x, x_res, gate, EPS, exact)
        n64 = ref.rms_norm_f64(x_res, None, EPS)
        branch = n64 * torch.tanh(gate.double()).unsqueeze(1)
        close_to(out, x.double() + branch, dtype, terms=(branch,) if exact else ())
        mod = poisoned(x)
        kernel.ops.modulated_rmsnorm(mod, x_res, scale, EPS, 1.0)
        close_to(mod, n64 * (1 + scale.double().unsqueeze(1)), dtype)


@pytest.mark.parametrize("D", [3072, 1536, 2048])
def test_rows_spread_over_many_passes_equal_each_sample_alone(kernel, D):
    """Each block walks ~10-30 rows of several samples (persistent grid; an
    odd S puts two-row blocks across a sample boundary): no state carried from
    one row to the next (the alternating reduction buffers, Mochi's tanh(gate)
    held per sample) may leak into another row."""
    B, S = 3, 4097
    x, y = rand((B, S, D), torch.bfloat16, 1, 2), rand((B, S, D), torch.bfloat16, 2, 2)
    gate2, gate3 = rand((B, D), torch.bfloat16, 3), rand((B, 1, D), torch.bfloat16, 4)
    scale, shift, w = rand((B, 1, D), torch.bfloat16, 5, 0.5), rand((B, 1, D), torch.bfloat16, 6), \
        rand((D,), torch.bfloat16, 7)
    ops = {
        "mochi exact": lambda b: kernel.residual_tanh_gated_rmsnorm(x[b], y[b], gate2[b], EPS),
        "mochi fast": lambda b: kernel.residual_tanh_gated_rmsnorm(x[b], y[b], gate2[b], EPS, exact_mode=False),
        "seam": lambda b: kernel.gated_residual_rmsnorm(x[b], y[b], gate3[b], scale[b], shift[b], EPS),
        "rmsnorm_residual": lambda b: kernel.rmsnorm_residual(x[b], y[b], w, EPS),
        "adaln": lambda b: kernel.adaln_rmsnorm(x[b], w, scale[b], shift[b], EPS),
        "adaln fast": lambda b: kernel.adaln_rmsnorm(x[b], w, scale[b], shift[b], EPS, exact_mode=False),
        "seam fast": lambda b: kernel.gated_residual_rmsnorm(x[b], y[b], gate3[b], scale[b], shift[b], EPS,
                                                             exact_mode=False),
        "mochi modulated": lambda b: kernel.modulated_rmsnorm(x[b], gate2[b], EPS),
    }
    for name, op in ops.items():
        whole = op(slice(None))
        for b in range(B):
            alone = op(slice(b, b + 1))
            for got, want in zip(whole if isinstance(whole, tuple) else (whole,),
                                 alone if isinstance(alone, tuple) else (alone,)):
                assert torch.equal(got[b], want[0]), (name, b)
    out = kernel.residual_tanh_gated_rmsnorm(x, grid((B, S, D), torch.bfloat16, 8, 1 / 8, 4), gate2, EPS)
    assert torch.equal(out, ref.genmo_residual_tanh_gated_rmsnorm(x, grid((B, S, D), torch.bfloat16, 8, 1 / 8, 4),
                                                                  gate2, EPS))


def test_back_to_back_fused_ops_see_each_others_output_with_and_without_dependent_launch(kernel, launch_mode):
    """Each op reads what the one before wrote (eagerly and in a CUDA graph):
    equal to the same chain run one synchronised op at a time."""
    B, S, D = 2, 8160, 2048
    x, y = rand((B, S, D), torch.bfloat16, 1, 2), rand((B, S, D), torch.bfloat16, 2, 2)
    gate, scale, shift = rand((B, 1, D), torch.bfloat16, 3), rand((B, 1, D), torch.bfloat16, 4, 0.5), \
        rand((B, 1, D), torch.bfloat16, 5)

    steps = [lambda h, n: kernel.gated_residual_rmsnorm(h, n, gate, scale, shift, EPS),
             lambda h, n: kernel.rmsnorm_residual(n, h, None, EPS),
             lambda h, n: (kernel.adaln_rmsnorm(n, None, scale, shift, EPS), h),
             lambda h, n: (kernel.residual_tanh_gated_rmsnorm(h, n, gate[:, 0], EPS), h)]
    assert_chain_sees_each_output(residual_chain(steps, x, y))


def test_mochi_random_inputs_exact_differs_from_genmo_only_by_reduction_order(kernel):
    B, S, D = 2, 2048, 3072
    x, x_res = rand((B, S, D), torch.bfloat16, 1, 2), rand((B, S, D), torch.bfloat16, 2, 2)
    gate = rand((B, D), torch.bfloat16, 3)
    mostly_bitwise(kernel.residual_tanh_gated_rmsnorm(x, x_res, gate, EPS),
                   ref.genmo_residual_tanh_gated_rmsnorm(x, x_res, gate, EPS))


def test_mochi_modulated_layer_is_diffusers_mochi_modulated_rmsnorm(kernel):
    layer = kernel.layers.MochiModulatedRMSNorm()
    layer.eps = 1e-6
    x = grid((2, 64, 3072), torch.bfloat16, 1, 1 / 8, 4)
    for multiplier in (1 + rand((2, 1, 3072), torch.bfloat16, 2, 0.5).float(),
                       torch.tanh(rand((2, 1, 3072), torch.bfloat16, 3)), None):
        assert torch.equal(layer(x, multiplier), ref.diffusers_mochi_modulated_rmsnorm(x, multiplier, 1e-6))


# --- paths, layouts, bad input -------------------------------------------------------

def test_aligned_inputs_take_the_vectorized_path_and_others_the_fallback(dev_kernel):
    kernel = dev_kernel
    x = rand((2, 8, 2048), torch.bfloat16, 1)
    out = torch.empty_like(x)
    s = rand((2, 1, 2048), torch.bfloat16, 2)
    assert kernel.ops.fused_norm_path(out, x, None, s) == VECTORIZED
    assert kernel.ops.fused_norm_path(out, x, x, s) == VECTORIZED
    odd = rand((2, 8, 2047), torch.bfloat16, 3)
    assert kernel.ops.fused_norm_path(torch.empty_like(odd), odd, None, None) == FALLBACK
    shifted = torch.empty(2 * 8 * 2048 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(2, 8, 2048)
    assert kernel.ops.fused_norm_path(out, shifted, None, None) == FALLBACK
    s_shifted = torch.empty(2 * 2048 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(2, 1, 2048)
    assert kernel.ops.fused_norm_path(out, x, None, s_shifted) == FALLBACK


@pytest.mark.parametrize("exact", [True, False])
def test_misaligned_and_strided_operands_give_the_same_result(kernel, exact):
    B, S, D = 2, 50, 2048
    x, y = rand((B, S, D), torch.bfloat16, 1, 2), rand((B, S, D), torch.bfloat16, 2)
    gate, scale, shift = (rand((B, 1, D), torch.bfloat16, 3 + k, 0.5) for k in range(3))
    expected = kernel.gated_residual_rmsnorm(x, y, gate, scale, shift, EPS, exact_mode=exact)

    def misaligned(t):
        buf = torch.empty(t.numel() + 1, dtype=t.dtype, device="cuda")[1:].view(t.shape)
        return buf.copy_(t)

    def in_bigger(t):  # a [:, :S] slice of a longer sequence: batch stride != S * D
        big = torch.zeros(t.shape[0], t.shape[1] + 7, t.shape[2], dtype=t.dtype, device="cuda")
        big[:, : t.shape[1]] = t
        return big[:, : t.shape[1]]

    def last_dim_strided(t):  # copied once by the binding
        big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device="cuda")
        big[..., ::2] = t
        return big[..., ::2]

    for f in (misaligned, in_bigger, last_dim_strided):
        got = kernel.gated_residual_rmsnorm(f(x), f(y), f(gate), f(scale), f(shift), EPS, exact_mode=exact)
        assert torch.equal(got[1], expected[1]), f.__name__
        if f is misaligned:  # the scalar path sums the squares in another order
            mostly_bitwise(got[0], expected[0])
        else:
            assert torch.equal(got[0], expected[0]), f.__name__
    # A per-token modulation that is an expanded view (stride 0 over seq) is a
    # broadcast, not a copy.
    out = kernel.adaln_rmsnorm(x, None, scale.expand(B, S, D), shift.expand(B, S, D), EPS, exact_mode=exact)
    assert torch.equal(out, kernel.adaln_rmsnorm(x, None, scale, shift, EPS, exact_mode=exact))


def test_two_dimensional_rows_take_per_row_modulation(kernel):
    x = rand((6, 512), torch.bfloat16, 1)
    scale, shift = rand((6, 512), torch.bfloat16, 2), rand((512,), torch.bfloat16, 3)
    got = kernel.adaln_rmsnorm(x, None, scale, shift, EPS)
    mostly_bitwise(got, ref.ltx_adaln_eager(x, None, scale, shift, EPS), max_fraction=0.01)


def test_zero_size_inputs_are_a_no_op(kernel):
    for shape in ((0, 2048), (2, 0, 2048), (2, 5, 0)):
        x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
        s = torch.empty(shape[0], shape[-1], dtype=torch.bfloat16, device="cuda")
        assert kernel.adaln_rmsnorm(x, None, s, s, EPS).shape == shape
        assert kernel.gated_residual_rmsnorm(x, x, s, s, s, EPS)[1].shape == shape
        assert kernel.gated_residual(x, x, None).shape == shape
    torch.cuda.synchronize()


BAD_CALLS = {
    "scale on the CPU": (lambda k, x, s: k.adaln_rmsnorm(x, None, s.cpu(), s, EPS), RuntimeError, "`scale` is on cpu"),
    "y of another dtype": (lambda k, x, s: k.gated_residual(x, x.half(), s), TypeError, "`y` has dtype Half"),
    "scale that does not broadcast": (lambda k, x, s: k.adaln_rmsnorm(x, None, s.expand(2, 2, 256).contiguous(),
                                                                      s, EPS), RuntimeError, "does not broadcast"),
    "a 4-D x": (lambda k, x, s: k.adaln_rmsnorm(x[None], None, s, s, EPS), RuntimeError, "reshape it first"),
    "a float32 weight": (lambda k, x, s: k.rmsnorm_residual(x, x, torch.ones(256, device="cuda")), TypeError,
                         "`weight` has dtype Float"),
    "mixed modulation dtypes": (lambda k, x, s: k.adaln_rmsnorm(x, None, s, s.float(), EPS), TypeError,
                                "must share one dtype"),
    "a wrong weight shape": (lambda k, x, s: k.rmsnorm_residual(x, x, torch.ones(255, device="cuda",
                                                                                 dtype=x.dtype)), RuntimeError,
                             "`weight` has shape [255]"),
    "negative eps": (lambda k, x, s: k.modulated_rmsnorm(x, s[:, 0], -1.0), RuntimeError, "`eps` must be >= 0"),
    "an unsupported dtype": (lambda k, x, s: k.adaln_rmsnorm(x.double(), None, s, s, EPS), TypeError,
                             "supported dtypes"),
    "a gate of another dtype (Mochi)": (lambda k, x, s: k.residual_tanh_gated_rmsnorm(x, x, s[:, 0].half()),
                                        TypeError, "`gate` has dtype Half"),
    "an overlapping out": (lambda k, x, s: k.ops.gated_residual(x[:, :1].expand_as(x), x, x, None, True),
                           RuntimeError, "internal overlap"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_raises_a_named_error_and_the_next_call_is_right(kernel, case):
    call, exc, message = BAD_CALLS[case]
    x, s = rand((2, 8, 256), torch.bfloat16, 1), rand((2, 1, 256), torch.bfloat16, 2)
    with pytest.raises(exc, match=__import__("re").escape(message)):
        call(kernel, x, s)
    torch.cuda.synchronize()
    assert torch.equal(kernel.gated_residual(x, x, s), ref.gated_residual_eager(x, x, s))


# --- compile, opcheck, graphs ----------------------------------------------------------

def _api_calls(k):
    B, S, D = 2, 16, 256
    x, y = rand((B, S, D), torch.bfloat16, 1), rand((B, S, D), torch.bfloat16, 2)
    g, s, sh = (rand((B, 1, D), torch.bfloat16, 3 + i) for i in range(3))
    return {
        "adaln_rmsnorm": (lambda x, y, g, s, sh: k.adaln_rmsnorm(x, None, s, sh, EPS)),
        "rmsnorm_residual": (lambda x, y, g, s, sh: k.rmsnorm_residual(x, y, None, EPS)),
        "gated_residual_rmsnorm": (lambda x, y, g, s, sh: k.gated_residual_rmsnorm(x, y, g, s, sh, EPS)),
        "gated_residual": (lambda x, y, g, s, sh: k.gated_residual(x, y, g)),
        "residual_tanh_gated_rmsnorm": (lambda x, y, g, s, sh: k.residual_tanh_gated_rmsnorm(x, y, g[:, 0], EPS)),
        "modulated_rmsnorm": (lambda x, y, g, s, sh: k.modulated_rmsnorm(x, s[:, 0], EPS)),
    }, (x, y, g, s, sh)


@pytest.mark.parametrize("name", ["adaln_rmsnorm", "rmsnorm_residual", "gated_residual_rmsnorm", "gated_residual",
                                  "residual_tanh_gated_rmsnorm", "modulated_rmsnorm"])
def test_torch_compile_fullgraph_and_cuda_graph_replay_match_eager(kernel, name):
    calls, args = _api_calls(kernel)
    compiled_and_graph_replay_match_eager(calls[name], args)


def compiled_and_graph_replay_match_eager(f, args):
    """f(*args) under torch.compile(fullgraph=True) is bitwise eager, and a CUDA graph of it
    replayed on new values of its inputs is bitwise a fresh eager call."""
    eager = f(*args)
    compiled = torch.compile(f, fullgraph=True)(*args)
    for a, b in zip(*(t if isinstance(t, tuple) else (t,) for t in (eager, compiled))):
        assert torch.equal(a, b)
    static = tuple(a.clone() for a in args)
    f(*static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = f(*static)
    for a, new in zip(static, (rand(a.shape, a.dtype, 99 + i) for i, a in enumerate(static))):
        a.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    expected = f(*static)
    for a, b in zip(*(t if isinstance(t, tuple) else (t,) for t in (captured, expected))):
        assert torch.equal(a, b)


def test_opcheck_every_fused_op(kernel):
    B, S, D = 2, 8, 256
    x, y = rand((B, S, D), torch.bfloat16, 1), rand((B, S, D), torch.bfloat16, 2)
    g, s, sh = (rand((B, 1, D), torch.bfloat16, 3 + i) for i in range(3))
    w = rand((D,), torch.bfloat16, 9)
    e = torch.empty_like
    o = kernel.ops
    cases = [
        (o.adaln_rmsnorm, (e(x), x, w, s, sh, EPS, True)),
        (o.adaln_rmsnorm, (e(x), x, None, s, None, EPS, False)),
        (o.rmsnorm_residual, (e(x), e(x), x, y, w, EPS, True)),
        (o.gated_residual_rmsnorm, (e(x), e(x), x, y, g, None, s, sh, EPS, True)),
        (o.gated_residual, (e(x), x, y, g, False)),
        (o.residual_tanh_gated_rmsnorm, (e(x), x, y, g[:, 0], EPS, True)),
        (o.modulated_rmsnorm, (e(x), x, s[:, 0], EPS, 1.0)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


# --- backward (issue 36) ------------------------------------------------------------------------------
# Every op through one table: its leaves (keyed as the registry's args, so that the registry's float64
# reference gives the exact grads), and the model's own eager code (what bf16/fp16 grads are held to).
# Modulation forms: per batch [B,1,D], per token [B,S,D], one row for all [D], and [1,S,D] (batches share
# a row: summed after the kernel).
from ltx_dev.registry import OPS as SPECS  # noqa: E402

MOD_FORMS = {"batch": lambda B, S, D: (B, 1, D), "token": lambda B, S, D: (B, S, D), "all": lambda B, S, D: (D,),
             "seq": lambda B, S, D: (1, S, D)}


def leaf(shape, dtype, seed, scale=1.0, offset=0.0):
    return rand(shape, dtype, seed, scale, offset).requires_grad_()


def bwd_args(name, shape, dtype, *, mod_dtype=None, form="batch", exact=True, seed=0, weight=True, shift=True,
             gate=True):
    """The op's args with every floating tensor a leaf that requires grad."""
    B, S, D = shape
    md = mod_dtype or dtype
    m = lambda k, **kw: leaf(MOD_FORMS[form](B, S, D), md, seed + k, **kw)  # noqa: E731
    x = leaf(shape, dtype, seed)
    w = leaf((D,), dtype, seed + 1, 0.2, 1.0) if weight else None
    if name == "rmsnorm_residual":
        return {"x": x, "residual": leaf(shape, dtype, seed + 2), "weight": w, "eps": EPS,
                "rounding": "diffusers" if exact else "torch"}
    if name == "adaln_rmsnorm":
        return {"x": x, "weight": w, "scale": m(3, scale=0.5), "shift": m(4) if shift else None, "eps": EPS,
                "exact": exact}
    if name == "gated_residual":
        return {"x": x, "y": leaf(shape, dtype, seed + 2), "gate": m(5) if gate else None, "in_place": False,
                "exact": exact}
    if name == "gated_residual_rmsnorm":
        return {"x": x, "y": leaf(shape, dtype, seed + 2), "gate": m(5) if gate else None, "weight": w,
                "scale": m(3, scale=0.5), "shift": m(4) if shift else None, "eps": EPS, "exact": exact}
    gate_or_scale = leaf((B, D), md, seed + 6, 0.5)  # Mochi's per-batch [B, D]
    if name == "residual_tanh_gated_rmsnorm":
        return {"x": x, "x_res": leaf(shape, dtype, seed + 2), "gate": gate_or_scale, "eps": EPS, "exact": exact}
    return {"x": x, "scale": gate_or_scale, "eps": EPS}


def eager_model(name, a):
    """The models' eager code for the op (LTX, Flux, Wan, genmo's Mochi)."""
    if name == "rmsnorm_residual":
        h = a["x"] + a["residual"]
        if a["rounding"] == "torch":
            return torch.nn.functional.rms_norm(h, h.shape[-1:], a["weight"], a["eps"]), h
        return ref.diffusers_rms_norm(h, a["weight"], a["eps"]), h
    if name == "adaln_rmsnorm":
        return (ref.ltx_adaln_eager(a["x"], a["weight"], a["scale"], a["shift"], a["eps"]),)
    if name in ("gated_residual", "gated_residual_rmsnorm"):
        gated = ref.wan_gated_residual if a["gate"] is not None and a["gate"].dtype != a["x"].dtype else \
            ref.gated_residual_eager
        h = gated(a["x"], a["y"], a["gate"])
        if name == "gated_residual":
            return (h,)
        return ref.ltx_adaln_eager(h, a["weight"], a["scale"], a["shift"], a["eps"]), h
    if name == "residual_tanh_gated_rmsnorm":
        return (ref.genmo_residual_tanh_gated_rmsnorm(a["x"], a["x_res"], a["gate"], a["eps"]),)
    return (ref.genmo_modulated_rmsnorm(a["x"], a["scale"], a["eps"]),)


def spec_of(name):
    return next(s for s in SPECS if s.api == name)


def leaves_of(a):
    return [v for v in a.values() if isinstance(v, torch.Tensor) and v.requires_grad]


def upstream(outputs, seed):
    return [rand(o.shape, o.dtype, seed + i) for i, o in enumerate(outputs)]


def grads_of(outputs, dys, a):
    return torch.autograd.grad(outputs, leaves_of(a), [d.to(o.dtype) for o, d in zip(outputs, dys)])


def ours(kernel, name, a):
    return tuple(spec_of(name).call(kernel, a))


def float64_grads(name, a, dys):
    a64 = {k: v.detach().double().requires_grad_() if isinstance(v, torch.Tensor) and v.requires_grad else v
           for k, v in a.items()}
    values = [e.value for e in spec_of(name).reference(a64)]
    return torch.autograd.grad(values, leaves_of(a64), [d.double() for d in dys])


BWD_OPS = ["rmsnorm_residual", "adaln_rmsnorm", "gated_residual", "gated_residual_rmsnorm",
           "residual_tanh_gated_rmsnorm", "modulated_rmsnorm"]
MODULATED = {"adaln_rmsnorm", "gated_residual", "gated_residual_rmsnorm"}  # take every MOD_FORMS form


def skip_other_forms(name, form):
    if form != "batch" and name not in MODULATED:
        pytest.skip("the op's modulation (if any) is Mochi's per-batch [B, D] only")


@pytest.mark.parametrize("name", BWD_OPS)
@pytest.mark.parametrize("form", sorted(MOD_FORMS))
@pytest.mark.parametrize("D", [8, 7])  # vectorized, scalar
def test_backward_gradcheck_float32(kernel, name, form, D):
    """Numerical vs our analytical Jacobian on float32 (central differences, eps 1e-3: fp32 rounding of O(1)
    outputs gives ~1e-4 relative error in a difference quotient, hence the tolerances). nondet_tol 0: the
    backward gives the same bits twice."""
    skip_other_forms(name, form)
    a = bwd_args(name, (2, 3, D), torch.float32, form=form, seed=D)
    names = [k for k, v in a.items() if isinstance(v, torch.Tensor) and v.requires_grad]

    def fn(*tensors):
        return ours(kernel, name, {**a, **dict(zip(names, tensors))})

    assert torch.autograd.gradcheck(fn, [a[k] for k in names], eps=1e-3, atol=2e-3, rtol=1e-2, nondet_tol=0.0)


@pytest.mark.parametrize("name", BWD_OPS)
@pytest.mark.parametrize("shape", [(2, 64, 2048), (3, 40, 1000), (2, 9, 130)])
@pytest.mark.parametrize("form", ["batch", "token", "seq"])
def test_float32_grads_match_the_float64_reference(kernel, name, shape, form):
    skip_other_forms(name, form)
    a = bwd_args(name, shape, torch.float32, form=form, seed=shape[-1], exact=False)
    outputs = ours(kernel, name, a)
    dys = upstream(outputs, seed=5)
    for g, r in zip(grads_of(outputs, dys, a), float64_grads(name, a, dys)):
        # float32 math: the row sums' and the column sums' rounding, relative to the largest grad
        assert (g.double() - r).abs().max().item() <= 2e-5 * max(r.abs().max().item(), 1.0)


# Relative L2 bound of our grads against float64: one rounding of the grad's dtype (2^-8 bf16, 2^-11
# fp16) with 2x room; and never worse than 1.1x the models' eager autograd.
GRAD_TOL = {torch.bfloat16: 2 * 2**-8, torch.float16: 2 * 2**-11}


@pytest.mark.parametrize("name", BWD_OPS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("mod_fp32", [False, True])
@pytest.mark.parametrize("exact", [True, False])
# (2, 2688, 256): LTX-Video 2B's rows, split to fill one wave (11 rows a block); (2, 8500, 1536): past 8192
# rows a batch, the large problems' split at Wan's width (fused_norm_config::bwd_large_blocks).
@pytest.mark.parametrize("shape", [(2, 700, 1536), (3, 40, 1000), (2, 64, 4096), (2, 2688, 256), (2, 8500, 1536)])
def test_half_grads_are_no_worse_than_eager_autograd_of_the_model(kernel, name, dtype, mod_fp32, exact, shape):
    if mod_fp32 and name == "rmsnorm_residual":
        pytest.skip("no modulation")
    a = bwd_args(name, shape, dtype, mod_dtype=torch.float32 if mod_fp32 else None, exact=exact, seed=len(name))
    outputs, theirs = ours(kernel, name, a), eager_model(name, a)
    dys = upstream(outputs, seed=11)
    got, eager = grads_of(outputs, dys, a), grads_of(theirs, dys, a)
    for arg, g, e, r in zip([k for k, v in a.items() if isinstance(v, torch.Tensor) and v.requires_grad], got, eager,
                            float64_grads(name, a, dys)):
        assert g.dtype == e.dtype and g.shape == e.shape, arg
        assert not torch.isnan(g).any(), arg
        err, eager_err = rel_l2(g, r), rel_l2(e, r)
        assert err <= max(GRAD_TOL[dtype], 1.1 * eager_err), (arg, err, eager_err)


@pytest.mark.parametrize("name", BWD_OPS)
@pytest.mark.parametrize("shape", [(2, 2688, 2048), (2, 9, 130), (2, 8500, 1536)])
def test_backward_is_bitwise_deterministic(kernel, name, shape):
    a = bwd_args(name, shape, torch.bfloat16, seed=3)
    dys = upstream(ours(kernel, name, a), seed=4)
    first = grads_of(ours(kernel, name, a), dys, a)
    for _ in range(2):
        again = grads_of(ours(kernel, name, a), dys, a)
        assert all(torch.equal(x, y) for x, y in zip(first, again))


@pytest.mark.parametrize("name", ["adaln_rmsnorm", "gated_residual_rmsnorm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_widest_vectorized_rows_with_every_reduced_grad_are_right(kernel, name, dtype):
    """The widest rows the vectorized kernel takes (1024 words: 8192 bf16, 4096 float32 columns) with
    weight, scale and shift (and gate) all summed over rows: a row of shared-memory sums each, 128 KB in
    bf16 (above the 48 KB a launch gets without opting in)."""
    D = 8192 if dtype == torch.bfloat16 else 4096
    a = bwd_args(name, (2, 40, D), dtype, seed=9, exact=False)
    outputs = ours(kernel, name, a)
    dys = upstream(outputs, seed=12)
    tol = GRAD_TOL.get(dtype, 1e-5)  # float32: the row and column sums' rounding
    for arg, g, r in zip([k for k, v in a.items() if isinstance(v, torch.Tensor) and v.requires_grad],
                         grads_of(outputs, dys, a), float64_grads(name, a, dys)):
        assert rel_l2(g, r) <= tol, arg


@pytest.mark.parametrize("name", BWD_OPS)
@pytest.mark.parametrize("shape", [(2, 300, 1536), (3, 77, 2048)])
def test_backward_block_choices_keep_the_grads(dev_kernel, name, shape):
    """The development sweeps' launch choices (fused_norm.bwd_*): next-row loads and shared-memory sums
    change no bit; another block width (row sums in another order) or run length (reduced grads summed in
    another order) is as close to float64 as the default (or within one bf16 rounding), and gives the same
    bits twice."""
    from ltx_dev.tuning import override

    a = bwd_args(name, shape, torch.bfloat16, seed=13)
    outputs = ours(dev_kernel, name, a)
    dys = upstream(outputs, seed=14)
    exact64 = float64_grads(name, a, dys)

    def grads(knobs):
        with override(dev_kernel, knobs):
            return grads_of(ours(dev_kernel, name, a), dys, a)

    default = grads({})
    for knobs in [{"fused_norm.bwd_prefetch": v} for v in (0, 1)] + \
                 [{"fused_norm.bwd_shared_acc": v} for v in (0, 1)]:
        assert all(torch.equal(g, d) for g, d in zip(grads(knobs), default)), knobs
    for knobs in [{"fused_norm.bwd_threads": t} for t in (64, 96, 128, 192, 256)] + \
                 [{"fused_norm.bwd_rows_per_block": r} for r in (1, 3, 64)]:
        got = grads(knobs)
        assert all(torch.equal(g, h) for g, h in zip(got, grads(knobs))), knobs
        for g, d, r in zip(got, default, exact64):  # no worse than the default choices (exact mode's roundings)
            assert rel_l2(g, r) <= max(GRAD_TOL[torch.bfloat16], 1.1 * rel_l2(d, r)), knobs


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("dtype,mod_dtype", [(torch.bfloat16, None), (torch.float16, None),
                                             (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("shape,form", [((2, 300, 1536), "batch"), ((3, 77, 2048), "batch"), ((2, 40, 2048), "all")])
def test_adaln_one_word_kernel_gives_the_vectorized_kernels_bits(dev_kernel, exact, dtype, mod_dtype, shape, form):
    """LTX-Video's adaln_rmsnorm (no weight, scale broadcast over the sequence, grads summed) at hidden 1536
    and 2048 takes the one-word kernel (bwd_words); fused_norm.bwd_words=0 takes bwd_vectorized. Where that
    one has the same width (all but the fast mode's 96 x 2 at 1536: row sums in another order), every grad
    has the same bits; elsewhere each is as close to float64 as bwd_vectorized's (or within GRAD_TOL)."""
    from ltx_dev.tuning import override

    if exact and mod_dtype is not None:
        pytest.skip("round_n needs modulation of the rows' dtype")
    a = bwd_args("adaln_rmsnorm", shape, dtype, mod_dtype=mod_dtype, form=form, exact=exact, weight=False, seed=31)
    dys = upstream(ours(dev_kernel, "adaln_rmsnorm", a), seed=32)

    def run(knobs):
        with override(dev_kernel, knobs):
            got = []
            names = launched_kernels(lambda: got.extend(grads_of(ours(dev_kernel, "adaln_rmsnorm", a), dys, a)))
            return got, names

    words, words_names = run({})
    vectorized, vectorized_names = run({"fused_norm.bwd_words": 0})
    assert any("bwd_words" in n for n in words_names), words_names
    assert not any("bwd_words" in n for n in vectorized_names) and any("bwd_vectorized" in n for n in vectorized_names)
    same_width = exact or shape[-1] == 2048
    for arg, g, v, r in zip(["x", "scale", "shift"], words, vectorized, float64_grads("adaln_rmsnorm", a, dys)):
        assert torch.equal(g, v) or not same_width, arg
        assert rel_l2(g, r) <= max(GRAD_TOL[dtype], 1.1 * rel_l2(v, r)), arg


@pytest.mark.parametrize("name", BWD_OPS)
@pytest.mark.parametrize("form", sorted(MOD_FORMS))
@pytest.mark.parametrize("shape", [(2, 64, 2048), (3, 17, 1000), (1, 5, 16384)])
def test_every_grad_element_is_written(kernel, name, form, shape):
    skip_other_forms(name, form)
    with nan_filled_allocations():
        a = bwd_args(name, shape, torch.bfloat16, form=form, seed=5)
        outputs = ours(kernel, name, a)
        for arg, g in zip([k for k, v in a.items() if isinstance(v, torch.Tensor) and v.requires_grad],
                          grads_of(outputs, [torch.ones_like(o) for o in outputs], a)):
            assert not torch.isnan(g).any(), arg


@pytest.mark.parametrize("name", ["gated_residual", "gated_residual_rmsnorm", "adaln_rmsnorm"])
def test_absent_optional_operands_get_no_grad_and_the_rest_are_right(kernel, name):
    a = bwd_args(name, (2, 33, 256), torch.float32, seed=6, weight=False, shift=False, gate=False, exact=False)
    outputs = ours(kernel, name, a)
    dys = upstream(outputs, seed=7)
    for g, r in zip(grads_of(outputs, dys, a), float64_grads(name, a, dys)):
        assert (g.double() - r).abs().max().item() <= 2e-5 * max(r.abs().max().item(), 1.0)


def test_two_dimensional_rows_with_per_row_modulation_get_per_row_grads(kernel):
    a = bwd_args("adaln_rmsnorm", (1, 24, 512), torch.float32, seed=8)
    a["x"] = leaf((24, 512), torch.float32, 9)
    a["scale"], a["shift"] = leaf((24, 512), torch.float32, 10), leaf((1, 512), torch.float32, 11)
    outputs = ours(kernel, "adaln_rmsnorm", a)
    dys = upstream(outputs, seed=12)
    for g, r in zip(grads_of(outputs, dys, a), float64_grads("adaln_rmsnorm", a, dys)):
        assert g.shape == r.shape and (g.double() - r).abs().max().item() <= 2e-5 * max(r.abs().max().item(), 1.0)


@pytest.mark.parametrize("name", BWD_OPS)
def test_opcheck_functional_ops_with_autograd(kernel, name):
    """opcheck's schema, fake, autograd-registration and aot_dispatch (forward + backward) checks."""
    a = bwd_args(name, (2, 5, 256), torch.bfloat16, seed=21)
    fwd = {"rmsnorm_residual": lambda: (a["x"], a["residual"], a["weight"], EPS, True),
           "adaln_rmsnorm": lambda: (a["x"], a["weight"], a["scale"], a["shift"], EPS, True),
           "gated_residual": lambda: (a["x"], a["y"], a["gate"], True),
           "gated_residual_rmsnorm": lambda: (a["x"], a["y"], a["gate"], a["weight"], a["scale"], a["shift"], EPS,
                                              True),
           "residual_tanh_gated_rmsnorm": lambda: (a["x"], a["x_res"], a["gate"], EPS, True),
           "modulated_rmsnorm": lambda: (a["x"], a["scale"], EPS, 1.0)}[name]()
    torch.library.opcheck(getattr(kernel.ops, f"{name}_fwd").default, fwd)


def test_opcheck_backward_op(kernel):
    a = bwd_args("gated_residual_rmsnorm", (2, 5, 256), torch.bfloat16, seed=22)
    x = a["x"].detach()
    torch.library.opcheck(kernel.ops.fused_norm_bwd.default,
                          ("gated_residual_rmsnorm", torch.ones_like(x), torch.ones_like(x), x, a["y"].detach(),
                           a["gate"].detach(), a["weight"].detach(), a["scale"].detach(), a["shift"].detach(), EPS,
                           1.0, True, True, True, True, True, True))


@pytest.mark.parametrize("name", ["gated_residual_rmsnorm", "adaln_rmsnorm", "rmsnorm_residual"])
def test_cuda_graph_of_forward_and_backward_replays_with_new_inputs(kernel, name):
    a = bwd_args(name, (2, 700, 1536), torch.bfloat16, seed=24)
    leaves = leaves_of(a)
    dys = upstream(ours(kernel, name, a), seed=25)

    def step():
        for t in leaves:
            t.grad = None
        torch.autograd.backward(ours(kernel, name, a), dys)

    def refill():
        for i, t in enumerate(leaves):
            t.copy_(rand(t.shape, t.dtype, 26 + i))

    graph_replays_training_step(step, leaves, refill)


@pytest.mark.parametrize("name", ["gated_residual_rmsnorm", "rmsnorm_residual"])
def test_compiled_training_step_matches_eager(kernel, name):
    a = bwd_args(name, (2, 64, 2048), torch.bfloat16, seed=28)
    call = spec_of(name).call  # looked up outside the traced function
    f = lambda a: [o * 2 for o in call(kernel, a)]  # noqa: E731
    compiled = torch.compile(f, fullgraph=True)
    dys = upstream(f(a), seed=29)
    for x, y in zip(grads_of(compiled(a), dys, a), grads_of(f(a), dys, a)):
        assert torch.equal(x, y)


def test_weight_grad_sums_in_float32_not_in_the_weight_dtype(kernel):
    """dw over 5376 rows of bf16: eager sums the per-row products in bf16 ops; ours in float32, so it is
    far closer to float64 than one bf16 rounding per row would be."""
    a = bwd_args("rmsnorm_residual", (2, 2688, 2048), torch.bfloat16, seed=30)
    outputs = ours(kernel, "rmsnorm_residual", a)
    dys = upstream(outputs, seed=31)
    dw = grads_of(outputs, dys, a)[2]
    assert rel_l2(dw, float64_grads("rmsnorm_residual", a, dys)[2]) <= 2**-8


def test_an_expanded_modulation_gets_the_grad_of_its_shape(kernel):
    """scale.expand(B, S, D) reads like per-batch scale (stride 0 over S) but is a [B, S, D] tensor: its grad
    is per element, and autograd's sum through the expand gives the per-batch grad."""
    a = bwd_args("adaln_rmsnorm", (2, 33, 256), torch.float32, seed=40, exact=False)
    outputs = ours(kernel, "adaln_rmsnorm", a)
    dys = upstream(outputs, seed=41)
    direct = grads_of(outputs, dys, a)
    expanded = {**a, "scale": a["scale"].expand(2, 33, 256), "shift": a["shift"].expand(2, 33, 256)}
    again = torch.autograd.grad(ours(kernel, "adaln_rmsnorm", expanded), leaves_of(a), dys)
    for g, h in zip(direct, again):
        assert (g - h).abs().max().item() <= 1e-5 * max(g.abs().max().item(), 1.0)
