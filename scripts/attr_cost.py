"""Host cost of the CUDA device-attribute queries a launch could make, called
straight from libcudart through ctypes (no torch in between). The memory
clock query is the slow one (~0.7 ms on H100 and H200), which is why
high_bandwidth_device() in kernel_src/common.cuh caches its answer.

    python3 scripts/attr_cost.py        (on a GPU machine)
"""

import ctypes
import glob
import os
import time

import torch

# cudaDeviceAttr values (cuda_runtime_api.h)
ATTRIBUTES = {"MultiProcessorCount": 16, "MemoryClockRate": 36, "GlobalMemoryBusWidth": 37}
CALLS = 200


def cudart() -> ctypes.CDLL:
    site = os.path.dirname(os.path.dirname(torch.__file__))
    candidates = glob.glob(f"{site}/nvidia/cu*/lib/libcudart.so*") + glob.glob("/usr/local/cuda/lib64/libcudart.so*")
    if not candidates:
        raise SystemExit("libcudart not found next to torch or in /usr/local/cuda")
    return ctypes.CDLL(sorted(candidates)[0])


def main() -> None:
    torch.cuda.init()
    lib = cudart()
    value = ctypes.c_int()
    for name, attr in ATTRIBUTES.items():
        lib.cudaDeviceGetAttribute(ctypes.byref(value), attr, 0)
        start = time.perf_counter()
        for _ in range(CALLS):
            lib.cudaDeviceGetAttribute(ctypes.byref(value), attr, 0)
        per_call = (time.perf_counter() - start) / CALLS * 1e6
        print(f"cudaDeviceGetAttribute({name}) = {value.value}: {per_call:.1f} us per call")


if __name__ == "__main__":
    main()
