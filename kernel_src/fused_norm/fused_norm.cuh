// Fused residual + RMSNorm + modulation: the kernels (formulas in
// fused_norm.h). Included by the per-op .cu files (adaln_rmsnorm.cu, ...),
// each of which instantiates its variant's launcher, so that nvcc compiles
// them in parallel.
//
// Plan (as rmsnorm.cu): a persistent grid, TPR threads per row, each row held
// in registers as 16-byte words and read from HBM once, the next row's words
// loaded before the current row is reduced and written (residual + norm: one
// block per row group instead, without the next row's loads). The launch
// choices (threads per row, kernel, grid) are made in fused_norm_config.h.
// Modulation vectors ([B, 1, D] in LTX) are re-read per row and stay in L1/L2.
//
// What is fixed at compile time, and why: the op structure (Variant) and the
// rounding mode (kExact), because a runtime branch per element doubled the
// instruction count and the kernel became issue-bound (40% of the copy rate
// on H200, docs/performance.md#fused_norm). Operand presence (weight, gate,
// shift) is a branch per 16-byte word, except in the kernels compiled for
// LTX's operand set (Operands::kLtx), which the LTX blocks' calls take. Exact
// mode uses __fmul_rn/__fadd_rn (and __hmul2_rn/__hadd2_rn) so that nvcc
// cannot contract a multiply and an add into an FMA eager PyTorch does not do.
#pragma once

#include <type_traits>

#include "../common/launch.cuh"
#include "../common/rows.cuh"
#include "fused_norm.h"
#include "fused_norm_config.h"

