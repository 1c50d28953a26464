"""The FP8 producers and linear_fp8 (issue 37) on the GPU (skipped without CUDA).

Each producer against a float64 reference of its formula (ltx_kernels/fp8.py): the row scale is the
reference row's amax / 448, and every dequantised element is within half an e4m3 step of the
reference value. Outputs come from memory poisoned with NaN (an element never written shows); the
seam's residual stream is bitwise gated_residual's exact mode; linear_fp8 is torch._scaled_mm on
the same operands and within FP8's error of float64; bad input is refused naming the argument;
CUDA graphs replay the eager result."""

from __future__ import annotations

import pytest
import torch

from .conftest import cuda

pytestmark = cuda
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

E4M3_MAX = 448.0
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
# Model rows: LTX-Video 2B hidden and FF inner, Wan 1.3B hidden and FF inner, Flux/LTX-2 hidden.
WIDTHS = (2048, 8192, 1536, 8960, 3072, 4096, 16, 16384)


def poison_allocator(nbytes: int = 1 << 28) -> None:
    """Fill the caching allocator's free blocks with NaN bytes (0xFF is NaN in e4m3 and float32), so an
    output element a kernel never writes reads as NaN."""
    torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(0xFF)
    torch.cuda.synchronize()


def dequant(rows) -> torch.Tensor:
    return rows.data.double() * rows.scale.double().unsqueeze(-1)


def assert_quantised(rows, ref: torch.Tensor) -> None:
    """rows is e4m3 of the float64 values ``ref`` with one scale per row: scale = amax / 448 and each
    element within half an e4m3 step (2^-4 relative for normals, 2^-10 scale below 2^-6 scale)."""
    assert rows.data.dtype == torch.float8_e4m3fn and rows.scale.dtype == F32
    assert rows.data.shape == ref.shape and rows.scale.shape == ref.shape[:-1] and rows.data.is_contiguous()
    amax = ref.abs().amax(-1)
    expected_scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    # the kernel's values are float32 (their amax within ~1e-6 of float64's)
    torch.testing.assert_close(rows.scale.double(), expected_scale, rtol=2e-6, atol=0)
    got = dequant(rows)
    assert torch.isfinite(got).all(), "an element was never written (NaN) or overflowed"
    scale = rows.scale.double().unsqueeze(-1)
    bound = 2.0 ** -4 * ref.abs() * (1 + 1e-5) + 2.0 ** -10 * scale + 1e-6 * amax.unsqueeze(-1)
    excess = (got - ref).abs() - bound
    assert excess.max() <= 0, f"max error over the bound {excess.max().item():.3g}"


def rms_modulated64(h, weight, scale, shift, eps):
    h = h.double()
    v = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        v = v * weight.double()
    v = v * (1 + scale.double())
    return v + shift.double() if shift is not None else v


def gelu_tanh64(x):
    x = x.double()
    return 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3)))


def randn(*shape, dtype=BF16, scale=1.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)


# --- quantize_fp8, gelu_tanh_fp8 ---------------------------------------------------------------------------

@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_quantize_fp8_rows_match_float64(kernel, width, dtype):
    x = randn(3, 37, width, dtype=dtype, scale=3.0)
    poison_allocator()
    assert_quantised(kernel.quantize_fp8(x), x.double())


def test_quantize_fp8_float32_weight_per_output_channel(kernel):
    w = randn(512, 2048, dtype=F32, scale=0.02)
    poison_allocator()
    rows = kernel.quantize_fp8(w)
    assert rows.scale.shape == (512,)
    assert_quantised(rows, w.double())


def test_quantize_fp8_zero_row_has_scale_one_and_zeros(kernel):
    x = randn(4, 64)
    x[1] = 0
    rows = kernel.quantize_fp8(x)
    assert rows.scale[1].item() == 1.0 and (rows.data[1].float() == 0).all()


def test_quantize_fp8_row_amax_maps_to_448(kernel):
    x = randn(8, 2048, scale=5.0)
    rows = kernel.quantize_fp8(x)
    assert (rows.data.float().abs().amax(-1) == E4M3_MAX).all()


