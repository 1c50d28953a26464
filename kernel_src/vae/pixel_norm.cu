// Pixel norm: RMS over the channel dim of a contiguous [outer, C, S] tensor
// (C = dim 1 of NCDHW, S = D*H*W), a reduction with stride S.
//
//   diffusers (original = false): y = T(x * rsqrt(mean_C(x^2) + eps)), fp32
//   original  (original = true):  sq = T(x*x); m = T(mean_C(sq));
//                                 d = T(sqrt(T(m + eps))); y = T(x / d)
//
// The positions of one channel plane are contiguous, so a 16-byte word holds
// N = 16/sizeof(T) consecutive positions of one channel. Vectorized path: a
// block covers `pw` position words x `groups` channel groups; each thread
// keeps CPT channel words of its position word in registers (x is read from
// HBM once), the per-position sums are reduced over the groups with shuffles
// and shared memory, then each thread scales and stores its words. Fallback
// (S not a multiple of N, misaligned pointers, C > 8 * 256): scalar accesses,
// 32 positions x 8 channel groups per block, x read twice (the second read
// mostly from L2).
#include <type_traits>

#include "../common/launch.cuh"
#include "pixel_norm.h"
#include "vae_config.h"

namespace ltx {
namespace {

using vae_config::kMaxBlock;
using vae_config::kMaxGroups;
using vae_config::kMaxWordsPerThread;
using vae_config::kScalarGroups;
using vae_config::kScalarPositions;

struct Params {
  void* out;
  const void* input;
  int64_t channels, spatial;
  int64_t units_per_plane;  // positions (scalar path) or position words (vectorized) per [c] plane
  int64_t units;            // outer * units_per_plane
  int pw, groups;           // block = pw units x groups channel groups, tid = unit + pw * group
  float eps;
  float mean_factor;
};

// Sums acc[] over the channel groups of a block laid out as tid = u + pw * g
// (pw a power of two <= 32, block a multiple of 32 threads): first over the
// groups that share a warp (shuffles), then over warps (shared memory, one
// thread per sum). Every thread of the block must call it; on return each
// holds finish(total) for the sums of its unit u (finish runs once per sum,
// not once per group). The order is fixed, so results are deterministic.
// smem: (warps + 1) * pw * NV floats.
template <int NV, typename Finish>
__device__ __forceinline__ void sum_over_groups(float (&acc)[NV], int u, int pw, float* smem, Finish finish) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int width = pw * NV;  // sums per group
  for (int offset = pw; offset < 32; offset *= 2) {
#pragma unroll
    for (int j = 0; j < NV; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], offset);
  }
  float* partial = smem;                  // [warps][width]
  float* total = smem + warps * width;    // [width]
  if (lane < pw) {                        // lanes 0..pw-1 are units 0..pw-1 of the warp's first group
#pragma unroll
    for (int j = 0; j < NV; ++j) partial[warp * width + lane * NV + j] = acc[j];
  }
  __syncthreads();
  // One thread per sum, all sums at once: a warp per sum, in turn, kept the
  // block (with no loads in flight) waiting through 4 shuffle trees and
  // finishes in a row (H100, original rounding: 122.6 -> 117.5 us at
  // [1,128,25,128,192], 33.6 -> 31.6 at [1,256,13,64,96]).
  for (int o = threadIdx.x; o < width; o += blockDim.x) {
    float v = partial[o];
    for (int w = 1; w < warps; ++w) v += partial[w * width + o];
    total[o] = finish(v);
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < NV; ++j) acc[j] = total[u * NV + j];
}

template <typename T, bool kOriginal> __device__ __forceinline__ float square(float x) {
  return kOriginal ? round_through<T>(x * x) : x * x;  // x**2 of a half tensor is rounded per element
}

// What each x of a position is multiplied by (diffusers) or divided by
// (original). The mean is sum * factor, as ATen's CUDA mean computes it.
template <typename T, bool kOriginal>
__device__ __forceinline__ float position_scale(float sum, const Params& p) {
  if constexpr (kOriginal) {
    const float m = round_through<T>(sum * p.mean_factor);
    return round_through<T>(__fsqrt_rn(round_through<T>(m + p.eps)));
  } else {
    return rsqrtf(sum * p.mean_factor + p.eps);
  }
}

