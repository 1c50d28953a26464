// Rotary position embedding over position axes, rotating query and key in
// place: host-side launch interface. Plain pointers, sizes, strides and a
// stream; argument checking is the caller's job (torch-ext/rope_axes_binding.cpp).
//
// Tokens s of a [frames, height, width] grid (f-major, as video DiTs pack
// latents) sit at f = s / (height*width), h = (s / width) % height,
// w = s % width; 1-D RoPE is the grid [seq, 1, 1]. The head dim is split in
// consecutive parts (time, height, width) of `split[a]` channels (even). In
// part a (size d), pair j (channels 2j, 2j+1 of the part) turns by
// pos_a * theta_base^(-2j/d):
//
//   out[2j]   = x[2j]   * cos - x[2j+1] * sin
//   out[2j+1] = x[2j+1] * cos + x[2j]   * sin
//
// in float32, one rounding to the tensor's dtype. The backward (inverse) turns
// dy by -angle with the same roundings: dx[2j] = dy[2j] * cos + dy[2j+1] * sin,
// dx[2j+1] = dy[2j+1] * cos - dy[2j] * sin. The angles are computed in
// the kernel (no tables in memory): the frequencies are formed on the host in
// at least float64 and passed as two float32 parts, the angle pos*freq is kept
// to about 2^-46 relative and sincosf of its float32 part gets a second-order
// correction for the remainder (angles >= 2^17 take a float64 sincos), so cos
// and sin are within a few float32 ulps of the exact values.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

#include "../common/dtype.h"

namespace ltx {

// head_dim <= 2 * kRopeAxesMaxPairs (the frequency table is a kernel argument).
constexpr int kRopeAxesMaxPairs = 256;
// Positions are exact in float32 below this bound: frames, height, width (and
// seq for 1-D) must not exceed it.
constexpr int64_t kRopeAxesMaxPosition = int64_t(1) << 24;

// A [batch, seq, heads, head_dim] tensor with a contiguous last dim; strides in
// elements. It must not overlap itself or the other operand.
struct RopeAxesOperand {
  void* ptr = nullptr;
  int64_t heads = 0;
  int64_t batch_stride = 0, seq_stride = 0, head_stride = 0;
};

// Out of place (the functional op autograd uses): the tensor an operand is read
// from, of its shape, with its own strides (0 allowed); the operand is written.
struct RopeAxesSource {
  const void* ptr = nullptr;  // nullptr: in place
  int64_t batch_stride = 0, seq_stride = 0, head_stride = 0;
};

struct RopeAxesArgs {
  RopeAxesOperand query, key;  // same dtype, batch, seq, head_dim; heads may differ
  int64_t batch = 0, seq = 0, head_dim = 0;
  int64_t frames = 0, height = 1, width = 1;  // frames * height * width == seq
  int64_t split[3] = {0, 0, 0};               // channels per axis, even, summing to head_dim
  double theta_base = 10000.0;
  DType dtype = DType::kBFloat16;
  RopeAxesSource query_src, key_src;  // both set, or neither (in place)
  // The backward: turn by -angle (sin negated, exactly), the transpose of the rotation.
  bool inverse = false;
};

// 16-byte words when head_dim, both pointers and every stride of a dim of size
// > 1 are whole words; a pair-at-a-time scalar kernel otherwise.
enum class RopeAxesPath : int { kVectorized = 0, kScalarFallback = 1 };
RopeAxesPath rope_axes_path(const RopeAxesArgs& a);

// Enqueue on `stream`. Nothing is enqueued for zero elements. Returns
// cudaErrorInvalidValue for arguments outside the contract above.
cudaError_t rope_axes(const RopeAxesArgs& a, cudaStream_t stream);

}  // namespace ltx
