// Backward of layernorm, adaln_layernorm and gated_residual_layernorm: the
// kernels (formulas and rounding notes in layernorm.h). One row kernel for the three
// ops, templated on the op (Variant: what it adds), then common/column_sum.cuh
// for each reduced grad. Each op's launcher is instantiated in its own .cu
// (layernorm_bwd.cu, adaln_layernorm_bwd.cu, gated_residual_layernorm_bwd.cu), so that nvcc
// compiles them in parallel, as the forward's.
//
// Row kernel: a block takes its fixed run of rows one at a time
// (layernorm_bwd_blocks); a thread holds the same columns in every row, so its
// sums of the reduced grads (weight, bias, and modulation tensors broadcast
// over rows) stay in its registers (vectorized path) or in the block's own
// workspace rows (scalar path), always added in row order, and are written to
// the workspace once. No atomics. Plain layernorm without weight or bias sums
// nothing over rows: a warp takes a whole row (layernorm_bwd_vectorized_warp), or a
// thread one word (layernorm_bwd_plain_rows); with a weight or bias at those widths, and
// adaln_layernorm without, a thread's word of the row stays in registers, not the ring
// (layernorm_bwd_words).
#pragma once

#include "../common/column_sum.cuh"
#include "../common/row_ring.cuh"
#include "layernorm.cuh"

