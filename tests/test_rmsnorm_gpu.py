"""RMSNorm on the GPU: numerics against float64, both rounding behaviours
against the models' own eager code, every kernel path, compile, opcheck and
kernelize. Skipped without CUDA."""

from __future__ import annotations

import random

import pytest
import torch

from ltx_dev.reference.numerics import ulp_distance
from ltx_dev.reference.rmsnorm import diffusers_rms_norm, rms_norm_backward_f64, rms_norm_f64, torch_rms_norm

from . import conftest
from .backward_support import graph_replays_training_step, grads, nan_filled_allocations, rel_l2
from .conftest import cuda, expect_path
from .stream_chain import assert_chain_sees_each_output

pytestmark = cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# Bound on |y - ref64| relative to max(|ref64|, 1): one rounding of T, and for
# "diffusers" rounding with a half weight, two.
TOL = {torch.bfloat16: 2 * 2**-8, torch.float16: 2 * 2**-11, torch.float32: 1e-5}
VECTORIZED, FALLBACK = 0, 1


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def rand(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") * 2 + 0.3).to(dtype)


def check_against_f64(y, x, w, eps, dtype):
    assert not torch.isnan(y).any(), "an output element was not written"
    ref = rms_norm_f64(x, w, eps)
    err = (y.double() - ref).abs() / ref.abs().clamp_min(1.0)
    assert err.max().item() <= TOL[dtype], err.max().item()


def random_shapes(n, seed):
    rnd = random.Random(seed)
    shapes = [(1, 1), (3, 7), (5, 8), (2, 127), (2, 128), (4, 2047), (4, 2048), (2, 3072), (3, 4096), (2, 8192),
              (1, 16384), (1, 65536), (1, 65544), (7, 100000),
              (3, 1536), (2, 5120), (2, 6144), (9000, 3072), (5000, 5120)]  # one word per thread at 3072-6144
    for _ in range(n):
        hidden = rnd.choice([rnd.randint(1, 9000), 8 * rnd.randint(1, 1024)])
        lead = tuple(rnd.randint(1, 5) for _ in range(rnd.randint(1, 3)))
        shapes.append(lead + (hidden,))
    return shapes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rounding", ["torch", "diffusers"])
@pytest.mark.parametrize("weight_kind", ["none", "same", "fp32"])
def test_matches_float64_reference_over_random_shapes(kernel, dtype, rounding, weight_kind):
    for i, shape in enumerate(random_shapes(12, seed=hash((str(dtype), rounding, weight_kind)) % 1000)):
        x = rand(shape, dtype, seed=i)
        w = None if weight_kind == "none" else rand(shape[-1:], dtype if weight_kind == "same" else torch.float32,
                                                   seed=1000 + i)
        out_dtype = torch.float32 if (rounding == "diffusers" and weight_kind == "fp32") else dtype
        out = poisoned(shape, out_dtype)
        y = kernel.rmsnorm(x, w, 1e-6, out=out, rounding=rounding)
        assert y is out
        check_against_f64(y, x, w, 1e-6, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hidden", [128, 2048, 3072, 4096])
def test_diffusers_rounding_reproduces_diffusers_rmsnorm(kernel, dtype, hidden):
    x = rand((4096, hidden), dtype, seed=hidden)
    w = rand((hidden,), dtype, seed=hidden + 1)
    ours = kernel.rmsnorm(x, w, 1e-6, rounding="diffusers")
    theirs = diffusers_rms_norm(x, w, 1e-6)
    other = torch_rms_norm(x, w, 1e-6)
    ulps = ulp_distance(ours, theirs)
    # Only the fp32 reduction order differs, on a tiny fraction of elements:
    # there the intermediate T(x*r) is 1 ulp off, which the multiply by |w| > 1
    # can make 2 ulps of the output.
    assert ulps.max().item() <= 2
    assert (ulps > 0).float().mean().item() < 1e-3
    # ... while the other rounding differs from diffusers on a large fraction.
    assert (other != theirs).float().mean().item() > 0.05


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hidden", [128, 2048, 4096])
def test_torch_rounding_reproduces_nn_rmsnorm(kernel, dtype, hidden):
    x = rand((4096, hidden), dtype, seed=hidden)
    m = torch.nn.RMSNorm(hidden, eps=1e-5, device="cuda", dtype=dtype)
    with torch.no_grad():
        m.weight.copy_(rand((hidden,), dtype, seed=7))
        theirs = m(x)
    ours = kernel.rmsnorm(x, m.weight.detach(), 1e-5, rounding="torch")  # a Parameter: no op has a backward
    ulps = ulp_distance(ours, theirs)
    assert ulps.max().item() <= 1
    assert (ulps > 0).float().mean().item() < 1e-3
    exact = torch_rms_norm(x, m.weight, 1e-5)
    assert (ulp_distance(ours, exact) > 0).float().mean().item() < 1e-3


def test_without_weight_both_roundings_are_identical(kernel):
    x = rand((512, 2048), torch.bfloat16, seed=3)
    a = kernel.rmsnorm(x, None, 1e-6, rounding="diffusers")
    b = kernel.rmsnorm(x, None, 1e-6, rounding="torch")
    assert torch.equal(a, b)
    assert ulp_distance(a, diffusers_rms_norm(x, None, 1e-6)).max().item() <= 1


def test_diffusers_rounding_with_fp32_weight_returns_fp32_like_diffusers(kernel):
    x = rand((64, 2048), torch.bfloat16, seed=4)
    w = rand((2048,), torch.float32, seed=5)
    y = kernel.rmsnorm(x, w, 1e-6, rounding="diffusers")
    ref = diffusers_rms_norm(x, w, 1e-6)
    assert y.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)


def path_args(out, x, w=None):
    """rmsnorm_path's arguments (it takes no eps)."""
    return out, x, w


@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_view_takes_the_fallback_and_is_correct(kernel, dtype):
    rows, hidden = 33, 2048
    base = rand((rows * hidden + 1,), dtype, seed=8)
    x = base[1:].view(rows, hidden)  # storage offset of one element: not 16-byte aligned
    w = rand((hidden,), dtype, seed=9)
    out = poisoned((rows, hidden), dtype)
    expect_path(kernel, "rmsnorm_path", path_args(out, x, w), FALLBACK)
    check_against_f64(kernel.rmsnorm(x, w, 1e-6, out=out), x, w, 1e-6, dtype)


@pytest.mark.parametrize("hidden", [1, 7, 100, 2047, 4095])
def test_hidden_not_a_multiple_of_the_vector_takes_the_fallback(kernel, hidden):
    x = rand((17, hidden), torch.bfloat16, seed=hidden)
    out = poisoned((17, hidden), torch.bfloat16)
    expect_path(kernel, "rmsnorm_path", path_args(out, x), FALLBACK)
    check_against_f64(kernel.rmsnorm(x, None, 1e-6, out=out), x, None, 1e-6, torch.bfloat16)


def test_aligned_contiguous_input_takes_the_vectorized_path(dev_kernel):
    kernel = dev_kernel
    x = rand((8, 2048), torch.bfloat16, seed=1)
    expect_path(kernel, "rmsnorm_path", path_args(torch.empty_like(x), x), VECTORIZED)


def test_row_strided_view_is_read_in_place(kernel):
    big = rand((64, 2048 + 64), torch.bfloat16, seed=10)
    x = big[:, 32:32 + 2048]  # rows 2112 apart, 16-byte aligned
    out = poisoned((64, 2048), torch.bfloat16)
    expect_path(kernel, "rmsnorm_path", path_args(out, x), VECTORIZED)
    check_against_f64(kernel.rmsnorm(x, None, 1e-6, out=out), x, None, 1e-6, torch.bfloat16)


def test_non_contiguous_last_dim_is_copied_and_correct(kernel):
    xt = rand((256, 64), torch.bfloat16, seed=11).t()  # [64, 256] with last-dim stride 64
    y = kernel.rmsnorm(xt, None, 1e-6)
    assert y.is_contiguous()
    check_against_f64(y, xt, None, 1e-6, torch.bfloat16)


def test_in_place_output_equals_out_of_place(kernel):
    x = rand((128, 2048), torch.bfloat16, seed=12)
    w = rand((2048,), torch.bfloat16, seed=13)
    expected = kernel.rmsnorm(x, w, 1e-6)
    y = x.clone()
    kernel.rmsnorm(y, w, 1e-6, out=y)
    assert torch.equal(y, expected)


@pytest.mark.parametrize("shape", [(0, 2048), (2, 0, 2048), (4, 0)])
def test_zero_size_input_is_a_no_op(kernel, shape):
    x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    y = kernel.rmsnorm(x, None, 1e-6)
    assert y.shape == x.shape
    torch.cuda.synchronize()


def test_rejected_calls_leave_the_next_call_correct(kernel):
    x = rand((16, 2048), torch.bfloat16, seed=14)
    bad = [
        lambda: kernel.rmsnorm(x, torch.ones(2048, dtype=torch.float16, device="cuda")),  # dtype
        lambda: kernel.rmsnorm(x, torch.ones(1024, dtype=torch.bfloat16, device="cuda")),  # shape
        lambda: kernel.rmsnorm(x, torch.ones(2048, dtype=torch.bfloat16)),  # device
        lambda: kernel.rmsnorm(x.cpu()),
    ]
    for call in bad:
        with pytest.raises((RuntimeError, TypeError)):
            call()
    check_against_f64(kernel.rmsnorm(x, None, 1e-6), x, None, 1e-6, torch.bfloat16)


def test_weight_on_another_device_is_named(kernel):
    x = rand((4, 64), torch.bfloat16, seed=15)
    with pytest.raises(RuntimeError, match="`weight` is on cpu"):
        kernel.rmsnorm(x, torch.ones(64, dtype=torch.bfloat16))


def test_runs_on_the_current_stream(kernel):
    x = rand((2048, 2048), torch.bfloat16, seed=16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = kernel.rmsnorm(x, None, 1e-6)
        z = y * 1  # same stream: must see the finished output
    torch.cuda.current_stream().wait_stream(s)
    check_against_f64(z, x, None, 1e-6, torch.bfloat16)


def test_chained_calls_see_the_previous_output_with_and_without_dependent_launch(kernel, launch_mode):
    """Each call normalises the previous call's output (a read-after-write
    between back-to-back kernels, eagerly and in a CUDA graph), so a kernel
    that read its input before the previous kernel finished would differ from
    the same chain run one synchronised call at a time."""
    x = rand((2 * 8160, 2048), torch.bfloat16, seed=3)
    w = rand((2048,), torch.bfloat16, seed=4)

    def chain(sync):  # every output returned, so the graph replay poisons and checks all six
        outs = []
        for i in range(6):
            y = outs[-1] if outs else x
            outs.append(kernel.rmsnorm(y * 1.5 if i == 3 else y, w, 1e-6, out=torch.empty_like(x)))
            if sync:
                torch.cuda.synchronize()
        return outs

    assert (ulp_distance(chain(True)[-1], torch_rms_norm(x, w, 1e-6)) > 0).any()  # the chain changed the values
    assert_chain_sees_each_output(chain)


def test_torch_compile_fullgraph_has_no_graph_break(kernel):
    x = rand((2, 2688, 2048), torch.bfloat16, seed=17)
    w = rand((2048,), torch.bfloat16, seed=18)

    def f(x, w):
        return kernel.rmsnorm(x, w, 1e-6, rounding="diffusers") * 2 + kernel.rmsnorm(x, None, 1e-6)

    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), f(x, w), rtol=0, atol=0)


