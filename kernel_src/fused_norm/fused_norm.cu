// Fused residual + RMSNorm + modulation: path choice and dispatch onto the
// variant launchers (kernels in fused_norm.cuh, instantiated per variant in
// one .cu per op; launch choices in fused_norm_config.h).
#include "fused_norm.cuh"

namespace ltx {
namespace {

// A row operand can be read as 16-byte words of its dtype.
bool vector_ok(const void* ptr, int64_t batch_stride, int64_t seq_stride, DType dt) {
  if (ptr == nullptr) return true;
  const int64_t n = 16 / dtype_size(dt);
  return is_aligned16(ptr) && batch_stride % n == 0 && seq_stride % n == 0;
}
bool vector_ok(const RowIn& t, DType dt) { return vector_ok(t.ptr, t.batch_stride, t.seq_stride, dt); }
bool vector_ok(const RowOut& t, DType dt) { return vector_ok(t.ptr, t.batch_stride, t.seq_stride, dt); }

}  // namespace

namespace fused {

// Rows that follow each other in memory (the flat kernel indexes words).
template <typename Row> static bool contiguous_rows(const Row& t, const FusedNormArgs& a) {
  return t.seq_stride == a.hidden && (a.batch == 1 || t.batch_stride == a.seq * a.hidden);
}

int flat_residual_words(const FusedNormArgs& a) {
  return fused_norm_config::flat_words(contiguous_rows(a.x, a) && contiguous_rows(a.y, a) &&
                                       contiguous_rows(a.residual_out, a));
}

Variant variant_of(const FusedNormArgs& a) {
  switch (a.modulation) {
    case Modulation::kScaleFloat: return Variant::kModulatedRmsnorm;
    case Modulation::kTanhGatedBase: return Variant::kResidualTanhGatedRmsnorm;
    case Modulation::kScaleShift: return a.second == SecondStream::kSummand ? Variant::kGatedResidualRmsnorm : Variant::kAdalnRmsnorm;
    default: return a.out.ptr == nullptr ? Variant::kGatedResidual : Variant::kRmsnormResidual;
  }
}

}  // namespace fused

FusedNormPath fused_norm_path(const FusedNormArgs& a) {
  const int64_t n = 16 / dtype_size(a.dtype);
  const bool ok = a.hidden % n == 0 && a.hidden / n <= int64_t(fused::kMaxTpr) * fused::kMaxVpt &&
                  vector_ok(a.out, a.dtype) && vector_ok(a.residual_out, a.dtype) && vector_ok(a.x, a.dtype) &&
                  vector_ok(a.y, a.dtype) && vector_ok(a.weight, a.dtype) && vector_ok(a.gate, a.mod_dtype) &&
                  vector_ok(a.scale, a.mod_dtype) && vector_ok(a.shift, a.mod_dtype);
  return ok ? FusedNormPath::kVectorized : FusedNormPath::kScalarFallback;
}

cudaError_t fused_norm(const FusedNormArgs& a, cudaStream_t stream) {
  using fused::Variant;
  if (a.batch == 0 || a.seq == 0 || a.hidden == 0) return cudaSuccess;
  if (a.mod_dtype != a.dtype && a.mod_dtype != DType::kFloat32) return cudaErrorInvalidValue;
  if (a.batch * a.seq >= (int64_t(1) << 31)) return cudaErrorInvalidValue;  // 32-bit row counters
  // mean = sum * (1 / n), the factor PyTorch's mean reduction multiplies by.
  const float inv_hidden = 1.f / float(a.hidden);
  switch (fused::variant_of(a)) {
    case Variant::kAdalnRmsnorm: return fused::launch_variant<Variant::kAdalnRmsnorm>(a, inv_hidden, stream);
    case Variant::kGatedResidualRmsnorm: return fused::launch_variant<Variant::kGatedResidualRmsnorm>(a, inv_hidden, stream);
    case Variant::kRmsnormResidual: return fused::launch_variant<Variant::kRmsnormResidual>(a, inv_hidden, stream);
    case Variant::kGatedResidual: return fused::launch_variant<Variant::kGatedResidual>(a, inv_hidden, stream);
    case Variant::kResidualTanhGatedRmsnorm: return fused::launch_variant<Variant::kResidualTanhGatedRmsnorm>(a, inv_hidden, stream);
    case Variant::kModulatedRmsnorm: return fused::launch_variant<Variant::kModulatedRmsnorm>(a, inv_hidden, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ltx
