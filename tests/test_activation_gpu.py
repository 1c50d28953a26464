"""Activations on the GPU (issue 4, items 4-5): against PyTorch's own eager
ops (bitwise, or within 1 ulp on a tiny fraction where nvcc contracts the
float formula differently), both paths, compile, opcheck, and Linear+GELU
against the separate pair. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .conftest import cuda
from .reference import ulp_distance

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
    for i, shape in enumerate([(2, 300, 2 * 4096), (3, 17, 2 * 1000), (3, 5, 2 * 2600), (5, 2), (4, 7, 2 * 130)]):
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


def close_to_exact(ours, exact):
    """Fast mode: the exact formula through approximate exp/division, a few
    float32 ulp off. In bf16/fp16 that moves a result by at most 1 ulp, on
    elements whose exact value lies near a rounding boundary (a small
    fraction); in float32 it is a relative error below 2e-5."""
    assert not torch.isnan(ours).any()
    if ours.dtype == torch.float32:
        torch.testing.assert_close(ours, exact, rtol=2e-5, atol=1e-6)
        return
    ulps = ulp_distance(ours, exact)
    assert ulps.max().item() <= 1, ulps.max().item()
    assert (ulps > 0).float().mean().item() < 2e-2


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_gelu_tanh_is_within_an_ulp_of_f_gelu_tanh(kernel, dtype):
    for i, shape in enumerate(SHAPES):
        x = rand(shape, dtype, 20 + i, scale=4.0)  # well into both tails
        ours = kernel.gelu_tanh(x, fast=True)
        close_to_exact(ours, F.gelu(x, approximate="tanh"))
        if x.numel() > 10000 and dtype != torch.float32:  # it is a different computation, not a copy
            assert not torch.equal(ours, kernel.gelu_tanh(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("half", ["first", "second"])
def test_fast_gated_activations_are_within_an_ulp_of_eager(kernel, dtype, half):
    for i, shape in enumerate([(2, 300, 2 * 4096), (3, 17, 2 * 1000), (5, 2)]):
        x = rand(shape, dtype, 30 + i, scale=4.0)
        a, b = x.chunk(2, dim=-1)
        if half == "second":
            a, b = b, a
        close_to_exact(kernel.geglu(x, gelu_half=half, fast=True), F.gelu(a, approximate="tanh") * b)
        close_to_exact(kernel.swiglu(x, silu_half=half, fast=True), F.silu(a) * b)


def test_aligned_inputs_are_vectorized_and_others_fall_back_with_the_same_result(kernel):
    x = rand((4, 2 * 512), torch.bfloat16, 1)
    out = torch.empty(4, 512, dtype=torch.bfloat16, device="cuda")
    assert kernel.ops.activation_path(out, x, True) == VECTORIZED
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:].view(x.shape).copy_(x)
    assert kernel.ops.activation_path(out, shifted, True) == FALLBACK
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
    if name == "gelu_tanh":
        torch.library.opcheck(kernel.ops.activation.default, (out, x, 0))
    else:
        torch.library.opcheck(kernel.ops.gated_activation.default, (out, x, 0 if name == "geglu" else 2, True))


def test_errors_leave_the_next_call_right(kernel):
    x = rand((4, 64), torch.bfloat16, 5)
    with pytest.raises(RuntimeError, match="must be even"):
        kernel.ops.gated_activation(torch.empty(4, 32, dtype=x.dtype, device="cuda"), x[:, :63], 0, True)
    with pytest.raises(TypeError, match="`out` has dtype"):
        kernel.ops.activation(torch.empty(4, 64, device="cuda"), x, 0)
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