namespace ltx {
namespace ln {

constexpr int kThreads = layernorm_config::kBwdThreads;  // the scalar kernel's block

// The reduced grads, by role: the index of each one's workspace and accumulator.
enum Role : int { kWeight = 0, kBias, kScale, kShift, kGate, kRoles };
// Roles an op can have (its vectorized kernel keeps an accumulator for each).
__host__ __device__ constexpr int roles_of(Variant v) { return v == Variant::kLayerNorm ? 2 : v == Variant::kAdalnLayerNorm ? 4 : 5; }

struct BwdParams {
  LayerNormBwdArgs a;
  float* partials[kRoles];  // the workspace of each reduced grad, by role, or null (not summed)
  int64_t group_rows, blocks_per_group, rows_per_block;
  float inv_hidden;
  bool round_mod;  // exact mode with half modulation: n' = T(n), (1 + scale)' = T(1 + scale)
};

// (1 + scale)': what the forward multiplied n' by.
template <typename T> __device__ __forceinline__ float mod_multiplier(float sc, bool round_mod) {
  const float one_plus = 1.f + sc;
  return round_mod ? round_through<T>(one_plus) : one_plus;
}
// n': what the forward multiplied by (1 + scale)', from n0 and the affine w, b (1 and 0 when absent).
template <typename T> __device__ __forceinline__ float modulated_n(float n0, float w, float b, bool round_mod) {
  const float n = fmaf(n0, w, b);  // the forward's n
  return round_mod ? round_through<T>(n) : n;
}
// The modulated ops' products dn = dout * (1 + scale)' and dscale's term dout * n', rounded as written
// (never fused into the sums after them), so that every kernel of the family gives the same bits.
__device__ __forceinline__ float mod_product(float a, float b) { return __fmul_rn(a, b); }

// One element's terms of the row: n0 = (h - mean) * rstd; with scale, n' and dn.
template <typename T>
__device__ __forceinline__ void element_terms(float h, float dout, float w, float b, float sc, bool has_scale,
                                              bool round_mod, float mean, float rstd, float& n0, float& dn,
                                              float& n_mod) {
  n0 = (h - mean) * rstd;
  dn = dout;
  n_mod = 0.f;
  if (has_scale) {
    n_mod = modulated_n<T>(n0, w, b, round_mod);
    dn = mod_product(dout, mod_multiplier<T>(sc, round_mod));
  }
}

// The rows of a block's fixed run: [first, end), within one group.
struct RowRun {
  int64_t first, end;
};
__device__ __forceinline__ RowRun block_rows(const BwdParams& p) {
  const int64_t g = blockIdx.x / p.blocks_per_group, k = blockIdx.x - g * p.blocks_per_group;
  const int64_t first = g * p.group_rows + k * p.rows_per_block;
  const int64_t group_end = (g + 1) * p.group_rows;
  return {first, first + p.rows_per_block < group_end ? first + p.rows_per_block : group_end};
}

// Rows of up to TPR * VPT 16-byte words of T, a block of TPR threads per row.
// A thread's words are v = threadIdx.x + i * TPR. One read of every row from
// HBM, through a ring of S stages in shared memory (common/row_ring.cuh): the
// next S - 1 rows' words (h and dout; on the seam grad_h and y too) are in
// flight while this one is reduced and written, and both passes over the row
// read its words there and recompute their terms (no row is held in registers
// across the reduction); weight, bias and modulation are re-read per pass
// (L1). The reduced grads' sums are per-thread registers, one array per
// role (kRoles of the op; a role not wanted is never added to). REDUCE false (no
// grad asked for is summed over rows, as in LoRA training: frozen weights and
// modulation) compiles the sums away: the seam's five roles cost 40 registers.
// AFFINE false (no weight and no bias: Wan's and Flux's modulated norms) compiles
// their loads, products and sums away. ROUND: the call's round_mod, compiled in (as fused_norm's backward:
// a runtime select per element left the kernel issue-bound).
// S = 1: no ring; this row's words and the next row's in registers (layernorm_config::bwd_rows_in_registers).
template <typename T, typename Tm, Variant V, int TPR, int VPT, int S, bool REDUCE, bool AFFINE, bool ROUND>
__global__ void __launch_bounds__(TPR) layernorm_bwd_vectorized(BwdParams p) {
  pdl_wait();
  constexpr int N = 16 / sizeof(T);
  constexpr bool kSeam = V == Variant::kGatedResidualLayerNorm;
  constexpr bool kMod = V != Variant::kLayerNorm;
  constexpr int R = roles_of(V);
  const LayerNormBwdArgs& a = p.a;
  const int64_t nvec = a.hidden / N;
  const bool has_scale = kMod && a.scale.ptr != nullptr;
  constexpr bool round_mod = kMod && ROUND;
  bool want[R];
#pragma unroll
  for (int r = 0; r < R; ++r) want[r] = REDUCE && (AFFINE || (r != kWeight && r != kBias)) && p.partials[r] != nullptr;
  const bool rows_scale = kMod && a.grad_scale.kind == ModGradKind::kPerRow;
  const bool rows_shift = kMod && a.grad_shift.kind == ModGradKind::kPerRow;
  const bool rows_gate = kSeam && a.grad_gate.kind == ModGradKind::kPerRow;
  const bool want_dgate = kSeam && (want[R - 1] || rows_gate);  // R - 1: kGate on the seam
  float acc[R][VPT][N];
  zero_fill(acc);

  // The ring's tensors: h, dout, and on the seam grad_h and y (each only where the call reads it). S = 1:
  // registers hold this row and the next instead (RowRegisters).
  using Ring = RowSource<S, layernorm_config::bwd_ring_tensors(V), VPT, TPR>;
  extern __shared__ uint4 ring_words[];
  Ring ring{ring_words};
  const RowRun run = block_rows(p);
  // (b, s) of this row and of the next one to fill, advanced a row at a time (next_row, rows.cuh).
  const uint32_t seq = uint32_t(a.seq);
  RowIndex at = split_row(uint32_t(run.first), seq), ahead = at;
  auto fill = [&](int64_t row, int stage) {  // row `row` (at `ahead`) into `stage`, then ahead moves on
    if (row >= run.end) return Ring::skip();
    const uint32_t b = ahead.b, s = ahead.s;
    ahead = next_row(ahead, seq);
    if constexpr (kSeam) {
      const void* rows[4] = {at_row<T>(a.h, b, s), at_row<T>(a.grad_out, b, s), at_row_or_null<T>(a.grad_h, b, s),
                             want_dgate ? at_row<T>(a.y, b, s) : nullptr};
      ring.fill(stage, rows, nvec);
    } else {
      const void* rows[2] = {at_row<T>(a.h, b, s), at_row<T>(a.grad_out, b, s)};
      ring.fill(stage, rows, nvec);
    }
  };
#pragma unroll
  for (int k = 0; k < (S > 1 ? S - 1 : 1); ++k) fill(run.first + k, k);
  int64_t pass = 0;
  int stage = 0;
  for (int64_t row = run.first; row < run.end; ++row, ++pass, at = next_row(at, seq)) {  // uniform bounds
    if constexpr (S == 1) {
      ring.advance();      // the row loaded last pass
      fill(row + 1, 0);    // the next one's loads in flight while this one is reduced
    } else {
      fill(row + S - 1, stage == 0 ? S - 1 : stage - 1);  // the stage the last row was read from
      wait_async<S - 1>();                                 // this row's group has landed
    }
    const uint32_t b = at.b, s = at.s;
    const int cur = stage;
    stage = stage + 1 >= S ? 0 : stage + 1;
    const float mean = a.mean[row], rstd = a.rstd[row];
    const Tm* scale = has_scale ? at_row<Tm>(a.scale, b, s) : nullptr;
    // Word i's terms, from the ring (both passes read it there: nothing of the row is held in registers
    // across its reduction).
    auto terms = [&](int i, int64_t v, float (&d)[N], float (&w)[N], float (&n0)[N], float (&dn)[N],
                     float (&n_mod)[N]) {
      float h[N], bias[N], sc[N];
      unpack_word<T>(ring.word(cur, 0, i), h);
      unpack_word<T>(ring.word(cur, 1, i), d);
      load_affine<T, N>(w, AFFINE ? a.weight.ptr : nullptr, a.weight_f32, v, 1.f);
      load_affine<T, N>(bias, AFFINE && has_scale ? a.bias.ptr : nullptr, a.bias_f32, v, 0.f);
      load_or<Tm, N>(sc, has_scale, scale, v, 0.f);
#pragma unroll
      for (int j = 0; j < N; ++j)
        element_terms<T>(h[j], d[j], w[j], bias[j], sc[j], has_scale, round_mod, mean, rstd, n0[j], dn[j], n_mod[j]);
    };

    float sum_g = 0.f, sum_gn = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = threadIdx.x + int64_t(i) * TPR;
      if (v >= nvec) continue;
      float d[N], w[N], n0[N], dn[N], n_mod[N];
      terms(i, v, d, w, n0, dn, n_mod);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float g = dn[j] * w[j];
        sum_g += g;
        sum_gn += g * n0[j];
      }
      if (want[kWeight])
#pragma unroll
        for (int j = 0; j < N; ++j) acc[kWeight][i][j] += dn[j] * n0[j];
      if (want[kBias])
#pragma unroll
        for (int j = 0; j < N; ++j) acc[kBias][i][j] += dn[j];
      if constexpr (kMod) {
        if (has_scale) {
          float t[N];
#pragma unroll
          for (int j = 0; j < N; ++j) t[j] = mod_product(d[j], n_mod[j]);
          if (want[kScale])
#pragma unroll
            for (int j = 0; j < N; ++j) acc[kScale][i][j] += t[j];
          if (rows_scale) store_vec<Tm, N>(at_row<Tm>(a.grad_scale.rows, b, s) + v * N, t);
          if (want[kShift])
#pragma unroll
            for (int j = 0; j < N; ++j) acc[kShift][i][j] += d[j];
          if (rows_shift) store_vec<Tm, N>(at_row<Tm>(a.grad_shift.rows, b, s) + v * N, d);
        }
      }
    }
    const float2 sums = row_sum2<TPR>(sum_g, sum_gn, pass);
    const float mean_g = sums.x * p.inv_hidden, mean_gn = sums.y * p.inv_hidden;

