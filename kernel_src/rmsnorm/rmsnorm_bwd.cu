// RMSNorm backward (formulas and rounding notes in rmsnorm.h):
//
//   n = x_f32 * r,  g = dy_f32 * w_f32 (dy_f32 without weight)
//   dx = T_in(r * (g - n * sum(g * n) / hidden))
//   dw = T_w(sum over rows of dy_f32 * n')     n' = n, or round_through<Tin>(n)
//
// Row kernel: a block of kBwdThreads takes its fixed run of rows one at a
// time; a thread holds the same columns in every row, so its dw sums stay in
// registers (vectorized path) or in the block's own row of the float32
// workspace (scalar path), always added in row order. Weight kernel: sums the
// workspace rows per column in a fixed order. No atomics anywhere.
#include <type_traits>

#include "../common/column_sum.cuh"
#include "../common/launch.cuh"
#include "rmsnorm.h"
#include "rmsnorm_config.h"

namespace ltx {
namespace {

constexpr int kThreads = rmsnorm_config::kBwdThreads;

struct BwdParams {
  void* dx;
  float* partials;  // nullptr: no dw
  const void* dy;
  const void* x;
  const void* w;  // nullptr: no weight
  const float* rstd;
  int64_t rows, hidden, rows_per_block;
  bool round_before_weight;
};

// The n a dw term multiplies: what the forward multiplied by w.
template <typename Tin> __device__ __forceinline__ float weight_factor(float n, bool round_before_weight) {
  return round_before_weight ? round_through<Tin>(n) : n;
}

template <typename T, int W, int N> __device__ __forceinline__ void unpack_words(const uint4 (&raw)[W], float (&dst)[N]) {
#pragma unroll
  for (int k = 0; k < W; ++k) unpack_word<T>(raw[k], dst + k * (16 / int(sizeof(T))));
}

// Word v of a row: n = x * r, g = dy * w (dy without weight) and dy itself, in float32.
template <typename Tin, typename Tw, typename Tdy, int W, int N>
__device__ __forceinline__ void word_terms(const uint4& xw, const uint4 (&dyw)[W], const Tw* w, int64_t v, float r,
                                           float (&n)[N], float (&g)[N], float (&d)[N]) {
  float x[N], wf[N];
  unpack_word<Tin>(xw, x);
  unpack_words<Tdy>(dyw, d);
  if (w != nullptr) load_vec<Tw, N>(w + v * N, wf);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    n[j] = x[j] * r;
    g[j] = w != nullptr ? d[j] * wf[j] : d[j];
  }
}

// Loads a row's 16-byte words of x and dy into registers (words v = threadIdx.x + i * TPR).
template <typename Tin, typename Tdy, int VPT, int TPR, int kDyWords>
__device__ __forceinline__ void load_row(const BwdParams& p, int64_t row, int64_t nvec, uint4 (&xw)[VPT],
                                         uint4 (&dyw)[VPT][kDyWords]) {
  const Tin* xr = static_cast<const Tin*>(p.x) + row * p.hidden;
  const Tdy* dyr = static_cast<const Tdy*>(p.dy) + row * p.hidden;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t v = threadIdx.x + int64_t(i) * TPR;
    if (v < nvec) {
      xw[i] = load_word(xr, v);
#pragma unroll
      for (int k = 0; k < kDyWords; ++k) dyw[i][k] = load_word(dyr, v * kDyWords + k);
    }
  }
}

