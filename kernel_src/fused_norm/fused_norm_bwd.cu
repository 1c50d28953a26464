// fused_norm backward: one row kernel for every op of the family, the op a
// template parameter (formulas and rounding notes in fused_norm.h), then
// common/column_sum.cuh's column_sum for each grad reduced over rows.
//
// Row kernel (as rmsnorm_bwd.cu): a block of kBwdThreads takes its fixed run
// of rows one at a time, in order; a thread holds the same columns in every
// row, so its sums of the reduced grads stay in registers (vectorized path) or
// in the block's own row of each float32 workspace (scalar path). Each row is
// read once (the scalar path's second pass re-reads it from L1/L2); r is
// recomputed from h with the row's other sum, in the same pass. No atomics.
#include "../common/column_sum.cuh"
#include "../common/launch.cuh"
#include "../common/rows.cuh"
#include "fused_norm.h"
#include "fused_norm_config.h"

namespace ltx {
namespace {

using Op = FusedNormOp;
constexpr int kThreads = fused_norm_config::kBwdThreads;

// What op V adds to the RMSNorm of h.
template <Op V> struct Traits {
  static constexpr bool kNorm = V != Op::kGatedResidual;
  static constexpr bool kSum = V == Op::kRmsnormResidual || V == Op::kGatedResidual || V == Op::kGatedResidualRmsnorm;
  static constexpr bool kSumGate = V == Op::kGatedResidual || V == Op::kGatedResidualRmsnorm;
  static constexpr bool kScaleShift = V == Op::kAdalnRmsnorm || V == Op::kGatedResidualRmsnorm;
  static constexpr bool kScaleFloat = V == Op::kModulatedRmsnorm;
  static constexpr bool kTanh = V == Op::kResidualTanhGatedRmsnorm;
  static constexpr bool kWeight = V == Op::kRmsnormResidual || kScaleShift;
  static constexpr bool kReadsScale = kScaleShift || kScaleFloat;
  static constexpr bool kReadsGate = kSumGate || kTanh;
};

// The grads a row contributes to a weight / modulation tensor.
enum Slot : int { kW = 0, kScale = 1, kShift = 2, kGate = 3, kSlots = 4 };
template <Op V> __host__ __device__ constexpr bool has_slot(int s) {
  using Tr = Traits<V>;
  return s == kW ? Tr::kWeight : s == kScale ? Tr::kReadsScale : s == kShift ? Tr::kScaleShift : Tr::kReadsGate;
}

struct Params {
  const void* dout;  // contiguous rows
  const void* dsum;  // contiguous rows
  RowIn h, y, gate, weight, scale;
  void* dh;  // contiguous rows, or null (gated_residual: dx is dsum itself)
  void* dy;  // contiguous rows, or null
  RowOut per_row[kSlots];   // elementwise grads (ptr null: none)
  float* partials[kSlots];  // reduced grads' workspaces (null: none)
  int64_t rows_per_group, rows_per_block, blocks_per_group, hidden;
  uint32_t seq;
  float eps, inv_hidden, scale_offset;
  bool round_n;
};

// One element's inputs (1 / 0 where an operand is absent).
struct Elem {
  float h, dout, dsum, y, gate, w, scale;
};

// k: what the modulation multiplies n * w by (fused_norm.h).
template <typename T, Op V> __device__ __forceinline__ float multiplier(const Params& p, const Elem& e) {
  using Tr = Traits<V>;
  if constexpr (Tr::kScaleShift) return p.round_n ? round_through<T>(1.f + e.scale) : 1.f + e.scale;
  else if constexpr (Tr::kScaleFloat) return p.scale_offset + e.scale;
  else if constexpr (Tr::kTanh) return p.round_n ? round_through<T>(tanhf(e.gate)) : tanhf(e.gate);
  else return 1.f;
}

// dn * h and h * h: the row sums' terms.
template <typename T, Op V> __device__ __forceinline__ void row_terms(const Params& p, const Elem& e, float& gh, float& ss) {
  gh += e.dout * multiplier<T, V>(p, e) * e.w * e.h;
  ss += e.h * e.h;
}

// dh, dy and the slots' terms of one element, given r and coef = r^3 * sum(dn * h) / hidden.
template <typename T, Op V>
__device__ __forceinline__ void element(const Params& p, const Elem& e, float r, float coef, float& dh, float& dy,
                                        float (&c)[kSlots]) {
  using Tr = Traits<V>;
  float d = 0.f;
  if constexpr (Tr::kNorm) {
    const float k = multiplier<T, V>(p, e);
    const float n = e.h * r;
    d = r * (e.dout * k * e.w) - e.h * coef;
    const float n_r = p.round_n ? round_through<T>(n) : n;  // the n the forward multiplied by w
    if constexpr (Tr::kWeight) c[kW] = e.dout * k * n_r;
    if constexpr (Tr::kScaleShift) {
      c[kScale] = e.dout * (p.round_n ? round_through<T>(n_r * e.w) : n * e.w);
      c[kShift] = e.dout;
    }
    if constexpr (Tr::kScaleFloat) c[kScale] = e.dout * n;
    if constexpr (Tr::kTanh) c[kGate] = e.dout * n * (1.f - k * k);
  }
  if constexpr (Tr::kSum) d += e.dsum;
  if constexpr (Tr::kSumGate) {
    dy = d * e.gate;
    c[kGate] = d * e.y;
  }
  dh = d;
}

// The block's rows: [first, end) of its group.
struct RowRun {
  int64_t first, end;
};
__device__ __forceinline__ RowRun row_run(const Params& p) {
  const int64_t group = blockIdx.x / p.blocks_per_group, part = blockIdx.x % p.blocks_per_group;
  const int64_t first = group * p.rows_per_group + part * p.rows_per_block;
  const int64_t group_end = (group + 1) * p.rows_per_group;
  return {first, first + p.rows_per_block < group_end ? first + p.rows_per_block : group_end};
}

// Rows of up to kThreads * VPT 16-byte words of T: thread words v = threadIdx.x + i * kThreads. h, dout,
// dsum and y stay in registers between the row sums and the stores; weight and modulation words are
// re-read (L1/L2) per use.
template <typename T, typename Tm, Op V, int VPT> __global__ void __launch_bounds__(kThreads) bwd_vectorized(Params p) {
  using Tr = Traits<V>;
  constexpr int N = 16 / sizeof(T);
  const int64_t nvec = p.hidden / N;
  const T* w = static_cast<const T*>(p.weight.ptr);
  const bool has_gate = p.gate.ptr != nullptr;
  const bool reads_y = Tr::kSumGate && p.y.ptr != nullptr;
  float acc[kSlots][VPT][N];
#pragma unroll
  for (int s = 0; s < kSlots; ++s)
#pragma unroll
    for (int i = 0; i < VPT; ++i)
#pragma unroll
      for (int j = 0; j < N; ++j) acc[s][i][j] = 0.f;

  const RowRun run = row_run(p);
  int64_t pass = 0;
  for (int64_t row = run.first; row < run.end; ++row, ++pass) {  // the same bounds for the whole block
    const RowIndex at = split_row(uint32_t(row), p.seq);
    const T* hr = at_row<T>(p.h, at.b, at.s);
    const T* dor = static_cast<const T*>(p.dout) + row * p.hidden;
    const T* dsr = static_cast<const T*>(p.dsum) + row * p.hidden;
    const T* yr = reads_y ? at_row<T>(p.y, at.b, at.s) : nullptr;
    const Tm* gr = Tr::kReadsGate ? at_row_or_null<Tm>(p.gate, at.b, at.s) : nullptr;
    const Tm* sr = Tr::kReadsScale ? at_row<Tm>(p.scale, at.b, at.s) : nullptr;
    uint4 hw[VPT], dow[VPT], dsw[VPT], yw[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) {  // every load of the row first: they are in flight together
      const int64_t v = threadIdx.x + int64_t(i) * kThreads;
      if (v >= nvec) continue;
      if constexpr (Tr::kNorm) {
        hw[i] = load_word(hr, v);
        dow[i] = load_word(dor, v);
      }
      if constexpr (Tr::kSum) dsw[i] = load_word(dsr, v);
      if (reads_y) yw[i] = load_word(yr, v);
    }
    // The element values of word i (modulation and weight re-read).
    auto elems = [&](int i, int64_t v, Elem (&e)[N]) {
      float h[N], d[N], ds[N], y[N], g[N], wf[N], sc[N];
      if constexpr (Tr::kNorm) {
        unpack_word<T>(hw[i], h);
        unpack_word<T>(dow[i], d);
      }
      if constexpr (Tr::kSum) unpack_word<T>(dsw[i], ds);
      if (reads_y) unpack_word<T>(yw[i], y);
      if constexpr (Tr::kReadsGate) load_or<Tm, N>(g, has_gate, gr, v, 1.f);
      if constexpr (Tr::kWeight) load_or<T, N>(wf, w != nullptr, w, v, 1.f);
      if constexpr (Tr::kReadsScale) load_vec<Tm, N>(sr + v * N, sc);
#pragma unroll
      for (int j = 0; j < N; ++j)
        e[j] = Elem{Tr::kNorm ? h[j] : 0.f, Tr::kNorm ? d[j] : 0.f, Tr::kSum ? ds[j] : 0.f, reads_y ? y[j] : 0.f,
                    Tr::kReadsGate ? g[j] : 1.f, Tr::kWeight ? wf[j] : 1.f, Tr::kReadsScale ? sc[j] : 0.f};
    };
    float r = 0.f, coef = 0.f;
    if constexpr (Tr::kNorm) {
      float gh = 0.f, ss = 0.f;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t v = threadIdx.x + int64_t(i) * kThreads;
        if (v >= nvec) continue;
        Elem e[N];
        elems(i, v, e);
#pragma unroll
        for (int j = 0; j < N; ++j) row_terms<T, V>(p, e[j], gh, ss);
      }
      ss = row_sum<kThreads, 1>(ss, 2 * pass);
      gh = row_sum<kThreads, 1>(gh, 2 * pass + 1);
      r = rsqrtf(__fadd_rn(__fmul_rn(ss, p.inv_hidden), p.eps));  // as the forward computes it
      coef = r * r * r * gh * p.inv_hidden;
    }
    T* dhr = p.dh != nullptr ? static_cast<T*>(p.dh) + row * p.hidden : nullptr;
    T* dyr = p.dy != nullptr ? static_cast<T*>(p.dy) + row * p.hidden : nullptr;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = threadIdx.x + int64_t(i) * kThreads;
      if (v >= nvec) continue;
      Elem e[N];
      elems(i, v, e);
      float dh[N], dy[N], c[kSlots][N];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        float cj[kSlots] = {0.f, 0.f, 0.f, 0.f};
        dy[j] = 0.f;
        element<T, V>(p, e[j], r, coef, dh[j], dy[j], cj);
#pragma unroll
        for (int s = 0; s < kSlots; ++s) c[s][j] = cj[s];
      }
      if (dhr != nullptr) store_vec<T, N>(dhr + v * N, dh);
      if (dyr != nullptr) store_vec<T, N>(dyr + v * N, dy);
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (!has_slot<V>(s)) continue;
        if (p.per_row[s].ptr != nullptr) store_vec<Tm, N>(at_row<Tm>(p.per_row[s], at.b, at.s) + v * N, c[s]);
#pragma unroll
        for (int j = 0; j < N; ++j) acc[s][i][j] += c[s][j];
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    if (!has_slot<V>(s) || p.partials[s] == nullptr) continue;
    float* part = p.partials[s] + int64_t(blockIdx.x) * p.hidden;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = threadIdx.x + int64_t(i) * kThreads;
      if (v < nvec) store_vec<float, N>(part + v * N, acc[s][i]);
    }
  }
}

