#!/usr/bin/env bash
# Which compile flags let a validation error thrown in the binding reach
# Python on this machine? Builds the binding with each CXXFLAGS and calls the
# op with a bad weight dtype in a fresh process. Prints one line per variant.
g++ --version | head -1
for flags in "" "-std=c++17" "-DLTX_NO_GLIBC_COMPAT" "-std=c++17 -DLTX_NO_GLIBC_COMPAT" "-O0"; do
  CXXFLAGS="$flags" python3 -m ltx_build build -j 16 --no-check >/dev/null 2>&1 || { echo "[$flags] build failed"; continue; }
  python3 -X faulthandler - <<'PY' >/tmp/throw.log 2>&1
import sys, torch
from pathlib import Path
import kernels
k = kernels.get_local_kernel(Path("."))
x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
for bad in (lambda: k.rmsnorm(x, torch.ones(64, device="cuda", dtype=torch.float16)),
            lambda: k.rmsnorm(x, torch.ones(32, device="cuda", dtype=torch.bfloat16))):
    try:
        bad()
    except (RuntimeError, TypeError) as e:
        print("raised", type(e).__name__)
PY
  echo "[$flags] rc=$? $(grep -c raised /tmp/throw.log) raised"
done
