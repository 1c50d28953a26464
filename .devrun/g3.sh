set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps .wheels/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD/tools:$PWD/integrations/diffusers:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
python3 -m ltx_build build -j 16 --allow-newer-glibc > $OUT/build.log 2>&1 || { tail -50 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
timeout 240 python3 -m pytest -q -p no:cacheprovider -x tests/test_layernorm_gpu.py tests/test_backward_gpu.py -k "layernorm" 2>&1 | tail -6
echo "tests $(( $(date +%s) - t0 )) s"
OPS="layernorm_backward,adaln_layernorm_backward,gated_residual_layernorm_backward,layernorm_backward_(rows_only),adaln_layernorm_backward_(rows_only),gated_residual_layernorm_backward_(rows_only)"
timeout 230 python3 -m benchmarks.bench_layernorm --out $OUT/rel --commit WORKTREE --only "$OPS" 2>&1 | grep -v "^\s*$" | grep "backward" | sed 's/  */ /g' | cut -c1-120
echo "all $(( $(date +%s) - t0 )) s"
