// rmsnorm's launch choices: the one place they are made. Each rung says why,
// with the same-run figure that chose it (docs/performance.md#rmsnorm).
#pragma once

#include <cstdint>

#include "../common/launch.cuh"

namespace ltx {
namespace rmsnorm_config {

// Row widths in 16-byte words that get one thread per word: hidden 3072, 5120
// and 6144 in bf16/fp16 (each needs a case in launch_for_width).
inline int one_word_width(int64_t nvec) { return matching_width<384, 640, 768>(nvec); }

// Threads that share a row of `nvec` 16-byte words on the vectorized path.
inline int threads_per_row(int64_t nvec) {
  // Development builds: a forced width (a power of two 8..1024 leaving <= 8 words per thread, or one of
  // the one-word widths leaving <= 1), for sweeps.
  const int forced = tuning::override_of(tuning::Knob::kRmsnormThreadsPerRow);
  if (forced > 0 && one_word_width(forced) == forced && nvec <= forced) return forced;
  if (forced >= 8 && forced <= 1024 && (forced & (forced - 1)) == 0 && nvec <= int64_t(forced) * 8) return forced;
  // One thread per word at 3072/5120/6144 (an exact number of words per thread beats the next power of two).
  if (const int tpr = one_word_width(nvec)) return tpr;
  // Else the largest power of two <= nvec (1-2 words per thread), 8..1024: best on the H200 at hidden 2048, 3072.
  return pow2_threads_per_row(nvec, 8, 1024);
}

// Blocks per SM asked of ptxas (__launch_bounds__) at one word per thread.
template <int kBlock, GpuClass G> constexpr int min_blocks_one_word() {
  // H200: ptxas's own choice at 256 threads (~6 blocks; forcing 8 cost 1-2% at [1,32768,2048]), and 5
  // blocks of 384 at hidden 3072 (26.6 us at [2,4096,3072]; 4 blocks 27.1).
  if (G == GpuClass::kH200) return kBlock <= 256 ? 1 : 2048 / kBlock;
  // H100: all 2048 threads per SM in 256-thread blocks (<= 32 registers: [1,1024,2048] 4.04 -> 3.62 us,
  // [2,8160,2048] 47.2 -> 46.8), and 4 blocks of 384 at hidden 3072 (36.0 us; 5 blocks 36.9-37.3, 3 38.9).
  return (kBlock <= 256 ? 2048 : 1536) / kBlock;
}

// How the row groups spread over blocks.
constexpr GridPlan grid_plan(GpuClass gpu, int block_threads) {
  // H200: persistent (a block loads its next row while it reduces the current one).
  if (gpu == GpuClass::kH200) return GridPlan::kPersistent;
  // H100, large inputs: ~2 row groups per block for blocks of <= 256 threads ([1,32768,2048] 92.2 -> 90.3
  // us, [2,8160,2048] 46.9 -> 46.1), ~4 for larger ones ([2,4096,3072] 36.3 us; 2 per block 37.5-39.0).
  return block_threads <= 256 ? GridPlan::kTwoPerBlock : GridPlan::kFourPerBlock;
}

// --- backward (rmsnorm_bwd.cu). Figures where a choice was swept (issue 36); the rest are not swept. ------

// Threads of a backward block, which takes one row at a time: 256 covers a row of 2048 bf16 (LTX-Video
// 2B) with one 16-byte word per thread; at 62 registers (bf16, ptxas 13.0) 4 blocks fit an SM, which is
// the wave column_sum.cuh's split fills (not swept).
constexpr int kBwdThreads = 256;

// Rows of 192 16-byte words (hidden 1536 in bf16/fp16, Wan 1.3B) take 96-thread blocks of 2 words per
// thread: H200, [2,32760,1536] 186.8 us (77% of copy) against 207.9 with 256 threads (64 idle) and
// 231-301 with 2-8 rows per block at once. Elsewhere the 256-thread block: at hidden 2048 it was 29.0 us
// against 38.2 for 64 threads x 4 words (fewer threads in all: 5376 rows made 672 blocks).
inline bool bwd_narrow_block(int64_t nvec) { return nvec == 192; }

// 16-byte words each thread holds on the vectorized backward (x and dy words in registers, plus a float32
// dw accumulator per element): 4 keeps that near 100 registers; wider rows take the scalar kernel
// (not swept).
constexpr int kBwdMaxWordsPerThread = 4;

// The row split and the dw reduction: common/column_sum.cuh (shared by every backward).

}  // namespace rmsnorm_config
}  // namespace ltx