template <bool kOriginal> __device__ __forceinline__ float apply_scale(float x, float s) {
  return kOriginal ? __fdiv_rn(x, s) : x * s;  // IEEE division, as torch's x / d
}

// torch's x / d (an fp32 IEEE quotient rounded to T) for a 2-byte x and a
// divisor d in [2^-14, 2^14] with r = RN(1 / d), without a division.
//
// bf16: the product x * r rounds to the same bf16. With x = X 2^a and d = D
// 2^b (X, D < 2^8 integers: both are bf16) and a bf16 rounding midpoint m =
// M 2^c (M odd, 2^8 <= M < 2^9), x / d - m = (X 2^a - M D 2^(b+c)) / d is
// never 0 (X's odd part is < 2^8 <= M) and, near m, at least 2^(b+c) / d,
// i.e. >= 2^-17 of m (1 / (D M)); x * r is within 2^-22.9 of x / d (one
// rounding in r, one in the product; below 2^-126 the product's absolute
// error 2^-150 is far under the midpoints' distance there, >= 2^-142). So x *
// r and torch's fp32 quotient lie on the same side of every midpoint, and
// neither is on one. (tests/test_vae_cpu.py checks every pair.)
//
// fp16 (11-bit significands) gets no margin from that argument, and the
// plain product does differ for some pairs: q = x' * r corrected once by an
// FMA (Markstein) is x' / d correctly rounded for x' = x * 2^64, which keeps
// x' and the quotient normal (|x| <= sqrt(C) * d < 2^20 as d is x's own
// channel RMS, so no overflow); scaling back rounds again only below 2^-126,
// where no fp16 quotient lands. x = -0 keeps its sign. Tested against torch
// for every bf16 and fp16 x below the divisor.
constexpr float kMinFastDivisor = 0x1p-14f, kMaxFastDivisor = 0x1p14f;
template <typename T> __device__ __forceinline__ float divide_in_range(float x, float d, float r) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __fmul_rn(x, r);
  const float xs = __fmul_rn(x, 0x1p64f);
  const float q = __fmul_rn(xs, r);
  const float corrected = __fmaf_rn(__fmaf_rn(-q, d, xs), r, q);
  const float y = __fmul_rn(corrected, 0x1p-64f);
  return __int_as_float(__float_as_int(y) | (__float_as_int(x) & int(0x80000000u)));
}

// kRegCap: at most 32 registers, 4 blocks of 512 threads per SM, where
// vae_config::register_capped says so. (No explicit minimum of 1 block
// otherwise: ptxas then took 40 registers instead of 32 for the diffusers
// kernel at 2 words.)
template <typename T, int CPT, bool kOriginal, bool kRegCap = false>
__global__ void __launch_bounds__(kMaxBlock, kRegCap ? 2 : 0) pixel_norm_vectorized(Params p) {
  constexpr int N = 16 / sizeof(T);
  constexpr bool kPackedOriginal = kOriginal && sizeof(T) == 2;
  extern __shared__ float smem[];
  const int u = threadIdx.x % p.pw, g = threadIdx.x / p.pw;
  const int64_t q = int64_t(blockIdx.x) * p.pw + u;  // global position word
  const bool active = q < p.units;
  const int64_t b = active ? q / p.units_per_plane : 0;
  const int64_t offset = b * p.channels * p.spatial + (active ? q - b * p.units_per_plane : 0) * N;
  // This thread's channels are g, g + groups, ...: `words` of them, `step` apart.
  // (channels <= 2048 on this path, so int arithmetic.)
  const int channels = int(p.channels);
  const int words = active && g < channels ? (channels - g + p.groups - 1) / p.groups : 0;
  const int64_t step = int64_t(p.groups) * p.spatial;
  const int64_t first = offset + g * p.spatial;
  const T* in = static_cast<const T*>(p.input) + first;

  pdl_wait_and_release();  // before the first read of x: the index math above needs nothing of the previous kernel
  // All loads are issued before any is used.
  uint4 raw[CPT];
#pragma unroll
  for (int i = 0; i < CPT; ++i)
    if (i < words) raw[i] = *reinterpret_cast<const uint4*>(in + i * step);
  float acc[N];
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j] = 0.f;
#pragma unroll
  for (int i = 0; i < CPT; ++i) {
    if (i >= words) continue;
    if constexpr (kPackedOriginal) {  // T(x * x) two at a time: one packed multiply, one rounding each
      const uint32_t* pairs = reinterpret_cast<const uint32_t*>(&raw[i]);
#pragma unroll
      for (int k = 0; k < N / 2; ++k) {
        const float2 sq = unpack_pair<T>(mul_pair<T>(pairs[k], pairs[k]));
        acc[2 * k] += sq.x;
        acc[2 * k + 1] += sq.y;
      }
    } else {
      float x[N];
      unpack_word<T>(raw[i], x);
#pragma unroll
      for (int j = 0; j < N; ++j) acc[j] += square<T, kOriginal>(x[j]);
    }
  }
  // The whole block takes part; acc becomes the per-position scale.
  sum_over_groups<N>(acc, u, p.pw, smem, [&](float sum) { return position_scale<T, kOriginal>(sum, p); });
  if (words == 0) return;
  // Keep the words packed across the reduction: without this the compiler
  // reuses the floats unpacked above (2x the registers) and spills at CPT 8.
