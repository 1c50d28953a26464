"""Activations on the GPU (issue 4, items 4-5): against PyTorch's own eager
ops (bitwise, or within 1 ulp on a tiny fraction where nvcc contracts the
float formula differently), both paths, compile, opcheck, and Linear+GELU
against the separate pair; head_gate bitwise against diffusers' eager LTX-2
gate chain and within its stated bound of float64 (fast mode), with a
hypothesis fuzz. The backward (issue 36, at the end): against eager autograd,
gradcheck in float32, every grad element written, opcheck with autograd, CUDA
graphs and compile. Skipped without CUDA."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ltx_dev.reference.activation import (geglu_eager, gelu_tanh64, head_gate64, head_gate_eager, linear_gelu_eager,
                                          swiglu_eager)
from ltx_dev.reference.numerics import ulp_distance

from .backward_support import graph_replays_training_step, grads, nan_filled_allocations
from .conftest import cuda, expect_path
from .stream_chain import assert_chain_sees_each_output
from .test_fused_norm_gpu import compiled_and_graph_replay_match_eager, poisoned

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


# --- head_gate (LTX-2's per-head sigmoid gate) ----------------------------------------------------

# Unit roundoff and smallest subnormal per dtype: the non-exact bound is u |ref| + 6e-7 |ref| + s / 2.
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 0.0}
TINY = {torch.bfloat16: 2.0 ** -133, torch.float16: 2.0 ** -24, torch.float32: 2.0 ** -149}
# (x shape, heads): LTX-2 video (32 x 128) and audio (32 x 64) heads, other head dims of whole words,
# head dims that are not (the scalar kernel), one head, one element.
GATE_SHAPES = [((2, 300, 32 * 128), 32), ((2, 126, 32 * 64), 32), ((3, 7, 4 * 8), 4), ((5, 13 * 3), 3),
               ((2, 9, 6 * 12), 6), ((4, 3 * 4), 3), ((70001, 8), 1), ((1,), 1), ((2, 3, 5, 2 * 16), 2)]


def gate_logits(shape, dtype, seed):
    """Logits across sigmoid's whole range: normal draws, wide ones, and the tails where exp(-l)
    overflows or underflows float32 (|l| > 88), as well as 0 and +-inf."""
    l = rand(shape, dtype, seed, scale=3.0)
    flat = l.view(-1)
    wide = rand((flat.numel(),), torch.float32, seed + 1, scale=40.0)
    flat[1::3] = wide[1::3].to(dtype)
    special = torch.tensor([0.0, 88.0, -88.0, 87.5, -87.5, 100.0, -100.0, -103.0, 1e4, -1e4, float("inf"),
                            float("-inf"), 16.6, -16.6, 9.0, -9.0], device="cuda").to(dtype)
    n = min(flat.numel(), special.numel())
    flat[:n] = special[:n]
    return l


def raw_head_gate(kernel, x, logits, scale=2.0, exact=True):
    """The raw op into an output of NaN: an element the kernel leaves unwritten stays NaN."""
    out = poisoned(x)
    kernel.ops.head_gate(out, x, logits, scale, exact)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_gate_exact_mode_is_the_eager_diffusers_chain_bitwise(kernel, dtype):
    for i, (shape, heads) in enumerate(GATE_SHAPES):
        x = rand(shape, dtype, 40 + i)
        logits = gate_logits((*shape[:-1], heads), dtype, 60 + i)
        eager = head_gate_eager(x, logits)
        assert torch.equal(kernel.head_gate(x, logits), eager), (shape, heads)
        assert torch.equal(raw_head_gate(kernel, x, logits), eager), (shape, heads)
        for scale in (1.0, 0.7, 3.3):  # any scale: T(scale * T(sigmoid)) as eager's scalar product rounds
            assert torch.equal(kernel.head_gate(x, logits, scale=scale), head_gate_eager(x, logits, scale)), scale


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_gate_sigmoid_is_torch_sigmoid_bitwise(kernel, dtype):
    """With x = 1 and scale 1 the output is T(sigmoid(l)) itself: a failure of the exact-mode test
    that shows here is in the sigmoid (expf or the division), not in the products."""
    logits = gate_logits((64, 1024), dtype, 7)
    ones = torch.ones((64, 1024 * 8), dtype=dtype, device="cuda")
    out = kernel.head_gate(ones, logits, scale=1.0)
    assert torch.equal(out.view(64, 1024, 8), torch.sigmoid(logits).unsqueeze(-1).expand(64, 1024, 8))


def accurate_to_float64(out, expected64, dtype):
    """The non-exact bound (head_gate's docstring): |out - ref| <= (u + 6e-7) |ref| + s / 2."""
    assert not torch.isnan(out).any()
    err = (out.double() - expected64).abs()
    bound = (UNIT[dtype] + 6e-7) * expected64.abs() + TINY[dtype] / 2
    assert (err <= bound).all(), (err - bound).max().item()


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_gate_fast_mode_is_within_its_bound_of_float64(kernel, dtype):
    for i, (shape, heads) in enumerate(GATE_SHAPES):
        x = rand(shape, dtype, 80 + i)
        logits = rand((*shape[:-1], heads), dtype, 100 + i, scale=8.0).clamp(-80, 80)  # float32 sigmoid normal
        for scale in (2.0, 0.7):
            out = raw_head_gate(kernel, x, logits, scale, exact=False)
            assert torch.equal(out, kernel.head_gate(x, logits, scale=scale, exact_mode=False))
            accurate_to_float64(out, head_gate64(x, logits, scale), dtype)
        exact = kernel.head_gate(x, logits)
        if dtype == torch.float32:  # no rounding to skip: one computation
            assert torch.equal(kernel.head_gate(x, logits, exact_mode=False), exact)
        elif x.numel() > 100000:  # fewer roundings: a different result somewhere
            assert not torch.equal(kernel.head_gate(x, logits, exact_mode=False), exact)


def test_head_gate_takes_the_vectorized_kernel_for_whole_word_heads_and_falls_back_alike(kernel):
    x = rand((4, 8 * 64), torch.bfloat16, 1)
    logits = rand((4, 8), torch.bfloat16, 2, scale=4.0)
    out = torch.empty_like(x)
    expect_path(kernel, "activation_path", (out, x, False, logits), VECTORIZED)
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:].view(x.shape).copy_(x)
    expect_path(kernel, "activation_path", (out, shifted, False, logits), FALLBACK)
    odd = rand((4, 8 * 12), torch.bfloat16, 3)  # heads of 12 elements: words straddle two heads
    expect_path(kernel, "activation_path", (torch.empty_like(odd), odd, False, logits), FALLBACK)
    expect_path(kernel, "activation_path", (odd.float(), odd.float(), False, logits.float()), VECTORIZED)  # 3 words
    assert torch.equal(kernel.head_gate(shifted, logits), kernel.head_gate(x, logits))
    strided_x = torch.zeros(4, 2 * 8 * 64, dtype=x.dtype, device="cuda")[:, ::2].copy_(x)
    strided_logits = torch.zeros(4, 16, dtype=x.dtype, device="cuda")[:, ::2].copy_(logits)
    assert torch.equal(kernel.head_gate(strided_x, strided_logits), kernel.head_gate(x, logits))  # copied once
    broadcast = logits[:1].expand(4, 8)
    assert torch.equal(kernel.head_gate(x, broadcast), head_gate_eager(x, broadcast))


