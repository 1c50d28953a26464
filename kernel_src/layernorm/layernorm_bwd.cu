// LayerNorm family backward: path choice and dispatch onto the op launchers
// (kernels in layernorm_bwd.cuh, instantiated per op in one .cu each). Instantiates
// plain layernorm's.
#include "layernorm_bwd.cuh"

namespace ltx {
namespace ln {
LTX_LAYERNORM_BWD_INSTANTIATE(Variant::kLayerNorm)
}  // namespace ln

int64_t layernorm_bwd_blocks(const LayerNormBwdArgs& a) {
  const ln::RowSplit sp = ln::row_split(a, true);
  return sp.groups * sp.blocks_per_group;
}

LayerNormPath layernorm_bwd_path(const LayerNormBwdArgs& a) {
  const int t = dtype_size(a.dtype), m = dtype_size(a.mod_dtype);
  const int64_t n = 16 / t;
  auto rows_ok = [&](const ModGrad& g) { return g.kind != ModGradKind::kPerRow || ln::vector_ok(g.rows, m); };
  const bool ok = a.hidden % n == 0 &&
                  a.hidden / n <= int64_t(layernorm_config::kBwdThreads) * layernorm_config::kBwdMaxWordsPerThread &&
                  ln::vector_ok(a.grad_x, t) && ln::vector_ok(a.grad_y, t) && ln::vector_ok(a.grad_out, t) &&
                  ln::vector_ok(a.grad_h, t) && ln::vector_ok(a.h, t) && ln::vector_ok(a.y, t) &&
                  ln::vector_ok(a.gate, m) && ln::vector_ok(a.scale, m) &&
                  ln::vector_ok(a.weight, a.weight_f32 ? 4 : t) && ln::vector_ok(a.bias, a.bias_f32 ? 4 : t) &&
                  rows_ok(a.grad_gate) && rows_ok(a.grad_scale) && rows_ok(a.grad_shift);
  return ok ? LayerNormPath::kVectorized : LayerNormPath::kScalarFallback;
}

cudaError_t layernorm_bwd(const LayerNormBwdArgs& a, cudaStream_t stream) {
  using ln::Variant;
  if (a.batch == 0 || a.seq == 0 || a.hidden == 0) return cudaSuccess;
  if (a.mod_dtype != a.dtype && a.mod_dtype != DType::kFloat32) return cudaErrorInvalidValue;
  if (a.batch * a.seq >= (int64_t(1) << 31)) return cudaErrorInvalidValue;  // 32-bit (b, s) indices
  const bool some_per_batch = a.grad_gate.kind == ModGradKind::kPerBatch ||
                              a.grad_scale.kind == ModGradKind::kPerBatch ||
                              a.grad_shift.kind == ModGradKind::kPerBatch;
  if (some_per_batch && !a.per_batch_split) return cudaErrorInvalidValue;  // a batch's rows span blocks
  if (a.per_batch_split && a.batch > 65535) return cudaErrorInvalidValue;  // column_sum's groups: grid y
  if (a.y.ptr != nullptr || a.grad_y.ptr != nullptr || a.grad_h.ptr != nullptr || a.gate.ptr != nullptr)
    return ln::launch_bwd_variant<Variant::kGatedResidualLayerNorm>(a, stream);
  if (a.scale.ptr != nullptr) return ln::launch_bwd_variant<Variant::kAdalnLayerNorm>(a, stream);
  return ln::launch_bwd_variant<Variant::kLayerNorm>(a, stream);
}

}  // namespace ltx
