// Device helpers shared by every op family: dtype conversion, 16-byte
// vector access, warp and row reductions. No torch headers here; the host
// side of a launch (grid plans, GPU classes) is in launch.cuh.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dtype.h"

namespace ltx {

template <typename T> struct TypeTag { using type = T; };

// Map the host-side DType enum onto the device element type and call
// `f(TypeTag<T>{})`. Returns cudaErrorInvalidValue for an unknown dtype.
template <typename F> cudaError_t visit_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::kFloat32: return f(TypeTag<float>{});
    case DType::kFloat16: return f(TypeTag<__half>{});
    case DType::kBFloat16: return f(TypeTag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

// The inverse of visit_dtype: the DType of a device element type.
template <typename T> constexpr DType dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>);
  return std::is_same_v<T, float> ? DType::kFloat32 : std::is_same_v<T, __half> ? DType::kFloat16 : DType::kBFloat16;
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// Round-to-nearest-even conversion, the rounding PyTorch's casts use.
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// The value `v` takes after a round trip through T (what an eager PyTorch op
// producing a T tensor does to an intermediate).
template <typename T> __device__ __forceinline__ float round_through(float v) {
  return to_float(from_float<T>(v));
}

// The two bf16 values of 32 bits as floats: one shift and one mask (the
// element-wise conversion extracts the high half first, a second instruction).
__device__ __forceinline__ float2 bf16_pair_to_float2(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

// Every element of a float array, nested to any depth (a backward's per-thread sums), set to 0.
__device__ __forceinline__ void zero_fill(float& x) { x = 0.f; }
template <typename A, int N> __device__ __forceinline__ void zero_fill(A (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) zero_fill(a[i]);
}

// Unpack one 16-byte word of T into the 16 / sizeof(T) floats at dst.
template <typename T> __device__ __forceinline__ void unpack_word(const uint4& raw, float* dst) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = bf16_pair_to_float2(u[k]);
      dst[2 * k] = f.x;
      dst[2 * k + 1] = f.y;
    }
  } else {
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < int(16 / sizeof(T)); ++j) dst[j] = to_float(e[j]);
  }
}

// N consecutive elements of T, read or written as 16-byte transactions.
// `p` must be 16-byte aligned and N * sizeof(T) a multiple of 16.
template <typename T, int N> __device__ __forceinline__ void load_vec(const T* p, float (&dst)[N]) {
  static_assert((N * sizeof(T)) % 16 == 0, "vector must be whole 16-byte words");
  constexpr int kWords = N * sizeof(T) / 16;
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    const uint4 raw = reinterpret_cast<const uint4*>(p)[w];  // a copy: one 128-bit load (see load_word)
    unpack_word<T>(raw, dst + w * (16 / sizeof(T)));
  }
}

// The packed two-element type of a 2-byte T (__nv_bfloat162, __half2).
template <typename T>
using PairOf = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;

// A pair of a 2-byte T as 32 bits: packed from floats (rounded), unpacked,
// multiplied elementwise with one rounding each (the eager T(float(x) * float(w))).
template <typename T> __device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  PairOf<T> p;
  if constexpr (std::is_same_v<T, __half>) p = __floats2half2_rn(lo, hi);
  else p = __floats2bfloat162_rn(lo, hi);
  return reinterpret_cast<const uint32_t&>(p);
}

template <typename T> __device__ __forceinline__ float2 unpack_pair(uint32_t u) {
  if constexpr (std::is_same_v<T, __half>) return __half22float2(reinterpret_cast<const __half2&>(u));
  else return bf16_pair_to_float2(u);
}

template <typename T> __device__ __forceinline__ uint32_t mul_pair(uint32_t x, uint32_t w) {
  const PairOf<T> y = __hmul2_rn(reinterpret_cast<const PairOf<T>&>(x), reinterpret_cast<const PairOf<T>&>(w));
  return reinterpret_cast<const uint32_t&>(y);
}

// Word v of a 16-byte-aligned array, as one 128-bit load. (Indexing a uint4
// array in place and handing the reference to code that views it as pairs
// let nvcc split the read into four 32-bit loads.)
template <typename T> __device__ __forceinline__ uint4 load_word(const T* p, int64_t v) {
  uint4 r;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(reinterpret_cast<const uint4*>(p) + v));
  return r;
}

// One 16-byte word holding 16 / sizeof(T) values rounded to T.
template <typename T> __device__ __forceinline__ uint4 pack_word(const float* src) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int j = 0; j < int(16 / sizeof(T)); ++j) e[j] = from_float<T>(src[j]);
  return raw;
}

// A 16-byte word of T with every element `v`.
template <typename T> __device__ __forceinline__ uint4 filled_word(float v) {
  float e[16 / sizeof(T)];
#pragma unroll
  for (int j = 0; j < int(16 / sizeof(T)); ++j) e[j] = v;
  return pack_word<T>(e);
}

template <typename T, int N> __device__ __forceinline__ void store_vec(T* p, const float (&src)[N]) {
  static_assert((N * sizeof(T)) % 16 == 0, "vector must be whole 16-byte words");
  constexpr int kWords = N * sizeof(T) / 16;
  constexpr int kPerWord = 16 / sizeof(T);
#pragma unroll
  for (int w = 0; w < kWords; ++w) reinterpret_cast<uint4*>(p)[w] = pack_word<T>(src + w * kPerWord);
}

// Row kernels put TPR threads on a row and at least this many threads in a
// block (several rows per block when TPR is smaller). TPR is a power of two
// or a multiple of 32 (a row of 192 or 384 words gets one thread per word).
constexpr int kMinRowBlockThreads = 256;
template <int TPR> __host__ __device__ constexpr int row_block_threads() {
  return TPR >= kMinRowBlockThreads ? TPR : TPR * ((kMinRowBlockThreads + TPR - 1) / TPR);
}

