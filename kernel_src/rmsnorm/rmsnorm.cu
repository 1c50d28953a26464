// RMSNorm over the last dimension.
//
//   r = rsqrt(mean(x_f32^2) + eps)
//   y = T_out(x_f32 * r * w_f32)                 (round_before_weight = false)
//   y = T_out(float(T_in(x_f32 * r)) * w_f32)    (round_before_weight = true)
//
// Fast path: each row is held in registers as 16-byte words, read from HBM
// once; TPR threads share a row (a fraction of a warp for short rows, several
// warps for long ones) and reduce with shuffles. Fallback: any size or
// alignment, scalar accesses, the row read twice (the second read hits L1/L2).
// Both store each row's r to `rstd` when given (rmsnorm_fwd, for the backward).
#include "../common/launch.cuh"
#include "rmsnorm.h"
#include "rmsnorm_config.h"

namespace ltx {
namespace {

struct Params {
  void* out;
  const void* input;
  const void* weight;
  int64_t rows, hidden, in_stride, out_stride;
  float eps;
  bool round_before_weight;
  float* rstd;  // nullptr, or [rows]: r of each row (for the backward)
};

template <typename Tin, typename Tw, typename Tout>
__device__ __forceinline__ float finish(float x, float r, const Tw* w, int64_t col, bool round_before_weight) {
  float n = x * r;
  if (w == nullptr) return n;
  if (round_before_weight) n = round_through<Tin>(n);
  return n * to_float(w[col]);
}

// Blocks per SM asked of ptxas: rmsnorm_config at one word per thread, else 1.
template <int TPR, int VPT, GpuClass kGpu>
constexpr int rmsnorm_min_blocks() {
  return VPT == 1 ? rmsnorm_config::min_blocks_one_word<row_block_threads<TPR>(), kGpu>() : 1;
}

// Persistent: the grid is sized to what fits on the GPU at once and each
// group of TPR threads walks rows with a grid stride, loading its next row
// before it reduces and stores the current one, so reads stay in flight while
// results are written and no partial last wave is left.
template <typename Tin, typename Tw, typename Tout, int TPR, int VPT, GpuClass kGpu>
__global__ void __launch_bounds__(row_block_threads<TPR>(), (rmsnorm_min_blocks<TPR, VPT, kGpu>()))
    rmsnorm_vectorized(Params p) {
  constexpr int kBlock = row_block_threads<TPR>();
  constexpr int kRows = kBlock / TPR;
  constexpr int N = 16 / sizeof(Tin);  // elements per 16-byte word of input
  const int lane = threadIdx.x % TPR;
  const int64_t nvec = p.hidden / N;
  const int64_t stride = int64_t(gridDim.x) * kRows;
  const Tw* w = static_cast<const Tw*>(p.weight);
  const Tin* input = static_cast<const Tin*>(p.input);
  pdl_wait_and_release();

  // The loop bound is the same for every thread of the block (row_sum may
  // synchronise the block); `active` masks rows past the end.
  int64_t row = int64_t(blockIdx.x) * kRows + threadIdx.x / TPR;
  uint4 raw[VPT];
  load_row_words<Tin, TPR, VPT>(raw, input + row * p.in_stride, lane, nvec, row < p.rows);
  // A thread's columns are the same in every row it takes: the weight's
  // words are read once, before the first reduction, and held.
  constexpr bool kHoldWeight = VPT <= 2;
  constexpr int kWeightWords = sizeof(Tw) / sizeof(Tin);  // 16-byte words of weight per word of input
  uint4 held_w[kHoldWeight ? VPT : 1][kWeightWords];
  if constexpr (kHoldWeight) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = lane + int64_t(i) * TPR;
#pragma unroll
      for (int k = 0; k < kWeightWords; ++k)
        if (w != nullptr && v < nvec) held_w[i][k] = reinterpret_cast<const uint4*>(w + v * N)[k];
    }
  }
  int64_t pass = 0;
  for (int64_t base = int64_t(blockIdx.x) * kRows; base < p.rows; base += stride, row += stride, ++pass) {
    const bool active = row < p.rows;
    uint4 next[VPT];
    const int64_t next_row = row + stride;
    load_row_words<Tin, TPR, VPT>(next, input + (next_row < p.rows ? next_row : 0) * p.in_stride, lane, nvec,
                            next_row < p.rows);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = lane + int64_t(i) * TPR;
      if (active && v < nvec) {
        float x[N];
        unpack_word<Tin>(raw[i], x);
#pragma unroll
        for (int j = 0; j < N; ++j) ss += x[j] * x[j];
      }
    }
    ss = row_sum<TPR, kRows>(ss, pass);  // all threads of the block take part
    const float r = rsqrtf(ss / float(p.hidden) + p.eps);
    if (p.rstd != nullptr && active && lane == 0) p.rstd[row] = r;
    Tout* out = static_cast<Tout*>(p.out) + row * p.out_stride;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = lane + int64_t(i) * TPR;
      if (!active || v >= nvec) continue;
      float x[N];
      unpack_word<Tin>(raw[i], x);
      float y[N];
      if (w != nullptr) {
        float wf[N];
        if constexpr (kHoldWeight) {
          const Tw* e = reinterpret_cast<const Tw*>(held_w[i]);
#pragma unroll
          for (int j = 0; j < N; ++j) wf[j] = to_float(e[j]);
        } else {
          load_vec<Tw, N>(w + v * N, wf);
        }
#pragma unroll
        for (int j = 0; j < N; ++j) {
          float n = x[j] * r;
          if (p.round_before_weight) n = round_through<Tin>(n);
          y[j] = n * wf[j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) y[j] = x[j] * r;
      }
      store_vec<Tout, N>(out + v * N, y);
    }
#pragma unroll
    for (int i = 0; i < VPT; ++i) raw[i] = next[i];
  }
}

