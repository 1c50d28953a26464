// Fused residual + RMSNorm + modulation (formulas in fused_norm.h).
//
// Same plan as rms_norm.cu: a persistent grid, TPR threads per row, each row
// held in registers as 16-byte words and read from HBM once, the next row's
// words loaded before the current row is reduced and written. Modulation
// vectors ([B, 1, D] in LTX) are re-read per row and stay in L1/L2. The row
// streams (x, and y when present) are a template parameter so that one-stream
// ops do not pay the registers of a second; everything else is a uniform
// runtime branch.
//
// Exact mode uses __fmul_rn/__fadd_rn so that nvcc cannot contract a multiply
// and an add into an FMA that eager PyTorch does not do.
#include <type_traits>

#include "common.cuh"
#include "fused_norm.h"

namespace ltx {
namespace {

constexpr int kMinBlockThreads = 256;
constexpr int kMinTpr = 32, kMaxTpr = 512, kMaxVpt = 4;

template <int TPR> __host__ __device__ constexpr int block_threads() {
  return TPR > kMinBlockThreads ? TPR : kMinBlockThreads;
}

template <typename T> __device__ __forceinline__ const T* at_row(const RowIn& t, int64_t b, int64_t s) {
  return static_cast<const T*>(t.ptr) + b * t.batch_stride + s * t.seq_stride;
}
template <typename T> __device__ __forceinline__ T* at_row(const RowOut& t, int64_t b, int64_t s) {
  return static_cast<T*>(t.ptr) + b * t.batch_stride + s * t.seq_stride;
}

// The per-element formulas, shared by the vectorized and scalar paths.
template <typename T, typename Tm> struct Chain {
  bool exact;
  Modulation modulation;
  bool has_shift;
  float scale_offset;

  // An intermediate of the eager chain: eager PyTorch rounds it to T when the
  // chain runs in half precision; float32 modulation keeps it in float32.
  __device__ __forceinline__ float eager(float v) const {
    if constexpr (std::is_same_v<Tm, float>) return v;
    else return exact ? round_through<T>(v) : v;
  }

  // h before its rounding to T.
  __device__ __forceinline__ float residual(float x, float y, float g, bool has_gate) const {
    if (!has_gate) return __fadd_rn(x, y);
    return exact ? __fadd_rn(x, eager(__fmul_rn(y, g))) : fmaf(y, g, x);
  }

  // out before its rounding to T. `w` is 1 without weight, `shift` 0 without
  // shift; `base` and `gate` are used by kTanhGatedBase only.
  __device__ __forceinline__ float finish(float h, float r, float w, float scale, float shift, float base,
                                          float gate) const {
    const float n0 = __fmul_rn(h, r);
    switch (modulation) {
      case Modulation::kScaleFloat:  // Mochi: float32 throughout, no weight
        return __fmul_rn(n0, __fadd_rn(scale_offset, scale));
      case Modulation::kTanhGatedBase:  // Mochi: the branch is cast to T, then added in T
        if (exact) return __fadd_rn(base, round_through<T>(__fmul_rn(n0, eager(tanhf(gate)))));
        return fmaf(n0, tanhf(gate), base);
      default:
        break;
    }
    // diffusers RMSNorm (exact) rounds the normalised value before a
    // half-precision weight; torch.nn.RMSNorm (fast) does not.
    const float n = exact ? __fmul_rn(eager(n0), w) : n0 * w;
    if (modulation != Modulation::kScaleShift) return n;
    if (exact) {
      const float u = eager(__fmul_rn(eager(n), eager(__fadd_rn(1.f, scale))));
      return has_shift ? __fadd_rn(u, shift) : u;
    }
    return fmaf(n, 1.f + scale, shift);
  }
};

struct RowIndex {
  int64_t b, s;
};
__device__ __forceinline__ RowIndex split_row(int64_t row, int64_t seq) {
  const int64_t b = row / seq;
  return {b, row - b * seq};
}

template <typename T, int TPR, int VPT>
__device__ __forceinline__ void load_words(uint4 (&raw)[VPT], const T* p, int lane, int64_t nvec, bool active) {
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t v = lane + int64_t(i) * TPR;
    if (active && v < nvec) raw[i] = reinterpret_cast<const uint4*>(p)[v];
  }
}

// N values of an optional operand at word v of a row (`fill` when absent).
template <typename Tm, int N>
__device__ __forceinline__ void load_or(float (&dst)[N], const Tm* row, int64_t v, float fill) {
  if (row != nullptr) {
    load_vec<Tm, N>(row + v * N, dst);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) dst[j] = fill;
  }
}

