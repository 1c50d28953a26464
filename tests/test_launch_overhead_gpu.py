"""Host time per call, for every exported op (ltx_dev/registry.py) on a small
input: an eager model calls these ops thousands of times per step, and a call
that costs the host more than its kernel costs the GPU makes the model slower
however fast the kernel is. The bound is loose (a Python wrapper, argument
checks, one dispatcher call and a launch take ~10-40 us); what it catches is a
slow CUDA query on every call, as when the memory clock was read per launch
(~0.3-1 ms: every op ran at that rate outside CUDA graphs). Skipped without
CUDA."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from ltx_dev.registry import BF16, OPS, Source

from .conftest import cuda

pytestmark = cuda

CALLS = 50
REPEATS = 7
MAX_HOST_US = 150.0  # per call; PyTorch's own F.rms_norm is measured beside it


def host_us_per_call(fn) -> float:
    """Median over REPEATS of the wall time of CALLS calls (then a synchronize), per call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / CALLS * 1e6)
    return sorted(times)[REPEATS // 2]


@pytest.mark.parametrize("spec", OPS, ids=[s.name for s in OPS])
def test_a_call_costs_the_host_well_under_a_millisecond(kernel, spec):
    dtype = BF16 if BF16 in spec.dtypes else spec.dtypes[0]
    args, _ = spec.build(spec.canonical("small", "vector"), dtype, Source(1, "cuda"), sentinel=False)
    ours = host_us_per_call(lambda: spec.call(kernel, args))
    x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    torch_rms_norm = host_us_per_call(lambda: F.rms_norm(x, (2048,), w, 1e-6))
    print(f"{spec.name}: {ours:.1f} us per call (F.rms_norm {torch_rms_norm:.1f} us)")
    assert ours < MAX_HOST_US, (
        f"{spec.name} costs {ours:.0f} us of host time per call on a small input "
        f"(F.rms_norm: {torch_rms_norm:.0f} us); something slow runs on every call")
