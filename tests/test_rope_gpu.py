"""LTX RoPE application on the GPU (issue 4, item 1): bitwise the eager
formula of diffusers' `apply_rotary_emb` (and the real function when
diffusers is installed), shared (stride-0) and per-sample tables, both
kernel paths, in place, bad input, compile and opcheck. Skipped without CUDA."""

from __future__ import annotations

import re

import pytest
import torch

from .conftest import cuda, expect_path

pytestmark = cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
VECTORIZED, FALLBACK = 0, 1


def eager_rotary(x, cos, sin):
    """diffusers transformer_ltx.apply_rotary_emb, written out."""
    x_real, x_imag = x.unflatten(2, (-1, 2)).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(2)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def rand(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") * 2).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [2048, 4096, 96, 130])
def test_matches_the_eager_formula_bitwise(kernel, dtype, dim):
    cos, sin = kernel.ltx_rope_cos_sin(7, 16, 24, (8 / 25, 32, 32), dim, batch_size=2, device="cuda")
    x = rand((2, 7 * 16 * 24, dim), dtype, dim)
    out = torch.full_like(x, float("nan"))
    kernel.apply_rotary_emb(x, cos, sin, out=out)
    assert torch.equal(out, eager_rotary(x, cos, sin))
    # per-sample (contiguous) tables, as diffusers returns them
    assert torch.equal(kernel.apply_rotary_emb(x, cos.contiguous(), sin.contiguous()), out)


def test_matches_diffusers_apply_rotary_emb(kernel):
    try:
        from diffusers.models.transformers import transformer_ltx as ltx
    except Exception as e:  # noqa: BLE001 - diffusers, or one of its own dependencies, is missing
        pytest.skip(f"diffusers is not importable here: {e!r}")
    module = ltx.LTXVideoRotaryPosEmbed(2048)
    x = rand((2, 2688, 2048), torch.bfloat16, 1)
    cos, sin = module(x, 7, 16, 24, (8 / 25, 32, 32))
    assert torch.equal(kernel.apply_rotary_emb(x, cos, sin), ltx.apply_rotary_emb(x, (cos, sin)))


def test_fallback_path_and_in_place_give_the_same_result(kernel):
    cos, sin = kernel.ltx_rope_cos_sin(2, 4, 6, None, 2048, batch_size=2, device="cuda")
    x = rand((2, 48, 2048), torch.bfloat16, 2)
    expected = eager_rotary(x, cos, sin)
    expect_path(kernel, "rope_path", (torch.empty_like(x), x, cos, sin), VECTORIZED)
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:].view(x.shape).copy_(x)
    expect_path(kernel, "rope_path", (torch.empty_like(x), shifted, cos, sin), FALLBACK)
    assert torch.equal(kernel.apply_rotary_emb(shifted, cos, sin), expected)
    y = x.clone()
    assert kernel.apply_rotary_emb(y, cos, sin, out=y) is y and torch.equal(y, expected)


