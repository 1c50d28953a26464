// Torch-facing entry points of the RoPE kernels (kernel_src/rope.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

// out = x rotated by interleaved pairs with float32 cos/sin tables; x, out
// [B, S, D]; cos, sin [B or 1, S, D]. out may be x.
void rotary_interleaved(at::Tensor& out, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// 0 vectorized, 1 scalar fallback, for the tests.
int64_t rope_path(const at::Tensor& out, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

void register_rope_ops(torch::Library& ops);
