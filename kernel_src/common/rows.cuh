// Device helpers of the row-wise ops (fused_norm, layernorm): addressing a
// row of a RowIn / RowOut (rows.h), walking rows with a grid stride, optional
// operands as words, the eager chain's half-precision ops on packed pairs and
// the gated residual h = x + y * gate in both rounding modes.
#pragma once

#include <type_traits>

#include "device.cuh"
#include "rows.h"

namespace ltx {

// Row (b, s) of a row tensor: 32-bit indices, 64-bit offsets.
template <typename T> __device__ __forceinline__ const T* at_row(const RowIn& t, uint32_t b, uint32_t s) {
  return static_cast<const T*>(t.ptr) + int64_t(b) * t.batch_stride + int64_t(s) * t.seq_stride;
}
template <typename T> __device__ __forceinline__ T* at_row(const RowOut& t, uint32_t b, uint32_t s) {
  return static_cast<T*>(t.ptr) + int64_t(b) * t.batch_stride + int64_t(s) * t.seq_stride;
}
template <typename T> __device__ __forceinline__ const T* at_row_or_null(const RowIn& t, uint32_t b, uint32_t s) {
  return t.ptr ? at_row<T>(t, b, s) : nullptr;
}

// Rows are counted in 32 bits: batch * seq < 2^31 (the launchers check), so a
// row index plus a grid stride (< 2^31) cannot wrap. Registers are what the
// row kernels run short of (docs/performance.md#fused_norm).
struct RowIndex {
  uint32_t b, s;
};
__device__ __forceinline__ RowIndex split_row(uint32_t row, uint32_t seq) {
  const uint32_t b = row / seq;
  return {b, row - b * seq};
}
// The same with the division by seq as a multiply-high (per-word callers).
__device__ __forceinline__ RowIndex split_row(uint32_t row, uint32_t seq, const DivU32& by_seq) {
  const uint32_t b = by_seq.div(row);
  return {b, row - b * seq};
}

// Advancing (b, s) by a fixed number of rows.
struct RowStep {
  uint32_t b, s, seq;
  __device__ __forceinline__ RowIndex advance(RowIndex at) const {
    at.b += b;
    at.s += s;
    if (at.s >= seq) {
      at.s -= seq;
      ++at.b;
    }
    return at;
  }
};
// The row after `at`, for a row kernel that walks a block's run of rows one at a time with no division
// per row (layernorm's backward: at 8 elements a thread it is instruction-bound).
__device__ __forceinline__ RowIndex next_row(RowIndex at, uint32_t seq) {
  if (++at.s == seq) {
    at.s = 0;
    ++at.b;
  }
  return at;
}
__device__ __forceinline__ RowStep row_step(uint32_t rows, uint32_t seq) {
  const RowIndex q = split_row(rows, seq);
  return {q.b, q.s, seq};
}

// N values of an optional operand at word v of a row (`fill` when absent).
// A 2-byte operand is chosen as a whole word (loaded, or `fill` packed) and
// then unpacked: choosing per element cost two instructions each. `present`
// rather than a null test, so that kernels compiled for a fixed operand set
// (fused_norm's Operands) lose the choice.
template <typename Tm, int N>
__device__ __forceinline__ void load_or(float (&dst)[N], bool present, const Tm* row, int64_t v, float fill) {
  if constexpr (sizeof(Tm) == 2 && N == 8) {
    unpack_word<Tm>(present ? load_word(row, v) : filled_word<Tm>(fill), dst);
  } else if (present) {
    load_vec<Tm, N>(row + v * N, dst);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) dst[j] = fill;
  }
}

// N values of an affine vector (a norm's weight or bias) at word v: `fill` when
// absent, else read as T or as float32 (the choice is per word and uniform).
template <typename T, int N>
__device__ __forceinline__ void load_affine(float (&dst)[N], const void* ptr, bool f32, int64_t v, float fill) {
  if (ptr == nullptr) {
#pragma unroll
    for (int j = 0; j < N; ++j) dst[j] = fill;
  } else if (f32) {
    load_vec<float, N>(static_cast<const float*>(ptr) + v * N, dst);
  } else {
    load_vec<T, N>(static_cast<const T*>(ptr) + v * N, dst);
  }
}

