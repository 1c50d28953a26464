// Deterministic sums over rows, for backward weight/scale/shift grads: no
// atomics, a fixed order, so the same inputs give the same bits on any GPU.
//
// Step 1 (the op's own row kernel): block b of each group takes the fixed rows
// [b * rows_per_block, (b + 1) * rows_per_block) in order and writes its
// float32 sum per column to row b of a [groups, blocks, cols] workspace.
// Step 2 (column_sums below, one launch for all of an op's reduced grads): adds
// each group's workspace rows in a fixed order.
// The split depends on the row count alone (fixed_split), never on the GPU.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "device.cuh"
#include "launch.cuh"

namespace ltx {

namespace column_sum_config {
// At least this many rows per block, so the float32 partials stay a small share
// of the bytes next to the rows the op reads (rmsnorm backward, not swept).
constexpr int64_t kMinRowsPerBlock = 8;
// At most this many blocks per group (~8 resident on each of 132 SMs). A
// constant, not a query of the GPU, so the summation order is the same everywhere.
constexpr int64_t kMaxBlocks = 1024;
// The reduction kernel: 32 columns (one 128-byte line per warp) x 8 slices of
// the partial rows, so a [1024, 2048] workspace is read by 16K threads.
constexpr int kColumns = 32;
constexpr int kSlices = 8;
// Rows per block where a row kernel sums nothing over rows (no grad asked for is reduced, as in LoRA
// training: no order to keep): the fixed split's 8 rows, with no cap on the blocks. H200 (ad8afa7), Wan
// 1.3B [2, 32760, 1536], row grads only, us at 1 / 2 / 8 / 32 rows: layernorm 258.9 / 196.1 / 179.7 /
// 191.4, adaln_layernorm 304.5 / 254.9 / 233.8 / 237.8, the seam 419.4 / 340.4 / 313.8 / 315.0.
constexpr int64_t kUnreducedRowsPerBlock = 8;
// One wave of the row kernels' 256-thread blocks at 4 per SM (48-64 registers) on the 132 SMs of an
// H100 or H200 SXM. Constants, not the GPU's, so that the split is the same everywhere.
constexpr int64_t kWaveSms = 132;
constexpr int64_t kWaveBlocks = 4 * kWaveSms;
}  // namespace column_sum_config

// Rows per block for `rows` rows (per group): a fixed function of `rows` (and of a
// family's own constant bounds, where it sets them: never of the GPU).
inline int64_t fixed_rows_per_block(int64_t rows, int64_t min_rows = column_sum_config::kMinRowsPerBlock,
                                    int64_t max_blocks = column_sum_config::kMaxBlocks) {
  const int64_t spread = (rows + max_blocks - 1) / max_blocks;
  return spread > min_rows ? spread : min_rows;
}

// Blocks per group (the workspace rows of a group) for `rows` rows per group.
inline int64_t fixed_split_blocks(int64_t rows, int64_t min_rows = column_sum_config::kMinRowsPerBlock,
                                  int64_t max_blocks = column_sum_config::kMaxBlocks) {
  if (rows <= 0) return 0;
  const int64_t per = fixed_rows_per_block(rows, min_rows, max_blocks);
  return (rows + per - 1) / per;
}

// The split of the row kernels of rmsnorm, fused_norm and layernorm: as fixed_rows_per_block for `rows` rows
// in each of `groups` groups, except where runs of min_rows would make a grid of one to two waves
// (kWaveBlocks over all groups): its thin second wave takes as long as the first, so the runs are
// stretched to fill one wave. H100 (98b3c65, development knobs), LTX-Video 2B's 5376 rows (672 blocks
// of 8 -> 489 of 11), us: adaln_rmsnorm 51.4 -> 45.4, rmsnorm_residual 44.4 -> 39.2,
// gated_residual_rmsnorm 87.2 -> 80.3, modulated_rmsnorm 36.1 -> 32.2, adaln_layernorm 50.5 -> 45.4.
// Flux's 4096 rows (512 blocks) and Wan's 65520 (runs above min_rows) are not stretched.
// `wave_blocks`: the one wave stretched to, where a kernel's registers give it other than 4 blocks an SM
// (a constant of its family's config); whether to stretch is decided at kWaveBlocks for all.
// `large_blocks`: where a family's config gives one for the op and row width (0: none), large problems
// (runs past min_rows at max_blocks) take that many blocks over all groups (at most max_blocks a group):
// 1024 blocks a group can be a wave and a half of a kernel at 5 an SM (layernorm_config, fused_norm_config).
inline int64_t wave_rows_per_block(int64_t rows, int64_t groups,
                                   int64_t min_rows = column_sum_config::kMinRowsPerBlock,
                                   int64_t max_blocks = column_sum_config::kMaxBlocks,
                                   int64_t wave_blocks = column_sum_config::kWaveBlocks, int64_t large_blocks = 0) {
  const int64_t per = fixed_rows_per_block(rows, min_rows, max_blocks);
  const int64_t g = groups > 1 ? groups : 1;  // groups 0: a batch of 0, whose empty workspace is still sized
  const auto per_group = [g](int64_t w) { return w > g ? w / g : int64_t(1); };
  if (large_blocks > 0 && per > min_rows) {  // never more than max_blocks a group
    const int64_t blocks = per_group(large_blocks), wide = (rows + blocks - 1) / blocks;
    return wide > per ? wide : per;
  }
  const int64_t wave = per_group(column_sum_config::kWaveBlocks), target = per_group(wave_blocks);
  const int64_t blocks = (rows + per - 1) / per;
  return per == min_rows && blocks > wave && blocks < 2 * wave ? (rows + target - 1) / target : per;
}
inline int64_t wave_split_blocks(int64_t rows, int64_t groups) {
  if (rows <= 0) return 0;
  const int64_t per = wave_rows_per_block(rows, groups);
  return (rows + per - 1) / per;
}

// One reduced grad for step 2: `groups` groups of `blocks` partial rows each, summed into `out`
// ([groups, cols] of `dtype`).
struct ColumnSumJob {
  const float* partials = nullptr;
  void* out = nullptr;
  DType dtype = DType::kFloat32;
  int64_t groups = 0, blocks = 0;
};
// A backward's reduced grads, summed by one launch: a launch per grad had cost 1.5-3 us each at
// LTX-Video's rows (H200), most of it the launch's own latency, not the bytes.
struct ColumnSumJobs {
  static constexpr int kMax = 5;  // the most one op reduces: the layernorm seam's weight, bias, scale, shift, gate
  ColumnSumJob job[kMax];
  int count = 0;
  bool add(const ColumnSumJob& j) {
    if (count == kMax) return false;
    job[count++] = j;
    return true;
  }
};

// out[g][c] = sum over b of partials[g][b][c]: slice s adds rows s, s + S, ...
// in order, then slice 0 adds the S slice sums in order. grid (ceil(cols / 32), groups, jobs).
// A template only so that the header's kernel links from every translation unit that includes it.
template <int = 0>
__global__ void __launch_bounds__(column_sum_config::kColumns * column_sum_config::kSlices)
    column_sum_kernel(ColumnSumJobs jobs, int64_t cols) {
  constexpr int kCols = column_sum_config::kColumns, kSlices = column_sum_config::kSlices;
  pdl_wait_and_release();  // launched while the row kernel drains; its partials are read after this
  const ColumnSumJob& j = jobs.job[blockIdx.z];
  if (blockIdx.y >= j.groups) return;  // the whole block: a job with fewer groups than the grid
  const int lane = threadIdx.x % kCols, slice = threadIdx.x / kCols;
  const int64_t c = int64_t(blockIdx.x) * kCols + lane;
  const float* part = j.partials + int64_t(blockIdx.y) * j.blocks * cols;
  float s = 0.f;
  if (c < cols)
    for (int64_t b = slice; b < j.blocks; b += kSlices) s += part[b * cols + c];
  __shared__ float sums[kSlices][kCols];
  sums[slice][lane] = s;
  __syncthreads();
  if (slice != 0 || c >= cols) return;
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < kSlices; ++k) total += sums[k][lane];
  const int64_t at = int64_t(blockIdx.y) * cols + c;
  switch (j.dtype) {
    case DType::kFloat32: static_cast<float*>(j.out)[at] = total; break;
    case DType::kFloat16: static_cast<__half*>(j.out)[at] = from_float<__half>(total); break;
    case DType::kBFloat16: static_cast<__nv_bfloat16*>(j.out)[at] = from_float<__nv_bfloat16>(total); break;
  }
}

