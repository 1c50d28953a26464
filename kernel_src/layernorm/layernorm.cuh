// LayerNorm, AdaLN LayerNorm and the gated-residual + LayerNorm seam: the
// kernels (formulas in layernorm.h). Included by the per-op .cu files
// (layernorm.cu, adaln_layernorm.cu, gated_residual_layernorm.cu), each of
// which instantiates its variant's launcher, so that nvcc compiles them in
// parallel.
//
// Plan (as fused_norm's row kernels): TPR threads per row, each row read from
// HBM once, the next row's 16-byte words loaded before the current row (held
// unpacked in float32) is reduced and written; two reductions per row (the
// mean, then the squared deviations from it: the two-pass variance of the row
// in registers, which a large mean cannot cancel as it does mean(h^2) -
// mean^2), each row's threads at a barrier of their own where
// layernorm_config::row_barrier says so. The launch choices (threads per row, grid) are made in
// layernorm_config.h. Weight, bias and modulation vectors are re-read per row
// and stay in L1/L2 (held in registers across rows they cost fused_norm 30-45
// registers and time).
//
// Fixed at compile time: the op (Variant) and the rounding mode (kExact; with
// float32 modulation the modes are one kernel). Operand presence (weight,
// bias, gate, scale, shift) and the weight's and bias's dtype are a branch per
// 16-byte word. Exact mode uses __fmul_rn/__fadd_rn (and __hmul2_rn /
// __hadd2_rn) so that nvcc cannot contract a multiply and an add into an FMA
// eager PyTorch does not do.
#pragma once

#include <type_traits>

#include "../common/launch.cuh"
#include "../common/rows.cuh"
#include "layernorm.h"
#include "layernorm_config.h"

