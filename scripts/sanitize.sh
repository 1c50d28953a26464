#!/usr/bin/env bash
# Every op under compute-sanitizer's memcheck, racecheck, initcheck and synccheck
# (issue 7, item 1): every dtype, the vectorised and fallback paths, small and
# medium shapes, one LTX-sized shape and a few random layouts per op
# (scripts/sanitize_ops.py), then a table of report counts per tool and per op.
#
#   usage: bash scripts/sanitize.sh [--quick] [--parallel] [memcheck|racecheck|initcheck|synccheck ...]
#   --parallel runs the tools at once, spread round-robin over the visible GPUs.
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
parallel=0
tools=()
for arg in "$@"; do
  case "$arg" in
    --quick) quick=(--quick) ;;
    --parallel) parallel=1 ;;
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
run_tool() {  # tool, GPU index or "" for the current visibility, [control]
  local tool=$1 gpu=$2 what=${3:-run} start rc log args
  local pin=()
  [ -n "$gpu" ] && pin=(env "CUDA_VISIBLE_DEVICES=$gpu")
  start=$(date +%s)
  log=$out/$tool.log
  args=(run --tool "$tool" "${quick[@]}")
  if [ "$what" = control ]; then
    log=$out/control-$tool.log
    args=(control --tool "$tool")
  fi
  "${pin[@]}" timeout "$limit" "$san" --tool "$tool" --print-limit 100000 \
    python3 scripts/sanitize_ops.py "${args[@]}" >"$log" 2>&1
  rc=$?
  echo "$tool${3:+ $3}: exit $rc after $(($(date +%s) - start)) s${gpu:+ on GPU $gpu} (log: $log)"
}
# The control runs linear_gelu's GEMMs in plain PyTorch under the tools that report
# inside cuBLAS (racecheck) and on reads of its output (initcheck).
jobs=()
for tool in "${tools[@]}"; do
  jobs+=("$tool run")
  case "$tool" in initcheck|racecheck) jobs+=("$tool control") ;; esac
done
logs=()
for job in "${jobs[@]}"; do
  set -- $job
  if [ "$2" = control ]; then logs+=("$out/control-$1.log"); else logs+=("$out/$1.log"); fi
done
if [ "$parallel" = 1 ]; then
  ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$ngpu" -ge 1 ] || ngpu=1
  i=0
  for job in "${jobs[@]}"; do
    set -- $job
    visible=${CUDA_VISIBLE_DEVICES-}
    gpu=$((i % ngpu))
    [ -n "$visible" ] && gpu=$(echo "$visible" | cut -d, -f$((gpu + 1)))
    run_tool "$1" "$gpu" "$2" &
    i=$((i + 1))
  done
  wait
else
  for job in "${jobs[@]}"; do
    set -- $job
    run_tool "$1" "" "$2"
  done
fi
python3 scripts/sanitize_ops.py summarize "${logs[@]}" --markdown "$out/summary.md"
