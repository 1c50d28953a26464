// Fused q/k RMSNorm + RoPE (formula in qk_rmsnorm_rope.h). Memory-bound: q and
// k are read once and written once; the tables are read once per token, not
// once per row (fp32 and as wide as a row, they would otherwise be 4x the
// bytes of the row that uses them).
//
// Fast path: a row is held in registers as 16-byte words, `tpr` threads per
// row, word v = lane + i * tpr (i < VPT); the q and k rows of a sample are
// processed together, and the tables of a token are loaded once for all of them. A norm group is either the whole row
// (reduced over the row's threads) or one head of `group_words` words, a power
// of two <= 32: heads are then aligned runs of lanes and reduce with shuffles
// alone, and the rotate-half partner of a word is in lane ^ (group_words / 2).
// Per-head norms of bf16/fp16 take a one-word-per-thread kernel instead (v7,
// qk_rmsnorm_rope_head_words; since v8 the same lane of two heads per thread
// where the head count allows), with the same per-word reductions and results.
// Whole-row norms whose tables repeat per head (Wan) take a persistent kernel at
// Wan's widths (qk_rmsnorm_rope_row_tables), one table word per thread.
// Fallback: one warp per norm group, scalar accesses, any size or alignment.
// Which of them a call takes, and its grid: qk_rmsnorm_rope_config.h.
#include <type_traits>

#include "../common/launch.cuh"
#include "../common/rows.cuh"
#include "qk_rmsnorm_rope.h"
#include "qk_rmsnorm_rope_config.h"

