// Torch-facing entry points of the 1-D / 3-D RoPE kernels (kernel_src/rope_axes.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

// Rotate query and key ([batch, frames*height*width, heads, head_dim]) in place
// by their (frame, row, column) positions; head dim split as Wan splits it.
void rope_3d(at::Tensor& query, at::Tensor& key, int64_t num_frames, int64_t height, int64_t width,
             double theta_base);

// Rotate query and key ([batch, seq, heads, head_dim]) in place by token index.
void rope_1d(at::Tensor& query, at::Tensor& key, double theta_base);

// 0 vectorized, 1 scalar fallback (validates like rope_1d), for the tests.
int64_t rope_axes_path(const at::Tensor& query, const at::Tensor& key);

void register_rope_axes_ops(torch::Library& ops);
