"""What kernel-builder's `nix run .#ci-test` runs (`pytest tests -m kernels_ci`, after a Nix build):
the kernel loaded the way users load it, `kernels.get_kernel(<repo-id>, version=1)` through
LOCAL_KERNELS, is this kernel (its op namespace, its metadata.json, its ops registered for CUDA),
and a handful of ops agree with float64 references on small inputs. A smoke test of a few seconds;
the other test modules check everything in depth.

The Nix test Python holds only torch, kernels and pytest (and what they pull in), so this module
imports nothing else: its references are written out here. Needs a CUDA GPU; skips without one.

Tolerance: |out - ref64| <= TOL * max(|ref64|, 1) for an op that rounds once (TOL: twice the
dtype's unit roundoff); twice that, against the largest term, for exact mode's chain of roundings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from .conftest import BUILD_TOML, cuda

pytestmark = [pytest.mark.kernels_ci, cuda]

F64 = torch.float64
TOL = {torch.bfloat16: 2 * 2**-8, torch.float32: 2e-5}
DTYPES = list(TOL)
# Ops each family registers (torch.library names), checked to have a CUDA kernel.
OPS = ("rmsnorm", "gated_residual_rmsnorm", "gelu_tanh", "head_gate", "apply_rotary_emb", "rope_3d", "pixel_norm")


def rand(shape, dtype, seed, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) * scale).to(dtype)


def assert_close64(out, ref64, dtype, scale=None, factor=1):
    assert out.dtype == dtype and out.shape == ref64.shape
    bound = ref64.abs().clamp_min(1.0) if scale is None else torch.maximum(ref64.abs().clamp_min(1.0), scale)
    err = ((out.double() - ref64).abs() / bound).max().item()  # NaN fails the comparison below
    assert err <= TOL[dtype] * factor, err


def rms64(x, eps, dim=-1):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(dim, keepdim=True) + eps)


def test_loads_this_kernels_namespace_with_its_metadata(ci_kernel):
    general = BUILD_TOML["general"]
    python_name = general["name"].replace("-", "_")
    namespace = ci_kernel.add_op_namespace_prefix("rmsnorm").split("::")[0]
    # kernels imports the package under its metadata id, which is the op namespace
    assert ci_kernel.__name__ == namespace
    assert namespace.startswith(f"_{python_name}_cuda_")
    meta = json.loads((Path(ci_kernel.__file__).parent / "metadata.json").read_text())
    assert (meta["name"], meta["id"], meta["version"]) == (general["name"], namespace, general["version"])
    assert meta["backend"]["type"] == "cuda"
    capabilities = {c for k in BUILD_TOML["kernel"].values() for c in k["cuda-capabilities"]}
    assert set(meta["backend"]["archs"]) == capabilities
    for op in OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{namespace}::{op}", "CUDA"), op
        assert callable(getattr(ci_kernel, op))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm(ci_kernel, dtype):
    x, w = rand((6, 2048), dtype, 1, 2.0), rand((2048,), dtype, 2)
    out = ci_kernel.rmsnorm(x, w, eps=1e-6)
    assert_close64(out, rms64(x, 1e-6) * w.double(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_residual_rmsnorm(ci_kernel, dtype):
    B, S, D = 2, 40, 2048
    x, y = rand((B, S, D), dtype, 3), rand((B, S, D), dtype, 4)
    gate, scale, shift = (rand((B, 1, D), dtype, s, 0.5) for s in (5, 6, 7))
    out, x_new = ci_kernel.gated_residual_rmsnorm(x, y, gate, scale, shift, 1e-6)
    assert_close64(x_new, x.double() + y.double() * gate.double(), dtype,
                   scale=(y.double() * gate.double()).abs(), factor=2)
    n = rms64(x_new, 1e-6) * (1 + scale.double())
    assert_close64(out, n + shift.double(), dtype, scale=n.abs(), factor=2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh(ci_kernel, dtype):
    x = rand((8, 4096), dtype, 8, 3.0)
    x64 = x.double()
    ref = 0.5 * x64 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    assert_close64(ci_kernel.gelu_tanh(x), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_gate(ci_kernel, dtype):
    x, logits = rand((4, 16, 8 * 64), dtype, 13, 2.0), rand((4, 16, 8), dtype, 14, 4.0)
    ref = (x.double().unflatten(-1, (8, 64)) * 2 * torch.sigmoid(logits.double()).unsqueeze(-1)).flatten(-2)
    assert_close64(ci_kernel.head_gate(x, logits, exact_mode=False), ref, dtype)  # one rounding
    assert_close64(ci_kernel.head_gate(x, logits), ref, dtype, factor=2)  # exact mode: three


def rotate_interleaved64(x, cos, sin):
    """Pairs (2i, 2i+1): out = x * cos + (-x[2i+1], x[2i]) * sin, in float64."""
    x0, x1 = x.double().unflatten(-1, (-1, 2)).unbind(-1)
    partner = torch.stack([-x1, x0], dim=-1).flatten(-2)
    return x.double() * cos.double() + partner * sin.double()


def pair_magnitude(x):
    m = x.double().abs().unflatten(-1, (-1, 2)).sum(-1, keepdim=True)
    return m.expand(*m.shape[:-1], 2).flatten(-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_apply_rotary_emb(ci_kernel, dtype):
    B, S, D = 2, 48, 512
    x = rand((B, S, D), dtype, 9, 2.0)
    angles = torch.rand((1, S, D // 2), device="cuda", dtype=F64) * 20
    angles = angles.repeat_interleave(2, dim=-1).expand(B, S, D)  # one angle per pair, as LTX's tables
    cos, sin = angles.cos().float(), angles.sin().float()
    out = ci_kernel.apply_rotary_emb(x, cos, sin)
    assert_close64(out, rotate_interleaved64(x, cos, sin), dtype, scale=pair_magnitude(x))


def rope_3d_angles64(frames, height, width, head_dim, theta):
    """[F*H*W, head_dim/2]: the head dim split as Wan 2.1 splits it, each part rotated by its axis'
    position (frame-major tokens) times theta ** (-2j / part)."""
    hw = 2 * (head_dim // 6)
    parts = (head_dim - 2 * hw, hw, hw)
    grid = torch.meshgrid(*(torch.arange(n, dtype=F64, device="cuda") for n in (frames, height, width)),
                          indexing="ij")
    return torch.cat([pos.flatten()[:, None] * theta ** (-2 * torch.arange(d // 2, dtype=F64, device="cuda") / d)
                      for pos, d in zip(grid, parts)], dim=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_3d(ci_kernel, dtype):
    frames, height, width, heads, head_dim = 3, 4, 5, 2, 128
    assert tuple(ci_kernel.rope_3d_split(head_dim)) == (44, 42, 42)
    q0 = rand((1, frames * height * width, heads, head_dim), dtype, 10)
    k0 = rand((1, frames * height * width, heads, head_dim), dtype, 11)
    q, k = q0.clone(), k0.clone()
    q_out, k_out = ci_kernel.rope_3d(q, k, frames, height, width, theta_base=10000.0)
    assert q_out is q and k_out is k  # in place
    a = rope_3d_angles64(frames, height, width, head_dim, 10000.0)[None, :, None, :].repeat_interleave(2, dim=-1)
    for out, x in ((q, q0), (k, k0)):
        assert_close64(out, rotate_interleaved64(x, a.cos(), a.sin()), dtype, scale=pair_magnitude(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_pixel_norm(ci_kernel, dtype):
    x = rand((2, 64, 3, 8, 12), dtype, 12, 2.0)
    assert_close64(ci_kernel.pixel_norm(x, dim=1, eps=1e-8), rms64(x, 1e-8, dim=1), dtype)
