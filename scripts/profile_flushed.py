"""Mochi's gated norm, ours and torch.compile's, each call behind 256 MB of zeros (as triton's do_bench
times the JSON's `us_flushed`) and back to back without them, at the two DiT shapes where compile leads
the flushed column (docs/perf-notes.md, session (u)). Each call sits in an NVTX range named after its
implementation; per shape, three calls flushed, then three back to back. For a profiler that keeps
the caches as the program leaves them:

    ncu --nvtx --nvtx-include ours/ --nvtx-include compile/ --cache-control none --clock-control none \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum python3 scripts/profile_flushed.py
"""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from common import load_kernel  # noqa: E402
from tests import reference as ref  # noqa: E402

EPS = 1e-6
SHAPES = [(2, 8160, 2048), (2, 2688, 4096)]

k = load_kernel()
compiled = torch.compile(ref.genmo_residual_tanh_gated_rmsnorm, dynamic=False)
flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
for shape in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    x, x_res = (torch.randn(shape, generator=g, device="cuda").bfloat16() for _ in range(2))
    gate = (torch.randn(shape[0], shape[-1], generator=g, device="cuda") * 0.3).bfloat16()
    impls = {"ours": lambda: k.residual_tanh_gated_rmsnorm(x, x_res, gate, EPS),
             "compile": lambda: compiled(x, x_res, gate)}
    for fn in impls.values():  # compile and warm up outside the ranges
        fn()
    torch.cuda.synchronize()
    for case in ("flushed", "back-to-back"):
        for name, fn in impls.items():
            for _ in range(3):
                if case == "flushed":
                    flush.zero_()
                torch.cuda.nvtx.range_push(name)
                fn()
                torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
