"""VAE ops on the GPU: pixel_norm against float64 and against the models' own
eager code (diffusers RMSNorm via movedim, LTX PixelNorm), every kernel path
(vectorized, scalar fallback: odd spatial sizes, misaligned storage, many
channels), 4-D and 5-D, fp32/fp16/bf16; inplace_add against torch's add_
(bitwise) for same-shape and broadcast y, every path; aliasing, streams,
compile, opcheck, CUDA-graph replay, and rejected calls leaving the context
usable. Skipped without CUDA. Outputs are poisoned with NaN before each run
and inputs are random (never zeros)."""

from __future__ import annotations

import importlib

import pytest
import torch

from ltx_dev.reference.numerics import every_finite_value, ulp_distance
from ltx_dev.reference.vae import diffusers_pixel_norm, original_pixel_norm, pixel_norm_f64

from .conftest import cuda, expect_path

pytestmark = cuda

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
DTYPES = [BF16, F16, F32]
EPS = 1e-8
# Bound on |y - ref64| / max(|ref64|, 1), in units of the dtype's unit
# roundoff u (2^-8 bf16, 2^-11 fp16): "diffusers" rounds once (measured
# <= 1u on CPU with the same formula), "original" rounds x^2, the mean,
# m + eps, the sqrt and the quotient (measured <= 2.4u); 2x margin.
TOL = {"diffusers": {BF16: 2 * 2**-8, F16: 2 * 2**-11, F32: 1e-5},
       "original": {BF16: 4 * 2**-8, F16: 4 * 2**-11, F32: 1e-5}}
# Outputs allowed to differ (by 1 ulp) from the eager model code: only the
# fp32 sum's order differs from torch's; on CPU the same formula with three
# summation orders differed on <= 5e-5 of the elements.
MAX_DIFF_FRACTION = 1e-3
VECTORIZED, FALLBACK = 0, 1
CONTIGUOUS, BROADCAST, STRIDED = 0, 1, 2


@pytest.fixture(scope="module")
def vae(kernel):
    return importlib.import_module(kernel.__name__ + ".vae")


