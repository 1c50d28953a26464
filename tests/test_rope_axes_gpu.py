"""1-D / 3-D RoPE on the GPU (issue 4, item 3): rope_3d and rope_1d against a
float64 PyTorch reference (ltx_dev/reference/rope_axes.py) on fresh random
inputs, both kernel paths (16-byte words and the scalar fallback, which must
agree bitwise), GQA head counts, strided views rotated in place with the
memory around them poisoned (NaN) and checked untouched, positions up to
2^24, zero-size input, bad input, diffusers' Wan rotation, torch.compile
(fullgraph) and torch.library.opcheck. Skipped without CUDA.

Tolerances, per element, against the float64 rotation `ref` of the input x:
  float32:          |out - ref| <= 2^-20 * (|x[2j]| + |x[2j+1]|)
  bfloat16/float16: |out - ref| <= half an ulp of ref in the dtype + the same 2^-20 term,
                    and at most 1% of the elements differ from ref rounded to the dtype.
The 2^-20 (16 float32 ulps) term bounds the kernel's float32 error before its
one rounding: cos/sin within ~4.5 float32 ulps of exact (sincosf's 2 plus the
angle remainder correction), the FMA rotation ~1.5 ulps. An angle formed as a
plain float32 product would be off by ~1e-4 at position 5000 and fail it."""

from __future__ import annotations

import importlib
import re

import pytest
import torch

from ltx_dev.reference.rope_axes import diffusers_wan_rotary_apply, diffusers_wan_tables, rope_1d_f64, rope_3d_f64

from .conftest import cuda, expect_path

pytestmark = cuda

DEV = "cuda"
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
DTYPES = [BF16, F16, F32]
VECTORIZED, FALLBACK = 0, 1
MANTISSA_BITS = {BF16: 8, F16: 11, F32: 24}  # significant bits, the implicit one included
KERNEL_REL = 2.0 ** -20


@pytest.fixture(scope="session")
def ra(kernel):
    """ltx_kernels.rope_axes of the built variant (imported directly, so these
    tests do not depend on what __init__.py re-exports)."""
    return importlib.import_module(kernel.__name__ + ".rope_axes")


def rand(shape, dtype, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(shape, generator=g, device=DEV) * 2).to(dtype)


def pair_magnitude(x):
    """|x[2j]| + |x[2j+1]|, float64, at both channels of each pair."""
    m = x.double().abs().unflatten(-1, (-1, 2)).sum(-1, keepdim=True)
    return m.expand(*m.shape[:-1], 2).flatten(-2)


def half_ulp(ref, dtype):
    """Half an ulp of `dtype` at each float64 value of `ref` (0 where ref is 0)."""
    _, e = torch.frexp(ref)  # |ref| = m * 2^e, m in [0.5, 1)
    ulp = torch.pow(2.0, (e - MANTISSA_BITS[dtype]).to(torch.float64))  # exact powers of two
    if dtype == F16:
        ulp = ulp.clamp_min(2.0 ** -24)  # subnormal spacing
    return torch.where(ref == 0, torch.zeros_like(ref), ulp / 2)


def assert_rotated(out, x, ref):
    """`out` (the kernel's in-place result, x's dtype) is the rotation `ref` (float64)
    of the input `x` within the tolerances of the module docstring."""
    assert out.dtype == x.dtype and out.shape == x.shape == ref.shape
    if out.numel() == 0:
        return
    err = (out.double() - ref).abs()
    bound = KERNEL_REL * pair_magnitude(x)
    if out.dtype != F32:
        bound = bound + half_ulp(ref, out.dtype)
    bad = ~(err <= bound)  # NaN counts as bad
    assert not bad.any(), (f"{int(bad.sum())} of {bad.numel()} elements off; first at "
                           f"{tuple(bad.nonzero()[0].tolist())}: {out[bad][0].item()} vs {ref[bad][0].item()}")
    if out.dtype != F32:
        frac = (out != ref.to(out.dtype)).double().mean().item()
        assert frac <= 0.01, f"{frac:.4f} of the elements are not the correctly rounded value"


def run_3d(ra, xq, xk, grid, theta=10000.0):
    """rope_3d on clones of xq, xk; checks it returns its inputs, then the result
    against the float64 reference."""
    q, k = xq.clone(), xk.clone()
    q2, k2 = ra.rope_3d(q, k, *grid, theta_base=theta)
    assert q2 is q and k2 is k
    rq, rk = rope_3d_f64(xq, xk, *grid, theta=theta)
    assert_rotated(q, xq, rq)
    assert_rotated(k, xk, rk)
    return q, k


