"""Activations on the GPU (issue 4, items 4-5): against PyTorch's own eager
ops (bitwise, or within 1 ulp on a tiny fraction where nvcc contracts the
float formula differently), both paths, compile, opcheck, and Linear+GELU
against the separate pair. Skipped without CUDA."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ltx_dev.reference.numerics import ulp_distance

from .conftest import cuda, expect_path

pytestmark = cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
VECTORIZED, FALLBACK = 0, 1


def rand(shape, dtype, seed, scale=2.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") * scale).to(dtype)


def same_as_eager(ours, eager):
    """Bitwise, except where the float32 formula's rounding differs (FMA
    contraction): at most 1 ulp on < 0.1% of elements."""
    assert not torch.isnan(ours).any()
    ulps = ulp_distance(ours, eager)
    assert ulps.max().item() <= 1, ulps.max().item()
    assert (ulps > 0).float().mean().item() < 1e-3


SHAPES = [(2, 2688, 2048), (3, 17, 1000), (5, 8), (1, 1), (4, 7, 130)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_is_f_gelu_tanh(kernel, dtype):
    for i, shape in enumerate(SHAPES):
        x = rand(shape, dtype, i)
        same_as_eager(kernel.gelu_tanh(x), F.gelu(x, approximate="tanh"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", [True, False])
@pytest.mark.parametrize("half", ["first", "second"])
def test_geglu_is_eager_gelu_times_the_other_half(kernel, dtype, approximate, half):
    for i, shape in enumerate([(2, 300, 2 * 4096), (3, 17, 2 * 1000), (3, 5, 2 * 2600), (5, 2), (4, 7, 2 * 130),
                                    (70001, 2 * 24)]):  # more rows than a grid's y (65535)
        x = rand(shape, dtype, i)
        a, b = x.chunk(2, dim=-1)
        if half == "second":
            a, b = b, a
        eager = F.gelu(a, approximate="tanh" if approximate else "none") * b
        same_as_eager(kernel.geglu(x, approximate, gelu_half=half), eager)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("half", ["first", "second"])
def test_swiglu_is_eager_silu_times_the_other_half(kernel, dtype, half):
    for i, shape in enumerate([(2, 256, 2 * 8192), (3, 17, 2 * 1000), (5, 2)]):
        x = rand(shape, dtype, i)
        a, b = x.chunk(2, dim=-1)
        if half == "second":
            a, b = b, a
        same_as_eager(kernel.swiglu(x, silu_half=half), F.silu(a) * b)


def act64(name, v):
    """The activation in float64, in the sigmoid form (no cancellation in the negative tail)."""
    v = v.double()
    if name == "gelu_tanh":
        return v * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))
    return v * torch.sigmoid(v)


def fast_is_accurate(ours, expected64, max_ulps):
    """Fast mode against float64: float32 relative error below 5e-5 (the rounding of exp's
    argument, |2u| * 2^-23 with |2u| < 88 before the approximate division flushes the result);
    in bf16/fp16 within `max_ulps` of the correctly rounded value. Values below 1e-30 in
    magnitude may come out as 0."""
    assert not torch.isnan(ours).any()
    tiny = expected64.abs() < 1e-30
    assert (ours.double().abs()[tiny] <= 1e-30).all()
    if ours.dtype == torch.float32:
        torch.testing.assert_close(ours.double()[~tiny], expected64[~tiny], rtol=5e-5, atol=0)
    else:
        assert ulp_distance(ours, expected64.to(ours.dtype))[~tiny].max().item() <= max_ulps


def agrees_with_eager_away_from_the_tail(ours, eager, expected64, max_ulps):
    """Where |y| > 1e-3 the eager tanh form's cancellation stays below a bf16/fp16 ulp: there
    fast and eager differ by at most `max_ulps`, on a small fraction of elements (rounding
    ties); in float32 fast is no further from float64 than eager. Below, eager's 1 + tanh(u)
    cancels (0, or a coarse multiple of 3e-8 * x) and fast is the accurate one."""
    away = expected64.abs() > 1e-3
    if ours.dtype == torch.float32:  # eager's own error there reaches ~1e-4 relative: fast is no worse
        err_ours = (ours.double() - expected64).abs()[away]
        err_eager = (eager.double() - expected64).abs()[away]
        assert (err_ours <= err_eager + 5e-5 * expected64.abs()[away]).all()
        return
    ulps = ulp_distance(ours, eager)[away]
    assert ulps.max().item() <= max_ulps
    assert (ulps > 0).float().mean().item() < 2e-2


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_gelu_tanh_is_accurate_and_eager_away_from_the_negative_tail(kernel, dtype):
    for i, shape in enumerate(SHAPES):
        x = rand(shape, dtype, 20 + i, scale=4.0)  # well into both tails
        ours = kernel.gelu_tanh(x, fast=True)
        expected64 = act64("gelu_tanh", x)
        fast_is_accurate(ours, expected64, 1)
        agrees_with_eager_away_from_the_tail(ours, F.gelu(x, approximate="tanh"), expected64, 1)
        if x.numel() > 10000 and dtype != torch.float32:  # a different computation, not the exact kernel
            assert not torch.equal(ours, kernel.gelu_tanh(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("half", ["first", "second"])
def test_fast_gated_activations_are_accurate_and_eager_away_from_the_tail(kernel, dtype, half):
    for i, shape in enumerate([(2, 300, 2 * 4096), (3, 17, 2 * 1000), (5, 2)]):
        x = rand(shape, dtype, 30 + i, scale=4.0)
        a, b = x.chunk(2, dim=-1)
        if half == "second":
            a, b = b, a
        for name, fn, eager in (("gelu_tanh", lambda: kernel.geglu(x, gelu_half=half, fast=True),
                                 F.gelu(a, approximate="tanh") * b),
                                ("silu", lambda: kernel.swiglu(x, silu_half=half, fast=True), F.silu(a) * b)):
            # eager rounds the activation to the dtype before the product: so does the reference
            expected64 = act64(name, a).to(dtype).double() * b.double()
            ours = fn()
            fast_is_accurate(ours, expected64, 2)
            agrees_with_eager_away_from_the_tail(ours, eager, expected64, 2)


def test_aligned_inputs_are_vectorized_and_others_fall_back_with_the_same_result(kernel):
    x = rand((4, 2 * 512), torch.bfloat16, 1)
    out = torch.empty(4, 512, dtype=torch.bfloat16, device="cuda")
    expect_path(kernel, "activation_path", (out, x, True), VECTORIZED)
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:].view(x.shape).copy_(x)
    expect_path(kernel, "activation_path", (out, shifted, True), FALLBACK)
    assert torch.equal(kernel.geglu(shifted), kernel.geglu(x))
    strided = torch.zeros(4, 4 * 512, dtype=x.dtype, device="cuda")[:, ::2]
    strided.copy_(x)
    assert torch.equal(kernel.geglu(strided), kernel.geglu(x))  # copied once by the binding


def test_zero_size_is_a_no_op(kernel):
    assert kernel.gelu_tanh(torch.empty(0, 64, device="cuda")).shape == (0, 64)
    assert kernel.geglu(torch.empty(3, 0, device="cuda", dtype=torch.bfloat16)).shape == (3, 0)


@pytest.mark.parametrize("name", ["gelu_tanh", "geglu", "swiglu"])
def test_compile_fullgraph_and_opcheck(kernel, name):
    fn = getattr(kernel, name)
    x = rand((2, 16, 256), torch.bfloat16, 3)
    assert torch.equal(torch.compile(fn, fullgraph=True)(x), fn(x))
    out = torch.empty(x.shape if name == "gelu_tanh" else (2, 16, 128), dtype=x.dtype, device="cuda")
    args = {"gelu_tanh": (False,), "geglu": (True, True, False), "swiglu": (True, False)}[name]
    torch.library.opcheck(getattr(kernel.ops, name).default, (out, x, *args))


def test_errors_leave_the_next_call_right(kernel):
    x = rand((4, 64), torch.bfloat16, 5)
    with pytest.raises(RuntimeError, match="must be even"):
        kernel.ops.geglu(torch.empty(4, 32, dtype=x.dtype, device="cuda"), x[:, :63], True, True, False)
    with pytest.raises(TypeError, match="`out` has dtype"):
        kernel.ops.gelu_tanh(torch.empty(4, 64, device="cuda"), x, False)
    same_as_eager(kernel.gelu_tanh(x), F.gelu(x, approximate="tanh"))


def test_linear_gelu_is_close_to_the_separate_pair(kernel):
    x = rand((2, 2688, 2048), torch.bfloat16, 6, 1.0)
    w = rand((8192, 2048), torch.bfloat16, 7, 0.02)
    b = rand((8192,), torch.bfloat16, 8, 0.1)
    ours = kernel.linear_gelu(x, w, b)
    pair = F.gelu(F.linear(x, w, b), approximate="tanh")
    ref = F.gelu(F.linear(x.double(), w.double(), b.double()), approximate="tanh")
    assert ours.shape == pair.shape == (2, 2688, 8192)
    # The epilogue rounds once; the pair rounds the linear output first: both
    # within bf16 resolution of the float64 result, ours at least as close.
    err_ours = (ours.double() - ref).abs().max().item()
    err_pair = (pair.double() - ref).abs().max().item()
    assert err_ours <= max(err_pair, 1e-3) * 1.5, (err_ours, err_pair)