template <typename T, typename Tm, bool kTwoStreams, int TPR, int VPT>
__global__ void __launch_bounds__(block_threads<TPR>()) fused_norm_vectorized(FusedNormArgs a, float inv_hidden) {
  constexpr int kRows = block_threads<TPR>() / TPR;
  constexpr int N = 16 / sizeof(T);
  const int lane = threadIdx.x % TPR;
  const int64_t nvec = a.hidden / N, rows = a.batch * a.seq;
  const int64_t stride = int64_t(gridDim.x) * kRows;
  const Chain<T, Tm> chain{a.exact, a.modulation, a.shift.ptr != nullptr, a.scale_offset};
  const bool summand = kTwoStreams && a.second == SecondStream::kSummand;
  const bool norm = a.out.ptr != nullptr;

  int64_t row = int64_t(blockIdx.x) * kRows + threadIdx.x / TPR;
  uint4 x_raw[VPT], y_raw[VPT];
  {
    const RowIndex at = split_row(row < rows ? row : 0, a.seq);
    load_words<T, TPR, VPT>(x_raw, at_row<T>(a.x, at.b, at.s), lane, nvec, row < rows);
    if constexpr (kTwoStreams) load_words<T, TPR, VPT>(y_raw, at_row<T>(a.y, at.b, at.s), lane, nvec, row < rows);
  }
  // The loop bound is uniform across the block (row_sum may synchronise it).
  for (int64_t first = int64_t(blockIdx.x) * kRows; first < rows; first += stride, row += stride) {
    const bool active = row < rows;
    const RowIndex at = split_row(active ? row : 0, a.seq);
    uint4 x_next[VPT], y_next[VPT];
    {
      const int64_t next = row + stride;
      const RowIndex nat = split_row(next < rows ? next : 0, a.seq);
      load_words<T, TPR, VPT>(x_next, at_row<T>(a.x, nat.b, nat.s), lane, nvec, next < rows);
      if constexpr (kTwoStreams)
        load_words<T, TPR, VPT>(y_next, at_row<T>(a.y, nat.b, nat.s), lane, nvec, next < rows);
    }
    const Tm* gate = a.gate.ptr ? at_row<Tm>(a.gate, at.b, at.s) : nullptr;
    T* residual_out = a.residual_out.ptr ? at_row<T>(a.residual_out, at.b, at.s) : nullptr;

    // h = x or T(x + y * gate), kept as words of T; residual_out = h.
    uint4 h_raw[VPT];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = lane + int64_t(i) * TPR;
      if (!active || v >= nvec) continue;
      h_raw[i] = x_raw[i];
      if (summand) {
        float x[N], y[N], g[N], h[N];
        unpack_word<T>(x_raw[i], x);
        unpack_word<T>(y_raw[i], y);
        load_or<Tm, N>(g, gate, v, 1.f);
#pragma unroll
        for (int j = 0; j < N; ++j) h[j] = chain.residual(x[j], y[j], g[j], gate != nullptr);
        h_raw[i] = pack_word<T>(h);
      }
      if (residual_out != nullptr) reinterpret_cast<uint4*>(residual_out)[v] = h_raw[i];
      float h[N];
      unpack_word<T>(h_raw[i], h);
#pragma unroll
      for (int j = 0; j < N; ++j) ss += h[j] * h[j];
    }

    if (norm) {
      ss = row_sum<TPR, kRows>(ss);  // every thread of the block takes part
      const float r = rsqrtf(__fadd_rn(__fmul_rn(ss, inv_hidden), a.eps));
      const T* weight = static_cast<const T*>(a.weight.ptr);
      const Tm* scale = a.scale.ptr ? at_row<Tm>(a.scale, at.b, at.s) : nullptr;
      const Tm* shift = a.shift.ptr ? at_row<Tm>(a.shift, at.b, at.s) : nullptr;
      T* out = at_row<T>(a.out, at.b, at.s);
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t v = lane + int64_t(i) * TPR;
        if (!active || v >= nvec) continue;
        float h[N], w[N], sc[N], sh[N], g[N], base[N], o[N];
        unpack_word<T>(h_raw[i], h);
        load_or<T, N>(w, weight, v, 1.f);
        load_or<Tm, N>(sc, scale, v, 0.f);
        load_or<Tm, N>(sh, shift, v, 0.f);
        if (kTwoStreams && !summand) {
          load_or<Tm, N>(g, gate, v, 0.f);
          unpack_word<T>(y_raw[i], base);
        } else {
#pragma unroll
          for (int j = 0; j < N; ++j) g[j] = base[j] = 0.f;
        }
#pragma unroll
        for (int j = 0; j < N; ++j) o[j] = chain.finish(h[j], r, w[j], sc[j], sh[j], base[j], g[j]);
        reinterpret_cast<uint4*>(out)[v] = pack_word<T>(o);
      }
      if constexpr (TPR > 32) __syncthreads();  // row_sum's shared partials are reused next iteration
    }
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      x_raw[i] = x_next[i];
      if constexpr (kTwoStreams) y_raw[i] = y_next[i];
    }
  }
}