@pytest.mark.parametrize("diffusers_rounding", [False, True])
def test_opcheck(kernel, diffusers_rounding):
    x = rand((3, 5, 256), torch.bfloat16, seed=19)
    w = rand((256,), torch.bfloat16, seed=20)
    op = kernel.ops.rmsnorm.default
    torch.library.opcheck(op, (torch.empty_like(x), x, w, 1e-6, diffusers_rounding))
    torch.library.opcheck(op, (torch.empty_like(x), x, None, 1e-5, diffusers_rounding))


def test_kernelize_replaces_diffusers_style_rmsnorm_forward(kernel):
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

    @use_kernel_forward_from_hub("RMSNorm")
    class RMSNorm(torch.nn.Module):  # the shape of diffusers' RMSNorm
        def __init__(self, dim, eps, elementwise_affine):
            super().__init__()
            self.eps = eps
            self.weight = torch.nn.Parameter(torch.randn(dim)) if elementwise_affine else None
            self.bias = None

        def forward(self, hidden_states):
            return diffusers_rms_norm(hidden_states, self.weight, self.eps)

    model = torch.nn.Sequential(RMSNorm(2048, 1e-6, True), RMSNorm(2048, 1e-6, False)).cuda().bfloat16()
    x = rand((2, 300, 2048), torch.bfloat16, seed=21)
    with torch.no_grad():
        expected = model(x)
    mapping = {"RMSNorm": {"cuda": LocalLayerRepository(conftest.KERNEL_ROOT, layer_name="RMSNorm")}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE, device="cuda")
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got = model(x)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert sum("rmsnorm_vectorized" in n for n in names) == 2, names
    assert ulp_distance(got, expected).max().item() <= 1