def test_head_gate_zero_size_is_a_no_op(kernel):
    empty = kernel.head_gate(torch.empty(0, 7, 256, device="cuda"), torch.empty(0, 7, 4, device="cuda"))
    assert empty.shape == (0, 7, 256)
    assert kernel.head_gate(torch.empty(3, 0, device="cuda"), torch.empty(3, 4, device="cuda")).shape == (3, 0)


def test_head_gate_bad_input_is_refused_and_the_next_call_is_right(kernel):
    x, logits = rand((4, 256), torch.bfloat16, 5), rand((4, 4), torch.bfloat16, 6)
    with pytest.raises(RuntimeError, match="`logits` is on cpu"):
        kernel.head_gate(x, logits.cpu())
    with pytest.raises(TypeError, match="`out` has dtype"):
        kernel.ops.head_gate(torch.empty(4, 256, device="cuda"), x, logits, 2.0, True)
    with pytest.raises(RuntimeError, match="`out` must be contiguous"):
        kernel.ops.head_gate(torch.empty(256, 4, dtype=x.dtype, device="cuda").t(), x, logits, 2.0, True)
    with pytest.raises(RuntimeError, match="must be a multiple of the number of heads"):
        kernel.head_gate(x, logits[:, :3])
    assert torch.equal(kernel.head_gate(x, logits), head_gate_eager(x, logits))