// Exact mode with half-precision modulation runs the eager chain's half ops
// on packed pairs (HADD2/HMUL2): a product of two bf16 or fp16 values is
// exact in float32, and a sum of two is either exact in float32 or too far
// from a half-precision tie for float32's rounding to matter, so one rounding
// of the exact result equals eager PyTorch's float32 op followed by the cast.
// It needs a quarter of the instructions of converting every intermediate.

template <typename T, typename Tm, bool kExact>
constexpr bool kPacked = kExact && std::is_same_v<T, Tm> && !std::is_same_v<T, float>;

// Apply `op` to the four pairs of 16-byte words a and b.
template <typename T, typename Op> __device__ __forceinline__ uint4 pairwise(const uint4& a, const uint4& b, Op op) {
  using T2 = PairOf<T>;
  uint4 r;
  const T2* pa = reinterpret_cast<const T2*>(&a);
  const T2* pb = reinterpret_cast<const T2*>(&b);
  T2* pr = reinterpret_cast<T2*>(&r);
#pragma unroll
  for (int k = 0; k < 4; ++k) pr[k] = op(pa[k], pb[k]);
  return r;
}

// The _rn forms: nvcc may contract a plain __hmul2 and a following __hadd2
// into one HFMA2 (one rounding, not eager PyTorch's two). Branches between
// them had hidden that until the operands were compiled in (fused_norm's Operands::kLtx).
template <typename T> __device__ __forceinline__ uint4 add_words(const uint4& a, const uint4& b) {
  return pairwise<T>(a, b, [](auto x, auto y) { return __hadd2_rn(x, y); });
}
template <typename T> __device__ __forceinline__ uint4 mul_words(const uint4& a, const uint4& b) {
  return pairwise<T>(a, b, [](auto x, auto y) { return __hmul2_rn(x, y); });
}

// An intermediate of an eager chain in exact mode: eager PyTorch rounds it to
// T when the chain runs in half precision (modulation of x's dtype); float32
// modulation keeps it in float32 (Wan's `(x.float() + y * gate)`).
template <typename T, typename Tm, bool kExact> __device__ __forceinline__ float eager_round(float v) {
  if constexpr (kExact && !std::is_same_v<Tm, float>) return round_through<T>(v);
  else return v;
}

// h = x + y * gate before its rounding to T (g = 1 without gate): exact mode
// rounds the product as eager does, fast mode takes one FMA.
template <typename T, typename Tm, bool kExact>
__device__ __forceinline__ float gated_sum(float x, float y, float g, bool has_gate) {
  if (!has_gate) return __fadd_rn(x, y);
  if constexpr (kExact) return __fadd_rn(x, eager_round<T, Tm, kExact>(__fmul_rn(y, g)));
  else return fmaf(y, g, x);
}

// Word v of h = T(x + y * gate) (without gate: T(x + y)), from words of x and y.
template <typename T, typename Tm, bool kExact>
__device__ __forceinline__ uint4 residual_word(const uint4& x_raw, const uint4& y_raw, bool has_gate, const Tm* gate,
                                               int64_t v) {
  constexpr int N = 16 / sizeof(T);
  if constexpr (kPacked<T, Tm, kExact>) {  // T(x + T(y * gate)) on pairs
    const uint4 yg = has_gate ? mul_words<T>(y_raw, load_word(gate, v)) : y_raw;
    return add_words<T>(x_raw, yg);
  } else {
    float x[N], y[N], g[N], h[N];
    unpack_word<T>(x_raw, x);
    unpack_word<T>(y_raw, y);
    load_or<Tm, N>(g, has_gate, gate, v, 1.f);
#pragma unroll
    for (int j = 0; j < N; ++j) h[j] = gated_sum<T, Tm, kExact>(x[j], y[j], g[j], has_gate);
    return pack_word<T>(h);
  }
}

}  // namespace ltx
