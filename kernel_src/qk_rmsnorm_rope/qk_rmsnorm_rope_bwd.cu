// qk_rmsnorm_rope backward (formulas and rounding notes in qk_rmsnorm_rope.h).
//
// A unit is one norm group (a head, or the whole row) of one token of one
// sample, for q and k together (they share the token's tables), ordered
// token-major: u = (s * batch + b) * groups + h. A worker (a warp for small
// groups, a block for large ones: qk_rmsnorm_rope_config::bwd_pairs_per_thread;
// for aligned whole rows with the interleaved rotation and per-channel or
// repeating tables, LTX-Video's and Wan's forms, the row kernel of 16-byte
// words below)
// takes a fixed run of units in order (the split of common/column_sum.cuh), a
// thread owning the same pairs of the group in every unit:
//
//   dn = R^T(dy) (the transposed rotation), g = dn * w;
//   the sums S1 = sum(x^2) and S2 = sum(g * x) in one reduction;
//   r = rsqrt(S1 / G + eps) (recomputed: the forward's formula);
//   dx = T(r * (g - m * (r * S2 / G))), m = x * r; dw partials += dn * m'
//   (m' = m, rounded to T first under diffusers rounding).
//
// The dw partials of a worker are its own row of a float32 workspace
// [workers, head_dim] per tensor (registers in the block kernel, stored once;
// updated in place by the warp kernel, each column by one lane in unit
// order); column_sum adds the rows in a fixed order (per run of units, then
// the runs, when the warp kernel takes several). No atomics: the same inputs
// give the same bits.
#include "../common/column_sum.cuh"
#include "../common/launch.cuh"
#include "qk_rmsnorm_rope.h"
#include "qk_rmsnorm_rope_config.h"

namespace ltx {
namespace {

namespace config = qk_rmsnorm_rope_config;
constexpr int kThreads = config::kBwdThreads;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kMask, v, offset);
  return v;
}

// The fixed split of the units over workers: `unit_groups` consecutive runs of
// units_per_group units (the last may be shorter), each split over `splits`
// workers of units_per_worker units (column_sum.cuh's split of the run). A
// function of the sizes alone. Worker w = group * splits + split owns
// workspace row w.
struct BwdSplit {
  int64_t units = 0;  // batch * seq * norm groups per row
  int64_t unit_groups = 1, units_per_group = 0, units_per_worker = 0, splits = 0;
  __host__ __device__ int64_t workers() const { return unit_groups * splits; }
};

// `row_threads`: the row kernel's threads where the call's shapes and form take it (row_form_threads below),
// alignment aside; else 0.
BwdSplit bwd_split(int64_t units, int64_t head_dim, int row_threads) {
  BwdSplit sp;
  sp.units = units;
  // The warp kernel: enough runs for ~kMaxBlocks warps each (column_sum caps a run's workers at
  // kMaxBlocks, too few warps for the GPU); the block kernel: one run.
  const bool warp_kernel = config::bwd_pairs_per_thread(head_dim) == 0;
  sp.unit_groups = warp_kernel ? config::bwd_unit_groups(units, column_sum_config::kMinRowsPerBlock *
                                                                    column_sum_config::kMaxBlocks)
                               : config::bwd_row_runs();
  sp.units_per_group = ceil_div(units, sp.unit_groups);
  if (!warp_kernel) {
    // The block and row kernels (whichever a call takes: the same split, so the same workspace).
    sp.units_per_worker = config::bwd_rows_per_block(sp.units_per_group, row_threads);
    sp.splits = sp.units_per_group > 0 ? ceil_div(sp.units_per_group, sp.units_per_worker) : 0;
  } else {
    sp.units_per_worker = fixed_rows_per_block(sp.units_per_group);
    sp.splits = fixed_split_blocks(sp.units_per_group);
  }
  return sp;
}

struct BwdParams {
  QkRmsnormRopeBwdArgs a;
  BwdSplit sp;
};