BINDING_THROW = """
import sys, torch
from pathlib import Path
import kernels
k = kernels.get_local_kernel(Path(sys.argv[1]))
x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
out = torch.empty_like(x)
bad = [
    (out, x, torch.ones(64, device="cuda", dtype=torch.float16), "`weight` has dtype"),  # TypeError
    (out, x, torch.ones(32, device="cuda", dtype=x.dtype), "`weight` has shape [32] but must be [64]"),
    (torch.empty(4, 63, device="cuda", dtype=x.dtype), x, None, "`out` has shape [4, 63]"),
    (out, x, torch.ones(64, dtype=x.dtype), "`weight` is on cpu"),
]
for o, i, w, expected in bad:
    try:
        k.ops.rmsnorm(o, i, w, 1e-6, False)  # the raw op: the binding itself raises
        print("no error for", expected)
    except (RuntimeError, TypeError) as e:
        print("raised:" if expected in str(e) else "wrong message:", str(e).splitlines()[0])
y = k.rmsnorm(x)  # the process and the CUDA context are still fine
torch.cuda.synchronize()
print("valid call ok:", bool(torch.isfinite(y).all()))
"""


def test_errors_raised_inside_the_binding_reach_python():
    # Integer formatting in these messages once crashed the process on the GPU
    # machine (two libstdc++ copies; torch-ext/check.h). Fresh processes, twice.
    import subprocess
    import sys

    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", BINDING_THROW, str(conftest.KERNEL_ROOT)], capture_output=True, text=True)
        assert proc.returncode == 0, (proc.returncode, proc.stdout[-1000:], proc.stderr[-2000:])
        assert proc.stdout.count("raised:") == 4 and "valid call ok: True" in proc.stdout, proc.stdout