def run_1d(ra, xq, xk, theta=10000.0):
    q, k = xq.clone(), xk.clone()
    q2, k2 = ra.rope_1d(q, k, theta_base=theta)
    assert q2 is q and k2 is k
    rq, rk = rope_1d_f64(xq, xk, theta=theta)
    assert_rotated(q, xq, rq)
    assert_rotated(k, xk, rk)
    return q, k


# --- correctness against float64 ---------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [128, 64, 96, 80, 48])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2)], ids=lambda h: f"hq{h[0]}-hk{h[1]}")
def test_rope_3d_matches_float64(ra, kernel, dtype, head_dim, heads):
    grid = (4, 6, 10)
    hq, hk = heads
    xq = rand((2, 240, hq, head_dim), dtype, head_dim * 10 + hq)
    xk = rand((2, 240, hk, head_dim), dtype, head_dim * 10 + hk + 1)
    expect_path(kernel, "rope_axes_path", (xq, xk), VECTORIZED)
    run_3d(ra, xq, xk, grid)


@pytest.mark.parametrize("dtype", [BF16, F32], ids=str)
def test_rope_3d_at_wan_480p_grid(ra, dtype):
    """Wan 2.1 at 832x480, 81 frames: latent 21 x 60 x 104, patch (1, 2, 2) -> 21 x 30 x 52 tokens."""
    grid = (21, 30, 52)
    run_3d(ra, rand((1, 21 * 30 * 52, 4, 128), dtype, 7), rand((1, 21 * 30 * 52, 2, 128), dtype, 8), grid)


@pytest.mark.parametrize("grid", [(2, 3, 200_000), (140_000, 1, 1), (3, 50_000, 2)])
def test_rope_3d_positions_above_2_pow_17(ra, grid):
    """Axis positions past 2^17 (angles that take the float64 sincos), float32 to see it."""
    seq = grid[0] * grid[1] * grid[2]
    run_3d(ra, rand((1, seq, 1, 8), F32, 9), rand((1, seq, 1, 8), F32, 10), grid)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("seq, head_dim", [(512, 128), (5000, 64), (77, 40)])
def test_rope_1d_matches_float64(ra, kernel, dtype, seq, head_dim):
    xq, xk = rand((2, seq, 5, head_dim), dtype, seq + 1), rand((2, seq, 3, head_dim), dtype, seq + 2)
    expect_path(kernel, "rope_axes_path", (xq, xk), VECTORIZED)
    run_1d(ra, xq, xk)


@pytest.mark.parametrize("seq, head_dim", [(140_000, 8), (2 ** 24, 2)])
def test_rope_1d_positions_up_to_2_pow_24(ra, seq, head_dim):
    """The largest positions allowed (2^24 - 1), float32: the float64 sincos path."""
    run_1d(ra, rand((1, seq, 1, head_dim), F32, 11), rand((1, seq, 1, head_dim), F32, 12))


@pytest.mark.parametrize("theta", [256.0, 1e6, 1.0, 0.5])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=str)
def test_theta_base(ra, theta, dtype):
    grid = (3, 8, 10)
    run_3d(ra, rand((2, 240, 4, 128), dtype, 13), rand((2, 240, 4, 128), dtype, 14), grid, theta)
    run_1d(ra, rand((2, 300, 4, 64), dtype, 15), rand((2, 300, 2, 64), dtype, 16), theta)


# --- both paths -----------------------------------------------------------------------------

def misaligned(x):
    """A copy of x one element past a 16-byte boundary."""
    buf = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    return buf[1:].view(x.shape).copy_(x)


def odd_head_stride(x):
    """A copy of x in a buffer whose rows are 2 elements longer (head stride not whole words)."""
    buf = torch.empty(*x.shape[:-1], x.shape[-1] + 2, dtype=x.dtype, device=x.device)
    return buf[..., : x.shape[-1]].copy_(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["misaligned pointer", "head stride not whole words"])
