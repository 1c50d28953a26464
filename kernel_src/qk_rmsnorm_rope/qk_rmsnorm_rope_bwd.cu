// qk_rmsnorm_rope backward (formulas and rounding notes in qk_rmsnorm_rope.h).
//
// A unit is one norm group (a head, or the whole row) of one row of q or k.
// One warp takes a fixed run of units of one tensor in order (the split of
// common/column_sum.cuh over the units), lane l owning pairs l, l + 32, ... of
// the group, so it touches the same weight columns in every unit:
//
//   pass 1: dn = R^T(dy) (the transposed rotation), g = dn * w; the sums
//           S1 = sum(x^2) and S2 = sum(g * x) in one warp reduction;
//   r = rsqrt(S1 / G + eps) (recomputed: the same formula as the forward's),
//   pass 2: dx = T(r * (g - x r * (r S2 / G))), and dw partials += dn * m',
//           m' = x r (rounded to T first under diffusers rounding).
//
// The second pass re-reads the unit (L1/L2). dw partials live in the warp's own
// row of a float32 workspace [splits, head_dim] per tensor, each column always
// updated by the same lane in unit order; column_sum adds the rows in a fixed
// order. No atomics: the same inputs give the same bits.
#include "../common/column_sum.cuh"
#include "../common/launch.cuh"
#include "qk_rmsnorm_rope.h"
#include "qk_rmsnorm_rope_config.h"

namespace ltx {
namespace {

constexpr int kWarps = qk_rmsnorm_rope_config::kBwdThreads / 32;
constexpr unsigned kMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kMask, v, offset);
  return v;
}

struct BwdParams {
  QkRmsnormRopeBwdArgs a;
  int64_t units;           // norm groups per tensor: batch * seq * dim / head_dim
  int64_t units_per_warp;  // fixed_rows_per_block(units)
  int64_t splits;          // warps per tensor
};

// dn of the pair (e0, e1) at table columns (t0, t1): the transpose of
// [[c0, -s0], [s1, c1]], separate float32 products and sum.
__device__ __forceinline__ void transposed_pair(float d0, float d1, float c0, float c1, float s0, float s1,
                                                float& n0, float& n1) {
  n0 = __fadd_rn(__fmul_rn(d0, c0), __fmul_rn(d1, s1));
  n1 = __fadd_rn(__fmul_rn(d1, c1), __fmul_rn(-d0, s0));
}

