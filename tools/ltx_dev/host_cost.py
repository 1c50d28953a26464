"""`ltx-dev host-cost`: where the host time of one fused-norm call goes (Mochi's
ops), step by step: allocating the output, the dispatcher call with a
preallocated output, the checks and grid plan without a launch
(`fused_norm_path`), the whole Python API, beside PyTorch ops; then Python's
share of the whole API call (cProfile). A tiny input, so the GPU never holds
the host back. Host µs per call, median of --loops loops of --calls calls. With
--dev-build also with dependent launch off (the dependent_launch knob).

--training-graph instead times the calls a compiled LoRA training graph of LTX-Video 2B makes
(the functional ``<op>_fwd`` ops and the backward ops, as ``torch.ops.<namespace>.<op>.default``)
at the model's own shapes, beside aten.mm / add / empty and an out-variant op. A sleep kernel
stalls the GPU first, so every call only enqueues: the host cost at real shapes, never the GPU's.

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
    p.add_argument("--training-graph", action="store_true",
                   help="time the ops a compiled LTX-Video LoRA graph calls, at its shapes, the GPU stalled")
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


def training_graph_cases(ops, device: str = "cuda") -> dict:
    """label -> a call as Inductor's wrapper code makes it in the LTX-Video 2B LoRA step's graphs
    ([2, 2688, 2048] rows, [2, 1, 2048] modulation slices of one [2, 1, 12288] tensor, fp32 RoPE tables
    expanded over the batch, the text rows [2, 128, 2048]). ``ops``: the kernel's op namespace; on
    "meta" every op runs its fake kernel (the table's arguments checked against the schemas)."""
    import torch

    B, S, D = 2, 2688, 2048
    bf = torch.bfloat16
    x, y, g = (torch.randn(B, S, D, device=device, dtype=bf) for _ in range(3))
    mods = torch.randn(B, 1, 6 * D, device=device, dtype=bf)
    shift, scale, gate = mods[:, :, :D], mods[:, :, 2 * D:3 * D], mods[:, :, 4 * D:5 * D]
    w = torch.randn(D, device=device, dtype=bf)
    cos, sin = (torch.randn(1, S, D, device=device).expand(B, S, D) for _ in range(2))
    text = torch.randn(B, 128, D, device=device, dtype=bf)
    rows, weight = torch.randn(B * S, D, device=device, dtype=bf), torch.randn(D, D, device=device, dtype=bf)
    _, rstd = ops.rmsnorm_fwd.default(x, w, 1e-5, False)
    _, h = ops.gated_residual_rmsnorm_fwd.default(x, y, None, None, scale, shift, 1e-6, True)
    aten = torch.ops.aten
    return {
        "aten.mm [5376, 2048] x [2048, 2048]": lambda: aten.mm.default(rows, weight),
        "aten.add.Tensor": lambda: aten.add.Tensor(x, y),
        "aten.empty_strided": lambda: aten.empty_strided.default((B, S, D), (S * D, D, 1), dtype=bf, device=device),
        "adaln_rmsnorm (out variant)": lambda: ops.adaln_rmsnorm.default(g, x, None, scale, shift, 1e-6, True),
        "adaln_rmsnorm_fwd": lambda: ops.adaln_rmsnorm_fwd.default(x, None, scale, shift, 1e-6, True),
        "qk_rmsnorm_rope_fwd": lambda: ops.qk_rmsnorm_rope_fwd.default(x, y, w, w, cos, sin, D, 1e-5, "interleaved",
                                                                       False, True),
        "gated_residual_fwd": lambda: ops.gated_residual_fwd.default(x, y, gate, True),
        "rmsnorm_fwd": lambda: ops.rmsnorm_fwd.default(x, w, 1e-5, False),
        "rmsnorm_fwd (text rows)": lambda: ops.rmsnorm_fwd.default(text, w, 1e-5, False),
        "gated_residual_rmsnorm_fwd": lambda: ops.gated_residual_rmsnorm_fwd.default(x, y, None, None, scale, shift,
                                                                                     1e-6, True),
        "fused_norm_bwd gated_residual": lambda: ops.fused_norm_bwd.default(
            "gated_residual", None, g, g, None, gate, None, None, None, 0.0, 1.0, True, True, False, False, False,
            False),
        "fused_norm_bwd gated_residual_rmsnorm": lambda: ops.fused_norm_bwd.default(
            "gated_residual_rmsnorm", g, y, h, None, None, None, scale, shift, 1e-6, 1.0, True, False, False, False,
            False, False),
        "fused_norm_bwd adaln_rmsnorm": lambda: ops.fused_norm_bwd.default(
            "adaln_rmsnorm", g, None, x, None, None, None, scale, shift, 1e-6, 1.0, True, False, False, False, False,
            False),
        "rmsnorm_bwd": lambda: ops.rmsnorm_bwd.default(g, x, w, rstd, False, False),
        "qk_rmsnorm_rope_bwd": lambda: ops.qk_rmsnorm_rope_bwd.default(g, y, x, y, w, w, cos, sin, D, 1e-5,
                                                                       "interleaved", False, False, False),
    }


def stalled_host_us(fn, calls: int, loops: int) -> float:
    """Median over `loops` loops of the host µs per call of `calls` calls enqueued behind a sleep kernel
    (~0.1 s on an H100), so that no call waits for the GPU."""
    import torch

    times = []
    for _ in range(loops):
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return sorted(times)[loops // 2]


def training_graph_costs(args) -> None:
    import torch

    if args.calls > 300:  # the stream's launch queue (~1000 kernels) must not fill behind the sleep
        raise SystemExit("--training-graph: --calls at most 300")
    k = kernel_loading.load(dev=args.dev_build)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}: host us per call, GPU stalled")
    with torch.no_grad():  # as the compiled graphs run (inside autograd.Function's forward and backward)
        for name, fn in training_graph_cases(k.ops).items():
            fn()
            print(f"  {name:42s} {stalled_host_us(fn, args.calls, args.loops):7.2f} us", flush=True)


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
    elif args.training_graph:
        training_graph_costs(args)
    else:
        op_costs(args)
    return 0