// Rows of up to TPR * VPT 16-byte words of Tin, one row at a time per block of
// TPR threads. x and dy stay in registers between the row's reduction and its
// dx store, and the next row's words are loaded before this row's reduction,
// so a block always has a row's loads in flight; the weight is re-read (L1).
template <typename Tin, typename Tw, typename Tdy, int VPT, int TPR>
__global__ void __launch_bounds__(TPR) rmsnorm_bwd_vectorized(BwdParams p) {
  constexpr int N = 16 / sizeof(Tin);
  constexpr int kDyWords = int(sizeof(Tdy) / sizeof(Tin));  // 16-byte words of dy per word of x: 1, or 2 (float dy)
  const int64_t nvec = p.hidden / N;
  const Tw* w = static_cast<const Tw*>(p.w);
  const bool want_dw = p.partials != nullptr;
  pdl_wait();
  float acc[VPT][N];
  zero_fill(acc);

  const int64_t first = int64_t(blockIdx.x) * p.rows_per_block;
  const int64_t end = first + p.rows_per_block < p.rows ? first + p.rows_per_block : p.rows;
  uint4 xw[VPT], dyw[VPT][kDyWords];
  load_row<Tin, Tdy, VPT, TPR>(p, first, nvec, xw, dyw);
  int64_t pass = 0;
  for (int64_t row = first; row < end; ++row, ++pass) {  // the same bounds for the whole block (row_sum syncs)
    const float r = p.rstd[row];
    uint4 next_x[VPT], next_dy[VPT][kDyWords];
    if (row + 1 < end) load_row<Tin, Tdy, VPT, TPR>(p, row + 1, nvec, next_x, next_dy);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = threadIdx.x + int64_t(i) * TPR;
      if (v >= nvec) continue;
      float n[N], g[N], d[N];
      word_terms<Tin, Tw, Tdy>(xw[i], dyw[i], w, v, r, n, g, d);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        dot += g[j] * n[j];
        if (want_dw) acc[i][j] += d[j] * weight_factor<Tin>(n[j], p.round_before_weight);
      }
    }
    dot = row_sum<TPR, 1>(dot, pass);
    const float mean = dot / float(p.hidden);
    Tin* dxr = static_cast<Tin*>(p.dx) + row * p.hidden;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = threadIdx.x + int64_t(i) * TPR;
      if (v >= nvec) continue;
      float n[N], g[N], d[N], o[N];
      word_terms<Tin, Tw, Tdy>(xw[i], dyw[i], w, v, r, n, g, d);
#pragma unroll
      for (int j = 0; j < N; ++j) o[j] = r * (g[j] - n[j] * mean);
      store_vec<Tin, N>(dxr + v * N, o);
    }
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      xw[i] = next_x[i];
#pragma unroll
      for (int k = 0; k < kDyWords; ++k) dyw[i][k] = next_dy[i][k];
    }
  }
  pdl_release();
  if (!want_dw) return;
  float* part = p.partials + int64_t(blockIdx.x) * p.hidden;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t v = threadIdx.x + int64_t(i) * TPR;
    if (v < nvec) store_vec<float, N>(part + v * N, acc[i]);
  }
}

// Any hidden size and alignment: scalar accesses, two reads of each row (the
// second from L1/L2). The dw sums live in the block's own workspace row, each
// column always touched by the same thread, in row order.
template <typename Tin, typename Tw, typename Tdy>
__global__ void __launch_bounds__(kThreads) rmsnorm_bwd_scalar(BwdParams p) {
  pdl_wait();
  const Tw* w = static_cast<const Tw*>(p.w);
  float* part = p.partials != nullptr ? p.partials + int64_t(blockIdx.x) * p.hidden : nullptr;
  if (part != nullptr)
    for (int64_t c = threadIdx.x; c < p.hidden; c += kThreads) part[c] = 0.f;
  const int64_t first = int64_t(blockIdx.x) * p.rows_per_block;
  const int64_t end = first + p.rows_per_block < p.rows ? first + p.rows_per_block : p.rows;
  int64_t pass = 0;
  for (int64_t row = first; row < end; ++row, ++pass) {
    const float r = p.rstd[row];
    const Tin* xr = static_cast<const Tin*>(p.x) + row * p.hidden;
    const Tdy* dyr = static_cast<const Tdy*>(p.dy) + row * p.hidden;
    float dot = 0.f;
    for (int64_t c = threadIdx.x; c < p.hidden; c += kThreads) {
      const float n = to_float(xr[c]) * r, d = to_float(dyr[c]);
      dot += (w != nullptr ? d * to_float(w[c]) : d) * n;
      if (part != nullptr) part[c] += d * weight_factor<Tin>(n, p.round_before_weight);
    }
    dot = row_sum<kThreads, 1>(dot, pass);
    const float mean = dot / float(p.hidden);
    Tin* dxr = static_cast<Tin*>(p.dx) + row * p.hidden;
    for (int64_t c = threadIdx.x; c < p.hidden; c += kThreads) {
      const float n = to_float(xr[c]) * r, d = to_float(dyr[c]);
      const float g = w != nullptr ? d * to_float(w[c]) : d;
      dxr[c] = from_float<Tin>(r * (g - n * mean));
    }
  }
}

template <typename Tin, typename Tw, typename Tdy, int VPT, int TPR>
cudaError_t launch_vectorized(const BwdParams& p, int64_t blocks, cudaStream_t stream) {
  return launch_kernel(rmsnorm_bwd_vectorized<Tin, Tw, Tdy, VPT, TPR>, dim3(unsigned(blocks)), dim3(TPR), 0, stream,
                       dependent_launch_enabled(), p);
}

