set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps .wheels/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD/tools:$PWD/integrations/diffusers:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
python3 -m ltx_build build --dev -j 16 --allow-newer-glibc > $OUT/build.log 2>&1 || { tail -50 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
OPS="adaln_layernorm_backward,adaln_layernorm_backward_(rows_only),gated_residual_layernorm_backward,gated_residual_layernorm_backward_(rows_only),layernorm_backward,layernorm_backward_(rows_only)"
python3 -m benchmarks.bench_layernorm --dev-build --out $OUT/wan --rounds 2 --impl ltx_kernels --only "$OPS" --shape 2,32760,1536 --shape 2,2688,2048 --tuning layernorm.bwd_affine_words=0 --sweep-tuning layernorm.bwd_stages=1,2 2>&1 | grep -v "^\s*$" | tail -60
echo "bench done $(( $(date +%s) - t0 )) s"
timeout 200 python3 -m pytest --dev-build -q -p no:cacheprovider tests/test_layernorm_gpu.py -k "every_backward_block_width" 2>&1 | tail -15
echo "all $(( $(date +%s) - t0 )) s"