namespace ltx {
namespace {

// Blocks and plans: qk_rmsnorm_rope_config.h.
using qk_rmsnorm_rope_config::kBlock;
using qk_rmsnorm_rope_config::kHeadBlock;
using qk_rmsnorm_rope_config::kWideBlock;
using qk_rmsnorm_rope_config::Plan;
constexpr unsigned kFullMask = 0xffffffffu;

// A unit is one row of q or k, ordered token-major, u = 2 * (s * batch + b) + (0 for q, 1 for k),
// so the rows that share a token's tables run back to back.
template <typename T> struct UnitRow {
  const T* in;
  T* out;
  const void* weight;
  const float* cos;
  const float* sin;
};

template <typename T> __device__ __forceinline__ UnitRow<T> unit_row(const QkRmsnormRopeArgs& a, int64_t u) {
  const int64_t token = u >> 1;
  const int64_t s = token / a.batch, b = token - s * a.batch;
  const bool is_k = u & 1;
  const QkOperand& o = is_k ? a.k : a.q;
  return {static_cast<const T*>(o.in) + b * o.in_batch_stride + s * o.in_seq_stride,
          static_cast<T*>(o.out) + b * o.out_batch_stride + s * o.out_seq_stride, o.weight,
          a.cos.ptr + b * a.cos.batch_stride + s * a.cos.seq_stride,
          a.sin.ptr + b * a.sin.batch_stride + s * a.sin.seq_stride};
}

// The rounding modes of the header.
struct RuntimeRounding {
  bool before_weight, normalized;
};
template <bool kBeforeWeight, bool kNormalized> struct FixedRounding {
  static constexpr bool before_weight = kBeforeWeight, normalized = kNormalized;
};

// A launch's rotation and rounding, read from the arguments (RuntimeChain) or
// fixed at compile time (FixedChain: the per-head kernel, and the whole-row
// kernel on LTX's chain), where as runtime flags they cost a branch or a
// select per element (per head: 1648 SASS instructions against 760 fixed).
struct RuntimeChain {
  static __device__ __forceinline__ bool half(const QkRmsnormRopeArgs& a) { return a.rotation == Rotation::kHalf; }
  static __device__ __forceinline__ RuntimeRounding rounding(const QkRmsnormRopeArgs& a) {
    return {a.round_before_weight, a.round_normalized};
  }
};
template <Rotation kRot, bool kBeforeWeight, bool kNormalized> struct FixedChain {
  static constexpr bool kHalf = kRot == Rotation::kHalf;
  using Rounding = FixedRounding<kBeforeWeight, kNormalized>;
  static __device__ __forceinline__ constexpr bool half(const QkRmsnormRopeArgs&) { return kHalf; }
  static __device__ __forceinline__ constexpr Rounding rounding(const QkRmsnormRopeArgs&) { return {}; }
};
template <typename Chain> constexpr bool kFixedChain = !std::is_same_v<Chain, RuntimeChain>;
// LTX-Video's chain: torch.nn.RMSNorm rounding, the norm rounded to T (exact mode), interleaved pairs.
using LtxChain = FixedChain<Rotation::kInterleaved, false, true>;
bool is_ltx_chain(const QkRmsnormRopeArgs& a) {
  return a.rotation == Rotation::kInterleaved && !a.round_before_weight && a.round_normalized;
}

// sum / n as 1 / rms needs it: a product with 1 / n (inv_n, passed when n is a
// power of two: then the same value) saves a float division (~10 instructions).
__device__ __forceinline__ float mean_of(float sum, float n, float inv_n) {
  return inv_n != 0.f ? sum * inv_n : sum / n;
}
float inverse_if_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0 ? 1.f / float(n) : 0.f; }

// The normalised value the rotation sees.
template <typename T, typename Rounding>
__device__ __forceinline__ float normalized(float x, float r, float w, bool has_weight, const Rounding& rnd) {
  float n = x * r;
  if (has_weight) {
    if (rnd.before_weight) n = round_through<T>(n);
    n = n * w;
  }
  return rnd.normalized ? round_through<T>(n) : n;
}

// y0 = x0 * c0 - x1 * s0, y1 = x1 * c1 + x0 * s1: separate products and sum, as eager.
__device__ __forceinline__ float rotated_first(float x0, float x1, float c0, float s0) {
  return __fadd_rn(__fmul_rn(x0, c0), __fmul_rn(-x1, s0));
}
__device__ __forceinline__ float rotated_second(float x1, float x0, float c1, float s1) {
  return __fadd_rn(__fmul_rn(x1, c1), __fmul_rn(x0, s1));
}

__device__ __forceinline__ float xor_sum(float v, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Sums over the `tpr` consecutive threads of a row (tpr a power of two <=
// BLOCK) for R rows at once (q and k of each sample in the pass). Every
// thread of the block must call it; the caller syncs before `warp_sums` is
// reused when tpr > 32. kWholeBlockPath: a loop of known length (16-byte
// shared loads) when a row fills the block, as LTX's do; only in the kernels
// compiled for LTX's chain (elsewhere its registers made the 48-register
// kernels spill).
template <int R, int BLOCK, bool kWholeBlockPath>
__device__ __forceinline__ void row_totals(float (&v)[R], int tpr, float (&warp_sums)[R][BLOCK / 32]) {
  if (tpr <= 32) {
    for (float& x : v) x = xor_sum(x, tpr);
    return;
  }
  for (int t = 0; t < R; ++t) {
    v[t] = xor_sum(v[t], 32);
    if (threadIdx.x % 32 == 0) warp_sums[t][threadIdx.x / 32] = v[t];
  }
  __syncthreads();
  if (kWholeBlockPath && tpr == BLOCK) {
    for (int t = 0; t < R; ++t) {
      v[t] = 0.f;
#pragma unroll
      for (int w = 0; w < BLOCK / 32; ++w) v[t] += warp_sums[t][w];
    }
    return;
  }
  const int warps = tpr / 32, first = (threadIdx.x / tpr) * warps;
  for (int t = 0; t < R; ++t) {
    v[t] = 0.f;
    for (int w = 0; w < warps; ++w) v[t] += warp_sums[t][first + w];
  }
}

// The words of one row a thread holds: word v = lane + i * tpr, valid when v < words.
struct RowLanes {
  int lane, tpr, words;
  __device__ __forceinline__ int word(int i) const { return lane + i * tpr; }
};

// Table words a thread holds: one per row word, or a single one when the
// tables are per head (table_dim == head_dim): with tpr a multiple of the head
// words, word v = lane + i * tpr is then in the same table column for every i.
template <int VPT, bool kHeadTables> __host__ __device__ constexpr int table_slots() { return kHeadTables ? 1 : VPT; }

// Normalise, rotate and store the words of one row (its 1 / rms per word in r).
template <typename T, typename Tw, typename Chain, int VPT, bool kHeadTables, int TS = table_slots<VPT, kHeadTables>()>
__device__ __forceinline__ void finish_row(const QkRmsnormRopeArgs& a, const RowLanes& rl, bool active,
                                           const uint4 (&raw)[VPT], const float (&r)[VPT], const Tw* weight,
                                           const float (&cos)[TS][16 / sizeof(T)],
                                           const float (&sin)[TS][16 / sizeof(T)], int group_words, T* out) {
  constexpr int N = 16 / sizeof(T);
  // The weight has one norm group of columns: per head, the lane's column is
  // the same for every i (tpr is a multiple of the head words); over the whole
  // row it is the word itself. No division per word.
  const int head_lane = group_words ? rl.lane % group_words : 0;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = rl.word(i);
    const int weight_word = group_words ? head_lane : v;
    const bool ok = active && v < rl.words;
    const float(&c)[N] = cos[kHeadTables ? 0 : i];
    const float(&s)[N] = sin[kHeadTables ? 0 : i];
    float x[N], w[N], n[N], y[N];
    unpack_word<T>(raw[i], x);
    if (ok && weight != nullptr) load_vec<Tw, N>(weight + weight_word * N, w);
#pragma unroll
    for (int j = 0; j < N; ++j)
      n[j] = normalized<T>(x[j], r[i], weight ? w[j] : 1.f, weight != nullptr, Chain::rounding(a));
    if (Chain::half(a)) {  // uniform branch: every lane shuffles
      const bool first = head_lane < group_words / 2;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float partner = __shfl_xor_sync(kFullMask, n[j], group_words / 2);
        y[j] = first ? rotated_first(n[j], partner, c[j], s[j]) : rotated_second(n[j], partner, c[j], s[j]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < N; j += 2) {
        y[j] = rotated_first(n[j], n[j + 1], c[j], s[j]);
        y[j + 1] = rotated_second(n[j + 1], n[j], c[j + 1], s[j + 1]);
      }
    }
    if (ok) reinterpret_cast<uint4*>(out)[v] = pack_word<T>(y);
  }
}

// Token-major: `tpr` threads own a token and walk its samples, S at a time;
// for each they normalise and rotate the q row and the k row together (2 * S
// rows in flight, one reduction round and one table read for all of them).
// Tables shared by the batch (stride 0) are loaded into registers once per
// token; S = 2 only then (per-sample tables would need a copy per sample).
// Blocks per SM to ask ptxas for: the kernel is latency-bound, so more rows
// in flight pay; at 1 word per thread 5 blocks fit in 48 registers without
// spills (62 unconstrained: 4 blocks), two samples per pass 4 blocks, per-head
// tables at 2 words 4 blocks. Larger variants would spill, so they are left
// unconstrained. LTX's chain compiled in (kFixed) spilled 32 bytes in 48
// registers at one sample per pass: 4 blocks.
template <int VPT, bool kHeadTables, int S, bool kFixed> __host__ __device__ constexpr int min_blocks_per_sm() {
  if (S == 2) return VPT == 1 ? 4 : VPT == 2 ? 2 : 1;  // VPT 2: <= 128 registers (129 would leave 1 block per SM)
  return VPT == 1 ? (kFixed ? 4 : 5) : (VPT == 2 && kHeadTables) ? 4 : 1;
}
// The same register budgets for a block of BLOCK threads.
template <int VPT, bool kHeadTables, int S, int BLOCK, bool kFixed>
__host__ __device__ constexpr int min_blocks_per_sm() {
  constexpr int blocks = min_blocks_per_sm<VPT, kHeadTables, S, kFixed>() * kBlock / BLOCK;
  return blocks > 1 ? blocks : 1;
}

template <typename T, typename Tw, typename Chain, int VPT, bool kHeadTables, int S, int BLOCK>
__global__ void __launch_bounds__(BLOCK, min_blocks_per_sm<VPT, kHeadTables, S, BLOCK, kFixedChain<Chain>>())
    qk_rmsnorm_rope_vectorized(QkRmsnormRopeArgs a, int tpr, int group_words, float inv_group) {
  constexpr int N = 16 / sizeof(T);
  constexpr int R = 2 * S;  // rows per pass: q and k of S samples, row u = 2 * sample + (0 q, 1 k)
  __shared__ float warp_sums[R][BLOCK / 32];
  pdl_wait_and_release();
  const RowLanes rl{int(threadIdx.x) & (tpr - 1), tpr, int(a.dim / N)};
  const int tokens_per_block = BLOCK / tpr, table_words = int(a.table_dim / N);
  const float group = float(group_words ? a.head_dim : a.dim);
  const bool tables_per_sample = a.cos.batch_stride != 0 || a.sin.batch_stride != 0;
  for (int64_t base = int64_t(blockIdx.x) * tokens_per_block; base < a.seq;
       base += int64_t(gridDim.x) * tokens_per_block) {
    const int64_t s = base + threadIdx.x / tpr;
    const bool active = s < a.seq;
    constexpr int TS = table_slots<VPT, kHeadTables>();
    float c[TS][N], sn[TS][N];
    for (int64_t b0 = 0; b0 < a.batch; b0 += S) {
      uint4 raw[R][VPT];
      float sq[R][VPT];
#pragma unroll
      for (int u = 0; u < R; ++u) {
        const int64_t b = b0 + u / 2;
        const QkOperand& o = (u & 1) ? a.k : a.q;  // u is a constant after unrolling
        const bool row_ok = active && (S == 1 || b < a.batch);  // S == 1: b0 < batch already
        const T* in = static_cast<const T*>(o.in) + b * o.in_batch_stride + s * o.in_seq_stride;  // read if row_ok
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
          const int v = rl.word(i);
          sq[u][i] = 0.f;
          raw[u][i] = make_uint4(0, 0, 0, 0);
          if (row_ok && v < rl.words) {
            raw[u][i] = reinterpret_cast<const uint4*>(in)[v];
            float x[N];
            unpack_word<T>(raw[u][i], x);
#pragma unroll
            for (int j = 0; j < N; ++j) sq[u][i] += x[j] * x[j];
          }
        }
      }
      if (b0 == 0 || tables_per_sample) {
        const float* cos_row = a.cos.ptr + b0 * a.cos.batch_stride + s * a.cos.seq_stride;
        const float* sin_row = a.sin.ptr + b0 * a.sin.batch_stride + s * a.sin.seq_stride;
#pragma unroll
        for (int i = 0; i < TS; ++i) {
          const int v = rl.word(i);
          if (active && v < rl.words) {
            // i == 0 only when kHeadTables; a row wider than its tables repeats them (Wan)
            const int col = (kHeadTables || table_words != rl.words ? v % table_words : v) * N;
            load_vec<float, N>(cos_row + col, c[i]);
            load_vec<float, N>(sin_row + col, sn[i]);
          }
        }
      }
      float r[R][VPT];
      if (group_words) {
#pragma unroll
        for (int u = 0; u < R; ++u)
#pragma unroll
          for (int i = 0; i < VPT; ++i)
            r[u][i] = rsqrtf(mean_of(xor_sum(sq[u][i], group_words), group, inv_group) + a.eps);
      } else {
        float totals[R];
#pragma unroll
        for (int u = 0; u < R; ++u) {
          totals[u] = 0.f;
#pragma unroll
          for (int i = 0; i < VPT; ++i) totals[u] += sq[u][i];
        }
        row_totals<R, BLOCK, kFixedChain<Chain>>(totals, tpr, warp_sums);
#pragma unroll
        for (int u = 0; u < R; ++u)
#pragma unroll
          for (int i = 0; i < VPT; ++i) r[u][i] = rsqrtf(mean_of(totals[u], group, inv_group) + a.eps);
      }
#pragma unroll
      for (int u = 0; u < R; ++u) {
        const int64_t b = b0 + u / 2;
        const QkOperand& o = (u & 1) ? a.k : a.q;
        const bool row_ok = active && (S == 1 || b < a.batch);  // S == 1: b0 < batch already
        T* out = static_cast<T*>(o.out) + b * o.out_batch_stride + s * o.out_seq_stride;  // written if row_ok
        finish_row<T, Tw, Chain, VPT, kHeadTables>(a, rl, row_ok, raw[u], r[u], static_cast<const Tw*>(o.weight), c,
                                                   sn, group_words, out);
      }
      if (tpr > 32) __syncthreads();  // warp_sums is reused by the next pass
    }
  }
}

// Whole-row norms whose tables repeat along the row (Wan's form; qk_rmsnorm_rope_config::plan_row_tables):
// TPR threads take a row of q and the same row of k, VPT words of each a thread and one table word (every
// word of a thread is in one table column). Persistent: a block walks rows (b, s) with a grid stride and
// loads the next row's words before it reduces and finishes the current one, as the layernorm row
// kernels; the chain (rounding) is compiled in.
template <typename T, int VPT>
__device__ __forceinline__ void load_qk_words(const QkRmsnormRopeArgs& a, const RowLanes& rl, RowIndex at,
                                              bool active, uint4 (&q)[VPT], uint4 (&k)[VPT]) {
  const T* qi = static_cast<const T*>(a.q.in) + at.b * a.q.in_batch_stride + at.s * a.q.in_seq_stride;
  const T* ki = static_cast<const T*>(a.k.in) + at.b * a.k.in_batch_stride + at.s * a.k.in_seq_stride;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (active && rl.word(i) < rl.words) {
      q[i] = reinterpret_cast<const uint4*>(qi)[rl.word(i)];
      k[i] = reinterpret_cast<const uint4*>(ki)[rl.word(i)];
    }
  }
}