def rand(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") * 2 + 0.3).to(dtype)


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def run_pixel_norm(vae, x, dim=1, rounding="diffusers", eps=EPS):
    out = poisoned(x.shape, x.dtype)
    y = vae.pixel_norm(x, dim, eps, rounding=rounding, out=out)
    assert y is out
    assert not torch.isnan(y).any(), "an output element was not written"
    return y


def check_f64(y, x, dim, rounding, eps=EPS):
    ref = pixel_norm_f64(x, dim, eps)
    err = (y.double() - ref).abs() / ref.abs().clamp_min(1.0)
    assert err.max().item() <= TOL[rounding][x.dtype], (err.max().item(), tuple(x.shape), dim, rounding)


def pn_args(x, dim=1):
    """pixel_norm_path's arguments for `x`: a contiguous output, no eps."""
    return torch.empty(x.shape, dtype=x.dtype, device="cuda"), x, dim


# --- pixel_norm numerics -----------------------------------------------------------

# (shape, dim, path for bf16/fp16)
PN_CASES = [
    ((2, 128, 3, 16, 24), 1, VECTORIZED),   # 5-D, 2 channel words per thread
    ((1, 512, 2, 8, 12), 1, VECTORIZED),    # C of the LTX decoder, 8 words per thread
    ((2, 64, 32, 48), 1, VECTORIZED),       # 4-D
    ((2, 1000, 1, 4, 6), 1, VECTORIZED),    # C not a power of two
    ((1, 2048, 16), 1, VECTORIZED),         # the most channels the registers hold
    ((3, 3, 4, 8), 1, VECTORIZED),          # few channels
    ((1, 1, 8, 8), 1, VECTORIZED),          # one channel: y = x / rms(x) = sign(x)
    ((2, 8, 64, 16), 2, VECTORIZED),        # another dim
    ((2, 16, 8, 40), -3, VECTORIZED),       # negative dim
    ((2, 256, 5, 7, 9), 1, FALLBACK),       # spatial 315: not whole 16-byte words
    ((1, 3000, 16), 1, FALLBACK),           # too many channels for the registers
    ((4, 24, 16, 8), -1, FALLBACK),         # last dim: spatial 1
    ((1, 128, 1, 1, 1), 1, FALLBACK),
    ((2, 4, 3), 1, FALLBACK),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rounding", ["diffusers", "original"])
@pytest.mark.parametrize("shape, dim, path", PN_CASES)
def test_pixel_norm_matches_float64(kernel, vae, dtype, rounding, shape, dim, path):
    x = rand(shape, dtype, seed=sum(shape) + dim)
    if shape[dim] == 1:
        # One channel: the mean square is x^2 itself, which fp16 (as eager
        # PixelNorm in fp16) flushes into subnormals below |x| ~ 0.008.
        x = x + torch.sign(x) * 0.25
    if dtype != F32:
        expect_path(kernel, "pixel_norm_path", pn_args(x, dim), path)
    check_f64(run_pixel_norm(vae, x, dim, rounding), x, dim, rounding)


def test_fp32_takes_the_vectorized_path_at_four_elements_per_word(kernel, vae):
    x = rand((2, 64, 12), F32, seed=1)  # spatial 12: whole fp32 words, not whole bf16 words
    expect_path(kernel, "pixel_norm_path", pn_args(x), VECTORIZED)
    expect_path(kernel, "pixel_norm_path", pn_args(x.bfloat16()), FALLBACK)
    check_f64(run_pixel_norm(vae, x), x, 1, "diffusers")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rounding", ["diffusers", "original"])
def test_misaligned_storage_takes_the_fallback_and_is_correct(kernel, vae, dtype, rounding):
    shape = (2, 128, 2, 8, 16)
    numel = 2 * 128 * 2 * 8 * 16
    x = rand((numel + 1,), dtype, seed=2)[1:].view(shape)  # one element off 16-byte alignment
    expect_path(kernel, "pixel_norm_path", pn_args(x), FALLBACK)
    check_f64(run_pixel_norm(vae, x, 1, rounding), x, 1, rounding)


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("shape", [(1, 512, 3, 16, 24), (1, 128, 5, 32, 48), (2, 256, 3, 24, 32),
                                   (2, 256, 3, 7, 9)])  # the last one: fallback path
def test_original_rounding_reproduces_eager_pixelnorm(vae, dtype, shape):
    x = rand(shape, dtype, seed=shape[1])
    ours = run_pixel_norm(vae, x, 1, "original")
    theirs = original_pixel_norm(x, 1, EPS)
    ulps = ulp_distance(ours, theirs)
    # Where the channel sum's order flips the rounding of the fp16/bf16 mean,
    # sqrt and the division can carry that ulp to 2 ulps of the output.
    assert ulps.max().item() <= 2
    assert (ulps > 0).float().mean().item() < MAX_DIFF_FRACTION
    # ... while the other rounding differs from it on a large fraction.
    assert (diffusers_pixel_norm(x, 1, EPS) != theirs).float().mean().item() > 0.05


@pytest.mark.parametrize("dtype, scales, huge", [(BF16, (2.0**-40, 1.0, 2.0**30), (2.0**-80, 2.0**40)),
                                                 (F16, (2.0**-4, 1.0, 8.0), (2.0**-6, 60000.0))])
@pytest.mark.parametrize("shape", [(1, 512, 3, 16, 24), (2, 128, 5, 32, 48), (2, 256, 3, 7, 9)])
def test_original_rounding_is_torchs_chain_bit_for_bit_when_sums_are_exact(vae, dtype, scales, huge, shape):
    """Inputs on a grid (multiples of 1/4 up to 4, some zeros, times a power of
    two) make every square and channel sum exact in any order, so the original
    rounding must be torch's chain bit for bit, division included, at every
    scale and at the extremes (one huge channel: the others' quotients below
    2^-100 in bf16; fp16 squares overflowing, d = inf)."""
    g = torch.Generator(device="cuda").manual_seed(shape[1])
    grid = torch.randint(-16, 17, shape, generator=g, device="cuda").float() * 0.25
    for scale in scales:
        x = (grid * scale).to(dtype)
        assert torch.equal(run_pixel_norm(vae, x, 1, "original"), original_pixel_norm(x, 1, EPS))
    tiny, big = huge
    x = grid * tiny
    x[:, 0] = big
    x = x.to(dtype)
    assert torch.equal(run_pixel_norm(vae, x, 1, "original"), original_pixel_norm(x, 1, EPS))


def every_small_value(dtype, limit):
    """Every finite value of a 2-byte dtype with |x| <= limit, +0 and -0 included."""
    values = every_finite_value(dtype, "cuda")
    return values[values.float().abs() <= limit]


@pytest.mark.parametrize("dtype, big", [(BF16, 2.0**4), (BF16, 2.0**-9), (BF16, 2.0**20), (F16, 2.0**3),
                                        (F16, 2.0**-3)])
@pytest.mark.parametrize("plan", [(4, 8), (4, 4), (4, 2)])
def test_original_division_is_torchs_for_every_small_value(vae, tuning, dtype, big, plan):
    """The original rounding divides by the position's d = T(sqrt(T(mean(T(x^2))
    + eps))). Channel 0 of every position holds B = v * big (v^2 an 8-bit
    integer, so B^2 / 512 is exact in T) and the other 511 channels every
    value of T small enough (sum of their squares < B^2 * 2^-13) not to move
    T(mean) off B^2 / 512 in any summation order: d is then torch's exactly,
    and each output is T(x / d) of one of all those x, for four divisors of
    different significands. big = 2^20 puts d above the range the kernel
    divides by a reciprocal product (IEEE divisions there)."""
    tuning({"pixel_norm.pos_words": plan[0], "pixel_norm.channel_words": plan[1]})
    channels = 512
    for v in (9.0, 11.0, 13.0, 15.0):
        b = v * big
        values = every_small_value(dtype, b * 2.0**-6.5 / (channels - 1) ** 0.5)
        positions = -(-values.numel() // (channels - 1))
        positions += -positions % 8  # whole 16-byte words of positions
        sweep = torch.zeros((channels - 1) * positions, dtype=dtype, device="cuda")
        sweep[: values.numel()] = values
        x = torch.empty((1, channels, positions), dtype=dtype, device="cuda")
        x[0, 0] = b
        x[0, 1:] = sweep.view(channels - 1, positions)
        theirs = original_pixel_norm(x, 1, EPS)
        ours = run_pixel_norm(vae, x, 1, "original")
        assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16)), f"v={v}"


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("shape", [(1, 512, 3, 16, 24), (1, 128, 5, 32, 48), (2, 64, 32, 48), (2, 256, 3, 7, 9)])
def test_diffusers_rounding_reproduces_diffusers_rmsnorm_via_movedim(vae, dtype, shape):
    x = rand(shape, dtype, seed=shape[1] + 1)
    ours = run_pixel_norm(vae, x, 1, "diffusers")
    theirs = diffusers_pixel_norm(x, 1, EPS)
    ulps = ulp_distance(ours, theirs)
    assert ulps.max().item() <= 1
    assert (ulps > 0).float().mean().item() < MAX_DIFF_FRACTION


@pytest.mark.parametrize("rounding, reference", [("diffusers", diffusers_pixel_norm),
                                                 ("original", original_pixel_norm)])
def test_fp32_matches_the_eager_code(vae, rounding, reference):
    x = rand((2, 256, 3, 16, 24), F32, seed=3)
    torch.testing.assert_close(run_pixel_norm(vae, x, 1, rounding), reference(x, 1, EPS), rtol=1e-5, atol=1e-6)


def test_eps_is_used(vae):
    x = rand((2, 64, 8, 8), F32, seed=4) * 1e-3
    check_f64(run_pixel_norm(vae, x, 1, "diffusers", eps=1e-3), x, 1, "diffusers", eps=1e-3)


@pytest.mark.parametrize("plan", [(4, 8), (8, 8), (16, 8), (8, 4), (32, 2), (4, 1), (64, 8), (3, 8)])
def test_every_block_plan_is_correct(vae, plan, tuning):
    """Plans forced through the `pixel_norm.pos_words` / `pixel_norm.channel_words` overrides
    (benchmark sweeps); a plan that does not fit (C=512 at 1 word per thread: 2048 threads) or is not
    a power of two in range is ignored."""
    tuning({"pixel_norm.pos_words": plan[0], "pixel_norm.channel_words": plan[1]})
    for shape in [(2, 512, 2, 8, 16), (1, 128, 3, 8, 24), (2, 40, 64)]:
        x = rand(shape, BF16, seed=shape[1])
        check_f64(run_pixel_norm(vae, x, 1, "original"), x, 1, "original")


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("shape", [(1, 128, 5, 32, 48), (2, 100, 3, 8, 16)])
def test_register_capped_original_kernel_is_bitwise_the_uncapped_one(vae, tuning, dtype, shape):
    """The original rounding at 2 channel words per thread (65-128 channels) runs
    capped at 32 registers; the `pixel_norm.register_cap` override 0 runs the
    uncapped build (development builds). Same code, so the same bits."""
    x = rand(shape, dtype, seed=shape[1] + 9)
    capped = run_pixel_norm(vae, x, 1, "original")
    tuning({"pixel_norm.register_cap": 0})
    assert torch.equal(capped, run_pixel_norm(vae, x, 1, "original"))


def test_results_are_deterministic(vae):
    x = rand((2, 512, 3, 16, 24), BF16, seed=5)
    assert torch.equal(run_pixel_norm(vae, x), run_pixel_norm(vae, x))


def test_in_place_out_equals_out_of_place(vae):
    x = rand((2, 256, 3, 16, 24), BF16, seed=6)
    expected = vae.pixel_norm(x, rounding="original")
    y = x.clone()
    assert vae.pixel_norm(y, rounding="original", out=y) is y
    assert torch.equal(y, expected)


def test_out_overlapping_x_reads_the_input_before_it_is_written(vae):
    shape, numel = (2, 64, 8, 16), 2 * 64 * 8 * 16
    buf = rand((2 * numel,), BF16, seed=7)
    x = buf[:numel].view(shape)
    expected = vae.pixel_norm(x.clone())
    out = buf[numel // 2:numel // 2 + numel].view(shape)  # half of it is x's second half
    vae.pixel_norm(x, out=out)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("make", [
    lambda t: t.to(memory_format=torch.channels_last_3d),
    lambda t: t.transpose(3, 4),
    lambda t: t[:, :, :, ::2],
])
def test_non_contiguous_input_is_copied_and_correct(vae, make):
    x = make(rand((2, 64, 3, 16, 24), BF16, seed=8))
    assert not x.is_contiguous()
    y = vae.pixel_norm(x)
    assert y.is_contiguous()
    check_f64(y, x, 1, "diffusers")
    assert torch.equal(y, vae.pixel_norm(x.contiguous()))


@pytest.mark.parametrize("shape", [(0, 64, 8), (2, 0, 8), (2, 64, 0, 4)])
def test_pixel_norm_zero_size_is_a_no_op(vae, shape):
    x = torch.empty(shape, dtype=BF16, device="cuda")
    assert vae.pixel_norm(x).shape == shape
    torch.cuda.synchronize()


def test_layer_forward_is_the_original_pixel_norm(vae):
    class PixelNorm(torch.nn.Module):  # LTX-Video's, ltx_video/models/autoencoders/pixel_norm.py
        def __init__(self, dim=1, eps=1e-8):
            super().__init__()
            self.dim, self.eps = dim, eps

        def forward(self, x):
            return original_pixel_norm(x, self.dim, self.eps)

    m = PixelNorm()
    x = rand((1, 512, 3, 16, 24), BF16, seed=9)
    expected = m(x)
    m.forward = vae.PixelNorm.forward.__get__(m)  # what kernelize does
    ulps = ulp_distance(m(x), expected)
    assert ulps.max().item() <= 1 and (ulps > 0).float().mean().item() < MAX_DIFF_FRACTION


# --- inplace_add -----------------------------------------------------------------------

def check_add(vae, x, y):
    """x += y through the kernel equals torch's add_ bitwise (both compute in
    fp32 and round once); returns x itself; x's storage is written in place."""
    expected = x.clone().add_(y)
    ptr = x.data_ptr()
    assert vae.inplace_add(x, y) is x
    assert x.data_ptr() == ptr
    assert torch.equal(x, expected)


X5 = (2, 64, 7, 16, 24)


@pytest.mark.parametrize("x_dtype, y_dtype", [(BF16, BF16), (F16, F16), (F32, F32), (BF16, F32), (F16, F32)])
@pytest.mark.parametrize("y_shape, path", [
    (X5, CONTIGUOUS),
    ((64, 1, 1, 1), BROADCAST),       # per channel ([C, 1, 1, 1], a bias)
    ((2, 64, 1, 1, 1), BROADCAST),
    ((24,), BROADCAST),               # trailing, y read as vectors
    ((7, 1, 24), BROADCAST),
    ((1, 1, 1, 1, 1), BROADCAST),     # [1] * k
    ((1,), BROADCAST),
    ((), BROADCAST),
    ((2, 1, 1, 1, 1), BROADCAST),
])
def test_inplace_add_matches_add_(kernel, vae, x_dtype, y_dtype, y_shape, path):
    x = rand(X5, x_dtype, seed=10)
    y = rand(y_shape, y_dtype, seed=11)
    expect_path(kernel, "inplace_add_path", (x, y), path)
    check_add(vae, x, y)


@pytest.mark.parametrize("x_shape, y_shape, path", [
    ((2, 300, 2048), (2048,), BROADCAST),
    ((2, 300, 2048), (2, 1, 2048), BROADCAST),
    ((3, 5, 7), (3, 5, 7), CONTIGUOUS),     # numel not whole words: the tail
    ((5,), (5,), CONTIGUOUS),               # less than one word
    ((4, 7), (7,), STRIDED),                # broadcast run not whole words
    ((4, 7), (4, 1), STRIDED),
    ((3, 1, 5), (3, 1, 5), CONTIGUOUS),
    ((3, 641, 56), (641, 1), BROADCAST),    # sizes that are no power of two: the 32-bit division by multiply-high
    ((5, 4099, 3, 8), (4099, 1, 1), BROADCAST),
    ((7, 13, 11), (13, 1), STRIDED),
])
@pytest.mark.parametrize("words_per_thread", [None, 2, 4])
def test_inplace_add_shapes(kernel, vae, request, x_shape, y_shape, path, words_per_thread):
    """Every path against x.add_(y), at the default 1 word of x per thread and, on a development
    build, at 2 or 4 (the `inplace_add.words` override)."""
    if words_per_thread:
        request.getfixturevalue("tuning")({"inplace_add.words": words_per_thread})
    for y_dtype in (BF16, F32):
        x, y = rand(x_shape, BF16, seed=12), rand(y_shape, y_dtype, seed=13)
        expect_path(kernel, "inplace_add_path", (x, y), path)
        check_add(vae, x, y)


def test_inplace_add_into_a_strided_view_leaves_the_rest_alone(kernel, vae):
    big = rand((64, 2 * 256), BF16, seed=14)
    before = big.clone()
    x = big[:, ::2]
    y = rand((64, 256), BF16, seed=15)
    expect_path(kernel, "inplace_add_path", (x, y), STRIDED)
    check_add(vae, x, y)
    assert torch.equal(big[:, 1::2], before[:, 1::2])


def test_inplace_add_into_a_transposed_x(kernel, vae):
    x = rand((256, 64), F32, seed=16).t()
    y = rand((256,), F32, seed=17)
    expect_path(kernel, "inplace_add_path", (x, y), STRIDED)
    check_add(vae, x, y)


def test_inplace_add_misaligned_storage_takes_the_strided_path(kernel, vae):
    x = rand((4097,), BF16, seed=18)[1:].view(64, 64)
    y = rand((64, 64), BF16, seed=19)
    expect_path(kernel, "inplace_add_path", (x, y), STRIDED)
    check_add(vae, x, y)


def test_inplace_add_row_strided_y_is_read_as_vectors(kernel, vae):
    y = rand((64, 2048 + 64), BF16, seed=20)[:, 32:32 + 2048]  # rows 2112 apart, 16-byte aligned
    x = rand((64, 2048), BF16, seed=21)
    expect_path(kernel, "inplace_add_path", (x, y), BROADCAST)
    check_add(vae, x, y)


def test_y_is_x(vae):
    x = rand((4, 1024), BF16, seed=22)
    expected = x * 2
    assert vae.inplace_add(x, x) is x
    assert torch.equal(x, expected)


def test_y_overlapping_x_is_read_before_it_is_written(vae):
    buf = rand((4097,), BF16, seed=23)
    x, y = buf[1:], buf[:-1]  # y[i] is x[i - 1]
    expected = x.clone() + y.clone()
    vae.inplace_add(x, y)
    assert torch.equal(x, expected)
    x2 = rand((8, 256), BF16, seed=24)
    expected = x2.clone() + x2[0].clone()
    vae.inplace_add(x2, x2[0])  # a row of x broadcast over x
    assert torch.equal(x2, expected)


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 8)])
def test_inplace_add_zero_size_is_a_no_op(vae, shape):
    x = torch.empty(shape, dtype=BF16, device="cuda")
    assert vae.inplace_add(x, torch.ones(8, dtype=BF16, device="cuda")) is x
    torch.cuda.synchronize()