def test_quantize_fp8_non_contiguous_input_is_read_as_its_values(kernel):
    x = randn(64, 4096)[:, ::2]
    assert not x.is_contiguous()
    assert_quantised(kernel.quantize_fp8(x), x.double())


@pytest.mark.parametrize("width", WIDTHS)
def test_gelu_tanh_fp8_matches_float64(kernel, width):
    x = randn(2, 41, width, scale=2.5, seed=1)
    poison_allocator()
    assert_quantised(kernel.gelu_tanh_fp8(x), gelu_tanh64(x))


# --- the norms ----------------------------------------------------------------------------------------------

MODULATION_SHAPES = {"per batch [B, 1, D]": lambda b, s, d: (b, 1, d), "per token [B, S, D]": lambda b, s, d: (b, s, d),
                     "all rows [D]": lambda b, s, d: (d,)}


@pytest.mark.parametrize("width", (2048, 1536, 3072, 4096))
@pytest.mark.parametrize("mod", list(MODULATION_SHAPES))
@pytest.mark.parametrize("mod_dtype", [BF16, F32])
@pytest.mark.parametrize("with_weight, with_shift", [(False, True), (True, True), (True, False)])
def test_adaln_rmsnorm_fp8_matches_float64(kernel, width, mod, mod_dtype, with_weight, with_shift):
    b, s = 2, 67
    x = randn(b, s, width, scale=2.0)
    shape = MODULATION_SHAPES[mod](b, s, width)
    scale = randn(*shape, dtype=mod_dtype, scale=0.3, seed=2)
    shift = randn(*shape, dtype=mod_dtype, scale=0.3, seed=3) if with_shift else None
    weight = randn(width, scale=0.5, seed=4) + 1 if with_weight else None
    poison_allocator()
    rows = kernel.adaln_rmsnorm_fp8(x, weight, scale, shift, 1e-6)
    assert_quantised(rows, rms_modulated64(x, weight, scale, shift, 1e-6))


@pytest.mark.parametrize("with_gate", [True, False])
@pytest.mark.parametrize("mod_dtype", [BF16, F32])
def test_gated_residual_rmsnorm_fp8_seam(kernel, with_gate, mod_dtype):
    """The residual stream is bitwise gated_residual (exact mode); the normalised rows are e4m3 of it."""
    b, s, d = 2, 2688, 2048
    x, y = randn(b, s, d, scale=4.0), randn(b, s, d, seed=5)
    gate = randn(b, 1, d, dtype=mod_dtype, scale=0.5, seed=6) if with_gate else None
    scale, shift = randn(b, 1, d, dtype=mod_dtype, scale=0.3, seed=7), randn(b, 1, d, dtype=mod_dtype, seed=8)
    poison_allocator()
    rows, x_new = kernel.gated_residual_rmsnorm_fp8(x, y, gate, scale, shift, 1e-6)
    assert torch.equal(x_new, kernel.gated_residual(x, y, gate, exact_mode=True))
    assert_quantised(rows, rms_modulated64(x_new, None, scale, shift, 1e-6))


@pytest.mark.parametrize("gate_dtype", [None, BF16, F32])
def test_gated_residual_fp8_writes_the_residual_and_its_rows(kernel, gate_dtype):
    b, s, d = 2, 2688, 2048
    x, y = randn(b, s, d, scale=4.0), randn(b, s, d, seed=5)
    gate = randn(b, 1, d, dtype=gate_dtype, scale=0.5, seed=6) if gate_dtype else None
    poison_allocator()
    rows, x_new = kernel.gated_residual_fp8(x, y, gate)
    assert torch.equal(x_new, kernel.gated_residual(x, y, gate, exact_mode=True))
    assert_quantised(rows, x_new.double())


def layernorm_modulated64(h, weight, bias, scale, shift, eps):
    h = h.double()
    mean = h.mean(-1, keepdim=True)
    v = (h - mean) * torch.rsqrt((h - mean).pow(2).mean(-1, keepdim=True) + eps)
    v = v * weight.double() if weight is not None else v
    v = v + bias.double() if bias is not None else v
    if scale is not None:
        v = v * (1 + scale.double()) + (shift.double() if shift is not None else 0)
    return v


