// Torch-facing entry points: argument validation and dispatch onto the
// launchers in kernel_src/.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

// RMSNorm, one rounding at the end (torch.nn.RMSNorm, behaviour "B").
void rms_norm(at::Tensor& out, const at::Tensor& input, const std::optional<at::Tensor>& weight, double eps);

// RMSNorm that rounds the normalised value to the input dtype before a
// half-precision weight multiply (diffusers RMSNorm, behaviour "A").
void rms_norm_diffusers(at::Tensor& out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
                        double eps);

// Which kernel path a call with these arguments takes: 0 vectorized,
// 1 scalar fallback. Validates like rms_norm; launches nothing.
int64_t rms_norm_path(const at::Tensor& out, const at::Tensor& input, const std::optional<at::Tensor>& weight);