# --- backward (issue 36) ------------------------------------------------------------------------------
# Shapes: hidden 2048 and 1536 (LTX-Video 2B, Wan 1.3B) and 8192 take the vectorized backward (1, 1 and 4
# words per thread in bf16); 2047 and 5120 in float32 (1280 words) the scalar one. 9001 rows leave the last
# backward block short; so do 5376 (LTX-Video 2B's rows, at a narrow hidden), split to fill one wave (489
# blocks of 11).
BWD_SHAPES = [(3, 8), (9001, 2048), (2, 700, 1536), (5, 8192), (33, 2047), (2, 2688, 256)]


def leaves(shape, dtype, weight_kind, seed):
    """x and w (None, the input's dtype or float32) that require grad, and an upstream grad of the output's dtype."""
    x = rand(shape, dtype, seed).requires_grad_()
    w = None
    if weight_kind != "none":
        w = rand(shape[-1:], dtype if weight_kind == "same" else torch.float32, seed + 1).requires_grad_()
    return x, w


@pytest.mark.parametrize("rounding", ["torch", "diffusers"])
@pytest.mark.parametrize("weight_kind", ["none", "same"])
@pytest.mark.parametrize("hidden", [8, 7])  # vectorized, scalar
def test_gradcheck_float32(kernel, rounding, weight_kind, hidden):
    """Numerical vs our analytical Jacobian on float32 (central differences, eps 1e-3: fp32 rounding of
    O(1) outputs gives ~1e-4 relative error in a difference quotient, hence the tolerances)."""
    x, w = leaves((3, hidden), torch.float32, weight_kind, seed=hidden)
    inputs = (x,) if w is None else (x, w)
    fn = lambda *t: kernel.rmsnorm(t[0], t[1] if len(t) > 1 else None, 1e-6, rounding=rounding)  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-3, atol=2e-3, rtol=1e-2, nondet_tol=0.0)