@pytest.mark.parametrize("width", (1536, 3072, 5120))
@pytest.mark.parametrize("affine", [None, F32, BF16])
@pytest.mark.parametrize("mod_dtype", [F32, BF16])
def test_adaln_layernorm_fp8_matches_float64(kernel, width, affine, mod_dtype):
    b, s = 2, 300
    x = randn(b, s, width, scale=2.0) + 0.5
    scale, shift = randn(b, 1, width, dtype=mod_dtype, scale=0.3, seed=2), randn(b, 1, width, dtype=mod_dtype, seed=3)
    weight = randn(width, dtype=affine, scale=0.2, seed=4) + 1 if affine else None
    bias = randn(width, dtype=affine, scale=0.2, seed=5) if affine else None
    poison_allocator()
    rows = kernel.adaln_layernorm_fp8(x, scale, shift, 1e-6, weight=weight, bias=bias)
    assert_quantised(rows, layernorm_modulated64(x, weight, bias, scale, shift, 1e-6))


@pytest.mark.parametrize("modulated", [True, False])
def test_gated_residual_layernorm_fp8_is_wans_seam(kernel, modulated):
    """Wan: float32 gate and modulation; norm2 (affine, float32 weights) has no modulation."""
    b, s, d = 2, 2048, 1536
    x, y = randn(b, s, d, scale=3.0), randn(b, s, d, seed=6)
    gate = randn(b, 1, d, dtype=F32, scale=0.5, seed=7)
    scale = randn(b, 1, d, dtype=F32, scale=0.3, seed=8) if modulated else None
    shift = randn(b, 1, d, dtype=F32, seed=9) if modulated else None
    weight, bias = (None, None) if modulated else (randn(d, dtype=F32, scale=0.2, seed=10) + 1,
                                                   randn(d, dtype=F32, scale=0.2, seed=11))
    poison_allocator()
    rows, x_new = kernel.gated_residual_layernorm_fp8(x, y, gate, 1e-6, weight=weight, bias=bias, scale=scale,
                                                      shift=shift)
    assert torch.equal(x_new, kernel.gated_residual(x, y, gate, exact_mode=True))
    assert_quantised(rows, layernorm_modulated64(x_new, weight, bias, scale, shift, 1e-6))


def test_fp8_norm_matches_bf16_norm_within_e4m3(kernel):
    """The FP8 norm is the bf16 op's fast mode up to e4m3's step (same formula, one rounding less)."""
    x = randn(2, 2688, 2048)
    scale, shift = randn(2, 1, 2048, scale=0.3, seed=2), randn(2, 1, 2048, seed=3)
    rows = kernel.adaln_rmsnorm_fp8(x, None, scale, shift, 1e-6)
    bf16 = kernel.adaln_rmsnorm(x, None, scale, shift, 1e-6, exact_mode=False).double()
    assert ((dequant(rows) - bf16).abs() <= 2.0 ** -4 * bf16.abs() + 2.0 ** -8 * bf16.abs() + 1e-2).all()


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 300), words=st.integers(1, 1024), seq=st.integers(1, 5), per_token=st.booleans(),
       summed=st.booleans(), fp16=st.booleans(), magnitude=st.sampled_from([1e-3, 1.0, 300.0]))
def test_fp8_norm_fuzz(kernel, rows, words, seq, per_token, summed, fp16, magnitude):
    dtype = F16 if fp16 else BF16
    d = 16 * words
    b = max(1, rows // seq)
    x = randn(b, seq, d, dtype=dtype, scale=magnitude, seed=rows)
    mshape = (b, seq, d) if per_token else (b, 1, d)
    scale, shift = randn(*mshape, dtype=dtype, scale=0.3, seed=words), randn(*mshape, dtype=dtype, seed=seq)
    poison_allocator(1 << 24)
    if summed:
        y = randn(b, seq, d, dtype=dtype, scale=magnitude, seed=rows + 1)
        got, h = kernel.gated_residual_rmsnorm_fp8(x, y, scale, scale, shift, 1e-6)
        assert torch.equal(h, kernel.gated_residual(x, y, scale, exact_mode=True))
    else:
        got, h = kernel.adaln_rmsnorm_fp8(x, None, scale, shift, 1e-6), x
    assert_quantised(got, rms_modulated64(h, None, scale, shift, 1e-6))


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 700), words=st.integers(1, 1024), gelu=st.booleans(),
       magnitude=st.sampled_from([1e-3, 1.0, 300.0]))
