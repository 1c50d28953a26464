// apply_rotary_emb's launch choices: the one place they are made
// (docs/performance.md#rope).
#pragma once

#include <cstdint>

namespace ltx {
namespace rope_config {

// 256 threads per block; the vectorized kernel's blocks walk tokens (all samples of a token share its
// table words), the scalar one's walk rows. One rung for both GPUs: one block per token reaches
// 100-102% of the copy rate of the same bytes on the H100.
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t(1) << 20;  // then a grid stride

}  // namespace rope_config
}  // namespace ltx
