// Torch-facing entry points of the activations (kernel_src/activation.h):
// argument validation and dispatch.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

// out = act(x), elementwise. activation: 0 GELU-tanh, 1 GELU (erf), 2 SiLU.
void activation(at::Tensor& out, const at::Tensor& x, int64_t activation);

// out[..., :H] = act(x[..., half a]) * x[..., half b] for x [..., 2H]; act_first
// selects which half the activation applies to.
void gated_activation(at::Tensor& out, const at::Tensor& x, int64_t activation, bool act_first);

// 0 vectorized, 1 scalar fallback, for the tests.
int64_t activation_path(const at::Tensor& out, const at::Tensor& x, bool gated);

void register_activation_ops(torch::Library& ops);
