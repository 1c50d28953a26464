// FP8 producers: the row-wise ops that write a GEMM's input as float8_e4m3
// with one float32 scale per row (torch._scaled_mm's rowwise scaling), in the
// same pass that computes it. Host-side launch interface; the caller checks
// arguments (torch-ext/fp8_binding.cpp).
//
// Rows are indexed (b, s), b < batch, s < seq, each of `hidden` elements:
//
//   h     = x                                 kGeluTanh, and kQuantize / kModulatedRmsnorm without y
//   h     = T(x + T(y * gate)) -> residual_out kQuantize / kModulatedRmsnorm with y (the eager rounding
//                                             of the residual stream, gated_residual's exact mode)
//   v     = h                                 kQuantize
//   v     = GELU_tanh(h)                      kGeluTanh (the fast formula: 1 / (1 + exp(-2u)))
//   v     = h * r [* w] * (1 + scale) [+ shift], r = rsqrt(mean(h^2) + eps)   kModulatedRmsnorm
//   v     = ((h - mean) * rsqrt(var + eps) [* w] [+ b]) [* (1 + scale) [+ shift]]  kModulatedLayernorm
//           (var the biased variance, as torch; Wan's FP32LayerNorm and modulation in float32)
//   amax  = max |v| over the row
//   row_scale = amax / 448 (1 where amax is 0)
//   data  = e4m3(v / row_scale), saturated to +-448
//
// v is float32 throughout: no rounding to T before the quantisation.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

#include "../common/dtype.h"
#include "../common/rows.h"

namespace ltx {

enum class Fp8Producer : int { kQuantize = 0, kGeluTanh = 1, kModulatedRmsnorm = 2, kModulatedLayernorm = 3 };

struct Fp8RowsArgs {
  void* data = nullptr;     // [batch * seq, hidden] float8_e4m3fn, contiguous
  float* row_scale = nullptr;  // [batch * seq]
  RowOut residual_out;      // h, when y is given
  RowIn x;
  RowIn y;                  // the summand (kQuantize, kModulatedRmsnorm), or null
  RowIn gate;               // y's gate, or null (1)
  RowIn weight;             // [hidden] of x's dtype (or float32: weight_f32), or null
  RowIn bias;               // kModulatedLayernorm: [hidden] of x's dtype (or float32: bias_f32), or null
  RowIn scale;              // kModulatedRmsnorm; optional for kModulatedLayernorm
  RowIn shift;              // optional
  int64_t batch = 0, seq = 0, hidden = 0;
  DType dtype = DType::kBFloat16;      // x, y, residual_out, weight
  DType mod_dtype = DType::kBFloat16;  // gate, scale, shift: `dtype` or kFloat32
  Fp8Producer producer = Fp8Producer::kQuantize;
  float eps = 1e-6f;
  bool weight_f32 = false, bias_f32 = false;
};

// The widest row (in elements of x's dtype) the kernels hold in registers.
int64_t fp8_max_hidden(DType dtype);

// Enqueue on `stream`; nothing for an empty problem. cudaErrorInvalidValue for
// a row wider than fp8_max_hidden, a hidden size that is not a multiple of 16,
// or an unsupported dtype pair.
cudaError_t fp8_rows(const Fp8RowsArgs& a, cudaStream_t stream);

}  // namespace ltx
