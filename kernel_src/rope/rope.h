// Rotary position embedding on interleaved pairs (LTX-Video, diffusers'
// `apply_rotary_emb`): host-side launch interface.
//
//   out[2i]   = T(x[2i]   * cos[2i]   - x[2i+1] * sin[2i])
//   out[2i+1] = T(x[2i+1] * cos[2i+1] + x[2i]   * sin[2i+1])
//
// computed as eager PyTorch does, `(x.float() * cos + x_rotated.float() * sin)
// .to(x.dtype)`: two float32 products, a float32 sum, one cast (no FMA).
//
// Backward (transpose = true, x = dy, out = dx): the transpose of each pair's
// matrix [[cos[2i], -sin[2i]], [sin[2i+1], cos[2i+1]]], i.e. the rotation by
// -theta of dy for tables repeated over the pair (as LTX-Video builds them):
//
//   dx[2i]   = T(dy[2i]   * cos[2i]   + dy[2i+1] * sin[2i+1])
//   dx[2i+1] = T(dy[2i+1] * cos[2i+1] - dy[2i]   * sin[2i])
//
// float32 products and sum, one cast (eager autograd rounds each of its two
// partial grads to T before adding them: within one ulp of T of this).
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

#include "../common/dtype.h"

namespace ltx {

// A [batch, seq, dim] operand with a contiguous last dim; a zero stride
// broadcasts (tables shared by every sample have batch_stride 0).
struct RopeOperand {
  const void* ptr = nullptr;
  int64_t batch_stride = 0, seq_stride = 0;
};

struct RopeArgs {
  void* out = nullptr;
  int64_t out_batch_stride = 0, out_seq_stride = 0;
  RopeOperand x;         // dtype
  RopeOperand cos, sin;  // float32
  int64_t batch = 0, seq = 0, dim = 0;  // dim even
  DType dtype = DType::kBFloat16;
  bool transpose = false;  // the backward: the transposed rotation (above)
};

enum class RopePath : int { kVectorized = 0, kScalarFallback = 1 };
RopePath rope_path(const RopeArgs& a);

// Enqueue on `stream`; out may be x itself (each element pair is read before
// it is written, by the same thread).
cudaError_t apply_rotary_emb(const RopeArgs& a, cudaStream_t stream);

}  // namespace ltx
