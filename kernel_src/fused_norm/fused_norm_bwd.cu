// fused_norm backward: one row kernel for every op of the family, the op a
// template parameter (formulas and rounding notes in fused_norm.h), then
// common/column_sum.cuh's column_sums for the grads reduced over rows, in one launch.
//
// Row kernel (as rmsnorm_bwd.cu): a block takes its fixed run of rows one at
// a time, in order; a thread holds the same columns in every row, so its sums
// of the reduced grads stay in registers (vectorized path) or in the block's
// own row of each float32 workspace (scalar path). Each row is read once (the
// scalar path's second pass re-reads it from L1/L2); r is recomputed from h
// with the row's other sum, in the same pass and the same barrier. The
// vectorized kernel's block shape (threads x words per thread) and whether it
// loads the next row's words before it reduces the current one come from
// fused_norm_config.h, as does where LTX-Video's adaln_rmsnorm takes the
// leaner one-word kernel (bwd_words). No atomics.
#include <atomic>
#include <type_traits>

#include "../common/column_sum.cuh"
#include "../common/launch.cuh"
#include "../common/rows.cuh"
#include "fused_norm.h"
#include "fused_norm_config.h"

namespace ltx {
namespace {

using Op = FusedNormOp;
constexpr int kThreads = fused_norm_config::kBwdThreads;  // the scalar kernel's block

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
  static constexpr bool kRounds = kWeight || kScaleShift || kTanh;  // round_n changes its formulas
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
  int acc_offset[kSlots];   // shared-memory accumulators (vectorized kernel, SMEM): a slot's floats
  int64_t rows_per_group, rows_per_block, blocks_per_group, hidden;
  uint32_t seq;
  float eps, inv_hidden, scale_offset;
  bool round_n;
};

// One element's inputs (1 / 0 where an operand is absent). Where the multiplier depends on the modulation
// alone, the modulation's field holds that multiplier (held_multiplier_of), not the modulation: `gate` for
// residual_tanh_gated_rmsnorm, `scale` for the scale-shift ops.
struct Elem {
  float h, dout, dsum, y, gate, w, scale;
};

// `round`: the call's round_n (fused_norm.h's Roundings); `weighted`: a weight operand is given (else w is 1).
// The vectorized kernel takes both as template parameters (ROUND, WEIGHT), so that no element's rounding is
// a runtime branch and no absent weight is multiplied by; the scalar kernel passes the call's.

// residual_tanh_gated_rmsnorm's k = tanh(gate), T(tanh(gate)) with round_n.
template <typename T> __device__ __forceinline__ float tanh_multiplier(bool round, float gate) {
  return round ? round_through<T>(tanhf(gate)) : tanhf(gate);
}

// The scale-shift ops' k = 1 + scale, T(1 + scale) with round_n.
template <typename T> __device__ __forceinline__ float scale_multiplier(bool round, float scale) {
  return round ? round_through<T>(1.f + scale) : 1.f + scale;
}

// Whether the vectorized kernel at VPT words per thread (WEIGHT: with a weight) holds op V's multiplier,
// which depends on the modulation alone: computed once per modulation row, not per element of every row (a
// tanhf is ~20 instructions, T(1 + scale) 3; LTX's and Mochi's modulation is one row per sample): always
// residual_tanh_gated_rmsnorm's, the scale-shift ops' where fused_norm_config::bwd_hold_scale says.
template <Op V, int VPT, bool WEIGHT> __host__ __device__ constexpr bool held_multiplier() {
  return Traits<V>::kTanh || (Traits<V>::kScaleShift && fused_norm_config::bwd_hold_scale(VPT, WEIGHT));
}
// That multiplier from the modulation value m (the gate or the scale).
template <typename T, Op V> __device__ __forceinline__ float held_multiplier_of(bool round, float m) {
  if constexpr (Traits<V>::kTanh) return tanh_multiplier<T>(round, m);
  else return scale_multiplier<T>(round, m);
}

// k: what the modulation multiplies n * w by (fused_norm.h).
template <typename T, Op V> __device__ __forceinline__ float multiplier(const Params& p, const Elem& e) {
  using Tr = Traits<V>;
  if constexpr (Tr::kScaleShift) return e.scale;  // held, or computed where the Elem is made
  else if constexpr (Tr::kScaleFloat) return p.scale_offset + e.scale;
  else if constexpr (Tr::kTanh) return e.gate;  // likewise
  else return 1.f;
}

// dn * h and h * h: the row sums' terms.
template <typename T, Op V>
__device__ __forceinline__ void row_terms(const Params& p, const Elem& e, float& gh, float& ss) {
  gh += e.dout * multiplier<T, V>(p, e) * e.w * e.h;
  ss += e.h * e.h;
}

// dh, dy and the slots' terms of one element, given r and coef = r^3 * sum(dn * h) / hidden.
template <typename T, Op V>
__device__ __forceinline__ void element(const Params& p, bool round, bool weighted, const Elem& e, float r,
                                        float coef, float& dh, float& dy, float (&c)[kSlots]) {
  using Tr = Traits<V>;
  float d = 0.f;
  if constexpr (Tr::kNorm) {
    const float k = multiplier<T, V>(p, e);
    const float n = e.h * r;
    d = r * (e.dout * k * e.w) - e.h * coef;
    const float n_r = round ? round_through<T>(n) : n;  // the n the forward multiplied by w
    if constexpr (Tr::kWeight) c[kW] = e.dout * k * n_r;
    if constexpr (Tr::kScaleShift) {
      c[kScale] = e.dout * (!round ? n * e.w : weighted ? round_through<T>(n_r * e.w) : n_r);
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

// A row's 16-byte words that the vectorized kernel keeps in registers (those op V does not read are never
// touched and compile away).
template <int VPT> struct RowWords {
  uint4 h[VPT], d[VPT], s[VPT], y[VPT];
};

// Loads row `row` (at (b, s) `at`): its words v = threadIdx.x + i * TPR of h, dout, dsum and y.
template <typename T, Op V, int TPR, int VPT>
__device__ __forceinline__ void load_row(const Params& p, int64_t row, RowIndex at, int64_t nvec, bool reads_y,
                                         RowWords<VPT>& w) {
  using Tr = Traits<V>;
  const T* hr = at_row<T>(p.h, at.b, at.s);
  const T* dor = static_cast<const T*>(p.dout) + row * p.hidden;
  const T* dsr = static_cast<const T*>(p.dsum) + row * p.hidden;
  const T* yr = reads_y ? at_row<T>(p.y, at.b, at.s) : nullptr;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {  // every load of the row first: they are in flight together
    const int64_t v = threadIdx.x + int64_t(i) * TPR;
    if (v >= nvec) continue;
    if constexpr (Tr::kNorm) {
      w.h[i] = load_word(hr, v);
      w.d[i] = load_word(dor, v);
    }
    if constexpr (Tr::kSum) w.s[i] = load_word(dsr, v);
    if (reads_y) w.y[i] = load_word(yr, v);
  }
}

// The shared-memory accumulators of the vectorized kernel (SMEM): one row of `hidden` floats per reduced
// grad the call asks for, at Params::acc_offset.
extern __shared__ __align__(16) float smem_acc[];

// acc (4 consecutive floats, 16-byte aligned in shared memory) += c.
__device__ __forceinline__ void add4(float* acc, const float* c) {
  float4 a = *reinterpret_cast<float4*>(acc);
  a.x += c[0];
  a.y += c[1];
  a.z += c[2];
  a.w += c[3];
  *reinterpret_cast<float4*>(acc) = a;
}

// Rows of up to TPR * VPT 16-byte words of T, in blocks of TPR threads: thread words
// v = threadIdx.x + i * TPR. h, dout, dsum and y stay in registers between the row sums and the stores;
// weight and modulation words are re-read (L1/L2) per use, except held multipliers. PREFETCH: the next
// row's words are loaded before this row's sums, so a block keeps a row's loads in flight through its
// barrier. SMEM: the sums of the reduced grads live in shared memory (each thread only ever touches its own
// columns: no barrier), not in up to 32 registers per word; the same additions in the same order, so the
// same bits. ROUND: the call's round_n; WEIGHT: a weight may be given (false: the call has none).
template <typename T, typename Tm, Op V, int TPR, int VPT, bool PREFETCH, bool SMEM, bool ROUND, bool WEIGHT>
__global__ void __launch_bounds__(TPR) bwd_vectorized(Params p) {
  using Tr = Traits<V>;
  pdl_wait();
  constexpr int N = 16 / sizeof(T);
  const int64_t nvec = p.hidden / N;
  const T* w = WEIGHT ? static_cast<const T*>(p.weight.ptr) : nullptr;
  constexpr bool kRoundFixed = fused_norm_config::bwd_round_compiled(V);
  const bool round = kRoundFixed ? ROUND : p.round_n;
  const bool has_gate = p.gate.ptr != nullptr;
  const bool reads_y = Tr::kSumGate && p.y.ptr != nullptr;
  float acc[kSlots][VPT][N];
  zero_fill(acc);
  if constexpr (SMEM) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (!has_slot<V>(s) || p.partials[s] == nullptr) continue;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t v = threadIdx.x + int64_t(i) * TPR;
        if (v >= nvec) continue;
#pragma unroll
        for (int j = 0; j < N; j += 4)
          *reinterpret_cast<float4*>(smem_acc + p.acc_offset[s] + v * N + j) = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
  }

  const RowRun run = row_run(p);
  RowIndex at = split_row(uint32_t(run.first), p.seq);  // then a row at a time (next_row, rows.cuh)
  RowWords<VPT> cur;
  // The held multiplier of this thread's words (held_multiplier), recomputed when its modulation row changes.
  constexpr bool kHeld = held_multiplier<V, VPT, WEIGHT>();
  float held_k[kHeld ? VPT : 1][N];
  const Tm* held_row = nullptr;
  bool held = false;
  if constexpr (PREFETCH)
    if (run.first < run.end) load_row<T, V, TPR, VPT>(p, run.first, at, nvec, reads_y, cur);
  int64_t pass = 0;
  for (int64_t row = run.first; row < run.end; ++row, ++pass, at = next_row(at, p.seq)) {  // uniform bounds
    const Tm* gr = Tr::kReadsGate ? at_row_or_null<Tm>(p.gate, at.b, at.s) : nullptr;
    const Tm* sr = Tr::kReadsScale ? at_row<Tm>(p.scale, at.b, at.s) : nullptr;
    if constexpr (kHeld) {
      const Tm* mr = Tr::kTanh ? gr : sr;
      if (!held || mr != held_row) {
        held = true;
        held_row = mr;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
          const int64_t v = threadIdx.x + int64_t(i) * TPR;
          if (v >= nvec) continue;
          if constexpr (Tr::kTanh) load_or<Tm, N>(held_k[i], has_gate, gr, v, 1.f);
          else load_vec<Tm, N>(sr + v * N, held_k[i]);
#pragma unroll
          for (int j = 0; j < N; ++j) held_k[i][j] = held_multiplier_of<T, V>(round, held_k[i][j]);
        }
      }
    }
    RowWords<VPT> next;
    if constexpr (PREFETCH) {
      if (row + 1 < run.end) load_row<T, V, TPR, VPT>(p, row + 1, next_row(at, p.seq), nvec, reads_y, next);
    } else {
      load_row<T, V, TPR, VPT>(p, row, at, nvec, reads_y, cur);
    }
    // The element values of word i (the weight and any modulation not held re-read).
    auto elems = [&](int i, int64_t v, Elem (&e)[N]) {
      float h[N], d[N], ds[N], y[N], g[N], wf[N], sc[N];
      if constexpr (Tr::kNorm) {
        unpack_word<T>(cur.h[i], h);
        unpack_word<T>(cur.d[i], d);
      }
      if constexpr (Tr::kSum) unpack_word<T>(cur.s[i], ds);
      if (reads_y) unpack_word<T>(cur.y[i], y);
      if constexpr (Tr::kTanh) {  // always held
#pragma unroll
        for (int j = 0; j < N; ++j) g[j] = held_k[i][j];
      } else if constexpr (Tr::kReadsGate) {
        load_or<Tm, N>(g, has_gate, gr, v, 1.f);
      }
      if constexpr (Tr::kWeight && WEIGHT) load_or<T, N>(wf, w != nullptr, w, v, 1.f);
      if constexpr (Tr::kScaleShift && kHeld) {
#pragma unroll
        for (int j = 0; j < N; ++j) sc[j] = held_k[i][j];
      } else if constexpr (Tr::kReadsScale) {
        load_vec<Tm, N>(sr + v * N, sc);
        if constexpr (Tr::kScaleShift)
#pragma unroll
          for (int j = 0; j < N; ++j) sc[j] = scale_multiplier<T>(round, sc[j]);
      }
#pragma unroll
      for (int j = 0; j < N; ++j)
        e[j] = Elem{Tr::kNorm ? h[j] : 0.f, Tr::kNorm ? d[j] : 0.f, Tr::kSum ? ds[j] : 0.f, reads_y ? y[j] : 0.f,
                    Tr::kReadsGate ? g[j] : 1.f, Tr::kWeight && WEIGHT ? wf[j] : 1.f, Tr::kReadsScale ? sc[j] : 0.f};
    };
    float r = 0.f, coef = 0.f;
    if constexpr (Tr::kNorm) {
      float gh = 0.f, ss = 0.f;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t v = threadIdx.x + int64_t(i) * TPR;
        if (v >= nvec) continue;
        Elem e[N];
        elems(i, v, e);
#pragma unroll
        for (int j = 0; j < N; ++j) row_terms<T, V>(p, e[j], gh, ss);
      }
      const float2 sums = row_sum2<TPR>(ss, gh, pass);
      ss = sums.x;
      gh = sums.y;
      r = rsqrtf(__fadd_rn(__fmul_rn(ss, p.inv_hidden), p.eps));  // as the forward computes it
      coef = r * r * r * gh * p.inv_hidden;
    }
    T* dhr = p.dh != nullptr ? static_cast<T*>(p.dh) + row * p.hidden : nullptr;
    T* dyr = p.dy != nullptr ? static_cast<T*>(p.dy) + row * p.hidden : nullptr;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = threadIdx.x + int64_t(i) * TPR;
      if (v >= nvec) continue;
      Elem e[N];
      elems(i, v, e);
      float dh[N], dy[N], c[kSlots][N];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        float cj[kSlots] = {0.f, 0.f, 0.f, 0.f};
        dy[j] = 0.f;
        element<T, V>(p, round, WEIGHT, e[j], r, coef, dh[j], dy[j], cj);
#pragma unroll
        for (int s = 0; s < kSlots; ++s) c[s][j] = cj[s];
      }
      if (dhr != nullptr) store_vec<T, N>(dhr + v * N, dh);
      if (dyr != nullptr) store_vec<T, N>(dyr + v * N, dy);
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (!has_slot<V>(s)) continue;
        if (p.per_row[s].ptr != nullptr) store_vec<Tm, N>(at_row<Tm>(p.per_row[s], at.b, at.s) + v * N, c[s]);
        if constexpr (SMEM) {
          if (p.partials[s] != nullptr)
#pragma unroll
            for (int j = 0; j < N; j += 4) add4(smem_acc + p.acc_offset[s] + v * N + j, c[s] + j);
        } else {
#pragma unroll
          for (int j = 0; j < N; ++j) acc[s][i][j] += c[s][j];
        }
      }
    }
    if constexpr (PREFETCH) cur = next;
  }
  pdl_release();  // the column sums may be scheduled: they wait for these partials
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    if (!has_slot<V>(s) || p.partials[s] == nullptr) continue;
    float* part = p.partials[s] + int64_t(blockIdx.x) * p.hidden;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = threadIdx.x + int64_t(i) * TPR;
      if (v >= nvec) continue;
      if constexpr (SMEM) store_vec<float, N>(part + v * N, *reinterpret_cast<const float(*)[N]>(smem_acc + p.acc_offset[s] + v * N));
      else store_vec<float, N>(part + v * N, acc[s][i]);
    }
  }
}

