// Pixel norm (RMS over the channel dim of [outer, C, S]): host-side launch
// interface. Plain pointers, sizes and a stream; argument checking is the
// caller's job (torch-ext/vae_binding.cpp), this header only describes the
// contract.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

#include "../common/dtype.h"

namespace ltx {

struct PixelNormArgs {
  void* out = nullptr;          // [outer, channels, spatial], contiguous
  const void* input = nullptr;  // [outer, channels, spatial], contiguous
  int64_t outer = 0;            // product of the dims before the channel dim
  int64_t channels = 0;         // C: the reduced dim, stride `spatial`
  int64_t spatial = 0;          // product of the dims after the channel dim
  DType dtype = DType::kBFloat16;  // input and output
  float eps = 1e-8f;
  // false: y = T(x * rsqrt(mean(x^2) + eps)), all in fp32 (diffusers RMSNorm
  //        via movedim).
  // true:  the eager roundings of LTX's PixelNorm, x / sqrt(mean(x**2) + eps)
  //        in the input dtype: sq = T(x*x), m = T(mean(sq)), d = T(sqrt(T(m + eps))),
  //        y = T(x / d).
  bool original = false;
};

// Which kernel a call takes (exposed for tests and benchmarks).
enum class PixelNormPath : int { kVectorized = 0, kScalarFallback = 1 };
PixelNormPath pixel_norm_path(const PixelNormArgs& a);

// Block shape of the vectorized path: `pos_words` 16-byte words of positions
// x `groups` channel groups, each thread holding `words_per_thread` channels
// of its position word in registers. Zeroes when the vectorized path is not
// taken. `sms` is the SM count (small problems get narrower blocks).
struct PixelNormPlan {
  int pos_words = 0;
  int groups = 0;
  int words_per_thread = 0;
};
PixelNormPlan pixel_norm_plan(const PixelNormArgs& a, int sms);

// Enqueue the kernel on `stream`. A zero-size problem enqueues nothing.
// Returns the launch status (cudaErrorInvalidValue for an unknown dtype).
cudaError_t pixel_norm(const PixelNormArgs& a, cudaStream_t stream);

}  // namespace ltx