@pytest.mark.parametrize("exact", [True, False])
def test_head_gate_compile_graph_replay_and_opcheck(kernel, exact):
    x, logits = rand((2, 16, 8 * 64), torch.bfloat16, 3), rand((2, 16, 8), torch.bfloat16, 4, scale=4.0)
    compiled_and_graph_replay_match_eager(lambda x, l: kernel.head_gate(x, l, exact_mode=exact), (x, logits))
    torch.library.opcheck(kernel.ops.head_gate.default, (torch.empty_like(x), x, logits, 2.0, exact))


def test_head_gate_reads_what_the_kernel_before_wrote(kernel, launch_mode):
    x, logits = rand((2, 512, 32 * 128), torch.bfloat16, 8), rand((2, 512, 32), torch.bfloat16, 9, scale=4.0)

    def chain(sync):
        def step(result):
            if sync:
                torch.cuda.synchronize()
            return result

        a = step(kernel.gelu_tanh(x))
        b = step(kernel.head_gate(a, logits))
        c = step(kernel.head_gate(b, logits[..., :16], exact_mode=False))  # 16 heads of 256
        return a, b, c

    assert_chain_sees_each_output(chain)


try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # the fuzz needs hypothesis; the rest of the file does not
    given = None

if given is not None:
    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def test_fuzz_head_gate_exact_against_eager_and_fast_against_float64(kernel, data):
        """Random head counts and head dims (whole 16-byte words or not), leading dims, dtypes,
        scales, logit spreads and x offsets (misaligned: the scalar kernel): exact mode is the eager
        chain bit for bit, fast mode within its bound, and nothing is left unwritten."""
        dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
        heads = data.draw(st.one_of(st.sampled_from([1, 32]), st.integers(1, 40)), label="heads")
        head_dim = data.draw(st.one_of(st.sampled_from([64, 128]), st.integers(1, 160),
                                       st.builds(lambda k, o: 8 * k + o, st.integers(1, 20),
                                                 st.sampled_from([0, 1, 4]))), label="head_dim")
        lead = data.draw(st.lists(st.integers(0, 12), min_size=0, max_size=3), label="lead")  # <= 1728 tokens
        scale = data.draw(st.sampled_from([2.0, 1.0, 0.5, 3.3]), label="scale")
        spread = data.draw(st.sampled_from([1.0, 8.0, 60.0]), label="logit spread")
        offset = data.draw(st.sampled_from([0, 1, 8]), label="x offset (elements)")
        seed = data.draw(st.integers(0, 2**20), label="seed")
        shape = (*lead, heads * head_dim)
        x0 = rand(shape, dtype, seed)
        x = torch.empty(x0.numel() + offset, dtype=dtype, device="cuda")[offset:].view(shape).copy_(x0)
        logits = rand((*lead, heads), dtype, seed + 1, scale=spread)
        assert torch.equal(raw_head_gate(kernel, x, logits, scale), head_gate_eager(x, logits, scale))
        fast = raw_head_gate(kernel, x, logits, scale, exact=False)
        if spread < 60.0:  # below l = -87 the float32 sigmoid is subnormal: outside the relative bound
            accurate_to_float64(fast, head_gate64(x, logits, scale), dtype)
        else:
            assert not torch.isnan(fast).any()


# --- backward (issue 36) --------------------------------------------------------------------------
# Against eager autograd of the models' code (ltx_dev/reference/activation.py): the backward takes
# PyTorch's backward formulas and eager autograd's roundings, so it is eager's bit for bit except where
# nvcc contracts the float32 formula differently. Gradcheck in float32; the head gate's logit grad (a
# sum over the head in another order) within the bounds its docstring states.