# --- integration: errors, streams, compile, opcheck, graphs ------------------------------

def test_rejected_calls_leave_the_next_call_correct(vae):
    x = rand((2, 128, 3, 8, 16), BF16, seed=25)
    bad = [
        lambda: vae.pixel_norm(x, 5),
        lambda: vae.pixel_norm(x, 1, -1.0),
        lambda: vae.pixel_norm(x.cpu()),
        lambda: vae.pixel_norm(x, out=torch.empty(x.shape, dtype=F16, device="cuda")),
        lambda: vae.inplace_add(x, torch.ones(3, device="cuda", dtype=BF16)),
        lambda: vae.inplace_add(x, torch.ones(16, device="cuda", dtype=F16)),
        lambda: vae.inplace_add(torch.ones(1, 16, device="cuda", dtype=BF16).expand(4, 16),
                                torch.ones(16, device="cuda", dtype=BF16)),
        lambda: vae.inplace_add(x, torch.ones(16, dtype=BF16)),
    ]
    for call in bad:
        with pytest.raises((RuntimeError, TypeError, IndexError)):
            call()
    check_f64(run_pixel_norm(vae, x), x, 1, "diffusers")
    check_add(vae, x.clone(), rand((128, 1, 1, 1), F32, seed=26))


def test_runs_on_the_current_stream(vae):
    x = rand((2, 512, 3, 32, 48), BF16, seed=27)
    b = rand((512, 1, 1, 1), BF16, seed=28)
    expected = vae.pixel_norm(x).add_(b)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = vae.pixel_norm(x)
        vae.inplace_add(y, b)
        z = y * 1  # same stream: must see the finished output
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(z, expected)