// Any hidden size and alignment: scalar accesses, two reads of each row (the second from L1/L2). The
// reduced sums live in the block's own workspace rows, each column always touched by the same thread, in
// row order.
template <typename T, typename Tm, Op V> __global__ void __launch_bounds__(kThreads) bwd_scalar(Params p) {
  using Tr = Traits<V>;
  const T* w = static_cast<const T*>(p.weight.ptr);
  const bool reads_y = Tr::kSumGate && p.y.ptr != nullptr;
  float* part[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    part[s] = has_slot<V>(s) && p.partials[s] != nullptr ? p.partials[s] + int64_t(blockIdx.x) * p.hidden : nullptr;
    if (part[s] != nullptr)
      for (int64_t c = threadIdx.x; c < p.hidden; c += kThreads) part[s][c] = 0.f;
  }
  const RowRun run = row_run(p);
  int64_t pass = 0;
  for (int64_t row = run.first; row < run.end; ++row, ++pass) {
    const RowIndex at = split_row(uint32_t(row), p.seq);
    const T* hr = at_row<T>(p.h, at.b, at.s);
    const T* dor = static_cast<const T*>(p.dout) + row * p.hidden;
    const T* dsr = static_cast<const T*>(p.dsum) + row * p.hidden;
    const T* yr = reads_y ? at_row<T>(p.y, at.b, at.s) : nullptr;
    const Tm* gr = Tr::kReadsGate ? at_row_or_null<Tm>(p.gate, at.b, at.s) : nullptr;
    const Tm* sr = Tr::kReadsScale ? at_row<Tm>(p.scale, at.b, at.s) : nullptr;
    auto elem = [&](int64_t c) {
      return Elem{Tr::kNorm ? to_float(hr[c]) : 0.f, Tr::kNorm ? to_float(dor[c]) : 0.f,
                  Tr::kSum ? to_float(dsr[c]) : 0.f, reads_y ? to_float(yr[c]) : 0.f,
                  gr != nullptr ? to_float(gr[c]) : 1.f, Tr::kWeight && w != nullptr ? to_float(w[c]) : 1.f,
                  Tr::kReadsScale ? to_float(sr[c]) : 0.f};
    };
    float r = 0.f, coef = 0.f;
    if constexpr (Tr::kNorm) {
      float gh = 0.f, ss = 0.f;
      for (int64_t c = threadIdx.x; c < p.hidden; c += kThreads) row_terms<T, V>(p, elem(c), gh, ss);
      ss = row_sum<kThreads, 1>(ss, 2 * pass);
      gh = row_sum<kThreads, 1>(gh, 2 * pass + 1);
      r = rsqrtf(__fadd_rn(__fmul_rn(ss, p.inv_hidden), p.eps));
      coef = r * r * r * gh * p.inv_hidden;
    }
    T* dhr = p.dh != nullptr ? static_cast<T*>(p.dh) + row * p.hidden : nullptr;
    T* dyr = p.dy != nullptr ? static_cast<T*>(p.dy) + row * p.hidden : nullptr;
    for (int64_t c = threadIdx.x; c < p.hidden; c += kThreads) {
      float dh = 0.f, dy = 0.f, cs[kSlots] = {0.f, 0.f, 0.f, 0.f};
      element<T, V>(p, elem(c), r, coef, dh, dy, cs);
      if (dhr != nullptr) dhr[c] = from_float<T>(dh);
      if (dyr != nullptr) dyr[c] = from_float<T>(dy);
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (!has_slot<V>(s)) continue;
        if (p.per_row[s].ptr != nullptr) at_row<Tm>(p.per_row[s], at.b, at.s)[c] = from_float<Tm>(cs[s]);
        if (part[s] != nullptr) part[s][c] += cs[s];
      }
    }
  }
}