// Worker w's units [first, end) (maybe none, in a short last run).
__device__ __forceinline__ void worker_units(const BwdSplit& sp, int64_t w, int64_t& first, int64_t& end) {
  const int64_t g = w / sp.splits, split = w - g * sp.splits;
  const int64_t group_begin = g * sp.units_per_group;
  const int64_t group_end = group_begin + sp.units_per_group < sp.units ? group_begin + sp.units_per_group : sp.units;
  first = group_begin + split * sp.units_per_worker;
  end = first + sp.units_per_worker < group_end ? first + sp.units_per_worker : group_end;
}

// One unit's pointers for one tensor.
template <typename T> struct UnitPtrs {
  const T* x;
  const T* dy;
  T* dx;
  const float* cos;  // the token's tables at the group's first column
  const float* sin;
  int64_t table_offset;  // column of the group's first channel in per-channel tables
};

template <typename T>
__device__ __forceinline__ UnitPtrs<T> unit_ptrs(const QkRmsnormRopeBwdArgs& a, const QkBwdOperand& o, int64_t u) {
  const int64_t groups = a.dim / a.head_dim;
  const int64_t token_row = u / groups, h = u - token_row * groups;
  const int64_t s = token_row / a.batch, b = token_row - s * a.batch;
  const int64_t offset = h * a.head_dim;
  return {static_cast<const T*>(o.x) + b * o.x_batch_stride + s * o.x_seq_stride + offset,
          static_cast<const T*>(o.dy) + b * o.dy_batch_stride + s * o.dy_seq_stride + offset,
          static_cast<T*>(o.dx) + b * o.dx_batch_stride + s * o.dx_seq_stride + offset,
          a.cos.ptr + b * a.cos.batch_stride + s * a.cos.seq_stride,
          a.sin.ptr + b * a.sin.batch_stride + s * a.sin.seq_stride, offset};
}

// Pair q of the group: its channels, x, dn = R^T(dy) (the transpose of
// [[c0, -s0], [s1, c1]], separate float32 products and sum) and g = dn * w.
struct Pair {
  float x[2], dn[2], g[2];
};

// The channels of pair q: (2q, 2q + 1) interleaved, (q, q + G/2) rotate-half.
__device__ __forceinline__ void pair_channels(const QkRmsnormRopeBwdArgs& a, int64_t q, int64_t (&e)[2]) {
  const bool interleaved = a.rotation == Rotation::kInterleaved;
  e[0] = interleaved ? 2 * q : q;
  e[1] = interleaved ? 2 * q + 1 : q + a.head_dim / 2;
}

template <typename T, typename Tw>
__device__ __forceinline__ Pair load_pair(const QkRmsnormRopeBwdArgs& a, const UnitPtrs<T>& p, const Tw* w,
                                          int64_t q) {
  Pair r;
  int64_t e[2];
  pair_channels(a, q, e);
  // Table columns: per channel (table_dim == dim) from the group's offset, else shared by the heads (or,
  // under a whole-row norm, repeating every table_dim channels).
  const int64_t base = a.table_dim == a.dim ? p.table_offset : 0;
  const bool repeats = a.table_dim < a.head_dim;  // uniform: no division per pair elsewhere
  const int64_t t0 = repeats ? e[0] % a.table_dim : base + e[0], t1 = repeats ? e[1] % a.table_dim : base + e[1];
  r.x[0] = to_float(p.x[e[0]]);
  r.x[1] = to_float(p.x[e[1]]);
  const float d0 = to_float(p.dy[e[0]]), d1 = to_float(p.dy[e[1]]);
  r.dn[0] = __fadd_rn(__fmul_rn(d0, p.cos[t0]), __fmul_rn(d1, p.sin[t1]));
  r.dn[1] = __fadd_rn(__fmul_rn(d1, p.cos[t1]), __fmul_rn(-d0, p.sin[t0]));
#pragma unroll
  for (int j = 0; j < 2; ++j) r.g[j] = w != nullptr ? r.dn[j] * to_float(w[e[j]]) : r.dn[j];
  return r;
}

