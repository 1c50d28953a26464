"""Fused q/k RMSNorm + RoPE on the GPU (issue 4, item 2): LTX's form (norm
over all heads, torch.nn.RMSNorm rounding, eps 1e-5, interleaved RoPE with the
[B, S, D] tables) bitwise against the eager chain, the per-head forms
(interleaved and rotate-half, diffusers and torch roundings) against eager and
float64, both kernel paths, in place, bad input, compile and opcheck.
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from ltx_dev.reference.rmsnorm import diffusers_rms_norm, torch_rms_norm

from .conftest import cuda, expect_path

pytestmark = cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
EPS = 1e-5
VECTORIZED, FALLBACK = 0, 1
# |y - ref64| / max(|ref64|, |n_a|, |n_b|, 1): one rounding of T plus float32 error;
# exact mode rounds twice (the norm, then the rotation).
TOL = {torch.bfloat16: 2 * 2**-8, torch.float16: 2 * 2**-11, torch.float32: 2e-5}


def rand(shape, dtype, seed, scale=1.0, offset=0.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") * scale + offset).to(dtype)


def grid(shape, dtype, seed, step=0.25, limit=4.0):
    """Random multiples of `step` in [-limit, limit] with no zero row: squares
    and their sums are exact in float32 in any order, so any reduction order
    gives the same r and the eager chain can be matched bit for bit."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = int(limit / step)
    v = torch.randint(-n, n + 1, shape, generator=g, device="cuda").float() * step
    v[..., 0] = limit
    return v.to(dtype)


