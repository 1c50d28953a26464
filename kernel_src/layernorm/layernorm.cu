// LayerNorm family: path choice and dispatch onto the variant launchers
// (kernels in layernorm.cuh, instantiated per variant in one .cu per op;
// launch choices in layernorm_config.h). Instantiates plain layernorm's.
#include "layernorm.cuh"

namespace ltx {
namespace ln {

Variant variant_of(const LayerNormArgs& a) {
  if (a.y.ptr != nullptr) return Variant::kGatedResidualLayerNorm;
  return a.scale.ptr != nullptr ? Variant::kAdalnLayerNorm : Variant::kLayerNorm;
}

LTX_LAYERNORM_INSTANTIATE(Variant::kLayerNorm)

}  // namespace ln

LayerNormPath layernorm_path(const LayerNormArgs& a) {
  const int t = dtype_size(a.dtype), m = dtype_size(a.mod_dtype);
  const int64_t n = 16 / t;
  using ln::vector_ok;
  const bool ok = a.hidden % n == 0 && a.hidden / n <= int64_t(ln::kMaxTpr) * ln::kMaxVpt &&
                  vector_ok(a.out, t) && vector_ok(a.residual_out, t) && vector_ok(a.x, t) && vector_ok(a.y, t) &&
                  vector_ok(a.weight, a.weight_f32 ? 4 : t) && vector_ok(a.bias, a.bias_f32 ? 4 : t) &&
                  vector_ok(a.gate, m) && vector_ok(a.scale, m) && vector_ok(a.shift, m);
  return ok ? LayerNormPath::kVectorized : LayerNormPath::kScalarFallback;
}

cudaError_t layernorm(const LayerNormArgs& a, cudaStream_t stream) {
  using ln::Variant;
  if (a.batch == 0 || a.seq == 0 || a.hidden == 0) return cudaSuccess;
  if (a.mod_dtype != a.dtype && a.mod_dtype != DType::kFloat32) return cudaErrorInvalidValue;
  if (a.shift.ptr != nullptr && a.scale.ptr == nullptr) return cudaErrorInvalidValue;
  if (a.batch * a.seq >= (int64_t(1) << 31)) return cudaErrorInvalidValue;  // 32-bit row counters
  const float inv_hidden = 1.f / float(a.hidden);
  switch (ln::variant_of(a)) {
    case Variant::kLayerNorm: return ln::launch_variant<Variant::kLayerNorm>(a, inv_hidden, stream);
    case Variant::kAdalnLayerNorm: return ln::launch_variant<Variant::kAdalnLayerNorm>(a, inv_hidden, stream);
    case Variant::kGatedResidualLayerNorm:
      return ln::launch_variant<Variant::kGatedResidualLayerNorm>(a, inv_hidden, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ltx
