"""`ltx-dev profile`: run one family's benchmark for a profiler instead of timing
it: each selected implementation is compiled and warmed up, then called --calls
times, each call in an NVTX range named after the implementation; no JSON.
Everything after FAMILY goes to benchmarks/bench_<FAMILY>.py (see its --help):

  --only OP[,OP]     the ops (spaces in a name as underscores)
  --shape DIMS       the shape (e.g. 2,8160,2048; repeatable; plain-shape families take any shape)
  --impl TEXT        implementations whose name contains TEXT (repeatable; e.g. ltx_kernels, compile)
  --calls N          calls per implementation (default 3)
  --flush            zero 256 MB before each call (do_bench's cold L2); without it, calls run back to back
  --quick            the benchmark's quick subset of shapes
  --dev-build        the development build, with --tuning KNOB=V to force a knob on ours

For example:

  ncu --kernel-name regex:fused_norm python3 -m ltx_dev profile fused_norm --quick --impl ltx_kernels
  ncu --kernel-name regex:qk_rmsnorm_rope python3 -m ltx_dev profile qk_rmsnorm_rope --quick --impl ltx_kernels
  ncu --kernel-name regex:pixel_norm python3 -m ltx_dev profile vae --only pixel_norm --impl ltx_kernels
  ncu --kernel-name regex:'gated_vectorized|triton' python3 -m ltx_dev profile activation --only geglu,swiglu \\
      --impl ltx_kernels --impl compile
  ncu --nvtx --nvtx-include 'ltx_kernels (exact)/' --nvtx-include 'torch.compile(genmo)/' --cache-control none \\
      --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
      python3 -m ltx_dev profile fused_norm --only residual_tanh_gated_rmsnorm --shape 2,8160,2048 \\
      --impl 'ltx_kernels (exact)' --impl 'torch.compile(genmo)' --flush
  nsys profile python3 -m ltx_dev profile rope_axes --quick
"""

from __future__ import annotations

import argparse
import runpy
import sys

from .bench import FAMILIES
from .paths import BENCHMARKS


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="run a family's ops in NVTX ranges for ncu / nsys",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("family", choices=FAMILIES, help="the op family (benchmarks/bench_<family>.py)")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, metavar="...",
                   help="the benchmark's options (--only, --shape, --impl, --calls, --flush, ...)")
    p.set_defaults(run=run)


def bench_argv(family: str, bench_args: list[str]) -> list[str]:
    return [str(BENCHMARKS / f"bench_{family}.py"), "--profile", *bench_args]


def run(args) -> int:
    argv = bench_argv(args.family, args.bench_args)
    saved, sys.argv = sys.argv, argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
    finally:
        sys.argv = saved
    return 0