def leaf(shape, dtype, seed, scale=2.0):
    return rand(shape, dtype, seed, scale).requires_grad_()


def ulp_size(t):
    """An upper bound on one ulp of each element of `t` in its dtype."""
    return t.double().abs().clamp_min(torch.finfo(t.dtype).tiny) * torch.finfo(t.dtype).eps


def eager_grad_match(ours, eager, noise):
    """Bitwise but for a few elements; those within one ulp of the dtype plus `noise` (the float32
    formula's absolute rounding, for elements where the derivative's terms cancel and a different
    contraction moves the float32 result by more than the dtype's half ulp)."""
    assert ours.dtype == eager.dtype and ours.shape == eager.shape
    assert not torch.isnan(ours).any()
    diff = (ours.double() - eager.double()).abs()
    assert (diff <= ulp_size(eager) + noise).all(), diff.max().item()
    if ours.dtype != torch.float32 and ours.numel() >= 10000:  # a float32 difference rarely crosses a rounding
        assert (ours != eager).float().mean().item() < 1e-3


def formula_noise(dy):
    """The float32 derivative formulas' absolute rounding: terms of O(1) times |dy| (GELU's and SiLU's
    derivatives stay below 1.2), a few float32 ulps of each."""
    return 2.0 ** -20 * dy.detach().double().abs()


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_grad_is_eager_autograd(kernel, dtype):
    for i, shape in enumerate(SHAPES):
        x = leaf(shape, dtype, 200 + i, scale=3.0)
        dy = rand(shape, dtype, 300 + i)
        (ours,) = grads(kernel.gelu_tanh(x), dy, x)
        (eager,) = grads(F.gelu(x, approximate="tanh"), dy, x)
        eager_grad_match(ours, eager, formula_noise(dy))
        (fast,) = grads(kernel.gelu_tanh(x, fast=True), dy, x)
        assert torch.equal(fast, ours)  # the derivative of the function fast=True approximates


GATED_SHAPES = [(2, 300, 2 * 4096), (3, 17, 2 * 1000), (5, 2), (4, 7, 2 * 130),
                (70001, 2 * 24)]  # (5, 2) and 130 take the scalar kernel in bf16/fp16; 70001 rows > a grid's y


def gated_case(name, approximate):
    """(our call, eager call) of a gated activation with `half` activated."""
    if name == "geglu":
        act = (lambda a: F.gelu(a, approximate="tanh" if approximate else "none"))
        return (lambda k, x, half, fast: k.geglu(x, approximate, gelu_half=half, fast=fast)), act
    return (lambda k, x, half, fast: k.swiglu(x, silu_half=half, fast=fast)), F.silu


def gated_noise(dy, x, half, eager):
    """The activated half's grad is act'(a) times T(dy * b): the float32 formula's rounding scales with
    |dy * b|. The other half's, T(dy * T(act(a))), may take one more ulp where the forward's act(a) is
    the one ulp off eager's that the forward tests allow."""
    first = half == "first"
    b = x.detach().chunk(2, dim=-1)[1 if first else 0]
    act_noise = formula_noise(dy * b.double())
    other_noise = ulp_size(eager.chunk(2, dim=-1)[1 if first else 0])
    return torch.cat([act_noise, other_noise] if first else [other_noise, act_noise], dim=-1)