namespace ltx {
namespace ln {

Variant variant_of(const LayerNormArgs& a);

// The kernel's rounding mode for a dtype pair: float32 modulation has one
// (every op rounded to float32, as Wan's eager code), so `exact` only matters
// for modulation of a half-precision x's own dtype.
template <typename T, typename Tm> constexpr bool kHasFastMode = !std::is_same_v<Tm, float>;

// The normalised value before modulation: n0 = d * rstd of the deviation d = h - mean, then
// torch's affine step: n0 * w + b as one FMA, n0 * w, or n0 + b.
template <int N>
__device__ __forceinline__ void normalise(const float (&d)[N], float rstd, const float (&w)[N], const float (&b)[N],
                                          bool has_weight, bool has_bias, float (&n)[N]) {
  float n0[N];
#pragma unroll
  for (int j = 0; j < N; ++j) n0[j] = __fmul_rn(d[j], rstd);
  if (has_weight && has_bias) {
#pragma unroll
    for (int j = 0; j < N; ++j) n[j] = fmaf(n0[j], w[j], b[j]);
  } else if (has_weight) {
#pragma unroll
    for (int j = 0; j < N; ++j) n[j] = __fmul_rn(n0[j], w[j]);
  } else if (has_bias) {
#pragma unroll
    for (int j = 0; j < N; ++j) n[j] = __fadd_rn(n0[j], b[j]);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) n[j] = n0[j];
  }
}

// out = modulate(n) before its rounding to T, unpacked (fast mode, float32
// modulation, the scalar path): exact with half modulation
// T(T(T(n) * T(1 + scale)) + shift); exact with float32 modulation (Wan)
// float32 ops without FMA; fast one FMA.
template <typename T, typename Tm, bool kExact>
__device__ __forceinline__ float modulate(float n, float scale, float shift, bool has_shift) {
  if constexpr (kExact) {
    const float u = eager_round<T, Tm, kExact>(
        __fmul_rn(eager_round<T, Tm, kExact>(n), eager_round<T, Tm, kExact>(__fadd_rn(1.f, scale))));
    return has_shift ? __fadd_rn(u, shift) : u;
  } else {
    return fmaf(n, 1.f + scale, shift);  // shift is 0 when absent
  }
}

// The row's statistics for the backward (the *_fwd ops; null in inference).
__device__ __forceinline__ void save_stats(const LayerNormArgs& a, int64_t row, float mean, float rstd) {
  a.mean[row] = mean;
  a.rstd[row] = rstd;
}

// A row operand can be read (written) as 16-byte words of a dtype of `elem_size` bytes.
inline bool vector_ok(const void* ptr, int64_t batch_stride, int64_t seq_stride, int elem_size) {
  if (ptr == nullptr) return true;
  const int64_t n = 16 / elem_size;
  return is_aligned16(ptr) && batch_stride % n == 0 && seq_stride % n == 0;
}
inline bool vector_ok(const RowIn& t, int elem_size) {
  return vector_ok(t.ptr, t.batch_stride, t.seq_stride, elem_size);
}
inline bool vector_ok(const RowOut& t, int elem_size) {
  return vector_ok(t.ptr, t.batch_stride, t.seq_stride, elem_size);
}

// One element of an affine vector (the scalar path).
template <typename T> __device__ __forceinline__ float affine_at(const void* ptr, bool f32, int64_t c, float fill) {
  if (ptr == nullptr) return fill;
  return f32 ? static_cast<const float*>(ptr)[c] : to_float(static_cast<const T*>(ptr)[c]);
}

// The rows of one block, TPR threads each, VPT words per thread: the kernel of
// every variant on the vectorized path.
template <typename T, typename Tm, bool kExact, Variant V, int TPR, int VPT>
__global__ void __launch_bounds__(row_block_threads<TPR>(), layernorm_config::row_min_blocks(TPR, VPT))
    layernorm_rows(LayerNormArgs a, float inv_hidden) {
  constexpr int kRows = row_block_threads<TPR>() / TPR;
  constexpr int N = 16 / sizeof(T);
  constexpr bool kSeam = V == Variant::kGatedResidualLayerNorm;
  const int lane = threadIdx.x % TPR;
  const int nvec = int(a.hidden / N);
  const uint32_t rows = uint32_t(a.batch * a.seq), seq = uint32_t(a.seq);
  const uint32_t stride = gridDim.x * kRows;
  const bool has_gate = kSeam && a.gate.ptr != nullptr;
  const bool has_scale = V == Variant::kAdalnLayerNorm || (kSeam && a.scale.ptr != nullptr);
  const bool has_shift = a.shift.ptr != nullptr;
  const bool has_weight = a.weight.ptr != nullptr, has_bias = a.bias.ptr != nullptr;
  pdl_wait_and_release();

  uint32_t row = blockIdx.x * kRows + threadIdx.x / TPR;
  // (b, s) of `row`, advanced by `stride` rows per iteration without a
  // division (rows past the end get indices past the end and are not read).
  const RowStep step = row_step(stride, seq);
  RowIndex at = split_row(row, seq);
  uint4 x_raw[VPT], y_raw[VPT];
  load_row_words<T, TPR, VPT>(x_raw, at_row<T>(a.x, at.b, at.s), lane, nvec, row < rows);
  if constexpr (kSeam) load_row_words<T, TPR, VPT>(y_raw, at_row<T>(a.y, at.b, at.s), lane, nvec, row < rows);
  // The loop bound is uniform across the block (row_sum may synchronise it).
  uint32_t pass = 0;
  for (uint32_t first = blockIdx.x * kRows; first < rows; first += stride, row += stride, ++pass) {
    const bool active = row < rows;
    const uint32_t next = row + stride;
    const RowIndex next_at = step.advance(at);
    uint4 x_next[VPT], y_next[VPT];
    load_row_words<T, TPR, VPT>(x_next, at_row<T>(a.x, next_at.b, next_at.s), lane, nvec, next < rows);
    if constexpr (kSeam)
      load_row_words<T, TPR, VPT>(y_next, at_row<T>(a.y, next_at.b, next_at.s), lane, nvec, next < rows);

    // h = x, or T(x + y * gate) written to residual_out; unpacked once, then held as its deviation from
    // the mean (each pass re-unpacking the words cost the H200 issue slots: docs/performance.md#layernorm).
    float d[VPT][N];
    float sum = 0.f;
    {
      const Tm* gate = has_gate ? at_row<Tm>(a.gate, at.b, at.s) : nullptr;
      T* residual_out = kSeam ? at_row<T>(a.residual_out, at.b, at.s) : nullptr;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int v = lane + i * TPR;
        if (!active || v >= nvec) continue;
        uint4 h_raw = x_raw[i];
        if constexpr (kSeam) {
          h_raw = residual_word<T, Tm, kExact>(x_raw[i], y_raw[i], has_gate, gate, v);
          reinterpret_cast<uint4*>(residual_out)[v] = h_raw;
        }
        unpack_word<T>(h_raw, d[i]);
#pragma unroll
        for (int j = 0; j < N; ++j) sum += d[i][j];
      }
    }
    // Every thread of the block takes part in both reductions.
    constexpr bool kRowBarrier = layernorm_config::row_barrier(V);
    const float mean = __fmul_rn(row_sum<TPR, kRows, kRowBarrier>(sum, 2 * pass), inv_hidden);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = lane + i * TPR;
      if (!active || v >= nvec) continue;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        d[i][j] = __fsub_rn(d[i][j], mean);
        ss = fmaf(d[i][j], d[i][j], ss);
      }
    }
    const float var = __fmul_rn(row_sum<TPR, kRows, kRowBarrier>(ss, 2 * pass + 1), inv_hidden);
    const float rstd = rsqrtf(__fadd_rn(var, a.eps));
    if (a.rstd != nullptr && active && lane == 0) save_stats(a, row, mean, rstd);

    if (active) {
      const Tm* scale = has_scale ? at_row<Tm>(a.scale, at.b, at.s) : nullptr;
      const Tm* shift = has_shift ? at_row<Tm>(a.shift, at.b, at.s) : nullptr;
      T* out = at_row<T>(a.out, at.b, at.s);
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int v = lane + i * TPR;
        if (v >= nvec) continue;
        float w[N], b[N], n[N];
        load_affine<T, N>(w, a.weight.ptr, a.weight_f32, v, 1.f);
        load_affine<T, N>(b, a.bias.ptr, a.bias_f32, v, 0.f);
        normalise<N>(d[i], rstd, w, b, has_weight, has_bias, n);
        uint4 o;
        if (!has_scale) {
          o = pack_word<T>(n);
        } else if constexpr (kPacked<T, Tm, kExact>) {
          // out = T(T(T(n) * T(1 + scale)) + shift), on pairs (HMUL2 / HADD2).
          o = mul_words<T>(pack_word<T>(n), add_words<T>(filled_word<T>(1.f), load_word(scale, v)));
          if (has_shift) o = add_words<T>(o, load_word(shift, v));
        } else {
          float sc[N], sh[N], m[N];
          load_or<Tm, N>(sc, true, scale, v, 0.f);
          load_or<Tm, N>(sh, has_shift, shift, v, 0.f);
#pragma unroll
          for (int j = 0; j < N; ++j) m[j] = modulate<T, Tm, kExact>(n[j], sc[j], sh[j], has_shift);
          o = pack_word<T>(m);
        }
        reinterpret_cast<uint4*>(out)[v] = o;
      }
    }
    at = next_at;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      x_raw[i] = x_next[i];
      if constexpr (kSeam) y_raw[i] = y_next[i];
    }
  }
}

