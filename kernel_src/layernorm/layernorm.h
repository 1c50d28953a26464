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
  // [rows] float32 each (row = b * seq + s), or both null: the row's mean and
  // rsqrt(var + eps), saved for the backward (the *_fwd ops). One store each
  // per row, by the row's first thread.
  float* mean = nullptr;
  float* rstd = nullptr;
};

enum class LayerNormPath : int { kVectorized = 0, kScalarFallback = 1 };
LayerNormPath layernorm_path(const LayerNormArgs& a);

// Enqueue on `stream`. Nothing is enqueued for an empty problem. Returns the
// launch status (cudaErrorInvalidValue for an unsupported dtype pair, shift
// without scale, or 2^31 rows or more).
cudaError_t layernorm(const LayerNormArgs& a, cudaStream_t stream);

// --- backward (layernorm_bwd.cu) ----------------------------------------------
//
// One row kernel for the three ops; what an op adds (modulation, the gated
// residual) is an operand that is present or null. With the forward's saved
// mean and rstd of row h (h = x, or the seam's rounded residual x_new) and
// dout the grad of out, float32 throughout:
//
//   n0  = (h - mean) * rstd
//   n   = n0 [* w] [+ b]                       what modulation multiplies
//   dshift = dout,  dscale = dout * n'         n'  = T(n) in exact half mode, else n
//   dn  = dout * (1 + scale)'                  (1 + scale)' = T(1 + scale) in exact half mode;
//                                              dn = dout without scale
//   dbias = dn,  dweight = dn * n0             (each summed over rows)
//   g   = dn [* w]
//   dh  = rstd * (g - mean(g) - n0 * mean(g * n0))  [+ dx_new]   (means over the row)
//   dx  = T(dh);  seam: dy = T(dh * gate),  dgate = dh * y      (gate = 1 when absent)
//
// Roundings: the forward's roundings (T(n), T(1 + scale), the eager chain's
// T(y * gate), h = T(x + ...), the final T(...)) are treated as the identity,
// as eager autograd treats a cast; the products that multiply a rounded value
// use that value (n', (1 + scale)'), as eager autograd does. Versus eager
// autograd in bf16 the difference is eager's own per-op roundings of the
// intermediate grads (T(dout * (1 + scale)), the LayerNorm backward's T(dx)
// before the residual grad is added, T(dh * y) before the sum): ~2^-8
// relative per element. With float32 modulation (Wan) eager runs every op in
// float32 and rounds once, as here. Reduced grads are summed in float32 and
// rounded once to the tensor's dtype (eager sums in float32 too, in another
// order).
//
// Modulation grads by the tensor's broadcast: a tensor with an element per row
// ([B, S, D], or [B, D] when seq == 1) is written per row; a [D] (or [1, D],
// ...) tensor is summed over every row; a per-batch [B, D] / [B, 1, D] tensor
// over each batch's rows. Weight and bias are summed over every row.
//
// Deterministic (common/column_sum.cuh): the row kernel's blocks take fixed
// runs of rows (within one batch when some grad is per batch), each writing
// float32 partial sums to its own row of each workspace; column_sum adds them
// in a fixed order. No atomics: the same inputs give the same bits.

// How a modulation tensor's grad is formed (see above).
enum class ModGradKind : int { kNone = 0, kPerRow, kAllRows, kPerBatch };

struct ModGrad {
  ModGradKind kind = ModGradKind::kNone;
  RowOut rows;               // kPerRow: the grad, of mod_dtype, written per row
  float* partials = nullptr; // kAllRows / kPerBatch: [layernorm_bwd_blocks(...), hidden] workspace
  void* out = nullptr;       // kAllRows: [hidden]; kPerBatch: [batch, hidden]; mod_dtype
};

struct LayerNormBwdArgs {
  RowOut grad_x;   // dx of `dtype`, or null (not wanted)
  RowOut grad_y;   // seam: dy of `dtype`, or null
  RowIn grad_out;  // dout of `dtype`
  RowIn grad_h;    // seam: the grad of x_new (`dtype`), or null (zero)
  RowIn h;         // the rows the forward normalised: x, or the seam's x_new
  RowIn y;         // seam: the summand (read for dgate), or null
  RowIn gate;      // seam: gate (mod_dtype), or null = 1
  RowIn scale;     // modulation scale (mod_dtype), or null
  RowIn weight, bias;  // [hidden] (strides 0), each of `dtype` or float32, or null
  const float* mean = nullptr;  // [rows], the forward's
  const float* rstd = nullptr;  // [rows]
  ModGrad grad_gate, grad_scale, grad_shift;
  float* weight_partials = nullptr;  // [blocks, hidden] workspace, or null: no dweight
  void* grad_weight = nullptr;       // [hidden], the weight's dtype
  float* bias_partials = nullptr;    // or null: no dbias
  void* grad_bias = nullptr;         // [hidden], the bias's dtype
  int64_t batch = 0, seq = 0, hidden = 0;
  DType dtype = DType::kBFloat16;
  DType mod_dtype = DType::kBFloat16;
  bool weight_f32 = false, bias_f32 = false;
  bool exact = true;  // as the forward's
  // The row split (layernorm_bwd_blocks): true keeps each block within one batch, as a kPerBatch grad
  // needs. The caller sets it from the shapes alone (any per-batch modulation tensor given), so that the
  // grads asked for do not change the bits of the others.
  bool per_batch_split = false;
  // The call is gated_residual_layernorm's (the caller sets it from the op, whichever grads are asked for,
  // as above): its row split stretches to its own wave (layernorm_config::bwd_wave_blocks).
  bool seam = false;
};

// Blocks of the backward's row kernel (the rows of every workspace) for the call `a`: fixed runs of rows
// over all rows, or within each batch when a.per_batch_split; set from its shapes, dtype, seam and scale.
int64_t layernorm_bwd_blocks(const LayerNormBwdArgs& a);
LayerNormPath layernorm_bwd_path(const LayerNormBwdArgs& a);

// Enqueue the backward: the row kernel, then one column_sums launch for every reduced grad.
// An empty problem enqueues nothing (the caller zeroes reduced grads).
cudaError_t layernorm_bwd(const LayerNormBwdArgs& a, cudaStream_t stream);

}  // namespace ltx