// Pair q's dx (stored) and its dw terms dn * m'.
template <typename T>
__device__ __forceinline__ void finish_pair(const QkRmsnormRopeBwdArgs& a, const Pair& p, int64_t q, T* dx, float r,
                                            float mean, float (&dw)[2]) {
  int64_t e[2];
  pair_channels(a, q, e);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float m = p.x[j] * r;
    dx[e[j]] = from_float<T>(r * (p.g[j] - m * mean));
    dw[j] = p.dn[j] * (a.round_before_weight ? round_through<T>(m) : m);
  }
}

// Small groups: a warp per worker, lanes own pairs lane, lane + 32, ...; two
// passes over each unit (the second from L1/L2); dw partials updated in place.
template <typename T, typename Tw> __global__ void __launch_bounds__(kThreads) qk_bwd_warp(BwdParams p) {
  pdl_wait();  // its dependents are scheduled as it exits
  const QkRmsnormRopeBwdArgs& a = p.a;
  const int64_t worker = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (worker >= p.sp.workers()) return;  // whole warps leave: the shuffles below stay full
  const int lane = threadIdx.x % 32;
  const int64_t G = a.head_dim, P = G / 2;
  const float inv_g = 1.f / float(G);
  float* part[2];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const QkBwdOperand& o = t ? a.k : a.q;
    part[t] = o.partials != nullptr ? o.partials + worker * G : nullptr;
    if (part[t] == nullptr) continue;
    for (int64_t q = lane; q < P; q += 32) {  // by the lane that later updates the column: no sync needed
      int64_t e[2];
      pair_channels(a, q, e);
      part[t][e[0]] = part[t][e[1]] = 0.f;
    }
  }
  int64_t first, end;
  worker_units(p.sp, worker, first, end);
  for (int64_t u = first; u < end; ++u) {
#pragma unroll
    for (int t = 0; t < 2; ++t) {  // q, then k: the token's tables are in L1 for k
      const QkBwdOperand& o = t ? a.k : a.q;
      const Tw* w = static_cast<const Tw*>(o.weight);
      const UnitPtrs<T> up = unit_ptrs<T>(a, o, u);
      float s1 = 0.f, s2 = 0.f;
      for (int64_t q = lane; q < P; q += 32) {
        const Pair pr = load_pair<T, Tw>(a, up, w, q);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          s1 += pr.x[j] * pr.x[j];
          s2 += pr.g[j] * pr.x[j];
        }
      }
      s1 = warp_sum(s1);
      s2 = warp_sum(s2);
      const float r = rsqrtf(s1 * inv_g + a.eps);
      const float mean = r * s2 * inv_g;  // mean over the group of g * m
      for (int64_t q = lane; q < P; q += 32) {
        const Pair pr = load_pair<T, Tw>(a, up, w, q);
        float dw[2];
        int64_t e[2];
        finish_pair<T>(a, pr, q, up.dx, r, mean, dw);
        pair_channels(a, q, e);
        if (part[t] != nullptr) {
          part[t][e[0]] += dw[0];
          part[t][e[1]] += dw[1];
        }
      }
    }
  }
}

// Large groups: a block per worker, thread i owning pairs i + kThreads * j
// (j < PPT), held in registers between the reduction and the stores; the dw
// sums stay in registers and are stored once.
template <typename T, typename Tw, int PPT> __global__ void __launch_bounds__(kThreads) qk_bwd_block(BwdParams p) {
  pdl_wait();  // its dependents are scheduled as it exits
  const QkRmsnormRopeBwdArgs& a = p.a;
  __shared__ float sums[kWarps][4];  // (S1, S2) of q and of k, per warp
  const int64_t G = a.head_dim, P = G / 2;
  const float inv_g = 1.f / float(G);
  float acc[2][PPT][2];
  zero_fill(acc);
  int64_t first, end;
  worker_units(p.sp, blockIdx.x, first, end);
  for (int64_t u = first; u < end; ++u) {
    Pair pr[2][PPT];
    float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const QkBwdOperand& o = t ? a.k : a.q;
      const UnitPtrs<T> up = unit_ptrs<T>(a, o, u);
#pragma unroll
      for (int j = 0; j < PPT; ++j) {
        const int64_t q = threadIdx.x + int64_t(kThreads) * j;
        if (q >= P) continue;
        pr[t][j] = load_pair<T, Tw>(a, up, static_cast<const Tw*>(o.weight), q);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          part[2 * t] += pr[t][j].x[e] * pr[t][j].x[e];
          part[2 * t + 1] += pr[t][j].g[e] * pr[t][j].x[e];
        }
      }
    }
