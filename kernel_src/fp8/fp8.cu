// FP8 producers (formulas in fp8.h): one block per row, the row read from HBM
// once and held in registers as float32 until its amax is known, then written
// as e4m3 bytes (half of a bf16 row) and one float32 scale.
#include <cuda_fp8.h>

#include "../activation/activation_math.cuh"
#include "../common/launch.cuh"
#include "../common/rows.cuh"
#include "fp8.h"
#include "fp8_config.h"

namespace ltx {
namespace {

constexpr float kE4m3Max = 448.f;

// The max of `v` over the block; every thread gets it. (Sums take device.cuh's row_sum, whose buffers
// are its own, so the two reductions of a row need no barrier between them.)
template <int THREADS> __device__ __forceinline__ float block_max(float v) {
  constexpr int kWarps = THREADS / 32;
  __shared__ float partial[kWarps];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = partial[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) total = fmaxf(total, partial[w]);
  return total;
}

// N float32 values as N e4m3 bytes (saturating), stored at p (N bytes, aligned to N).
template <int N> __device__ __forceinline__ void store_e4m3(uint8_t* p, const float (&v)[N], float inv) {
  uint32_t packed[N / 4];
#pragma unroll
  for (int k = 0; k < N / 4; ++k) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * k] * inv, v[4 * k + 1] * inv), __NV_SATFINITE,
                                                 __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * k + 2] * inv, v[4 * k + 3] * inv),
                                                 __NV_SATFINITE, __NV_E4M3);
    packed[k] = lo | (hi << 16);
  }
  if constexpr (N == 8) *reinterpret_cast<uint2*>(p) = make_uint2(packed[0], packed[1]);
  else *reinterpret_cast<uint32_t*>(p) = packed[0];
}

template <typename T, typename Tm, Fp8Producer P, bool kSum, int THREADS, int VPT>
__global__ void __launch_bounds__(THREADS) fp8_rows_kernel(Fp8RowsArgs a, float inv_hidden) {
  constexpr int N = 16 / sizeof(T);
  const uint32_t row = blockIdx.x;
  const RowIndex at = split_row(row, uint32_t(a.seq));
  const int nvec = int(a.hidden / N);
  const int lane = threadIdx.x;
  pdl_wait_and_release();

  uint4 x_raw[VPT], y_raw[VPT];
  load_row_words<T, THREADS, VPT>(x_raw, at_row<T>(a.x, at.b, at.s), lane, nvec, true);
  if constexpr (kSum) load_row_words<T, THREADS, VPT>(y_raw, at_row<T>(a.y, at.b, at.s), lane, nvec, true);

  float v[VPT][N];
  float ss = 0.f;
  const Tm* gate = kSum ? at_row_or_null<Tm>(a.gate, at.b, at.s) : nullptr;
  T* residual_out = kSum ? at_row<T>(a.residual_out, at.b, at.s) : nullptr;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int w = lane + i * THREADS;
    if (w >= nvec) continue;
    uint4 h = x_raw[i];
    if constexpr (kSum) {
      h = residual_word<T, Tm, true>(x_raw[i], y_raw[i], gate != nullptr, gate, w);
      reinterpret_cast<uint4*>(residual_out)[w] = h;
    }
    unpack_word<T>(h, v[i]);
    if constexpr (P == Fp8Producer::kModulatedRmsnorm) {
#pragma unroll
      for (int j = 0; j < N; ++j) ss += v[i][j] * v[i][j];
    }
  }

  if constexpr (P == Fp8Producer::kModulatedRmsnorm) {
    ss = row_sum<THREADS, 1>(ss);
    const float r = rsqrtf(__fadd_rn(__fmul_rn(ss, inv_hidden), a.eps));
    const T* weight = static_cast<const T*>(a.weight.ptr);
    const Tm* scale = at_row<Tm>(a.scale, at.b, at.s);
    const Tm* shift = at_row_or_null<Tm>(a.shift, at.b, at.s);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int w = lane + i * THREADS;
      if (w >= nvec) continue;
      float wt[N], sc[N], sh[N];
      load_or<T, N>(wt, weight != nullptr, weight, w, 1.f);
      load_or<Tm, N>(sc, true, scale, w, 0.f);
      load_or<Tm, N>(sh, shift != nullptr, shift, w, 0.f);
#pragma unroll
      for (int j = 0; j < N; ++j) v[i][j] = fmaf(v[i][j] * r * wt[j], 1.f + sc[j], sh[j]);
    }
  } else if constexpr (P == Fp8Producer::kModulatedLayernorm) {
    // mean, then the biased variance from the row in registers (row_sum's alternate buffers: passes 0, 1)
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (lane + i * THREADS >= nvec) continue;
#pragma unroll
      for (int j = 0; j < N; ++j) sum += v[i][j];
    }
    const float mean = row_sum<THREADS, 1>(sum, 0) * inv_hidden;
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (lane + i * THREADS >= nvec) continue;
#pragma unroll
      for (int j = 0; j < N; ++j) sq += (v[i][j] - mean) * (v[i][j] - mean);
    }
    const float r = rsqrtf(__fadd_rn(__fmul_rn(row_sum<THREADS, 1>(sq, 1), inv_hidden), a.eps));
    const Tm* scale = at_row_or_null<Tm>(a.scale, at.b, at.s);
    const Tm* shift = at_row_or_null<Tm>(a.shift, at.b, at.s);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int w = lane + i * THREADS;
      if (w >= nvec) continue;
      float wt[N], bs[N], sc[N], sh[N];
      load_affine<T, N>(wt, a.weight.ptr, a.weight_f32, w, 1.f);
      load_affine<T, N>(bs, a.bias.ptr, a.bias_f32, w, 0.f);
      load_or<Tm, N>(sc, scale != nullptr, scale, w, 0.f);
      load_or<Tm, N>(sh, shift != nullptr, shift, w, 0.f);
