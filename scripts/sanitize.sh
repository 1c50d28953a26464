#!/usr/bin/env bash
# Every op under compute-sanitizer's memcheck, racecheck, initcheck and synccheck
# (issue 7, item 1): every dtype, the vectorised and fallback paths, small and
# medium shapes, one LTX-sized shape and a few random layouts per op
# (scripts/sanitize_ops.py), then a table of report counts per tool and per op.
#
#   usage: bash scripts/sanitize.sh [--quick] [memcheck|racecheck|initcheck|synccheck ...]
#   logs and summary.md in $OUT/sanitize (default gpu-out/sanitize); exit 0 only when clean.
#   COMPUTE_SANITIZER=/path/to/compute-sanitizer overrides the lookup;
#   LTX_SANITIZE_TIMEOUT (seconds per tool, default 300).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

find_sanitizer() {
  local candidates=("${COMPUTE_SANITIZER:-}" "$(command -v compute-sanitizer 2>/dev/null)")
  [ -n "${CUDA_HOME:-}" ] && candidates+=("$CUDA_HOME/bin/compute-sanitizer")
  candidates+=(/usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer)
  for c in "${candidates[@]}"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}

san=$(find_sanitizer) || { echo "compute-sanitizer not found; set COMPUTE_SANITIZER" >&2; exit 2; }
quick=()
tools=()
for arg in "$@"; do
  case "$arg" in
    --quick) quick=(--quick) ;;
    memcheck|racecheck|initcheck|synccheck) tools+=("$arg") ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done
[ ${#tools[@]} -gt 0 ] || tools=(memcheck racecheck initcheck synccheck)
out=${OUT:-gpu-out}/sanitize
mkdir -p "$out"
limit=${LTX_SANITIZE_TIMEOUT:-300}

export PYTHONUNBUFFERED=1
# One cudaMalloc per tensor: an access past a tensor's end leaves its allocation
# (memcheck sees it), and memory around a view is never initialised (initcheck
# sees reads of it). Without this the caching allocator hides both.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1

echo "compute-sanitizer: $san"
"$san" --version | tee "$out/version.txt"
logs=()
for tool in "${tools[@]}"; do
  start=$(date +%s)
  timeout "$limit" "$san" --tool "$tool" --print-limit 100000 \
    python3 scripts/sanitize_ops.py run --tool "$tool" "${quick[@]}" >"$out/$tool.log" 2>&1
  rc=$?
  echo "$tool: exit $rc after $(($(date +%s) - start)) s (log: $out/$tool.log)"
  logs+=("$out/$tool.log")
done
python3 scripts/sanitize_ops.py summarize "${logs[@]}" --markdown "$out/summary.md"
