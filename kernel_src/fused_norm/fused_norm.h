// Fused residual + RMSNorm + modulation over the last dimension: host-side
// launch interface (plain pointers, strides and a stream; the caller checks
// arguments, see torch-ext/fused_norm_binding.cpp).
//
// Rows are indexed (b, s), b < batch, s < seq, each of `hidden` elements. One
// pass per row:
//
//   h   = x                          no second stream, or y is the Mochi base
//   h   = T(x + y)                   y is a summand, no gate
//   h   = T(x + y * gate)            y is a summand with a gate
//   residual_out = h                 when given
//   r   = rsqrt(mean(h^2) + eps)     skipped when `out` is absent
//   out = T(modulate(h * r))         see Modulation
//
// T is the element type of x. `exact` selects how intermediates round:
// true copies the model's eager PyTorch chain (every half-precision op
// rounds its result), false rounds once at the end (fast). With float32
// modulation tensors both modes compute in float32 and round once, which is
// what the models that keep their modulation in float32 (Wan) do.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

#include "../common/dtype.h"
#include "../common/rows.h"

namespace ltx {

enum class SecondStream : int {
  kNone = 0,
  kSummand = 1,  // h = x + y (* gate)
  kBase = 2,     // Mochi: out = y + n * tanh(gate); h = x
};

enum class Modulation : int {
  kNone = 0,          // out = T(n)                                        n = h * r [* weight]
  kScaleShift = 1,    // out = n * (1 + scale) [+ shift]; exact: T(T(T(n) * T(1 + scale)) + shift) (LTX, Flux)
  kScaleFloat = 2,    // out = T(n * (scale_offset + float(scale))), float32 math, one rounding (Mochi)
  kTanhGatedBase = 3, // out = y + n * tanh(gate); exact: T(y + T(n * G(tanh(gate)))), G = gate dtype (Mochi)
};

struct FusedNormArgs {
  RowOut out;           // null: no normalisation (gated residual only)
  RowOut residual_out;  // h, or null
  RowIn x;              // the row to normalise, or the residual stream
  RowIn y;              // second stream (see SecondStream), or null
  RowIn weight;         // [hidden] (both strides 0) of x's dtype, or null
  RowIn gate;           // summand gate, or the tanh gate of kTanhGatedBase; null = 1
  RowIn scale;          // kScaleShift / kScaleFloat
  RowIn shift;          // kScaleShift, optional
  int64_t batch = 0, seq = 0, hidden = 0;
  DType dtype = DType::kBFloat16;      // x, y, out, residual_out, weight
  DType mod_dtype = DType::kBFloat16;  // gate, scale, shift: `dtype` or kFloat32
  SecondStream second = SecondStream::kNone;
  Modulation modulation = Modulation::kNone;
  float eps = 1e-6f;
  float scale_offset = 1.f;  // kScaleFloat: 1 for (1 + scale), 0 when `scale` is the whole multiplier
  bool exact = true;
};

enum class FusedNormPath : int { kVectorized = 0, kScalarFallback = 1 };
FusedNormPath fused_norm_path(const FusedNormArgs& a);

// Enqueue on `stream`. Nothing is enqueued for an empty problem. Returns the
// launch status (cudaErrorInvalidValue for an unsupported dtype pair).
cudaError_t fused_norm(const FusedNormArgs& a, cudaStream_t stream);

}  // namespace ltx