def test_fp8_elementwise_fuzz(kernel, rows, words, gelu, magnitude):
    x = randn(rows, 16 * words, scale=magnitude, seed=words)
    poison_allocator(1 << 24)
    if gelu:
        assert_quantised(kernel.gelu_tanh_fp8(x), gelu_tanh64(x))
    else:
        assert_quantised(kernel.quantize_fp8(x), x.double())


# --- linear_fp8 ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("m, k, n", [(5376, 2048, 2048), (5376, 2048, 8192), (5376, 8192, 2048), (77, 1536, 8960)])
@pytest.mark.parametrize("fast_accum", [False, True])
def test_linear_fp8_is_scaled_mm_and_close_to_float64(kernel, m, k, n, fast_accum):
    x = randn(m, k, seed=9)
    w, bias = randn(n, k, scale=k ** -0.5, seed=10), randn(n, scale=0.1, seed=11)
    xq, wq = kernel.quantize_fp8(x), kernel.quantize_fp8(w)
    got = kernel.linear_fp8(xq, wq, bias, fast_accum=fast_accum)
    direct = torch._scaled_mm(xq.data, wq.data.t(), scale_a=xq.scale[:, None], scale_b=wq.scale[None],
                              bias=bias, out_dtype=BF16, use_fast_accum=fast_accum)
    assert got.dtype == BF16 and torch.equal(got, direct)
    ref = x.double() @ w.double().t() + bias.double()
    err = ((got.double() - ref).norm() / ref.norm()).item()
    assert err < 0.06, f"relative L2 {err:.3g}"  # measured 3.7e-2 per GEMM (docs/fp8.md)


def test_linear_fp8_quantises_a_tensor_input_and_keeps_leading_dims(kernel):
    x = randn(2, 300, 2048)
    w = randn(1024, 2048, scale=2048 ** -0.5, seed=1)
    wq = kernel.quantize_fp8(w)
    got = kernel.linear_fp8(x, wq)
    assert got.shape == (2, 300, 1024) and got.dtype == BF16
    assert torch.equal(got, kernel.linear_fp8(kernel.quantize_fp8(x), wq))