namespace ltx {
namespace fused {

// Variant, Operands and the width limits: fused_norm_config.h.
Variant variant_of(const FusedNormArgs& a);

// The per-element formulas, shared by the vectorized and scalar paths.
template <typename T, typename Tm, bool kExact> struct Chain {
  bool has_shift;
  float scale_offset;

  // An intermediate of the eager chain: eager PyTorch rounds it to T when the
  // chain runs in half precision; float32 modulation keeps it in float32.
  static __device__ __forceinline__ float eager(float v) { return eager_round<T, Tm, kExact>(v); }

  // Mochi's tanh(gate), as the eager chain holds it (in the gate's dtype).
  static __device__ __forceinline__ float tanh_gate(float gate) { return eager(tanhf(gate)); }

  // h before its rounding to T; g = 1 without gate.
  static __device__ __forceinline__ float residual(float x, float y, float g, bool has_gate) {
    return gated_sum<T, Tm, kExact>(x, y, g, has_gate);
  }

  // out before its rounding to T. `w` is 1 without weight, `shift` 0 without
  // shift; `base` and `tg` (= tanh_gate(gate)) are read by kResidualTanhGatedRmsnorm only.
  template <Variant V>
  __device__ __forceinline__ float finish(float h, float r, float w, float scale, float shift, float base,
                                          float tg) const {
    const float n0 = __fmul_rn(h, r);
    if constexpr (V == Variant::kModulatedRmsnorm) {  // Mochi: float32 throughout, no weight
      return __fmul_rn(n0, __fadd_rn(scale_offset, scale));
    } else if constexpr (V == Variant::kResidualTanhGatedRmsnorm) {  // Mochi: the branch is cast to T, then added in T
      if constexpr (kExact) return __fadd_rn(base, round_through<T>(__fmul_rn(n0, tg)));
      else return fmaf(n0, tg, base);
    } else {
      // diffusers RMSNorm (exact) rounds the normalised value before a
      // half-precision weight; torch.nn.RMSNorm (fast) does not.
      const float n = kExact ? __fmul_rn(eager(n0), w) : n0 * w;
      if constexpr (!scale_shift(V)) {
        return n;
      } else if constexpr (kExact) {
        const float u = eager(__fmul_rn(eager(n), eager(__fadd_rn(1.f, scale))));
        return has_shift ? __fadd_rn(u, shift) : u;
      } else {
        return fmaf(n, 1.f + scale, shift);
      }
    }
  }
};

// gated_residual over contiguous rows as one flat stream of words (no
// reduction, so no row structure): U words of x and y per thread loaded
// before any is combined, one block per 256 * U words (U:
// fused_norm_config::flat_words; release builds compile U = 1 only).
constexpr int kFlatBlock = 256;
// The gate's row of word w is found only when there is a gate, by
// multiply-high divisions when the word count fits 32 bits (a 64-bit division
// per word was most of the kernel's instructions).
template <typename T, typename Tm, bool kExact, int U>
__global__ void __launch_bounds__(kFlatBlock)
    residual_flat(FusedNormArgs a, int64_t words, DivU32 by_row_words, DivU32 by_seq) {
  constexpr int N = 16 / sizeof(T);
  const uint32_t row_words = uint32_t(a.hidden / N);
  const int64_t first = int64_t(blockIdx.x) * kFlatBlock * U + threadIdx.x;
  const uint4* x = static_cast<const uint4*>(a.x.ptr);
  const uint4* y = static_cast<const uint4*>(a.y.ptr);
  pdl_wait_and_release();
  uint4 x_raw[U], y_raw[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t w = first + int64_t(u) * kFlatBlock;
    if (w < words) {
      x_raw[u] = x[w];
      y_raw[u] = y[w];
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t w = first + int64_t(u) * kFlatBlock;
    if (w >= words) continue;
    const Tm* gate = nullptr;
    int64_t col = 0;
    if (a.gate.ptr != nullptr) {
      // rows < 2^31 (fused_norm checks)
      const uint32_t row = words <= int64_t(UINT32_MAX) ? by_row_words.div(uint32_t(w)) : uint32_t(w / row_words);
      const RowIndex at = split_row(row, uint32_t(a.seq), by_seq);
      gate = at_row<Tm>(a.gate, at.b, at.s);
      col = w - int64_t(row) * row_words;
    }
    static_cast<uint4*>(a.residual_out.ptr)[w] =
        residual_word<T, Tm, kExact>(x_raw[u], y_raw[u], a.gate.ptr != nullptr, gate, col);
  }
}

// The operands present in a row kernel compiled for O (Operands:
// fused_norm_config.h).
struct Present {
  bool weight, gate, shift;
};
template <Operands O> __device__ __forceinline__ Present present(const FusedNormArgs& a) {
  if constexpr (O == Operands::kLtx) return {false, true, true};
  else return {a.weight.ptr != nullptr, a.gate.ptr != nullptr, a.shift.ptr != nullptr};
}
// Whether `a` is LTX's operand set (for a variant that has one).
inline bool ltx_operands(const FusedNormArgs& a, Variant v) {
  return a.weight.ptr == nullptr && a.shift.ptr != nullptr && (v != Variant::kGatedResidualRmsnorm || a.gate.ptr != nullptr);
}

// kPrefetch: the next row's words are loaded before the current row is
// reduced (persistent grids); without it a row's words are loaded at the top
// of its pass (one block per row group: no registers held for a next row).
template <typename T, typename Tm, bool kExact, Variant V, int TPR, int VPT, bool kPrefetch, Operands O>
__device__ __forceinline__ void vectorized_rows(const FusedNormArgs& a, float inv_hidden) {
  constexpr int kRows = row_block_threads<TPR>() / TPR;
  constexpr int N = 16 / sizeof(T);
  const Present has = present<O>(a);
  const Chain<T, Tm, kExact> chain{has.shift, a.scale_offset};
  const int lane = threadIdx.x % TPR;
  const int nvec = int(a.hidden / N);
  const uint32_t rows = uint32_t(a.batch * a.seq), seq = uint32_t(a.seq);
  const uint32_t stride = gridDim.x * kRows;
  pdl_wait_and_release();

  uint32_t row = blockIdx.x * kRows + threadIdx.x / TPR;
  // (b, s) of `row`, advanced by `stride` rows per iteration without a
  // division (rows past the end get indices past the end and are not read).
  const RowStep step = row_step(stride, seq);
  RowIndex at = split_row(row, seq);
  uint4 x_raw[VPT], y_raw[VPT];
  constexpr int kNext = kPrefetch ? VPT : 1;  // words of the next row held
  // Mochi's gate is one row per sample: tanh_gate of this thread's words is
  // computed when the gate row changes, not per element (a tanhf is ~20
  // instructions). Held as floats, so only at <= 2 words per thread.
  constexpr bool kCacheTanh = V == Variant::kResidualTanhGatedRmsnorm && VPT <= 2;
  float tanh_cache[kCacheTanh ? VPT : 1][N];
  const Tm* tanh_row = nullptr;
  if constexpr (kPrefetch) {
    load_row_words<T, TPR, VPT>(x_raw, at_row<T>(a.x, at.b, at.s), lane, nvec, row < rows);
    if constexpr (reads_y(V)) load_row_words<T, TPR, VPT>(y_raw, at_row<T>(a.y, at.b, at.s), lane, nvec, row < rows);
  }
  // The loop bound is uniform across the block (row_sum may synchronise it).
  uint32_t pass = 0;
  for (uint32_t first = blockIdx.x * kRows; first < rows; first += stride, row += stride, ++pass) {
    const bool active = row < rows;
    const uint32_t next = row + stride;
    const RowIndex next_at = step.advance(at);
    uint4 x_next[kNext], y_next[kNext];
    if constexpr (kPrefetch) {
      load_row_words<T, TPR, VPT>(x_next, at_row<T>(a.x, next_at.b, next_at.s), lane, nvec, next < rows);
      if constexpr (reads_y(V))
        load_row_words<T, TPR, VPT>(y_next, at_row<T>(a.y, next_at.b, next_at.s), lane, nvec, next < rows);
    } else {  // this row's words, at the top of its pass
      load_row_words<T, TPR, VPT>(x_raw, at_row<T>(a.x, at.b, at.s), lane, nvec, active);
      if constexpr (reads_y(V)) load_row_words<T, TPR, VPT>(y_raw, at_row<T>(a.y, at.b, at.s), lane, nvec, active);
    }

    // h = x or T(x + y * gate), kept as words of T; residual_out = h.
    uint4 h_raw[VPT];
    float ss = 0.f;
    {
      const Tm* gate = sums(V) && has.gate ? at_row<Tm>(a.gate, at.b, at.s) : nullptr;
      T* residual_out = sums(V) ? at_row<T>(a.residual_out, at.b, at.s) : nullptr;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int v = lane + i * TPR;
        if (!active || v >= nvec) continue;
        float h[N];
        if constexpr (sums(V)) {
          h_raw[i] = residual_word<T, Tm, kExact>(x_raw[i], y_raw[i], has.gate, gate, v);
          reinterpret_cast<uint4*>(residual_out)[v] = h_raw[i];
        } else {
          h_raw[i] = x_raw[i];
        }
        if constexpr (normalises(V)) {
          unpack_word<T>(h_raw[i], h);
#pragma unroll
          for (int j = 0; j < N; ++j) ss += h[j] * h[j];
        }
      }
    }

    if constexpr (normalises(V)) {
      ss = row_sum<TPR, kRows>(ss, pass);  // every thread of the block takes part
      const float r = rsqrtf(__fadd_rn(__fmul_rn(ss, inv_hidden), a.eps));
      const T* weight = has.weight ? static_cast<const T*>(a.weight.ptr) : nullptr;
      const bool has_scale = a.scale.ptr != nullptr;  // always, in the variants that read it
      const Tm* scale = has_scale ? at_row<Tm>(a.scale, at.b, at.s) : nullptr;
      const Tm* shift = has.shift ? at_row<Tm>(a.shift, at.b, at.s) : nullptr;
      const Tm* gate = V == Variant::kResidualTanhGatedRmsnorm ? at_row<Tm>(a.gate, at.b, at.s) : nullptr;
      T* out = at_row<T>(a.out, at.b, at.s);
      if constexpr (kCacheTanh) {
        if (active && gate != tanh_row) {
          tanh_row = gate;
#pragma unroll
          for (int i = 0; i < VPT; ++i) {
            const int v = lane + i * TPR;
            if (v >= nvec) continue;
            load_vec<Tm, N>(gate + v * N, tanh_cache[i]);
#pragma unroll
            for (int j = 0; j < N; ++j) tanh_cache[i][j] = chain.tanh_gate(tanh_cache[i][j]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int v = lane + i * TPR;
        if (!active || v >= nvec) continue;
        if constexpr (scale_shift(V) && kPacked<T, Tm, kExact>) {
          // n = T(h * r) [then T(n * w)]; out = T(T(n * T(1 + scale)) + shift), on pairs.
          float h[N], n[N];
          unpack_word<T>(h_raw[i], h);
#pragma unroll
          for (int j = 0; j < N; ++j) n[j] = __fmul_rn(h[j], r);
          uint4 o = pack_word<T>(n);
          if (has.weight) o = mul_words<T>(o, load_word(weight, v));
          o = mul_words<T>(o, add_words<T>(filled_word<T>(1.f), load_word(scale, v)));
          if (has.shift) o = add_words<T>(o, load_word(shift, v));
          reinterpret_cast<uint4*>(out)[v] = o;
          continue;
        }
        float h[N], w[N], sc[N], sh[N], tg[N], base[N], o[N];
        unpack_word<T>(h_raw[i], h);
        load_or<T, N>(w, has.weight, weight, v, 1.f);
        load_or<Tm, N>(sc, has_scale, scale, v, 0.f);
        load_or<Tm, N>(sh, has.shift, shift, v, 0.f);
        if constexpr (kCacheTanh) {
#pragma unroll
          for (int j = 0; j < N; ++j) tg[j] = tanh_cache[i][j];
        } else {
          load_or<Tm, N>(tg, gate != nullptr, gate, v, 0.f);
#pragma unroll
          for (int j = 0; j < N; ++j) tg[j] = chain.tanh_gate(tg[j]);
        }
        if constexpr (V == Variant::kResidualTanhGatedRmsnorm && kPacked<T, Tm, kExact>) {
          // out = T(y + T(n * tanh(gate))): the product rounded to pairs of T,
          // the sum on pairs (HADD2), y never unpacked.
          float g[N];
#pragma unroll
          for (int j = 0; j < N; ++j) g[j] = __fmul_rn(__fmul_rn(h[j], r), tg[j]);
          reinterpret_cast<uint4*>(out)[v] = add_words<T>(y_raw[i], pack_word<T>(g));
          continue;
        }
        if constexpr (V == Variant::kResidualTanhGatedRmsnorm) unpack_word<T>(y_raw[i], base);
#pragma unroll
        for (int j = 0; j < N; ++j)
          o[j] = chain.template finish<V>(h[j], r, w[j], sc[j], sh[j], V == Variant::kResidualTanhGatedRmsnorm ? base[j] : 0.f, tg[j]);
        reinterpret_cast<uint4*>(out)[v] = pack_word<T>(o);
      }
    }
    at = next_at;
    if constexpr (kPrefetch) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        x_raw[i] = x_next[i];
        if constexpr (reads_y(V)) y_raw[i] = y_next[i];
      }
    }
  }
}

// One kernel per rounding mode, so that the fast one is not allocated the
// registers of the exact one.
template <typename T, typename Tm, bool kExact, Variant V, int TPR, int VPT, Operands O>
__global__ void __launch_bounds__(row_block_threads<TPR>())
    fused_norm_vectorized(FusedNormArgs a, float inv_hidden) {
  vectorized_rows<T, Tm, kExact, V, TPR, VPT, true, O>(a, inv_hidden);
}
// Without next-row loads (rmsnorm_residual and LTX's gated_residual_rmsnorm,
// one block per row group), asked to fit a full SM at one word per thread
// (2048 threads: 32 registers without spills, as the standalone kernel that
// reached Liger's speed; gated_residual_rmsnorm with its operands checked at
// run time would spill 16-92 bytes there).
template <typename T, typename Tm, bool kExact, Variant V, int TPR, int VPT, Operands O>
__global__ void __launch_bounds__(row_block_threads<TPR>(), VPT == 1 ? 2048 / row_block_threads<TPR>() : 1)
    fused_norm_rows_once(FusedNormArgs a, float inv_hidden) {
  vectorized_rows<T, Tm, kExact, V, TPR, VPT, false, O>(a, inv_hidden);
}

// The kernel with next-row loads for a rounding mode, and the one without.
template <typename T, typename Tm, Variant V, int TPR, int VPT, Operands O> auto prefetch_kernel(bool exact) {
  return exact ? fused_norm_vectorized<T, Tm, true, V, TPR, VPT, O>
               : fused_norm_vectorized<T, Tm, false, V, TPR, VPT, O>;
}
template <typename T, typename Tm, Variant V, int TPR, int VPT, Operands O> auto rows_once_kernel(bool exact) {
  return exact ? fused_norm_rows_once<T, Tm, true, V, TPR, VPT, O> : fused_norm_rows_once<T, Tm, false, V, TPR, VPT, O>;
}

// The row kernel `launch` asks for, for a rounding mode. A release build
// compiles only the one the table picks for V, O and TPR (which is then the
// one row_launch asks for); a development build both, where both exist
// (fused_norm_config::kCompilesPrefetch, kCompilesRowsOnce).
template <typename T, typename Tm, Variant V, int TPR, int VPT, Operands O>
auto row_kernel(const fused_norm_config::RowLaunch& launch, bool exact) {
  constexpr bool kPrefetch = fused_norm_config::kCompilesPrefetch<V, O, TPR>;
  constexpr bool kRowsOnce = fused_norm_config::kCompilesRowsOnce<V, O, TPR>;
  if constexpr (kPrefetch && kRowsOnce)
    return launch.prefetch ? prefetch_kernel<T, Tm, V, TPR, VPT, O>(exact) : rows_once_kernel<T, Tm, V, TPR, VPT, O>(exact);
  else if constexpr (kRowsOnce) return rows_once_kernel<T, Tm, V, TPR, VPT, O>(exact);
  else return prefetch_kernel<T, Tm, V, TPR, VPT, O>(exact);
}

// `prefetch_resident` > 0: the resident blocks of prefetch_kernel(a.exact),
// when the caller has asked already.
template <typename T, typename Tm, Variant V, int TPR, int VPT, Operands O>
cudaError_t launch_vectorized(const FusedNormArgs& a, float inv_hidden, cudaStream_t stream,
                              int64_t prefetch_resident = 0) {
  constexpr int kBlock = row_block_threads<TPR>();
  const fused_norm_config::RowLaunch launch = fused_norm_config::row_launch<V, O, TPR>(gpu_class(), a.exact);
  auto kernel = row_kernel<T, Tm, V, TPR, VPT, O>(launch, a.exact);
  const int64_t grid = plan_grid(kernel, kBlock, ceil_div(a.batch * a.seq, kBlock / TPR), launch.plan, 0,
                                 launch.prefetch ? prefetch_resident : 0);
  if (grid < 0) return cudaGetLastError();
  return launch_kernel(kernel, dim3(unsigned(grid)), dim3(kBlock), 0, stream, dependent_launch_enabled(), a,
                       inv_hidden);
}

// The resident blocks of LTX's adaln kernel where it beats the general one on
// `a` (fused_norm_config::ltx_adaln_kernel_wins; launch_vectorized reuses
// them), 0 where it does not, -1 on a CUDA error.
template <typename T, int TPR, int VPT> int64_t ltx_adaln_kernel_residency_if_faster(const FusedNormArgs& a) {
  if (!fused_norm_config::ltx_adaln_kernel_may_win(a.exact, TPR)) return 0;
  constexpr int kBlock = row_block_threads<TPR>();
  const int64_t resident =
      resident_blocks(prefetch_kernel<T, T, Variant::kAdalnRmsnorm, TPR, VPT, Operands::kLtx>(a.exact), kBlock);
  if (resident < 0) return -1;
  return fused_norm_config::ltx_adaln_kernel_wins(ceil_div(a.batch * a.seq, kBlock / TPR), resident) ? resident : 0;
}

// LTX's operand set (ltx_operands) takes the kernels compiled for it where
// fused_norm_config says so; everything else the general ones.
template <typename T, typename Tm, Variant V, int TPR, int VPT>
cudaError_t launch_for_operands(const FusedNormArgs& a, float inv_hidden, cudaStream_t stream) {
  if constexpr (fused_norm_config::kLtxOperandKernels<T, Tm, V, VPT>) {
    if (ltx_operands(a, V) && fused_norm_config::ltx_operand_kernels()) {
      if constexpr (V != Variant::kAdalnRmsnorm) {
        return launch_vectorized<T, Tm, V, TPR, VPT, Operands::kLtx>(a, inv_hidden, stream);
      } else {
        const int64_t resident = ltx_adaln_kernel_residency_if_faster<T, TPR, VPT>(a);
        if (resident < 0) return cudaGetLastError();
        if (resident > 0)
          return launch_vectorized<T, Tm, V, TPR, VPT, Operands::kLtx>(a, inv_hidden, stream, resident);
      }
    }
  }
  return launch_vectorized<T, Tm, V, TPR, VPT, Operands::kAsGiven>(a, inv_hidden, stream);
}

// Powers of two take up to kMaxVpt words per thread; the exact widths
// (192, 384: fused_norm_config::threads_per_row) at most 2.
template <typename T, typename Tm, Variant V, int TPR>
cudaError_t launch_with_tpr(const FusedNormArgs& a, int64_t nvec, float inv_hidden, cudaStream_t stream) {
  const int64_t vpt = ceil_div(nvec, TPR);
  if (vpt <= 1) return launch_for_operands<T, Tm, V, TPR, 1>(a, inv_hidden, stream);
  if (vpt <= 2) return launch_for_operands<T, Tm, V, TPR, 2>(a, inv_hidden, stream);
  if constexpr ((TPR & (TPR - 1)) == 0) return launch_for_operands<T, Tm, V, TPR, kMaxVpt>(a, inv_hidden, stream);
  return cudaErrorInvalidValue;
}


// Any hidden size or alignment: scalar accesses, two passes over the row (the
// second re-reads it, from L1/L2). h is re-read from residual_out when that
// was written (it may alias x), else recomputed.
template <typename T, typename Tm, bool kExact, Variant V, int TPR>
__device__ __forceinline__ void scalar_row(const FusedNormArgs& a, float inv_hidden) {
  constexpr int kRows = row_block_threads<TPR>() / TPR;
  const Chain<T, Tm, kExact> chain{a.shift.ptr != nullptr, a.scale_offset};
  const int lane = threadIdx.x % TPR;
  const int64_t row = int64_t(blockIdx.x) * kRows + threadIdx.x / TPR;
  const bool active = row < a.batch * a.seq;
  const RowIndex at = split_row(active ? row : 0, a.seq);
  const T* x = at_row<T>(a.x, at.b, at.s);
  const T* y = reads_y(V) ? at_row<T>(a.y, at.b, at.s) : nullptr;
  const Tm* gate = at_row_or_null<Tm>(a.gate, at.b, at.s);
  T* residual_out = sums(V) ? at_row<T>(a.residual_out, at.b, at.s) : nullptr;
  auto h_at = [&](int64_t c) {
    if constexpr (!sums(V)) return to_float(x[c]);
    else return round_through<T>(chain.residual(to_float(x[c]), to_float(y[c]), gate ? to_float(gate[c]) : 1.f,
                                                gate != nullptr));
  };

  float ss = 0.f;
  if (active)
    for (int64_t c = lane; c < a.hidden; c += TPR) {
      const float h = h_at(c);
      if constexpr (sums(V)) residual_out[c] = from_float<T>(h);
      ss += h * h;
    }
  if constexpr (normalises(V)) {
    ss = row_sum<TPR, kRows>(ss);
    if (!active) return;
    const float r = rsqrtf(__fadd_rn(__fmul_rn(ss, inv_hidden), a.eps));
    const T* weight = static_cast<const T*>(a.weight.ptr);
    const Tm* scale = at_row_or_null<Tm>(a.scale, at.b, at.s);
    const Tm* shift = at_row_or_null<Tm>(a.shift, at.b, at.s);
    T* out = at_row<T>(a.out, at.b, at.s);
    for (int64_t c = lane; c < a.hidden; c += TPR) {
      const float h = sums(V) ? to_float(residual_out[c]) : h_at(c);
      const bool tanh_base = V == Variant::kResidualTanhGatedRmsnorm;
      out[c] = from_float<T>(chain.template finish<V>(
          h, r, weight ? to_float(weight[c]) : 1.f, scale ? to_float(scale[c]) : 0.f,
          shift ? to_float(shift[c]) : 0.f, tanh_base ? to_float(y[c]) : 0.f,
          tanh_base ? chain.tanh_gate(to_float(gate[c])) : 0.f));
    }
  }
}

template <typename T, typename Tm, Variant V, int TPR>
__global__ void __launch_bounds__(row_block_threads<TPR>())
    fused_norm_scalar(FusedNormArgs a, float inv_hidden) {
  if (a.exact) scalar_row<T, Tm, true, V, TPR>(a, inv_hidden);
  else scalar_row<T, Tm, false, V, TPR>(a, inv_hidden);
}

template <typename T, typename Tm, Variant V>
cudaError_t launch_scalar(const FusedNormArgs& a, float inv_hidden, cudaStream_t stream) {
  const int64_t rows = a.batch * a.seq;
  if (a.hidden <= 1024) {
    fused_norm_scalar<T, Tm, V, 32><<<dim3(unsigned(ceil_div(rows, 256 / 32))), 256, 0, stream>>>(a, inv_hidden);
  } else {
    fused_norm_scalar<T, Tm, V, 256><<<dim3(unsigned(rows)), 256, 0, stream>>>(a, inv_hidden);
  }
  return cudaGetLastError();
}

// Words per thread of residual_flat for `a`, 0 for the row kernel (fused_norm.cu).
int flat_residual_words(const FusedNormArgs& a);

template <typename T, typename Tm, int U>
cudaError_t launch_flat(const FusedNormArgs& a, cudaStream_t stream) {
  const int64_t words = a.batch * a.seq * (a.hidden / (16 / int64_t(sizeof(T))));
  auto kernel = a.exact ? residual_flat<T, Tm, true, U> : residual_flat<T, Tm, false, U>;
  return launch_kernel(kernel, dim3(unsigned(ceil_div(words, int64_t(kFlatBlock) * U))), dim3(kFlatBlock), 0, stream,
                       dependent_launch_enabled(), a, words, DivU32::of(uint64_t(a.hidden / (16 / int64_t(sizeof(T))))),
                       DivU32::of(uint64_t(a.seq)));
}

// Launch variant V for the dtype pair of `a` on the path fused_norm_path picks.
template <Variant V> cudaError_t launch_variant(const FusedNormArgs& a, float inv_hidden, cudaStream_t stream) {
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    auto with_mod = [&](auto mod_tag) -> cudaError_t {
      using Tm = typename decltype(mod_tag)::type;
      if (fused_norm_path(a) != FusedNormPath::kVectorized) return launch_scalar<T, Tm, V>(a, inv_hidden, stream);
      if constexpr (V == Variant::kGatedResidual) {
        const int words = flat_residual_words(a);
        if (words == 1) return launch_flat<T, Tm, 1>(a, stream);
        if constexpr (tuning::kDevBuild) {  // 2 and 4 words per thread: A/B only
          if (words == 2) return launch_flat<T, Tm, 2>(a, stream);
          if (words == 4) return launch_flat<T, Tm, 4>(a, stream);
        }
      }
      const int64_t nvec = a.hidden / (16 / int64_t(sizeof(T)));
      switch (fused_norm_config::threads_per_row(nvec, V, a.exact, gpu_class())) {
        case 32: return launch_with_tpr<T, Tm, V, 32>(a, nvec, inv_hidden, stream);
        case 64: return launch_with_tpr<T, Tm, V, 64>(a, nvec, inv_hidden, stream);
        case 128: return launch_with_tpr<T, Tm, V, 128>(a, nvec, inv_hidden, stream);
        case 192: return launch_with_tpr<T, Tm, V, 192>(a, nvec, inv_hidden, stream);
        case 256: return launch_with_tpr<T, Tm, V, 256>(a, nvec, inv_hidden, stream);
        case 384: return launch_with_tpr<T, Tm, V, 384>(a, nvec, inv_hidden, stream);
        default: return launch_with_tpr<T, Tm, V, kMaxTpr>(a, nvec, inv_hidden, stream);
      }
    };
    // Variants without modulation tensors only need Tm = T.
    constexpr bool has_mods = V != Variant::kRmsnormResidual;
    if (!has_mods || a.mod_dtype == a.dtype || std::is_same_v<T, float>) return with_mod(TypeTag<T>{});
    if constexpr (has_mods && !std::is_same_v<T, float>) return with_mod(TypeTag<float>{});
    return cudaErrorInvalidValue;
  });
}

// Each variant's launcher is instantiated in exactly one fused_norm_*.cu.
#define LTX_FUSED_NORM_INSTANTIATE(V) \
  template cudaError_t launch_variant<V>(const FusedNormArgs&, float, cudaStream_t);

extern template cudaError_t launch_variant<Variant::kAdalnRmsnorm>(const FusedNormArgs&, float, cudaStream_t);
extern template cudaError_t launch_variant<Variant::kGatedResidualRmsnorm>(const FusedNormArgs&, float, cudaStream_t);
extern template cudaError_t launch_variant<Variant::kRmsnormResidual>(const FusedNormArgs&, float, cudaStream_t);
extern template cudaError_t launch_variant<Variant::kGatedResidual>(const FusedNormArgs&, float, cudaStream_t);
extern template cudaError_t launch_variant<Variant::kResidualTanhGatedRmsnorm>(const FusedNormArgs&, float, cudaStream_t);
extern template cudaError_t launch_variant<Variant::kModulatedRmsnorm>(const FusedNormArgs&, float, cudaStream_t);

}  // namespace fused
}  // namespace ltx
