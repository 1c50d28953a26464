// Activations of the DiT feed-forward (GELU-tanh, GEGLU, SwiGLU): host-side
// launch interface (plain pointers, sizes, a stream; the caller checks the
// arguments, see torch-ext/activation_binding.cpp).
//
//   plain:  out[i]    = T(act(x[i]))                          over rows * width elements
//   gated:  out[r, c] = T(T(act(x[r, a + c])) * x[r, b + c])  x rows of 2 * width, out rows of width,
//           (a, b) = (0, width) when act_first, else (width, 0)
//
// act(x) is computed in float32 with PyTorch's formulas, and the gated form
// rounds the activation before the product, as eager `F.gelu(a) * b` does.
//
//   head gate: out[r, h * D + d] = T(x[r, h * D + d] * g(logits[r, h]))   x, out rows of H * D, logits rows of H
//           exact:  g(l) = T(scale * T(sigmoid(l)))   (eager `scale * torch.sigmoid(l)`, then the product)
//           else:   g(l) = scale * sigmoid(l)          (float32, one rounding at the end)
//           sigmoid(l) = 1 / (1 + exp(-l)) in float32, PyTorch's formula (UnarySpecialOpsKernel.cu)
//
// Backward (issue 36; activation_bwd.cu): elementwise, recomputed from the saved input alone, in
// float32 with PyTorch's backward formulas and eager autograd's roundings (T(.) rounds to T):
//   plain:  dx = T(dy * act'(x))                                      (F.gelu's GeluBackward)
//   gated:  db = T(dy * T(act(a))),  da = T(T(dy * b) * act'(a))       (MulBackward, then the
//           activation's backward on the rounded T(dy * b)); dx = [da, db] in the input's halves
//   act'(x) (dy * act'(x) in PyTorch's operation order, activation_math.cuh):
//     GELU-tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) beta (1 + 3 kappa x^2),  t = tanh(beta (x + kappa x^3))
//     GELU-erf:  Phi(x) + x exp(-x^2 / 2) / sqrt(2 pi)
//     SiLU:      s (1 + x (1 - s)),  s = 1 / (1 + exp(-x))
//   A fast form takes its function's exact derivative; the gated db multiplies by the fast act(a),
//   the value the forward used.
//   head gate: dx = the forward applied to dy (dx[r, h*D + d] = T(dy * g(logits[r, h])));
//     dlogits[r, h] = sum over the head's D elements of p_d, in a fixed order per path:
//     exact:  T(T(scale * T(sum_d T(dy_d * x_d))) * (1 - s) * s),  s = T(sigmoid(l))  (eager's
//             MulBackward sum_to_size, the scalar product, SigmoidBackward on the saved output)
//     else:   T(scale * s' * sum_d dy_d * x_d)  in float32,  s' = sigmoid'(l) = 1 / (2 + e + 1 / e),
//             e = exp(-l): no cancellation (s * (1 - s) loses 1 - s where s rounds near 1)
//   No reduction crosses rows: each (row, head) sums its own D products, so the grads are
//   deterministic (the same bits for the same inputs).
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

#include "../common/dtype.h"

namespace ltx {

enum class Activation : int {
  kGeluTanh = 0,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   F.gelu(approximate="tanh")
  kGeluErf = 1,   // 0.5 x (1 + erf(x / sqrt(2)))                      F.gelu
  kSilu = 2,      // x / (1 + exp(-x))                                  F.silu
  // Fast forms: the same functions through the hardware exp2 and reciprocal
  // approximations (relative error < 5e-5; not bitwise eager).
  kGeluTanhFast = 3,  // x / (1 + exp(-2 sqrt(2/pi) (x + 0.044715 x^3)))  (= the tanh form)
  kSiluFast = 4,      // x / (1 + exp(-x))
};

struct ActivationArgs {
  void* out = nullptr;          // contiguous [rows, width]
  const void* input = nullptr;  // contiguous [rows, width] (plain) or [rows, 2 * width] (gated)
  int64_t rows = 0, width = 0;
  DType dtype = DType::kBFloat16;  // input and out
  Activation activation = Activation::kGeluTanh;
  bool gated = false;
  bool act_first = true;  // gated: the activation applies to the first half
};

enum class ActivationPath : int { kVectorized = 0, kScalarFallback = 1 };
ActivationPath activation_path(const ActivationArgs& a);

// Enqueue on `stream`; nothing for an empty problem.
cudaError_t activation(const ActivationArgs& a, cudaStream_t stream);

// LTX-2's per-head attention gate (the head gate formula above).
struct HeadGateArgs {
  void* out = nullptr;           // contiguous [rows, heads * head_dim]
  const void* x = nullptr;       // contiguous [rows, heads * head_dim]
  const void* logits = nullptr;  // contiguous [rows, heads]
  int64_t rows = 0, heads = 0, head_dim = 0;
  float scale = 2.f;
  DType dtype = DType::kBFloat16;  // x, logits and out
  bool exact = true;
};

// Vectorized: x and out 16-byte aligned and head_dim whole 16-byte words (so no word straddles two heads).
ActivationPath head_gate_path(const HeadGateArgs& a);
cudaError_t head_gate(const HeadGateArgs& a, cudaStream_t stream);

// --- backward ----------------------------------------------------------------------------

struct ActivationBwdArgs {
  void* grad_input = nullptr;      // contiguous, the input's shape: [rows, width] or [rows, 2 * width]
  const void* grad_out = nullptr;  // contiguous [rows, width]
  const void* input = nullptr;     // the forward's input, contiguous
  int64_t rows = 0, width = 0;     // of the forward's output
  DType dtype = DType::kBFloat16;  // all three
  Activation activation = Activation::kGeluTanh;  // the forward's (a fast form recomputes the fast act for db)
  bool gated = false;
  bool act_first = true;
};

// Vectorized: the three buffers 16-byte aligned and (gated) each row half whole words.
ActivationPath activation_bwd_path(const ActivationBwdArgs& a);
cudaError_t activation_bwd(const ActivationBwdArgs& a, cudaStream_t stream);

struct HeadGateBwdArgs {
  void* grad_x = nullptr;          // contiguous [rows, heads * head_dim]
  void* grad_logits = nullptr;     // contiguous [rows, heads]; nullptr: only grad_x (the forward on grad_out)
  const void* grad_out = nullptr;  // contiguous [rows, heads * head_dim]
  const void* x = nullptr;         // contiguous [rows, heads * head_dim]
  const void* logits = nullptr;    // contiguous [rows, heads]
  int64_t rows = 0, heads = 0, head_dim = 0;
  float scale = 2.f;
  DType dtype = DType::kBFloat16;  // all five
  bool exact = true;
};

// Vectorized: grad_out, x and grad_x 16-byte aligned, head_dim whole words and its words a power
// of two <= 32 (a head's words are lanes of one warp); else a warp per head.
ActivationPath head_gate_bwd_path(const HeadGateBwdArgs& a);
cudaError_t head_gate_bwd(const HeadGateBwdArgs& a, cudaStream_t stream);

}  // namespace ltx