BAD = {
    "bf16 tables": (lambda k, x, c, s: k.apply_rotary_emb(x, c.bfloat16(), s), TypeError, "must be torch.float32"),
    "odd dim": (lambda k, x, c, s: k.apply_rotary_emb(x[..., :63], c[..., :63], s[..., :63]), RuntimeError,
                "must be even"),
    "table shape": (lambda k, x, c, s: k.apply_rotary_emb(x, c[:, :4], s), RuntimeError, "`cos` has shape"),
    "cpu table": (lambda k, x, c, s: k.apply_rotary_emb(x, c.cpu(), s), RuntimeError, "`cos` is on cpu"),
    "2-d x": (lambda k, x, c, s: k.apply_rotary_emb(x[0], c, s), RuntimeError, "[batch, seq, dim]"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_and_the_next_call_is_right(kernel, case):
    call, exc, message = BAD[case]
    cos, sin = kernel.ltx_rope_cos_sin(1, 2, 4, None, 64, batch_size=2, device="cuda")
    x = rand((2, 8, 64), torch.bfloat16, 3)
    with pytest.raises(exc, match=re.escape(message)):
        call(kernel, x, cos, sin)
    assert torch.equal(kernel.apply_rotary_emb(x, cos, sin), eager_rotary(x, cos, sin))


def test_compile_fullgraph_and_opcheck(kernel):
    cos, sin = kernel.ltx_rope_cos_sin(1, 2, 4, None, 256, batch_size=2, device="cuda")
    x = rand((2, 8, 256), torch.bfloat16, 4)
    f = torch.compile(lambda x, c, s: kernel.apply_rotary_emb(x, c, s), fullgraph=True)
    assert torch.equal(f(x, cos, sin), eager_rotary(x, cos, sin))
    torch.library.opcheck(kernel.ops.apply_rotary_emb.default, (torch.empty_like(x), x, cos.contiguous(),
                                                                  sin.contiguous()))


# --- backward (issue 36) ------------------------------------------------------------------------------
# dx is the transposed rotation of dy: float32 products and sum, one rounding. Eager autograd of the
# diffusers code rounds its two partial grads (dy * cos, dy * sin) to x's dtype before adding them.

from ltx_dev.reference.rope import diffusers_ltx_apply_rotary_emb  # noqa: E402

from .backward_support import graph_replays_training_step, grads, nan_filled_allocations, rel_l2  # noqa: E402


def rotary_backward_f64(dy, cos, sin, with_terms=False):
    """The transpose of x -> x * cos + partner(x) * sin on interleaved pairs, in float64 (and, with
    `with_terms`, the sum of the products' magnitudes, the scale of a float32 evaluation's error)."""
    d0, d1 = dy.double().unflatten(-1, (-1, 2)).unbind(-1)
    c0, c1 = cos.double().unflatten(-1, (-1, 2)).unbind(-1)
    s0, s1 = sin.double().unflatten(-1, (-1, 2)).unbind(-1)
    dx = torch.stack([d0 * c0 + d1 * s1, d1 * c1 - d0 * s0], dim=-1).flatten(-2)
    if not with_terms:
        return dx
    terms = torch.stack([(d0 * c0).abs() + (d1 * s1).abs(), (d1 * c1).abs() + (d0 * s0).abs()], -1).flatten(-2)
    return dx, terms


def random_tables(shape, seed):
    """cos/sin with different values at 2i and 2i+1, so a transpose taken the wrong way round shows."""
    return rand(shape, torch.float32, seed), rand(shape, torch.float32, seed + 1)


@pytest.mark.parametrize("dim", [8, 6])  # vectorized (fp32: 4 per word), scalar
def test_gradcheck_float32(kernel, dim):
    x = rand((2, 3, dim), torch.float32, 30).requires_grad_()
    cos, sin = random_tables((1, 3, dim), 31)
    assert torch.autograd.gradcheck(lambda t: kernel.apply_rotary_emb(t, cos, sin), (x,), eps=1e-3, atol=2e-3,
                                    rtol=1e-2, nondet_tol=0.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [2048, 130])
def test_grad_is_the_transposed_rotation_rounded_once(kernel, dtype, dim):
    x = rand((2, 96, dim), dtype, 32).requires_grad_()
    cos, sin = random_tables((2, 96, dim), 33)
    dy = rand((2, 96, dim), dtype, 34)
    (dx,) = grads(kernel.apply_rotary_emb(x, cos, sin), dy, x)
    assert dx.dtype == dtype and dx.shape == x.shape
    ref, terms = rotary_backward_f64(dy, cos, sin, with_terms=True)
    expected = ref.float().to(dtype)
    if dtype == torch.float32:  # two rounded products and a rounded sum: within 3 half-ulps of the terms (4: margin)
        assert ((dx.double() - ref).abs() <= 4 * 2.0 ** -24 * terms).all()
    else:  # float32 math, one rounding: the correctly rounded value but for rare boundary cases
        assert torch.equal(dx, expected) or rel_l2(dx, expected) < 2**-12


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_grads_are_no_worse_than_eager_autograd_of_diffusers(kernel, dtype):
    """LTX-Video 2B's shape with its own tables (stride-0 batch) against eager autograd of diffusers'
    apply_rotary_emb, both measured against the float64 transpose."""
    cos, sin = kernel.ltx_rope_cos_sin(7, 16, 24, (8 / 25, 32, 32), 2048, batch_size=2, device="cuda")
    x = rand((2, 2688, 2048), dtype, 35).requires_grad_()
    dy = rand((2, 2688, 2048), dtype, 36)
    (ours,) = grads(kernel.apply_rotary_emb(x, cos, sin), dy, x)
    (eager,) = grads(diffusers_ltx_apply_rotary_emb()(x, (cos, sin)), dy, x)
    ref = rotary_backward_f64(dy, cos, sin)
    assert ours.dtype == eager.dtype == dtype
    assert rel_l2(ours, ref) <= rel_l2(eager, ref) * 1.01  # one rounding against eager's three


def test_backward_is_bitwise_deterministic_and_writes_every_element(kernel):
    cos, sin = kernel.ltx_rope_cos_sin(3, 8, 8, None, 2048, batch_size=2, device="cuda")
    x = rand((2, 192, 2048), torch.bfloat16, 37).requires_grad_()
    dy = rand((2, 192, 2048), torch.bfloat16, 38)
    with nan_filled_allocations():
        first = grads(kernel.apply_rotary_emb(x, cos, sin), dy, x)[0]
        assert not torch.isnan(first).any()
        for _ in range(2):
            assert torch.equal(grads(kernel.apply_rotary_emb(x, cos, sin), dy, x)[0], first)


def test_strided_upstream_grad_and_strided_x(kernel):
    cos, sin = random_tables((1, 64, 130), 39)
    x = rand((2, 64, 131), torch.bfloat16, 40)[..., 1:].detach().requires_grad_()  # misaligned rows
    dy = rand((130, 64, 2), torch.bfloat16, 41).permute(2, 1, 0)  # last dim strided: copied once
    (dx,) = grads(kernel.apply_rotary_emb(x, cos, sin), dy, x)
    assert rel_l2(dx, rotary_backward_f64(dy, cos.expand(2, -1, -1), sin.expand(2, -1, -1))) < 2**-8


def test_tables_requiring_grad_or_out_are_refused_while_recording(kernel):
    x = rand((1, 4, 8), torch.bfloat16, 42).requires_grad_()
    cos, sin = random_tables((1, 4, 8), 43)
    with pytest.raises(kernel.NoBackwardError, match=r"`sin` requires grad.*grads for `x` only"):
        kernel.apply_rotary_emb(x, cos, sin.requires_grad_())
    with pytest.raises(kernel.NoBackwardError, match=r"`out`"):
        kernel.apply_rotary_emb(x, cos, sin.detach(), out=torch.empty_like(x))
    with torch.no_grad():  # inference is unchanged
        assert kernel.apply_rotary_emb(x, cos, sin, out=torch.empty_like(x)).grad_fn is None


def test_opcheck_functional_ops_with_autograd(kernel):
    x = rand((2, 5, 64), torch.bfloat16, 44).requires_grad_()
    cos, sin = random_tables((1, 5, 64), 45)
    torch.library.opcheck(kernel.ops.apply_rotary_emb_fwd.default, (x, cos, sin))
    torch.library.opcheck(kernel.ops.apply_rotary_emb_bwd.default, (torch.ones_like(x.detach()), cos, sin))


def test_cuda_graph_of_forward_and_backward(kernel):
    cos, sin = kernel.ltx_rope_cos_sin(3, 8, 8, None, 2048, batch_size=2, device="cuda")
    x = rand((2, 192, 2048), torch.bfloat16, 46).requires_grad_()
    dy = rand((2, 192, 2048), torch.bfloat16, 47)
    graph_replays_training_step(lambda: kernel.apply_rotary_emb(x, cos, sin).backward(dy), [x],
                                lambda: x.copy_(rand(x.shape, x.dtype, 48)))


def test_compiled_training_step_matches_eager(kernel):
    cos, sin = random_tables((1, 16, 256), 49)
    x = rand((2, 16, 256), torch.bfloat16, 50).requires_grad_()
    dy = rand((2, 16, 256), torch.bfloat16, 51)
    f = lambda x: kernel.apply_rotary_emb(x, cos, sin) * 2  # noqa: E731
    assert torch.equal(grads(torch.compile(f, fullgraph=True)(x), dy, x)[0], grads(f(x), dy, x)[0])