template <typename T, int VPT>
__device__ __forceinline__ float sum_of_squares(const uint4 (&raw)[VPT], const RowLanes& rl, bool active) {
  constexpr int N = 16 / sizeof(T);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (!active || rl.word(i) >= rl.words) continue;
    float x[N];
    unpack_word<T>(raw[i], x);
#pragma unroll
    for (int j = 0; j < N; ++j) sum += x[j] * x[j];
  }
  return sum;
}

template <typename T, typename Tw, typename Chain, int TPR, int VPT>
__global__ void __launch_bounds__(qk_rmsnorm_rope_config::row_tables_block<TPR>(),
                                  qk_rmsnorm_rope_config::row_tables_min_blocks<TPR>())
    qk_rmsnorm_rope_row_tables(QkRmsnormRopeArgs a, float inv_dim) {
  constexpr int N = 16 / sizeof(T), kRowBlock = qk_rmsnorm_rope_config::row_tables_block<TPR>();
  constexpr int kRows = kRowBlock / TPR, kWarps = TPR / 32;
  static_assert(TPR % 32 == 0, "rows of whole warps");
  __shared__ float warp_sums[2][2][kRowBlock / 32];  // [pass parity][q, k][warp]
  pdl_wait_and_release();
  const int slot = threadIdx.x / TPR;
  const RowLanes rl{int(threadIdx.x % TPR), TPR, int(a.dim / N)};
  const int table_col = (rl.lane % int(a.table_dim / N)) * N;
  const uint32_t rows = uint32_t(a.batch * a.seq), stride = gridDim.x * kRows;
  const RowStep step = row_step(stride, uint32_t(a.seq));
  uint32_t row = blockIdx.x * kRows + slot;
  RowIndex at = split_row(row, uint32_t(a.seq));
  uint4 q[VPT], k[VPT];
  load_qk_words<T, VPT>(a, rl, at, row < rows, q, k);
  // The loop bound is uniform across the block (the barrier below).
  uint32_t pass = 0;
  for (uint32_t first = blockIdx.x * kRows; first < rows; first += stride, row += stride, ++pass) {
    const bool active = row < rows;
    const RowIndex next_at = step.advance(at);
    uint4 q_next[VPT], k_next[VPT];
    load_qk_words<T, VPT>(a, rl, next_at, row + stride < rows, q_next, k_next);
    float c[1][N], sn[1][N];
    if (active) {
      load_vec<float, N>(a.cos.ptr + at.b * a.cos.batch_stride + at.s * a.cos.seq_stride + table_col, c[0]);
      load_vec<float, N>(a.sin.ptr + at.b * a.sin.batch_stride + at.s * a.sin.seq_stride + table_col, sn[0]);
    }
    float sums[2] = {xor_sum(sum_of_squares<T, VPT>(q, rl, active), 32),
                     xor_sum(sum_of_squares<T, VPT>(k, rl, active), 32)};
    if constexpr (kWarps > 1) {  // alternate buffers: the next pass writes the other one
      float(&mine)[2][kRowBlock / 32] = warp_sums[pass & 1];
      if (threadIdx.x % 32 == 0) {
        mine[0][threadIdx.x / 32] = sums[0];
        mine[1][threadIdx.x / 32] = sums[1];
      }
      __syncthreads();
      sums[0] = sums[1] = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        sums[0] += mine[0][slot * kWarps + w];
        sums[1] += mine[1][slot * kWarps + w];
      }
    }
    const float r_q = rsqrtf(mean_of(sums[0], float(a.dim), inv_dim) + a.eps);
    const float r_k = rsqrtf(mean_of(sums[1], float(a.dim), inv_dim) + a.eps);
    float rq[VPT], rk[VPT];  // finish_row takes an r per word: one row's here
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      rq[i] = r_q;
      rk[i] = r_k;
    }
    T* q_out = static_cast<T*>(a.q.out) + at.b * a.q.out_batch_stride + at.s * a.q.out_seq_stride;
    T* k_out = static_cast<T*>(a.k.out) + at.b * a.k.out_batch_stride + at.s * a.k.out_seq_stride;
    finish_row<T, Tw, Chain, VPT, true>(a, rl, active, q, rq, static_cast<const Tw*>(a.q.weight), c, sn, 0, q_out);
    finish_row<T, Tw, Chain, VPT, true>(a, rl, active, k, rk, static_cast<const Tw*>(a.k.weight), c, sn, 0, k_out);
    at = next_at;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      q[i] = q_next[i];
      k[i] = k_next[i];
    }
  }
}

