"""The layernorm family on the GPU (issue 35, item 2): numerics against float64
for every dtype, weight/bias dtype and modulation form; exact mode against the
models' own eager code, bit for bit where that is a claim we can make; both
kernel paths and every compiled row width; strided, misaligned and broadcast
operands; bad input; torch.compile, opcheck, CUDA graphs, streams, dependent
launch; a hypothesis fuzz. Skipped without CUDA.

What is bitwise (docs/formulas.md#layernorm):
- the residual x_new of gated_residual_layernorm (no reduction in it), except
  in fast mode with a gate of x's dtype (one rounding there);
- the modulation and the final rounding, given the same normalised value: the
  ops equal the models' eager chains with our own `layernorm` in place of the
  model's norm module. The normalised value depends on the order the row is
  summed in, which differs between torch's kernel (Welford), ours, and our
  kernels for other dtypes or row widths; these tests feed rows whose mean and
  variance are exact in float32 in any order (`paired_grid`), so that the
  comparison checks the chain and not the summation order;
- against torch's own LayerNorm on random rows: within an ulp, bitwise on all
  but a small fraction of elements (the bounds below).
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from ltx_dev.reference import fused_norm as fref
from ltx_dev.reference import layernorm as lref

from .backward_support import graph_replays_training_step, launched_kernels, nan_filled_allocations, rel_l2
from .conftest import FALLBACK, VECTORIZED, cuda
from .stream_chain import assert_chain_sees_each_output, residual_chain
from .test_fused_norm_gpu import compiled_and_graph_replay_match_eager, poisoned, rand

pytestmark = cuda

DEV = "cuda"
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
DTYPES = [BF16, F16, F32]
HALF = [BF16, F16]
EPS = 1e-6
# |y - ref64| / error magnitude (see ln_magnitude): one rounding of T plus float32 error.
TOL = {BF16: 2 * 2**-8, F16: 2 * 2**-11, F32: 2e-5}
# [B, S, D]: the models' widths (1536 Wan 1.3B, 3072 Flux / HunyuanVideo, 5120 Wan 14B), a width that
# takes a power-of-two row (1000), the scalar fallback (130: not whole words; 24576: past 2048 words),
# the widest vectorized row (16384: 4 words per thread), tiny rows.
SHAPES = [(2, 64, 1536), (1, 33, 3072), (1, 7, 5120), (3, 17, 1000), (2, 5, 8), (1, 1, 1), (2, 9, 130),
          (1, 3, 16384), (1, 2, 24576)]
FORMS = ["[D]", "[B,D]", "[B,1,D]", "[B,S,D]"]
# Every row width the kernel is compiled for (layernorm_config.h: powers of two and the exact widths).
WIDTHS = [32, 64, 96, 128, 192, 256, 320, 384, 512, 640]


def mod(form, B, S, D, dtype, seed, scale=0.5):
    """A modulation tensor in one of the accepted broadcast forms."""
    shape = {"[D]": (D,), "[B,D]": (B, D), "[B,1,D]": (B, 1, D), "[B,S,D]": (B, S, D)}[form]
    return rand(shape, dtype, seed, scale)


def affine_params(D, kind, dtype, seed):
    """(weight, bias): None, of x's dtype, or float32 (Wan keeps its norms' parameters in float32)."""
    if kind is None:
        return None, None
    wd = dtype if kind == "same" else F32
    return rand((D,), wd, seed, 0.2, 1.0), rand((D,), wd, seed + 1, 0.3)


def pairing(D, seed):
    return torch.randperm(D, generator=torch.Generator(device=DEV).manual_seed(seed), device=DEV)


def paired_grid(shape, dtype, seed, step=1 / 16, limit=1.0, perm_seed=0, sign=-1.0):
    """Rows whose LayerNorm statistics are exact in float32 in any summation order: multiples of
    `step` in [-limit, limit], each value paired with its negation (`sign=-1`: the mean is exactly 0
    and the squares and their sums are exact), the columns shuffled by the pairing `perm_seed` (the
    same pairing for tensors combined elementwise, e.g. x and y of a residual). `sign=+1` repeats a
    value in its pair instead (a gate that keeps y * gate paired)."""
    *lead, D = shape
    assert D % 2 == 0
    g = torch.Generator(device=DEV).manual_seed(seed)
    n = round(limit / step)
    half = torch.randint(-n, n + 1, (*lead, D // 2), generator=g, device=DEV).float() * step
    if sign < 0:
        half[..., 0] = limit  # no all-zero row
    rows = torch.cat([half, sign * half], -1) + 0.0  # + 0.0: no -0
    return rows[..., pairing(D, perm_seed)].to(dtype)


def power_of_two_gate(shape, dtype, seed, perm_seed=0):
    """A gate of 1/2 and 1/4, paired like paired_grid's rows, so that y * gate stays exact and paired."""
    *lead, D = shape
    g = torch.Generator(device=DEV).manual_seed(seed)
    half = 2.0 ** -torch.randint(1, 3, (*lead, D // 2), generator=g, device=DEV).float()
    return torch.cat([half, half], -1)[..., pairing(D, perm_seed)].to(dtype)


def ln_magnitude(x, weight=None, bias=None, eps=EPS):
    """What the float32 error of LayerNorm(x) scales with: |x| / std [* |w|] (the mean is subtracted
    in float32, so a near-constant row amplifies it), |b|, and 1."""
    x64 = x.double()
    m = x64.abs() / ((x64 - x64.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True) + eps).sqrt()
    if weight is not None:
        m = m * weight.double().abs()
    if bias is not None:
        m = torch.maximum(m, bias.double().abs())
    return m.clamp_min(1.0)


def modulated_magnitude(x, n_mag, scale, shift):
    """The error magnitude of LN(x) * (1 + scale) + shift (per-batch [B, D] broadcast as the models do)."""
    scale, shift = fref.per_batch(scale, x), fref.per_batch(shift, x)
    m = n_mag * (1 + scale.double().abs())
    return torch.maximum(m, shift.double().abs()) if shift is not None else m


def close_to(y, expected64, dtype, magnitude, factor=1.0):
    assert not torch.isnan(y).any(), "an output element was not written"
    err = (y.double() - expected64).abs() / torch.maximum(magnitude, expected64.abs())
    assert err.max().item() <= TOL[dtype] * factor, err.max().item()


def mostly_bitwise(ours, theirs, magnitude, max_fraction, ulps=1):
    """Equal to `theirs` but where the normalised value moved with the summation order: on at most
    `max_fraction` of the elements, and there by at most `ulps` ulps of T of the row's magnitude."""
    differ = (ours != theirs).float().mean().item()
    print(f"{ours.dtype}: {differ:.2e} of the elements differ")  # -s shows the fractions measured
    assert differ <= max_fraction, differ
    ulp = {BF16: 2**-7, F16: 2**-10, F32: 2**-23}[ours.dtype]
    err = (ours.double() - theirs.double()).abs() / torch.maximum(magnitude, theirs.double().abs())
    assert err.max().item() <= ulps * ulp, err.max().item() / ulp


class OurLayerNorm(nn.Module):
    """A LayerNorm module computed by this package's `layernorm`: dropped into a model in place of its
    norm, so that the model's own forward computes its chain around our normalised value."""

    def __init__(self, kernel, weight=None, bias=None, eps=EPS):
        super().__init__()
        self.kernel, self.weight, self.bias, self.eps = kernel, weight, bias, eps
        self.seen = []

    def forward(self, h):
        self.seen.append(h)
        return self.kernel.layernorm(h, self.weight, self.bias, self.eps)


class Stub(nn.Module):
    """A sub-layer (attention, feed-forward) that records its input and returns fixed tensors."""

    def __init__(self, returns):
        super().__init__()
        self.returns, self.seen = returns, []

    def forward(self, *args, **kwargs):
        self.seen.append(args[0] if args else kwargs["hidden_states"])
        return self.returns


# --- numerics against float64 ------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [None, "same", "float32"])
def test_layernorm_matches_float64(kernel, dtype, affine):
    for i, (B, S, D) in enumerate(SHAPES):
        x = rand((B, S, D), dtype, i, 2, 0.3)
        w, b = affine_params(D, affine, dtype, 100 + i)
        out = poisoned(x)
        kernel.ops.layernorm(out, x, w, b, EPS)
        close_to(out, lref.layer_norm_f64(x, w, b, EPS), dtype, ln_magnitude(x, w, b))


def test_layernorm_takes_any_leading_dims(kernel):
    for shape in [(3072,), (2, 3, 4, 1536), (2, 1, 3, 5, 64)]:
        x = rand(shape, BF16, 1, 2)
        out = kernel.layernorm(x, None, None, EPS)
        assert out.shape == x.shape and out.is_contiguous()
        assert torch.equal(out, kernel.layernorm(x.reshape(-1, shape[-1]), None, None, EPS).view(shape))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("mod_fp32", [False, True])
@pytest.mark.parametrize("exact", [True, False])
def test_adaln_layernorm_matches_float64(kernel, dtype, form, mod_fp32, exact):
    mdt = F32 if mod_fp32 else dtype
    for i, (B, S, D) in enumerate(SHAPES):
        x = rand((B, S, D), dtype, i, 2, 0.3)
        w, b = affine_params(D, (None, "same", "float32")[i % 3], dtype, 100 + i)
        scale = mod(form, B, S, D, mdt, 200 + i)
        shift = mod(form, B, S, D, mdt, 300 + i) if i % 4 != 3 else None
        out = poisoned(x)
        kernel.ops.adaln_layernorm(out, x, scale, shift, w, b, EPS, exact)
        expected = lref.adaln_layer_norm_f64(x, scale, shift, EPS, w, b)
        # Exact mode with half modulation rounds four times (n, 1 + scale, the product, the sum).
        close_to(out, expected, dtype, modulated_magnitude(x, ln_magnitude(x, w, b), scale, shift), factor=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mod_fp32", [False, True])
@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("operands", ["gate", "gate+scale", "scale", "none"])
def test_gated_residual_layernorm_matches_float64(kernel, dtype, mod_fp32, exact, operands):
    mdt = F32 if mod_fp32 else dtype
    for i, (B, S, D) in enumerate(SHAPES):
        x, y = rand((B, S, D), dtype, i, 2), rand((B, S, D), dtype, 10 + i)
        gate = mod("[B,1,D]", B, S, D, mdt, 20 + i) if "gate" in operands else None
        scale = mod("[B,D]", B, S, D, mdt, 30 + i) if "scale" in operands else None
        shift = mod("[B,S,D]", B, S, D, mdt, 40 + i) if scale is not None else None
        w, b = affine_params(D, (None, "same", "float32")[i % 3], dtype, 100 + i)
        out, x_new = poisoned(x), poisoned(x)
        kernel.ops.gated_residual_layernorm(out, x_new, x, y, gate, scale, shift, w, b, EPS, exact)
        yg = y.double() * (gate.double() if gate is not None else 1.0)
        close_to(x_new, x.double() + yg, dtype, torch.maximum(yg.abs(), x.double().abs()).clamp_min(1.0), factor=2)
        n_mag = ln_magnitude(x_new, w, b)  # the kernel normalises x_new after its rounding to T
        if scale is None:
            close_to(out, lref.layer_norm_f64(x_new, w, b, EPS), dtype, n_mag)
        else:
            close_to(out, lref.adaln_layer_norm_f64(x_new, scale, shift, EPS, w, b), dtype,
                     modulated_magnitude(x_new, n_mag, scale, shift), factor=2)


# --- exact mode: the models' chains, bit for bit given the same normalised value ----------------

@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("D", [3072, 1536, 5120, 1000, 130])
@pytest.mark.parametrize("form", ["[B,D]", "[B,1,D]", "[B,S,D]"])
@pytest.mark.parametrize("with_shift", [True, False])
def test_adaln_exact_half_is_bitwise_the_flux_chain(kernel, dtype, D, form, with_shift):
    """Flux / HunyuanVideo: `norm(x) * (1 + scale[:, None]) + shift[:, None]` in T, with nn.LayerNorm's
    rounding of the norm (here our layernorm in its place, optionally affine)."""
    B, S = 2, 48
    x = paired_grid((B, S, D), dtype, D)
    scale, shift = mod(form, B, S, D, dtype, 2), mod(form, B, S, D, dtype, 3) if with_shift else None
    for w, b in ((None, None), affine_params(D, "same", dtype, 4)):
        chain = lref.flux_modulated_norm(lambda h: kernel.layernorm(h, w, b, EPS), x, scale, shift)
        out = kernel.adaln_layernorm(x, scale, shift, EPS, weight=w, bias=b)
        assert torch.equal(out, chain), (out != chain).sum().item()
    # Fast mode rounds once: not the chain on a fair share of the elements.
    fast = kernel.adaln_layernorm(x, scale, shift, EPS, exact_mode=False)
    chain = lref.flux_modulated_norm(lambda h: kernel.layernorm(h, None, None, EPS), x, scale, shift)
    assert (fast != chain).float().mean().item() > 0.01


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("D", [1536, 5120, 3072, 1000, 130])
@pytest.mark.parametrize("form", ["[B,1,D]", "[B,S,D]"])
@pytest.mark.parametrize("exact", [True, False])
def test_adaln_with_float32_modulation_is_bitwise_the_wan_chain(kernel, dtype, D, form, exact):
    """Wan: `(norm1(x.float()) * (1 + scale) + shift).type_as(x)` with float32 scale and shift of
    [B, 1, D] (Wan 2.1) or [B, S, D] (Wan 2.2 TI2V), FP32LayerNorm here our layernorm on x.float().
    One kernel for both modes."""
    B, S = 2, 40
    x = paired_grid((B, S, D), dtype, D)
    scale, shift = mod(form, B, S, D, F32, 2), mod(form, B, S, D, F32, 3)
    chain = lref.wan_modulated_norm(lambda h: kernel.layernorm(h, None, None, EPS), x, scale, shift)
    out = kernel.adaln_layernorm(x, scale, shift, EPS, exact_mode=exact)
    assert torch.equal(out, chain), (out != chain).sum().item()


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("form", ["[B,D]", "[B,1,D]", "[B,S,D]"])
def test_seam_residual_is_bitwise_the_models_residual_on_random_inputs(kernel, dtype, form):
    """x_new needs no reduction, so it is the eager residual bit for bit on any input: Flux's
    `h + gate.unsqueeze(1) * y` (gate of T, exact mode), Wan's `(h.float() + y * gate).type_as(h)`
    (float32 gate, both modes) and the plain `h + y` (Wan before norm3, both modes)."""
    B, S, D = 2, 300, 3072
    x, y = rand((B, S, D), dtype, 1, 2), rand((B, S, D), dtype, 2)
    gate_t, gate_f = mod(form, B, S, D, dtype, 3), mod(form, B, S, D, F32, 4)
    _, x_new = kernel.gated_residual_layernorm(x, y, gate_t, EPS)
    assert torch.equal(x_new, lref.flux_gated_residual(x, y, gate_t))
    for exact in (True, False):
        _, x_new = kernel.gated_residual_layernorm(x, y, gate_f, EPS, exact_mode=exact)
        assert torch.equal(x_new, fref.wan_gated_residual(x, y, gate_f))
        _, x_new = kernel.gated_residual_layernorm(x, y, None, EPS, exact_mode=exact)
        assert torch.equal(x_new, x + y)
    # Fast mode with a gate of T: T(x + y * gate) rounded once.
    _, fast = kernel.gated_residual_layernorm(x, y, gate_t, EPS, exact_mode=False)
    once = (x.double() + y.double() * fref.per_batch(gate_t, x).double()).to(dtype)
    assert (fast != once).float().mean().item() < 1e-3  # float32 FMA against float64: ties only


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("D", [1536, 3072, 5120, 130])
def test_seam_out_is_bitwise_each_models_chain_on_its_own_residual(kernel, dtype, D):
    """out = the model's norm chain applied to x_new (with our layernorm as the norm), for each seam:
    Flux (gate, scale, shift of T), Wan after self-attention (float32 gate, norm2 with float32 weight
    and bias), after cross-attention (no gate, float32 scale and shift), after the FFN into the next
    norm1 (all three float32). x, y and the gate keep x_new a paired grid."""
    B, S = 2, 32
    x = paired_grid((B, S, D), dtype, 1)
    y = paired_grid((B, S, D), dtype, 2, step=1 / 8)
    w32, b32 = affine_params(D, "float32", dtype, 5)
    ours = lambda w=None, b=None: (lambda h: kernel.layernorm(h, w, b, EPS))  # noqa: E731
    gate_t, gate_f = power_of_two_gate((B, D), dtype, 3), power_of_two_gate((B, 1, D), F32, 4)
    s_t, sh_t = mod("[B,D]", B, S, D, dtype, 6), mod("[B,D]", B, S, D, dtype, 7)
    s_f, sh_f = mod("[B,1,D]", B, S, D, F32, 8), mod("[B,1,D]", B, S, D, F32, 9)

    out, x_new = kernel.gated_residual_layernorm(x, y, gate_t, EPS, scale=s_t, shift=sh_t)
    assert torch.equal(x_new, lref.flux_gated_residual(x, y, gate_t))
    assert torch.equal(out, lref.flux_modulated_norm(ours(), x_new, s_t, sh_t))

    out, x_new = kernel.gated_residual_layernorm(x, y, gate_f, EPS, weight=w32, bias=b32)
    assert torch.equal(x_new, fref.wan_gated_residual(x, y, gate_f))
    assert torch.equal(out, lref.wan_norm2(ours(w32, b32), x_new))

    out, x_new = kernel.gated_residual_layernorm(x, y, None, EPS, scale=s_f, shift=sh_f)
    assert torch.equal(x_new, x + y)
    assert torch.equal(out, lref.wan_modulated_norm(ours(), x_new, s_f, sh_f))

    out, x_new = kernel.gated_residual_layernorm(x, y, gate_f, EPS, scale=s_f, shift=sh_f)
    assert torch.equal(out, lref.wan_modulated_norm(ours(), fref.wan_gated_residual(x, y, gate_f), s_f, sh_f))


# --- exact mode against the diffusers modules themselves --------------------------------------

@pytest.fixture(scope="module")
def diffusers_models():
    return pytest.importorskip("diffusers.models.normalization"), pytest.importorskip(
        "diffusers.models.transformers.transformer_wan"), pytest.importorskip(
        "diffusers.models.transformers.transformer_flux")


@torch.no_grad()
@pytest.mark.parametrize("dtype", HALF)
def test_flux_ada_layer_norms_with_our_norm_inside_equal_adaln_layernorm(kernel, diffusers_models, dtype):
    """AdaLayerNormZero (Flux / HunyuanVideo norm1) and AdaLayerNormContinuous (norm_out), run as
    diffusers wrote them with our layernorm as their `norm`: adaln_layernorm on the chunks of their
    own projection gives their output bit for bit (the chunks are strided views, as in the model)."""
    normalization, _, _ = diffusers_models
    B, S, D = 2, 64, 3072
    x, emb = paired_grid((B, S, D), dtype, 1), rand((B, D), dtype, 2)
    zero = normalization.AdaLayerNormZero(D).to(DEV, dtype)
    zero.norm = OurLayerNorm(kernel, eps=1e-6)
    got, *_ = zero(x, emb=emb)
    shift_msa, scale_msa, *_ = zero.linear(zero.silu(emb)).chunk(6, dim=1)
    assert torch.equal(kernel.adaln_layernorm(x, scale_msa, shift_msa, 1e-6), got)
    cont = normalization.AdaLayerNormContinuous(D, D, elementwise_affine=False, eps=1e-6).to(DEV, dtype)
    cont.norm = OurLayerNorm(kernel, eps=1e-6)
    scale, shift = cont.linear(cont.silu(emb).to(dtype)).chunk(2, dim=1)
    assert torch.equal(kernel.adaln_layernorm(x, scale, shift, 1e-6), cont(x, emb))


@torch.no_grad()
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("per_token", [False, True], ids=["wan2.1", "wan2.2_ti2v"])
def test_wan_block_with_our_norms_inside_equals_our_fused_ops(kernel, diffusers_models, dtype, per_token):
    """diffusers' WanTransformerBlock.forward with its three FP32LayerNorms replaced by our layernorm
    and its attentions and FFN by stubs that record their inputs and return fixed outputs: every
    norm input the block computes is what our fused ops give, bit for bit, and so is the block's
    output (fused_norm's gated_residual). temb [B, 6, D] (Wan 2.1) or [B, S, 6, D] (Wan 2.2 TI2V)."""
    _, wan, _ = diffusers_models
    B, S, D = 2, 40, 1536
    block = wan.WanTransformerBlock(D, 2 * D, 12, cross_attn_norm=True, eps=EPS).to(DEV)  # parameters float32
    with torch.no_grad():
        block.scale_shift_table.zero_()
        block.norm2.weight.copy_(rand((D,), F32, 5, 0.2, 1.0))
        block.norm2.bias.copy_(rand((D,), F32, 6, 0.3))
    lead = (B, S) if per_token else (B,)
    temb = rand((*lead, 6, D), F32, 7, 0.5)
    temb[..., 2, :] = power_of_two_gate((*lead, D), F32, 8)  # gate_msa keeps the residual a paired grid
    h0 = paired_grid((B, S, D), dtype, 9)
    y1, y2 = paired_grid((B, S, D), dtype, 10, step=1 / 8), paired_grid((B, S, D), dtype, 11, step=1 / 32,
                                                                      limit=0.5)
    y3 = rand((B, S, D), dtype, 12)
    block.norm1, block.norm3 = OurLayerNorm(kernel), OurLayerNorm(kernel)
    block.norm2 = OurLayerNorm(kernel, block.norm2.weight, block.norm2.bias)
    block.attn1, block.attn2, block.ffn = Stub(y1), Stub(y2), Stub(y3)
    final = block(h0, rand((B, 7, D), dtype, 13), temb, None)

    # The block's own split of temb (transformer_wan.py): [B, 1, D] chunks, or [B, S, D] per token.
    if per_token:
        parts = [m.squeeze(2) for m in (block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)]
    else:
        parts = (block.scale_shift_table + temb.float()).chunk(6, dim=1)
    shift_msa, scale_msa, gate_msa, c_shift, c_scale, c_gate = parts
    assert torch.equal(kernel.adaln_layernorm(h0, scale_msa, shift_msa, EPS), block.attn1.seen[0])
    out2, h1 = kernel.gated_residual_layernorm(h0, y1, gate_msa, EPS, weight=block.norm2.weight,
                                               bias=block.norm2.bias)
    assert torch.equal(h1.float(), block.norm2.seen[0]) and torch.equal(out2, block.attn2.seen[0])
    out3, h2 = kernel.gated_residual_layernorm(h1, y2, None, EPS, scale=c_scale, shift=c_shift)
    assert torch.equal(h2.float(), block.norm3.seen[0]) and torch.equal(out3, block.ffn.seen[0])
    assert torch.equal(kernel.gated_residual(h2, y3, c_gate), final)


@torch.no_grad()
@pytest.mark.parametrize("dtype", HALF)
def test_flux_block_with_our_norms_inside_equals_our_fused_ops(kernel, diffusers_models, dtype):
    """diffusers' FluxTransformerBlock.forward with our layernorm as its norms and stubbed attention
    and feed-forwards: norm1's output is adaln_layernorm's, the feed-forward's input and the new
    residual are gated_residual_layernorm's, bit for bit. norm1's projection is set to a constant
    (zero weight) whose gate chunk is a power of two, so that the residual stays a paired grid."""
    _, _, flux = diffusers_models
    B, S, D = 2, 64, 3072
    block = flux.FluxTransformerBlock(D, 24, 128).to(DEV, dtype)
    modulation = rand((6, D), F32, 1, 0.5)
    modulation[2] = power_of_two_gate((D,), F32, 2)  # gate_msa
    with torch.no_grad():
        block.norm1.linear.weight.zero_()
        block.norm1.linear.bias.copy_(modulation.reshape(-1).to(dtype))
    h0, y = paired_grid((B, S, D), dtype, 3), paired_grid((B, S, D), dtype, 4, step=1 / 8)
    text = rand((B, 8, D), dtype, 5)
    block.norm1.norm, block.norm1_context.norm, block.norm2 = OurLayerNorm(kernel), OurLayerNorm(kernel), \
        OurLayerNorm(kernel)
    block.attn = Stub((y, torch.zeros_like(text)))
    block.ff, block.ff_context = Stub(torch.zeros_like(h0)), Stub(torch.zeros_like(text))
    _, final = block(h0, text, rand((B, D), dtype, 6))

    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, _ = block.norm1.linear(
        block.norm1.silu(rand((B, D), dtype, 6))).chunk(6, dim=1)
    assert torch.equal(kernel.adaln_layernorm(h0, scale_msa, shift_msa, 1e-6), block.attn.seen[0])
    out, x_new = kernel.gated_residual_layernorm(h0, y, gate_msa, 1e-6, scale=scale_mlp, shift=shift_mlp)
    assert torch.equal(out, block.ff.seen[0])
    assert torch.equal(x_new, final)  # the block adds gate_mlp * 0 to it


# --- against torch's own LayerNorm on random rows -------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [None, "same", "float32"])
def test_layernorm_is_torch_layer_norm_up_to_summation_order(kernel, dtype, affine):
    """nn.LayerNorm on x (affine of x's dtype: HunyuanVideo's refiner) and FP32LayerNorm(x) (float32
    parameters: Wan's norm2), on random rows at the models' widths."""
    for i, (B, S, D) in enumerate([(2, 1024, 1536), (1, 1024, 3072), (1, 512, 5120)]):
        x = rand((B, S, D), dtype, i, 2, 0.3)
        w, b = affine_params(D, affine, dtype, 10 + i)
        theirs = lref.fp32_layer_norm(EPS, w, b)(x) if affine == "float32" else lref.torch_layer_norm(EPS, w, b)(x)
        ours = kernel.layernorm(x, w, b, EPS)
        # float32 output: any element may differ, by the float32 error of the statistics
        mostly_bitwise(ours, theirs, ln_magnitude(x, w, b), {BF16: 1e-2, F16: 5e-2, F32: 1.0}[dtype],
                       ulps=64 if dtype == F32 else 1)


@pytest.mark.parametrize("dtype", HALF)
def test_adaln_on_random_rows_is_the_eager_chains_up_to_summation_order(kernel, dtype):
    B, S, D = 2, 2048, 3072
    x = rand((B, S, D), dtype, 1, 2, 0.3)
    s_t, sh_t = mod("[B,D]", B, S, D, dtype, 2), mod("[B,D]", B, S, D, dtype, 3)
    s_f, sh_f = mod("[B,1,D]", B, S, D, F32, 4), mod("[B,1,D]", B, S, D, F32, 5)
    n_mag = ln_magnitude(x)
    flux = lref.flux_modulated_norm(lref.torch_layer_norm(EPS), x, s_t, sh_t)
    # the normalised value moves by an ulp on a few elements; the chain's roundings then by up to two
    mostly_bitwise(kernel.adaln_layernorm(x, s_t, sh_t, EPS), flux, modulated_magnitude(x, n_mag, s_t, sh_t),
                   {BF16: 2e-2, F16: 1e-1}[dtype], ulps=2)
    wan = lref.wan_modulated_norm(lref.torch_layer_norm(EPS), x, s_f, sh_f)
    mostly_bitwise(kernel.adaln_layernorm(x, s_f, sh_f, EPS), wan, modulated_magnitude(x, n_mag, s_f, sh_f),
                   {BF16: 1e-2, F16: 5e-2}[dtype])


# --- paths, row widths, layouts ---------------------------------------------------------------

def test_aligned_inputs_take_the_vectorized_path_and_others_the_fallback(dev_kernel):
    probe = dev_kernel.ops.layernorm_path
    x = rand((2, 8, 1536), BF16, 1)
    out, s, w32 = torch.empty_like(x), rand((2, 1, 1536), F32, 2), rand((1536,), F32, 3)
    assert probe(out, x, None, None, None) == VECTORIZED
    assert probe(out, x, x, s, w32) == VECTORIZED
    odd = rand((2, 8, 1530), BF16, 4)
    assert probe(torch.empty_like(odd), odd, None, None, None) == FALLBACK
    wide = rand((1, 2, 24576), BF16, 5)
    assert probe(torch.empty_like(wide), wide, None, None, None) == FALLBACK
    shifted = torch.empty(x.numel() + 1, dtype=BF16, device=DEV)[1:].view(x.shape)
    assert probe(out, shifted, None, None, None) == FALLBACK
    s_shifted = torch.empty(2 * 1536 + 1, dtype=F32, device=DEV)[1:].view(2, 1, 1536)
    assert probe(out, x, None, s_shifted, None) == FALLBACK
    w_shifted = torch.empty(1537, dtype=F32, device=DEV)[1:]
    assert probe(out, x, None, None, w_shifted) == FALLBACK


@pytest.mark.parametrize("op", ["layernorm", "adaln_layernorm", "gated_residual_layernorm"])
def test_wan_14b_rows_take_rows_of_160_threads_on_the_h200_only(kernel, op):
    """Rows of 5120 in bf16 (640 words: Wan 14B) take rows of 160 threads of four words on the H200
    (layernorm_config::takes_wide_row), except the seam; 320 of two elsewhere."""
    x, y = rand((1, 64, 5120), BF16, 1), rand((1, 64, 5120), BF16, 2)
    s, sh = rand((1, 1, 5120), F32, 3), rand((1, 1, 5120), F32, 4)
    w, b = affine_params(5120, "float32", BF16, 5)
    call = {"layernorm": lambda: kernel.layernorm(x, w, b, EPS),
            "adaln_layernorm": lambda: kernel.adaln_layernorm(x, s, sh, EPS),
            "gated_residual_layernorm": lambda: kernel.gated_residual_layernorm(x, y, s, EPS, scale=s, shift=sh)}[op]
    rows = [n for n in launched_kernels(call) if "layernorm_rows" in n]
    wide = "H200" in torch.cuda.get_device_name() and op != "gated_residual_layernorm"
    assert len(rows) == 1 and ("160,4>(" if wide else "320,2>(") in rows[0].replace(" ", ""), rows


@pytest.mark.parametrize("D", [1536, 3072, 5120, 1000, 8192])
def test_every_row_width_and_grid_gives_the_same_result(dev_kernel, tuning, D):
    """Each compiled row width (layernorm.threads_per_row) that fits the row, and each grid plan
    (layernorm.grid_plan), on rows whose statistics do not depend on the summation order: the same
    bits for all three ops in both modes."""
    from ltx_dev.tuning import override

    kernel = dev_kernel
    B, S = 3, 257
    x, y = paired_grid((B, S, D), BF16, 1), paired_grid((B, S, D), BF16, 2, step=1 / 8)
    gate = power_of_two_gate((B, 1, D), BF16, 3)
    s, sh = rand((B, D), BF16, 4, 0.5), rand((B, 1, D), BF16, 5)
    s32 = rand((B, S, D), F32, 6, 0.5)
    w, b = affine_params(D, "float32", BF16, 7)
    calls = {
        "layernorm": lambda: (kernel.layernorm(x, w, b, EPS),),
        "adaln exact": lambda: (kernel.adaln_layernorm(x, s, sh, EPS),),
        "adaln fast": lambda: (kernel.adaln_layernorm(x, s, sh, EPS, exact_mode=False),),
        "adaln float32": lambda: (kernel.adaln_layernorm(x, s32, None, EPS, weight=w),),
        "seam exact": lambda: kernel.gated_residual_layernorm(x, y, gate, EPS, scale=s, shift=sh),
        "seam fast": lambda: kernel.gated_residual_layernorm(x, y, gate, EPS, scale=s, shift=sh, exact_mode=False),
        "seam norm2": lambda: kernel.gated_residual_layernorm(x, y, gate.float(), EPS, weight=w, bias=b),
    }
    expected = {name: call() for name, call in calls.items()}
    nvec = D // 8
    settings = [{"layernorm.threads_per_row": t} for t in WIDTHS
                if nvec <= t * (4 if t == 512 else 2)] + [{"layernorm.grid_plan": p} for p in range(7)]
    assert len(settings) > 7
    for knobs in settings:
        with override(kernel, knobs):
            for name, call in calls.items():
                for got, want in zip(call(), expected[name]):
                    assert not torch.isnan(got).any()
                    assert torch.equal(got, want), (name, knobs)


@pytest.mark.parametrize("exact", [True, False])
def test_misaligned_and_strided_operands_give_the_same_result(kernel, exact):
    B, S, D = 2, 50, 3072
    x, y = paired_grid((B, S, D), BF16, 1), paired_grid((B, S, D), BF16, 2, step=1 / 8)
    gate = power_of_two_gate((B, 1, D), BF16, 3)
    scale, shift = rand((B, 1, D), BF16, 4, 0.5), rand((B, 1, D), BF16, 5)
    w, b = affine_params(D, "float32", BF16, 6)
    expected = kernel.gated_residual_layernorm(x, y, gate, EPS, scale=scale, shift=shift, weight=w, bias=b,
                                               exact_mode=exact)

    def misaligned(t):  # the scalar path (its sums in another order: the paired grid makes that exact)
        buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=DEV)[1:].view(t.shape)
        return buf.copy_(t)

    def in_bigger(t):  # a [:, :S] slice of a longer sequence: batch stride != S * D
        big = torch.zeros(t.shape[0], t.shape[1] + 7, *t.shape[2:], dtype=t.dtype, device=DEV)
        big[:, : t.shape[1]] = t
        return big[:, : t.shape[1]]

    def last_dim_strided(t):  # copied once by the binding
        big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=DEV)
        big[..., ::2] = t
        return big[..., ::2]

    for f in (misaligned, in_bigger, last_dim_strided):
        got = kernel.gated_residual_layernorm(f(x), f(y), f(gate), EPS, scale=f(scale), shift=f(shift),
                                              weight=f(w) if f is not in_bigger else w, bias=b, exact_mode=exact)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), f.__name__
    # An expanded per-token modulation (stride 0 over seq) is a broadcast, not a copy.
    out = kernel.adaln_layernorm(x, scale.expand(B, S, D), shift.expand(B, S, D), EPS, exact_mode=exact)
    assert torch.equal(out, kernel.adaln_layernorm(x, scale, shift, EPS, exact_mode=exact))


