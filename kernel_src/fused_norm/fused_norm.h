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

// The ops of the family: one kernel structure each (forward: fused_norm.cuh,
// fused_norm_config.h names it fused::Variant; backward: fused_norm_bwd.cu).
enum class FusedNormOp : int {
  kAdalnRmsnorm,               // out = mod(RMSNorm(x))
  kRmsnormResidual,            // h = x + y -> residual_out, out = RMSNorm(h)
  kGatedResidualRmsnorm,       // h = x + y * gate -> residual_out, out = mod(RMSNorm(h))
  kGatedResidual,              // h = x + y * gate -> residual_out, no norm
  kResidualTanhGatedRmsnorm,   // Mochi: out = y + RMSNorm(x) * tanh(gate)
  kModulatedRmsnorm,           // Mochi: out = RMSNorm(x) * (offset + scale), float32
};

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

// --- backward (fused_norm_bwd.cu) ------------------------------------------------
//
// One row kernel for every op, the op a template parameter (what it adds: a
// summand and its gate, a weight, scale/shift or Mochi's multipliers). All
// math in float32. With h the row the forward normalised (x, or the rounded
// residual_out of the summand ops), r = rsqrt(mean(h^2) + eps) recomputed from
// h (the backward reads h anyway: no saved statistics, the forward kernels are
// unchanged), n = h * r, w the weight (1 without), and k the multiplier the
// modulation puts on n * w:
//   k = 1 + scale (adaln_rmsnorm, gated_residual_rmsnorm), offset + scale
//   (modulated_rmsnorm), tanh(gate) (residual_tanh_gated_rmsnorm), 1 (rmsnorm_residual)
//   dn = dout * k * w
//   dh = r * (dn - n * mean(dn * n)) + dsum     (= r*dn - h * r^3 * sum(dn*h)/hidden: both row
//                                                sums, of h^2 and dn*h, in one pass)
//   gated_residual (no norm): dh = dsum (not written: the caller returns dsum itself)
//   summand ops: dx = dh, dy = dh * gate (dh without gate), dgate = dh * y
//   residual_tanh_gated_rmsnorm: dx (the base) = dout, dgate = dout * n * (1 - tanh(gate)^2)
//   dweight = sum over rows of dout * k * n'
//   dscale  = dout * (n' * w)' (scale-shift), dout * n (modulated_rmsnorm)
//   dshift  = dout
// dsum is the upstream grad of residual_out (summand ops), dout that of out.
//
// Roundings: the backward treats the forward's roundings to T as the identity
// (as eager autograd does for a cast), so dh is the exact derivative of the
// float32 formula. Where a reduced grad multiplies by a value the forward
// rounded, it uses that rounded value, as eager autograd of the model's code
// does: with `round_n` (exact mode, half-precision x and modulation of x's
// dtype: the eager chain) n' = T(n), (n' * w)' = T(n' * w), k = T(1 + scale)
// and tanh(gate) = T(tanh(gate)); otherwise the unrounded values. Versus eager
// autograd in bf16 the difference is eager's own per-op roundings of the
// grads (~2^-8 relative per element) and its bf16 sums over rows.
//
// Modulation grads (gate, scale, shift) follow the tensor's broadcast: per row
// (a stride for every row dim the tensor spans) they are written elementwise;
// shared by the rows of a batch or by all rows they are summed over those rows,
// deterministically: the row kernel splits each group of rows (a batch when any
// reduced grad is per batch, else all rows) into fixed runs (common/column_sum.cuh:
// fixed_rows_per_block) and writes per-block float32 partials; column_sum adds
// them in a fixed order, per batch or over every block. The weight grad is
// always summed over all rows. No atomics: the same inputs give the same bits.

// One grad of a modulation tensor or the weight.
struct FusedGrad {
  RowOut per_row;             // per-row target (ptr null: reduced, or not asked for)
  float* partials = nullptr;  // reduced: [fused_norm_bwd_blocks(...), hidden] float32 workspace
  void* out = nullptr;        // reduced: [groups, hidden] contiguous, the tensor's dtype
  bool per_batch = false;     // reduced: one sum per batch (else one over all rows)
  bool wanted() const { return per_row.ptr != nullptr || partials != nullptr; }
};

struct FusedNormBwdArgs {
  FusedNormOp op = FusedNormOp::kAdalnRmsnorm;
  const void* grad_out = nullptr;  // [rows, hidden] contiguous (dtype): the grad of out; normalising ops
  const void* grad_sum = nullptr;  // [rows, hidden] contiguous: the grad of residual_out; summand ops
  RowIn h;                         // the normalised row: x, or residual_out of the summand ops
  RowIn y;                         // summand ops with a gate grad: the summand y
  RowIn gate, weight, scale, shift;  // as the forward read them (null where absent)
  void* grad_h = nullptr;          // [rows, hidden] contiguous: dh (dx; also the residual's / y's grad
                                   // where no gate scales it); null for gated_residual, whose dx is dsum
  void* grad_y = nullptr;          // [rows, hidden] contiguous: dh * gate (summand ops with a gate)
  FusedGrad grad_gate, grad_weight, grad_scale, grad_shift;
  int64_t batch = 0, seq = 0, hidden = 0;
  DType dtype = DType::kBFloat16;      // h, y, weight, the grads of out and residual_out
  DType mod_dtype = DType::kBFloat16;  // gate, scale, shift and their grads
  float eps = 1e-6f;
  float scale_offset = 1.f;  // modulated_rmsnorm
  bool round_n = false;      // see Roundings above
};

// Whether the row split goes per batch (some reduced grad is per batch).
inline bool fused_norm_bwd_by_batch(const FusedNormBwdArgs& a) {
  return a.grad_gate.per_batch || a.grad_scale.per_batch || a.grad_shift.per_batch;
}
// Blocks of the row kernel for the call `a` (rows of each partials workspace): from its shapes, dtype, op
// and the reduced grads' broadcast (fused_norm_bwd_by_batch).
int64_t fused_norm_bwd_blocks(const FusedNormBwdArgs& a);
FusedNormPath fused_norm_bwd_path(const FusedNormBwdArgs& a);
// Enqueue the backward: the row kernel, then one column_sums launch for every reduced grad.
// Nothing for an empty problem (the caller zeroes reduced grads).
cudaError_t fused_norm_bwd(const FusedNormBwdArgs& a, cudaStream_t stream);

}  // namespace ltx