// Per-head norms of 2-byte types (v7): one 16-byte word of q and one of k
// per thread, so a thread's loads of a sample (q, k, tables, weights) are all
// issued before its shuffles, and no state is carried between tokens (one
// block per token group and chunk, not persistent). A block of kHeadBlock
// threads holds whole tokens (rounded up to whole warps: the extra threads
// only join the shuffles) or one chunk of whole warps of a longer row, so any
// head count fits without the idle slots of a power-of-two tpr. The v6 path
// gave each thread 2-3 words of a row (64-91 registers) at ~14 instructions
// per element; here conversions take a pair of elements per instruction and,
// with the diffusers rounding and a weight of T, the weight product is one
// packed multiply per pair: x·r rounded to T times w is exact in float, so
// the packed product rounded once is the eager T(float(T(x·r)) · w) bit for bit.
// 4 blocks per SM fit its ~62 registers without spills (5, capping it at 48
// with 12-80 bytes of spills, measured 17% slower on an H200). Staging the
// next sample's words through shared memory with cp.async while finishing the
// current one (no registers held in flight) was 11-12% slower on an H200, and
// bulk copies (TMA) of whole q and k rows 4 units ahead on a persistent grid
// (~3x the bytes in flight) no faster (56.0 -> 56.4 us, Flux 38.5 -> 40.7):
// loads in flight are not what limits it there. Its block: kHeadBlock.

