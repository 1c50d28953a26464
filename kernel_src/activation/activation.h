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

}  // namespace ltx
