// rope_3d / rope_1d launch choices: the one place they are made. Each rung says
// why, with the figure that chose it (docs/performance.md#rope_axes).
#pragma once

#include <algorithm>
#include <cstdint>

namespace ltx {
namespace rope_axes_config {

// Threads of a block: a token's head groups x tokens; the block shares one table of angles.
constexpr int kBlockThreads = 256;
constexpr int64_t kMaxTokenBlocks = int64_t(1) << 20;  // then a grid stride over tokens
constexpr int64_t kMaxBatchBlocks = 65535;             // gridDim.y limit

// Heads each thread takes at least, in place: one head per thread was 13% slower at [2,2688,32,64] on
// the H100 (a thread's setup costs about two words).
constexpr int64_t kMinHeadsPerThread = 2;
// Out of place (the backward): 4, whose loads in flight gave 254 -> 237 us at Wan 1.3B's
// [2,32760,12,128] and 45 -> 42 at [2,2688,32,64] (H200, isolated launches); in place 4 gained nothing.
constexpr int64_t kMinHeadsPerThreadOutOfPlace = 4;

// Head groups per token (threads per pair unit along the heads): a divisor of the head count, so no
// thread gets one head more than another, leaving each thread at least its minimum of heads (Wan
// 1.3B's 12 heads in place: 6 groups of 2 rather than 8 groups of 1-2) and the token within one block.
inline int64_t head_groups(int64_t max_heads, int units_per_head, bool out_of_place) {
  const int64_t min_heads = out_of_place ? kMinHeadsPerThreadOutOfPlace : kMinHeadsPerThread;
  int64_t groups = std::min<int64_t>(std::max(kBlockThreads / units_per_head, 1),
                                     std::max<int64_t>(max_heads / min_heads, 1));
  while (groups > 1 && max_heads % groups) --groups;
  return groups;
}

// Out of place, the words are read and written with evict-first hints (ld/st.global.cs): they are
// touched once, and at Wan 1.3B's shape the backward took 237 -> 224-230 us (in place the hints cost
// 229 -> 249 us: the store hits the line its load brought in).
constexpr bool kStreamOutOfPlace = true;

// Loads in flight per thread (its heads of a tensor): the kernel for 2 where a thread has at most 2
// heads (46 registers instead of 57: 5 blocks per SM, not 4), else for 4.
constexpr int loads_in_flight(int64_t heads_per_thread) { return heads_per_thread <= 2 ? 2 : 4; }

}  // namespace rope_axes_config
}  // namespace ltx