// The normalised pair (x0, x1) of a row (1 / rms in r; `w` the pair of the
// lane's weight column, from raw weight words).
template <typename T, typename Tw, typename Rounding>
__device__ __forceinline__ float2 normalized_pair(uint32_t x, float r, const uint4* w, int p, bool has_weight) {
  constexpr Rounding rnd{};  // FixedRounding
  const float2 xf = unpack_pair<T>(x);
  if constexpr (std::is_same_v<Tw, T>) {
    const uint32_t wp = reinterpret_cast<const uint32_t*>(w)[p];
    // The exact diffusers chain, packed; without a weight `w` holds ones, and
    // T(T(x * r) * 1) is the chain's T(x * r).
    if constexpr (rnd.before_weight && rnd.normalized)
      return unpack_pair<T>(mul_pair<T>(pack_pair<T>(xf.x * r, xf.y * r), wp));
    const float2 wf = has_weight ? unpack_pair<T>(wp) : make_float2(1.f, 1.f);
    return make_float2(normalized<T>(xf.x, r, wf.x, has_weight, rnd), normalized<T>(xf.y, r, wf.y, has_weight, rnd));
  } else {
    const float2 wf = reinterpret_cast<const float2*>(w)[p];
    return make_float2(normalized<T>(xf.x, r, wf.x, has_weight, rnd), normalized<T>(xf.y, r, wf.y, has_weight, rnd));
  }
}

// The per-head rows' finish for W words of q and W of k (raw[i][0] q, raw[i][1]
// k, words t + i * row_slots of the row): per-head 1 / rms through shuffles,
// normalise, rotate, store.
template <typename T, typename Tw, typename Chain, int W, int WW>
__device__ __forceinline__ void finish_head_words(const QkRmsnormRopeArgs& a, const uint4 (&raw)[W][2],
                                                  const float (&c)[16 / sizeof(T)], const float (&sn)[16 / sizeof(T)],
                                                  const uint4 (&w)[2][WW], int t, int row_slots, int group_words,
                                                  bool active, int64_t b, int64_t s) {
  constexpr int P = 16 / sizeof(T) / 2;
  const bool first_half = (t & (group_words - 1)) < group_words / 2;
  // head_dim = N * group_words is a power of two here, so the product with its
  // reciprocal is the quotient exactly (a float division is ~10 instructions).
  const float inv_group = 1.f / float(a.head_dim);
  float r[W][2];
#pragma unroll
  for (int i = 0; i < W; ++i)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      float sq = 0.f;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const float2 xf = unpack_pair<T>(reinterpret_cast<const uint32_t*>(&raw[i][u])[p]);
        sq += xf.x * xf.x;
        sq += xf.y * xf.y;
      }
      r[i][u] = rsqrtf(xor_sum(sq, group_words) * inv_group + a.eps);
    }