#pragma unroll
  for (int i = 0; i < CPT; ++i) asm volatile("" : "+r"(raw[i].x), "+r"(raw[i].y), "+r"(raw[i].z), "+r"(raw[i].w));
  T* out = static_cast<T*>(p.out) + first;
  if constexpr (kPackedOriginal) {
    // The quotients in place, pair by pair of positions (one pair of
    // reciprocals live), by divide_in_range when every divisor of the word
    // allows it, else by IEEE divisions.
    auto divide_words = [&](auto divide) {
#pragma unroll
      for (int k = 0; k < N / 2; ++k) {
        const float d0 = acc[2 * k], d1 = acc[2 * k + 1];
        const float r0 = __frcp_rn(d0), r1 = __frcp_rn(d1);
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
          uint32_t& pair = reinterpret_cast<uint32_t*>(&raw[i])[k];
          const float2 x = unpack_pair<T>(pair);
          pair = pack_pair<T>(divide(x.x, d0, r0), divide(x.y, d1, r1));
        }
      }
#pragma unroll
      for (int i = 0; i < CPT; ++i)
        if (i < words) *reinterpret_cast<uint4*>(out + i * step) = raw[i];
    };
    bool in_range = true;
#pragma unroll
    for (int j = 0; j < N; ++j) in_range &= acc[j] >= kMinFastDivisor && acc[j] <= kMaxFastDivisor;
    if (in_range) divide_words(divide_in_range<T>);
    else divide_words([](float x, float d, float) { return __fdiv_rn(x, d); });
  } else {
#pragma unroll
    for (int i = 0; i < CPT; ++i) {
      if (i >= words) continue;
      float y[N];
      unpack_word<T>(raw[i], y);
#pragma unroll
      for (int j = 0; j < N; ++j) y[j] = apply_scale<kOriginal>(y[j], acc[j]);
      store_vec<T, N>(out + i * step, y);
    }
  }
}

template <typename T, bool kOriginal>
__global__ void __launch_bounds__(kScalarPositions * kScalarGroups) pixel_norm_scalar(Params p) {
  extern __shared__ float smem[];
  pdl_wait_and_release();
  const int u = threadIdx.x % kScalarPositions, g = threadIdx.x / kScalarPositions;
  const int64_t q = int64_t(blockIdx.x) * kScalarPositions + u;  // global position
  const bool active = q < p.units;
  const int64_t b = active ? q / p.spatial : 0;
  const int64_t offset = b * p.channels * p.spatial + (active ? q - b * p.spatial : 0);
  const T* in = static_cast<const T*>(p.input) + offset;
  float acc[1] = {0.f};
  if (active)
    for (int64_t c = g; c < p.channels; c += kScalarGroups) acc[0] += square<T, kOriginal>(to_float(in[c * p.spatial]));
  sum_over_groups<1>(acc, u, kScalarPositions, smem, [&](float sum) { return position_scale<T, kOriginal>(sum, p); });
  if (!active) return;
  const float s = acc[0];
  T* out = static_cast<T*>(p.out) + offset;
  for (int64_t c = g; c < p.channels; c += kScalarGroups)
    out[c * p.spatial] = from_float<T>(apply_scale<kOriginal>(to_float(in[c * p.spatial]), s));
}