// A row operand can be read (or written) as 16-byte words of its dtype.
bool words_ok(const void* ptr, int64_t batch_stride, int64_t seq_stride, DType dt) {
  if (ptr == nullptr) return true;
  const int64_t n = 16 / dtype_size(dt);
  return is_aligned16(ptr) && batch_stride % n == 0 && seq_stride % n == 0;
}
bool words_ok(const RowIn& t, DType dt) { return words_ok(t.ptr, t.batch_stride, t.seq_stride, dt); }
bool words_ok(const RowOut& t, DType dt) { return words_ok(t.ptr, t.batch_stride, t.seq_stride, dt); }

struct Split {
  int64_t groups, rows_per_group, rows_per_block, blocks_per_group;
};
Split split_of(int64_t batch, int64_t seq, bool by_batch) {
  const int64_t groups = by_batch ? batch : 1, per_group = by_batch ? seq : batch * seq;
  return {groups, per_group, fixed_rows_per_block(per_group), fixed_split_blocks(per_group)};
}

// Sum each reduced grad's partials: per batch (groups of blocks_per_group) or over every block.
template <typename T, typename Tm>
cudaError_t reduce_grads(const FusedNormBwdArgs& a, const Split& sp, cudaStream_t stream) {
  const FusedGrad* grads[kSlots] = {&a.grad_weight, &a.grad_scale, &a.grad_shift, &a.grad_gate};
  for (int s = 0; s < kSlots; ++s) {
    const FusedGrad& g = *grads[s];
    if (g.partials == nullptr) continue;
    const int64_t groups = g.per_batch ? sp.groups : 1;
    const int64_t blocks = g.per_batch ? sp.blocks_per_group : sp.groups * sp.blocks_per_group;
    const cudaError_t err = s == kW ? column_sum(g.partials, static_cast<T*>(g.out), groups, blocks, a.hidden, stream)
                                    : column_sum(g.partials, static_cast<Tm*>(g.out), groups, blocks, a.hidden, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <typename T, typename Tm, Op V> cudaError_t launch(const FusedNormBwdArgs& a, cudaStream_t stream) {
  const Split sp = split_of(a.batch, a.seq, fused_norm_bwd_by_batch(a));
  Params p{};
  p.dout = a.grad_out;
  p.dsum = a.grad_sum;
  p.h = a.h;
  p.y = a.y;
  p.gate = a.gate;
  p.weight = a.weight;
  p.scale = a.scale;
  p.dh = a.grad_h;
  p.dy = a.grad_y;
  const FusedGrad* grads[kSlots] = {&a.grad_weight, &a.grad_scale, &a.grad_shift, &a.grad_gate};
  for (int s = 0; s < kSlots; ++s) {
    p.per_row[s] = grads[s]->per_row;
    p.partials[s] = grads[s]->partials;
  }
  p.rows_per_group = sp.rows_per_group;
  p.rows_per_block = sp.rows_per_block;
  p.blocks_per_group = sp.blocks_per_group;
  p.hidden = a.hidden;
  p.seq = uint32_t(a.seq);
  p.eps = a.eps;
  p.inv_hidden = 1.f / float(a.hidden);  // the factor PyTorch's mean multiplies by, as the forward
  p.scale_offset = a.scale_offset;
  p.round_n = a.round_n;
  const dim3 grid(unsigned(sp.groups * sp.blocks_per_group));
  if (fused_norm_bwd_path(a) == FusedNormPath::kVectorized) {
    const int64_t vpt = ceil_div(a.hidden / (16 / int64_t(sizeof(T))), kThreads);
    static_assert(fused_norm_config::kBwdMaxWordsPerThread == 4, "one case per words-per-thread below");
    if (vpt <= 1) bwd_vectorized<T, Tm, V, 1><<<grid, kThreads, 0, stream>>>(p);
    else if (vpt <= 2) bwd_vectorized<T, Tm, V, 2><<<grid, kThreads, 0, stream>>>(p);
    else bwd_vectorized<T, Tm, V, 4><<<grid, kThreads, 0, stream>>>(p);
  } else {
    bwd_scalar<T, Tm, V><<<grid, kThreads, 0, stream>>>(p);
  }
  const cudaError_t err = cudaGetLastError();
  return err != cudaSuccess ? err : reduce_grads<T, Tm>(a, sp, stream);
}

template <Op V> cudaError_t launch_op(const FusedNormBwdArgs& a, cudaStream_t stream) {
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr bool kMods = V != Op::kRmsnormResidual;  // the others may take float32 modulation
    if (a.mod_dtype == a.dtype || !kMods) return launch<T, T, V>(a, stream);
    if constexpr (kMods && !std::is_same_v<T, float>) return launch<T, float, V>(a, stream);
    return cudaErrorInvalidValue;
  });
}

}  // namespace