template <typename T, typename Tm, Variant V, int TPR, int VPT> auto row_kernel(bool exact) {
  if constexpr (kHasFastMode<T, Tm> && V != Variant::kLayerNorm)
    return exact ? layernorm_rows<T, Tm, true, V, TPR, VPT> : layernorm_rows<T, Tm, false, V, TPR, VPT>;
  else
    return layernorm_rows<T, Tm, true, V, TPR, VPT>;
}

template <typename T, typename Tm, Variant V, int TPR, int VPT>
cudaError_t launch_vectorized(const LayerNormArgs& a, float inv_hidden, cudaStream_t stream) {
  constexpr int kBlock = row_block_threads<TPR>();
  const GridPlan plan = layernorm_config::grid_plan(V, gpu_class(), kBlock, TPR);
  auto kernel = row_kernel<T, Tm, V, TPR, VPT>(a.exact);
  const int64_t grid = plan_grid(kernel, kBlock, ceil_div(a.batch * a.seq, kBlock / TPR), plan);
  if (grid < 0) return cudaGetLastError();
  return launch_kernel(kernel, dim3(unsigned(grid)), dim3(kBlock), 0, stream, dependent_launch_enabled(), a,
                       inv_hidden);
}

// Words per thread for TPR threads on a row of `nvec` words: 1 or 2, and up to
// kMaxVpt at kMaxTpr (layernorm_config::threads_per_row keeps within these).
template <typename T, typename Tm, Variant V, int TPR>
cudaError_t launch_with_tpr(const LayerNormArgs& a, int64_t nvec, float inv_hidden, cudaStream_t stream) {
  const int64_t vpt = ceil_div(nvec, TPR);
  if (vpt <= 1) return launch_vectorized<T, Tm, V, TPR, 1>(a, inv_hidden, stream);
  if (vpt <= 2) return launch_vectorized<T, Tm, V, TPR, 2>(a, inv_hidden, stream);
  if constexpr (TPR == kMaxTpr) {
    if (vpt <= kMaxVpt) return launch_vectorized<T, Tm, V, TPR, kMaxVpt>(a, inv_hidden, stream);
  }
  return cudaErrorInvalidValue;
}

