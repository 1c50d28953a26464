// Elementwise ops: host-side launch interface. Plain pointers, sizes, strides
// and a stream; argument checking is the caller's job
// (torch-ext/vae_binding.cpp), this header only describes the contract.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

#include "../common/dtype.h"

namespace ltx {

constexpr int kMaxElementwiseDims = 8;

// x += y in place, y broadcast to x's shape: y_strides are y's strides
// expanded to x's shape (0 along broadcast dims). x must not overlap itself
// (no stride-0 dim of size > 1) and y must not partially overlap x (y may be
// x itself). Each element is computed as T_x(float(x) + float(y)), one
// rounding, as torch's add_ computes it.
struct InplaceAddArgs {
  void* x = nullptr;
  const void* y = nullptr;
  int ndim = 0;  // <= kMaxElementwiseDims
  int64_t sizes[kMaxElementwiseDims] = {};
  int64_t x_strides[kMaxElementwiseDims] = {};  // in elements of x
  int64_t y_strides[kMaxElementwiseDims] = {};  // in elements of y
  DType x_dtype = DType::kBFloat16;
  DType y_dtype = DType::kBFloat16;  // x_dtype or kFloat32
};

// Which kernel a call takes (exposed for tests and benchmarks):
//   kContiguous: x and y same-shape contiguous, 16-byte words (any numel);
//   kVectorizedBroadcast: x contiguous, y broadcast, 16-byte words of x with
//     one y offset per word (the innermost merged dim a multiple of a word);
//   kStrided: scalar accesses at any strides.
enum class InplaceAddPath : int { kContiguous = 0, kVectorizedBroadcast = 1, kStrided = 2 };
InplaceAddPath inplace_add_path(const InplaceAddArgs& a);

// Enqueue the kernel on `stream`. Zero elements enqueue nothing. Returns the
// launch status (cudaErrorInvalidValue for an unsupported dtype pair or
// ndim out of range).
cudaError_t inplace_add(const InplaceAddArgs& a, cudaStream_t stream);

}  // namespace ltx
