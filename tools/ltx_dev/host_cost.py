"""`ltx-dev host-cost`: where the host time of one fused-norm call goes (Mochi's
ops), step by step: allocating the output, the dispatcher call with a
preallocated output, the checks and grid plan without a launch
(`fused_norm_path`), the whole Python API, beside PyTorch ops; then Python's
share of the whole API call (cProfile). A tiny input, so the GPU never holds
the host back. Host µs per call, median of --loops loops of --calls calls. With
--dev-build also with dependent launch off (the dependent_launch knob).

--attributes instead times the CUDA device-attribute queries a launch could
make, straight from libcudart through ctypes (no torch in between). The memory
clock query is the slow one (~0.7 ms on H100 and H200), which is why
high_bandwidth_device() in kernel_src/common caches its answer.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import ctypes
import glob
import os
import pstats
import time

from . import kernel as kernel_loading
from . import tuning

# cudaDeviceAttr values (cuda_runtime_api.h)
ATTRIBUTES = {"MultiProcessorCount": 16, "MemoryClockRate": 36, "GlobalMemoryBusWidth": 37}


def add_parser(sub) -> None:
    p = sub.add_parser("host-cost", help="host time per call of the fused norms, step by step (GPU machine)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=200, metavar="N", help="calls per loop (default 200)")
    p.add_argument("--loops", type=int, default=7, metavar="N", help="loops, of which the median (default 7)")
    p.add_argument("--dev-build", action="store_true",
                   help="the development build, also timed with dependent launch off")
    p.add_argument("--attributes", action="store_true", help="time the device-attribute queries instead")
    p.set_defaults(run=run)


def host_us(fn, calls: int, loops: int) -> float:
    """Median over `loops` loops of `calls` calls (harness.published_harness_us: host timer, same inputs)."""
    from .bench.harness import published_harness_us

    return sorted(published_harness_us(fn, (), calls=calls, warmup=20) for _ in range(loops))[loops // 2]


def cases(k) -> dict:
    import torch
    import torch.nn.functional as F

    ops = k.ops
    x = torch.randn(1, 64, 3072, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    g = torch.randn(1, 3072, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    w = torch.ones(3072, device="cuda", dtype=torch.bfloat16)
    return {
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


def settings(dev_build: bool) -> dict:
    """label -> the knobs forced: the build's default, and with a dev build dependent launch off."""
    return {"default": {}, **({"dependent_launch=0": {"dependent_launch": 0}} if dev_build else {})}


def op_costs(args) -> None:
    import torch

    k = kernel_loading.load(dev=args.dev_build)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}"
          + ("  (development build)" if args.dev_build else "  (release build: dependent launch as built)"))
    table = cases(k)
    for label, knobs in settings(args.dev_build).items():
        with tuning.override(k, knobs) if knobs else contextlib.nullcontext():
            for name, fn in table.items():
                try:
                    print(f"  {label:18s}  {name:48s} {host_us(fn, args.calls, args.loops):6.2f} us", flush=True)
                except Exception as e:  # noqa: BLE001 - report and go on
                    print(f"  {label:18s}  {name:48s} failed: {e!r}", flush=True)
    # Python's share of the whole API call (the C++ part shows as one builtin)
    api = table["k.residual_tanh_gated_rmsnorm(x, r, gate)"]
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        api()
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)


def cudart() -> ctypes.CDLL:
    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    candidates = glob.glob(f"{site}/nvidia/cu*/lib/libcudart.so*") + glob.glob("/usr/local/cuda/lib64/libcudart.so*")
    if not candidates:
        raise SystemExit("libcudart not found next to torch or in /usr/local/cuda")
    return ctypes.CDLL(sorted(candidates)[0])


def attribute_costs(calls: int) -> None:
    import torch

    torch.cuda.init()
    lib = cudart()
    value = ctypes.c_int()
    for name, attr in ATTRIBUTES.items():
        lib.cudaDeviceGetAttribute(ctypes.byref(value), attr, 0)
        start = time.perf_counter()
        for _ in range(calls):
            lib.cudaDeviceGetAttribute(ctypes.byref(value), attr, 0)
        per_call = (time.perf_counter() - start) / calls * 1e6
        print(f"cudaDeviceGetAttribute({name}) = {value.value}: {per_call:.1f} us per call")


def run(args) -> int:
    if args.calls < 1 or args.loops < 1:
        raise SystemExit("--calls and --loops must be at least 1")
    if args.attributes:
        attribute_costs(args.calls)
    else:
        op_costs(args)
    return 0
