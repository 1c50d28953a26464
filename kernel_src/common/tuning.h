// Launch-choice overrides, for development builds only (`ltx-build build
// --dev` defines LTX_KERNELS_DEV): A/B benchmarks and the tests that force one
// path set them through the dev-only op `set_tuning(knob, value)`. A release
// build compiles none of this: override_of() is the constant kUnset, every
// branch that reads it folds away, and each launch choice comes from its
// family's table (kernel_src/<family>/<family>_config.h) alone.
#pragma once

#include <atomic>
#include <cstring>

namespace ltx {
namespace tuning {

enum class Knob : int {
  kDependentLaunch,          // 0: launch without programmatic dependent launch
  kRmsnormThreadsPerRow,     // a power of two 8..1024, or 384/640/768 (one word per thread)
  kFusedNormThreadsPerRow,   // a power of two 32..512, or 192/384
  kFusedNormPrefetch,        // 0: the row kernel without next-row loads; 1: with them
  kFusedNormGeneralOperands, // 1: the general kernels for LTX's operand set too
  kFusedNormFlatWords,       // gated_residual's flat kernel: 1/2/4 words per thread; 0: the row kernel
  kQkThreadsPerRow,          // qk_rmsnorm_rope's general kernel at this many threads per row
  kQkOneWord,                // 0: per-head norms take the general kernel, not the one-word one
  kQkHeadWords,              // 1: one word per thread in the one-word kernel (not two heads' words)
  kQkSamples,                // 1: one sample per pass in the whole-row kernel
  kPixelNormPosWords,        // pixel_norm block plan: position words (with kPixelNormChannelWords)
  kPixelNormChannelWords,    // pixel_norm block plan: channel words per thread
  kPixelNormRegisterCap,     // 0: the original-rounding kernel without its 32-register cap
  kInplaceAddWords,          // inplace_add: 16-byte words per thread, 1/2/4
  kLayerNormThreadsPerRow,   // layernorm: a power of two 32..512, or 96/192/320/384/640
  kLayerNormGridPlan,        // layernorm: a GridPlan (launch.cuh) by its value, 0..6
  kFusedNormBwdThreads,      // fused_norm backward: threads of a vectorized block (a compiled block shape)
  kFusedNormBwdPrefetch,     // fused_norm backward: 0 without next-row loads, 1 with them
  kFusedNormBwdRowsPerBlock, // fused_norm backward: rows per block (>= 1) instead of column_sum's split
  kFusedNormBwdSharedAcc,    // fused_norm backward: 0 reduced-grad sums in registers, 1 in shared memory
  kLayerNormBwdThreads,      // layernorm backward: threads per row, 96/128/192/256 (bf16 rows)
  kLayerNormBwdMinRows,      // layernorm backward: the fewest rows per block, >= 1
  kLayerNormBwdMaxBlocks,    // layernorm backward: the most blocks per row group, >= 1
  kQkBwdThreads,             // qk backward's row kernel: threads per row (32..512, multiple of 32); 0: old block kernel
  kQkBwdRows,                // qk backward: minimum norm groups (rows) per block, >= 1 (the dw split)
  kQkBwdPrefetch,            // qk backward's row kernel: 1 with next-row loads, 0 without
  kQkBwdRuns,                // qk backward (row and block kernels): runs of units the dw split is cut into, 1..64
  kLayerNormBwdStages,       // layernorm backward: ring stages 2..4, or 1 (registers); bf16 rows of 192/256 threads
  kLayerNormBwdWords,        // layernorm backward with weight or bias, adaln without: 1 the one-word kernel, 0 the ring
  kFusedNormBwdWords,        // fused_norm backward, adaln_rmsnorm without weight: 1 the one-word kernel, 0 bwd_vectorized
  kCount,
};

constexpr const char* kKnobNames[] = {
    "dependent_launch",         "rmsnorm.threads_per_row",     "fused_norm.threads_per_row",
    "fused_norm.prefetch",      "fused_norm.general_operands", "fused_norm.flat_words",
    "qk_rmsnorm_rope.threads_per_row", "qk_rmsnorm_rope.one_word", "qk_rmsnorm_rope.head_words",
    "qk_rmsnorm_rope.samples",  "pixel_norm.pos_words",        "pixel_norm.channel_words",
    "pixel_norm.register_cap",  "inplace_add.words",           "layernorm.threads_per_row",
    "layernorm.grid_plan",      "fused_norm.bwd_threads",      "fused_norm.bwd_prefetch",
    "fused_norm.bwd_rows_per_block", "fused_norm.bwd_shared_acc", "layernorm.bwd_threads",
    "layernorm.bwd_min_rows",   "layernorm.bwd_max_blocks",
    "qk_rmsnorm_rope.bwd_threads", "qk_rmsnorm_rope.bwd_rows",
    "qk_rmsnorm_rope.bwd_prefetch", "qk_rmsnorm_rope.bwd_runs", "layernorm.bwd_stages",
    "layernorm.bwd_words",      "fused_norm.bwd_words",
};
static_assert(sizeof(kKnobNames) / sizeof(kKnobNames[0]) == int(Knob::kCount), "one name per knob");

constexpr int kUnset = -1;

#ifdef LTX_KERNELS_DEV
constexpr bool kDevBuild = true;

// One process-wide table (an inline function's static: one copy in the .so).
inline std::atomic<int>* overrides() {
  static struct Table {
    std::atomic<int> value[int(Knob::kCount)];
    Table() {
      for (auto& v : value) v.store(kUnset);
    }
  } table;
  return table.value;
}
inline int override_of(Knob k) { return overrides()[int(k)].load(std::memory_order_relaxed); }
inline void set_override(Knob k, int value) { overrides()[int(k)].store(value, std::memory_order_relaxed); }
#else
constexpr bool kDevBuild = false;
constexpr int override_of(Knob) { return kUnset; }
#endif

// The knob called `name`, or kCount.
inline Knob knob_named(const char* name) {
  for (int k = 0; k < int(Knob::kCount); ++k)
    if (std::strcmp(kKnobNames[k], name) == 0) return Knob(k);
  return Knob::kCount;
}

}  // namespace tuning
}  // namespace ltx