// The 16-byte words lane, lane + TPR, ... (VPT of them) of a row of `nvec`
// words into registers; words past the end, or of an inactive row, are left
// untouched.
template <typename T, int TPR, int VPT>
__device__ __forceinline__ void load_row_words(uint4 (&raw)[VPT], const T* row, int lane, int64_t nvec,
                                               bool active) {
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t v = lane + int64_t(i) * TPR;
    if (active && v < nvec) raw[i] = reinterpret_cast<const uint4*>(row)[v];
  }
}

// Sum over aligned groups of GROUP lanes within a warp (GROUP a power of two
// <= 32). Every lane of the warp must call it.
template <int GROUP> __device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int offset = GROUP / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the TPR threads that share one row, for blocks of ROWS rows of TPR
// consecutive threads each. Every thread of the block must call it. Rows of up
// to a warp reduce with shuffles alone; wider rows go through shared memory,
// one barrier per call: a loop over rows passes its iteration count as
// `pass`, and consecutive passes use alternate buffers, so the barrier of pass
// i + 1 also orders pass i's reads before pass i + 2's writes. kRowBarrier:
// each row's threads meet at a named barrier of their own (1..ROWS; the kernel
// must use no other) instead of the block's, so that one row's late loads do
// not hold up the block's other rows.
template <int TPR, int ROWS, bool kRowBarrier = false>
__device__ __forceinline__ float row_sum(float v, int64_t pass = 0) {
  static_assert(TPR <= 32 ? (TPR & (TPR - 1)) == 0 : TPR % 32 == 0, "rows are pow2 lanes or whole warps");
  if constexpr (TPR <= 32) {
    return group_sum<TPR>(v);
  } else {
    constexpr int kWarpsPerRow = TPR / 32;
    __shared__ float partial[2][ROWS][kWarpsPerRow];
    float(&mine)[ROWS][kWarpsPerRow] = partial[pass & 1];
    v = group_sum<32>(v);
    const int row = threadIdx.x / TPR;
    const int warp_in_row = (threadIdx.x % TPR) / 32;
    if (threadIdx.x % 32 == 0) mine[row][warp_in_row] = v;
    if constexpr (kRowBarrier && ROWS > 1) {
      static_assert(ROWS < 16, "named barriers 1..15");
      asm volatile("bar.sync %0, %1;" ::"r"(row + 1), "n"(TPR) : "memory");
    } else {
      __syncthreads();
    }
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarpsPerRow; ++w) total += mine[row][w];
    return total;
  }
}

// Two sums (a, b) over the TPR threads (whole warps) that share one row, for blocks of ROWS rows of TPR
// consecutive threads, under one barrier (the backward kernels' two row statistics). Every thread of the
// block must call it. Consecutive passes use alternate buffers, as row_sum.
template <int TPR, int ROWS = 1> __device__ __forceinline__ float2 row_sum2(float a, float b, int64_t pass) {
  static_assert(TPR % 32 == 0, "whole warps");
  constexpr int kWarps = TPR / 32;
  __shared__ float2 partial[2][ROWS][kWarps];
  float2(&mine)[kWarps] = partial[pass & 1][ROWS == 1 ? 0 : threadIdx.x / TPR];
  a = group_sum<32>(a);
  b = group_sum<32>(b);
  if (threadIdx.x % 32 == 0) mine[(threadIdx.x % TPR) / 32] = make_float2(a, b);
  __syncthreads();
  float2 total = make_float2(0.f, 0.f);
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    total.x += mine[w].x;
    total.y += mine[w].y;
  }
  return total;
}

// Threads sharing a row of `nvec` 16-byte words: the largest power of two
// <= nvec (1-2 words per thread), clamped to [lo, hi].
inline int pow2_threads_per_row(int64_t nvec, int lo, int hi) {
  int tpr = lo;
  while (tpr < hi && int64_t(tpr) * 2 <= nvec) tpr *= 2;
  return tpr;
}

// `n` when it is one of Widths, else 0. Row kernels use it for the row widths
// (in 16-byte words) between powers of two that get an exact number of words
// per thread: hidden 3072 in bf16/fp16 is 384 words, 1536 is 192, 5120 640.
template <int... Widths> inline int matching_width(int64_t n) {
  int width = 0;
  ((width = n == Widths ? Widths : width), ...);
  return width;
}

inline bool is_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Programmatic dependent launch (sm_90): a kernel launched with `pdl` by
// launch_kernel may be scheduled while the previous kernel of the stream is
// still finishing. pdl_wait: before touching memory, until that kernel has
// completed and its writes are visible. pdl_release: the next kernel may be
// scheduled (at the latest, it is when this one exits); a row kernel releases
// after its rows, so its column sums do not sit on the SMs beside them. All
// are no-ops in a kernel launched without `pdl`.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait_and_release() {
  pdl_wait();
  pdl_release();
}

// n / d for any 32-bit n as (umulhi(n, m) + n) >> s, with s = ceil(log2 d) and
// m = floor(2^32 (2^s - d) / d) + 1 (round-up method; the sum taken in 64 bits).
struct DivU32 {
  uint32_t m = 1, s = 0;  // d == 1
  static DivU32 of(uint64_t d) {  // d in [1, 2^32]; 0 gives the d == 1 divider
    DivU32 f;
    if (d == 0) return f;
    while ((uint64_t(1) << f.s) < d) ++f.s;
    f.m = uint32_t((static_cast<unsigned __int128>(1) << 32) * ((uint64_t(1) << f.s) - d) / d + 1);
    return f;
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return uint32_t((uint64_t(__umulhi(n, m)) + n) >> s);
  }
};

}  // namespace ltx
