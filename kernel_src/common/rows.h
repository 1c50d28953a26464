// Row operands of the row-wise ops (fused_norm, layernorm), shared by the
// CUDA sources and the torch bindings: plain pointers and strides, no torch
// or CUDA headers.
#pragma once

#include <cstdint>

namespace ltx {

// A [batch, seq, hidden] operand with a contiguous last dim: element (b, s, c)
// is at ptr[b * batch_stride + s * seq_stride + c], strides in elements; a
// zero stride broadcasts (per-batch modulation is seq_stride == 0, a [hidden]
// vector has both zero).
struct RowIn {
  const void* ptr = nullptr;
  int64_t batch_stride = 0;
  int64_t seq_stride = 0;
};

struct RowOut {
  void* ptr = nullptr;
  int64_t batch_stride = 0;
  int64_t seq_stride = 0;
};

}  // namespace ltx