#pragma unroll
  for (int i = 0; i < W; ++i) {
    // q and k pair by pair: each table pair is dead after its last use
    uint4 y[2];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int j = 2 * p;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const float2 n = normalized_pair<T, Tw, typename Chain::Rounding>(
            reinterpret_cast<const uint32_t*>(&raw[i][u])[p], r[i][u], w[u], p, (u ? a.k : a.q).weight != nullptr);
        uint32_t& out = reinterpret_cast<uint32_t*>(&y[u])[p];
        if constexpr (Chain::kHalf) {
          const float p0 = __shfl_xor_sync(kFullMask, n.x, group_words / 2);
          const float p1 = __shfl_xor_sync(kFullMask, n.y, group_words / 2);
          out = first_half ? pack_pair<T>(rotated_first(n.x, p0, c[j], sn[j]),
                                          rotated_first(n.y, p1, c[j + 1], sn[j + 1]))
                           : pack_pair<T>(rotated_second(n.x, p0, c[j], sn[j]),
                                          rotated_second(n.y, p1, c[j + 1], sn[j + 1]));
        } else {
          out = pack_pair<T>(rotated_first(n.x, n.y, c[j], sn[j]), rotated_second(n.y, n.x, c[j + 1], sn[j + 1]));
        }
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const QkOperand& o = u ? a.k : a.q;
      T* out = static_cast<T*>(o.out) + b * o.out_batch_stride + s * o.out_seq_stride;
      if (active) reinterpret_cast<uint4*>(out)[t + i * row_slots] = y[u];
    }
  }
}

// The lane's weight columns of q and k (raw words; L1 after the first token),
// ones where there is no weight.
template <typename T, typename Tw, int WW>
__device__ __forceinline__ void load_head_weights(const QkRmsnormRopeArgs& a, int head_lane, uint4 (&w)[2][WW]) {
  constexpr int N = 16 / sizeof(T);
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const Tw* weight = static_cast<const Tw*>((u ? a.k : a.q).weight);
#pragma unroll
    for (int i = 0; i < WW; ++i)
      w[u][i] = weight ? reinterpret_cast<const uint4*>(weight + head_lane * N)[i] : filled_word<Tw>(1.f);
  }
}

// W words of q and of k per thread (W = 2 doubles the bytes in flight for
// ~12 more registers, 3 blocks per SM instead of 4): a thread's words are t
// and t + words / W of the row, the same lane of W heads, so they share the
// weight and table columns. Chain is a FixedChain.
template <typename T, typename Tw, int W, typename Chain>
__global__ void __launch_bounds__(kHeadBlock, W == 1 ? 4 : 3)
    qk_rmsnorm_rope_head_words(QkRmsnormRopeArgs a, int tokens_per_block, int group_words) {
  static_assert(sizeof(T) == 2, "packed pairs of a 2-byte type");
  constexpr int N = 16 / sizeof(T), WW = sizeof(Tw) * N / 16;
  pdl_wait_and_release();
  // blockIdx.y picks a chunk of the row's thread slots (gridDim.y chunks of whole heads), blockIdx.x the tokens
  const int row_slots = int(a.dim / N) / W;
  const int chunk = row_slots / int(gridDim.y);
  const int slot = int(threadIdx.x) / chunk;
  const int t = int(blockIdx.y) * chunk + int(threadIdx.x) - slot * chunk;
  const int head_lane = t & (group_words - 1);  // group_words is a power of two dividing row_slots
  const bool tables_per_sample = a.cos.batch_stride != 0 || a.sin.batch_stride != 0;
  // W == 1 unless per-head tables; a row wider than its tables repeats them
  const int table_col = (a.table_dim == a.head_dim ? head_lane : t % int(a.table_dim / N)) * N;
  const int64_t s = int64_t(blockIdx.x) * tokens_per_block + slot;
  // slot == tokens_per_block: a thread rounding the block up to whole warps; it only joins the shuffles
  const bool active = slot < tokens_per_block && s < a.seq;
  float c[N], sn[N];
  for (int64_t b = 0; b < a.batch; ++b) {
    uint4 raw[W][2], w[2][WW];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const QkOperand& o = u ? a.k : a.q;
      const uint4* in = reinterpret_cast<const uint4*>(static_cast<const T*>(o.in) + b * o.in_batch_stride +
                                                       s * o.in_seq_stride);
#pragma unroll
      for (int i = 0; i < W; ++i) raw[i][u] = active ? in[t + i * row_slots] : make_uint4(0, 0, 0, 0);
    }
    if ((b == 0 || tables_per_sample) && active) {
      load_vec<float, N>(a.cos.ptr + b * a.cos.batch_stride + s * a.cos.seq_stride + table_col, c);
      load_vec<float, N>(a.sin.ptr + b * a.sin.batch_stride + s * a.sin.seq_stride + table_col, sn);
    }
    load_head_weights<T, Tw, WW>(a, head_lane, w);
    finish_head_words<T, Tw, Chain, W, WW>(a, raw, c, sn, w, t, row_slots, group_words, active, b, s);
  }
}