#pragma unroll
      for (int j = 0; j < N; ++j) v[i][j] = fmaf(fmaf((v[i][j] - mean) * r, wt[j], bs[j]), 1.f + sc[j], sh[j]);
    }
  } else if constexpr (P == Fp8Producer::kGeluTanh) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
#pragma unroll
      for (int j = 0; j < N; ++j) v[i][j] = activation_math::activate<Activation::kGeluTanhFast>(v[i][j]);
    }
  }

  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (lane + i * THREADS >= nvec) continue;
#pragma unroll
    for (int j = 0; j < N; ++j) amax = fmaxf(amax, fabsf(v[i][j]));
  }
  amax = block_max<THREADS>(amax);
  // amax / 448 as the dequantisation scale; a row of zeros (or one that
  // overflowed to inf/nan) keeps scale 1 / the non-finite amax, so it shows.
  const float row_scale = amax > 0.f ? __fdiv_rn(amax, kE4m3Max) : 1.f;
  const float inv = amax > 0.f ? __fdiv_rn(kE4m3Max, amax) : 1.f;
  uint8_t* data = static_cast<uint8_t*>(a.data) + int64_t(row) * a.hidden;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int w = lane + i * THREADS;
    if (w < nvec) store_e4m3<N>(data + int64_t(w) * N, v[i], inv);
  }
  if (lane == 0) a.row_scale[row] = row_scale;
}

template <typename T, typename Tm, Fp8Producer P, bool kSum>
cudaError_t launch_rows(const Fp8RowsArgs& a, cudaStream_t stream) {
  const int64_t words = a.hidden / (16 / int64_t(sizeof(T)));
  const fp8_config::RowShape shape = fp8_config::row_shape(words);
  const float inv_hidden = 1.f / float(a.hidden);
  const dim3 grid(unsigned(a.batch * a.seq));
  auto go = [&](auto kernel) {
    return launch_kernel(kernel, grid, dim3(shape.threads), 0, stream, dependent_launch_enabled(), a, inv_hidden);
  };
  if (shape.threads == 128) {
    if (shape.vpt == 1) return go(fp8_rows_kernel<T, Tm, P, kSum, 128, 1>);
    if (shape.vpt == 2) return go(fp8_rows_kernel<T, Tm, P, kSum, 128, 2>);
    return go(fp8_rows_kernel<T, Tm, P, kSum, 128, 4>);
  }
  if (shape.threads == 384) return go(fp8_rows_kernel<T, Tm, P, kSum, 384, 3>);
  if (shape.vpt == 4) return go(fp8_rows_kernel<T, Tm, P, kSum, 256, 4>);
  return go(fp8_rows_kernel<T, Tm, P, kSum, 256, 8>);
}

}  // namespace

int64_t fp8_max_hidden(DType dtype) { return fp8_config::kMaxWords * (16 / dtype_size(dtype)); }

cudaError_t fp8_rows(const Fp8RowsArgs& a, cudaStream_t stream) {
  if (a.batch * a.seq == 0 || a.hidden == 0) return cudaSuccess;
  if (a.hidden % 16 != 0 || a.hidden > fp8_max_hidden(a.dtype)) return cudaErrorInvalidValue;
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    switch (a.producer) {
      case Fp8Producer::kGeluTanh: return launch_rows<T, T, Fp8Producer::kGeluTanh, false>(a, stream);
      case Fp8Producer::kQuantize:
        if (a.y.ptr == nullptr) return launch_rows<T, T, Fp8Producer::kQuantize, false>(a, stream);
        break;  // the gated residual's rows: Tm below
      case Fp8Producer::kModulatedRmsnorm:
      case Fp8Producer::kModulatedLayernorm: break;
    }
    // Producers that read modulation (a gate, a scale): Tm is x's dtype or float32.
    auto with_mod = [&](auto mod_tag) -> cudaError_t {
      using Tm = typename decltype(mod_tag)::type;
      if (a.producer == Fp8Producer::kQuantize) return launch_rows<T, Tm, Fp8Producer::kQuantize, true>(a, stream);
      if (a.producer == Fp8Producer::kModulatedLayernorm) {
        if (a.y.ptr != nullptr) return launch_rows<T, Tm, Fp8Producer::kModulatedLayernorm, true>(a, stream);
        return launch_rows<T, Tm, Fp8Producer::kModulatedLayernorm, false>(a, stream);
      }
      if (a.y.ptr != nullptr) return launch_rows<T, Tm, Fp8Producer::kModulatedRmsnorm, true>(a, stream);
      return launch_rows<T, Tm, Fp8Producer::kModulatedRmsnorm, false>(a, stream);
    };
    if (a.mod_dtype == a.dtype || std::is_same_v<T, float>) return with_mod(TypeTag<T>{});
    if constexpr (!std::is_same_v<T, float>) return with_mod(TypeTag<float>{});
    return cudaErrorInvalidValue;
  });
}

}  // namespace ltx
