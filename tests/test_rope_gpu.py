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