// Any hidden size or alignment: scalar accesses, three passes over the row
// (the later ones re-read it, from L1/L2). h is re-read from residual_out
// (which may alias x) once written.
template <typename T, typename Tm, bool kExact, Variant V, int TPR>
__global__ void __launch_bounds__(row_block_threads<TPR>()) layernorm_scalar(LayerNormArgs a, float inv_hidden) {
  constexpr int kRows = row_block_threads<TPR>() / TPR;
  constexpr bool kSeam = V == Variant::kGatedResidualLayerNorm;
  const int lane = threadIdx.x % TPR;
  const int64_t row = int64_t(blockIdx.x) * kRows + threadIdx.x / TPR;
  const bool active = row < a.batch * a.seq;
  const RowIndex at = split_row(uint32_t(active ? row : 0), uint32_t(a.seq));
  const T* x = at_row<T>(a.x, at.b, at.s);
  const T* y = kSeam ? at_row<T>(a.y, at.b, at.s) : nullptr;
  const Tm* gate = kSeam ? at_row_or_null<Tm>(a.gate, at.b, at.s) : nullptr;
  T* residual_out = kSeam ? at_row<T>(a.residual_out, at.b, at.s) : nullptr;
  pdl_wait_and_release();
  auto h_at = [&](int64_t c) { return kSeam ? to_float(residual_out[c]) : to_float(x[c]); };

  float sum = 0.f;
  if (active)
    for (int64_t c = lane; c < a.hidden; c += TPR) {
      float h;
      if constexpr (kSeam) {
        h = round_through<T>(gated_sum<T, Tm, kExact>(to_float(x[c]), to_float(y[c]), gate ? to_float(gate[c]) : 1.f,
                                                      gate != nullptr));
        residual_out[c] = from_float<T>(h);
      } else {
        h = to_float(x[c]);
      }
      sum += h;
    }
  const float mean = __fmul_rn(row_sum<TPR, kRows>(sum, 0), inv_hidden);
  float ss = 0.f;
  if (active)
    for (int64_t c = lane; c < a.hidden; c += TPR) {
      const float d = __fsub_rn(h_at(c), mean);
      ss = fmaf(d, d, ss);
    }
  const float var = __fmul_rn(row_sum<TPR, kRows>(ss, 1), inv_hidden);
  if (!active) return;
  const float rstd = rsqrtf(__fadd_rn(var, a.eps));
  if (a.rstd != nullptr && lane == 0) save_stats(a, row, mean, rstd);
  const bool has_scale = V == Variant::kAdalnLayerNorm || (kSeam && a.scale.ptr != nullptr);
  const Tm* scale = has_scale ? at_row<Tm>(a.scale, at.b, at.s) : nullptr;
  const Tm* shift = at_row_or_null<Tm>(a.shift, at.b, at.s);
  T* out = at_row<T>(a.out, at.b, at.s);
  for (int64_t c = lane; c < a.hidden; c += TPR) {
    const float d[1] = {__fsub_rn(h_at(c), mean)};
    const float w[1] = {affine_at<T>(a.weight.ptr, a.weight_f32, c, 1.f)};
    const float b[1] = {affine_at<T>(a.bias.ptr, a.bias_f32, c, 0.f)};
    float n[1];
    normalise<1>(d, rstd, w, b, a.weight.ptr != nullptr, a.bias.ptr != nullptr, n);
    out[c] = from_float<T>(has_scale ? modulate<T, Tm, kExact>(n[0], to_float(scale[c]),
                                                                shift ? to_float(shift[c]) : 0.f, shift != nullptr)
                                     : n[0]);
  }
}