// Enqueue step 2 for every job of `jobs` (grads of `cols` columns) in one launch; nothing for no job.
inline cudaError_t column_sums(const ColumnSumJobs& jobs, int64_t cols, cudaStream_t stream) {
  constexpr int kCols = column_sum_config::kColumns;
  int64_t groups = 0;
  for (int i = 0; i < jobs.count; ++i) groups = jobs.job[i].groups > groups ? jobs.job[i].groups : groups;
  if (jobs.count == 0 || groups == 0 || cols == 0) return cudaSuccess;
  const dim3 grid(unsigned((cols + kCols - 1) / kCols), unsigned(groups), unsigned(jobs.count));
  return launch_kernel(column_sum_kernel<>, grid, dim3(kCols * column_sum_config::kSlices), 0, stream,
                       dependent_launch_enabled(), jobs, cols);
}

// Step 2 for one grad: `groups` groups of `blocks` partial rows of `cols` columns.
template <typename T>
cudaError_t column_sum(const float* partials, T* out, int64_t groups, int64_t blocks, int64_t cols,
                       cudaStream_t stream) {
  ColumnSumJobs jobs;
  jobs.add({partials, out, dtype_of<T>(), groups, blocks});
  return column_sums(jobs, cols, stream);
}

}  // namespace ltx