    const Tm* gate = kSeam ? at_row_or_null<Tm>(a.gate, b, s) : nullptr;
    T* dx = a.grad_x.ptr != nullptr ? at_row<T>(a.grad_x, b, s) : nullptr;
    T* dy = kSeam && a.grad_y.ptr != nullptr ? at_row<T>(a.grad_y, b, s) : nullptr;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = threadIdx.x + int64_t(i) * TPR;
      if (v >= nvec) continue;
      float d[N], w[N], n0[N], dn[N], n_mod[N], dh[N];
      terms(i, v, d, w, n0, dn, n_mod);
#pragma unroll
      for (int j = 0; j < N; ++j) dh[j] = rstd * (dn[j] * w[j] - mean_g - n0[j] * mean_gn);
      if constexpr (kSeam) {
        if (a.grad_h.ptr != nullptr) {
          float t[N];
          unpack_word<T>(ring.word(cur, 2, i), t);
#pragma unroll
          for (int j = 0; j < N; ++j) dh[j] += t[j];
        }
      }
      if (dx != nullptr) store_vec<T, N>(dx + v * N, dh);
      if constexpr (kSeam) {
        if (dy != nullptr) {
          float gt[N], t[N];
          load_or<Tm, N>(gt, gate != nullptr, gate, v, 1.f);
#pragma unroll
          for (int j = 0; j < N; ++j) t[j] = dh[j] * gt[j];
          store_vec<T, N>(dy + v * N, t);
        }
        if (want_dgate) {
          float y[N], t[N];
          unpack_word<T>(ring.word(cur, 3, i), y);
#pragma unroll
          for (int j = 0; j < N; ++j) t[j] = dh[j] * y[j];
          if (want[R - 1])
#pragma unroll
            for (int j = 0; j < N; ++j) acc[R - 1][i][j] += t[j];
          if (rows_gate) store_vec<Tm, N>(at_row<Tm>(a.grad_gate.rows, b, s) + v * N, t);
        }
      }
    }
  }
  pdl_release();  // the column sums may be scheduled: they wait for these partials
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (!want[r]) continue;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = threadIdx.x + int64_t(i) * TPR;
      if (v < nvec) store_vec<float, N>(p.partials[r] + int64_t(blockIdx.x) * a.hidden + v * N, acc[r][i]);
    }
  }
}

// Plain layernorm with no affine parameters (Wan's norm1 and norm3, Flux's norms): nothing is ever summed
// over rows, so no block shares a row. Rows other than layernorm_bwd_plain_rows' widths: one warp per
// row, kBwdWarpRows rows per block: no barrier, and a lane's VPT words of h and dout are all in flight at
// once (the block kernel's one row at a time left rows of <= 3072 columns at 63-70% of copy, behind
// torch.compile's 73-92%). The sums come from the packed words and the dx pass unpacks them again, so
// registers hold 2 * VPT words. The choice depends on the op's shapes alone (no weight or bias), never on
// the grads asked for.
template <typename T, int VPT>
__global__ void __launch_bounds__(32 * layernorm_config::kBwdWarpRows) layernorm_bwd_vectorized_warp(BwdParams p) {
  pdl_wait_and_release();
  constexpr int N = 16 / sizeof(T);
  const LayerNormBwdArgs& a = p.a;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * layernorm_config::kBwdWarpRows + threadIdx.x / 32;
  if (row >= a.batch * a.seq) return;  // whole warps: no shuffle loses a lane
  const int64_t nvec = a.hidden / N;
  const uint32_t b = uint32_t(row / a.seq), s = uint32_t(row - int64_t(b) * a.seq);
  const T* hr = at_row<T>(a.h, b, s);
  const T* dr = at_row<T>(a.grad_out, b, s);
  uint4 hw[VPT], dw[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t v = lane + int64_t(i) * 32;
    if (v < nvec) {
      hw[i] = load_word(hr, v);
      dw[i] = load_word(dr, v);
    }
  }
  const float mean = a.mean[row], rstd = a.rstd[row];
  float sum_g = 0.f, sum_gn = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (lane + int64_t(i) * 32 >= nvec) continue;
    float h[N], d[N];
    unpack_word<T>(hw[i], h);
    unpack_word<T>(dw[i], d);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      sum_g += d[j];
      sum_gn += d[j] * ((h[j] - mean) * rstd);
    }
  }
  const float mean_g = group_sum<32>(sum_g) * p.inv_hidden, mean_gn = group_sum<32>(sum_gn) * p.inv_hidden;
  T* dx = at_row<T>(a.grad_x, b, s);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t v = lane + int64_t(i) * 32;
    if (v >= nvec) continue;
    float h[N], d[N], dh[N];
    unpack_word<T>(hw[i], h);
    unpack_word<T>(dw[i], d);
#pragma unroll
    for (int j = 0; j < N; ++j) dh[j] = rstd * (d[j] - mean_g - (h[j] - mean) * rstd * mean_gn);
    store_vec<T, N>(dx + v * N, dh);
  }
}

