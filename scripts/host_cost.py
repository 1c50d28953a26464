"""Where the host time of one fused-norm call goes (Mochi's ops), step by step: allocating the output,
the dispatcher call with a preallocated output, the checks and grid plan without a launch
(`fused_norm_path`), the whole Python API, with dependent launch on and off, beside PyTorch ops.
A tiny input, so the GPU never holds the host back. Host µs per call, median of 7 loops of 200.

    python3 scripts/host_cost.py        (on a GPU machine, after ltx_build)
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from common import load_kernel, published_harness_us  # noqa: E402

CALLS, LOOPS = 200, 7


def host_us(fn) -> float:
    """Median over LOOPS loops of CALLS calls (common.published_harness_us: host timer, same inputs)."""
    return sorted(published_harness_us(fn, (), calls=CALLS, warmup=20) for _ in range(LOOPS))[LOOPS // 2]


def main() -> None:
    k = load_kernel()
    ops = k.ops
    x = torch.randn(1, 64, 3072, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    g = torch.randn(1, 3072, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    w = torch.ones(3072, device="cuda", dtype=torch.bfloat16)
    cases = {
        "torch.empty(shape, dtype, device)": lambda: torch.empty(x.shape, dtype=x.dtype, device=x.device),
        "torch.add(x, r)": lambda: torch.add(x, r),
        "F.rms_norm(x, w)": lambda: F.rms_norm(x, (3072,), w, 1e-6),
        "ops.fused_norm_path (checks + plan, no launch)": lambda: ops.fused_norm_path(out, x, None, g),
        "ops.modulated_rmsnorm(out, ...)": lambda: ops.modulated_rmsnorm(out, x, g, 1e-6, 1.0),
        "k.modulated_rmsnorm(x, scale)": lambda: k.modulated_rmsnorm(x, g),
        "ops.residual_tanh_gated_rmsnorm(out, ...)": lambda: ops.residual_tanh_gated_rmsnorm(out, x, r, g, 1e-6,
                                                                                              True),
        "k.residual_tanh_gated_rmsnorm(x, r, gate)": lambda: k.residual_tanh_gated_rmsnorm(x, r, g),
        "k.rmsnorm(x, w)": lambda: k.rmsnorm(x, w, 1e-6),
    }
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    for pdl in ("1", "0"):
        os.environ["LTX_KERNELS_PDL"] = pdl
        for name, fn in cases.items():
            try:
                print(f"  PDL={pdl}  {name:48s} {host_us(fn):6.2f} us", flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"  PDL={pdl}  {name:48s} failed: {e!r}", flush=True)
    # Python's share of the whole API call (the C++ part shows as one builtin)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        k.residual_tanh_gated_rmsnorm(x, r, g)
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
