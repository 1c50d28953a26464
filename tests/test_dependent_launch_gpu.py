"""Programmatic dependent launch across op families: the activation, RoPE, q/k norm and VAE
kernels, back to back, each reading what the one before wrote (in place included), give what
the same chain gives one synchronised op at a time, with dependent launch on and off, eagerly
and in a CUDA graph. (RMSNorm's and the fused norms' chains are in their own test files.)"""

from __future__ import annotations

import pytest
import torch

from .conftest import cuda
from .stream_chain import assert_chain_sees_each_output

pytestmark = cuda

B, F, H, W = 2, 7, 16, 24
S = F * H * W


def rand(shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16)


def test_activation_rope_qk_and_vae_kernels_see_each_others_output(kernel, launch_mode):
    x = rand((B, S, 2048), 1)
    cos, sin = kernel.ltx_rope_cos_sin(F, H, W, None, 2048, device="cuda")
    cos_half, sin_half = kernel.ltx_rope_cos_sin(F, H, W, None, 1024, device="cuda")
    q_weight, k_weight = 1 + 0.1 * rand((1024,), 2), 1 + 0.1 * rand((1024,), 3)

    def chain(sync):
        def step(result):
            if sync:
                torch.cuda.synchronize()
            return result

        a = step(kernel.apply_rotary_emb(x, cos, sin))
        b = step(kernel.gelu_tanh(a))
        step(kernel.rope_3d(b.view(B, S, 32, 64), a.view(B, S, 32, 64), F, H, W))  # in place on b and a
        c = step(kernel.geglu(b))
        d = step(kernel.swiglu(a))
        step(kernel.rope_1d(c.view(B, S, 16, 64), d.view(B, S, 16, 64)))  # in place on c and d
        q, k = step(kernel.qk_rmsnorm_rope(c, d, q_weight, k_weight, cos_half, sin_half))
        video = q.view(B, 512, F, 32, W)  # a [B, C, T, H, W] view of the same 5.5 M elements
        normed = step(kernel.pixel_norm(video))
        step(kernel.inplace_add(normed, k.view(B, 512, F, 32, W)))
        return a, b, c, d, q, k, normed

    outs = chain(True)
    assert all(torch.isfinite(t).all() for t in outs)
    assert not torch.equal(outs[0], kernel.apply_rotary_emb(x, cos, sin))  # rope_3d rotated a in place
    assert_chain_sees_each_output(chain)