// Any hidden size, any alignment: TPR threads per row walk it with scalar
// accesses, first for the sum of squares, then for the output.
template <typename Tin, typename Tw, typename Tout, int TPR>
__global__ void __launch_bounds__(row_block_threads<TPR>())
    rmsnorm_scalar(Params p) {
  constexpr int kBlock = row_block_threads<TPR>();
  constexpr int kRows = kBlock / TPR;
  const int lane = threadIdx.x % TPR;
  const int64_t row = int64_t(blockIdx.x) * kRows + threadIdx.x / TPR;
  const bool active = row < p.rows;
  const Tin* in = static_cast<const Tin*>(p.input) + (active ? row * p.in_stride : 0);
  float ss = 0.f;
  if (active)
    for (int64_t c = lane; c < p.hidden; c += TPR) {
      const float x = to_float(in[c]);
      ss += x * x;
    }
  ss = row_sum<TPR, kRows>(ss);
  if (!active) return;
  const float r = rsqrtf(ss / float(p.hidden) + p.eps);
  if (p.rstd != nullptr && lane == 0) p.rstd[row] = r;
  const Tw* w = static_cast<const Tw*>(p.weight);
  Tout* out = static_cast<Tout*>(p.out) + row * p.out_stride;
  for (int64_t c = lane; c < p.hidden; c += TPR)
    out[c] = from_float<Tout>(finish<Tin, Tw, Tout>(to_float(in[c]), r, w, c, p.round_before_weight));
}

template <typename Tin, typename Tw, typename Tout, int TPR, int VPT>
cudaError_t launch_vectorized(const Params& p, cudaStream_t stream) {
  constexpr int kRows = row_block_threads<TPR>() / TPR;
  const GpuClass gpu = gpu_class();
  // Only the one-word kernels differ by GPU class (rmsnorm_min_blocks).
  auto kernel = rmsnorm_vectorized<Tin, Tw, Tout, TPR, VPT, GpuClass::kH100>;
  if constexpr (VPT == 1)
    if (gpu == GpuClass::kH200) kernel = rmsnorm_vectorized<Tin, Tw, Tout, TPR, VPT, GpuClass::kH200>;
  const int64_t grid = plan_grid(kernel, row_block_threads<TPR>(), ceil_div(p.rows, kRows),
                                 rmsnorm_config::grid_plan(gpu, row_block_threads<TPR>()));
  if (grid < 0) return cudaGetLastError();
  return launch_kernel(kernel, dim3(unsigned(grid)), dim3(row_block_threads<TPR>()), 0, stream,
                       dependent_launch_enabled(), p);
}