// Plain layernorm with no affine parameters, one 16-byte word per thread (TPR = the row's words), ROWS rows
// per block: h and dout held in registers across the row's two sums (layernorm_config::bwd_plain_threads),
// at a full SM of threads: the bound holds it to 32 registers, no spill (unbounded: 37-39, 48 warps an SM).
template <typename T, int TPR, int ROWS>
__global__ void __launch_bounds__(TPR * ROWS, 2048 / (TPR * ROWS)) layernorm_bwd_plain_rows(BwdParams p) {
  pdl_wait_and_release();
  constexpr int N = 16 / sizeof(T);
  const LayerNormBwdArgs& a = p.a;
  const int t = threadIdx.x % TPR;
  const int64_t row = int64_t(blockIdx.x) * ROWS + threadIdx.x / TPR;
  const bool live = row < a.batch * a.seq;  // a dead row's threads still take the barrier
  const RowIndex at = split_row(uint32_t(live ? row : 0), uint32_t(a.seq));
  float h[N], d[N], mean = 0.f, rstd = 0.f;
  {
    uint4 hw = make_uint4(0, 0, 0, 0), dw = hw;
    if (live) {
      hw = load_word(at_row<T>(a.h, at.b, at.s), t);
      dw = load_word(at_row<T>(a.grad_out, at.b, at.s), t);
      mean = a.mean[row];
      rstd = a.rstd[row];
    }
    unpack_word<T>(hw, h);
    unpack_word<T>(dw, d);
  }
  float sum_g = 0.f, sum_gn = 0.f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    h[j] = (h[j] - mean) * rstd;  // n0
    sum_g += d[j];
    sum_gn += d[j] * h[j];
  }
  const float2 sums = row_sum2<TPR, ROWS>(sum_g, sum_gn, 0);
  if (!live) return;
  const float mean_g = sums.x * p.inv_hidden, mean_gn = sums.y * p.inv_hidden;
  float dh[N];
#pragma unroll
  for (int j = 0; j < N; ++j) dh[j] = rstd * (d[j] - mean_g - h[j] * mean_gn);
  store_vec<T, N>(at_row<T>(a.grad_x, at.b, at.s) + int64_t(t) * N, dh);
}

// One 16-byte word per thread (TPR = the row's words), the block's run of rows one at a time, as the ring
// kernel's split (the same partials, sums per thread in row order: the same bits), but each row's h and dout in
// registers, the next row's loaded before this one's sums, and the row's multiplier m held: plain layernorm's
// weight (with a weight or a bias: layernorm_config::bwd_affine_threads), or adaln_layernorm's (1 + scale)',
// reloaded when the batch changes (no weight or bias, layernorm_config::bwd_adaln_threads). The reduced sums
// (weight and bias, or scale and shift) compile away for x's grad alone (REDUCE false). ROUND: round_mod.
template <typename T, typename Tm, Variant V, int TPR, bool REDUCE, bool ROUND>
__global__ void __launch_bounds__(TPR) layernorm_bwd_words(BwdParams p) {
  static_assert(V != Variant::kGatedResidualLayerNorm, "the seam takes the ring");
  constexpr bool kMod = V == Variant::kAdalnLayerNorm;
  constexpr Role kByN = kMod ? kScale : kWeight, kByOne = kMod ? kShift : kBias;  // sums of dout * n, of dout
  pdl_wait();
  constexpr int N = 16 / sizeof(T);
  const LayerNormBwdArgs& a = p.a;
  const int t = threadIdx.x;
  const RowRun run = block_rows(p);
  const uint32_t seq = uint32_t(a.seq);
  const bool want_n = REDUCE && p.partials[kByN] != nullptr, want_one = REDUCE && p.partials[kByOne] != nullptr;
  float m[N], acc_n[N], acc_one[N];
  if constexpr (!kMod) load_affine<T, N>(m, a.weight.ptr, a.weight_f32, t, 1.f);
  zero_fill(acc_n);
  zero_fill(acc_one);
  RowIndex at = split_row(uint32_t(run.first), seq);
  uint32_t held_b = ~0u;  // adaln: the batch whose (1 + scale)' m holds
  uint4 hw = make_uint4(0, 0, 0, 0), dw = hw;
  if (run.first < run.end) {
    hw = load_word(at_row<T>(a.h, at.b, at.s), t);
    dw = load_word(at_row<T>(a.grad_out, at.b, at.s), t);
  }
  int64_t pass = 0;
  for (int64_t row = run.first; row < run.end; ++row, ++pass) {  // uniform bounds
    const RowIndex next = next_row(at, seq);
    uint4 hn = hw, dn = dw;
    if (row + 1 < run.end) {
      hn = load_word(at_row<T>(a.h, next.b, next.s), t);
      dn = load_word(at_row<T>(a.grad_out, next.b, next.s), t);
    }
    if constexpr (kMod) {
      if (at.b != held_b) {
        held_b = at.b;
        float sc[N];
        load_or<Tm, N>(sc, true, at_row<Tm>(a.scale, at.b, at.s), t, 0.f);
#pragma unroll
        for (int j = 0; j < N; ++j) m[j] = mod_multiplier<T>(sc[j], ROUND);
      }
    }
    // The upstream grad times m: element_terms' dn (adaln), dout * w (layernorm).
    auto scaled = [&](float d, float mj) { return kMod ? mod_product(d, mj) : d * mj; };
    const float mean = a.mean[row], rstd = a.rstd[row];
    float n0[N], d[N];
    unpack_word<T>(hw, n0);
    unpack_word<T>(dw, d);
    float sum_g = 0.f, sum_gn = 0.f;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      n0[j] = (n0[j] - mean) * rstd;
      const float g = scaled(d[j], m[j]);
      sum_g += g;
      sum_gn += g * n0[j];
      if (want_n) acc_n[j] += kMod ? mod_product(d[j], modulated_n<T>(n0[j], 1.f, 0.f, ROUND)) : d[j] * n0[j];
      if (want_one) acc_one[j] += d[j];
    }
    const float2 sums = row_sum2<TPR>(sum_g, sum_gn, pass);
    const float mean_g = sums.x * p.inv_hidden, mean_gn = sums.y * p.inv_hidden;
    if (a.grad_x.ptr != nullptr) {
      float dh[N];
#pragma unroll
      for (int j = 0; j < N; ++j) dh[j] = rstd * (scaled(d[j], m[j]) - mean_g - n0[j] * mean_gn);
      store_vec<T, N>(at_row<T>(a.grad_x, at.b, at.s) + int64_t(t) * N, dh);
    }
    hw = hn;
    dw = dn;
    at = next;
  }
  pdl_release();  // the column sums may be scheduled: they wait for these partials
  if (want_n) store_vec<float, N>(p.partials[kByN] + int64_t(blockIdx.x) * a.hidden + int64_t(t) * N, acc_n);
  if (want_one) store_vec<float, N>(p.partials[kByOne] + int64_t(blockIdx.x) * a.hidden + int64_t(t) * N, acc_one);
}