// The general block: 256 threads, 1, 2 or 4 words per thread.
template <typename Tin, typename Tw, typename Tdy>
cudaError_t launch_general(const BwdParams& p, int64_t nvec, int64_t blocks, cudaStream_t stream) {
  static_assert(rmsnorm_config::kBwdMaxWordsPerThread == 4, "one case per words-per-thread below");
  const int64_t vpt = ceil_div(nvec, kThreads);
  if (vpt <= 1) return launch_vectorized<Tin, Tw, Tdy, 1, kThreads>(p, blocks, stream);
  if (vpt <= 2) return launch_vectorized<Tin, Tw, Tdy, 2, kThreads>(p, blocks, stream);
  return launch_vectorized<Tin, Tw, Tdy, 4, kThreads>(p, blocks, stream);
}

template <typename Tin, typename Tw, typename Tdy>
cudaError_t launch(const RmsnormBwdArgs& a, cudaStream_t stream) {
  const int64_t rows_per_block = a.weight_partials != nullptr ? wave_rows_per_block(a.rows, 1)
                                                               : column_sum_config::kUnreducedRowsPerBlock;
  const int64_t blocks = ceil_div(a.rows, rows_per_block);
  const BwdParams p{a.grad_input, a.weight_partials, a.grad_out, a.input, a.weight, a.rstd,
                    a.rows, a.hidden, rows_per_block, a.round_before_weight};
  cudaError_t err;
  if (rmsnorm_bwd_path(a) == RmsnormPath::kVectorized) {
    const int64_t nvec = a.hidden / (16 / int64_t(sizeof(Tin)));
    // Mixed dtypes (a float32 weight or grad) are rare: the general block only.
    constexpr bool kMixed = !std::is_same_v<Tw, Tin> || !std::is_same_v<Tdy, Tin>;
    if (!kMixed && rmsnorm_config::bwd_narrow_block(nvec)) err = launch_vectorized<Tin, Tw, Tdy, 2, 96>(p, blocks, stream);
    else err = launch_general<Tin, Tw, Tdy>(p, nvec, blocks, stream);
  } else {
    err = launch_kernel(rmsnorm_bwd_scalar<Tin, Tw, Tdy>, dim3(unsigned(blocks)), dim3(kThreads), 0, stream,
                        dependent_launch_enabled(), p);
  }
  if (err != cudaSuccess || a.weight_partials == nullptr) return err;
  return column_sum(a.weight_partials, static_cast<Tw*>(a.grad_weight), 1, blocks, a.hidden, stream);
}

}  // namespace

int64_t rmsnorm_bwd_blocks(int64_t rows) { return wave_split_blocks(rows, 1); }

RmsnormPath rmsnorm_bwd_path(const RmsnormBwdArgs& a) {
  const int64_t n = 16 / dtype_size(a.input_dtype);  // elements per 16-byte word
  const bool ok = a.hidden % n == 0 && a.hidden / n <= int64_t(kThreads) * rmsnorm_config::kBwdMaxWordsPerThread &&
                  is_aligned16(a.input) && is_aligned16(a.grad_out) && is_aligned16(a.grad_input) &&
                  (a.weight == nullptr || is_aligned16(a.weight));
  return ok ? RmsnormPath::kVectorized : RmsnormPath::kScalarFallback;
}

cudaError_t rmsnorm_bwd(const RmsnormBwdArgs& a, cudaStream_t stream) {
  if (a.rows == 0 || a.hidden == 0) return cudaSuccess;
  const auto same_or_f32 = [&](DType d) { return d == a.input_dtype || d == DType::kFloat32; };
  if ((a.weight != nullptr && !same_or_f32(a.weight_dtype)) || !same_or_f32(a.grad_out_dtype) ||
      (a.weight_partials != nullptr && (a.weight == nullptr || a.grad_weight == nullptr)))
    return cudaErrorInvalidValue;
  const bool w_same = a.weight == nullptr || a.weight_dtype == a.input_dtype;
  const bool dy_same = a.grad_out_dtype == a.input_dtype;
  return visit_dtype(a.input_dtype, [&](auto tin) -> cudaError_t {
    using Tin = typename decltype(tin)::type;
    if (w_same && dy_same) return launch<Tin, Tin, Tin>(a, stream);
    if (w_same) return launch<Tin, Tin, float>(a, stream);
    if (dy_same) return launch<Tin, float, Tin>(a, stream);
    return launch<Tin, float, float>(a, stream);
  });
}

}  // namespace ltx