#pragma unroll
    for (int v = 0; v < 4; ++v) part[v] = warp_sum(part[v]);
    if (threadIdx.x % 32 == 0)
#pragma unroll
      for (int v = 0; v < 4; ++v) sums[threadIdx.x / 32][v] = part[v];
    __syncthreads();
    float total[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi)  // the same order in every thread
#pragma unroll
      for (int v = 0; v < 4; ++v) total[v] += sums[wi][v];
    __syncthreads();  // sums is rewritten by the next unit
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const QkBwdOperand& o = t ? a.k : a.q;
      const float r = rsqrtf(total[2 * t] * inv_g + a.eps);
      const float mean = r * total[2 * t + 1] * inv_g;
      T* dx = unit_ptrs<T>(a, o, u).dx;
#pragma unroll
      for (int j = 0; j < PPT; ++j) {
        const int64_t q = threadIdx.x + int64_t(kThreads) * j;
        if (q >= P) continue;
        float dw[2];
        finish_pair<T>(a, pr[t][j], q, dx, r, mean, dw);
        acc[t][j][0] += dw[0];
        acc[t][j][1] += dw[1];
      }
    }
  }
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const QkBwdOperand& o = t ? a.k : a.q;
    if (o.partials == nullptr) continue;
    float* part = o.partials + int64_t(blockIdx.x) * G;
#pragma unroll
    for (int j = 0; j < PPT; ++j) {
      const int64_t q = threadIdx.x + int64_t(kThreads) * j;
      if (q >= P) continue;
      int64_t e[2];
      pair_channels(a, q, e);
      part[e[0]] = acc[t][j][0];
      part[e[1]] = acc[t][j][1];
    }
  }
}

// Whole rows of words (16 bytes, N elements of T) with the interleaved rotation: a block of TPR threads
// per unit (the q and k rows of a token), thread i owning words v = i + TPR * j (j < VPT) of both and of
// the tables. Each unit's x, dy and table words are loaded as it starts (kPrefetch: the next unit's too,
// into registers); the first pass keeps x (packed) and dn = R^T(dy) in registers for the second, which
// recomputes nothing of the rotation. What is the same for every unit is worked out once: the weights'
// words (in registers), each word's table column, and (b, s) is stepped, not divided. The dw sums stay in
// registers and are stored once per block (a row of the partials). ROUND: round_before_weight, compiled in.
template <typename T, int VPT> struct UnitWords {
  static constexpr int N = 16 / sizeof(T), TW = N / 4;  // elements per word, table words per row word
  uint4 x[2][VPT], dy[2][VPT], cos[VPT][TW], sin[VPT][TW];
};

// The token s and sample b of a unit (u = s * batch + b), stepped one unit at a time.
struct UnitIndex {
  int64_t s, b;
  __device__ __forceinline__ void step(int64_t batch) {
    if (++b == batch) {
      b = 0;
      ++s;
    }
  }
};