// Any hidden size or alignment: scalar accesses, two passes over the row (the
// second re-reads it, from L1/L2). h is re-read from residual_out when that
// was written (it may alias x), else recomputed.
template <typename T, typename Tm, int TPR>
__global__ void __launch_bounds__(block_threads<TPR>()) fused_norm_scalar(FusedNormArgs a, float inv_hidden) {
  constexpr int kRows = block_threads<TPR>() / TPR;
  const int lane = threadIdx.x % TPR;
  const int64_t row = int64_t(blockIdx.x) * kRows + threadIdx.x / TPR;
  const bool active = row < a.batch * a.seq;
  const RowIndex at = split_row(active ? row : 0, a.seq);
  const Chain<T, Tm> chain{a.exact, a.modulation, a.shift.ptr != nullptr, a.scale_offset};
  const bool summand = a.second == SecondStream::kSummand;
  const T* x = at_row<T>(a.x, at.b, at.s);
  const T* y = a.y.ptr ? at_row<T>(a.y, at.b, at.s) : nullptr;
  const Tm* gate = a.gate.ptr ? at_row<Tm>(a.gate, at.b, at.s) : nullptr;
  T* residual_out = a.residual_out.ptr ? at_row<T>(a.residual_out, at.b, at.s) : nullptr;
  auto h_at = [&](int64_t c) {
    if (!summand) return to_float(x[c]);
    return round_through<T>(chain.residual(to_float(x[c]), to_float(y[c]), gate ? to_float(gate[c]) : 1.f,
                                           gate != nullptr));
  };

  float ss = 0.f;
  if (active)
    for (int64_t c = lane; c < a.hidden; c += TPR) {
      const float h = h_at(c);
      if (residual_out != nullptr) residual_out[c] = from_float<T>(h);
      ss += h * h;
    }
  if (a.out.ptr == nullptr) return;  // uniform: gated residual only
  ss = row_sum<TPR, kRows>(ss);
  if (!active) return;
  const float r = rsqrtf(__fadd_rn(__fmul_rn(ss, inv_hidden), a.eps));
  const T* weight = static_cast<const T*>(a.weight.ptr);
  const Tm* scale = a.scale.ptr ? at_row<Tm>(a.scale, at.b, at.s) : nullptr;
  const Tm* shift = a.shift.ptr ? at_row<Tm>(a.shift, at.b, at.s) : nullptr;
  const bool base = a.second == SecondStream::kBase;
  T* out = at_row<T>(a.out, at.b, at.s);
  for (int64_t c = lane; c < a.hidden; c += TPR) {
    const float h = residual_out != nullptr ? to_float(residual_out[c]) : h_at(c);
    out[c] = from_float<T>(chain.finish(h, r, weight ? to_float(weight[c]) : 1.f, scale ? to_float(scale[c]) : 0.f,
                                        shift ? to_float(shift[c]) : 0.f, base ? to_float(y[c]) : 0.f,
                                        base && gate ? to_float(gate[c]) : 0.f));
  }
}

template <typename T, typename Tm, bool kTwoStreams, int TPR, int VPT>
cudaError_t launch_vectorized(const FusedNormArgs& a, float inv_hidden, cudaStream_t stream) {
  constexpr int kRows = block_threads<TPR>() / TPR;
  auto kernel = fused_norm_vectorized<T, Tm, kTwoStreams, TPR, VPT>;
  const int64_t grid = persistent_grid(kernel, block_threads<TPR>(), ceil_div(a.batch * a.seq, kRows));
  if (grid < 0) return cudaGetLastError();
  kernel<<<dim3(unsigned(grid)), block_threads<TPR>(), 0, stream>>>(a, inv_hidden);
  return cudaGetLastError();
}