// Any hidden size and alignment: scalar accesses, two reads of each row (the
// second from L1/L2). The sums live in the block's own workspace rows, each
// column always touched by the same thread, in row order.
template <typename T, typename Tm, Variant V>
__global__ void __launch_bounds__(kThreads) layernorm_bwd_scalar(BwdParams p) {
  pdl_wait();
  constexpr bool kSeam = V == Variant::kGatedResidualLayerNorm;
  constexpr bool kMod = V != Variant::kLayerNorm;
  const LayerNormBwdArgs& a = p.a;
  const bool has_scale = kMod && a.scale.ptr != nullptr;
  const bool round_mod = kMod && p.round_mod;
  auto sum_row = [&](int r) { return p.partials[r] ? p.partials[r] + int64_t(blockIdx.x) * a.hidden : nullptr; };
  float* const s_weight = sum_row(kWeight);
  float* const s_bias = sum_row(kBias);
  float* const s_scale = kMod ? sum_row(kScale) : nullptr;
  float* const s_shift = kMod ? sum_row(kShift) : nullptr;
  float* const s_gate = kSeam ? sum_row(kGate) : nullptr;
  const bool rows_scale = kMod && a.grad_scale.kind == ModGradKind::kPerRow;
  const bool rows_shift = kMod && a.grad_shift.kind == ModGradKind::kPerRow;
  const bool rows_gate = kSeam && a.grad_gate.kind == ModGradKind::kPerRow;
  for (int r = 0; r < kRoles; ++r)
    if (float* sums = sum_row(r))
      for (int64_t c = threadIdx.x; c < a.hidden; c += kThreads) sums[c] = 0.f;

  const RowRun run = block_rows(p);
  int64_t pass = 0;
  for (int64_t row = run.first; row < run.end; ++row, ++pass) {
    const uint32_t b = uint32_t(row / a.seq), s = uint32_t(row - int64_t(b) * a.seq);
    const float mean = a.mean[row], rstd = a.rstd[row];
    const T* hr = at_row<T>(a.h, b, s);
    const T* dr = at_row<T>(a.grad_out, b, s);
    const Tm* scale = has_scale ? at_row<Tm>(a.scale, b, s) : nullptr;
    auto terms = [&](int64_t c, float& d, float& w, float& n0, float& dn, float& n_mod) {
      d = to_float(dr[c]);
      w = affine_at<T>(a.weight.ptr, a.weight_f32, c, 1.f);
      const float bias = has_scale ? affine_at<T>(a.bias.ptr, a.bias_f32, c, 0.f) : 0.f;
      const float sc = has_scale ? to_float(scale[c]) : 0.f;
      element_terms<T>(to_float(hr[c]), d, w, bias, sc, has_scale, round_mod, mean, rstd, n0, dn, n_mod);
    };
    float sum_g = 0.f, sum_gn = 0.f;
    for (int64_t c = threadIdx.x; c < a.hidden; c += kThreads) {
      float d, w, n0, dn, n_mod;
      terms(c, d, w, n0, dn, n_mod);
      sum_g += dn * w;
      sum_gn += dn * w * n0;
      const float t = mod_product(d, n_mod);
      if (s_scale != nullptr) s_scale[c] += t;
      if (rows_scale) at_row<Tm>(a.grad_scale.rows, b, s)[c] = from_float<Tm>(t);
      if (s_shift != nullptr) s_shift[c] += d;
      if (rows_shift) at_row<Tm>(a.grad_shift.rows, b, s)[c] = from_float<Tm>(d);
      if (s_bias != nullptr) s_bias[c] += dn;
      if (s_weight != nullptr) s_weight[c] += dn * n0;
    }
    const float2 sums = row_sum2<kThreads>(sum_g, sum_gn, pass);
    const float mean_g = sums.x * p.inv_hidden, mean_gn = sums.y * p.inv_hidden;
    const Tm* gate = kSeam ? at_row_or_null<Tm>(a.gate, b, s) : nullptr;
    const T* gh = kSeam ? at_row_or_null<T>(a.grad_h, b, s) : nullptr;
    const T* yr = kSeam && (s_gate != nullptr || rows_gate) ? at_row<T>(a.y, b, s) : nullptr;
    T* dx = a.grad_x.ptr != nullptr ? at_row<T>(a.grad_x, b, s) : nullptr;
    T* dy = kSeam && a.grad_y.ptr != nullptr ? at_row<T>(a.grad_y, b, s) : nullptr;
    for (int64_t c = threadIdx.x; c < a.hidden; c += kThreads) {
      float d, w, n0, dn, n_mod;
      terms(c, d, w, n0, dn, n_mod);
      float dh = rstd * (dn * w - mean_g - n0 * mean_gn);
      if (gh != nullptr) dh += to_float(gh[c]);
      if (dx != nullptr) dx[c] = from_float<T>(dh);
      if (dy != nullptr) dy[c] = from_float<T>(dh * (gate != nullptr ? to_float(gate[c]) : 1.f));
      if (yr != nullptr) {
        const float t = dh * to_float(yr[c]);
        if (s_gate != nullptr) s_gate[c] += t;
        if (rows_gate) at_row<Tm>(a.grad_gate.rows, b, s)[c] = from_float<Tm>(t);
      }
    }
  }
}

