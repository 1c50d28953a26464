// Torch-facing entry points of the fused q/k RMSNorm + RoPE kernel
// (kernel_src/qk_norm_rope.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

// q_out, k_out = RoPE(RMSNorm(q) * q_weight), RoPE(RMSNorm(k) * k_weight) over
// norm groups of head_dim (head_dim == q.size(2): the whole row). q, k, q_out,
// k_out [B, S, D]; weights [head_dim] or None; cos, sin float32
// [B or 1, S, D or head_dim]; rotation 0 interleaved, 1 rotate-half.
// q_out may be q and k_out may be k.
void qk_rms_norm_rope(at::Tensor& q_out, at::Tensor& k_out, const at::Tensor& q, const at::Tensor& k,
                      const c10::optional<at::Tensor>& q_weight, const c10::optional<at::Tensor>& k_weight,
                      const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim, double eps, int64_t rotation,
                      bool round_before_weight, bool exact);

// 0 vectorized, 1 scalar fallback, for the tests.
int64_t qk_norm_rope_path(const at::Tensor& q_out, const at::Tensor& k_out, const at::Tensor& q, const at::Tensor& k,
                          const c10::optional<at::Tensor>& q_weight, const c10::optional<at::Tensor>& k_weight,
                          const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim, int64_t rotation);

void register_qk_norm_rope_ops(torch::Library& ops);
