// Torch-facing entry points of the fused residual / RMSNorm / modulation ops
// (kernel_src/fused_norm.h): argument validation and dispatch. Row tensors
// are [R, D] or [B, S, D]; modulation tensors broadcast from [D], [B, D]
// (per batch), [B, 1, D] or [B, S, D]. `exact` copies the model's eager
// roundings, otherwise one rounding at the end.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>
#include <torch/library.h>

// out = RMSNorm(x) [* weight] * (1 + scale) [+ shift]   (LTX / Flux AdaLN)
void adaln_rms_norm(at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                    const at::Tensor& scale, const std::optional<at::Tensor>& shift, double eps, bool exact);

// residual_out = x + residual; out = RMSNorm(residual_out) [* weight]
// (exact: diffusers rounding of the weight multiply, else torch.nn.RMSNorm).
void rms_norm_residual(at::Tensor& out, at::Tensor& residual_out, const at::Tensor& x, const at::Tensor& residual,
                       const std::optional<at::Tensor>& weight, double eps, bool exact);

// x_out = x + y * gate; out = RMSNorm(x_out) [* weight] * (1 + scale) [+ shift]  (LTX block seam)
void gated_residual_rms_norm(at::Tensor& out, at::Tensor& x_out, const at::Tensor& x, const at::Tensor& y,
                             const std::optional<at::Tensor>& gate, const std::optional<at::Tensor>& weight,
                             const at::Tensor& scale, const std::optional<at::Tensor>& shift, double eps, bool exact);

// out = x + y * gate (out may be x)
void gated_residual(at::Tensor& out, const at::Tensor& x, const at::Tensor& y, const std::optional<at::Tensor>& gate,
                    bool exact);

// out = x + RMSNorm(x_res) * tanh(gate)   (Mochi)
void residual_tanh_gated_rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& x_res,
                                  const at::Tensor& gate, double eps, bool exact);

// out = RMSNorm(x) * (scale_offset + scale), float32 math, one rounding (Mochi:
// offset 1 for modulated_rmsnorm, 0 for MochiModulatedRMSNorm's multiplier)
void modulated_rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& scale, double eps,
                        double scale_offset);

// Which kernel an adaln_rms_norm / gated_residual_rms_norm call with these
// tensors takes: 0 vectorized, 1 scalar fallback (for tests and benchmarks).
int64_t fused_norm_path(const at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& y,
                        const std::optional<at::Tensor>& modulation);

// Defines the schemas and registers them for CUDA and CPU (CPU tensors get
// the validation error that names the argument).
void register_fused_norm_ops(torch::Library& ops);
