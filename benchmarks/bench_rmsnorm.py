"""RMSNorm benchmark: ltx_kernels against diffusers-style eager, F.rms_norm,
torch.compile and Liger at the issue's shapes, bf16, cold L2.

Bytes counted: x read once + y written once (+ the weight, once). Two
timings per row, both GPU time:
  us          steady state: calls rotating over inputs spanning 4x L2,
              captured back to back in a CUDA graph (rotating_graph_us);
  us_flushed  triton do_bench median, L2 flushed (256 MB of zeros written)
              before each call: the method of the figures quoted in issue 2.
TB/s and the fraction of the device-to-device copy rate (measured in the
same process) are from `us`.

Backward rows (op "rmsnorm backward", issue 36) at LTX-Video 2B [2, 2688, 2048]
and Wan 1.3B [2, 32760, 1536]: each implementation's own forward runs outside
the timing, then only `torch.autograd.grad(y, (x, w), dy)` is timed, against
eager autograd (diffusers' RMSNorm, F.rms_norm), torch.compile's backward and
Liger's. Bytes counted (the floor): dy and x read, dx written, rstd read
(float32 per row), the weight read and its grad written; not our dw partials
([<= 1024, hidden] float32, written and read once).

    python3 -m benchmarks.bench_rmsnorm [--out DIR] [--quick] [--dev-build --sweep]   (--help: every option)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ltx_dev.bench.backward import measure_backward as backward_rows
from ltx_dev.bench.harness import measure, save, shapes, start, tuned
from ltx_dev.bench.rows import COPY_IMPL
from ltx_dev.reference.rmsnorm import diffusers_rms_norm

SHAPES = [(1, 1024, 2048), (2, 1024, 2048), (4, 1024, 2048), (2, 4096, 3072), (4, 4096, 3072),
          (2, 2688, 2048), (2, 8160, 2048), (1, 32768, 2048)]
EPS = 1e-6
BACKWARD_SHAPES = [(2, 2688, 2048), (2, 32760, 1536)]  # LTX-Video 2B, Wan 1.3B


def sweep(kernel):
    """The same kernel with its threads per row forced (a dev build's rmsnorm.threads_per_row)."""
    return dict(tuned("ltx_kernels (torch rounding)", {"rmsnorm.threads_per_row": tpr},
                      lambda x, w: kernel.rmsnorm(x, w, EPS)) for tpr in (32, 64, 128, 256))


def baselines(kernel):
    impls = {
        "ltx_kernels (torch rounding)": lambda x, w: kernel.rmsnorm(x, w, EPS),
        "ltx_kernels (diffusers rounding)": lambda x, w: kernel.rmsnorm(x, w, EPS, rounding="diffusers"),
        "diffusers eager": lambda x, w: diffusers_rms_norm(x, w, EPS),
        "F.rms_norm": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS),
        "torch.compile(diffusers)": torch.compile(lambda x, w: diffusers_rms_norm(x, w, EPS), dynamic=False),
        "torch.compile(F.rms_norm)": torch.compile(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS),
                                                   dynamic=False),
        # what a plain copy of the same bytes takes at this size (reference, not a baseline)
        COPY_IMPL: lambda x, w: x.clone(),
    }
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        impls["Liger"] = lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)
    except Exception as e:  # noqa: BLE001 - report and go on without it
        print(f"Liger unavailable: {e!r}", flush=True)
    return impls


def measure_backward(rows: list, ceiling: float, kernel, shape) -> None:
    """The "rmsnorm backward" rows: every baseline's forward but the copy, its backward timed."""
    n, hidden = shape[0] * shape[1], shape[2]
    nbytes = 3 * 2 * n * hidden + 4 * n + 2 * 2 * hidden  # dy, x read, dx written; rstd; w read, dw written
    forwards = {name: fn for name, fn in baselines(kernel).items() if name != COPY_IMPL}

    def make_leaves():
        return (torch.randn(shape, device="cuda", dtype=torch.bfloat16),
                (torch.randn(hidden, device="cuda") * 0.1 + 1).bfloat16())

    backward_rows(rows, ceiling, "rmsnorm", shape, forwards, make_leaves, nbytes)


def main() -> None:
    args, kernel, env, ceiling = start(__doc__, "two shapes only", "also the threads-per-row sweep")
    impls = baselines(kernel)
    if args.sweep:
        impls.update(sweep(kernel))
    rows: list[dict] = []
    for shape in shapes(SHAPES, SHAPES[5:7], args):
        def make_args(i, shape=shape):
            x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            w = (torch.randn(shape[-1], device="cuda") * 0.1 + 1).bfloat16()
            return x, w

        nbytes = 2 * 2 * shape[0] * shape[1] * shape[2] + 2 * shape[-1]  # x read, y written, the weight
        measure(rows, ceiling, "rmsnorm", shape, impls, make_args, nbytes)
    for shape in shapes(BACKWARD_SHAPES, BACKWARD_SHAPES, args):
        measure_backward(rows, ceiling, kernel, shape)
    save("rmsnorm", env, ceiling, rows, args.out)


if __name__ == "__main__":
    main()