def eager_gated(act, x, half):
    a, b = x.chunk(2, dim=-1)
    return act(a) * b if half == "first" else act(b) * a


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, approximate", [("geglu", True), ("geglu", False), ("swiglu", True)])
@pytest.mark.parametrize("half", ["first", "second"])
def test_gated_grads_are_eager_autograd(kernel, dtype, name, approximate, half):
    ours_fn, act = gated_case(name, approximate)
    for i, shape in enumerate(GATED_SHAPES):
        x = leaf(shape, dtype, 400 + i)
        dy = rand((*shape[:-1], shape[-1] // 2), dtype, 500 + i)
        (ours,) = grads(ours_fn(kernel, x, half, False), dy, x)
        (eager,) = grads(eager_gated(act, x, half), dy, x)
        eager_grad_match(ours, eager, gated_noise(dy, x, half, eager))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["geglu", "swiglu"])
def test_fast_gated_grads_multiply_by_the_fast_activation(kernel, dtype, name):
    """fast=True: the other half's grad multiplies dy by the fast T(act(a)) the forward used (read back
    from the forward with b = 1); the activated half's grad is the exact one's."""
    ours_fn, _ = gated_case(name, True)
    x = leaf((3, 40, 2 * 512), dtype, 600, scale=4.0)
    dy = rand((3, 40, 512), dtype, 601)
    (fast,) = grads(ours_fn(kernel, x, "first", True), dy, x)
    (exact,) = grads(ours_fn(kernel, x, "first", False), dy, x)
    a = x.detach().chunk(2, dim=-1)[0]
    with torch.no_grad():
        act_fast = ours_fn(kernel, torch.cat([a, torch.ones_like(a)], dim=-1), "first", True)
    assert torch.equal(fast.chunk(2, dim=-1)[0], exact.chunk(2, dim=-1)[0])
    assert torch.equal(fast.chunk(2, dim=-1)[1], dy * act_fast)


def test_gelu_tanh_float32_grad_matches_float64_autograd(kernel):
    x = leaf((64, 4096), torch.float32, 610, scale=4.0)
    dy = rand((64, 4096), torch.float32, 611)
    (ours,) = grads(kernel.gelu_tanh(x), dy, x)
    x64 = x.detach().double().requires_grad_()
    (ref,) = grads(gelu_tanh64(x64), dy.double(), x64)
    # float32 formula: a few ulps of its terms, relative to |dy|; the largest where 1 - tanh^2 cancels
    # (x near -5: tanhf's 2 ulps times 0.5 x beta (1 + 3 kappa x^2) ~ 9, about 2e-6)
    assert ((ours.double() - ref).abs() <= 2.0 ** -17 * dy.double().abs() + 1e-30).all()


@pytest.mark.parametrize("name, fn", [
    ("gelu_tanh", lambda k, x: k.gelu_tanh(x)),
    ("geglu", lambda k, x: k.geglu(x)), ("geglu_erf", lambda k, x: k.geglu(x, False, gelu_half="second")),
    ("swiglu", lambda k, x: k.swiglu(x, silu_half="second")),
])
@pytest.mark.parametrize("width", [8, 6])  # vectorized, scalar (a half of 3 floats is not a word)
def test_gradcheck_float32(kernel, name, fn, width):
    """Numerical against our analytical Jacobian on float32 (central differences, eps 1e-3: float32
    rounding of O(1) outputs gives ~1e-4 relative error in a difference quotient, hence the tolerances)."""
    x = leaf((3, width), torch.float32, 620)
    assert torch.autograd.gradcheck(lambda t: fn(kernel, t), (x,), eps=1e-3, atol=2e-3, rtol=1e-2, nondet_tol=0.0)


def shifted(t):
    """A contiguous copy of `t` one element past a 16-byte boundary: the scalar kernels."""
    return torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape).copy_(t).detach()


def test_misaligned_and_strided_inputs_get_eager_grads(kernel):
    x0 = rand((64, 2 * 1024), torch.bfloat16, 630)
    strided = torch.zeros(64, 4 * 1024, dtype=x0.dtype, device="cuda")[:, ::2].copy_(x0)  # copied once
    dy = rand((1024, 64), torch.bfloat16, 631).t()  # a transposed upstream grad: copied once
    for x in (shifted(x0).requires_grad_(), strided.requires_grad_()):
        for ours_fn, eager_fn in ((kernel.geglu, geglu_eager), (kernel.swiglu, swiglu_eager)):
            (ours,) = grads(ours_fn(x), dy, x)
            (eager,) = grads(eager_fn(x), dy, x)
            eager_grad_match(ours, eager, gated_noise(dy, x, "first", eager))
    flat = shifted(rand((64, 1000), torch.bfloat16, 632)).requires_grad_()
    dflat = rand((64, 1000), torch.bfloat16, 633)
    eager_grad_match(grads(kernel.gelu_tanh(flat), dflat, flat)[0],
                     grads(F.gelu(flat, approximate="tanh"), dflat, flat)[0], formula_noise(dflat))


