// layernorm's launch choices: the one place they are made, per GPU class.
// Each rung says why, with the figure that chose it (bench_layernorm.py
// --dev-build --sweep: H200 at 16c4795, H100 at 8cff303;
// docs/performance.md#layernorm). Also here: the
// ops (Variant) and the widths the row kernel is compiled for.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../common/column_sum.cuh"
#include "../common/launch.cuh"
#include "../common/row_ring.cuh"

namespace ltx {
namespace ln {

// One kernel structure per op (formulas in layernorm.h).
enum class Variant : int {
  kLayerNorm,               // out = T(LN(x))
  kAdalnLayerNorm,          // out = modulate(LN(x))
  kGatedResidualLayerNorm,  // h = x + y [* gate] -> residual_out, out = [modulate](LN(h))
};

__host__ __device__ constexpr bool reads_y(Variant v) { return v == Variant::kGatedResidualLayerNorm; }

// Threads per row: powers of two kMinTpr..kMaxTpr, at most 2 words per thread
// below kMaxTpr and kMaxVpt at it (rows of up to 2048 words: hidden 16384 in
// bf16/fp16, 8192 in float32); the exact widths (exact_width) at most 2.
constexpr int kMinTpr = 32, kMaxTpr = 512, kMaxVpt = 4;
constexpr int max_words_per_thread(int tpr) { return tpr == kMaxTpr ? kMaxVpt : 2; }

}  // namespace ln

namespace layernorm_config {

using ln::Variant;

constexpr bool pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

// --- Threads per row ------------------------------------------------------------

// Row widths (16-byte words) between powers of two that get an exact number of words per thread: the
// models' hidden sizes 1536 (Wan 1.3B), 3072 (Flux, HunyuanVideo) and 5120 (Wan 14B) are 192, 384 and 640
// words in bf16/fp16 and 384, 768, 1280 in float32; at one or two words per thread they take 96, 192,
// 320, 384 or 640 threads, so that no thread of a row idles.
inline int exact_width(int64_t n) { return matching_width<96, 192, 320, 384, 640>(n); }

// Words of a row per thread that the row width aims at.
inline int64_t words_per_thread(int64_t nvec, Variant v, GpuClass gpu) {
  (void)nvec;
  (void)v;
  (void)gpu;
  // Two for every op. The seam (two rows read, two written) was first given one word of each per thread,
  // as fused_norm's two-row variants; on the H200 (16c4795, bench_layernorm --sweep) two were 18% faster at
  // Wan 14B [1,32760,5120] (415 -> 340 us), 7% at Wan 1.3B's norm3 [2,32760,1536] (234 -> 218 us) and 3%
  // at HunyuanVideo [1,118800,3072] (765 -> 745 us); no row slower. H100 (8cff303): the same, Wan 1.3B [2,32760,1536] 331 -> 271 us.
  // One row read: two, as fused_norm's adaln_rmsnorm (issue-bound: a row costs a fixed ~200 instructions
  // per thread besides the per-element work, and LayerNorm reduces twice); on the H200 the sweep (one or
  // two words) found no width within 1% faster at any model row. Rows of 640 words: takes_wide_row below.
  return 2;
}

// Rows of 640 words (hidden 5120 in bf16/fp16: Wan 14B) on the H200: rows of 160 threads of four words, two
// blocks of two rows an SM: the next rows' words in flight are 40 KB an SM, not 320 x 2's 20 KB. H200 harness
// (experiments/layernorm_wide_rows, branch exp/bwd-reduction-phase), release kernels, persistent grid, us at
// Wan 14B's [1, 32760, 5120] / [1, 75600, 5120]:
//   layernorm, float32 weight and bias (90 registers): 320 x 2 190.6 / 434.7 (83 / 84% of copy) -> 174.6 / 393.9
//     (91 / 93%); 128 x 5 181.2 / 407.9.
//   adaln_layernorm, float32 modulation: 320 x 2 209.8 / 480.6 (75 / 76%) -> 177.2 / 401.6 (89 / 91%) held to
//     two blocks an SM (96 registers; unbounded, 134 and one block: 236.3 / 528.4); 128 x 5 183.6 / 413.5.
// 64 x 10 lost both (one block an SM); 320 x 2 held to three blocks an SM spills and lost. Not the seam (93-94%
// at 320 x 2), not the H100 (95-98% at 320 x 2; not measured wider). Widths 1536 and 3072 gained < 2% from
// three or more words (64 x 3, 128 x 3), so they keep two.
constexpr int64_t kWideRowWords = 640;
constexpr int kWideRowThreads = 160;
inline bool takes_wide_row(int64_t nvec, Variant v, GpuClass gpu) {
  return nvec == kWideRowWords && gpu == GpuClass::kH200 && !ln::reads_y(v);
}
// The row kernel's __launch_bounds__ minimum of blocks an SM: two for the wide rows (above), else 0 (no
// bound: nvcc then emits none, and an explicit 1 moved other widths' registers, e.g. 63 -> 68 at 320 x 2).
constexpr int row_min_blocks(int tpr, int vpt) { return tpr == kWideRowThreads && vpt == 4 ? 2 : 0; }

// Threads that share a row of `nvec` 16-byte words for variant `v`.
inline int threads_per_row(int64_t nvec, Variant v, GpuClass gpu) {
  // Development builds: a forced width (layernorm.threads_per_row: a power of two kMinTpr..kMaxTpr or an
  // exact width, leaving at most max_words_per_thread words per thread), for sweeps.
  const int forced = tuning::override_of(tuning::Knob::kLayerNormThreadsPerRow);
  if (forced > 0 && (exact_width(forced) == forced ||
                     (pow2(forced) && forced >= ln::kMinTpr && forced <= ln::kMaxTpr)) &&
      nvec <= int64_t(forced) * ln::max_words_per_thread(forced))
    return forced;
  if (takes_wide_row(nvec, v, gpu)) return kWideRowThreads;
  // An exact width at the aimed words per thread, else at the other of one or two (float32 rows of the
  // model widths: the seam's 768 words take 384 threads of two).
  const int64_t wpt = words_per_thread(nvec, v, gpu);
  for (const int64_t w : {wpt, 3 - wpt})
    if (nvec % w == 0)
      if (const int tpr = exact_width(nvec / w)) return tpr;
  // Else the smallest power of two that leaves at most `wpt` words per thread, kMinTpr..kMaxTpr.
  int tpr = ln::kMinTpr;
  while (tpr < ln::kMaxTpr && int64_t(tpr) * wpt < nvec) tpr *= 2;
  return tpr;
}

// --- Grid ----------------------------------------------------------------------------

// How the row groups spread over blocks (the row kernel loads the next row's words before it reduces the
// current one, so persistent blocks keep a row in flight).
inline GridPlan grid_plan(Variant v, GpuClass gpu, int block_threads, int tpr) {
  // Development builds: layernorm.grid_plan forces a plan by its value (GridPlan, launch.cuh).
  const int forced = tuning::override_of(tuning::Knob::kLayerNormGridPlan);
  if (forced >= int(GridPlan::kPersistent) && forced <= int(GridPlan::kOnePerBlock)) return GridPlan(forced);
  // H200: persistent, as rmsnorm and fused_norm's row kernels there. Measured (16c4795): never slower than two
  // row groups per block (up to 30%) or one per block (up to 55%; the seam at Wan 14B: 415 / 529 / 638 us).
  if (gpu == GpuClass::kH200) return GridPlan::kPersistent;
  // H100 (8cff303, bench_layernorm --dev-build --sweep): the seam with rows of >= 256 threads (one row per
  // block: Wan 14B's 5120) two row groups per block, 5-6% faster than one (Wan 14B 484 -> 456 us, 720p
  // 1104 -> 1042 us, norm3 479 -> 454 us, which had trailed torch.compile's 475); narrower rows (several
  // per block) one per block, as fused_norm's gated_residual_rmsnorm: two per block was 1-5% slower there.
  // The one-row ops: ~2 row groups per block for blocks of <= 256 threads, ~4 for larger ones (rmsnorm's
  // rung); persistent was within 2% at Wan 1.3B and 6% slower at Wan 14B.
  if (ln::reads_y(v)) return tpr >= 256 ? GridPlan::kTwoPerBlock : GridPlan::kOnePerBlock;
  return block_threads <= 256 ? GridPlan::kTwoPerBlock : GridPlan::kFourPerBlock;
}

// --- Row kernel ---------------------------------------------------------------------

// Each row's threads meet at a barrier of their own (row_sum's kRowBarrier) rather than the block's, for the
// one-read ops; the seam keeps the block's. H200 A/B (isolated launches, us, the block's / the row's):
// Wan 1.3B [2, 32760, 1536] (three rows a block) adaln with float32 modulation 121.5 / 116.5, layernorm
// with float32 weight and bias 120.5 / 114.9; HunyuanVideo [1, 118800, 3072] (two) adaln 439.4 / 420.7;
// the seam there 759.8 / 826.8, so not the seam (at Wan 1.3B it gained 1%).
__host__ __device__ constexpr bool row_barrier(Variant v) { return v != Variant::kGatedResidualLayerNorm; }

// --- backward (layernorm_bwd.cu). Not swept unless a figure is given (issue 36). ---------------------

// Threads of the vectorized backward's block (one row per block, one row at a time). H200 same-run sweep
// (ebc4955, bf16, us): hidden 1536 (Wan, 192 words) 192 x 1: adaln_layernorm 351.3 against 507.3 at
// 96 x 2 and 446.0 at 256 x 1, the seam 553.1 against 645.9 / 572.7, layernorm 252.6 against 258.8
// (128 x 2: 247.5, but adaln 499.0); hidden 3072 (Flux, 384 words) 192 x 2 (adaln 60.3, seam 124.2,
// layernorm 33.9; 256 x 2 no better); hidden 2048 256 x 1 (128 x 2 is faster for adaln, 54.2 against
// 62.7, slower for the seam, 96.9 against 86.0: one width per row size for now). Hidden 5120 (640
// words, Wan 14B) 320 x 2, no thread idle (not swept). Else 256 threads of 1, 2 or 4 words.
constexpr int kBwdThreads = 256;
inline int bwd_threads(int64_t nvec, bool all_widths) {
  // Development builds (bf16 rows: all_widths): layernorm.bwd_threads forces 96, 128, 192 or 256 threads
  // where they cover the row at <= 4 words per thread (320: <= 2), for sweeps.
  const int forced = tuning::override_of(tuning::Knob::kLayerNormBwdThreads);
  if (all_widths && (forced == 96 || forced == 128 || forced == 192 || forced == 256) && nvec <= 4 * forced)
    return forced;
  if (all_widths && forced == 320 && nvec <= 2 * forced) return forced;
  if (nvec == 192 || nvec == 384) return 192;
  if (nvec == 640) return 320;
  return kBwdThreads;
}

// The warp-row backward (plain layernorm without weight or bias: one warp per row): kBwdWarpRows rows per
// block, and each lane's words of a row, 4, 6, 8 or 12, the fewest that cover it (rows of <= 384 words:
// 3072 columns in bf16; wider rows, or float32 ones past 1536, take the block kernel). Rows of exactly 192,
// 256 or 384 words take the one-word kernel instead (bwd_plain_threads below).
constexpr int kBwdWarpRows = 4;
constexpr int kBwdWarpMaxWords = 12;
inline int bwd_warp_words(int64_t nvec) {
  // Development builds: a forced layernorm.bwd_threads takes the block kernel instead, for sweeps.
  if (tuning::override_of(tuning::Knob::kLayerNormBwdThreads) > 0) return 0;
  for (const int words : {4, 6, 8, kBwdWarpMaxWords})
    if (nvec <= 32 * words) return words;
  return 0;  // too wide: the block kernel
}

// Plain layernorm's rows of 192, 256 or 384 words (hidden 1536, 2048, 3072 in bf16/fp16) take one word per
// thread instead (layernorm_bwd_plain_rows, TPR = the row's words): the warp kernel's 96 registers at 8
// words a lane left 18 warps an SM and 0.38 issued per scheduler cycle; this one runs 32 registers at 88%
// occupancy (H200, in the benchmark's graph: 20.50 -> 18.71 us at LTX's rows, compile 18.19; Flux's 22.4 ->
// 20.3). Rows per block: two below 384 threads, as compile's 512-thread blocks at LTX's rows (not swept).
inline int bwd_plain_threads(int64_t nvec) { return nvec == 192 || nvec == 256 || nvec == 384 ? int(nvec) : 0; }
constexpr int bwd_plain_rows(int tpr) { return tpr < 384 ? 2 : 1; }
// Plain layernorm with a weight or a bias at those widths: the one-word kernel that walks its block's run of
// rows (layernorm_bwd_words: the row and the next one's words in registers, the weight held, the sums per
// thread) instead of the ring: the same split and the same bits. H200 development build A/B, Wan [2, 32760,
// 1536], us ring / one-word: with the weight and bias grads 209.9 / 195.4 (68% / 73% of copy; compile 231.7),
// x's grad alone (LoRA) 165.6 / 148.0 (86% / 96%; compile 254.4). Development builds: layernorm.bwd_words=0,
// or a forced layernorm.bwd_threads, takes the ring instead, for A/B (here and below).
inline bool bwd_words_allowed() {
  return tuning::override_of(tuning::Knob::kLayerNormBwdWords) != 0 &&
         tuning::override_of(tuning::Knob::kLayerNormBwdThreads) <= 0;
}
inline int bwd_affine_threads(int64_t nvec) { return bwd_words_allowed() ? bwd_plain_threads(nvec) : 0; }
// adaln_layernorm at those widths takes the one-word kernel too, its (1 + scale)' held per batch, where it has
// no weight or bias, its scale is broadcast over the sequence and its scale and shift grads are summed (not
// per row). H200 A/B in one run (the release launcher against this kernel, same split, scale and shift grads
// per batch; experiments/adaln_words on branch exp/bwd-reduction-phase), us: LTX-Video's
// [2, 2688, 2048] with bf16 modulation, exact 35.6 -> 25.6 (the ring), fast 29.9 -> 25.5 (registers); Flux's
// [1, 4096, 3072] exact 38.1 -> 35.4 (192 x 2 -> 384 x 1); Wan's [2, 32760, 1536] with float32 modulation
// 207.1 -> 188.2. Kept on the old kernels (not measured): x's grad alone, and modulation per token.
inline int bwd_adaln_threads(int64_t nvec, bool reduces, bool affine, bool broadcast, bool per_row_grads) {
  return reduces && !affine && broadcast && !per_row_grads && bwd_words_allowed() ? bwd_plain_threads(nvec) : 0;
}

// The vectorized backward's ring of upcoming rows (common/row_ring.cuh): the row tensors it holds, h and
// dout (the seam also grad_h and y), and its stages. Two (the next row in flight while this one is
// reduced, both read from shared memory, not registers): H200 sweep (16d933e, us, 2 / 3 / 4 stages):
// Wan [2, 32760, 1536] adaln 303 / 339 / 340, the seam rows only 282 / 294 / 337; Flux [1, 4096, 3072]
// the seam 83 / 86 / 92; no row faster at 3 or 4 beyond noise. The seam gained most from the ring
// (553 -> 470 us at Wan, 123 -> 92 at Flux, 970b178 -> db26642): its four row tensors had been held in
// registers. Rows past kRingDefaultBytes opt in (hidden 5120: 80 KB on the seam). The forward tried the
// same ring and lost (Wan 1536: 115 -> 125-135 us): it keeps its row ahead in registers.
__host__ __device__ constexpr int bwd_ring_tensors(Variant v) { return v == Variant::kGatedResidualLayerNorm ? 4 : 2; }
constexpr int kBwdStages = 2;
// No ring (RowRegisters: this row's words and the next row's in registers) for adaln_layernorm at one word a
// thread with grads summed over rows, no weight or bias and no rounding of the modulation (Wan's float32
// scale and shift): 64 registers, the ring's 50, and no shared-memory pass. H200 development build A/B
// (two machines, us, ring / registers): Wan [2, 32760, 1536] 223.3 / 216.5 and 230.1 / 215.1; LTX-Video's
// rows [2, 2688, 2048] 38.5 / 32.2 and 36.9 / 32.1. Kept on the ring: bf16 modulation in exact mode (74
// registers, three blocks an SM: 38.7 / 47.9 at LTX's rows), the seam (96-137 registers: 481 / 550 at Wan),
// layernorm with a weight (210.7 / 242.4 at Wan), x's grad alone (within the machines' noise, either way).
constexpr bool bwd_rows_in_registers(Variant v, int vpt, bool reduces, bool affine, bool round_mod) {
  return v == Variant::kAdalnLayerNorm && vpt == 1 && reduces && !affine && !round_mod;
}

// Dependent launch for the vectorized backward's row kernel (launched while the kernel before drains), but
// not for the seam. H200 development build, LTX-Video 2B's [2, 2688, 2048], us with / without: the seam 65.3 /
// 55.3 whether its dependents were released at its start or after its rows (cause not found; two blocks an SM
// by registers, as its wave); adaln_layernorm 38.4 / 39.6. Flux's and Wan's seam lose 3% without it.
constexpr bool bwd_dependent_launch(Variant v) { return v != Variant::kGatedResidualLayerNorm; }

// 16-byte words of each row tensor per thread on the vectorized backward: at most 4 (at 256 threads:
// hidden 8192 in bf16); wider rows take the scalar kernel (not swept).
constexpr int kBwdMaxWordsPerThread = 4;

// The row split (common/column_sum.cuh's fixed split, with this family's bounds): at least
// kBwdMinRowsPerBlock rows per block (the float32 partials of each reduced grad stay a small share of
// the bytes) and at most kBwdMaxBlocks blocks per row group. Constants, never the GPU's, so the sums'
// order and bits are the same everywhere; development builds may force either (layernorm.bwd_min_rows,
// layernorm.bwd_max_blocks) for sweeps: at LTX-Video and Flux sizes (5376 and 4096 rows: 489 blocks of 11
// by the wave split, and 512 of 8) a block's chain of rows, one in flight at a time, bounds the rate
// (rmsnorm's backward, H200). Not swept here: column_sum's defaults (8, 1024).
constexpr int64_t kBwdMinRowsPerBlock = column_sum_config::kMinRowsPerBlock;
constexpr int64_t kBwdMaxBlocks = column_sum_config::kMaxBlocks;
inline int64_t bwd_min_rows() {
  const int forced = tuning::override_of(tuning::Knob::kLayerNormBwdMinRows);
  return forced >= 1 ? forced : kBwdMinRowsPerBlock;
}
inline int64_t bwd_max_blocks() {
  const int forced = tuning::override_of(tuning::Knob::kLayerNormBwdMaxBlocks);
  return forced >= 1 ? forced : kBwdMaxBlocks;
}
// The wave split (column_sum.cuh) for `rows` rows in each of `groups` groups; a forced bound takes the plain
// fixed split, for sweeps.
inline bool bwd_split_forced() { return bwd_min_rows() != kBwdMinRowsPerBlock || bwd_max_blocks() != kBwdMaxBlocks; }
// The one wave it stretches to: four blocks an SM (kWaveBlocks); for the seam (gated_residual_layernorm) two,
// measured, not its occupancy (as fused_norm's gated_residual_rmsnorm). H200 development sweep, LTX-Video 2B's
// [2, 2688, 2048], us at 8 / 11 / 21 rows: affine 72.9 / 72.5 / 58.7, without 72.8 / 73.2 / 61.3 (58.3 at 14).
inline int64_t bwd_wave_blocks(bool seam) {
  return seam ? 2 * column_sum_config::kWaveSms : column_sum_config::kWaveBlocks;
}
// Large problems' blocks over all groups (column_sum.cuh's wave_rows_per_block: runs past kBwdMinRowsPerBlock at
// kBwdMaxBlocks, over 8192 rows a group): one wave of the op's row kernel; 0 keeps kBwdMaxBlocks a group. Measured
// at Wan 1.3B's [2, 32760, 1536] only (rows of 192 words): H200, a standalone harness over forced splits
// (layernorm.bwd_max_blocks; branch exp/bwd-split-harness), two runs, us at kBwdMaxBlocks -> this wave, and other
// waves:
inline int64_t bwd_large_blocks(Variant v, int64_t nvec) {
  if (nvec != 192) return 0;
  // layernorm with weight and bias (layernorm_bwd_words: 64 registers, 5 blocks an SM): 1024 blocks
  // of 64 rows were 1.55 waves. 197.3-200.6 -> 172.1-174.8 (656 of 100 rows); 4 an SM 179-181, 6 220-222.
  // adaln_layernorm on the same kernel (no weight or bias, float32 modulation, grads per batch): 2048 blocks
  // of 32 rows (3.1 waves) -> 656 of 100 (experiments/adaln_layernorm_split, branch exp/bwd-reduction-phase).
  // Its ring kernel's calls at these rows (with a weight or bias) take the same split, not measured.
  if (v == Variant::kLayerNorm || v == Variant::kAdalnLayerNorm) return 5 * column_sum_config::kWaveSms;
  // The seam (108 registers, 3 an SM, yet best at 4: measured): 2048 blocks of 32 rows 489.9-491.3 ->
  // 444.4-447.8 (526 of 125 rows); 3 an SM 508-552, 6 an SM 451-452.
  if (v == Variant::kGatedResidualLayerNorm) return 4 * column_sum_config::kWaveSms;
  return 0;
}
inline int64_t bwd_rows_per_block(int64_t rows, int64_t groups, bool seam, int64_t large_blocks) {
  return bwd_split_forced() ? fixed_rows_per_block(rows, bwd_min_rows(), bwd_max_blocks())
                            : wave_rows_per_block(rows, groups, kBwdMinRowsPerBlock, kBwdMaxBlocks,
                                                  bwd_wave_blocks(seam), large_blocks);
}
// Rows per block when no grad asked for is summed over rows (frozen weights and modulation: LoRA training):
// column_sum.cuh's unreduced runs; layernorm.bwd_min_rows forces this too, for sweeps.
inline int64_t bwd_unreduced_rows() {
  const int forced = tuning::override_of(tuning::Knob::kLayerNormBwdMinRows);
  return forced >= 1 ? forced : column_sum_config::kUnreducedRowsPerBlock;
}

}  // namespace layernorm_config
}  // namespace ltx