// adaln_rmsnorm without a weight, its scale broadcast over the sequence, one 16-byte word per thread
// (fused_norm_config::bwd_words_threads; LTX-Video's norms): bwd_vectorized's split, formulas and order of
// additions (the same bits), leaner: the row and the next in registers, T(1 + scale) held per batch, the
// scale and shift sums in registers (not shared memory), the block bounded to kBwdWordsBlocksPerSm an SM.
template <typename T, typename Tm, Op V, int TPR, bool ROUND>
__global__ void __launch_bounds__(TPR, fused_norm_config::kBwdWordsBlocksPerSm) bwd_words(Params p) {
  static_assert(V == Op::kAdalnRmsnorm, "the one-word kernel is adaln_rmsnorm's");
  pdl_wait();
  constexpr int N = 16 / sizeof(T);
  const int t = threadIdx.x;
  const RowRun run = row_run(p);
  RowIndex at = split_row(uint32_t(run.first), p.seq);
  float k[N], acc_scale[N], acc_shift[N];
  zero_fill(acc_scale);
  zero_fill(acc_shift);
  uint32_t held_b = ~0u;  // the batch whose T(1 + scale) k holds
  uint4 hw = make_uint4(0, 0, 0, 0), dw = hw;
  if (run.first < run.end) {
    hw = load_word(at_row<T>(p.h, at.b, at.s), t);
    dw = load_word(static_cast<const T*>(p.dout) + run.first * p.hidden, t);
  }
  int64_t pass = 0;
  for (int64_t row = run.first; row < run.end; ++row, ++pass) {  // uniform bounds
    const RowIndex next = next_row(at, p.seq);
    uint4 hn = hw, dn = dw;
    if (row + 1 < run.end) {
      hn = load_word(at_row<T>(p.h, next.b, next.s), t);
      dn = load_word(static_cast<const T*>(p.dout) + (row + 1) * p.hidden, t);
    }
    if (at.b != held_b) {
      held_b = at.b;
      load_vec<Tm, N>(at_row<Tm>(p.scale, at.b, at.s) + int64_t(t) * N, k);
#pragma unroll
      for (int j = 0; j < N; ++j) k[j] = scale_multiplier<T>(ROUND, k[j]);
    }
    float h[N], d[N];
    unpack_word<T>(hw, h);
    unpack_word<T>(dw, d);
    Elem e[N];
    float gh = 0.f, ss = 0.f;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      e[j] = Elem{h[j], d[j], 0.f, 0.f, 1.f, 1.f, k[j]};
      row_terms<T, V>(p, e[j], gh, ss);
    }
    const float2 sums = row_sum2<TPR>(ss, gh, pass);
    const float r = rsqrtf(__fadd_rn(__fmul_rn(sums.x, p.inv_hidden), p.eps));  // as bwd_vectorized
    const float coef = r * r * r * sums.y * p.inv_hidden;
    float dh[N];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      float dy = 0.f, c[kSlots] = {0.f, 0.f, 0.f, 0.f};
      element<T, V>(p, ROUND, false, e[j], r, coef, dh[j], dy, c);
      acc_scale[j] = __fadd_rn(acc_scale[j], c[kScale]);  // the product rounded, then added: as shared-memory sums
      acc_shift[j] += c[kShift];
    }
    if (p.dh != nullptr) store_vec<T, N>(static_cast<T*>(p.dh) + row * p.hidden + int64_t(t) * N, dh);
    hw = hn;
    dw = dn;
    at = next;
  }
  pdl_release();  // the column sums may be scheduled: they wait for these partials
  const int64_t word = int64_t(blockIdx.x) * p.hidden + int64_t(t) * N;
  if (p.partials[kScale] != nullptr) store_vec<float, N>(p.partials[kScale] + word, acc_scale);
  if (p.partials[kShift] != nullptr) store_vec<float, N>(p.partials[kShift] + word, acc_shift);
}

