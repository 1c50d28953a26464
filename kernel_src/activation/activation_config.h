// The activations' launch choices: the one place they are made. Each rung says
// why, with the same-run figure that chose it (docs/performance.md#activation).
#pragma once

#include <cstdint>

#include "../common/launch.cuh"
#include "activation.h"

namespace ltx {
namespace activation_config {

// Plain (elementwise) kernel: 256 threads, one 16-byte word each per grid step.
constexpr int kPlainThreads = 256;

// Gated kernel: 128 threads take 128 consecutive words of one row (64-1024 tried; 128 best on both GPUs).
// Rows narrower than that take whole warps covering them.
inline int gated_threads(int64_t words) {
  return words >= 128 ? 128 : int(ceil_div(words, 32) * 32);
}

// Scalar fallback: 256 threads per row, at most 8 x 65535 row blocks (then a grid stride).
constexpr int kScalarThreads = 256;
constexpr int64_t kScalarMaxBlocks = 65535 * 8;

// How the plain kernel's words spread over blocks.
constexpr GridPlan plain_grid_plan(GpuClass gpu, Activation a) {
  const bool exact_formula = a != Activation::kGeluTanhFast && a != Activation::kSiluFast;
  // H200, exact formulas: issue-bound there, a persistent grid ([2,8160,8192] 141.2 us vs 148.8 one per block).
  if (gpu == GpuClass::kH200 && exact_formula) return GridPlan::kPersistent;
  // Else one block per 256 words, the hardware balances the load ([2,8160,8192]: H100 exact 211.1 -> 178.5 us,
  // H200 fast 145.0 -> 129.9).
  return GridPlan::kOnePerBlock;
}

// Head gate, vectorized: 256 threads, one 16-byte word of x each, one block per 256 words: the plain kernel's
// shape, the same access (a word in, a word out; the logit is a broadcast load from L1). Not tuned separately.
constexpr int kHeadGateThreads = 256;
constexpr GridPlan kHeadGateGridPlan = GridPlan::kOnePerBlock;

// Head gate, scalar fallback: the other kernels' 256 threads, a grid stride past 8 x 65535 blocks.
constexpr int kHeadGateScalarThreads = kScalarThreads;
constexpr int64_t kHeadGateScalarMaxBlocks = kScalarMaxBlocks;

// --- backward (activation_bwd.cu). Timed as shipped (results/activation-backward-H200.json: ahead of eager
// and compile but gelu_tanh at Wan 1.3B's FFN, 0.2% behind eager, and head_gate at LTX-2, 1.4% behind compile);
// no rung below was chosen by a sweep. ------------------------------------------------------------------

// Plain backward: the forward's shape (256 threads, a word of dy and of x in, a word of dx out, per grid
// step), one block per 256 words, the hardware balancing the load (not swept).
constexpr int kBwdPlainThreads = 256;
constexpr GridPlan kBwdPlainGridPlan = GridPlan::kOnePerBlock;

// Gated backward: the forward's blocks of 128 consecutive words of a row (gated_threads), each thread a
// word of both halves and of dy in, a word of both grad halves out (not swept).
inline int gated_bwd_threads(int64_t words) { return gated_threads(words); }

// Head gate backward, vectorized: 256 threads, a word of dy and of x each; a head's words are lanes of one
// warp, summed with shuffles. One block per 256 words, as the forward (not swept).
constexpr int kHeadGateBwdThreads = 256;
constexpr GridPlan kHeadGateBwdGridPlan = GridPlan::kOnePerBlock;

// Head gate backward, scalar: one warp per (row, head), 8 warps a block, at most 8 x 65535 blocks then a
// grid stride (not swept).
constexpr int kHeadGateBwdScalarThreads = 256;
constexpr int64_t kHeadGateBwdScalarMaxBlocks = kScalarMaxBlocks;

}  // namespace activation_config
}  // namespace ltx