@pytest.mark.parametrize("rounding", ["torch", "diffusers"])
@pytest.mark.parametrize("weight_kind", ["none", "same"])
@pytest.mark.parametrize("shape", [(3, 8), (4, 2048), (33, 2047), (3, 5120)])
def test_float32_grads_match_the_float64_backward(kernel, rounding, weight_kind, shape):
    x, w = leaves(shape, torch.float32, weight_kind, seed=shape[-1])
    dy = rand(shape, torch.float32, seed=7)
    got = grads(kernel.rmsnorm(x, w, 1e-6, rounding=rounding), dy, x, w)
    dx, dw = rms_norm_backward_f64(dy, x.detach(), None if w is None else w.detach(), 1e-6, rounding)
    for g, ref in zip(got, (dx, dw)):
        # float32 math: the row sum's rounding, relative to the largest grad
        assert (g.double() - ref).abs().max().item() <= 1e-5 * max(ref.abs().max().item(), 1.0)


# Relative L2 bound of our grads against the float64 backward: one rounding of the output dtype
# (2^-8 bf16, 2^-11 fp16) with 2x room; and never worse than 1.1x the models' eager autograd.
GRAD_TOL = {torch.bfloat16: 2 * 2**-8, torch.float16: 2 * 2**-11}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rounding", ["torch", "diffusers"])
@pytest.mark.parametrize("weight_kind", ["none", "same", "fp32"])
@pytest.mark.parametrize("shape", BWD_SHAPES[1:])
def test_half_grads_are_no_worse_than_eager_autograd(kernel, dtype, rounding, weight_kind, shape):
    """Against eager autograd of the model's own code: F.rms_norm ("torch") or diffusers' RMSNorm
    ("diffusers"), both measured against the float64 backward."""
    x, w = leaves(shape, dtype, weight_kind, seed=len(shape) + shape[-1])
    ours = kernel.rmsnorm(x, w, 1e-6, rounding=rounding)
    if rounding == "torch" and weight_kind == "fp32":
        theirs = torch_rms_norm(x, w, 1e-6)  # F.rms_norm's decomposition: F.rms_norm wants one dtype
    elif rounding == "torch":
        theirs = torch.nn.functional.rms_norm(x, shape[-1:], w, 1e-6)
    else:
        theirs = diffusers_rms_norm(x, w, 1e-6)
    assert ours.dtype == theirs.dtype
    dy = rand(shape, ours.dtype, seed=11)
    got, eager = grads(ours, dy, x, w), grads(theirs, dy, x, w)
    refs = rms_norm_backward_f64(dy, x.detach(), None if w is None else w.detach(), 1e-6, rounding)
    for name, g, e, ref in zip(("dx", "dw"), got, eager, refs):
        assert g.dtype == e.dtype and g.shape == e.shape, name
        assert not torch.isnan(g).any(), name
        err, eager_err = rel_l2(g, ref), rel_l2(e, ref)
        assert err <= max(GRAD_TOL[dtype], 1.1 * eager_err), (name, err, eager_err)


@pytest.mark.parametrize("shape, dtype", [((2, 2688, 2048), torch.bfloat16), ((33, 2047), torch.bfloat16),
                                          ((4, 5120), torch.float32)])
@pytest.mark.parametrize("rounding", ["torch", "diffusers"])
def test_backward_is_bitwise_deterministic(kernel, shape, dtype, rounding):
    x, w = leaves(shape, dtype, "same", seed=3)
    dy = rand(shape, dtype, seed=4)
    first = grads(kernel.rmsnorm(x, w, 1e-6, rounding=rounding), dy, x, w)
    for _ in range(3):
        again = grads(kernel.rmsnorm(x, w, 1e-6, rounding=rounding), dy, x, w)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("shape", BWD_SHAPES)
@pytest.mark.parametrize("weight_kind", ["none", "same", "fp32"])
def test_every_grad_element_is_written(kernel, shape, weight_kind):
    with nan_filled_allocations():  # outputs and the dw workspace too
        x, w = leaves(shape, torch.bfloat16, weight_kind, seed=5)
        y = kernel.rmsnorm(x, w, 1e-6, rounding="diffusers")
        for g in grads(y, torch.ones_like(y), x, w):
            assert not torch.isnan(g).any()


