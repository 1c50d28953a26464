// LayerNorm over the last dimension, alone, with AdaLN modulation, or after a
// gated residual: host-side launch interface (plain pointers, strides and a
// stream; the caller checks arguments, see torch-ext/layernorm_binding.cpp).
//
// Rows are indexed (b, s), b < batch, s < seq, each of `hidden` elements. One
// pass per row, the row held in registers on the vectorized path:
//
//   h    = x                              no summand (y null)
//   h    = T(x + y [* gate])              y given; residual_out = h
//   mean = sum(h) / hidden                float32, from the row in registers
//   var  = sum((h - mean)^2) / hidden     the biased variance, as torch
//   n    = (h - mean) * rsqrt(var + eps) [* weight] [+ bias]   float32
//   out  = T(n)                           no scale
//   out  = modulate(n, scale, shift)      scale given, see below
//
// T is the dtype of x. Modulation tensors (gate, scale, shift) share one
// dtype, T or float32; weight and bias are each T or float32. `exact` picks
// how intermediates round (docs/formulas.md#layernorm):
//
//   modulation of T (half), exact:  the eager chain of Flux / HunyuanVideo's
//     AdaLayerNormZero / AdaLayerNormContinuous in T: n rounded to T, then
//     out = T(T(T(n) * T(1 + scale)) + shift); h = T(x + T(y * gate));
//   modulation of T, fast:          float32 throughout, one rounding:
//     out = T(n * (1 + scale) + shift), h = T(x + y * gate);
//   float32 modulation (either mode): Wan's `(norm(x.float()) * (1 + scale)
//     + shift).type_as(x)` and `(x.float() + y * gate).type_as(x)`: every op
//     in float32, each rounded to float32 as eager does (no FMA), one
//     rounding to T at the end. float32 x has float32 modulation only.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

#include "../common/dtype.h"
#include "../common/rows.h"

namespace ltx {

struct LayerNormArgs {
  RowOut out;           // the normalised (and modulated) rows
  RowOut residual_out;  // h when y is given (the new residual stream), else null
  RowIn x;
  RowIn y;              // the summand of the gated residual, or null
  RowIn weight, bias;   // [hidden] (both strides 0), each of `dtype` or float32, or null
  RowIn gate;           // with y; null = 1
  RowIn scale, shift;   // AdaLN modulation, or null (shift needs scale)
  int64_t batch = 0, seq = 0, hidden = 0;
  DType dtype = DType::kBFloat16;      // x, y, out, residual_out
  DType mod_dtype = DType::kBFloat16;  // gate, scale, shift: `dtype` or kFloat32
  bool weight_f32 = false, bias_f32 = false;
  float eps = 1e-6f;
  bool exact = true;
};

enum class LayerNormPath : int { kVectorized = 0, kScalarFallback = 1 };
LayerNormPath layernorm_path(const LayerNormArgs& a);

// Enqueue on `stream`. Nothing is enqueued for an empty problem. Returns the
// launch status (cudaErrorInvalidValue for an unsupported dtype pair, shift
// without scale, or 2^31 rows or more).
cudaError_t layernorm(const LayerNormArgs& a, cudaStream_t stream);

}  // namespace ltx