def random_tables(B, S, C, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    angle = torch.rand((B, S, C), generator=g, device="cuda") * 6.3
    return angle.cos(), angle.sin()


def rotate_interleaved(x):
    x_real, x_imag = x.unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([-x_imag, x_real], dim=-1).flatten(-2)


def rotate_half(x):
    x_real, x_imag = x.unflatten(-1, (2, -1)).unbind(-2)
    return torch.cat([-x_imag, x_real], dim=-1)


def eager_rope(x, cos, sin, rotation):
    """diffusers' apply_rotary_emb (LTX's, and embeddings.py's for both unbind dims)."""
    rot = rotate_interleaved(x) if rotation == "interleaved" else rotate_half(x)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def per_head(t, cos, sin, head_dim):
    """[B, S, D] -> [B, S, H, Dh] and the tables broadcast over heads when they are per head."""
    t = t.unflatten(-1, (-1, head_dim))
    if cos.shape[-1] == head_dim:
        return t, cos.unsqueeze(-2), sin.unsqueeze(-2)
    return t, cos.unflatten(-1, (-1, head_dim)), sin.unflatten(-1, (-1, head_dim))


def eager_chain(x, w, cos, sin, head_dim, rotation, rounding, kernel=None):
    """norm (torch.nn.RMSNorm or diffusers RMSNorm over each group) then RoPE, eagerly.

    With `kernel`, the norm is the package's own `rmsnorm` (tested against both
    modules in test_rmsnorm_gpu.py): it computes the mean as sum / n like the fused
    kernel, so on `grid` inputs the chain is bitwise comparable at any size, while
    PyTorch's mean may round differently when n is not a power of two."""
    xh, c, s = per_head(x, cos, sin, head_dim)
    if kernel is not None:
        n = kernel.rmsnorm(xh, w, EPS, rounding=rounding)
    elif rounding == "torch":
        n = torch.nn.functional.rms_norm(xh, (head_dim,), w, EPS)
    else:
        n = diffusers_rms_norm(xh, w, EPS)
    return eager_rope(n, c, s, rotation).flatten(-2)


def f64_chain(x, w, cos, sin, head_dim, rotation):
    xh, c, s = per_head(x.double(), cos.double(), sin.double(), head_dim)
    n = xh * torch.rsqrt(xh.pow(2).mean(-1, keepdim=True) + EPS)
    if w is not None:
        n = n * w.double()
    rot = rotate_interleaved(n) if rotation == "interleaved" else rotate_half(n)
    partner = rot.abs()
    return (n * c + rot * s).flatten(-2), torch.maximum(n.abs(), partner).flatten(-2)


def close_to(y, expected, terms, dtype, roundings):
    assert not torch.isnan(y).any(), "an output element was not written"
    err = (y.double() - expected).abs() / torch.maximum(terms, torch.ones_like(terms))
    assert err.max().item() <= TOL[dtype] * roundings, err.max().item()


def call(kernel, q, k, wq, wk, cos, sin, **kw):
    """The op with poisoned outputs, so an element left unwritten shows."""
    qo, ko = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    hd = kw.pop("head_dim", None) or q.shape[-1]
    rotation = kw.pop("rotation", "interleaved")
    diffusers = kw.pop("rounding", "torch") == "diffusers"
    kernel.ops.qk_rmsnorm_rope(qo, ko, q, k, wq, wk, cos, sin, hd, EPS, rotation, diffusers,
                               kw.pop("exact_mode", True))
    assert not kw
    return qo, ko


# --- LTX: norm over all heads, torch rounding, interleaved, [B, S, D] tables ----------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [2048, 4096, 128])
@pytest.mark.parametrize("shared_tables", [True, False])
def test_ltx_exact_mode_is_bitwise_nn_rmsnorm_then_apply_rotary_emb(kernel, dtype, D, shared_tables):
    B, (F, H, W) = 2, (3, 4, 6)
    cos, sin = kernel.ltx_rope_cos_sin(F, H, W, (8 / 25, 32, 32), D, batch_size=B, device="cuda")
    if not shared_tables:
        cos, sin = cos.contiguous(), sin.contiguous()
    q, k = grid((B, F * H * W, D), dtype, D), grid((B, F * H * W, D), dtype, D + 1)
    wq, wk = rand((D,), dtype, 1, 0.2, 1), rand((D,), dtype, 2, 0.2, 1)
    norm_q = torch.nn.RMSNorm(D, eps=EPS, device="cuda", dtype=dtype)
    with torch.no_grad():
        norm_q.weight.copy_(wq)
        expected_q = eager_rope(norm_q(q), cos, sin, "interleaved")
    qo, ko = kernel.qk_rmsnorm_rope(q, k, wq, wk, cos, sin, EPS)
    assert torch.equal(qo, expected_q)
    assert torch.equal(ko, eager_chain(k, wk, cos, sin, D, "interleaved", "torch"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [1536, 96, 5120])
def test_ltx_exact_mode_is_bitwise_the_packages_rmsnorm_then_rope_at_other_widths(kernel, dtype, D):
    cos, sin = kernel.ltx_rope_cos_sin(3, 4, 6, (8 / 25, 32, 32), D, batch_size=2, device="cuda")
    q, k = grid((2, 72, D), dtype, D), grid((2, 72, D), dtype, D + 1)
    w = rand((D,), dtype, 3, 0.2, 1)
    qo, ko = kernel.qk_rmsnorm_rope(q, k, w, None, cos, sin, EPS)
    assert torch.equal(qo, eager_chain(q, w, cos, sin, D, "interleaved", "torch", kernel))
    assert torch.equal(ko, eager_chain(k, None, cos, sin, D, "interleaved", "torch", kernel))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D, C", [(1536, 128), (5120, 128), (2048, 64), (256, 128), (256, 32), (130, 26)],
                         ids=["wan1.3b", "wan14b", "d2048", "one-word", "one-word-narrow", "fallback"])
@pytest.mark.parametrize("per_sample", [False, True])
@pytest.mark.parametrize("batch", [1, 2])
def test_tables_repeating_along_a_whole_row_norm_give_the_bits_of_the_tiled_tables(kernel, dtype, D, C, per_sample,
                                                                                    batch):
    """Wan's case: one head's columns ([B or 1, S, D / H]) under the norm over all heads; forward and
    backward as with the tables tiled to [.., D] (the vectorized, one-word, row-tables and scalar paths:
    the repeating tables take widths of their own, plan_row_tables; q and k on a grid, so the row sums
    are exact in any order)."""
    q, k = (grid((batch, 37, D), dtype, seed).requires_grad_() for seed in (11, 12))
    w = rand((D,), dtype, 13, 0.2, 1).requires_grad_()
    cos, sin = random_tables(batch if per_sample else 1, 37, C, 14)
    tiled = tuple(t.repeat(1, 1, D // C) for t in (cos, sin))
    dq, dk = rand((batch, 37, D), dtype, 15), rand((batch, 37, D), dtype, 16)
    results = []
    for tables in ((cos, sin), tiled):
        qo, ko = kernel.qk_rmsnorm_rope(q, k, w, w, *tables, EPS)
        results.append((qo, ko, *torch.autograd.grad((qo, ko), (q, k, w), (dq, dk))))
    for got, expected in zip(*results):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("D, width", [(1536, "64, 3"), (3072, "128, 3"), (5120, "160, 4"), (2048, None)],
                         ids=["wan1.3b", "wan2.2-5b", "wan14b", "d2048"])
@pytest.mark.parametrize("batch, per_sample", [(1, False), (2, True), (2, False)])
def test_wan_rows_take_the_row_tables_kernel_at_their_widths(kernel, D, width, batch, per_sample):
    """Wan's form ([.., 128] tables under the norm over all heads) at Wan's widths takes the row-tables
    kernel (threads x words: plan_row_tables), any batch; another width (2048) the general kernel."""
    q, k = rand((batch, 16, D), torch.bfloat16, 1), rand((batch, 16, D), torch.bfloat16, 2)
    cos, sin = random_tables(batch if per_sample else 1, 16, 128, 3)
    names = [n for n in launched_kernels(lambda: kernel.qk_rmsnorm_rope(q, k, None, None, cos, sin, EPS))
             if "qk_rmsnorm_rope_" in n]
    assert len(names) == 1, names
    if width is None:
        assert "qk_rmsnorm_rope_vectorized" in names[0], names
    else:
        assert "qk_rmsnorm_rope_row_tables" in names[0] and f", {width}>(" in names[0], names


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [1536, 5120])
@pytest.mark.parametrize("per_sample", [False, True])
def test_wan_rows_over_many_passes_and_samples_equal_the_general_kernels(kernel, dtype, D, per_sample):
    """The row-tables kernel walks rows over many persistent passes, across the samples' boundary: its
    output is the general kernel's (the same tables tiled to [.., D]) bit for bit, on a grid where the
    row sums are exact in any order, in both modes."""
    q, k = grid((2, 3001, D), dtype, 21), grid((2, 3001, D), dtype, 22)
    w = rand((D,), dtype, 23, 0.2, 1)
    cos, sin = random_tables(2 if per_sample else 1, 3001, 128, 24)
    tiled = tuple(t.repeat(1, 1, D // 128) for t in (cos, sin))
    for exact in (True, False):
        got = kernel.qk_rmsnorm_rope(q, k, w, w, cos, sin, EPS, exact_mode=exact)
        expected = kernel.qk_rmsnorm_rope(q, k, w, w, *tiled, EPS, exact_mode=exact)
        for g, e in zip(got, expected):
            assert torch.equal(g, e), exact


def test_ltx_exact_mode_on_random_inputs_differs_from_eager_only_by_reduction_order(kernel):
    cos, sin = kernel.ltx_rope_cos_sin(7, 16, 24, (8 / 25, 32, 32), 2048, batch_size=2, device="cuda")
    q, k = rand((2, 2688, 2048), torch.bfloat16, 3, 2), rand((2, 2688, 2048), torch.bfloat16, 4, 2)
    w = rand((2048,), torch.bfloat16, 5, 0.2, 1)
    qo, ko = kernel.qk_rmsnorm_rope(q, k, w, w, cos, sin, EPS)
    for ours, x in ((qo, q), (ko, k)):
        eager = eager_chain(x, w, cos, sin, 2048, "interleaved", "torch")
        assert (ours != eager).float().mean().item() < 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("with_weight", [True, False])
def test_ltx_form_matches_float64(kernel, dtype, exact, with_weight):
    B, S, D = 2, 96, 2048
    cos, sin = random_tables(1, S, D, 9)
    q, k = rand((B, S, D), dtype, 10, 2, 0.3), rand((B, S, D), dtype, 11, 2)
    wq = rand((D,), dtype, 12, 0.2, 1) if with_weight else None
    wk = rand((D,), torch.float32, 13, 0.2, 1) if with_weight and dtype == torch.float32 else wq
    qo, ko = call(kernel, q, k, wq, wk, cos, sin, exact_mode=exact)
    for y, x, w in ((qo, q, wq), (ko, k, wk)):
        expected, terms = f64_chain(x, w, cos, sin, D, "interleaved")
        close_to(y, expected, terms, dtype, 2 if exact else 1)


def test_float32_weights_on_half_input_match_the_torch_chain(kernel):
    D = 2048
    cos, sin = kernel.ltx_rope_cos_sin(2, 4, 6, None, D, device="cuda")
    q = grid((2, 48, D), torch.bfloat16, 20)
    w32 = rand((D,), torch.float32, 21, 0.2, 1)
    qo, ko = kernel.qk_rmsnorm_rope(q, q, w32, w32, cos, sin, EPS)
    expected = eager_rope(torch_rms_norm(q, w32, EPS), cos, sin, "interleaved")  # fp32 math, one cast
    assert torch.equal(qo, expected) and torch.equal(ko, expected)


# --- per head: Flux / Hunyuan (diffusers rounding), Mochi / Wan (torch), rotate-half ---

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("rotation", ["interleaved", "half"])
@pytest.mark.parametrize("rounding", ["torch", "diffusers"])
@pytest.mark.parametrize("per_head_tables", [True, False])
def test_per_head_exact_mode_is_bitwise_the_eager_chain(kernel, dtype, head_dim, rotation, rounding, per_head_tables):
    B, S, H = 2, 40, 24
    D = H * head_dim
    cos, sin = random_tables(1, S, head_dim if per_head_tables else D, head_dim)
    q, k = grid((B, S, D), dtype, 30), grid((B, S, D), dtype, 31)
    wq, wk = rand((head_dim,), dtype, 32, 0.2, 1), rand((head_dim,), dtype, 33, 0.2, 1)
    qo, ko = call(kernel, q, k, wq, wk, cos, sin, head_dim=head_dim, rotation=rotation, rounding=rounding)
    assert torch.equal(qo, eager_chain(q, wq, cos, sin, head_dim, rotation, rounding))
    assert torch.equal(ko, eager_chain(k, wk, cos, sin, head_dim, rotation, rounding))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotation", ["interleaved", "half"])
@pytest.mark.parametrize("exact", [True, False])
def test_per_head_matches_float64(kernel, dtype, rotation, exact):
    B, S, H, hd = 2, 33, 24, 128
    cos, sin = random_tables(B, S, hd, 40)
    q, k = rand((B, S, H * hd), dtype, 41, 2), rand((B, S, H * hd), dtype, 42, 2, -0.2)
    w = rand((hd,), dtype, 43, 0.2, 1)
    qo, ko = call(kernel, q, k, w, w, cos, sin, head_dim=hd, rotation=rotation, exact_mode=exact)
    for y, x in ((qo, q), (ko, k)):
        expected, terms = f64_chain(x, w, cos, sin, hd, rotation)
        close_to(y, expected, terms, dtype, 2 if exact else 1)


@pytest.mark.parametrize("B", [1, 2, 3, 5])
@pytest.mark.parametrize("D, head_dim, rotation", [(2048, 2048, "interleaved"), (4096, 4096, "interleaved"),
                                                   (2048, 128, "half"), (1536, 64, "interleaved")])
def test_samples_taken_two_per_pass_equal_one_per_pass_and_eager_for_any_batch(kernel, tuning, B, D, head_dim,
                                                                               rotation):
    """Tables shared by the batch and a norm over the whole row: the kernel takes
    two samples per pass (the second predicated off past an odd batch's end); one
    per pass is forced with the `qk_rmsnorm_rope.samples` override (per-head norms always take
    one). Both must be the eager chain bit for bit."""
    S = 40
    cos, sin = (t.expand(B, S, head_dim) for t in random_tables(1, S, head_dim, B))
    q, k = grid((B, S, D), torch.bfloat16, 40 + B), grid((B, S, D), torch.bfloat16, 50 + B)
    wq, wk = rand((head_dim,), torch.bfloat16, 60, 0.2, 1), rand((head_dim,), torch.bfloat16, 61, 0.2, 1)
    two = call(kernel, q, k, wq, wk, cos, sin, head_dim=head_dim, rotation=rotation)
    tuning({"qk_rmsnorm_rope.samples": 1})
    one = call(kernel, q, k, wq, wk, cos, sin, head_dim=head_dim, rotation=rotation)
    for got, forced, x, w in zip(two, one, (q, k), (wq, wk)):
        assert torch.equal(got, forced)
        assert torch.equal(got, eager_chain(x, w, cos, sin, head_dim, rotation, "torch", kernel))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("H, head_dim", [(32, 128), (24, 128), (24, 64), (8, 64), (3, 64), (1, 64), (33, 64)])
@pytest.mark.parametrize("rotation", ["interleaved", "half"])
@pytest.mark.parametrize("rounding, exact, weight_dtype", [("diffusers", True, None), ("torch", True, torch.float32),
                                                           ("diffusers", False, None), ("torch", False, "none"),
                                                           ("diffusers", True, "none")])
def test_one_word_per_head_kernel_is_bitwise_the_v6_kernel(kernel, tuning, dtype, H, head_dim, rotation,
                                                           rounding, exact, weight_dtype):
    """2-byte per-head rows take the one-word kernel (v7): a row split into chunks
    along y (32 or 24 heads of 128: 512 or 384 words), whole tokens per block (24
    heads of 64: one; 8 heads: four; 3 heads: ten, rounded up to whole warps; 1
    head: 32), 33 heads of 64 (264 words, no chunk of whole warps divides them)
    stay on v6. Random inputs, tables per sample for odd H (per token otherwise)
    and an odd S that leaves the last token group short: the reduction of each
    word is the same shuffles in the same order, so v7 and v6
    (the `qk_rmsnorm_rope.one_word` override 0) agree bit for bit."""
    B, S = 2, 41
    D = H * head_dim
    cos, sin = random_tables(B if H % 2 else 1, S, head_dim, H)
    q, k = rand((B, S, D), dtype, 100 + H, 2), rand((B, S, D), dtype, 200 + H, 2, 0.3)
    if weight_dtype == "none":
        wq = wk = None
    else:
        wq = rand((head_dim,), weight_dtype or dtype, 300 + H, 0.2, 1)
        wk = rand((head_dim,), weight_dtype or dtype, 400 + H, 0.2, 1)
    kw = dict(head_dim=head_dim, rotation=rotation, rounding=rounding, exact_mode=exact)
    v7 = call(kernel, q, k, wq, wk, cos, sin, **kw)
    tuning({"qk_rmsnorm_rope.one_word": 0})
    v6 = call(kernel, q, k, wq, wk, cos, sin, **kw)
    for a, b in zip(v7, v6):
        assert torch.equal(a, b)


@pytest.mark.parametrize("B, S, H, head_dim", [(1, 37, 24, 128), (2, 41, 32, 128), (3, 5, 24, 64), (2, 9, 8, 64),
                                                (1, 3, 3, 64), (2, 7, 6, 128)])
@pytest.mark.parametrize("rotation", ["interleaved", "half"])
def test_two_words_per_thread_equal_one_word_per_thread_and_eager_in_place_too(kernel, tuning, B, S, H, head_dim,
                                                                               rotation):
    """With tables per head the one-word kernel gives each thread the same lane
    of two heads where the head count allows (3 heads keep one word);
    the `qk_rmsnorm_rope.head_words` override 1 forces one. Both widths must be the eager chain
    bit for bit, out of place and in place (out = in)."""
    D = H * head_dim
    cos, sin = random_tables(1, S, head_dim, 80 + S)
    q, k = grid((B, S, D), torch.bfloat16, 81 + S), grid((B, S, D), torch.bfloat16, 82 + S)
    wq, wk = rand((head_dim,), torch.bfloat16, 83, 0.2, 1), rand((head_dim,), torch.bfloat16, 84, 0.2, 1)
    kw = dict(head_dim=head_dim, rotation=rotation, rounding="diffusers")
    two = call(kernel, q, k, wq, wk, cos, sin, **kw)
    qi, ki = q.clone(), k.clone()
    kernel.ops.qk_rmsnorm_rope(qi, ki, qi, ki, wq, wk, cos, sin, head_dim, EPS, rotation, True, True)
    tuning({"qk_rmsnorm_rope.head_words": 1})
    one = call(kernel, q, k, wq, wk, cos, sin, **kw)
    for got, single, inplace, x, w in zip(two, one, (qi, ki), (q, k), (wq, wk)):
        assert torch.equal(got, single)
        assert torch.equal(inplace, got)
        assert torch.equal(got, eager_chain(x, w, cos, sin, head_dim, rotation, "diffusers", kernel))


def test_four_dim_input_and_two_dim_tables_as_flux_passes_them(kernel):
    B, S, H, hd = 1, 64, 24, 128
    cos, sin = random_tables(1, S, hd, 50)
    q, k = grid((B, S, H, hd), torch.bfloat16, 51), grid((B, S, H, hd), torch.bfloat16, 52)
    w = rand((hd,), torch.bfloat16, 53, 0.2, 1)
    qo, ko = kernel.qk_rmsnorm_rope(q, k, w, w, cos[0], sin[0], 1e-5, rounding="diffusers")
    assert qo.shape == q.shape
    expected = eager_chain(q.flatten(2), w, cos, sin, hd, "interleaved", "diffusers").unflatten(-1, (H, hd))
    assert torch.equal(qo, expected)


@pytest.mark.parametrize("B", [1, 2, 3])
@pytest.mark.parametrize("D, dtype", [(4096, torch.bfloat16), (4000, torch.bfloat16), (2056, torch.bfloat16),
                                      (2048, torch.float32)])
def test_rows_of_257_to_512_words_in_512_thread_blocks_equal_two_words_per_thread_and_eager(kernel, tuning,
                                                                                            B, D, dtype):
    """A whole-row norm over 257-512 words takes one word per thread in a block of
    512 (LTX 13B's 4096, 4000 with the last 12 lanes idle, 2056 with 255 idle);
    the `qk_rmsnorm_rope.threads_per_row` override 256 forces two words per thread in 256. Both must be the
    eager chain bit for bit, with one and two samples per pass."""
    S = 33
    cos, sin = (t.expand(B, S, D) for t in random_tables(1, S, D, B))
    q, k = grid((B, S, D), dtype, 70 + B), grid((B, S, D), dtype, 80 + B)
    wq, wk = rand((D,), dtype, 90, 0.2, 1), rand((D,), dtype, 91, 0.2, 1)
    wide = call(kernel, q, k, wq, wk, cos, sin, head_dim=D)
    tuning({"qk_rmsnorm_rope.threads_per_row": 256})
    narrow = call(kernel, q, k, wq, wk, cos, sin, head_dim=D)
    for got, forced, x, w in zip(wide, narrow, (q, k), (wq, wk)):
        assert torch.equal(got, forced)
        assert torch.equal(got, eager_chain(x, w, cos, sin, D, "interleaved", "torch", kernel))


# --- paths, layouts, in place --------------------------------------------------------

@pytest.mark.parametrize("D, head_dim, rotation, path", [
    (2048, 2048, "interleaved", VECTORIZED),  # the whole row
    (3072, 128, "half", VECTORIZED),
    (4096, 128, "interleaved", VECTORIZED),  # per head, one word per thread: two chunks of 256 words
    (5120, 5120, "interleaved", VECTORIZED),  # 640 words: 3 per thread
    (4096, 4096, "interleaved", VECTORIZED),  # 512 words: one per thread in a 512-thread block
    (8, 8, "interleaved", VECTORIZED),  # one word
    (130, 130, "interleaved", FALLBACK),  # not whole words
    (96 * 4, 96, "half", FALLBACK),  # 12 words per head, not a power of two
    (16384, 16384, "interleaved", FALLBACK),  # more than 4 words per thread
])
def test_every_size_is_right_on_its_path(kernel, D, head_dim, rotation, path):
    cos, sin = random_tables(1, 12, head_dim, D)
    q, k = grid((2, 12, D), torch.bfloat16, D), grid((2, 12, D), torch.bfloat16, D + 1)
    expect_path(kernel, "qk_rmsnorm_rope_path", (q, k, q, k, None, None, cos, sin, head_dim, rotation), path)
    qo, ko = call(kernel, q, k, None, None, cos, sin, head_dim=head_dim, rotation=rotation)
    assert torch.equal(qo, eager_chain(q, None, cos, sin, head_dim, rotation, "torch", kernel))
    assert torch.equal(ko, eager_chain(k, None, cos, sin, head_dim, rotation, "torch", kernel))


def test_misaligned_views_take_the_fallback_with_the_same_result(kernel):
    D = 2048
    cos, sin = random_tables(1, 16, D, 60)
    q_buf, k_buf = grid((2, 16, D + 1), torch.bfloat16, 61), grid((2, 16, D + 1), torch.bfloat16, 62)
    q, k = q_buf[..., 1:], k_buf[..., 1:]  # 2-byte offset rows
    qc, kc = q.contiguous(), k.contiguous()
    qo, ko = torch.empty_like(qc), torch.empty_like(kc)
    expect_path(kernel, "qk_rmsnorm_rope_path", (qo, ko, qc, kc, None, None, cos, sin, D, "interleaved"), VECTORIZED)
    expect_path(kernel, "qk_rmsnorm_rope_path", (qo, ko, q, k, None, None, cos, sin, D, "interleaved"), FALLBACK)
    a = call(kernel, q, k, None, None, cos, sin)
    b = call(kernel, qc, kc, None, None, cos, sin)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("D, head_dim", [(2048, None), (3072, 128), (130, None)])
def test_in_place_equals_out_of_place(kernel, D, head_dim):
    cos, sin = random_tables(2, 20, head_dim or D, 70)
    q, k = rand((2, 20, D), torch.bfloat16, 71), rand((2, 20, D), torch.bfloat16, 72)
    expected = kernel.qk_rmsnorm_rope(q, k, None, None, cos, sin, head_dim=head_dim)
    qo, ko = kernel.qk_rmsnorm_rope(q, k, None, None, cos, sin, head_dim=head_dim, inplace=True)
    assert qo is q and ko is k
    assert torch.equal(q, expected[0]) and torch.equal(k, expected[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_into_the_video_rows_of_a_joint_tensor_equals_out_of_place_and_leaves_the_rest(kernel, dtype):
    """Mochi's [video | text] q and k ([B, S + L, H, Dh]): the fused pass writes the video rows into
    the joint tensors' views; the text rows keep their poison."""
    B, S, L, H, Dh = 2, 40, 7, 24, 128
    cos, sin = random_tables(1, S, H * Dh, 73)
    q, k = rand((B, S, H, Dh), dtype, 74), rand((B, S, H, Dh), dtype, 75)
    wq, wk = rand((Dh,), dtype, 76, 0.1, 1.0), rand((Dh,), dtype, 77, 0.1, 1.0)
    expected = kernel.qk_rmsnorm_rope(q, k, wq, wk, cos, sin, head_dim=Dh)
    joint = [torch.full((B, S + L, H, Dh), float("nan"), dtype=dtype, device="cuda") for _ in range(2)]
    out = tuple(t[:, :S] for t in joint)
    got = kernel.qk_rmsnorm_rope(q, k, wq, wk, cos, sin, head_dim=Dh, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    for t, e in zip(joint, expected):
        assert torch.equal(t[:, :S], e) and t[:, S:].isnan().all()


def test_strided_views_and_non_contiguous_tables_are_right(kernel):
    D = 2048
    qkv = grid((2, 24, 3 * D), torch.bfloat16, 80)  # q and k as column slices of a fused projection
    q, k = qkv[..., :D], qkv[..., D:2 * D]
    cos_t, sin_t = random_tables(1, D, 24, 81)
    cos, sin = cos_t.transpose(1, 2), sin_t.transpose(1, 2)  # last dim not contiguous: copied
    qo, ko = kernel.qk_rmsnorm_rope(q, k, None, None, cos, sin)
    assert torch.equal(qo, eager_chain(q, None, cos, sin, D, "interleaved", "torch"))
    assert torch.equal(ko, eager_chain(k, None, cos, sin, D, "interleaved", "torch"))


def test_zero_size_input_is_a_no_op(kernel):
    q = torch.empty(2, 0, 256, dtype=torch.bfloat16, device="cuda")
    cos, sin = torch.empty(1, 0, 256, device="cuda"), torch.empty(1, 0, 256, device="cuda")
    qo, ko = kernel.qk_rmsnorm_rope(q, q.clone(), None, None, cos, sin)
    assert qo.shape == q.shape and ko.shape == q.shape


def _bad(kernel, case):
    D = 256
    q = rand((2, 8, D), torch.bfloat16, 90)
    cos, sin = random_tables(1, 8, D, 91)
    args = dict(q=q, k=q.clone(), q_weight=None, k_weight=None, cos=cos, sin=sin)
    kw = {}
    if case == "k dtype":
        args["k"] = q.half()
    elif case == "k shape":
        args["k"] = q[:, :4].clone()
    elif case == "weight shape":
        args["q_weight"] = torch.ones(D // 2, device="cuda", dtype=torch.bfloat16)
    elif case == "weight dtype":
        args["q_weight"] = torch.ones(D, device="cuda", dtype=torch.float16)
    elif case == "mixed weight dtypes":
        args["q_weight"], args["k_weight"] = torch.ones(D, device="cuda"), torch.ones(D, device="cuda").bfloat16()
    elif case == "table dtype":
        args["cos"] = cos.bfloat16()
    elif case == "table shape":
        args["cos"], args["sin"] = cos[:, :4], sin[:, :4]
    elif case == "table on cpu":
        args["sin"] = sin.cpu()
    elif case == "head_dim":
        kw["head_dim"] = 48
    elif case == "odd head_dim":
        kw["head_dim"] = 1
    elif case == "negative eps":
        kw["eps"] = -1.0
    elif case == "diffusers rounding with fp32 weight":
        args["q_weight"] = torch.ones(D, device="cuda")
        kw["rounding"] = "diffusers"
    return args, kw


BAD = {"k dtype": "`k` has dtype", "k shape": "`k` has shape", "weight shape": "`q_weight` has shape",
       "weight dtype": "`q_weight` has dtype", "mixed weight dtypes": "`k_weight` has dtype",
       "table dtype": "`cos` has dtype", "table shape": "`cos` has shape", "table on cpu": "`sin` is on cpu",
       "head_dim": "`head_dim` is 48", "odd head_dim": "`head_dim` is 1", "negative eps": "`eps` must be >= 0",
       "diffusers rounding with fp32 weight": "diffusers rounding with a float32 weight"}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_naming_the_argument_and_the_next_call_is_right(kernel, case):
    args, kw = _bad(kernel, case)
    with pytest.raises((RuntimeError, TypeError), match=BAD[case].replace("`", ".")):
        kernel.qk_rmsnorm_rope(**args, **kw)
    q = grid((2, 8, 256), torch.bfloat16, 92)
    cos, sin = random_tables(1, 8, 256, 93)
    qo, _ = kernel.qk_rmsnorm_rope(q, q, None, None, cos, sin)
    assert torch.equal(qo, eager_chain(q, None, cos, sin, 256, "interleaved", "torch"))


def test_same_output_for_q_and_k_is_refused(kernel):
    q = rand((2, 8, 256), torch.bfloat16, 94)
    cos, sin = random_tables(1, 8, 256, 95)
    out = torch.empty_like(q)
    with pytest.raises(RuntimeError, match="same memory"):
        kernel.ops.qk_rmsnorm_rope(out, out, q, q, None, None, cos, sin, 256, EPS, "interleaved", False, True)


def test_runs_on_the_current_stream(kernel):
    q = rand((2, 512, 2048), torch.bfloat16, 96)
    cos, sin = kernel.ltx_rope_cos_sin(2, 16, 16, None, 2048, device="cuda")
    expected = kernel.qk_rmsnorm_rope(q, q, None, None, cos, sin)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(10_000_000)  # the op must queue behind this, not run ahead on the default stream
        got = kernel.qk_rmsnorm_rope(q, q, None, None, cos, sin)
    stream.synchronize()
    assert torch.equal(got[0], expected[0])


def test_compile_fullgraph_and_opcheck(kernel):
    cos, sin = kernel.ltx_rope_cos_sin(2, 4, 4, None, 256, batch_size=2, device="cuda")
    q, k = rand((2, 32, 256), torch.bfloat16, 97), rand((2, 32, 256), torch.bfloat16, 98)
    w = rand((256,), torch.bfloat16, 99)
    f = torch.compile(lambda q, k: kernel.qk_rmsnorm_rope(q, k, w, w, cos, sin), fullgraph=True)
    a, b = f(q, k)
    expected = kernel.qk_rmsnorm_rope(q, k, w, w, cos, sin)
    assert torch.equal(a, expected[0]) and torch.equal(b, expected[1])
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    torch.library.opcheck(kernel.ops.qk_rmsnorm_rope, (qo, ko, q, k, w, w, cos.contiguous(), sin.contiguous(),
                                                      256, EPS, "interleaved", False, True))


# --- backward (issue 36) ------------------------------------------------------------------------------
# Grads of q, k and both weights; the weight grads sum over rows (and heads) in a fixed order.

from .backward_support import (graph_replays_training_step, grads, launched_kernels,  # noqa: E402
                               nan_filled_allocations, rel_l2)

# (shape, head_dim, rotation, table columns): LTX-Video 2B (a norm over the row of 2048, [B, S, D] tables),
# Flux/Mochi-like per-head norms of 128 with per-head tables, rotate-half, and an odd group of 6.
BWD_FORMS = [((2, 2688, 2048), None, "interleaved", "full"),
             ((2, 300, 3 * 128), 128, "interleaved", "head"),
             ((1, 77, 4 * 64), 64, "half", "full"),
             ((3, 5, 4 * 6), 6, "half", "head"),
             ((2, 2048, 8 * 64), 64, "interleaved", "head")]  # 32768 heads: the warp kernel's units in 4 runs
BWD_IDS = ["ltx", "heads128", "half64", "group6", "runs4"]


def qk_leaves(shape, dtype, weight_dtype, seed, group=None):
    """q, k and weights of `group` channels (the whole last dim when None) that require grad."""
    q, k = rand(shape, dtype, seed).requires_grad_(), rand(shape, dtype, seed + 1).requires_grad_()
    if weight_dtype is None:
        return q, k, None, None
    group = group or shape[-1]
    return (q, k, rand((group,), weight_dtype, seed + 2, 0.2, 1.0).requires_grad_(),
            rand((group,), weight_dtype, seed + 3, 0.2, 1.0).requires_grad_())


def run_qk(kernel, q, k, wq, wk, cos, sin, head_dim, rotation, rounding="torch", exact=True):
    return kernel.qk_rmsnorm_rope(q, k, wq, wk, cos, sin, EPS, head_dim=head_dim, rotation=rotation,
                                  rounding=rounding, exact_mode=exact)


def f64_grads(q, k, wq, wk, cos, sin, head_dim, rotation, dq, dk):
    """Autograd of the float64 chain."""
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (q, k, wq, wk)]
    hd = head_dim or q.shape[-1]
    outs = (f64_chain(leaves[0], leaves[2], cos, sin, hd, rotation)[0],
            f64_chain(leaves[1], leaves[3], cos, sin, hd, rotation)[0])
    return grads(outs, (dq.double(), dk.double()), *leaves)


def tables_for(shape, head_dim, cols, seed):
    return random_tables(1, shape[1], head_dim if cols == "head" else shape[-1], seed)


@pytest.mark.parametrize("form", BWD_FORMS[1:], ids=BWD_IDS[1:])
@pytest.mark.parametrize("weighted", [True, False])
def test_gradcheck_float32(kernel, form, weighted):
    shape, head_dim, rotation, cols = form
    shape = (1, 3, shape[-1])
    q, k, wq, wk = qk_leaves(shape, torch.float32, torch.float32 if weighted else None, 80, head_dim)
    cos, sin = tables_for(shape, head_dim, cols, 81)
    inputs = tuple(t for t in (q, k, wq, wk) if t is not None)
    fn = lambda *t: run_qk(kernel, t[0], t[1], *(t[2:] or (None, None)), cos, sin, head_dim, rotation)  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-3, atol=3e-3, rtol=1e-2, nondet_tol=0.0)


# Other whole-row norms: Wan 1.3B's 1536 and LTX 13B's 4096 (the row kernel: 384 threads x 1 word,
# 256 x 4 in float32), rotate-half across a row of 1024 (the block kernel, 2 pairs per thread); and a row
# of 6000, too wide for both (warp kernel).
WIDE_FORMS = [((2, 100, 1536), None, "interleaved", "full"), ((1, 40, 1024), None, "half", "full"),
              ((1, 50, 4096), None, "interleaved", "full"), ((1, 9, 6000), None, "interleaved", "full")]


@pytest.mark.parametrize("form", BWD_FORMS + WIDE_FORMS,
                         ids=BWD_IDS + ["wan", "half1024", "ltx13b", "row6000"])
def test_float32_grads_match_the_float64_backward(kernel, form):
    shape, head_dim, rotation, cols = form
    q, k, wq, wk = qk_leaves(shape, torch.float32, torch.float32, 82, head_dim)
    cos, sin = tables_for(shape, head_dim, cols, 83)
    dq, dk = rand(shape, torch.float32, 84), rand(shape, torch.float32, 85)
    got = grads(run_qk(kernel, q, k, wq, wk, cos, sin, head_dim, rotation, exact=False), (dq, dk), q, k, wq, wk)
    for name, g, r in zip(("dq", "dk", "dwq", "dwk"), got, f64_grads(q, k, wq, wk, cos, sin, head_dim, rotation,
                                                                      dq, dk)):
        assert g.dtype == torch.float32 and g.shape == r.shape, name
        # float32 sums over a row (and over every row for dw): relative to the largest grad
        assert (g.double() - r).abs().max().item() <= 2e-5 * max(r.abs().max().item(), 1.0), name


# The row kernel's launch choices (development builds): every threads-per-row it takes (64 at Wan's 192
# words: 3 of 4 words per thread; 0: the block kernel), units per block down to 1, several runs of the
# split, the next unit's loads on at more words a thread and off at one. Each must be as close to the
# float64 backward as the default, and deterministic.
ROW_KNOBS = [{"qk_rmsnorm_rope.bwd_threads": 0}, {"qk_rmsnorm_rope.bwd_threads": 64},
             {"qk_rmsnorm_rope.bwd_threads": 96}, {"qk_rmsnorm_rope.bwd_threads": 512},
             {"qk_rmsnorm_rope.bwd_rows": 1}, {"qk_rmsnorm_rope.bwd_rows": 3, "qk_rmsnorm_rope.bwd_runs": 5},
             {"qk_rmsnorm_rope.bwd_prefetch": 0},
             {"qk_rmsnorm_rope.bwd_threads": 64, "qk_rmsnorm_rope.bwd_prefetch": 1}]


@pytest.mark.parametrize("knobs", ROW_KNOBS, ids=lambda k: ",".join(f"{n.split('.')[1]}={v}" for n, v in k.items()))
@pytest.mark.parametrize("dim, weight_dtype, rounding", [(2048, torch.bfloat16, "torch"),
                                                         (1536, torch.float32, "torch")], ids=["ltx", "wan"])
def test_row_kernel_choices_match_the_float64_backward_like_the_default(kernel, tuning, knobs, dim, weight_dtype,
                                                                         rounding):
    shape = (3, 37, dim)  # an odd batch, 111 units: a short last block at every split
    q, k, wq, wk = qk_leaves(shape, torch.bfloat16, weight_dtype, 120)
    cos, sin = (t.expand(3, 37, dim) for t in random_tables(1, 37, dim, 121))
    dq, dk = rand(shape, torch.bfloat16, 122), rand(shape, torch.bfloat16, 123)
    refs = f64_grads(q, k, wq, wk, cos, sin, None, "interleaved", dq, dk)

    def run():
        return grads(run_qk(kernel, q, k, wq, wk, cos, sin, None, "interleaved", rounding), (dq, dk), q, k, wq, wk)

    default = run()
    tuning(knobs)
    with nan_filled_allocations():
        forced = run()
        assert all(torch.equal(a, b) for a, b in zip(forced, run()))
    for name, f, d, r in zip(("dq", "dk", "dwq", "dwk"), forced, default, refs):
        assert not torch.isnan(f).any(), name
        assert rel_l2(f, r) <= max(2 * 2.0 ** -8, 1.1 * rel_l2(d, r)), (name, rel_l2(f, r), rel_l2(d, r))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rounding", ["torch", "diffusers"])
@pytest.mark.parametrize("form", BWD_FORMS[:3], ids=BWD_IDS[:3])
def test_half_grads_are_no_worse_than_eager_autograd(kernel, dtype, rounding, form):
    """Against eager autograd of the model's chain (torch.nn.RMSNorm or diffusers RMSNorm, then
    diffusers' apply_rotary_emb), both measured against the float64 backward."""
    shape, head_dim, rotation, cols = form
    q, k, wq, wk = qk_leaves(shape, dtype, dtype, 86, head_dim)
    cos, sin = tables_for(shape, head_dim, cols, 87)
    dq, dk = rand(shape, dtype, 88), rand(shape, dtype, 89)
    hd = head_dim or shape[-1]
    ours = grads(run_qk(kernel, q, k, wq, wk, cos, sin, head_dim, rotation, rounding), (dq, dk), q, k, wq, wk)
    eager = grads((eager_chain(q, wq, cos, sin, hd, rotation, rounding),
                   eager_chain(k, wk, cos, sin, hd, rotation, rounding)), (dq, dk), q, k, wq, wk)
    refs = f64_grads(q, k, wq, wk, cos, sin, head_dim, rotation, dq, dk)
    tol = 2 * 2.0 ** -(8 if dtype == torch.bfloat16 else 11)
    for name, o, e, r in zip(("dq", "dk", "dwq", "dwk"), ours, eager, refs):
        assert o.dtype == e.dtype and o.shape == e.shape and not torch.isnan(o).any(), name
        assert rel_l2(o, r) <= max(tol, 1.1 * rel_l2(e, r)), (name, rel_l2(o, r), rel_l2(e, r))


# Wan's form: a whole-row norm with one head's [1, S, 128] tables repeating along the row. Rows of 192
# words (one a thread, the next unit's loads ahead), of 80 (bf16 640: 96 threads, a short last warp) and
# of 640 (5120: 3 words a thread, the kernel that re-reads weights and recomputes dn).
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rounding", ["torch", "diffusers"])
@pytest.mark.parametrize("shape", [(2, 37, 1536), (1, 9, 640), (2, 5, 5120)], ids=["1536", "640", "5120"])
def test_backward_with_tables_repeating_along_the_row_gives_the_bits_of_the_tiled_tables(kernel, dtype, rounding,
                                                                                         shape):
    q, k, wq, wk = qk_leaves(shape, dtype, dtype, 130)
    cos, sin = random_tables(1, shape[1], 128, 131)
    tiled = tuple(t.repeat(1, 1, shape[-1] // 128) for t in (cos, sin))
    dq, dk = rand(shape, dtype, 132), rand(shape, dtype, 133)
    with nan_filled_allocations():
        got = grads(run_qk(kernel, q, k, wq, wk, cos, sin, None, "interleaved", rounding), (dq, dk), q, k, wq, wk)
        want = grads(run_qk(kernel, q, k, wq, wk, *tiled, None, "interleaved", rounding), (dq, dk), q, k, wq, wk)
    refs = f64_grads(q, k, wq, wk, *tiled, None, "interleaved", dq, dk)
    tol = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 1e-5}[dtype]
    for name, g, w, r in zip(("dq", "dk", "dwq", "dwk"), got, want, refs):
        assert torch.equal(g, w), name
        assert rel_l2(g, r) <= tol, (name, rel_l2(g, r))


@pytest.mark.parametrize("form", BWD_FORMS, ids=BWD_IDS)
def test_backward_is_bitwise_deterministic_and_writes_every_element(kernel, form):
    shape, head_dim, rotation, cols = form
    q, k, wq, wk = qk_leaves(shape, torch.bfloat16, torch.float32, 90, head_dim)
    cos, sin = tables_for(shape, head_dim, cols, 91)
    dq, dk = rand(shape, torch.bfloat16, 92), rand(shape, torch.bfloat16, 93)
    with nan_filled_allocations():
        first = grads(run_qk(kernel, q, k, wq, wk, cos, sin, head_dim, rotation), (dq, dk), q, k, wq, wk)
        assert not any(torch.isnan(g).any() for g in first)
        for _ in range(2):
            again = grads(run_qk(kernel, q, k, wq, wk, cos, sin, head_dim, rotation), (dq, dk), q, k, wq, wk)
            assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_misaligned_rows_of_the_row_form_take_the_block_kernel_on_its_split_with_correct_grads(kernel):
    """The split follows the shapes and form alone (one wave of the row kernel at LTX-Video's 5376 units),
    so rows offset by one element take the block kernel on that split: the grads still match the float64
    backward as closely as the aligned call's, bitwise the same twice."""
    shape = (2, 2688, 2048)
    bufs = [rand((2, 2688, 2049), torch.bfloat16, 130 + i) for i in range(2)]
    q, k = (b[..., 1:].requires_grad_() for b in bufs)  # 2-byte offset rows
    wq, wk = (rand((2048,), torch.float32, 132 + i, 0.2, 1.0).requires_grad_() for i in range(2))
    cos, sin = random_tables(1, 2688, 2048, 134)
    dq, dk = rand(shape, torch.bfloat16, 135), rand(shape, torch.bfloat16, 136)
    refs = f64_grads(q, k, wq, wk, cos, sin, None, "interleaved", dq, dk)

    def run(q, k):
        return grads(run_qk(kernel, q, k, wq, wk, cos, sin, None, "interleaved"), (dq, dk), q, k, wq, wk)

    aligned = run(*(t.detach().contiguous().requires_grad_() for t in (q, k)))
    offset = run(q, k)
    assert all(torch.equal(a, b) for a, b in zip(offset, run(q, k)))
    for name, o, a, r in zip(("dq", "dk", "dwq", "dwk"), offset, aligned, refs):
        assert not torch.isnan(o).any(), name
        assert rel_l2(o, r) <= max(2 * 2.0 ** -8, 1.1 * rel_l2(a, r)), (name, rel_l2(o, r), rel_l2(a, r))


def test_four_d_input_one_weight_and_only_weight_grads(kernel):
    q = rand((2, 40, 4, 64), torch.bfloat16, 94).requires_grad_()
    k = rand((2, 40, 4, 64), torch.bfloat16, 95)
    wq = rand((64,), torch.bfloat16, 96, 0.2, 1.0).requires_grad_()
    cos, sin = random_tables(1, 40, 64, 97)
    qo, ko = kernel.qk_rmsnorm_rope(q, k, wq, None, cos, sin, EPS, head_dim=64)
    assert qo.shape == q.shape
    dq, dwq = grads(qo, torch.ones_like(qo), q, wq)
    assert dq.shape == q.shape and dwq.shape == wq.shape and dwq.dtype == wq.dtype
    qo, _ = kernel.qk_rmsnorm_rope(q.detach(), k, wq, None, cos, sin, EPS, head_dim=64)
    (dwq_only,) = grads(qo, torch.ones_like(qo), wq)
    assert torch.equal(dwq_only, dwq)


def test_tables_requiring_grad_or_inplace_are_refused_while_recording(kernel):
    q, k, wq, wk = qk_leaves((1, 4, 64), torch.bfloat16, torch.bfloat16, 98)
    cos, sin = random_tables(1, 4, 64, 99)
    with pytest.raises(kernel.NoBackwardError, match=r"`cos` requires grad"):
        kernel.qk_rmsnorm_rope(q, k, wq, wk, cos.requires_grad_(), sin)
    with pytest.raises(kernel.NoBackwardError, match=r"`inplace`"):
        kernel.qk_rmsnorm_rope(q, k, wq, wk, cos.detach(), sin, inplace=True)


def test_opcheck_functional_ops_with_autograd(kernel):
    q, k, wq, wk = qk_leaves((2, 5, 256), torch.bfloat16, torch.float32, 100, 64)
    cos, sin = random_tables(1, 5, 64, 101)
    args = (q, k, wq, wk, cos, sin, 64, EPS, "half", False, True)
    torch.library.opcheck(kernel.ops.qk_rmsnorm_rope_fwd.default, args)
    detached = [t.detach() for t in (q, k, wq, wk)]
    torch.library.opcheck(kernel.ops.qk_rmsnorm_rope_bwd.default,
                          (torch.ones_like(detached[0]), torch.ones_like(detached[1]), *detached, cos, sin, 64, EPS,
                           "half", False, True, True))


def test_cuda_graph_of_forward_and_backward(kernel):
    shape = (2, 2688, 2048)
    q, k, wq, wk = qk_leaves(shape, torch.bfloat16, torch.bfloat16, 102)
    cos, sin = random_tables(1, 2688, 2048, 103)
    dq, dk = rand(shape, torch.bfloat16, 104), rand(shape, torch.bfloat16, 105)

    def step():
        torch.autograd.backward(run_qk(kernel, q, k, wq, wk, cos, sin, None, "interleaved"), (dq, dk))

    graph_replays_training_step(step, [q, k, wq, wk], lambda: q.copy_(rand(shape, torch.bfloat16, 106)))


def test_compiled_training_step_matches_eager(kernel):
    q, k, wq, wk = qk_leaves((2, 16, 256), torch.bfloat16, torch.bfloat16, 107)
    cos, sin = random_tables(1, 16, 256, 108)
    dq, dk = rand(q.shape, torch.bfloat16, 109), rand(k.shape, torch.bfloat16, 110)
    f = lambda *t: tuple(o * 2 for o in run_qk(kernel, *t, cos, sin, None, "interleaved"))  # noqa: E731
    compiled = torch.compile(f, fullgraph=True)
    for a, b in zip(grads(compiled(q, k, wq, wk), (dq, dk), q, k, wq, wk),
                    grads(f(q, k, wq, wk), (dq, dk), q, k, wq, wk)):
        assert torch.equal(a, b)