// The call's layernorm_config::bwd_large_blocks: its op as layernorm_bwd dispatches it (the seam's
// calls are those with y), and its row's 16-byte words.
inline int64_t large_blocks(const LayerNormBwdArgs& a) {
  const Variant v = a.seam ? Variant::kGatedResidualLayerNorm
                    : a.scale.ptr != nullptr ? Variant::kAdalnLayerNorm : Variant::kLayerNorm;
  return layernorm_config::bwd_large_blocks(v, a.hidden * dtype_size(a.dtype) / 16);
}

// The call's row split: groups of rows (each batch's rows where a grad is summed per batch), runs of rows a
// block, blocks a group. `reduces`: some grad is summed over rows (else the split is free: one group, no cap
// on the blocks). The launch and layernorm_bwd_blocks (the workspaces' rows) both take it from here.
struct RowSplit {
  int64_t groups, group_rows, rows_per_block, blocks_per_group;
};
inline RowSplit row_split(const LayerNormBwdArgs& a, bool reduces) {
  RowSplit sp{reduces && a.per_batch_split ? a.batch : 1, 0, 0, 0};
  if (sp.groups == 0) return sp;  // a batch of 0: no rows, no blocks
  sp.group_rows = a.batch * a.seq / sp.groups;
  sp.rows_per_block = reduces ? layernorm_config::bwd_rows_per_block(sp.group_rows, sp.groups, a.seam, large_blocks(a))
                              : layernorm_config::bwd_unreduced_rows();
  sp.blocks_per_group = ceil_div(sp.group_rows, sp.rows_per_block);
  return sp;
}

// A vectorized row kernel's launch: dependent launch where the op's config allows it (not the seam).
template <Variant V, typename Kernel>
cudaError_t launch_row_kernel(Kernel kernel, int64_t blocks, int tpr, size_t smem, const BwdParams& p,
                              cudaStream_t stream) {
  const bool pdl = dependent_launch_enabled() && layernorm_config::bwd_dependent_launch(V);
  return launch_kernel(kernel, dim3(unsigned(blocks)), dim3(tpr), smem, stream, pdl, p);
}

template <typename T, typename Tm, Variant V, int TPR, int VPT, int S>
cudaError_t launch_vectorized(const BwdParams& p, int64_t blocks, bool reduces, cudaStream_t stream) {
  auto pick_reduce = [reduces](auto affine, auto round) {
    constexpr bool kAffine = decltype(affine)::value, kRound = decltype(round)::value;
    return reduces ? layernorm_bwd_vectorized<T, Tm, V, TPR, VPT, S, true, kAffine, kRound>
                   : layernorm_bwd_vectorized<T, Tm, V, TPR, VPT, S, false, kAffine, kRound>;
  };
  // round_mod is only ever set for the modulated ops with half-precision rows and modulation of their
  // dtype (launch); everything else takes the kernel without rounding.
  constexpr bool kRoundable = V != Variant::kLayerNorm && std::is_same_v<T, Tm> && !std::is_same_v<T, float>;
  auto pick = [&](auto affine) {
    if constexpr (kRoundable)
      if (p.round_mod) return pick_reduce(affine, std::true_type{});
    return pick_reduce(affine, std::false_type{});
  };
  // The affine-free kernels for the modulated ops only (plain layernorm without weight or bias takes the
  // one-word or warp kernel where its row fits one).
  auto kernel = pick(std::true_type{});
  if constexpr (V != Variant::kLayerNorm)
    if (p.a.weight.ptr == nullptr && p.a.bias.ptr == nullptr) kernel = pick(std::false_type{});
  constexpr size_t kSmem = RowSource<S, layernorm_config::bwd_ring_tensors(V), VPT, TPR>::kBytes;
  if (const cudaError_t err = allow_ring_bytes(kernel, kSmem); err != cudaSuccess) return err;
  return launch_row_kernel<V>(kernel, blocks, TPR, kSmem, p, stream);
}

// The ring's stages: layernorm_config::kBwdStages, registers (S = 1) where bwd_rows_in_registers picks them
// (only that kernel is compiled for it), or (development builds, bf16 rows of 192 or 256 threads) the
// layernorm.bwd_stages knob's 2, 3 or 4, or 1 for every kernel at one word a thread, for sweeps.
template <typename T, typename Tm, Variant V, int TPR, int VPT>
cudaError_t launch_staged(const BwdParams& p, int64_t blocks, bool reduces, cudaStream_t stream) {
  const int forced = tuning::override_of(tuning::Knob::kLayerNormBwdStages);
  if constexpr (tuning::kDevBuild && std::is_same_v<T, __nv_bfloat16> && (TPR == 192 || TPR == 256)) {
    if constexpr (VPT == 1)
      if (forced == 1) return launch_vectorized<T, Tm, V, TPR, VPT, 1>(p, blocks, reduces, stream);
    if (forced == 2) return launch_vectorized<T, Tm, V, TPR, VPT, 2>(p, blocks, reduces, stream);
    if (forced == 3) return launch_vectorized<T, Tm, V, TPR, VPT, 3>(p, blocks, reduces, stream);
    if (forced == 4) return launch_vectorized<T, Tm, V, TPR, VPT, 4>(p, blocks, reduces, stream);
  }
  if constexpr (V == Variant::kAdalnLayerNorm && VPT == 1) {
    const bool affine = p.a.weight.ptr != nullptr || p.a.bias.ptr != nullptr;
    if (forced <= 0 && layernorm_config::bwd_rows_in_registers(V, VPT, reduces, affine, p.round_mod))
      return launch_row_kernel<V>(layernorm_bwd_vectorized<T, Tm, V, TPR, VPT, 1, true, false, false>, blocks, TPR, 0,
                                  p, stream);
  }
  return launch_vectorized<T, Tm, V, TPR, VPT, layernorm_config::kBwdStages>(p, blocks, reduces, stream);
}

