#!/usr/bin/env bash
# Why does an error thrown inside the C++ binding crash the process on some
# machines? Calls the raw op (no Python-side checks) with bad arguments in a
# fresh process, several times, and under gdb when it is installed, printing
# the backtrace and the loaded C++ runtime libraries. Needs a built variant.
#   usage: bash scripts/diagnose_throw.sh [runs]   (logs to $OUT or ./gpu-out)
out=${OUT:-gpu-out}
mkdir -p "$out"
runs=${1:-3}
g++ --version | head -1
cat > /tmp/ltx_throw.py <<'PY'
import torch
from pathlib import Path
import kernels
k = kernels.get_local_kernel(Path("."))
dev = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.randn(4, 64, device=dev, dtype=torch.bfloat16)
out = torch.empty_like(x)
raised = 0
for w in (torch.ones(64, device=dev, dtype=torch.float16), torch.ones(32, device=dev, dtype=torch.bfloat16)):
    try:
        k.ops.rms_norm(out, x, w, 1e-6)  # the raw op: the binding's TORCH_CHECK throws
    except (RuntimeError, TypeError) as e:
        raised += 1
        print("raised", type(e).__name__, str(e).splitlines()[0][:100])
print("raised", raised, "of 2")
PY
# Each link variant: rebuild, run the raw-op throw `runs` times, and record
# where the binding's C++ runtime symbols bind (LD_DEBUG=bindings).
for ldflags in "" "-Wl,--no-as-needed"; do
  LDFLAGS="$ldflags" python3 -m ltx_build build -j 16 --no-check --allow-newer-glibc >/dev/null 2>&1 \
    || { echo "[$ldflags] build failed"; continue; }
  so=$(ls build/*/_ltx_kernels_*.so | head -1)
  echo "[$ldflags] NEEDED: $(readelf -d "$so" | grep NEEDED | sed 's/.*\[\(.*\)\]/\1/' | tr '\n' ' ')"
  ok=0
  for i in $(seq "$runs"); do
    python3 -X faulthandler /tmp/ltx_throw.py >"$out/throw-$i.log" 2>&1 && ok=$((ok + 1))
  done
  echo "[$ldflags] $ok of $runs runs raised both errors without crashing"
  tag=$(echo "$ldflags" | tr -c 'a-z' '_')
  LD_DEBUG=bindings python3 /tmp/ltx_throw.py 2>&1 | grep "_ltx_kernels_" \
    | grep -E "cxa|Unwind|St|basic_|ostream|string|typeinfo|_ZT" >"$out/bindings$tag.txt" || true
  echo "[$ldflags] C++ runtime symbols of the binding bound to: $(sed -n 's/.*to \([^ ]*\) \[.*/\1/p' \
    "$out/bindings$tag.txt" | sort | uniq -c | sort -rn | tr '\n' ' ')"
done
lib=$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))")/lib
for l in libc10.so libtorch_cpu.so libtorch.so; do
  echo "$l exports $(nm -D --defined-only "$lib/$l" | grep -c -E ' _ZNS|_ZNKS|__cxa_|_ZSt') std/C++-runtime symbols"
done
if command -v gdb >/dev/null; then
  gdb -q -batch -ex "set pagination off" -ex run -ex bt -ex "info sharedlibrary" \
      --args python3 /tmp/ltx_throw.py >"$out/throw-gdb.log" 2>&1
  echo "gdb run: $(grep -c '^#' "$out/throw-gdb.log") frames; see $out/throw-gdb.log"
  grep -A25 "SIG" "$out/throw-gdb.log" | head -40
else
  echo "gdb not installed"
  python3 - <<'PY'
import ctypes.util, torch
print("libstdc++:", ctypes.util.find_library("stdc++"), " libgcc_s:", ctypes.util.find_library("gcc_s"))
PY
fi
so=$(ls build/*/_ltx_kernels_*.so | head -1)
echo "== $so"; ldd "$so" | grep -E "stdc|gcc|c10|torch" ; readelf -d "$so" | grep -E "NEEDED|RUNPATH"
grep -E "libstdc|libgcc" /proc/self/maps 2>/dev/null | head -2