template <typename T, int VPT>
__device__ __forceinline__ void load_unit(const QkRmsnormRopeBwdArgs& a, UnitIndex at, int64_t words,
                                          const int (&col)[VPT], UnitWords<T, VPT>& r) {
  using W = UnitWords<T, VPT>;
  const float* cos = a.cos.ptr + at.b * a.cos.batch_stride + at.s * a.cos.seq_stride;
  const float* sin = a.sin.ptr + at.b * a.sin.batch_stride + at.s * a.sin.seq_stride;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t v = threadIdx.x + int64_t(i) * blockDim.x;
    if (v >= words) continue;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const QkBwdOperand& o = t ? a.k : a.q;
      r.x[t][i] = load_word(static_cast<const T*>(o.x) + at.b * o.x_batch_stride + at.s * o.x_seq_stride, v);
      r.dy[t][i] = load_word(static_cast<const T*>(o.dy) + at.b * o.dy_batch_stride + at.s * o.dy_seq_stride, v);
    }
#pragma unroll
    for (int k = 0; k < W::TW; ++k) {
      r.cos[i][k] = load_word(cos, col[i] + k);
      r.sin[i][k] = load_word(sin, col[i] + k);
    }
  }
}

// Word i of tensor t: dn = R^T(dy) as floats (load_pair's products and sums, pair by pair).
template <typename T, int VPT>
__device__ __forceinline__ void rotate_back(const UnitWords<T, VPT>& r, int t, int i, float (&dn)[UnitWords<T, VPT>::N]) {
  constexpr int N = UnitWords<T, VPT>::N;
  float d[N], c[N], sn[N];
  unpack_word<T>(r.dy[t][i], d);
#pragma unroll
  for (int k = 0; k < UnitWords<T, VPT>::TW; ++k) {
    unpack_word<float>(r.cos[i][k], c + 4 * k);
    unpack_word<float>(r.sin[i][k], sn + 4 * k);
  }
#pragma unroll
  for (int j = 0; j < N; j += 2) {
    dn[j] = __fadd_rn(__fmul_rn(d[j], c[j]), __fmul_rn(d[j + 1], sn[j + 1]));
    dn[j + 1] = __fadd_rn(__fmul_rn(d[j + 1], c[j + 1]), __fmul_rn(-d[j], sn[j]));
  }
}

template <typename T, typename Tw, int VPT, bool kPrefetch, bool ROUND, int REGS>
__global__ void __maxnreg__(REGS) qk_bwd_rows(BwdParams p) {  // REGS: config::bwd_row_registers
  pdl_wait();  // its dependents are scheduled as it exits
  using W = UnitWords<T, VPT>;
  constexpr int N = W::N, WW = N * sizeof(Tw) / 16;  // weight words per row word
  const QkRmsnormRopeBwdArgs& a = p.a;
  __shared__ float4 sums[2][config::kBwdMaxRowThreads / 32];  // per warp (S1, S2 of q, of k); two passes
  const int64_t words = a.dim / N;
  const float inv_g = 1.f / float(a.head_dim);
  const int warps = blockDim.x / 32;
  const Tw* weight[2] = {static_cast<const Tw*>(a.q.weight), static_cast<const Tw*>(a.k.weight)};
  // Per thread, the same for every unit: each word's table column, and (one word a thread: kKeep) the
  // weights' words. More words a thread would spill them, and dn, so those re-read and recompute.
  constexpr bool kKeep = VPT == 1;
  const int64_t table_words = a.table_dim / N;  // fewer than the row's: the tables repeat (Wan)
  int col[VPT];
  uint4 w[2][kKeep ? VPT : 1][WW];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t v = threadIdx.x + int64_t(i) * blockDim.x;
    col[i] = int((table_words == words ? v : v % table_words) * W::TW);
    if constexpr (kKeep)
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int k = 0; k < WW; ++k)
          w[t][i][k] = weight[t] != nullptr && v < words ? load_word(weight[t], v * WW + k) : make_uint4(0, 0, 0, 0);
  }
  // g = dn * w of word i of tensor t (dn alone without a weight)
  auto weigh = [&](int t, int i, int64_t v, const float (&dn)[N], float (&g)[N]) {
    float wf[N];
    if constexpr (kKeep) {
#pragma unroll
      for (int k = 0; k < WW; ++k) unpack_word<Tw>(w[t][i][k], wf + k * (16 / sizeof(Tw)));
    } else if (weight[t] != nullptr) {
      load_vec<Tw, N>(weight[t] + v * N, wf);
    }
#pragma unroll
    for (int j = 0; j < N; ++j) g[j] = weight[t] != nullptr ? dn[j] * wf[j] : dn[j];
  };
  float acc[2][VPT][N];
  zero_fill(acc);
  int64_t first, end;
  worker_units(p.sp, blockIdx.x, first, end);
  const int64_t first_s = first / a.batch;
  UnitIndex at{first_s, first - first_s * a.batch}, ahead = at;  // this unit, and the next one
  W cur;
  if (first < end) load_unit<T, VPT>(a, at, words, col, cur);
  int pass = 0;
  for (int64_t u = first; u < end; ++u, pass ^= 1, at.step(a.batch)) {  // the same bounds for the whole block
    W next;
    ahead.step(a.batch);
    if constexpr (kPrefetch)
      if (u + 1 < end) load_unit<T, VPT>(a, ahead, words, col, next);
    float kept[2][kKeep ? VPT : 1][N];  // dn of the first pass, for the second (kKeep)
    float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t v = threadIdx.x + int64_t(i) * blockDim.x;
        if (v >= words) continue;
        float x[N], dn[N], g[N];
        unpack_word<T>(cur.x[t][i], x);
        rotate_back<T, VPT>(cur, t, i, dn);
        if constexpr (kKeep)
#pragma unroll
          for (int j = 0; j < N; ++j) kept[t][i][j] = dn[j];
        weigh(t, i, v, dn, g);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          part[2 * t] += x[j] * x[j];
          part[2 * t + 1] += g[j] * x[j];
        }
      }
    }