int64_t fused_norm_bwd_blocks(int64_t batch, int64_t seq, bool by_batch) {
  const Split sp = split_of(batch, seq, by_batch);
  return sp.groups * sp.blocks_per_group;
}

FusedNormPath fused_norm_bwd_path(const FusedNormBwdArgs& a) {
  const int64_t n = 16 / dtype_size(a.dtype);
  const auto rows_ok = [&](const void* p) { return p == nullptr || is_aligned16(p); };  // contiguous rows
  const bool ok = a.hidden % n == 0 && a.hidden / n <= int64_t(kThreads) * fused_norm_config::kBwdMaxWordsPerThread &&
                  rows_ok(a.grad_out) && rows_ok(a.grad_sum) && rows_ok(a.grad_h) && rows_ok(a.grad_y) &&
                  words_ok(a.h, a.dtype) && words_ok(a.y, a.dtype) && words_ok(a.weight, a.dtype) &&
                  words_ok(a.gate, a.mod_dtype) && words_ok(a.scale, a.mod_dtype) &&
                  words_ok(a.grad_gate.per_row, a.mod_dtype) && words_ok(a.grad_scale.per_row, a.mod_dtype) &&
                  words_ok(a.grad_shift.per_row, a.mod_dtype);
  return ok ? FusedNormPath::kVectorized : FusedNormPath::kScalarFallback;
}

cudaError_t fused_norm_bwd(const FusedNormBwdArgs& a, cudaStream_t stream) {
  if (a.batch == 0 || a.seq == 0 || a.hidden == 0) return cudaSuccess;
  if (a.mod_dtype != a.dtype && a.mod_dtype != DType::kFloat32) return cudaErrorInvalidValue;
  if (a.batch * a.seq >= (int64_t(1) << 31)) return cudaErrorInvalidValue;  // 32-bit row indices
  switch (a.op) {
    case Op::kAdalnRmsnorm: return launch_op<Op::kAdalnRmsnorm>(a, stream);
    case Op::kRmsnormResidual: return launch_op<Op::kRmsnormResidual>(a, stream);
    case Op::kGatedResidualRmsnorm: return launch_op<Op::kGatedResidualRmsnorm>(a, stream);
    case Op::kGatedResidual: return launch_op<Op::kGatedResidual>(a, stream);
    case Op::kResidualTanhGatedRmsnorm: return launch_op<Op::kResidualTanhGatedRmsnorm>(a, stream);
    case Op::kModulatedRmsnorm: return launch_op<Op::kModulatedRmsnorm>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ltx