template <typename T, typename Tm, Variant V>
cudaError_t launch_scalar(const LayerNormArgs& a, float inv_hidden, cudaStream_t stream) {
  const int64_t rows = a.batch * a.seq;
  auto pick = [&](auto tpr_tag) {
    constexpr int kTpr = decltype(tpr_tag)::value;
    if constexpr (kHasFastMode<T, Tm> && V != Variant::kLayerNorm)
      return a.exact ? layernorm_scalar<T, Tm, true, V, kTpr> : layernorm_scalar<T, Tm, false, V, kTpr>;
    else
      return layernorm_scalar<T, Tm, true, V, kTpr>;
  };
  if (a.hidden <= 1024) {
    constexpr int kBlock = row_block_threads<32>();
    return launch_kernel(pick(std::integral_constant<int, 32>{}), dim3(unsigned(ceil_div(rows, kBlock / 32))),
                         dim3(kBlock), 0, stream, dependent_launch_enabled(), a, inv_hidden);
  }
  return launch_kernel(pick(std::integral_constant<int, 256>{}), dim3(unsigned(rows)), dim3(256), 0, stream,
                       dependent_launch_enabled(), a, inv_hidden);
}

// Launch variant V for the dtype pair of `a` on the path layernorm_path picks.
template <Variant V> cudaError_t launch_variant(const LayerNormArgs& a, float inv_hidden, cudaStream_t stream) {
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    auto with_mod = [&](auto mod_tag) -> cudaError_t {
      using Tm = typename decltype(mod_tag)::type;
      if (layernorm_path(a) != LayerNormPath::kVectorized) return launch_scalar<T, Tm, V>(a, inv_hidden, stream);
      const int64_t nvec = a.hidden / (16 / int64_t(sizeof(T)));
      const int tpr = layernorm_config::threads_per_row(nvec, V, gpu_class());
      if constexpr (!reads_y(V)) {
        constexpr int kWide = layernorm_config::kWideRowThreads;
        if (tpr == kWide && nvec == layernorm_config::kWideRowWords)
          return launch_vectorized<T, Tm, V, kWide, layernorm_config::kWideRowWords / kWide>(a, inv_hidden, stream);
      }
      switch (tpr) {
        case 32: return launch_with_tpr<T, Tm, V, 32>(a, nvec, inv_hidden, stream);
        case 64: return launch_with_tpr<T, Tm, V, 64>(a, nvec, inv_hidden, stream);
        case 96: return launch_with_tpr<T, Tm, V, 96>(a, nvec, inv_hidden, stream);
        case 128: return launch_with_tpr<T, Tm, V, 128>(a, nvec, inv_hidden, stream);
        case 192: return launch_with_tpr<T, Tm, V, 192>(a, nvec, inv_hidden, stream);
        case 256: return launch_with_tpr<T, Tm, V, 256>(a, nvec, inv_hidden, stream);
        case 320: return launch_with_tpr<T, Tm, V, 320>(a, nvec, inv_hidden, stream);
        case 384: return launch_with_tpr<T, Tm, V, 384>(a, nvec, inv_hidden, stream);
        case 640: return launch_with_tpr<T, Tm, V, 640>(a, nvec, inv_hidden, stream);
        case kMaxTpr: return launch_with_tpr<T, Tm, V, kMaxTpr>(a, nvec, inv_hidden, stream);
        default: return cudaErrorInvalidValue;
      }
    };
    // plain LayerNorm has no modulation tensors; float32 x has float32 modulation only.
    if (V == Variant::kLayerNorm || a.mod_dtype == a.dtype || std::is_same_v<T, float>) return with_mod(TypeTag<T>{});
    if constexpr (V != Variant::kLayerNorm && !std::is_same_v<T, float>) return with_mod(TypeTag<float>{});
    return cudaErrorInvalidValue;
  });
}

// Each variant's launcher is instantiated in exactly one .cu of this family.
#define LTX_LAYERNORM_INSTANTIATE(V) \
  template cudaError_t launch_variant<V>(const LayerNormArgs&, float, cudaStream_t);

extern template cudaError_t launch_variant<Variant::kLayerNorm>(const LayerNormArgs&, float, cudaStream_t);
extern template cudaError_t launch_variant<Variant::kAdalnLayerNorm>(const LayerNormArgs&, float, cudaStream_t);
extern template cudaError_t launch_variant<Variant::kGatedResidualLayerNorm>(const LayerNormArgs&, float,
                                                                             cudaStream_t);

}  // namespace ln
}  // namespace ltx