@pytest.mark.parametrize("D", [3072, 1536, 5120])
def test_rows_spread_over_many_passes_equal_each_sample_alone(kernel, D):
    """Each block walks many rows of several samples (persistent grid; an odd S puts row groups across
    a sample boundary): nothing carried from one row to the next (next-row loads, the alternating
    reduction buffers) may leak into another row."""
    B, S = 3, 4097
    x, y = rand((B, S, D), BF16, 1, 2), rand((B, S, D), BF16, 2, 2)
    gate, scale, shift = rand((B, 1, D), BF16, 3), rand((B, D), BF16, 4, 0.5), rand((B, 1, D), BF16, 5)
    g32, s32 = rand((B, 1, D), F32, 6), rand((B, S, D), F32, 7, 0.5)
    w, b = affine_params(D, "float32", BF16, 8)
    ops = {
        "layernorm": lambda i: kernel.layernorm(x[i], w, b, EPS),
        "adaln": lambda i: kernel.adaln_layernorm(x[i], scale[i], shift[i], EPS),
        "adaln fast": lambda i: kernel.adaln_layernorm(x[i], scale[i], shift[i], EPS, exact_mode=False),
        "adaln per token": lambda i: kernel.adaln_layernorm(x[i], s32[i], None, EPS),
        "seam": lambda i: kernel.gated_residual_layernorm(x[i], y[i], gate[i], EPS, scale=scale[i], shift=shift[i]),
        "seam norm2": lambda i: kernel.gated_residual_layernorm(x[i], y[i], g32[i], EPS, weight=w, bias=b),
    }
    for name, op in ops.items():
        whole = op(slice(None))
        for i in range(B):
            alone = op(slice(i, i + 1))
            for got, want in zip(whole if isinstance(whole, tuple) else (whole,),
                                 alone if isinstance(alone, tuple) else (alone,)):
                assert torch.equal(got[i], want[0]), (name, i)


