"""VAE ops benchmark, bf16, cold L2:

  pixel_norm   ltx_kernels (both roundings) against the eager code they
               reproduce (diffusers RMSNorm via movedim; LTX's PixelNorm,
               x / sqrt(mean(x**2) + eps)) and torch.compile of each, at
               shapes of the LTX VAE decoder;
  inplace_add  ltx_kernels against x.add_(y) and torch.compile of it.

Bytes counted: pixel_norm reads x once and writes y once; inplace_add reads x
and y and writes x. Two timings per row, both GPU time (as in
bench_rmsnorm.py):
  us          steady state: calls rotating over inputs spanning 4x L2,
              captured back to back in a CUDA graph (rotating_graph_us);
  us_flushed  triton do_bench median, L2 flushed before each call.
TB/s and the fraction of the device-to-device copy rate (measured in the
same process) are from `us`. --sweep (with --dev-build) adds pixel_norm rows (both roundings)
for block plans forced through the tuning knobs pixel_norm.pos_words (position words per
block) and pixel_norm.channel_words (channel words per thread); a plan that does not fit
the shape falls back to the default and is skipped here.

    python3 -m benchmarks.bench_vae [--out DIR] [--quick] [--dev-build --sweep]   (--help: every option)
"""

from __future__ import annotations

import importlib

import torch

from ltx_dev.bench.harness import measure, save, shapes, start, tuned
from ltx_dev.reference.vae import diffusers_pixel_norm, original_pixel_norm

EPS = 1e-8
# LTX VAE decoder activations [B, C, T, H, W] (512 channels at the latent
# resolution, 256 and 128 after the upsamplers).
PIXEL_NORM_SHAPES = [(1, 512, 7, 16, 24), (2, 512, 7, 32, 48), (1, 256, 13, 64, 96), (1, 128, 25, 128, 192)]
# (x shape, y shape, y dtype): the DiT residual shape, and a VAE residual.
ADD_CASES = [((2, 2688, 2048), (2, 2688, 2048), torch.bfloat16),
             ((2, 2688, 2048), (2, 2688, 2048), torch.float32),
             ((2, 512, 7, 32, 48), (2, 512, 7, 32, 48), torch.bfloat16),
             ((2, 512, 7, 32, 48), (512, 1, 1, 1), torch.bfloat16)]
SWEEP_PLANS = [(4, 8), (8, 8), (16, 8), (4, 4), (8, 4), (16, 4), (4, 2), (8, 2), (16, 2), (32, 2), (32, 1)]


def _plan_fits(channels: int, plan) -> bool:
    """Mirror of make_plan in kernel_src/vae/pixel_norm.cu: the block holds every
    channel of its position words in at most 1024 threads."""
    pw, cpt = plan
    per_warp = 32 // pw  # channel groups that share a warp
    groups = -(-channels // cpt)
    groups = -(-groups // per_warp) * per_warp
    return pw * groups <= 1024


def pixel_norm_impls(vae, sweep: bool):
    impls = {
        "ltx_kernels (diffusers rounding)": lambda x: vae.pixel_norm(x, 1, EPS),
        "ltx_kernels (original rounding)": lambda x: vae.pixel_norm(x, 1, EPS, rounding="original"),
        "diffusers eager (movedim RMSNorm)": lambda x: diffusers_pixel_norm(x, 1, EPS),
        "original eager (PixelNorm)": lambda x: original_pixel_norm(x, 1, EPS),
        "torch.compile(diffusers)": torch.compile(lambda x: diffusers_pixel_norm(x, 1, EPS), dynamic=False),
        "torch.compile(original)": torch.compile(lambda x: original_pixel_norm(x, 1, EPS), dynamic=False),
    }
    plans = {}
    if sweep:
        for plan in SWEEP_PLANS:
            for rounding in ("diffusers", "original"):
                name, fn = tuned(f"ltx_kernels ({rounding} rounding)",
                                 {"pixel_norm.pos_words": plan[0], "pixel_norm.channel_words": plan[1]},
                                 lambda x, r=rounding: vae.pixel_norm(x, 1, EPS, rounding=r))
                impls[name] = fn
                plans[name] = plan
    return impls, plans


def add_impls(vae):
    return {
        "ltx_kernels inplace_add": lambda x, y: vae.inplace_add(x, y),
        "x.add_(y)": lambda x, y: x.add_(y),
        "torch.compile(add_)": torch.compile(lambda x, y: x.add_(y), dynamic=False),
    }


def main() -> None:
    args, kernel, env, ceiling = start(__doc__, "one shape per op", "add pixel_norm rows for forced block plans")
    vae = getattr(kernel, "vae", None) or importlib.import_module(kernel.__name__ + ".vae")
    rows: list[dict] = []

    pn_impls, plans = pixel_norm_impls(vae, args.sweep)
    for shape in shapes(PIXEL_NORM_SHAPES, PIXEL_NORM_SHAPES[1:2], args):
        def make_x(i, shape=shape):
            return (torch.randn(shape, device="cuda", dtype=torch.bfloat16),)

        nbytes = 2 * make_x(0)[0].numel() * 2
        measure(rows, ceiling, "pixel_norm", shape, pn_impls, make_x, nbytes,
                skip=lambda name, c=shape[1]: name in plans and not _plan_fits(c, plans[name]))

    for x_shape, y_shape, y_dtype in ADD_CASES[:1] if args.quick else ADD_CASES:
        def make_xy(i, x_shape=x_shape, y_shape=y_shape, y_dtype=y_dtype):
            return (torch.randn(x_shape, device="cuda", dtype=torch.bfloat16),
                    torch.randn(y_shape, device="cuda", dtype=y_dtype))

        x, y = make_xy(0)
        nbytes = 2 * x.numel() * x.element_size() + y.numel() * y.element_size()
        impls = {f"{n} (y {str(y_dtype).replace('torch.', '')})": f for n, f in add_impls(vae).items()}
        measure(rows, ceiling, "inplace_add", (x_shape, y_shape), impls, make_xy, nbytes)

    save("vae", env, ceiling, rows, args.out)


if __name__ == "__main__":
    main()
