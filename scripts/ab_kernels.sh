#!/usr/bin/env bash
# A/B two versions of the CUDA sources in one GPU-machine call. A is this tree;
# B is a copy of it with the kernel sources in $AB_DIR (default _ab/kernel_src)
# in place of kernel_src/. Both are built at once, then every benchmark given
# runs against A and then B in the same session; JSON and logs go to
# $OUT/A and $OUT/B (or ./gpu-out/...). Builds for the installed torch.
#
#   here:  rm -rf _ab && mkdir _ab && git archive <rev> kernel_src | tar -x -C _ab
#   there (carry .wheels and _ab):
#          LTX_COMMIT=<A sha> bash scripts/ab_kernels.sh benchmarks/bench_fused_norm.py [--only op,op]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ab_dir=${AB_DIR:-_ab/kernel_src}
out=$(mkdir -p "${OUT:-gpu-out}" && cd "${OUT:-gpu-out}" && pwd)
[ "$#" -ge 1 ] || { echo "usage: $0 BENCHMARK.py [benchmark args...]" >&2; exit 2; }
[ -d "$ab_dir" ] || { echo "$ab_dir: no such directory (see the header of $0)" >&2; exit 2; }
bench=$1
shift
if ls .wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps .wheels/*.whl 2>&1 | grep -v -i warning
fi
b_tree=$(mktemp -d)
trap 'rm -rf "$b_tree"' EXIT
tar -c --exclude=./kernel_src --exclude=./build --exclude=./_build --exclude=./_ab . | tar -x -C "$b_tree"
cp -r "$ab_dir" "$b_tree/kernel_src"
mkdir -p "$out/A" "$out/B"
jobs=$(( $(nproc) / 2 > 1 ? $(nproc) / 2 : 1 ))
python3 -m ltx_build build -j "$jobs" --allow-newer-glibc >"$out/A/build.log" 2>&1 &
a_pid=$!
(cd "$b_tree" && python3 -m ltx_build build -j "$jobs" --allow-newer-glibc) >"$out/B/build.log" 2>&1
b_rc=$?
wait "$a_pid"
a_rc=$?
[ "$a_rc" -eq 0 ] && [ "$b_rc" -eq 0 ] || { echo "build failed: A rc=$a_rc, B rc=$b_rc (see build.log)" >&2; exit 1; }
python3 "$bench" --out "$out/A" "$@" 2>&1 | tee "$out/A/bench.log"
(cd "$b_tree" && python3 "$bench" --out "$out/B" "$@") 2>&1 | tee "$out/B/bench.log"
