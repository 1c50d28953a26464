// Host-only probe of the backward row split (test_row_split_cpu.py): for each "rows groups" pair read
// from stdin, prints the rows per block of column_sum.cuh's wave split, of the layernorm and fused_norm
// configs that use it (an op on the four-an-SM wave; each seam, two an SM; modulated_rmsnorm, five), the
// blocks per group of the default split, then at Wan's rows of 192 words (large problems' own splits)
// layernorm's, its seam's, adaln_rmsnorm's, gated_residual_rmsnorm's and adaln_layernorm's.
#include <cstdio>

#include "../../kernel_src/common/column_sum.cuh"
#include "../../kernel_src/fused_norm/fused_norm_config.h"
#include "../../kernel_src/layernorm/layernorm_config.h"

int main() {
  using ltx::FusedNormOp;
  namespace fn = ltx::fused_norm_config;
  namespace ln = ltx::layernorm_config;
  using V = ltx::ln::Variant;
  long long rows, groups;
  while (std::scanf("%lld %lld", &rows, &groups) == 2) {
    std::printf("%lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld\n", (long long)ltx::wave_rows_per_block(rows, groups),
                (long long)ln::bwd_rows_per_block(rows, groups, false, 0),
                (long long)fn::bwd_rows_per_block(rows, groups, FusedNormOp::kAdalnRmsnorm, 0),
                (long long)ln::bwd_rows_per_block(rows, groups, true, 0),
                (long long)fn::bwd_rows_per_block(rows, groups, FusedNormOp::kGatedResidualRmsnorm, 0),
                (long long)fn::bwd_rows_per_block(rows, groups, FusedNormOp::kModulatedRmsnorm, 0),
                (long long)ltx::wave_split_blocks(rows, groups),
                (long long)ln::bwd_rows_per_block(rows, groups, false, ln::bwd_large_blocks(V::kLayerNorm, 192)),
                (long long)ln::bwd_rows_per_block(rows, groups, true,
                                                  ln::bwd_large_blocks(V::kGatedResidualLayerNorm, 192)),
                (long long)fn::bwd_rows_per_block(rows, groups, FusedNormOp::kAdalnRmsnorm, 192),
                (long long)fn::bwd_rows_per_block(rows, groups, FusedNormOp::kGatedResidualRmsnorm, 192),
                (long long)ln::bwd_rows_per_block(rows, groups, false, ln::bwd_large_blocks(V::kAdalnLayerNorm, 192)));
  }
  return 0;
}