#pragma unroll
    for (int v = 0; v < 4; ++v) part[v] = warp_sum(part[v]);
    if (threadIdx.x % 32 == 0) sums[pass][threadIdx.x / 32] = make_float4(part[0], part[1], part[2], part[3]);
    __syncthreads();  // one per unit: the next unit writes the other buffer, and the one after this one's
                      // only past the next unit's barrier, after every thread has read it here
    float total[4] = {0.f, 0.f, 0.f, 0.f};
    for (int wi = 0; wi < warps; ++wi) {  // the same order in every thread
      const float4 s4 = sums[pass][wi];
      total[0] += s4.x;
      total[1] += s4.y;
      total[2] += s4.z;
      total[3] += s4.w;
    }
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const QkBwdOperand& o = t ? a.k : a.q;
      const float r = rsqrtf(total[2 * t] * inv_g + a.eps);
      const float mean = r * total[2 * t + 1] * inv_g;
      T* dx = static_cast<T*>(o.dx) + at.b * o.dx_batch_stride + at.s * o.dx_seq_stride;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t v = threadIdx.x + int64_t(i) * blockDim.x;
        if (v >= words) continue;
        float x[N], dn[N], g[N], out[N];
        unpack_word<T>(cur.x[t][i], x);
        if constexpr (kKeep) {
#pragma unroll
          for (int j = 0; j < N; ++j) dn[j] = kept[t][i][j];
        } else {
          rotate_back<T, VPT>(cur, t, i, dn);
        }
        weigh(t, i, v, dn, g);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float m = x[j] * r;
          out[j] = r * (g[j] - m * mean);
          acc[t][i][j] += dn[j] * (ROUND ? round_through<T>(m) : m);
        }
        store_vec<T, N>(dx + v * N, out);
      }
    }
    if constexpr (kPrefetch) {
      cur = next;
    } else {
      if (u + 1 < end) load_unit<T, VPT>(a, ahead, words, col, cur);
    }
  }
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const QkBwdOperand& o = t ? a.k : a.q;
    if (o.partials == nullptr) continue;
    float* part = o.partials + int64_t(blockIdx.x) * a.head_dim;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = threadIdx.x + int64_t(i) * blockDim.x;
      if (v < words) store_vec<float, N>(part + v * N, acc[t][i]);
    }
  }
}