def test_scalar_fallback_is_bitwise_the_vector_path(ra, kernel, dtype, case):
    grid = (3, 4, 5)
    xq, xk = rand((2, 60, 6, 128), dtype, 17), rand((2, 60, 2, 128), dtype, 18)
    make = misaligned if case.startswith("misaligned") else odd_head_stride
    q, k = make(xq), xk.clone()
    expect_path(kernel, "rope_axes_path", (q, k), FALLBACK)
    expect_path(kernel, "rope_axes_path", (xq, xk), VECTORIZED)
    ra.rope_3d(q, k, *grid)
    vq, vk = run_3d(ra, xq, xk, grid)
    assert torch.equal(q, vq) and torch.equal(k, vk)
    q, k = xq.clone(), make(xk)
    ra.rope_1d(q, k)
    vq, vk = run_1d(ra, xq, xk)
    assert torch.equal(q, vq) and torch.equal(k, vk)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_head_dim_of_no_whole_words_takes_the_fallback(ra, kernel, dtype):
    head_dim = 34 if dtype == F32 else 36  # 16-byte words hold 4 float32 or 8 half values
    xq, xk = rand((2, 60, 3, head_dim), dtype, 19), rand((2, 60, 1, head_dim), dtype, 20)
    expect_path(kernel, "rope_axes_path", (xq, xk), FALLBACK)
    run_3d(ra, xq, xk, (3, 4, 5))
    run_1d(ra, xq, xk)


@pytest.mark.parametrize("heads", [(40, 8), (8, 40), (1, 3), (5, 0), (0, 5), (24, 24)],
                         ids=lambda h: f"hq{h[0]}-hk{h[1]}")
def test_gqa_head_counts(ra, heads):
    hq, hk = heads
    xq, xk = rand((2, 48, hq, 128), BF16, 21), rand((2, 48, hk, 128), BF16, 22)
    run_3d(ra, xq, xk, (2, 4, 6))
    run_1d(ra, xq, xk)


def test_head_dims_2_to_512(ra):
    for head_dim in range(2, 513, 2):
        xq, xk = rand((1, 12, 2, head_dim), BF16, head_dim), rand((1, 12, 1, head_dim), BF16, head_dim + 1)
        run_3d(ra, xq, xk, (2, 3, 2))


# --- strided views, in place, nothing else touched ------------------------------------------

