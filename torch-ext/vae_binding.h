// Torch-facing entry points of the VAE ops (pixel norm, in-place add):
// argument validation and dispatch onto the launchers in kernel_src/.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

// RMS over dim `dim` of x (the channels of [B, C, ...]) into `out` (x's
// shape and dtype, contiguous). original=false: diffusers RMSNorm via
// movedim, fp32 then one rounding; original=true: the eager roundings of
// LTX's PixelNorm. A non-contiguous x is copied once.
void pixel_norm(at::Tensor& out, const at::Tensor& x, int64_t dim, double eps, bool original);

// Which kernel path a pixel_norm call with these arguments takes: 0
// vectorized, 1 scalar fallback. Validates like pixel_norm; launches nothing.
int64_t pixel_norm_path(const at::Tensor& out, const at::Tensor& x, int64_t dim);

// x += y, y broadcast to x's shape (x never is), y of x's dtype or float32;
// one rounding into x.
void inplace_add(at::Tensor& x, const at::Tensor& y);

// Which kernel path an inplace_add call takes: 0 contiguous, 1 vectorized
// broadcast, 2 strided. Validates like inplace_add; launches nothing.
int64_t inplace_add_path(const at::Tensor& x, const at::Tensor& y);

// Defines the schemas above and registers them for CUDA and CPU (CPU tensors
// get the validation error that names the argument). Call it from the
// extension's TORCH_LIBRARY block.
void register_vae_ops(torch::Library& ops);
