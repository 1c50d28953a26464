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

// Enqueue the kernel on `stream`. A zero-size problem enqueues nothing.
// Returns the launch status (cudaErrorInvalidValue for an unknown dtype).
cudaError_t pixel_norm(const PixelNormArgs& a, cudaStream_t stream);

}  // namespace ltx
