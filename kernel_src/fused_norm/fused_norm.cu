// Fused residual + RMSNorm + modulation: path choice and dispatch onto the
// variant launchers (kernels in fused_norm.cuh, instantiated per variant in
// fused_norm_modulate.cu, fused_norm_residual.cu and fused_norm_mochi.cu).
#include <cstdlib>

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

// LTX_KERNELS_FUSED_TPR (a power of two 32..512 leaving <= kMaxVpt words
// per thread, or 192 / 384 leaving <= 2) overrides the choice for
// experiments; read per call.
// Row widths (16-byte words) between powers of two that get an exact number
// of words per thread.
static int exact_width(int64_t n) { return matching_width<192, 384>(n); }

int fused_threads_per_row(int64_t nvec, Variant v, bool exact, bool high_bandwidth) {
  const char* env = std::getenv("LTX_KERNELS_FUSED_TPR");
  const int forced = env ? std::atoi(env) : 0;
  if (forced >= kMinTpr && forced <= kMaxTpr && (forced & (forced - 1)) == 0 && nvec <= int64_t(forced) * kMaxVpt)
    return forced;
  if (forced > 0 && exact_width(forced) == forced && nvec <= int64_t(forced) * 2) return forced;
  // The variants that read two rows and normalise hold one word of each
  // stream per thread, like rms_norm.cu: at two words per thread they need
  // 80-125 registers (1-3 blocks per SM) and the two-output ones were 7-10%
  // slower at [2, 8160, 2048] on the H200. Except on the H100 for rows of
  // >= 512 words (hidden 4096 in bf16): there rmsnorm_residual and the fast
  // seam are 6-8% faster at two ([2,2688,4096] 64.95 -> 60.91 us, fast seam
  // 69.49 -> 64.12; the exact seam 62.98 vs 63.84). The others take two words
  // of a row per thread: they are issue-bound, and a row costs ~190
  // instructions per thread besides the per-element work (reduction,
  // addressing). Sweeps: docs/perf-notes.md. Rows of 384 words (hidden 3072
  // in bf16/fp16) take 384 or 192 threads, so that every thread holds the
  // same number of words.
  const bool wide_rows_h100 = !high_bandwidth && nvec >= 512 &&
                              (v == Variant::kRmsnormResidual || (v == Variant::kGatedResidualRmsnorm && !exact));
  const int64_t words_per_thread = reads_y(v) && normalises(v) && !wide_rows_h100 ? 1 : 2;
  if (nvec % words_per_thread == 0)
    if (const int tpr = exact_width(nvec / words_per_thread)) return tpr;
  return pow2_threads_per_row(nvec / words_per_thread, kMinTpr, kMaxTpr);
}

// Rows that follow each other in memory (the flat kernel indexes words).
template <typename Row> static bool contiguous_rows(const Row& t, const FusedNormArgs& a) {
  return t.seq_stride == a.hidden && (a.batch == 1 || t.batch_stride == a.seq * a.hidden);
}

int flat_residual_words(const FusedNormArgs& a) {
  // LTX_KERNELS_RESIDUAL_FLAT (experiments): words per thread 1, 2 or 4; 0 = the row kernel.
  const char* env = std::getenv("LTX_KERNELS_RESIDUAL_FLAT");
  const int u = env ? std::atoi(env) : 1;
  const bool flat = contiguous_rows(a.x, a) && contiguous_rows(a.y, a) && contiguous_rows(a.residual_out, a);
  return flat && (u == 1 || u == 2 || u == 4) ? u : 0;
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