bool row_aligned(const void* p, int64_t batch_stride, int64_t seq_stride, int64_t elems_per_word) {
  return config::rows_aligned(p, batch_stride, seq_stride, elems_per_word);
}

// Threads per row of the row kernel for the call's shapes and form (whole-row norm, interleaved rotation,
// rows and tables of whole words), alignment aside; 0: the block or warp kernel.
int row_form_threads(const QkRmsnormRopeBwdArgs& a) {
  const int64_t n = 16 / dtype_size(a.dtype);
  if (a.head_dim != a.dim || a.rotation != Rotation::kInterleaved || a.table_dim % n || a.dim % n ||
      n % 4 || config::bwd_pairs_per_thread(a.head_dim) == 0)
    return 0;
  return config::bwd_row_threads(a.dim / n);
}

// Threads per row of the row kernel for this call (`threads`: its row_form_threads); 0: it cannot take it
// (or a development build forced the block kernel).
int row_kernel_threads(const QkRmsnormRopeBwdArgs& a, int threads) {
  const int64_t n = 16 / dtype_size(a.dtype);
  if (threads == 0) return 0;
  for (const QkBwdOperand* o : {&a.q, &a.k}) {
    if (!row_aligned(o->x, o->x_batch_stride, o->x_seq_stride, n) ||
        !row_aligned(o->dy, o->dy_batch_stride, o->dy_seq_stride, n) ||
        !row_aligned(o->dx, o->dx_batch_stride, o->dx_seq_stride, n))
      return 0;
    if (o->weight != nullptr && !is_aligned16(o->weight)) return 0;
    if (o->partials != nullptr && !is_aligned16(o->partials)) return 0;
  }
  for (const QkTable* t : {&a.cos, &a.sin})
    if (!row_aligned(t->ptr, t->batch_stride, t->seq_stride, 4)) return 0;
  return threads;
}

template <typename T, typename Tw, int VPT, bool kPrefetch, int REGS>
cudaError_t launch_rows_at(const BwdParams& p, int threads, cudaStream_t stream) {
  const auto kernel = p.a.round_before_weight ? qk_bwd_rows<T, Tw, VPT, kPrefetch, true, REGS>
                                              : qk_bwd_rows<T, Tw, VPT, kPrefetch, false, REGS>;
  return launch_kernel(kernel, dim3(unsigned(p.sp.workers())), dim3(threads), 0, stream,
                       dependent_launch_enabled(), p);
}

// Whether the next unit's words are loaded ahead (config::bwd_prefetch): the table's in a release build, either
// where a development build forces it.
template <typename T, typename Tw, int VPT>
cudaError_t launch_rows_with(const BwdParams& p, int threads, cudaStream_t stream) {
  constexpr bool kPrefetch = config::bwd_prefetch(VPT);
  constexpr int REGS = config::bwd_row_registers(VPT);
  if constexpr (tuning::kDevBuild) {
    const int forced = config::bwd_forced_prefetch();
    if (forced >= 0 && (forced == 1) != kPrefetch)
      return launch_rows_at<T, Tw, VPT, !kPrefetch, REGS>(p, threads, stream);
  }
  return launch_rows_at<T, Tw, VPT, kPrefetch, REGS>(p, threads, stream);
}

template <typename T, typename Tw> cudaError_t launch_rows(const BwdParams& p, int vpt, int threads, cudaStream_t stream) {
  static_assert(config::kBwdMaxRowWordsPerThread == 4, "one case per words-per-thread below");
  if (vpt > 2) return launch_rows_with<T, Tw, 4>(p, threads, stream);
  if (vpt > 1) return launch_rows_with<T, Tw, 2>(p, threads, stream);
  return launch_rows_with<T, Tw, 1>(p, threads, stream);
}