template <typename T, typename Tw> __global__ void __launch_bounds__(qk_rmsnorm_rope_config::kBwdThreads)
    qk_rmsnorm_rope_bwd_kernel(BwdParams p) {
  const QkRmsnormRopeBwdArgs& a = p.a;
  const int64_t warp = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (warp >= 2 * p.splits) return;  // whole warps leave: the shuffles below stay full
  const int lane = threadIdx.x % 32;
  const bool is_k = warp >= p.splits;
  const int64_t split = is_k ? warp - p.splits : warp;
  const QkBwdOperand& o = is_k ? a.k : a.q;
  const Tw* w = static_cast<const Tw*>(o.weight);
  float* part = o.partials != nullptr ? o.partials + split * a.head_dim : nullptr;
  const int64_t G = a.head_dim, P = G / 2, groups = a.dim / G;
  const bool interleaved = a.rotation == Rotation::kInterleaved;
  const float inv_g = 1.f / float(G);
  if (part != nullptr)
    for (int64_t e = lane; e < G; e += 32) part[e] = 0.f;
  const int64_t first = split * p.units_per_warp;
  const int64_t end = first + p.units_per_warp < p.units ? first + p.units_per_warp : p.units;
  for (int64_t u = first; u < end; ++u) {
    const int64_t row = u / groups, h = u - row * groups;
    const int64_t b = row / a.seq, s = row - b * a.seq;
    const int64_t offset = h * G;
    const T* x = static_cast<const T*>(o.x) + b * o.x_batch_stride + s * o.x_seq_stride + offset;
    const T* dy = static_cast<const T*>(o.dy) + b * o.dy_batch_stride + s * o.dy_seq_stride + offset;
    T* dx = static_cast<T*>(o.dx) + b * o.dx_batch_stride + s * o.dx_seq_stride + offset;
    const float* cs = a.cos.ptr + b * a.cos.batch_stride + s * a.cos.seq_stride;
    const float* sn = a.sin.ptr + b * a.sin.batch_stride + s * a.sin.seq_stride;
    // The pair's dn and g (g = dn * w) and its x.
    const auto pair = [&](int64_t q, float (&xv)[2], float (&dn)[2], float (&g)[2], int64_t (&e)[2]) {
      e[0] = interleaved ? 2 * q : q;
      e[1] = interleaved ? 2 * q + 1 : q + P;
      const int64_t t0 = (offset + e[0]) % a.table_dim, t1 = (offset + e[1]) % a.table_dim;
      xv[0] = to_float(x[e[0]]);
      xv[1] = to_float(x[e[1]]);
      transposed_pair(to_float(dy[e[0]]), to_float(dy[e[1]]), cs[t0], cs[t1], sn[t0], sn[t1], dn[0], dn[1]);
#pragma unroll
      for (int j = 0; j < 2; ++j) g[j] = w != nullptr ? dn[j] * to_float(w[e[j]]) : dn[j];
    };
    float s1 = 0.f, s2 = 0.f;
    for (int64_t q = lane; q < P; q += 32) {
      float xv[2], dn[2], g[2];
      int64_t e[2];
      pair(q, xv, dn, g, e);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        s1 += xv[j] * xv[j];
        s2 += g[j] * xv[j];
      }
    }
    s1 = warp_sum(s1);
    s2 = warp_sum(s2);
    const float r = rsqrtf(s1 * inv_g + a.eps);
    const float mean = r * s2 * inv_g;  // mean over the group of g * m, m = x * r
    for (int64_t q = lane; q < P; q += 32) {
      float xv[2], dn[2], g[2];
      int64_t e[2];
      pair(q, xv, dn, g, e);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float m = xv[j] * r;
        dx[e[j]] = from_float<T>(r * (g[j] - m * mean));
        if (part != nullptr) part[e[j]] += dn[j] * (a.round_before_weight ? round_through<T>(m) : m);
      }
    }
  }
}

template <typename T, typename Tw> cudaError_t launch(const QkRmsnormRopeBwdArgs& a, cudaStream_t stream) {
  BwdParams p{a, a.batch * a.seq * (a.dim / a.head_dim), 0, 0};
  p.units_per_warp = fixed_rows_per_block(p.units);
  p.splits = fixed_split_blocks(p.units);
  const int64_t blocks = ceil_div(2 * p.splits, kWarps);
  qk_rmsnorm_rope_bwd_kernel<T, Tw><<<dim3(unsigned(blocks)), qk_rmsnorm_rope_config::kBwdThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  for (const QkBwdOperand* o : {&a.q, &a.k}) {
    if (err != cudaSuccess || o->partials == nullptr) continue;
    err = column_sum(o->partials, static_cast<Tw*>(o->grad_weight), 1, p.splits, a.head_dim, stream);
  }
  return err;
}

}  // namespace

int64_t qk_rmsnorm_rope_bwd_splits(int64_t units) { return fixed_split_blocks(units); }

cudaError_t qk_rmsnorm_rope_bwd(const QkRmsnormRopeBwdArgs& a, cudaStream_t stream) {
  if (a.head_dim <= 0 || a.head_dim % 2 || a.dim % a.head_dim ||
      (a.table_dim != a.dim && a.table_dim != a.head_dim))
    return cudaErrorInvalidValue;
  for (const QkBwdOperand* o : {&a.q, &a.k})
    if (o->partials != nullptr && (o->weight == nullptr || o->grad_weight == nullptr)) return cudaErrorInvalidValue;
  if (a.batch == 0 || a.seq == 0 || a.dim == 0) return cudaSuccess;
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return a.weight_is_float ? launch<T, float>(a, stream) : launch<T, T>(a, stream);
  });
}

}  // namespace ltx