def test_linear_fp8_bias_of_another_dtype_is_added_after(kernel):
    x, w = randn(64, 256), randn(128, 256, seed=1)
    bias = randn(128, dtype=F32, seed=2)
    got = kernel.linear_fp8(x, kernel.quantize_fp8(w), bias)
    plain = kernel.linear_fp8(x, kernel.quantize_fp8(w))
    torch.testing.assert_close(got.float(), plain.float() + bias, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("fast_accum", [False, True])
def test_fp8_linear_concat_is_its_parts_joined_and_shares_their_memory(kernel, fast_accum):
    parts = [kernel.Fp8Linear.from_linear(torch.nn.Linear(2048, 2048, device="cuda", dtype=BF16),
                                          fast_accum=fast_accum) for _ in range(3)]
    keys = [sorted(m.state_dict()) for m in parts]
    joined = kernel.Fp8Linear.concat(parts)
    rows = kernel.quantize_fp8(randn(2, 2688, 2048))
    got, apart = joined(rows), torch.cat([m(rows) for m in parts], dim=-1)
    assert got.shape == (2, 2688, 6144) and joined.parts == tuple(parts)
    torch.testing.assert_close(got, apart, rtol=2e-2, atol=2e-2)  # one GEMM's accumulation against three
    assert ((got.float() - apart.float()).norm() / apart.float().norm()).item() < 1e-3
    for i, m in enumerate(parts):  # views of the joined buffers, the state_dict as before
        assert m.weight_data.data_ptr() == joined.weight_data[2048 * i].data_ptr()
        assert m.bias.data_ptr() == joined.bias[2048 * i].data_ptr()
        assert sorted(m.state_dict()) == keys[i]
    assert joined.state_dict() == {}


# --- graphs, bad input ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [BF16, F16])
def test_fp8_linear_answers_in_its_linears_dtype_whatever_the_input(kernel, dtype):
    linear = torch.nn.Linear(64, 32, device="cuda", dtype=dtype)
    fp8 = kernel.Fp8Linear.from_linear(linear)
    x = torch.randn(4, 64, device="cuda", dtype=dtype)
    for given in (x, kernel.quantize_fp8(x)):  # e4m3 rows carry no dtype
        got = fp8(given)
        ref = linear(x).double()
        assert got.dtype == dtype and got.shape == (4, 32)
        assert ((got.double() - ref).norm() / ref.norm()).item() < 0.1


def test_norm_and_linear_replay_in_a_cuda_graph(kernel):
    x = randn(2, 2688, 2048)
    scale, shift = randn(2, 1, 2048, scale=0.3, seed=2), randn(2, 1, 2048, seed=3)
    wq = kernel.quantize_fp8(randn(2048, 2048, scale=2048 ** -0.5, seed=4))

    def step():
        rows = kernel.adaln_rmsnorm_fp8(x, None, scale, shift, 1e-6)
        return kernel.linear_fp8(kernel.gelu_tanh_fp8(kernel.linear_fp8(rows, wq)), wq)

    expected = step()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    x.copy_(randn(2, 2688, 2048, seed=99))
    expected_after = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected_after) and not torch.equal(out, expected)


@pytest.mark.parametrize("call, message", [
    (lambda k: k.quantize_fp8(randn(4, 40)), "multiple of 16"),
    (lambda k: k.quantize_fp8(randn(4, 16400)), "at most 16384"),
    (lambda k: k.quantize_fp8(randn(4, 8208, dtype=F32)), "at most 8192"),
    (lambda k: k.gelu_tanh_fp8(randn(4, 64, dtype=F32)), "torch.bfloat16 or torch.float16"),
    (lambda k: k.quantize_fp8(randn(4, 64).to(torch.int32)), "supported dtypes"),
    (lambda k: k.adaln_rmsnorm_fp8(randn(2, 8, 64), None, randn(3, 1, 64), None, 1e-6), "`scale` has shape"),
    (lambda k: k.adaln_rmsnorm_fp8(randn(2, 8, 64), randn(32), randn(2, 1, 64), None, 1e-6), "`weight` has shape"),
    (lambda k: k.adaln_rmsnorm_fp8(randn(2, 8, 64), None, randn(2, 1, 64), randn(2, 1, 64, dtype=F32), 1e-6),
     "share one dtype"),
    (lambda k: k.gated_residual_rmsnorm_fp8(randn(2, 8, 64), randn(2, 9, 64), None, randn(2, 1, 64), None),
     "`y` has shape"),
    (lambda k: k.gated_residual_fp8(randn(2, 8, 64), randn(2, 8, 64), randn(2, 2, 64)), "`gate` has shape"),
    (lambda k: k.adaln_rmsnorm_fp8(randn(2, 8, 64).cpu(), None, randn(2, 1, 64).cpu(), None, 1e-6),
     "must be a CUDA tensor"),
    (lambda k: k.linear_fp8(randn(4, 64), k.quantize_fp8(randn(32, 48))), "do not make x @ weight.T"),
])
def test_bad_input_is_refused_naming_it(kernel, call, message):
    with pytest.raises((RuntimeError, TypeError, ValueError), match=message):
        call(kernel)


def test_fp8_ops_refuse_autograd(kernel):
    x = randn(4, 64).requires_grad_()
    with pytest.raises(kernel.NoBackwardError, match="quantize_fp8"):
        kernel.quantize_fp8(x)
    with torch.no_grad():
        kernel.quantize_fp8(x)