template <typename Tin, typename Tw, typename Tout, int TPR>
cudaError_t launch_scalar(const Params& p, cudaStream_t stream) {
  constexpr int kRows = row_block_threads<TPR>() / TPR;
  rmsnorm_scalar<Tin, Tw, Tout, TPR>
      <<<dim3(unsigned(ceil_div(p.rows, kRows))), row_block_threads<TPR>(), 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename Tin, typename Tw, typename Tout, int TPR>
cudaError_t launch_with_tpr(const Params& p, int64_t nvec, cudaStream_t stream) {
  const int64_t vpt = ceil_div(nvec, TPR);  // 16-byte words each thread holds
  if (vpt <= 1) return launch_vectorized<Tin, Tw, Tout, TPR, 1>(p, stream);
  if (vpt <= 2) return launch_vectorized<Tin, Tw, Tout, TPR, 2>(p, stream);
  if (vpt <= 4) return launch_vectorized<Tin, Tw, Tout, TPR, 4>(p, stream);
  return launch_vectorized<Tin, Tw, Tout, TPR, 8>(p, stream);
}

template <typename Tin, typename Tw, typename Tout>
cudaError_t launch_for_width(const Params& p, int64_t nvec, cudaStream_t stream) {
  switch (rmsnorm_config::threads_per_row(nvec)) {
    case 8: return launch_with_tpr<Tin, Tw, Tout, 8>(p, nvec, stream);
    case 16: return launch_with_tpr<Tin, Tw, Tout, 16>(p, nvec, stream);
    case 32: return launch_with_tpr<Tin, Tw, Tout, 32>(p, nvec, stream);
    case 64: return launch_with_tpr<Tin, Tw, Tout, 64>(p, nvec, stream);
    case 128: return launch_with_tpr<Tin, Tw, Tout, 128>(p, nvec, stream);
    case 256: return launch_with_tpr<Tin, Tw, Tout, 256>(p, nvec, stream);
    case 384: return launch_vectorized<Tin, Tw, Tout, 384, 1>(p, stream);
    case 512: return launch_with_tpr<Tin, Tw, Tout, 512>(p, nvec, stream);
    case 640: return launch_vectorized<Tin, Tw, Tout, 640, 1>(p, stream);
    case 768: return launch_vectorized<Tin, Tw, Tout, 768, 1>(p, stream);
    default: return launch_with_tpr<Tin, Tw, Tout, 1024>(p, nvec, stream);
  }
}

constexpr int64_t kMaxVectorizedWords = 1024 * 8;

template <typename Tin, typename Tw, typename Tout>
cudaError_t launch(const RmsnormArgs& a, cudaStream_t stream) {
  const Params p{a.out, a.input, a.weight, a.rows, a.hidden, a.input_row_stride, a.out_row_stride, a.eps,
                 a.round_before_weight, a.rstd};
  if (rmsnorm_path(a) == RmsnormPath::kVectorized) {
    return launch_for_width<Tin, Tw, Tout>(p, a.hidden / (16 / int64_t(sizeof(Tin))), stream);
  }
  if (a.hidden <= 1024) return launch_scalar<Tin, Tw, Tout, 32>(p, stream);
  return launch_scalar<Tin, Tw, Tout, 256>(p, stream);
}

}  // namespace

RmsnormPath rmsnorm_path(const RmsnormArgs& a) {
  const int64_t n = 16 / dtype_size(a.input_dtype);  // elements per 16-byte word
  const bool ok = a.hidden % n == 0 && a.hidden / n <= kMaxVectorizedWords && a.input_row_stride % n == 0 &&
                  a.out_row_stride % n == 0 && is_aligned16(a.input) && is_aligned16(a.out) &&
                  (a.weight == nullptr || is_aligned16(a.weight));
  return ok ? RmsnormPath::kVectorized : RmsnormPath::kScalarFallback;
}

cudaError_t rmsnorm(const RmsnormArgs& a, cudaStream_t stream) {
  if (a.rows == 0 || a.hidden == 0) return cudaSuccess;
  // Supported (input, weight, out): weight and out are either the input's
  // dtype or float32; without weight the weight dtype is ignored.
  const bool weight_ok = a.weight == nullptr || a.weight_dtype == a.input_dtype || a.weight_dtype == DType::kFloat32;
  const bool out_ok = a.out_dtype == a.input_dtype || a.out_dtype == DType::kFloat32;
  if (!weight_ok || !out_ok) return cudaErrorInvalidValue;
  const DType w_dt = a.weight == nullptr ? a.input_dtype : a.weight_dtype;
  return visit_dtype(a.input_dtype, [&](auto tin) -> cudaError_t {
    using Tin = typename decltype(tin)::type;
    const bool w_same = w_dt == a.input_dtype, out_same = a.out_dtype == a.input_dtype;
    if (w_same && out_same) return launch<Tin, Tin, Tin>(a, stream);
    if (w_same) return launch<Tin, Tin, float>(a, stream);
    if (out_same) return launch<Tin, float, Tin>(a, stream);
    return launch<Tin, float, float>(a, stream);
  });
}

}  // namespace ltx
