// Fused q/k RMSNorm + rotary embedding: host-side launch interface.
//
// For each token row of q and of k ([batch, seq, dim], dim = heads * head_dim)
// and each norm group g (the whole row when head_dim == dim, as LTX-Video's
// torch.nn.RMSNorm over all heads; each head otherwise, as Flux, Mochi and
// HunyuanVideo):
//
//   r = rsqrt(mean_g(x_f32^2) + eps)
//   n = x_f32 * r * w_f32                          (round_before_weight = false, torch.nn.RMSNorm)
//   n = float(T(x_f32 * r)) * w_f32                (round_before_weight = true, diffusers RMSNorm)
//   n = float(T(n))                                (round_normalized: the eager chain stores the norm)
//   out = T(n * cos - n_partner * sin)             first element of a pair
//   out = T(n * cos + n_partner * sin)             second element of a pair
//
// Pairs are (2i, 2i+1) (interleaved) or, per head, (i, i + head_dim / 2)
// (rotate-half). cos and sin are float32 [batch or 1, seq, table_dim] with
// table_dim = dim (one column per channel) or head_dim (shared by all heads);
// under a whole-row norm also any even divisor of dim, channel c reading column
// c % table_dim (Wan: one head's columns, shared by the heads); the products
// and the sum are separate float32 operations (no FMA), as in the eager
// `(x.float() * cos + x_rotated.float() * sin).to(x.dtype)`.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

#include "../common/dtype.h"

namespace ltx {

enum class Rotation : int { kInterleaved = 0, kHalf = 1 };

// One of q and k: input and output rows (contiguous last dim; out may be in)
// and the norm weight (nullptr for none; the tensor's dtype or float32).
struct QkOperand {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t in_batch_stride = 0, in_seq_stride = 0;
  int64_t out_batch_stride = 0, out_seq_stride = 0;
  const void* weight = nullptr;
};

// A float32 [batch or 1, seq, table_dim] table; batch_stride 0 shares it.
struct QkTable {
  const float* ptr = nullptr;
  int64_t batch_stride = 0, seq_stride = 0;
};

struct QkRmsnormRopeArgs {
  QkOperand q, k;
  QkTable cos, sin;
  int64_t batch = 0, seq = 0, dim = 0, head_dim = 0, table_dim = 0;
  float eps = 1e-5f;
  DType dtype = DType::kBFloat16;
  bool weight_is_float = false;  // weights are float32 (else the tensors' dtype)
  Rotation rotation = Rotation::kInterleaved;
  bool round_before_weight = false;
  bool round_normalized = true;
};

// The table widths the ops take (see the top): dim, head_dim, or under a
// whole-row norm (head_dim == dim) an even divisor of dim.
inline bool qk_table_dim_ok(int64_t dim, int64_t head_dim, int64_t table_dim) {
  if (table_dim == dim || table_dim == head_dim) return true;
  return head_dim == dim && table_dim > 0 && table_dim % 2 == 0 && dim % table_dim == 0;
}

enum class QkRmsnormRopePath : int { kVectorized = 0, kScalarFallback = 1 };
QkRmsnormRopePath qk_rmsnorm_rope_path(const QkRmsnormRopeArgs& a);

// Enqueue on `stream`. Requires dim % head_dim == 0, an even head_dim and
// qk_table_dim_ok; cudaErrorInvalidValue otherwise.
cudaError_t qk_rmsnorm_rope(const QkRmsnormRopeArgs& a, cudaStream_t stream);

// --- backward (qk_rmsnorm_rope_bwd.cu) ---------------------------------------
//
// Per norm group of G channels, with m = x_f32 * r (r recomputed from x, as the
// forward computes it) and the roundings of the forward taken as identities:
//
//   dn = R^T(dy): for a pair (a, b), dn_a = dy_a * cos_a + dy_b * sin_b,
//                 dn_b = dy_b * cos_b - dy_a * sin_a  (the rotation by -theta)
//   g  = dn * w_f32 (dn without weight)
//   dx = T(r * (g - m * mean_G(g * m)))
//   dw = Tw(sum over rows and groups of dn * m')   m' = m, or float(T(m)) when
//                                                 the forward rounded before the weight
//
// float32 throughout, one rounding per stored grad. dw is deterministic: fixed
// per-worker partials (float32 rows of G per tensor), then column_sum.
struct QkBwdOperand {
  const void* x = nullptr;   // the forward's input (T)
  const void* dy = nullptr;  // grad of the output (T)
  void* dx = nullptr;        // grad of the input (T)
  int64_t x_batch_stride = 0, x_seq_stride = 0;
  int64_t dy_batch_stride = 0, dy_seq_stride = 0;
  int64_t dx_batch_stride = 0, dx_seq_stride = 0;
  const void* weight = nullptr;  // nullptr: no weight
  float* partials = nullptr;     // qk_rmsnorm_rope_bwd_workspace floats; nullptr: no weight grad
  void* grad_weight = nullptr;   // [head_dim] of the weight's dtype
};

struct QkRmsnormRopeBwdArgs {
  QkBwdOperand q, k;
  QkTable cos, sin;
  int64_t batch = 0, seq = 0, dim = 0, head_dim = 0, table_dim = 0;
  float eps = 1e-5f;
  DType dtype = DType::kBFloat16;
  bool weight_is_float = false;
  Rotation rotation = Rotation::kInterleaved;
  bool round_before_weight = false;
};

// Floats of the dw workspace of one tensor (its `partials`) for these sizes and form (batch, seq, dim,
// head_dim, table_dim, dtype, rotation).
int64_t qk_rmsnorm_rope_bwd_workspace(const QkRmsnormRopeBwdArgs& a);

cudaError_t qk_rmsnorm_rope_bwd(const QkRmsnormRopeBwdArgs& a, cudaStream_t stream);

}  // namespace ltx