BWD_CALLS = {
    "gelu_tanh": (lambda k, x: k.gelu_tanh(x), 1),
    "geglu": (lambda k, x: k.geglu(x, gelu_half="second"), 2),
    "swiglu": (lambda k, x: k.swiglu(x, fast=True), 2),
}


@pytest.mark.parametrize("name", sorted(BWD_CALLS))
@pytest.mark.parametrize("shape", [(2, 300, 2 * 4096), (5, 2 * 130), (3, 2)])
def test_every_grad_element_is_written(kernel, name, shape):
    fn, _ = BWD_CALLS[name]
    with nan_filled_allocations():
        x = leaf(shape, torch.bfloat16, 640)
        y = fn(kernel, x)
        (g,) = grads(y, torch.ones_like(y), x)
        assert not torch.isnan(g).any()


def test_zero_size_backward(kernel):
    x = torch.empty(0, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for fn, _ in BWD_CALLS.values():
        y = fn(kernel, x)
        assert grads(y, torch.ones_like(y), x)[0].shape == (0, 64)


@pytest.mark.parametrize("name", sorted(BWD_CALLS))
def test_opcheck_functional_ops_with_autograd(kernel, name):
    """opcheck's schema, fake, autograd-registration and aot_dispatch (forward + backward) checks."""
    x = leaf((3, 5, 256), torch.bfloat16, 650)
    fwd_args = {"gelu_tanh": (False,), "geglu": (True, False, False), "swiglu": (True, True)}[name]
    torch.library.opcheck(getattr(kernel.ops, f"{name}_fwd").default, (x, *fwd_args))
    y = getattr(kernel.ops, f"{name}_fwd")(x.detach(), *fwd_args)
    bwd_args = () if name == "gelu_tanh" else fwd_args  # the backward takes the flags but `fast` of gelu_tanh
    torch.library.opcheck(getattr(kernel.ops, f"{name}_bwd").default, (torch.ones_like(y), x.detach(), *bwd_args))


@pytest.mark.parametrize("name", sorted(BWD_CALLS))
def test_cuda_graph_of_forward_and_backward_replays_with_new_inputs(kernel, name):
    fn, factor = BWD_CALLS[name]
    x = leaf((2, 700, factor * 1536), torch.bfloat16, 660)
    dy = rand((2, 700, 1536), torch.bfloat16, 661)

    def step():
        x.grad = None
        fn(kernel, x).backward(dy)

    graph_replays_training_step(step, [x], lambda: x.copy_(rand(x.shape, torch.bfloat16, 662)))


@pytest.mark.parametrize("name", sorted(BWD_CALLS))
def test_compiled_training_step_matches_eager(kernel, name):
    fn, factor = BWD_CALLS[name]
    x = leaf((4, factor * 2048), torch.bfloat16, 670)
    dy = rand((4, 2048), torch.bfloat16, 671)
    f = lambda x: fn(kernel, x) * 2  # noqa: E731
    assert torch.equal(grads(torch.compile(f, fullgraph=True)(x), dy, x)[0], grads(f(x), dy, x)[0])


def test_without_grad_mode_the_out_variant_runs(kernel):
    """The inference path: no graph, the same bits as the recorded forward."""
    x = leaf((4, 2 * 512), torch.bfloat16, 680)
    with torch.no_grad():
        plain = kernel.geglu(x)
    assert plain.grad_fn is None
    recorded = kernel.geglu(x)
    assert recorded.grad_fn is not None and torch.equal(recorded, plain)


# --- head_gate backward ---

def head_gate_leaves(shape, heads, dtype, seed):
    x = leaf(shape, dtype, seed)
    logits = leaf((*shape[:-1], heads), dtype, seed + 1, scale=3.0)
    return x, logits


def head_products(dy, x, heads, exact):
    """The per-head products dy * x (exact: rounded to the dtype, as eager's tensor) and their |sum|."""
    p = dy * x.detach() if exact else dy.double() * x.detach().double()
    p = p.double().unflatten(-1, (heads, -1))
    return p.sum(-1), p.abs().sum(-1)


# LTX-2 video (32 x 128) and audio (32 x 64) heads, a float32 head of 32 words, heads of 12 and 13 (scalar).
GATE_BWD_SHAPES = [((2, 300, 32 * 128), 32), ((2, 126, 32 * 64), 32), ((3, 7, 4 * 8), 4), ((5, 13 * 3), 3),
                   ((2, 9, 6 * 12), 6), ((4, 3 * 4), 3), ((70001, 8), 1), ((2, 3, 5, 2 * 16), 2)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_gate_exact_grads_are_eager_autograd(kernel, dtype):
    """dx is eager's T(dy * T(scale * T(sigmoid))) bitwise; the logit grad is eager's chain of roundings
    with the head's sum in another order: within 2 ulps, or the float32 sum's rounding where it cancels.
    Logits across sigmoid's range, infinities included: a saturated T(sigmoid) gives 0, as eager."""
    for i, (shape, heads) in enumerate(GATE_BWD_SHAPES):
        x = leaf(shape, dtype, 700 + 2 * i)
        logits = gate_logits((*shape[:-1], heads), dtype, 701 + 2 * i).requires_grad_()  # +-inf, saturated, wide
        dy = rand(shape, dtype, 750 + i)
        ours = grads(kernel.head_gate(x, logits), dy, x, logits)
        eager = grads(head_gate_eager(x, logits), dy, x, logits)
        assert torch.equal(ours[0], eager[0]), shape
        _, sum_abs = head_products(dy, x, heads, True)
        # float32 sums in two orders (scale * s * (1 - s) <= 0.5 carries their difference), then up to
        # two roundings that it may move
        noise = 0.5 * sum_abs * 2 * (shape[-1] // heads) * 2.0 ** -24
        diff = (ours[1].double() - eager[1].double()).abs()
        assert (diff <= 2 * ulp_size(eager[1]) + noise).all() and not torch.isnan(ours[1]).any(), shape


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_gate_fast_grads_are_within_their_bound_of_float64(kernel, dtype):
    for i, (shape, heads) in enumerate(GATE_BWD_SHAPES):
        x, logits = head_gate_leaves(shape, heads, dtype, 800 + 2 * i)
        dy = rand(shape, dtype, 850 + i)
        ours = grads(kernel.head_gate(x, logits, scale=0.7, exact_mode=False), dy, x, logits)
        x64, l64 = (t.detach().double().requires_grad_() for t in (x, logits))
        ref = grads(head_gate64(x64, l64, 0.7), dy.double(), x64, l64)
        accurate_to_float64(ours[0], ref[0], dtype)  # dx: the forward's bound, on dy
        _, sum_abs = head_products(dy, x, heads, False)
        d = shape[-1] // heads
        # float32: the derivative's few roundings (1e-6 relative) and the sum's (d + 1 roundings of its terms)
        bound = (UNIT[dtype] + 1e-6) * ref[1].abs() + 0.7 * 0.25 * sum_abs * (d + 1) * 2.0 ** -24 + TINY[dtype]
        assert ((ours[1].double() - ref[1]).abs() <= bound).all(), shape


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("width", [8, 12])  # a whole float32 word per head (vectorized), 3 words (scalar)
def test_head_gate_gradcheck_float32(kernel, exact, width):
    x, logits = head_gate_leaves((3, 2 * width), 2, torch.float32, 900)
    fn = lambda x, l: kernel.head_gate(x, l, scale=1.5, exact_mode=exact)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, logits), eps=1e-3, atol=2e-3, rtol=1e-2, nondet_tol=0.0)


def test_head_gate_backward_is_bitwise_deterministic(kernel):
    x, logits = head_gate_leaves((2, 6144, 32 * 128), 32, torch.bfloat16, 910)
    dy = rand(x.shape, torch.bfloat16, 911)
    first = grads(kernel.head_gate(x, logits), dy, x, logits)
    for _ in range(3):
        again = grads(kernel.head_gate(x, logits), dy, x, logits)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("needs", ["x", "logits"])
def test_head_gate_computes_only_the_grads_asked_for(kernel, needs):
    x, logits = head_gate_leaves((4, 8 * 64), 8, torch.bfloat16, 920)
    dy = rand(x.shape, torch.bfloat16, 921)
    both = grads(kernel.head_gate(x, logits), dy, x, logits)
    args = (x, logits.detach()) if needs == "x" else (x.detach(), logits)
    (g,) = grads(kernel.head_gate(*args), dy, args[0] if needs == "x" else args[1])
    assert torch.equal(g, both[0] if needs == "x" else both[1])


@pytest.mark.parametrize("shape, heads", [((2, 300, 32 * 128), 32), ((5, 13 * 3), 3), ((3, 0), 4)])
def test_head_gate_every_grad_element_is_written(kernel, shape, heads):
    with nan_filled_allocations():
        x, logits = head_gate_leaves(shape, heads, torch.bfloat16, 930)
        y = kernel.head_gate(x, logits)
        dx, dl = grads(y, torch.ones_like(y), x, logits)
        assert not torch.isnan(dx).any() and not torch.isnan(dl).any()
        if shape[-1] == 0:  # heads of no elements: sums over nothing
            assert torch.equal(dl, torch.zeros_like(dl))


def test_head_gate_misaligned_and_broadcast_inputs_get_eager_grads(kernel):
    x = shifted(rand((4, 8 * 64), torch.bfloat16, 940)).requires_grad_()  # misaligned: the scalar kernel
    logits = leaf((1, 8), torch.bfloat16, 941, scale=3.0)
    dy = rand((4, 8 * 64), torch.bfloat16, 942)
    ours = grads(kernel.head_gate(x, logits.expand(4, 8)), dy, x, logits)
    eager = grads(head_gate_eager(x, logits.expand(4, 8)), dy, x, logits)
    assert torch.equal(ours[0], eager[0])
    # Each row's logit grad is a bf16 rounding of a 64-term float32 sum (in another order than eager's),
    # then the 4 rows are added: errors up to a few bf16 ulps of the largest per-row term.
    torch.testing.assert_close(ours[1], eager[1], rtol=2 ** -6, atol=2 ** -6 * eager[1].abs().max().item())


@pytest.mark.parametrize("exact", [True, False])
def test_head_gate_opcheck_compile_and_graph_with_autograd(kernel, exact):
    x, logits = head_gate_leaves((2, 16, 8 * 64), 8, torch.bfloat16, 950)
    torch.library.opcheck(kernel.ops.head_gate_fwd.default, (x, logits, 2.0, exact))
    dy = rand(x.shape, torch.bfloat16, 951)
    torch.library.opcheck(kernel.ops.head_gate_bwd.default, (dy, x.detach(), logits.detach(), 2.0, exact, True))
    f = lambda x, l: kernel.head_gate(x, l, exact_mode=exact) * 2  # noqa: E731
    compiled = grads(torch.compile(f, fullgraph=True)(x, logits), dy, x, logits)
    for a, b in zip(compiled, grads(f(x, logits), dy, x, logits)):
        assert torch.equal(a, b)


# --- linear_gelu backward ---

def test_linear_gelu_under_autograd_is_the_pair_with_its_grads(kernel):
    """While autograd records: F.linear then gelu_tanh, bitwise the eager pair; the grads through
    torch's GEMM backward and gelu_tanh's backward, eager's to within its rounding."""
    x = leaf((2, 64, 256), torch.bfloat16, 960, 1.0)
    w = leaf((512, 256), torch.bfloat16, 961, 0.05)
    b = leaf((512,), torch.bfloat16, 962, 0.1)
    dy = rand((2, 64, 512), torch.bfloat16, 963)
    ours = kernel.linear_gelu(x, w, b)
    pair = linear_gelu_eager(x, w, b)
    assert ours.grad_fn is not None
    same_as_eager(ours, pair)
    for g, e in zip(grads(ours, dy, x, w, b), grads(pair, dy, x, w, b)):
        assert ((g.double() - e.double()).norm() / e.double().norm()).item() <= 2 ** -8


def test_linear_gelu_gradcheck_float32(kernel):
    x, w = leaf((3, 8), torch.float32, 970, 1.0), leaf((4, 8), torch.float32, 971, 0.3)
    b = leaf((4,), torch.float32, 972)
    assert torch.autograd.gradcheck(kernel.linear_gelu, (x, w, b), eps=1e-3, atol=2e-3, rtol=1e-2)
