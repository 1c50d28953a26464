"""FP8 producer benchmark (issue 37): the ops that write a GEMM's input as e4m3 rows with one float32
scale per row, against what a user would run instead: the same PyTorch chain (op, row amax, scale,
cast) eager and under torch.compile, and our bf16 op followed by quantize_fp8 (two passes). Shapes: LTX-Video 2B's block ([2, 2688, 2048], modulation per
sample) and feed-forward inner dim ([2, 2688, 8192]); Wan 1.3B's hidden and FF inner rows
([2, 32760, 1536], [2, 32760, 8960]). Bytes counted (the floor): inputs read, e4m3 rows and scales
written (the seam also writes its bf16 residual stream). Timing as bench_rmsnorm.py.

    python3 -m benchmarks.bench_fp8 [--out DIR] [--quick]   (--help: every option)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ltx_dev.bench.harness import measure, save, shapes, start

E4M3 = torch.float8_e4m3fn


def to_rows(v: torch.Tensor):
    """e4m3 rows and scales of float32 values, as the ops define them."""
    amax = v.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return (v / scale).clamp(-448.0, 448.0).to(E4M3), scale.squeeze(-1)


def quantize_eager(x):
    return to_rows(x.float())


def gelu_eager(x):
    return to_rows(F.gelu(x.float(), approximate="tanh"))


def adaln_eager(x, scale, shift, eps=1e-6):
    xf = x.float()
    v = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1 + scale.float()) + shift.float()
    return to_rows(v)


def seam_eager(x, y, scale, shift, eps=1e-6):
    h = x + y
    return (*adaln_eager(h, scale, shift, eps), h)


def main() -> None:
    args, k, env, ceiling = start(__doc__, "one shape per op")
    rows: list = []

    def randn(*shape, s=1.0):
        return (torch.randn(shape, device="cuda") * s).bfloat16()

    for shape in shapes([(2, 2688, 2048), (2, 32760, 1536)], [(2, 2688, 2048)], args):
        n, r = math.prod(shape), math.prod(shape[:-1])
        mod = (shape[0], 1, shape[-1])
        impls = {"ltx_kernels": lambda x: k.quantize_fp8(x), "eager": quantize_eager,
                 "torch.compile": torch.compile(quantize_eager)}
        measure(rows, ceiling, "quantize_fp8", shape, impls, lambda i, shape=shape: (randn(*shape),), 3 * n + 4 * r)
        impls = {"ltx_kernels": lambda x, sc, sh: k.adaln_rmsnorm_fp8(x, None, sc, sh, 1e-6),
                 "two passes (our adaln_rmsnorm, quantize_fp8)":
                     lambda x, sc, sh: k.quantize_fp8(k.adaln_rmsnorm(x, None, sc, sh, 1e-6, exact_mode=False)),
                 "eager": adaln_eager, "torch.compile": torch.compile(adaln_eager)}
        measure(rows, ceiling, "adaln_rmsnorm_fp8", shape, impls,
                lambda i, shape=shape, mod=mod: (randn(*shape), randn(*mod, s=0.3), randn(*mod)), 3 * n + 4 * r)
        impls = {"ltx_kernels": lambda x, y, sc, sh: k.gated_residual_rmsnorm_fp8(x, y, None, sc, sh, 1e-6),
                 "eager": seam_eager, "torch.compile": torch.compile(seam_eager)}
        measure(rows, ceiling, "gated_residual_rmsnorm_fp8", shape, impls,
                lambda i, shape=shape, mod=mod: (randn(*shape), randn(*shape), randn(*mod, s=0.3), randn(*mod)),
                7 * n + 4 * r)
    for shape in shapes([(2, 2688, 8192), (2, 32760, 8960)], [(2, 2688, 8192)], args):
        n, r = math.prod(shape), math.prod(shape[:-1])
        impls = {"ltx_kernels": lambda x: k.gelu_tanh_fp8(x),
                 "two passes (our gelu_tanh, quantize_fp8)": lambda x: k.quantize_fp8(k.gelu_tanh(x, fast=True)),
                 "eager": gelu_eager, "torch.compile": torch.compile(gelu_eager)}
        measure(rows, ceiling, "gelu_tanh_fp8", shape, impls, lambda i, shape=shape: (randn(*shape),), 3 * n + 4 * r)
    save("fp8", env, ceiling, rows, args.out)


if __name__ == "__main__":
    main()
