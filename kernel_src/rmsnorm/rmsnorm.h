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
  // [rows] float32, or nullptr: the r of each row, saved for the backward
  // (rmsnorm_fwd). One store per row, by the row's first thread.
  float* rstd = nullptr;
};

// Which kernel a call takes (exposed for tests and benchmarks).
enum class RmsnormPath : int { kVectorized = 0, kScalarFallback = 1 };
RmsnormPath rmsnorm_path(const RmsnormArgs& a);

// Enqueue the kernel on `stream`. rows == 0 or hidden == 0 enqueues nothing.
// Returns the launch status (cudaErrorInvalidValue for an unsupported dtype
// combination).
cudaError_t rmsnorm(const RmsnormArgs& a, cudaStream_t stream);

// --- backward (rmsnorm_bwd.cu) ---------------------------------------------
//
// With n = x * r (r the forward's saved rstd) and g = dy * w (dy without weight):
//   dx = r * (g - n * mean(g * n))      over the row, float32 inside
//   dw = sum over rows of dy * n'       n' = n, or T_in(n) with round_before_weight
// round_before_weight (diffusers rounding, half weight of the input's dtype):
// the forward is y = T(T(n) * w); the backward treats both roundings as the
// identity (as eager autograd does for a cast), so dx uses the unrounded n and
// differs from the exact derivative of the rounded function only where the
// rounding is not locally the identity. dw uses T_in(n), the value the forward
// multiplied by w, as eager autograd does: the same products as diffusers'
// backward, summed in float32 instead of rounded per row to the weight dtype.
// Versus eager autograd in bf16 the difference is eager's own per-op
// roundings (g = T(dy * w) and the row terms): ~2^-8 relative per element.
//
// dw is deterministic: block b of the first kernel takes the fixed rows
// [b * rows_per_block, (b + 1) * rows_per_block) in order and writes its
// float32 sum per column to row b of `weight_partials`; a second kernel adds
// the rows of `weight_partials` in a fixed order. No atomics: the same inputs
// give the same bits on any GPU (the block count depends on `rows` alone).
struct RmsnormBwdArgs {
  void* grad_input = nullptr;        // [rows, hidden] contiguous, input_dtype
  float* weight_partials = nullptr;  // [rmsnorm_bwd_blocks(rows), hidden] float32 workspace; nullptr: no dw
  void* grad_weight = nullptr;       // [hidden], weight_dtype; written when weight_partials is given
  const void* grad_out = nullptr;    // [rows, hidden] contiguous, grad_out_dtype
  const void* input = nullptr;       // [rows, hidden] contiguous
  const void* weight = nullptr;      // [hidden] contiguous, or nullptr for no weight
  const float* rstd = nullptr;       // [rows]
  int64_t rows = 0;
  int64_t hidden = 0;
  DType input_dtype = DType::kBFloat16;
  DType weight_dtype = DType::kBFloat16;    // input_dtype or kFloat32
  DType grad_out_dtype = DType::kBFloat16;  // input_dtype or kFloat32 (the forward's output dtype)
  bool round_before_weight = false;         // as in RmsnormArgs
};

// Blocks of the backward's row kernel (the rows of weight_partials) for `rows` rows.
int64_t rmsnorm_bwd_blocks(int64_t rows);
RmsnormPath rmsnorm_bwd_path(const RmsnormBwdArgs& a);

// Enqueue the backward (one kernel, two with dw). rows == 0 or hidden == 0
// enqueues nothing (the caller zeroes grad_weight).
cudaError_t rmsnorm_bwd(const RmsnormBwdArgs& a, cudaStream_t stream);

}  // namespace ltx