// The vectorized kernel at TPR threads, the fewest words per thread (1, 2 or 4) that cover `nvec`.
template <typename T, typename Tm, Variant V, int TPR>
cudaError_t launch_width(const BwdParams& p, int64_t nvec, int64_t blocks, bool reduces, cudaStream_t stream) {
  static_assert(layernorm_config::kBwdMaxWordsPerThread == 4, "one case per words-per-thread below");
  if (nvec <= TPR) return launch_staged<T, Tm, V, TPR, 1>(p, blocks, reduces, stream);
  if (nvec <= 2 * TPR) return launch_staged<T, Tm, V, TPR, 2>(p, blocks, reduces, stream);
  return launch_staged<T, Tm, V, TPR, 4>(p, blocks, reduces, stream);
}

// The block width layernorm_config::bwd_threads picks. Release builds compile the widths it can pick
// there (192 x 1/2/4, 320 x 2, 256 x 1/2/4); development builds also 96 and 128 at 1-4 words
// for bf16 rows (layernorm.bwd_threads sweeps), the release ones for the other dtypes.
template <typename T, typename Tm, Variant V>
cudaError_t launch_rows(const BwdParams& p, int64_t nvec, int64_t blocks, bool reduces, cudaStream_t stream) {
  constexpr bool kAllWidths = tuning::kDevBuild && std::is_same_v<T, __nv_bfloat16>;
  const int tpr = layernorm_config::bwd_threads(nvec, kAllWidths);
  if (tpr == 320) return launch_staged<T, Tm, V, 320, 2>(p, blocks, reduces, stream);
  if constexpr (kAllWidths) {
    if (tpr == 96) return launch_width<T, Tm, V, 96>(p, nvec, blocks, reduces, stream);
    if (tpr == 128) return launch_width<T, Tm, V, 128>(p, nvec, blocks, reduces, stream);
    if (tpr == 192) return launch_width<T, Tm, V, 192>(p, nvec, blocks, reduces, stream);
    return launch_width<T, Tm, V, 256>(p, nvec, blocks, reduces, stream);
  } else {
    if (tpr == 192) return launch_width<T, Tm, V, 192>(p, nvec, blocks, reduces, stream);
    return launch_width<T, Tm, V, 256>(p, nvec, blocks, reduces, stream);
  }
}

// The warp-row kernel at `words` (layernorm_config::bwd_warp_words) words per lane.
template <typename T> cudaError_t launch_warp_rows(const BwdParams& p, int words, int64_t rows, cudaStream_t stream) {
  constexpr int kRows = layernorm_config::kBwdWarpRows;
  const dim3 grid(unsigned(ceil_div(rows, kRows))), block(32 * kRows);
  static_assert(layernorm_config::kBwdWarpMaxWords == 12, "one case per words-per-lane below");
  const auto kernel = words == 4   ? layernorm_bwd_vectorized_warp<T, 4>
                      : words == 6 ? layernorm_bwd_vectorized_warp<T, 6>
                      : words == 8 ? layernorm_bwd_vectorized_warp<T, 8>
                                   : layernorm_bwd_vectorized_warp<T, 12>;
  return launch_kernel(kernel, grid, block, 0, stream, dependent_launch_enabled(), p);
}

// The one-word plain kernel at `tpr` (layernorm_config::bwd_plain_threads) threads per row.
template <typename T> cudaError_t launch_plain_rows(const BwdParams& p, int tpr, int64_t rows, cudaStream_t stream) {
  auto go = [&](auto tag) {
    constexpr int kTpr = decltype(tag)::value, kRows = layernorm_config::bwd_plain_rows(kTpr);
    return launch_kernel(layernorm_bwd_plain_rows<T, kTpr, kRows>, dim3(unsigned(ceil_div(rows, kRows))),
                         dim3(kTpr * kRows), 0, stream, dependent_launch_enabled(), p);
  };
  if (tpr == 192) return go(std::integral_constant<int, 192>{});
  if (tpr == 256) return go(std::integral_constant<int, 256>{});
  return go(std::integral_constant<int, 384>{});
}

// The one-word kernel of op V at `tpr` threads per row (layernorm_config::bwd_affine_threads /
// bwd_adaln_threads).
template <typename T, typename Tm, Variant V>
cudaError_t launch_words(const BwdParams& p, int tpr, int64_t blocks, bool reduces, cudaStream_t stream) {
  constexpr bool kRoundable = V != Variant::kLayerNorm && std::is_same_v<T, Tm> && !std::is_same_v<T, float>;
  auto go = [&](auto tag) {
    constexpr int kTpr = decltype(tag)::value;
    auto pick = [&](auto round) {
      constexpr bool kRound = decltype(round)::value;
      // adaln_layernorm takes this kernel only with its grads summed (bwd_adaln_threads)
      if constexpr (V == Variant::kAdalnLayerNorm) return layernorm_bwd_words<T, Tm, V, kTpr, true, kRound>;
      else return reduces ? layernorm_bwd_words<T, Tm, V, kTpr, true, kRound> : layernorm_bwd_words<T, Tm, V, kTpr, false, kRound>;
    };
    auto kernel = pick(std::false_type{});
    if constexpr (kRoundable)
      if (p.round_mod) kernel = pick(std::true_type{});
    return launch_kernel(kernel, dim3(unsigned(blocks)), dim3(kTpr), 0, stream, dependent_launch_enabled(), p);
  };
  if (tpr == 192) return go(std::integral_constant<int, 192>{});
  if (tpr == 256) return go(std::integral_constant<int, 256>{});
  return go(std::integral_constant<int, 384>{});
}