LAYOUTS = ["padded in a NaN buffer", "fused qkv [B,S,3,H,D]", "packed GQA [B,S,Hq+2Hk,D]",
           "[B,H,S,D] transposed"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_strided_views_are_rotated_in_place(ra, kernel, dtype, layout):
    b, s, hq, hk, d, grid = 2, 60, 8, 2, 128, (3, 4, 5)
    xq, xk = rand((b, s, hq, d), dtype, 23), rand((b, s, hk, d), dtype, 24)
    if layout.startswith("padded"):
        buf = torch.full((b, s + 3, hq + hk + 1, d + 8), float("nan"), dtype=dtype, device=DEV)
        q, k = buf[:, 1:s + 1, :hq, :d], buf[:, 1:s + 1, hq + 1:, :d]
        untouched = torch.ones(buf.shape, dtype=torch.bool, device=DEV)
        untouched[:, 1:s + 1, :hq, :d] = False
        untouched[:, 1:s + 1, hq + 1:, :d] = False
    elif layout.startswith("fused"):
        buf = rand((b, s, 3, hq, d), dtype, 25)
        q, k = buf[:, :, 0], buf[:, :, 1, :hk]
        untouched = torch.ones(buf.shape, dtype=torch.bool, device=DEV)
        untouched[:, :, 0] = False
        untouched[:, :, 1, :hk] = False
    elif layout.startswith("packed"):
        buf = rand((b, s, hq + 2 * hk, d), dtype, 26)
        q, k = buf[:, :, :hq], buf[:, :, hq:hq + hk]
        untouched = torch.ones(buf.shape, dtype=torch.bool, device=DEV)
        untouched[:, :, :hq + hk] = False
    else:
        buf = rand((b, hq + hk, s, d), dtype, 27)
        q, k = buf[:, :hq].transpose(1, 2), buf[:, hq:].transpose(1, 2)
        untouched = torch.zeros(buf.shape, dtype=torch.bool, device=DEV)
    q.copy_(xq)
    k.copy_(xk)
    before = buf.clone()
    expect_path(kernel, "rope_axes_path", (q, k), VECTORIZED)
    q2, k2 = ra.rope_3d(q, k, *grid)
    assert q2 is q and k2 is k
    rq, rk = rope_3d_f64(xq, xk, *grid)
    assert_rotated(q, xq, rq)
    assert_rotated(k, xk, rk)
    # everything outside the two views keeps its bits (NaN included)
    assert torch.equal(buf[untouched].view(torch.uint8), before[untouched].view(torch.uint8))


# --- zero size, errors -------------------------------------------------------------------------

@pytest.mark.parametrize("shape_q, shape_k, grid", [
    ((2, 0, 4, 64), (2, 0, 4, 64), (0, 4, 5)),
    ((0, 60, 4, 64), (0, 60, 2, 64), (3, 4, 5)),
    ((2, 60, 0, 64), (2, 60, 0, 64), (3, 4, 5)),
    ((2, 60, 4, 0), (2, 60, 2, 0), (3, 4, 5)),
])
def test_zero_size_is_a_no_op(ra, shape_q, shape_k, grid):
    q = torch.empty(shape_q, dtype=BF16, device=DEV)
    k = torch.empty(shape_k, dtype=BF16, device=DEV)
    q2, k2 = ra.rope_3d(q, k, *grid)
    q3, k3 = ra.rope_1d(q, k)
    assert q2 is q and k2 is k and q3 is q and k3 is k
    torch.cuda.synchronize()


BAD = {
    "key on cpu": (lambda ra, q, k: ra.rope_3d(q, k.cpu(), 3, 4, 5), RuntimeError,
                   "`key` is on cpu but `query` is on cuda"),
    "grid not seq": (lambda ra, q, k: ra.rope_3d(q, k, 3, 4, 4), RuntimeError, "must equal the seq dim"),
    "key dtype": (lambda ra, q, k: ra.rope_3d(q, k.half(), 3, 4, 5), TypeError, "`key` has dtype Half"),
    "query is key": (lambda ra, q, k: ra.rope_1d(q, q), RuntimeError, "`query` and `key` overlap in memory"),
    "strided last dim": (lambda ra, q, k: ra.rope_1d(q, torch.cat([k, k], -1)[..., ::2]), RuntimeError,
                         "`key` must have a contiguous last dim"),
    "theta": (lambda ra, q, k: ra.rope_1d(q, k, 0.0), RuntimeError, "`theta_base` must be finite and > 0"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_changes_nothing_and_the_next_call_is_right(ra, case):
    call, exc, message = BAD[case]
    xq, xk = rand((2, 60, 4, 64), BF16, 28), rand((2, 60, 2, 64), BF16, 29)
    q, k = xq.clone(), xk.clone()
    with pytest.raises(exc, match=re.escape(message)):
        call(ra, q, k)
    torch.cuda.synchronize()
    assert torch.equal(q, xq) and torch.equal(k, xk)
    run_3d(ra, xq, xk, (3, 4, 5))


# --- diffusers, streams, compile, opcheck ---------------------------------------------------

def test_matches_diffusers_wan_rotation(ra):
    """diffusers' WanAttnProcessor rotation with WanRotaryPosEmbed tables: within one
    bf16 ulp (both round a float32 value within a few float32 ulps of exact), and
    nearly always equal."""
    grid = (3, 8, 10)
    try:
        cos, sin = diffusers_wan_tables(128, *grid, device=DEV)
    except ImportError as e:
        pytest.skip(f"diffusers is not importable here: {e!r}")
    xq, xk = rand((1, 240, 12, 128), BF16, 30), rand((1, 240, 12, 128), BF16, 31)
    q, k = ra.rope_3d(xq.clone(), xk.clone(), *grid)
    for out, x in ((q, xq), (k, xk)):
        expected = diffusers_wan_rotary_apply(x, cos, sin)
        err = (out.double() - expected.double()).abs()
        assert (err <= 2 * half_ulp(expected.double(), BF16) + KERNEL_REL * pair_magnitude(x)).all()
        assert (out != expected).double().mean().item() <= 0.01


def test_runs_on_the_current_stream(ra):
    grid = (3, 4, 5)
    xq, xk = rand((2, 60, 4, 128), BF16, 32), rand((2, 60, 4, 128), BF16, 33)
    q, k = xq.clone(), xk.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ra.rope_3d(q, k, *grid)
        q_after = q.clone()  # ordered after the rotation only if it ran on `side`
    side.synchronize()
    rq, _ = rope_3d_f64(xq, xk, *grid)
    assert_rotated(q_after, xq, rq)


def test_compile_fullgraph_matches_eager_and_mutates_the_inputs(ra):
    grid = (3, 4, 5)
    xq, xk = rand((2, 60, 8, 128), BF16, 34), rand((2, 60, 2, 128), BF16, 35)
    xt, xu = rand((2, 16, 8, 64), BF16, 36), rand((2, 16, 8, 64), BF16, 39)

    def f(q, k, t, u):
        q, k = ra.rope_3d(q, k, *grid)
        t, u = ra.rope_1d(t, u, theta_base=500.0)
        return q * 2, k + 1, t, u

    compiled = torch.compile(f, fullgraph=True)
    eager_in = [x.clone() for x in (xq, xk, xt, xu)]
    compiled_in = [x.clone() for x in (xq, xk, xt, xu)]
    expected = f(*eager_in)
    got = compiled(*compiled_in)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    for a, b in zip(compiled_in, eager_in):  # the in-place updates reach the caller's tensors
        assert torch.equal(a, b)


def test_opcheck(kernel):
    q, k = rand((2, 60, 4, 128), BF16, 37), rand((2, 60, 2, 128), BF16, 38)
    torch.library.opcheck(kernel.ops.rope_3d.default, (q, k, 3, 4, 5, 10000.0))
    torch.library.opcheck(kernel.ops.rope_1d.default, (q, k, 500.0))


# --- backward (issue 36) ------------------------------------------------------------------------------
# While autograd records, rope_3d/rope_1d rotate out of place; the backward turns the grads by -angle
# with the same kernel (and is itself differentiable: the backward's backward turns them back).

from ltx_dev.reference.rope_axes import angles_3d  # noqa: E402

from .backward_support import graph_replays_training_step, grads, nan_filled_allocations, rel_l2  # noqa: E402


def leaves(shape_q, shape_k, dtype, seed):
    return rand(shape_q, dtype, seed).requires_grad_(), rand(shape_k, dtype, seed + 1).requires_grad_()


def f64_grads(fn, q, k, dq, dk):
    """Grads of the float64 reference formula by autograd."""
    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    return torch.autograd.grad(fn(q64, k64), (q64, k64), (dq.double(), dk.double()))


@pytest.mark.parametrize("three_d", [True, False])
@pytest.mark.parametrize("head_dim", [16, 6])  # vectorized (fp32: 4 per word), scalar
def test_gradcheck_and_gradgradcheck_float32(ra, three_d, head_dim):
    q, k = leaves((2, 12, 2, head_dim), (2, 12, 1, head_dim), F32, 60)
    # on clones: a call gradcheck makes without grad would rotate its inputs in place
    if three_d:
        fn = lambda q, k: ra.rope_3d(q.clone(), k.clone(), 2, 2, 3)  # noqa: E731
    else:
        fn = lambda q, k: ra.rope_1d(q.clone(), k.clone())  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k), eps=1e-3, atol=2e-3, rtol=1e-2, nondet_tol=0.0)
    assert torch.autograd.gradgradcheck(fn, (q, k), eps=1e-3, atol=2e-3, rtol=1e-2, nondet_tol=0.0)


@pytest.mark.parametrize("three_d", [True, False])
def test_recording_rotates_out_of_place_and_grads_match_float64(ra, three_d):
    q, k = leaves((2, 60, 4, 128), (2, 60, 2, 128), F32, 61)
    before = q.detach().clone(), k.detach().clone()
    if three_d:
        out = ra.rope_3d(q, k, 3, 4, 5)
        ref = lambda q, k: rope_3d_f64(q, k, 3, 4, 5)  # noqa: E731
    else:
        out = ra.rope_1d(q, k)
        ref = rope_1d_f64
    assert out[0] is not q and torch.equal(q.detach(), before[0]) and torch.equal(k.detach(), before[1])
    assert_rotated(out[0].detach(), before[0], ref(before[0], before[1])[0])
    dq, dk = rand(q.shape, F32, 62), rand(k.shape, F32, 63)
    for g, r in zip(grads(out, (dq, dk), q, k), f64_grads(ref, q, k, dq, dk)):
        assert g.dtype == F32 and (g.double() - r).abs().max().item() <= 1e-5 * r.abs().max().item()


def wan_eager(x, grid):
    """diffusers' Wan rotation (its processor's nested apply_rotary_emb) with float32 tables from the
    float64 angles, repeated over each pair as WanRotaryPosEmbed lays them out."""
    a = angles_3d(*grid, x.shape[-1], device=x.device)
    cos, sin = (t.float().repeat_interleave(2, dim=-1)[None, :, None, :] for t in (a.cos(), a.sin()))
    return diffusers_wan_rotary_apply(x, cos, sin)


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_half_grads_are_no_worse_than_eager_autograd_of_wan(ra, dtype):
    """Wan 1.3B's heads (12 of 128) on a 480p-like grid slice, against eager autograd of diffusers' Wan
    rotation, both measured against the float64 backward."""
    grid = (3, 30, 52)
    q, k = leaves((2, 3 * 30 * 52, 12, 128), (2, 3 * 30 * 52, 12, 128), dtype, 64)
    dq, dk = rand(q.shape, dtype, 65), rand(k.shape, dtype, 66)
    ours = grads(ra.rope_3d(q, k, *grid), (dq, dk), q, k)
    eager = grads((wan_eager(q, grid), wan_eager(k, grid)), (dq, dk), q, k)
    refs = f64_grads(lambda q, k: rope_3d_f64(q, k, *grid), q, k, dq, dk)
    for o, e, r in zip(ours, eager, refs):
        assert o.dtype == e.dtype == dtype
        assert rel_l2(o, r) <= max(rel_l2(e, r) * 1.01, 2.0 ** -MANTISSA_BITS[dtype])


def test_backward_is_deterministic_writes_every_element_and_takes_expanded_grads(ra):
    q, k = leaves((2, 2688, 32, 64), (2, 2688, 32, 64), BF16, 67)
    with nan_filled_allocations():
        first = grads(ra.rope_3d(q, k, 7, 16, 24), (torch.ones_like(q), torch.ones_like(k)), q, k)
        assert not any(torch.isnan(g).any() for g in first)
        again = grads(ra.rope_3d(q, k, 7, 16, 24), (torch.ones_like(q), torch.ones_like(k)), q, k)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
    # sum().backward() hands stride-0 grads: the same result
    out = ra.rope_3d(q, k, 7, 16, 24)
    expanded = grads(out[0].sum() + out[1].sum(), torch.ones((), device=DEV, dtype=BF16), q, k)
    assert all(torch.equal(a, b) for a, b in zip(first, expanded))


def test_only_one_tensor_requiring_grad(ra):
    q = rand((1, 24, 2, 64), BF16, 68).requires_grad_()
    k = rand((1, 24, 2, 64), BF16, 69)
    out_q, out_k = ra.rope_1d(q, k)
    assert out_k.grad_fn is not None  # one result of the op; k itself gets no grad
    (dq,) = grads(out_q, torch.ones_like(out_q), q)
    assert dq.shape == q.shape


def test_opcheck_functional_op_with_autograd(kernel):
    q, k = leaves((2, 12, 3, 64), (2, 12, 1, 64), BF16, 70)
    torch.library.opcheck(kernel.ops.rope_axes_fwd.default, (q, k, 2, 2, 3, 10000.0, True, False))
    torch.library.opcheck(kernel.ops.rope_axes_fwd.default, (q, k, 0, 1, 1, 10000.0, False, True))


def test_cuda_graph_of_forward_and_backward(ra):
    q, k = leaves((2, 1560, 12, 128), (2, 1560, 12, 128), BF16, 71)
    dq, dk = rand(q.shape, BF16, 72), rand(k.shape, BF16, 73)

    def step():
        torch.autograd.backward(ra.rope_3d(q, k, 1, 30, 52), (dq, dk))

    def refill():
        q.copy_(rand(q.shape, BF16, 74))
        dq.copy_(rand(q.shape, BF16, 75))

    graph_replays_training_step(step, [q, k], refill)


def test_compiled_training_step_matches_eager(ra):
    q, k = leaves((2, 12, 4, 64), (2, 12, 4, 64), BF16, 76)
    dq, dk = rand(q.shape, BF16, 77), rand(k.shape, BF16, 78)
    f = lambda q, k: tuple(t * 2 for t in ra.rope_3d(q, k, 2, 2, 3))  # noqa: E731
    compiled = torch.compile(f, fullgraph=True)
    for a, b in zip(grads(compiled(q, k), (dq, dk), q, k), grads(f(q, k), (dq, dk), q, k)):
        assert torch.equal(a, b)