int64_t units_of(const QkRmsnormRopeBwdArgs& a) { return a.batch * a.seq * (a.dim / a.head_dim); }

template <typename T, typename Tw> cudaError_t launch(const QkRmsnormRopeBwdArgs& a, cudaStream_t stream) {
  const int form_threads = row_form_threads(a);
  const BwdParams p{a, bwd_split(units_of(a), a.head_dim, form_threads)};
  const int64_t workers = p.sp.workers();
  const int ppt = config::bwd_pairs_per_thread(a.head_dim);
  const int row_threads = row_kernel_threads(a, form_threads);
  cudaError_t err = cudaSuccess;
  if (row_threads > 0) {
    const int vpt = int(ceil_div(a.dim / (16 / int64_t(sizeof(T))), int64_t(row_threads)));
    err = launch_rows<T, Tw>(p, vpt, row_threads, stream);
  } else if (ppt == 0) {
    err = launch_kernel(qk_bwd_warp<T, Tw>, dim3(unsigned(ceil_div(workers, kWarps))), dim3(kThreads), 0, stream,
                        dependent_launch_enabled(), p);
  } else {
    static_assert(config::kBwdMaxPairsPerThread == 8, "one case per pairs-per-thread below");
    const auto kernel = ppt <= 1   ? qk_bwd_block<T, Tw, 1>
                        : ppt <= 2 ? qk_bwd_block<T, Tw, 2>
                        : ppt <= 4 ? qk_bwd_block<T, Tw, 4>
                                   : qk_bwd_block<T, Tw, 8>;
    err = launch_kernel(kernel, dim3(static_cast<unsigned>(workers)), dim3(kThreads), 0, stream,
                        dependent_launch_enabled(), p);
  }
  // Each run's workers, then (several runs) the runs' sums: both in a fixed order, q's and k's in one launch.
  const int64_t G = a.head_dim, runs = p.sp.unit_groups;
  ColumnSumJobs workers_sums, runs_sums;
  for (const QkBwdOperand* o : {&a.q, &a.k}) {
    if (o->partials == nullptr) continue;
    float* run_sums = o->partials + workers * G;  // [runs, G] after the workers' rows
    if (runs == 1) {
      workers_sums.add({o->partials, o->grad_weight, dtype_of<Tw>(), 1, p.sp.splits});
    } else {
      workers_sums.add({o->partials, run_sums, DType::kFloat32, runs, p.sp.splits});
      runs_sums.add({run_sums, o->grad_weight, dtype_of<Tw>(), 1, runs});
    }
  }
  if (err == cudaSuccess) err = column_sums(workers_sums, G, stream);
  if (err == cudaSuccess) err = column_sums(runs_sums, G, stream);
  return err;
}

}  // namespace

int64_t qk_rmsnorm_rope_bwd_workspace(const QkRmsnormRopeBwdArgs& a) {
  if (a.head_dim <= 0 || a.dim % a.head_dim) return 0;
  const BwdSplit sp = bwd_split(units_of(a), a.head_dim, row_form_threads(a));
  return (sp.workers() + (sp.unit_groups > 1 ? sp.unit_groups : 0)) * a.head_dim;
}

cudaError_t qk_rmsnorm_rope_bwd(const QkRmsnormRopeBwdArgs& a, cudaStream_t stream) {
  if (a.head_dim <= 0 || a.head_dim % 2 || a.dim % a.head_dim || !qk_table_dim_ok(a.dim, a.head_dim, a.table_dim))
    return cudaErrorInvalidValue;
  for (const QkBwdOperand* o : {&a.q, &a.k})
    if (o->partials != nullptr && (o->weight == nullptr || o->grad_weight == nullptr)) return cudaErrorInvalidValue;
  if (a.batch == 0 || a.seq == 0 || a.dim == 0) return cudaSuccess;
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return a.weight_is_float ? launch<T, float>(a, stream) : launch<T, T>(a, stream);
  });
}

}  // namespace ltx