// One warp per norm group (a head, or the whole row); each lane owns whole
// pairs, reading both elements before writing them, so out may be in.
template <typename T, typename Tw> __global__ void __launch_bounds__(kBlock) qk_rmsnorm_rope_scalar(QkRmsnormRopeArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t groups_per_row = a.dim / a.head_dim, hd = a.head_dim, half = hd / 2;
  const int64_t groups = 2 * a.batch * a.seq * groups_per_row;
  const bool interleaved = a.rotation == Rotation::kInterleaved;
  for (int64_t g = int64_t(blockIdx.x) * (kBlock / 32) + threadIdx.x / 32; g < groups;
       g += int64_t(gridDim.x) * (kBlock / 32)) {
    const UnitRow<T> row = unit_row<T>(a, g / groups_per_row);
    const int64_t offset = (g % groups_per_row) * hd;
    const T* in = row.in + offset;
    T* out = row.out + offset;
    const Tw* weight = static_cast<const Tw*>(row.weight);
    float ss = 0.f;
    for (int64_t e = lane; e < hd; e += 32) {
      const float x = to_float(in[e]);
      ss += x * x;
    }
    const float r = rsqrtf(xor_sum(ss, 32) / float(hd) + a.eps);
    for (int64_t p = lane; p < half; p += 32) {
      const int64_t e0 = interleaved ? 2 * p : p, e1 = interleaved ? 2 * p + 1 : p + half;
      const int64_t t0 = (offset + e0) % a.table_dim, t1 = (offset + e1) % a.table_dim;
      const float w0 = weight ? to_float(weight[e0]) : 1.f, w1 = weight ? to_float(weight[e1]) : 1.f;
      const float n0 = normalized<T>(to_float(in[e0]), r, w0, weight != nullptr, RuntimeChain::rounding(a));
      const float n1 = normalized<T>(to_float(in[e1]), r, w1, weight != nullptr, RuntimeChain::rounding(a));
      out[e0] = from_float<T>(rotated_first(n0, n1, row.cos[t0], row.sin[t0]));
      out[e1] = from_float<T>(rotated_second(n1, n0, row.cos[t1], row.sin[t1]));
    }
  }
}

// The per-head kernel for the launch's words per thread, rotation and rounding.
template <typename T, typename Tw>
auto head_words_kernel(const QkRmsnormRopeArgs& a, bool word_pairs) {
  const auto by_rounding = [&](auto w_tag, auto rot_tag) {
    constexpr int W = decltype(w_tag)::value;
    constexpr Rotation kRot = decltype(rot_tag)::value;
    if (a.round_before_weight)
      return a.round_normalized ? qk_rmsnorm_rope_head_words<T, Tw, W, FixedChain<kRot, true, true>>
                                : qk_rmsnorm_rope_head_words<T, Tw, W, FixedChain<kRot, true, false>>;
    return a.round_normalized ? qk_rmsnorm_rope_head_words<T, Tw, W, FixedChain<kRot, false, true>>
                              : qk_rmsnorm_rope_head_words<T, Tw, W, FixedChain<kRot, false, false>>;
  };
  const auto by_rotation = [&](auto w_tag) {
    using Half = std::integral_constant<Rotation, Rotation::kHalf>;
    using Interleaved = std::integral_constant<Rotation, Rotation::kInterleaved>;
    return a.rotation == Rotation::kHalf ? by_rounding(w_tag, Half{}) : by_rounding(w_tag, Interleaved{});
  };
  return word_pairs ? by_rotation(std::integral_constant<int, 2>{}) : by_rotation(std::integral_constant<int, 1>{});
}

// The row-tables kernel for the launch's width (plan.tpr) and rounding (interleaved pairs only: whole-row
// norms with the half rotation take the scalar fallback).
template <typename T, typename Tw>
cudaError_t launch_row_tables(const QkRmsnormRopeArgs& a, const Plan& plan, cudaStream_t stream) {
  using qk_rmsnorm_rope_config::row_tables_block;
  using qk_rmsnorm_rope_config::row_tables_vpt;
  const auto go = [&](auto kernel, int block) -> cudaError_t {
    const int64_t grid = plan_grid(kernel, block, ceil_div(a.batch * a.seq, block / plan.tpr), GridPlan::kPersistent);
    if (grid < 0) return cudaGetLastError();
    return launch_kernel(kernel, dim3(unsigned(grid)), dim3(block), 0, stream, dependent_launch_enabled(), a,
                         inverse_if_power_of_two(a.dim));
  };
  const auto by_width = [&](auto chain_tag) -> cudaError_t {
    using Chain = typename decltype(chain_tag)::type;
    switch (plan.tpr) {
      case 64: return go(qk_rmsnorm_rope_row_tables<T, Tw, Chain, 64, row_tables_vpt(64)>, row_tables_block<64>());
      case 128: return go(qk_rmsnorm_rope_row_tables<T, Tw, Chain, 128, row_tables_vpt(128)>, row_tables_block<128>());
      case 160: return go(qk_rmsnorm_rope_row_tables<T, Tw, Chain, 160, row_tables_vpt(160)>, row_tables_block<160>());
    }
    return cudaErrorInvalidValue;  // plan_row_tables picks only these
  };
  constexpr Rotation kI = Rotation::kInterleaved;
  if (a.rotation != kI) return cudaErrorInvalidValue;
  if (a.round_before_weight)
    return a.round_normalized ? by_width(TypeTag<FixedChain<kI, true, true>>{})
                              : by_width(TypeTag<FixedChain<kI, true, false>>{});
  return a.round_normalized ? by_width(TypeTag<FixedChain<kI, false, true>>{})
                            : by_width(TypeTag<FixedChain<kI, false, false>>{});
}