size_t smem_bytes(int block, int pw, int nv) { return size_t(block / 32 + 1) * pw * nv * sizeof(float); }

template <typename T, int CPT, bool kOriginal> cudaError_t launch_vectorized(const Params& p, cudaStream_t stream) {
  const int block = p.pw * p.groups;
  const size_t smem = smem_bytes(block, p.pw, 16 / sizeof(T));
  const dim3 grid(unsigned(ceil_div(p.units, p.pw)));
  constexpr bool kCapped = vae_config::register_capped(kOriginal, CPT);
  // Development builds: the `pixel_norm.register_cap` override 0 runs the uncapped kernel (A/B).
  if constexpr (kCapped && tuning::kDevBuild) {
    if (tuning::override_of(tuning::Knob::kPixelNormRegisterCap) == 0)
      return launch_kernel(pixel_norm_vectorized<T, CPT, kOriginal, false>, grid, dim3(block), smem, stream,
                           dependent_launch_enabled(), p);
  }
  return launch_kernel(pixel_norm_vectorized<T, CPT, kOriginal, kCapped>, grid, dim3(block), smem, stream,
                       dependent_launch_enabled(), p);
}

template <typename T, bool kOriginal> cudaError_t launch_with_cpt(const Params& p, int cpt, cudaStream_t stream) {
  switch (cpt) {
    case 1: return launch_vectorized<T, 1, kOriginal>(p, stream);
    case 2: return launch_vectorized<T, 2, kOriginal>(p, stream);
    case 4: return launch_vectorized<T, 4, kOriginal>(p, stream);
    default: return launch_vectorized<T, 8, kOriginal>(p, stream);
  }
}

template <typename T, bool kOriginal> cudaError_t launch_scalar(const Params& p, cudaStream_t stream) {
  constexpr int kBlock = kScalarPositions * kScalarGroups;
  return launch_kernel(pixel_norm_scalar<T, kOriginal>, dim3(unsigned(ceil_div(p.units, kScalarPositions))),
                       dim3(kBlock), smem_bytes(kBlock, kScalarPositions, 1), stream, dependent_launch_enabled(), p);
}

int64_t words_per_position_plane(const PixelNormArgs& a) { return a.spatial / (16 / dtype_size(a.dtype)); }

}  // namespace

PixelNormPath pixel_norm_path(const PixelNormArgs& a) {
  const int64_t n = 16 / dtype_size(a.dtype);
  const bool ok = a.spatial % n == 0 && a.channels <= int64_t(kMaxWordsPerThread) * kMaxGroups &&
                  is_aligned16(a.input) && is_aligned16(a.out);
  return ok ? PixelNormPath::kVectorized : PixelNormPath::kScalarFallback;
}

cudaError_t pixel_norm(const PixelNormArgs& a, cudaStream_t stream) {
  if (a.outer == 0 || a.channels == 0 || a.spatial == 0) return cudaSuccess;
  // ATen's CUDA mean multiplies the sum by float(outputs) / numel (1/C in
  // float, unless the counts are not exact in float).
  const float factor = static_cast<float>(a.outer * a.spatial) / static_cast<float>(a.outer * a.channels * a.spatial);
  Params p{a.out, a.input, a.channels, a.spatial, 0, 0, 0, 0, a.eps, factor};
  const bool vectorized = pixel_norm_path(a) == PixelNormPath::kVectorized;
  vae_config::PixelNormPlan plan;
  if (vectorized) {
    int device = 0, sms = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    plan = vae_config::pixel_norm_plan(a.channels, a.outer * words_per_position_plane(a), sms);
    p.units_per_plane = words_per_position_plane(a);
    p.pw = plan.pos_words;
    p.groups = plan.groups;
  } else {
    p.units_per_plane = a.spatial;
    p.pw = kScalarPositions;
    p.groups = kScalarGroups;
  }
  p.units = a.outer * p.units_per_plane;
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    if (vectorized) {
      return a.original ? launch_with_cpt<T, true>(p, plan.words_per_thread, stream)
                        : launch_with_cpt<T, false>(p, plan.words_per_thread, stream);
    }
    return a.original ? launch_scalar<T, true>(p, stream) : launch_scalar<T, false>(p, stream);
  });
}

}  // namespace ltx
