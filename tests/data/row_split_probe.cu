// Host-only probe of the backward row split (test_row_split_cpu.py): for each "rows groups" pair read
// from stdin, prints the rows per block of column_sum.cuh's wave split and of the layernorm and fused_norm
// configs that use it, then the blocks per group.
#include <cstdio>

#include "../../kernel_src/common/column_sum.cuh"
#include "../../kernel_src/fused_norm/fused_norm_config.h"
#include "../../kernel_src/layernorm/layernorm_config.h"

int main() {
  long long rows, groups;
  while (std::scanf("%lld %lld", &rows, &groups) == 2) {
    std::printf("%lld %lld %lld %lld\n", (long long)ltx::wave_rows_per_block(rows, groups),
                (long long)ltx::layernorm_config::bwd_rows_per_block(rows, groups),
                (long long)ltx::fused_norm_config::bwd_rows_per_block(rows, groups),
                (long long)ltx::wave_split_blocks(rows, groups));
  }
  return 0;
}