// The column sum of reduced grad `g` (none for kNone / kPerRow).
inline void add_mod_grad(ColumnSumJobs& jobs, const ModGrad& g, DType dtype, int64_t groups, int64_t blocks) {
  if (g.kind == ModGradKind::kAllRows) jobs.add({g.partials, g.out, dtype, 1, blocks});
  if (g.kind == ModGradKind::kPerBatch) jobs.add({g.partials, g.out, dtype, groups, blocks / groups});
}

template <typename T, typename Tm, Variant V> cudaError_t launch(const LayerNormBwdArgs& a, cudaStream_t stream) {
  BwdParams p{};
  p.a = a;
  p.inv_hidden = 1.f / float(a.hidden);
  p.round_mod = a.exact && a.mod_dtype == a.dtype && a.dtype != DType::kFloat32;
  auto summed = [](const ModGrad& g) {
    return g.kind == ModGradKind::kAllRows || g.kind == ModGradKind::kPerBatch ? g.partials : nullptr;
  };
  p.partials[kWeight] = a.weight_partials;
  p.partials[kBias] = a.bias_partials;
  p.partials[kScale] = summed(a.grad_scale);
  p.partials[kShift] = summed(a.grad_shift);
  p.partials[kGate] = summed(a.grad_gate);
  bool reduces = false;
  for (float* part : p.partials) reduces = reduces || part != nullptr;
  const RowSplit sp = row_split(a, reduces);
  p.group_rows = sp.group_rows;
  p.rows_per_block = sp.rows_per_block;
  p.blocks_per_group = sp.blocks_per_group;
  const int64_t blocks = sp.groups * sp.blocks_per_group;

  const int64_t nvec = a.hidden / (16 / int64_t(sizeof(T)));
  const bool vectorized = layernorm_bwd_path(a) == LayerNormPath::kVectorized;
  // Plain layernorm's own kernels are instantiated in its translation unit only (one copy in the library).
  if constexpr (V == Variant::kLayerNorm) {
    const int warp_words =
        vectorized && a.weight.ptr == nullptr && a.bias.ptr == nullptr ? layernorm_config::bwd_warp_words(nvec) : 0;
    if (warp_words > 0) {
      if (a.grad_x.ptr == nullptr) return cudaSuccess;  // no grad asked for
      if (const int tpr = layernorm_config::bwd_plain_threads(nvec); tpr > 0)
        return launch_plain_rows<T>(p, tpr, a.batch * a.seq, stream);
      return launch_warp_rows<T>(p, warp_words, a.batch * a.seq, stream);
    }
  }
  auto row_kernel = [&]() -> cudaError_t {
    if constexpr (V == Variant::kLayerNorm)
      if (const int tpr = vectorized ? layernorm_config::bwd_affine_threads(nvec) : 0; tpr > 0)
        return launch_words<T, T, V>(p, tpr, blocks, reduces, stream);
    if constexpr (V == Variant::kAdalnLayerNorm) {
      const bool affine = a.weight.ptr != nullptr || a.bias.ptr != nullptr;
      const bool per_row = a.grad_scale.kind == ModGradKind::kPerRow || a.grad_shift.kind == ModGradKind::kPerRow;
      const bool broadcast = a.scale.seq_stride == 0;  // [B, D], [B, 1, D] or [D]: held per batch
      if (const int tpr = vectorized ? layernorm_config::bwd_adaln_threads(nvec, reduces, affine, broadcast, per_row) : 0;
          tpr > 0)
        return launch_words<T, Tm, V>(p, tpr, blocks, reduces, stream);
    }
    if (vectorized) return launch_rows<T, Tm, V>(p, nvec, blocks, reduces, stream);
    return launch_kernel(layernorm_bwd_scalar<T, Tm, V>, dim3(unsigned(blocks)), dim3(kThreads), 0, stream,
                         dependent_launch_enabled(), p);
  };
  const cudaError_t err = row_kernel();
  if (err != cudaSuccess) return err;
  ColumnSumJobs jobs;  // at most five: weight, bias, scale, shift, gate
  if (a.weight_partials != nullptr)
    jobs.add({a.weight_partials, a.grad_weight, a.weight_f32 ? DType::kFloat32 : a.dtype, 1, blocks});
  if (a.bias_partials != nullptr)
    jobs.add({a.bias_partials, a.grad_bias, a.bias_f32 ? DType::kFloat32 : a.dtype, 1, blocks});
  for (const ModGrad* g : {&a.grad_scale, &a.grad_shift, &a.grad_gate})
    add_mod_grad(jobs, *g, dtype_of<Tm>(), sp.groups, blocks);
  return column_sums(jobs, a.hidden, stream);
}

template <Variant V> cudaError_t launch_bwd_variant(const LayerNormBwdArgs& a, cudaStream_t stream) {
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    if (V == Variant::kLayerNorm || a.mod_dtype == a.dtype) return launch<T, T, V>(a, stream);
    if constexpr (V != Variant::kLayerNorm && !std::is_same_v<T, float>) return launch<T, float, V>(a, stream);
    return cudaErrorInvalidValue;
  });
}

// Each op's launcher is instantiated in exactly one .cu of this family.
#define LTX_LAYERNORM_BWD_INSTANTIATE(V) \
  template cudaError_t launch_bwd_variant<V>(const LayerNormBwdArgs&, cudaStream_t);

extern template cudaError_t launch_bwd_variant<Variant::kLayerNorm>(const LayerNormBwdArgs&, cudaStream_t);
extern template cudaError_t launch_bwd_variant<Variant::kAdalnLayerNorm>(const LayerNormBwdArgs&, cudaStream_t);
extern template cudaError_t launch_bwd_variant<Variant::kGatedResidualLayerNorm>(const LayerNormBwdArgs&,
                                                                                 cudaStream_t);

}  // namespace ln
}  // namespace ltx