def test_torch_compile_fullgraph(vae):
    x = rand((2, 128, 3, 16, 24), BF16, seed=29)
    b = rand((128, 1, 1, 1), F32, seed=30)

    def f(x, b):
        h = vae.pixel_norm(x, 1, EPS, rounding="original")
        return vae.inplace_add(h, b) * 2 + vae.pixel_norm(x)

    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x, b), f(x, b), rtol=0, atol=0)


def test_torch_compile_writes_back_into_a_mutated_input(vae):
    def g(x, y):
        vae.inplace_add(x, y)
        return x

    x = rand((2, 300, 2048), BF16, seed=31)
    y = rand((2048,), F32, seed=32)
    expected = x.clone().add_(y)
    out = torch.compile(g, fullgraph=True)(x, y)
    assert torch.equal(x, expected) and torch.equal(out, expected)


@pytest.mark.parametrize("original", [False, True])
def test_opcheck_pixel_norm(kernel, original):
    x = rand((2, 64, 3, 8, 16), BF16, seed=33)
    torch.library.opcheck(kernel.ops.pixel_norm.default, (torch.empty_like(x), x, 1, EPS, original))
    x4 = rand((2, 33, 5, 7), F16, seed=34)  # fallback path
    torch.library.opcheck(kernel.ops.pixel_norm.default, (torch.empty_like(x4), x4, 1, 1e-6, original))


@pytest.mark.parametrize("y_shape", [(2, 64, 3, 8, 16), (64, 1, 1, 1), (16,)])
def test_opcheck_inplace_add(kernel, y_shape):
    x = rand((2, 64, 3, 8, 16), BF16, seed=35)
    y = rand(y_shape, F32, seed=36)
    torch.library.opcheck(kernel.ops.inplace_add.default, (x, y))


def test_cuda_graph_capture_and_replay(vae):
    x = rand((2, 256, 3, 16, 24), BF16, seed=37)
    b = rand((256, 1, 1, 1), BF16, seed=38)
    out = torch.empty_like(x)
    vae.pixel_norm(x, rounding="original", out=out)  # warm up outside the capture
    vae.inplace_add(out, b)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        vae.pixel_norm(x, rounding="original", out=out)
        vae.inplace_add(out, b)
    for seed in (39, 40):
        x.copy_(rand(x.shape, BF16, seed=seed))
        out.fill_(float("nan"))
        graph.replay()
        expected = vae.pixel_norm(x, rounding="original").add_(b)
        torch.cuda.synchronize()
        assert torch.equal(out, expected)

