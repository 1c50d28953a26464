// fused_norm's launch choices: the one place they are made, per GPU class.
// Each rung says why, with the same-run figure that chose it (µs, measured on
// one H100 and one H200; docs/performance.md#fused_norm). Also here: what the
// choices are keyed on, the ops (Variant) and the operand sets the row kernels
// are compiled for (Operands).
#pragma once

#include <cstdint>
#include <type_traits>

#include "../common/column_sum.cuh"
#include "../common/launch.cuh"
#include "fused_norm.h"

namespace ltx {
namespace fused {

// One kernel structure per op (formulas in fused_norm.h; the enum lives there, the backward names it too).
using Variant = FusedNormOp;

__host__ __device__ constexpr bool reads_y(Variant v) { return v != Variant::kAdalnRmsnorm && v != Variant::kModulatedRmsnorm; }
__host__ __device__ constexpr bool sums(Variant v) {
  return v == Variant::kRmsnormResidual || v == Variant::kGatedResidualRmsnorm || v == Variant::kGatedResidual;
}
__host__ __device__ constexpr bool normalises(Variant v) { return v != Variant::kGatedResidual; }
__host__ __device__ constexpr bool scale_shift(Variant v) { return v == Variant::kAdalnRmsnorm || v == Variant::kGatedResidualRmsnorm; }

// The optional operands a row kernel is compiled for. kAsGiven: each is
// checked at run time (a select per word). kLtx: LTX-Video's blocks, gate (in
// gated_residual_rmsnorm), scale and shift present and no weight (its norms
// have elementwise_affine=False), in the activations' dtype: the checks and
// the ones and zeros they select compile away (a standalone
// gated_residual_rmsnorm with fixed operands ran at 32 registers against the
// library's 56).
enum class Operands : int { kAsGiven, kLtx };

// Threads per row: powers of two kMinTpr..kMaxTpr (up to kMaxVpt words per
// thread) and the exact widths 192, 384 (up to 2).
constexpr int kMinTpr = 32, kMaxTpr = 512, kMaxVpt = 4;

}  // namespace fused

namespace fused_norm_config {

using fused::Operands;
using fused::Variant;

constexpr bool pow2(int n) { return (n & (n - 1)) == 0; }

// --- Threads per row ------------------------------------------------------------

// Row widths (16-byte words) between powers of two that get an exact number of
// words per thread: rows of 384 words (hidden 3072 in bf16/fp16) take 384 or
// 192 threads, so that every thread holds the same number of words.
inline int exact_width(int64_t n) { return matching_width<192, 384>(n); }

// Words of a row per thread that the row width aims at.
inline int64_t words_per_thread(int64_t nvec, Variant v, bool exact, GpuClass gpu) {
  // H100, rows of >= 512 words (hidden 4096 in bf16): two for rmsnorm_residual and the fast
  // gated_residual_rmsnorm, 6-8% faster ([2,2688,4096] 64.95 -> 60.91; fast gated_residual_rmsnorm
  // 69.49 -> 64.12; the exact one 62.98 at two against 63.84, so it keeps one).
  if (gpu == GpuClass::kH100 && nvec >= 512 &&
      (v == Variant::kRmsnormResidual || (v == Variant::kGatedResidualRmsnorm && !exact)))
    return 2;
  // The variants that read two rows and normalise: one word of each stream, like rmsnorm (at two they
  // need 80-125 registers, 1-3 blocks per SM, and the two-output ones were 7-10% slower at [2,8160,2048]
  // on the H200).
  if (fused::reads_y(v) && fused::normalises(v)) return 1;
  // The others: two (issue-bound; a row costs ~190 instructions per thread besides the per-element
  // work: reduction, addressing).
  return 2;
}

// Threads that share a row of `nvec` 16-byte words for variant `v`.
inline int threads_per_row(int64_t nvec, Variant v, bool exact, GpuClass gpu) {
  // Development builds: a forced width (fused_norm.threads_per_row: a power of two kMinTpr..kMaxTpr
  // leaving <= kMaxVpt words per thread, or 192 / 384 leaving <= 2), for sweeps.
  const int forced = tuning::override_of(tuning::Knob::kFusedNormThreadsPerRow);
  if (forced >= fused::kMinTpr && forced <= fused::kMaxTpr && pow2(forced) &&
      nvec <= int64_t(forced) * fused::kMaxVpt)
    return forced;
  if (forced > 0 && exact_width(forced) == forced && nvec <= int64_t(forced) * 2) return forced;
  // An exact width where the words per thread divide the row, else the largest power of two <= the
  // words at that many per thread (kMinTpr..kMaxTpr).
  const int64_t wpt = words_per_thread(nvec, v, exact, gpu);
  if (nvec % wpt == 0)
    if (const int tpr = exact_width(nvec / wpt)) return tpr;
  return pow2_threads_per_row(nvec / wpt, fused::kMinTpr, fused::kMaxTpr);
}

// --- gated_residual over contiguous rows ----------------------------------------

// Words per thread of the flat kernel (rows as one stream of words; no reduction, so no row
// structure); 0: the row kernel. Rows that do not follow each other in memory take the row kernel.
inline int flat_words(bool contiguous_rows) {
  // Development builds: fused_norm.flat_words (1, 2 or 4; 0 or another value: the row kernel).
  const int forced = tuning::override_of(tuning::Knob::kFusedNormFlatWords);
  // One word per thread: faster than the row kernel at every measured shape on both GPUs (H200
  // [2,8160,2048] 49.74 -> 47.64, H100 70.47 -> 67.48), and the best of 1 / 2 / 4 on both.
  const int u = forced == tuning::kUnset ? 1 : forced;
  return contiguous_rows && (u == 1 || u == 2 || u == 4) ? u : 0;
}

// --- The row kernels: with or without next-row loads, and their grids --------------

// The kernel without next-row loads (one block per row group, no registers held for a next row),
// where the table picks it; elsewhere the kernel that loads the next row's words before it reduces
// the current one, on a grid of prefetch_grid. Fixed per compiled kernel: a release build compiles
// only the one picked here.
template <Variant V, Operands O, int TPR> constexpr bool rows_once() {
  // rmsnorm_residual: 32 registers, full occupancy (H200 [2,8160,2048] 68.9 -> 65.0, ahead of Liger's
  // 65.6).
  if (V == Variant::kRmsnormResidual) return true;
  // gated_residual_rmsnorm with LTX's operands: the same, 32 registers once they are compiled in
  // (H200 [2,8160,2048] exact 70.9 -> 65.5, [2,2688,4096] 46.4 -> 45.1), except on rows of 192 or 384
  // threads (hidden 3072: 27.9 -> 28.8, fast 31.4).
  if (V == Variant::kGatedResidualRmsnorm && O == Operands::kLtx) return pow2(TPR);
  // The others keep their next-row loads (one block per row group: Mochi's gated norm and
  // modulated_rmsnorm slower everywhere, H100 gated [2,8160,2048] 69.1 -> 72.3; gated_residual_rmsnorm
  // with its operands checked at run time keeps 56 registers and was 3-16% slower on the H200).
  return false;
}

// The grid of the kernel with next-row loads.
constexpr GridPlan prefetch_grid(Variant v, GpuClass gpu, bool exact) {
  if (gpu == GpuClass::kH200) {
    // gated_residual_rmsnorm exact at twice the resident blocks once a block would take > 12 row groups
    // ([2,2688,4096] 53.2 -> 48.1).
    if (v == Variant::kGatedResidualRmsnorm && exact) return GridPlan::kLargeTwiceResident;
    // The rest persistent: the H200 needs the next row's bytes in flight (as rmsnorm, where one block
    // per row group was 15-25% slower there).
    return GridPlan::kPersistent;
  }
  switch (v) {
    // H100: gated_residual_rmsnorm one block per row group (exact [2,8160,2048] 100.0 -> 93.1).
    case Variant::kGatedResidualRmsnorm: return GridPlan::kOnePerBlock;
    // modulated_rmsnorm one per block once a persistent block would take > 8 ([2,8160,2048] 50.5 -> 47.2).
    case Variant::kModulatedRmsnorm: return GridPlan::kLargeOnePerBlock;
    // adaln_rmsnorm twice the resident blocks once one would take > 12 ([2,8160,2048] 53.35 -> 48.91; at
    // the smaller shapes persistent is 2-10% faster).
    case Variant::kAdalnRmsnorm: return GridPlan::kLargeTwiceResident;
    // residual_tanh_gated_rmsnorm persistent with every block taking the same number of rows
    // ([2,2688,4096] 46.06 -> 45.73, [1,1024,3072] 8.30 -> 8.22; the same plan cost adaln_rmsnorm and
    // modulated_rmsnorm up to 3%).
    case Variant::kResidualTanhGatedRmsnorm: return GridPlan::kBalancedPersistent;
    // The others (gated_residual's row kernel) persistent.
    default: return GridPlan::kPersistent;
  }
}

// The variants and operand sets with a kernel without next-row loads (those rows_once picks it for,
// and LTX's adaln_rmsnorm and gated_residual_rmsnorm at every width): in development builds the
// fused_norm.prefetch knob picks between the two.
template <Variant V, Operands O> constexpr bool kHasRowsOnce = V == Variant::kRmsnormResidual || O == Operands::kLtx;

// Which row kernels a build compiles for V, O and TPR: a release build the one the table picks,
// a development build the alternative too (where kHasRowsOnce).
template <Variant V, Operands O, int TPR>
constexpr bool kCompilesPrefetch = tuning::kDevBuild || !rows_once<V, O, TPR>();
template <Variant V, Operands O, int TPR>
constexpr bool kCompilesRowsOnce = kHasRowsOnce<V, O> && (tuning::kDevBuild || rows_once<V, O, TPR>());

struct RowLaunch {
  GridPlan plan;
  bool prefetch;  // false: the kernel without next-row loads
};

// How the row kernel of V for O at TPR threads per row is launched.
template <Variant V, Operands O, int TPR> RowLaunch row_launch(GpuClass gpu, bool exact) {
  static_assert(!rows_once<V, O, TPR>() || kHasRowsOnce<V, O>, "rows_once picks a kernel that exists");
  RowLaunch launch = rows_once<V, O, TPR>() ? RowLaunch{GridPlan::kOnePerBlock, false}
                                            : RowLaunch{prefetch_grid(V, gpu, exact), true};
  if constexpr (kHasRowsOnce<V, O>) {
    // Development builds: fused_norm.prefetch 0 takes the kernel without next-row loads (one block per
    // row group), 1 the one with them (on the grid above, persistent where that was one block per row
    // group).
    if (const int forced = tuning::override_of(tuning::Knob::kFusedNormPrefetch); forced != tuning::kUnset) {
      launch.prefetch = forced != 0;
      if (!launch.prefetch) launch.plan = GridPlan::kOnePerBlock;
      else if (launch.plan == GridPlan::kOnePerBlock) launch.plan = GridPlan::kPersistent;
    }
  }
  return launch;
}

// --- LTX's operand set --------------------------------------------------------------

// The kernels compiled for LTX's operand set (Operands::kLtx): adaln_rmsnorm and
// gated_residual_rmsnorm with modulation in the activations' half-precision dtype, at up to two words
// per thread (LTX's rows, hidden 2048 and 4096, take at most two).
template <typename T, typename Tm, Variant V, int VPT>
constexpr bool kLtxOperandKernels =
    VPT <= 2 && std::is_same_v<T, Tm> && !std::is_same_v<T, float> && fused::scale_shift(V);

// Whether LTX's operand set takes the kernels compiled for it (for adaln_rmsnorm, only where
// ltx_adaln_kernel_wins too): yes, except in development builds with fused_norm.general_operands = 1.
inline bool ltx_operand_kernels() { return tuning::override_of(tuning::Knob::kFusedNormGeneralOperands) != 1; }

// adaln_rmsnorm's kernel for LTX's operands has fewer registers (48 against 58-64: 5 blocks per SM,
// not 4) and was 2-7% faster at [2,2688,2048], [2,2688,4096] and fast [2,2048,3072] on both GPUs, but
// slower in exact mode on rows of 192 or 384 threads (H200 [2,2048,3072] 14.30 against 13.92, two
// runs): whether it may win at all, before its residency is asked.
constexpr bool ltx_adaln_kernel_may_win(bool exact, int tpr) { return !exact || pow2(tpr); }
// ... and 2-3% slower once a persistent block of it (`resident` blocks on the GPU) would take > 12 of
// the `row_groups` ([2,8160,2048], with either grid plan).
constexpr bool ltx_adaln_kernel_wins(int64_t row_groups, int64_t resident) { return row_groups <= 12 * resident; }

// --- backward (fused_norm_bwd.cu). Figures where a choice was swept (issue 36), some of them rmsnorm's backward.

// The scalar kernel's block (any hidden size or alignment; rare): 256 threads (not swept).
constexpr int kBwdThreads = 256;

// 16-byte words each thread holds on the vectorized backward (h, dout, dsum and y words in registers,
// plus up to four float32 accumulators per element for weight/scale/shift/gate): 4 words of bf16 on 256
// threads is hidden 8192; wider rows take the scalar kernel. ptxas (CUDA 13.0, sm_90), 256 threads without
// next-row loads: 48-80 registers at one word per thread for every op but gated_residual_rmsnorm (123-127:
// 2 blocks per SM), which takes 192-208 at two and spills 20-88 bytes at four.
constexpr int kBwdMaxWordsPerThread = 4;

// The dtype pair the development sweeps time (bf16 activations and modulation), which a development build
// also compiles the alternatives (block shapes, prefetch, shared accumulators) for.
template <typename T, typename Tm>
constexpr bool kBwdSweepPair = std::is_same_v<T, __nv_bfloat16> && std::is_same_v<T, Tm>;

// The vectorized kernel's block shapes (threads x words per thread) a build compiles for activations T and
// modulation Tm. `half`: a 2-byte activation dtype; `rounds`: round_n may be set (half-precision rows and
// modulation of their dtype). A block takes the shape whose threads are asked for and whose words per thread
// fit the row without leaving half of them idle.
template <typename T, typename Tm> constexpr bool bwd_shape_compiled(int threads, int words, Variant v) {
  constexpr bool half = sizeof(T) == 2, rounds = half && std::is_same_v<T, Tm>;
  // The general block: 256 threads, 1, 2 or 4 words (LTX-Video 2B's hidden 2048 in bf16: one word each;
  // rmsnorm's backward at hidden 2048 on the H200: 29.0 us against 38.2 for 64 x 4).
  if (threads == 256 && (words == 1 || words == 2 || words == 4)) return true;
  // Rows of 192 words (hidden 1536 in bf16/fp16, Wan 1.3B): 96 threads x 2 words, no idle thread (as
  // rmsnorm's backward, H200 [2,32760,1536]: 186.8 us against 207.9 on 256 threads, 64 idle).
  if (threads == 96 && words == 2 && half) return true;
  // adaln_rmsnorm's rows of 192 words in exact mode: 192 x 1 (bwd_default_threads).
  if (threads == 192 && words == 1 && rounds && v == Variant::kAdalnRmsnorm) return true;
  // Development builds, for fused_norm.bwd_threads sweeps: 64 x 3 and 192 x 1 (hidden 1536), 64 x 4 and
  // 128 x 2 (hidden 2048).
  return tuning::kDevBuild && kBwdSweepPair<T, Tm> &&
         ((threads == 64 && (words == 3 || words == 4)) || (threads == 128 && words == 2) ||
          (threads == 192 && words == 1));
}

// Threads of a vectorized block for rows of `nvec` 16-byte words, before the launcher checks that
// such a block is compiled (else it takes bwd_default_threads, then 256).
// `exact`: the call's round_n.
inline int bwd_default_threads(int64_t nvec, Variant v, bool exact) {
  // Rows of 192 words: 96 x 2, except adaln_rmsnorm in exact mode at 192 x 1 (64 registers, 5 blocks an SM;
  // the figures below were taken without a weight, where bwd_words now serves).
  // H200, Wan 1.3B's [2, 32760, 1536] at its 1040 blocks, us 96 x 2 -> 192 x 1: exact 224.4 -> 210.5 (release
  // benches at 053d5cd and a237d76; a development harness read 224.5 -> 211.7, experiments/bulk_ring on branch
  // exp/bwd-bulk-ring), fast 207.4 -> 211.4, so the fast mode keeps 96 x 2.
  if (nvec == 192) return v == Variant::kAdalnRmsnorm && exact ? 192 : 96;
  return 256;
}
inline int bwd_threads(int64_t nvec, Variant v, bool exact) {
  // Development builds: fused_norm.bwd_threads (64, 96, 128, 192 or 256 where bwd_shape_compiled has it).
  const int forced = tuning::override_of(tuning::Knob::kFusedNormBwdThreads);
  return forced > 0 ? forced : bwd_default_threads(nvec, v, exact);
}

// adaln_rmsnorm without a weight, its scale broadcast over the sequence and its scale and shift grads summed
// over rows (LTX-Video's norms), at rows of 192 or 256 words (hidden 1536 / 2048 in bf16/fp16): the one-word
// kernel (fused_norm_bwd.cu's bwd_words), not bwd_vectorized; the same split, the same bits where both take
// the same width. H200 A/B in one run (the release launcher against this kernel, grads per batch, bf16
// modulation; experiments/adaln_rmsnorm_words on branch exp/bwd-reduction-phase), us: LTX-Video's
// [2, 2688, 2048] exact 30.8 -> 28.7, fast 30.9 -> 28.5; Wan's [2, 32760, 1536] exact 204.0 -> 169.1, fast
// 201.0 -> 169.0. Kept on bwd_vectorized (not measured): a weight, modulation per token, x's grad alone.
// Development builds: fused_norm.bwd_words=0, or a forced fused_norm.bwd_threads, takes bwd_vectorized.
inline int bwd_words_threads(int64_t nvec, Variant v, bool reduces, bool weight, bool broadcast, bool per_row_grads) {
  const bool allowed = tuning::override_of(tuning::Knob::kFusedNormBwdWords) != 0 &&
                       tuning::override_of(tuning::Knob::kFusedNormBwdThreads) <= 0;
  const bool takes = v == Variant::kAdalnRmsnorm && reduces && !weight && broadcast && !per_row_grads;
  return allowed && takes && (nvec == 192 || nvec == 256) ? int(nvec) : 0;
}
// The one-word kernel's blocks an SM (its __launch_bounds__), ptxas 13.0, bf16: at 256 threads 64 registers
// and 8 bytes spilled (unbounded, 80 at 3 an SM: LTX exact 28.7 -> 29.8 us); at 192 threads 80, none
// spilled, and Wan's 1056 blocks (bwd_large_blocks) make two full waves (held to 5 an SM, 64 registers and
// 24-32 bytes spilled: 169.1 -> 207.3).
constexpr int kBwdWordsBlocksPerSm = 4;

// Whether the vectorized kernel loads the next row's words before it reduces the current row (a release
// build compiles only this choice). H200 same-run sweep (ebc4955, bf16, us, on / off): off for most ops,
// whose second row's words cost more registers than the early loads gain: Wan [2,32760,1536]
// rmsnorm_residual 278.2 / 210.3, gated_residual 181.6 / 164.1, residual_tanh_gated_rmsnorm 318.4 /
// 283.7, modulated_rmsnorm 185.0 / 179.2; LTX [2,2688,2048] 39.2 / 37.0, 27.6 / 27.2, 46.3 / 44.1,
// 33.9 / 31.7. On for gated_residual_rmsnorm (LTX 82.1 / 87.3) and adaln_rmsnorm (LTX 47.8 / 49.5; Wan
// 272.8 / 260.2 is the one row that loses).
template <Variant V> constexpr bool kBwdPrefetch = V == Variant::kAdalnRmsnorm || V == Variant::kGatedResidualRmsnorm;
template <Variant V> inline bool bwd_prefetch() {
  // Development builds: fused_norm.bwd_prefetch 0 / 1 (the sweep dtype pair only; others keep the default).
  const int forced = tuning::override_of(tuning::Knob::kFusedNormBwdPrefetch);
  return forced == tuning::kUnset ? kBwdPrefetch<V> : forced != 0;
}

// Where the vectorized kernel keeps its sums of the reduced grads (a release build compiles only this
// choice): in shared memory for the ops with three or four of them (adaln_rmsnorm: 80-98 registers at
// 256 x 1 and 125-157 at 96 x 2 in registers; gated_residual_rmsnorm 128 and 186-227, 2 blocks per SM at
// 256 threads: each word's eight elements cost 8 registers per reduced grad), in registers for the
// others (one reduced grad; as rmsnorm's measured backward). Not swept on its own.
template <Variant V> constexpr bool kBwdSharedAcc = V == Variant::kAdalnRmsnorm || V == Variant::kGatedResidualRmsnorm;
template <Variant V> inline bool bwd_shared_acc() {
  // Development builds: fused_norm.bwd_shared_acc 0 / 1 (the sweep dtype pair only; others keep the default).
  const int forced = tuning::override_of(tuning::Knob::kFusedNormBwdSharedAcc);
  return forced == tuning::kUnset ? kBwdSharedAcc<V> : forced != 0;
}

// The one wave the split stretches to (column_sum.cuh's wave_rows_per_block): the row kernel's blocks an SM
// at hidden 2048 (ptxas 13.0, bf16, 256 x 1) times 132 SMs. H200 development sweep, LTX-Video 2B's
// [2, 2688, 2048], us at 8 / 11 / this op's wave's rows:
inline int64_t bwd_wave_blocks(Variant v) {
  // 115 registers, 2 an SM: 80.4 / 73.2 / 60.9 (21 rows, 256 blocks).
  if (v == Variant::kGatedResidualRmsnorm) return 2 * column_sum_config::kWaveSms;
  // 48 registers, 5 an SM: 31.2 / 28.2 / 26.6 (9 rows, 598 blocks).
  if (v == Variant::kModulatedRmsnorm) return 5 * column_sum_config::kWaveSms;
  // The others at 4 an SM (residual_tanh_gated_rmsnorm, 48 registers then, was 40.9 at 11 rows and 40.7 at 9;
  // 54 with its tanh(gate) held, still 4 an SM).
  return column_sum_config::kWaveBlocks;
}

// Whether the vectorized kernel has the call's rounding (round_n) compiled in (an instance per rounding, no
// runtime select per element: the kernel was issue-bound, ncu H200 adaln_rmsnorm 0.69 issued warps per
// scheduler cycle, 31% of DRAM bandwidth) for variant v. H200, exact mode, us at LTX [2,2688,2048] / Wan
// [2,32760,1536], 92114c7's run against this one's (with the held scale multiplier below): adaln_rmsnorm
// 44.0 -> 34.6 / 252.2 -> 227.3, gated_residual_rmsnorm 60.0 -> 53.1 / 417.1 -> 407.2. Not rmsnorm_residual:
// 70 -> 88 registers at 96 x 2 (Wan 209.9 -> 261.2, behind compile's 248.8).
__host__ __device__ constexpr bool bwd_round_compiled(Variant v) { return v != Variant::kRmsnormResidual; }

// Where the vectorized kernel holds a multiplier per word across rows (computed once per modulation row, not
// per element of every row; fused_norm_bwd.cu's held_multiplier): residual_tanh_gated_rmsnorm's tanh(gate)
// always (92114c7: H200 Wan 287.4 -> 200.7 us, LTX 40.9 -> 29.1); the scale-shift ops' T(1 + scale) at one
// word per thread without a weight (LTX-Video 2B's calls at hidden 2048: adaln_rmsnorm 56 -> 61 registers,
// still 4 blocks an SM). Not with a weight (adaln_rmsnorm 64 -> 70: 3 blocks an SM) nor at two words
// (72 -> 105-124). ptxas 13.0, bf16.
__host__ __device__ constexpr bool bwd_hold_scale(int words_per_thread, bool weight) {
  return words_per_thread == 1 && !weight;
}

// Rows per block of the row kernel, in each of `groups` row groups: column_sum.cuh's wave split (>= 8 rows,
// <= 1024 blocks per group, one wave of the op's where 8-row runs would make one to two of four blocks an
// SM), a function of the row count, the row's words and the op alone, so the reduced grads' bits do not
// depend on the GPU. LTX-Video 2B's 5376 rows make 489 blocks of 11 (latency-bound: a block's rows one after
// another; 256 of 21 and 598 of 9 for the ops above); Wan 1.3B's 65520 make 1024 of 64 (2048 of 32 when the
// split goes per batch; 1040 and 526 for the two ops below). Fewer rows per block: more blocks, and more
// float32 partials (per reduced grad, 4 bytes per column per block, written and read back).
// Large problems' blocks over all groups (column_sum.cuh's wave_rows_per_block: runs past kMinRowsPerBlock at
// kMaxBlocks, over 8192 rows a group); 0 keeps kMaxBlocks a group. Measured at Wan 1.3B's [2, 32760, 1536] only
// (rows of 192 words, [B, 1, D] bf16 modulation): H200, a standalone harness over forced runs
// (fused_norm.bwd_rows_per_block; branch exp/bwd-split-harness), two runs, us fast / exact at 2048 blocks of 32
// rows -> this split:
inline int64_t bwd_large_blocks(Variant v, int64_t nvec) {
  if (nvec != 192) return 0;
  // 220.6-221.6 / 231.7-233.4 -> 196.1-198.8 / 210.3-212.4 (1040 blocks of 63 rows, two waves at 4 an SM of
  // 96 x 2; kept for the exact mode's 192 x 1, 5 an SM, where 526 blocks were slower: 243.6 against 211.7);
  // 790 / 656 / 526 blocks: 202-206 / 203-210 / 208-214 fast.
  if (v == Variant::kAdalnRmsnorm) return 8 * column_sum_config::kWaveSms;
  // 395.3-395.9 / 398.2-398.8 -> 360.1-361.7 / 363.8-366.1 (526 blocks of 125 rows: 4 an SM); 1040 blocks
  // 370-374, 656 490-504 (the split is measured, not derived).
  if (v == Variant::kGatedResidualRmsnorm) return 4 * column_sum_config::kWaveSms;
  return 0;
}
inline int64_t bwd_rows_per_block(int64_t rows, int64_t groups, Variant v, int64_t nvec) {
  // Development builds: fused_norm.bwd_rows_per_block forces the run length (>= 1); the reduced grads are
  // then deterministic for that setting, but not bitwise those of the default split.
  const int forced = tuning::override_of(tuning::Knob::kFusedNormBwdRowsPerBlock);
  return forced > 0 ? forced
                    : wave_rows_per_block(rows, groups, column_sum_config::kMinRowsPerBlock,
                                          column_sum_config::kMaxBlocks, bwd_wave_blocks(v),
                                          bwd_large_blocks(v, nvec));
}

// The row split and the reductions: common/column_sum.cuh (shared by every backward).

}  // namespace fused_norm_config
}  // namespace ltx
