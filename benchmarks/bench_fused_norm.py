"""Fused norm family benchmark (issue 3): each op against the eager chain as
the model writes it and that chain under torch.compile (and Liger where it
has the op), bf16, at the DiT shapes; the Mochi ops also at the sizes Mochi's
own kernel was published with, with the speedup over eager.

Bytes counted: each row tensor read once and each output written once
(modulation vectors are [B, 1, D] and negligible). Timing as in
bench_rmsnorm.py: `us` steady state (CUDA graph over inputs spanning 4x L2),
`us_flushed` triton do_bench with L2 flushed; fractions of the copy rate
measured in the same process. Mochi's published sizes are also timed the way
that table was (`us_published_harness`: same inputs every call, host timer), to
set beside its ratios; host-bound at those sizes, so for reference only.

Backward rows ("<op> backward", issue 36): each implementation's forward
runs outside the timing (with every input a leaf that requires grad), then
`torch.autograd.grad` of its outputs is timed, at the LTX-Video 2B and Wan
1.3B shapes. Bytes: the floor of BACKWARD_ROWS (every row tensor the
backward must read once and every row grad it must write once; modulation
and weight grads are [B, 1, D] or [D]; their float32 partials are not counted). The backward's launch
choices are swept on a development build with --sweep-tuning fused_norm.bwd_threads=... (also
bwd_prefetch, bwd_shared_acc, bwd_rows_per_block; kernel_src/fused_norm/fused_norm_config.h).

    python3 -m benchmarks.bench_fused_norm [--out DIR] [--quick] [--dev-build --sweep]   (--help: every option)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ltx_dev.bench.harness import measure, published_harness_us, save, shapes, start, tuned
from ltx_dev.bench.targets import MOCHI_PUBLISHED
from ltx_dev.reference import fused_norm as ref

EPS = 1e-6
DIT_SHAPES = [(2, 2688, 2048), (2, 8160, 2048), (2, 2688, 4096), (2, 2048, 3072)]
BACKWARD_SHAPES = [(2, 2688, 2048), (2, 32760, 1536)]  # LTX-Video 2B, Wan 1.3B
# Row tensors (x's shape) the backward floor reads + writes, and the forward's outputs.
BACKWARD_ROWS = {
    "rmsnorm_residual": (4, 2),         # dout, dsum, h read; dh written (input's and residual's grad, as add's)
    "adaln_rmsnorm": (3, 1),            # dout, x read; dx written
    "gated_residual": (3, 1),           # dsum, y read; dy written (dx is dsum itself)
    "gated_residual_rmsnorm": (6, 2),   # dout, dsum, h, y read; dx, dy written
    "residual_tanh_gated_rmsnorm": (3, 1),  # dout, x_res read; dx_res written (dx is dout itself)
    "modulated_rmsnorm": (3, 1),        # dout, x read; dx written
}


def _compiled(fn):
    return torch.compile(fn, dynamic=False)


def ops(k):
    """name -> (row tensors read + written, argument maker, {impl: fn})."""
    def rows(shape, i, n):
        g = torch.Generator(device="cuda").manual_seed(i)
        return [torch.randn(shape, generator=g, device="cuda").bfloat16() for _ in range(n)]

    def mods(shape, i, n, per_batch_2d=False):
        B, D = shape[0], shape[-1]
        g = torch.Generator(device="cuda").manual_seed(1000 + i)
        s = (B, D) if per_batch_2d else (B, 1, D)
        return [(torch.randn(s, generator=g, device="cuda") * 0.3).bfloat16() for _ in range(n)]

    adaln_eager = lambda x, s, sh: ref.ltx_adaln_eager(x, None, s, sh, EPS)  # noqa: E731
    residual_eager = lambda x, r, w: (lambda h: (F.rms_norm(h, (h.shape[-1],), w, EPS), h))(x + r)  # noqa: E731

    def seam_eager(x, y, g, s, sh):
        h = ref.gated_residual_eager(x, y, g)
        return ref.ltx_adaln_eager(h, None, s, sh, EPS), h

    impls = {
        "adaln_rmsnorm": (2, lambda shape, i: (*rows(shape, i, 1), *mods(shape, i, 2)), {
            "ltx_kernels (exact)": lambda x, s, sh: k.adaln_rmsnorm(x, None, s, sh, EPS),
            "ltx_kernels (fast)": lambda x, s, sh: k.adaln_rmsnorm(x, None, s, sh, EPS, exact_mode=False),
            "eager chain": adaln_eager,
            "torch.compile(chain)": _compiled(adaln_eager),
        }),
        "rmsnorm_residual": (4, lambda shape, i: (*rows(shape, i, 2), torch.ones(shape[-1], device="cuda",
                                                                                  dtype=torch.bfloat16)), {
            "ltx_kernels": lambda x, r, w: k.rmsnorm_residual(x, r, w, EPS),
            "eager (add, F.rms_norm)": residual_eager,
            "torch.compile(add, F.rms_norm)": _compiled(residual_eager),
        }),
        "gated_residual_rmsnorm": (4, lambda shape, i: (*rows(shape, i, 2), *mods(shape, i, 3)), {
            "ltx_kernels (exact)": lambda x, y, g, s, sh: k.gated_residual_rmsnorm(x, y, g, s, sh, EPS),
            "ltx_kernels (fast)": lambda x, y, g, s, sh: k.gated_residual_rmsnorm(x, y, g, s, sh, EPS,
                                                                                  exact_mode=False),
            "eager chain": seam_eager,
            "torch.compile(chain)": _compiled(seam_eager),
        }),
        "gated_residual": (3, lambda shape, i: (*rows(shape, i, 2), *mods(shape, i, 1)), {
            "ltx_kernels (exact)": lambda x, y, g: k.gated_residual(x, y, g),
            "eager": ref.gated_residual_eager,
            "torch.compile": _compiled(ref.gated_residual_eager),
        }),
        "residual_tanh_gated_rmsnorm": (3, lambda shape, i: (*rows(shape, i, 2), *mods(shape, i, 1, True)), {
            "ltx_kernels (exact)": lambda x, r, g: k.residual_tanh_gated_rmsnorm(x, r, g, EPS),
            "ltx_kernels (fast)": lambda x, r, g: k.residual_tanh_gated_rmsnorm(x, r, g, EPS, exact_mode=False),
            "eager (genmo)": ref.genmo_residual_tanh_gated_rmsnorm,
            "torch.compile(genmo)": _compiled(ref.genmo_residual_tanh_gated_rmsnorm),
        }),
        "modulated_rmsnorm": (2, lambda shape, i: (*rows(shape, i, 1), *mods(shape, i, 1, True)), {
            "ltx_kernels": lambda x, s: k.modulated_rmsnorm(x, s, EPS),
            "eager (genmo)": ref.genmo_modulated_rmsnorm,
            "torch.compile(genmo)": _compiled(ref.genmo_modulated_rmsnorm),
        }),
    }
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

        impls["rmsnorm_residual"][2]["Liger (fused add)"] = (
            lambda x, r, w: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS, 0.0, "llama", False))
    except Exception as e:  # noqa: BLE001 - report and go on without it
        print(f"Liger fused add RMSNorm unavailable: {e!r}", flush=True)
    return impls


def like_for_like(added: list[dict], impls: dict, args) -> None:
    """Time `added`'s implementations the way Mochi's published kernel table was timed (same inputs
    every call, host timer: harness.published_harness_us), five loops each in turn, and add the median
    and the speedup over eager so measured to each row (sweep rows are left as they are)."""
    timed = [r for r in added if r["impl"] in impls]
    loops: dict[str, list[float]] = {r["impl"]: [] for r in timed}
    for _ in range(5):
        for name in loops:
            loops[name].append(published_harness_us(impls[name], args))
    for r in timed:
        r["us_published_harness"] = round(sorted(loops[r["impl"]])[2], 2)
    eager = next(r for r in timed if r["impl"].startswith("eager"))
    for r in timed:
        r["speedup_vs_eager_published_harness"] = round(eager["us_published_harness"] / r["us_published_harness"], 2)


def measure_backward(rows: list, ceiling: float, table: dict, shape) -> None:
    """"<op> backward" rows: every implementation of the forward table (the model's eager code, its
    torch.compile, Liger where it has the op, ours), with all inputs requiring grad."""
    for op, (_, make, impls) in table.items():
        floor_rows, n_out = BACKWARD_ROWS[op]
        nbytes = floor_rows * 2 * shape[0] * shape[1] * shape[2]
        n_in = len(make(shape, 0))

        def make_args(i, make=make, forward=None):
            leaves = [t.requires_grad_() for t in make(shape, i)]
            outs = forward(*leaves)
            outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
            return (*outs, *leaves, *[torch.randn_like(o) for o in outs])

        def grad(*t, n_in=n_in, n_out=n_out):
            return torch.autograd.grad(t[:n_out], t[n_out:n_out + n_in], t[n_out + n_in:], retain_graph=True)

        for name, forward in impls.items():
            measure(rows, ceiling, f"{op} backward", shape, {name: grad},
                    lambda i, forward=forward, make_args=make_args: make_args(i, forward=forward), nbytes)


def main() -> None:
    args, kernel, env, ceiling = start(__doc__, "the LTX shape only", "also sweep threads per row "
                                       "(fused_norm.threads_per_row)")
    table = ops(kernel)
    if args.sweep:
        for op, (_, _, impls) in table.items():
            ours = [(n, f) for n, f in impls.items() if n.startswith("ltx_kernels")]
            for tpr in (32, 64, 128, 256):
                impls.update(tuned(n, {"fused_norm.threads_per_row": tpr}, f) for n, f in ours)
    rows: list[dict] = []
    for op, (tensors, make, impls) in table.items():
        mochi = list(MOCHI_PUBLISHED) if op in ("residual_tanh_gated_rmsnorm", "modulated_rmsnorm") else []
        for shape in shapes(DIT_SHAPES + mochi, DIT_SHAPES[:1], args):
            nbytes = tensors * 2 * shape[0] * shape[1] * shape[2]
            added = measure(rows, ceiling, op, shape, impls, lambda i, shape=shape: make(shape, i), nbytes)
            eager = next((r for r in added if r["impl"].startswith("eager")), None)
            if eager is None:
                continue
            for row in added:  # speedups over the eager chain, both timings
                row["speedup_vs_eager"] = round(eager["us"] / row["us"], 2)
                row["speedup_vs_eager_flushed"] = round(eager["us_flushed"] / row["us_flushed"], 2)
            if shape in MOCHI_PUBLISHED:
                like_for_like(added, impls, make(shape, 0))
                ours = [r for r in added if r["impl"].startswith("ltx_kernels")]
                best = max(r["speedup_vs_eager"] for r in ours)
                best_harness = max(r["speedup_vs_eager_published_harness"] for r in ours)
                print(f"  {op} {list(shape)}: {best:.1f}x eager, {best_harness:.1f}x timed as the published "
                      f"table was (published Mochi kernel: {MOCHI_PUBLISHED[shape]}x)", flush=True)
    for shape in shapes(BACKWARD_SHAPES, BACKWARD_SHAPES[:1], args):
        measure_backward(rows, ceiling, ops(kernel), shape)
    save("fused_norm", env, ceiling, rows, args.out)


if __name__ == "__main__":
    main()