template <typename T, typename Tw>
cudaError_t launch_vectorized(const QkRmsnormRopeArgs& a, const Plan& plan, cudaStream_t stream) {
  if (plan.row_tables) return launch_row_tables<T, Tw>(a, plan, stream);
  const int block = plan.tpr > kBlock ? kWideBlock : kBlock;
  const auto go = [&](auto kernel) -> cudaError_t {
    const int64_t needed = ceil_div(a.seq, block / plan.tpr);
    const int64_t grid = plan_grid(kernel, block, needed, qk_rmsnorm_rope_config::kVectorizedGrid);
    if (grid < 0) return cudaGetLastError();
    return launch_kernel(kernel, dim3(unsigned(grid)), dim3(block), 0, stream, dependent_launch_enabled(), a,
                         plan.tpr, plan.group_words,
                         inverse_if_power_of_two(plan.group_words ? a.head_dim : a.dim));
  };
  if (plan.tokens_per_block) {
    if constexpr (sizeof(T) == 2) {
      return launch_kernel(head_words_kernel<T, Tw>(a, plan.head_word_pairs),
                           qk_rmsnorm_rope_config::head_words_grid(a.seq, plan), dim3(plan.block), 0, stream,
                           dependent_launch_enabled(), a, plan.tokens_per_block, plan.group_words);
    }
    return cudaErrorInvalidValue;  // plan_for picks it for 2-byte types only
  }
  const bool head_tables = (plan.group_words && a.table_dim == a.head_dim) || plan.one_table_word;
  const bool two_samples = qk_rmsnorm_rope_config::samples_per_pass(a, plan) == 2;
  const auto by_vpt = [&](auto head_tag, auto samples_tag) -> cudaError_t {
    constexpr bool kHeadTables = decltype(head_tag)::value;
    constexpr int S = decltype(samples_tag)::value;
    if constexpr (!kHeadTables) {
      // LTX-Video's form (a whole-row norm, one word per thread) on its chain: compiled for it
      if (plan.vpt == 1 && plan.group_words == 0 && is_ltx_chain(a))
        return block == kWideBlock ? go(qk_rmsnorm_rope_vectorized<T, Tw, LtxChain, 1, false, S, kWideBlock>)
                                   : go(qk_rmsnorm_rope_vectorized<T, Tw, LtxChain, 1, false, S, kBlock>);
      if (block == kWideBlock) return go(qk_rmsnorm_rope_vectorized<T, Tw, RuntimeChain, 1, false, S, kWideBlock>);
    }
    const auto at_vpt = [&](auto vpt_tag) -> cudaError_t {
      constexpr int VPT = decltype(vpt_tag)::value;
      // Release builds compile only what plan_for picks without an override (override_only).
      if constexpr (tuning::kDevBuild ||
                    !qk_rmsnorm_rope_config::override_only<int(sizeof(T)), VPT, kHeadTables, S>())
        return go(qk_rmsnorm_rope_vectorized<T, Tw, RuntimeChain, VPT, kHeadTables, S, kBlock>);
      else
        return cudaErrorInvalidValue;  // unreachable without an override
    };
    switch (plan.vpt) {
      case 1: return at_vpt(std::integral_constant<int, 1>{});
      case 2: return at_vpt(std::integral_constant<int, 2>{});
      case 3: return at_vpt(std::integral_constant<int, 3>{});
      case 4: return at_vpt(std::integral_constant<int, 4>{});
    }
    if constexpr (kHeadTables) {  // whole rows at one table word only (plan_row_tables)
      if (plan.vpt == 5) return at_vpt(std::integral_constant<int, 5>{});
      if (plan.vpt == 6) return at_vpt(std::integral_constant<int, 6>{});
    }
    return cudaErrorInvalidValue;
  };
  const auto by_samples = [&](auto head_tag) -> cudaError_t {
    // Per-head tables imply a per-head norm, which always takes one sample per pass.
    if constexpr (!decltype(head_tag)::value) {
      if (two_samples) return by_vpt(head_tag, std::integral_constant<int, 2>{});
    }
    return by_vpt(head_tag, std::integral_constant<int, 1>{});
  };
  return head_tables ? by_samples(std::true_type{}) : by_samples(std::false_type{});
}

template <typename T, typename Tw> cudaError_t launch_scalar(const QkRmsnormRopeArgs& a, cudaStream_t stream) {
  const int64_t needed = ceil_div(2 * a.batch * a.seq * (a.dim / a.head_dim), kBlock / 32);
  const int64_t grid =
      plan_grid(qk_rmsnorm_rope_scalar<T, Tw>, kBlock, needed, qk_rmsnorm_rope_config::kScalarGrid);
  if (grid < 0) return cudaGetLastError();
  qk_rmsnorm_rope_scalar<T, Tw><<<unsigned(grid), kBlock, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

QkRmsnormRopePath qk_rmsnorm_rope_path(const QkRmsnormRopeArgs& a) {
  return qk_rmsnorm_rope_config::plan_for(a).vectorized ? QkRmsnormRopePath::kVectorized
                                                        : QkRmsnormRopePath::kScalarFallback;
}

cudaError_t qk_rmsnorm_rope(const QkRmsnormRopeArgs& a, cudaStream_t stream) {
  if (a.head_dim <= 0 || a.head_dim % 2 || a.dim % a.head_dim || !qk_table_dim_ok(a.dim, a.head_dim, a.table_dim))
    return cudaErrorInvalidValue;
  if (a.batch == 0 || a.seq == 0 || a.dim == 0) return cudaSuccess;
  const Plan plan = qk_rmsnorm_rope_config::plan_for(a);
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    const auto with_weight_type = [&](auto weight_tag) -> cudaError_t {
      using Tw = typename decltype(weight_tag)::type;
      return plan.vectorized ? launch_vectorized<T, Tw>(a, plan, stream) : launch_scalar<T, Tw>(a, stream);
    };
    return a.weight_is_float ? with_weight_type(TypeTag<float>{}) : with_weight_type(TypeTag<T>{});
  });
}

}  // namespace ltx