def test_misaligned_and_strided_inputs_get_correct_grads(kernel):
    base = rand((64, 2049), torch.bfloat16, seed=6)
    x = base[:, 1:].detach().requires_grad_()  # misaligned rows: the forward's scalar path (the backward copies)
    w = rand((2048,), torch.bfloat16, seed=7).requires_grad_()
    dy = rand((2048, 64), torch.bfloat16, seed=8).t()  # a transposed upstream grad: copied once
    got = grads(kernel.rmsnorm(x, w, 1e-6), dy, x, w)
    for g, ref in zip(got, rms_norm_backward_f64(dy, x.detach(), w.detach(), 1e-6)):
        assert rel_l2(g, ref) <= GRAD_TOL[torch.bfloat16]


def test_only_the_grads_asked_for_are_computed(kernel):
    x, w = leaves((4, 256), torch.bfloat16, "same", seed=9)
    y = kernel.rmsnorm(x.detach(), w, 1e-6)  # only the weight requires grad
    (dw,) = torch.autograd.grad(y, [w], torch.ones_like(y))
    assert dw.shape == w.shape and dw.dtype == w.dtype
    y = kernel.rmsnorm(x, w.detach(), 1e-6)
    (dx,) = torch.autograd.grad(y, [x], torch.ones_like(y))
    assert dx.shape == x.shape


def test_zero_rows_give_zero_weight_grad(kernel):
    x, w = leaves((0, 64), torch.bfloat16, "same", seed=10)
    y = kernel.rmsnorm(x, w, 1e-6)
    dx, dw = grads(y, torch.ones_like(y), x, w)
    assert dx.shape == (0, 64) and torch.equal(dw, torch.zeros_like(dw))


@pytest.mark.parametrize("diffusers_rounding", [False, True])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32, None])
def test_opcheck_functional_ops_with_autograd(kernel, diffusers_rounding, weight_dtype):
    """opcheck's schema, fake, autograd-registration and aot_dispatch (forward + backward) checks."""
    x = rand((3, 5, 256), torch.bfloat16, seed=21).requires_grad_()
    w = None if weight_dtype is None else rand((256,), weight_dtype, seed=22).requires_grad_()
    torch.library.opcheck(kernel.ops.rmsnorm_fwd.default, (x, w, 1e-6, diffusers_rounding))
    y, rstd = kernel.ops.rmsnorm_fwd(x.detach(), None if w is None else w.detach(), 1e-6, diffusers_rounding)
    torch.library.opcheck(kernel.ops.rmsnorm_bwd.default,
                          (torch.ones_like(y), x.detach(), None if w is None else w.detach(), rstd,
                           diffusers_rounding, w is not None))


def test_saved_rstd_is_the_forward_r(kernel):
    x = rand((5, 2048), torch.bfloat16, seed=23)
    _, rstd = kernel.ops.rmsnorm_fwd(x, None, 1e-6, False)
    ref = torch.rsqrt(x.double().pow(2).mean(-1) + 1e-6)
    assert rstd.dtype == torch.float32 and rstd.shape == (5,)
    assert ((rstd.double() - ref).abs() / ref).max().item() <= 2e-6  # fp32 sum of squares, then rsqrtf


def test_cuda_graph_of_forward_and_backward_replays_with_new_inputs(kernel):
    shape = (2, 700, 1536)
    x, w = leaves(shape, torch.bfloat16, "same", seed=24)
    dy = rand(shape, torch.bfloat16, seed=25)

    def step():
        x.grad = w.grad = None
        kernel.rmsnorm(x, w, 1e-6).backward(dy)

    def refill():
        x.copy_(rand(shape, torch.bfloat16, seed=26))
        w.copy_(rand(shape[-1:], torch.bfloat16, seed=27))

    graph_replays_training_step(step, [x, w], refill)


def test_compiled_training_step_matches_eager(kernel):
    x, w = leaves((4, 2048), torch.bfloat16, "same", seed=28)
    dy = rand((4, 2048), torch.bfloat16, seed=29)
    f = lambda x, w: kernel.rmsnorm(x, w, 1e-6, rounding="diffusers") * 2  # noqa: E731
    compiled = torch.compile(f, fullgraph=True)
    for a, b in zip(grads(compiled(x, w), dy, x, w), grads(f(x, w), dy, x, w)):
        assert torch.equal(a, b)