// Any hidden size and alignment: scalar accesses, two reads of each row (the second from L1/L2). The
// reduced sums live in the block's own workspace rows, each column always touched by the same thread, in
// row order.
template <typename T, typename Tm, Op V> __global__ void __launch_bounds__(kThreads) bwd_scalar(Params p) {
  using Tr = Traits<V>;
  pdl_wait();
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
      const float g = gr != nullptr ? to_float(gr[c]) : 1.f;
      return Elem{Tr::kNorm ? to_float(hr[c]) : 0.f, Tr::kNorm ? to_float(dor[c]) : 0.f,
                  Tr::kSum ? to_float(dsr[c]) : 0.f, reads_y ? to_float(yr[c]) : 0.f,
                  Tr::kTanh ? tanh_multiplier<T>(p.round_n, g) : g, Tr::kWeight && w != nullptr ? to_float(w[c]) : 1.f,
                  Tr::kScaleShift ? scale_multiplier<T>(p.round_n, to_float(sr[c]))
                  : Tr::kReadsScale ? to_float(sr[c]) : 0.f};
    };
    float r = 0.f, coef = 0.f;
    if constexpr (Tr::kNorm) {
      float gh = 0.f, ss = 0.f;
      for (int64_t c = threadIdx.x; c < p.hidden; c += kThreads) row_terms<T, V>(p, elem(c), gh, ss);
      const float2 sums = row_sum2<kThreads>(ss, gh, pass);
      ss = sums.x;
      gh = sums.y;
      r = rsqrtf(__fadd_rn(__fmul_rn(ss, p.inv_hidden), p.eps));
      coef = r * r * r * gh * p.inv_hidden;
    }
    T* dhr = p.dh != nullptr ? static_cast<T*>(p.dh) + row * p.hidden : nullptr;
    T* dyr = p.dy != nullptr ? static_cast<T*>(p.dy) + row * p.hidden : nullptr;
    for (int64_t c = threadIdx.x; c < p.hidden; c += kThreads) {
      float dh = 0.f, dy = 0.f, cs[kSlots] = {0.f, 0.f, 0.f, 0.f};
      element<T, V>(p, p.round_n, w != nullptr, elem(c), r, coef, dh, dy, cs);
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
// `reduces`: some grad asked for is summed over rows (else the split is free: one group, no cap on the blocks).
// The split follows the call's shapes, dtype and op (fused_norm_bwd_blocks sizes the workspaces from it).
Split split_of(const FusedNormBwdArgs& a, Op op, bool reduces = true) {
  const bool by_batch = reduces && fused_norm_bwd_by_batch(a);
  const int64_t groups = by_batch ? a.batch : 1, per_group = by_batch ? a.seq : a.batch * a.seq;
  const int64_t words = a.hidden * dtype_size(a.dtype) / 16;
  const int64_t per_block = reduces ? fused_norm_config::bwd_rows_per_block(per_group, groups, op, words)
                                    : column_sum_config::kUnreducedRowsPerBlock;
  return {groups, per_group, per_block, per_group > 0 ? ceil_div(per_group, per_block) : 0};
}

// Sum each reduced grad's partials, all in one launch: per batch (groups of blocks_per_group) or over every block.
template <typename T, typename Tm>
cudaError_t reduce_grads(const FusedNormBwdArgs& a, const Split& sp, cudaStream_t stream) {
  const FusedGrad* grads[kSlots] = {&a.grad_weight, &a.grad_scale, &a.grad_shift, &a.grad_gate};
  ColumnSumJobs jobs;
  for (int s = 0; s < kSlots; ++s) {
    const FusedGrad& g = *grads[s];
    if (g.partials == nullptr) continue;
    const int64_t groups = g.per_batch ? sp.groups : 1;
    const int64_t blocks = g.per_batch ? sp.blocks_per_group : sp.groups * sp.blocks_per_group;
    if (!jobs.add({g.partials, g.out, s == kW ? dtype_of<T>() : dtype_of<Tm>(), groups, blocks}))
      return cudaErrorInvalidValue;
  }
  return column_sums(jobs, a.hidden, stream);
}

// Launches one compiled vectorized kernel; `smem`: its shared-memory accumulators' bytes (SMEM).
template <typename T, typename Tm, Op V, int TPR, int VPT, bool PREFETCH, bool SMEM, bool ROUND, bool WEIGHT>
void launch_instance(const Params& p, dim3 grid, size_t smem, cudaStream_t stream) {
  const auto kernel = bwd_vectorized<T, Tm, V, TPR, VPT, PREFETCH, SMEM, ROUND, WEIGHT>;
  if constexpr (SMEM) {
    // Near or above the default 48 KB (3 grads of 4096 columns are exactly 48 KB, and the kernel's static
    // row buffers count too) the kernel must opt in, once.
    static std::atomic<size_t> opted{40 * 1024};
    if (smem > opted.load(std::memory_order_relaxed)) {
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      opted.store(smem, std::memory_order_relaxed);
    }
  }
  ::ltx::launch_kernel(kernel, grid, dim3(TPR), SMEM ? smem : 0, stream, dependent_launch_enabled(), p);
}

// The instance for the call's round_n and weight. ROUND is compiled where round_n can be set (an op whose
// formulas it changes, half-precision rows and modulation of their dtype: fused_norm_bwd checks that) and
// fused_norm_config::bwd_round_compiled says so (elsewhere the kernel reads round_n); WEIGHT false for the
// ops with a weight operand at up to two words per thread (LTX-Video's calls: its norms have none, at
// hidden 2048 and 4096).
template <typename T, typename Tm, Op V, int TPR, int VPT, bool PREFETCH, bool SMEM>
void launch_kernel(const Params& p, dim3 grid, size_t smem, cudaStream_t stream) {
  constexpr bool kHalf = std::is_same_v<T, Tm> && !std::is_same_v<T, float>;
  constexpr bool kRound = kHalf && Traits<V>::kRounds && fused_norm_config::bwd_round_compiled(V);
  auto with_weight = [&](auto weight) {
    constexpr bool kWeight = decltype(weight)::value;
    if constexpr (kRound)
      if (p.round_n) return launch_instance<T, Tm, V, TPR, VPT, PREFETCH, SMEM, true, kWeight>(p, grid, smem, stream);
    launch_instance<T, Tm, V, TPR, VPT, PREFETCH, SMEM, false, kWeight>(p, grid, smem, stream);
  };
  if constexpr (kHalf && Traits<V>::kRounds && Traits<V>::kWeight && VPT <= 2)
    if (p.weight.ptr == nullptr) return with_weight(std::false_type{});
  with_weight(std::true_type{});
}

// Launches the vectorized kernel of TPR threads x VPT words if the build compiles it and it is the shape
// for `threads` on rows of `nvec` words (the words per thread fit, and more than half of them are used).
template <typename T, typename Tm, Op V, int TPR, int VPT>
bool launch_shape(const Params& p, dim3 grid, int64_t nvec, int threads, bool prefetch, bool shared_acc,
                  size_t smem, cudaStream_t stream) {
  if constexpr (!fused_norm_config::bwd_shape_compiled<T, Tm>(TPR, VPT, V)) {
    return false;
  } else {
    const int64_t words = ceil_div(nvec, int64_t(TPR));
    if (threads != TPR || words > VPT || (VPT > 1 && words <= VPT / 2)) return false;
    constexpr bool kPf = fused_norm_config::kBwdPrefetch<V>, kSm = fused_norm_config::kBwdSharedAcc<V>;
    if constexpr (tuning::kDevBuild && fused_norm_config::kBwdSweepPair<T, Tm>) {  // the other choices, for the sweeps
      if (prefetch != kPf && shared_acc != kSm) launch_kernel<T, Tm, V, TPR, VPT, !kPf, !kSm>(p, grid, smem, stream);
      else if (prefetch != kPf) launch_kernel<T, Tm, V, TPR, VPT, !kPf, kSm>(p, grid, smem, stream);
      else if (shared_acc != kSm) launch_kernel<T, Tm, V, TPR, VPT, kPf, !kSm>(p, grid, smem, stream);
      else launch_kernel<T, Tm, V, TPR, VPT, kPf, kSm>(p, grid, smem, stream);
      return true;
    }
    launch_kernel<T, Tm, V, TPR, VPT, kPf, kSm>(p, grid, smem, stream);
    return true;
  }
}

// The vectorized kernel for rows of `nvec` words: the block of bwd_threads, else (a forced width this
// build has no kernel for) the default's, else 256 threads (every row the vectorized path takes fits).
template <typename T, typename Tm, Op V> void launch_rows(Params p, dim3 grid, int64_t nvec, cudaStream_t stream) {
  static_assert(fused_norm_config::kBwdMaxWordsPerThread == 4, "256 threads x 4 words is the widest block");
  const bool prefetch = fused_norm_config::bwd_prefetch<V>(), shared_acc = fused_norm_config::bwd_shared_acc<V>();
  size_t smem = 0;  // a row of floats per reduced grad asked for (<= 4 x 8192 columns: 128 KB)
  for (int s = 0; s < kSlots; ++s) {
    p.acc_offset[s] = int(smem / sizeof(float));
    if (has_slot<V>(s) && p.partials[s] != nullptr) smem += size_t(p.hidden) * sizeof(float);
  }
  const auto launch = [&](int threads) {
    return launch_shape<T, Tm, V, 256, 1>(p, grid, nvec, threads, prefetch, shared_acc, smem, stream) ||
           launch_shape<T, Tm, V, 256, 2>(p, grid, nvec, threads, prefetch, shared_acc, smem, stream) ||
           launch_shape<T, Tm, V, 256, 4>(p, grid, nvec, threads, prefetch, shared_acc, smem, stream) ||
           launch_shape<T, Tm, V, 96, 2>(p, grid, nvec, threads, prefetch, shared_acc, smem, stream) ||
           launch_shape<T, Tm, V, 64, 3>(p, grid, nvec, threads, prefetch, shared_acc, smem, stream) ||
           launch_shape<T, Tm, V, 64, 4>(p, grid, nvec, threads, prefetch, shared_acc, smem, stream) ||
           launch_shape<T, Tm, V, 128, 2>(p, grid, nvec, threads, prefetch, shared_acc, smem, stream) ||
           launch_shape<T, Tm, V, 192, 1>(p, grid, nvec, threads, prefetch, shared_acc, smem, stream);
  };
  if (!launch(fused_norm_config::bwd_threads(nvec, V, p.round_n)) &&
      !launch(fused_norm_config::bwd_default_threads(nvec, V, p.round_n)))
    launch(256);
}

// The one-word kernel's threads for the call (fused_norm_config::bwd_words_threads), 0: bwd_vectorized's.
template <typename T, Op V> int words_threads(const FusedNormBwdArgs& a, bool reduces) {
  if constexpr (V != Op::kAdalnRmsnorm || sizeof(T) != 2) {
    return 0;
  } else {
    const bool per_row_grads = a.grad_scale.per_row.ptr != nullptr || a.grad_shift.per_row.ptr != nullptr;
    return fused_norm_config::bwd_words_threads(a.hidden / 8, V, reduces, a.weight.ptr != nullptr,
                                                a.scale.seq_stride == 0, per_row_grads);
  }
}

// Launches the one-word kernel at `tpr` threads (192 or 256), for the call's round_n.
template <typename T, typename Tm, Op V> void launch_words(const Params& p, dim3 grid, int tpr, cudaStream_t stream) {
  if constexpr (V == Op::kAdalnRmsnorm && sizeof(T) == 2) {
    auto go = [&](auto tag) {
      constexpr int kTpr = decltype(tag)::value;
      auto kernel = bwd_words<T, Tm, V, kTpr, false>;
      if constexpr (std::is_same_v<T, Tm>)  // round_n needs modulation of the rows' dtype
        if (p.round_n) kernel = bwd_words<T, Tm, V, kTpr, true>;
      ::ltx::launch_kernel(kernel, grid, dim3(kTpr), 0, stream, dependent_launch_enabled(), p);
    };
    if (tpr == 192) go(std::integral_constant<int, 192>{});
    else go(std::integral_constant<int, 256>{});
  }
}

template <typename T, typename Tm, Op V> cudaError_t launch(const FusedNormBwdArgs& a, cudaStream_t stream) {
  bool reduces = false;
  for (const FusedGrad* g : {&a.grad_weight, &a.grad_scale, &a.grad_shift, &a.grad_gate})
    reduces = reduces || g->partials != nullptr;
  const Split sp = split_of(a, V, reduces);
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
  const bool vectorized = fused_norm_bwd_path(a) == FusedNormPath::kVectorized;
  const int words = vectorized ? words_threads<T, V>(a, reduces) : 0;
  if (words > 0) {
    launch_words<T, Tm, V>(p, grid, words, stream);
  } else if (vectorized) {
    launch_rows<T, Tm, V>(p, grid, a.hidden / (16 / int64_t(sizeof(T))), stream);
  } else {
    ::ltx::launch_kernel(bwd_scalar<T, Tm, V>, grid, dim3(kThreads), 0, stream, dependent_launch_enabled(), p);
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

int64_t fused_norm_bwd_blocks(const FusedNormBwdArgs& a) {
  const Split sp = split_of(a, a.op);
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
  // round_n rounds to the rows' half-precision dtype, which the modulation shares (the eager chain).
  if (a.round_n && (a.mod_dtype != a.dtype || a.dtype == DType::kFloat32)) return cudaErrorInvalidValue;
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
