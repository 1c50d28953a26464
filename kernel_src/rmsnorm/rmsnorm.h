// RMSNorm over the last dimension: host-side launch interface.
// Plain pointers, sizes and a stream; argument checking is the caller's job
// (torch-ext/rmsnorm_binding.cpp), this header only describes the contract.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

#include "../common/dtype.h"

namespace ltx {

struct RmsnormArgs {
  void* out = nullptr;           // [rows, hidden], row stride out_row_stride
  const void* input = nullptr;   // [rows, hidden], row stride input_row_stride
  const void* weight = nullptr;  // [hidden] contiguous, or nullptr for no weight
  int64_t rows = 0;
  int64_t hidden = 0;
  int64_t input_row_stride = 0;  // in elements; the last dim is contiguous
  int64_t out_row_stride = 0;    // in elements
  DType input_dtype = DType::kBFloat16;
  DType weight_dtype = DType::kBFloat16;  // input_dtype or kFloat32
  DType out_dtype = DType::kBFloat16;     // input_dtype or kFloat32
  float eps = 1e-6f;
  // false: y = T(x * r * w), one rounding (torch.nn.RMSNorm, behaviour "B").
  // true:  y = T(T(x * r) * w), the normalised value is rounded to the input
  //        dtype before the weight multiply (diffusers RMSNorm with a
  //        half-precision weight, behaviour "A"). No effect without weight.
  bool round_before_weight = false;
};

// Which kernel a call takes (exposed for tests and benchmarks).
enum class RmsnormPath : int { kVectorized = 0, kScalarFallback = 1 };
RmsnormPath rmsnorm_path(const RmsnormArgs& a);

// Enqueue the kernel on `stream`. rows == 0 or hidden == 0 enqueues nothing.
// Returns the launch status (cudaErrorInvalidValue for an unsupported dtype
// combination).
cudaError_t rmsnorm(const RmsnormArgs& a, cudaStream_t stream);

}  // namespace ltx
