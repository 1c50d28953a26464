#!/usr/bin/env bash
# One GPU-machine session: install the carried wheels, build the variant for
# the machine's torch, run the op tests (GPU and CPU; the builder tests need a git
# checkout and a glibc <= 2.36 host, so they run in CI) and the
# benchmarks, then list the rows that miss the issues' targets
# (benchmarks/targets.py). Logs and JSON go to $OUT (or ./gpu-out).
#   usage: LTX_COMMIT=<sha> [LTX_TESTS=...] [LTX_BENCHES=...] [LTX_BENCH_ARGS=...] \
#          [LTX_BENCH_TIMEOUT=seconds] [LTX_STOP_AFTER=seconds] [LTX_PACK=1] \
#          [LTX_REQUIRE_GPU=name] bash scripts/gpu_session.sh [pytest args...]
# LTX_REQUIRE_GPU=H200: do nothing (exit 0) unless the GPU's name contains it
# (the device tool may start an H100 where an H200 was asked for; this way
# that start costs seconds, not a session's worth of benchmarks).
# LTX_STOP_AFTER: start no benchmark once the session has run that long.
# LTX_PACK=1: everything goes into one $OUT/results.tar, rewritten after the
# tests and after each benchmark (the device tool returns at most 8 files, and
# a call cut off at its limit still returns what was packed).
set -uo pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [ -n "${LTX_REQUIRE_GPU:-}" ] && [[ "$gpu" != *"$LTX_REQUIRE_GPU"* ]]; then
  echo "LTX_REQUIRE_GPU=$LTX_REQUIRE_GPU: this is a $gpu; nothing run"
  exit 0
fi
out=${OUT:-gpu-out}
pack_to=""
if [ -n "${LTX_PACK:-}" ]; then
  pack_to=$out
  mkdir -p "$pack_to"
  out=$(mktemp -d)
fi
pack() { [ -z "$pack_to" ] || tar -C "$out" -cf "$pack_to/results.tar" .; }
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if ls .wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps .wheels/*.whl 2>&1 | grep -v -i warning
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -m ltx_build build -j 16 --allow-newer-glibc 2>&1 | tee "$out/build.log" || exit 1
python3 -m pytest -q -p no:cacheprovider ${LTX_TESTS:-$(ls tests/test_*_gpu.py tests/test_*_cpu.py) tests/test_reference.py tests/test_rope_tables.py} "$@" 2>&1 | tee "$out/tests.log"
tests_rc=${PIPESTATUS[0]}
pack
for b in ${LTX_BENCHES-$(ls benchmarks/bench_*.py)}; do  # LTX_BENCHES= (empty) runs none
  if [ -n "${LTX_STOP_AFTER:-}" ] && [ "$SECONDS" -ge "$LTX_STOP_AFTER" ]; then
    echo "LTX_STOP_AFTER: $SECONDS s gone, not starting $b or the benchmarks after it"
    break
  fi
  # shellcheck disable=SC2086  # LTX_BENCH_ARGS is a list of flags
  timeout "${LTX_BENCH_TIMEOUT:-900}" python3 "$b" --out "$out" ${LTX_BENCH_ARGS:-} 2>&1 |
    tee "$out/$(basename "$b" .py).log"
  pack
done
if ls "$out"/*.json >/dev/null 2>&1; then
  python3 benchmarks/targets.py "$out"/*.json 2>&1 | tee "$out/targets.log"
  pack
fi
echo "tests exit code: $tests_rc"
exit "$tests_rc"