def test_zero_size_inputs_are_a_no_op(kernel):
    for shape in ((0, 1536), (2, 0, 1536), (2, 5, 0)):
        x = torch.empty(shape, dtype=BF16, device=DEV)
        s = torch.empty(shape[0], shape[-1], dtype=BF16, device=DEV)
        assert kernel.layernorm(x).shape == shape
        assert kernel.adaln_layernorm(x, s, s, EPS).shape == shape
        assert kernel.gated_residual_layernorm(x, x, s, EPS, scale=s, shift=s)[1].shape == shape
    torch.cuda.synchronize()


# --- bad input ------------------------------------------------------------------------------

BAD_CALLS = {
    "x on the CPU": (lambda k, x, s: k.layernorm(x.cpu()), RuntimeError,
                     "ltx_kernels.layernorm: `x` must be a CUDA tensor"),
    "scale on the CPU": (lambda k, x, s: k.adaln_layernorm(x, s.cpu(), s, EPS), RuntimeError,
                         "ltx_kernels.adaln_layernorm: `scale` is on cpu"),
    "y of another dtype": (lambda k, x, s: k.gated_residual_layernorm(x, x.half(), s, EPS), TypeError,
                           "ltx_kernels.gated_residual_layernorm: `y` has dtype Half"),
    "scale that does not broadcast": (lambda k, x, s: k.adaln_layernorm(x, s.expand(2, 3, 256).contiguous(), None,
                                                                        EPS), RuntimeError, "does not broadcast"),
    "a 4-D x": (lambda k, x, s: k.adaln_layernorm(x[None], s, s, EPS), RuntimeError, "reshape it first"),
    "a float64 weight": (lambda k, x, s: k.layernorm(x, torch.ones(256, device=DEV, dtype=torch.float64)),
                         TypeError, "`weight` has dtype Double"),
    "a bias of the other half dtype": (lambda k, x, s: k.layernorm(x, None, torch.ones(256, device=DEV, dtype=F16)),
                                       TypeError, "`bias` must have the dtype of `x` or torch.float32"),
    "a wrong weight shape": (lambda k, x, s: k.layernorm(x, torch.ones(255, device=DEV, dtype=BF16)), RuntimeError,
                             "`weight` has shape [255] but must be [256]"),
    "mixed modulation dtypes": (lambda k, x, s: k.adaln_layernorm(x, s, s.float(), EPS), TypeError,
                                "must share one dtype"),
    "negative eps": (lambda k, x, s: k.layernorm(x, None, None, -1.0), RuntimeError, "`eps` must be >= 0"),
    "an unsupported dtype": (lambda k, x, s: k.adaln_layernorm(x.double(), s, s, EPS), TypeError, "supported dtypes"),
    "shift without scale": (lambda k, x, s: k.gated_residual_layernorm(x, x, None, EPS, shift=s), RuntimeError,
                            "`shift` was given without `scale`"),
    "a 0-d x": (lambda k, x, s: k.layernorm(x[0, 0, 0]), RuntimeError, "at least one dimension"),
    "an overlapping out": (lambda k, x, s: k.ops.layernorm(x[:, :1].expand_as(x), x, None, None, EPS),
                           RuntimeError, "internal overlap"),
    "out as x_out": (lambda k, x, s: (lambda o: k.ops.gated_residual_layernorm(o, o, x, x, None, None, None, None,
                                                                               None, EPS, True))(torch.empty_like(x)),
                     RuntimeError, "`out` and `x_out` must be different tensors"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_raises_a_named_error_and_the_next_call_is_right(kernel, case):
    call, exc, message = BAD_CALLS[case]
    x, s = rand((2, 8, 256), BF16, 1), rand((2, 1, 256), BF16, 2)
    with pytest.raises(exc, match=re.escape(message)):
        call(kernel, x, s)
    torch.cuda.synchronize()
    close_to(kernel.layernorm(x), lref.layer_norm_f64(x), BF16, ln_magnitude(x))


# --- compile, opcheck, graphs, streams ------------------------------------------------------------

def _api_calls(k):
    B, S, D = 2, 16, 256
    x, y = rand((B, S, D), BF16, 1), rand((B, S, D), BF16, 2)
    g, s, sh = (rand((B, 1, D), BF16, 3 + i) for i in range(3))
    return {
        "layernorm": lambda x, y, g, s, sh: k.layernorm(x, None, None, EPS),
        "adaln_layernorm": lambda x, y, g, s, sh: k.adaln_layernorm(x, s, sh, EPS),
        "adaln_layernorm float32": lambda x, y, g, s, sh: k.adaln_layernorm(x, s.float(), sh.float(), EPS),
        "gated_residual_layernorm": lambda x, y, g, s, sh: k.gated_residual_layernorm(x, y, g, EPS, scale=s, shift=sh),
    }, (x, y, g, s, sh)


@pytest.mark.parametrize("name", ["layernorm", "adaln_layernorm", "adaln_layernorm float32",
                                  "gated_residual_layernorm"])
def test_torch_compile_fullgraph_and_cuda_graph_replay_match_eager(kernel, name):
    calls, args = _api_calls(kernel)
    compiled_and_graph_replay_match_eager(calls[name], args)


def test_opcheck_every_layernorm_op(kernel):
    B, S, D = 2, 8, 256
    x, y = rand((B, S, D), BF16, 1), rand((B, S, D), BF16, 2)
    g, s, sh = (rand((B, 1, D), BF16, 3 + i) for i in range(3))
    w, b = affine_params(D, "float32", BF16, 9)
    e = torch.empty_like
    o = kernel.ops
    cases = [
        (o.layernorm, (e(x), x, w, b, EPS)),
        (o.layernorm, (e(x), x, None, None, EPS)),
        (o.adaln_layernorm, (e(x), x, s, sh, None, None, EPS, True)),
        (o.adaln_layernorm, (e(x), x, s.float(), None, w, None, EPS, False)),
        (o.gated_residual_layernorm, (e(x), e(x), x, y, g, s, sh, None, None, EPS, True)),
        (o.gated_residual_layernorm, (e(x), e(x), x, y, g.float(), None, None, w, b, EPS, True)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


def test_ops_on_a_side_stream_are_ordered_by_its_events_alone(kernel):
    """Inputs written on a producer stream after a long sleep, read by our ops on that stream, the
    results read on a consumer after an event: right only if the ops ran on the current stream."""
    B, S, D = 2, 1024, 3072
    x, y = rand((B, S, D), BF16, 1), rand((B, S, D), BF16, 2)
    g, s = rand((B, D), BF16, 3), rand((B, D), BF16, 4, 0.5)
    expected = (kernel.layernorm(x), kernel.adaln_layernorm(x, s, g, EPS),
                *kernel.gated_residual_layernorm(x, y, g, EPS, scale=s, shift=g))
    xs, ys = torch.zeros_like(x), torch.zeros_like(y)
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    producer.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(producer):
        torch.cuda._sleep(50_000_000)
        xs.copy_(x)
        ys.copy_(y)
        outs = (kernel.layernorm(xs), kernel.adaln_layernorm(xs, s, g, EPS),
                *kernel.gated_residual_layernorm(xs, ys, g, EPS, scale=s, shift=g))
        done = torch.cuda.Event()
        done.record()
    consumer.wait_event(done)
    with torch.cuda.stream(consumer):
        got = [o.clone() for o in outs]
    torch.cuda.synchronize()
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_back_to_back_ops_see_each_others_output_with_and_without_dependent_launch(kernel, launch_mode):
    """A Wan-like chain (norm1, seam into norm2, seam into norm3, the next block's norm1), each op
    reading what the one before wrote, eagerly and in a CUDA graph: equal to the same chain run one
    synchronised op at a time."""
    B, S, D = 2, 8190, 1536
    x, y = rand((B, S, D), BF16, 1, 2), rand((B, S, D), BF16, 2, 2)
    g32, s32, sh32 = rand((B, 1, D), F32, 3), rand((B, 1, D), F32, 4, 0.5), rand((B, 1, D), F32, 5)
    w, b = affine_params(D, "float32", BF16, 6)

    steps = [lambda h, n: (kernel.adaln_layernorm(h, s32, sh32, EPS), h),
             lambda h, n: kernel.gated_residual_layernorm(h, n, g32, EPS, weight=w, bias=b),
             lambda h, n: kernel.gated_residual_layernorm(h, n, None, EPS, scale=s32, shift=sh32),
             lambda h, n: (kernel.layernorm(n, w, b, EPS), h)]
    assert_chain_sees_each_output(residual_chain(steps, x, y))


# --- fuzz --------------------------------------------------------------------------------------

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # the fuzz needs hypothesis; the rest of the file does not
    given = None

if given is not None:
    WIDTH = st.one_of(st.sampled_from([1536, 3072, 5120, 2048, 4096]), st.integers(1, 600),
                      st.builds(lambda k, o: 8 * k + o, st.integers(1, 300), st.sampled_from([0, 1, 4])))

    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def test_fuzz_the_seam_against_float64_and_its_residual_against_eager(kernel, data):
        """Random widths around 16-byte words and the models' widths, every dtype, operand set and
        modulation form, both modes: out within tolerance of float64, x_new the eager residual bit
        for bit where the mode promises it."""
        dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
        D = data.draw(WIDTH, label="D")
        B, S = data.draw(st.integers(1, 3), label="B"), data.draw(st.integers(1, 40), label="S")
        mdt = data.draw(st.sampled_from([dtype, F32]), label="modulation dtype")
        forms = st.sampled_from(FORMS)
        gate = mod(data.draw(forms), B, S, D, mdt, 1) if data.draw(st.booleans(), label="gate") else None
        scale = mod(data.draw(forms), B, S, D, mdt, 2) if data.draw(st.booleans(), label="scale") else None
        with_shift = scale is not None and data.draw(st.booleans(), label="shift")
        shift = mod(data.draw(forms), B, S, D, mdt, 3) if with_shift else None
        w, b = affine_params(D, data.draw(st.sampled_from([None, "same", "float32"]), label="affine"), dtype, 4)
        exact = data.draw(st.booleans(), label="exact")
        x, y = rand((B, S, D), dtype, 5, 2, 0.3), rand((B, S, D), dtype, 6)
        out, x_new = poisoned(x), poisoned(x)
        kernel.ops.gated_residual_layernorm(out, x_new, x, y, gate, scale, shift, w, b, EPS, exact)
        if gate is None:
            assert torch.equal(x_new, x + y)
        elif mdt == F32:  # float32 gate: one kernel for both modes
            assert torch.equal(x_new, fref.wan_gated_residual(x, y, gate))
        elif exact:
            assert torch.equal(x_new, lref.flux_gated_residual(x, y, gate))
        n_mag = ln_magnitude(x_new, w, b)
        if scale is None:
            close_to(out, lref.layer_norm_f64(x_new, w, b, EPS), dtype, n_mag)
        else:
            # exact mode rounds four times (n, 1 + scale, the product, + shift): up to 2 ulps and the norm's own
            # error (fp16, D 1928, [D] scale: 2.09 ulps); fast mode rounds once
            close_to(out, lref.adaln_layer_norm_f64(x_new, scale, shift, EPS, w, b), dtype,
                     modulated_magnitude(x_new, n_mag, scale, shift), factor=3 if exact else 2)


# --- backward (issue 36) ------------------------------------------------------------------------------
# Every op's grads for each of its tensor arguments, against autograd through the float64 formulas
# (ltx_dev.reference.layernorm) and through the models' own eager code. Modulation forms: the four the
# forward takes and [1,S,D] (per token, shared over the batch: its grad is summed over the batch).
# Widths: 1536 and 3072 take the vectorized backward (96 and 192 threads of 2 words in bf16), 8 float32
# two words, 130 (not whole words) and 10240 (past 4 words per thread) the scalar one.
BWD_FORMS = FORMS + ["[1,S,D]"]
BWD_OPS = ["layernorm", "adaln_layernorm", "gated_residual_layernorm"]
# Relative L2 bound of our grads against float64: one rounding of the grad's dtype with 2x room, and
# never worse than 1.1x the models' eager autograd (which rounds every intermediate grad).
GRAD_TOL = {BF16: 2 * 2**-8, F16: 2 * 2**-11, F32: 1e-4}


def bwd_mod(form, B, S, D, dtype, seed, scale=0.5):
    if form == "[1,S,D]":
        return rand((1, S, D), dtype, seed, scale)
    return mod(form, B, S, D, dtype, seed, scale)


def bwd_leaves(op, shape, dtype, *, form="[B,D]", mod_dtype=None, affine=None, gate=True, shift=True, seed=0):
    """The op's tensor arguments, each requiring grad (a dict by argument name; absent ones left out)."""
    B, S, D = shape
    mod_dtype = mod_dtype or dtype
    t = {"x": rand(shape, dtype, seed)}
    weight, bias = affine_params(D, affine, dtype, seed + 1)
    if weight is not None:
        t.update(weight=weight, bias=bias)
    if op != "layernorm":
        t["scale"] = bwd_mod(form, B, S, D, mod_dtype, seed + 3)
        if shift:
            t["shift"] = bwd_mod(form, B, S, D, mod_dtype, seed + 4)
    if op == "gated_residual_layernorm":
        t["y"] = rand(shape, dtype, seed + 5)
        if gate:
            t["gate"] = bwd_mod(form, B, S, D, mod_dtype, seed + 6)
    return {k: v.requires_grad_() for k, v in t.items()}


def ours(k, op, t, exact=True):
    """The op on the arguments in `t`, its outputs as a tuple."""
    g = t.get
    if op == "layernorm":
        return (k.layernorm(t["x"], g("weight"), g("bias"), EPS),)
    if op == "adaln_layernorm":
        return (k.adaln_layernorm(t["x"], t["scale"], g("shift"), EPS, weight=g("weight"), bias=g("bias"),
                                  exact_mode=exact),)
    return k.gated_residual_layernorm(t["x"], t["y"], g("gate"), EPS, weight=g("weight"), bias=g("bias"),
                                      scale=g("scale"), shift=g("shift"), exact_mode=exact)


def broadcast(m, x):
    """A modulation tensor as the kernels read it: [B, D] per batch of a 3-D x."""
    return fref.per_batch(m, x)


def formula64(op, t):
    """The op's outputs from the float64 formulas (autograd records through them)."""
    g = t.get
    x = t["x"]
    if op == "gated_residual_layernorm":
        h = x + broadcast(g("gate"), x) * t["y"] if "gate" in t else x + t["y"]
    else:
        h = x
    out = lref.layer_norm_f64(h, g("weight"), g("bias"), EPS)
    if "scale" in t:
        out = out * (1 + broadcast(t["scale"], h))
        if "shift" in t:
            out = out + broadcast(t["shift"], h)
    return (out, h) if op == "gated_residual_layernorm" else (out,)


def eager(op, t):
    """The models' own eager code for the op: Wan's float32 chains for float32 modulation (or a
    float32 affine norm, FP32LayerNorm), Flux's half chain for modulation of x's dtype, torch's
    F.layer_norm for the plain norm of one dtype."""
    g = t.get
    x = t["x"]
    wan = (g("scale") is not None and t["scale"].dtype == F32) or (g("weight") is not None and t["weight"].dtype == F32)
    norm = lref.fp32_layer_norm(EPS, g("weight"), g("bias")) if wan else lref.torch_layer_norm(EPS, g("weight"),
                                                                                              g("bias"))
    if op == "gated_residual_layernorm":
        if "gate" not in t:
            h = x + t["y"]
        else:
            h = fref.wan_gated_residual(x, t["y"], t["gate"]) if wan else lref.flux_gated_residual(x, t["y"], t["gate"])
    else:
        h = x
    if "scale" not in t:
        out = lref.wan_norm2(norm, h) if wan else norm(h)
    elif wan:
        out = lref.wan_modulated_norm(norm, h, t["scale"], g("shift"))
    else:
        out = lref.flux_modulated_norm(norm, h, t["scale"], g("shift"))
    return (out, h) if op == "gated_residual_layernorm" else (out,)


def upstream(outs, seed):
    return [rand(o.shape, o.dtype, seed + i) for i, o in enumerate(outs)]


def grads_of(outs, dys, t):
    """Grads of every tensor of `t` (by name) for upstream grads `dys`."""
    names = list(t)
    return dict(zip(names, torch.autograd.grad(outs, [t[n] for n in names], dys)))


def as64(t):
    return {k: v.detach().double().requires_grad_() for k, v in t.items()}


@pytest.mark.parametrize("op", BWD_OPS)
@pytest.mark.parametrize("form", BWD_FORMS)
@pytest.mark.parametrize("affine", [None, "same"])
@pytest.mark.parametrize("D", [8, 7])  # vectorized, scalar
def test_gradcheck_float32(kernel, op, form, affine, D):
    """Numerical vs our analytical Jacobian on float32 for every input (central differences with eps
    1e-3: float32 rounding of O(1) outputs gives ~1e-4 relative error in a difference quotient, hence
    the tolerances). nondet_tol=0: the backward run twice gives the same bits."""
    if op == "layernorm" and form != "[B,D]":
        pytest.skip("no modulation")
    t = bwd_leaves(op, (2, 3, D), F32, form=form, affine=affine, seed=D)
    names = list(t)

    def fn(*tensors):
        return ours(kernel, op, dict(zip(names, tensors)))

    assert torch.autograd.gradcheck(fn, tuple(t.values()), eps=1e-3, atol=2e-3, rtol=1e-2, nondet_tol=0.0)


@pytest.mark.parametrize("outside", [0, 1])
def test_the_seams_grads_when_one_output_is_outside_the_loss(kernel, outside):
    """Autograd gives the backward None (not zeros) for an unused output; the grads are those of
    the other output alone (zero for what only the unused one reads: out's scale, shift, weight, bias)."""
    op = "gated_residual_layernorm"
    t = bwd_leaves(op, (2, 64, 1536), F32, form="[B,D]", affine="same", seed=11)
    used = [o for i, o in enumerate(ours(kernel, op, t)) if i != outside]
    dys = upstream(used, seed=3)
    got = torch.autograd.grad(used, list(t.values()), dys, allow_unused=True)
    t64 = as64(t)
    used64 = [o for i, o in enumerate(formula64(op, t64)) if i != outside]
    ref = torch.autograd.grad(used64, list(t64.values()), [d.double() for d in dys], allow_unused=True)
    for name, g, r, leaf in zip(t, got, ref, t64.values()):
        r = torch.zeros_like(leaf) if r is None else r
        assert g is not None and torch.isfinite(g).all(), name
        assert (g.abs().max() == 0) if r.abs().max() == 0 else rel_l2(g, r) <= GRAD_TOL[F32], name


@pytest.mark.parametrize("op", BWD_OPS)
@pytest.mark.parametrize("form", BWD_FORMS)
@pytest.mark.parametrize("shape", [(2, 64, 1536), (2, 9, 130), (1, 3, 5000)])
def test_float32_grads_match_float64_autograd(kernel, op, form, shape):
    if op == "layernorm" and form != "[B,D]":
        pytest.skip("no modulation")
    t = bwd_leaves(op, shape, F32, form=form, affine="same", seed=shape[-1])
    outs = ours(kernel, op, t)
    dys = upstream(outs, seed=7)
    got = grads_of(outs, dys, t)
    t64 = as64(t)
    ref = grads_of(formula64(op, t64), [d.double() for d in dys], t64)
    for name in t:
        assert got[name].shape == t[name].shape and got[name].dtype == t[name].dtype, name
        assert rel_l2(got[name], ref[name]) <= GRAD_TOL[F32], name


# (op, x dtype, modulation dtype, form, affine): the models' uses. Flux / HunyuanVideo: AdaLayerNormZero
# (no affine, [B, D] half modulation) and the seam before norm2; Wan: float32 [B, 1, D] or per-token
# [B, S, D] modulation (2.2 TI2V), FP32LayerNorm with float32 affine (norm2, cross_attn_norm); a plain
# nn.LayerNorm of x's dtype, with and without weight and bias (Wan's norm1 and norm3, Flux's).
MODEL_CASES = [
    ("layernorm", BF16, None, "[B,D]", "same"),
    ("layernorm", BF16, None, "[B,D]", "float32"),
    ("layernorm", BF16, None, "[B,D]", None),
    ("adaln_layernorm", BF16, BF16, "[B,D]", None),
    ("adaln_layernorm", F16, F16, "[B,D]", None),
    ("adaln_layernorm", BF16, F32, "[B,1,D]", None),
    ("adaln_layernorm", BF16, F32, "[B,S,D]", None),
    ("gated_residual_layernorm", BF16, BF16, "[B,D]", None),
    ("gated_residual_layernorm", BF16, F32, "[B,1,D]", None),
    ("gated_residual_layernorm", BF16, F32, "[B,1,D]", "float32"),
    ("gated_residual_layernorm", BF16, F32, "[B,S,D]", None),
]


@pytest.mark.parametrize("case", MODEL_CASES, ids=lambda c: "-".join(str(v) for v in c))
# (2, 2688, 256): LTX-Video 2B's rows, split to fill one wave (11 rows a block); (1, 333, 2048): an odd
# row count, so plain layernorm's last two-row block has a row past the end; (2, 8500, 1536): past 8192
# rows a batch, the large problems' split at Wan's width (layernorm_config::bwd_large_blocks).
@pytest.mark.parametrize("shape", [(2, 700, 1536), (1, 257, 3072), (2, 2688, 256), (1, 333, 2048),
                                   (2, 8500, 1536)])
def test_half_grads_are_no_worse_than_the_models_eager_autograd(kernel, case, shape):
    """Both measured against autograd through the float64 formulas: ours within one rounding of the
    grad's dtype, or within 1.1x eager's own error (eager rounds every intermediate grad)."""
    op, dtype, mod_dtype, form, affine = case
    t = bwd_leaves(op, shape, dtype, form=form, mod_dtype=mod_dtype, affine=affine, seed=shape[-1] + len(op))
    outs, theirs = ours(kernel, op, t), eager(op, t)
    assert [o.dtype for o in outs] == [o.dtype for o in theirs]
    dys = upstream(outs, seed=11)
    got, ref_eager = grads_of(outs, dys, t), grads_of(theirs, dys, t)
    t64 = as64(t)
    ref = grads_of(formula64(op, t64), [d.double() for d in dys], t64)
    for name in t:
        g, e = got[name], ref_eager[name]
        assert g.dtype == e.dtype and g.shape == e.shape, name
        assert not torch.isnan(g).any(), name
        err, eager_err = rel_l2(g, ref[name]), rel_l2(e, ref[name])
        assert err <= max(GRAD_TOL[g.dtype], 1.1 * eager_err), (name, err, eager_err)


@pytest.mark.parametrize("op", BWD_OPS)
@pytest.mark.parametrize("form", ["[B,D]", "[D]", "[B,S,D]", "[1,S,D]"])
def test_backward_is_bitwise_deterministic(kernel, op, form):
    # past 8192 rows a group with [D] modulation: the large problems' split (layernorm_config::bwd_large_blocks)
    t = bwd_leaves(op, (2, 4500, 1536), BF16, form=form, mod_dtype=F32, affine="float32", seed=3)
    outs = ours(kernel, op, t)
    dys = upstream(outs, seed=4)
    first = grads_of(outs, dys, t)
    for _ in range(2):
        again = grads_of(ours(kernel, op, t), dys, t)
        assert all(torch.equal(first[n], again[n]) for n in t)


@pytest.mark.parametrize("op", BWD_OPS)
@pytest.mark.parametrize("D", [1536, 2048, 3072])
@pytest.mark.parametrize("affine", ["float32", None])
@pytest.mark.parametrize("mod_dtype", [F32, BF16])  # Wan's float32 modulation; LTX-Video's and Flux's bf16, rounded
def test_every_backward_block_width_and_row_split_gives_correct_grads(dev_kernel, op, D, affine, mod_dtype):
    """Each backward block width (layernorm.bwd_threads), row split (layernorm.bwd_min_rows,
    layernorm.bwd_max_blocks), ring depth (layernorm.bwd_stages; 1: registers) and, for plain layernorm
    with weight and bias and adaln_layernorm without, the ring in place of the one-word kernel
    (layernorm.bwd_words=0): grads within one rounding of the float64 backward. A width or kernel changes
    no bit of the per-thread column sums (weight, bias, scale, shift), a split none of the row grads (x, y):
    neither is in the other's order of summation; the ring's depth changes no bit at all (nor do registers
    in its place)."""
    from ltx_dev.tuning import override

    if op == "layernorm" and mod_dtype != F32:
        pytest.skip("no modulation")
    kernel = dev_kernel
    shape = (2, 200, D)
    t = bwd_leaves(op, shape, BF16, form="[B,1,D]", mod_dtype=mod_dtype, affine=affine, seed=21)
    dys = upstream(ours(kernel, op, t), seed=22)
    base = grads_of(ours(kernel, op, t), dys, t)
    t64 = as64(t)
    ref = grads_of(formula64(op, t64), [d.double() for d in dys], t64)
    column_sums = [n for n in ("weight", "bias", "scale", "shift") if n in t]
    row_grads = [n for n in ("x", "y") if n in t]
    settings = [({"layernorm.bwd_threads": w}, column_sums) for w in (96, 128, 192, 256) if D // 8 <= 4 * w]
    settings += [({"layernorm.bwd_min_rows": 1, "layernorm.bwd_max_blocks": 4096}, row_grads),
                 ({"layernorm.bwd_min_rows": 3, "layernorm.bwd_max_blocks": 7}, row_grads)]
    settings += [({"layernorm.bwd_words": 0}, column_sums)]
    assert len(settings) >= 7
    ring = {"layernorm.bwd_words": 0}  # the ops the one-word kernel serves take the ring only so
    with override(kernel, ring):
        ring_base = grads_of(ours(kernel, op, t), dys, t)
    settings += [({**ring, "layernorm.bwd_stages": s}, list(t), ring_base) for s in (1, 2, 3, 4)]
    for knobs, same_bits, *against in settings:
        with override(kernel, knobs):
            got = grads_of(ours(kernel, op, t), dys, t)
        for name in t:
            assert rel_l2(got[name], ref[name]) <= GRAD_TOL[BF16], (knobs, name)
        for name in same_bits:
            assert torch.equal(got[name], (against or [base])[0][name]), (knobs, name)


@pytest.mark.parametrize("op", BWD_OPS)
@pytest.mark.parametrize("form", BWD_FORMS)
@pytest.mark.parametrize("shape", [(3, 17, 1536), (2, 9, 130), (1, 2, 10240), (5, 1, 64)])
def test_every_grad_element_is_written(kernel, op, form, shape):
    if op == "layernorm" and form != "[B,D]":
        pytest.skip("no modulation")
    with nan_filled_allocations():  # the binding's grads and workspaces too
        t = bwd_leaves(op, shape, BF16, form=form, affine="same", seed=5)
        outs = ours(kernel, op, t)
        for name, g in grads_of(outs, [torch.ones_like(o) for o in outs], t).items():
            assert not torch.isnan(g).any(), name


def test_two_dimensional_x_takes_per_row_and_shared_modulation(kernel):
    """[R, D] x: a [R, D] / [R, 1, D] modulation is per row, a [D] one summed over every row."""
    R, D = 37, 256
    x, y = rand((R, D), BF16, 1).requires_grad_(), rand((R, D), BF16, 2).requires_grad_()
    gate, scale = rand((R, 1, D), F32, 3).requires_grad_(), rand((R, D), F32, 4).requires_grad_()
    shift = rand((D,), F32, 5).requires_grad_()
    t = {"x": x, "y": y, "gate": gate, "scale": scale, "shift": shift}
    outs = ours(kernel, "gated_residual_layernorm", t)
    dys = upstream(outs, seed=6)
    got = grads_of(outs, dys, t)
    t64 = as64(t)
    x64 = t64["x"]
    h = x64 + t64["gate"][:, 0] * t64["y"]
    out = lref.layer_norm_f64(h, None, None, EPS) * (1 + t64["scale"]) + t64["shift"]
    ref = grads_of((out, h), [d.double() for d in dys], t64)
    for name in t:  # within bf16's rounding: x_new is rounded to bf16 before it is normalised
        assert got[name].shape == t[name].shape
        assert rel_l2(got[name], ref[name]) <= GRAD_TOL[BF16], name


def test_an_expanded_modulation_leaf_gets_a_grad_per_index(kernel):
    """A [B, S, D] leaf that is an expanded [B, 1, D] (stride 0 over seq) has a grad element per index,
    as autograd expects of any leaf: the same grads as its contiguous copy."""
    B, S, D = 2, 40, 1536
    t = bwd_leaves("gated_residual_layernorm", (B, S, D), BF16, form="[B,1,D]", mod_dtype=F32, seed=15)
    expanded = {k: (v.detach().expand(B, S, D).requires_grad_() if k in ("gate", "scale", "shift") else v)
                for k, v in t.items()}
    copied = {k: v.detach().contiguous().requires_grad_() for k, v in expanded.items()}
    outs = ours(kernel, "gated_residual_layernorm", expanded)
    dys = upstream(outs, seed=16)
    got = grads_of(outs, dys, expanded)
    expected = grads_of(ours(kernel, "gated_residual_layernorm", copied), dys, copied)
    for name in expanded:
        assert got[name].shape == expanded[name].shape and torch.equal(got[name], expected[name]), name


def misaligned_copy(t):
    """t in memory one element past a 16-byte boundary (its rows cannot be read as 16-byte words)."""
    return torch.empty(t.numel() + 1, dtype=t.dtype, device=DEV)[1:].view(t.shape).copy_(t)


def test_misaligned_and_strided_operands_get_correct_grads(kernel):
    """Misaligned x and weight (the scalar paths, forward and backward), a transposed y and upstream
    grad (copied once by the bindings), a [:, :S] slice of a longer sequence: grads within one rounding
    of the float64 backward."""
    B, S, D = 2, 33, 1024
    x = rand((B, S + 5, D), BF16, 1)[:, :S]
    t = {"x": misaligned_copy(x).detach().requires_grad_(),
         "y": rand((B, D, S), BF16, 2).transpose(1, 2).detach().requires_grad_(),
         "gate": rand((B, D), F32, 3).requires_grad_(), "scale": rand((B, D), F32, 4).requires_grad_(),
         "shift": rand((B, 1, D), F32, 5).requires_grad_(),
         "weight": misaligned_copy(rand((D,), BF16, 6, 0.2, 1.0)).requires_grad_(),
         "bias": rand((D,), BF16, 7).requires_grad_()}
    outs = ours(kernel, "gated_residual_layernorm", t)
    dys = [rand((B, D, S), BF16, 8).transpose(1, 2), rand((B, S, D), BF16, 9)]
    got = grads_of(outs, dys, t)
    t64 = as64(t)
    ref = grads_of(formula64("gated_residual_layernorm", t64), [d.double() for d in dys], t64)
    for name in t:
        assert got[name].shape == t[name].shape, name
        assert rel_l2(got[name], ref[name]) <= GRAD_TOL[BF16], name


def test_only_the_grads_asked_for_are_computed_and_they_do_not_change(kernel):
    """Leaving some inputs out of the graph changes no bit of the other grads (the row split depends
    on the shapes alone)."""
    t = bwd_leaves("gated_residual_layernorm", (2, 8, 256), BF16, form="[B,D]", affine="same", seed=9)
    outs = ours(kernel, "gated_residual_layernorm", t)
    full = grads_of(outs, upstream(outs, seed=1), t)
    for wanted in (["x"], ["y"], ["gate"], ["scale", "shift"], ["weight"], ["bias"]):
        args = {k: (v if k in wanted else v.detach()) for k, v in t.items()}
        outs = ours(kernel, "gated_residual_layernorm", args)
        got = grads_of(outs, upstream(outs, seed=1), {k: args[k] for k in wanted})
        for name in wanted:
            assert torch.equal(got[name], full[name]), (wanted, name)


def test_an_unused_output_of_the_seam_still_gives_every_grad(kernel):
    """Only x_new (or only out) reaches the loss: the other output's grad is zero."""
    t = bwd_leaves("gated_residual_layernorm", (2, 8, 256), BF16, form="[B,D]", seed=10)
    out, x_new = ours(kernel, "gated_residual_layernorm", t)
    got = grads_of(x_new, [torch.ones_like(x_new)], {"x": t["x"], "y": t["y"]})
    assert torch.equal(got["x"], torch.ones_like(got["x"]))  # d x_new / d x = 1
    out, _ = ours(kernel, "gated_residual_layernorm", t)
    got = grads_of(out, [rand(out.shape, BF16, 11)], t)
    assert all(not torch.isnan(g).any() for g in got.values())


def test_zero_rows_give_zero_reduced_grads(kernel):
    t = bwd_leaves("gated_residual_layernorm", (2, 0, 64), BF16, form="[B,D]", affine="same", seed=12)
    outs = ours(kernel, "gated_residual_layernorm", t)
    got = grads_of(outs, [torch.ones_like(o) for o in outs], t)
    for name in ("gate", "scale", "shift", "weight", "bias"):
        assert torch.equal(got[name], torch.zeros_like(got[name])), name
    assert got["x"].shape == (2, 0, 64)


@pytest.mark.parametrize("op", BWD_OPS)
def test_differentiable_forward_is_bitwise_the_inference_forward(kernel, op):
    """The *_fwd op runs the same kernel (saving its row statistics besides): the same outputs."""
    t = bwd_leaves(op, (2, 64, 1536), BF16, form="[B,1,D]", mod_dtype=F32, affine="float32", seed=13)
    recorded = ours(kernel, op, t)
    assert all(o.requires_grad for o in recorded)
    with torch.no_grad():
        plain = ours(kernel, op, t)
    assert all(torch.equal(a, b) for a, b in zip(recorded, plain))


@pytest.mark.parametrize("op", BWD_OPS)
def test_saved_statistics_are_the_rows_mean_and_rstd(kernel, op):
    t = bwd_leaves(op, (2, 5, 2048), BF16, form="[B,D]", seed=14)
    x = t["x"].detach()
    if op == "layernorm":
        _, mean, rstd = kernel.ops.layernorm_fwd(x, None, None, EPS)
        h = x
    elif op == "adaln_layernorm":
        _, mean, rstd = kernel.ops.adaln_layernorm_fwd(x, t["scale"].detach(), None, None, None, EPS, True)
        h = x
    else:
        _, h, mean, rstd = kernel.ops.gated_residual_layernorm_fwd(x, t["y"].detach(), None, None, None, None, None,
                                                                   EPS, True)
    h64 = h.double()
    ref_mean = h64.mean(-1)
    ref_rstd = torch.rsqrt((h64 - ref_mean[..., None]).pow(2).mean(-1) + EPS)
    assert mean.dtype == rstd.dtype == F32 and mean.shape == rstd.shape == (2, 5)
    assert (mean.double() - ref_mean).abs().max().item() <= 1e-5 * h64.abs().max().item()
    assert ((rstd.double() - ref_rstd).abs() / ref_rstd).max().item() <= 1e-5


@pytest.mark.parametrize("op", BWD_OPS)
def test_opcheck_functional_ops_with_autograd(kernel, op):
    """opcheck's schema, fake, autograd-registration and aot_dispatch (forward + backward) checks."""
    t = bwd_leaves(op, (2, 5, 256), BF16, form="[B,D]", affine="float32", seed=15)
    g = t.get
    if op == "layernorm":
        fwd, args = kernel.ops.layernorm_fwd, (t["x"], g("weight"), g("bias"), EPS)
    elif op == "adaln_layernorm":
        fwd, args = kernel.ops.adaln_layernorm_fwd, (t["x"], t["scale"], g("shift"), g("weight"), g("bias"), EPS, True)
    else:
        fwd, args = kernel.ops.gated_residual_layernorm_fwd, (t["x"], t["y"], g("gate"), g("scale"), g("shift"),
                                                              g("weight"), g("bias"), EPS, True)
    torch.library.opcheck(fwd.default, args)
    d = {k: v.detach() for k, v in t.items()}
    outs = fwd(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
    h = outs[1] if op == "gated_residual_layernorm" else d["x"]
    mean, rstd = outs[-2], outs[-1]
    grad_x_out = torch.ones_like(h) if op == "gated_residual_layernorm" else None
    torch.library.opcheck(kernel.ops.layernorm_bwd.default, (
        torch.ones_like(outs[0]), grad_x_out, h, mean, rstd, d.get("y"), d.get("gate"), d.get("scale"),
        d.get("shift"), d.get("weight"), d.get("bias"), True, [True] * 7))


@pytest.mark.parametrize("op", BWD_OPS)
def test_cuda_graph_of_forward_and_backward_replays_with_new_inputs(kernel, op):
    t = bwd_leaves(op, (2, 700, 1536), BF16, form="[B,D]", affine="same", seed=24)
    dys = upstream(ours(kernel, op, t), seed=25)

    def step():
        for v in t.values():
            v.grad = None
        torch.autograd.backward(ours(kernel, op, t), dys)

    def refill():
        for i, v in enumerate(t.values()):
            v.copy_(rand(v.shape, v.dtype, 26 + i))

    graph_replays_training_step(step, list(t.values()), refill)


@pytest.mark.parametrize("op", BWD_OPS)
def test_compiled_training_step_matches_eager(kernel, op):
    t = bwd_leaves(op, (2, 16, 1536), BF16, form="[B,1,D]", mod_dtype=F32, affine="float32", seed=28)
    names = list(t)

    def f(*tensors):
        return tuple(o * 2 for o in ours(kernel, op, dict(zip(names, tensors))))

    compiled = torch.compile(f, fullgraph=True)
    dys = upstream(f(*t.values()), seed=29)
    got, expected = grads_of(compiled(*t.values()), dys, t), grads_of(f(*t.values()), dys, t)
    assert all(torch.equal(got[n], expected[n]) for n in t)