template <typename T, typename Tm, bool kTwoStreams, int TPR>
cudaError_t launch_with_tpr(const FusedNormArgs& a, int64_t nvec, float inv_hidden, cudaStream_t stream) {
  const int64_t vpt = ceil_div(nvec, TPR);
  if (vpt <= 1) return launch_vectorized<T, Tm, kTwoStreams, TPR, 1>(a, inv_hidden, stream);
  if (vpt <= 2) return launch_vectorized<T, Tm, kTwoStreams, TPR, 2>(a, inv_hidden, stream);
  return launch_vectorized<T, Tm, kTwoStreams, TPR, kMaxVpt>(a, inv_hidden, stream);
}

template <typename T, typename Tm, bool kTwoStreams>
cudaError_t launch_streams(const FusedNormArgs& a, float inv_hidden, cudaStream_t stream) {
  const int64_t nvec = a.hidden / (16 / int64_t(sizeof(T)));
  switch (pow2_threads_per_row(nvec, kMinTpr, kMaxTpr)) {
    case 32: return launch_with_tpr<T, Tm, kTwoStreams, 32>(a, nvec, inv_hidden, stream);
    case 64: return launch_with_tpr<T, Tm, kTwoStreams, 64>(a, nvec, inv_hidden, stream);
    case 128: return launch_with_tpr<T, Tm, kTwoStreams, 128>(a, nvec, inv_hidden, stream);
    case 256: return launch_with_tpr<T, Tm, kTwoStreams, 256>(a, nvec, inv_hidden, stream);
    default: return launch_with_tpr<T, Tm, kTwoStreams, kMaxTpr>(a, nvec, inv_hidden, stream);
  }
}

template <typename T, typename Tm>
cudaError_t launch(const FusedNormArgs& a, cudaStream_t stream) {
  // mean = sum * (1 / n), the factor PyTorch's mean reduction multiplies by.
  const float inv_hidden = 1.f / float(a.hidden);
  if (fused_norm_path(a) == FusedNormPath::kVectorized) {
    if (a.second == SecondStream::kNone) return launch_streams<T, Tm, false>(a, inv_hidden, stream);
    return launch_streams<T, Tm, true>(a, inv_hidden, stream);
  }
  const int64_t rows = a.batch * a.seq;
  if (a.hidden <= 1024) {
    fused_norm_scalar<T, Tm, 32><<<dim3(unsigned(ceil_div(rows, 256 / 32))), 256, 0, stream>>>(a, inv_hidden);
  } else {
    fused_norm_scalar<T, Tm, 256><<<dim3(unsigned(rows)), 256, 0, stream>>>(a, inv_hidden);
  }
  return cudaGetLastError();
}

// A row operand can be read as 16-byte words of its dtype.
bool vector_ok(const void* ptr, int64_t batch_stride, int64_t seq_stride, DType dt) {
  if (ptr == nullptr) return true;
  const int64_t n = 16 / dtype_size(dt);
  return is_aligned16(ptr) && batch_stride % n == 0 && seq_stride % n == 0;
}
bool vector_ok(const RowIn& t, DType dt) { return vector_ok(t.ptr, t.batch_stride, t.seq_stride, dt); }
bool vector_ok(const RowOut& t, DType dt) { return vector_ok(t.ptr, t.batch_stride, t.seq_stride, dt); }

}  // namespace

FusedNormPath fused_norm_path(const FusedNormArgs& a) {
  const int64_t n = 16 / dtype_size(a.dtype);
  const bool ok = a.hidden % n == 0 && a.hidden / n <= int64_t(kMaxTpr) * kMaxVpt && vector_ok(a.out, a.dtype) &&
                  vector_ok(a.residual_out, a.dtype) && vector_ok(a.x, a.dtype) && vector_ok(a.y, a.dtype) &&
                  vector_ok(a.weight, a.dtype) && vector_ok(a.gate, a.mod_dtype) && vector_ok(a.scale, a.mod_dtype) &&
                  vector_ok(a.shift, a.mod_dtype);
  return ok ? FusedNormPath::kVectorized : FusedNormPath::kScalarFallback;
}

cudaError_t fused_norm(const FusedNormArgs& a, cudaStream_t stream) {
  if (a.batch == 0 || a.seq == 0 || a.hidden == 0) return cudaSuccess;
  if (a.mod_dtype != a.dtype && a.mod_dtype != DType::kFloat32) return cudaErrorInvalidValue;
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    if (a.mod_dtype == a.dtype) return launch<T, T>(a, stream);
    if constexpr (std::is_same_v<T, float>) return cudaErrorInvalidValue;  // unreachable: handled above
    else return launch<T, float>(a, stream);
  });
}

}  // namespace ltx
